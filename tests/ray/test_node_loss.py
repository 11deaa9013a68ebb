"""Nothing lost when a machine dies (issue 18 item 1), on a local multi-node Ray cluster.

`ray.cluster_utils.Cluster`: a head with no CPUs (Serve's controller and the HTTP entry:
HAProxy unless WATTWISE_INGRESS says otherwise, and the gateway) and
four workers with logical GPUs running serve_config.yaml: two hold an Ingress replica each,
two the pools' replicas (custom resources place them, so each case loses what it names and
not an ingress by chance).
Each case streams completions through the openai client, removes one worker (kill -9)
while they are in flight, and accounts for every stream: accepted (HTTP 200), completed
(resumed or not), errored (an OpenAI error event: the client knows to retry) or lost
(the connection dropped or the stream ended silently). A client sees an errored stream as a
failed request, so where the gateway and ingress can resume, a case asserts that every
accepted stream completed. They can in every case here: a worker's loss leaves the head (the
gateway and the client's connections), and what the worker hosted runs again elsewhere while
the gateway and ingress hold the streams. It then measures the time until a
new request is served, adds a worker like the one removed (a replacement machine), and
the time until every deployment is back at its target (printed, not asserted tightly:
the machine is shared).

Run with `-s` to see the table:
    flock /tmp/ray.lock env RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 \
        .venv/bin/python -m pytest -s tests/ray/test_node_loss.py
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import openai
import psutil
import pytest
import yaml

from tests.factories import INTERACTIVE_KEY, quick_config
from tests.live_app import serve_run, wait_for
from tests.local_ray import started_despite_registration_timeouts
from wattwise.ingress_mode import DEFAULT_INGRESS
from wattwise.local_serve import (
    SERVE_CONFIG,
    PortWindow,
    _bin,
    haproxy_pids,
    ingress_ports_env,
    stop_haproxy,
)

pytestmark = pytest.mark.ray

MODEL = "llama2-70b-sim"
APP = "wattwise"
STREAMS = 12
# ~12 s of tokens unresumed: on a busy machine the kill (the raylet, then its workers noticing)
# takes seconds, and 160-token streams (~4 s) ended before it in one CI run.
MAX_TOKENS = 480
INGRESS_NODE = {"num_cpus": 2, "num_gpus": 8, "resources": {"ingress": 1}}
POOL_NODE = {"num_cpus": 4, "num_gpus": 8, "resources": {"pool": 100}}
PROMPT_NODE = {"num_cpus": 2, "num_gpus": 8, "resources": {"prompt": 1}}  # one Splitwise prompt replica each
SPLITWISE_CONFIG = SERVE_CONFIG.parent / "serve_config.splitwise.yaml"
REPORT: list[NodeLoss] = []


@dataclass(frozen=True)
class NodeLoss:
    """The client-side fate of the streams in flight when one node was removed."""

    case: str
    hosted: tuple[str, ...]  # what ran on the removed node
    accepted: int
    completed: int
    resumed: int
    errored: int
    lost: int
    served_after_s: float  # removal to the first new request served
    capacity_after_s: float  # removal to every deployment back at its target
    kv_recomputed: int = 0  # Splitwise: token phases that recomputed the prompt (the KV was lost)


@dataclass
class Stream:
    """One client stream: what it got before it ended."""

    accepted: bool = False
    tokens: int = 0
    finished: bool = False
    resumed: bool = False
    report: dict[str, Any] | None = None  # the final chunk's `wattwise` block
    error: str | None = None  # an OpenAI error event or status: the client was told
    dropped: str | None = None  # the connection broke or the stream ended silently


NODE_START_ATTEMPTS = 5
NODE_START_PAUSE_S = 15.0  # between tries: a burst of load beside it (a Serve app's replicas) may pass
T = TypeVar("T")


def _node_started(start: Callable[[], T]) -> T:
    """`start()` (the cluster's head, or a node joining it), tried again if its raylet does
    not register in time: Ray waits a fixed 30 s for that, which a CI machine running the
    unit tier beside this one can exceed (seen for the head once in ~40 runs, then for a
    worker; three tries in a row for the head once, while test_chiron_serve's app beside it
    was stopping a dozen replicas). The processes of a failed try are killed; a failed node
    never joined the cluster's list (Cluster.add_node adds it once started)."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}

    def kill_new_processes() -> None:
        for child in psutil.Process().children(recursive=True):
            if child.pid not in before:
                child.kill()

    return started_despite_registration_timeouts(start, kill_new_processes, NODE_START_ATTEMPTS, NODE_START_PAUSE_S)


def _start_head() -> Any:  # ray.cluster_utils.Cluster, imported where Ray is wanted
    from ray.cluster_utils import Cluster

    return _node_started(lambda: Cluster(initialize_head=True,
                                         head_node_args={"num_cpus": 0, "include_dashboard": False}))


class LiveCluster:
    """The cluster, the app (serve_config.yaml, or with `splitwise` serve_config.splitwise.yaml,
    its prompt pool on a node of its own) and a driver connected to it."""

    def __init__(self, splitwise: bool = False) -> None:
        import ray

        self.splitwise = splitwise
        # Splitwise: a long prompt (still class S, < 256 tokens) has a large KV to hand off.
        self.prompt = "tell me a story" + " about the sea" * (45 if splitwise else 0)
        self.workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"wattwise-nodeloss-{os.getpid()}"
        self.workdir.mkdir(exist_ok=True)
        # Ports of its own, for the nodes it starts (they take this process's environment, set
        # back at shutdown): another cluster may share the machine (another test run's, a demo).
        self._window = PortWindow()
        self.http_port, *ingress_ports = self._window.fixed_ports(5)
        self._env = pytest.MonkeyPatch()
        for key, value in {**ingress_ports_env(*ingress_ports), **self._window.env}.items():
            self._env.setenv(key, value)
        try:
            self.cluster = _start_head()
        except BaseException:
            self._give_back_ports()
            raise
        self.kinds: dict[str, dict[str, Any]] = {}  # node id -> the kind of node it is
        try:
            for kind in (INGRESS_NODE, INGRESS_NODE, POOL_NODE, POOL_NODE, *([PROMPT_NODE] * 2 if splitwise else [])):
                self.add(kind)
            self.cluster.wait_for_nodes()
            ray.init(address=self.cluster.address, namespace="wattwise-tests", log_to_driver=False)
            self.config_path = self.workdir / "serve_config.yaml"
            self.config_path.write_text(yaml.safe_dump(self._config(), sort_keys=False))
            self._pin_plan_store_to_a_worker()
            serve_run(self.cluster.address, self.config_path, self.workdir / "serve.log")
            wait_for(self._started, 600, "the app to start on the cluster", poll_s=0.5)
        except BaseException:  # a cluster that never served must not outlive the test, nor its driver
            self.shutdown()
            raise

    def add(self, kind: dict[str, Any]) -> Any:
        """A worker of `kind` joins (at start, or replacing a lost one)."""
        node = _node_started(lambda: self.cluster.add_node(**kind))
        self.kinds[node.node_id] = kind
        return node

    def _config(self) -> dict[str, Any]:
        config = yaml.safe_load((SPLITWISE_CONFIG if self.splitwise else SERVE_CONFIG).read_text())
        config["proxy_location"] = "HeadOnly"
        config["http_options"] = {"host": DEFAULT_INGRESS.http_host, "port": self.http_port}
        config.setdefault("tracing_config", {})
        quick_config(config)
        config["tracing_config"]["enabled"] = False
        kwargs = config["applications"][0]["autoscaling_policy"]["policy_kwargs"]
        for key in ("target_requests_per_replica", "downscale_hold_s"):  # the utilisation policy's, not wattwise's
            kwargs.pop(key, None)
        args = config["applications"][0]["args"]
        args.update({"ingress_replicas": 2, "ingress_max_replicas_per_node": 1, "batch_api": {"enabled": False},
                     "max_retries": 3})
        if self.splitwise:  # the whole KV moves (~10 MB for the long prompt): a hand-off takes a while
            args["splitwise"]["kv_payload_scale"] = 1.0
        placed = [{"name": "Ingress", "ray_actor_options": {"num_cpus": 0.2, "resources": {"ingress": 1}}}]
        for pool in args["pools"]:  # one replica each: losing its node is losing the pool
            prompt = pool.get("phase") == "prompt"  # Splitwise's prompt pool: one on each prompt node
            n = 2 if prompt else 1
            pool["autoscaling"].update({"min_replicas": n, "initial_replicas": n, "max_replicas": n})
            node = "prompt" if prompt else "pool"
            placed.append({"name": f"pool-{pool['name']}",
                           "ray_actor_options": {"num_cpus": 0.1, "resources": {node: 1}}})
        if self.splitwise:  # off the prompt node: its loss is the prompt replica's alone
            placed.append({"name": "SplitwiseCoordinator", "ray_actor_options": {"resources": {"pool": 1}}})
        config["applications"][0]["deployments"] = placed
        return config

    def _pin_plan_store_to_a_worker(self) -> None:
        """The store is created by whoever asks first; created here on a pool worker, so
        that a worker's loss takes it and no ingress. Pinned hard, Ray cannot restart it
        elsewhere: it dies for good, and its readers recreate it by name from its saved
        state (the restart in place is tested in test_plan_recovery)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from deployments.plan_store import NAMESPACE, PlanStore

        node_id = next(n for n in self.cluster.worker_nodes if self.kinds[n.node_id] is POOL_NODE).node_id
        store = PlanStore.options(name=f"plan-{APP}", namespace=NAMESPACE, get_if_exists=True, lifetime="detached",
                                  scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(APP)
        ray.get(store.get.remote(), timeout=120)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def _started(self) -> bool:
        """Ready, or raise at once when Serve says the app failed to deploy (a config the
        app refuses would otherwise wait out the whole start). Asks this cluster's Serve
        controller itself: `serve.status()` keeps a client of the first cluster this process
        saw (an earlier module's)."""
        import ray
        from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

        try:
            controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
            details = ray.get(controller.get_serve_instance_details.remote(), timeout=60)
        except (ValueError, ray.exceptions.RayError):  # not started yet, or busy: ask again
            return False
        app = (details.get("applications") or {}).get(APP) or {}
        if app.get("status") == "DEPLOY_FAILED":
            raise RuntimeError(f"the app failed to deploy: {app.get('message')}")
        return self.ready()

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.base_url}/health/ready", timeout=10).status_code == 200
        except httpx.HTTPError:
            return False

    def served(self) -> bool:
        try:
            response = httpx.post(f"{self.base_url}/v1/completions", timeout=30,
                                  headers={"authorization": f"Bearer {INTERACTIVE_KEY}"},
                                  json={"model": MODEL, "prompt": "hello there", "max_tokens": 2})
            return response.status_code == 200
        except httpx.HTTPError:
            return False

    def hosts(self, only: str | None = None) -> dict[str, list[tuple[str, int]]]:
        """{node id: the app's actors on it (only those labelled `only`, if given), with their
        requests in flight} (Serve replicas by deployment, the plan store). Every actor is
        asked at once: asked in turn on a busy machine, the streams could end before the kill."""
        import ray
        from ray.serve._private.common import REPLICA_ID_FULL_ID_STR_PREFIX

        from deployments.plan_store import NAMESPACE

        asked = []
        for actor in ray.util.list_named_actors(all_namespaces=True):
            name, namespace = actor["name"], actor["namespace"]
            if namespace == "serve" and name.startswith(f"{REPLICA_ID_FULL_ID_STR_PREFIX}{APP}#"):
                label = name.split("#")[1]
            elif namespace == NAMESPACE and name == f"plan-{APP}":
                label = "PlanStore"
            else:
                continue
            if only is not None and label != only:
                continue
            try:
                handle = ray.get_actor(name, namespace=namespace)
            except ValueError:  # gone since it was listed
                continue
            node = handle.__ray_call__.remote(lambda _: ray.get_runtime_context().get_node_id())
            ongoing = handle.get_num_ongoing_requests.remote() if namespace == "serve" else None
            asked.append((label, node, ongoing))
        where: dict[str, list[tuple[str, int]]] = {}
        for label, node, ongoing in asked:
            try:
                node_id = ray.get(node, timeout=60)
                in_flight = ray.get(ongoing, timeout=60) if ongoing is not None else 0
            except Exception:  # an actor dying or restarting right now
                continue
            where.setdefault(node_id, []).append((label, in_flight))
        return where

    def busiest(self, label: str, candidates: list[Any]) -> Any:
        """Of the `candidates` (workers), the one whose `label` holds the most requests now."""
        busy = {node_id: max(n for lbl, n in on_node) for node_id, on_node in self.hosts(only=label).items()}
        return max(candidates, key=lambda node: busy.get(node.node_id, -1))

    def shutdown(self) -> None:
        import ray

        subprocess.run([_bin("serve"), "shutdown", "-y", "-a", self.cluster.address], env=os.environ,
                       capture_output=True, timeout=120, check=False)
        node_ids = [node.node_id for node in self.cluster.list_all_nodes()]
        ray.shutdown()
        self.cluster.shutdown()
        # Its head's HAProxy outlives the raylets; other clusters' do not stop.
        stop_haproxy(lambda: haproxy_pids(node_ids))
        self._give_back_ports()

    def _give_back_ports(self) -> None:
        self._env.undo()
        self._window.release()




def _live(splitwise: bool) -> Iterator[LiveCluster]:
    os.environ.update({"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                       "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "60", "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "30",
                       **DEFAULT_INGRESS.env})
    cluster = LiveCluster(splitwise)
    try:
        yield cluster
    finally:
        cluster.shutdown()
        _print_report()


@pytest.fixture(scope="module")
def live() -> Iterator[LiveCluster]:
    yield from _live(splitwise=False)


async def _stream(client: openai.AsyncOpenAI, prompt: str, out: Stream) -> None:
    try:
        response = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, stream=True)
        out.accepted = True
        async for chunk in response:
            if chunk.choices:
                out.tokens += len(chunk.choices[0].text.split())
                if chunk.choices[0].finish_reason:
                    out.finished = True
                    out.report = (chunk.model_extra or {}).get("wattwise")
                    out.resumed = bool(out.report and out.report["resumed"])
    except openai.APIConnectionError as exc:  # before openai.APIError: it is one
        out.dropped = repr(exc)
        return
    except openai.APIError as exc:
        out.error = repr(exc)
        return
    except httpx.HTTPError as exc:
        out.dropped = repr(exc)
        return
    if not out.finished:
        out.dropped = f"ended silently after {out.tokens} tokens"


