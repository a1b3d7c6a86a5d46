"""One settings tree for the whole product: model, engine, workload, app.

Layers, lowest first: defaults < TOML file < environment (``ERNIECHAT_`` prefix, ``__``
between levels, e.g. ``ERNIECHAT_ENGINE__PORT=8001``) < command-line flags. The TOML file is
``erniechat.toml`` in the working directory, or the path in ``ERNIECHAT_CONFIG``.
Unknown keys and bad values are errors that name the key and what is allowed.
"""

from __future__ import annotations

import ipaddress
import json
import os
import tomllib
import types
from pathlib import Path
from typing import Any, Literal, TypeGuard, Union, get_args, get_origin
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)
from pydantic_settings import SettingsError as SourceError

from config.errors import SettingsError
from config.sampling import Sampling

ENV_PREFIX = "ERNIECHAT_"
ENV_DELIMITER = "__"
CONFIG_ENV = "ERNIECHAT_CONFIG"
TMP_BASE_ENV = "ERNIECHAT_TMP_BASE"
"""Not a setting: set by a start for its children (``backend.runtime.processes.child_tmp``)."""
DEFAULT_TOML = "erniechat.toml"
ROOT = Path(__file__).resolve().parents[1]

Objective = Literal["latency", "throughput", "balanced"]
DATABASE_SCHEMES = ("postgresql://", "postgresql+asyncpg://", "postgres://", "sqlite://", "sqlite+aiosqlite://")
"""The chat store's database URLs (``app.database_url``)."""

SECRET_KEYS = ("app.users", "app.auth_secret", "engine.api_key", "app.database_url")
"""Values never echoed in an error message (nor any section or entry holding one)."""
JSON_EXAMPLES = {
    "engine.extra_args": '["--flag", "value"]',
    "engine.pins": '{"tensor_parallel_size": 2}',
    "app.users": '{"user": "password"}',
    "model": '{"id": "demo"}',
    "engine": '{"port": 8001}',
    "workload": '{"users": 4}',
    "app": '{"port": 8080}',
}
"""The shape a JSON-valued environment variable takes, shown when its value is not JSON."""


def is_loopback(host: str) -> bool:
    """True when a server bound to ``host`` is reachable from this machine only."""
    name = host.strip().strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a host name other than localhost: may resolve to anything


def _union_args(annotation: Any) -> tuple[Any, ...]:
    return get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)


def _is_number(annotation: Any) -> bool:
    args = _union_args(annotation)
    return bool not in args and any(a in (int, float) for a in args)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_number(cls, value: Any, info: ValidationInfo) -> Any:
        """pydantic takes ``port = true`` as 1; a number field refuses true/false instead."""
        if isinstance(value, bool) and info.field_name and _is_number(cls.model_fields[info.field_name].annotation):
            raise PydanticCustomError("bool_not_number", "Input should be a number, not true or false")
        return value


