"""DynamoLLM's pool planning with free instance counts: the shape (TP, instances, clock)
of each pool that carries its load on the fewest joules, re-planned as load moves.

DynamoLLM's own policy sizes pools for a 30-minute peak forecast at TP8 and only
re-shards inside those GPUs, so at low load it holds GPUs a baseline like ScaleShard
gives back. Here every candidate (TP, clock) of the energy profile is costed at the
instance count it needs for the pool's per-class load, and the cheapest wins: the
choices of ScaleShard (small TP), ScaleInst (instances) and ScaleFreq (clock) are all in
the search, so the planner never loses to one of them on the profile's terms. Each GPU held
also costs `held_gpu_w`: between shapes the profile prices within a few watts of each other,
the one with fewer GPUs wins (the replicas' per-step clock does not save those watts).

Load is the trailing peak of the interactive rate replicas report, summed over the classes
(and pools) served together and split by their shares, times a margin for bursts, plus
batch work at its mean over a longer window (Chiron: batch work fills spare capacity
behind interactive work, so it needs capacity on average only).
Instances grow at once and shrink only after the smaller count held for
`downscale_hold_s`, and not while the pool warms up (its replicas' rate windows fill
from zero: a ramp, neither low load nor a burst); a TP change happens at a pool epoch
when the watts it saves over the epoch pay the reconfiguration (the shared overhead
table), or at once when the current TP cannot carry the load, or when the pool must start
instances anyway and the switch pays (growing at the old TP and re-sharding at the next
epoch would hold both shapes' GPUs in between). The plan's clock is a band:
its floor is the planned clock, its ceiling the GPU's top, and the replicas' per-step
clock hook searches inside it.
The profile may be wrong for the engines that run: each pool is planned at the speed its
replicas measure against the profile (`Dilation`, batching.step_speed), not only at the
profile's.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, replace

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from autoscaling.dynamollm.prompt_work import TUNED_PROMPT_TOKENS
from autoscaling.dynamollm.reconfig import worth_reconfiguring
from core.arrival_rates import RATE_WINDOW_S
from core.classes import LengthClassConfig
from core.kv_budget import KV_BUDGET
from energy.profile import EnergyProfile


class ShapePlannerTuning(BaseModel):
    """The planner's constants chosen on traces, not settings an operator sizes a fleet with. Each
    says which data chose it (docs/results/2026-12-05-tuning-log.md): a new value is a new
    experiment, judged on data it was not chosen on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    headroom: float = Field(default=0.7, gt=0, le=1, description=(
        "Share of the TBT target to plan for. Tuned on conv's first half (t < 1800 s)."))
    ttft_headroom: float = Field(default=0.6, gt=0, le=1, description=(
        "Share of the TTFT target's slack above a prompt's own prefill that the planned wait may "
        "fill: the profile's TTFT is a mean (M/D/1 queueing), the SLO is judged per request, so "
        "the tail of the wait needs room the mean does not show (the prefill itself does not vary). "
        "Tuned on conv's first half; read on the slack above the prefill since `cb572c4` (conv's "
        "first half on Splitwise's H100 and A100 profiles)."))
    burst_margin: float = Field(default=0.25, ge=0, description=(
        "Extra load planned above the trailing peak rate, for bursts inside the re-plan period: "
        "the most a pool plans for, and what it plans for until it has `bursty_lookback_s` of "
        "history (with `margin_from_history`). "
        "Tuned on conv's first half."))
    margin_from_history: bool = Field(default=True, description=(
        "A steady pool with `bursty_lookback_s` of history plans for the largest rise of its "
        "interactive rate above its trailing peak over that window (at most `burst_margin`, at "
        "least none): conversation traffic drifts a few percent above its 2-minute peak, "
        "coding traffic's bursts many times over it. False: `burst_margin` for every pool. "
        "Tuned on conv's first half (`3e395f9`, docs/results/2026-12-02-margin-from-history.md)."))
    lookback_s: float = Field(default=120.0, gt=0, description=(
        "Window of the trailing peak rate. Tuned on conv's first half."))
    bursty_cv: float = Field(default=1.0, gt=0, description=(
        "A pool whose interactive rate over `bursty_lookback_s` varies more than this (std over "
        "mean of the plans' rates) is bursty: on/off traffic that a short trailing peak forgets "
        "between bursts. "
        "Tuned on the first halves of conv and code (`73769f9`)."))
    bursty_lookback_s: float = Field(default=900.0, gt=0, description=(
        "Window of the trailing peak rate for a bursty pool; a pool stays bursty this long after "
        "it last varied more than `bursty_cv` (bursts close together vary less over the window, "
        "yet each still needs the instances the last one did). "
        "Tuned on the first halves of conv and code (`73769f9`); how long a pool stays bursty was "
        "read from code's second half (`484bc03`)."))
    warmup_s: float = Field(default=120.0, ge=0, description=(
        "For this long after a pool's first plan it neither shrinks nor counts as bursty: its "
        "replicas' arrival-rate windows fill from zero, a ramp that reads as low and varying load. "
        "Tuned on conv's first half."))
    batch_window_s: float = Field(default=900.0, gt=0, description=(
        "Batch work is planned at its mean rate over this window, without a burst margin: it "
        "waits for spare capacity behind interactive work (Chiron), its deadlines are hours. "
        "Set with Chiron's layer on conv's first half (`21215af`), not tuned since."))
    downscale_hold_s: float = Field(default=90.0, ge=0, description=(
        "A smaller instance count must be enough for this long before the pool shrinks. "
        "Tuned on conv's first half."))
    prompt_reference_tokens: dict[str, int] = Field(default_factory=lambda: dict(TUNED_PROMPT_TOKENS), description=(
        "Mean prompt tokens per predicted length class of the traffic these constants were tuned "
        "on (the Azure conversation trace, classes as the shipped predictor assigns them: "
        "autoscaling.dynamollm.prompt_work.TUNED_PROMPT_TOKENS). A class whose prompts run longer "
        "is planned for the extra prefill (`follow_prompt_lengths`)."))
    prompt_deadband: float = Field(default=0.35, ge=0, description=(
        "A class whose mean prompt over `bursty_lookback_s` runs more than this share above its "
        "`prompt_reference_tokens` is planned for the longer prompts (`follow_prompt_lengths`). "
        "Chosen on conv's first half, read then over 2 min (0.25 drew 6.4% more there, 0.35 none) "
        "(docs/results/2026-12-06-prompt-lengths-and-escalation.md)."))
    speed_deadband: float = Field(default=0.1, ge=0, description=(
        "A measured step-time ratio within this share of 1 counts as 1 (noise, not a wrong profile). "
        "Assumed (step-time noise), not tuned (`75e7821`)."))
    held_gpu_w: float = Field(default=200.0, ge=0, description=(
        "What one GPU held costs beyond its power, in watts: a steady pool's shape is the one of "
        "least planned power plus this per GPU, and folds and TP changes weigh the same sum. 0: "
        "power alone (DynamoLLM), which holds a GPU more to save the few watts the profile shows "
        "between near-equal shapes, watts the replicas' per-step clock does not save. A bursty "
        "pool is priced at power alone: its clock headroom absorbs bursts beyond the window's "
        "peak. A GPU-hour's rental over a kWh's price is ~20 kW; 200 W breaks the profile's "
        "near-ties without trading SLO on the benches (docs/one-controller.md). "
        "Tuned on conv and code (docs/results/2026-11-26-held-gpu-worth.md)."))
    young_fold_cv: float | None = Field(default=0.3, gt=0, description=(
        "Pools one of which has under `bursty_lookback_s` of history newly fold only if their "
        "summed interactive rate since their replicas' rate windows filled (`RATE_WINDOW_S` "
        "after the first plan) varied at most this much (std over mean; silence has shown "
        "nothing): two minutes of conversation traffic vary 0.1-0.3 per pool, the coding "
        "trace's on/off minutes 0.7-0.9 (0.4-0.5 at twice its rate) before its long window "
        "calls them bursty. None: no such check. "
        "Tuned on the first halves of conv and code (docs/results/2026-12-02-young-pools-fold.md)."))
    first_epoch_s: float = Field(default=120.0, ge=0, description=(
        "The first pool epoch (a TP change or a fold may happen) comes this long after the first "
        "plan: `warmup_s` of observed load first, then the shape the operator started with may "
        "go (a fold only where `young_fold_cv` finds the load steady). "
        "Tuned on the first halves of conv and code (docs/results/2026-12-02-margin-from-history.md)."))


class ShapePlannerConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kv_budget: float = Field(default=KV_BUDGET, gt=0, le=1, description=(
        "Share of a replica's KV its planned steady batch may fill (energy profiles built from the "
        "perf model; a measured profile already shows what its engines held). throttLL'eM's "
        "admission reserves each request's projected peak, so a replica planned to its last KV "
        "block turns prompts away at the door while decodes finish. The KV budget (core.kv_budget, "
        "chosen on the first halves of conv, code, the batch mix and the job: `58e7cd5`)."))
    min_instances: int = Field(default=1, ge=0, description=(
        "Warm instances every serving pool keeps (a pool folded into another keeps none)."))
    follow_measured_speed: bool = Field(default=True, description=(
        "Plan each pool on the step times its replicas measure against the profile "
        "(ReplicaStats.step_time_ratio, batching.step_speed): a pool whose engine runs f times "
        "slower than the profile is planned as the profile's engine at f times the load and 1/f "
        "of the SLOs. False: trust the profile."))
    follow_prompt_lengths: bool = Field(default=True, description=(
        "Plan each class on the prompts its replicas see (ReplicaStats.class_prompt_tokens_per_s): "
        "a class whose mean prompt over `bursty_lookback_s` runs f times its `prompt_reference_tokens` "
        "(beyond `prompt_deadband`) is planned as f times its rate "
        "(autoscaling.dynamollm.prompt_work). False: the prompts the planner was tuned with."))
    tuning: ShapePlannerTuning = Field(default_factory=ShapePlannerTuning, description=(
        "Constants chosen on traces (windows, margins, headrooms, the bursty rule), each with the "
        "data it was chosen on."))


