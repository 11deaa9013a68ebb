"""Pool manager (DynamoLLM §IV-A eq. 1, §IV-B shard-up/down): TP mix, clocks and load
per instance that carry a pool's load on its GPUs with the least energy.

The energy curves are non-linear in load, so each instance's load is chosen from the
profile's load grid: x[t,f,k] instances of TP t at clock f each carry load level k.
All instances of one TP run at one clock and receive the same share (the paper's
assumptions), and by default a pool runs one TP at a time (a Serve deployment has one
replica shape). CBC solves it under a time limit; if it fails or times out, a greedy
heuristic answers instead, and `max_clock_only` gives the simplified online version.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import pulp

from core.slo import SLO
from energy.profile import EnergyProfile


@dataclass(frozen=True)
class PoolConfigChoice:
    tensor_parallel: int
    instances: int
    clock_mhz: int
    rate_per_instance: float
    power_w: float  # whole pool: busy instances plus idle GPUs
    solver: str  # "milp" or "heuristic"


def _levels(profile: EnergyProfile, cls: str, tp: int, clock: int, load: float, n_max: int) -> list[float]:
    """Per-instance loads worth considering: the even split of `load` over 1..n_max instances."""
    top = profile.max_rate_per_s(cls, tp, clock)
    return sorted({load / n for n in range(1, n_max + 1) if load / n <= top})


def solve_pool(
    profile: EnergyProfile,
    length_class: str,
    load_per_s: float,
    gpus: int,
    slo: SLO,
    max_clock_only: bool = False,
    single_tp: bool = True,
    headroom: float = 0.9,
    time_limit_s: float = 0.5,
) -> PoolConfigChoice | None:
    """Least-power configuration of `gpus` GPUs carrying `load_per_s`; None if none can."""
    idle_w = _idle_w_per_gpu(profile, length_class)
    clocks = [max(profile.clocks_mhz)] if max_clock_only else profile.clocks_mhz
    options = []  # (tp, clock, rate per instance, instances, busy power of the instances)
    for tp in profile.tensor_parallel_degrees:
        if tp > gpus:
            continue
        for clock in clocks:
            for rate in _levels(profile, length_class, tp, clock, load_per_s, gpus // tp):
                point = profile.at(length_class, tp, clock, rate)
                if point is None or not profile.meets(length_class, tp, clock, rate, slo, headroom):
                    continue
                n = math.ceil(load_per_s / rate - 1e-9) if load_per_s > 0 else 1
                power = point[0]
                options.append((tp, clock, rate, n, power))
    if not options:
        return None
    try:
        return _milp(options, gpus, load_per_s, idle_w, single_tp, time_limit_s)
    except _SolverFailed:
        return _greedy(options, gpus, idle_w)


class _SolverFailed(Exception):
    pass


def _idle_w_per_gpu(profile: EnergyProfile, length_class: str) -> float:
    """Idle power per GPU: the profile's power at its lightest load is close to idle."""
    tp = min(profile.tensor_parallel_degrees)
    clock = min(profile.clocks_mhz)
    lightest = profile.at(length_class, tp, clock, 0.0)
    return (lightest[0] / tp) if lightest else 0.0


def _milp(options, gpus: int, load: float, idle_w: float, single_tp: bool, time_limit_s: float) -> PoolConfigChoice:
    prob = pulp.LpProblem("pool", pulp.LpMinimize)
    x = {i: prob.add_variable(f"x{i}", lowBound=0, upBound=gpus // o[0], cat="Integer") for i, o in enumerate(options)}
    tps = sorted({o[0] for o in options})
    pairs = sorted({(o[0], o[1]) for o in options})
    use_tp = {t: prob.add_variable(f"tp{t}", cat="Binary") for t in tps}
    use_clock = {p: prob.add_variable(f"f{p[0]}_{p[1]}", cat="Binary") for p in pairs}
    # Energy: busy instances at their profiled power, unused GPUs at idle.
    prob += pulp.lpSum(x[i] * (o[4] - o[0] * idle_w) for i, o in enumerate(options)) + gpus * idle_w
    prob += pulp.lpSum(x[i] * o[0] for i, o in enumerate(options)) <= gpus
    prob += pulp.lpSum(x[i] * o[2] for i, o in enumerate(options)) >= load
    for t in tps:
        prob += pulp.lpSum(use_clock[p] for p in pairs if p[0] == t) <= use_tp[t]
    if single_tp:
        prob += pulp.lpSum(use_tp.values()) <= 1
    for i, o in enumerate(options):
        prob += x[i] <= (gpus // o[0]) * use_clock[(o[0], o[1])]
    with warnings.catch_warnings():  # PuLP 3 deprecates its bundled CBC; pulp<4 is pinned
        warnings.simplefilter("ignore", DeprecationWarning)
        status = prob.solve(pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s))
    if pulp.LpStatus[status] != "Optimal":
        raise _SolverFailed(pulp.LpStatus[status])
    chosen = [(o, round(x[i].value() or 0)) for i, o in enumerate(options) if (x[i].value() or 0) > 0.5]
    if not chosen:
        raise _SolverFailed("empty solution")
    # Report the TP with most instances (one TP per pool by default).
    (tp, clock, rate, _, _), n = max(chosen, key=lambda c: c[1] * c[0][0])
    used = sum(cnt * o[0] for o, cnt in chosen)
    total = sum(cnt * o[4] for o, cnt in chosen) + (gpus - used) * idle_w
    return PoolConfigChoice(tp, n, clock, rate, total, "milp")


def _greedy(options, gpus: int, idle_w: float) -> PoolConfigChoice | None:
    """Cheapest single (TP, clock, even split) that fits the GPUs."""
    best = None
    for tp, clock, rate, n, power in options:
        if n * tp > gpus:
            continue
        total = n * power + (gpus - n * tp) * idle_w
        if best is None or total < best.power_w:
            best = PoolConfigChoice(tp, n, clock, rate, total, "heuristic")
    return best
