"""Faults and overload in a running app: nothing accepted is lost, no token is sent twice.

These tests run the app in local Ray, inject faults under load from real openai clients
(kill a replica mid-stream, kill the Serve controller, disconnect clients, overload a
pool) and account for every request: completed (with exactly the expected text), errored
retryable / final, or lost. The modelled engine's text is a deterministic function of the
request id (the response id), so a resumed stream can be checked token for token. Run
with `-s` to see the table. The continuation/retry logic, the queue bounds and the
adapter's fail-static are checked without a cluster in tests/unit/deployments/test_faults.py.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest
import ray

from engines.modelled_engine import placeholder_text
from tests.factories import INTERACTIVE_KEY, quick_config
from tests.live_app import metric_sum
from wattwise.local_serve import LocalServe

MODEL = "llama2-70b-sim"


# ---- ray: fault injection under load --------------------------------------------------
RETRYABLE_CODES = {"replica_failed", "pool_full", "request_squashed", "overloaded"}
REPORT: list[dict[str, Any]] = []


def _fault_config(config: dict[str, Any]) -> None:
    """The test config with a spare short replica to resume on, and medium/long pools of
    one slow replica each with tight queue bounds (shed) and a short squash deadline."""
    quick_config(config)
    app = config["applications"][0]
    app["args"]["max_retries"] = 2
    app["args"]["ingress_replicas"] = 1  # /admin/requests counts what the answering ingress replica saw
    for pool in app["args"]["pools"]:
        if pool["name"] == "short":
            pool["autoscaling"].update({"min_replicas": 2, "initial_replicas": 2, "max_replicas": 3})
        elif pool["name"] == "medium":
            pool["autoscaling"].update({"min_replicas": 1, "max_replicas": 1})
            pool["engine"].update({"batch_limit": 1, "max_waiting_requests": 1})
        else:
            pool["autoscaling"].update({"min_replicas": 1, "max_replicas": 1})
            pool["engine"].update({"batch_limit": 1, "squash_after_s": 1.0, "shed_wait_factor": None})


@pytest.fixture(scope="module")
def faults() -> Iterator[LocalServe]:
    with LocalServe(edit=_fault_config, dashboard=False) as local:
        os.environ.update({"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"})
        ray.init(address=f"127.0.0.1:{local.gcs_port}", namespace="wattwise-tests", log_to_driver=False)
        try:
            yield local
        finally:
            ray.shutdown()
            _print_report()


@dataclass
class Tally:
    """Client-side fate of every request of one experiment."""

    outcomes: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    streaming: int = 0  # streams that have received their first token

    def add(self, outcome: str, problem: str | None = None) -> None:
        self.outcomes[outcome] += 1
        if problem:
            self.problems.append(problem)


def _words(n: int) -> str:
    return " ".join(["word"] * n)


def _client(served: LocalServe) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{served.base_url}/v1", api_key=INTERACTIVE_KEY, max_retries=0, timeout=120)


def _classify_error(exc: openai.APIError) -> str:
    if isinstance(exc, openai.APIStatusError):
        retryable = exc.status_code in (429, 503) and exc.response.headers.get("retry-after")
        return "error_retryable" if retryable else "error_final"
    code = (exc.body or {}).get("code") if isinstance(exc.body, dict) else None
    return "error_retryable" if code in RETRYABLE_CODES else "error_final"


async def _one(client: openai.AsyncOpenAI, tally: Tally, prompt_words: int, max_tokens: int, stream: bool) -> None:
    """One request; completed only if its text is exactly the engine's for that request."""
    rid, text, finish, usage = "", "", None, None
    try:
        if stream:
            response = await client.completions.create(
                model=MODEL, prompt=_words(prompt_words), max_tokens=max_tokens, stream=True,
                stream_options={"include_usage": True})
            async for chunk in response:
                rid = chunk.id
                if chunk.choices:
                    if not text:
                        tally.streaming += 1
                    text += chunk.choices[0].text
                    finish = chunk.choices[0].finish_reason or finish
                usage = chunk.usage or usage
        else:
            response = await client.completions.create(model=MODEL, prompt=_words(prompt_words),
                                                       max_tokens=max_tokens)
            rid, text, finish, usage = (response.id, response.choices[0].text, response.choices[0].finish_reason,
                                        response.usage)
    except openai.APIError as exc:
        tally.add(_classify_error(exc), None if _classify_error(exc) == "error_retryable" else repr(exc))
        return
    expected = placeholder_text(rid.removeprefix("chat").removeprefix("cmpl-"), 0, max_tokens)
    if finish is None:
        tally.add("lost", f"{rid}: the stream ended silently after {len(text.split())} tokens")
    elif text != expected or usage is None or usage.completion_tokens != max_tokens:
        tally.add("lost", f"{rid}: {len(text.split())} tokens, usage {usage}, text differs from the expected one")
    else:
        tally.add("completed")


