"""Small local clouds and a front door over them, on this machine: what the federation's
Ray tests and `wattwise bench mico --served` run.

Each cloud is a LocalServe cluster of its own (its own Ray, ports and Serve app) kept
small: one pool of one replica serving every length class and one ingress taking HTTP
itself (the front resumes streams across clouds, so no gateway). The front door runs in
this process, served by uvicorn on a free loopback port.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from typing import Any, Self

import uvicorn

from app.config import hash_key
from core.classes import LengthClassConfig
from federation.config import FederationConfig
from federation.front import FrontDoor
from wattwise.local_serve import LocalServe, free_port

TENANT_KEY = "sk-federation-tenant"
MODEL = "llama2-70b-sim"


def small_cloud(hardware: str = "h100-80gb", deferral: dict[str, Any] | None = None) -> Callable[[dict], None]:
    """The edit of serve_config.yaml for one small cloud. `hardware`: the GPU its replica
    imitates (A100s make a slow cloud, whose GPU count says otherwise); `deferral`: its
    Batch API's deferral (app.batch_deferral), else no Batch API."""
    engine: dict[str, Any] = {"model": "llama2-70b", "hardware": hardware, "tensor_parallel": 2}

    def edit(config: dict[str, Any]) -> None:
        app = config["applications"][0]
        app["autoscaling_policy"]["policy_kwargs"] = {"policy": "utilisation"}
        args = app["args"]
        args.update(ingress_replicas=1, gateway_replicas=0,
                    api_keys=[{"sha256": hash_key(TENANT_KEY), "tenant": "federated"}])
        args["pools"] = [{"name": "all", "classes": list(LengthClassConfig.names()), "engine": copy.deepcopy(engine),
                          "autoscaling": {"min_replicas": 1, "initial_replicas": 1, "max_replicas": 1}}]
        args["batch_api"] = {"enabled": deferral is not None, **({"deferral": deferral} if deferral else {})}

    return edit


def cloud_entry(name: str, cloud: LocalServe) -> dict[str, Any]:
    """The front's `clouds:` entry for a local cloud."""
    return {"name": name, "url": cloud.base_url, "models": [MODEL], "admin_key": cloud.admin_key}


def front_config(clouds: dict[str, LocalServe], **more: Any) -> FederationConfig:
    return FederationConfig.model_validate({
        "clouds": [cloud_entry(name, c) for name, c in clouds.items()],
        "api_keys": [{"sha256": hash_key(TENANT_KEY), "tenant": "federated"}], **more})


class LocalFront:
    """The front door on a free loopback port, served by uvicorn in a thread of this process;
    use as a context manager."""

    def __init__(self, config: FederationConfig) -> None:
        self.door = FrontDoor(config)
        self.port = free_port()
        self._server = uvicorn.Server(uvicorn.Config(self.door.app(), host="127.0.0.1", port=self.port,
                                                     log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, name="federation-front", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the federation front did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
