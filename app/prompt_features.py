"""Prompt text -> sparse features for the length predictor, in a fixed-size hashed space.

Hashing (no vocabulary) lets the model learn online from unseen words without refitting
a vectoriser. Besides word 1-2 grams, marker tokens carry what shapes an answer's length:
the prompt's size, code fences, questions, list requests and chat turns.
"""

from __future__ import annotations

import math
import re

from scipy.sparse import csr_matrix
from sklearn.feature_extraction.text import HashingVectorizer

_TURN = re.compile(r"^(user|assistant|system):", re.MULTILINE)
_LIST = re.compile(r"\b(list|steps|outline|examples|ideas|table)\b", re.IGNORECASE)


def markers(text: str, prompt_tokens: int) -> str:
    """Synthetic words describing the prompt's shape, appended to its text."""
    tags = [f"__plen{int(math.log2(max(prompt_tokens, 1)))}__", f"__lines{min(text.count(chr(10)), 8)}__"]
    if "```" in text:
        tags.append("__code__")
    if "?" in text:
        tags.append("__question__")
    if _LIST.search(text):
        tags.append("__list__")
    tags.append(f"__turns{min(len(_TURN.findall(text)), 6)}__")
    return " ".join(tags)


class PromptFeaturizer:
    """Stateless: the same text always maps to the same row."""

    def __init__(self, n_features: int = 2**18, max_chars: int = 4000) -> None:
        self.max_chars = max_chars  # long prompts: the head says what is asked; caps latency
        self._vectorizer = HashingVectorizer(
            n_features=n_features, ngram_range=(1, 2), alternate_sign=False, norm="l2", lowercase=True,
        )

    def transform(self, texts: list[str], prompt_tokens: list[int]) -> csr_matrix:
        docs = [t[: self.max_chars] + " " + markers(t, n) for t, n in zip(texts, prompt_tokens)]
        return self._vectorizer.transform(docs)
