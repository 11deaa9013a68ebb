"""GPUs left as found: a lease per locked GPU, renewed by its replica; a lapsed lease, a
released one and an actor's start each put GPUs back at the driver's default clocks
(energy.leased_clocks), against the fake NVML."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from energy.clock_governor import ClockGovernor
from energy.gpu_control import NvmlGpu
from energy.leased_clocks import BEFORE_START, LeasedClocks
from tests.fake_nvml import FakeNvml

LEASE_S = 10.0


def _keeper(nvml: FakeNvml, now_s: float = 0.0) -> LeasedClocks:
    return LeasedClocks(ClockGovernor(NvmlGpu(nvml), min_interval_s=0.0), LEASE_S, now_s)


def test_a_lease_that_lapses_resets_its_gpu_and_renewals_keep_it() -> None:
    nvml = FakeNvml(count=2)
    keeper = _keeper(nvml)
    keeper.set_clock("replica-a", [0, 1], 1200, now_s=1.0)
    for t in (4.0, 8.0, 12.0):  # renewed by each forward: held
        keeper.set_clock("replica-a", [0, 1], 1200, now_s=t)
        assert keeper.expire(t + 1.0) == []
    assert nvml.locked() == {0: 1200, 1: 1200}
    # replica-a died after its renewal at 12 s: nothing happens before its lease lapses...
    assert keeper.expire(12.0 + LEASE_S - 0.1) == [] and nvml.locked() == {0: 1200, 1: 1200}
    # ...and then both its GPUs are back at the driver's default
    assert keeper.expire(12.0 + LEASE_S) == [0, 1]
    assert nvml.locked() == {} and keeper.holders() == {}


def test_a_replica_that_stops_releases_only_its_own_gpus_at_once() -> None:
    nvml = FakeNvml(count=2)
    keeper = _keeper(nvml)
    keeper.set_clock("replica-a", [0], 1200, now_s=1.0)
    keeper.set_clock("replica-b", [1], 990, now_s=1.0)
    assert keeper.release("replica-a", now_s=2.0) == [0]
    assert nvml.locked() == {1: 990} and keeper.holders() == {1: "replica-b"}


def test_a_gpu_given_to_a_new_replica_is_not_reset_when_its_last_holders_lease_would_lapse() -> None:
    nvml = FakeNvml(count=1)
    keeper = _keeper(nvml)
    keeper.set_clock("killed", [0], 1200, now_s=1.0)
    keeper.set_clock("replacement", [0], 1600, now_s=5.0)  # Ray gave the GPU to a new replica
    assert keeper.expire(1.0 + LEASE_S) == [] and keeper.release("killed", now_s=11.5) == []
    assert nvml.locked() == {0: 1600}


def test_on_start_gpus_no_live_replica_claims_are_reset_after_one_lease() -> None:
    """A restarted actor finds GPU 1 locked by a replica that died with the old actor, and
    GPU 0 by one still serving: the live one's next forward claims GPU 0 and keeps its clock;
    GPU 1, unclaimed, goes back to default once the start's lease lapses."""
    nvml = FakeNvml(count=2)
    nvml.lock_outside(0, 1200)
    nvml.lock_outside(1, 990)
    keeper = _keeper(nvml, now_s=100.0)
    assert keeper.holders() == {0: BEFORE_START, 1: BEFORE_START}
    keeper.set_clock("live", [0], 1200, now_s=100.3)
    assert keeper.expire(100.0 + LEASE_S - 0.1) == []
    assert keeper.expire(100.0 + LEASE_S) == [1]
    assert nvml.locked() == {0: 1200} and keeper.holders() == {0: "live"}


def test_a_node_whose_gpus_cannot_be_counted_resets_none_at_start() -> None:
    nvml = FakeNvml(count=2, fail=frozenset({"nvmlDeviceGetCount"}))
    keeper = _keeper(nvml)
    assert keeper.holders() == {} and keeper.expire(LEASE_S) == []


def test_each_reset_records_why_and_whose() -> None:
    nvml = FakeNvml(count=2)
    keeper = _keeper(nvml)
    keeper.set_clock("a", [0], 1200, now_s=1.0)
    keeper.release("a", now_s=2.0)
    keeper.expire(LEASE_S)  # GPU 1: nobody claimed it since the start
    notes = [c.note for c in keeper.governor.history if c.note.startswith("reset")]
    assert notes == ["reset to default (released by a)", f"reset to default (lease lapsed by {BEFORE_START})"]


def test_a_replicas_gpus_are_locked_at_once_and_each_gpus_calls_one_at_a_time() -> None:
    """NVML takes 50-200 ms a lock: a TP8 replica's change must not cost eight of them in a
    row, and two calls on one GPU must not interleave (the fake counts calls in flight)."""
    nvml = FakeNvml(count=8, lock_latency_s=0.05)
    with ThreadPoolExecutor(8) as pool:
        keeper = LeasedClocks(ClockGovernor(NvmlGpu(nvml), min_interval_s=0.0), LEASE_S, 0.0, each_gpu=pool.map)
        assert keeper.set_clock("tp8", range(8), 1200, now_s=1.0) == [1200] * 8
        assert nvml.most_locks_at_once == 8
        one_gpu = FakeNvml(count=1, lock_latency_s=0.05)
        keeper = LeasedClocks(ClockGovernor(NvmlGpu(one_gpu), min_interval_s=0.0), LEASE_S, 0.0, each_gpu=pool.map)
        list(pool.map(lambda clock: keeper.set_clock("a", [0], clock, now_s=1.0), [800, 990, 1200, 1600]))
        assert one_gpu.most_locks_at_once == 1
