"""Machines, not only replicas, scale (issue 18 item 2): cluster.yaml's node types on Ray's
fake multi-node autoscaler.

`ray.cluster_utils.AutoscalingCluster` runs Ray's autoscaler (v1, the monitor Ray starts with
`--autoscaling-config`) with the `fake_multinode` provider: it launches a worker node (a raylet
on this machine with the node type's logical resources) for resource demand nothing can hold,
and terminates a worker idle for `idle_timeout_minutes`. The node types are cluster.yaml's:
its head (`CPU: 0`) and its GPU worker type with its GPU count and min_workers, scaled down
for a 2-core machine (CPUs, max_workers, the idle timeout; see `fake_node_types`).

The app is serve_config.yaml's (`deployments.builder:build_app`, modelled engine, the utilisation
policy of tests.factories.quick_config behind the project's Serve adapter) with one pool: the
`long` pool of serve_config.gpu.yaml, whose replicas ask Serve for what a TP8 vLLM replica
asks (engines.vllm_placement.replica_resources: a CPU bundle and eight GPU bundles,
STRICT_PACK), so each replica takes a whole 8-GPU node. Then:

1. load: eight requests kept in flight push the policy to the pool's max_replicas (2); the
   second replica fits on no node, so the autoscaler adds a worker of the GPU type and the
   replica runs there;
2. no load: the policy shrinks the pool to min_replicas (1), Serve stops the replica on the
   node with fewest replicas (the added one), and that idle node is removed, back to
   cluster.yaml's min_workers.

    env RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 \\
        .venv/bin/python -m pytest -q tests/ray/test_machine_autoscaling.py

The fake head runs in a session of its own, ended alone (not Ray's `ray stop --force`): other
clusters on the machine run on, so .ci/run runs this module beside the others.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import pytest
import yaml

from core.paths import SERVE_CONFIG
from tests.factories import APP, INTERACTIVE_KEY, quick_config
from tests.live_app import serve_run, wait_for
from wattwise.local_serve import PortWindow, end_session, ingress_ports_env

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]
POOL = "long"  # serve_config.gpu.yaml's TP8 pool: one replica fills one 8-GPU node
DEPLOYMENT = f"pool-{POOL}"
MAX_WORKERS = 2  # cluster.yaml allows 8; two raylets are what a 2-core machine can spare
MAX_NODE_CPUS = 8  # logical CPUs per worker: cluster.yaml's 190 would only tell Ray to start more workers
IDLE_TIMEOUT_MIN = 0.1  # cluster.yaml's 10 minutes, in seconds here
LOAD_STREAMS = 8  # requests in flight: 2 per replica above the utilisation policy's target of 4
DEADLINE_S = 300  # generous: a shared, loaded machine


def fake_node_types(cluster: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """cluster.yaml's head resources and worker node types, for the fake provider: the
    same resources (GPUs as logical resources, CPUs capped at MAX_NODE_CPUS), min_workers
    as shipped, max_workers capped at MAX_WORKERS, no cloud node_config."""
    types = cluster["available_node_types"]
    head = dict(types[cluster["head_node_type"]]["resources"])
    workers = {}
    for name, node_type in types.items():
        if name == cluster["head_node_type"]:
            continue
        resources = dict(node_type["resources"])
        resources["CPU"] = min(resources.get("CPU", 0), MAX_NODE_CPUS)
        resources["object_store_memory"] = 200 * 1024**2  # plasma per fake node: 200 MB, not 30% of RAM
        workers[name] = {"resources": resources, "node_config": {},
                         "min_workers": node_type.get("min_workers", 0),
                         "max_workers": min(node_type.get("max_workers", cluster["max_workers"]), MAX_WORKERS)}
    return head, workers


# Ray's fake_multi_node/example.yaml, which AutoscalingCluster reads but the 2.60 wheel does
# not ship (FileNotFoundError): the provider section and the empty launcher fields.
FAKE_BASE_CONFIG: dict[str, Any] = {
    "cluster_name": "fake_multinode",
    "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                 "disable_launch_config_check": True},
    "head_node_type": "ray.head.default",
    "auth": {}, "docker": {}, "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
    "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
    "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
    "rsync_exclude": [], "rsync_filter": [],
}


def autoscaling_cluster(cluster: dict[str, Any], ports: HeadPorts) -> Any:
    """An AutoscalingCluster of cluster.yaml's node types (its config built here: see
    FAKE_BASE_CONFIG), its head on `ports`: Ray's defaults (6379, 8265, the agent's 52365)
    may be another test's cluster's."""
    from ray import cluster_utils
    from ray.cluster_utils import AutoscalingCluster

    head, workers = fake_node_types(cluster)

    class _Cluster(AutoscalingCluster):
        session: int | None = None  # the head's, once started: every process of this cluster's

        def _generate_config(self, head_resources: dict[str, Any], worker_node_types: dict[str, Any],
                             autoscaler_v2: bool = False, **config_kwargs: Any) -> dict[str, Any]:
            config = copy.deepcopy(FAKE_BASE_CONFIG)
            config["available_node_types"] = {
                **worker_node_types,
                "ray.head.default": {"resources": dict(head_resources), "node_config": {}, "max_workers": 0}}
            config.update(config_kwargs)
            config["provider"]["gcs_address"] = ports.gcs_address  # where the launched workers join
            return config

        def start(self, _system_config: Any = None, override_env: dict[str, str] | None = None) -> None:
            """Ray's start without the `ray stop --force` it runs first (which ends every Ray
            on the machine), its head in a session of its own: the workers the autoscaler
            launches are the monitor's children, in that session, and `shutdown` ends it
            alone, so other tests' clusters may share the machine."""
            def run(cmd: list[str], env: dict[str, str] | None = None) -> int:
                if cmd[:2] == ["ray", "stop"]:
                    return 0
                head = subprocess.Popen([*cmd, *ports.flags], env=env, start_new_session=True)
                self.session = head.pid
                if head.wait(timeout=180) != 0:
                    raise subprocess.CalledProcessError(head.returncode, cmd)
                return 0

            with mock.patch.object(cluster_utils.subprocess, "check_call", run):
                super().start(_system_config, override_env)

        def shutdown(self) -> None:
            if self.session is not None:
                end_session(self.session, timeout_s=120)
                self.session = None

    return _Cluster(head_resources=head, worker_node_types=workers,
                    max_workers=sum(w["max_workers"] for w in workers.values()),
                    upscaling_speed=cluster["upscaling_speed"], idle_timeout_minutes=IDLE_TIMEOUT_MIN)


