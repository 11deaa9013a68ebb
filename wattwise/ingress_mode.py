"""How HTTP reaches the app's ingress replicas under Ray Serve 2.60.

Serve's default is its Python proxy actor; Ray 2.60 can instead let each ingress replica
serve HTTP on a port of its own (direct ingress) or put HAProxy in front of those ports,
which wattwise runs by default (DEFAULT_INGRESS: LocalServe, the demo, cluster.yaml).
Both are process environment flags read at import by every Ray process, so a mode holds
for a cluster's whole life: `LocalServe(ingress=...)` starts Ray with `env` and `http_host`.
docs/operations.md ("Serve's fast path") has what each mode costs and what it lacks.
"""

from __future__ import annotations

import os
from enum import StrEnum


class IngressMode(StrEnum):
    PROXY = "proxy"  # Serve's Python proxy on http_options.port (Serve's default)
    DIRECT = "direct"  # RAY_SERVE_ENABLE_DIRECT_INGRESS: clients call a replica's port (30000+)
    HAPROXY = "haproxy"  # RAY_SERVE_ENABLE_HA_PROXY: HAProxy on http_options.port -> replicas' ports (ours)

    @property
    def env(self) -> dict[str, str]:
        """The flags Ray's processes need for this mode (HAProxy implies direct ingress)."""
        return {
            IngressMode.PROXY: {},
            IngressMode.DIRECT: {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"},
            IngressMode.HAPROXY: {"RAY_SERVE_ENABLE_HA_PROXY": "1"},
        }[self]

    @property
    def http_host(self) -> str:
        """Where the app listens. Serve publishes replica ports at the node's IP (Ray maps a
        loopback node address to the machine's), so replicas reached there must listen on it."""
        return "127.0.0.1" if self is IngressMode.PROXY else "0.0.0.0"


# HAProxy: faster than Serve's proxy in every cell of `wattwise bench ingress` (docs/operations.md,
# "Serve's fast path"), one port balanced over the ingress replicas, and every Ray test runs it.
# WATTWISE_INGRESS=proxy falls back to Serve's proxy (e.g. where HAProxy's ports 8404/9101 are taken).
DEFAULT_INGRESS = IngressMode(os.environ.get("WATTWISE_INGRESS", IngressMode.HAPROXY.value))
