"""The `engine:` block of a pool whose replicas are simulated GPUs (engines.modelled_engine), apart
from the engine itself: the app's config, the gateway and the ingress read it without
importing the batcher and the throttLL'eM model behind the engine (scikit-learn among them)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autoscaling.splitwise.config import MachineConfig
from autoscaling.throttllem.config import ThrottllemConfig
from core.overheads import OverheadTable


class ModelledEngineConfig(BaseModel):
    """A modelled replica: which GPU and model it imitates, at which TP and clock."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(default="llama2-70b", description="Model the replica imitates (a perf model's model name).")
    hardware: str = Field(default="h100-80gb", description="GPU the replica imitates (a perf model's hardware name).")
    profile: str | None = Field(default=None, description=(
        "Named perf/power profile (energy.profiles) the replica is modelled on; None: the default for"
        " model and hardware (energy.profiles.default_profile). "
        "A throttllem block follows it unless it names its own (AppConfig refuses another)."))
    tensor_parallel: int = Field(default=8, gt=0, description="GPUs per replica (tensor parallelism) at start.")
    clock_mhz: float = Field(default=1980, gt=0, description=(
        "GPU clock at start (MHz); 1980 is the H100's maximum."))
    batch_limit: int = Field(default=256, gt=0, description="Most requests in one running batch.")
    max_batched_tokens: int = Field(default=8192, gt=0, description=(
        "Most tokens (prefill plus decode) one engine step processes."))
    step_time_target_s: float | None = Field(default=None, gt=0, description=(
        "Chunked prefill sized to the TBT target: a step takes at most the tokens whose step fits "
        "in this long at the replica's TP (batching.step_budget; the one controller's replicas: the "
        "tightest TBT target, 0.1 s) at the replica's TP and the clock it runs; beside interactive "
        "decodes the chunks are trimmed so that the step fits (or runs only on time those decodes "
        "banked under their mean TBT). None: every step may take max_batched_tokens."))
    interactive_first: bool = Field(default=False, description=(
        "Chiron's mixed replicas: interactive requests go first and preempt batch ones."))
    prefill_by_ttft_deadline: bool = Field(default=False, description=(
        "Prompts prefill earliest TTFT deadline first (arrival + target), ahead of a running prompt's "
        "remaining chunks due later: on a replica serving every length class a short prompt waits "
        "for the step in flight, not for a long prompt's whole prefill. A prompt already past its "
        "deadline goes behind those still on time (batching.deadline_order). False: arrival order."))
    squash_after_s: float | None = Field(default=60.0, gt=0, description=(
        "Requests that never started within this long (s) and their TTFT target are dropped with "
        "RequestSquashed so the client retries elsewhere; None keeps them waiting."))
    max_waiting_requests: int | None = Field(default=256, gt=0, description=(
        "Overload: at most this many requests wait in the replica; more are shed (RequestShed -> "
        "503 + Retry-After). None: unbounded."))
    shed_wait_factor: float | None = Field(default=10.0, gt=0, description=(
        "Overload: a request that would queue behind one waiting longer than this many times its "
        "TTFT target is shed (RequestShed -> 503 + Retry-After). None: never shed."))
    throttllem: ThrottllemConfig | None = Field(default=None, description=(
        "throttLL'eM admission control and clock throttling in the batcher; None: FCFS at clock_mhz. "
        "Its model, hardware and profile are this engine's where it leaves them out; its length_error "
        "defaults to the ingress predictor's measured overrun when left at 0."))
    splitwise: MachineConfig | None = Field(default=None, description=(
        "Splitwise: the replica's phase pool adds its batcher hooks (§IV-B); None: none."))
    prefix_block_tokens: int = Field(default=0, ge=0, description=(
        "Set by the app from its prefix_cache: the replica caches prompts' prefix blocks of this many "
        "tokens as vLLM caches prefixes, and prefills only what it does not hold. 0: no prefix cache."))
    overheads: OverheadTable = Field(default_factory=OverheadTable, description=(
        "What a TP change (start-up of the new engine) and a clock change (the GPUs take it late) "
        "cost: the table the planners assume and the simulator charges."))

    @model_validator(mode="before")
    @classmethod
    def _throttllem_models_this_engine(cls, data: Any) -> Any:
        """throttLL'eM's M models the replica it runs in: a `throttllem:` block that leaves out
        model, hardware or profile takes the engine's, so a pool moved to another model needs no
        second edit."""
        if not isinstance(data, dict) or not isinstance(data.get("throttllem"), dict):
            return data
        engine = {key: data[key] for key in ("model", "hardware", "profile") if key in data}
        return {**data, "throttllem": {**engine, **data["throttllem"]}}
