"""What the Serve runtime broadcasts to its ingress and replicas: the policy's plan, by
deployment, with what only the runtime knows.

A policy returns a `ClusterPlan` (core.plan); the Serve autoscaling policy turns pools into
deployments (shadow rollouts), adds the replicas Serve runs, and the plan store layers in the
operators' drains. Keeping these out of `ClusterPlan` keeps a policy from setting them, and
`compose` (core.plan_ownership) from having to skip them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from core.plan import ClusterPlan


@dataclass(frozen=True)
class PublishedPlan(ClusterPlan):
    # Pool -> the deployment serving its traffic, for pools whose TP changes run as shadow
    # deployments (autoscaling.shadow_rollout).
    serving: dict[str, str] = field(default_factory=dict)
    # Pools an operator drained (POST /admin/drain): the ingress routes them no new
    # requests. Layered in by the plan store, so every ingress replica sees the same.
    drained: dict[str, bool] = field(default_factory=dict)
    # Deployment -> its replicas running when the plan went out, as Serve's controller counts
    # them: the ingress sends a request overflowing its pool only to a pool with one running
    # (asking Serve's status instead costs the ingress ~0.13 s of CPU a call).
    running_replicas: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, plan: ClusterPlan, serving: dict[str, str] | None = None) -> PublishedPlan:
        """`plan` as the runtime broadcasts it, with the deployments serving its pools."""
        return cls(**{f.name: getattr(plan, f.name) for f in fields(ClusterPlan)}, serving=dict(serving or {}))
