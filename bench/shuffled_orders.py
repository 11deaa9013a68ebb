"""The composite on many orders of the coding trace's minutes: the same bursts, in sequences
no rule was read from ("code-shuffled", one order per seed), against SinglePool sized to
meet 99% on each. One order can meet every target and the next miss one: whether a pool
has kept the capacity a burst needs depends on which bursts came before it. So a held-out
claim about bursts is a count over many orders, not one seed's figure.

    wattwise bench shuffled-orders [--seeds 1-36] [--jobs 2] [--json out.json]

Per seed: the composite's energy and GPU-hours over SinglePool's, and each policy's SLO
attainment overall and in its worst length class; then how many orders miss 99% in some
class under each, and on how many the composite's worst class is above SinglePool's.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.wattwise import COMPOSITE, run_one
from sim.metrics import worst_class

TARGET = 0.99


def seed_range(text: str) -> list[int]:
    """'1-36' or '1,8,9': the seeds to run."""
    seeds: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        seeds.extend(range(int(first), int(last or first) + 1))
    return seeds


@dataclass(frozen=True)
class Tally:
    """Over the orders: which miss the target in some class under each policy, and on how
    many the composite's worst class is above SinglePool's."""

    missed_by_composite: list[int]
    missed_by_singlepool: list[int]
    composite_worst_class_above: int


def tally(by_seed: dict[int, tuple[dict[str, Any], dict[str, Any]]]) -> Tally:
    """`by_seed`: seed -> (SinglePool's run summary, the composite's)."""
    return Tally(
        missed_by_composite=[s for s, (_, c) in by_seed.items() if worst_class(c)[1] < TARGET],
        missed_by_singlepool=[s for s, (sp, _) in by_seed.items() if worst_class(sp)[1] < TARGET],
        composite_worst_class_above=sum(worst_class(c)[1] > worst_class(sp)[1] for sp, c in by_seed.values()))


def seed_row(seed: int, composite: dict[str, Any], single: dict[str, Any]) -> str:
    ours, theirs = worst_class(composite), worst_class(single)
    return (f"{seed:>5} {composite['energy_kwh'] / single['energy_kwh']:>9.3f} "
            f"{composite['gpu_hours'] / single['gpu_hours']:>9.3f} "
            f"{100 * composite['slo_attainment']['overall']:>8.2f} {ours[0]:>3} {100 * ours[1]:>6.2f} "
            f"{100 * single['slo_attainment']['overall']:>8.2f} {theirs[0]:>3} {100 * theirs[1]:>6.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wattwise bench shuffled-orders", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="1-36", help="seeds of the orders: a range (1-36) or a list (1,8,9)")
    p.add_argument("--jobs", type=int, default=2, help="simulations run in parallel")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    seeds = seed_range(args.seeds)
    jobs = [("code-shuffled", policy, 0.0, seed) for seed in seeds for policy in ("singlepool", COMPOSITE)]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = [{k: v for k, v in r.items() if k != "series"} for r in pool.map(run_one, jobs)]
    by_seed = {seed: (results[2 * i], results[2 * i + 1]) for i, seed in enumerate(seeds)}
    print(f"{'seed':>5} {'energy x':>9} {'GPU-h x':>9} {'wattwise':>8} {'worst class':>10} "
          f"{'singlepool':>8} {'worst class':>10}")
    for seed, (single, composite) in by_seed.items():
        print(seed_row(seed, composite, single))
    counts = tally(by_seed)
    n = len(seeds)
    print(f"\norders missing {TARGET:.0%} in some class: {COMPOSITE} {len(counts.missed_by_composite)} of {n} "
          f"{counts.missed_by_composite}, singlepool {len(counts.missed_by_singlepool)} of {n}")
    print(f"{COMPOSITE}'s worst class above singlepool's on {counts.composite_worst_class_above} of {n} orders")
    if args.json is not None:
        args.json.write_text(json.dumps({str(s): {"singlepool": sp, COMPOSITE: c} for s, (sp, c) in by_seed.items()},
                                        indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
