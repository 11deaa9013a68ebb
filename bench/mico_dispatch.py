"""Mico's multi-cluster experiment (§4.2, Table 1) in the simulator, and served vs simulated.

    wattwise bench mico            # Table 1 grid (800 queries) + query-count sweep
    wattwise bench mico --quick
    wattwise bench mico --served 2 [--queries 96]   # local clouds behind the federation front

One batch of held-out ShareGPT prompts (predicted by the default text predictor, true
response lengths as outputs) with skewed lengths (`--long-share` of them drawn from
responses of >= 470 tokens, about 300 words) is dispatched over 2-9 clusters, each a Llama2-70B TP8
replica on the shared ContinuousBatcher with batch limit 2-10. Compared in the same
run: count-balanced round-robin (Mico's Q-bar), token-balanced with the predictor,
with true buckets (oracle), and with the predictor plus back-off offloading. Both
sides batch continuously, so the ratios are Mico's Q vs Q-bar ablation (Fig. 12a),
not Table 1's Q+I vs Q-bar+I-bar.

`--served N` starts N small local clouds (wattwise.local_federation: one TP2 H100 replica
each, simulated GPUs in real time) behind the federation front door, sends one burst of a
skewed mix through it (held-out ShareGPT prompts, their responses' lengths as max_tokens,
capped at `--max-output`), and runs the same queries through the simulator's multi-cluster
run with the same dispatcher (app.cloud_dispatch.CloudDispatcher) and the same predictions:
makespan, throughput and the predicted tokens each cloud got, served beside simulated.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np

from app.dispatch import Query, round_robin, token_balanced
from app.offload import TransferCost
from core.classes import LengthClassConfig
from prediction.predictor_config import PredictorConfig
from prediction.predictor_factory import make_bucket_predictor
from prediction.prompt_data import load_pairs, split_by_conversation
from sim.multicluster import ClusterSpec, MultiClusterResult, MultiClusterSim

LONG_TOKENS = 470  # ~300 words (1.56 tokens per word in these responses), the threshold first used


def skewed_sample(n: int, long_share: float, rng: np.random.Generator) -> tuple[list[int], list[int], list[str]]:
    """Indices into the held-out pairs: `long_share` of them with long responses."""
    _, held = split_by_conversation(load_pairs())
    out = np.array(held.output_tokens)
    long_idx, short_idx = np.flatnonzero(out >= LONG_TOKENS), np.flatnonzero(out < LONG_TOKENS)
    picks = np.where(rng.random(n) < long_share, rng.choice(long_idx, n), rng.choice(short_idx, n))
    return ([held.prompt_tokens[i] for i in picks], [held.output_tokens[i] for i in picks],
            [held.prompts[i] for i in picks])


def run_config(spec: ClusterSpec, n_clusters: int, prompts: list[int], outputs: list[int],
               predicted_buckets: np.ndarray, buckets) -> dict[str, MultiClusterResult]:
    weights = [1] * n_clusters

    def queries(bucket_of) -> list[Query]:
        return [Query(str(i), p, int(b), buckets.midpoint_tokens(int(b)))
                for i, (p, b) in enumerate(zip(prompts, bucket_of))]

    predicted = queries(predicted_buckets)
    oracle = queries([buckets.label(o) for o in outputs])
    guess = [q.predicted_output_tokens for q in predicted]

    def sim(assignment, offload=None) -> MultiClusterResult:
        return MultiClusterSim(spec, n_clusters, prompts, outputs, guess, offload).run(assignment)

    tb = token_balanced(predicted, weights)
    return {
        "rr": sim(round_robin(len(prompts), weights)),
        "tb": sim(tb),
        "oracle": sim(token_balanced(oracle, weights)),
        "tb+offload": sim(tb, TransferCost()),
    }


async def _burst(url: str, texts: list[str], outputs: list[int], key: str, model: str) -> list[float | None]:
    """Every query at once through the front; each one's completion time (None: it failed)."""

    async def one(client: httpx.AsyncClient, text: str, max_tokens: int) -> float | None:
        r = await client.post(f"{url}/v1/completions", headers={"authorization": f"Bearer {key}"},
                              json={"model": model, "prompt": text, "max_tokens": max_tokens})
        ok = r.status_code == 200 and r.json()["usage"]["completion_tokens"] == max_tokens
        return time.monotonic() if ok else None

    async with httpx.AsyncClient(timeout=900) as client:
        return await asyncio.gather(*(one(client, t, o) for t, o in zip(texts, outputs)))


