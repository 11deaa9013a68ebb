"""Hand-made prompt cues: what a request says about the length of its answer.

Words alone tie a length to a topic, which moves with the traffic; these cues name the
task instead (write an essay, list, translate, summarise, continue, a yes/no question),
so they carry over to conversations the model never saw.
"""

from __future__ import annotations

import math
import re

import numpy as np

_FLAGS = re.IGNORECASE | re.MULTILINE
CUES: dict[str, re.Pattern[str]] = {
    name: re.compile(pattern, _FLAGS)
    for name, pattern in {
        "long_form": r"\b(essay|article|story|blog|post|chapter|report|paper|proposal|speech|script|letter|novel"
                     r"|poem|lyrics|outline|plan|guide|course|lesson|curriculum|syllabus)\b",
        "write": r"\b(write|create|generate|draft|compose|develop|design|build|make)\b",
        "list": r"\b(list|steps|examples|ideas|ways|tips|points|bullet|table|options|suggestions|names)\b",
        "counted_items": r"\b(\d+|three|five|ten|twenty|several)\s+(ideas|examples|ways|tips|steps|questions|names"
                         r"|points|reasons|things|items)\b",
        "translate": r"\b(translate|translation|in (english|spanish|french|german|chinese|korean|japanese))\b",
        "code": r"\b(code|function|script|implement|program|class|sql|python|javascript|java|react|api|regex|bash"
                r"|css|html|typescript|golang|c\+\+|django|flask|node)\b",
        "explain": r"\b(explain|describe|elaborate|detail|detailed|comprehensive|in depth|thorough|step by step"
                   r"|step-by-step)\b",
        "summarize": r"\b(summari[sz]e|summary|tl;?dr|shorten|concise|brief|briefly|short|one sentence|one word"
                     r"|in a few words)\b",
        "continue": r"^\s*(please\s+)?(continue|go on|keep going|more|next|finish)\b|\bcontinue\b",
        "acknowledge": r"^\s*(ok|okay|thanks|thank you|great|good|nice|yes|no|cool|perfect|sure)\b[\s!.]*$",
        "rewrite": r"\b(rewrite|rephrase|revise|improve|edit|fix|correct|proofread|paraphrase|shorter|longer|expand)\b",
        "question_word": r"^\s*(what|why|how|when|where|who|which|is|are|can|could|does|do|should|would|will)\b",
        "yes_no": r"\b(yes or no|true or false)\b",
        "more": r"\b(more|another|other|again|additional|expand)\b",
        "pasted_paragraphs": r"\n\s*\n",
    }.items()
}
_WORD_COUNT = re.compile(r"\b(\d{2,4})\s*words?\b", re.IGNORECASE)
_CODE_CHARS = "{};=()<>"
N_CUES = 10 + len(CUES)


def prompt_cues(text: str, prompt_tokens: int, max_chars: int = 4000) -> list[float]:
    """One row of N_CUES numbers; regexes see the head of the prompt only (latency)."""
    head = text[:max_chars]
    n = max(len(head), 1)
    asked = _WORD_COUNT.search(head)
    row = [
        math.log1p(prompt_tokens),
        math.log1p(len(text)),
        math.log1p(text.count("\n")),
        float("```" in text),
        float(min(head.count("?"), 5)),
        float(text.rstrip().endswith("?")),
        sum(head.count(d) for d in "0123456789") / n,  # str.count runs in C: ~10x a per-character loop
        (len(head.encode()) - len(head)) / n,  # extra UTF-8 bytes: non-ASCII script
        sum(head.count(c) for c in _CODE_CHARS) / n,
        math.log1p(int(asked.group(1))) if asked else 0.0,  # "in 500 words"
    ]
    row.extend(float(pattern.search(head) is not None) for pattern in CUES.values())
    return row


def cue_matrix(texts: list[str], prompt_tokens: list[int]) -> np.ndarray:
    return np.array([prompt_cues(t, n) for t, n in zip(texts, prompt_tokens)], dtype=np.float64).reshape(-1, N_CUES)
