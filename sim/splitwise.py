"""The simulator with Splitwise's phase split: prompt on one replica, KV over the link,
tokens on another.

A request's first token comes from its prompt replica (the request runs there with
one output token); its KV then travels (energy/kv_transfer.py) and the token replica
resumes the sequence with the KV present. A failed transfer is noticed after a
timeout and the token replica recomputes the prompt instead. Both replicas charge
their own energy; the request's energy is the sum of its two phases.

The cluster-level scheduler's pending-token ledger hears from a replica whenever work
lands on it or a phase completes there, besides every control tick, as the CLS sees
both events itself; reports only on ticks leave it stale for up to a tick.

Pools may run on different machines (Splitwise-HA: H100 prompt, A100 token): a pool
named in `pool_perf` starts its replicas with that performance model, the others
with the run's (SimConfig.hardware).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from functools import partial

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from autoscaling.splitwise.config import SplitwiseConfig
from autoscaling.splitwise.machine import AgingPreemption, KvBudgetAdmission
from autoscaling.splitwise.scheduler import PROMPT, TOKEN, Placement, SplitwiseScheduler
from batching.continuous_batcher import Sequence
from batching.hook_chains import chain_admission, chain_preemption
from core.request import Request
from core.roles import Phase
from energy.kv_transfer import KVTransferConfig, KVTransferModel
from energy.perf_model import PerfModel
from sim.replica import SimReplica, State
from sim.simulator import Event, Pool, Simulator


class SplitwiseSimConfig(BaseModel):
    """The phase split's settings in the simulator, failure injection included."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scheduling: SplitwiseConfig = Field(default=SplitwiseConfig(), description="Splitwise's scheduling knobs.")
    transfer: KVTransferConfig = Field(default=KVTransferConfig(), description=(
        "The modelled KV transfer between a prompt and a token replica (link, layer-wise threshold)."))
    transfer_failure_prob: float = Field(default=0.0, ge=0, le=1, description=(
        "Failure injection: the share of KV transfers that fail; the token replica then recomputes the prompt."))
    transfer_timeout_s: float = Field(default=1.0, gt=0, description=(
        "A failed transfer is noticed after this long (s), when the token replica stops waiting for the KV."))
    seed: int = Field(default=0, description="Seed of the failure injection.")


