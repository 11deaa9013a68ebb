"""A TP rollout watched under load, for the shadow-TP Serve tests (sim and vLLM engines):
steady openai-client traffic while an operator's pin moves a pool to another TP."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Self

import openai

from wattwise.local_serve import LocalServe


class Load:
    """Requests through the openai client, streaming and not, from `threads` threads;
    every success is recorded with the time it ended, every failure by its repr."""

    def __init__(self, base_url: str, model: str, max_tokens: int = 20, threads: int = 2) -> None:
        self.client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0, timeout=120)
        self.model, self.max_tokens = model, max_tokens
        self.done: list[float] = []
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i % 2 == 0,)) for i in range(threads)]

    def _one(self, stream: bool) -> None:
        prompt = " ".join(["w"] * 20)
        if stream:
            chunks = list(self.client.completions.create(model=self.model, prompt=prompt, max_tokens=self.max_tokens,
                                                         stream=True))
            assert chunks[-1].choices[0].finish_reason in ("length", "stop"), chunks[-1]
        else:
            resp = self.client.completions.create(model=self.model, prompt=prompt, max_tokens=self.max_tokens)
            assert 0 < resp.usage.completion_tokens <= self.max_tokens, resp

    def _run(self, stream: bool) -> None:
        while not self._stop.is_set():
            try:
                self._one(stream)
                self.done.append(time.monotonic())
            except Exception as exc:  # every failure counts
                self.failed.append(repr(exc))

    def __enter__(self) -> Self:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=150)


def pools(local: LocalServe) -> dict[str, Any]:
    response = local.admin("GET", "/admin/pools")
    response.raise_for_status()
    return response.json()


@dataclass
class Rollout:
    """When the pin was taken, traffic switched and the old deployment was gone
    (monotonic s), and the old deployment's running replicas seen before the switch."""

    pinned_s: float
    switched_s: float
    retired_s: float
    old_running_before_switch: list[int]

    def summary(self, load: Load) -> str:
        during = sum(1 for t in load.done if self.pinned_s < t < self.retired_s)
        return (f"traffic switched {self.switched_s - self.pinned_s:.1f} s after the pin, old deployment gone "
                f"{self.retired_s - self.pinned_s:.1f} s after; {during} requests completed during the rollout, "
                f"{len(load.done)} in all, {len(load.failed)} failed")


def pin_and_watch(local: LocalServe, load: Load, pool: str, old: str, new: str, tp: int, timeout_s: float) -> Rollout:
    """Pin `pool` to `tp` once the load flows; poll /admin/pools until the `new`
    deployment serves and `old` has no replicas left, then let the load run 5 s more."""
    while len(load.done) < 3 and not load.failed:
        time.sleep(0.2)
    pinned = local.admin("POST", "/admin/tensor_parallel", json={"pool": pool, "tensor_parallel": tp})
    assert pinned.status_code == 200, pinned.text
    pinned_s, switched_s, old_running = time.monotonic(), None, []
    deadline = pinned_s + timeout_s
    while time.monotonic() < deadline and not load.failed:
        status = pools(local)
        if not status[new]["serving"]:
            old_running.append(status[old]["replicas"].get("RUNNING", 0))
        else:
            switched_s = switched_s or time.monotonic()
            if not status[old]["replicas"].get("RUNNING", 0) and not status[old]["replicas"].get("STOPPING", 0):
                retired_s = time.monotonic()
                while time.monotonic() < retired_s + 5 and not load.failed:  # the new TP alone
                    time.sleep(0.2)
                return Rollout(pinned_s, switched_s, retired_s, old_running)
        time.sleep(0.5)
    raise AssertionError(f"no rollover in {timeout_s} s (failures: {load.failed[:3]}): {pools(local)}")
