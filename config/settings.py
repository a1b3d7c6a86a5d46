"""One settings tree for the whole product: model, engine, workload, app.

Layers, lowest first: defaults < TOML file < environment (``ERNIECHAT_`` prefix, ``__``
between levels, e.g. ``ERNIECHAT_ENGINE__PORT=8001``) < command-line flags. The TOML file is
``erniechat.toml`` in the working directory, or the path in ``ERNIECHAT_CONFIG``.
Unknown keys and bad values are errors that name the key and what is allowed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from config.errors import SettingsError

ENV_PREFIX = "ERNIECHAT_"
ENV_DELIMITER = "__"
CONFIG_ENV = "ERNIECHAT_CONFIG"
DEFAULT_TOML = "erniechat.toml"
ROOT = Path(__file__).resolve().parents[1]

Objective = Literal["latency", "throughput", "balanced"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelSettings(_Section):
    id: str = "baidu/ERNIE-4.5-0.3B-PT"
    """Hugging Face id, a local directory, or ``demo`` for the built-in random-weight model."""
    revision: str | None = None
    served_name: str | None = None
    """Name the API serves the model under; defaults to the id."""
    demo_dir: Path = ROOT / ".run" / "demo-model"
    demo_full_size: bool = False
    """Write the demo at the real 0.36 B shape (for GPU benchmarks) instead of the tiny one."""
    demo_fallback: bool = True
    """Serve the demo model, loudly, when the real weights cannot be had."""


class EngineSettings(_Section):
    python: str = str(ROOT / ".venv-engine" / "bin" / "python")
    """The engine's interpreter: its own venv here; the host's ``python3`` on a GPU bundle."""
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    api_key: str | None = None
    hardware: str = "auto"
    """``auto`` (detect), a shipped profile name, or a profile file."""
    run_dir: Path = ROOT / ".run"
    """Engine log, status file and warm-up record live here."""
    warmup: bool = True
    start_timeout_s: float = Field(default=900.0, gt=0)
    pins: dict[str, Any] = Field(default_factory=dict)
    """Plan values the user fixes (``--set tensor_parallel_size=2``); checked before start."""
    extra_args: list[str] = Field(default_factory=list)
    """Passed to vLLM verbatim, after the planned arguments; a flag the plan passes is refused (pin it instead)."""


class WorkloadSettings(_Section):
    objective: Objective = "balanced"
    users: int = Field(default=8, ge=1)
    """Expected concurrent users."""
    prompt_tokens: int = Field(default=512, ge=1)
    reply_tokens: int = Field(default=256, ge=1)
    context: int | None = Field(default=None, ge=16)
    """Wanted context length; default: the model's own, capped to what memory holds."""


class AppSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    connect_timeout_s: float = Field(default=3.0, gt=0)
    """Connecting to the engine on this machine takes milliseconds; seconds means it is down."""
    first_token_timeout_s: float | None = Field(default=None, gt=0)
    """Fixed first-token timeout; default: warm-up's slowest first token x margin, at least the floor."""
    first_token_margin: float = Field(default=4.0, ge=1)
    first_token_floor_s: float = Field(default=15.0, gt=0)
    token_timeout_s: float = Field(default=30.0, gt=0)
    """Longest silence allowed between two streamed tokens."""
    stream_interval_ms: float = Field(default=30.0, ge=0)
    """Tokens after the first go to the page at most this often, joined (0: one message per token).
    A small model makes 600-1,200 tokens/s per reply; one socket message each floods the page."""
    keepalive: bool = False
    """HTTP keep-alive to the engine (off: a dead engine shows at once, no stale sockets)."""
    ping_interval_s: float = Field(default=10.0, gt=0)
    ping_timeout_s: float = Field(default=10.0, gt=0)
    abandoned_reply_s: float = Field(default=15.0, ge=0)
    """A reply whose tab went away (socket closed, no reconnect within this time) is stopped on the
    engine; a reconnect in time keeps it streaming. Chainlit itself lets it run to max_tokens."""
    temperature: float = Field(default=0.7, ge=0, le=2)
    top_p: float = Field(default=0.95, gt=0, le=1)
    max_tokens: int = Field(default=512, ge=1)
    system_prompt: str = "You are a helpful assistant."
    users: dict[str, str] = Field(default_factory=dict)
    """Login users (name -> password); login is on when this is set with a secret (below).
    Required, with the secret, when the page listens beyond loopback (backend/page/auth.py)."""
    auth_secret: str | None = None
    """Signs the login cookie; the environment's CHAINLIT_AUTH_SECRET wins when set."""


