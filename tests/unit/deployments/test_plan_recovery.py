"""The plan and a resumed response's report survive failures (issue 18 items 1 and 4).

The controller re-publishes an unchanged plan (a restarted store gets it back, readers
measure its age); a resume's silence counts against the SLO and the report says it was
resumed. In Ray, tests/ray/test_plan_store.py kills the plan store itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from ray.exceptions import ActorDiedError

from core.request import Request
from core.slo import SLO
from deployments.ingress import _service_report
from deployments.messages import ReplicaChunk
from deployments.plan_store import PlanAge
from deployments.resume import ResumableStream, Resumption
from deployments.serve_adapter import AppAutoscalingPolicy
from engines.protocol import RequestUsage
from tests.factories import autoscaling_context, by_deployment


def _ctx(replicas: int, metrics: dict, now_s: float):
    return autoscaling_context("pool-a", replicas, metrics, total_requests=0.0, now_s=now_s)


class _Call:
    def __init__(self, log: list[tuple[str, tuple]], name: str) -> None:
        self.log, self.name = log, name

    def remote(self, *args: Any) -> Any:
        self.log.append((self.name, args))
        return self

    def future(self) -> Any:
        from concurrent.futures import Future

        done: Future = Future()
        done.set_result({})
        return done


class _FakeStore:
    """Records what the controller sends to the plan store."""

    def __init__(self) -> None:
        self.log: list[tuple[str, tuple]] = []
        self.publish = _Call(self.log, "publish")
        self.overrides_of = _Call(self.log, "overrides_of")
        self.report_load = _Call(self.log, "report_load")

    def publishes(self) -> int:
        return sum(name == "publish" for name, _ in self.log)


def test_an_unchanged_plan_is_republished_every_few_seconds() -> None:
    policy = AppAutoscalingPolicy(policy="utilisation", republish_s=5.0, target_requests_per_replica=1)
    store = policy._store = _FakeStore()
    busy = {"running_requests": 2.0, "kv_blocks_total": 100.0}
    for now in (0.0, 1.0, 2.0, 4.9):
        policy(by_deployment(_ctx(2, busy, now)))
    assert store.publishes() == 1  # unchanged within republish_s: sent once
    policy(by_deployment(_ctx(2, busy, 5.1)))
    assert store.publishes() == 2  # a store restarted meanwhile has the plan again
    assert policy.plan_version == 1  # the same plan, not a new one


def test_the_replicas_work_goes_to_the_store_once_a_second_for_admin_load() -> None:
    policy = AppAutoscalingPolicy(policy="utilisation", target_requests_per_replica=1)
    store = policy._store = _FakeStore()
    busy = {"running_requests": 2.0, "kv_blocks_total": 100.0, "pending_prompt_tokens": 30.0,
            "pending_decode_tokens": 70.0, "tokens_per_s": 12.0, "batch_limit": 8.0, "tensor_parallel": 2.0}
    for now in (0.0, 0.5, 1.0):
        policy(by_deployment(_ctx(2, busy, now)))
    reports = [args[0] for name, args in store.log if name == "report_load"]
    assert [r.at_s for r in reports] == [0.0, 1.0]
    assert (reports[-1].outstanding_tokens, reports[-1].tokens_per_s, reports[-1].running_gpus) == (200.0, 24.0, 4)


def test_the_plan_counts_each_deployments_running_replicas_and_a_new_count_goes_out_at_once() -> None:
    """The ingress overflows only into a pool with a replica running, read from the plan (the
    controller counts them every tick) rather than from Serve's status per request."""
    policy = AppAutoscalingPolicy(policy="utilisation", republish_s=5.0, target_requests_per_replica=1)
    store = policy._store = _FakeStore()
    busy = {"running_requests": 2.0, "kv_blocks_total": 100.0}
    for now, running in ((0.0, 2), (1.0, 2), (2.0, 3)):
        policy(by_deployment(_ctx(running, busy, now)))
    published = [args[0]["running_replicas"] for name, args in store.log if name == "publish"]
    assert published == [{"pool-a": 2}, {"pool-a": 3}]  # the same count is not sent again


