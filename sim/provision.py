"""Splitwise provisioning (§IV-D, Fig. 12): how many prompt and token machines, of which
type, serve a trace within Table VI's slowdown SLOs at the least cost or power, or at
the most throughput within a power or cost budget.

Every candidate is one simulator run, cached. Meeting the SLOs is taken to be
monotone in both machine counts (one more machine never breaks an SLO), so the
cost/power search walks the feasibility frontier as a staircase - for each number of
prompt machines the fewest token machines that meet the SLOs, starting from the
previous count - which simulates at most ~2 x max_prompt + max_token points instead
of the whole grid; the points off the frontier are classified by that monotonicity.
Every point reported as an optimum or alternative was simulated. The throughput goal
bisects the trace's rate (its timeline compressed) on each split the budget allows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from autoscaling.registry import make_policy
from core.classes import LengthClassConfig
from core.roles import Phase
from energy.calibration import default_perf_model, splitwise_perf_model
from energy.hardware import GPUS
from energy.perf_model import PerfModel
from sim.config import SimConfig
from sim.metrics import slowdown_percentiles
from sim.simulator import PoolSetup, Simulator
from sim.splitwise import SplitwiseSimConfig, SplitwiseSimulator
from sim.workload import Workload, scale_time

Goal = Literal["cost", "power", "throughput"]
GPUS_PER_MACHINE = 8  # a DGX: one TP8 replica of Llama2-70B per machine
DGX_A100_KW = 6.5  # DGX-A100's rated power; Table V gives the others relative to it


@dataclass(frozen=True)
class MachineType:
    """A DGX as Table V prices and powers it; `cap_w_per_gpu` makes it Splitwise's Hcap."""

    name: str
    hardware: str  # key of energy.hardware.GPUS
    provisioned_kw: float
    link_gbps: float  # per-GPU InfiniBand the KV cache travels over (§VI-A: 200 on A100, 400 on H100)
    cap_w_per_gpu: float | None = None

    @property
    def price_per_hour(self) -> float:
        return GPUS_PER_MACHINE * GPUS[self.hardware].price_per_hour

    def perf(self, model: str, profile: str | None = None) -> PerfModel:
        """`profile` (energy.profiles) must be for this machine's GPU. None: Splitwise's fit,
        not the GPU's default: it is the one source that measured both A100 and H100 with
        one stack, so designs that mix them compare like with like."""
        if profile is None:
            return splitwise_perf_model(model, self.hardware)
        return default_perf_model(model, self.hardware, profile)

    def clock_mhz(self, model: str, profile: str | None = None) -> float:
        """Max clock, or the token phase's clock under the power cap (PerfModel)."""
        perf = self.perf(model, profile)
        if self.cap_w_per_gpu is None:
            return float(perf.gpu.max_clock_mhz)
        return perf.clock_under_power_cap("token", self.cap_w_per_gpu)


MACHINES: dict[str, MachineType] = {
    "A": MachineType("A", "a100-80gb", DGX_A100_KW, 200.0),
    "H": MachineType("H", "h100-80gb", 1.75 * DGX_A100_KW, 400.0),
    # Token machines capped at 50% per GPU (350 W), 70% of the machine's rated power (Table V: 1.23x).
    "Hcap": MachineType("Hcap", "h100-80gb", 1.23 * DGX_A100_KW, 400.0, cap_w_per_gpu=350.0),
}


@dataclass(frozen=True)
class Design:
    """Prompt and token machine types; no token type is a mixed-batching baseline pool."""

    name: str
    prompt: MachineType
    token: MachineType | None = None

    @property
    def split(self) -> bool:
        return self.token is not None

    def cost_per_hour(self, prompt: int, token: int) -> float:
        return prompt * self.prompt.price_per_hour + (token * self.token.price_per_hour if self.token else 0.0)

    def power_kw(self, prompt: int, token: int) -> float:
        return prompt * self.prompt.provisioned_kw + (token * self.token.provisioned_kw if self.token else 0.0)