class SplitwiseSimulator(Simulator):
    def __init__(self, *args, splitwise: SplitwiseSimConfig | None = None,
                 pool_perf: dict[str, PerfModel] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.pool_perf = pool_perf or {}
        splitwise = splitwise or SplitwiseSimConfig()
        self.splitwise = splitwise
        self.scheduler = SplitwiseScheduler(splitwise.scheduling)
        self.transfer = KVTransferModel(self.perf.model, splitwise.transfer)
        self.rng = np.random.default_rng(splitwise.seed)
        self.transfers: Counter[str] = Counter()
        self._token_phase: dict[str, tuple[Request, Placement]] = {}

    def _start_replica(self, pool: Pool, now: float, delay_s: float) -> bool:
        """The base simulator builds replicas on `self.perf`: lend it the pool's machine."""
        run_perf = self.perf
        self.perf = self.pool_perf.get(pool.name, run_perf)
        try:
            return super()._start_replica(pool, now, delay_s)
        finally:
            self.perf = run_perf

    def _ready(self, r: SimReplica, now: float) -> None:
        super()._ready(r, now)
        if r.state is not State.READY:
            return
        sched = self.splitwise.scheduling
        batcher = r.ready_batcher
        batcher.preemption = chain_preemption(
            [batcher.preemption, AgingPreemption(sched.preempt_age_limit_s, sched.max_preemptions_per_request)])
        home = PROMPT if self.pools[r.pool].setup.kind is Phase.PROMPT else TOKEN
        if home is TOKEN:  # after the pool's own admission (e.g. throttLL'eM's), not instead of it
            batcher.admission = chain_admission([batcher.admission, KvBudgetAdmission(sched.token_kv_budget)])
        self.scheduler.add_replica(r.replica_id, home)

    def _stop(self, r: SimReplica, now: float) -> None:
        super()._stop(r, now)
        self.scheduler.remove_replica(r.replica_id)

    def _arrive_by_kind(self, i: int, request: Request, now: float) -> None:
        out = request.predicted_output_tokens or request.output_tokens_to_generate
        assignment = self.scheduler.assign(request.prompt_tokens, out, now)
        prompt_replica = self.all_replicas[assignment.prompt.replica_id]
        self.log.pool[i] = self.pools[prompt_replica.pool].index
        self._token_phase[request.request_id] = (request, assignment.token)
        prompt_phase = replace(request, max_tokens=1, target_output_tokens=1)
        try:
            prompt_replica.ready_batcher.add(prompt_phase, now)
        except ValueError:  # larger than the replica's whole KV cache
            self._reject(i, now)
            self._token_phase.pop(request.request_id)
            self.scheduler.finished(assignment.prompt.replica_id, PROMPT)
            self.scheduler.finished(assignment.token.replica_id, TOKEN)
            self.scheduler.ledger.land(assignment.prompt.ticket)
            self.scheduler.ledger.land(assignment.token.ticket)
            return
        self._land_ticket(prompt_replica, assignment.prompt.ticket, now)
        self._kick(prompt_replica, now)

    def _complete(self, r: SimReplica, seq: Sequence, now: float) -> None:
        self._report(r, now)  # its queue shrank: JSQ must not keep avoiding it until the next tick
        pending = self._token_phase.pop(seq.request_id, None)
        if pending is None:  # a token phase finished: the request is done
            self.scheduler.finished(r.replica_id, TOKEN)
            super()._complete(r, seq, now)
            return
        self.scheduler.finished(r.replica_id, PROMPT)
        request, token = pending
        if seq.generated >= request.output_tokens_to_generate:  # a one-token answer needs no token phase
            self.scheduler.finished(token.replica_id, TOKEN)
            self.scheduler.ledger.land(token.ticket)
            super()._complete(r, seq, now)
            return
        if token.replica_id == r.replica_id:  # a mixed replica drew both phases: the KV is already here
            self.transfers["local"] += 1
            self._push(now, Event.CALL, partial(self._land, request, seq, token, True))
            return
        prefill_s = r.perf.prefill_time_s(request.prompt_tokens, request.prompt_tokens ** 2, r.tp,
                                          r.ready_batcher.clock_mhz)
        plan = self.transfer.plan(request.prompt_tokens, r.tp, prefill_s)
        failed = bool(self.rng.random() < self.splitwise.transfer_failure_prob)
        self.transfers["layerwise" if plan.layerwise else "serialized"] += 1
        self.transfers["failed"] += failed
        delay = self.splitwise.transfer_timeout_s if failed else plan.visible_s
        self._push(now + delay, Event.CALL, partial(self._land, request, seq, token, not failed))

    def _land(self, request: Request, prior: Sequence, token: Placement, kv_present: bool, now: float) -> None:
        """The KV arrived (or the transfer timed out): the token replica takes over."""
        r = self.all_replicas[token.replica_id]
        r.ready_batcher.resume(request, prior, now, kv_present)
        self._land_ticket(r, token.ticket, now)
        self._kick(r, now)

    def _land_ticket(self, r: SimReplica, ticket: int, now: float) -> None:
        """Work reached `r`: its reservation ends and `r` reports at once, so the work
        stays counted (left to the next control tick's report, arrivals within a tick
        would all see the same stale minimum and herd onto one replica)."""
        self.scheduler.ledger.land(ticket)
        self._report(r, now)

    def _report(self, r: SimReplica, now: float) -> None:
        stats = r.ready_batcher.stats(now)
        self.scheduler.ledger.report(r.replica_id, stats.pending_prompt_tokens + stats.pending_decode_tokens)

    def _control(self, now: float) -> None:
        for r in self.all_replicas:
            if r.state is State.READY:
                self._report(r, now)
        self.scheduler.rebalance(now)
        super()._control(now)
