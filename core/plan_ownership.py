"""One writer per plan entry: the layers of the one controller compose into one plan.

Each layer of the one controller (DynamoLLM's planner, Chiron's autoscalers, ...) publishes
a partial ClusterPlan. `compose` stacks them and refuses an entry (a field for
one deployment, e.g. `clock_mhz["pool-short"]`) that two layers both set: two owners of
one decision is how DynamoLLM's pool clock came to be overwritten by throttLL'eM's
within half a second. What only the runtime knows is not in a ClusterPlan
(core.published_plan).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields

from core.plan import ClusterPlan

POLICY_FIELDS = tuple(f.name for f in fields(ClusterPlan) if f.name != "reason")


class PlanConflict(ValueError):
    """Two layers wrote the same plan entry."""


def compose(parts: Mapping[str, ClusterPlan]) -> ClusterPlan:
    """Layer name -> its partial plan, in order; raises PlanConflict on a shared entry."""
    owner: dict[tuple[str, str], str] = {}
    plan = ClusterPlan()
    for layer, part in parts.items():
        for name in POLICY_FIELDS:
            for key in getattr(part, name):
                first = owner.setdefault((name, key), layer)
                if first != layer:
                    raise PlanConflict(f"{name}[{key!r}] is written by both {first!r} and {layer!r}")
        plan = plan.merge(part)
    return plan
