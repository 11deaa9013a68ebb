"""A vLLM replica's running batch as the admission rules read it (batching's RunningBatch).

vLLM schedules its own batch; what our rules need is the set of requests we let past
the admission gate, how far each has generated, and the engine's KV capacity. That is
what this view keeps: a Sequence per admitted request, advanced as its tokens stream
out, and vLLM's block counts from its stat loggers. It lets throttLL'eM's admission
(the same object the simulated replicas run) decide for a vLLM replica.
"""

from __future__ import annotations

from batching.continuous_batcher import Sequence
from core.request import Request
from engines.admission_gate import AdmissionGate
from engines.vllm_stats import VllmStatsSnapshot


class VllmRunningBatch:
    def __init__(self, tensor_parallel: int, block_size: int, snapshot: VllmStatsSnapshot,
                 gate: AdmissionGate) -> None:
        self.tensor_parallel = tensor_parallel
        self.block_size = block_size
        self.clock_mhz = 0.0  # the clock the node's GPU-control actor set; 0 until one is
        self._snapshot = snapshot
        self._gate = gate
        self._sequences: dict[str, Sequence] = {}

    @property
    def batch_limit(self) -> int:
        """The gate's limit: what Chiron's local autoscaler last set."""
        return self._gate.limit

    @property
    def running(self) -> list[Sequence]:
        """Admitted requests, oldest first."""
        return list(self._sequences.values())

    @property
    def kv_blocks_total(self) -> int:
        return self._snapshot.kv_blocks_total

    @property
    def kv_blocks_used(self) -> int:
        return round(self._snapshot.kv_usage * self._snapshot.kv_blocks_total) if self._sequences else 0

    @staticmethod
    def candidate(request: Request, now_s: float, generated: int = 0) -> Sequence:
        """The Sequence a waiting request is judged as (`generated`: resumed after a preemption)."""
        seq = Sequence(request, now_s)
        seq.generated = generated
        return seq

    def enter(self, seq: Sequence) -> None:
        self._sequences[seq.request_id] = seq

    def advance(self, request_id: str, generated: int, first_token_s: float | None) -> None:
        """Its tokens so far, and when the first came out (its TBT is a mean from there)."""
        if (seq := self._sequences.get(request_id)) is not None:
            seq.generated = generated
            seq.first_token_s = first_token_s

    def leave(self, request_id: str) -> None:
        self._sequences.pop(request_id, None)
