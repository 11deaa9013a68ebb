"""throttLL'eM's scoreboard projection (eqs. 1-2) against the batcher stepping the same batch."""

import numpy as np
import pytest

from autoscaling.throttllem.scoreboard import Scoreboard
from batching.continuous_batcher import BatcherConfig, ContinuousBatcher
from core.request import Request
from core.slo import SLO
from energy.calibration import default_perf_model

SLO_ANY = SLO(ttft_s=60, tbt_s=1)


def test_projection_matches_step_by_step_batcher():
    rng = np.random.default_rng(3)
    batcher = ContinuousBatcher(default_perf_model(), BatcherConfig(tensor_parallel=8))
    prompts, outputs = rng.integers(1, 300, 40), rng.integers(1, 120, 40)
    for i, (p, o) in enumerate(zip(prompts, outputs)):
        batcher.add(Request(str(i), int(p), int(o), 0.0, SLO_ANY, target_output_tokens=int(o)), 0.0)
    # Every prompt fits the first step's token budget: all are scheduled at iteration 0.
    board = Scoreboard(batcher.config.block_size)
    board.reset([str(i) for i in range(40)], np.zeros(40, dtype=np.int64), prompts, outputs, np.zeros(40),
                np.zeros(40), np.zeros(40, dtype=bool))
    projection = board.project(0)
    t, actual_batch, actual_kv = 0.0, [], []
    while batcher.has_work():
        step = batcher.plan_step(t)
        actual_batch.append(len(batcher.running))
        actual_kv.append(batcher.kv_blocks_used)
        t = batcher.finish_step(step).end_s
    assert len(projection.batch) == len(actual_batch) == outputs.max()
    np.testing.assert_array_equal(projection.batch, actual_batch)
    np.testing.assert_array_equal(projection.kv_blocks, actual_kv)


def test_projection_from_a_later_iteration_counts_generated_tokens():
    board = Scoreboard(block_size=4)
    # Scheduled at iteration 2 with a 5-token prompt and 6 outputs; now at iteration 5 it
    # has generated 3 tokens and writes the 4th: ceil((5 + 3 + 1) / 4) = 3 blocks.
    board.reset(["a"], np.array([2]), np.array([5]), np.array([6]), np.zeros(1), np.zeros(1), np.zeros(1, dtype=bool))
    p = board.project(5)
    np.testing.assert_array_equal(p.batch, [1, 1, 1])
    np.testing.assert_array_equal(p.kv_blocks, [3, 3, 3])
    np.testing.assert_array_equal(p.remaining, [3])


def test_virtual_insert_commit_and_rollback():
    board = Scoreboard(block_size=16)
    board.reset(["a"], np.array([0]), np.array([10]), np.array([5]), np.array([9.0]), np.zeros(1),
                np.zeros(1, dtype=bool))
    before = board.project(0)
    board.insert_virtual("b", 0, 40, 8, 5.0, 0.0)
    assert len(board.project(0).batch) == 8
    board.rollback()
    after = board.project(0)
    np.testing.assert_array_equal(before.kv_blocks, after.kv_blocks)
    assert board.ids == ["a"]
    board.insert_virtual("b", 0, 40, 8, 5.0, 0.0)
    board.commit(lost=True)
    assert board.ids == ["a", "b"] and board.lost.tolist() == [False, True]
    with pytest.raises(RuntimeError):
        board.rollback()



def test_a_projection_is_kept_until_the_entries_change():
    """The "lost" check, admission and the clock search ask for the step's projection in turn:
    one object until an entry is added or removed or the iteration moves (a deadline or a
    "lost" mark does not move B or KV)."""
    board = Scoreboard(block_size=16)
    board.reset(["a"], np.array([0]), np.array([10]), np.array([5]), np.array([9.0]), np.zeros(1),
                np.zeros(1, dtype=bool))
    first = board.project(0)
    board.deadline_s[0], board.lost[0] = 1.0, True
    assert board.project(0) is first
    assert len(board.project(1).batch) == 4 and len(board.project(0).batch) == 5
    board.insert_virtual("b", 0, 40, 8, 5.0, 0.0)
    with_b = board.project(0)
    assert with_b.batch.tolist()[:5] == [2] * 5 and len(with_b.batch) == 8
    board.commit()
    assert board.project(0) is with_b  # committing keeps the entries projected
    board.reset(["c"], np.array([0]), np.array([10]), np.array([3]), np.array([9.0]), np.zeros(1),
                np.zeros(1, dtype=bool))
    assert board.project(0).batch.tolist() == [1, 1, 1]
    board.insert_virtual("d", 0, 10, 2, 5.0, 0.0)
    board.project(0)
    board.rollback()
    assert board.project(0).batch.tolist() == [1, 1, 1]


