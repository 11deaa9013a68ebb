"""Mico's multi-cluster experiment (§4.2, Table 1) in the simulator.

    python -m bench.mico_dispatch            # Table 1 grid (800 queries) + query-count sweep
    python -m bench.mico_dispatch --quick

One batch of held-out ShareGPT prompts (predicted by the default text predictor, true
response lengths as outputs) with skewed lengths (`--long-share` of them drawn from
responses of >= 470 tokens, about 300 words) is dispatched over 2-9 clusters, each a Llama2-70B TP8
replica on the shared ContinuousBatcher with batch limit 2-10. Compared in the same
run: count-balanced round-robin (Mico's Q-bar), token-balanced with the predictor,
with true buckets (oracle), and with the predictor plus back-off offloading. Both
sides batch continuously, so the ratios are Mico's Q vs Q-bar ablation (Fig. 12a),
not Table 1's Q+I vs Q-bar+I-bar.
"""

from __future__ import annotations

import argparse

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.mico_dispatch", description=__doc__)
    p.add_argument("--long-share", type=float, default=0.3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="batch sizes 2, 6, 10 only")
    args = p.parse_args(argv)
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
