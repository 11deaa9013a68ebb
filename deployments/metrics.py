"""Prometheus metrics of the serving path, named like vLLM's where one exists.

Ray exports them (prefixed `ray_`) on each node's metrics port and the dashboard;
Serve adds deployment, replica and application tags.
"""

from __future__ import annotations

from ray.serve import metrics
from ray.util import metrics as ray_metrics

from core.efficiency import MODEL, NVML
from core.stats import ReplicaStats
from engines.protocol import RequestUsage

_LATENCY_BOUNDS_S = [0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.5, 3, 6, 12, 30, 60, 120, 300]
_ITL_BOUNDS_S = [0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2]
_REQUEST_TAGS = ("pool", "length_class", "service_class")
ENERGY_TAGS = ("pool", "source")


def zero_counter(counter: ray_metrics.Counter, tags: dict[str, str]) -> None:
    """Export a counter's series at 0, so a healthy system shows 0 rather than no data
    (Counter.inc refuses 0; recording a 0 increment creates the series)."""
    counter._record(0.0, tags)


# `type: ignore[arg-type]` below: Ray annotates tag_keys as Tuple[str] (exactly one key) though it
# takes any number of keys.


class ReplicaMetrics:
    """Per-request histograms and counters plus per-replica gauges."""

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self.ttft = metrics.Histogram(
            "wattwise_time_to_first_token_seconds", "Time to first token.", _LATENCY_BOUNDS_S, _REQUEST_TAGS  # type: ignore[arg-type]
        )
        self.itl = metrics.Histogram(
            "wattwise_inter_token_latency_seconds", "Mean time between tokens of a request.", _ITL_BOUNDS_S,
            _REQUEST_TAGS,  # type: ignore[arg-type]
        )
        self.e2e = metrics.Histogram(
            "wattwise_e2e_request_latency_seconds", "Arrival to last token.", _LATENCY_BOUNDS_S, _REQUEST_TAGS  # type: ignore[arg-type]
        )
        self.prompt_tokens = metrics.Counter("wattwise_prompt_tokens_total", "Prefilled prompt tokens.", _REQUEST_TAGS)  # type: ignore[arg-type]
        self.generation_tokens = metrics.Counter(
            "wattwise_generation_tokens_total", "Generated tokens.", _REQUEST_TAGS  # type: ignore[arg-type]
        )
        self.request_energy = metrics.Counter(
            "wattwise_request_energy_joules_total", "GPU energy attributed to requests.", _REQUEST_TAGS  # type: ignore[arg-type]
        )
        self.requests = metrics.Counter(
            "wattwise_requests_total", "Finished requests by reason.", (*_REQUEST_TAGS, "finish_reason")  # type: ignore[arg-type]
        )
        self.energy = metrics.Gauge(
            "wattwise_energy_joules", "GPU energy of the replica since start: source=nvml its GPUs' energy counter, "
            "source=model the perf/power model's for the same work (side by side: the model's error).",
            ENERGY_TAGS)  # type: ignore[arg-type]
        self.idle_energy = metrics.Gauge(
            "wattwise_idle_energy_joules", "Of wattwise_energy_joules, the part spent while no request was inside "
            "(charged to no request).", ENERGY_TAGS)  # type: ignore[arg-type]
        self.power = metrics.Gauge("wattwise_power_watts", "GPU power draw of the replica.", ("pool",))
        self.clock = metrics.Gauge(
            "wattwise_gpu_clock_mhz", "GPU clock the replica's GPUs run at (read back; modelled GPUs: the engine's).",
            ("pool",))
        self.clock_target = metrics.Gauge(
            "wattwise_gpu_clock_target_mhz", "GPU clock the engine asks for (plan or throttling).", ("pool",))
        self.kv = metrics.Gauge("wattwise_kv_cache_usage_ratio", "Share of KV blocks in use.", ("pool",))
        self.step_time_ratio = metrics.Gauge(
            "wattwise_step_time_ratio", "The engine's step time over what the planner's perf model gives for the same "
            "steps (1: as profiled; the controller plans the pool at this speed).", ("pool",))
        self.running = metrics.Gauge("wattwise_num_requests_running", "Requests in the batch.", ("pool",))
        self.waiting = metrics.Gauge("wattwise_num_requests_waiting", "Requests queued in the replica.", ("pool",))
        self.prompt_tokens_started = metrics.Gauge(
            "wattwise_prompt_tokens_started", "Prompt tokens of the requests the replica started, since its start.",
            ("pool",))
        self.prompt_tokens_cached = metrics.Gauge(
            "wattwise_prompt_tokens_cached", "Of those, found in its prefix cache (prefill skipped).",
            ("pool",))
        self.refused = metrics.Counter(
            "wattwise_requests_refused_total", "Requests the replica refused: shed at arrival (overload), "
            "squashed, or overflow (backed up: the ingress tried the next pool).",
            ("pool", "reason"),  # type: ignore[arg-type]
        )

    def record_refusal(self, reason: str) -> None:
        self.refused.inc(1, {"pool": self.pool, "reason": reason})

    def record_request(self, length_class: str, service_class: str, usage: RequestUsage, finish_reason: str) -> None:
        tags = {"pool": self.pool, "length_class": length_class, "service_class": service_class}
        self.ttft.observe(usage.ttft_s, tags)
        if usage.completion_tokens > 1:
            self.itl.observe((usage.e2e_s - usage.ttft_s) / (usage.completion_tokens - 1), tags)
        self.e2e.observe(usage.e2e_s, tags)
        self.prompt_tokens.inc(usage.prompt_tokens, tags)
        if usage.completion_tokens:
            self.generation_tokens.inc(usage.completion_tokens, tags)
        if usage.energy_j > 0:
            self.request_energy.inc(usage.energy_j, tags)
        self.requests.inc(1, {**tags, "finish_reason": finish_reason})

    def record_stats(self, stats: ReplicaStats, applied_clock_mhz: float | None) -> None:
        """`applied_clock_mhz`: what the GPUs run at; None (not read back yet) leaves the
        clock gauge as it was rather than report the target as applied."""
        tags = {"pool": self.pool}
        for source, present, total_j, idle_j in (
                (NVML, stats.energy_measured, stats.nvml_energy_j, stats.nvml_idle_energy_j),
                (MODEL, stats.energy_modelled, stats.energy_j, stats.idle_energy_j)):
            if present:
                self.energy.set(total_j, {**tags, "source": source})
                self.idle_energy.set(idle_j, {**tags, "source": source})
        self.power.set(stats.power_w, tags)
        self.clock_target.set(stats.clock_mhz, tags)
        if applied_clock_mhz is not None:
            self.clock.set(applied_clock_mhz, tags)
        self.kv.set(stats.kv_utilisation, tags)
        if stats.step_time_ratio > 0:  # 0: no step timed yet
            self.step_time_ratio.set(stats.step_time_ratio, tags)
        self.running.set(stats.running_requests, tags)
        self.waiting.set(stats.queued_requests, tags)
        self.prompt_tokens_started.set(stats.prompt_tokens_started, tags)
        self.prompt_tokens_cached.set(stats.prompt_tokens_cached, tags)


