"""A replica's stream (deployments.replica.LLMReplica.generate) ends cleanly whichever task
closes it: an orphaned stream is closed by its supersession or the loop's shutdown, not by
the task that consumed it."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from core.request import Request
from core.slo import SLO
from deployments.messages import ReplicaChunk
from deployments.replica import LLMReplica, ReplicaIdentity
from engines.modelled_engine import ModelledEngine
from engines.modelled_engine_config import ModelledEngineConfig


def test_a_stream_closed_from_another_task_ends_without_a_context_error(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> ReplicaChunk:
        replica = LLMReplica("pool-short", ModelledEngine(ModelledEngineConfig()), ReplicaIdentity("app", "d", "r0"))
        stream = replica.generate(Request("r1", 16, 200, time.time(), SLO(ttft_s=5.0, tbt_s=0.5)))
        first = await asyncio.create_task(anext(stream))  # consumed in a task that then ends
        await stream.aclose()  # closed here, in another context
        assert isinstance(first, ReplicaChunk)
        return first

    with caplog.at_level(logging.ERROR):
        first = asyncio.run(scenario())
    assert first.finish_reason is None  # closed mid-stream
    assert not [r for r in caplog.records if "detach" in r.getMessage()]
