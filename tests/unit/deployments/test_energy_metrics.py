"""A replica's energy gauges: measured (NVML) and modelled joules side by side, each with its idle
part, and only the sources the replica has (a simulated replica has no GPU counter to show)."""

from __future__ import annotations

from core.stats import ReplicaStats
from deployments.metrics import ReplicaMetrics


class _Recorder:
    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def set(self, value: float, tags: dict[str, str]) -> None:
        self.values[tags["source"]] = value


def _recorded(stats: ReplicaStats) -> tuple[dict[str, float], dict[str, float]]:
    metrics = ReplicaMetrics("short")
    metrics.energy, metrics.idle_energy = _Recorder(), _Recorder()  # type: ignore[assignment]
    metrics.record_stats(stats, None)
    return metrics.energy.values, metrics.idle_energy.values  # type: ignore[attr-defined]


def test_a_gpu_replica_shows_its_counter_beside_the_model() -> None:
    stats = ReplicaStats(energy_measured=True, nvml_energy_j=900.0, nvml_idle_energy_j=300.0,
                         energy_modelled=True, energy_j=700.0, idle_energy_j=200.0)
    assert _recorded(stats) == ({"nvml": 900.0, "model": 700.0}, {"nvml": 300.0, "model": 200.0})


def test_a_simulated_replica_shows_the_model_alone_and_a_cpu_one_nothing() -> None:
    assert _recorded(ReplicaStats(energy_j=50.0, idle_energy_j=20.0)) == ({"model": 50.0}, {"model": 20.0})
    assert _recorded(ReplicaStats(energy_modelled=False)) == ({}, {})
