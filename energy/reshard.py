"""Re-shard plans (DynamoLLM §IV-C, Fig. 6): move the fewest weights between GPUs.

A server's GPUs hold tensor-parallel shards of one model, cut into `units` equal
slices (8 for an 8-GPU server: TP t gives each GPU 8/t slices). For a new layout we
match target GPU slots to physical GPUs by maximum-weight bipartite matching
(scipy's linear_sum_assignment) on the slices a GPU already holds, then fetch the
missing slices, spreading them over sources. Transfers between different GPU pairs
run in parallel (NVLink/NVSwitch), so the plan's time is the largest number of bytes
one pair moves over the link bandwidth: this reproduces DynamoLLM's Table VI.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment


@dataclass(frozen=True)
class Transfer:
    src_gpu: int
    dst_gpu: int
    bytes: float


@dataclass(frozen=True)
class ReshardPlan:
    placement: dict[int, frozenset[int]]  # physical GPU -> slices it holds afterwards
    transfers: tuple[Transfer, ...]
    time_s: float

    @property
    def bytes_moved(self) -> float:
        return sum(t.bytes for t in self.transfers)


def layout_slices(tps: list[int], units: int = 8) -> list[frozenset[int]]:
    """Slices each GPU slot holds for instances of the given TPs packed in order
    (e.g. [4, 2, 2] on 8 GPUs: a TP4 on slots 0-3, TP2s on 4-5 and 6-7)."""
    slots: list[frozenset[int]] = []
    for tp in tps:
        if units % tp:
            raise ValueError(f"TP{tp} does not divide {units} slices")
        per_gpu = units // tp
        slots += [frozenset(range(i * per_gpu, (i + 1) * per_gpu)) for i in range(tp)]
    if len(slots) > units:
        raise ValueError(f"layout {tps} needs {len(slots)} GPUs; the server has {units}")
    return slots + [frozenset()] * (units - len(slots))


def plan_reshard(
    current: list[frozenset[int]], target: list[frozenset[int]], model_bytes: float, link_bytes_per_s: float
) -> ReshardPlan:
    """Place target slots on physical GPUs keeping the most slices in place."""
    units = len(current)
    overlap = np.array([[len(cur & tgt) for tgt in target] for cur in current])
    gpu_of_slot = dict(zip(*linear_sum_assignment(-overlap)[::-1], strict=True))
    slice_bytes = model_bytes / units
    holders: dict[int, list[int]] = {}
    for gpu, held in enumerate(current):
        for s in held:
            holders.setdefault(s, []).append(gpu)
    pair_bytes = np.zeros((units, units))
    transfers = []
    placement = {}
    for slot, wanted in enumerate(target):
        gpu = int(gpu_of_slot[slot])
        placement[gpu] = wanted
        for s in sorted(wanted - current[gpu]):
            if s not in holders:
                raise ValueError(f"slice {s} is on no GPU: the current layout does not hold the whole model")
            src = min(holders[s], key=lambda g: (pair_bytes[g, gpu], pair_bytes[g].sum()))
            pair_bytes[src, gpu] += slice_bytes
            transfers.append(Transfer(src, gpu, slice_bytes))
    time_s = float(pair_bytes.max() / link_bytes_per_s)
    return ReshardPlan(placement, tuple(transfers), time_s)