class ModelSettings(_Section):
    id: str = Field(default="baidu/ERNIE-4.5-0.3B-PT", min_length=1)
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
    """Bearer key vLLM asks of every request (``VLLM_API_KEY``); required when ``host`` is beyond loopback."""
    hardware: str = "auto"
    """``auto`` (detect), a shipped profile name, or a profile file."""
    run_dir: Path = ROOT / ".run"
    """Engine log, status file and warm-up record live here."""
    warmup: bool = True
    start_timeout_s: float = Field(default=900.0, gt=0)
    restart_limit: int = Field(default=3, ge=0)
    """Restarts of a dead engine within ``RESTART_WINDOW_S`` (10 minutes) before ``serve`` gives up on
    it, each after a longer pause; 0: an engine that dies stays dead."""
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
    """Fixed first-token timeout; default: warm-up's slowest first token x margin, at least the floor, and
    longer for a prompt longer than warm-up's longest (its expected prefill x margin)."""
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
    database_url: str | None = None
    """Where chats are kept: ``postgresql://user:password@host/db`` for Postgres, ``sqlite:///path`` for
    another SQLite file; default: ``chats.db`` in the run directory (``engine.run_dir``, the container's
    ``/data``). The page creates and upgrades its tables itself (``backend/page/chats/schema.py``)."""
    allowed_origins: list[str] = Field(default_factory=list)
    """Web origins (``https://host[:port]``) other than the page's own address whose scripts may use the
    page with its user's login (HTTP and socket); empty: the page's own address only
    (``backend/page/guards/origins.py``)."""

    def sampling(self) -> Sampling:
        """The page's chat settings before a user changes them (each slider's range holds them)."""
        return Sampling(self.temperature, self.top_p, self.max_tokens, self.system_prompt)

    @field_validator("database_url")
    @classmethod
    def _known_database(cls, value: str | None) -> str | None:
        """Only the two databases the page's chat store is tested on; the URL is never echoed."""
        if value is not None and not value.startswith(DATABASE_SCHEMES):
            raise PydanticCustomError(
                "database_url", "a Postgres (postgresql://...) or SQLite (sqlite:///path) URL is needed"
            )
        return value

    @field_validator("allowed_origins")
    @classmethod
    def _plain_origins(cls, value: list[str]) -> list[str]:
        """Each an origin as a browser sends it (scheme, host, port: no path, no wildcard), kept in the
        form the ``Origin`` header has, so the page compares it exactly."""
        return [_origin(item) for item in value]


def _origin(text: str) -> str:
    if text.strip() == "*":
        raise PydanticCustomError(
            "allowed_origins", "'*' would let any web page read the chats; list each origin (https://host:port)"
        )
    parts = urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        raise PydanticCustomError(
            "allowed_origins",
            "{text} is not a web origin: give its scheme, host and port only, as in https://chat.example.com:8443",
            {"text": json.dumps(text)},
        )
    if parts.query or parts.fragment or parts.username or parts.password:
        raise PydanticCustomError(
            "allowed_origins", "{text} is not a web origin: no path, query or login in it", {"text": json.dumps(text)}
        )
    try:
        port = parts.port
    except ValueError:
        raise PydanticCustomError(
            "allowed_origins", "{text} has a port that is not a number", {"text": json.dumps(text)}
        ) from None
    default = {"http": 80, "https": 443}[parts.scheme]
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None and port != default else "")


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


def _settings_env() -> dict[str, list[str]]:
    """``ERNIECHAT_`` variables (not ``ERNIECHAT_CONFIG`` or ``ERNIECHAT_TMP_BASE``) -> the key path each one sets."""
    return {
        name: name[len(ENV_PREFIX) :].lower().split(ENV_DELIMITER)
        for name in os.environ
        if name.startswith(ENV_PREFIX) and name not in (CONFIG_ENV, TMP_BASE_ENV)
    }


def _is_section(annotation: Any) -> TypeGuard[type[BaseModel]]:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _check_env_keys() -> None:
    """pydantic-settings ignores unknown variables; a typo must not pass silently. A variable for
    a list, dict or section must hold JSON: say so here, naming it, not as pydantic-settings does."""
    for name, path in _settings_env().items():
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
            if depth == len(path) - 1:
                _check_env_json(name, path, annotation)
            if _is_section(annotation):
                model = annotation
            else:
                break


def _check_env_json(name: str, path: list[str], annotation: Any) -> None:
    """The variable for a list, dict or section (parsed as JSON by pydantic-settings) is JSON."""
    origin = get_origin(annotation) or annotation
    if origin in (list, tuple, set, frozenset):
        shape = '["value"]'
    elif origin is dict or _is_section(annotation):
        shape = '{"key": "value"}'
    else:
        return
    value = os.environ[name]
    try:
        json.loads(value)
    except ValueError:
        key = ".".join(path)
        example = JSON_EXAMPLES.get(key, shape)
        raise SettingsError(
            f"environment variable {name}: {key} must be JSON, e.g. {example!r} ({_shown(value, path)})"
        ) from None