DESIGNS: dict[str, Design] = {
    "AA": Design("AA", MACHINES["A"], MACHINES["A"]),
    "HH": Design("HH", MACHINES["H"], MACHINES["H"]),
    "HHcap": Design("HHcap", MACHINES["H"], MACHINES["Hcap"]),
    "HA": Design("HA", MACHINES["H"], MACHINES["A"]),
    "base-A": Design("base-A", MACHINES["A"]),
    "base-H": Design("base-H", MACHINES["H"]),
}

Limits = tuple[float, float, float]  # P50, P90, P99
# Overloaded runs are cut 5 min after the last arrival: their stragglers fail the SLOs anyway.
PLAN_SIM_CONFIG = SimConfig(drain_limit_s=300.0)
DEFAULT_SPLITWISE = SplitwiseSimConfig()


class SlowdownSLO(BaseModel):
    """Table VI: percentile limits of each request's slowdown vs running alone on a
    DGX-A100 (`reference_hardware`); all nine must hold."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ttft: Limits = (2.0, 3.0, 6.0)
    tbt: Limits = (1.25, 1.5, 5.0)
    e2e: Limits = (1.25, 1.5, 5.0)
    reference_hardware: str = "a100-80gb"
    reference_tp: int = Field(default=GPUS_PER_MACHINE, gt=0)

    def scaled(self, factor: float) -> SlowdownSLO:
        """Every limit times `factor` (< 1: stricter)."""
        return self.model_copy(update={m: tuple(v * factor for v in getattr(self, m)) for m in ("ttft", "tbt", "e2e")})

    def violations(self, slowdowns: dict[str, dict[int, float]]) -> list[str]:
        out = []
        for metric in ("ttft", "tbt", "e2e"):
            for q, limit in zip((50, 90, 99), getattr(self, metric)):
                if slowdowns[metric][q] > limit:
                    out.append(f"{metric} p{q} {slowdowns[metric][q]:.2f}x > {limit:g}x")
        return out


TABLE_VI = SlowdownSLO()


@dataclass(frozen=True)
class Outcome:
    """One simulated (design, prompt machines, token machines, rate) point."""

    design: str
    prompt: int
    token: int
    rate_rps: float
    slowdowns: dict[str, dict[int, float]]
    violations: tuple[str, ...]
    cost_per_hour: float
    power_kw: float
    mean_power_kw: float  # measured: the run's energy over its duration

    @property
    def meets_slo(self) -> bool:
        return not self.violations

    def goal_value(self, goal: Goal) -> float:
        return {"cost": self.cost_per_hour, "power": self.power_kw, "throughput": self.rate_rps}[goal]


def at_rate(w: Workload, factor: float) -> Workload:
    """The same requests arriving `factor` times as fast."""
    return w if factor == 1.0 else scale_time(w, 1.0 / factor)


def _pool(name: str, machine: MachineType, config: SimConfig, count: int, **kwargs: Any) -> PoolSetup:
    return PoolSetup(name, tuple(LengthClassConfig.names()), GPUS_PER_MACHINE,
                     machine.clock_mhz(config.model, config.profile), count, **kwargs)


def simulate_design(
    w: Workload, design: Design, prompt: int, token: int, slo: SlowdownSLO | None = None,
    config: SimConfig = PLAN_SIM_CONFIG, splitwise: SplitwiseSimConfig = DEFAULT_SPLITWISE,
) -> Outcome:
    """Run `w` on `prompt` + `token` machines of `design` (a baseline: `prompt` mixed machines)."""
    slo = slo or TABLE_VI
    model = config.model
    config = config.model_copy(update={
        "hardware": design.prompt.hardware, "cluster_gpus": GPUS_PER_MACHINE * (prompt + token)})
    if design.token is None:
        pools = [_pool("pool-all", design.prompt, config, prompt)]
        simulator: type[Simulator] = Simulator
        extra: dict = {}
    else:
        pools = [_pool("pool-prompt", design.prompt, config, prompt, kind=Phase.PROMPT,
                       max_batched_tokens=splitwise.scheduling.prompt_batch_tokens),
                 _pool("pool-token", design.token, config, token, kind=Phase.TOKEN)]
        link = min(design.prompt.link_gbps, design.token.link_gbps)
        transfer = splitwise.transfer.model_copy(update={"link_gbps": link})
        simulator = SplitwiseSimulator
        extra = {"splitwise": splitwise.model_copy(update={"transfer": transfer}),
                 "pool_perf": {"pool-token": design.token.perf(model, config.profile)}}
    policy = make_policy(
        "singlepool" if design.token is None else "splitwise", replicas={p.name: p.replicas for p in pools},
        tensor_parallel={p.name: p.tensor_parallel for p in pools}, clock_mhz={p.name: int(p.clock_mhz) for p in pools},
        model=model, hardware=config.hardware, profile=config.profile)
    raw = simulator(w, policy, pools, config, perf=design.prompt.perf(model, config.profile), **extra).run()
    reference = splitwise_perf_model(model, slo.reference_hardware)  # Table VI's DGX-A100, whatever the run's profile
    slowdowns = slowdown_percentiles(raw.log, w.output_tokens, reference, slo.reference_tp)
    energy_j = float(raw.series.energy_j[-1])
    return Outcome(design.name, prompt, token, len(w) / max(w.duration_s, 1e-9), slowdowns,
                   tuple(slo.violations(slowdowns)), design.cost_per_hour(prompt, token),
                   design.power_kw(prompt, token), energy_j / max(raw.end_s, 1e-9) / 1e3)


@dataclass
class Runs:
    """Cached simulations of one trace under one SLO: (design, prompt, token, rate) -> Outcome.

    The workload at a rate multiplier is `at_rate(workload, factor)` (the same requests,
    sooner), or `make_workload(factor)` when given (e.g. Poisson arrivals over a fixed span)."""

    workload: Workload
    slo: SlowdownSLO = TABLE_VI
    config: SimConfig = PLAN_SIM_CONFIG
    splitwise: SplitwiseSimConfig = DEFAULT_SPLITWISE
    make_workload: Callable[[float], Workload] | None = None
    cache: dict[tuple[str, int, int, float], Outcome] = field(default_factory=dict)

    def __call__(self, design: Design, prompt: int, token: int, rate_factor: float = 1.0) -> Outcome:
        key = (design.name, prompt, token, round(rate_factor, 6))
        if key not in self.cache:
            w = self.make_workload(rate_factor) if self.make_workload else at_rate(self.workload, rate_factor)
            self.cache[key] = simulate_design(w, design, prompt, token, self.slo, self.config, self.splitwise)
        return self.cache[key]


# ---- cost / power: the cheapest point meeting the SLOs ------------------------------------
@dataclass(frozen=True)
class GridPoint:
    prompt: int
    token: int
    feasible: bool
    simulated: bool


def frontier(meets: Callable[[int, int], bool], max_prompt: int,
             max_token: int) -> tuple[dict[int, int], list[GridPoint]]:
    """For each prompt count, the fewest token machines meeting the SLOs (simulated), and
    every grid point classified (simulated, or inferred by monotonicity)."""
    first: dict[int, int] = {}
    seen: dict[tuple[int, int], bool] = {}

    def check(p: int, t: int) -> bool:
        seen[(p, t)] = meets(p, t)
        return seen[(p, t)]

    t = max_token
    for p in range(1, max_prompt + 1):
        if not check(p, t):
            continue  # not even `t` token machines (the previous minimum, or the most) suffice
        while t > 1 and check(p, t - 1):
            t -= 1
        first[p] = t
    grid = []
    for p in range(1, max_prompt + 1):
        for t in range(1, max_token + 1):
            if (p, t) in seen:
                grid.append(GridPoint(p, t, seen[(p, t)], True))
            else:
                grid.append(GridPoint(p, t, p in first and t >= first[p], False))
    return first, grid


def baseline_size(meets: Callable[[int], bool], max_machines: int) -> int | None:
    """Fewest mixed machines meeting the SLOs (bisection; monotone), None if even the most fail."""
    if not meets(max_machines):
        return None
    lo, hi = 0, max_machines  # lo fails (or is 0), hi meets
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid
    return hi


@dataclass
class DesignSearch:
    design: Design
    candidates: list[Outcome]  # simulated points meeting the SLOs that may be optimal
    grid: list[GridPoint]


def search_design(runs: Runs, design: Design, goal: Goal, max_prompt: int, max_token: int) -> DesignSearch:
    """Least cost or power for `design` at the trace's rate."""
    if goal == "throughput":
        raise ValueError("the throughput goal needs a budget: use search_throughput")
    if not design.split:
        n = baseline_size(lambda m: runs(design, m, 0).meets_slo, max_prompt)
        grid = [GridPoint(m, 0, n is not None and m >= n, (design.name, m, 0, 1.0) in runs.cache)
                for m in range(1, max_prompt + 1)]
        return DesignSearch(design, [runs(design, n, 0)] if n else [], grid)
    first, grid = frontier(lambda p, t: runs(design, p, t).meets_slo, max_prompt, max_token)
    candidates = [runs(design, p, t) for p, t in first.items()]
    return DesignSearch(design, sorted(candidates, key=lambda o: o.goal_value(goal)), grid)


