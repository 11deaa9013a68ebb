"""What the one controller asks of DynamoLLM's pool planner: the interface, not the search.

`autoscaling.wattwise.WattwisePolicy` holds its planner as this Protocol; the search that
answers it is `autoscaling.dynamollm.shape_planner.PoolShapePlanner`. Every plan (each
`plan_interval_s`) the controller calls, in order:

1. `planning_rates` once per pool that reported, its load history updated;
   `group_rates` for each group of pools a host would serve;
2. `at_epoch`: may TPs change and pools fold now?
3. while choosing folds (pool epochs only): `warming_up`, `may_newly_fold`, `cheapest`,
   `gpu_worth_w`, `burst_margin`, `dilation` for each candidate group;
4. per pool that serves: `dilation`, `is_bursty`, `burst_margin`, `plan`, then `clock_for`
   where instances are still starting; `forget` for a pool folded away; `shape` for the
   GPUs each pool holds;
5. `end_epoch` once the plan is out.

A planner keeps its own state between plans (history, shapes, hysteresis): the methods in
1 and 4 that take `now_s` move it; the others only read it.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from autoscaling.dynamollm.shape_planner import (
    ARRIVAL_ORDER_AT_PLANNED_CLOCK,
    AS_PROFILED,
    Dilation,
    PoolShape,
    ReplicaTraits,
)


class ShapePlanning(Protocol):
    def planning_rates(self, pool: str, rates: dict[str, float], batch_rate: float, now_s: float,
                       batch_floor: dict[str, float] | None = None) -> dict[str, float]:
        """The load `pool` is planned for, per length class, from the arrival rates its
        replicas report now (`batch_rate` of them batch work; `batch_floor`: Chiron's
        deadline rate per class). Records them in the pool's history: once a plan."""
        ...

    def group_rates(self, pools: Collection[str], now_s: float) -> dict[str, float]:
        """The load planned for these pools served on one host, per class (their histories
        taken together: what `planning_rates` returns for a pool alone)."""
        ...

    def at_epoch(self, now_s: float) -> bool:
        """Whether a pool epoch (TP changes, folding) is due at this plan."""
        ...

    def end_epoch(self, now_s: float) -> None:
        """The plan is out: schedule the next epoch if this one was due."""
        ...

    def warming_up(self, pool: str, now_s: float) -> bool:
        """Whether the pool's load is still ramping in its rate windows (no folding yet)."""
        ...

    def may_newly_fold(self, pools: Collection[str], now_s: float) -> bool:
        """Whether these pools' load is steady enough to fold onto one host."""
        ...

    def is_bursty(self, pool: str, now_s: float) -> bool:
        """Whether the pool's load was bursty lately (its band's floor stays the planned clock)."""
        ...

    def burst_margin(self, pools: Collection[str], now_s: float) -> float:
        """The margin these pools' planned load carries above their trailing peak."""
        ...

    def gpu_worth_w(self, pools: Collection[str], now_s: float) -> float:
        """What one GPU held is worth to a shape serving these pools (watts)."""
        ...

    def dilation(self, pool: str, step_time_ratios: list[float], work_ratios: Collection[float] = ()) -> Dilation:
        """How much slower than the profile the pool's replicas measure themselves."""
        ...

    def cheapest(self, planned: dict[str, float], gpus_available: int, max_instances: int | None = None,
                 tps: Collection[int] | None = None, dilation: Dilation = AS_PROFILED,
                 replicas: ReplicaTraits = ARRIVAL_ORDER_AT_PLANNED_CLOCK, held_gpu_w: float = 0.0,
                 burst_margin: float | None = None) -> PoolShape | None:
        """The least-cost shape carrying `planned` (None: none does). Reads no state: the
        folding layer prices candidate groups with it."""
        ...

    def plan(self, pool: str, planned: dict[str, float], gpus_available: int, backlog_instances: int,
             running: PoolShape | None, now_s: float, max_instances: int | None = None,
             tps: Collection[int] | None = None, late: bool = False,
             dilation: Dilation = AS_PROFILED, replicas: ReplicaTraits = ARRIVAL_ORDER_AT_PLANNED_CLOCK,
             burst_margin: float | None = None) -> PoolShape:
        """The pool's shape now: the cheapest, held back by the planner's hysteresis (TP
        changes at epochs, downscale holds, warm-up) and floored by the backlog."""
        ...

    def clock_for(self, planned: dict[str, float], tp: int, instances: int, dilation: Dilation = AS_PROFILED,
                  replicas: ReplicaTraits = ARRIVAL_ORDER_AT_PLANNED_CLOCK) -> int:
        """The lowest clock at which `instances` replicas at TP `tp` carry `planned`: the
        band's floor while a pool's new instances are still starting."""
        ...

    def shape(self, pool: str) -> PoolShape | None:
        """The shape last planned for the pool (None: not planned, or forgotten)."""
        ...

    def forget(self, pool: str) -> None:
        """The pool was folded away: plan it afresh if it serves again."""
        ...