async def _first_served(live: LiveCluster, since_s: float) -> float:
    """Seconds from `since_s` until a new request is served (polled beside the streams)."""
    while not await asyncio.to_thread(live.served):
        await asyncio.sleep(0.5)
    return time.monotonic() - since_s


async def _streams_through_loss(live: LiveCluster, remove: Callable[[], None],
                                at_first_token: bool) -> tuple[list[Stream], float, float]:
    """Start the streams at once and remove the node once every accepted one is producing
    tokens, or with `at_first_token` as soon as one is (a Splitwise prompt replica has
    then just prefilled them and their KV is on its way to the token replicas); wait for
    them all. Returns them and the seconds until a new request was served."""
    client = openai.AsyncOpenAI(base_url=f"{live.base_url}/v1", api_key=INTERACTIVE_KEY, max_retries=0,
                                timeout=300)
    streams = [Stream() for _ in range(STREAMS)]
    tasks = [asyncio.create_task(_stream(client, live.prompt, s)) for s in streams]
    under_way = any if at_first_token else all
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not under_way(s.tokens or s.error or s.dropped or s.finished
                                                        for s in streams):
        await asyncio.sleep(0.01)
    removed_at = time.monotonic()
    await asyncio.to_thread(remove)
    served = asyncio.create_task(_first_served(live, removed_at))
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=600)
    await client.close()
    return streams, await asyncio.wait_for(served, timeout=300), removed_at


