"""Emptied deployments keep their replicas until the ingress has seen the new routing.

A plan that takes a pool's traffic away and scales it to 0 (DynamoLLM folding a small
pool into a larger one, a shadow TP rollout switching deployments) reaches Serve's
controller at once but the ingress only when it next polls the plan store (about a
second). A request it routes there in between would wait in Serve's router for a replica
that never comes. Shrinking to a non-zero count needs no such grace: Serve routes around
draining replicas. The simulator applies routing and replicas in the same instant, so this
is the Serve runtime's concern, not a policy's. Pure: targets and the time in, targets out.
"""

from __future__ import annotations


class EmptyingHandover:
    """A deployment whose target drops to 0 keeps its last target `handover_s` longer."""

    def __init__(self, handover_s: float = 5.0) -> None:
        self.handover_s = handover_s
        self._emptied: dict[str, tuple[float, int]] = {}  # deployment -> (emptied at, replicas kept)

    def hold(self, targets: dict[str, int], previous: dict[str, int], now_s: float) -> dict[str, int]:
        """`targets` with every deployment emptied less than `handover_s` ago (its
        `previous` target was > 0) kept at that previous target."""
        held = dict(targets)
        for name, replicas in targets.items():
            if replicas > 0:
                self._emptied.pop(name, None)
                continue
            if name not in self._emptied and previous.get(name, 0) > 0:
                self._emptied[name] = (now_s, previous[name])
            entry = self._emptied.get(name)
            if entry is not None and now_s - entry[0] < self.handover_s:
                held[name] = entry[1]
            else:
                self._emptied.pop(name, None)
        return held