def test_a_decode_step_moves_the_kept_projection_by_one_iteration():
    """Re-read with the same entries one iteration on, the scoreboard moves its last projection
    instead of projecting again: equal to a fresh projection at every iteration, through an
    entry's end (where it projects again) and block boundaries."""
    entries = (["a", "b", "c"], np.array([0, -3, 2]), np.array([30, 15, 47]), np.array([9, 40, 21]))

    def fresh(now_iter: int):
        board = Scoreboard(block_size=16)
        board.reset(*entries, np.zeros(3), np.zeros(3), np.zeros(3, dtype=bool))
        return board.project(now_iter)

    kept = Scoreboard(block_size=16)
    moved, could_move, last = 0, 0, None
    for now_iter in range(0, 45):
        kept.reset(*[e.copy() if isinstance(e, np.ndarray) else list(e) for e in entries],
                   np.zeros(3), np.zeros(3), np.zeros(3, dtype=bool))
        got = kept.project(now_iter)
        if last is not None and int(last.remaining.min()) > 1:
            could_move += 1
            moved += np.shares_memory(got.batch, last.batch)
        want = fresh(now_iter)
        for name in ("batch", "kv_blocks", "remaining"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
        last = got
    assert moved == could_move == 8  # until "a" ends; then every step projects again

def _projector_on_a_batch(ids: list[str]):
    from autoscaling.throttllem.config import ThrottllemConfig, ThrottllemTuning
    from autoscaling.throttllem.replica_policies import replica_policies

    perf, config = default_perf_model(), BatcherConfig(tensor_parallel=8)
    admission, _ = replica_policies(perf, config, ThrottllemConfig(tuning=ThrottllemTuning(correction_alpha=0.2)))
    batcher = ContinuousBatcher(perf, config)
    for rid in ids:
        batcher.add(Request(rid, 20, 500, 0.0, SLO_ANY), 0.0)
    batcher.finish_step(batcher.plan_step(0.0))  # all running
    return admission.projector, batcher


def _predicted_step_s(projector) -> float:
    step = projector.project()
    at = projector.table.lookup(step.batch[:1], step.kv_blocks[:1])
    return float(projector.table.iteration_s(len(projector.table.clocks_mhz) - 1, at)[0])  # max clock


def test_online_correction_learns_how_much_slower_steps_run_than_m_predicts():
    """Prefills M does not model make real steps slower: the correction follows the ratio
    and shrinks the share of each target projections may use by as much."""
    projector, batcher = _projector_on_a_batch([f"r{i}" for i in range(8)])
    t = 0.0
    projector.sync(batcher, t)
    for _ in range(40):
        t += 2.0 * _predicted_step_s(projector)
        projector.sync(batcher, t)
    assert projector.correction == pytest.approx(2.0, rel=0.02)
    assert projector.headroom == pytest.approx(projector.config.tuning.slo_headroom / 2.0, rel=0.02)
    # Time between steps that no request ran through is idle time: not learnt.
    before = projector.correction
    batcher.running = []  # the batch finished; the replica idles
    projector.sync(batcher, t + 100.0)
    _, other = _projector_on_a_batch(["other"])
    batcher.running = other.running  # a new request starts after the gap
    projector.sync(batcher, t + 200.0)
    assert projector.correction == before


def test_current_iteration_equals_the_projections_first_entry():
    """The per-step correction of M reads only the current iteration: the O(n) shortcut
    must agree with the full projection, and the kept projection (fresh or moved one
    iteration on) with the O(n) sum."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 40))
        now = int(rng.integers(100, 1000))
        generated = rng.integers(0, 300, n)
        entries = ([str(i) for i in range(n)], now - generated, rng.integers(1, 4000, n),
                   generated + rng.integers(1, 500, n), np.zeros(n), np.zeros(n), np.zeros(n, dtype=bool))
        board, plain = Scoreboard(16), Scoreboard(16)
        board.reset(*entries)
        plain.reset(*entries)
        summed = board.current(now)  # no projection kept yet: the O(n) sum
        projection = board.project(now)
        assert summed == (int(projection.batch[0]), int(projection.kv_blocks[0])) == board.current(now)
        board.project(now + 1)  # moved one iteration on where no entry ends now
        assert board.current(now + 1) == plain.current(now + 1)


def test_a_moved_projection_reads_the_iteration_times_of_a_fresh_one():
    """The projector moves its lookup in M (and the iteration times it read at each clock) with
    a projection that moved one iteration on: the clock searches must read what a fresh lookup
    of the same projection reads, element for element, and a new entry must look up afresh."""
    projector, batcher = _projector_on_a_batch([f"r{i}" for i in range(6)])
    projector.sync(batcher, 0.0)
    table, top = projector.synced_table, len(projector.synced_table.clocks_mhz) - 1
    t, moved = 0.0, 0
    for _ in range(30):
        projector.sync(batcher, t)
        projection = projector.project()
        at = projector.lookup(projection)
        moved += projection.offset > 0
        fresh = table.lookup(projection.batch, projection.kv_blocks)
        for clock in (0, top // 2, top):
            np.testing.assert_array_equal(table.iteration_s(clock, at), table.iteration_s(clock, fresh))
        batcher.finish_step(batcher.plan_step(t))
        t += 0.05
    assert moved > 20  # the same entries decoded: each step moved the last projection
    projector.scoreboard.insert_virtual("new", projector.now_iter, 3000, 200, 1e9, 0.0)
    grown = projector.project()
    assert grown.offset == 0
    np.testing.assert_array_equal(table.iteration_s(top, projector.lookup(grown)),
                                  table.iteration_s(top, table.lookup(grown.batch, grown.kv_blocks)))
    projector.scoreboard.rollback()


def test_one_iteration_in_scalars_is_the_vector_lookups_to_the_bit():
    projector, batcher = _projector_on_a_batch(["a"])
    projector.sync(batcher, 0.0)
    table = projector.synced_table
    rng = np.random.default_rng(2)
    batch, kv = rng.integers(0, 600, 300), rng.integers(0, 200_000, 300)  # past the grid's ends too
    at = table.lookup(batch, kv)
    for clock in (0, len(table.clocks_mhz) - 1):
        vector = table.iteration_s(clock, at)
        assert [table.one_iteration_s(clock, int(b), int(k)) for b, k in zip(batch, kv)] == vector.tolist()
