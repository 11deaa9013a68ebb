"""M's profiler on the real engine: a two-run sweep of the tiny offline model (no Ray)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.tiny_model_fixture import loop, require_vllm, running_engine, tiny_model  # noqa: F401 (fixtures)
from wattwise.tiny_model import tiny_engine_config

require_vllm()

from engines.ips_profiling_vllm import measure_ips
from engines.vllm_engine import VllmEngine


@pytest.fixture(scope="module")
def engine(tiny_model: Path, loop: asyncio.AbstractEventLoop) -> Iterator[VllmEngine]:
    yield from running_engine(loop, tiny_engine_config(tiny_model))


def test_sweep_gives_decode_rows_per_run(engine: VllmEngine, loop) -> None:
    profile = loop.run_until_complete(measure_ips(engine, batch_sizes=(1, 8), repeats=1, sample_s=0.25))
    s = profile.samples
    assert len(s) >= 2 and set(profile.runs) == {0, 1}
    assert np.all(s.tp == 1) and len(np.unique(s.clock_mhz)) == 1  # no clock control on CPU: one value
    assert np.all(s.ips > 0) and np.all(s.kv_blocks > 0)
    assert s.batch[profile.runs == 0].max() <= 1 < s.batch[profile.runs == 1].max() <= 8
    assert not engine.tracker.step_observers  # the sweep's observer is gone after it
