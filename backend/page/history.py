"""Which turns of a conversation fit the engine's context window, with room left for the reply.

Counting tokens exactly needs the engine's ``/tokenize`` (the model's own tokenizer and chat
template): a round trip before the reply can start. So a message is sent without any count
when an upper bound already fits: every token covers at least one byte of text (byte-level
BPE; SentencePiece with byte fallback, after its NFKC normalisation), plus the template's own
tokens, measured once per engine start (:class:`TemplateCost`). Only a conversation near the
limit is counted exactly, and then trimmed oldest turn first by bisection.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from backend.errors import TooLong

Message = dict[str, str]
Counter = Callable[[list[Message]], Awaitable[int]]

SLACK_PER_MESSAGE = 4
"""Tokens added to the bound per message: a dummy-prefix or boundary token, and room for roles
whose template markup is a little longer than the measured one."""


@dataclass(frozen=True)
class TemplateCost:
    """Tokens the chat template adds: for one empty user message (with the generation prompt),
    and for each further message."""

    first: int
    per_message: int

    @classmethod
    async def measure(cls, count: Counter) -> TemplateCost:
        empty = [{"role": "user", "content": ""}]
        one = await count(empty)
        with_system = await count([{"role": "system", "content": ""}, *empty])
        three = await count([*empty, {"role": "assistant", "content": ""}, *empty])
        per = max(with_system - one, -(-(three - one) // 2), 0)
        return cls(first=one, per_message=per)

    def bound(self, messages: list[Message]) -> int:
        """At least as many tokens as ``messages`` take with this template."""
        text = sum(_text_bytes(m.get("content", "")) for m in messages)
        return self.first + self.per_message * (len(messages) - 1) + SLACK_PER_MESSAGE * len(messages) + text


def valid_text(text: str) -> str:
    """``text`` as the engine can take it: a lone surrogate (which a script, not a browser, can send)
    becomes U+FFFD instead of failing the request's JSON; valid text is unchanged."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _text_bytes(text: str) -> int:
    return max(len(text.encode()), len(unicodedata.normalize("NFKC", text).encode()))


@dataclass
class Fitted:
    """The request to send: system prompt, the turns that fit, the new message."""

    messages: list[Message]
    prompt_tokens: int
    """Exact when counted; else the upper bound that showed it fits."""
    kept_turns: int
    dropped_turns: int
    window: int
    counted: bool
    """Whether ``/tokenize`` was asked (only near the context limit)."""


async def fit(
    history: list[Message],
    text: str,
    *,
    system_prompt: str,
    reply_tokens: int,
    window: int,
    template: TemplateCost,
    count: Counter,
) -> Fitted:
    """System prompt + as many recent turns as fit + the new message, leaving ``reply_tokens``
    for the reply. Raises TooLong when the new message cannot fit even alone."""
    limit = window - reply_tokens
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    new = [{"role": "user", "content": text}]
    turns = [history[i : i + 2] for i in range(0, len(history), 2)]

    def build(drop: int) -> list[Message]:
        return system + [m for turn in turns[drop:] for m in turn] + new

    bound = template.bound(build(0))
    if bound <= limit:
        return Fitted(build(0), bound, len(turns), 0, window, counted=False)
    alone = await count(system + new)
    if alone > limit:
        system_tokens = await count(system) if system else 0
        raise TooLong(alone, max(limit, 0), window, reply_tokens, len(turns), system_tokens)
    tokens = await count(build(0)) if turns else alone
    if tokens <= limit:
        return Fitted(build(0), tokens, len(turns), 0, window, counted=True)
    fits, fails = len(turns), 0  # dropping every turn fits, dropping none does not
    tokens = alone
    while fits - fails > 1:
        mid = (fits + fails) // 2
        n = await count(build(mid))
        if n <= limit:
            fits, tokens = mid, n
        else:
            fails = mid
    return Fitted(build(fits), tokens, len(turns) - fits, fits, window, counted=True)
