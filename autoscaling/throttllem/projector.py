"""One replica's scoreboard kept in step with its batcher, and M tabulated for its TP.

Shared by the admission and clock policies of that replica. The batcher is the truth:
at each new step the scoreboard is re-read from the running batch, each entry
re-anchored at s_i = k - (tokens generated), so chunked prefill and preemptions never
drift the projection. A request that outlived its (margin-stretched) prediction is
re-projected to its max_tokens; one projected to miss its deadline even at max clock is
marked lost, so the scheduler stops protecting a deadline it cannot meet.

M predicts decode steps; real steps also carry the prefills of requests admitted into
them. Each step's observed time over M's prediction for it (at the clock it ran at) feeds
an EWMA, `correction`, that stretches every projection (online correction of M).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from autoscaling.throttllem.config import ThrottllemConfig
from autoscaling.throttllem.ips_table import IpsTable, Lookup
from autoscaling.throttllem.scoreboard import Projection, Scoreboard
from autoscaling.throttllem.slo_checks import DeadlineLines, Verdict, check, late_entries
from batching.continuous_batcher import RunningBatch, Sequence


def deadline_per_token_s(seq: Sequence) -> float:
    """How far the request's deadline moves per output token: its TBT target, 0 when its
    E2E target is explicit (the deadline is the same wherever it ends)."""
    slo = seq.request.slo
    return 0.0 if slo.e2e_s is not None else slo.tbt_s


@dataclass(frozen=True)
class _Entry:
    """A running request's scoreboard fields that stay put while it decodes."""

    request_id: str
    first_token_s: float | None
    prompt_tokens: int
    tokens: int  # projected output (ReplicaProjector.projected_tokens)
    deadline_s: float
    deadline_per_token_s: float


@dataclass(frozen=True)
class _Rows:
    """The scoreboard's columns that only entries move, kept while the running batch holds the
    same entries (most steps only decode). Read-only: a change copies."""

    entries: list[_Entry]
    by_id: dict[str, _Entry]
    ids: list[str]
    tokens: list[int]
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    deadline_s: np.ndarray
    deadline_per_token_s: np.ndarray
    tbt_s: float  # the tightest TBT target among them

    @classmethod
    def of(cls, entries: list[_Entry], running: list[Sequence]) -> _Rows:
        tokens = [e.tokens for e in entries]
        return cls(entries, {e.request_id: e for e in entries}, [e.request_id for e in entries], tokens,
                   np.array([e.prompt_tokens for e in entries], dtype=np.int64), np.array(tokens, dtype=np.int64),
                   np.array([e.deadline_s for e in entries], dtype=np.float64),
                   np.array([e.deadline_per_token_s for e in entries], dtype=np.float64),
                   min((s.request.slo.tbt_s for s in running), default=math.inf))