class Settings(BaseSettings):
    """The whole tree; build it with :func:`load_settings`."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_DELIMITER,
        extra="forbid",
        validate_assignment=True,
    )

    model: ModelSettings = Field(default_factory=ModelSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    workload: WorkloadSettings = Field(default_factory=WorkloadSettings)
    app: AppSettings = Field(default_factory=AppSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml = TomlConfigSettingsSource(settings_cls, toml_file=_toml_path())
        return (init_settings, env_settings, toml)


def _toml_path() -> Path | None:
    explicit = os.environ.get(CONFIG_ENV)
    if explicit:
        return Path(explicit)
    default = Path.cwd() / DEFAULT_TOML
    return default if default.is_file() else None


def _check_env_keys() -> None:
    """pydantic-settings ignores unknown variables; a typo must not pass silently."""
    for name in os.environ:
        if not name.startswith(ENV_PREFIX) or name == CONFIG_ENV:
            continue
        path = name[len(ENV_PREFIX) :].lower().split(ENV_DELIMITER)
        model: type[BaseModel] = Settings
        for depth, part in enumerate(path):
            fields = model.model_fields
            if part not in fields:
                where = ".".join(path[:depth]) or "top level"
                raise SettingsError(
                    f"environment variable {name}: unknown key '{part}' in {where}; "
                    f"allowed: {', '.join(sorted(fields))}"
                )
            annotation = fields[part].annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                model = annotation
            else:
                break


def _fields_at(path: list[str]) -> list[str]:
    """Field names of the settings section at ``path`` (for 'allowed: ...' in messages)."""
    model: type[BaseModel] = Settings
    for part in path:
        annotation = model.model_fields[part].annotation if part in model.model_fields else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return sorted(model.model_fields)


def describe_validation_error(err: ValidationError) -> str:
    """First error of a ValidationError as one line: dotted key, problem, allowed values."""
    first = err.errors()[0]
    loc = [str(p) for p in first["loc"]]
    key = ".".join(loc)
    if first["type"] == "extra_forbidden":
        return f"{key}: unknown key; allowed: {', '.join(_fields_at(loc[:-1]))}"
    return f"{key}: {first['msg']} (got {first.get('input')!r})"


def load_settings(overrides: dict[str, Any] | None = None) -> Settings:
    """Settings from all layers; ``overrides`` (from CLI flags) win. Raises SettingsError."""
    _check_env_keys()
    path = _toml_path()
    if path is not None and not path.is_file():
        raise SettingsError(f"settings file {path} (from {CONFIG_ENV}) does not exist")
    try:
        return Settings(**_nest(overrides or {}))
    except ValidationError as err:
        source = f" in {path}" if path else ""
        raise SettingsError(f"bad setting{source}: {describe_validation_error(err)}") from None
    except (OSError, ValueError) as err:  # TOML syntax errors arrive as ValueError
        raise SettingsError(f"settings file {path}: {err}") from None


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    """``{'engine.port': 1}`` -> ``{'engine': {'port': 1}}``; None values are left out."""
    nested: dict[str, Any] = {}
    for dotted, value in flat.items():
        if value is None:
            continue
        *parents, leaf = dotted.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested
