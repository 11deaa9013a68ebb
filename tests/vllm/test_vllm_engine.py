"""The vLLM engine behind the engine protocol, on the tiny offline model (no Ray)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.request import Request
from core.sampling import Sampling
from core.slo import SLO
from tests.tiny_model_fixture import hf_greedy, loop, require_vllm, running_engine, tiny_model  # noqa: F401 (fixtures)
from wattwise.tiny_model import tiny_engine_config

require_vllm()

from engines.factory import make_engine
from engines.protocol import TensorParallelChangeUnsupported
from engines.vllm_engine import VllmEngine

PROMPT = "Return the number of items in the"


@pytest.fixture(scope="module")
def engine(tiny_model: Path, loop: asyncio.AbstractEventLoop) -> Iterator[VllmEngine]:
    yield from running_engine(loop, tiny_engine_config(tiny_model, batch_limit=4))


def _request(engine: VllmEngine, prompt: str, max_tokens: int, rid: str, **sampling) -> Request:
    return Request(rid, engine.count_tokens(prompt), max_tokens, time.time(), SLO(ttft_s=60, tbt_s=10),
                   prompt_text=prompt, sampling=Sampling(**{"temperature": 0.0, **sampling}))


async def _collect(engine: VllmEngine, request: Request) -> list:
    return [chunk async for chunk in engine.generate(request)]


def test_greedy_stream_matches_hf_reference(engine: VllmEngine, tiny_model: Path, loop) -> None:
    chunks = loop.run_until_complete(_collect(engine, _request(engine, PROMPT, 16, "greedy")))
    expected = engine.tokenizer.decode(hf_greedy(tiny_model, PROMPT, 16))
    assert "".join(c.text for c in chunks) == expected
    assert len(chunks) > 1 and all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.finish_reason == "length"
    assert last.usage.completion_tokens == 16 == sum(c.num_tokens for c in chunks)
    assert last.usage.prompt_tokens == engine.count_tokens(PROMPT)
    assert 0 < last.usage.ttft_s <= last.usage.e2e_s
    assert last.usage.energy_j == 0.0  # no NVML on a CPU: reported as 0, not invented


def test_sampling_parameters_reach_vllm(engine: VllmEngine, loop) -> None:
    greedy = "".join(c.text for c in loop.run_until_complete(_collect(engine, _request(engine, PROMPT, 16, "g2"))))
    stop = greedy[len(greedy) // 2:][:3]
    stopped = loop.run_until_complete(_collect(engine, _request(engine, PROMPT, 16, "stop", stop=(stop,))))
    assert stopped[-1].finish_reason == "stop" and stop not in "".join(c.text for c in stopped)
    seeded = [
        "".join(c.text for c in loop.run_until_complete(
            _collect(engine, _request(engine, PROMPT, 24, f"seed{i}", temperature=1.5, seed=7))))
        for i in range(2)
    ]
    assert seeded[0] == seeded[1] != greedy[:len(seeded[0])]


def test_closing_the_stream_aborts_in_vllm(engine: VllmEngine, loop) -> None:
    async def run() -> tuple[int, int]:
        stream = engine.generate(_request(engine, PROMPT, 900, "abort"))
        await stream.__anext__()
        during = engine.unfinished_in_vllm()
        await stream.aclose()
        await asyncio.sleep(0.2)
        return during, engine.unfinished_in_vllm()

    during, after = loop.run_until_complete(run())
    assert during == 1 and after == 0
    assert engine.stats().running_requests == 0 and engine.gate.active == 0


def test_admission_limit_is_respected_and_stats_move(engine: VllmEngine, loop) -> None:
    async def run() -> tuple[int, int, list, int]:
        engine.set_batch_limit(2)
        peak_running, peak_queued, samples = 0, 0, []
        tasks = [asyncio.ensure_future(_collect(engine, _request(engine, PROMPT, 120, f"load{i}"))) for i in range(6)]
        while not all(t.done() for t in tasks):
            await asyncio.sleep(0.05)
            s = engine.stats()
            assert engine.gate.active <= 2
            peak_running, peak_queued = max(peak_running, s.running_requests), max(peak_queued, s.queued_requests)
            samples.append(s)
        await asyncio.gather(*tasks)
        return peak_running, peak_queued, samples, sum(len(t.result()) > 0 for t in tasks)

    completed_before = engine.stats().completed_requests
    peak_running, peak_queued, samples, done = loop.run_until_complete(run())
    assert done == 6 and peak_running == 2 and peak_queued >= 3
    assert max(s.kv_blocks_used for s in samples) > 0 and samples[0].kv_blocks_total > 1
    final = engine.stats()
    assert final.completed_requests == completed_before + 6
    assert final.tokens_per_s > 0 and final.itl_ewma_s > 0 and final.ttft_ewma_s > 0
    assert final.running_requests == 0 and final.kv_blocks_used == 0 and final.batch_limit == 2
    engine.set_batch_limit(4)


def test_tensor_parallel_change_is_refused(engine: VllmEngine) -> None:
    with pytest.raises(TensorParallelChangeUnsupported, match="shadow"):
        engine.set_tensor_parallel(2)


def test_latency_profile_of_the_vllm_engine(engine: VllmEngine, loop, tmp_path: Path) -> None:
    """`wattwise profile --vllm-model`: latency vs batch and context, on this engine."""
    import csv

    from energy.latency_points import save_latency_csv
    from engines.latency_profiling import measure_latency

    points = loop.run_until_complete(measure_latency(engine, (1, 3), (40, 300), output_tokens=8))
    assert [(p.batch, p.context_tokens > 250) for p in points] == [(1, False), (3, False), (1, True), (3, True)]
    assert all(30 < p.context_tokens <= 300 for p in points)
    assert all(p.ttft_s > 0 and p.itl_s > 0 and p.tokens_per_s > 0 for p in points)
    assert all(p.energy_j == 0 and p.clock_mhz == 0 for p in points)  # no NVML here: 0, not invented
    assert all(p.output_tokens == 8 and p.tensor_parallel == 1 for p in points)
    # The points fit the perf model DynamoLLM's profile is built from (wattwise profile --profile-out).
    from energy.engine_fit import fit_engine_perf_model, fit_quality
    from energy.hardware import GPUS, ModelSpec

    perf = fit_engine_perf_model(points, ModelSpec.from_hf_config(engine.config.model), GPUS["h100-80gb"])
    assert perf.tensor_parallel_degrees == [1] and [q.points for q in fit_quality(perf, points)] == [4]
    save_latency_csv(points, tmp_path / "latency.csv")
    rows = list(csv.DictReader((tmp_path / "latency.csv").open()))
    assert [int(r["batch"]) for r in rows] == [1, 3, 1, 3] and float(rows[2]["ttft_s"]) == points[2].ttft_s


def test_ips_sweep_gives_decode_rows_per_run(engine: VllmEngine, loop) -> None:
    """M's profiler (throttLL'eM's IPS model, `engines.ips_profiling_vllm`): a two-run sweep."""
    import numpy as np

    from engines.ips_profiling_vllm import measure_ips

    observers = list(engine.tracker.step_observers)  # the engine's own
    profile = loop.run_until_complete(measure_ips(engine, batch_sizes=(1, 4), repeats=1, sample_s=0.25))
    s = profile.samples
    assert len(s) >= 2 and set(profile.runs) == {0, 1}
    assert np.all(s.tp == 1) and len(np.unique(s.clock_mhz)) == 1  # no clock control on CPU: one value
    assert np.all(s.ips > 0) and np.all(s.kv_blocks > 0)
    assert s.batch[profile.runs == 0].max() <= 1 < s.batch[profile.runs == 1].max() <= 4
    assert engine.tracker.step_observers == observers  # the sweep's observer is gone after it


