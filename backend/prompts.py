"""Prompts for measuring: distinct text of a given length, and its size in the model's tokens.

Every prompt opens with a fresh nonce, so the prefix cache never answers for the engine and
each first-token time is a real prefill. Sizes are measured with the served model's
tokenizer (``engine_api.count_tokens``) once per run: ``tokens_per_word`` of this text, then words for a
target token count (``sized_prompt``). Used by the warm-up, bench, tune, bench-startup and
verify.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Sequence

import httpx
from pydantic import BaseModel

from backend.engine_api import count_tokens
from backend.errors import UsageError

WORDS = [
    "the",
    "engine",
    "reads",
    "each",
    "prompt",
    "and",
    "writes",
    "a",
    "short",
    "answer",
    "about",
    "rivers",
    "mountains",
    "cities",
    "music",
    "history",
    "science",
    "gardens",
    "weather",
    "travel",
    "cooking",
    "numbers",
    "stars",
    "oceans",
    "forests",
]
LONG_CAP = {"cpu": 1024, "cuda": 8192}
"""The longest prompt (tokens) the warm-up, bench and tune send, per device."""
SHORT_WORDS = 12
PROMPT_MARGIN = 64
"""Tokens kept free below max_model_len besides the reply (chat template, rounding)."""


def prompt_of(n_words: int) -> str:
    """Distinct text of about ``n_words`` words: a fresh nonce defeats the prefix cache."""
    words = itertools.islice(itertools.cycle(WORDS), n_words)
    return f"[{uuid.uuid4().hex[:12]}] " + " ".join(words)


async def tokens_per_word(client: httpx.AsyncClient, base_url: str, model: str, api_key: str | None) -> float:
    """How many tokens a word of ``prompt_of`` text costs, measured once with the model's tokenizer."""
    probe_words = 200
    return await count_tokens(client, base_url, model, prompt_of(probe_words), api_key) / probe_words


def sized_prompt(tokens: int, per_word: float) -> tuple[int, int]:
    """(words, tokens) for a prompt of about ``tokens`` tokens."""
    words = max(4, int(tokens / per_word))
    return words, int(words * per_word)


def prompt_room(max_model_len: int | None, max_tokens: int) -> int:
    """Prompt tokens that fit beside a ``max_tokens`` reply (no limit known: practically any)."""
    return (max_model_len or 1 << 30) - max_tokens - PROMPT_MARGIN


def long_tokens(prompt_tokens: int, device: str, room: int) -> int:
    """The 'long' prompt: 4x the workload's, within the context and the device's cap."""
    return min(4 * prompt_tokens, LONG_CAP.get(device, LONG_CAP["cuda"]), room)


class Shape(BaseModel):
    """One item of a prompt mix: its length in words, and what that is in the model's tokens."""

    words: int
    tokens: int


async def prompt_shapes(
    base_url: str,
    model: str,
    mix: Sequence[str],
    *,
    api_key: str | None,
    max_tokens: int,
    prompt_tokens: int,
    max_model_len: int | None,
    device: str = "cuda",
) -> dict[str, Shape]:
    """A :class:`Shape` for each item of the mix, measured with the model's tokenizer.

    short: a dozen words; medium: the workload's prompt length; long: 4x that, within the
    context (max_model_len − reply − margin) and the warm-up's cap for the device. A number in
    the mix is a prompt length in tokens.
    """
    room = prompt_room(max_model_len, max_tokens)
    if room < 8:
        raise UsageError(f"--max-tokens {max_tokens} leaves no room for a prompt in max_model_len {max_model_len}")
    targets: dict[str, int] = {}
    for item in mix:
        if item == "short":
            continue
        if item == "medium":
            targets[item] = min(prompt_tokens, room)
        elif item == "long":
            targets[item] = long_tokens(prompt_tokens, device, room)
        elif item.isdigit():
            targets[item] = min(int(item), room)
        else:
            raise UsageError(f"prompt mix item {item!r}: use short, medium, long or a token count")
    shapes: dict[str, Shape] = {}
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as client:
        per_word = await tokens_per_word(client, base_url, model, api_key) if targets else 0.0
        for item in mix:
            if item == "short":
                shapes[item] = Shape(words=SHORT_WORDS, tokens=0)
                continue
            words, tokens = sized_prompt(targets[item], per_word)
            shapes[item] = Shape(words=words, tokens=tokens)
        if "short" in shapes:
            shapes["short"].tokens = await count_tokens(client, base_url, model, prompt_of(SHORT_WORDS), api_key)
    return shapes


def prompt_lengths(n: int, max_words: int) -> list[int]:
    """``n`` distinct prompt lengths in words: 10, 50, 100, 200, 300, ..., scaled down to fit."""
    base = [10, 50, 100] + [100 * k for k in range(2, max(2, n - 1))]
    lengths = base[:n]
    if lengths[-1] <= max_words:
        return lengths
    if n == 1:
        return [max(1, min(10, max_words))]
    low = max(1, min(10, max_words // n))
    step = max(1, (max_words - low) // (n - 1))
    return [low + step * i for i in range(n)]


def prompts_of(lengths: Sequence[int]) -> list[str]:
    """One distinct prompt (``prompt_of``) per word count."""
    return [prompt_of(n) for n in lengths]
