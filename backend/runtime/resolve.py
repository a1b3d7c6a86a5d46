"""Find the weights to serve: a directory, the Hugging Face cache or hub, else the demo model.

When the real weights cannot be had, the built-in random-weight demo is served instead,
and every surface (terminal, status, chat page) says so loudly.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from backend.runtime.components.logwatch import WEIGHTS_FIX
from config.model import ModelReadError
from config.model.hub import not_cached, offline_reason
from config.model.reading import not_found
from config.settings import ROOT, Settings

DEMO_ID = "demo"


@dataclass(frozen=True)
class ResolvedModel:
    path: str
    demo: bool
    note: str | None = None
    """Why the demo was used instead of what was asked for."""


def ensure_demo(settings: Settings) -> Path:
    """Write the demo checkpoint with the engine's Python (it has torch); no-op when present."""
    target = settings.model.demo_dir.expanduser().absolute()  # the writer runs in ROOT, not the caller's cwd
    argv = [settings.engine.python, "-m", "backend.demo.checkpoint", str(target)]
    if settings.model.demo_full_size:
        argv.append("--full-size")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    except FileNotFoundError:
        raise ModelReadError(
            f"cannot write the demo model: the engine's Python '{settings.engine.python}' does not exist; "
            "run the set-up script or set engine.python"
        ) from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        said = tail[0]  # the writer's own "demo model: cannot write ..." line, else its last words
        raise ModelReadError(said if said.startswith("demo model: ") else f"writing the demo model failed: {said}")
    return target


def _from_hub(model_id: str, revision: str | None) -> str:
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.py"]
    try:
        return snapshot_download(model_id, revision=revision, local_files_only=True, allow_patterns=patterns)
    except Exception:
        pass
    offline = offline_reason()
    if offline:  # not huggingface_hub's ~24 s of retries to say the same
        raise not_cached(f"model '{model_id}'", offline)
    try:
        return snapshot_download(model_id, revision=revision, allow_patterns=patterns)
    except Exception as err:
        raise ModelReadError(
            f"model '{model_id}': not in the local Hugging Face cache and the hub cannot be reached "
            f"({str(err).splitlines()[0][:200] if str(err) else 'no answer'})"
        ) from None


HEADER_LIMIT = 100_000_000
"""The largest header safetensors reads (its own limit): a bigger length is no safetensors file, and
reading it would take that much memory."""


def damaged_weights(directory: Path) -> str | None:
    """Why a ``*.safetensors`` file of ``directory`` cannot be loaded, else None. Reads each file's
    header only: a file cut short or not safetensors is named here, in a second, instead of by vLLM
    after its start (tens of seconds, more on a GPU)."""
    for path in sorted(directory.glob("*.safetensors")):
        if why := _unloadable(path):
            return f"{path.name} is damaged (cut short or not safetensors: {why}): {WEIGHTS_FIX}"
    return None


def _unloadable(path: Path) -> str | None:
    """What is wrong with one safetensors file: an 8-byte header length, a JSON header, then exactly
    the bytes its tensors' offsets cover."""
    size = path.stat().st_size
    if size < 8:
        return f"{size} bytes, less than a header"
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        if length > HEADER_LIMIT:
            return f"its header wants {length} bytes, over safetensors' limit of {HEADER_LIMIT}"
        if length > size - 8:
            return f"its header wants {length} bytes, the file holds {size}"
        raw = f.read(length)
    try:
        header = json.loads(raw)
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return "its header is not a safetensors header (not JSON, or a tensor without its data offsets)"
    if 8 + length + end != size:
        return f"its tensors need {8 + length + end} bytes, the file holds {size}"
    return None


def resolve_model(settings: Settings) -> ResolvedModel:
    """The local path to serve, or ModelReadError when nothing can be served."""
    model_id = settings.model.id
    if model_id == DEMO_ID:
        return ResolvedModel(str(ensure_demo(settings)), demo=True)
    if not model_id.strip():
        raise ModelReadError("model id is empty: give a Hugging Face id, a directory with config.json, or 'demo'")
    local = Path(model_id).expanduser()
    if local.is_file():
        raise ModelReadError(f"model '{model_id}': a file; give the directory that holds its config.json")
    if local.exists():
        if not (local / "config.json").is_file():
            raise ModelReadError(f"model '{model_id}': no config.json in that directory")
        if why := damaged_weights(local):
            raise ModelReadError(f"model '{model_id}': {why}")
        from backend.demo.checkpoint import is_demo_model

        return ResolvedModel(str(local.resolve()), demo=is_demo_model(local))
    why = not_found(model_id)
    if why:
        raise ModelReadError(f"model '{model_id}': {why}")
    try:
        path = _from_hub(model_id, settings.model.revision)
    except ModelReadError as err:
        if not settings.model.demo_fallback:
            raise
        note = f"{err}; serving the built-in DEMO model (random weights, answers are noise)"
        return ResolvedModel(str(ensure_demo(settings)), demo=True, note=note)
    if why := damaged_weights(Path(path)):
        raise ModelReadError(f"model '{model_id}': {why}")
    return ResolvedModel(path, demo=False)