@dataclass(frozen=True)
class PoolShape:
    tensor_parallel: int
    instances: int
    clock_mhz: int
    power_w: float  # the pool's instances together, at the planned load
    held_gpu_w: float = 0.0  # what each GPU it holds was priced at beside its power
    # Where its replicas pick each step's clock: the least-power clock that carries the load
    # (the band's floor); 0 where the shape runs at `clock_mhz`.
    run_clock_mhz: int = 0

    @property
    def cost_w(self) -> float:
        """What the planner minimises: its power plus `held_gpu_w` per GPU held."""
        return self.power_w + self.held_gpu_w * self.tensor_parallel * self.instances


@dataclass(frozen=True)
class Dilation:
    """A pool whose engine runs `slowdown` times slower than the profile, as the profile's
    engine sees it: time stretches by `slowdown`, so the same replicas carry 1/`slowdown` of
    the rate within SLOs `slowdown` times as long, at the power of the profile's engine at
    `slowdown` times the rate (each step as long, as hungry, and as many of them per request).
    `work`: the share of the profile's work per request the replicas do (prompts found in their
    prefix caches skip that prefill, ReplicaStats.prefix_work_ratio): it scales the load the
    replicas carry, not their steps' time."""

    slowdown: float = 1.0
    work: float = 1.0

    def rates(self, planned: dict[str, float]) -> dict[str, float]:
        factor = self.slowdown * self.work
        return planned if factor == 1.0 else {cls: r * factor for cls, r in planned.items()}

    def headroom(self, share: float) -> float:
        return share / self.slowdown

    @property
    def slo_scale(self) -> float:
        """What the SLOs are for the profile's engine: 1/`slowdown` of the real ones."""
        return 1.0 / self.slowdown


AS_PROFILED = Dilation()


@dataclass(frozen=True)
class ReplicaTraits:
    """What a pool's replicas do that its costs depend on (from what they report)."""

    # They prefill in TTFT-deadline order, each step at most this long at the clock it runs
    # (ReplicaStats.deadline_prefill_step_s); None: in arrival order.
    deadline_step_s: float | None = None
    # They pick each step's clock from the GPU's lowest up: a shape then draws the power of
    # the lowest clock that carries its load (without the burst margin), not of the clock
    # that sizes it for the margined peak.
    pick_clock: bool = False
    # Their per-step clock goes no lower than this, whatever the band's floor
    # (ReplicaStats.step_clock_floor_mhz: throttLL'eM's least-energy clock); 0: no floor.
    clock_floor_mhz: float = 0.0


ARRIVAL_ORDER_AT_PLANNED_CLOCK = ReplicaTraits()


