"""The one controller: the five papers as layers of one policy, each decision with one owner.

Who owns which decision, and how each owner decides: `autoscaling.ownership.DECISIONS` (the
table docs/one-controller.md shows).

The plan is composed with `core.plan_ownership.compose`, which refuses an entry written
by two layers; the clock is never a plan entry here (only its band), so the replicas'
per-step clock cannot fight the planner. Reconfiguration costs come from
`core.overheads.OverheadTable`, the table the simulator charges and the Serve modelled engine
pays. Policies of one paper alone stay in the registry for ablations and benches.
Not (yet) layers: Chiron's local batch-size autoscaler (measured, not adopted) and dedicated
batch replicas (batch work runs behind interactive work on the pools' replicas), Splitwise's
prompt/token phases inside a pool.
"""

from __future__ import annotations

import math
from collections.abc import Collection

from pydantic import Field

from autoscaling.chiron.deadline_capacity import BatchDemand, DeadlineCapacity, DeadlineCapacityConfig
from autoscaling.dynamollm.pool_folding import PoolFolding, PoolGroup
from autoscaling.dynamollm.prompt_work import PromptWork, in_profiled_requests
from autoscaling.dynamollm.route_handover import RouteHandover
from autoscaling.dynamollm.shape_planner import (
    Dilation,
    PoolShape,
    PoolShapePlanner,
    ReplicaTraits,
    ShapePlannerConfig,
)
from autoscaling.dynamollm.shape_planning import ShapePlanning
from autoscaling.ownership import CATCH_UP, CHIRON, DYNAMOLLM_FOLDING, DYNAMOLLM_SHAPES, SLO_GUARD
from autoscaling.slo_guard import SloGuard, SloGuardConfig
from core.classes import LengthClassConfig
from core.overheads import OverheadTable
from core.plan import ClusterPlan
from core.plan_ownership import compose
from core.roles import BATCH_QUEUE_DEPLOYMENT
from core.view import ClusterView, DeploymentView
from energy.profile import EnergyProfile
from energy.profile_source import EnergyProfileSource


class WattwiseConfig(EnergyProfileSource):
    pools: dict[str, list[str]] = Field(description="Deployment name -> the length classes it serves.")
    cluster_gpus: int = Field(default=96, gt=0, description="GPUs the pools may hold together.")
    tensor_parallel_options: dict[str, list[int]] = Field(default_factory=dict, description=(
        "Pool -> the TPs it may run (a vLLM pool: its tensor_parallel_options, shadow-deployed); "
        "pools not listed may run every TP the profile has (the modelled engine re-shards)."))
    planner: ShapePlannerConfig = Field(default_factory=ShapePlannerConfig,
                                        description="DynamoLLM layer: how pool shapes follow load.")
    plan_interval_s: float = Field(default=5.0, gt=0, description=(
        "Re-plan instances and clock bands this often (DynamoLLM's instance epoch)."))
    pool_epoch_s: float = Field(default=300.0, gt=0, description=(
        "TP changes are considered this often (DynamoLLM's pool epoch); between epochs a pool "
        "changes TP only when its TP cannot carry the load, or when it must start instances "
        "anyway and the cheaper TP's pay the switch."))
    overload_queue_per_replica: float = Field(default=4.0, gt=0, description=(
        "Requests waiting per replica beyond which a pool gets an instance at once. Set in the "
        "first cut (`6a7f1bf`), not tuned on a trace."))
    fold_pools: bool = Field(default=True, description=(
        "At low load a pool may fold into one serving longer inputs (its classes routed there, "
        "its replicas given back) when that costs fewer watts (autoscaling.dynamollm.pool_folding)."))
    batch_deadlines: DeadlineCapacityConfig = Field(default_factory=DeadlineCapacityConfig, description=(
        "Chiron layer: the batch rate and queue concurrency the global batch queue's deadlines need "
        "(Algorithm 2 on its request groups), planned by DynamoLLM's layer as a floor under batch load."))
    batch_queue: str = Field(default=BATCH_QUEUE_DEPLOYMENT, description=(
        "The deployment reporting the global batch queue's request groups."))
    overheads: OverheadTable = Field(default_factory=OverheadTable, description=(
        "Reconfiguration costs the planner weighs (the same table the simulator charges)."))
    lowest_floor_when_steady: bool = Field(default=True, description=(
        "A pool that is not bursty, has no batch requests waiting, and whose replicas all pick each step's "
        "clock (throttLL'eM's hook) gets as its band's floor the least-power clock that carries its "
        "load (the GPU's lowest where none is found); the planned clock then sizes its instances only. "
        "False: the planned clock is always the floor. Chosen on the first halves of conv and code "
        "(`576548a`, the least-power clock `63e5fe5`)."))
    slo_guard: SloGuardConfig = Field(default_factory=SloGuardConfig, description=(
        "A length class whose SLO attainment falls below target stops being saved on: the pools "
        "hosting it run at the top clock, with more planned load at the TP they run, unfolded, "
        "until it recovers (autoscaling.slo_guard)."))


