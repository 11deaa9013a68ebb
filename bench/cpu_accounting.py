"""CPU seconds spent by each kind of process over a phase of a benchmark.

On a machine with few cores, every CPU second the proxy, ingress or replica spends
is a second the engine does not get; this says where an overhead ratio comes from.
"""

from __future__ import annotations

import re

import psutil

# Process titles Ray and vLLM set, most specific first -> the label printed.
_LABELS = (
    (re.compile(r"EngineCore"), "vLLM engine core"),
    (re.compile(r"VLLM::Worker"), "vLLM worker"),
    (re.compile(r"multiprocessing\.spawn|spawn_main"), "spawned processes (untitled engine)"),
    (re.compile(r"ServeReplica:[^:]*:Ingress"), "ingress replica"),
    (re.compile(r"ServeReplica:[^:]*:pool-"), "pool replica"),
    (re.compile(r"ServeReplica"), "other Serve replicas"),
    (re.compile(r"ProxyActor"), "Serve HTTP proxy"),
    (re.compile(r"ServeController"), "Serve controller"),
    (re.compile(r"raylet|gcs_server|dashboard|ray::|ray/"), "Ray system"),
)


def _label(proc: psutil.Process) -> str | None:
    try:
        title = " ".join(proc.cmdline()) or proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    if proc.pid == psutil.Process().pid:
        return "benchmark client"
    for pattern, label in _LABELS:
        if pattern.search(title):
            return label
    return None


def snapshot() -> dict[int, tuple[str, float]]:
    """pid -> (label, user + system CPU seconds so far), for the processes we label."""
    out = {}
    for proc in psutil.process_iter():
        label = _label(proc)
        if label is None:
            continue
        try:
            times = proc.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        out[proc.pid] = (label, times.user + times.system)
    return out


def cpu_by_label(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per label between two snapshots (processes born in between count whole)."""
    used: dict[str, float] = {}
    for pid, (label, cpu_s) in after.items():
        used[label] = used.get(label, 0.0) + cpu_s - before.get(pid, (label, 0.0))[1]
    return dict(sorted(used.items(), key=lambda kv: -kv[1]))
