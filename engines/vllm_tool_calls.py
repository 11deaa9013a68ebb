"""Tool calls as vLLM's OpenAI server makes them, by vLLM's own code: its request model
validates the body, its parser (`tool_call_parser`, a name vLLM registers: hermes,
pythonic, llama3_json, ...) constrains a "required" or named tool choice to the tools'
JSON schemas (structured outputs) and turns the model's text into `tool_calls`, whole or
streamed. Only the ingress of an app that names a parser imports this (and vLLM).

What vLLM's serving_chat adds around its parser is mirrored here: which choices get
`tool_calls`, the "tool_calls" finish reason for "auto" and "required", the first call
only when `parallel_tool_calls` is false.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from core.sampling import StructuredOutput


def _structured(params: Any) -> StructuredOutput | None:
    """vLLM's StructuredOutputsParams (a parser's constraint) as the engines' typed one."""
    if params is None:
        return None
    spec = {f.name: getattr(params, f.name) for f in dataclasses.fields(StructuredOutput)}
    if spec["json"] is not None and not isinstance(spec["json"], str):
        spec["json"] = json.dumps(spec["json"])
    if spec["choice"] is not None:
        spec["choice"] = tuple(spec["choice"])
    return StructuredOutput(**spec)


class VllmToolParsing:
    """One app's tool parsing: vLLM's parser class for `parser_name`, checked against the
    app's tokenizer at start (as vLLM's server checks it)."""

    def __init__(self, parser_name: str, tokenizer_path: str) -> None:
        from vllm.parser.parser_manager import ParserManager
        from vllm.tokenizers.registry import get_tokenizer

        self.tokenizer = get_tokenizer(tokenizer_path)
        parser_cls = ParserManager.get_parser(tool_parser_name=parser_name, enable_auto_tools=True,
                                              tokenizer=self.tokenizer)
        assert parser_cls is not None  # a tool parser was named
        self.parser_cls = parser_cls

    def prepare(self, body: dict[str, Any]) -> PreparedTools:
        """vLLM's request for `body` after the parser adjusted it (a required or named tool
        choice: the calls' schema as a structured output)."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        request = ChatCompletionRequest.model_validate(body)
        adjusted = self.parser_cls(self.tokenizer, list(request.tools or ())).adjust_request(request)
        return PreparedTools(self, adjusted, _structured(adjusted.structured_outputs))


@dataclasses.dataclass(frozen=True)
class PreparedTools:
    parsing: VllmToolParsing
    request: Any  # vLLM's ChatCompletionRequest
    structured: StructuredOutput | None  # the constraint the engine generates under

    def calls(self) -> VllmToolCalls:
        """A parser for one choice (vLLM's parsers keep a stream's state)."""
        return VllmToolCalls(self.parsing.parser_cls(self.parsing.tokenizer, list(self.request.tools or ())),
                             self.request)


class VllmToolCalls:
    def __init__(self, parser: Any, request: Any) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionNamedToolChoiceParam

        self.parser, self.request = parser, request
        self.named = isinstance(request.tool_choice, ChatCompletionNamedToolChoiceParam)
        self.required = request.tool_choice == "required"
        self.streamed_calls = False

    def message(self, text: str, token_ids: Sequence[int], finish_reason: str | None) -> tuple[dict[str, Any], str]:
        """serving_chat's whole-reply branches: content and the calls parsed from `text`."""
        from vllm.entrypoints.generate.base.protocol import ToolCall

        _, content, calls = self.parser.parse(text, self.request, enable_auto_tools=True,
                                              model_output_token_ids=list(token_ids))
        auto = self.request.tool_choice in (None, "auto")
        tool_calls = [ToolCall(id=c.id, function=c) if getattr(c, "id", None) else ToolCall(function=c)
                      for c in calls or ()] if (self.named or self.required or auto) else []
        if self.request.parallel_tool_calls is False:
            tool_calls = tool_calls[:1]
        fields: dict[str, Any] = {"content": (content or "") if (self.named or self.required) else content}
        if tool_calls:
            fields["tool_calls"] = [c.model_dump(exclude_none=True) for c in tool_calls]
        called = (auto and bool(tool_calls)) or (self.required and finish_reason == "stop")
        return fields, "tool_calls" if called else finish_reason or "stop"

    def delta(self, text: str, token_ids: Sequence[int], finish_reason: str | None) -> tuple[dict[str, Any] | None,
                                                                                                str | None]:
        """serving_chat's streamed branches: the parser's delta (None while it holds text back)."""
        # The prompt's ids only tell a reasoning parser whether reasoning ended in the prompt;
        # with none configured (this app runs none), any list puts the parser past reasoning.
        delta = self.parser.parse_delta(text, list(token_ids), self.request, [],
                                        finished=finish_reason is not None)
        if delta is not None and delta.tool_calls:
            self.streamed_calls = True
            if self.request.parallel_tool_calls is False:
                delta.tool_calls = [c for c in delta.tool_calls if c.index == 0]
        if finish_reason is not None and self.streamed_calls and not self.named and finish_reason == "stop":
            finish_reason = "tool_calls"
        return (None if delta is None else delta.model_dump(exclude_none=True)), finish_reason
