"""Snapshot of one replica, the only thing controllers learn about it."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from core.replica_choice import ReplicaOccupancy

RATE_PREFIX = "rate_per_s."
# Serve carries stats as flat floats: each per-class field travels as one key per class.
CLASS_FIELD_PREFIXES = {
    "class_rates_per_s": RATE_PREFIX,
    "class_prompt_tokens_per_s": "prompt_tokens_per_s.",
    "slo_completed": "slo_completed.",
    "slo_met": "slo_met.",
    "slo_late": "slo_late.",
}


@dataclass(frozen=True)
class ReplicaStats:
    """What a replica reports each sampling period (a vLLM replica reports the same)."""

    queued_requests: int = 0
    running_requests: int = 0
    batch_limit: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 1
    kv_block_size: int = 16  # tokens per KV block
    pending_prompt_tokens: int = 0
    pending_decode_tokens: int = 0
    itl_ewma_s: float = 0.0
    ttft_ewma_s: float = 0.0  # interactive requests only: batch work waits by design
    tokens_per_s: float = 0.0
    clock_mhz: float = 0.0
    power_w: float = 0.0
    # GPU energy since the replica started, as the perf/power model gives it (the modelled engine's
    # steps; a vLLM replica's: the model's joules for its steps' work) and as the GPUs' energy
    # counter measures it (NVML), each with the part spent while no request was inside (idle:
    # charged to no request). `energy_modelled` / `energy_measured`: whether the replica has it.
    energy_j: float = 0.0
    idle_energy_j: float = 0.0
    energy_modelled: bool = True
    nvml_energy_j: float = 0.0
    nvml_idle_energy_j: float = 0.0
    energy_measured: bool = False
    tensor_parallel: int = 1
    preemptions: int = 0
    completed_requests: int = 0
    tokens_generated: int = 0
    interactive_running: int = 0  # Chiron's IBP counts replicas running interactive work
    batch_waiting: int = 0  # batch requests among queued_requests (they may wait: not overload)
    # Batch service-class arrivals over the same window (a share of class_rates_per_s).
    batch_rate_per_s: float = 0.0
    # The engine's step time over what the planner's perf model gives for the same steps
    # (batching.step_speed): 2.0 runs twice as slow as planned; 1.0 as planned (or the engine
    # runs the planner's model itself); 0.0 not measured yet (no step timed).
    step_time_ratio: float = 1.0
    # The engine picks each step's clock inside the plan's band (throttLL'eM's hook); False:
    # it runs at the band's floor, which must then carry the load (a vLLM replica here).
    per_step_clock: bool = False
    # The lowest clock that per-step choice runs at (throttLL'eM's least-energy clock,
    # ThrottllemConfig.energy_floor), whatever the band's floor: what the planner prices the
    # replica at when its load needs less. 0: the band's floor.
    step_clock_floor_mhz: float = 0.0
    # Prompts prefill in TTFT-deadline order, each step at most this long at the clock it runs
    # (the batcher's step_time_target_s): a prompt waits for one such step of a prompt due
    # later, not its whole prefill (a vLLM replica: its measured inter-token gap). 0: in arrival
    # order (vLLM's default scheduler), or nothing measured yet. A float,
    # not None: Serve carries replica stats as flat floats.
    deadline_prefill_step_s: float = 0.0
    # Prompt tokens of the requests it started since its start, and of those, what its prefix
    # cache held (prefill it skipped): the planner counts the pool's hit rate in its capacity.
    prompt_tokens_started: int = 0
    prompt_tokens_cached: int = 0
    # Its steps' time over that time plus the prefill its cache hits skipped (as the perf model
    # costs it): the share of the profile's work per request it does. 1.0: no hits (or unknown).
    prefix_work_ratio: float = 1.0
    # Arrivals per length class over a trailing window (DynamoLLM's per-class load).
    class_rates_per_s: dict[str, float] = field(default_factory=dict)
    # Their prompt tokens per second over the same window: with the rates, each class's mean
    # prompt, which the planner weighs against the one its profile assumed (prompt_work).
    class_prompt_tokens_per_s: dict[str, float] = field(default_factory=dict)
    # Interactive requests finished per length class over a trailing window, and those of
    # them that met their SLO (core.slo_outcomes): the controller's SLO guard sums them.
    slo_completed: dict[str, int] = field(default_factory=dict)
    slo_met: dict[str, int] = field(default_factory=dict)
    # Interactive requests on the replica past their TTFT deadline with no token yet: misses
    # already, counted as soon as they are (a queue in a burst drains tens of seconds later).
    slo_late: dict[str, int] = field(default_factory=dict)

    @property
    def kv_utilisation(self) -> float:
        return self.kv_blocks_used / max(self.kv_blocks_total, 1)

    @property
    def load(self) -> int:
        """Requests on the replica, waiting or running."""
        return self.queued_requests + self.running_requests

    def occupancy(self) -> ReplicaOccupancy:
        """What routing reads (core.replica_choice)."""
        return ReplicaOccupancy.of(self.load, self.kv_blocks_used, self.kv_blocks_total, self.kv_block_size,
                                   self.pending_prompt_tokens)

    def to_metrics(self) -> dict[str, float]:
        """Flat float dict, the shape Serve's record_autoscaling_stats expects."""
        flat = {f.name: float(getattr(self, f.name)) for f in fields(self) if f.name not in CLASS_FIELD_PREFIXES}
        for name, prefix in CLASS_FIELD_PREFIXES.items():
            flat.update({prefix + cls: float(v) for cls, v in getattr(self, name).items()})
        return flat

    @classmethod
    def from_metrics(cls, metrics: dict[str, float]) -> ReplicaStats:
        """Inverse of to_metrics; unknown keys ignored, missing keys default."""
        kwargs: dict = {}
        for f in fields(cls):
            if f.name in metrics:
                value = metrics[f.name]
                kwargs[f.name] = int(value) if f.type == "int" else bool(value) if f.type == "bool" else float(value)
        for name, prefix in CLASS_FIELD_PREFIXES.items():
            # Counts come back as Serve's mean over its look-back window: rounded to whole requests.
            cast = float if name.endswith("_per_s") else round
            kwargs[name] = {k[len(prefix):]: cast(v) for k, v in metrics.items() if k.startswith(prefix)}
        return cls(**kwargs)