class _DeadStore(_FakeStore):
    """A store Ray gave up restarting: every call fails with ActorDiedError."""

    def __init__(self) -> None:
        super().__init__()
        self.publish = self.overrides_of = self

    def remote(self, *args: Any) -> Any:
        self.log.append(("publish", args))
        return self

    def future(self) -> Any:
        from concurrent.futures import Future

        dead: Future = Future()
        dead.set_exception(ActorDiedError())
        return dead


def test_a_store_dead_for_good_is_looked_up_again() -> None:
    policy = AppAutoscalingPolicy(policy="utilisation", republish_s=5.0, target_requests_per_replica=1)
    policy._store = _DeadStore()
    busy = {"running_requests": 2.0, "kv_blocks_total": 100.0}
    policy(by_deployment(_ctx(2, busy, 0.0)))
    policy(by_deployment(_ctx(2, busy, 6.0)))
    assert policy._store is None  # the next tick (in Ray) resolves the name again, recreating it


def _request(ttft_s: float) -> Request:
    return Request("r1", 10, 8, arrival_s=time.time(), slo=SLO(ttft_s=ttft_s, tbt_s=0.5), prompt_text="hi")


def test_a_resumed_stream_reports_its_stall_and_misses_a_tight_slo() -> None:
    async def main(request: Request) -> tuple[ReplicaChunk, ResumableStream]:
        def start(req: Request, pool: str) -> AsyncIterator[ReplicaChunk]:
            async def gen() -> AsyncIterator[ReplicaChunk]:
                if pool == "pool-a":
                    yield ReplicaChunk(" a", 1)
                    raise ActorDiedError()
                await asyncio.sleep(0.3)  # the failure's silence, as the client sees it
                yield ReplicaChunk(" b" * 7, 7, "length", RequestUsage(
                    prompt_tokens=11, completion_tokens=7, energy_j=1.0, ttft_s=0.3, e2e_s=0.3, max_tbt_s=0.0,
                    preemptions=0))
            return gen()

        stream = ResumableStream(start, request, ["pool-a", "pool-b"], max_retries=1)
        final = ReplicaChunk("", 0)
        async for chunk in stream:
            assert isinstance(chunk, ReplicaChunk)
            final = chunk
            if chunk.finish_reason:
                break
        return final, stream

    request = _request(ttft_s=0.2)
    final, stream = asyncio.run(main(request))
    resumption = stream.resumption()
    assert resumption.resumed and resumption.retries == 1 and resumption.stall_s >= 0.3
    report = _service_report(request, "pool-b", final, resumption, time.time(), stream.progress.first_token_s)
    assert report["resumed"] and report["retries"] == 1
    assert report["e2e_s"] >= 0.3 and report["ttft_s"] < 0.2  # from arrival to the client's last token
    assert not report["slo_met"]  # mean TBT alone would have hidden the stall
    relaxed = _request(ttft_s=5.0)
    assert _service_report(relaxed, "pool-b", final, resumption, relaxed.arrival_s + 1.0)["slo_met"]
    clean = _service_report(relaxed, "pool-a", final, Resumption(), relaxed.arrival_s + 1.0)
    assert not clean["resumed"] and clean["retries"] == 0


def test_plan_age_logs_once_per_stale_spell(caplog: pytest.LogCaptureFixture) -> None:
    age = PlanAge("app", stale_after_s=60.0)
    assert age.update(None, 100.0) is None  # no plan yet: nothing to age
    with caplog.at_level("WARNING", logger="ray.serve"):
        ages = [age.update(100.0, now) for now in (110.0, 170.0, 171.0, 172.0)]
    assert ages == [10.0, 70.0, 71.0, 72.0]
    assert sum("the plan is" in r.message for r in caplog.records) == 1
