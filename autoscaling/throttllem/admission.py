"""throttLL'eM's admission control as the batcher's AdmissionPolicy (throttLL'eM paper §IV-C2).

The head of the queue is inserted virtually into the scoreboard and the projection is
checked at max clock: KV never exceeds capacity, the mean TBT stays within target and
no protected request (the candidate aside) is projected past its deadline. Passing
commits the entry; if only the candidate's own deadline fails it still joins, marked
lost (it harms no one); anything else rolls back and the request keeps waiting.
An empty replica always admits: waiting cannot make the request any faster.
An interactive prompt whose TTFT deadline falls within `urgent_prompt_steps` iterations
misses it if refused now: it is checked again against the running requests' whole targets
(the projection's headroom keeps a share of each for later arrivals), since its miss is
certain and theirs only projected within that share. Conv's hour: an 11-token prompt
refused three steps running behind 62 decodes, then a TTFT of 0.71 s against 0.25 s.
A refused interactive prompt is recorded on the projector, for the clock
(autoscaling/throttllem/clock.py) to drain the batch ahead of it faster.
"""

from __future__ import annotations

from autoscaling.throttllem.projector import ReplicaProjector, deadline_per_token_s
from autoscaling.throttllem.slo_checks import kv_fits
from batching.continuous_batcher import RunningBatch, Sequence


class ThrottllemAdmission:
    def __init__(self, projector: ReplicaProjector) -> None:
        self.projector = projector
        self.admitted = 0
        self.refused = 0
        self.admitted_lost = 0
        self.admitted_urgent = 0  # passed only against the running requests' whole targets

    def admit(self, seq: Sequence, batch: RunningBatch, now_s: float) -> bool:
        p = self.projector
        p.sync(batch, now_s)
        board = p.scoreboard
        cannot_wait = self._cannot_wait(seq, now_s)  # read on the batch before the candidate joins
        tokens = p.projected_tokens(seq)
        empty = len(board) == 0
        board.insert_virtual(seq.request_id, p.now_iter - seq.generated, seq.request.prompt_tokens, tokens,
                             p.deadline_s(seq, tokens), deadline_per_token_s(seq))
        tbt_s = min(p.tbt_s, seq.request.slo.tbt_s)
        projection = p.project()
        if empty:
            lost = bool(p.check_at_max(projection, now_s, tbt_s).late[-1])
        else:
            if not kv_fits(projection, p.kv_blocks_total):
                return self._refuse(seq)
            verdict = p.check_at_max(projection, now_s, tbt_s)
            protected = board.lost.copy()
            protected[-1] = True  # the candidate's own deadline decides only "lost"
            if not verdict.passes(ignore=protected):
                if not cannot_wait:
                    return self._refuse(seq)
                verdict = p.check_at_max(projection, now_s, tbt_s, headroom=p.whole_targets)
                if not verdict.passes(ignore=protected):
                    return self._refuse(seq)
                self.admitted_urgent += 1
            lost = bool(verdict.late[-1])
        board.commit(lost)
        p.refused_prompt_id = None
        p.tbt_s = tbt_s
        p.changed = True
        if lost:
            p.mark_lost(seq.request_id)
            self.admitted_lost += 1
        self.admitted += 1
        return True

    def _cannot_wait(self, seq: Sequence, now_s: float) -> bool:
        """Whether `seq` is an interactive prompt that misses its TTFT if refused now: still on
        time, and due within `urgent_prompt_steps` iterations of the running batch."""
        p = self.projector
        steps = p.config.tuning.urgent_prompt_steps
        if steps <= 0 or seq.generated != 0 or seq.request.service_class == "batch" or len(p.scoreboard) == 0:
            return False
        left_s = seq.request.arrival_s + seq.request.slo.ttft_s - now_s
        return 0 < left_s <= steps * p.next_iteration_s()

    def _refuse(self, seq: Sequence) -> bool:
        self.projector.scoreboard.rollback()
        waits_first_token = seq.request.service_class != "batch" and seq.generated == 0
        self.projector.refused_prompt_id = seq.request_id if waits_first_token else None
        self.refused += 1
        return False