def served(n_clouds: int, queries: int, long_share: float, seed: int, max_output: int) -> int:
    """The same burst served by local clouds behind the front door and simulated (see above)."""
    from wattwise.local_federation import MODEL, TENANT_KEY, LocalFront, front_config, small_cloud
    from wattwise.local_serve import LocalServe

    _, outputs_all, texts = skewed_sample(queries, long_share, np.random.default_rng(seed))
    outputs = [max(1, min(o, max_output)) for o in outputs_all]
    clouds = {f"cloud{k}": LocalServe(edit=small_cloud(), dashboard=False) for k in range(n_clouds)}
    try:
        with ThreadPoolExecutor(n_clouds) as pool:
            for start in [pool.submit(c.start) for c in clouds.values()]:
                start.result()
        with LocalFront(front_config(clouds)) as front:
            door = front.door
            prompts = [door.counter.count(t) for t in texts]
            predicted = [door.predictor.predict(p, o, t) for p, o, t in zip(prompts, outputs, texts)]
            started = time.monotonic()
            done = asyncio.run(_burst(front.url, texts, outputs, TENANT_KEY, MODEL))
            placed = [door.dispatcher.status(k, door.now_s()).dispatched_tokens for k in range(n_clouds)]
            offloaded = sum(s.value for m in door.metrics.offloads.collect() for s in m.samples
                            if s.name.endswith("_total"))
    finally:
        for cloud in clouds.values():
            cloud.stop()
    finished = [t for t in done if t is not None]
    served_makespan = max(finished) - started
    sim = MultiClusterSim(ClusterSpec(batch_limit=256, tensor_parallel=2), n_clouds, prompts, outputs, predicted,
                          TransferCost()).run()
    print(f"{queries} held-out ShareGPT queries, {long_share:.0%} long, max_tokens = response length (<= "
          f"{max_output}); {n_clouds} clouds of one TP2 H100 replica (simulated GPUs); one burst")
    print(f"{'':>10} {'completed':>9} {'makespan s':>10} {'q/s':>6} {'offloaded':>9}  predicted tokens per cloud")
    print(f"{'served':>10} {len(finished):>9} {served_makespan:>10.1f} {len(finished) / served_makespan:>6.2f} "
          f"{offloaded:>9.0f}  {[round(x) for x in placed]} (max/min {max(placed) / min(placed):.3f})")
    sim_placed = sim.predicted_tokens_per_cluster
    print(f"{'simulated':>10} {queries:>9} {sim.makespan_s:>10.1f} {sim.throughput_qps:>6.2f} {sim.offloaded:>9}  "
          f"{[round(x) for x in sim_placed]} (max/min {max(sim_placed) / min(sim_placed):.3f})")
    print(f"served / simulated makespan: {served_makespan / sim.makespan_s:.2f}")
    return 0 if len(finished) == queries else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wattwise bench mico", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--long-share", type=float, default=0.3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="batch sizes 2, 6, 10 only")
    p.add_argument("--served", type=int, metavar="N", help="N local clouds behind the front door vs the simulator")
    p.add_argument("--queries", type=int, default=96, help="--served: queries in the burst")
    p.add_argument("--max-output", type=int, default=384, help="--served: the longest response asked for")
    args = p.parse_args(argv)
    if args.served:
        return served(args.served, args.queries, args.long_share, args.seed, args.max_output)
    rng = np.random.default_rng(args.seed)
    predictor = make_bucket_predictor(PredictorConfig(online_sample_rate=0.0), LengthClassConfig())
    buckets = predictor.buckets
    batch_sizes = [2, 6, 10] if args.quick else list(range(2, 11))
    grid = [(k, b, 800) for k in (2, 3, 6, 9) for b in batch_sizes] + [(3, 3, n) for n in (200, 500, 1000)]
    print(f"held-out ShareGPT, {args.long_share:.0%} long (>= {LONG_TOKENS} tokens); Llama2-70B TP8 per cluster; "
          "ratios vs round-robin in the same run")
    print(f"{'clusters':>8} {'batch':>5} {'queries':>7} {'RR q/s':>7} {'TB/RR':>6} {'oracle/RR':>9} "
          f"{'TB+off/RR':>9} {'KV TB/RR':>8} {'imbal RR':>8} {'imbal TB':>8} {'moved':>5}")
    ratios = []
    for k, b, n in grid:
        prompts, outputs, texts = skewed_sample(n, args.long_share, rng)
        results = run_config(ClusterSpec(batch_limit=b), k, prompts, outputs,
                             predictor.predict_buckets(texts, prompts), buckets)
        rr = results["rr"]
        ratio = {name: r.throughput_qps / rr.throughput_qps for name, r in results.items()}
        ratios.append(ratio["tb"])
        print(f"{k:>8} {b:>5} {n:>7} {rr.throughput_qps:>7.3f} {ratio['tb']:>6.3f} {ratio['oracle']:>9.3f} "
              f"{ratio['tb+offload']:>9.3f} {results['tb'].cumulative_kv_token_s / rr.cumulative_kv_token_s:>8.3f} "
              f"{rr.token_imbalance:>8.3f} {results['tb'].token_imbalance:>8.3f} {results['tb+offload'].offloaded:>5}")
    print(f"token-balanced / round-robin throughput: min {min(ratios):.3f}, "
          f"geomean {float(np.exp(np.mean(np.log(ratios)))):.3f}, max {max(ratios):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