# ---- throughput: the highest rate meeting the SLOs within a budget -----------------------
def max_rate_factor(meets_at: Callable[[float], bool], start: float = 1.0, rel_tol: float = 0.05,
                    floor: float = 1 / 64, ceiling: float = 256.0) -> float | None:
    """Largest rate multiplier meeting the SLOs (monotone): grow or shrink by 2x, then
    bisect (geometrically) to `rel_tol`. None if even `floor` fails."""
    x = start
    if meets_at(x):
        lo = x
        while lo * 2 <= ceiling and meets_at(lo * 2):
            lo *= 2
        hi = lo * 2
    else:
        hi = x
        while hi / 2 >= floor and not meets_at(hi / 2):
            hi /= 2
        if hi / 2 < floor:
            return None
        lo = hi / 2
    while hi / lo > 1 + rel_tol:
        mid = (lo * hi) ** 0.5
        if meets_at(mid):
            lo = mid
        else:
            hi = mid
    return lo


def budget_splits(design: Design, budget: Callable[[int, int], float], limit: float,
                  max_prompt: int) -> list[tuple[int, int]]:
    """Per prompt count, the most token machines within the budget (baselines: the most machines)."""
    if not design.split:
        n = max((m for m in range(1, max_prompt + 1) if budget(m, 0) <= limit + 1e-9), default=0)
        return [(n, 0)] if n else []
    out = []
    for p in range(1, max_prompt + 1):
        t = 0
        while budget(p, t + 1) <= limit + 1e-9:
            t += 1
        if t >= 1:
            out.append((p, t))
    return out


