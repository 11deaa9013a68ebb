"""A unary response the front door assembles from the stream a cloud sent.

The front always streams from a cloud (so a request not yet started can move to another cloud,
and a started one can resume there), then joins the text for a client that asked for one
response. It joins text only: what a cloud's response carries beyond one choice's text
(n > 1, logprobs, echo, tool calls) it cannot rebuild from text deltas, so `unassemblable`
names such a parameter and the front refuses it with a 400 (a streamed request passes it
through untouched).
"""

from __future__ import annotations

import time
from typing import Any


def unassemblable(body: Any) -> str | None:
    """The first parameter of a unary request whose answer is more than one choice's text."""
    if body.n > 1:
        return "n"
    for name in ("logprobs", "top_logprobs", "prompt_logprobs", "echo", "tools"):
        if getattr(body, name, None):
            return name
    return None


def completion_body(rid: str, model: str, text: str, finish: str | None, usage: dict | None) -> dict:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}], "usage": usage}


def chat_body(rid: str, model: str, text: str, finish: str | None, usage: dict | None) -> dict:
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
            "usage": usage}
