"""throttLL'eM's scoreboard projection (eqs. 1-2) against the batcher stepping the same batch."""

import numpy as np
import pytest

from autoscaling.throttllem.scoreboard import Scoreboard
from core.request import Request
from core.slo import SLO
from energy.calibration import default_perf_model
from engines.batching import BatcherConfig, ContinuousBatcher

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
                np.zeros(40, dtype=bool))
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
    board.reset(["a"], np.array([2]), np.array([5]), np.array([6]), np.zeros(1), np.zeros(1, dtype=bool))
    p = board.project(5)
    np.testing.assert_array_equal(p.batch, [1, 1, 1])
    np.testing.assert_array_equal(p.kv_blocks, [3, 3, 3])
    np.testing.assert_array_equal(p.remaining, [3])


def test_virtual_insert_commit_and_rollback():
    board = Scoreboard(block_size=16)
    board.reset(["a"], np.array([0]), np.array([10]), np.array([5]), np.array([9.0]), np.zeros(1, dtype=bool))
    before = board.project(0)
    board.insert_virtual("b", 0, 40, 8, 5.0)
    assert len(board.project(0).batch) == 8
    board.rollback()
    after = board.project(0)
    np.testing.assert_array_equal(before.kv_blocks, after.kv_blocks)
    assert board.ids == ["a"]
    board.insert_virtual("b", 0, 40, 8, 5.0)
    board.commit(lost=True)
    assert board.ids == ["a", "b"] and board.lost.tolist() == [False, True]
    with pytest.raises(RuntimeError):
        board.rollback()
