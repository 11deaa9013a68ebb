"""Splitwise's pure policies: JSQ with reservations, mixed fallback, KV transfer model."""

from autoscaling.splitwise.config import SplitwiseConfig
from autoscaling.splitwise.scheduler import MIXED, PROMPT, TOKEN, SplitwiseScheduler
from energy.hardware import MODELS
from energy.kv_transfer import KVTransferConfig, KVTransferModel


def scheduler(prompts: int, tokens: int, **kw) -> SplitwiseScheduler:
    s = SplitwiseScheduler(SplitwiseConfig(**kw))
    for i in range(prompts):
        s.add_replica(i, PROMPT)
    for i in range(prompts, prompts + tokens):
        s.add_replica(i, TOKEN)
    return s


def test_jsq_picks_the_pair_with_least_pending_tokens():
    s = scheduler(3, 3)
    for replica, pending in {0: 500, 1: 100, 2: 300, 3: 900, 4: 1000, 5: 200}.items():
        s.ledger.report(replica, pending)
    a = s.assign(50, 20, now_s=0.0)
    assert (a.prompt.replica_id, a.token.replica_id) == (1, 5)


def test_reservations_spread_a_burst_instead_of_herding():
    s = scheduler(4, 4)
    picks = {s.assign(1000, 100, now_s=0.0).prompt.replica_id for _ in range(4)}
    assert picks == {0, 1, 2, 3}  # no report in between: only reservations tell them apart
    assert s.ledger.pending_tokens(0) == 1000


def test_landing_hands_the_reservation_to_the_next_report():
    s = scheduler(1, 1)
    a = s.assign(700, 10, now_s=0.0)
    s.ledger.land(a.prompt.ticket)
    s.ledger.report(0, 700)
    assert s.ledger.pending_tokens(0) == 700


def test_overflow_goes_mixed_then_pulls_from_the_opposite_pool_and_returns_home():
    s = scheduler(1, 3, prompt_queue_threshold_tokens=1000)
    s.ledger.report(0, 5000)  # the only prompt replica is over its threshold
    s.ledger.report(1, 10)
    a = s.assign(200, 10, now_s=0.0)
    pulled = a.prompt.replica_id
    assert s.home[pulled] is TOKEN and s.role[pulled] is MIXED
    assert s.assign(200, 10, now_s=0.0).prompt.replica_id == pulled  # the mixed pool comes next
    s.rebalance(1.0)
    assert s.role[pulled] is MIXED  # its prompts are still outstanding
    s.finished(pulled, PROMPT)
    s.finished(pulled, PROMPT)
    s.rebalance(2.0)
    assert s.role[pulled] is TOKEN


def test_a_replica_mixed_too_long_is_repurposed():
    s = scheduler(1, 2, prompt_queue_threshold_tokens=1, repurpose_after_s=60.0)
    s.ledger.report(0, 100)
    pulled = s.assign(100, 10, now_s=0.0).prompt.replica_id
    s.rebalance(61.0)
    assert s.home[pulled] is PROMPT and s.repurposed == 1


def test_a_pool_keeps_its_last_replica():
    s = scheduler(1, 1, prompt_queue_threshold_tokens=1)
    s.ledger.report(0, 100)
    assert s.assign(100, 10, now_s=0.0).prompt.replica_id == 0


def test_a_phase_with_no_replica_left_borrows_the_other_pools_last_one():
    s = scheduler(1, 1)
    s.remove_replica(0)  # the prompt pool's only replica, lost with its machine
    a = s.assign(100, 10, now_s=0.0)
    assert a.prompt.replica_id == a.token.replica_id == 1 and s.role[1] is MIXED
    s.add_replica(2, PROMPT)  # a replacement joins: prompts go to it, the borrowed replica goes home
    assert s.assign(100, 10, now_s=1.0).prompt.replica_id == 2
    s.finished(1, PROMPT)
    s.rebalance(2.0)
    assert s.role[1] is TOKEN


