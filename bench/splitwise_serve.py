"""Herding under bursts in Ray Serve: Splitwise's coordinator with and without reservations.

    wattwise bench splitwise-serve [--requests 32] [--token-replicas 3] [--max-tokens 64]

Starts the app of serve_config.splitwise.yaml twice on this machine (a local Ray), once
with the coordinator's ledger reservations and once with reported load only, and fires
a burst of concurrent requests from several client threads at each. Herding is
measured on the coordinator's own assignments: max/ideal = the busiest token replica's
assigned output tokens over an even share (1.0 = perfectly spread, N = all on one of N).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import openai

from core.paths import ROOT
from wattwise.local_serve import LocalServe

CONFIG = ROOT / "serve_config.splitwise.yaml"
MODEL = "llama2-70b-sim"


def _edit(reservations: bool, token_replicas: int) -> Any:
    def edit(config: dict[str, Any]) -> None:
        args = config["applications"][0]["args"]
        args["batch_api"] = {"enabled": False}
        args["splitwise"]["reservations"] = reservations
        args["pools"] = [p for p in args["pools"] if p["phase"] != "mixed"]
        for pool in args["pools"]:
            pool["num_cpus"] = 0.05
            n = token_replicas if pool["phase"] == "token" else 2
            pool["autoscaling"] = {"min_replicas": n, "max_replicas": n}
    return edit


def _coordinator(served: LocalServe) -> Any:
    import ray
    from ray import serve

    os.environ.update({"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"})
    ray.init(address=f"127.0.0.1:{served.gcs_port}", log_to_driver=False)
    return serve.get_deployment_handle("SplitwiseCoordinator", "wattwise")


def burst(reservations: bool, requests: int, clients: int, token_replicas: int, max_tokens: int) -> dict[str, Any]:
    import ray

    with LocalServe(CONFIG, edit=_edit(reservations, token_replicas)) as served:
        coordinator = _coordinator(served)
        client = openai.OpenAI(base_url=f"{served.base_url}/v1", api_key="x", max_retries=0, timeout=300)
        client.completions.create(model=MODEL, prompt="warm up", max_tokens=2)  # every path imported
        time.sleep(1.5)  # the warm-up's load has been reported and drained
        coordinator.reset_stats.remote().result()

        def one(i: int) -> float:
            r = client.completions.create(model=MODEL, prompt=" ".join(["word"] * (100 + i % 7)),
                                          max_tokens=max_tokens)
            return (r.model_extra or {})["wattwise"]["ttft_s"]

        start = time.monotonic()
        with ThreadPoolExecutor(clients) as pool:
            ttfts = list(pool.map(one, range(requests)))
        wall_s = time.monotonic() - start
        stats = coordinator.stats.remote().result()
        ray.shutdown()
    token_uids = [uid for uid, home in stats["homes"].items() if home == "token"]
    loads = [stats["assigned_tokens"].get("token", {}).get(uid, 0) for uid in token_uids]
    return {"max_over_ideal": max(loads) / (sum(loads) / len(loads)), "loads": loads, "wall_s": wall_s,
            "ttft_p50_s": statistics.median(ttfts), "ttft_max_s": max(ttfts)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wattwise bench splitwise-serve", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--clients", type=int, default=32, help="concurrent client threads")
    parser.add_argument("--token-replicas", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    a = parser.parse_args(argv)
    rows = {}
    for name, flag in (("reservations", True), ("reports only", False)):
        # A fresh process per run: Serve caches handles (and their routers) per process.
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
            rows[name] = child.submit(burst, flag, a.requests, a.clients, a.token_replicas, a.max_tokens).result()
    print(f"burst of {a.requests} requests from {a.clients} clients; {a.token_replicas} token replicas, "
          f"2 prompt replicas; {a.max_tokens} output tokens each")
    print(f"{'coordinator':<14}{'max/ideal':>10}{'tokens per token replica':>36}{'TTFT p50':>10}{'TTFT max':>10}"
          f"{'wall s':>8}")
    for name, r in rows.items():
        print(f"{name:<14}{r['max_over_ideal']:>10.2f}{r['loads']!s:>36}{r['ttft_p50_s']:>10.3f}"
              f"{r['ttft_max_s']:>10.3f}{r['wall_s']:>8.1f}")
    ratio = rows["reports only"]["max_over_ideal"] / rows["reservations"]["max_over_ideal"]
    print(f"herding without reservations: {ratio:.2f}x the max/ideal load with them")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
