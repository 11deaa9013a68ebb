"""A TP change in Ray Serve as a shadow deployment: the new TP's deployment comes up
beside the serving one, traffic switches, the old one drains to 0, no request fails.

The change is an operator's TP pin (POST /admin/tensor_parallel), which the controller
applies over the policy's plan exactly as it would a policy's own TP change."""

import threading
import time
from collections.abc import Iterator
from typing import Any, Self

import openai
import pytest

from core.classes import LengthClassConfig
from wattwise.local_serve import LocalServe

pytestmark = pytest.mark.ray
MODEL = "llama2-70b-sim"


def _shadow_config(config: dict[str, Any]) -> None:
    """One sim pool for every length class at TP2 that may run at TP4, by shadow deployment."""
    app = config["applications"][0]
    app["autoscaling_policy"]["policy_kwargs"].update({"shadow_timeout_s": 120, "shadow_handover_s": 3})
    app["args"]["batch_api"] = {"enabled": False}
    app["args"]["pools"] = [{
        "name": "all", "classes": LengthClassConfig.names(),
        "engine": {"model": "llama2-70b", "hardware": "h100-80gb", "tensor_parallel": 2},
        "tensor_parallel_options": [2, 4], "tp_change": "shadow",
        "autoscaling": {"min_replicas": 1, "max_replicas": 2},
    }]


@pytest.fixture(scope="module")
def shadow() -> Iterator[LocalServe]:
    with LocalServe(edit=_shadow_config) as local:
        yield local


class Load:
    """A steady stream of requests through the openai client, streaming and not, from
    two threads; every outcome is recorded with the time it ended."""

    def __init__(self, base_url: str) -> None:
        self.client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0, timeout=60)
        self.done: list[float] = []
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i % 2 == 0,)) for i in range(2)]

    def _one(self, stream: bool) -> None:
        prompt = " ".join(["w"] * 20)
        if stream:
            chunks = list(self.client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, stream=True))
            assert chunks[-1].choices[0].finish_reason == "length", chunks[-1]
        else:
            resp = self.client.completions.create(model=MODEL, prompt=prompt, max_tokens=20)
            assert resp.usage.completion_tokens == 20, resp

    def _run(self, stream: bool) -> None:
        while not self._stop.is_set():
            try:
                self._one(stream)
                self.done.append(time.monotonic())
            except Exception as exc:  # noqa: BLE001 - every failure counts
                self.failed.append(repr(exc))

    def __enter__(self) -> Self:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=90)


def _pools(local: LocalServe) -> dict[str, Any]:
    response = local.admin("GET", "/admin/pools")
    response.raise_for_status()
    return response.json()


def test_tp_change_rolls_over_to_the_shadow_without_failing_a_request(shadow: LocalServe) -> None:
    pools = _pools(shadow)
    assert pools["pool-all"]["serving"] and pools["pool-all"]["tensor_parallel"] == 2
    assert pools["pool-all-tp4"]["replicas"].get("RUNNING", 0) == 0 and not pools["pool-all-tp4"]["serving"]
    refused = shadow.admin("POST", "/admin/tensor_parallel", json={"pool": "all", "tensor_parallel": 8})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tensor_parallel"

    with Load(shadow.base_url) as load:
        while len(load.done) < 5 and not load.failed:  # the stream is flowing
            time.sleep(0.2)
        pinned = shadow.admin("POST", "/admin/tensor_parallel", json={"pool": "all", "tensor_parallel": 4})
        assert pinned.status_code == 200, pinned.text
        pinned_s, switched_s = time.monotonic(), None
        old_running_while_rolling: list[int] = []
        retired_s = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not load.failed:
            pools = _pools(shadow)
            old, new = pools["pool-all"], pools["pool-all-tp4"]
            if not new["serving"]:
                old_running_while_rolling.append(old["replicas"].get("RUNNING", 0))
            else:
                switched_s = switched_s or time.monotonic()
                if old["replicas"].get("RUNNING", 0) == 0 and not old["replicas"].get("STOPPING", 0):
                    retired_s = time.monotonic()
                    break
            time.sleep(0.5)
        assert retired_s is not None, f"no rollover in 90 s: {pools}"
        while time.monotonic() < retired_s + 5 and not load.failed:  # served by the new TP alone
            time.sleep(0.2)
    assert load.failed == []
    print(f"\nshadow TP2->TP4: traffic switched {switched_s - pinned_s:.1f} s after the pin, old deployment gone "
          f"{retired_s - pinned_s:.1f} s after; {sum(1 for t in load.done if pinned_s < t < retired_s)} requests "
          f"completed during the rollout, {len(load.done)} in all, 0 failed")
    assert sum(1 for t in load.done if t > retired_s) >= 3, "no request completed after the old deployment left"
    # The old deployment kept serving at its count while the shadow came up.
    assert old_running_while_rolling and min(old_running_while_rolling) >= 1
    pools = _pools(shadow)
    new = pools["pool-all-tp4"]
    assert new["serving_deployment"] == "pool-all-tp4" and new["tensor_parallel"] == 4
    assert new["replicas"].get("RUNNING", 0) >= 1 and new["rollout"] is None
    assert new["rollout_outcomes"] == {"completed": 1}
    assert pools["pool-all"]["replicas"].get("RUNNING", 0) == 0