def _ingress_counts(served: LocalServe) -> dict[str, int]:
    """Over HTTP, not a Serve handle: a handle's router threads in this driver outlive
    ray.shutdown() and would auto-start a stray Ray that the next module's start kills."""
    response = served.admin("GET", "/admin/requests")
    response.raise_for_status()
    return response.json()


def _record(fault: str, injected: int, tally: Tally, before: dict[str, int], after: dict[str, int]) -> None:
    server = {k: after[k] - before.get(k, 0) for k in after}
    row = {"fault": fault, "injected": injected, "sent": sum(tally.outcomes.values()), **tally.outcomes,
           "server": server}
    REPORT.append(row)
    print(f"\n[faults] {row}")


def _print_report() -> None:
    print("\n| Fault injected | Injected | Requests accepted | Completed | Errored retryable | Errored final "
          "| Client left | Lost | Retries/resumes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in REPORT:
        s = r["server"]
        print(f"| {r['fault']} | {r['injected']} | {s['accepted']} | {r.get('completed', 0)} "
              f"| {r.get('error_retryable', 0)} | {r.get('error_final', 0)} | {r.get('client_left', 0)} "
              f"| {r.get('lost', 0)} | {s['retries']} |")


def _actor_names(fragment: str) -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == "serve" and fragment in a["name"]]


def _pending_tokens(stats: ray.ObjectRef) -> float | None:
    """Tokens a pool replica has still to generate; None from a replica still starting
    (autoscaling may be adding one) or gone."""
    try:
        return float(ray.get(stats, timeout=30).get("pending_tokens", 0.0))
    except (ray.exceptions.RayError, TimeoutError):
        return None


