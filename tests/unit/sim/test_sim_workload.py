"""Workloads, the oracle floor and the simulate CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sim.cli import main
from sim.config import SimConfig
from sim.oracle import oracle_energy
from sim.run import simulate
from sim.workload import (
    Workload,
    amplify_rate,
    batch_dump,
    fit_context,
    gamma_arrivals,
    load_trace,
    scale_rate,
    scale_time,
    shuffle_blocks,
    superpose,
    window,
    with_batch_fraction,
)


def test_trace_loads_sorted_from_zero():
    w = load_trace("conv")
    assert len(w) == 19366
    assert w.arrival_s[0] == 0 and (np.diff(w.arrival_s) >= 0).all()
    assert 3400 < w.duration_s < 3600


def test_the_mooncake_trace_loads_long_prompts_in_its_order(tmp_path):
    w = load_trace("mooncake")
    assert len(w) == 3993 and w.arrival_s[0] == 0 and (np.diff(w.arrival_s) >= 0).all()
    assert 1000 < w.duration_s < 1030 and w.prompt_tokens.mean() > 15000
    fitted = fit_context(w, 8192)
    assert (fitted.prompt_tokens + fitted.output_tokens <= 8192).all()
    # Any JSONL like it: milliseconds from any start, requests at one time kept in file order.
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps({"timestamp": t, "input_length": i, "output_length": 5, "hash_ids": []})
                               for t, i in ((5000, 10), (5000, 20), (4000, 30))) + "\n")
    mine = load_trace(path)
    assert mine.arrival_s.tolist() == [0.0, 1.0, 1.0] and mine.prompt_tokens.tolist() == [30, 10, 20]


def test_window_time_and_rate_scaling():
    rng = np.random.default_rng(0)
    w = window(load_trace("conv"), 600, 300)
    assert w.arrival_s.min() >= 0 and w.arrival_s.max() < 300
    assert scale_time(w, 2.0).duration_s == 2 * w.duration_s
    doubled = scale_rate(w, 2.0, rng)
    assert len(doubled) == 2 * len(w) and (np.diff(doubled.arrival_s) >= 0).all()
    half = scale_rate(w, 0.5, rng)
    assert 0.4 * len(w) < len(half) < 0.6 * len(w)


def test_gamma_arrivals_rate_and_burstiness():
    rng = np.random.default_rng(0)
    smooth = np.diff(gamma_arrivals(10.0, 2000.0, 1.0, rng))
    bursty = np.diff(gamma_arrivals(10.0, 2000.0, 4.0, rng))
    assert abs(1 / smooth.mean() - 10) < 0.5
    assert bursty.std() / bursty.mean() > 2 * smooth.std() / smooth.mean()


def test_batch_fraction_and_context_fit():
    rng = np.random.default_rng(0)
    w = fit_context(with_batch_fraction(load_trace("conv"), 0.3, rng), 8192)
    assert 0.25 < 1 - w.interactive.mean() < 0.35
    assert (w.prompt_tokens + w.output_tokens <= 8192).all()


def test_oracle_is_below_the_static_baseline():
    w = fit_context(window(load_trace("conv"), 0, 300), 8192)
    summary, _ = simulate("singlepool", w)
    floor = oracle_energy(w, SimConfig())
    assert floor.infeasible_windows == 0
    assert 0 < floor.energy_j < summary["energy_j"]


def test_oracle_paces_a_job_that_lands_at_once():
    """25,000 batch requests in one minute: no configuration carries that window, yet the
    floor must count the job's work, which its hour-long TTFT target lets it pace."""
    interactive = fit_context(window(load_trace("conv"), 0, 600), 8192)
    with_job = batch_dump(interactive, 25_000, 300.0, np.random.default_rng(0))
    alone, floor = oracle_energy(interactive, SimConfig()), oracle_energy(with_job, SimConfig())
    assert floor.infeasible_windows == 0
    assert floor.batch_pace_s > 60
    # The job is 2.5x the interactive requests, of the same lengths.
    assert floor.energy_j > 2 * alone.energy_j
    assert alone.batch_pace_s == 60  # nothing to pace


