"""Check plans against vLLM's own config classes; runs in the ENGINE's environment.

Input (stdin): JSON list of {"id", "config_dir", "plan"}. Output (stdout, last line):
JSON {id: {"ok": bool, "error": str, "kv_heads_per_rank": int, "layers_per_stage": int,
"head_size": int}}. Imports vLLM once (~16 s), so the test sends every case in one call.
"""

from __future__ import annotations

import json
import sys
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
        out["kv_heads_per_rank"] = mc.get_num_kv_heads(pc)
        out["layers_per_stage"] = mc.get_num_layers(pc)
        out["head_size"] = mc.get_head_size()
        out["ok"] = True
    except Exception as err:
        out["error"] = f"{type(err).__name__}: {' '.join(str(err).split())[:400]}"
    return out


def main() -> None:
    cases = json.load(sys.stdin)
    results = {c["id"]: check(c) for c in cases}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
