"""The replica's admission gate: FCFS or TTFT-deadline order, a run-time limit, and Chiron's
urgent-first order."""

from __future__ import annotations

import asyncio

from engines.admission_gate import AdmissionGate


async def _enter(gate: AdmissionGate, name: str, order: list[str], release: asyncio.Event, **kw) -> None:
    async with gate.slot(**kw):
        order.append(name)
        await release.wait()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def _admit_in_order(gate: AdmissionGate, arrivals: list[tuple[str, dict]]) -> list[str]:
    """Fill the gate with one holder, queue `arrivals` in turn, then release them one by one."""

    async def run() -> list[str]:
        order: list[str] = []
        releases = {name: asyncio.Event() for name, _ in [("holder", {}), *arrivals]}
        tasks = [asyncio.ensure_future(_enter(gate, "holder", order, releases["holder"]))]
        await _settle()
        for name, kw in arrivals:
            tasks.append(asyncio.ensure_future(_enter(gate, name, order, releases[name], **kw)))
            await _settle()
        assert gate.active == gate.limit and gate.waiting == len(arrivals)
        for _ in tasks:  # release whoever is inside: the next waiter gets the place
            for name in order:
                releases[name].set()
            await _settle()
        await asyncio.gather(*tasks)
        assert gate.active == 0 and gate.waiting == 0
        return order[1:]

    return asyncio.run(run())


def test_fcfs_without_priorities() -> None:
    order = _admit_in_order(AdmissionGate(1), [("a", {}), ("b", {}), ("c", {})])
    assert order == ["a", "b", "c"]


def test_urgent_waiters_go_first_fcfs_among_themselves() -> None:
    arrivals = [("b1", {}), ("i1", {"urgent": True}), ("b2", {}), ("i2", {"urgent": True})]
    assert _admit_in_order(AdmissionGate(1), arrivals) == ["i1", "i2", "b1", "b2"]


def test_a_requeued_request_waits_first_among_non_urgent_ones() -> None:
    arrivals = [("b1", {}), ("b2", {}), ("resumed", {"requeue": True}), ("i1", {"urgent": True})]
    assert _admit_in_order(AdmissionGate(1), arrivals) == ["i1", "resumed", "b1", "b2"]


def test_by_deadline_each_group_waits_earliest_ttft_deadline_first_and_a_requeued_one_keeps_the_front() -> None:
    arrivals = [("b-late", {"due_s": 90.0}), ("b-soon", {"due_s": 10.0}), ("resumed", {"requeue": True, "due_s": 5.0}),
                ("b-mid", {"due_s": 50.0}), ("i-late", {"urgent": True, "due_s": 3.0}),
                ("i-soon", {"urgent": True, "due_s": 1.0}), ("b-first", {"due_s": 1.0})]
    assert _admit_in_order(AdmissionGate(1, by_deadline=True, clock=lambda: 0.0), arrivals) == [
        "i-soon", "i-late", "resumed", "b-first", "b-soon", "b-mid", "b-late"]
    # Without it, the same arrivals wait FCFS in their groups (the due times are ignored).
    assert _admit_in_order(AdmissionGate(1), arrivals) == [
        "i-late", "i-soon", "resumed", "b-late", "b-soon", "b-mid", "b-first"]


def test_by_deadline_a_waiter_past_its_deadline_goes_behind_those_still_on_time() -> None:
    """The batcher's rule (batching.deadline_order): it has missed its TTFT whatever runs next.
    Late ones keep deadline order among themselves; a requeued one keeps the front."""
    now = [0.0]
    gate = AdmissionGate(1, by_deadline=True, clock=lambda: now[0])
    arrivals = [("due-1", {"due_s": 1.0}), ("due-2", {"due_s": 2.0}), ("due-4", {"due_s": 4.0}),
                ("resumed", {"requeue": True, "due_s": 0.5})]

    async def run() -> list[str]:
        order: list[str] = []
        release = asyncio.Event()
        holder = asyncio.ensure_future(_enter(gate, "holder", order, release))
        await _settle()
        tasks = [asyncio.ensure_future(_enter(gate, name, order, asyncio.Event(), **kw)) for name, kw in arrivals]
        await _settle()
        now[0] = 3.0  # due-1 and due-2 are late by the time a place frees
        gate.set_limit(4)
        await _settle()
        release.set()
        await holder
        for t in tasks:
            t.cancel()
        return order[1:]

    assert asyncio.run(run()) == ["resumed", "due-4", "due-1", "due-2"]


