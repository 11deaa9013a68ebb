"""Soak: a steady request rate through HTTP for a long time, with the memory of the Ray
processes sampled throughout. A leak (per-request state never freed in the ingress,
replicas, controller or proxy) shows as RSS growing with the number of requests served.

Requests arrive open-loop at `--rate` per second (half streamed, prompts and lengths
spread over the short and medium pools) against the local app started as `serve run`
would. Prints the rate, duration, every request's fate (client side, and the ingress's
own accepted/outcome counts) and RSS at start (after warm-up) and end per process kind.
Run: `wattwise bench soak [--duration-s 600] [--rate 4]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time
from collections import Counter
from collections.abc import Iterator

import numpy as np
import openai
import psutil

from wattwise.local_serve import LocalServe

MODEL = "llama2-70b-sim"
# Process title fragments (Ray sets them to the actor's class) -> kind.
KINDS = (("ServeController", "controller"), ("ProxyActor", "proxy"), (":Ingress", "ingress"),
         (":pool-", "replica"), (":batch-queue", "batch_queue"), ("raylet", "raylet"), ("gcs_server", "gcs"))
RETRYABLE_STATUS = (429, 503)


def _kind(proc: psutil.Process) -> str | None:
    try:
        title = " ".join(proc.cmdline()) or proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    return next((kind for fragment, kind in KINDS if fragment in title), None)


def sample_rss_mb() -> dict[str, tuple[int, float]]:
    """(process count, total RSS in MB) per kind of Ray process of this user."""
    totals: dict[str, list[float]] = {}
    for proc in psutil.process_iter():
        kind = _kind(proc)
        if kind is None:
            continue
        try:
            if proc.uids().real != os.getuid():
                continue
            rss = proc.memory_info().rss / 2**20
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        entry = totals.setdefault(kind, [0, 0.0])
        entry[0] += 1
        entry[1] += rss
    return {k: (int(n), mb) for k, (n, mb) in totals.items()}


def _requests(seed: int) -> Iterator[tuple[int, int, bool]]:
    """(prompt words, max tokens, stream) of successive requests: short and medium pools."""
    rng = random.Random(seed)
    while True:
        yield rng.choice((rng.randint(8, 200), rng.randint(300, 600))), rng.randint(16, 96), rng.random() < 0.5


async def _one(client: openai.AsyncOpenAI, words: int, max_tokens: int, stream: bool,
               tally: Counter, e2e_s: list[tuple[float, float]]) -> None:
    start = time.monotonic()
    prompt = " ".join(["word"] * words)
    finish = None
    try:
        if stream:
            async for chunk in await client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens,
                                                               stream=True):
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
        else:
            finish = (await client.completions.create(model=MODEL, prompt=prompt,
                                                      max_tokens=max_tokens)).choices[0].finish_reason
    except openai.APIStatusError as exc:
        tally["error_retryable" if exc.status_code in RETRYABLE_STATUS else "error_final"] += 1
        return
    except openai.APIError:  # an error event inside a stream
        tally["error_stream"] += 1
        return
    tally["completed" if finish else "lost"] += 1
    e2e_s.append((start, time.monotonic() - start))


async def _load(base_url: str, rate: float, duration_s: float, warmup_s: float, sample_s: float, seed: int
                ) -> tuple[Counter, list[tuple[float, float]], list[tuple[float, dict]], float]:
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="soak", max_retries=0, timeout=300)
    tally: Counter = Counter()
    e2e_s: list[tuple[float, float]] = []
    samples: list[tuple[float, dict]] = []
    tasks: set[asyncio.Task] = set()
    start = time.monotonic()
    next_sample = start + warmup_s
    specs = _requests(seed)
    sent = 0
    while (now := time.monotonic()) < start + duration_s:
        if now >= next_sample:
            samples.append((now - start, await asyncio.to_thread(sample_rss_mb)))
            next_sample += sample_s
        while sent < (now - start) * rate:  # open loop: arrivals do not wait for answers
            words, max_tokens, stream = next(specs)
            task = asyncio.create_task(_one(client, words, max_tokens, stream, tally, e2e_s))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            sent += 1
        await asyncio.sleep(min(1.0 / rate, 0.05))
    await asyncio.gather(*tasks)
    samples.append((time.monotonic() - start, await asyncio.to_thread(sample_rss_mb)))
    tally["sent"] = sent
    return tally, e2e_s, samples, time.monotonic() - start


def _ingress_counts(local: LocalServe) -> dict[str, int]:
    response = local.admin("GET", "/admin/requests")
    response.raise_for_status()
    return response.json()


def _report(args: argparse.Namespace, tally: Counter, e2e_s: list[tuple[float, float]],
            samples: list[tuple[float, dict]], wall_s: float, before: dict[str, int], after: dict[str, int]) -> None:
    server = {k: after[k] - before.get(k, 0) for k in after}
    print(f"\nsoak: rate {args.rate:g} req/s, duration {args.duration_s:g} s (wall {wall_s:.0f} s), "
          f"sent {tally['sent']} ({tally['sent'] / wall_s:.2f} req/s)")
    print("client:  " + ", ".join(f"{k} {tally[k]}" for k in
                                  ("completed", "error_retryable", "error_stream", "error_final", "lost")))
    print("ingress: " + ", ".join(f"{k} {v}" for k, v in server.items()))
    half = args.duration_s / 2
    for name, part in (("first half", [d for t, d in e2e_s if t - e2e_s[0][0] < half]),
                       ("second half", [d for t, d in e2e_s if t - e2e_s[0][0] >= half])):
        if part:
            print(f"e2e {name}: p50 {np.percentile(part, 50) * 1e3:.0f} ms, p99 {np.percentile(part, 99) * 1e3:.0f} ms"
                  f" ({len(part)} requests)")
    first_t, first = samples[0]
    last_t, last = samples[-1]
    print(f"\nRSS per process kind, start (t={first_t:.0f} s, after warm-up) and end (t={last_t:.0f} s):")
    print("| kind | processes start/end | RSS start MB | RSS end MB | change | max MB |")
    print("|---|---|---|---|---|---|")
    for kind in sorted(set(first) | set(last)):
        n0, mb0 = first.get(kind, (0, 0.0))
        n1, mb1 = last.get(kind, (0, 0.0))
        peak = max(s.get(kind, (0, 0.0))[1] for _, s in samples)
        change = f"{(mb1 - mb0) / mb0 * 100:+.1f}%" if mb0 else "n/a"
        print(f"| {kind} | {n0}/{n1} | {mb0:.0f} | {mb1:.0f} | {change} | {peak:.0f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wattwise bench soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=600.0)
    parser.add_argument("--rate", type=float, default=4.0, help="requests per second")
    parser.add_argument("--warmup-s", type=float, default=30.0, help="load before the first memory sample")
    parser.add_argument("--sample-s", type=float, default=15.0, help="seconds between memory samples")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with LocalServe() as local:
        before = _ingress_counts(local)
        tally, e2e_s, samples, wall_s = asyncio.run(
            _load(local.base_url, args.rate, args.duration_s, args.warmup_s, args.sample_s, args.seed))
        time.sleep(2)  # let the ingress record the last outcomes
        after = _ingress_counts(local)
    _report(args, tally, e2e_s, samples, wall_s, before, after)
    return 0 if tally["lost"] == 0 and tally["error_final"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
