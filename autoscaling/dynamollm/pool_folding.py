"""DynamoLLM's pool merging at low load: a length-class pool folds into a pool that
serves longer inputs, its classes routed there and its replicas given back.

Per-class pools pay when each is busy (short requests never share a batch with long
ones). At low load every pool still holds a whole instance, and the rounding of three
pools costs more than the interference it saves: SinglePool carries the conversation
trace on one TP8 replica, a shape no per-pool plan can reach. So the planner costs every
partition of the pools into runs of neighbours (pools ordered by the inputs they serve),
each run served by its last pool, the one that can take every request of the run, and
keeps the cheapest (least power plus what each GPU held is worth, as the shape planner
prices a pool: `PoolShape.cost_w`). A partition changes only on a pool epoch and only
when what it saves over the epoch pays the joules of a restart, as a TP change does.
Pure: shapes in, groups out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass

from autoscaling.dynamollm.reconfig import worth_reconfiguring
from autoscaling.dynamollm.shape_planner import PoolShape


@dataclass(frozen=True)
class PoolGroup:
    """Pools served together by `host` (the last of `members`, the longest inputs)."""

    members: tuple[str, ...]

    @property
    def host(self) -> str:
        return self.members[-1]


def partitions(order: Sequence[str]) -> Iterator[tuple[PoolGroup, ...]]:
    """Every split of `order` into runs of neighbours (2^(n-1) of them)."""
    n = len(order)
    for cuts in range(2 ** max(n - 1, 0)):  # bit i set: a run ends after order[i]
        groups: list[PoolGroup] = []
        start = 0
        for i in range(n):
            if i == n - 1 or cuts >> i & 1:
                groups.append(PoolGroup(tuple(order[start:i + 1])))
                start = i + 1
        yield tuple(groups)


class PoolFolding:
    """The partition in force, changed on epochs when the change pays its restart."""

    def __init__(self, order: Sequence[str], reconfigure_cost_s: float, pool_epoch_s: float) -> None:
        self.order = tuple(order)
        self.reconfigure_cost_s = reconfigure_cost_s
        self.pool_epoch_s = pool_epoch_s
        self.groups: tuple[PoolGroup, ...] = tuple(PoolGroup((p,)) for p in self.order)

    def unfold(self, pools: Collection[str]) -> None:
        """Each of `pools` serves alone from now on, neither hosting nor hosted (the SLO guard's
        pools: a fold is a saving); the other members of its group stay folded together."""
        groups: list[PoolGroup] = []
        for group in self.groups:
            run: list[str] = []
            for pool in group.members:
                if pool in pools:
                    groups.extend(PoolGroup(members) for members in (tuple(run), (pool,)) if members)
                    run = []
                else:
                    run.append(pool)
            if run:
                groups.append(PoolGroup(tuple(run)))
        self.groups = tuple(groups)

    def choose(self, shape_of: Callable[[PoolGroup], PoolShape | None], epoch: bool,
               may_form: Callable[[PoolGroup], bool] = lambda group: True) -> tuple[PoolGroup, ...]:
        """The groups to run: on an epoch the cheapest partition (`shape_of` gives one group's
        cheapest shape on its host, None if it cannot run) if it pays; else the current. A fold
        not in force that `may_form` refuses is not made; one in force is not undone for it."""
        if not epoch or len(self.order) < 2:
            return self.groups
        shapes: dict[PoolGroup, PoolShape | None] = {}

        def total(partition: tuple[PoolGroup, ...], price: Callable[[PoolShape], float]) -> float:
            for g in partition:
                if g not in shapes:
                    new_fold = len(g.members) > 1 and g not in self.groups
                    shapes[g] = None if new_fold and not may_form(g) else shape_of(g)
            return sum(price(s) if (s := shapes[g]) is not None else math.inf for g in partition)

        def cost_w(partition: tuple[PoolGroup, ...]) -> float:
            return total(partition, lambda s: s.cost_w)

        best = min(partitions(self.order), key=cost_w)
        now_w, best_w = cost_w(self.groups), cost_w(best)
        restart_j = self.reconfigure_cost_s * total(best, lambda s: s.power_w)
        if best != self.groups and math.isfinite(best_w) and (
                not math.isfinite(now_w) or worth_reconfiguring(now_w, best_w, self.pool_epoch_s, restart_j)):
            self.groups = best
        return self.groups
