"""Kill an engine's helper processes when the process that started them dies.

vLLM's AsyncLLM runs its engine core (and, on CPU, a worker under it) in child
processes that talk to it over ZMQ and never notice when it is gone. A replica killed
without a graceful shutdown (Ray killing a crashed or hung actor, `ray stop --force`,
the OOM killer) leaves them running and holding the model's memory: 3.2 GB of RAM per
SmolLM2 replica here, GPU memory on a GPU node, where the replacement replica then
cannot start. A graceful shutdown (the replica's `__del__`) stops them itself; for the
rest, `watch_children` starts a small watchdog in its own session that checks every
`period_s` whether its parent is alive and, once it is not, stops the children it was
given and their descendants: SIGTERM, then SIGKILL after `grace_s` (vLLM's engine core
can hang on SIGTERM).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil


def watch_children(pids: list[int], period_s: float = 1.0, grace_s: float = 5.0) -> subprocess.Popen:
    """Start the watchdog for `pids` (children of this process); terminate it after a
    graceful shutdown of those children."""
    procs = [psutil.Process(pid) for pid in pids]
    args = [f"{p.pid}:{p.create_time()!r}" for p in procs]
    return subprocess.Popen(
        [sys.executable, "-m", "engines.child_reaper", str(os.getpid()), str(period_s), str(grace_s), *args],
        start_new_session=True, stdin=subprocess.DEVNULL,
    )


def new_children(before: set[int]) -> list[int]:
    """Pids of this process's direct children that are not in `before`."""
    return [p.pid for p in psutil.Process().children() if p.pid not in before]


def _alive(pid: int, created: float) -> psutil.Process | None:
    """The process if it is still the one we were given (pids are reused)."""
    try:
        proc = psutil.Process(pid)
        return proc if proc.create_time() == created else None
    except psutil.NoSuchProcess:
        return None


def reap(targets: list[tuple[int, float]], grace_s: float) -> None:
    procs = [p for pid, created in targets if (p := _alive(pid, created)) is not None]
    for proc in list(procs):
        try:
            procs += proc.children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    for proc in procs:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


def _main(argv: list[str]) -> None:
    parent, period_s, grace_s = int(argv[0]), float(argv[1]), float(argv[2])
    targets = [(int(pid), float(created)) for pid, created in (a.split(":", 1) for a in argv[3:])]
    while os.getppid() == parent:
        time.sleep(period_s)
    reap(targets, grace_s)


if __name__ == "__main__":
    _main(sys.argv[1:])
