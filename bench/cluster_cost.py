"""What a local cluster running the default app costs in CPU, as Ray and Serve start it by
default and as `LocalServe` does (no dashboard, Serve's controller stepping every 0.5 s), in
the same run: CPU seconds until the app is healthy (every process of the cluster: Ray's
daemons, Serve's controller and proxy, the app's replicas) and per minute after, while no
request arrives.

Every Ray test and the demo start such a cluster, and on a 2-core machine the CI's suites
are CPU-bound, so each second here is paid in wall time there, once per test module.
Run: `wattwise bench cluster-cost [--idle-s 60] [--runs 2]`.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from dataclasses import dataclass

from bench.run_header import run_header
from wattwise.local_serve import CONTROL_LOOP_ENV, LOCAL_CONTROL_LOOP_S, LocalServe


@dataclass(frozen=True)
class Setting:
    """How the cluster is started: Ray's dashboard, and Serve's control-loop period (s)."""

    name: str
    dashboard: bool
    control_loop_s: float


SETTINGS = (
    Setting("Ray's and Serve's defaults", dashboard=True, control_loop_s=0.1),
    Setting("no dashboard", dashboard=False, control_loop_s=0.1),
    Setting(f"LocalServe's (no dashboard, {LOCAL_CONTROL_LOOP_S} s loop)", dashboard=False,
            control_loop_s=LOCAL_CONTROL_LOOP_S),
)


@dataclass(frozen=True)
class ClusterCost:
    start_cpu_s: float
    start_wall_s: float
    idle_cpu_s_per_min: float
    idle_by_process: dict[str, float]


def measure(setting: Setting, idle_s: float) -> ClusterCost:
    began = time.monotonic()
    env = {CONTROL_LOOP_ENV: str(setting.control_loop_s)}
    with LocalServe(dashboard=setting.dashboard, env=env) as local:
        started = local.cpu_s()
        start_wall_s = time.monotonic() - began
        time.sleep(idle_s)
        after = local.cpu_s()
    idle_by_process: defaultdict[str, float] = defaultdict(float)
    for pid, (name, cpu_s) in after.items():
        idle_by_process[name] += cpu_s - started.get(pid, (name, 0.0))[1]
    return ClusterCost(sum(cpu_s for _, cpu_s in started.values()), start_wall_s,
                       sum(idle_by_process.values()) * 60 / idle_s, idle_by_process)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wattwise bench cluster-cost", description=__doc__)
    parser.add_argument("--idle-s", type=float, default=60.0, help="how long each cluster is watched idle (s)")
    parser.add_argument("--runs", type=int, default=2, help="clusters per setting, started in turn")
    args = parser.parse_args(argv)
    print(run_header("wattwise bench cluster-cost " + " ".join(argv or [])).markdown())
    costs: dict[Setting, list[ClusterCost]] = {setting: [] for setting in SETTINGS}
    for _ in range(args.runs):
        for setting in SETTINGS:  # interleaved, so that a busier minute hits each
            costs[setting].append(measure(setting, args.idle_s))
    print("\n| cluster | start CPU (s) | start wall (s) | idle CPU (s/min) |\n| --- | --- | --- | --- |")
    for setting, runs in costs.items():
        print(f"| {setting.name} | " + " | ".join(
            " / ".join(f"{getattr(c, field):.1f}" for c in runs)
            for field in ("start_cpu_s", "start_wall_s", "idle_cpu_s_per_min")) + " |")
    def against_defaults(setting: Setting, field: str) -> float:
        return sum(getattr(c, field) for c in costs[setting]) / sum(getattr(c, field) for c in costs[SETTINGS[0]])

    print()
    for setting in SETTINGS[1:]:
        print(f"{setting.name}: start CPU x{against_defaults(setting, 'start_cpu_s'):.2f}, "
              f"idle CPU x{against_defaults(setting, 'idle_cpu_s_per_min'):.2f}")
    for setting in (SETTINGS[0], SETTINGS[-1]):
        last = costs[setting][-1]
        print(f"\nidle CPU by process, {setting.name} (last run, s/min):")
        for name, cpu_s in sorted(last.idle_by_process.items(), key=lambda item: -item[1])[:6]:
            print(f"  {cpu_s * 60 / args.idle_s:6.2f}  {name}")
    return 0