def _until(predicate, timeout_s: float, period_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(period_s)
    return predicate()


def _balanced_outcomes(counts: dict[str, int]) -> bool:
    ended = sum(counts[k] for k in ("completed", "error_retryable", "error_final", "cancelled"))
    return ended == counts["accepted"]


KILL_TRIES = 3


def _short_replicas() -> list[Any]:
    """Handles of pool short's replica actors (ValueError: one was gone between the listing
    and the lookup)."""
    return [ray.get_actor(name, namespace="serve") for name in _actor_names("#pool-short#")]


def _short_replicas_ready() -> bool:
    """Two pool-short replicas answer (Serve restores the second after a kill)."""
    try:
        actors = _short_replicas()
    except ValueError:
        return False
    return sum(_pending_tokens(a.record_routing_stats.remote()) is not None for a in actors) >= 2


def _kill_the_busiest_short_replica_under_load(faults: LocalServe, tally: Tally) -> list[float | None]:
    """16 requests (12 streamed) to pool short; once half the streams are under way, kill the
    replica with the most tokens still to generate, read from its engine (Serve's router may
    send a busy machine's load to one replica). Returns each replica's pending tokens."""
    pending: list[float | None] = []

    async def main() -> None:
        client = _client(faults)
        # ~8 s of modelled decode each, so the kill lands while the replica still generates.
        load = [asyncio.create_task(_one(client, tally, 20, 480, stream=True)) for _ in range(12)]
        load += [asyncio.create_task(_one(client, tally, 20, 360, stream=False)) for _ in range(4)]
        deadline = time.monotonic() + 60
        while tally.streaming < 6 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert tally.streaming >= 6, tally  # streams are under way: the kill lands mid-stream
        actors = _short_replicas()
        pending.extend(map(_pending_tokens, [a.record_routing_stats.remote() for a in actors]))
        busiest = max(range(len(actors)), key=lambda i: pending[i] or 0.0)
        ray.kill(actors[busiest], no_restart=True)
        await asyncio.wait_for(asyncio.gather(*load), timeout=120)

    asyncio.run(main())
    return pending


@pytest.mark.ray
def test_killing_a_replica_mid_stream_loses_nothing(faults: LocalServe) -> None:
    """Every try must lose nothing. A try whose kill hit no request in flight (no retry at the
    ingress: CI saw this twice, with work pending on the replica killed, cause not found) is
    run again, up to KILL_TRIES; one of them must hit requests in flight."""
    hits = []
    for attempt in range(1, KILL_TRIES + 1):
        assert _until(_short_replicas_ready, 120), _actor_names("#pool-short#")
        before = _ingress_counts(faults)
        tally = Tally()
        pending = _kill_the_busiest_short_replica_under_load(faults, tally)
        after = _ingress_counts(faults)
        _record(f"replica killed mid-stream (try {attempt})", 1, tally, before, after)
        assert tally.outcomes["lost"] == 0, tally.problems
        assert tally.outcomes["error_final"] == 0, tally.problems
        assert sum(tally.outcomes.values()) == 16
        assert after["accepted"] - before["accepted"] == 16 and _balanced_outcomes(after)
        hits.append((pending, after["retries"] - before["retries"]))
        if after["retries"] > before["retries"]:
            break  # the kill did hit requests in flight, and they resumed
    assert hits[-1][1] > 0, f"no kill hit a request in flight (pending tokens, retries): {hits}"


@pytest.mark.ray
def test_clients_leaving_mid_stream_are_counted_and_free_their_replica(faults: LocalServe) -> None:
    before = _ingress_counts(faults)
    tally = Tally()
    body = {"model": MODEL, "prompt": _words(20), "max_tokens": 400, "stream": True}
    headers = {"Authorization": f"Bearer {INTERACTIVE_KEY}"}

    async def leave_early(client: httpx.AsyncClient) -> None:
        async with client.stream("POST", f"{faults.base_url}/v1/completions", json=body, headers=headers) as r:
            assert r.status_code == 200
            lines = 0
            async for line in r.aiter_lines():
                lines += line.startswith("data: ")
                if lines == 2:
                    break  # closing the response drops the connection mid-stream
        tally.add("client_left")

    async def main() -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            await asyncio.gather(*(leave_early(client) for _ in range(6)))
        await _one(_client(faults), tally, 20, 30, stream=True)  # the app serves on

    asyncio.run(main())
    assert _until(lambda: _ingress_counts(faults)["cancelled"] - before["cancelled"] >= 6, 30)
    after = _ingress_counts(faults)
    _record("client disconnects mid-stream", 6, tally, before, after)
    assert tally.outcomes == Counter({"client_left": 6, "completed": 1}), tally.problems
    assert after["cancelled"] - before["cancelled"] == 6 and _balanced_outcomes(after)
    def idle() -> bool:  # the abandoned sequences left the engines (the replicas' own gauges)
        return metric_sum(faults, "ray_wattwise_num_requests_running", pool="short") == 0 and \
            metric_sum(faults, "ray_wattwise_num_requests_waiting", pool="short") == 0

    assert _until(idle, 30)


@pytest.mark.ray
def test_overload_is_shed_and_squashed_with_503_and_retry_after(faults: LocalServe) -> None:
    before = _ingress_counts(faults)
    shed, squashed = Tally(), Tally()
    codes: Counter = Counter()

    async def one(tally: Tally, words: int, max_tokens: int) -> None:
        async with httpx.AsyncClient(timeout=120) as client:
            r = await client.post(f"{faults.base_url}/v1/completions",
                                  json={"model": MODEL, "prompt": _words(words), "max_tokens": max_tokens},
                                  headers={"Authorization": f"Bearer {INTERACTIVE_KEY}"})
        if r.status_code == 200:
            text = r.json()["choices"][0]["text"]
            ok = text == placeholder_text(r.json()["id"].removeprefix("cmpl-"), 0, max_tokens)
            tally.add("completed" if ok else "lost", None if ok else f"text of {r.json()['id']} differs")
        elif r.status_code == 503 and r.headers.get("retry-after"):
            codes[r.json()["error"]["code"]] += 1
            tally.add("error_retryable")
        else:
            tally.add("error_final", f"{r.status_code}: {r.text}")

    async def main() -> None:
        # medium pool: one replica, batch of 1, one waiting slot -> the rest are shed at once.
        # long pool: batch of 1, squash after max(1 s, 2 s TTFT target) -> waiting ones are squashed.
        await asyncio.gather(*(one(shed, 300, 80) for _ in range(5)), *(one(squashed, 1100, 300) for _ in range(3)))

    asyncio.run(main())
    after = _ingress_counts(faults)
    _record("overload: queue bound + wait past deadline", 8, Tally(shed.outcomes + squashed.outcomes), before, after)
    assert not shed.problems and not squashed.problems, (shed.problems, squashed.problems)
    assert shed.outcomes["completed"] >= 1 and shed.outcomes["error_retryable"] >= 2, shed.outcomes
    assert squashed.outcomes["completed"] >= 1 and squashed.outcomes["error_retryable"] >= 1, squashed.outcomes
    assert codes["pool_full"] >= 2 and codes["request_squashed"] >= 1, codes
    assert after["accepted"] - before["accepted"] == 8 and _balanced_outcomes(after)


@pytest.mark.ray
def test_killing_the_serve_controller_keeps_serving(faults: LocalServe) -> None:
    """Last in the module: after the restart this driver's own handle logs metric-push errors."""
    before = _ingress_counts(faults)
    tally = Tally()

    async def worker(client: openai.AsyncOpenAI, until_s: float, i: int) -> None:
        while time.monotonic() < until_s:
            await _one(client, tally, 20, 40, stream=i % 2 == 0)

    async def main() -> None:
        client = _client(faults)
        until = time.monotonic() + 10
        load = [asyncio.create_task(worker(client, until, i)) for i in range(4)]
        await asyncio.sleep(1.0)
        ray.kill(ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve"), no_restart=False)
        await asyncio.gather(*load)

    asyncio.run(main())
    after = _ingress_counts(faults)
    _record("Serve controller killed", 1, tally, before, after)
    assert tally.outcomes["completed"] > 10 and set(tally.outcomes) == {"completed"}, (tally.outcomes, tally.problems)
    # The controller comes back (Serve restarts it) and sees the app running.
    assert _until(lambda: bool(_actor_names("SERVE_CONTROLLER_ACTOR")), 60)
    assert _balanced_outcomes(after)
