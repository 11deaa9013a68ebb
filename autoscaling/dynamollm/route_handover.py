"""Make-before-break for a length class moving between pools (a fold, or its undoing).

A fold routes a pool's classes to its host and gives the pool's replicas back. When the
fold also grows the host or changes its TP (conversation trace: every class onto the long
pool, TP2 to TP4), the host's new replicas take a restart to start, and a fold that moved
the classes at once sent them to a pool with half its replicas serving: 38 requests missed
in one minute on conv. So a class moves only once the pool it moves to has its planned
replicas, at its planned TP, serving; until then it stays where it runs, and that pool
keeps its replicas. Pure: the planner's decisions and the replicas' reports in, routes out.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RouteHandover:
    """Which pool each class runs on, moved only to a pool ready to take it."""

    # class -> the pool it runs on; a class not in it runs on its own pool.
    serving: dict[str, str] = field(default_factory=dict)

    def route(self, length_class: str, own_pool: str, target: str, target_ready: bool) -> str:
        """The pool `length_class` runs on now: `target` when it runs there already or
        `target_ready`, else where it runs."""
        current = self.serving.get(length_class, own_pool)
        if current != target and not target_ready:
            return current
        self.serving[length_class] = target
        return target
