"""Latency targets of one request."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SLO(BaseModel):
    """Time to first token, time between tokens and end-to-end deadline, in seconds."""

    model_config = ConfigDict(frozen=True)

    ttft_s: float = Field(gt=0, description="Time to first token target (s).")
    tbt_s: float = Field(gt=0, description="Time between tokens (inter-token latency) target (s).")
    e2e_s: float | None = Field(default=None, gt=0, description=(
        "End-to-end deadline (s); None: TTFT plus one TBT per further output token."))

    def e2e_for(self, output_tokens: int) -> float:
        """E2E deadline: explicit if set, else TTFT plus one TBT per further token."""
        if self.e2e_s is not None:
            return self.e2e_s
        return self.ttft_s + self.tbt_s * max(output_tokens - 1, 0)

    def tightest(self, other: SLO) -> SLO:
        """Element-wise minimum: a request must meet both sets of targets."""
        e2e = [v for v in (self.e2e_s, other.e2e_s) if v is not None]
        return SLO(
            ttft_s=min(self.ttft_s, other.ttft_s),
            tbt_s=min(self.tbt_s, other.tbt_s),
            e2e_s=min(e2e) if e2e else None,
        )
