"""One or several engine cores under a closed loop of users, step by step, as the benchmarks load them.

Each user sends a request, waits for its whole reply and sends the next at once (``vllm bench serve``
and ``bench`` do this). A request passes the chat page's event loop (on the page's path), the router's
latency (several engines) and an API server (a queue of its own; vLLM's Rust frontend: one per thread),
then waits for a free slot (``max_num_seqs``, KV capacity) and for the step budget
(``max_num_batched_tokens``): prompts are read in chunks beside the running sequences' next tokens, in
arrival order, as vLLM's scheduler does. Steps of pure decoding are taken together up to the next arrival
or reply end, so a run costs events, not tokens.

Behind the router a user's requests stay on one engine when they carry the user's conversation (the page,
``bench``): each distinct engine is simulated alone with its users, a shared GPU slowing it by the others'
mean. A request that is a conversation of its own (``vllm bench serve`` names every request apart) goes to
the engine with the fewest conversations, so the engines take them in turn: they are simulated together,
replies that end together on one engine start their next prompts on all of them, and a shared GPU slows
each step by what the others run at that moment (their prompt reading collides at times, mostly not).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from dataclasses import dataclass, field

from config.performance.step import StepModel

PS_SHARE = 0.28
"""How far a request in an API server's hands is held back by the ones that came after it: 0 one after
another, 1 all done together (an event loop interleaving them); vLLM's lies between."""


SHARE_WINDOW = 256
"""Requests an API server interleaves at most (the latest in hand): beyond, they wait their turn."""


class Pool:
    """Processes that take requests in turn (API servers, page processes); ``capacity`` may be a share."""

    def __init__(self, capacity: float) -> None:
        self.count = max(1, math.floor(capacity + 1e-9))
        self.scale = self.count / max(capacity, 1e-9)
        self.free = [0.0] * self.count
        self.busy: list[list[Request]] = [[] for _ in range(self.count)]

    def serve(self, ready: float, seconds: float) -> tuple[float, float]:
        """(done, waited) for work of ``seconds`` ready at ``ready``, one after another."""
        start = max(ready, self.free[0])
        done = start + seconds * self.scale
        heapq.heapreplace(self.free, done)
        return done, start - ready

    def share(self, req: Request, ready: float, seconds: float) -> list[Request]:
        """Take ``req`` in at ``ready`` on the least busy process, sharing it with what that process still
        has in hand: an event loop interleaves them, so they are done together (a burst of requests reaches
        the engine as one, as vLLM's API server hands it on). Sets ``req.arrive`` and ``req.waited``;
        returns the earlier requests whose arrival moved (not those the engine core already holds)."""
        i = min(range(self.count), key=lambda k: self.free[k])
        start = max(ready, self.free[i])
        done = start + seconds * self.scale
        self.free[i] = done
        moved = [r for r in self.busy[i][-SHARE_WINDOW:] if r.arrive > ready and not r.queued]
        for r in moved:
            later = PS_SHARE * (done - r.arrive)
            r.waited += later
            r.arrive += later
        self.busy[i] = [*moved[-SHARE_WINDOW:], req]
        req.arrive, req.waited = done, req.waited + start - ready
        return moved


@dataclass
class Request:
    user: int
    prompt: int
    sent: float
    arrive: float
    waited: float
    """Time in the front end's queues before it reached the engine core."""
    prefilled: int = 0
    generated: int = 0
    admitted: float = -1.0
    first: float = -1.0
    queued: bool = False
    """The engine core holds it (waiting or running)."""


@dataclass
class Front:
    """What stands before the engine core: the page's processes (None: straight to the API), the router."""

    page: Pool | None
    page_s: float
    router_s: float
    latency_s: float
    api: Pool


@dataclass(frozen=True)
class SharedGpu:
    """Engines whose kernels run on one GPU at once: how much the others' busy device slows one's step."""

    engines: int
    """Engines per GPU."""
    weight: float
    """Share of another engine's busy time in this one's way (under MPS their kernels run beside its own)."""
    width_share: float
    """Share of the GPU one engine's kernels fill (a small model's are thin)."""

    def slowing(self, own: float, others: float) -> float:
        """The slowing of a step busy ``own`` of its time on the device while the others are ``others`` (the
        sum of their busy shares): theirs in its way, or all of them beyond a whole GPU."""
        return max(1.0 + self.weight * others, (own + others) * self.width_share)