def search_throughput(
    runs: Runs, design: Design, budget_kind: Literal["power", "cost"], limit: float, max_prompt: int,
) -> list[Outcome]:
    """Every budget-limited split's best sustainable rate, best first. A split is only
    bisected when it beats the best rate found so far (so most cost one run); the
    others appear as their run that failed at that rate (meets_slo False, listed last)."""
    budget = design.power_kw if budget_kind == "power" else design.cost_per_hour
    best: float | None = None
    found = []
    for p, t in budget_splits(design, budget, limit, max_prompt):
        def meets_at(f: float, p: int = p, t: int = t) -> bool:
            return runs(design, p, t, f).meets_slo
        if best is not None and not meets_at(best * 1.05):
            found.append(runs(design, p, t, best * 1.05))
            continue
        factor = max_rate_factor(meets_at, start=best * 1.05 if best else 1.0)
        if factor is not None:
            best = factor if best is None else max(best, factor)
            found.append(runs(design, p, t, factor))
    return sorted(found, key=lambda o: (not o.meets_slo, -o.rate_rps))


def rank(outcomes: Iterable[Outcome], goal: Goal) -> list[Outcome]:
    """Those meeting the SLOs, best first: least cost/power (ties: fewer machines), or most throughput."""
    sign = -1.0 if goal == "throughput" else 1.0
    return sorted((o for o in outcomes if o.meets_slo), key=lambda o: (sign * o.goal_value(goal), o.prompt + o.token))


