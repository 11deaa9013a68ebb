"""throttLL'eM's M learnt online from an engine's own steps (autoscaling.throttllem.online_ips):
the profile's until steps come, then the engine's speed everywhere and each visited cell's
own, monotone as the clock search needs; and admission decides with it."""

from __future__ import annotations

import numpy as np
import pytest

from autoscaling.throttllem.config import ThrottllemConfig, ThrottllemTuning
from autoscaling.throttllem.online_ips import OnlineIpsTable
from autoscaling.throttllem.replica_policies import learnt_ips_table, replica_policies
from batching.continuous_batcher import BatcherConfig, ContinuousBatcher
from core.request import Request
from core.slo import SLO
from energy.calibration import default_perf_model

PERF = default_perf_model("llama2-70b", "h100-80gb")
TP, BATCH_MAX = 2, 64
KV_BLOCKS = PERF.kv_capacity_tokens(TP) // 16
CONFIG = ThrottllemConfig(tuning=ThrottllemTuning(learn_refresh_steps=10))


def _learnt() -> OnlineIpsTable:
    return learnt_ips_table(CONFIG, TP, BATCH_MAX, KV_BLOCKS)


def _steps(learnt: OnlineIpsTable, slowdown: float, batch: int, kv_blocks: int, clock: int, n: int) -> None:
    table = learnt.profile
    for _ in range(n):
        learnt.observe(batch, kv_blocks, table.clocks_mhz[clock], slowdown * table.one_iteration_s(clock, batch,
                                                                                                    kv_blocks))


def test_the_profile_holds_until_the_engine_has_run_enough_steps() -> None:
    learnt = _learnt()
    assert learnt.table is learnt.profile and learnt.speed_ratio == 1.0
    _steps(learnt, 2.0, batch=8, kv_blocks=2000, clock=-1, n=CONFIG.tuning.learn_refresh_steps - 1)
    assert learnt.table is learnt.profile  # rebuilt every learn_refresh_steps
    _steps(learnt, 2.0, batch=8, kv_blocks=2000, clock=-1, n=1)
    assert learnt.table is not learnt.profile and learnt.speed_ratio == pytest.approx(2.0)


def test_an_engine_twice_as_slow_is_twice_as_slow_where_it_never_ran_too() -> None:
    learnt = _learnt()
    _steps(learnt, 2.0, batch=8, kv_blocks=2000, clock=-1, n=CONFIG.tuning.learn_refresh_steps)
    profile, table = learnt.profile, learnt.table
    for clock, batch, kv_blocks in ((-1, 8, 2000), (0, 40, 9000), (len(profile.clocks_mhz) // 2, 2, 100)):
        assert table.one_iteration_s(clock, batch, kv_blocks) == pytest.approx(
            2.0 * profile.one_iteration_s(clock, batch, kv_blocks), rel=0.02)


def test_a_cell_the_engine_ran_in_often_follows_its_own_steps() -> None:
    learnt = _learnt()
    _steps(learnt, 1.0, batch=2, kv_blocks=100, clock=-1, n=200)  # mostly as profiled...
    _steps(learnt, 3.0, batch=40, kv_blocks=9000, clock=-1, n=200)  # ...but large batches 3x slower
    profile, table = learnt.profile, learnt.table
    assert table.one_iteration_s(-1, 40, 9000) > 2.5 * profile.one_iteration_s(-1, 40, 9000)
    assert table.one_iteration_s(-1, 2, 100) < 1.2 * profile.one_iteration_s(-1, 2, 100)


def test_the_learnt_table_stays_monotone_in_the_clock_for_its_searches() -> None:
    learnt = _learnt()
    _steps(learnt, 0.2, batch=32, kv_blocks=5000, clock=0, n=100)  # an odd fast cell at the lowest clock
    _steps(learnt, 1.5, batch=32, kv_blocks=5000, clock=-1, n=100)
    iter_s, top = learnt.table.iter_s, len(learnt.profile.clocks_mhz) - 1
    assert (np.diff(iter_s, axis=0) <= 0).all()  # a higher clock is never slower
    assert learnt.table.one_iteration_s(0, 32, 5000) >= learnt.table.one_iteration_s(top, 32, 5000)


def _running(n: int) -> list[Request]:
    return [Request(f"r{i}", 500, 400, 0.0, SLO(ttft_s=60, tbt_s=10), predicted_output_tokens=400,
                    target_output_tokens=400) for i in range(n)]


def _admits(learnt: OnlineIpsTable, tbt_s: float) -> bool:
    """Whether throttLL'eM admits a request with TBT target `tbt_s` beside 8 decoding ones."""
    config = BatcherConfig(tensor_parallel=TP, batch_limit=BATCH_MAX)
    admission, _ = replica_policies(PERF, config, CONFIG, learnt)
    batcher = ContinuousBatcher(PERF, config, admission)
    for r in _running(8):
        seq = batcher.add(r, 0.0)
        batcher.waiting.remove(seq)
        seq.prefilled, seq.generated, seq.first_token_s = seq.prefill_target, 5, 0.5
        batcher._grow(seq, r.prompt_tokens + 6)
        batcher.running.append(seq)
    candidate = Request("new", 500, 100, 1.0, SLO(ttft_s=60, tbt_s=tbt_s), predicted_output_tokens=100,
                        target_output_tokens=100)
    return admission.admit(batcher.add(candidate, 1.0), batcher, 1.0)


def test_admission_decides_with_the_model_the_engine_taught() -> None:
    profile = _learnt().profile
    tbt_s = 2.0 * profile.one_iteration_s(len(profile.clocks_mhz) - 1, 9, 9 * 32) / CONFIG.tuning.slo_headroom
    assert _admits(_learnt(), tbt_s)  # as profiled, 9 requests step well inside the target
    slow = _learnt()
    _steps(slow, 4.0, batch=8, kv_blocks=256, clock=-1, n=CONFIG.tuning.learn_refresh_steps)
    assert not _admits(slow, tbt_s)  # this engine is 4x slower: the 9th would break the running ones
