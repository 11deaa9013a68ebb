"""Workloads for the simulator: Azure traces (or any CSV like them), Mooncake's (or any
JSONL like it) and synthetic ones.

A workload is three aligned arrays (arrival time, prompt tokens, output tokens) plus
a service class per request; every transform returns a new one and takes an explicit
numpy Generator, so a seed fixes the whole run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

import numpy as np

from core.paths import DATA
from core.prefix_cache import chained

# The checkout's data/ or, in an installed wheel, its package data (core.paths).
TRACE_DIR = DATA / "azure"
TRACES = {
    **{name: TRACE_DIR / f"AzureLLMInferenceTrace_{name}.csv" for name in ("conv", "code")},
    # Long prompts (15k-token mean, beyond most models' context: fit_context clips them).
    "mooncake": DATA / "mooncake" / "synthetic_trace.jsonl",
}


@dataclass(frozen=True)
class Workload:
    arrival_s: np.ndarray  # float64, sorted, starting near 0
    prompt_tokens: np.ndarray  # int64 >= 1
    output_tokens: np.ndarray  # int64 >= 1
    interactive: np.ndarray  # bool: interactive (else batch) service class
    # Each prompt's prefix blocks of `prefix_block_tokens` tokens, chained hashes
    # (core.prefix_cache): Mooncake's hash_ids, the multi-turn generator's. None: unknown.
    prefix: tuple[tuple[int, ...], ...] | None = None
    prefix_block_tokens: int = 0

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if not (len(self.prompt_tokens) == len(self.output_tokens) == len(self.interactive) == n):
            raise ValueError("workload arrays must have the same length")
        if self.prefix is not None and len(self.prefix) != n:
            raise ValueError("workload prefix blocks must be one entry per request")

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1]) if len(self) else 0.0

    def take(self, mask: np.ndarray) -> Workload:
        """The requests a boolean mask or an index array picks (repeats allowed), in its order."""
        idx = np.flatnonzero(mask) if mask.dtype == bool else mask
        prefix = None if self.prefix is None else tuple(self.prefix[i] for i in idx)
        return replace(self, arrival_s=self.arrival_s[idx], prompt_tokens=self.prompt_tokens[idx],
                       output_tokens=self.output_tokens[idx], interactive=self.interactive[idx], prefix=prefix)


def _parse_time(stamp: str) -> float:
    # Seven fractional digits: datetime takes six.
    head, _, frac = stamp.partition(".")
    return datetime.fromisoformat(head).timestamp() + float("0." + (frac or "0"))


def load_trace(source: str | Path) -> Workload:
    """A CSV with TIMESTAMP, ContextTokens, GeneratedTokens, or a JSONL like Mooncake's
    ('conv'/'code'/'mooncake' name the shipped ones)."""
    path = TRACES.get(str(source), Path(source))
    if path.suffix == ".jsonl":
        return _load_jsonl(path)
    data = np.genfromtxt(path, delimiter=",", names=True, dtype=None, encoding="utf-8")
    stamps = np.array([_parse_time(s) for s in np.atleast_1d(data["TIMESTAMP"])])
    order = np.argsort(stamps, kind="stable")
    arrival = stamps[order] - stamps[order[0]]
    prompt = np.maximum(np.atleast_1d(data["ContextTokens"])[order].astype(np.int64), 1)
    output = np.maximum(np.atleast_1d(data["GeneratedTokens"])[order].astype(np.int64), 1)
    return Workload(arrival, prompt, output, np.ones(len(arrival), dtype=bool))


MOONCAKE_BLOCK_TOKENS = 512  # the tokens of one of its hash_ids' blocks


def _load_jsonl(path: Path) -> Workload:
    """Mooncake's trace format: one object a line with `timestamp` (ms), `input_length` and
    `output_length` (tokens), and `hash_ids` (its 512-token prompt blocks; equal ids, equal
    prefix content), kept as the prompt's full blocks. Requests keep the file's order at equal
    times (a conversation's turns)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    stamps_s = np.array([row["timestamp"] for row in rows], dtype=float) / 1000.0
    order = np.argsort(stamps_s, kind="stable")
    arrival = stamps_s[order] - (stamps_s[order[0]] if len(rows) else 0.0)
    prompt = np.maximum(np.array([row["input_length"] for row in rows], dtype=np.int64)[order], 1)
    output = np.maximum(np.array([row["output_length"] for row in rows], dtype=np.int64)[order], 1)
    prefix = None
    if rows and all("hash_ids" in row for row in rows):
        prefix = tuple(chained(rows[i]["hash_ids"][:rows[i]["input_length"] // MOONCAKE_BLOCK_TOKENS])
                       for i in order)
    return Workload(arrival, prompt, output, np.ones(len(rows), dtype=bool), prefix,
                    MOONCAKE_BLOCK_TOKENS if prefix is not None else 0)


def window(w: Workload, start_s: float = 0.0, duration_s: float | None = None) -> Workload:
    """Requests arriving in [start_s, start_s + duration_s), re-based to start at 0."""
    end = np.inf if duration_s is None else start_s + duration_s
    mask = (w.arrival_s >= start_s) & (w.arrival_s < end)
    out = w.take(mask)
    return replace(out, arrival_s=out.arrival_s - start_s)


def shuffle_blocks(w: Workload, block_s: float, rng: np.random.Generator) -> Workload:
    """The trace's `block_s` blocks in a random order, each block's arrivals kept as they
    were: the same bursts in a sequence no policy was tuned on."""
    if block_s <= 0:
        raise ValueError("block length must be > 0")
    block = (w.arrival_s // block_s).astype(np.int64)
    slot = np.empty(int(block.max()) + 1 if len(w) else 0, dtype=np.int64)
    slot[rng.permutation(len(slot))] = np.arange(len(slot))
    arrival = slot[block] * block_s + (w.arrival_s - block * block_s)
    order = np.argsort(arrival, kind="stable")
    return replace(w.take(order), arrival_s=arrival[order])


def scale_time(w: Workload, factor: float) -> Workload:
    """Stretch (factor > 1) or compress the timeline; the rate changes by 1/factor."""
    if factor <= 0:
        raise ValueError("time scale must be > 0")
    return replace(w, arrival_s=w.arrival_s * factor)


def scale_rate(w: Workload, factor: float, rng: np.random.Generator) -> Workload:
    """Same timeline, `factor` times the requests: thin (< 1) or add jittered copies (> 1).

    Copies arrive within one mean inter-arrival gap of their original, so bursts keep
    their shape while the rate scales."""
    if factor <= 0:
        raise ValueError("rate scale must be > 0")
    whole, frac = int(factor), factor - int(factor)
    picks = [np.arange(len(w))] * whole
    if frac > 0:
        picks.append(np.flatnonzero(rng.random(len(w)) < frac))
    idx = np.concatenate(picks) if picks else np.array([], dtype=np.int64)
    gap = w.duration_s / max(len(w), 1)
    # The first copy (or the thinned trace) keeps its times; added copies are jittered.
    jitter = np.concatenate([np.zeros(len(p)) if i == 0 else rng.uniform(0, gap, len(p)) for i, p in enumerate(picks)])
    return _rearrived(w, idx, w.arrival_s[idx] + jitter)


def _rearrived(w: Workload, idx: np.ndarray, arrival_s: np.ndarray) -> Workload:
    """Requests `idx` of `w` (repeats allowed) arriving at `arrival_s`, in time order."""
    order = np.argsort(arrival_s, kind="stable")
    return replace(w.take(idx[order]), arrival_s=arrival_s[order])


def amplify_rate(w: Workload, low_rps: float, peak_rps: float, bin_s: float, rng: np.random.Generator) -> Workload:
    """The trace's rate curve mapped onto [`low_rps`, `peak_rps`]: its shape kept, the gap
    between its quietest and busiest bins (about `bin_s` long) widened or narrowed to that range.

    throttLL'eM's headline experiment (paper §V-D2) scales the Azure trace this way, to
    10%-100% of the largest engine's max load, so that every engine size serves part of
    it. The rate at each arrival is the bins' rates interpolated between bin centres, so
    the load ramps rather than jumps at bin edges; a request is kept floor(f) times and
    once more with probability frac(f), f its target rate over the trace's rate there,
    its copies jittered within one target inter-arrival gap."""
    if not 0 < low_rps <= peak_rps:
        raise ValueError("need 0 < low_rps <= peak_rps")
    if bin_s <= 0:
        raise ValueError("bin length must be > 0")
    edges = np.linspace(0.0, w.duration_s, max(round(w.duration_s / bin_s), 1) + 1)  # equal bins, none partial
    counts = np.histogram(w.arrival_s, edges)[0]
    rates = counts / np.diff(edges)
    if rates.max() == rates.min():
        raise ValueError("a trace of one rate has no shape to amplify")
    rate = np.interp(w.arrival_s, (edges[:-1] + edges[1:]) / 2, rates)
    target = low_rps + (rate - rates.min()) / (rates.max() - rates.min()) * (peak_rps - low_rps)
    factor = target / rate
    copies = np.floor(factor).astype(np.int64) + (rng.random(len(w)) < factor - np.floor(factor))
    idx = np.repeat(np.arange(len(w)), copies)
    first = np.r_[True, idx[1:] != idx[:-1]]
    return _rearrived(w, idx, w.arrival_s[idx] + np.where(first, 0.0, rng.uniform(0.0, 1.0 / target[idx])))


def gamma_arrivals(rate_per_s: float, duration_s: float, cv: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times with Gamma inter-arrivals of the given CV (1 = Poisson, > 1 bursty)."""
    if rate_per_s <= 0 or cv <= 0:
        raise ValueError("rate and cv must be > 0")
    shape = 1.0 / cv**2
    n = int(rate_per_s * duration_s * 1.2) + 16
    times = np.cumsum(rng.gamma(shape, 1.0 / (rate_per_s * shape), n))
    while times[-1] < duration_s:
        more = np.cumsum(rng.gamma(shape, 1.0 / (rate_per_s * shape), n)) + times[-1]
        times = np.concatenate([times, more])
    return times[times < duration_s]


def synthetic(
    rate_per_s: float,
    duration_s: float,
    rng: np.random.Generator,
    cv: float = 1.0,
    lengths_from: Workload | None = None,
    prompt_lognormal: tuple[float, float] = (6.5, 1.0),
    output_lognormal: tuple[float, float] = (5.0, 0.8),
) -> Workload:
    """Gamma arrivals; lengths resampled from a trace if given, else lognormal (mu, sigma)."""
    arrival = gamma_arrivals(rate_per_s, duration_s, cv, rng)
    n = len(arrival)
    if lengths_from is not None and len(lengths_from):
        idx = rng.integers(0, len(lengths_from), n)
        prompt, output = lengths_from.prompt_tokens[idx], lengths_from.output_tokens[idx]
    else:
        prompt = np.maximum(rng.lognormal(*prompt_lognormal, n).astype(np.int64), 1)
        output = np.maximum(rng.lognormal(*output_lognormal, n).astype(np.int64), 1)
    return Workload(arrival, prompt, output, np.ones(n, dtype=bool))


def diurnal(mean_rate_per_s: float, hours: float, peak_to_trough: float, rng: np.random.Generator,
            lengths_from: Workload) -> Workload:
    """A day-shaped load: Poisson arrivals whose rate follows a sine with its trough at
    t = 0 and its peak 12 h later, `peak_to_trough` times the trough (DynamoLLM: 3x-35x
    swings between day and night), lengths resampled from a trace."""
    if peak_to_trough < 1:
        raise ValueError("peak_to_trough must be >= 1")
    amplitude = (peak_to_trough - 1) / (peak_to_trough + 1)
    duration_s = hours * 3600.0
    peak = mean_rate_per_s * (1 + amplitude)
    candidates = gamma_arrivals(peak, duration_s, 1.0, rng)  # thinned to the day's rate
    rate = mean_rate_per_s * (1 - amplitude * np.cos(2 * np.pi * candidates / 86400.0))
    arrival = candidates[rng.random(len(candidates)) < rate / peak]
    idx = rng.integers(0, len(lengths_from), len(arrival))
    return Workload(arrival, lengths_from.prompt_tokens[idx], lengths_from.output_tokens[idx],
                    np.ones(len(arrival), dtype=bool))


def with_batch_fraction(w: Workload, batch_fraction: float, rng: np.random.Generator) -> Workload:
    """Mark a random share of requests as batch service class (Chiron's mix)."""
    if not 0 <= batch_fraction <= 1:
        raise ValueError("batch fraction must be in [0, 1]")
    return replace(w, interactive=rng.random(len(w)) >= batch_fraction)


def fit_context(w: Workload, max_context_tokens: int) -> Workload:
    """Clip prompts so prompt + output fits the model's context (traces hold a few longer ones)."""
    output = np.minimum(w.output_tokens, max_context_tokens - 1)
    prompt = np.clip(w.prompt_tokens, 1, max_context_tokens - output)
    prefix = None if w.prefix is None else tuple(
        blocks[:int(p) // w.prefix_block_tokens] for blocks, p in zip(w.prefix, prompt, strict=True))
    return replace(w, prompt_tokens=prompt, output_tokens=output, prefix=prefix)


def superpose(*workloads: Workload) -> Workload:
    """Every workload's requests together, in time order (ties keep the given order)."""
    order = np.argsort(np.concatenate([w.arrival_s for w in workloads]), kind="stable")

    def joined(arrays: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(arrays)[order]

    return Workload(joined([w.arrival_s for w in workloads]), joined([w.prompt_tokens for w in workloads]),
                    joined([w.output_tokens for w in workloads]), joined([w.interactive for w in workloads]))


def batch_dump(w: Workload, n: int, at_s: float, rng: np.random.Generator) -> Workload:
    """`w` plus `n` batch requests all queued at `at_s` (Chiron's W_B), lengths drawn from `w`."""
    idx = rng.integers(0, len(w), n)
    return superpose(w, Workload(np.full(n, at_s), w.prompt_tokens[idx], w.output_tokens[idx], np.zeros(n, dtype=bool)))