def _lose(live: LiveCluster, case: str, label: str, at_first_token: bool = False, every: bool = False) -> NodeLoss:
    """Stream through the loss of the node hosting `label` (with `every`, of all that do: the
    whole pool), then add a node like each one lost and wait for every deployment's target."""
    placed = live.hosts()  # known before the streams: asked during them, it takes seconds on a busy machine
    holders = [n for n in live.cluster.worker_nodes if any(lbl == label for lbl, _ in placed.get(n.node_id, []))]
    assert holders, f"{label} runs on no worker: {placed}"
    lost = holders if every else holders[:1]

    def crash() -> None:
        """kill -9 of the nodes: the busiest of several holders once the streams are in
        flight (the loss must hit them), or at once `at_first_token`."""
        if len(holders) > 1 and not every and not at_first_token:
            lost[:] = [live.busiest(label, holders)]
        for node in lost:
            live.cluster.remove_node(node, allow_graceful=False)

    streams, served_after_s, removed_at = asyncio.run(_streams_through_loss(live, crash, at_first_token))
    hosted = tuple(sorted({lbl for node in lost for lbl, _ in placed[node.node_id]}))
    for node in lost:
        live.add(live.kinds[node.node_id])  # a machine like the lost one joins
    live.cluster.wait_for_nodes()
    wait_for(live.ready, 300, "every deployment back at its target", poll_s=0.5)
    capacity_after_s = time.monotonic() - removed_at
    accepted = [s for s in streams if s.accepted]
    recomputed = sum(1 for s in accepted if s.report and s.report.get("splitwise", {}).get("kv") == "recomputed")
    result = NodeLoss(case, hosted, len(accepted), sum(s.finished for s in accepted),
                      sum(s.resumed for s in accepted), sum(s.error is not None for s in accepted),
                      sum(s.dropped is not None for s in accepted), served_after_s, capacity_after_s, recomputed)
    REPORT.append(result)
    resumed = [s.report for s in accepted if s.resumed and s.report]
    if resumed:
        e2e_s = [r["e2e_s"] for r in resumed]
        print(f"\n  resumed streams: e2e_s {min(e2e_s):.1f}-{max(e2e_s):.1f}, "
              f"stall up to {max(r['resume_stall_s'] for r in resumed):.1f} s, "
              f"slo_met {sum(r['slo_met'] for r in resumed)}/{len(resumed)}")
    print(f"\n{result}\n  dropped: {[s.dropped for s in accepted if s.dropped][:3]}"
          f"\n  errors: {[s.error for s in accepted if s.error][:3]}"
          f"\n  refused before acceptance: {[s.error for s in streams if not s.accepted][:3]}")
    return result