OUTCOMES = ("completed", "error_retryable", "error_final", "cancelled")


class IngressMetrics:
    """HTTP responses, plus the fate of every accepted request: each one accepted ends in
    exactly one outcome (accepted == sum of outcomes once nothing is in flight)."""

    def __init__(self) -> None:
        self.responses = metrics.Counter(
            "wattwise_http_responses_total", "HTTP responses by route and status.", ("route", "status")  # type: ignore[arg-type]
        )
        self.accepted_requests = metrics.Counter(
            "wattwise_requests_accepted_total", "Requests past validation, sent to a pool.", ("route",)
        )
        self.outcomes = metrics.Counter(
            "wattwise_request_outcomes_total",
            "Accepted requests by outcome: completed, error_retryable, error_final, cancelled (client left).",
            ("route", "outcome"),  # type: ignore[arg-type]
        )
        self.retries = metrics.Counter(
            "wattwise_request_retries_total", "Requests retried or resumed after a replica failed.", ("pool",)
        )
        # Measured at the ingress: arrival to the client's last token, across resumes.
        self.e2e = metrics.Histogram(
            "wattwise_ingress_e2e_seconds", "Arrival to the client's last token of completed requests, resumes "
            "included.", _LATENCY_BOUNDS_S, ("service_class", "resumed"))  # type: ignore[arg-type]
        self.slo = metrics.Counter(
            "wattwise_ingress_slo_requests_total", "Completed requests by whether the client saw their SLO met.",
            ("service_class", "slo_met", "resumed"))  # type: ignore[arg-type]
        self.counts: dict[str, int] = dict.fromkeys(("accepted", "retries", *OUTCOMES), 0)

    def record(self, route: str, status: int) -> None:
        self.responses.inc(1, {"route": route, "status": str(status)})

    def accepted(self, route: str) -> None:
        self.counts["accepted"] += 1
        self.accepted_requests.inc(1, {"route": route})

    def outcome(self, route: str, outcome: str) -> None:
        self.counts[outcome] += 1
        self.outcomes.inc(1, {"route": route, "outcome": outcome})

    def served(self, service_class: str, e2e_s: float, slo_met: bool, resumed: bool) -> None:
        tags = {"service_class": service_class, "resumed": str(resumed).lower()}
        self.e2e.observe(e2e_s, tags)
        self.slo.inc(1, {**tags, "slo_met": str(slo_met).lower()})

    def retried(self, pool: str) -> None:
        self.counts["retries"] += 1
        self.retries.inc(1, {"pool": pool})


FAILOVERS = ("replayed", "resumed", "failed")


class GatewayMetrics:
    """What the gateway did when an ingress replica failed under a request: one count per
    attempt on another replica, one per request given up (exported at 0 from start-up, so
    a healthy system shows 0)."""

    def __init__(self) -> None:
        self.failovers = metrics.Counter(
            "wattwise_gateway_failovers_total", "What the gateway did when an ingress replica failed under a "
            "request: replayed (sent it whole to another), resumed (sent a stream's continuation), failed (gave "
            "up: a 503 or an error event).", ("outcome",))
        for outcome in FAILOVERS:
            zero_counter(self.failovers, {"outcome": outcome})

    def failover(self, outcome: str) -> None:
        self.failovers.inc(1, {"outcome": outcome})