@pytest.fixture(scope="module")
def one_at_a_time(tiny_model: Path, loop: asyncio.AbstractEventLoop) -> Iterator[VllmEngine]:
    """max_num_seqs 1: one request runs, the rest wait inside vLLM, in its deadline order."""
    yield from running_engine(loop, tiny_engine_config(tiny_model, max_num_seqs=1, batch_limit=4,
                                                       prefill_by_ttft_deadline=True))


@pytest.mark.parametrize("tight_ttft_s, first", [(300.0, "tight"), (0.001, "loose")])
def test_with_deadline_order_vllm_runs_the_waiting_prompt_due_first(one_at_a_time: VllmEngine, loop,
                                                                   tight_ttft_s: float, first: str) -> None:
    """vLLM's own queue (max_num_seqs 1: one runs, the rest wait inside vLLM) takes the prompt
    due first, not the one that came first (keyed by TTFT deadline), unless that one is late
    already: then the one still on time (engines.vllm_deadline_scheduler.DeadlineQueue)."""
    engine = one_at_a_time
    assert engine.llm.vllm_config.scheduler_config.policy == "priority"

    async def run() -> dict[str, list[float]]:
        seen: dict[str, list[float]] = {}

        async def stream(request: Request) -> None:
            async for _chunk in engine.generate(request):
                seen.setdefault(request.request_id, []).append(time.time())

        # Long enough that both others are queued inside vLLM before it ends, on a busy machine.
        running = asyncio.ensure_future(stream(_request(engine, PROMPT, 900, "running", ignore_eos=True)))
        while "running" not in seen:
            await asyncio.sleep(0.01)
        # Deadlines far enough out that neither turns late while the running one ends (CI, on a
        # busy machine: over 30 s, and a tight prompt due in 30 s went behind the loose one).
        loose = dataclasses.replace(_request(engine, PROMPT, 8, "loose"), slo=SLO(ttft_s=600, tbt_s=10))  # comes first
        tight = dataclasses.replace(_request(engine, PROMPT, 8, "tight"), slo=SLO(ttft_s=tight_ttft_s, tbt_s=10))
        waiting = []
        for request in (loose, tight):  # each queued inside vLLM before the next is sent
            waiting.append(asyncio.ensure_future(stream(request)))
            deadline_s = time.time() + 120
            while engine.unfinished_in_vllm() < 1 + len(waiting):
                assert time.time() < deadline_s and not running.done(), "both must queue behind the running one"
                await asyncio.sleep(0.01)
        await asyncio.gather(running, *waiting)
        return seen

    seen = loop.run_until_complete(run())
    second = "loose" if first == "tight" else "tight"
    # One at a time, a request ends in vLLM before the next starts, but its reader may see its
    # last chunk after the next one's first (CI, on a busy machine: 0.11 s after), so each order
    # is read where a whole request's tokens separate the two.
    assert seen["running"][-1] < seen[first][-1], "the request running when both arrived goes on to its end"
    assert seen[first][0] < seen[second][0], "the prompt that goes first ran first"


