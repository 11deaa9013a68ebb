"""What prefix caching does in a replica: the modelled engine's batcher prefills only what
its cache does not hold and reports its hits and the work they saved; a vLLM replica
rebuilds the app's prefix blocks from vLLM's KV cache events (engines.vllm_prefix_events'
tracker, pure: no vLLM here; its ZMQ subscriber is not tested against a running engine yet)."""

from __future__ import annotations

from batching.continuous_batcher import BatcherConfig, ContinuousBatcher
from core.prefix_cache import block_hashes
from core.request import Request
from core.slo import SLO
from energy.calibration import default_perf_model
from engines.vllm_prefix_events import PrefixBlockTracker

PROMPT = 4096


def _run(batcher: ContinuousBatcher, request: Request, now_s: float) -> tuple[float, int]:
    """(when the request's prompt is done, the prompt tokens its steps computed)."""
    batcher.add(request, now_s)
    computed = 0
    while (step := batcher.plan_step(now_s)) is not None:
        computed += sum(n for s, n in step.prefill_chunks if s.request is request)
        now_s = batcher.finish_step(step).end_s
    return now_s, computed


def _request(rid: str, hashes: tuple[int, ...]) -> Request:
    return Request(rid, PROMPT, 2, 0.0, SLO(ttft_s=10, tbt_s=1), target_output_tokens=2, prefix_hashes=hashes)


def test_a_prompt_found_cached_prefills_only_the_rest_and_the_replica_reports_it() -> None:
    perf = default_perf_model("llama2-70b", "h100-80gb", None)
    batcher = ContinuousBatcher(perf, BatcherConfig(tensor_parallel=4, prefix_block_tokens=512))
    shared = tuple(range(6))  # 6 of the prompt's 8 blocks
    t0, first = _run(batcher, _request("a", (*shared, 10, 11)), 0.0)
    t1, second = _run(batcher, _request("b", (*shared, 20, 21)), t0)
    assert first == PROMPT and second == PROMPT - 6 * 512
    stats = batcher.stats(t1)
    assert (stats.prompt_tokens_started, stats.prompt_tokens_cached) == (2 * PROMPT, 6 * 512)
    assert 0.5 < stats.prefix_work_ratio < 1.0  # it did less than the profile's work per request
    whole = ContinuousBatcher(perf, BatcherConfig(tensor_parallel=4))  # no cache modelled: all of it
    assert _run(whole, _request("c", shared), 0.0)[1] == PROMPT and whole.stats(1.0).prefix_work_ratio == 1.0


def test_a_full_cache_evicts_the_least_recently_used_prompt() -> None:
    perf = default_perf_model("llama2-70b", "h100-80gb", None)
    batcher = ContinuousBatcher(perf, BatcherConfig(tensor_parallel=4, kv_capacity_tokens=16 * 512,
                                                    prefix_block_tokens=512))
    now = 0.0
    for i in range(3):  # 3 x 8 blocks through a 16-block cache: the first prompt is gone
        now, _ = _run(batcher, _request(f"r{i}", tuple(range(10 * i, 10 * i + 8))), now)
    assert batcher.cached_prompt_tokens(_request("x", tuple(range(8)))) == 0
    assert batcher.cached_prompt_tokens(_request("y", tuple(range(20, 28)))) == 8 * 512


def test_vllm_events_rebuild_the_apps_prefix_blocks() -> None:
    """vLLM stores 32-token blocks under its own hashes; the app's 64-token blocks are named
    by the chained hash of their tokens (block_hashes), held while vLLM holds their end."""
    tokens = list(range(200, 360))  # 160 tokens: 5 vLLM blocks, 2 of the app's
    tracker = PrefixBlockTracker(block_tokens=64)
    tracker.stored(["v0", "v1", "v2"], None, tokens[:96], 32)
    tracker.stored(["v3", "v4"], "v2", tokens[96:160], 32)
    assert tracker.held() == list(reversed(block_hashes(tokens, 64)))
    tracker.stored(["w0"], "unknown-parent", tokens[:32], 32)  # its prefix was never seen: skipped
    tracker.removed(["v3"])  # the second block's end is evicted
    assert tracker.held() == [block_hashes(tokens, 64)[0]]
    tracker.cleared()
    assert tracker.held() == []
