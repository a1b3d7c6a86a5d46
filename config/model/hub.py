"""A hub model's config.json through the local Hugging Face cache (``HF_HOME`` / ``HF_HUB_CACHE``,
``HF_HUB_OFFLINE``); the hub itself only when it answers."""

from __future__ import annotations

import os
import socket
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlparse

from config.errors import ModelReadError


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _hub_cache_dir() -> Path:
    """HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub, read at call time.

    huggingface_hub reads these once at import; reading them per call keeps a changed
    environment (tests, a settings reload) honoured.
    """
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(key):
            return Path(os.environ[key]).expanduser()
    home = os.environ.get("HF_HOME") or str(Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface")
    return Path(home).expanduser() / "hub"


@lru_cache(maxsize=1)
def hub_reachable(timeout_s: float = 2.0) -> bool:
    """Whether the hub answers at all: huggingface_hub retries ~24 s before giving up."""
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection((url.hostname or "", url.port or 443), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def offline_reason() -> str | None:
    """Why the hub is not asked (``HF_HUB_OFFLINE`` set, or no answer), or None when it answers."""
    if _env_flag("HF_HUB_OFFLINE"):
        return "offline: HF_HUB_OFFLINE is set"
    return None if hub_reachable() else f"offline: no answer from {os.environ.get('HF_ENDPOINT') or 'huggingface.co'}"


def not_cached(where: str, why: str) -> ModelReadError:
    """A hub model that is not in the cache, and the hub not asked or not answering (``why``)."""
    return ModelReadError(f"{where}: not in the local Hugging Face cache and the hub cannot be reached ({why})")


def hub_config(repo_id: str, revision: str | None) -> Path:
    """config.json of a hub model via the local cache; the hub only when not offline."""
    from huggingface_hub import errors as hub
    from huggingface_hub import hf_hub_download  # lazy: only hub ids need it

    why_offline = offline_reason()
    offline = why_offline is not None
    where = f"model '{repo_id}'" + (f" (revision {revision})" if revision else "")
    try:
        path = hf_hub_download(
            repo_id,
            "config.json",
            revision=revision,
            cache_dir=_hub_cache_dir(),
            local_files_only=offline,
        )
    except hub.HFValidationError:
        raise ModelReadError(f"model '{repo_id}': not a local directory and not a valid Hugging Face id") from None
    except hub.LocalEntryNotFoundError:
        raise not_cached(where, why_offline or "its download failed") from None
    except hub.GatedRepoError:
        raise ModelReadError(f"{where}: gated on the hub; accept its license and set HF_TOKEN") from None
    except hub.RevisionNotFoundError:
        raise ModelReadError(f"{where}: no such revision on the Hugging Face hub") from None
    except hub.RepositoryNotFoundError:
        raise ModelReadError(f"{where}: no such model on the Hugging Face hub (private? set HF_TOKEN)") from None
    except hub.EntryNotFoundError:
        raise ModelReadError(f"{where}: the repository has no config.json") from None
    except (hub.HfHubHTTPError, OSError) as err:
        raise ModelReadError(f"{where}: cannot fetch config.json ({type(err).__name__}: {err})") from None
    return Path(str(path))
