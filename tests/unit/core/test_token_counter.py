"""Sim pools count tokens as a client with a real tokenizer does (core.token_counter).

The bug this guards: a client's 256-token prompt was counted as ~36 whitespace words, so
length classes, context checks and usage disagreed with `vllm bench serve`.
"""

from __future__ import annotations

import gzip
import logging
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from app.prompt_tokenizer import SimPrompts
from core.token_counter import (
    TOKENIZER_FILE,
    BpeTokenCounter,
    WordTokenCounter,
    count_tokens,
    default_token_counter,
    load_token_counter,
)
from engines.modelled_engine import _WORDS, ModelledEngine, placeholder_text


@pytest.fixture(scope="module")
def counter() -> BpeTokenCounter:
    c = default_token_counter()
    assert isinstance(c, BpeTokenCounter), "the shipped tokenizer must load"
    return c


def test_counts_are_tokens_not_words(counter: BpeTokenCounter) -> None:
    assert counter.count("Hello world, the of and") == 6  # "," is a token of its own
    assert counter.count("tokenization") > 1  # one word, several tokens
    assert counter.count("") == 1  # an empty prompt still costs a step


def test_a_benchmark_prompt_counts_as_the_client_counts(counter: BpeTokenCounter) -> None:
    """`vllm bench serve`'s random dataset decodes N random token ids into the prompt;
    re-encoding it gives back about N, where whitespace words gave a fraction of N."""
    tokenizer = Tokenizer.from_str(gzip.decompress(TOKENIZER_FILE.read_bytes()).decode())
    rng = random.Random(7)
    ids = [rng.randrange(1000, 40_000) for _ in range(256)]
    prompt = tokenizer.decode(ids)
    assert abs(counter.count(prompt) - 256) <= 256 * 0.1
    assert abs(WordTokenCounter().count(prompt) - 256) > 256 * 0.1  # the old count fails this


def test_placeholder_output_counts_as_the_engine_reports(counter: BpeTokenCounter) -> None:
    """The modelled engine reports n completion tokens for n placeholder words: a client that
    tokenizes the text must count n too."""
    assert all(counter.count(" " + w) == 1 for w in _WORDS)
    for rid in ("cmpl-1", "chatcmpl-zz", "r"):
        for start, n in ((0, 1), (0, 40), (17, 300)):
            assert counter.count(placeholder_text(rid, start, n)) == n


def test_nul_and_other_control_characters_are_counted(counter: BpeTokenCounter) -> None:
    assert counter.count("a\x00b") == 3


def test_ingress_and_modelled_engine_count_alike() -> None:
    prompt = "Summarise: the GPU's clock (1980 MHz) sets tokens/s and J/token."
    assert len(SimPrompts().encode(prompt)) == ModelledEngine().count_tokens(prompt) == count_tokens(prompt)
    assert count_tokens(prompt) > len(prompt.split())


def test_missing_tokenizer_falls_back_to_words_and_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="core.token_counter"):
        fallback = load_token_counter(tmp_path / "absent.json.gz")
    assert isinstance(fallback, WordTokenCounter) and fallback.count("two words") == 2
    assert "fall back to whitespace words" in caplog.text and "absent.json.gz" in caplog.text