def test_cli_writes_json_per_policy(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(["--trace", "synthetic", "--duration-s", "60", "--rate", "2", "--policy", "singlepool",
               "--policy", "llumnix", "--batch-fraction", "0.5", "--json", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())
    assert [r["policy"] for r in rows] == ["singlepool", "llumnix", "oracle", "clairvoyant-floor", "peak-held"]
    floor, clairvoyant, held = (r["energy_j"] for r in rows[2:])
    # Here the clairvoyant schedule holds one GPU count through the minute, peak-held's: equal
    # in exact arithmetic, rounded apart (the DP adds each window's power x 5 s, peak-held
    # multiplies the summed power by 5 s), so the two may differ in the last bit.
    assert 0 < floor <= clairvoyant * (1 + 1e-12) and clairvoyant <= held * (1 + 1e-12)
    for r in rows[:2]:
        for key in ("energy_j", "gpu_hours", "p99_ttft_s", "p99_tbt_s", "requests", "completed", "wall_s"):
            assert key in r
        assert {"overall", "interactive", "batch"} <= set(r["slo_attainment"])
    printed = capsys.readouterr()
    assert "singlepool" in printed.out
    # Not a terminal: a line per policy, not a progress bar's redraws.
    assert "\r" not in printed.err and printed.err.count(": simulated") == 2


def test_cli_runs_the_composite_without_its_slo_guard_on_the_mooncake_trace(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["--trace", "mooncake", "--duration-s", "20", "--policy", "wattwise", "--no-slo-guard",
                 "--no-oracle", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["policy"] == "wattwise-noguard" and row["slo_guard_s"] == {}
    assert row["requests"] > 50
    assert "wattwise-noguard" in capsys.readouterr().out


def test_shuffled_blocks_keep_every_request_and_each_blocks_arrivals():
    w = load_trace("code")
    out = shuffle_blocks(w, 60.0, np.random.default_rng(1))

    def minute_sizes(x) -> list[int]:
        counts = np.bincount((x.arrival_s // 60).astype(int))
        return sorted(counts[counts > 0].tolist())

    assert len(out) == len(w) and np.all(np.diff(out.arrival_s) >= 0)
    assert sorted(out.prompt_tokens.tolist()) == sorted(w.prompt_tokens.tolist())
    assert np.array_equal(np.sort(out.arrival_s % 60.0), np.sort(w.arrival_s % 60.0))  # offsets inside a block
    assert minute_sizes(out) == minute_sizes(w)  # the same bursts
    assert not np.array_equal(out.arrival_s, w.arrival_s)  # in another order


def test_superposed_halves_carry_both_halves_requests_in_time_order():
    """The doubled workloads: each half's requests, each at its own offset into the half."""
    w = load_trace("code")
    first, second = window(w, 0.0, 1800.0), window(w, 1800.0, 1800.0)
    both = superpose(first, second)
    assert len(both) == len(first) + len(second) and np.all(np.diff(both.arrival_s) >= 0)
    assert both.duration_s < 1800.0
    for field in ("arrival_s", "prompt_tokens", "output_tokens"):
        joined = np.concatenate([getattr(first, field), getattr(second, field)])
        assert sorted(getattr(both, field).tolist()) == sorted(joined.tolist())
    # A request keeps its own lengths: (arrival, prompt) pairs are the halves' pairs.
    pairs = set(zip(both.arrival_s.tolist(), both.prompt_tokens.tolist(), strict=True))
    assert pairs == set(zip(first.arrival_s.tolist(), first.prompt_tokens.tolist(), strict=True)) | set(
        zip(second.arrival_s.tolist(), second.prompt_tokens.tolist(), strict=True))


def test_amplified_rate_spans_the_range_in_the_traces_shape():
    w = window(load_trace("conv"), 0, 900)
    out = amplify_rate(w, 1.5, 15.0, 60.0, np.random.default_rng(0))

    def per_minute(x) -> np.ndarray:
        return np.histogram(x.arrival_s, np.linspace(0.0, w.duration_s, 16))[0] / (w.duration_s / 15)

    before, after = per_minute(w), per_minute(out)
    assert after.max() / before.max() > 1.5  # the peak is raised to 15 req/s ...
    assert 9.0 < after.max() < 18.0 and 0.5 < after.min() < 4.5  # ... and the quietest minute near 1.5
    assert after.max() / after.min() > 3 * before.max() / before.min()  # the variation amplified
    assert np.argmax(after) == np.argmax(before) and np.argmin(after) == np.argmin(before)  # its shape kept
    assert np.all(np.diff(out.arrival_s) >= 0) and out.arrival_s.min() >= 0
    pairs = set(zip(w.prompt_tokens.tolist(), w.output_tokens.tolist(), strict=True))
    assert set(zip(out.prompt_tokens.tolist(), out.output_tokens.tolist(), strict=True)) <= pairs  # trace requests
    with pytest.raises(ValueError, match="low_rps"):
        amplify_rate(w, 2.0, 1.0, 60.0, np.random.default_rng(0))
    flat = Workload(np.arange(0.0, 120.0, 1.0), np.ones(120, np.int64), np.ones(120, np.int64), np.ones(120, bool))
    with pytest.raises(ValueError, match="one rate"):
        amplify_rate(flat, 1.0, 2.0, 60.0, np.random.default_rng(0))


def test_mooncakes_blocks_and_multi_turn_conversations_share_prefixes():
    from sim.multi_turn import Sessions, multi_turn

    w = load_trace("mooncake")
    assert w.prefix_block_tokens == 512 and all(len(p) == n // 512 for p, n in zip(w.prefix, w.prompt_tokens))
    clipped = fit_context(w, 8192)
    assert all(len(p) <= n // 512 for p, n in zip(clipped.prefix, clipped.prompt_tokens))
    assert window(w, 100, 50).prefix == tuple(p for p, t in zip(w.prefix, w.arrival_s) if 100 <= t < 150)
    conv = window(load_trace("conv"), 0, 120)
    turns = multi_turn(conv, np.random.default_rng(0), Sessions(block_tokens=128, system_tokens=256))
    assert (turns.arrival_s == conv.arrival_s).all() and (turns.prompt_tokens == conv.prompt_tokens).all()
    firsts = {p[0] for p in turns.prefix if p}
    assert len(firsts) <= 16  # every conversation starts with one of the system prompts
    # Some turns extend an earlier prompt: all of its blocks begin theirs.
    earlier = {p for p in turns.prefix if len(p) > 2}
    assert any(p[:len(q)] == q for p in turns.prefix for q in earlier if len(q) < len(p))


def test_cli_turns_a_trace_into_conversations_only_when_asked(tmp_path):
    """`--multi-turn` gives conv's requests prefixes the replicas cache; without it none is cached."""
    hit = {}
    for extra in ([], ["--multi-turn", "--router", "prefix_aware"]):
        out = tmp_path / "r.json"
        assert main(["--trace", "conv", "--duration-s", "60", "--policy", "singlepool", "--no-oracle",
                     "--json", str(out), *extra]) == 0
        hit[bool(extra)] = json.loads(out.read_text())[0]["prefix_hit_rate"]
    assert hit[False] == 0 and hit[True] > 0.1, hit
