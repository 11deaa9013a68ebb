"""What the admin endpoints report that the ingress does not hold itself.

The autoscaling policy (and with it any energy profile) runs in the Serve controller,
configured by serve_config.yaml's `autoscaling_policy`; the ingress reads that config
back from the controller rather than keeping a second copy that could drift.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from ray import serve

from energy.profile import EnergyProfile

POOL_NAME = r"^(pool-)?[a-z][a-z0-9_-]{0,30}$"


class ClockRequest(BaseModel):
    """POST /admin/clocks: pin a pool's GPU clock (None: back to the controller's choice)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    pool: str = Field(pattern=POOL_NAME, description="pool name (short) or deployment (pool-short)")
    clock_mhz: int | None = Field(ge=1, le=10_000, description="within the pool GPU's clock range; null unpins")


class TensorParallelRequest(BaseModel):
    """POST /admin/tensor_parallel: pin a pool's TP (None: back to the controller's choice).
    On a shadow-TP pool the change is a rollout to the deployment of that TP."""

    model_config = ConfigDict(extra="forbid", strict=True)

    pool: str = Field(pattern=POOL_NAME, description="pool name (short) or deployment (pool-short)")
    tensor_parallel: int | None = Field(ge=1, le=64, description="one of the pool's tensor_parallel_options; "
                                        "null unpins")


class DrainRequest(BaseModel):
    """POST /admin/drain: stop (or resume) routing new requests to a pool."""

    model_config = ConfigDict(extra="forbid", strict=True)

    pool: str = Field(pattern=POOL_NAME)
    drain: bool = True


def app_details(app_name: str) -> dict[str, Any]:
    """The app's details as Serve's controller reports them ({} if it runs no such app):
    what `serve status` and the dashboard show, as a dict. Serve has no public call for an
    app's deployed config, and `serve.status()` first validates every app's details into
    pydantic models, which cloudpickles each deployment's request router class by value:
    ~0.13 s of CPU a call in a process with the ingress's imports (1-2 ms as a dict)."""
    client = serve.context._get_global_client()
    assert client is not None  # without a controller the call raises instead
    return client.get_serve_details().get("applications", {}).get(app_name) or {}


def deployed_policy(app_name: str) -> dict[str, Any]:
    """policy_kwargs of the app's autoscaling policy as deployed ({} if none)."""
    policy = (app_details(app_name).get("deployed_app_config") or {}).get("autoscaling_policy") or {}
    return dict(policy.get("policy_kwargs") or {})


def profiles_in_use(policy_kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    """The energy profiles the policy plans with: a summary of each, not its points."""
    if policy_kwargs.get("policy") != "dynamollm":  # the only policy that reads profiles
        return []
    path = policy_kwargs.get("profile_path")
    if path is None:
        return [{"policy": "dynamollm", "source": "built from the performance model",
                 "model": policy_kwargs.get("model", "llama2-70b"),
                 "hardware": policy_kwargs.get("hardware", "h100-80gb")}]
    profile = EnergyProfile.load(Path(path).expanduser())
    return [{"policy": "dynamollm", "source": str(path), "model": profile.model, "hardware": profile.hardware,
             "length_classes": profile.classes, "tensor_parallel": profile.tensor_parallel_degrees,
             "clocks_mhz": profile.clocks_mhz, "points": len(profile.points)}]