@dataclass
class EngineRun:
    """What one engine core's users saw, in seconds, and what the engine and its front end spent."""

    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    queue: list[float] = field(default_factory=list)
    tokens: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    start: float = 0.0
    end: float = 0.0
    device_s: float = 0.0
    device_alone_s: float = 0.0
    """Device time as if the engine had the GPU alone (no other engine's kernels in its way)."""
    causes: dict[str, float] = field(default_factory=dict)
    """Request-seconds each cause held the running requests (``Step.cause``; 'slot', 'front' for queues)."""

    @property
    def makespan(self) -> float:
        return max(self.end - self.start, 1e-9)

    def blame(self, cause: str, seconds: float, weight: int) -> None:
        self.causes[cause] = self.causes.get(cause, 0.0) + seconds * weight


class _Core:
    """One engine core: the requests its front end handed on, those waiting for a slot and those running,
    and its clock (the end of its last step)."""

    def __init__(self, step: StepModel, front: Front, reply: int, order: itertools.count[int]) -> None:
        self.step, self.front, self.reply, self.order = step, front, reply, order
        self.run = EngineRun()
        self.heap: list[tuple[float, int, Request]] = []
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.kv_used = 0
        self.t = 0.0
        self.slots = max(1, step.layout.max_num_seqs)
        self.kv_tokens = max(step.layout.kv_tokens, 1)
        self.gpu: SharedGpu | None = None
        self.beside: list[_Core] = []
        """The other engine cores on its GPU."""
        self.busy = 0.0
        """Share of its last step the device was busy (as if alone)."""

    def share(self) -> float | None:
        """A shared GPU's slowing of the step it starts now, by the steps the others are running."""
        if self.gpu is None:
            return None
        return self.gpu.slowing(1.0, sum(c.busy for c in self.beside if c.t > self.t))

    def push(self, req: Request) -> None:
        heapq.heappush(self.heap, (req.arrive, next(self.order), req))

    def next_time(self) -> float:
        """When it takes its next step (infinite: idle, nothing on its way)."""
        if self.running or self.waiting:
            return self.t
        return max(self.t, self.heap[0][0]) if self.heap else math.inf

    def _admit(self, req: Request) -> None:
        req.admitted = self.t
        self.kv_used += req.prompt + self.reply
        self.running.append(req)

    def advance(self, horizon: float) -> list[Request]:
        """Its next step, or pure decode steps together up to the next arrival, a reply's end or ``horizon``
        (the earliest another core's reply could send it a request); returns the replies it ended."""
        heap, waiting, running, reply = self.heap, self.waiting, self.running, self.reply
        while heap and heap[0][0] <= self.t + 1e-12:
            at, _, req = heapq.heappop(heap)
            if at == req.arrive and not req.queued:
                req.queued = True
                waiting.append(req)
        while waiting and len(running) < self.slots and self.kv_used + waiting[0].prompt + reply <= self.kv_tokens:
            self._admit(waiting.popleft())
        if not running:
            self.busy = 0.0
            if heap:
                self.t = max(self.t, heap[0][0])
                return []
            if not waiting:
                return []
            self._admit(waiting.popleft())  # larger than the KV cache: served alone, as vLLM preempts for it
        step, run, t, share = self.step, self.run, self.t, self.share()
        decoding = [r for r in running if r.prefilled >= r.prompt]
        filling = [r for r in running if r.prefilled < r.prompt]
        context = float(sum(r.prompt + r.generated for r in decoding))
        done: list[Request] = []
        if filling:
            budget = max(step.layout.max_num_batched_tokens - len(decoding), 1)
            chunks: list[tuple[Request, int]] = []
            for r in filling:
                if budget <= 0:
                    break
                n = min(r.prompt - r.prefilled, budget)
                chunks.append((r, n))
                budget -= n
            completes = sum(1 for r, n in chunks if r.prefilled + n >= r.prompt)
            cost = step.time(
                len(decoding), context, [(n, r.prefilled) for r, n in chunks], len(decoding) + completes, share
            )
            steps = 1
            t += cost.duration
            for r in decoding:
                r.generated += 1
                if r.generated >= reply:
                    done.append(r)
            for r, n in chunks:
                r.prefilled += n
                if r.prefilled >= r.prompt:
                    r.generated, r.first = 1, t
                    if reply <= 1:
                        done.append(r)
        else:
            steps = min(reply - r.generated for r in decoding)
            mid = context + len(decoding) * (steps - 1) / 2
            cost = step.time(len(decoding), mid, [], len(decoding), share)
            if len(running) < self.slots:
                limit = min(heap[0][0] if heap else math.inf, horizon)
                if limit < math.inf:
                    steps = max(1, min(steps, math.ceil((limit - t) / cost.duration)))
            t += cost.duration * steps
            for r in decoding:
                r.generated += steps
            done = [r for r in decoding if r.generated >= reply]
        run.blame(cost.cause(), cost.duration * steps, len(running))
        run.blame("slot", cost.duration * steps, len(waiting))
        alone = cost.device / (step.device_share if share is None else share)
        run.device_s += cost.device * steps
        run.device_alone_s += alone * steps
        self.busy = alone / cost.duration
        self.t = t
        for r in done:
            running.remove(r)
            self.kv_used -= r.prompt + reply
        return done


