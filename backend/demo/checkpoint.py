"""A demo checkpoint shaped like baidu/ERNIE-4.5-0.3B-PT, with random weights.

No weights can be downloaded here, so this writes a checkpoint of the same
architecture and attention-head layout (``Ernie4_5ForCausalLM``, 16 query heads,
2 KV heads, head_dim 128) from a fixed seed, plus a byte-level BPE tokenizer
trained in-process and ERNIE's chat template. vLLM loads and serves it like the
real model; the answers are noise.

Run inside the engine's environment (it needs torch, transformers, tokenizers)::

    python -m backend.demo.checkpoint DIR [--full-size] [--seed N]

Only the standard library is imported at module level, so ``DEMO_MARKER`` and
``is_demo_model`` can be imported from the app's environment, which has no torch.
"""

from __future__ import annotations

import argparse
import glob
import inspect
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from backend.demo.tokenizer import (
    END_OF_SENTENCE_ID,
    build_tokenizer,
    silent_ids,
    write_json,
    write_tokenizer,
)

__all__ = [
    "DEMO_MARKER",
    "FULL_SIZE_SHAPE",
    "TINY_SHAPE",
    "is_demo_model",
    "main",
    "write_demo_model",
]

DEMO_MARKER: Final = "DEMO_MODEL.json"
"""File in a checkpoint directory that marks it as this random-weight demo."""

MARKER_FORMAT: Final = 3
"""Bumped when the checkpoint changes, so older demo checkpoints are rewritten (2: special-token
embedding rows are zero, so greedy replies run to max_tokens; 3: so are the rows of byte pieces
that are not whole UTF-8, so every reply streams visible text)."""

NOTE: Final = "random weights: answers are noise"

# Shape shared by both sizes: the real model's attention-head layout and numerics.
COMMON_SHAPE: Final[dict[str, Any]] = {
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": True,
    "use_bias": False,
    "initializer_range": 0.02,
}

TINY_SHAPE: Final[dict[str, int]] = {
    # head_dim stays 128 (vLLM's CPU attention rejects small head sizes), so
    # q_proj maps 256 -> 16 * 128 and o_proj maps back; both are legal.
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "intermediate_size": 512,
    "vocab_size": 4096,
}

FULL_SIZE_SHAPE: Final[dict[str, int]] = {
    "num_hidden_layers": 18,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "vocab_size": 103424,
}

MODEL_MAX_LENGTH: Final = 131072
PAD_ID: Final = 0
BOS_ID: Final = 1
EOS_ID: Final = 2
# Files that make a complete checkpoint; the marker is written last.
CHECKPOINT_FILES: Final = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    DEMO_MARKER,
)


