"""Chiron's global autoscaler (§5) as a ControlPolicy.

Interactive + mixed replicas: keep IBP (share of them running interactive requests)
inside [theta - delta, theta + delta]; theta is the over-provisioning for spikes (1/3
when the tail arrival spike is 3x the mean: `over_provisioning.theta_from_arrivals`).
Batch replicas: Algorithm 2 on the queue's request groups, counting the spare
throughput of mixed replicas; all batch replicas retire when no batch work is queued or
running. Guards: missing or stale stats never shrink a pool; a pool shrinks only if the
replicas left can carry its running requests; every scaling action is counted
(hysteresis = actions / scale-ups).
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from autoscaling.chiron.batch_queue import batch_instances_needed
from autoscaling.chiron.queue_summary import groups_from_metrics
from core.plan import ClusterPlan
from core.roles import BATCH_QUEUE_DEPLOYMENT
from core.view import ClusterView, DeploymentView


class ChironConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    interactive: str = Field(default="pool-interactive", description="Deployment of the interactive replicas.")
    mixed: str = Field(default="pool-mixed", description=(
        "Deployment of the mixed replicas (interactive first, batch fills)."))
    batch: str = Field(default="pool-batch", description="Deployment of the batch replicas.")
    queue: str = Field(default=BATCH_QUEUE_DEPLOYMENT, description="The deployment reporting the global batch queue.")
    theta: float = Field(default=1 / 3, gt=0, lt=1, description=(
        "Target IBP (share of interactive and mixed replicas running interactive requests): the "
        "over-provisioning for spikes; Chiron: 1/3 when the tail arrival spike is 3x the mean "
        "(autoscaling.chiron.over_provisioning.theta_from_arrivals reads it from an arrival history)."))
    delta: float = Field(default=0.1, ge=0, description=(
        "Half-width of the IBP band [theta - delta, theta + delta] inside which nothing scales."))
    batch_tokens_per_s: float = Field(default=1500.0, gt=0, description=(
        "Tokens/s one replica gives batch work, until batch replicas report their own."))
    max_batch_replicas: int = Field(default=64, ge=0, description="Most batch replicas.")
    downscale_hold_s: float = Field(default=30.0, ge=0, description=(
        "Interactive/mixed capacity shrinks only after IBP stayed low this long (s; no flapping)."))


def split_interactive_mixed(total: int, theta: float) -> tuple[int, int]:
    """Interactive and mixed replicas of `total`: interactive ones for theta of it, rounded
    down (spikes overflow to mixed replicas), at least one of each."""
    interactive = max(1, min(total - 1, math.floor(total * theta + 1e-9)))
    return interactive, max(total - interactive, 1)


class ChironPolicy:
    def __init__(self, config: ChironConfig = ChironConfig()) -> None:
        self.config = config
        self.actions = 0
        self.scale_ups = 0
        self._decided: dict[str, int] = {}
        self._low_since_s: float | None = None

    @property
    def hysteresis(self) -> float:
        """Chiron §2.3: scaling actions per scale-up (1.0 = never scaled back down)."""
        return self.actions / self.scale_ups if self.scale_ups else 0.0

    @staticmethod
    def _fresh(dep: DeploymentView | None) -> bool:
        return dep is not None and len(dep.replica_stats) >= dep.current_replicas

    def _interactive_targets(self, inter: DeploymentView, mixed: DeploymentView, now_s: float) -> tuple[int, int]:
        """IBP is read on the running replicas; replicas asked for and still starting are kept
        (`planned`): a reading taken before they run must not cancel them. Cancelling a start
        is the costliest flap there is (a CI run on a busy machine asked for 4 mixed replicas
        and took them back 3-15 s later, 10 times over, while none of them had started)."""
        cfg = self.config
        current = inter.current_replicas, mixed.current_replicas
        planned = max(inter.target_replicas, current[0]), max(mixed.target_replicas, current[1])
        total = sum(current)
        busy = sum(1 for d in (inter, mixed) for s in d.replica_stats if s.interactive_running > 0)
        ibp = busy / total if total else 1.0
        wanted = max(math.ceil(busy / cfg.theta), 2)
        if (total and cfg.theta - cfg.delta <= ibp <= cfg.theta + cfg.delta) or wanted == total:
            self._low_since_s = None
            return planned
        if total < wanted <= sum(planned):  # what is starting carries it
            self._low_since_s = None
            return planned
        if wanted < total:
            if self._low_since_s is None:
                self._low_since_s = now_s
            if now_s - self._low_since_s < cfg.downscale_hold_s or not (self._fresh(inter) and self._fresh(mixed)):
                return planned
            running = sum(s.interactive_running for d in (inter, mixed) for s in d.replica_stats)
            limit = min((s.batch_limit for d in (inter, mixed) for s in d.replica_stats if s.batch_limit), default=1)
            wanted = max(wanted, math.ceil(running / limit))
        else:
            self._low_since_s = None
        return split_interactive_mixed(wanted, cfg.theta)

    def _batch_target(self, batch: DeploymentView, mixed: DeploymentView, queue: DeploymentView | None,
                      now_s: float) -> int:
        cfg = self.config
        metrics = queue.extra_metrics if queue is not None else {}
        groups = groups_from_metrics(metrics)
        active = sum(s.running_requests + s.queued_requests for s in batch.replica_stats)
        if not groups:
            if active == 0 and self._fresh(batch):
                return 0  # Algorithm 2: retire every batch replica when none is busy
            return batch.current_replicas
        measured = [s.tokens_per_s for s in batch.replica_stats if s.tokens_per_s > 0]
        per_replica = sum(measured) / len(measured) if measured else cfg.batch_tokens_per_s
        spare = sum(per_replica * max(0.0, 1 - s.interactive_running / max(s.batch_limit, 1))
                    for s in mixed.replica_stats)
        spare += batch.current_replicas * per_replica
        extra = batch_instances_needed(groups, now_s, metrics.get("output_mean_tokens", 200.0),
                                       metrics.get("output_std_tokens", 150.0), per_replica, spare,
                                       cfg.max_batch_replicas)
        return min(batch.current_replicas + extra, cfg.max_batch_replicas)

    def observe(self, view: ClusterView, now_s: float) -> ClusterPlan:
        cfg = self.config
        deps = view.deployments
        missing = [n for n in (cfg.interactive, cfg.mixed, cfg.batch) if n not in deps]
        if missing:
            return ClusterPlan(reason=f"chiron: deployments {missing} not reported; holding")
        inter, mixed, batch = deps[cfg.interactive], deps[cfg.mixed], deps[cfg.batch]
        n_inter, n_mixed = self._interactive_targets(inter, mixed, now_s)
        n_batch = self._batch_target(batch, mixed, deps.get(cfg.queue), now_s)
        replicas = {cfg.interactive: n_inter, cfg.mixed: n_mixed, cfg.batch: n_batch}
        for name, n in replicas.items():
            before = self._decided.get(name, deps[name].target_replicas)
            if n != before:
                self.actions += 1
                self.scale_ups += n > before
            self._decided[name] = n
        return ClusterPlan(replicas=replicas, reason="chiron")
