"""Prompts for measuring: distinct texts of given lengths, and the lengths verify sends."""

from __future__ import annotations

from backend.prompts import long_tokens, prompt_lengths, prompt_of, prompt_room, prompts_of, sized_prompt


def test_prompt_lengths_are_distinct_and_fit() -> None:
    assert prompt_lengths(10, 10_000) == [10, 50, 100, 200, 300, 400, 500, 600, 700, 800]
    small = prompt_lengths(10, 200)
    assert len(set(small)) == 10 and max(small) <= 200 and small == sorted(small)
    assert prompt_lengths(2, 10_000) == [10, 50]


def test_prompts_have_their_word_counts_and_different_openings() -> None:
    lengths = prompt_lengths(10, 10_000)
    prompts = prompts_of(lengths)
    assert len(set(prompts)) == 10
    assert len({p.split()[0] for p in prompts}) == 10
    header = len(prompt_of(0).split())
    assert [len(p.split()) - header for p in prompts] == lengths


def test_sized_prompts_and_the_long_prompt_fit_the_context() -> None:
    assert sized_prompt(512, 1.3) == (393, 510)
    assert sized_prompt(1, 2.0) == (4, 8), "at least four words"
    assert prompt_room(4096, 128) == 4096 - 128 - 64
    assert long_tokens(512, "cpu", 10_000) == 1024, "the CPU cap"
    assert long_tokens(512, "cuda", 10_000) == 2048 and long_tokens(512, "cuda", 300) == 300
