"""One engine core under a closed loop of users, step by step, as the benchmarks load it.

Each user sends a request, waits for its whole reply and sends the next at once (``vllm bench serve``
and ``bench`` do this). A request passes the chat page's event loop (on the page's path), the router's
latency (several engines) and an API server (a queue of its own; vLLM's Rust frontend: one per thread),
then waits for a free slot (``max_num_seqs``, KV capacity) and for the step budget
(``max_num_batched_tokens``): prompts are read in chunks beside the running sequences' next tokens, in
arrival order, as vLLM's scheduler does. Steps of pure decoding are taken together up to the next arrival
or reply end, so a run costs events, not tokens.
"""

from __future__ import annotations

import heapq
import math
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
        returns the earlier requests whose arrival moved."""
        i = min(range(self.count), key=lambda k: self.free[k])
        start = max(ready, self.free[i])
        done = start + seconds * self.scale
        self.free[i] = done
        moved = [r for r in self.busy[i][-SHARE_WINDOW:] if r.arrive > ready]
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


@dataclass
class Front:
    """What stands before the engine core: the page's processes (None: straight to the API), the router."""

    page: Pool | None
    page_s: float
    router_s: float
    latency_s: float
    api: Pool


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


def simulate(
    step: StepModel,
    front: Front,
    users: int,
    prompts: tuple[int, ...],
    reply: int,
    per_user: int,
    first_user: int = 0,
) -> EngineRun:
    """Run ``users`` users of ``per_user`` requests each through one engine core; user ``i`` sends prompts
    ``prompts[(first_user + i + k * users) % len(prompts)]`` in turn."""
    lay = step.layout
    run = EngineRun()
    heap: list[tuple[float, int, Request]] = []
    sent_count = [0] * users
    order = 0

    def send(user: int, at: float) -> None:
        k = sent_count[user]
        sent_count[user] += 1
        prompt = prompts[(first_user + user + k * users) % len(prompts)]
        ready, waited = at + front.latency_s / 2, 0.0
        if front.page is not None:
            ready, waited = front.page.serve(ready, front.page_s)
        req = Request(user, prompt, at, ready, waited)
        for r in [req, *front.api.share(req, ready + front.router_s, step.request_s(prompt))]:
            push(r)

    def push(req: Request) -> None:
        nonlocal order
        heapq.heappush(heap, (req.arrive, order, req))
        order += 1

    def finish(req: Request, at: float) -> None:
        seen = at + front.latency_s / 2
        run.ttft.append(req.first + front.latency_s / 2 - req.sent)
        run.tpot.append((at - req.first) / (reply - 1) if reply > 1 else 0.0)
        run.queue.append(req.waited + (req.admitted - req.arrive))
        run.tokens += reply
        run.requests += 1
        run.prompt_tokens += req.prompt
        blame("front", req.waited, 1)
        run.end = max(run.end, seen)
        if sent_count[req.user] < per_user:
            send(req.user, seen)

    def blame(cause: str, seconds: float, weight: int) -> None:
        run.causes[cause] = run.causes.get(cause, 0.0) + seconds * weight

    for user in range(users):
        send(user, 0.0)
    waiting: deque[Request] = deque()
    running: list[Request] = []
    kv_used = 0
    slots = max(1, lay.max_num_seqs)
    t = 0.0
    total = users * per_user
    while run.requests < total:
        while heap and heap[0][0] <= t + 1e-12:
            at, _, req = heapq.heappop(heap)
            if at == req.arrive and req.admitted < 0:
                waiting.append(req)
        while waiting and len(running) < slots and kv_used + waiting[0].prompt + reply <= max(lay.kv_tokens, 1):
            req = waiting.popleft()
            req.admitted = t
            kv_used += req.prompt + reply
            running.append(req)
        if not running:
            if not heap:
                if waiting:  # one request larger than the KV cache: served alone, as vLLM preempts for it
                    req = waiting.popleft()
                    req.admitted = t
                    kv_used += req.prompt + reply
                    running.append(req)
                    continue
                break
            t = max(t, heap[0][0])
            continue
        decoding = [r for r in running if r.prefilled >= r.prompt]
        filling = [r for r in running if r.prefilled < r.prompt]
        context = float(sum(r.prompt + r.generated for r in decoding))
        if filling:
            budget = max(lay.max_num_batched_tokens - len(decoding), 1)
            chunks: list[tuple[Request, int]] = []
            for r in filling:
                if budget <= 0:
                    break
                n = min(r.prompt - r.prefilled, budget)
                chunks.append((r, n))
                budget -= n
            completes = sum(1 for r, n in chunks if r.prefilled + n >= r.prompt)
            cost = step.time(len(decoding), context, [(n, r.prefilled) for r, n in chunks], len(decoding) + completes)
            blame(cost.cause(), cost.duration, len(running))
            blame("slot", cost.duration, len(waiting))
            t += cost.duration
            run.device_s += cost.device
            run.device_alone_s += cost.device / step.device_share
            done: list[Request] = []
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
            cost = step.time(len(decoding), mid, [], len(decoding))
            if heap and len(running) < slots:
                steps = max(1, min(steps, math.ceil((heap[0][0] - t) / cost.duration)))
            blame(cost.cause(), cost.duration * steps, len(running))
            blame("slot", cost.duration * steps, len(waiting))
            t += cost.duration * steps
            run.device_s += cost.device * steps
            run.device_alone_s += cost.device * steps / step.device_share
            for r in decoding:
                r.generated += steps
            done = [r for r in decoding if r.generated >= reply]
        for r in done:
            running.remove(r)
            kv_used -= r.prompt + reply
            finish(r, t)
    return run
