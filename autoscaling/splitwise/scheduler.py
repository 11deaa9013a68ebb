"""Splitwise's cluster-level scheduler (§IV-A): pools, JSQ routing, mixed pool.

Each request gets a prompt AND a token replica at once (so the KV transfer can start
while the prompt runs), each the one with the fewest pending tokens in its pool. A
pool whose best replica is over its threshold overflows into the mixed pool, then
pulls the least-loaded replica of the opposite pool into the mixed pool. A mixed
replica keeps its home pool and returns to it once no work of the other kind is
outstanding on it; one that stays mixed past `repurpose_after_s` changes home.
A replica whose home is the mixed pool (a deployed mixed pool) stays mixed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from autoscaling.splitwise.config import SplitwiseConfig
from autoscaling.splitwise.ledger import PendingTokenLedger
from core.roles import Phase

PROMPT, TOKEN, MIXED = Phase.PROMPT, Phase.TOKEN, Phase.MIXED


def opposite(phase: Phase) -> Phase:
    return TOKEN if phase is PROMPT else PROMPT


@dataclass(frozen=True)
class Placement:
    replica_id: int
    ticket: int  # the ledger reservation; land it when the work reaches the replica


@dataclass(frozen=True)
class Assignment:
    prompt: Placement
    token: Placement


class SplitwiseScheduler:
    def __init__(self, config: SplitwiseConfig = SplitwiseConfig()) -> None:
        self.config = config
        self.ledger = PendingTokenLedger()
        self.home: dict[int, Phase] = {}
        self.role: dict[int, Phase] = {}
        self.mixed_since_s: dict[int, float] = {}
        self.outstanding: Counter[tuple[int, Phase]] = Counter()
        self.repurposed = 0
        self.pulled_into_mixed = 0

    def add_replica(self, replica_id: int, home: Phase) -> None:
        self.home[replica_id] = self.role[replica_id] = home
        self.ledger.add_replica(replica_id)

    def remove_replica(self, replica_id: int) -> None:
        for table in (self.home, self.role, self.mixed_since_s):
            table.pop(replica_id, None)
        self.ledger.remove_replica(replica_id)

    def _threshold(self, phase: Phase) -> int:
        c = self.config
        return c.prompt_queue_threshold_tokens if phase is PROMPT else c.token_queue_threshold_tokens

    def _least_loaded(self, role: Phase) -> int | None:
        members = [r for r, got in self.role.items() if got is role]
        return min(members, key=lambda r: (self.ledger.pending_tokens(r), r), default=None)

    def _pick(self, phase: Phase, now_s: float) -> int:
        threshold = self._threshold(phase)
        fallback = None
        for role in (phase, MIXED):
            best = self._least_loaded(role)
            if best is not None and self.ledger.pending_tokens(best) <= threshold:
                return best
            if best is not None and (fallback is None
                                     or self.ledger.pending_tokens(best) < self.ledger.pending_tokens(fallback)):
                fallback = best
        lender = opposite(phase)
        # A pool keeps its last replicas, unless no replica can run the phase at all (its
        # pool lost with its machines): one borrowed replica serves, none refuses everything.
        lendable = fallback is None or sum(1 for r in self.role.values() if r is lender) > self.config.min_home_replicas
        pulled = self._least_loaded(lender) if lendable else None
        if pulled is not None:
            self.role[pulled] = MIXED
            self.mixed_since_s[pulled] = now_s
            self.pulled_into_mixed += 1
            return pulled
        if fallback is None:
            raise RuntimeError(f"no replica can run the {phase.value} phase")
        return fallback

    def _place(self, phase: Phase, tokens: int, now_s: float) -> Placement:
        replica = self._pick(phase, now_s)
        self.outstanding[(replica, phase)] += 1
        return Placement(replica, self.ledger.reserve(replica, tokens))

    def assign(self, prompt_tokens: int, output_tokens: int, now_s: float) -> Assignment:
        """Both replicas of a request, each reserved for its phase's pending tokens."""
        return Assignment(self._place(PROMPT, prompt_tokens, now_s), self._place(TOKEN, output_tokens, now_s))

    def finished(self, replica_id: int, phase: Phase) -> None:
        """A phase assigned to `replica_id` completed (or will never run there)."""
        self.outstanding[(replica_id, phase)] -= 1

    def rebalance(self, now_s: float) -> None:
        """Mixed replicas go home when drained of the other kind; long-mixed ones change home."""
        for replica, role in list(self.role.items()):
            if role is not MIXED:
                continue
            home = self.home[replica]
            if home is MIXED:
                continue
            if self.outstanding[(replica, opposite(home))] <= 0:
                self.role[replica] = home
                del self.mixed_since_s[replica]
            elif now_s - self.mixed_since_s[replica] >= self.config.repurpose_after_s:
                self.home[replica] = opposite(home)
                self.mixed_since_s[replica] = now_s
                self.repurposed += 1
