"""LocalServe on a shared machine: a port it picked free and another process took before
Ray or HAProxy bound it (it happened in 1 of 6 CI runs beside other clusters) costs one
more start on fresh ports, not a failed test run."""

import socket

import httpx
import pytest

from tests.factories import INTERACTIVE_KEY, quick_config
from wattwise.local_serve import LocalServe


@pytest.mark.ray
@pytest.mark.parametrize("port", ["http", "haproxy_stats"])  # Serve's port, and one only HAProxy binds
def test_a_port_taken_before_the_cluster_bound_it_is_replaced_and_the_app_serves(port: str) -> None:
    local = LocalServe(edit=quick_config)
    taken = {"http": local.http_port, "haproxy_stats": int(local.env["RAY_SERVE_HAPROXY_STATS_PORT"])}[port]
    with socket.socket() as thief:
        thief.bind(("0.0.0.0", taken))
        thief.listen()
        with local:
            assert taken not in (local.http_port, int(local.env["RAY_SERVE_HAPROXY_STATS_PORT"]))
            assert local.config["http_options"]["port"] == local.http_port
            assert "start attempt 1 failed" in local.log_path.read_text()
            reply = httpx.post(f"{local.base_url}/v1/completions", timeout=60,
                               headers={"authorization": f"Bearer {INTERACTIVE_KEY}"},
                               json={"model": "llama2-70b-sim", "prompt": "hello there", "max_tokens": 2})
            assert reply.status_code == 200