def test_cancelled_waiter_holds_no_place_and_limit_changes_admit() -> None:
    async def run() -> None:
        gate = AdmissionGate(1)
        order: list[str] = []
        hold = asyncio.Event()
        holder = asyncio.ensure_future(_enter(gate, "holder", order, hold))
        await _settle()
        assert gate.would_wait
        urgent = asyncio.ensure_future(_enter(gate, "gone", order, hold, urgent=True))
        batch = asyncio.ensure_future(_enter(gate, "batch", order, hold))
        await _settle()
        assert (gate.waiting, gate.urgent_waiting) == (2, 1)
        urgent.cancel()
        await _settle()
        assert (gate.waiting, gate.urgent_waiting) == (1, 0)
        gate.set_limit(2)  # a higher limit admits the next waiter at once
        await _settle()
        assert order == ["holder", "batch"] and gate.active == 2 and not gate.waiting
        hold.set()
        await asyncio.gather(holder, batch)
        assert gate.active == 0 and not gate.would_wait

    asyncio.run(run())


def test_a_refusing_rule_holds_the_head_and_everyone_behind_until_retried() -> None:
    """The admission chain at the gate: a place is free, but the rule refuses the head
    waiter, so it and those behind it wait; after the rule's inputs change, `retry`
    admits them in order, and a request leaving asks the rule again too."""
    allowed = {"a"}
    gate = AdmissionGate(4, admits=lambda name: name in allowed)

    async def run() -> tuple[list[str], list[str], list[str], int]:
        order: list[str] = []
        release = asyncio.Event()
        tasks = [asyncio.ensure_future(_enter(gate, n, order, release, candidate=n)) for n in ("a", "b", "c")]
        await _settle()
        first = list(order)
        allowed.update({"b"})  # "c" still refused: it waits, though a place is free
        gate.retry()
        await _settle()
        second = list(order)
        allowed.add("c")
        release.set()  # "a" and "b" leave: their release asks the rule again
        await asyncio.gather(*tasks)
        return first, second, order, gate.refused

    first, second, order, refused = asyncio.run(run())
    assert first == ["a"] and second == ["a", "b"] and order == ["a", "b", "c"]
    assert refused >= 2 and gate.active == 0 and gate.waiting == 0


def test_an_urgent_waiter_the_rule_refuses_asks_for_room_and_a_plain_one_does_not() -> None:
    """On a mixed replica the engine preempts a batch request for an interactive one the
    admission rule refuses (`on_urgent_refused`), as the batcher does; a batch waiter the
    rule refuses just waits. Asked when the refusal queues it and at each retry it stays
    refused, until the rule admits it."""
    allowed: set[str] = set()
    asked: list[int] = []
    gate = AdmissionGate(4, admits=lambda name: name in allowed, on_urgent_refused=lambda: asked.append(gate.waiting))

    async def run() -> tuple[list[str], list[int], list[str], list[int]]:
        order: list[str] = []
        release = asyncio.Event()
        release.set()
        batch = asyncio.ensure_future(_enter(gate, "b", order, release, candidate="b"))
        await _settle()
        after_batch = list(asked)
        urgent = asyncio.ensure_future(_enter(gate, "i", order, release, urgent=True, candidate="i"))
        await _settle()
        gate.retry()  # the batch waiter "b" is at the head of its queue, "i" ahead of it
        await _settle()
        refused_twice = list(asked)
        allowed.update({"i", "b"})
        gate.retry()
        await asyncio.gather(batch, urgent)
        return after_batch, refused_twice, order, asked

    after_batch, refused_twice, order, asked_all = asyncio.run(run())
    assert after_batch == []  # a batch request refused asks for nothing
    assert refused_twice == [2, 2]  # queued, then refused again at the retry
    assert order == ["i", "b"] and asked_all == [2, 2]
    assert gate.active == 0 and gate.waiting == 0