class _Turns:
    """The engines in turn, as the router's fewest-sessions choice takes them: each once a round, the order
    within a round set by its hash of the session's name (here a fixed pseudo-random one)."""

    def __init__(self, engines: int, seed: int) -> None:
        self.engines, self.random = engines, random.Random(seed)
        self.round: list[int] = []

    def next(self) -> int:
        if not self.round:
            self.round = list(range(self.engines))
            self.random.shuffle(self.round)
        return self.round.pop()


def simulate(
    step: StepModel,
    fronts: list[Front],
    users: int,
    prompts: tuple[int, ...],
    reply: int,
    per_user: int,
    first_user: int = 0,
    *,
    in_turn: bool = False,
    seed: int = 0,
    gpu: SharedGpu | None = None,
) -> list[EngineRun]:
    """Run ``users`` users of ``per_user`` requests each through one engine core per front end in ``fronts``;
    user ``i`` sends prompts ``prompts[(first_user + i + k * users) % len(prompts)]`` in turn. A user's
    requests stay on engine ``i % len(fronts)``, or with ``in_turn`` go to the engines in turn, whoever sends
        them (``seed``: the order within the router's rounds). ``gpu``: engines ``gpu.engines`` at a time share a
    GPU, each step slowed by what the others run then (else by ``step.device_share``, the mean). Returns each
    engine's run, all over the same span."""
    order = itertools.count()
    cores = [_Core(step, front, reply, order) for front in fronts]
    if gpu is not None and gpu.engines > 1:
        for i, core in enumerate(cores):
            first = i - i % gpu.engines
            core.gpu, core.beside = gpu, [c for c in cores[first : first + gpu.engines] if c is not core]
    sent_count = [0] * users
    turns = _Turns(len(cores), seed)
    ahead = min(f.latency_s for f in fronts)
    """A reply's end reaches its user and the user's next request an engine no sooner than this."""

    def send(user: int, at: float) -> None:
        k = sent_count[user]
        sent_count[user] += 1
        prompt = prompts[(first_user + user + k * users) % len(prompts)]
        core = cores[turns.next() if in_turn else user % len(cores)]
        front = core.front
        ready, waited = at + front.latency_s / 2, 0.0
        if front.page is not None:
            ready, waited = front.page.serve(ready, front.page_s)
        req = Request(user, prompt, at, ready, waited)
        for r in [req, *front.api.share(req, ready + front.router_s, step.request_s(prompt))]:
            core.push(r)

    def finish(core: _Core, req: Request) -> None:
        run, half = core.run, core.front.latency_s / 2
        seen = core.t + half
        run.ttft.append(req.first + half - req.sent)
        run.tpot.append((core.t - req.first) / (reply - 1) if reply > 1 else 0.0)
        run.queue.append(req.waited + (req.admitted - req.arrive))
        run.tokens += reply
        run.requests += 1
        run.prompt_tokens += req.prompt
        run.blame("front", req.waited, 1)
        run.end = max(run.end, seen)
        if sent_count[req.user] < per_user:
            send(req.user, seen)

    for user in range(users):
        send(user, 0.0)
    while True:
        times = [c.next_time() for c in cores]
        i = min(range(len(cores)), key=times.__getitem__)
        if times[i] == math.inf:
            break
        horizon = min((x for j, x in enumerate(times) if j != i), default=math.inf) + ahead
        core = cores[i]
        for req in core.advance(horizon):
            finish(core, req)
    end = max(c.run.end for c in cores)
    for c in cores:
        c.run.end = end
    return [c.run for c in cores]
