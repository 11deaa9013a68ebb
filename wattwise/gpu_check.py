"""`wattwise gpu-check`: is this GPU machine ready for wattwise, and does its profile describe it?

Three checks, nothing downloaded; estimated at ~2 minutes on one H100 (the 8B-shaped model's build
plus 10 measurements of 2 s; not yet run on one):

1. NVML reads, which the clock governor and the energy meter rely on: supported clocks, the clock
   running, power limit and draw, and the energy counter (it must rise).
2. Clock control, what the node's GPU-control actor does: lock a mid clock, read it back, reset,
   read back (locking needs root or CAP_SYS_ADMIN).
3. A step sweep over clocks: a Llama-shaped model (random weights built with transformers, or a
   local `--model`) runs prefill steps and decode steps at each of `--clocks` clocks, each for
   `--seconds`; step time and energy per token (from the counter) are printed beside the
   profile's prediction for the same step (energy.profiles, what wattwise plans with). HF's eager
   forward is not vLLM's, so the times are not vLLM's either: what the table shows is how time
   and energy move with the clock on this GPU, against how the profile says they move.

The GPU's clock is reset to the driver's default at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from energy.calibration import default_perf_model
from energy.gpu_control import GpuControl, NvmlGpu
from energy.perf_model import PerfModel
from energy.profiles import profile_label

# Llama-3.1-8B's shape: the profile of its default (mlenergy-llama3.1-8b-h100) describes it.
LLAMA_8B = {"hidden": 4096, "layers": 32, "heads": 32, "kv_heads": 8, "intermediate": 14336, "vocab": 128256}


@dataclass(frozen=True)
class StepRow:
    """One kind of step at one clock: measured, and as the profile predicts it."""

    clock_mhz: int
    phase: str  # "prefill" or "decode"
    tokens_per_step: int
    step_s: float
    j_per_token: float
    predicted_step_s: float
    predicted_j_per_token: float


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="wattwise gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU (CUDA's too: PCI bus order)")
    parser.add_argument("--model", help="a local model directory instead of random weights")
    parser.add_argument("--profile-model", default="llama3.1-8b", help="model the profile's prediction is for")
    parser.add_argument("--hardware", default="h100-80gb", help="GPU the profile's prediction is for")
    parser.add_argument("--profile", help="named profile (energy.profiles); default: the model's and GPU's")
    parser.add_argument("--clocks", type=int, default=5, help="clocks swept, evenly over the supported ones")
    parser.add_argument("--seconds", type=float, default=2.0, help="each measurement runs at least this long")
    parser.add_argument("--batch", type=int, default=8, help="sequences per step")
    parser.add_argument("--prompt-tokens", type=int, default=512, help="tokens of each prompt (and decode context)")
    for name, value in LLAMA_8B.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=value, help=f"random model's {name}")
    return parser.parse_args(argv)


def main(argv: list[str], nvml: Any = None) -> int:
    """`nvml`: NVML's API (None: nvidia-ml-py; a fake one on a machine without a GPU)."""
    args = parse(argv)
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA numbers GPUs as NVML does
    gpus = NvmlGpu(nvml)
    index = args.gpu
    try:
        clocks = check_reads(gpus, index)
        check_lock(gpus, index, clocks[len(clocks) // 2])
        perf = default_perf_model(args.profile_model, args.hardware, args.profile)
        rows = sweep(gpus, index, spread(clocks, args.clocks), args, perf)
    finally:
        gpus.reset_clock(index)
        print(f"GPU {index}: clocks reset to the driver's default")
    print_rows(rows, profile_label(args.profile, args.profile_model, args.hardware))
    return 0


def check_reads(gpus: GpuControl, index: int) -> list[int]:
    """What wattwise reads of a GPU, printed; the supported clocks."""
    clocks = gpus.supported_clocks_mhz(index)
    start_j = gpus.energy_j(index)
    print(f"NVML: {gpus.device_count()} GPUs; GPU {index}: {len(clocks)} clocks {clocks[0]}-{clocks[-1]} MHz, "
          f"running {gpus.clock_mhz(index)} MHz, power {gpus.power_w(index):.0f} W of "
          f"{gpus.power_limit_w(index):.0f} W limit, energy counter {start_j:.1f} J")
    deadline = time.monotonic() + 10.0  # the driver refreshes the counter on its own period
    while gpus.energy_j(index) <= start_j:
        if time.monotonic() > deadline:
            raise RuntimeError(f"GPU {index}'s energy counter did not rise in 10 s")
        time.sleep(0.05)
    print("energy counter: rising")
    return clocks


def check_lock(gpus: GpuControl, index: int, clock_mhz: int) -> None:
    """Lock, read back, reset, read back: what the GPU-control actor does for replicas."""
    gpus.lock_clock(index, clock_mhz)
    locked = gpus.clock_mhz(index)
    gpus.reset_clock(index)
    print(f"clock lock: asked {clock_mhz} MHz, read back {locked} MHz; after reset {gpus.clock_mhz(index)} MHz")
    if locked != clock_mhz:
        print(f"  note: the GPU runs {locked} MHz under a {clock_mhz} MHz lock (power or thermal capping, or idle)")


def spread(clocks: list[int], n: int) -> list[int]:
    """`n` of the supported clocks, evenly from the lowest to the highest."""
    if n <= 1:
        return [clocks[-1]]
    return sorted({clocks[round(i * (len(clocks) - 1) / (n - 1))] for i in range(n)})


def sweep(gpus: GpuControl, index: int, clocks: list[int], args: argparse.Namespace, perf: PerfModel) -> list[StepRow]:
    import torch

    device = torch.device(f"cuda:{index}" if torch.cuda.is_available() else "cpu")
    model = _model(args, device)
    prompts = torch.randint(0, model.config.vocab_size, (args.batch, args.prompt_tokens), device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows: list[StepRow] = []
    with torch.inference_mode():
        cache = model(prompts, use_cache=True).past_key_values  # warm-up, and the decode steps' context
        next_ids = prompts[:, -1:]

        def prefill() -> None:
            model(prompts, use_cache=False)

        def decode() -> None:
            model(next_ids, past_key_values=cache, use_cache=True)
            cache.crop(-1)  # drop the token it added: each decode step over the same context

        for clock in clocks:
            gpus.lock_clock(index, clock)
            for phase, step, tokens in (("prefill", prefill, args.batch * args.prompt_tokens),
                                        ("decode", decode, args.batch)):
                step_s, joules = _measure(step, sync, lambda: gpus.energy_j(index), args.seconds)
                rows.append(_row(perf, clock, phase, tokens, step_s, joules, args))
    return rows


def _model(args: argparse.Namespace, device: Any) -> Any:
    """The checked model: `--model` from disk, else random weights of the given Llama shape."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.model:
        return AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(device).eval()
    config = LlamaConfig(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, intermediate_size=args.intermediate,
                         vocab_size=args.vocab, max_position_embeddings=args.prompt_tokens + 16)
    torch.manual_seed(0)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in its dtype on the device: an 8B model never in fp32 on the host
    try:
        with device:
            return LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default_dtype)


def _measure(step: Callable[[], None], sync: Callable[[], None], energy_j: Callable[[], float],
             seconds: float) -> tuple[float, float]:
    """Steps back to back for at least `seconds` (and 3 steps): mean step time, joules used."""
    step()  # the new clock's first step
    sync()
    start_s, start_j, steps = time.perf_counter(), energy_j(), 0
    while steps < 3 or time.perf_counter() - start_s < seconds:
        step()
        steps += 1
    sync()
    return (time.perf_counter() - start_s) / steps, (energy_j() - start_j) / steps


def _row(perf: PerfModel, clock: int, phase: str, tokens: int, step_s: float, step_j: float,
         args: argparse.Namespace) -> StepRow:
    batch, prompt = args.batch, args.prompt_tokens
    if phase == "prefill":
        predicted = perf.iteration(batch * prompt, float(batch * prompt * prompt), 0, 0, 1, clock)
    else:
        predicted = perf.iteration(0, 0.0, batch, batch * prompt, 1, clock)
    return StepRow(clock, phase, tokens, step_s, step_j / tokens, predicted.time_s, predicted.energy_j / tokens)


def print_rows(rows: list[StepRow], profile: str) -> None:
    print(f"\nstep sweep (measured | {profile} predicts):")
    print("clock MHz  phase    tokens/step  step ms  J/token   | step ms  J/token")
    for r in rows:
        print(f"{r.clock_mhz:9d}  {r.phase:7s}  {r.tokens_per_step:11d}  {1000 * r.step_s:7.2f}  {r.j_per_token:8.4f}"
              f"  | {1000 * r.predicted_step_s:7.2f}  {r.predicted_j_per_token:8.4f}")
