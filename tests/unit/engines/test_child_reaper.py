"""A replica killed without shutdown must not leave its engine processes behind."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

# A "replica": starts an "engine core" (which starts a "worker" that ignores SIGTERM, as
# vLLM's engine core can hang on it), hands both to the watchdog, prints the pids, waits.
REPLICA = textwrap.dedent("""
    import subprocess, sys, time
    from engines.child_reaper import new_children, watch_children
    before = set()
    core = subprocess.Popen([sys.executable, "-c",
        "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        "print(w.pid, flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    worker = int(core.stdout.readline())
    watchdog = watch_children(new_children(before), period_s=0.2, grace_s=1.0)
    print(core.pid, worker, watchdog.pid, flush=True)
    time.sleep(600)
""")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(pids: list[int], timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(_gone(pid) for pid in pids):
            return True
        time.sleep(0.2)
    return False


def test_engine_processes_die_with_a_killed_replica() -> None:
    replica = subprocess.Popen([sys.executable, "-c", REPLICA], stdout=subprocess.PIPE, text=True,
                               cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
    core, worker, watchdog = (int(x) for x in replica.stdout.readline().split())
    try:
        time.sleep(1)
        assert not any(_gone(pid) for pid in (core, worker, watchdog))  # alive while the replica is
        replica.send_signal(signal.SIGKILL)
        replica.wait()
        # The core ignores SIGTERM: it goes at SIGKILL after the grace period, its worker with it.
        assert _wait_gone([core, worker, watchdog])
    finally:
        for pid in (core, worker, watchdog):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_graceful_shutdown_stops_the_watchdog_and_leaves_others_alone() -> None:
    from engines.child_reaper import new_children, watch_children

    before = {p.pid for p in psutil.Process().children()}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        pids = new_children(before)
        assert pids == [child.pid]
        watchdog = watch_children(pids, period_s=0.2)
        time.sleep(0.5)
        watchdog.terminate()
        assert watchdog.wait(timeout=10) is not None
        assert child.poll() is None  # this process is alive: nothing was reaped
    finally:
        child.kill()
        child.wait()
