"""The federation front door's configuration: `federation:` in a YAML file.

The front knows N wattwise apps (clouds), each its own Ray cluster and Serve app in any
region, with the models each serves and the keys it calls them with. Clients see one app:
the same OpenAI API and the same key scheme (app.config.ApiKey / AdminKey).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from app.config import AdminKey, ApiKey, check_keys, load_key_file
from app.grid_signal import GridSignalConfig


class CloudConfig(BaseModel):
    """One wattwise app the front dispatches to."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,30}$", description="The cloud's name in metrics, logs and /admin/clouds.")
    url: str = Field(pattern=r"^https?://", description="The app's base URL (its HTTP entry: HAProxy, the gateway).")
    models: list[str] = Field(min_length=1, description="Model names the app serves (its `model_name`); a request goes only to clouds serving its model.")
    admin_key: SecretStr = Field(description="One of the app's admin keys: the front reads GET /admin/load with it and sends it with every request (app.federation_wire).")
    api_keys: dict[str, SecretStr] = Field(default_factory=dict, description="The key the front presents to this app for each service class; a class not named here passes the client's own Authorization header through (the same keys deployed on every cloud).")
    capacity_gpus: float | None = Field(default=None, gt=0, description="The cloud's capacity in the dispatch rule; None: the GPUs its pools may scale to, as it reports them.")
    region: str | None = Field(default=None, description="The cloud's series in `grid` (carbon_weight); None: not weighed.")


class FederationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    host: str = Field(default="127.0.0.1", description="Address the front listens on.")
    port: int = Field(default=8100, ge=1, le=65535, description="Port the front listens on.")
    clouds: list[CloudConfig] = Field(min_length=1, description="The wattwise apps the front dispatches to.")
    api_keys: list[ApiKey] = Field(default_factory=list, description="Tenant keys, as an app's: checked here before any cloud sees the request. Empty: no auth here (the clouds still check).")
    api_keys_file: str | None = Field(default=None, description="A JSON or YAML file with more keys (app.config.load_key_file), read at start.")
    admin_keys: list[AdminKey] = Field(default_factory=list, description="Keys for the front's /admin/*; empty: disabled (403).")
    default_service_class: str = Field(default="interactive", description="Service class of an unkeyed request that names none (X-Service-Class).")
    default_max_tokens: int = Field(default=256, gt=0, description="max_tokens assumed for a request's cost when it sets none (the clouds' own default).")
    max_request_bytes: int = Field(default=1_000_000, gt=0, description="Largest request body accepted; larger: 413.")
    failover_s: float = Field(default=30.0, gt=0, description="How long a request whose clouds fail keeps trying others, counted from the first failure since it last made progress, before a retryable 503 or an error event ends it.")
    load_poll_s: float = Field(default=1.0, gt=0, description="How often the front reads each cloud's GET /admin/load.")
    tick_s: float = Field(default=1.0, gt=0, description="How often the dispatcher measures each cloud's progress and offloads waiting requests to an idle cloud.")
    connect_timeout_s: float = Field(default=5.0, gt=0, description="A cloud that does not accept the connection this fast has failed.")
    back_off_below: float = Field(default=0.8, ge=0, le=1, description="A cloud whose running requests get less than this share of the best cloud's tokens per second counts with its capacity scaled down by as much (0: never).")
    offload: bool = Field(default=True, description="An idle cloud takes requests that have not started on a busy one while each would start sooner there (Mico's back-off).")
    carbon_weight: float = Field(default=0.0, ge=0, description="Lean interactive work toward the cleaner region: a cloud whose grid is x times the cleanest's carbon intensity counts (1 + carbon_weight * (x - 1)) times as loaded. 0: load alone. Each cloud's own controller keeps its SLOs; a cloud that is full still answers 503 and the request moves on.")
    grid: GridSignalConfig | None = Field(default=None, description="The grid signal `carbon_weight` reads (the clouds' `region`s); None: no weighing.")

    @model_validator(mode="after")
    def _consistent(self) -> FederationConfig:
        names = [c.name for c in self.clouds]
        if len(set(names)) != len(names):
            raise ValueError(f"clouds[].name: cloud names must be unique: {names}")
        check_keys(self.api_keys, self.admin_keys)
        if self.carbon_weight > 0 and (self.grid is None or any(c.region is None for c in self.clouds)):
            raise ValueError("carbon_weight needs a `grid` and a `region` on every cloud")
        return self

    def resolved(self) -> FederationConfig:
        """The keys file's keys merged in (read once, at start)."""
        if self.api_keys_file is None:
            return self
        tenant_keys, admin_keys = load_key_file(self.api_keys_file)
        return self.model_validate({**dict(self), "api_keys": [*self.api_keys, *tenant_keys],
                                    "admin_keys": [*self.admin_keys, *admin_keys], "api_keys_file": None})

    @property
    def models(self) -> list[str]:
        return sorted({m for c in self.clouds for m in c.models})


def load_federation(path: str | Path) -> FederationConfig:
    """The `federation:` block of a YAML file (or the whole file), validated and resolved."""
    data: Any = yaml.safe_load(Path(path).read_text())
    if isinstance(data, dict) and "federation" in data:
        data = data["federation"]
    return FederationConfig.model_validate(data).resolved()