@dataclass(frozen=True)
class HeadPorts:
    """The fake head's ports, its window's own (wattwise.local_serve.PortWindow)."""

    gcs: int
    dashboard: int
    agent: int
    client: int
    metrics: int

    @property
    def gcs_address(self) -> str:
        from ray._private.services import get_node_ip_address

        return f"{get_node_ip_address()}:{self.gcs}"

    @property
    def flags(self) -> list[str]:
        return [f"--port={self.gcs}", f"--dashboard-port={self.dashboard}",
                f"--dashboard-agent-listen-port={self.agent}", f"--ray-client-server-port={self.client}",
                f"--metrics-export-port={self.metrics}"]


def gpu_pool_resources() -> tuple[dict[str, Any], dict[str, Any]]:
    """serve_config.gpu.yaml's `long` pool: its Serve resources (what engines.vllm_placement
    asks for its vLLM engine) and its autoscaling bounds."""
    from engines.vllm_config import VllmEngineConfig
    from engines.vllm_placement import replica_resources

    gpu_config = yaml.safe_load((ROOT / "serve_config.gpu.yaml").read_text())
    app = next(a for a in gpu_config["applications"] if a["name"] == APP)
    pool = next(p for p in app["args"]["pools"] if p["name"] == POOL)
    engine = VllmEngineConfig(**{k: v for k, v in pool["engine"].items() if k != "kind"})
    return replica_resources(engine, pool["num_cpus"]), pool["autoscaling"]


def serve_config(http_port: int) -> dict[str, Any]:
    """serve_config.yaml as the Ray tests run it, with one pool: the modelled engine serving every
    length class, on the GPU pool's resources and bounds."""
    config = yaml.safe_load(SERVE_CONFIG.read_text())
    config["proxy_location"] = "HeadOnly"
    config["http_options"] = {"host": "127.0.0.1", "port": http_port}
    quick_config(config)
    config["tracing_config"]["enabled"] = False
    app = config["applications"][0]
    resources, bounds = gpu_pool_resources()
    pools = app["args"]["pools"]
    pool = next(p for p in pools if p["name"] == POOL)
    pool["classes"] = [c for p in pools for c in p["classes"]]
    pool["autoscaling"] = dict(bounds)
    app["args"]["pools"] = [pool]
    app["args"]["batch_api"] = {"enabled": False}
    app["deployments"] = [{"name": DEPLOYMENT, **resources}]
    return config