def test_transfer_time_from_bytes_and_bandwidth():
    model = MODELS["llama2-70b"]
    kv = KVTransferModel(model, KVTransferConfig(link_gbps=400, layerwise_min_prompt_tokens=512))
    # 1000 tokens x 327,680 B / TP8 = 40.96 MB per link; at 50 GB/s: 0.8192 ms.
    assert kv.bytes_per_link(1000, 8) == 1000 * 2 * 80 * 8 * 128 * 2 / 8
    assert abs(kv.serialized_s(1000, 8) - 40.96e6 * 8 / 400e9) < 1e-12
    small = kv.plan(256, 8, prompt_compute_s=0.05)
    assert not small.layerwise and small.visible_s == kv.serialized_s(256, 8)
    big = kv.plan(4000, 8, prompt_compute_s=0.5)
    assert big.layerwise and abs(big.visible_s - kv.serialized_s(4000, 8) / 80) < 1e-12
    # A prompt too fast to hide the transfer leaves the unhidden part visible.
    assert kv.layerwise_s(4000, 8, prompt_compute_s=0.0) == kv.serialized_s(4000, 8)


# ---- the Ray Serve side: pieces that run without Ray ----------------------------------

def test_a_deployed_mixed_pool_stays_mixed_and_takes_the_overflow():
    s = scheduler(1, 1, prompt_queue_threshold_tokens=100)
    s.add_replica(2, MIXED)
    s.ledger.report(0, 500)
    a = s.assign(50, 10, now_s=0.0)
    assert a.prompt.replica_id == 2 and s.pulled_into_mixed == 0
    s.finished(2, PROMPT)
    s.rebalance(now_s=1e6)
    assert s.role[2] is MIXED and s.repurposed == 0


def test_machine_policies_by_phase():
    from autoscaling.splitwise.config import MachineConfig
    from autoscaling.splitwise.machine import (
        AgingPreemption,
        KvBudgetAdmission,
        machine_policies,
    )

    for phase, admission in (("prompt", type(None)), ("token", KvBudgetAdmission), ("mixed", type(None))):
        got_admission, preemption = machine_policies(MachineConfig(phase=phase))
        assert isinstance(got_admission, admission) and isinstance(preemption, AgingPreemption)


def _phase_pools(*phases, **engine):
    return [{"name": p, "phase": p, "classes": ["SS"], "engine": engine} for p in phases]


def test_a_phase_split_config_needs_prompt_and_token_pools_and_sets_their_engines():
    import pytest
    from pydantic import ValidationError

    from app.config import AppConfig

    config = AppConfig.model_validate({"pools": _phase_pools("prompt", "token", "mixed"),
                                       "splitwise": {"scheduling": {"prompt_batch_tokens": 1024}}}).resolved()
    engines = {p.phase: p.engine for p in config.pools}
    assert engines["prompt"].max_batched_tokens == 1024 and engines["token"].max_batched_tokens == 8192
    assert {phase: e.splitwise.phase for phase, e in engines.items()} == {"prompt": "prompt", "token": "token",
                                                                         "mixed": "mixed"}
    assert set(config.pool_of_class().values()) == {"pool-prompt"}
    assert AppConfig.model_validate(config.model_dump(mode="json")).pools == config.pools  # stable re-validation
    with pytest.raises(ValidationError, match="a prompt and a token pool"):
        AppConfig.model_validate({"pools": _phase_pools("prompt", "mixed")})
    with pytest.raises(ValidationError, match="every pool needs a phase"):
        AppConfig.model_validate({"pools": [*_phase_pools("prompt", "token"),
                                            {"name": "x", "kind": "mixed", "classes": ["SS"]}]})
    vllm = {"kind": "vllm", "model": "/m", "kv_transfer": {"role": "kv_consumer", "storage_path": "/kv"}}
    with pytest.raises(ValidationError, match="a prompt pool needs one of"):
        AppConfig.model_validate({"pools": _phase_pools("prompt", "token", **vllm)})