def needed_instances(profile: EnergyProfile, rates: dict[str, float], tp: int, clock_mhz: int,
                     lengths: LengthClassConfig, headroom: float, ttft_headroom: float | None = None,
                     deadline_step_s: float | None = None, cross_class_wait: bool = True,
                     target_attainment: float = 0.99, slo_scale: float = 1.0) -> float | None:
    """Instances of (TP, clock) the per-class rates fill (each class's share of one
    instance is its rate over the instance's SLO-feasible capacity); None if a class
    with load cannot be served at this shape at all. `headroom` is the share of the TBT
    target planned for; `ttft_headroom` (default: `headroom`) the share of the TTFT
    target's slack above the class's unloaded TTFT that queueing may fill (a prompt's
    prefill does not vary; its wait does). `slo_scale`: the targets for the profile's engine
    over the real ones (Dilation.slo_scale). A request may wait for one prefill
    of another class sharing its replica (a short prompt behind a long one: the
    interference DynamoLLM's pools avoid). It does so only when it lands while one runs:
    with probability rho, the other class's per-instance rate times its prefill. So the
    mean TTFT the headroom plans for is cut by each wait weighted by rho, and the request
    that does wait (a tail of sum rho, when that exceeds the SLO's allowance of
    1 - `target_attainment`) must still meet the full target after its longest wait.
    Where the replicas prefill in TTFT-deadline order in steps of at most
    `deadline_step_s`, a class waits for the whole prefill only of classes due as soon,
    and for the step in flight of those due later: half a step on average.
    The per-instance rates behind rho are those of the instances the load needs without
    the waits (a lower bound: the count returned is at least the true one).
    `cross_class_wait` False leaves the waits out: what the load needs between the moments
    a prompt waits behind another class's."""
    loaded = [cls for cls, rate in rates.items() if rate > 0]
    solo_ttft_s = {cls: at[1] if (at := profile.at(cls, tp, clock_mhz, 0.0)) is not None else 0.0 for cls in loaded}
    slos = {cls: lengths.slo(cls) for cls in loaded}  # the planner's hot loop: one SLO per class

    def wait_behind_s(cls: str, other: str) -> float:
        if deadline_step_s is None or slos[other].ttft_s <= slos[cls].ttft_s:
            return solo_ttft_s[other]
        return min(solo_ttft_s[other], deadline_step_s / 2)

    def need_with(mean_wait_s: dict[str, float], tail_wait_s: dict[str, float]) -> float | None:
        need = 0.0
        for cls in loaded:
            ttft_slo_s = slos[cls].ttft_s * slo_scale  # the targets the headrooms leave, as floats
            solo_s = solo_ttft_s[cls]
            mean_target_s = solo_s + (ttft_slo_s - solo_s) * (ttft_headroom or headroom) - mean_wait_s.get(cls, 0.0)
            tail_target_s = ttft_slo_s - tail_wait_s[cls] if cls in tail_wait_s else math.inf
            ttft_s = min(mean_target_s, tail_target_s)
            cap = profile.capacity_within(cls, tp, clock_mhz, ttft_s, slos[cls].tbt_s * headroom) if ttft_s > 0 else 0.0
            if cap <= 0:
                return None
            need += rates[cls] / cap
        return need

    alone = need_with({}, {})
    if not cross_class_wait or alone is None or len(loaded) < 2:
        return alone
    instances = max(alone, 1.0)
    busy = {cls: rates[cls] / instances * solo_ttft_s[cls] for cls in loaded}  # rho per class
    mean_wait_s, tail_wait_s = {}, {}
    for cls in loaded:
        others = [o for o in loaded if o != cls]
        mean_wait_s[cls] = sum(busy[o] * wait_behind_s(cls, o) for o in others)
        if sum(busy[o] for o in others) > 1.0 - target_attainment:
            tail_wait_s[cls] = max(wait_behind_s(cls, o) for o in others)
    return need_with(mean_wait_s, tail_wait_s)


def shape_power_w(profile: EnergyProfile, rates: dict[str, float], tp: int, clock_mhz: int,
                  instances: int) -> float:
    """Power of `instances` replicas sharing the rates evenly. One replica runs at a
    utilisation U, the sum over classes of its rate over the class's top profiled rate;
    its power is idle plus each class's power above idle at U of that class's top rate,
    weighted by the class's share of U. One class alone is its own curve; a mix is not the
    sum of its classes' curves, which would charge each class a busy GPU of its own."""
    idle_w = profile.lightest_power_w(tp, clock_mhz)
    tops = {cls: top for cls, rate in rates.items()
            if rate > 0 and (top := profile.max_rate_per_s(cls, tp, clock_mhz)) > 0}
    shares = {cls: rates[cls] / instances / top for cls, top in tops.items()}
    utilisation = sum(shares.values())
    busy_w = 0.0
    for cls, share in shares.items():
        at = profile.at(cls, tp, clock_mhz, min(utilisation, 1.0) * tops[cls])
        if at is not None:
            busy_w += share / utilisation * max(at[0] - idle_w, 0.0)
    return instances * (idle_w + busy_w)


def _power_between_clocks_w(profile: EnergyProfile, rates: dict[str, float], tp: int, clock_mhz: float,
                            instances: int, clocks: list[int]) -> float:
    """shape_power_w at any clock in the profile's range: linear between the profiled clocks
    around it (the top one beyond them)."""
    above = next((c for c in clocks if c >= clock_mhz), clocks[-1])
    below = max((c for c in clocks if c <= clock_mhz), default=above)
    at_above = shape_power_w(profile, rates, tp, above, instances)
    if below == above:
        return at_above
    at_below = shape_power_w(profile, rates, tp, below, instances)
    return at_below + (at_above - at_below) * (clock_mhz - below) / (above - below)


