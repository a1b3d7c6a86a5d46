"""The demo checkpoint's tokenizer: a byte-level BPE trained in-process, and ERNIE's chat template.

Imported by ``backend.demo.checkpoint`` inside the engine's environment; ``tokenizers`` is imported only
when a tokenizer is built, so the app's environment can import the constants.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from tokenizers import Tokenizer

SPECIAL_TOKENS: Final = ("<unk>", "<s>", "</s>", "<|begin_of_sentence|>", "<|end_of_sentence|>")
"""Special tokens, in id order from 0."""
END_OF_SENTENCE_ID: Final = SPECIAL_TOKENS.index("<|end_of_sentence|>")

CHAT_TEMPLATE: Final = (
    "{%- if not add_generation_prompt is defined -%}"
    "{%- set add_generation_prompt = true -%}{%- endif -%}\n"
    '{{- "<|begin_of_sentence|>" -}}\n'
    "{%- for message in messages -%}\n"
    '{%- if message["role"] == "system" -%}{{- message["content"] + "\\n" -}}\n'
    '{%- elif message["role"] == "user" -%}{{- "User: " + message["content"] + "\\n" -}}\n'
    '{%- elif message["role"] == "assistant" -%}'
    '{{- "Assistant: " + message["content"] + "<|end_of_sentence|>" -}}\n'
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    '{%- if add_generation_prompt -%}{{- "Assistant: " -}}{%- endif -%}'
)

BPE_TRAINED_VOCAB: Final = 2048
"""Upper bound for the trained part of the vocabulary (the corpus runs out first)."""
PSEUDO_WORD_SEED: Final = 4096
"""Fixed seed for the order of padding pseudo-words; independent of the weight seed."""

CORPUS: Final = """\
This is a demonstration model. It has the same shape as a small ERNIE chat model,
but its weights were drawn at random from a fixed seed, so whatever it says is noise.
The tokenizer was trained on these few paragraphs when the checkpoint was written.

User: Hello! Can you help me plan a trip to the mountains next week?
Assistant: Of course. How many days do you have, and do you prefer hiking or a quiet
cabin by the lake? The weather in the hills can change quickly, so pack a warm jacket.

A language model reads text as a sequence of tokens. Each token is a short piece of
a word, a whole word, a number, or a mark of punctuation. The model looks at the tokens
it has seen so far and assigns a probability to every token that could come next; then
one token is chosen, added to the text, and the process repeats until the answer ends.

The server keeps a cache of keys and values for every request, so that earlier tokens
are not computed again. Requests that arrive together are batched, which keeps the
processor busy and makes the total throughput much higher than serving them one by one.

Numbers matter too: 1, 2, 3, 10, 42, 100, 2024, 3.14 and 0.5 are common in questions
about time, money, distance and size. What is 12 times 7? It is 84. Is 17 a prime number?
Yes, it is. The meeting starts at 9:30 and ends at 11:00; please don't be late!

Good writing is clear and simple. Say what you mean, use short sentences when you can,
and give an example when an idea is hard. If you are not sure about a fact, say so, and
explain how the reader could check it. Thank you for reading, and have a nice day.
"""


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, as byte-level BPE uses it."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def silent_ids(vocab: Mapping[str, int]) -> list[int]:
    """Ids of the tokens that stream no visible text on their own: the special tokens, and
    pieces whose bytes are not whole UTF-8. vLLM's detokenizer holds back a trailing U+FFFD
    while it waits for the rest of a character, so a greedy reply stuck on one such byte
    (``É``, 0xC9) streamed 16 tokens and no text: about 1 prompt in 50 on the page."""
    to_byte = {c: b for b, c in _bytes_to_unicode().items()}
    out = []
    for piece, idx in vocab.items():
        if piece in SPECIAL_TOKENS:
            out.append(idx)
            continue
        try:
            bytes(to_byte[c] for c in piece).decode("utf-8")
        except UnicodeDecodeError:
            out.append(idx)
    return sorted(out)


def _alphabet() -> list[str]:
    """The byte alphabet minus ASCII control bytes, which would decode to invisible text.

    Tab, newline and carriage return stay (the chat template needs newlines); the
    other control bytes map to ``<unk>``. Bytes 0x80-0xFF stay so that any UTF-8 text
    can be encoded; the model never writes them alone (``silent_ids``).
    """
    table = _bytes_to_unicode()
    keep = [b for b in range(256) if not ((b < 0x20 and b not in (0x09, 0x0A, 0x0D)) or b == 0x7F)]
    return sorted(table[b] for b in keep)


def _pseudo_words() -> list[str]:
    """Plain pronounceable pseudo-words (" kato", " renmi"), in a fixed shuffled order."""
    consonants = "bdfghklmnprstvz"
    vowels = "aeiou"
    finals = ("", "n", "r", "l", "s")
    syllables = [c + v + f for c in consonants for v in vowels for f in finals]
    words = [a + b for a, b in itertools.product(syllables, repeat=2)]
    random.Random(PSEUDO_WORD_SEED).shuffle(words)
    return words


def build_tokenizer(vocab_size: int) -> Tokenizer:
    """Byte-level BPE trained on ``CORPUS``, padded with pseudo-words to ``vocab_size``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS[0]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(vocab_size, BPE_TRAINED_VOCAB),
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=_alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS.split("\n\n"), trainer=trainer)

    data = json.loads(tokenizer.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    if len(vocab) > vocab_size:
        raise ValueError(f"trained vocabulary ({len(vocab)}) exceeds vocab_size {vocab_size}")
    space = _bytes_to_unicode()[ord(" ")]
    next_id = len(vocab)
    for word in _pseudo_words():
        if next_id >= vocab_size:
            break
        piece = space + word
        if piece not in vocab:
            vocab[piece] = next_id
            next_id += 1
    if next_id != vocab_size:
        raise ValueError(f"not enough pseudo-words to pad the vocabulary to {vocab_size}")
    padded = Tokenizer.from_str(json.dumps(data, ensure_ascii=False))
    if padded.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise AssertionError("tokenizer size does not match vocab_size")
    return padded


def write_tokenizer(directory: Path, tokenizer: Tokenizer, model_max_length: int) -> None:
    """tokenizer.json, tokenizer_config.json (with the chat template) and special_tokens_map.json."""
    tokenizer.save(str(directory / "tokenizer.json"))
    special_map = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<unk>",
        "cls_token": "<|begin_of_sentence|>",
        "sep_token": "<|end_of_sentence|>",
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special_map,
        "additional_special_tokens": ["<|begin_of_sentence|>", "<|end_of_sentence|>"],
        "added_tokens_decoder": {
            str(i): {
                "content": tok,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for i, tok in enumerate(SPECIAL_TOKENS)
        },
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "padding_side": "left",
        "chat_template": CHAT_TEMPLATE,
    }
    write_json(directory / "tokenizer_config.json", config)
    write_json(
        directory / "special_tokens_map.json",
        {**special_map, "additional_special_tokens": config["additional_special_tokens"]},
    )


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
