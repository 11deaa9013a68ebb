"""Helpers for tests against a live app: poll until something holds, read its metrics,
look inside a replica."""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from wattwise.local_serve import LocalServe, _bin

SERVE_RUN_ATTEMPTS = 3


def wait_for(predicate: Callable[[], object], timeout_s: float, what: str, poll_s: float = 1.0) -> float:
    """Seconds until `predicate` held; fails after `timeout_s`, which callers make generous
    (a slow shared machine), so a test asserts the outcome, not how fast it came."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if predicate():
            return time.monotonic() - start
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def serve_run(address: str, config_path: Path, log_path: Path) -> None:
    """`serve run --non-blocking` of `config_path` on the cluster at `address`, tried again
    if it fails: on a busy machine Serve's HTTP proxies can miss its fixed 60 s to start
    (a CI run's exit status 1). Trying again is safe: a second run finds the Serve already
    started and deploys the same config. The last failure names the log's end."""
    for attempt in range(1, SERVE_RUN_ATTEMPTS + 1):
        with open(log_path, "a") as log:
            done = subprocess.run([_bin("serve"), "run", "--non-blocking", "-a", address, str(config_path)],
                                  env=os.environ, stdout=log, stderr=subprocess.STDOUT, timeout=300)
        if done.returncode == 0:
            return
        if attempt < SERVE_RUN_ATTEMPTS:
            with open(log_path, "a") as log:
                log.write(f"\nwattwise tests: serve run attempt {attempt} failed (exit {done.returncode}); again\n")
    tail = "\n".join(log_path.read_text().splitlines()[-30:])
    raise RuntimeError(f"serve run failed {SERVE_RUN_ATTEMPTS} times; the end of {log_path}:\n{tail}")


def under_load(send: Callable[[], None], clients: int, until: Callable[[], bool], timeout_s: float) -> bool:
    """Whether `until()` came to hold while `clients` threads each ran `send()` back to back.
    The load has no gaps (in which an idle reading could let a policy shrink the pools) and
    lasts until the outcome or a generous deadline: starting a replica is slow on a busy
    machine. A request that failed fails the caller."""
    stop = threading.Event()

    def keep_busy() -> None:
        while not stop.is_set():
            send()

    deadline = time.monotonic() + timeout_s
    held = False
    with ThreadPoolExecutor(clients) as pool:
        running = [pool.submit(keep_busy) for _ in range(clients)]
        try:
            while not held and time.monotonic() < deadline:
                held = until()
                time.sleep(1)
        finally:
            stop.set()
        for client in running:
            client.result()
    return held


def metric_sum(served: LocalServe, name: str, **labels: str) -> float:
    """Sum of a metric's series with these labels on the Ray metrics endpoint."""
    total = 0.0
    for line in httpx.get(served.metrics_url, timeout=10).text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def in_replica(deployment: str, read: Callable[[Any], Any]) -> Any:
    """`read(the deployment's LLMReplica)`, run inside its first replica actor (the test
    process must be connected to the app's Ray cluster). Test-only introspection (Serve
    internals): a Serve handle here would start a router whose metrics thread outlives
    this driver."""
    import ray

    def call() -> Any:
        return ray.get(_replica_actor(deployment).__ray_call__.remote(
            lambda replica: read(replica._replica_impl._user_callable_wrapper.user_callable)), timeout=30)

    try:
        return call()
    except ray.exceptions.RayActorError:  # that replica is gone: look the deployment's replicas up again
        _replica_actor.cache_clear()
        return call()


@functools.cache
def _replica_actor(deployment: str) -> Any:
    """The first replica actor of `deployment`, looked up once: a lookup asks the GCS for
    every named actor, which on a loaded machine made polling tests sample too slowly to
    see a short load."""
    import ray

    name = next(a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if f"#{deployment}#" in a["name"])
    return ray.get_actor(name, namespace="serve")


@contextlib.contextmanager
def served_with_driver(config_path: Path, edit: Callable[[dict[str, Any]], None]) -> Iterator[LocalServe]:
    """The app of `config_path` (edited), with this test process connected to its Ray
    cluster as a driver, for in_replica."""
    import ray

    with LocalServe(config_path, edit=edit, dashboard=False) as local:
        ray.init(address=f"127.0.0.1:{local.gcs_port}", log_to_driver=False)
        try:
            yield local
        finally:
            _replica_actor.cache_clear()  # its handles belong to this cluster
            ray.shutdown()