def _print_report() -> None:
    if not REPORT:
        return
    print("\ncase            accepted completed resumed kv_recomputed errored lost  served_s capacity_s  "
          "removed node hosted")
    for r in REPORT:
        print(f"{r.case:15s} {r.accepted:8d} {r.completed:9d} {r.resumed:7d} {r.kv_recomputed:13d} {r.errored:7d} "
              f"{r.lost:4d} {r.served_after_s:9.1f} {r.capacity_after_s:10.1f}  {', '.join(r.hosted)}")


def test_losing_the_plan_stores_node_keeps_plan_and_operator_settings(live: LiveCluster) -> None:
    import ray

    from deployments.plan_store import PlanReply, plan_store

    store = plan_store(APP)
    ray.get(store.override.remote("clock_mhz", "pool-long", 1200), timeout=60)
    before = ray.get(store.admin_view.remote(), timeout=60)
    result = _lose(live, "plan-store", "PlanStore")
    assert result.accepted > 0 and result.completed == result.accepted  # none lost, none ended in an error
    after = ray.get(plan_store(APP).admin_view.remote(), timeout=120)
    assert after["overrides"] == before["overrides"] and after["version"] >= before["version"]
    first: PlanReply = ray.get(plan_store(APP).get.remote(), timeout=60)
    # The controller re-publishes every few seconds: the restarted store hears from it.
    wait_for(lambda: ray.get(plan_store(APP).get.remote(), timeout=60).published_at_s > first.published_at_s,
             120, "the controller's next publish to the restarted store", poll_s=0.5)
    ray.get(plan_store(APP).override.remote("clock_mhz", "pool-long", None), timeout=60)


def test_losing_the_only_replica_of_a_pool_resumes_its_streams(live: LiveCluster) -> None:
    result = _lose(live, "pool-replica", "pool-short")
    assert result.accepted > 0 and result.completed == result.accepted  # none lost, none ended in an error
    assert result.resumed > 0  # the kill hit streams in flight, and they went on elsewhere


def test_losing_an_ingress_node_resumes_its_streams_on_the_other_ingress(live: LiveCluster) -> None:
    result = _lose(live, "ingress", "Ingress")
    assert result.accepted > 0 and result.completed == result.accepted  # the gateway on the head resumed each one
    assert result.resumed > 0  # the dead replica's streams went on from the other

