"""DynamoLLM §V-B rebuilt on our profile: every baseline vs SinglePool on the 1 h
conversation trace, with latency percentiles and the oracle energy floor.

    wattwise bench dynamollm-table [--json out.json] [--plot-dir plots/]
"""

from __future__ import annotations

import sys

from sim.cli import main
from sim.scenario import SPECS


def run(argv: list[str] | None = None) -> int:
    policies = [arg for name in SPECS for arg in ("--policy", name)]
    return main(["--trace", "conv", *policies, *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(run())
