"""How the ingress turns a request into prompt text and counts its tokens, per app.

Length classes and context checks need the token count the engine will see: sim pools
count with core.token_counter (the tokenizer the modelled engine counts with, so both agree),
vLLM pools use their model's own tokenizer and render chat messages with its chat
template, as vLLM's server would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from app.config import AppConfig
from core.token_counter import TokenCounter, default_token_counter
from engines.vllm_config import VllmEngineConfig

if TYPE_CHECKING:
    from engines.vllm_tool_calls import VllmToolParsing


class PromptTokenizer(Protocol):
    def render(self, body: Any, prompt: str) -> str:
        """The text the engine gets: a chat's messages rendered as the model's chat template
        renders them; a completion's prompt as it is."""
        ...

    def encode(self, prompt: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def token_strs(self, ids: list[int]) -> list[str]:
        """Each id's token as the vocabulary writes it (vLLM's /tokenize `token_strs`)."""
        ...


class SimPrompts:
    """Prompt text as is, counted like the modelled engine counts it."""

    def __init__(self, counter: TokenCounter | None = None) -> None:
        self.counter = counter or default_token_counter()  # loaded with the ingress, not per request

    def render(self, body: Any, prompt: str) -> str:
        return prompt

    def encode(self, prompt: str, add_special_tokens: bool = True) -> list[int]:
        return self.counter.encode(prompt)

    def decode(self, ids: list[int]) -> str:
        return self.counter.decode(ids)

    def token_strs(self, ids: list[int]) -> list[str]:
        return [self.counter.decode([i]) for i in ids]


class HfPrompts:
    def __init__(self, tokenizer_path: str) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)

    def render(self, body: Any, prompt: str) -> str:
        """vLLM's rendering: the messages, the tools (whatever the tool choice), the
        generation prompt or the last message continued, the request's template kwargs."""
        messages = getattr(body, "messages", None)
        if messages is None or self.tokenizer.chat_template is None:
            return prompt
        tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
        rendered = self.tokenizer.apply_chat_template(
            [m.for_template() for m in messages], tools=tools, tokenize=False,
            add_generation_prompt=body.add_generation_prompt, continue_final_message=body.continue_final_message,
            **(body.chat_template_kwargs or {}),
        )
        assert isinstance(rendered, str)  # tokenize=False: the text
        return rendered

    def encode(self, prompt: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens))

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids))

    def token_strs(self, ids: list[int]) -> list[str]:
        return list(self.tokenizer.convert_ids_to_tokens(ids))


def _vllm_tokenizer(config: AppConfig) -> str | None:
    paths = {p.engine.tokenizer_path for p in config.pools if isinstance(p.engine, VllmEngineConfig)}
    if len(paths) > 1:
        raise ValueError(f"the vLLM pools of one app must share a tokenizer; got {sorted(paths)}")
    return paths.pop() if paths else None


def prompt_tokenizer(config: AppConfig) -> PromptTokenizer:
    """The vLLM pools' tokenizer if the app has any (they must share one), else the sim one."""
    path = _vllm_tokenizer(config)
    return HfPrompts(path) if path is not None else SimPrompts()


def tool_parsing(config: AppConfig) -> VllmToolParsing | None:
    """The app's vLLM tool parser on its pools' tokenizer (vLLM imported only then)."""
    path = _vllm_tokenizer(config)
    if config.tool_call_parser is None or path is None:
        return None
    from engines.vllm_tool_calls import VllmToolParsing

    return VllmToolParsing(config.tool_call_parser, path)
