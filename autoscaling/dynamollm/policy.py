"""DynamoLLM's controller hierarchy as one ControlPolicy (DynamoLLM paper, §IV).

Three epochs, each a pure step on the same EnergyProfile:
- cluster (default 30 min): forecast each class's peak, size pools at TP8/max clock,
  spill leftovers to the next larger pool (routing weights);
- pool (default 5 min): the max-clock MILP picks TP and instances within the pool's
  GPUs; a change is made only if the energy it saves over the epoch pays its cost,
  or at once if the current shape cannot carry the load;
- instance (default 5 s): the lowest-energy clock meeting the SLO at the current load.
Overload between epochs (queues beyond a bound, TTFT over target) forwards half of the
pool's own traffic to the next larger pool and adds an instance if GPUs allow.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pydantic import Field

from autoscaling.dynamollm.cluster_manager import PoolDemand, size_pools
from autoscaling.dynamollm.instance_manager import lowest_energy_clock, step_up
from autoscaling.dynamollm.load_predictor import WeeklyTemplatePredictor
from autoscaling.dynamollm.pool_manager import solve_pool
from autoscaling.dynamollm.reconfig import worth_reconfiguring
from core.classes import LengthClassConfig
from core.overheads import OverheadTable
from core.plan import ClusterPlan
from core.slo import SLO
from core.view import ClusterView, DeploymentView
from energy.profile import EnergyProfile
from energy.profile_source import EnergyProfileSource

MAX_TP = 8


class DynamoLLMConfig(EnergyProfileSource):
    pools: dict[str, list[str]] = Field(description=(
        "Deployment name -> the length classes it serves, smallest requests first."))
    cluster_gpus: int = Field(default=96, gt=0, description="GPUs the cluster manager may hand out to the pools.")
    warmup_s: float = Field(default=60.0, ge=0, description=(
        "The first cluster epoch waits this long (s) after the first replica stats, to observe load; "
        "until then the runtime's provisioned pools stay as they are."))
    cluster_epoch_s: float = Field(default=1800.0, gt=0, description=(
        "Cluster-manager epoch (s): pools are sized from the predicted peak over the next epoch "
        "(DynamoLLM: 30 min)."))
    pool_epoch_s: float = Field(default=300.0, gt=0, description=(
        "Pool-manager epoch (s): each pool re-picks its TP and instance count (DynamoLLM: 5 min)."))
    instance_epoch_s: float = Field(default=5.0, gt=0, description=(
        "Instance-manager epoch (s): each pool re-picks the lowest-energy GPU clock meeting the SLO "
        "at its current load (DynamoLLM: 5 s)."))
    headroom: float = Field(default=0.8, gt=0, le=1, description="Share of each SLO to plan for.")
    min_pool_instances: float = Field(default=0.5, ge=0, description=(
        "A pool (other than the last) whose demand is below this many instances gets none; its load "
        "spills to the next pool."))
    max_pools: int | None = Field(default=None, gt=0, description=(
        "Most pools kept: the busiest ones plus the last; the others' load spills over. None: all."))
    overload_queue_per_replica: float = Field(default=8.0, gt=0, description=(
        "A pool with more queued requests than this per replica (or late on TTFT) is overloaded: it "
        "sheds load to its spill pool or adds an instance."))
    shadow_timeout_s: float = Field(default=120.0, ge=0, description=(
        "A new plan that grows pools takes effect (routing moves, other pools shrink) once the grown "
        "pools' replicas are ready, or after this long (s)."))
    max_reshards_per_epoch: int = Field(default=2, ge=1, description=(
        "Most optional TP changes per pool epoch (staggered reconfiguration, §IV-B); changes a pool "
        "needs to carry its load are not counted."))
    overheads: OverheadTable = Field(default=OverheadTable(), description=(
        "What a TP change and a clock change cost: the reconfiguration is worth it only when its "
        "energy saving pays for them."))


@dataclass
class PoolState:
    classes: list[str]
    gpus: int = 0
    tp: int = MAX_TP
    instances: int = 1
    clock_mhz: int = 0
    keep_share: float = 1.0
    spill_to: str | None = None
    peak_demand: float = 0.0  # most instances needed since the last pool epoch


@dataclass(frozen=True)
class ShapeProposal:
    """A pool manager's new shape for its pool. `saved_w` is what it saves; None when the
    current shape cannot carry the load, so the change is not optional."""

    pool: PoolState
    tp: int
    instances: int
    saved_w: float | None = None

    def apply(self) -> None:
        self.pool.tp, self.pool.instances = self.tp, self.instances


class DynamoLLMPolicy:
    def __init__(self, config: DynamoLLMConfig, profile: EnergyProfile | None = None) -> None:
        self.config = config
        self.lengths = LengthClassConfig()
        profile = config.energy_profile() if profile is None else profile
        self.profile = profile
        self.max_clock = max(profile.clocks_mhz)
        self.predictor = WeeklyTemplatePredictor(slot_s=config.cluster_epoch_s)
        self.pools = {name: PoolState(list(classes), clock_mhz=self.max_clock)
                      for name, classes in config.pools.items()}
        self._start_s: float | None = None  # first observation: epochs count from here
        self._next_cluster_s = self._next_pool_s = self._next_instance_s = 0.0
        self._class_rates: dict[str, float] = {}
        self._committed: ClusterPlan | None = None
        self._pending_since_s: float | None = None

    # ---- helpers -------------------------------------------------------------------
    def _lead_class(self, name: str) -> str:
        """The class bringing pool `name` the most demand under the current routing
        (its own first class when idle): the class whose profile the pool is planned on."""
        best, best_need = self.pools[name].classes[0], 0.0
        for cls, weights in self._routing().items():
            need = weights.get(name, 0.0) * self._class_rates.get(cls, 0.0) / self._capacity(cls)
            if need > best_need:
                best, best_need = cls, need
        return best

    def _capacity(self, cls: str) -> float:
        """Requests/s of `cls` one instance carries at the highest-performance shape."""
        cap = self.profile.capacity(cls, MAX_TP, self.max_clock, self.lengths.slo(cls), self.config.headroom)
        return max(cap, 1e-9)

    def _pool_demands(self) -> dict[str, float]:
        """Instances (TP8, max clock) each pool needs for the traffic routed to it now."""
        demand = dict.fromkeys(self.pools, 0.0)
        for cls, weights in self._routing().items():
            need = self._class_rates.get(cls, 0.0) / self._capacity(cls)
            for pool, share in weights.items():
                demand[pool] += share * need
        return demand

    def _pool_slo(self, name: str) -> SLO:
        """The tightest targets among the classes routed to pool `name` (own ones if none)."""
        routed = [cls for cls, w in self._routing().items() if w.get(name, 0.0) > 0] or self.pools[name].classes
        slo = self.lengths.slo(routed[0])
        for cls in routed[1:]:
            slo = slo.tightest(self.lengths.slo(cls))
        return slo

    def _pool_load(self, name: str, demand_instances: float) -> tuple[str, float]:
        """The pool's load as a rate of its lead class (the profile it is planned on)."""
        cls = self._lead_class(name)
        return cls, demand_instances * self._capacity(cls)

    # ---- epochs --------------------------------------------------------------------
    def _cluster_epoch(self, now_s: float) -> None:
        demands = []
        for name, pool in self.pools.items():
            need = sum(
                self.predictor.predict_peak(c, now_s, self.config.cluster_epoch_s) / self._capacity(c)
                for c in pool.classes
            )
            demands.append(PoolDemand(name, need))
        decision = size_pools(demands, self.config.cluster_gpus, MAX_TP, self.config.min_pool_instances,
                              self.config.max_pools)
        for name, pool in self.pools.items():
            pool.gpus = decision.instances[name] * MAX_TP
            pool.keep_share = decision.keep_share[name]
            pool.spill_to = decision.spill_to.get(name)
        largest = self.pools[list(self.pools)[-1]]
        largest.gpus = max(largest.gpus, MAX_TP)  # someone must serve what all others spill

    def _pool_epochs(self) -> None:
        """Every pool proposes its shape; shapes that cannot carry the load change at
        once, the rest in savings order, at most `max_reshards_per_epoch` per epoch
        (staggered reconfiguration, §IV-B), the others waiting for the next epoch."""
        optional = []
        for name, pool in self.pools.items():
            proposal = self._propose(name, pool)
            if proposal is None:
                continue
            if proposal.saved_w is None:  # later pools plan with this pool's new shape
                proposal.apply()
            else:
                optional.append(proposal)
        optional.sort(key=lambda p: p.saved_w or 0.0, reverse=True)
        for proposal in optional[: self.config.max_reshards_per_epoch]:
            proposal.apply()

    def _propose(self, name: str, pool: PoolState) -> ShapeProposal | None:
        """The new shape of a pool whose shape should change, or None."""
        cls, load = self._pool_load(name, pool.peak_demand)
        pool.peak_demand = 0.0
        if pool.gpus == 0:
            return ShapeProposal(pool, pool.tp, 0) if pool.instances else None
        slo = self._pool_slo(name)
        choice = solve_pool(self.profile, cls, load, pool.gpus, slo, max_clock_only=True,
                            headroom=self.config.headroom)
        if choice is None:
            # No shape meets the SLO at this load: run all the pool's GPUs at the TP it has.
            # Re-sharding would stall the pool, and TP8 carries fewer requests per GPU.
            tp = pool.tp if pool.instances > 0 else MAX_TP
            instances = max(pool.gpus // tp, 1)
            return None if (tp, instances) == (pool.tp, pool.instances) else ShapeProposal(pool, tp, instances)
        # The pool runs all its GPUs (the cluster manager sized them); the pool manager
        # only picks how to shard them, as DynamoLLM's online simplification does.
        instances = pool.gpus // choice.tensor_parallel
        if (choice.tensor_parallel, instances) == (pool.tp, pool.instances):
            return None
        current_ok = pool.instances > 0 and self.profile.meets(
            cls, pool.tp, self.max_clock, load / pool.instances, slo, self.config.headroom)
        if not current_ok:
            return ShapeProposal(pool, choice.tensor_parallel, instances)
        saved = self._savings_w(pool, cls, load, choice.tensor_parallel, instances, choice.power_w)
        return ShapeProposal(pool, choice.tensor_parallel, instances, saved) if saved is not None else None

    def _savings_w(self, pool: PoolState, cls: str, load: float, tp: int, instances: int,
                   power_new_w: float) -> float | None:
        """Watts a new shape saves, if that pays its reconfiguration cost within the epoch."""
        now = self.profile.at(cls, pool.tp, self.max_clock, load / max(pool.instances, 1))
        if now is None:
            return None
        power_now = now[0] * pool.instances
        # The restart every runtime does for a TP change, or a new instance's start-up.
        oh = self.config.overheads
        if tp != pool.tp:
            cost_s = oh.reshard_s
        else:
            cost_s = oh.startup_s if instances > pool.instances else 0.0
        cost_j = cost_s * power_now
        if not worth_reconfiguring(power_now, power_new_w, self.config.pool_epoch_s, cost_j):
            return None
        return power_now - power_new_w

    def _instance_epoch(self, name: str, pool: PoolState, dep: DeploymentView | None, demand: float) -> None:
        if pool.instances == 0:
            return
        cls, load = self._pool_load(name, demand)
        slo = self._pool_slo(name)
        rate = load / pool.instances
        clock = lowest_energy_clock(self.profile, cls, pool.tp, rate, slo, self.config.headroom)
        slow = dep is not None and any(s.itl_ewma_s > slo.tbt_s * self.config.headroom for s in dep.replica_stats)
        pool.clock_mhz = max(clock, step_up(self.profile, pool.clock_mhz)) if slow else clock

    def _handle_overload(self, name: str, pool: PoolState, dep: DeploymentView | None, gpus_free: int) -> int:
        if pool.instances == 0:
            return self._serve_stranded(pool, dep, gpus_free)
        if dep is None or not dep.replica_stats or (pool.spill_to is None and gpus_free < pool.tp):
            return gpus_free
        queued = dep.queued_outside + sum(s.queued_requests for s in dep.replica_stats)
        # TTFT averages over every class in the pool: judge it by the lead class's target.
        lead_ttft_s = self.lengths.slo(self._lead_class(name)).ttft_s
        late = any(s.ttft_ewma_s > lead_ttft_s for s in dep.replica_stats)
        if queued > self.config.overload_queue_per_replica * max(len(dep.replica_stats), 1) or late:
            if pool.spill_to is not None:
                pool.keep_share *= 0.5
            # One instance at a time: wait until the last one added is serving.
            if gpus_free >= pool.tp and dep.target_replicas <= dep.current_replicas:
                pool.instances += 1
                pool.gpus = max(pool.gpus, pool.instances * pool.tp)
                gpus_free -= pool.tp
        return gpus_free

    def _serve_stranded(self, pool: PoolState, dep: DeploymentView | None, gpus_free: int) -> int:
        """A pool the cluster manager emptied gets no traffic, and what its draining replicas
        still hold is not demand for a new instance. But requests waiting at it with no
        replica left (a runtime that routed them before it saw the new routing) would wait
        forever: they get one instance, until the next pool epoch (the pool holds no GPUs)."""
        if dep is not None and dep.current_replicas == 0 and dep.queued_outside > 0 and gpus_free >= pool.tp:
            pool.instances = 1
            gpus_free -= pool.tp
        return gpus_free

    # ---- the policy ----------------------------------------------------------------
    def observe(self, view: ClusterView, now_s: float) -> ClusterPlan:
        rates: dict[str, float] = {}
        for dep in view.deployments.values():
            for s in dep.replica_stats:
                for cls, r in s.class_rates_per_s.items():
                    rates[cls] = rates.get(cls, 0.0) + r
        self._class_rates = rates
        for cls in self.lengths.names():
            self.predictor.observe(cls, rates.get(cls, 0.0), now_s)
        if self._start_s is None:
            if not any(dep.replica_stats for dep in view.deployments.values()):
                # Replicas still starting (minutes for a real model): the warm-up observes load, not start-up.
                return ClusterPlan(reason="dynamollm: waiting for replica stats")
            self._start_s = now_s
            self._next_cluster_s = self._next_pool_s = self._next_instance_s = now_s + self.config.warmup_s
        if now_s < self._start_s + self.config.warmup_s:
            return ClusterPlan(reason="dynamollm: warming up")
        if now_s >= self._next_cluster_s:
            self._cluster_epoch(now_s)
            self._next_cluster_s = now_s + self.config.cluster_epoch_s
            self._next_pool_s = now_s
        demands = self._pool_demands()
        for name, pool in self.pools.items():
            pool.peak_demand = max(pool.peak_demand, demands[name])
        if now_s >= self._next_pool_s:
            self._pool_epochs()
            self._next_pool_s = now_s + self.config.pool_epoch_s
        if now_s >= self._next_instance_s:
            gpus_free = self.config.cluster_gpus - sum(p.instances * p.tp for p in self.pools.values())
            for name, pool in self.pools.items():
                pool_dep = view.deployments.get(name)
                gpus_free = self._handle_overload(name, pool, pool_dep, gpus_free)
                self._instance_epoch(name, pool, pool_dep, demands[name])
            self._next_instance_s = now_s + self.config.instance_epoch_s
        return self._shadowed(self._plan(), view, now_s)

    def _shadowed(self, desired: ClusterPlan, view: ClusterView, now_s: float) -> ClusterPlan:
        """Shadow instances (§IV-C): pools keep serving under the old routing until the
        pools the new plan grows have their replicas ready."""
        # The first plan changes what the cluster runs now: the pools' replicas, default routing.
        old = self._committed or ClusterPlan(
            replicas={p: view.deployments[p].target_replicas for p in desired.replicas if p in view.deployments})
        growing = [p for p, n in desired.replicas.items() if n > old.replicas.get(p, 0)]
        ready = all(p in view.deployments and view.deployments[p].current_replicas >= desired.replicas[p]
                    for p in growing)
        if ready:
            self._committed, self._pending_since_s = desired, None
            return desired
        if self._pending_since_s is None:
            self._pending_since_s = now_s
        if now_s - self._pending_since_s >= self.config.shadow_timeout_s:
            self._committed, self._pending_since_s = desired, None
            return desired
        replicas = {p: max(n, old.replicas.get(p, 0)) for p, n in desired.replicas.items()}
        return replace(desired, replicas=replicas, routing_weights=old.routing_weights,
                       reason="dynamollm: waiting for new replicas")

    def _serving(self, name: str) -> str:
        """`name`, or the first larger pool that has instances."""
        while self.pools[name].instances == 0:
            spill_to = self.pools[name].spill_to
            if spill_to is None:
                break
            name = spill_to
        return name

    def _plan(self) -> ClusterPlan:
        return ClusterPlan(
            replicas={n: p.instances for n, p in self.pools.items()},
            tensor_parallel={n: p.tp for n, p in self.pools.items()},
            clock_mhz={n: p.clock_mhz for n, p in self.pools.items() if p.instances > 0},
            routing_weights=self._routing(),
            reason="dynamollm",
        )

    def _routing(self) -> dict[str, dict[str, float]]:
        """Class -> pool shares: keep what the own pool carries, spill the rest onward."""
        routing: dict[str, dict[str, float]] = {}
        for name, pool in self.pools.items():
            keep = pool.keep_share if pool.instances > 0 else 0.0
            for cls in pool.classes:
                weights = {name: keep} if keep > 0 else {}
                if pool.spill_to is not None and keep < 1.0:
                    target = self._serving(pool.spill_to)
                    weights[target] = weights.get(target, 0.0) + 1.0 - keep
                routing[cls] = weights
        return routing


def make_dynamollm(**kwargs) -> DynamoLLMPolicy:
    return DynamoLLMPolicy(DynamoLLMConfig(**kwargs))
