"""What a local cluster running the default app costs in CPU, with Ray's dashboard and
without, in the same run: CPU seconds until the app is healthy (every process of the
cluster: Ray's daemons, Serve's controller and proxy, the app's replicas) and per minute
after, while no request arrives.

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
from wattwise.local_serve import LocalServe


@dataclass(frozen=True)
class ClusterCost:
    start_cpu_s: float
    start_wall_s: float
    idle_cpu_s_per_min: float
    start_by_process: dict[str, float]
    idle_by_process: dict[str, float]


def measure(dashboard: bool, idle_s: float) -> ClusterCost:
    began = time.monotonic()
    with LocalServe(dashboard=dashboard) as local:
        started = local.cpu_s()
        start_wall_s = time.monotonic() - began
        time.sleep(idle_s)
        after = local.cpu_s()
    start_by_process: defaultdict[str, float] = defaultdict(float)
    idle_by_process: defaultdict[str, float] = defaultdict(float)
    for name, cpu_s in started.values():
        start_by_process[name] += cpu_s
    for pid, (name, cpu_s) in after.items():
        idle_by_process[name] += cpu_s - started.get(pid, (name, 0.0))[1]
    return ClusterCost(sum(start_by_process.values()), start_wall_s, sum(idle_by_process.values()) * 60 / idle_s,
                       start_by_process, idle_by_process)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wattwise bench cluster-cost", description=__doc__)
    parser.add_argument("--idle-s", type=float, default=60.0, help="how long each cluster is watched idle (s)")
    parser.add_argument("--runs", type=int, default=2, help="clusters per setting, started in turn")
    args = parser.parse_args(argv)
    print(run_header("wattwise bench cluster-cost " + " ".join(argv or [])).markdown())
    costs: dict[bool, list[ClusterCost]] = {True: [], False: []}
    for _ in range(args.runs):
        for dashboard in (True, False):  # interleaved, so that a busier minute hits both
            costs[dashboard].append(measure(dashboard, args.idle_s))
    print("\n| Ray's dashboard | start CPU (s) | start wall (s) | idle CPU (s/min) |\n| --- | --- | --- | --- |")
    for dashboard, runs in costs.items():
        print(f"| {'on' if dashboard else 'off'} | " + " | ".join(
            " / ".join(f"{getattr(c, field):.1f}" for c in runs)
            for field in ("start_cpu_s", "start_wall_s", "idle_cpu_s_per_min")) + " |")
    on, off = (sum(c.start_cpu_s for c in costs[d]) for d in (True, False))
    idle_on, idle_off = (sum(c.idle_cpu_s_per_min for c in costs[d]) for d in (True, False))
    print(f"\nwithout the dashboard: start CPU x{off / on:.2f}, idle CPU x{idle_off / idle_on:.2f}")
    last = costs[False][-1]
    print("\nstart CPU by process, without the dashboard (last run):")
    for name, cpu_s in sorted(last.start_by_process.items(), key=lambda item: -item[1])[:12]:
        print(f"  {cpu_s:6.1f} s  {name}")
    return 0
