"""Chiron's dedicated batch replicas as a layer of the one controller: the most they could save.

    wattwise bench batch-replicas [--workloads batch-dump,batch-mix] [--jobs 2]

The composite runs batch work behind interactive work on its pools' own replicas, and
Algorithm 2 sizes the pools for it. Dedicated batch replicas could only pay where that
costs more than batch work run on replicas of its own. Per workload, the bench measures
what the composite spends on its batch work (the workload, less the composite on the same
interactive requests alone): no layer for batch work can save more than that. And the least
that work could cost on replicas of its own: the oracle floor (sim/oracle.py) of the batch
requests alone (free start-ups, every window at its cheapest TP, clock and instance count,
batch work paced). The difference bounds what moving the batch work onto replicas of its
own could save; where it is negative, filling the pools' spare capacity already costs less
than the floor of replicas of its own. (Chiron's own mix, spare capacity first and batch
replicas for the rest, lies between the two bounds.)
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from bench.run_header import run_header
from bench.wattwise import COMPOSITE, workload
from sim.config import SimConfig
from sim.metrics import J_PER_KWH, summarise
from sim.oracle import oracle_energy
from sim.scenario import build
from sim.simulator import Simulator


@dataclass(frozen=True)
class BatchShare:
    """One workload's batch work: what the composite spends on it and its own replicas' floor."""

    workload: str
    composite_j: float  # the composite on the whole workload
    interactive_alone_j: float  # the composite on its interactive requests alone
    slo_met: float  # the composite on the whole workload, every request
    batch_floor_j: float  # the oracle floor of the batch requests alone

    @property
    def composite_batch_j(self) -> float:
        return self.composite_j - self.interactive_alone_j

    @property
    def batch_share(self) -> float:
        """The composite's batch work as a share of the workload's energy: the most any layer saves."""
        return self.composite_batch_j / self.composite_j

    @property
    def moved_saving_share(self) -> float:
        """The most moving the batch work onto replicas of its own saves, as a share of the workload."""
        return (self.composite_batch_j - self.batch_floor_j) / self.composite_j


def composite_energy(job: tuple[str, bool, int]) -> tuple[float, float]:
    """The composite's energy (J) and SLO attainment on a workload, or on its interactive part."""
    name, interactive_alone, seed = job
    w = workload(name, 24.0, seed)
    if interactive_alone:
        w = w.take(w.interactive)
    config = SimConfig()
    setups, policy = build(COMPOSITE, w, config)
    summary = summarise(Simulator(w, policy, setups, config).run(), config)
    return summary["energy_j"], summary["slo_attainment"]["overall"]


def batch_floor_j(name: str, seed: int) -> float:
    w = workload(name, 24.0, seed)
    return oracle_energy(w.take(~w.interactive), SimConfig()).energy_j


def measure(names: list[str], seed: int, jobs: int) -> list[BatchShare]:
    runs = [(name, alone, seed) for name in names for alone in (False, True)]
    with ProcessPoolExecutor(jobs) as pool:
        results = dict(zip(runs, pool.map(composite_energy, runs), strict=True))
    return [BatchShare(name, results[(name, False, seed)][0], results[(name, True, seed)][0],
                       results[(name, False, seed)][1], batch_floor_j(name, seed)) for name in names]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="batch-dump,batch-mix")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args(argv)
    print(run_header("wattwise bench batch-replicas " + " ".join(argv or [])).markdown())
    print("\n| workload | composite kWh | SLO met | composite on its interactive requests kWh | "
          "composite's batch work kWh (share: the most any batch layer saves) | batch work alone, floor kWh | "
          "most saved by moving it onto replicas of its own |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for s in measure(args.workloads.split(","), args.seed, args.jobs):
        moved = (f"{s.moved_saving_share:.1%} of the workload" if s.moved_saving_share > 0
                 else "none: the pools' spare capacity costs less")
        print(f"| {s.workload} | {s.composite_j / J_PER_KWH:.4f} | {s.slo_met:.3%} | "
              f"{s.interactive_alone_j / J_PER_KWH:.4f} | "
              f"{s.composite_batch_j / J_PER_KWH:.4f} ({s.batch_share:.1%}) | "
              f"{s.batch_floor_j / J_PER_KWH:.4f} | {moved} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
