"""How the ingress turns a request into prompt text and counts its tokens, per app.

Length classes and context checks need the token count the engine will see: sim pools
count with core.token_counter (the tokenizer the sim engine counts with, so both agree),
vLLM pools use their model's own tokenizer and render chat messages with its chat
template, as vLLM's server would.
"""

from __future__ import annotations

from typing import Any, Protocol

from app.config import AppConfig
from core.token_counter import TokenCounter, default_token_counter
from engines.vllm_config import VllmEngineConfig


class PromptTokenizer(Protocol):
    def render(self, body: Any, prompt: str) -> str: ...

    def count(self, prompt: str) -> int: ...


class SimPrompts:
    """Prompt text as is, counted like the sim engine counts it."""

    def __init__(self, counter: TokenCounter | None = None) -> None:
        self.counter = counter or default_token_counter()  # loaded with the ingress, not per request

    def render(self, body: Any, prompt: str) -> str:
        return prompt

    def count(self, prompt: str) -> int:
        return self.counter.count(prompt)


class HfPrompts:
    def __init__(self, tokenizer_path: str) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)

    def render(self, body: Any, prompt: str) -> str:
        messages = getattr(body, "messages", None)
        if messages is None or self.tokenizer.chat_template is None:
            return prompt
        rendered = self.tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.text()} for m in messages], tokenize=False, add_generation_prompt=True,
        )
        assert isinstance(rendered, str)  # tokenize=False: the text
        return rendered

    def count(self, prompt: str) -> int:
        return max(len(self.tokenizer.encode(prompt)), 1)


def prompt_tokenizer(config: AppConfig) -> PromptTokenizer:
    """The vLLM pools' tokenizer if the app has any (they must share one), else the sim one."""
    paths = {p.engine.tokenizer_path for p in config.pools if isinstance(p.engine, VllmEngineConfig)}
    if len(paths) > 1:
        raise ValueError(f"the vLLM pools of one app must share a tokenizer; got {sorted(paths)}")
    return HfPrompts(paths.pop()) if paths else SimPrompts()
