"""Length classes (DynamoLLM Table IV) and service classes (Chiron §6).

Defaults come from the papers; every threshold is a config field so a deployment can
re-derive them from its own traffic (DynamoLLM sets them at the 33rd/66th/100th
percentiles of the Conversation trace).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from core.slo import SLO

SIZES = ("S", "M", "L")


class LengthClassConfig(BaseModel):
    """Nine classes SS..LL from input and output length thresholds (tokens)."""

    model_config = ConfigDict(frozen=True)

    input_short_lt: int = Field(default=256, gt=0, description=(
        "Prompts shorter than this (tokens) are short input (S); DynamoLLM Table IV: <256."))
    input_medium_lt: int = Field(default=1024, gt=0, description=(
        "Prompts shorter than this (tokens) and not short are medium input (M), the rest long (L); "
        "DynamoLLM Table IV: <1024."))
    input_max: int = Field(default=8192, gt=0, description=(
        "Longest prompt of the long class (tokens); DynamoLLM Table IV: <=8192."))
    output_short_lt: int = Field(default=100, gt=0, description=(
        "Predicted outputs shorter than this (tokens) are short output (S); DynamoLLM: <100."))
    output_medium_lt: int = Field(default=350, gt=0, description=(
        "Predicted outputs shorter than this (tokens) and not short are medium output (M), the rest "
        "long (L, >=350 by default); DynamoLLM: <350."))
    ttft_s: dict[str, float] = Field(default_factory=lambda: {"S": 0.25, "M": 0.4, "L": 2.0}, description=(
        "TTFT target (s) by input size, keys S/M/L; DynamoLLM Table IV: 250 ms, 400 ms, 2000 ms."))
    tbt_s: dict[str, float] = Field(default_factory=lambda: {"S": 0.1, "M": 0.1, "L": 0.1}, description=(
        "TBT target (s) by input size, keys S/M/L; DynamoLLM Table IV: 100 ms for all."))

    @model_validator(mode="after")
    def _ordered(self) -> LengthClassConfig:
        if not self.input_short_lt < self.input_medium_lt <= self.input_max:
            raise ValueError("input thresholds must satisfy short < medium <= max")
        if not self.output_short_lt < self.output_medium_lt:
            raise ValueError("output thresholds must satisfy short < medium")
        for name, table in (("ttft_s", self.ttft_s), ("tbt_s", self.tbt_s)):
            if set(table) != set(SIZES):
                raise ValueError(f"{name} needs exactly the keys {SIZES}")
        return self

    def input_size(self, prompt_tokens: int) -> str:
        if prompt_tokens < self.input_short_lt:
            return "S"
        if prompt_tokens < self.input_medium_lt:
            return "M"
        return "L"

    def output_size(self, output_tokens: int) -> str:
        if output_tokens < self.output_short_lt:
            return "S"
        if output_tokens < self.output_medium_lt:
            return "M"
        return "L"

    def classify(self, prompt_tokens: int, predicted_output_tokens: int) -> str:
        """Two-letter class name: input size then output size, e.g. 'MS'."""
        return self.input_size(prompt_tokens) + self.output_size(predicted_output_tokens)

    def slo(self, length_class: str) -> SLO:
        size = length_class[0]
        return SLO(ttft_s=self.ttft_s[size], tbt_s=self.tbt_s[size])

    @staticmethod
    def names() -> list[str]:
        return [i + o for i in SIZES for o in SIZES]


class ServiceClass(BaseModel):
    """A tenant-facing class of service with its own SLO (Chiron: interactive vs batch)."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="The class's name (interactive, batch, ...); matches its key in `services`.")
    slo: SLO = Field(description="The class's latency targets.")
    tighten_with_length_class: bool = Field(default=False, description=(
        "Requests of this class also meet their length class's tighter DynamoLLM targets (the "
        "element-wise minimum); the default interactive class sets it."))


def default_service_classes() -> dict[str, ServiceClass]:
    """Chiron §6: interactive TTFT 10 s / ITL 200 ms; batch TTFT 1 h / ITL 2 s."""
    return {
        "interactive": ServiceClass(
            name="interactive", slo=SLO(ttft_s=10.0, tbt_s=0.2), tighten_with_length_class=True
        ),
        "batch": ServiceClass(name="batch", slo=SLO(ttft_s=3600.0, tbt_s=2.0)),
    }
