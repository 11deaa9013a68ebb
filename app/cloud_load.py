"""What one wattwise app tells a federation front about itself (GET /admin/load).

The front balances its clouds by outstanding predicted tokens per unit of capacity
(Mico §3.3). Its own ledger knows only what it sent; the cloud's report adds work from
other sources (direct clients, its Batch API) and its capacity. The controller sums its
replicas' stats into a `ViewLoad` each tick; the ingress adds the static capacity.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.view import ClusterView


@dataclass(frozen=True)
class ViewLoad:
    """The replicas' work as the controller last saw it."""

    outstanding_tokens: float  # prompt tokens to prefill plus output tokens to generate
    tokens_per_s: float  # tokens the replicas generate per second
    requests: int  # on the replicas (waiting or running) and queued for them
    running_gpus: int
    at_s: float  # wall-clock time of the view


@dataclass(frozen=True)
class CloudLoad:
    """One cloud's report: its work now and what it may grow to."""

    outstanding_tokens: float
    tokens_per_s: float
    requests: int
    running_gpus: int
    capacity_gpus: int  # GPUs its pools may scale to: each pool's max replicas times its largest TP
    at_s: float | None  # when the controller took the view; None before its first


def view_load(view: ClusterView, at_s: float) -> ViewLoad:
    """Sum of every pool replica's pending work and rate (the batch queue's waiting work is
    not counted: it runs behind interactive work, in the slack Chiron's layer leaves)."""
    stats = [s for d in view.deployments.values() for s in d.replica_stats]
    return ViewLoad(
        outstanding_tokens=float(sum(s.pending_prompt_tokens + s.pending_decode_tokens for s in stats)),
        tokens_per_s=float(sum(s.tokens_per_s for s in stats)),
        requests=int(sum(d.total_load for d in view.deployments.values())),
        running_gpus=int(sum(s.tensor_parallel for s in stats if s.batch_limit > 0)),
        at_s=at_s,
    )


def cloud_load(view: ViewLoad | None, capacity_gpus: int) -> CloudLoad:
    if view is None:
        return CloudLoad(0.0, 0.0, 0, 0, capacity_gpus, None)
    return CloudLoad(view.outstanding_tokens, view.tokens_per_s, view.requests, view.running_gpus, capacity_gpus,
                     view.at_s)