def test_with_deadline_order_a_started_prompt_yields_its_chunks_to_a_prompt_due_first(tiny_model: Path) -> None:
    """A long prompt due in a minute, prefilling 16 tokens a step, lets a short prompt due in
    a second go ahead of its remaining chunks (engines.vllm_deadline_scheduler): the short one
    ends before the long one's first token. vLLM alone runs started requests first, so the
    short prompt would wait out the whole prefill. The long one then finishes; nothing is lost."""

    async def run() -> tuple[dict[str, list[float]], float]:
        engine = make_engine(tiny_engine_config(tiny_model, max_num_seqs=4, batch_limit=4, max_num_batched_tokens=16,
                                                prefill_by_ttft_deadline=True))
        try:
            assert engine.llm.vllm_config.scheduler_config.scheduler_cls.startswith("engines.vllm_deadline_scheduler.")
            seen: dict[str, list[float]] = {}

            async def stream(request: Request) -> None:
                async for _chunk in engine.generate(request):
                    seen.setdefault(request.request_id, []).append(time.time())

            words = 950 // engine.count_tokens(" items")  # the tiny tokenizer spells words out
            long = _request(engine, " items" * words, 4, "long", ignore_eos=True)
            assert 900 < long.prompt_tokens < 1000
            started = asyncio.ensure_future(stream(long))
            deadline_s = time.time() + 120
            while engine.unfinished_in_vllm() < 1:  # inside vLLM: its chunks are being scheduled
                assert time.time() < deadline_s and not started.done()
                await asyncio.sleep(0.005)
            short = dataclasses.replace(_request(engine, PROMPT, 4, "short", ignore_eos=True),
                                        slo=SLO(ttft_s=1.0, tbt_s=10))
            await asyncio.gather(started, stream(short))
            return seen, engine.stats().deadline_prefill_step_s
        finally:
            await engine.shutdown()

    seen, step_s = asyncio.run(run())
    # Its four tokens, not only its first: a step's outputs arrive together, in no set order.
    assert seen["short"][-1] < seen["long"][0], "the prompt due first went ahead of the started one's chunks"
    assert len(seen["long"]) >= 1
    assert step_s > 0, "the replica reports the step a prompt due first waits for (the planner costs it)"