class WattwisePolicy:
    """A snapshot in, one plan out; the per-step layers live in the replicas' hooks."""

    def __init__(self, config: WattwiseConfig, profile: EnergyProfile | None = None) -> None:
        self.config = config
        self.lengths = LengthClassConfig()
        profile = config.energy_profile(config.planner.kv_budget) if profile is None else profile
        self.profile = profile
        for pool, options in config.tensor_parallel_options.items():
            # A pool limited to TPs the profile lacks would be planned at one it cannot model.
            if not set(options) & set(profile.tensor_parallel_degrees):
                raise ValueError(
                    f"pool {pool} may run TP{options}, but the energy profile "
                    f"({config.profile_name()}) has "
                    f"TP{list(profile.tensor_parallel_degrees)} only")
        self.planner: ShapePlanning = PoolShapePlanner(profile, config.planner, self.lengths,
                                                       reconfigure_cost_s=config.overheads.reshard_s,
                                                       pool_epoch_s=config.pool_epoch_s)
        self.min_clock_mhz = min(profile.clocks_mhz)
        planner = config.planner
        self._prompt_work = PromptWork(planner.tuning.prompt_reference_tokens, planner.tuning.prompt_deadband,
                                       planner.tuning.bursty_lookback_s) if planner.follow_prompt_lengths else None
        self.max_clock_mhz = max(profile.clocks_mhz)
        names = LengthClassConfig.names()
        # Pools in order of the inputs they serve: a pool folds only into a later one.
        self._order = sorted(config.pools, key=lambda p: max(names.index(c) for c in config.pools[p]))
        self._folding = (PoolFolding(self._order, config.overheads.reshard_s, config.pool_epoch_s)
                         if config.fold_pools else None)
        self._deadlines = DeadlineCapacity(config.batch_deadlines)
        self._own_pool = {cls: pool for pool, classes in config.pools.items() for cls in classes}
        self._handover = RouteHandover()
        self._guard = SloGuard(config.slo_guard) if config.slo_guard.enabled else None
        self._reported: set[str] = set()
        self._next_plan_s = 0.0
        self._last: ClusterPlan | None = None

    def _mean_ttft_target_s(self, rates: dict[str, float]) -> float:
        """The TTFT target a replica's mean TTFT (over every request) is held to: the mean of
        its classes' targets weighted by their rates (the tightest, with no load yet)."""
        total = sum(rates.values())
        if total <= 0:
            return min(self.lengths.slo(cls).ttft_s for cls in rates)
        return sum(r * self.lengths.slo(cls).ttft_s for cls, r in rates.items()) / total

    def _catch_up(self, view: ClusterView, loads: dict[str, tuple[dict[str, float], float]]) -> ClusterPlan:
        """The catch-up after a burst: what each serving pool's replicas see that the rate
        forecast missed. A floor on instances from the waiting interactive requests (each
        instance holding at most `overload_queue_per_replica`), and a replica whose mean TTFT
        is over its classes' target (latency the profile does not model, e.g. the serving
        stack's own), which earns the pool one instance beyond the forecast, never more: on a
        machine whose every replica is slow (a busy CPU), adding one per plan would feed the
        slowness. Nothing for a pool while instances are on their way. `loads`: each serving
        pool's planned rates and margin (`_host_load`)."""
        backlog: dict[str, int] = {}
        late: dict[str, float] = {}
        per_replica = self.config.overload_queue_per_replica
        for host, (rates, _) in loads.items():
            dep = view.deployments.get(host)
            if dep is None or dep.target_replicas > dep.current_replicas:
                continue
            queued = dep.queued_outside + sum(s.queued_requests - s.batch_waiting for s in dep.replica_stats)
            if queued > per_replica * max(len(dep.replica_stats), 1):
                backlog[host] = math.ceil(queued / per_replica)
            worst_s = max((s.ttft_ewma_s for s in dep.replica_stats), default=0.0)
            if worst_s > self._mean_ttft_target_s(rates):
                late[host] = worst_s
        reason = ", ".join([f"{p} backlog {n}" for p, n in backlog.items()]
                           + [f"{p} TTFT {t:.2f} s" for p, t in late.items()])
        return ClusterPlan(backlog_instances=backlog, late_ttft_s=late, reason=f"catch-up: {reason}" if reason else "")

    def _dilation(self, pool: str, dep: DeploymentView | None) -> Dilation:
        """How much slower than the profile the pool's replicas measure their steps, and the
        share of the work their prefix caches leave them."""
        stats = dep.replica_stats if dep is not None else []
        return self.planner.dilation(pool, [s.step_time_ratio for s in stats], [s.prefix_work_ratio for s in stats])

    def _running(self, dep: DeploymentView | None) -> PoolShape | None:
        """The shape a pool runs now, from its replicas' reports."""
        if dep is None or not dep.replica_stats:
            return None
        tp = dep.replica_stats[0].tensor_parallel
        return PoolShape(tp, dep.target_replicas, self.max_clock_mhz, math.inf)

    def _class_rates(self, view: ClusterView) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
        """Cluster-wide arrival rates per length class, all and batch only, and their prompt
        tokens per second, wherever the routing sent them (replicas report batch arrivals as
        one rate: each class gets the replica's batch share of it)."""
        arrivals: dict[str, float] = {}
        batch: dict[str, float] = {}
        tokens: dict[str, float] = {}
        for dep in view.deployments.values():
            for stats in dep.replica_stats:
                total = sum(stats.class_rates_per_s.values())
                share = min(stats.batch_rate_per_s / total, 1.0) if total > 0 else 0.0
                for cls, r in stats.class_rates_per_s.items():
                    arrivals[cls] = arrivals.get(cls, 0.0) + r
                    batch[cls] = batch.get(cls, 0.0) + r * share
                for cls, n in stats.class_prompt_tokens_per_s.items():
                    tokens[cls] = tokens.get(cls, 0.0) + n
        return arrivals, batch, tokens

    def _chiron(self, view: ClusterView, now_s: float, arrivals: dict[str, float],
                batch: dict[str, float]) -> ClusterPlan:
        """Chiron's layer: what the global batch queue's deadlines need (Algorithm 2 on its
        request groups): the batch requests it may have out at once, and the batch rate per
        class the pools are planned for at least. Empty without a queue."""
        queue = view.deployments.get(self.config.batch_queue)
        if queue is None:
            return ClusterPlan()
        itl_s = max((s.itl_ewma_s for name in self.config.pools if (dep := view.deployments.get(name))
                     for s in dep.replica_stats), default=0.0) or 0.05
        demand = self._deadlines.demand(queue.extra_metrics, now_s, itl_s)
        return ClusterPlan(batch_in_flight={self.config.batch_queue: demand.in_flight},
                           batch_rate_floor_per_s=self._batch_floor(demand, arrivals, batch),
                           reason="chiron deadlines")

    @staticmethod
    def _batch_floor(demand: BatchDemand, arrivals: dict[str, float], batch: dict[str, float]) -> dict[str, float]:
        """The demanded batch rate per class, split as batch work arrives at the pools (as
        all work does, before any batch request has)."""
        if demand.requests_per_s <= 0:
            return {}
        mix = batch if sum(batch.values()) > 0 else arrivals
        total = sum(mix.values())
        return {cls: demand.requests_per_s * r / total for cls, r in mix.items()} if total > 0 else {}

    def _planned_rates(self, view: ClusterView, now_s: float, arrivals: dict[str, float], batch: dict[str, float],
                       floor: dict[str, float]) -> dict[str, dict[str, float]]:
        """DynamoLLM's load per pool that reported: each pool's own classes, wherever they run
        now, with Chiron's deadline rate (`floor`) as a floor under their batch load."""
        for name in self.config.pools:
            dep = view.deployments.get(name)
            if dep is not None and dep.replica_stats:
                self._reported.add(name)
        planned: dict[str, dict[str, float]] = {}
        for name in self._order:
            if name in self._reported:
                classes = self.config.pools[name]
                planned[name] = self.planner.planning_rates(
                    name, {cls: arrivals.get(cls, 0.0) for cls in classes},
                    sum(batch.get(cls, 0.0) for cls in classes), now_s,
                    batch_floor={cls: floor[cls] for cls in classes if cls in floor})
        return planned

    def _fold(self, planned: dict[str, dict[str, float]], view: ClusterView, now_s: float, epoch: bool,
              guarded: frozenset[str]) -> tuple[PoolGroup, ...]:
        """DynamoLLM's pool folding: which pools serve, each group on its host (the last); new
        folds and unfolds only at a pool `epoch`."""
        if self._folding is None:
            return tuple(PoolGroup((name,)) for name in planned)
        self._folding.unfold(guarded)
        if len(planned) < len(self._order):
            return tuple(PoolGroup((name,)) for name in planned)
        # Not while a pool warms up: its load is not seen yet (its rate windows fill from zero).
        settled = not any(self.planner.warming_up(name, now_s) for name in planned)
        # A bursty pool does not newly fold: the profile's steady state prices the fold, and a
        # burst of prompts (the coding trace's, 20 req/s for 5 s) landing on the host's fewer
        # replicas waits behind their prefills (a fold from five TP2 replicas to two met 82%
        # of TTFTs in the burst's minute). A fold in force is not undone for it: a folded
        # short pool's few conversation requests read as bursty, and unfolding them cost 7%
        # more energy for no SLO.
        # A guarded pool neither takes another in nor goes into one: its SLOs come first.
        return self._folding.choose(lambda g: self._group_shape(g, view, now_s, guarded),
                                    epoch and settled,
                                    may_form=lambda g: not guarded & set(g.members)
                                    and self.planner.may_newly_fold(g.members, now_s))

    def _pool_plans(self, view: ClusterView, now_s: float, groups: tuple[PoolGroup, ...],
                    loads: dict[str, tuple[dict[str, float], float]], catch_up: ClusterPlan,
                    guarded_classes: Collection[str],
                    guarded: frozenset[str]) -> tuple[ClusterPlan, ClusterPlan, ClusterPlan]:
        """DynamoLLM's two entries and the SLO guard's clocks: (shapes: each serving pool's
        replicas, TP and band, no fewer instances than `catch_up` asks; folding: the routes, and
        the replicas of pools folded away; guard: the top clock wherever a guarded class runs).
        `loads`: each host's planned rates and margin. The pools of `guarded_classes`
        (`guarded`) are planned with the guard's margin at the TP they run, and serve alone."""
        replicas: dict[str, int] = {}
        tp: dict[str, int] = {}
        band: dict[str, tuple[int, int]] = {}
        routing: dict[str, dict[str, float]] = {}
        folded: set[str] = set()
        held = {name: (s.instances * s.tensor_parallel if (s := self.planner.shape(name)) else 0)
                for name in self.config.pools}
        for group in groups:
            host = group.host
            dep = view.deployments.get(host)
            for member in group.members[:-1]:  # folded: its classes go to the host, its GPUs back
                self.planner.forget(member)
                held[member] = 0
                replicas[member] = 0
                folded.add(member)
            rates, margin = loads[host]
            free = self.config.cluster_gpus - sum(g for other, g in held.items() if other != host)
            running = self._running(dep)
            dilation = self._dilation(host, dep)
            traits = self._replica_traits(host, dep, now_s, guarded)
            shape = self.planner.plan(host, rates, free, catch_up.backlog_instances.get(host, 0), running, now_s,
                                      late=host in catch_up.late_ttft_s,
                                      max_instances=dep.max_replicas if dep else None,
                                      tps=self._tps(host, dep, guarded), dilation=dilation,
                                      replicas=traits, burst_margin=margin)
            held[host] = shape.instances * shape.tensor_parallel
            replicas[host], tp[host] = shape.instances, shape.tensor_parallel
            band[host] = (self._clock_floor(dep, running, shape, rates, dilation, traits), self.max_clock_mhz)
            ready = dep is not None and sum(s.tensor_parallel == shape.tensor_parallel
                                            for s in dep.replica_stats) >= shape.instances
            for cls in rates:
                routing[cls] = {self._handover.route(cls, self._own_pool[cls], host, ready): 1.0}
        for weights in routing.values():  # a pool still serving a class until its new pool is ready
            (pool,) = weights
            if replicas.get(pool) == 0 and (dep := view.deployments.get(pool)) is not None:
                replicas[pool] = dep.target_replicas
        # Flat out wherever a guarded class runs: its own pool, and the one it leaves once that is ready.
        flat_out = {pool for pool in guarded | {pool for cls in guarded_classes for pool in routing.get(cls, {})}
                    if pool in band}
        self.planner.end_epoch(now_s)
        shapes = ClusterPlan(replicas={p: n for p, n in replicas.items() if p not in folded}, tensor_parallel=tp,
                             clock_band_mhz={p: b for p, b in band.items() if p not in flat_out},
                             reason="dynamollm planner")
        folding = ClusterPlan(replicas={p: replicas[p] for p in folded},
                              routing_weights=routing if self._folding is not None else {})
        guard = ClusterPlan(clock_band_mhz={p: (self.max_clock_mhz, self.max_clock_mhz) for p in flat_out})
        return shapes, folding, guard

    def _clock_floor(self, dep: DeploymentView | None, running: PoolShape | None, shape: PoolShape,
                     rates: dict[str, float], dilation: Dilation, traits: ReplicaTraits) -> int:
        """The band's floor. A steady pool of interactive work whose replicas pick each step's
        clock gets the least-power clock that carries its load (PoolShape.run_clock_mhz): their
        search sees every deadline (admitted requests, and the prompts still to prefill), so the
        planned clock sizes instances only, and steps below the planned peak run slower, but no
        lower than where a slower step costs more energy. Otherwise the planned clock, unless instances are on
        their way: until they are ready, the replicas already serving carry the planned load, at
        the clock that needs (the top one if they cannot). A bursty pool keeps the planned
        floor: in a burst its long prefills interleave with the running decodes, whose TBT a
        low clock stretches. So does a pool with batch requests waiting at its replicas: batch
        work fills its batches at the clock its loose deadlines allow, and interactive prompts
        arriving wait behind it. Batch work that runs as it arrives is served like interactive
        work, at the clock the search picks."""
        if traits.pick_clock:
            return shape.run_clock_mhz or self.min_clock_mhz
        if dep is None or running is None or dep.current_replicas >= shape.instances:
            return shape.clock_mhz
        return max(shape.clock_mhz, self.planner.clock_for(rates, running.tensor_parallel, dep.current_replicas,
                                                           dilation, traits))

    def _replica_traits(self, host: str, dep: DeploymentView | None, now_s: float,
                        guarded: frozenset[str]) -> ReplicaTraits:
        """What the pool's replicas report that its costs depend on: whether every one prefills
        in TTFT-deadline order (with the longest step any reports), whether they pick each
        step's clock from the GPU's lowest up (the band's floor `_clock_floor` gives them: a
        steady pool with no batch backlog whose replicas all run throttLL'eM's clock hook, and
        not one the SLO guard runs at the top clock), and the lowest clock every one of them
        runs at whatever the band (their search's floor)."""
        stats = dep.replica_stats if dep is not None else ()
        steps = [s.deadline_prefill_step_s for s in stats if s.deadline_prefill_step_s > 0]
        pick_clock = bool(self.config.lowest_floor_when_steady and host not in guarded
                          and not self.planner.is_bursty(host, now_s)
                          and dep is not None and stats and all(s.per_step_clock for s in stats)
                          and not self._batch_backlog(dep))
        return ReplicaTraits(deadline_step_s=max(steps) if stats and len(steps) == len(stats) else None,
                             pick_clock=pick_clock,
                             clock_floor_mhz=min((s.step_clock_floor_mhz for s in stats), default=0.0))

    @staticmethod
    def _batch_backlog(dep: DeploymentView) -> bool:
        """Batch requests wait at any of the pool's replicas: batch work has filled them."""
        return any(s.batch_waiting > 0 for s in dep.replica_stats)

    def _group_shape(self, group: PoolGroup, view: ClusterView, now_s: float,
                     guarded: frozenset[str]) -> PoolShape | None:
        """The cheapest shape that carries the group's planned load on its host; None if a
        pool it would fold must keep replicas (`min_replicas` > 0: Serve would keep them
        running, so folding would save nothing), or if the host's replicas run off the profile
        (their speed, measured at their TP and on their classes, says little of the TP and
        classes a fold would give them)."""
        for member in group.members[:-1]:
            if (folded := view.deployments.get(member)) is None or folded.min_replicas > 0:
                return None
        dep = view.deployments.get(group.host)
        dilation = self._dilation(group.host, dep)
        if len(group.members) > 1 and dilation.slowdown != 1.0:
            return None
        rates, margin = self._host_load(group, now_s, guarded)
        return self.planner.cheapest(rates, self.config.cluster_gpus,
                                     dep.max_replicas if dep else None,
                                     self._tps(group.host, dep, guarded),
                                     dilation, self._replica_traits(group.host, dep, now_s, guarded),
                                     self.planner.gpu_worth_w(group.members, now_s), margin)

    def _tps(self, host: str, dep: DeploymentView | None, guarded: frozenset[str]) -> list[int] | None:
        """The TPs the host may be planned at: its options; a guarded pool only the TP it runs
        (a TP change restarts replicas whose SLOs already miss: on a synthetic long-prompt load a
        guarded pool that re-sharded from TP4 to TP2 for its margin missed 37 requests in two
        minutes, and met 0.6 points less of the SLOs than the same guard kept at TP4)."""
        running = self._running(dep)
        if host in guarded and running is not None:
            return [running.tensor_parallel]
        return self.config.tensor_parallel_options.get(host)

    def _host_load(self, group: PoolGroup, now_s: float, guarded: frozenset[str]) -> tuple[dict[str, float], float]:
        """The rates the group's host is planned for and the burst margin they carry: a host
        the SLO guard names (it serves alone) carries the guard's margin more
        (SloGuard.load_margin), for what its SLOs showed the forecast missed."""
        rates = self.planner.group_rates(group.members, now_s)
        margin = self.planner.burst_margin(group.members, now_s)
        if group.host not in guarded:
            return rates, margin
        assert self._guard is not None  # a host is guarded only by the guard
        extra = self._guard.load_margin(self.config.pools[group.host])
        return {cls: r * (1.0 + extra) for cls, r in rates.items()}, (1.0 + margin) * (1.0 + extra) - 1.0

    def _guarded_pools(self, guarded_classes: Collection[str]) -> frozenset[str]:
        """The pools whose own classes the SLO guard names."""
        return frozenset(self._own_pool[cls] for cls in guarded_classes if cls in self._own_pool)

    def plan(self, view: ClusterView, now_s: float) -> ClusterPlan:
        """A fresh plan from every layer (what observe returns until the next plan interval).
        Each entry is written by one layer (`compose` refuses an entry two set; the owners:
        `autoscaling.ownership.DECISIONS`); a layer may read what an earlier one wrote: the
        shapes are sized on Chiron's batch floor and the catch-up floors."""
        guarded = self._guard.update(view, now_s) if self._guard is not None else {}
        arrivals, batch, prompt_tokens = self._class_rates(view)
        chiron = self._chiron(view, now_s, arrivals, batch)
        # Classes whose prompts run longer than the planner was tuned on, over its long window.
        work = self._prompt_work.observe(now_s, arrivals, prompt_tokens) if self._prompt_work is not None else {}
        planned = self._planned_rates(view, now_s, in_profiled_requests(arrivals, work),
                                      in_profiled_requests(batch, work), chiron.batch_rate_floor_per_s)
        guarded_pools = self._guarded_pools(guarded)
        groups = self._fold(planned, view, now_s, self.planner.at_epoch(now_s), guarded_pools)
        loads = {group.host: self._host_load(group, now_s, guarded_pools) for group in groups}
        catch_up = self._catch_up(view, loads)
        shapes, folding, guard_clocks = self._pool_plans(view, now_s, groups, loads, catch_up, guarded, guarded_pools)
        guard = ClusterPlan(slo_guard=guarded, reason="slo guard: " + ", ".join(
            f"{cls} under target since {since_s:.0f} s" for cls, since_s in sorted(guarded.items()))) \
            if guarded else ClusterPlan()
        return compose({SLO_GUARD: guard.merge(guard_clocks), CHIRON: chiron, CATCH_UP: catch_up,
                        DYNAMOLLM_SHAPES: shapes, DYNAMOLLM_FOLDING: folding})

    def observe(self, view: ClusterView, now_s: float) -> ClusterPlan:
        if self._last is not None and now_s < self._next_plan_s:
            return self._last
        self._next_plan_s = now_s + self.config.plan_interval_s
        self._last = self.plan(view, now_s)
        return self._last


def make_wattwise(**kwargs) -> WattwisePolicy:  # kwargs: policy_kwargs from YAML
    return WattwisePolicy(WattwiseConfig(**kwargs))