# ---- Fig. 12 ----------------------------------------------------------------------------
def plot_search_space(searches: list[DesignSearch], goal: Goal, path: str, best: Outcome | None,
                      title: str = "") -> None:
    """Prompt vs token machines per design, coloured by the goal metric; feasible points
    filled, infeasible ones crossed, simulated ones edged in black, the optimum starred."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    split = [s for s in searches if s.design.split]
    if not split:
        raise ValueError("the search-space plot needs a split design (AA, HH, HHcap, HA)")
    fig, axes = plt.subplots(1, len(split), figsize=(4.6 * len(split), 4.2), squeeze=False)
    metric = (lambda d, p, t: d.cost_per_hour(p, t)) if goal == "cost" else (lambda d, p, t: d.power_kw(p, t))
    every = [metric(s.design, g.prompt, g.token) for s in split for g in s.grid]
    lo, hi = min(every), max(every)  # one colour scale, so designs compare at a glance
    for ax, s in zip(axes[0], split):
        pts = s.grid
        vals = np.array([metric(s.design, g.prompt, g.token) for g in pts])
        for feasible, marker in ((True, "o"), (False, "x")):
            sel = [i for i, g in enumerate(pts) if g.feasible is feasible]
            if not sel:
                continue
            sc = ax.scatter([pts[i].prompt for i in sel], [pts[i].token for i in sel], c=vals[sel], marker=marker,
                            cmap="viridis", vmin=lo, vmax=hi, s=60 if feasible else 40,
                            edgecolors=["black" if pts[i].simulated else "none" for i in sel] if feasible else None,
                            label="meets SLOs" if feasible else "violates SLOs")
        fig.colorbar(sc, ax=ax, label="$/h" if goal == "cost" else "provisioned kW")
        _finish_axis(ax, s.design.name, best)
    _save(fig, path, title)


def plot_throughput_splits(outcomes: list[Outcome], path: str, best: Outcome | None, title: str = "") -> None:
    """The throughput goal's search space: every budget-limited split of each split design,
    coloured by the highest rate meeting the SLOs; crossed: could not beat the best so far."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    designs = sorted({o.design for o in outcomes if o.token > 0})
    if not designs:
        raise ValueError("the search-space plot needs a split design (AA, HH, HHcap, HA)")
    fig, axes = plt.subplots(1, len(designs), figsize=(4.6 * len(designs), 4.2), squeeze=False)
    rates = [o.rate_rps for o in outcomes if o.meets_slo] or [0.0]
    for ax, name in zip(axes[0], designs):
        mine = [o for o in outcomes if o.design == name]
        ok = [o for o in mine if o.meets_slo]
        if ok:
            sc = ax.scatter([o.prompt for o in ok], [o.token for o in ok], c=[o.rate_rps for o in ok], cmap="viridis",
                            vmin=min(rates), vmax=max(rates), s=70, edgecolors="black", label="max req/s at SLO")
            fig.colorbar(sc, ax=ax, label="req/s meeting the SLOs")
        bad = [o for o in mine if not o.meets_slo]
        if bad:
            ax.scatter([o.prompt for o in bad], [o.token for o in bad], marker="x", c="grey",
                       label="below the best rate")
        _finish_axis(ax, name, best)
    _save(fig, path, title)


def _finish_axis(ax, design: str, best) -> None:
    """Star the optimum on its design's panel; integer machine-count axes."""
    from matplotlib.ticker import MaxNLocator

    if best is not None and best.design == design:
        ax.scatter([best.prompt], [best.token], marker="*", s=320, c="red", label="optimum")
    ax.set_xlabel("prompt machines")
    ax.set_ylabel("token machines")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"Splitwise-{design}")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=7)


def _save(fig, path: str, title: str) -> None:
    import matplotlib.pyplot as plt

    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