def _is_secret(loc: list[str]) -> bool:
    """``loc`` is a secret, inside one, or a section holding one."""
    dotted = ".".join(loc)
    return any(dotted == s or dotted.startswith(s + ".") or s.startswith(dotted + ".") for s in SECRET_KEYS)


def _shown(value: Any, loc: list[str], limit: int = 60) -> str:
    """``got 'value'`` for a message, cut at ``limit`` characters; a secret's value is hidden."""
    if _is_secret(loc):
        return "value hidden"
    text = repr(value)
    return f"got {text[: limit - 3]}..." if len(text) > limit else f"got {text}"


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
    return f"{key}: {first['msg']} ({_shown(first.get('input'), loc)})"


def _overlaps(path: list[str], loc: list[str]) -> bool:
    """One key path lies inside the other (``engine.pins`` and ``engine.pins.x``, either way)."""
    n = min(len(path), len(loc))
    return path[:n] == loc[:n]


def _source_of(loc: list[str], overrides: dict[str, Any], path: Path | None) -> str:
    """Where the value at ``loc`` came from, highest layer first: ' on the command line',
    ' in environment variable NAME', ' in FILE', or '' (a default)."""
    if any(value is not None and _overlaps(key.split("."), loc) for key, value in overrides.items()):
        return " on the command line"
    names = [name for name, env_path in _settings_env().items() if _overlaps(env_path, loc)]
    if names:
        return f" in environment variable {max(names, key=len)}"
    if path is not None:
        try:
            node: Any = tomllib.loads(path.read_text())
        except (OSError, ValueError):
            return f" in {path}"
        for part in loc:
            if not isinstance(node, dict) or part not in node:
                return ""
            node = node[part]
        return f" in {path}"
    return ""


def load_settings(overrides: dict[str, Any] | None = None) -> Settings:
    """Settings from all layers; ``overrides`` (from CLI flags) win. Raises SettingsError."""
    overrides = overrides or {}
    _check_env_keys()
    path = _toml_path()
    if path is not None and path.is_dir():
        raise SettingsError(f"{CONFIG_ENV}={path} is a directory, not a settings file (name a TOML file)")
    if path is not None and not path.is_file():
        raise SettingsError(f"settings file {path} (from {CONFIG_ENV}) does not exist")
    try:
        settings = Settings(**_nest(overrides))
    except ValidationError as err:
        loc = [str(p) for p in err.errors()[0]["loc"]]
        source = _source_of(loc, overrides, path)
        raise SettingsError(f"bad setting{source}: {describe_validation_error(err)}") from None
    except SourceError as err:  # an environment value pydantic-settings cannot parse
        raise SettingsError(f"environment variables {ENV_PREFIX}*: {err}") from None
    except (OSError, ValueError) as err:  # TOML syntax errors arrive as ValueError
        raise SettingsError(f"settings file {path}: {err}") from None
    why = engine_exposed_without_key(settings)
    if why:
        raise SettingsError(f"bad setting{_source_of(['engine', 'host'], overrides, path)}: {why}")
    return settings


def engine_exposed_without_key(settings: Settings) -> str | None:
    """Why the engine must not start (vLLM would answer anyone beyond this machine, unauthenticated),
    or None. The page's own host has the same rule, with a login (``backend/page/auth.py``)."""
    e = settings.engine
    if e.api_key or is_loopback(e.host):
        return None
    return (
        f"engine.host: the engine would listen on {e.host}, beyond this machine, so it needs an API key "
        "(vLLM answers every request that reaches it), but engine.api_key is not set. Set it, in the environment:\n"
        "  ERNIECHAT_ENGINE__API_KEY=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')\n"
        'or in a settings file named by ERNIECHAT_CONFIG: [engine] api_key = "<a long random string>"\n'
        "or keep the engine on this machine (the page and the router reach it there): "
        "ERNIECHAT_ENGINE__HOST=127.0.0.1."
    )


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