def is_demo_model(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a checkpoint directory written by this module (stdlib only)."""
    marker = Path(path) / DEMO_MARKER
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("demo") is True


def _read_marker(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((path / DEMO_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _is_complete(path: Path, *, full_size: bool, seed: int) -> bool:
    """Whether ``path`` already holds a finished demo checkpoint of this size and seed."""
    marker = _read_marker(path)
    if marker is None or marker.get("demo") is not True:
        return False
    if marker.get("seed") != seed or marker.get("full_size") is not full_size or marker.get("format") != MARKER_FORMAT:
        return False
    return all((path / name).is_file() for name in CHECKPOINT_FILES)


def _shape(full_size: bool) -> dict[str, Any]:
    return {**COMMON_SHAPE, **(FULL_SIZE_SHAPE if full_size else TINY_SHAPE)}


# --- tokenizer ---------------------------------------------------------------------


# --- weights -----------------------------------------------------------------------


def _write_weights(directory: Path, shape: dict[str, Any], seed: int, silent: list[int]) -> int:
    """Save random bf16 weights with transformers' own classes; return the parameter count.
    ``silent``: token ids whose rows are zero (``silent_ids``)."""
    import torch
    from transformers import Ernie4_5Config, Ernie4_5ForCausalLM

    config = Ernie4_5Config(
        **shape,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        use_cache=True,
    )
    config.architectures = ["Ernie4_5ForCausalLM"]

    # Build on the meta device (no memory, no HF init), then allocate and fill cheaply.
    # Non-persistent buffers (rotary inv_freq) stay uninitialised: they are not saved,
    # and this model object is only used to write the checkpoint.
    with torch.device("meta"):
        model = Ernie4_5ForCausalLM(config)
    model = model.to(dtype=torch.bfloat16)
    model.to_empty(device="cpu")
    model.tie_weights()
    if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        raise AssertionError("lm_head is not tied to embed_tokens")

    generator = torch.Generator(device="cpu").manual_seed(seed)
    std = float(shape["initializer_range"])
    with torch.no_grad():
        for _, param in model.named_parameters():  # tied weights are listed once
            if param.dim() == 1:  # RMSNorm scales (there are no biases)
                param.fill_(1.0)
            else:
                param.normal_(0.0, std, generator=generator)
        # Zero rows for the special tokens and partial UTF-8 bytes: with tied embeddings their
        # logit is always 0, below the largest of thousands of random logits, so greedy replies
        # never end early or go silent, and sampled ones rarely do. Latency tests and demos rely
        # on replies of the asked length that show text.
        model.model.embed_tokens.weight[silent] = 0
    n_params = sum(p.numel() for p in model.parameters())

    save_kwargs: dict[str, Any] = {"max_shard_size": "50GB"}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        save_kwargs["safe_serialization"] = True  # transformers 4.x; 5.x always uses safetensors
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except (ImportError, AttributeError):
        pass
    model.save_pretrained(directory, **save_kwargs)
    if not (directory / "model.safetensors").is_file():
        raise AssertionError("save_pretrained did not write model.safetensors")

    # Readers on older transformers (4.x) look for these spellings; 5.x accepts both.
    config_path = directory / "config.json"
    saved = json.loads(config_path.read_text(encoding="utf-8"))
    saved.setdefault("torch_dtype", "bfloat16")
    saved.setdefault("rope_theta", float(shape["rope_theta"]))
    write_json(config_path, saved)
    return n_params


def _make_readable(directory: Path) -> None:
    """Give the checkpoint ordinary permissions (mkdtemp and some writers use 0700/0600)."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for child in directory.iterdir():
        child.chmod(0o666 & ~umask)


def _transformers_version() -> str:
    import transformers

    return str(transformers.__version__)


# --- checkpoint --------------------------------------------------------------------


def _build(directory: Path, *, full_size: bool, seed: int) -> int:
    shape = _shape(full_size)
    tokenizer = build_tokenizer(shape["vocab_size"])
    n_params = _write_weights(directory, shape, seed, silent_ids(tokenizer.get_vocab()))
    write_tokenizer(directory, tokenizer, MODEL_MAX_LENGTH)
    write_json(
        directory / "generation_config.json",
        {
            "bos_token_id": BOS_ID,
            "eos_token_id": [EOS_ID, END_OF_SENTENCE_ID],
            "pad_token_id": PAD_ID,
            "do_sample": True,
            "temperature": 0.8,
            "top_p": 0.8,
            "repetition_penalty": 1.0,
            "transformers_version": _transformers_version(),
        },
    )
    write_json(
        directory / DEMO_MARKER,
        {
            "demo": True,
            "seed": seed,
            "full_size": full_size,
            "note": NOTE,
            "params": n_params,
            "format": MARKER_FORMAT,
        },
    )
    _make_readable(directory)  # last: covers every file written above
    return n_params


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, not ours to signal
    try:  # a killed writer may linger as a zombie until its parent reaps it
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _remove_stale_temps(path: Path) -> None:
    """Delete temp dirs next to ``path`` left by writers that were killed mid-way."""
    for kind in ("tmp", "old"):
        for leftover in path.parent.glob(f".{glob.escape(path.name)}.{kind}-*-*"):
            pid_text = leftover.name[len(f".{path.name}.{kind}-") :].split("-", 1)[0]
            if not pid_text.isdigit() or not leftover.is_dir():
                continue
            if not _pid_alive(int(pid_text)):
                shutil.rmtree(leftover, ignore_errors=True)


def write_demo_model(path: Path, *, full_size: bool = False, seed: int = 0) -> Path:
    """Write the demo checkpoint to ``path`` unless it is already there; return ``path``.

    The checkpoint is built in a temporary sibling directory and renamed into place,
    so an interrupted run never leaves a half-written checkpoint at ``path``. An
    existing demo checkpoint of another size or seed is replaced; a directory that
    holds anything else is left alone (``FileExistsError``).
    """
    path = Path(path)
    if _is_complete(path, full_size=full_size, seed=seed):
        return path
    if path.exists() and not (path.is_dir() and (is_demo_model(path) or not any(path.iterdir()))):
        raise FileExistsError(f"{path} exists and is not a demo checkpoint; not overwriting it")
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(path)
    pid = os.getpid()
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-{pid}-", dir=path.parent))
    old: Path | None = None
    try:
        _build(tmp, full_size=full_size, seed=seed)
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-{pid}-", dir=path.parent))
            os.replace(path, old / "checkpoint")
        try:
            os.replace(tmp, path)
        except OSError:
            # Another writer got there first; accept its checkpoint if it is the same one.
            if not _is_complete(path, full_size=full_size, seed=seed):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return path


def _summary(path: Path) -> str:
    marker = _read_marker(path) or {}
    size = "full-size" if marker.get("full_size") else "tiny"
    return f"demo model: {path} ({marker.get('params', '?')} params, {size}, random weights)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m backend.demo.checkpoint",
        description="Write a random-weight checkpoint shaped like ERNIE-4.5-0.3B-PT.",
    )
    parser.add_argument("directory", type=Path, help="checkpoint directory to write")
    parser.add_argument("--full-size", action="store_true", help="the real shape (~0.36 B params) instead of tiny")
    parser.add_argument("--seed", type=int, default=0, help="seed for the random weights")
    args = parser.parse_args(argv)
    directory: Path = args.directory.absolute()

    if _is_complete(directory, full_size=args.full_size, seed=args.seed):
        print(f"demo model: {directory} already complete (seed {args.seed}); nothing to do")
    else:
        start = time.monotonic()
        try:
            write_demo_model(directory, full_size=args.full_size, seed=args.seed)
        except OSError as exc:  # our own refusal, or what the system says about the path
            if exc.filename and Path(exc.filename).is_file():
                why = f"{exc.filename} is a file, not a directory"
            else:
                why = f"{exc.strerror}: {exc.filename}" if exc.strerror else str(exc)
            print(f"demo model: cannot write {directory}: {why}", file=sys.stderr)
            return 1
        print(f"demo model: written in {time.monotonic() - start:.1f} s", file=sys.stderr)
    print(_summary(directory))
    return 0


if __name__ == "__main__":
    sys.exit(main())
