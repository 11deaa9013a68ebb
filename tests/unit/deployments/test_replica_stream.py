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


def test_a_resumed_stream_stops_its_orphan_whichever_task_drives_it() -> None:
    """The gateway resumed a request whose first caller died: the orphan, pulled last by a task
    other than the one that began it, is stopped and its request id freed for the new stream."""
    async def scenario() -> tuple[bool, int]:
        replica = LLMReplica("pool-short", ModelledEngine(ModelledEngineConfig()), ReplicaIdentity("app", "d", "r0"))
        request = Request("r1", 16, 200, time.time(), SLO(ttft_s=5.0, tbt_s=0.5))
        orphan = replica.generate(request)
        await asyncio.create_task(anext(orphan))  # begun by a task that has ended
        await asyncio.create_task(anext(orphan))  # pulled by another
        driver = asyncio.create_task(anext(orphan))  # and now by a third, mid-await
        await asyncio.sleep(0)
        chunks = [chunk async for chunk in replica.generate(request)]
        await asyncio.gather(driver, return_exceptions=True)
        final = chunks[-1]
        assert isinstance(final, ReplicaChunk) and final.usage is not None
        return driver.cancelled(), final.usage.completion_tokens

    orphan_cancelled, tokens = asyncio.run(scenario())
    assert orphan_cancelled and tokens == 200
