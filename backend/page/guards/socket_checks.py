"""What each socket event Chainlit 2.12 accepts must carry, and the sentence that says why one does not.

The browser sends only well-formed events; a script can send anything. Chainlit's handlers read their
payloads as the browser sends them and fail on anything else with Python's own words, in the chat or
as a traceback in the log (a string where a dict goes, a missing argument, an event for a feature this
page has off, such as editing a sent message or voice input, which Chainlit runs all the same).
``chainlit_internals.guard_socket_events`` checks each event against :func:`rules` before Chainlit
sees it and answers a refused one in one sentence.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Why = Callable[[Any], str | None]
"""Why a payload is refused (None: it is not)."""
CANNOT_CONNECT = "this socket did not say which chat it is for (its auth object is not a chat page's)"


@dataclass(frozen=True)
class Rule:
    """One event: whether Chainlit's handler takes a payload, why one is refused, and whether the
    refusal is said every time (a chat message) or once per chat (a stream of audio chunks)."""

    payload: bool
    why_not: Why
    every_time: bool = False


def _anything(payload: Any) -> str | None:
    return None


def unreadable_message(payload: Any) -> str | None:
    """Why a ``client_message`` payload is not a message Chainlit can read, or None."""
    if not isinstance(payload, dict):
        return "it is not a chat message"
    step = payload.get("message")
    if not isinstance(step, dict):
        return "it has no message"
    if not isinstance(step.get("id"), str):
        return "it has no id"
    try:
        if uuid.UUID(step["id"]).version != 4:
            raise ValueError
    except ValueError:
        return "its id is not a random UUID"
    if not isinstance(step.get("output"), str):
        return "it has no text"
    if "createdAt" not in step:
        return "it has no creation time"
    files = payload.get("fileReferences")
    if files is not None and not (isinstance(files, list) and all(isinstance(f, dict) and "id" in f for f in files)):
        return "its attachments cannot be read"
    return None


def _message(payload: Any) -> str | None:
    why = unreadable_message(payload)
    return f"That message could not be read ({why}); nothing was sent to the engine." if why else None


def _settings(payload: Any) -> str | None:
    if isinstance(payload, dict):
        return None
    return "Those chat settings could not be read (they are not named values); nothing was changed."


def _off(sentence: str) -> Why:
    return lambda payload: sentence


def _favorite(payload: Any) -> str | None:
    step = payload.get("message") if isinstance(payload, dict) else None
    if isinstance(step, dict) and isinstance(step.get("id"), str):
        return None
    return "That favourite could not be read (it names no message); nothing was changed."


def _audio_chunk(payload: Any) -> str | None:
    fields: dict[str, type | tuple[type, ...]] = {
        "isStart": bool,
        "mimeType": str,
        "elapsedTime": (int, float),
        "data": (bytes, bytearray),
    }
    if isinstance(payload, dict) and all(isinstance(payload.get(k), t) for k, t in fields.items()):
        return None
    return "That piece of audio could not be read; nothing was sent to the engine."


def _edited(payload: Any) -> str | None:
    why = unreadable_message(payload)
    return f"That edit could not be read ({why}); nothing was changed." if why else None


def rules(edit: bool, audio: bool, favorites: bool) -> dict[str, Rule]:
    """Every event Chainlit 2.12 handles but ``connect`` and ``disconnect`` (which no script sends as an
    event), for a page with message editing, voice input and favourites on or off."""
    voice_off = _off("Voice input is off on this page; type your message instead.")
    no_payload = Rule(payload=False, why_not=_anything)
    return {
        "connection_successful": no_payload,
        "clear_session": no_payload,
        "stop": no_payload,
        "fetch_favorites": no_payload,
        "client_message": Rule(payload=True, why_not=_message, every_time=True),
        "chat_settings_change": Rule(payload=True, why_not=_settings, every_time=True),
        "chat_settings_edit": Rule(payload=True, why_not=_settings),
        "window_message": Rule(payload=True, why_not=_anything),
        "edit_message": Rule(
            payload=True,
            why_not=_edited if edit else _off("Editing a sent message is off on this page; send a new one instead."),
        ),
        "message_favorite": Rule(
            payload=True, why_not=_favorite if favorites else _off("Favourites are off on this page.")
        ),
        "audio_start": Rule(payload=False, why_not=_anything if audio else voice_off),
        "audio_chunk": Rule(payload=True, why_not=_audio_chunk if audio else voice_off),
        "audio_end": Rule(payload=False, why_not=_anything if audio else voice_off),
    }


def connect_refusal(auth: Any) -> str | None:
    """Why a socket's ``connect`` auth object is refused (Chainlit reads ``sessionId`` and ``clientType``
    and failed with an AttributeError on anything else), or None."""
    if not isinstance(auth, dict) or not isinstance(auth.get("sessionId"), str) or not auth["sessionId"]:
        return CANNOT_CONNECT
    if not isinstance(auth.get("clientType"), str):
        return CANNOT_CONNECT
    for key in ("threadId", "userEnv", "chatProfile"):
        if auth.get(key) is not None and not isinstance(auth[key], str):
            return CANNOT_CONNECT
    if auth.get("userEnv"):
        try:
            if not isinstance(json.loads(auth["userEnv"]), dict):
                return CANNOT_CONNECT
        except ValueError:
            return CANNOT_CONNECT
    return None
