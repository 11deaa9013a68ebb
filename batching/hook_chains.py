"""Ordered chains of the batcher's hooks, so several papers' rules run in one replica.

The one controller gives each per-step decision one owner, but a replica can carry
rules from more than one layer (throttLL'eM's SLO admission and Splitwise's KV-budget
admission on a prompt pool; Chiron's interactive-first preemption beside Splitwise's
aging). Before these chains, attaching a second hook silently replaced the first.

- admission: a request joins the batch only when every member admits it; members are
  asked in order and the first refusal stops the chain (later members never commit
  state for a request that stays waiting).
- clock: the first member with an opinion picks the clock; the batcher clamps it into
  the band the planner published for the pool (`ContinuousBatcher.set_clock_band`):
  throttLL'eM searches clocks, the planner bounds the search.
- preemption: the first member that names a victim wins; None from all leaves the
  request waiting.
"""

from __future__ import annotations

from collections.abc import Sequence as Members
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from batching.continuous_batcher import (
        AdmissionPolicy,
        ClockedBatch,
        ClockPolicy,
        ContinuousBatcher,
        PreemptionPolicy,
        RunningBatch,
        Sequence,
    )


class AdmissionChain:
    """Every member must admit, in order."""

    def __init__(self, members: Members[AdmissionPolicy]) -> None:
        self.members = tuple(members)

    def admit(self, seq: Sequence, batch: RunningBatch, now_s: float) -> bool:
        return all(m.admit(seq, batch, now_s) for m in self.members)


class ClockChain:
    """The first member's clock choice (the batcher clamps it into the pool's band)."""

    def __init__(self, members: Members[ClockPolicy]) -> None:
        self.members = tuple(members)

    def choose_clock_mhz(self, batcher: ClockedBatch, now_s: float) -> float | None:
        for m in self.members:
            clock = m.choose_clock_mhz(batcher, now_s)
            if clock is not None:
                return clock
        return None

    def lowest_clock_mhz(self, batcher: ClockedBatch) -> float:
        """Any member may pick: the lowest of theirs."""
        return min((m.lowest_clock_mhz(batcher) for m in self.members), default=0.0)


class PreemptionChain:
    """The first member that picks a victim decides."""

    def __init__(self, members: Members[PreemptionPolicy]) -> None:
        self.members = tuple(members)

    def victim(self, seq: Sequence, batcher: ContinuousBatcher, now_s: float) -> int | None:
        for m in self.members:
            index = m.victim(seq, batcher, now_s)
            if index is not None:
                return index
        return None


def chain_admission(members: Members[AdmissionPolicy | None]) -> AdmissionPolicy | None:
    present = [m for m in members if m is not None]
    return None if not present else present[0] if len(present) == 1 else AdmissionChain(present)


def chain_clock(members: Members[ClockPolicy | None]) -> ClockPolicy | None:
    present = [m for m in members if m is not None]
    return ClockChain(present) if present else None


def chain_preemption(members: Members[PreemptionPolicy | None]) -> PreemptionPolicy | None:
    present = [m for m in members if m is not None]
    return None if not present else present[0] if len(present) == 1 else PreemptionChain(present)
