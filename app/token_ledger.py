"""Per-cluster pending tokens M_k, kept as work is dispatched, produced and finished.

Continuous batching inserts a query into a running batch at the next iteration
(Mico §3.4, our ContinuousBatcher), so a cluster's load falls token by token, not
batch by batch; dispatch reads M_k from here, updated with each step's output.
"""

from __future__ import annotations


class TokenLedger:
    def __init__(self, n_clusters: int) -> None:
        self.load_tokens = [0.0] * n_clusters
        self._held: dict[str, tuple[int, float]] = {}  # request id -> (cluster, tokens left)

    def add(self, cluster: int, request_id: str, tokens: float) -> None:
        if request_id in self._held:
            raise ValueError(f"request {request_id!r} is already on cluster {self._held[request_id][0]}")
        self._held[request_id] = (cluster, tokens)
        self.load_tokens[cluster] += tokens

    def progress(self, request_id: str, tokens: float) -> None:
        """`tokens` of the request were computed (prefill chunk or decoded token)."""
        cluster, left = self._held[request_id]
        done = min(tokens, left)  # a prediction below the true length bottoms out at 0
        self._held[request_id] = (cluster, left - done)
        self.load_tokens[cluster] -= done

    def finish(self, request_id: str) -> None:
        """Drop what is left (a prediction above the true length)."""
        cluster, left = self._held.pop(request_id)
        self.load_tokens[cluster] -= left

    def move(self, request_id: str, to_cluster: int) -> None:
        cluster, left = self._held.pop(request_id)
        self.load_tokens[cluster] -= left
        self.add(to_cluster, request_id, left)

    def holds(self, request_id: str) -> bool:
        return request_id in self._held

    def left_tokens(self, request_id: str) -> float:
        return self._held[request_id][1]
