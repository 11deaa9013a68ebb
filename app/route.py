"""Class-to-pool routing under a plan's weights, deterministic (no random draws).

DynamoLLM's cluster manager forwards a share of a class's load to the next larger
pool; both runtimes send each class's requests to pools by smooth weighted round
robin, so a 0.7/0.3 split is exact over every ten requests, reproducibly.
"""

from __future__ import annotations


class WeightedRouter:
    def __init__(self) -> None:
        self.weights: dict[str, dict[str, float]] = {}
        self._credit: dict[str, dict[str, float]] = {}

    def set_weights(self, weights: dict[str, dict[str, float]]) -> None:
        if weights != self.weights:
            self.weights = {cls: dict(w) for cls, w in weights.items()}
            self._credit = {}

    def pick(self, length_class: str, default_pool: str, allowed: set[str] | None = None) -> str:
        """The pool for the next request of `length_class`; the default without weights."""
        weights = {p: w for p, w in self.weights.get(length_class, {}).items()
                   if w > 0 and (allowed is None or p in allowed)}
        if not weights:
            return default_pool
        credit = self._credit.setdefault(length_class, {})
        total = sum(weights.values())
        for pool, w in weights.items():
            credit[pool] = credit.get(pool, 0.0) + w
        chosen = max(weights, key=lambda p: (credit[p], p))
        credit[chosen] -= total
        return chosen
