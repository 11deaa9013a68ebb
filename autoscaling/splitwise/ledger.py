"""Pending tokens per replica as the cluster-level scheduler believes them.

Replicas report their queues now and then (Splitwise §IV-A: not every iteration), so
between reports the scheduler adds its own reservations: without them a burst sees
the same stale minimum and herds onto one replica. A reservation lasts until its work
lands in the replica (after which the replica's next report counts it).
"""

from __future__ import annotations

import itertools


class PendingTokenLedger:
    def __init__(self) -> None:
        self._reported: dict[int, int] = {}
        self._reserved: dict[int, dict[int, int]] = {}  # replica -> ticket -> tokens
        self._owner: dict[int, int] = {}  # ticket -> replica
        self._tickets = itertools.count()

    def add_replica(self, replica_id: int) -> None:
        self._reported.setdefault(replica_id, 0)
        self._reserved.setdefault(replica_id, {})

    def remove_replica(self, replica_id: int) -> None:
        self._reported.pop(replica_id, None)
        for ticket in self._reserved.pop(replica_id, {}):
            del self._owner[ticket]

    def report(self, replica_id: int, pending_tokens: int) -> None:
        self._reported[replica_id] = pending_tokens

    def reserve(self, replica_id: int, tokens: int) -> int:
        ticket = next(self._tickets)
        self._reserved[replica_id][ticket] = tokens
        self._owner[ticket] = replica_id
        return ticket

    def land(self, ticket: int) -> None:
        """The reserved work reached its replica: its reports count it from now on."""
        replica_id = self._owner.pop(ticket, None)
        if replica_id is not None:
            del self._reserved[replica_id][ticket]

    def pending_tokens(self, replica_id: int) -> int:
        return self._reported[replica_id] + sum(self._reserved[replica_id].values())
