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


@pytest.mark.parametrize(
    ("name", "example"),
    [
        ("ERNIECHAT_ENGINE__EXTRA_ARGS", '["--flag", "value"]'),
        ("ERNIECHAT_ENGINE__PINS", '{"tensor_parallel_size": 2}'),
    ],
)
def test_env_json_field_not_json_names_the_variable(monkeypatch: pytest.MonkeyPatch, name: str, example: str) -> None:
    monkeypatch.setenv(name, "notjson")
    with pytest.raises(SettingsError) as err:
        load_settings()
    message = str(err.value)
    assert message.startswith(f"environment variable {name}: ") and "must be JSON" in message
    assert example in message and "(got 'notjson')" in message
    assert "None" not in message and "\n" not in message


@pytest.mark.parametrize("name", ["ERNIECHAT_APP__USERS", "ERNIECHAT_APP", "ERNIECHAT_ENGINE"])
def test_env_json_secret_value_is_hidden(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(name, "alice:hunter2")
    with pytest.raises(SettingsError, match=rf"environment variable {name}: .*must be JSON.*\(value hidden\)") as err:
        load_settings()
    assert "hunter2" not in str(err.value)


def test_bad_secret_value_is_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ERNIECHAT_APP__USERS", '{"alice": 12345}')
    with pytest.raises(SettingsError, match=r"app\.users\.alice: .*\(value hidden\)") as err:
        load_settings()
    assert "12345" not in str(err.value)


def test_long_value_is_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ERNIECHAT_ENGINE__EXTRA_ARGS", "x" * 500)
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert "x" * 40 in str(err.value) and "x" * 100 not in str(err.value) and "..." in str(err.value)


def test_bad_value_names_its_real_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    monkeypatch.setenv("ERNIECHAT_CONFIG", str(empty))
    with pytest.raises(SettingsError, match=r"^bad setting on the command line: workload\.users: ") as err:
        load_settings({"workload.users": 0})
    assert "empty.toml" not in str(err.value)
    monkeypatch.setenv("ERNIECHAT_ENGINE__PORT", "abc")
    with pytest.raises(
        SettingsError, match=r"^bad setting in environment variable ERNIECHAT_ENGINE__PORT: engine\.port: "
    ) as err:
        load_settings()
    assert "empty.toml" not in str(err.value)
    monkeypatch.delenv("ERNIECHAT_ENGINE__PORT")
    empty.write_text("[workload]\nusers = 0\n")
    with pytest.raises(SettingsError, match=r"^bad setting in .*empty\.toml: workload\.users: "):
        load_settings()


def test_config_path_that_is_a_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ERNIECHAT_CONFIG", str(tmp_path))
    with pytest.raises(SettingsError, match=r"is a directory, not a settings file"):
        load_settings()


@pytest.mark.parametrize(("section", "key"), [("engine", "port"), ("workload", "users"), ("app", "temperature")])
def test_bool_is_not_a_number(tmp_path: Path, section: str, key: str) -> None:
    write_toml(tmp_path, f"[{section}]\n{key} = true\n")
    with pytest.raises(SettingsError, match=rf"{section}\.{key}: Input should be a number, not true or false"):
        load_settings()


def test_numbers_from_env_strings_still_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ERNIECHAT_ENGINE__PORT", "8001")
    monkeypatch.setenv("ERNIECHAT_APP__TEMPERATURE", "0.5")
    s = load_settings()
    assert (s.engine.port, s.app.temperature) == (8001, 0.5)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "engine.example.org"])
def test_an_engine_beyond_loopback_needs_an_api_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: str) -> None:
    """vLLM answers every request that reaches it: an engine beyond this machine without a key is
    refused when the settings are read, before anything is planned or started, saying how to fix it."""
    monkeypatch.setenv("ERNIECHAT_ENGINE__HOST", host)
    with pytest.raises(SettingsError) as err:
        load_settings()
    said = str(err.value)
    assert said.startswith(
        f"bad setting in environment variable ERNIECHAT_ENGINE__HOST: engine.host: the engine would listen on {host}, "
        "beyond this machine, so it needs an API key"
    ), said
    assert "engine.api_key is not set" in said and "ERNIECHAT_ENGINE__API_KEY=" in said
    assert "ERNIECHAT_ENGINE__HOST=127.0.0.1" in said
    monkeypatch.setenv("ERNIECHAT_ENGINE__API_KEY", "k" * 40)
    assert load_settings().engine.host == host
    monkeypatch.delenv("ERNIECHAT_ENGINE__HOST")
    monkeypatch.delenv("ERNIECHAT_ENGINE__API_KEY")
    write_toml(tmp_path, f'[engine]\nhost = "{host}"\n')
    with pytest.raises(SettingsError, match=r"^bad setting in .*erniechat\.toml: engine\.host: .*needs an API key"):
        load_settings()
    with pytest.raises(SettingsError, match=r"^bad setting on the command line: engine\.host: "):
        load_settings({"engine.host": host})
    assert load_settings({"engine.host": host, "engine.api_key": "k" * 40}).engine.api_key == "k" * 40


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.5", "::1", "localhost"])
def test_an_engine_on_loopback_needs_no_api_key(monkeypatch: pytest.MonkeyPatch, host: str) -> None:
    monkeypatch.setenv("ERNIECHAT_ENGINE__HOST", host)
    assert load_settings().engine.api_key is None


def test_allowed_origins_are_none_by_default_and_each_must_be_a_plain_origin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load_settings().app.allowed_origins == [], "the page's own address only, by default"
    monkeypatch.setenv("ERNIECHAT_APP__ALLOWED_ORIGINS", '["HTTPS://Chat.Example.com:443/", "http://10.0.0.5:8080"]')
    assert load_settings().app.allowed_origins == ["https://chat.example.com", "http://10.0.0.5:8080"]
    for bad, said in (
        ('["*"]', "'*' would let any web page read the chats"),
        ('["chat.example.com"]', '"chat.example.com" is not a web origin'),
        ('["https://chat.example.com/page"]', "scheme, host and port only"),
    ):
        monkeypatch.setenv("ERNIECHAT_APP__ALLOWED_ORIGINS", bad)
        with pytest.raises(SettingsError) as err:
            load_settings()
        assert "app.allowed_origins" in str(err.value) and said in str(err.value), str(err.value)