def cheapest_shape(profile: EnergyProfile, rates: dict[str, float], lengths: LengthClassConfig,
                   headroom: float, min_instances: int, max_gpus: int, tps: Collection[int] | None = None,
                   ttft_headroom: float | None = None, max_instances: int | None = None,
                   deadline_step_s: float | None = None, load_rates: dict[str, float] | None = None,
                   held_gpu_w: float = 0.0, clock_floor_mhz: float = 0.0, slo_scale: float = 1.0) -> PoolShape | None:
    """The (TP, clock, instances) of least power plus `held_gpu_w` per GPU, over the
    profile's TPs (or `tps`) and clocks; the headrooms and `slo_scale` as needed_instances'.
    A shape is costed at its clock, or, given `load_rates` (replicas that pick each step's
    clock inside a band), at the clock of least power among those at which its instances carry
    them with no wait behind other classes' prefills (`run_clock_mhz`, the band's floor): the
    replicas raise the clock for the steps a prompt waits so, and otherwise run there. Not the
    lowest clock that carries them: below the roofline's knee a lower clock draws more energy
    (energy.perf_model; DynamoLLM Tables I-II measure the same). Replicas whose per-step
    clock stops at `clock_floor_mhz` (throttLL'eM's least-energy clock) are costed no lower,
    between profiled clocks linearly: at a lower clock the power the profile shows is one
    they never draw. (One TP2 replica at 1.6 MM + 0.8 LM requests/s draws 1,014 W in the
    simulator at throttLL'eM's 1,505 MHz floor; priced at it 1,022 W, at the lowest clock
    that carries the load 974 W.)"""
    best: PoolShape | None = None
    clocks = sorted(profile.clocks_mhz)
    for tp in profile.tensor_parallel_degrees:
        if tps is not None and tp not in tps:
            continue
        load_need = ([needed_instances(profile, load_rates, tp, c, lengths, headroom, ttft_headroom,
                                       cross_class_wait=False, slo_scale=slo_scale) for c in clocks]
                     if load_rates is not None else [])
        for clock in clocks:
            need = needed_instances(profile, rates, tp, clock, lengths, headroom, ttft_headroom, deadline_step_s,
                                    slo_scale=slo_scale)
            if need is None:
                continue
            n = max(math.ceil(need - 1e-9), min_instances)
            if n * tp > max_gpus or (max_instances is not None and n > max_instances):
                continue
            run_mhz, power = 0, 0.0
            if n and load_rates is not None:  # the sizing clock carries them, at the latest
                carrying = [c for c, x in zip(clocks, load_need, strict=True) if x is not None and x <= n + 1e-9]
                run_mhz, power = min(((c, _power_between_clocks_w(
                    profile, load_rates, tp, max(float(c), clock_floor_mhz), n, clocks)) for c in carrying or [clock]),
                    key=lambda priced: priced[1])
            elif n:
                power = _power_between_clocks_w(profile, rates, tp, max(float(clock), clock_floor_mhz), n, clocks)
            shape = PoolShape(tp, n, clock, power, held_gpu_w, run_mhz)
            if best is None or shape.cost_w < best.cost_w - 1e-6:
                best = shape
    return best