class ReplicaProjector:
    def __init__(self, config: ThrottllemConfig, table_for: Callable[[int, int, int], IpsTable],
                 block_size: int) -> None:
        self.config = config
        self.table_for = table_for  # (tp, batch limit, KV blocks) -> IpsTable
        self.scoreboard = Scoreboard(block_size)
        self.now_iter = 0
        self.table: IpsTable | None = None
        self.kv_blocks_total = 0
        self.tbt_s = math.inf
        self._synced_s: float | None = None
        self._lost_ids: set[str] = set()
        # Set when the scoreboard gained an entry or a lost one: the clock must be re-searched.
        self.changed = False
        # Observed / predicted step time (EWMA).
        self.correction = 1.0
        # The interactive prompt admission last refused (None once one is admitted): it
        # waits for the running batch to free KV or TBT room, which only a faster clock hastens.
        self.refused_prompt_id: str | None = None
        self._looked_up: tuple[Projection, IpsTable, Lookup] | None = None
        # The running requests' scoreboard fields at the last sync, as rows and by request id.
        self._rows = _Rows.of([], [])

    @property
    def headroom(self) -> float:
        """The share of each target projections may use, M's correction taken in."""
        return self.config.tuning.slo_headroom / self.correction

    def projected_tokens(self, seq: Sequence) -> int:
        """Predicted output stretched by the error margin; max_tokens once outlived."""
        request = seq.request
        predicted = request.predicted_output_tokens or request.max_tokens
        tokens = min(math.ceil(predicted * self.config.length_margin), request.max_tokens)
        return tokens if seq.generated < tokens else request.max_tokens

    def e2e_deadline_s(self, seq: Sequence, tokens: int) -> float:
        """When the request's last (`tokens`-th) token is due by its E2E target."""
        request = seq.request
        if tokens > (request.predicted_output_tokens or request.max_tokens):
            return request.arrival_s + request.slo.e2e_for(tokens)
        return request.deadline_s

    def deadline_s(self, seq: Sequence, tokens: int) -> float:
        """The E2E deadline, and once the first token is out, no later than one TBT target per
        further token after it: the SLO's TBT is a mean over those tokens, and a first token
        well inside its TTFT target leaves E2E slack that the mean does not have."""
        deadline = self.e2e_deadline_s(seq, tokens)
        if not self.config.hold_mean_tbt or seq.first_token_s is None or seq.request.slo.e2e_s is not None:
            return deadline
        return min(deadline, seq.first_token_s + seq.request.slo.tbt_s * (tokens - 1))

    def sync(self, batcher: RunningBatch, now_s: float) -> None:
        """Re-read the running batch once per step (a step is known by its start time)."""
        if self._synced_s == now_s:
            return
        self._learn(batcher, now_s)
        self._synced_s = now_s
        self.now_iter += 1
        self.table = self.table_for(batcher.tensor_parallel, batcher.batch_limit, batcher.kv_blocks_total)
        self.kv_blocks_total = batcher.kv_blocks_total
        running = batcher.running
        last = self._rows.by_id
        entries = [e if (e := last.get(s.request_id)) is not None and e.first_token_s == s.first_token_s
                   and s.generated < e.tokens else self._entry(s) for s in running]
        if len(entries) != len(self._rows.entries) or any(a is not b for a, b in zip(entries, self._rows.entries)):
            self._rows = _Rows.of(entries, running)
        rows, board = self._rows, self.scoreboard
        lost_ids = self._lost_ids
        board.reset(rows.ids, np.array([self.now_iter - s.generated for s in running], dtype=np.int64),
                    rows.input_tokens, rows.output_tokens, rows.deadline_s, rows.deadline_per_token_s,
                    np.array([i in lost_ids for i in rows.ids], dtype=bool) if lost_ids
                    else np.zeros(len(rows.ids), dtype=bool))
        self.tbt_s = rows.tbt_s
        if running:
            self._mark_lost(running, rows.tokens, now_s)
        self._lost_ids = {rows.ids[i] for i in np.flatnonzero(board.lost)} if board.lost.any() else set()

    def _entry(self, seq: Sequence) -> _Entry:
        """The request's scoreboard fields, worked out again (sync keeps the last ones) only
        when they can have moved: a new request, one outliving its projected length, or its
        first token (the mean-TBT line) coming out."""
        tokens = self.projected_tokens(seq)
        return _Entry(seq.request_id, seq.first_token_s, seq.request.prompt_tokens, tokens,
                      self.deadline_s(seq, tokens), deadline_per_token_s(seq))

    def _mark_lost(self, running: list[Sequence], tokens: list[int], now_s: float) -> None:
        """Entries late even at max clock are lost. A mean TBT that no clock brings back is
        given up first (the request keeps its E2E deadline), so one request's hand-off gap
        does not hold its replica at max clock."""
        board = self.scoreboard
        late = self.late_at_max(self.project(), now_s) & ~board.lost
        if not late.any():
            return
        behind = np.flatnonzero(late)
        e2e = np.array([self.e2e_deadline_s(running[i], tokens[i]) for i in behind])
        given_up = e2e > board.deadline_s[behind]
        if given_up.any():
            board.deadline_s = board.deadline_s.copy()  # the kept rows' own stays as built
            board.deadline_s[behind[given_up]] = e2e[given_up]
            late = self.late_at_max(self.project(), now_s) & ~board.lost
        if late.any():
            board.lost |= late
            self.changed = True

    def _learn(self, batcher: RunningBatch, now_s: float) -> None:
        """Fold the step that just ended into `correction`, predicted on the scoreboard as
        it ran (the requests admitted into it included). Only a step followed at once by
        the next (a request ran through both) is timed: otherwise the gap holds idle time.
        The batcher applies a new clock after this sync, so its clock is the one the step ran at."""
        board, alpha = self.scoreboard, self.config.tuning.correction_alpha
        if alpha == 0 or self._synced_s is None or self.table is None or len(board) == 0:
            return
        ran = set(board.ids)
        if not any(s.request_id in ran for s in batcher.running):
            return
        index = self.table.clock_index(batcher.clock_mhz)
        if index is None:
            return
        batch, kv_blocks = board.current(self.now_iter)
        ratio = (now_s - self._synced_s) / self.table.one_iteration_s(index, batch, kv_blocks)
        self.correction += alpha * (min(max(ratio, 0.5), 4.0) - self.correction)

    def mark_lost(self, request_id: str) -> None:
        self._lost_ids.add(request_id)

    @property
    def synced_table(self) -> IpsTable:
        """The IPS table of the last sync (the projector is only read after one)."""
        if self.table is None:
            raise RuntimeError("ReplicaProjector read before its first sync()")
        return self.table

    def project(self) -> Projection:
        return self.scoreboard.project(self.now_iter)

    def lookup(self, projection: Projection) -> Lookup:
        """M's grid corners for `projection`, kept for the last one asked: the scoreboard hands
        out the same projection until its entries change, and the "lost" check, admission and
        the clock search each ask for it in a step. A step that only decoded moves the last
        projection one iteration on, and its corners (and the iteration times read) with it."""
        table = self.synced_table
        kept = self._looked_up
        if kept is not None and kept[1] is table:
            last, _, at = kept
            if last is projection:
                return at
            if projection.origin is not None and projection.origin == last.origin \
                    and projection.offset == last.offset + 1:
                self._looked_up = (projection, table, at.shifted())
                return self._looked_up[2]
        self._looked_up = (projection, table, table.lookup(projection.batch, projection.kv_blocks))
        return self._looked_up[2]

    def deadline_lines(self, projection: Projection) -> DeadlineLines:
        """Every deadline at every token up to its projected end: what the clock search holds."""
        board = self.scoreboard
        return DeadlineLines.build(projection.remaining, board.deadline_s, board.deadline_per_token_s)

    @property
    def whole_targets(self) -> float:
        """`headroom` without the share kept for later arrivals: every target whole, M's
        correction taken in (admission's check for a prompt that cannot wait)."""
        return 1.0 / self.correction

    def check_at(self, clock_index: int, projection: Projection, now_s: float, tbt_s: float | None = None,
                 at: Lookup | None = None, headroom: float | None = None) -> Verdict:
        """The paper's checks (deadlines at their projected ends), for admission and "lost":
        held at every token there, prompts the clock would have served on time were refused,
        and a refused prompt holds the max clock (batch mix: +21% energy for 0.2 points)."""
        lines = DeadlineLines.at_ends(projection.remaining, self.scoreboard.deadline_s)
        return check(self.synced_table, clock_index, at or self.lookup(projection), projection, lines, now_s,
                     self.tbt_s if tbt_s is None else tbt_s, self.headroom if headroom is None else headroom)

    def check_at_max(self, projection: Projection, now_s: float, tbt_s: float | None = None,
                     headroom: float | None = None) -> Verdict:
        return self.check_at(len(self.synced_table.clocks_mhz) - 1, projection, now_s, tbt_s, headroom=headroom)

    def next_iteration_s(self) -> float:
        """The running batch's next iteration at max clock, M's correction taken in."""
        table = self.synced_table
        batch, kv_blocks = self.scoreboard.current(self.now_iter)
        return table.one_iteration_s(len(table.clocks_mhz) - 1, batch, kv_blocks) * self.correction

    def late_at_max(self, projection: Projection, now_s: float) -> np.ndarray:
        """`check_at_max(...).late` without the TBT mean: the "lost" check of every step."""
        table = self.synced_table
        lines = DeadlineLines.at_ends(projection.remaining, self.scoreboard.deadline_s)
        return late_entries(table, len(table.clocks_mhz) - 1, self.lookup(projection), projection, lines, now_s,
                            self.headroom)
