"""The scoreboard of one replica and its KV / batch projections (throttLL'eM paper §IV-B, eqs. 1-2).

Each entry is a scheduled request: the iteration it was scheduled at (s_i), its input
length |q_i| and its projected output length r_i. Projections assume no arrivals: entry
i occupies iterations s_i <= j < s_i + r_i and holds ceil((j - s_i + |q_i| + 1) / N)
KV blocks there (eq. 1, counting the slot of the token iteration j writes, as paged
engines allocate it). A candidate is inserted "virtually", then committed or rolled back.
Each entry's deadline is held at its projected end, with the seconds it moves per token
(its TBT target; 0 for an explicit E2E target): the request may end at any token before
that, and the clock search holds its deadline wherever it does (slo_checks).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Projection:
    """Vectors over future iterations k, k+1, ..., and each entry's remaining iterations."""

    batch: np.ndarray  # B (eq. 1 summed as a count)
    kv_blocks: np.ndarray  # KV (eq. 2)
    remaining: np.ndarray  # per entry: s_i + r_i - k (>= 1)
    # Which of its scoreboard's fresh projections this one is, and how many iterations on from it
    # (shifted by as many of them): one of the next offset is this one less its first iteration.
    origin: int | None = None
    offset: int = 0


class Scoreboard:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.ids: list[str] = []
        self.start = np.zeros(0, dtype=np.int64)
        self.input_tokens = np.zeros(0, dtype=np.int64)
        self.output_tokens = np.zeros(0, dtype=np.int64)
        self.deadline_s = np.zeros(0, dtype=np.float64)
        self.deadline_per_token_s = np.zeros(0, dtype=np.float64)
        self.lost = np.zeros(0, dtype=bool)
        self._virtual = False
        # The last projection and the iteration it was made at: the admission, the clock and
        # the "lost" check ask for it several times a step, and only new entries change it.
        self._projected: tuple[int, Projection] | None = None
        self._origins = 0  # fresh projections made

    def __len__(self) -> int:
        return len(self.ids)

    def reset(self, ids: list[str], start: np.ndarray, input_tokens: np.ndarray, output_tokens: np.ndarray,
              deadline_s: np.ndarray, deadline_per_token_s: np.ndarray, lost: np.ndarray) -> None:
        """Replace every entry (the replica's running batch, re-read each step)."""
        # Compared only when a kept projection could be reused (columns kept between steps
        # come back as the same arrays).
        same = (self._projected is not None and ids == self.ids and np.array_equal(start, self.start)
                and (input_tokens is self.input_tokens or np.array_equal(input_tokens, self.input_tokens))
                and (output_tokens is self.output_tokens or np.array_equal(output_tokens, self.output_tokens)))
        self.ids = list(ids)
        self.start, self.input_tokens, self.output_tokens = start, input_tokens, output_tokens
        self.deadline_s, self.deadline_per_token_s, self.lost = deadline_s, deadline_per_token_s, lost
        self._virtual = False
        if not same:
            self._projected = None

    def insert_virtual(self, request_id: str, start: int, input_tokens: int, output_tokens: int,
                       deadline_s: float, deadline_per_token_s: float) -> None:
        if self._virtual:
            raise RuntimeError("a virtual entry is already pending: commit or roll it back first")
        self.ids.append(request_id)
        self.start = np.append(self.start, start)
        self.input_tokens = np.append(self.input_tokens, input_tokens)
        self.output_tokens = np.append(self.output_tokens, output_tokens)
        self.deadline_s = np.append(self.deadline_s, deadline_s)
        self.deadline_per_token_s = np.append(self.deadline_per_token_s, deadline_per_token_s)
        self.lost = np.append(self.lost, False)
        self._virtual = True
        self._projected = None

    def commit(self, lost: bool = False) -> None:
        self._require_virtual()
        self.lost[-1] = lost
        self._virtual = False

    def rollback(self) -> None:
        self._require_virtual()
        self.ids.pop()
        for name in ("start", "input_tokens", "output_tokens", "deadline_s", "deadline_per_token_s", "lost"):
            setattr(self, name, getattr(self, name)[:-1])
        self._virtual = False
        self._projected = None

    def _require_virtual(self) -> None:
        if not self._virtual:
            raise RuntimeError("no virtual entry to commit or roll back")

    def current(self, now_iter: int) -> tuple[int, int]:
        """(B, KV) of iteration now_iter alone: `project(now_iter)`'s first entries in O(n),
        for the per-step correction of M that needs nothing further ahead."""
        if self._projected is not None and self._projected[0] == now_iter:  # its first entries
            return len(self.ids), int(self._projected[1].kv_blocks[0])
        a = now_iter - self.start + self.input_tokens + self.block_size
        return len(self.ids), int((a // self.block_size).sum())

    def project(self, now_iter: int) -> Projection:
        """B and KV for iterations now_iter ... until the last entry ends (numpy, O(n + horizon));
        the same object until an entry changes (deadlines and "lost" do not move it). Callers
        read it, never write to it. A step that only decoded the same entries moves the
        projection by one iteration: the last one, less its first iteration, unless an entry
        was projected to end there (the fresh projection counts it as ending one step on)."""
        if self._projected is not None:
            at, last = self._projected
            if at == now_iter:
                return last
            if at == now_iter - 1 and len(last.batch) > 1 and int(last.remaining.min()) > 1:
                shifted = Projection(last.batch[1:], last.kv_blocks[1:], last.remaining - 1, last.origin,
                                     last.offset + 1)
                self._projected = (now_iter, shifted)
                return shifted
        projection = self._project(now_iter)
        self._projected = (now_iter, projection)
        return projection

    def _project(self, now_iter: int) -> Projection:
        n_block = self.block_size
        remaining = np.maximum(self.start + self.output_tokens - now_iter, 1)
        horizon = int(remaining.max()) if len(remaining) else 0
        ends = np.bincount(remaining, minlength=horizon + 1)
        batch = len(remaining) - np.cumsum(ends)[:horizon]
        # ceil((c + j) / N) = floor((a + j) / N) with a = c + N - 1: a step up wherever
        # (a + j) % N == 0, built as a difference array over j.
        a = now_iter - self.start + self.input_tokens + 1 + n_block - 1
        diff = np.zeros(horizon + 1, dtype=np.int64)
        diff[0] = int((a // n_block).sum())
        # Each entry's blocks leave when it ends (integer weights sum exactly in float64).
        diff -= np.bincount(remaining, weights=(a + remaining - 1) // n_block, minlength=horizon + 1).astype(np.int64)
        first = n_block - a % n_block  # first offset >= 1 where a block is added
        count = np.where(remaining - 1 >= first, (remaining - 1 - first) // n_block + 1, 0)
        total = int(count.sum())
        if total:
            offsets = np.arange(total) - np.repeat(np.cumsum(count) - count, count)
            diff += np.bincount(np.repeat(first, count) + n_block * offsets, minlength=horizon + 1)
        self._origins += 1
        return Projection(batch, np.cumsum(diff)[:horizon], remaining, self._origins)
