"""Mico §3.4: a query inserted into a running batch, seen the same by engine and dispatch.

The ContinuousBatcher (modelled engine and simulator) admits a new request at the next
iteration; the dispatcher's M_k (TokenLedger, fed each step's output) must fall with
the batcher's own pending tokens, iteration by iteration, insertion included.
"""

from app.token_ledger import TokenLedger
from batching.continuous_batcher import BatcherConfig, ContinuousBatcher
from core.request import Request
from core.slo import SLO
from energy.calibration import default_perf_model
from sim.multicluster import account_step


def _request(rid: str, prompt: int, output: int) -> Request:
    return Request(rid, prompt, output, 0.0, SLO(ttft_s=10, tbt_s=1), target_output_tokens=output)


def _pending(batcher: ContinuousBatcher, now: float) -> int:
    stats = batcher.stats(now)
    return stats.pending_prompt_tokens + stats.pending_decode_tokens


def test_inserted_request_joins_the_running_batch_and_ledger_tracks_pending_tokens() -> None:
    batcher = ContinuousBatcher(default_perf_model(), BatcherConfig(batch_limit=4, max_batched_tokens=64))
    ledger = TokenLedger(1)
    first = _request("a", prompt=100, output=30)
    batcher.add(first, 0.0)
    ledger.add(0, "a", first.prompt_tokens + first.output_tokens_to_generate)
    now = 0.0
    inserted_at = None
    for i in range(200):
        if i == 5:  # "a" is decoding: insert "b" into the running batch
            late = _request("b", prompt=80, output=10)
            batcher.add(late, now)
            ledger.add(0, "b", late.prompt_tokens + late.output_tokens_to_generate)
            inserted_at = i
        step = batcher.plan_step(now)
        if step is None:
            break
        if i == inserted_at:
            assert [s.request_id for s, _ in step.prefill_chunks] == ["b"]
            assert [s.request_id for s in step.decodes] == ["a"]  # same iteration, no waiting for "a"
        out = batcher.finish_step(step)
        account_step(ledger, step, out)
        now = step.end_s
        assert ledger.load_tokens[0] == _pending(batcher, now)
    assert inserted_at == 5 and ledger.load_tokens[0] == 0 and not batcher.has_work()


def test_overpredicted_request_releases_its_remainder_at_finish() -> None:
    batcher = ContinuousBatcher(default_perf_model(), BatcherConfig(batch_limit=2))
    ledger = TokenLedger(1)
    batcher.add(_request("a", prompt=10, output=5), 0.0)
    ledger.add(0, "a", 10 + 50)  # predicted 50, produces 5
    now = 0.0
    while (step := batcher.plan_step(now)) is not None:
        account_step(ledger, step, batcher.finish_step(step))
        now = step.end_s
    assert ledger.load_tokens[0] == 0