class FakeCloud:
    """The fake autoscaling cluster, the app on it, and a driver connected to it."""

    def __init__(self) -> None:
        import ray

        self.cluster_config = yaml.safe_load((ROOT / "cluster.yaml").read_text())
        self.head_resources, self.worker_types = fake_node_types(self.cluster_config)
        (self.gpu_type, self.gpu_node), = ((n, t) for n, t in self.worker_types.items()
                                           if t["resources"].get("GPU", 0) > 0)
        self.workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"wattwise-machines-{os.getpid()}"
        self.workdir.mkdir(exist_ok=True)
        # Every port the cluster binds is its own (Serve's ingress ones included): another
        # test's cluster may share the machine.
        self._window = PortWindow()
        self.http_port, *head_ports, stats, metrics, fallback_http, fallback_grpc = self._window.fixed_ports(10)
        self.added: set[str] = set()  # GPU nodes the autoscaler added under load
        ports = HeadPorts(*head_ports)
        self.cluster = autoscaling_cluster(self.cluster_config, ports)
        try:
            self.cluster.start(override_env={**ingress_ports_env(stats, metrics, fallback_http, fallback_grpc),
                                             **self._window.env})
            if ray.is_initialized():  # a driver an earlier module left connected
                ray.shutdown()
            # The head's address, not "auto": that is whichever cluster on the machine started last.
            self.address = ports.gcs_address
            ray.init(address=self.address, namespace="wattwise-tests", log_to_driver=False)
            wait_for(lambda: len(self.gpu_nodes()) >= self.gpu_node["min_workers"], DEADLINE_S,
                     "min_workers GPU nodes")
            config_path = self.workdir / "serve_config.yaml"
            config_path.write_text(yaml.safe_dump(serve_config(self.http_port), sort_keys=False))
            serve_run(self.address, config_path, self.workdir / "serve.log")
            wait_for(self.ready, DEADLINE_S, "the app to start on the fake cluster")
        except BaseException:  # a cluster that never served must not outlive the test
            self.shutdown()
            raise

    def gpu_nodes(self) -> dict[str, dict[str, float]]:
        """Alive nodes with GPUs: {node id: resources}."""
        import ray

        return {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU", 0) > 0}

    def running_replicas(self) -> int:
        from ray import serve
        from ray.serve._private.common import ReplicaState

        try:
            deployment = serve.status().applications[APP].deployments[DEPLOYMENT]
        except KeyError:
            return 0
        return deployment.replica_states.get(ReplicaState.RUNNING, 0)

    def ready(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.http_port}/health/ready", timeout=10).status_code == 200
        except httpx.HTTPError:
            return False

    def shutdown(self) -> None:
        import ray

        ray.shutdown()
        self.cluster.shutdown()
        self._window.release()  # after the processes that bound its ports are gone


class Load:
    """LOAD_STREAMS clients, each sending its next completion as soon as the last returns."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.stop = threading.Event()
        self.served = 0
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(LOAD_STREAMS)]

    def _client(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=120,
                          headers={"authorization": f"Bearer {INTERACTIVE_KEY}"}) as client:
            while not self.stop.is_set():
                try:
                    r = client.post("/v1/completions", json={"model": "llama2-70b-sim", "prompt": "tell me a story",
                                                             "max_tokens": 200})
                except httpx.HTTPError:
                    time.sleep(0.5)
                    continue
                if r.status_code == 200:
                    self.served += 1
                else:  # shed or not ready: back off instead of spinning
                    time.sleep(0.5)

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=180)


@pytest.fixture(scope="module")
def cloud() -> Iterator[FakeCloud]:
    os.environ.update({"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                       "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "60", "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "30"})
    # AutoscalingCluster runs `ray` from PATH: this interpreter's.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    cloud = FakeCloud()
    try:
        yield cloud
    finally:
        cloud.shutdown()


def test_node_types_come_from_cluster_yaml() -> None:
    """The fake cluster runs the shipped node types: CPU-only head, 8-GPU workers, min_workers as shipped."""
    config = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    head, workers = fake_node_types(config)
    assert head == {"CPU": 0}
    (gpu,) = workers.values()
    shipped = config["available_node_types"]["h100x8"]
    assert gpu["resources"]["GPU"] == shipped["resources"]["GPU"] == 8
    assert gpu["min_workers"] == shipped["min_workers"] == 1
    resources, bounds = gpu_pool_resources()
    gpus = sum(b.get("GPU", 0) for b in resources["placement_group_bundles"])
    assert gpus == gpu["resources"]["GPU"]  # one replica fills one node
    assert bounds["max_replicas"] <= gpu["max_workers"]  # room for the pool at its max


def test_demand_adds_a_gpu_node(cloud: FakeCloud) -> None:
    before = cloud.gpu_nodes()
    assert len(before) == cloud.gpu_node["min_workers"] and cloud.running_replicas() == 1
    with Load(f"http://127.0.0.1:{cloud.http_port}") as load:
        took = wait_for(lambda: len(cloud.gpu_nodes()) == 2 and cloud.running_replicas() == 2, DEADLINE_S,
                        "a second GPU node and the pool's second replica RUNNING on it")
    assert load.served > 0  # the in-flight requests finished (exit waits for them)
    added = {n: r for n, r in cloud.gpu_nodes().items() if n not in before}
    assert len(added) == 1
    (resources,) = added.values()
    expected = cloud.gpu_node["resources"]
    assert resources["GPU"] == expected["GPU"] and resources["CPU"] == expected["CPU"]
    cloud.added = set(added)
    print(f"\n  node added and replica running {took:.0f} s after load started")


def test_idle_node_is_removed(cloud: FakeCloud) -> None:
    added = cloud.added
    if not added:
        pytest.skip("no node was added (test_demand_adds_a_gpu_node failed)")
    took = wait_for(lambda: cloud.running_replicas() == 1 and len(cloud.gpu_nodes()) == cloud.gpu_node["min_workers"],
                    DEADLINE_S, "the pool back at one replica and the idle GPU node removed")
    assert not added & set(cloud.gpu_nodes())  # the node that was added is the one that went
    assert cloud.ready()
    print(f"\n  replica stopped and idle node removed {took:.0f} s after load stopped")