def test_vllm_phase_pools_must_be_able_to_hand_each_other_kv():
    import pytest
    from pydantic import ValidationError

    from app.config import AppConfig

    def pools(prompt: dict, token: dict) -> list[dict]:
        base = {"kind": "vllm", "model": "/m"}
        return [{"name": "p", "phase": "prompt", "classes": ["SS"], "engine": {**base, **prompt}},
                {"name": "t", "phase": "token", "classes": ["SS"], "engine": {**base, **token}}]

    ours = AppConfig.model_validate({"pools": pools({"kv_transfer": {"role": "kv_producer"}},
                                                    {"kv_transfer": {"role": "kv_consumer"}})})
    assert all(p.engine.kv_transfer.block_files and p.engine.kv_transfer.storage_path is None for p in ours.pools)
    with pytest.raises(ValidationError, match="same model, tensor_parallel"):
        AppConfig.model_validate({"pools": pools({"kv_transfer": {"role": "kv_producer"}, "tensor_parallel": 2},
                                                 {"kv_transfer": {"role": "kv_consumer"}})})
    example = {"connector": "ExampleConnector", "storage_path": "/shared/kv"}
    with pytest.raises(ValidationError, match="one KV connector"):
        AppConfig.model_validate({"pools": pools({"kv_transfer": {"role": "kv_producer"}},
                                                 {"kv_transfer": {"role": "kv_consumer", **example}})})
    AppConfig.model_validate({"pools": pools({"kv_transfer": {"role": "kv_producer", **example}, "tensor_parallel": 2},
                                             {"kv_transfer": {"role": "kv_consumer", **example}})})
    with pytest.raises(ValidationError, match="ExampleConnector needs a directory"):
        no_path = {"role": "kv_producer", "connector": "ExampleConnector"}
        AppConfig.model_validate({"pools": pools({"kv_transfer": no_path}, {"kv_transfer": {"role": "kv_consumer"}})})
    sim_token = [pools({"kv_transfer": {"role": "kv_producer"}}, {})[0],
                 {"name": "t", "phase": "token", "classes": ["SS"], "engine": {"model": "llama2-70b"}}]
    with pytest.raises(ValidationError, match="all run vLLM or all the modelled engine"):
        AppConfig.model_validate({"pools": sim_token})


def test_the_assigned_replica_is_ranked_first_and_a_gone_one_falls_back():
    from types import SimpleNamespace

    from deployments.phase_router import assigned_first

    a, b, c = (SimpleNamespace(replica_id=SimpleNamespace(unique_id=u)) for u in "abc")
    ranks = [[a], [b], [c]]
    assert assigned_first(ranks, [a, b, c], "c") == [[c], [a], [b]]
    assert assigned_first(ranks, [a, b, c], "gone") == ranks
    assert assigned_first(ranks, [a, b, c], None) == ranks


def _split_run(prompt_tokens: int, out_tokens: int, lost: bool) -> tuple[str, str, int, float]:
    """Prompt on one modelled engine, tokens on another (KV local or lost): text, how, tokens, and
    the request's energy (modelled per step: deterministic, unlike wall time on a busy machine)."""
    import asyncio
    import time

    from app.splitwise_config import SplitwiseServeConfig
    from core.request import Request
    from core.slo import SLO
    from deployments.kv_handoff import KvHandle, run_prompt, run_tokens
    from engines.modelled_engine import ModelledEngine

    async def run() -> tuple[str, str, int, float]:
        prompt_engine, token_engine = ModelledEngine(), ModelledEngine()
        request = Request("r1", prompt_tokens, out_tokens, time.time(), SLO(ttft_s=10, tbt_s=1))
        settings = SplitwiseServeConfig(transfer_failure_prob=1.0 if lost else 0.0)
        first, kv = await run_prompt(prompt_engine, request, settings, "p", same_replica=not lost)
        if not lost:  # the same replica would keep its KV; here it is handed over as if it had
            kv = KvHandle("t", kv.via, generated=kv.generated, first_token_s=kv.first_token_s,
                          last_token_s=kv.last_token_s, energy_j=kv.energy_j)
        outcome: list[str] = []
        chunks = [c async for c in run_tokens(token_engine, request, kv, "t", 0.01, outcome)]
        await prompt_engine.shutdown()
        await token_engine.shutdown()
        return first.text + "".join(c.text for c in chunks), outcome[0], chunks[-1].usage.completion_tokens, \
            chunks[-1].usage.energy_j

    return asyncio.run(run())


def test_kv_handoff_on_the_modelled_engine_continues_the_sequence_or_recomputes():
    import asyncio
    import time

    from core.request import Request
    from core.slo import SLO
    from engines.modelled_engine import ModelledEngine

    async def whole() -> str:
        engine = ModelledEngine()
        request = Request("r1", 300, 12, time.time(), SLO(ttft_s=10, tbt_s=1))
        text = "".join([c.text async for c in engine.generate(request)])
        await engine.shutdown()
        return text

    reference = asyncio.run(whole())
    text, how, tokens, kept_j = _split_run(300, 12, lost=False)
    assert (text, how, tokens) == (reference, "local", 12)
    text, how, tokens, lost_j = _split_run(300, 12, lost=True)
    assert (text, how, tokens) == (reference, "recomputed", 12)
    assert lost_j > kept_j  # the recomputed prompt costs a second prefill
