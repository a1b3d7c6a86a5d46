"""Settings: defaults < TOML < environment < flags, and bad keys/values named precisely."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.services import clear_settings_env

from config.settings import SettingsError, load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clear_settings_env(monkeypatch)
    monkeypatch.chdir(tmp_path)


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "erniechat.toml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    s = load_settings()
    assert s.model.id == "baidu/ERNIE-4.5-0.3B-PT"
    assert s.workload.objective == "balanced"
    assert s.app.keepalive is False and s.app.host == "127.0.0.1"


def test_layers_toml_then_env_then_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_toml(tmp_path, '[engine]\nport = 9001\n[workload]\nusers = 3\nobjective = "latency"\n')
    s = load_settings()
    assert (s.engine.port, s.workload.users, s.workload.objective) == (9001, 3, "latency")
    monkeypatch.setenv("ERNIECHAT_ENGINE__PORT", "9002")
    assert load_settings().engine.port == 9002
    assert load_settings().workload.users == 3, "env overrides only what it names"
    assert load_settings({"engine.port": 9003}).engine.port == 9003


def test_config_path_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = tmp_path / "elsewhere.toml"
    other.write_text('[model]\nid = "demo"\n')
    monkeypatch.setenv("ERNIECHAT_CONFIG", str(other))
    assert load_settings().model.id == "demo"
    monkeypatch.setenv("ERNIECHAT_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(SettingsError, match=r"missing\.toml .*does not exist"):
        load_settings()


def test_unknown_toml_key_is_named(tmp_path: Path) -> None:
    write_toml(tmp_path, "[engine]\nprot = 1\n")
    with pytest.raises(SettingsError, match=r"engine\.prot: unknown key; allowed: .*port"):
        load_settings()


def test_unknown_env_key_is_named_with_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ERNIECHAT_WORKLOAD__USRES", "4")
    with pytest.raises(SettingsError, match=r"unknown key 'usres' in workload; allowed: .*users"):
        load_settings()


def test_bad_value_lists_allowed(tmp_path: Path) -> None:
    write_toml(tmp_path, '[workload]\nobjective = "fast"\n')
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert "workload.objective" in str(err.value)
    assert "'latency', 'throughput' or 'balanced'" in str(err.value)


def test_bad_number_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ERNIECHAT_ENGINE__PORT", "eighty")
    with pytest.raises(SettingsError, match=r"engine\.port"):
        load_settings()


def test_toml_syntax_error_is_one_line(tmp_path: Path) -> None:
    write_toml(tmp_path, "[engine\nport = 1\n")
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert "erniechat.toml" in str(err.value) and "\n" not in str(err.value)


def test_shipped_example_file_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The documented example stays valid: every key in it exists and has a good value."""
    example = Path(__file__).resolve().parents[2] / "erniechat.example.toml"
    monkeypatch.setenv("ERNIECHAT_CONFIG", str(example))
    s = load_settings()
    assert s.engine.hardware == "auto" and s.app.keepalive is False and s.workload.users == 8