class PoolShapePlanner:
    """Per pool: the cheapest shape for its trailing peak load, with hysteresis."""

    def __init__(self, profile: EnergyProfile, config: ShapePlannerConfig, lengths: LengthClassConfig,
                 reconfigure_cost_s: float, pool_epoch_s: float) -> None:
        self.profile = profile
        self.config = config
        self.lengths = lengths
        self.reconfigure_cost_s = reconfigure_cost_s
        self.pool_epoch_s = pool_epoch_s
        self.max_clock_mhz = max(profile.clocks_mhz)
        self._history: dict[str, deque[tuple[float, dict[str, float], dict[str, float]]]] = {}
        self._shape: dict[str, PoolShape] = {}
        self._dilation: dict[str, Dilation] = {}
        self._lower_since: dict[str, float] = {}
        self._bursty_until: dict[str, float] = {}
        self._first_planned_s: dict[str, float] = {}
        self._batch_floor: dict[str, dict[str, float]] = {}
        self._next_epoch_s: float | None = None
        self._first_epoch_at_s = math.inf  # before it the operator's TP stands

    def shape(self, pool: str) -> PoolShape | None:
        return self._shape.get(pool)

    def planning_rates(self, pool: str, rates: dict[str, float], batch_rate: float, now_s: float,
                       batch_floor: dict[str, float] | None = None) -> dict[str, float]:
        """Records what the pool's replicas report now (`batch_rate` of `rates` is batch work:
        replicas report batch arrivals as one rate, so each class's batch share is the pool's)
        and returns the pool's planned load, `group_rates` of the pool alone. `batch_floor`:
        the batch rate per class the batch queue's deadlines need."""
        total = sum(rates.values())
        share = min(batch_rate / total, 1.0) if total > 0 else 0.0
        history = self._history.setdefault(pool, deque())
        self._first_planned_s.setdefault(pool, now_s)
        history.append((now_s, {c: r * (1 - share) for c, r in rates.items()},
                        {c: r * share for c, r in rates.items()}))
        self._batch_floor[pool] = dict(batch_floor or {})
        tuning = self.config.tuning
        # The rises `burst_margin` reads over the long window each look back `lookback_s` more.
        horizon = max(tuning.batch_window_s, tuning.bursty_lookback_s + tuning.lookback_s)
        while history and history[0][0] < now_s - horizon:
            history.popleft()
        totals = np.array([sum(i.values()) for t, i, _ in history if t >= now_s - tuning.bursty_lookback_s])
        mean = totals.mean() if len(totals) > 2 else 0.0
        if mean > 0 and totals.std() / mean > tuning.bursty_cv and not self.warming_up(pool, now_s):
            self._bursty_until[pool] = now_s + tuning.bursty_lookback_s  # stays bursty a window long
        return self.group_rates((pool,), now_s)

    def group_rates(self, pools: Collection[str], now_s: float) -> dict[str, float]:
        """The load planned for pools served together, per class: the trailing peak of their
        summed interactive rate, split by each class's share of it over the window, plus the
        burst margin (bursty pools together over their long window, the others over the short
        one); and the batch rate's mean over the batch window (Chiron: batch work fills spare
        capacity behind interactive work, so it needs capacity on average only), or the
        deadlines' floor for the class where that is higher.
        The peak of the sum, not the sum of each class's peak: the classes' arrivals come
        independently, so their windows' counts do not peak together. Summed per class, a
        conversation mix of eight classes at 2.2 requests/s plans for 1.55x its mean rate over
        two minutes, where its total peaks at 1.2x; the gap grows as each class's rate falls."""
        tuning = self.config.tuning
        bursty = [p for p in pools if self.is_bursty(p, now_s)]
        steady = [p for p in pools if p not in bursty]
        planned = {**self._peak_by_share(steady, now_s, tuning.lookback_s),
                   **self._peak_by_share(bursty, now_s, tuning.bursty_lookback_s)}
        batch_mean: dict[str, float] = {}
        for pool in pools:
            batches = [batch for t, _, batch in self._history.get(pool, ()) if t >= now_s - tuning.batch_window_s]
            for batch in batches:
                for cls, r in batch.items():
                    batch_mean[cls] = batch_mean.get(cls, 0.0) + r / len(batches)
        floor = {cls: r for pool in pools for cls, r in self._batch_floor.get(pool, {}).items()}
        for cls in batch_mean.keys() | floor.keys():
            planned[cls] = planned.get(cls, 0.0) + max(batch_mean.get(cls, 0.0), floor.get(cls, 0.0))
        return planned

    def _peak_by_share(self, pools: Collection[str], now_s: float, lookback_s: float) -> dict[str, float]:
        """The peak of the pools' summed interactive rate over `lookback_s`, plus their burst
        margin, split by each class's share of their arrivals over it."""
        if not pools:
            return {}
        mass: dict[str, float] = {}
        totals: dict[float, float] = {}  # the pools' summed rate at each plan
        for pool in pools:
            for t, interactive, _ in self._history.get(pool, ()):
                if t >= now_s - lookback_s:
                    totals[t] = totals.get(t, 0.0) + sum(interactive.values())
                    for cls, r in interactive.items():
                        mass[cls] = mass.get(cls, 0.0) + r
        summed = sum(mass.values())
        peak = max(totals.values(), default=0.0) * (1.0 + self.burst_margin(pools, now_s))
        scale = peak / summed if summed > 0 else 0.0
        return {cls: m * scale for cls, m in mass.items()}

    def _summed_interactive(self, pools: Collection[str], since_s: float) -> tuple[list[float], list[float]]:
        """The pools' summed interactive rate at each plan since `since_s`, in time order."""
        summed: dict[float, float] = {}
        for pool in pools:
            for t, interactive, _ in self._history.get(pool, ()):
                if t >= since_s:
                    summed[t] = summed.get(t, 0.0) + sum(interactive.values())
        times = sorted(summed)
        return times, [summed[t] for t in times]

    def burst_margin(self, pools: Collection[str], now_s: float) -> float:
        """The margin pools served together plan above their trailing peak (`margin_from_history`):
        the most their summed interactive rate rose above its peak of the `lookback_s` before,
        over the last `bursty_lookback_s`; `burst_margin` until each has that much history, and
        for a bursty pool (planned at its long window's peak, which its next burst may exceed)."""
        tuning = self.config.tuning
        if (not tuning.margin_from_history or any(self.is_bursty(p, now_s) for p in pools)
                or any(now_s - self._first_planned_s.get(p, now_s) < tuning.bursty_lookback_s for p in pools)):
            return tuning.burst_margin
        times, totals = self._summed_interactive(pools, now_s - tuning.bursty_lookback_s - tuning.lookback_s)
        window: deque[int] = deque()  # plans of the trailing `lookback_s`, their rates decreasing
        rise = 0.0
        for i, (t, total) in enumerate(zip(times, totals, strict=True)):
            while window and times[window[0]] < t - tuning.lookback_s:
                window.popleft()
            if t >= now_s - tuning.bursty_lookback_s:
                peak = totals[window[0]] if window else 0.0
                if peak > 0:
                    rise = max(rise, total / peak - 1.0)
                elif total > 0:
                    return tuning.burst_margin
            while window and totals[window[-1]] <= total:
                window.pop()
            window.append(i)
        return min(rise, tuning.burst_margin)

    def at_epoch(self, now_s: float) -> bool:
        """Whether a pool epoch (TP changes, pool folding) is due; the first comes
        `first_epoch_s` after the first plan, so load is observed first."""
        if self._next_epoch_s is None:
            self._next_epoch_s = self._first_epoch_at_s = now_s + self.config.tuning.first_epoch_s
        return now_s >= self._next_epoch_s

    def dilation(self, pool: str, step_time_ratios: list[float], work_ratios: Collection[float] = ()) -> Dilation:
        """How much slower than the profile a pool's replicas run (the median of what they
        measured; 0 is a replica that timed no step yet), or AS_PROFILED when that is within
        the deadband or not followed. With nothing measured (every replica new, or none) the
        pool keeps its last: a fresh replica says nothing about the engine's speed. `work_ratios`:
        each replica's share of the profile's work its prompts' cache hits leave (the median
        counts, within the same deadband)."""
        if not self.config.follow_measured_speed:
            return AS_PROFILED
        measured = [r for r in step_time_ratios if r > 0]
        if not measured:
            return self._dilation.get(pool, AS_PROFILED)
        ratio = float(np.median(measured))
        work = float(np.median(list(work_ratios))) if work_ratios else 1.0
        deadband = self.config.tuning.speed_deadband
        dilation = Dilation(1.0 if abs(ratio - 1.0) <= deadband else ratio, 1.0 if 1.0 - work <= deadband else work)
        self._dilation[pool] = dilation
        return dilation

    def cheapest(self, planned: dict[str, float], gpus_available: int, max_instances: int | None = None,
                 tps: Collection[int] | None = None, dilation: Dilation = AS_PROFILED,
                 replicas: ReplicaTraits = ARRIVAL_ORDER_AT_PLANNED_CLOCK, held_gpu_w: float = 0.0,
                 burst_margin: float | None = None) -> PoolShape | None:
        """The shape of least power plus `held_gpu_w` per GPU (`gpu_worth_w`) for planned
        rates, under this planner's headrooms; `burst_margin` is the one they were planned
        with (`burst_margin`; default: the configured one)."""
        cfg = self.config
        rates = dilation.rates(planned)
        margin = cfg.tuning.burst_margin if burst_margin is None else burst_margin
        load = {cls: r / (1.0 + margin) for cls, r in rates.items()} if replicas.pick_clock else None
        return cheapest_shape(self.profile, rates, self.lengths, dilation.headroom(cfg.tuning.headroom),
                              cfg.min_instances, gpus_available, ttft_headroom=cfg.tuning.ttft_headroom,
                              slo_scale=dilation.slo_scale,
                              max_instances=max_instances, tps=tps, deadline_step_s=replicas.deadline_step_s,
                              load_rates=load, held_gpu_w=held_gpu_w, clock_floor_mhz=replicas.clock_floor_mhz)

    def clock_for(self, planned: dict[str, float], tp: int, instances: int, dilation: Dilation = AS_PROFILED,
                  replicas: ReplicaTraits = ARRIVAL_ORDER_AT_PLANNED_CLOCK) -> int:
        """The lowest clock at which `instances` replicas at TP `tp` carry `planned` within the
        planning SLOs; the top clock when none does (short of capacity: run flat out)."""
        cfg = self.config
        if tp in self.profile.tensor_parallel_degrees:
            for clock in sorted(self.profile.clocks_mhz):
                need = needed_instances(self.profile, dilation.rates(planned), tp, clock, self.lengths,
                                        dilation.headroom(cfg.tuning.headroom), cfg.tuning.ttft_headroom,
                                        replicas.deadline_step_s, slo_scale=dilation.slo_scale)
                if need is not None and need <= instances + 1e-9:
                    return clock
        return self.max_clock_mhz

    def gpu_worth_w(self, pools: Collection[str], now_s: float) -> float:
        """What a GPU held is worth to shapes serving these pools: `held_gpu_w`, or nothing if
        one of them is bursty (its clock headroom above the planned floor is what absorbs a
        burst beyond the window's peak; fewer GPUs at a higher clock would spend it)."""
        return 0.0 if any(self.is_bursty(p, now_s) for p in pools) else self.config.tuning.held_gpu_w

    def warming_up(self, pool: str, now_s: float) -> bool:
        """Whether the pool was first planned less than `warmup_s` ago (a pool not yet
        planned is: its first plan is now)."""
        return now_s - self._first_planned_s.get(pool, now_s) < self.config.tuning.warmup_s

    def may_newly_fold(self, pools: Collection[str], now_s: float) -> bool:
        """Whether these pools' load has shown it steady enough to fold onto one host: none is
        bursty, and, while one has under `bursty_lookback_s` of history, their summed
        interactive rate since their ramps varied at most `young_fold_cv`."""
        cfg = self.config
        if any(self.is_bursty(p, now_s) for p in pools):
            return False
        firsts = [self._first_planned_s.get(p, now_s) for p in pools]
        if cfg.tuning.young_fold_cv is None or now_s - max(firsts) >= cfg.tuning.bursty_lookback_s:
            return True
        since_s = max(firsts) + RATE_WINDOW_S
        summed: dict[float, float] = {}
        for p in pools:
            for t, interactive, _ in self._history.get(p, ()):
                if t >= since_s:
                    summed[t] = summed.get(t, 0.0) + sum(interactive.values())
        totals = np.array(list(summed.values()))
        return len(totals) > 2 and totals.mean() > 0 and totals.std() / totals.mean() <= cfg.tuning.young_fold_cv

    def is_bursty(self, pool: str, now_s: float) -> bool:
        """Whether the pool's load crossed `bursty_cv` within the last `bursty_lookback_s`."""
        return now_s < self._bursty_until.get(pool, -math.inf)

    def forget(self, pool: str) -> None:
        """A pool given back (folded into another): planned afresh if it serves again."""
        self._shape.pop(pool, None)
        self._lower_since.pop(pool, None)
        self._dilation.pop(pool, None)

    def plan(self, pool: str, planned: dict[str, float], gpus_available: int, backlog_instances: int,
             running: PoolShape | None, now_s: float, max_instances: int | None = None,
             tps: Collection[int] | None = None, late: bool = False,
             dilation: Dilation = AS_PROFILED, replicas: ReplicaTraits = ARRIVAL_ORDER_AT_PLANNED_CLOCK,
             burst_margin: float | None = None) -> PoolShape:
        """The pool's shape now for `planned` rates (`planning_rates`, summed over the pools
        it serves). `gpus_available` counts the GPUs it holds plus the free
        ones, `max_instances` the deployment's replica cap, `tps` the TPs it may run;
        `backlog_instances` (what requests queueing beyond the plan call for) is a floor;
        `late` (replicas over their TTFT target) asks for one instance beyond the forecast's;
        `running` is what the runtime runs, adopted the first time a pool is planned (its
        TP is kept until the first pool epoch, even if it grows); `dilation` is how much
        slower than the profile its replicas measure themselves; `replicas` what they do that
        costs depend on; `burst_margin` the margin `planned` carries (`burst_margin`)."""
        epoch = self.at_epoch(now_s)
        current = self._shape.get(pool, running)
        cfg = self.config
        gpu_w = self.gpu_worth_w([pool], now_s)
        best = self.cheapest(planned, gpus_available, max_instances, tps, dilation, replicas, gpu_w, burst_margin)
        if best is None:  # nothing carries the load: everything at the top shape that fits
            tp = max(tps or self.profile.tensor_parallel_degrees)
            fit = min(gpus_available // tp, max_instances or gpus_available)
            best = PoolShape(tp, max(fit, cfg.min_instances, 1), self.max_clock_mhz, math.inf)
        if current is None:
            self._shape[pool] = best
            return best
        if best.tensor_parallel != current.tensor_parallel:
            same_tp = self.cheapest(planned, gpus_available, max_instances, [current.tensor_parallel], dilation,
                                    replicas, gpu_w, burst_margin)
            # Keep the TP while the replicas run off the profile (their speed was measured at
            # this TP and says little of another), and otherwise until the switch is worth its
            # cost: at an epoch, or, once the first has come, as soon as the pool must start
            # instances anyway (they may as well be the cheaper TP's: growing at the old TP and
            # re-sharding at the next epoch holds both shapes' GPUs in between).
            if same_tp is not None:
                growing = same_tp.instances > current.instances and now_s >= self._first_epoch_at_s
                if not ((epoch or growing) and dilation.slowdown == 1.0 and self._pays(same_tp, best)):
                    best = same_tp
        instances = best.instances
        cap = min(gpus_available // best.tensor_parallel, max_instances or gpus_available)
        if backlog_instances > current.instances:
            instances = max(instances, min(backlog_instances, cap))
        if late:
            instances = max(instances, min(best.instances + 1, cap))
        tp_kept = best.tensor_parallel == current.tensor_parallel
        if tp_kept and self.warming_up(pool, now_s):
            instances = max(instances, current.instances)
        elif tp_kept and instances < current.instances:
            since = self._lower_since.setdefault(pool, now_s)
            if now_s - since < cfg.tuning.downscale_hold_s:
                instances = current.instances
            else:
                self._lower_since.pop(pool, None)
        else:
            self._lower_since.pop(pool, None)
        shape = replace(best, instances=instances)
        self._shape[pool] = shape
        return shape

    def end_epoch(self, now_s: float) -> None:
        if self._next_epoch_s is not None and now_s >= self._next_epoch_s:
            self._next_epoch_s = now_s + self.pool_epoch_s

    def _pays(self, now: PoolShape, new: PoolShape) -> bool:
        """What a TP switch saves over an epoch (power, plus `held_gpu_w` per GPU given back)
        exceeds the joules it burns getting there (the new replicas start while the old ones
        serve)."""
        return worth_reconfiguring(now.cost_w, new.cost_w, self.pool_epoch_s, self.reconfigure_cost_s * new.power_w)
