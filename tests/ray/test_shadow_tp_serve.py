"""A TP change in Ray Serve as a shadow deployment: the new TP's deployment comes up
beside the serving one, traffic switches, the old one drains to 0, no request fails.

The change is an operator's TP pin (POST /admin/tensor_parallel), which the controller
applies over the policy's plan exactly as it would a policy's own TP change."""

from collections.abc import Iterator
from typing import Any

import pytest

from core.classes import LengthClassConfig
from tests.factories import one_entry
from tests.shadow_load import Load, pin_and_watch, pools
from wattwise.local_serve import LocalServe

pytestmark = pytest.mark.ray
MODEL = "llama2-70b-sim"


def _shadow_config(config: dict[str, Any]) -> None:
    """One sim pool for every length class at TP2 that may run at TP4, by shadow deployment."""
    one_entry(config)
    app = config["applications"][0]
    # The rollout is driven by an operator's pin: a policy that plans TPs itself would race it.
    app["autoscaling_policy"]["policy_kwargs"] = {"policy": "utilisation", "shadow_timeout_s": 120, "handover_s": 3}
    app["args"]["batch_api"] = {"enabled": False}
    app["args"]["pools"] = [{
        "name": "all", "classes": LengthClassConfig.names(),
        "engine": {"model": "llama2-70b", "hardware": "h100-80gb", "tensor_parallel": 2},
        "tensor_parallel_options": [2, 4], "tp_change": "shadow",
        "autoscaling": {"min_replicas": 1, "max_replicas": 2},
    }]


@pytest.fixture(scope="module")
def shadow() -> Iterator[LocalServe]:
    with LocalServe(edit=_shadow_config, dashboard=False) as local:
        yield local


def test_tp_change_rolls_over_to_the_shadow_without_failing_a_request(shadow: LocalServe) -> None:
    status = pools(shadow)
    assert status["pool-all"]["serving"] and status["pool-all"]["tensor_parallel"] == 2
    assert status["pool-all-tp4"]["replicas"].get("RUNNING", 0) == 0 and not status["pool-all-tp4"]["serving"]
    refused = shadow.admin("POST", "/admin/tensor_parallel", json={"pool": "all", "tensor_parallel": 8})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tensor_parallel"

    with Load(shadow.base_url, MODEL) as load:
        rollout = pin_and_watch(shadow, load, "all", "pool-all", "pool-all-tp4", 4, timeout_s=90)
    print(f"\nshadow TP2->TP4 (modelled engine): {rollout.summary(load)}")
    assert load.failed == []
    assert sum(1 for t in load.done if t > rollout.retired_s) >= 3, "no request completed after the old one left"
    # The old deployment kept serving at its count while the shadow came up.
    assert rollout.old_running_before_switch and min(rollout.old_running_before_switch) >= 1
    status = pools(shadow)
    new = status["pool-all-tp4"]
    assert new["serving_deployment"] == "pool-all-tp4" and new["tensor_parallel"] == 4
    assert new["replicas"].get("RUNNING", 0) >= 1 and new["rollout"] is None
    assert new["rollout_outcomes"] == {"completed": 1}
    assert status["pool-all"]["replicas"].get("RUNNING", 0) == 0
