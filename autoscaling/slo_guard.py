"""The SLO guard: a length class that misses its SLOs stops being saved on.

Every saving of the one controller (low clocks, few instances, folded pools) is taken
where its model says the SLOs still hold. On a workload the model describes badly (the
Mooncake trace's long prompts: TTFTs queue beyond what its mean-based profile shows) the
wattwise policy met 95.0% of SLOs where SinglePool and static-max-clock met 99.5-99.6%.
The guard reads what the replicas measure: per length class, the interactive requests they
finished over their trailing window and those that met their SLO, plus those already past their
TTFT deadline without a token (core.slo_outcomes, ReplicaStats.slo_late), summed over the
cluster. It names the classes below target; the wattwise policy stops saving for them
(autoscaling.wattwise) until the class has held its target for `recover_hold_s`, the
hysteresis that keeps a pool from flapping between flat out and saving as the window's
misses age out.
Pure: a view in, the guarded classes out.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from core.view import ClusterView


class SloGuardTuning(BaseModel):
    """The guard's constants, not settings an operator sizes a fleet with; each says whether a
    load chose it (docs/results/2026-12-05-slo-guard.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_completed: int = Field(default=20, ge=1, description=(
        "Interactive requests of a class the window must hold before its attainment is judged: "
        "the share among a few says little. Not tuned (docs/results/2026-12-05-slo-guard.md)."))
    min_misses: int = Field(default=2, ge=1, description=(
        "Misses of a class the window must hold before it is guarded: one miss among 20-100 "
        "requests reads as under 99%, yet a class meeting 99.9% has such a window now and then. "
        "Chosen on synthetic and code loads, not on Mooncake (docs/results/2026-12-05-slo-guard.md)."))
    warmup_s: float = Field(default=180.0, ge=0, description=(
        "No class is judged for this long (s) after the first plan: the pools start at the "
        "operator's shape and grow to the load over the planner's warm-up (`warmup_s`, 120 s), and "
        "requests that queued meanwhile finish up to a window later. Misses then say nothing of "
        "the savings the guard could stop. "
        "Chosen on synthetic and code loads, not on Mooncake (docs/results/2026-12-05-slo-guard.md)."))
    recover_hold_s: float = Field(default=300.0, ge=0, description=(
        "A guarded class is released once its attainment has stayed at or above the target (or "
        "too few of its requests finished to judge) for this long (s). "
        "Not tuned: no load re-guarded a class after its release (docs/results/2026-12-05-slo-guard.md)."))
    load_margin: float = Field(default=0.25, ge=0, description=(
        "A pool hosting a guarded class is planned for this much more load than its forecast "
        "(on top of its burst margin): capacity the model did not see the need for. "
        "Chosen on synthetic and code loads, not on Mooncake (docs/results/2026-12-05-slo-guard.md)."))
    escalations: int = Field(default=2, ge=0, description=(
        "How many times a guarded class's `load_margin` may double: once each time the class "
        "misses again after it had met its target while guarded (the margin did not cover its "
        "next burst). The level outlives a release: a class guarded again starts where it was. "
        "Not tuned (docs/results/2026-12-06-prompt-lengths-and-escalation.md)."))


class SloGuardConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(default=True, description=(
        "Guard each length class's SLO attainment; False: the wattwise policy saves whatever its "
        "model predicts (ablations)."))
    target_attainment: float = Field(default=0.99, gt=0, le=1, description=(
        "A class whose share of interactive requests meeting their SLO (TTFT and mean TBT), over "
        "the replicas' trailing window, falls below this is guarded; the benches' SLO target."))
    tuning: SloGuardTuning = Field(default_factory=SloGuardTuning, description=(
        "How many requests judge a class, the warm-up, the release hold and the margin, each with "
        "the load it was chosen on, or that it was not tuned."))


@dataclass(frozen=True)
class Attainment:
    """One class's interactive requests judged over the replicas' windows (finished, or late:
    past their TTFT deadline without a token), and those that met their SLO."""

    completed: int
    met: int

    @property
    def share(self) -> float:
        return self.met / self.completed if self.completed else 1.0


def class_attainment(view: ClusterView) -> dict[str, Attainment]:
    """Per length class, summed over every replica of every deployment (wherever the routing
    or an overflow sent its requests); a late request is a miss already."""
    completed: dict[str, int] = {}
    met: dict[str, int] = {}
    for dep in view.deployments.values():
        for stats in dep.replica_stats:
            for counts in (stats.slo_completed, stats.slo_late):
                for cls, n in counts.items():
                    completed[cls] = completed.get(cls, 0) + n
            for cls, n in stats.slo_met.items():
                met[cls] = met.get(cls, 0) + n
    return {cls: Attainment(n, met.get(cls, 0)) for cls, n in completed.items()}


class SloGuard:
    """Which classes are guarded, and since when."""

    def __init__(self, config: SloGuardConfig) -> None:
        self.config = config
        self._since: dict[str, float] = {}  # guarded class -> when it was guarded
        self._back_since: dict[str, float] = {}  # guarded class -> since when it holds its target
        self._level: dict[str, int] = {}  # class -> times its margin missed a burst while guarded
        self._met_while_guarded: set[str] = set()  # guarded classes at their target since their last misses
        self._first_s: float | None = None

    def _below(self, attained: Attainment | None) -> bool:
        tuning = self.config.tuning
        return (attained is not None and attained.completed >= tuning.min_completed
                and attained.completed - attained.met >= tuning.min_misses
                and attained.share < self.config.target_attainment)

    def update(self, view: ClusterView, now_s: float) -> dict[str, float]:
        """Guarded class -> since when, after this view."""
        self._first_s = now_s if self._first_s is None else self._first_s
        if now_s - self._first_s < self.config.tuning.warmup_s:
            return {}
        attained = class_attainment(view)
        hold_s = self.config.tuning.recover_hold_s
        for cls in attained.keys() | self._since.keys():
            if self._below(attained.get(cls)):
                if cls in self._met_while_guarded:  # a new episode of misses: the margin fell short
                    self._level[cls] = self._level.get(cls, 0) + 1
                    self._met_while_guarded.discard(cls)
                self._since.setdefault(cls, now_s)
                self._back_since.pop(cls, None)
            elif cls in self._since:
                self._met_while_guarded.add(cls)
                if now_s - self._back_since.setdefault(cls, now_s) >= hold_s:
                    del self._since[cls], self._back_since[cls]
                    self._met_while_guarded.discard(cls)
        return dict(self._since)

    def load_margin(self, classes: Collection[str]) -> float:
        """The extra load a pool serving `classes` is planned for while one of them is guarded:
        `load_margin`, doubled for each time a guarded class of them missed again (at most
        `escalations` times)."""
        tuning = self.config.tuning
        level = max((self._level.get(cls, 0) for cls in classes if cls in self._since), default=0)
        return tuning.load_margin * 2 ** min(level, tuning.escalations)
