"""The random-weight demo checkpoint: written, loadable, idempotent, reproducible.

These tests run under the app's environment (no torch), so everything that needs torch
runs in the engine's Python as a subprocess: ``.venv-engine/bin/python`` or
``$ENGINE_PYTHON``.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
from support.services import run_backend

from backend.demo.checkpoint import DEMO_MARKER, is_demo_model, write_demo_model

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300

LOAD_SCRIPT = textwrap.dedent(
    """
    import json, random, sys

    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from backend.demo.tokenizer import silent_ids

    path = sys.argv[1]
    cfg = AutoConfig.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    model.eval()

    vocab = cfg.vocab_size
    ids = sorted({0, 1, vocab - 1, *random.Random(0).sample(range(2, vocab - 1), 197)})
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    enc = tok(rendered, return_tensors="pt")
    with torch.no_grad():
        logits = model(input_ids=enc["input_ids"]).logits
        greedy = model.generate(**enc, max_new_tokens=64, do_sample=False)[0, enc["input_ids"].shape[1]:]
    rope = getattr(cfg, "rope_parameters", None) or {}
    silent = silent_ids(tok.get_vocab())
    with safe_open(f"{path}/model.safetensors", framework="pt") as weights:
        saved_dtypes = sorted({str(weights.get_tensor(k).dtype) for k in weights.keys()})
        saved_names = sorted(weights.keys())
    print(json.dumps({
        "architectures": cfg.architectures,
        "model_type": cfg.model_type,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "vocab_size": vocab,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "rope_theta": rope.get("rope_theta", getattr(cfg, "rope_theta", None)),
        "saved_dtypes": saved_dtypes,
        "saved_names": saved_names,
        "tied": model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(),
        "tokenizer_len": len(tok),
        "model_max_length": tok.model_max_length,
        "eos_sentence_id": tok.convert_tokens_to_ids("<|end_of_sentence|>"),
        "generation_eos": model.generation_config.eos_token_id,
        "rendered": rendered,
        "sample_ids": ids,
        "decoded": [tok.decode([i]) for i in ids],
        "n_input": int(enc["input_ids"].shape[1]),
        "logits_shape": list(logits.shape),
        "logits_finite": bool(torch.isfinite(logits).all()),
        "special_rows_zero": bool((model.model.embed_tokens.weight[:5] == 0).all()),
        "silent_rows": silent,
        "silent_rows_zero": bool((model.model.embed_tokens.weight[silent] == 0).all()),
        "other_rows_zero": int((model.model.embed_tokens.weight.abs().sum(dim=1) == 0).sum()) - len(silent),
        "greedy_len": int(greedy.shape[0]),
        "greedy_specials": sorted({int(t) for t in greedy if int(t) < 5}),
    }))
    """
)


def engine_python() -> Path:
    return Path(os.environ.get("ENGINE_PYTHON") or ROOT / ".venv-engine/bin/python")


@pytest.fixture(scope="module")
def engine() -> Path:
    python = engine_python()
    if not python.exists():
        pytest.skip(f"engine python not found: {python} (set ENGINE_PYTHON)")
    return python


def run_engine(engine: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run(
        [str(engine), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def write_cli(engine: Path, directory: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    proc = run_engine(engine, "-m", "backend.demo.checkpoint", str(directory), *extra)
    assert proc.returncode == 0, proc.stderr
    return proc


def snapshot(directory: Path) -> dict[str, tuple[int, int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def tiny(engine: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("demo") / "tiny"
    proc = write_cli(engine, directory)
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith(f"demo model: {directory} (")
    assert last.endswith(" params, tiny, random weights)")
    return directory


@pytest.fixture(scope="module")
def loaded(engine: Path, tiny: Path) -> dict[str, Any]:
    proc = run_engine(engine, "-c", LOAD_SCRIPT, str(tiny))
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_tiny_checkpoint_is_written_and_marked(tiny: Path) -> None:
    assert is_demo_model(tiny)
    marker = json.loads((tiny / DEMO_MARKER).read_text())
    assert marker["demo"] is True
    assert marker["seed"] == 0
    assert marker["full_size"] is False
    assert "noise" in marker["note"]
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json"):
        assert (tiny / name).is_file(), name
    assert (tiny / "model.safetensors").stat().st_size < 20 * 1024**2
    leftovers = [p.name for p in tiny.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []

    config = json.loads((tiny / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 0)
    assert config["use_bias"] is False
    assert config["hidden_act"] == "silu"
    assert config["rms_norm_eps"] == 1e-5
    assert config["max_position_embeddings"] == 131072
    tok_config = json.loads((tiny / "tokenizer_config.json").read_text())
    assert tok_config["model_max_length"] == 131072
    assert "chat_template" in tok_config


def test_loads_with_transformers(loaded: dict[str, Any]) -> None:
    assert loaded["architectures"] == ["Ernie4_5ForCausalLM"]
    assert loaded["model_type"] == "ernie4_5"
    assert loaded["num_attention_heads"] == 16
    assert loaded["num_key_value_heads"] == 2
    assert loaded["head_dim"] == 128
    assert (loaded["num_hidden_layers"], loaded["hidden_size"]) == (2, 256)
    assert loaded["rope_theta"] == 500000
    assert loaded["tie_word_embeddings"] is True
    assert loaded["tied"] is True
    assert loaded["saved_dtypes"] == ["torch.bfloat16"]
    names = loaded["saved_names"]
    assert "model.embed_tokens.weight" in names
    assert "lm_head.weight" not in names  # tied
    assert "model.layers.1.self_attn.q_proj.weight" in names
    assert not any(name.endswith(".bias") for name in names)


def test_tokenizer_matches_the_model(loaded: dict[str, Any]) -> None:
    vocab = loaded["vocab_size"]
    assert loaded["tokenizer_len"] == vocab
    assert 3000 <= vocab <= 8192
    assert loaded["model_max_length"] == 131072
    assert sorted(loaded["generation_eos"]) == sorted([2, loaded["eos_sentence_id"]])


def test_chat_template_renders_like_ernie(loaded: dict[str, Any]) -> None:
    assert loaded["rendered"] == "<|begin_of_sentence|>User: hi\nAssistant: "


def test_every_sampled_id_decodes_to_text(loaded: dict[str, Any]) -> None:
    ids = loaded["sample_ids"]
    assert len(ids) == 200
    assert loaded["vocab_size"] - 1 in ids
    empty = [i for i, text in zip(ids, loaded["decoded"], strict=True) if not text]
    assert empty == []


def test_forward_pass_gives_vocab_logits(loaded: dict[str, Any]) -> None:
    assert loaded["logits_shape"] == [1, loaded["n_input"], loaded["vocab_size"]]
    assert loaded["logits_finite"] is True


def test_greedy_replies_never_end_early(loaded: dict[str, Any]) -> None:
    """Latency tests and stop tests need replies of the asked length: no special token is chosen."""
    assert loaded["special_rows_zero"]
    # nor a lone byte of a longer UTF-8 character: vLLM streams no text for it (test_engine)
    assert loaded["silent_rows"][:5] == [0, 1, 2, 3, 4] and len(loaded["silent_rows"]) == 5 + 128
    assert loaded["silent_rows_zero"] and loaded["other_rows_zero"] == 0
    assert loaded["greedy_len"] == 64 and loaded["greedy_specials"] == []


def test_second_run_is_a_no_op(engine: Path, tiny: Path) -> None:
    before = snapshot(tiny)
    proc = write_cli(engine, tiny)
    assert "nothing to do" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].endswith(" params, tiny, random weights)")
    assert snapshot(tiny) == before


def test_same_seed_gives_identical_bytes(engine: Path, tiny: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    other_seed = tmp_path / "seed1"
    # both through the CLI's main, in one process: a process of its own each imports torch again
    main = "import sys; from backend.demo.checkpoint import main"
    code = f"{main}; sys.exit(main(sys.argv[1:2]) or main([sys.argv[2], '--seed', '1']))"
    proc = run_engine(engine, "-c", code, str(again), str(other_seed))
    assert proc.returncode == 0, proc.stderr
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (again / name).read_bytes() == (tiny / name).read_bytes(), name
    weights = (tiny / "model.safetensors").read_bytes()
    assert (other_seed / "model.safetensors").read_bytes() != weights
    assert (other_seed / "tokenizer.json").read_bytes() == (tiny / "tokenizer.json").read_bytes()
    assert json.loads((other_seed / DEMO_MARKER).read_text())["seed"] == 1


def test_module_imports_without_torch(engine: Path) -> None:
    code = "import sys, backend.demo.checkpoint; print('torch' in sys.modules)"
    proc = run_engine(engine, "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_is_demo_model_is_strict(tmp_path: Path) -> None:
    assert not is_demo_model(tmp_path / "missing")
    assert not is_demo_model(tmp_path)
    (tmp_path / DEMO_MARKER).write_text("not json")
    assert not is_demo_model(tmp_path)
    (tmp_path / DEMO_MARKER).write_text('{"demo": false}')
    assert not is_demo_model(tmp_path)
    (tmp_path / DEMO_MARKER).write_text('{"demo": true}')
    assert is_demo_model(str(tmp_path))


def test_refuses_to_overwrite_a_real_checkpoint(tmp_path: Path) -> None:
    # Fails before importing torch, so this runs in the app's environment.
    real = tmp_path / "real-model"
    real.mkdir()
    (real / "config.json").write_text("{}")
    with pytest.raises(FileExistsError):
        write_demo_model(real)
    assert [p.name for p in real.iterdir()] == ["config.json"]


@pytest.mark.parametrize("where", ["under-a-file", "real-checkpoint"])
def test_demo_model_command_says_why_it_cannot_write(tmp_path: Path, where: str) -> None:
    (tmp_path / "afile").write_text("")
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "config.json").write_text("{}")
    target = tmp_path / ("afile/demo" if where == "under-a-file" else "real")
    done = run_backend(tmp_path / "run", "demo-model", str(target), timeout=TIMEOUT_S)
    said = f"{tmp_path / 'afile'} is a file, not a directory" if where == "under-a-file" else "is not a demo checkpoint"
    assert done.returncode == 2 and f"error: demo model: cannot write {target}: " in done.stderr, done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr
