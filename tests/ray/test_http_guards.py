"""What the HTTP surface refuses, on one running app started as users start it (LocalServe):
tenant and admin keys through real HTTP (the openai client; 401/403, admin endpoints, no key in
the logs), then bad input (a fuzz run of the published spec with zero 5xx, and early
rejection). One app for both: each start costs a minute of a CI machine's two cores. The pure
checks are tests/unit/app/test_auth.py and tests/unit/app/test_openapi.py.

The fuzz run generates bodies, path parameters and queries from our spec, valid ones
(positive) and invalid ones (negative); each case goes over real HTTP with a tenant key, an
admin key, a wrong key or none. Any 5xx or broken connection is a failure: bad input must be a
4xx in OpenAI's format. Print the counts with `-s`. It runs last: its admin calls change the
app's settings.
"""

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import requests
import schemathesis
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from app.config import hash_key
from tests.factories import keep_every_pool
from tests.live_app import wait_for
from wattwise.local_serve import LocalServe

MODEL = "llama2-70b-sim"
TENANT_KEY = "sk-tenant-3f9a1c"
SLO_KEY = "sk-tenant-with-slo-77d2"  # from the keys file, with its own targets
ADMIN_KEY = "sk-admin-b41e0c"
WRONG_KEY = "sk-wrong-c0ffee-5150"


FUZZ_KEY = "sk-fuzz-tenant-91ab"
EXAMPLES_PER_MODE = 30  # per operation and mode: ~1,000 cases, ~40 s of CPU on a 2-core CI machine
MAX_FUZZ_TOKENS = 16  # valid requests are served: keep generations short


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServe]:
    keys = tmp_path_factory.mktemp("keys") / "keys.yaml"
    keys.write_text(yaml.safe_dump({
        "api_keys": [{"sha256": hash_key(SLO_KEY), "tenant": "slo-co", "ttft_s": 0.9, "tbt_s": 0.15}],
        "admin_keys": [{"sha256": hash_key(ADMIN_KEY), "name": "ops"}],
    }))

    def edit(config: dict[str, Any]) -> None:
        args = config["applications"][0]["args"]
        args["api_keys"] = [{"sha256": hash_key(TENANT_KEY), "tenant": "acme"},
                            {"sha256": hash_key(FUZZ_KEY), "tenant": "fuzz"}]
        args["api_keys_file"] = str(keys)
        args["default_max_tokens"] = 8  # fuzzed requests that name no length stay short
        args["batch_api"] = {"db_path": str(tmp_path_factory.mktemp("batches") / "batches.sqlite")}
        # Two ingress replicas: operator settings must reach both, whichever one took the call.
        args["ingress_replicas"] = 2
        args["gateway_replicas"] = 1  # the entry in front of them: one is enough here
        keep_every_pool(config)  # the admin calls below act on pool-short

    with LocalServe(edit=edit, dashboard=False) as local:
        yield local


def _client(served: LocalServe, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.base_url}/v1", api_key=key, max_retries=0, timeout=60)


def _get(served: LocalServe, path: str, key: str | None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{served.base_url}{path}", headers=headers, timeout=30)


def _post(served: LocalServe, path: str, body: dict[str, Any], key: str | None = ADMIN_KEY) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{served.base_url}{path}", json=body, headers=headers, timeout=30)


@pytest.mark.ray
def test_tenant_keys_work_and_carry_their_slo(served: LocalServe) -> None:
    resp = _client(served, TENANT_KEY).completions.create(model=MODEL, prompt="hello", max_tokens=3)
    assert resp.usage.completion_tokens == 3
    report = _client(served, SLO_KEY).completions.create(model=MODEL, prompt="hello", max_tokens=3).model_extra
    assert report["wattwise"]["slo_ttft_s"] == 0.9 and report["wattwise"]["slo_tbt_s"] == 0.15


@pytest.mark.ray
def test_bad_keys_are_401(served: LocalServe) -> None:
    with pytest.raises(openai.AuthenticationError):
        _client(served, WRONG_KEY).completions.create(model=MODEL, prompt="hello", max_tokens=2)
    with pytest.raises(openai.AuthenticationError):
        _client(served, WRONG_KEY).models.list()
    resp = _post(served, "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
                 key=None)
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.ray
@pytest.mark.parametrize("path", ["/admin/pools", "/admin/plan", "/admin/profiles"])
def test_admin_reads_need_the_admin_key(served: LocalServe, path: str) -> None:
    assert _get(served, path, None).status_code == 401
    assert _get(served, path, WRONG_KEY).status_code == 401
    forbidden = _get(served, path, TENANT_KEY)
    assert forbidden.status_code == 403 and forbidden.json()["error"]["code"] == "admin_key_required"
    assert _get(served, path, ADMIN_KEY).status_code == 200
    assert _get(served, path, served.admin_key).status_code == 200


@pytest.mark.ray
def test_readiness_is_open_and_admin_reads_report(served: LocalServe) -> None:
    ready = _get(served, "/health/ready", None)
    assert ready.status_code == 200 and ready.json() == {
        "ready": True, "pools": {"pool-short": True, "pool-medium": True, "pool-long": True}}
    # At least the one each pool keeps: the autoscaler may have added one for the earlier tests'
    # traffic (seen on a loaded machine, where requests stay in flight longer).
    replicas = served.pool_replicas()
    assert set(replicas) == {"pool-short", "pool-medium", "pool-long"} and min(replicas.values()) >= 1
    assert _get(served, "/admin/profiles", ADMIN_KEY).json() == {"object": "list", "data": []}  # utilisation
    assert set(_get(served, "/admin/plan", ADMIN_KEY).json()) == {"version", "plan", "overrides", "rollouts", "drained"}


def _metric(served: LocalServe, name: str, pool: str) -> float | None:
    for line in httpx.get(served.metrics_url, timeout=10).text.splitlines():
        if line.startswith(name + "{") and f'pool="{pool}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None




@pytest.mark.ray
def test_admin_clock_reaches_the_pool_through_the_plan(served: LocalServe) -> None:
    assert _post(served, "/admin/clocks", {"pool": "short", "clock_mhz": 1200}, key=TENANT_KEY).status_code == 403
    bad = _post(served, "/admin/clocks", {"pool": "short", "clock_mhz": 50})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "clock_mhz"
    assert _post(served, "/admin/clocks", {"pool": "huge", "clock_mhz": 1200}).status_code == 404
    resp = _post(served, "/admin/clocks", {"pool": "short", "clock_mhz": 1200})
    assert resp.status_code == 200 and resp.json()["pool"] == "pool-short"
    assert _get(served, "/admin/plan", ADMIN_KEY).json()["overrides"] == {"clock_mhz": {"pool-short": 1200}}
    # The replica applied it (its clock gauge), the other pools kept theirs.
    wait_for(lambda: _metric(served, "ray_wattwise_gpu_clock_mhz", "short") == 1200, 60, "clock 1200 on short")
    assert _metric(served, "ray_wattwise_gpu_clock_mhz", "medium") != 1200
    assert _post(served, "/admin/clocks", {"pool": "short", "clock_mhz": None}).json()["clock_mhz"] is None
    assert _get(served, "/admin/plan", ADMIN_KEY).json()["overrides"] == {"clock_mhz": {}}


@pytest.mark.ray
def test_admin_tp_pin_needs_the_admin_key_and_one_of_the_pools_options(served: LocalServe) -> None:
    pin = {"pool": "short", "tensor_parallel": 2}  # its engine's own: it has no tensor_parallel_options
    assert _post(served, "/admin/tensor_parallel", pin, key=TENANT_KEY).status_code == 403
    bad = _post(served, "/admin/tensor_parallel", {"pool": "short", "tensor_parallel": 4})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tensor_parallel"
    assert _post(served, "/admin/tensor_parallel", {"pool": "short", "tensor_parallel": 0}).status_code == 400
    # The store keeps the pin; the controller applies it to the plan it publishes (an in-place pool).
    pinned = _post(served, "/admin/tensor_parallel", pin).json()
    assert (pinned["pool"], pinned["tensor_parallel"]) == ("pool-short", 2)
    plan = _get(served, "/admin/plan", ADMIN_KEY).json()
    assert plan["overrides"]["tensor_parallel"] == {"pool-short": 2}
    wait_for(lambda: (_get(served, "/admin/plan", ADMIN_KEY).json()["plan"] or {}).get("tensor_parallel", {})
             .get("pool-short") == 2, 30, "the controller's plan carries the pin")
    assert _post(served, "/admin/tensor_parallel", {**pin, "tensor_parallel": None}).status_code == 200


@pytest.mark.ray
def test_drained_pool_gets_no_new_requests(served: LocalServe) -> None:
    client = _client(served, TENANT_KEY)

    def pool() -> str:
        return client.completions.create(model=MODEL, prompt="hi", max_tokens=2).model_extra["wattwise"]["pool"]

    assert pool() == "pool-short"
    assert _post(served, "/admin/drain", {"pool": "short"}, key=TENANT_KEY).status_code == 403
    assert _post(served, "/admin/drain", {"pool": "short"}).json()["all_drained"] == ["pool-short"]
    # The other ingress replica learns of the drain from the plan store (read every second;
    # later on a busy machine). Then every request, whichever ingress replica takes it, goes to
    # the next larger pool: 12 in a row, which one ingress still routing to pool-short would
    # break with probability 1 - 2**-12.
    wait_for(lambda: [pool() for _ in range(12)] == ["pool-medium"] * 12, 60, "both ingresses routing around the drain")
    assert _get(served, "/admin/plan", ADMIN_KEY).json()["drained"] == ["pool-short"]
    assert _post(served, "/admin/drain", {"pool": "pool-short", "drain": False}).json()["all_drained"] == []
    wait_for(lambda: [pool() for _ in range(12)] == ["pool-short"] * 12, 60, "both ingresses routing to pool-short")


def _logs(served: LocalServe) -> str:
    """Everything this cluster logged: `serve run`'s output and its Ray session's log files."""
    assert served.ray_session_dir is not None
    files = [p for p in (served.ray_session_dir / "logs").rglob("*") if p.is_file()]
    return "\n".join([served.log_path.read_text(errors="replace")] + [p.read_text(errors="replace") for p in files])


@pytest.mark.ray
def test_keys_never_reach_the_logs(served: LocalServe) -> None:
    """Last of the key checks: every key above was sent, good and bad; none may be logged."""
    sent = [_get(served, "/admin/pools", WRONG_KEY),
            _post(served, "/v1/completions", {"model": MODEL, "prompt": "x"}, key=WRONG_KEY)]
    request_ids = [response.headers["x-request-id"] for response in sent]
    # Serve logs a request's access line when it ends: once both are in, so is all they logged.
    # The drain test's audit line shows these are the right logs.
    wait_for(lambda: all(rid in (text := _logs(served)) for rid in request_ids)
             and "wattwise admin 'ops': drained pool-short" in text, 120, "the requests' lines in the logs")
    everything = _logs(served)
    for secret in (TENANT_KEY, SLO_KEY, ADMIN_KEY, WRONG_KEY, served.admin_key):
        assert secret not in everything


# ---- bad input: last, as its admin calls change the app's settings -----------------------------
def _servable(body: Any, real_model: bool) -> None:
    """Half the cases name the served model, so they get past the 404 into classification
    and generation; those really generate, so their token counts are capped."""
    if isinstance(body, dict):
        if real_model and "model" in body:
            body["model"] = MODEL
        for field in ("max_tokens", "max_completion_tokens"):
            value = body.get(field)
            if isinstance(value, int) and not isinstance(value, bool) and value > MAX_FUZZ_TOKENS:
                body[field] = MAX_FUZZ_TOKENS


class Tally:
    def __init__(self) -> None:
        self.tried: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()
        self.failures: list[str] = []


def _fuzz(op: Any, mode: GenerationMode, base_url: str, keys: dict[str, str | None], tally: Tally) -> None:
    label = f"{op.method.upper()} {op.path}"
    # Mostly the key the operation is for; draining pools with a real admin key would turn
    # later requests into (correct) 503s, so /admin/drain gets every other key only.
    main = "admin" if op.path.startswith("/admin/") else "tenant"
    allowed = [k for k in [main, main, *keys] if not (k == "admin" and op.path == "/admin/drain")]

    @settings(max_examples=EXAMPLES_PER_MODE, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(generation_mode=mode), who=st.sampled_from(allowed), real_model=st.booleans())
    def run(case: Any, who: str, real_model: bool) -> None:
        _servable(case.body, real_model)
        headers = {"authorization": f"Bearer {keys[who]}"} if keys[who] else {}
        try:
            response = case.call(base_url=base_url, headers=headers, timeout=60)
        except requests.RequestException as exc:
            tally.failures.append(f"{label} [{mode}, {who}]: {type(exc).__name__}: {exc}")
            return
        tally.tried[label] += 1
        tally.statuses[response.status_code] += 1
        if response.status_code >= 500:
            tally.failures.append(f"{label} [{mode}, {who}] -> {response.status_code}: {response.text[:300]} "
                                  f"(body {str(case.body)[:200]})")

    try:
        run()
    except Unsatisfiable:  # nothing invalid to send (no body, no parameters)
        assert mode == GenerationMode.NEGATIVE, label


@pytest.mark.ray
def test_fuzz_openapi_has_no_5xx(served: LocalServe) -> None:
    schema = schemathesis.openapi.from_url(f"{served.base_url}/openapi.json")
    keys = {"tenant": FUZZ_KEY, "admin": served.admin_key, "wrong": "sk-wrong-fuzz", "none": None}
    tally = Tally()
    operations = [result.ok() for result in schema.get_all_operations()]
    started = time.monotonic()
    for op in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _fuzz(op, mode, served.base_url, keys, tally)
        print(f"  {op.method.upper()} {op.path}: {tally.tried[f'{op.method.upper()} {op.path}']} cases, "
              f"{time.monotonic() - started:.0f} s", flush=True)
    total = sum(tally.tried.values())
    print(f"\nfuzz: {total} cases over {len(operations)} operations in {time.monotonic() - started:.0f} s; "
          f"statuses {dict(sorted(tally.statuses.items()))}; 5xx or broken: {len(tally.failures)}")
    assert len(operations) >= 15 and all(tally.tried[f"{o.method.upper()} {o.path}"] > 0 for o in operations)
    assert not tally.failures, "\n".join(tally.failures[:20])


# ---- early rejection over HTTP ---------------------------------------------------------------
def _post_raw(served: LocalServe, content: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {FUZZ_KEY}", "content-type": "application/json", **(headers or {})}
    return httpx.post(f"{served.base_url}/v1/completions", content=content, timeout=60, headers=headers)


@pytest.mark.ray
def test_oversized_bodies_are_413_even_without_content_length(served: LocalServe) -> None:
    limit = 1_000_000  # AppConfig.max_request_bytes
    declared = _post_raw(served, b"x" * (limit + 1))
    assert declared.status_code == 413 and declared.json()["error"]["code"] == "request_too_large"

    def chunked() -> Iterator[bytes]:  # no Content-Length: refused while streaming in
        yield b'{"model": "' + MODEL.encode() + b'", "prompt": "'
        for _ in range(40):
            yield b"w " * 32_768

    streamed = _post_raw(served, chunked())
    assert streamed.status_code == 413 and streamed.json()["error"]["code"] == "request_too_large"


@pytest.mark.ray
@pytest.mark.parametrize(("content", "code"), [
    (b'{"model": "llama2-70b-sim", "prompt": "caf\xe9"}', "invalid_json"),  # Latin-1, not UTF-8
    (b"[" * 100_000 + b"]" * 100_000, "invalid_json"),  # nesting past the parser's recursion limit
    (b'{"model": "llama2-70b-sim", "prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}", "invalid_json"),
    (b'{"model": "llama2-70b-sim", "prompt": "a\\ud800b"}', None),  # a lone surrogate: not UTF-8
])
def test_bad_encodings_are_400(served: LocalServe, content: bytes, code: str | None) -> None:
    resp = _post_raw(served, content)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == code


@pytest.mark.ray
def test_nul_prompts_are_served(served: LocalServe) -> None:
    """The prompt `vllm bench serve` got a 400 for: served, and counted as tokens."""
    resp = _post_raw(served, b'{"model": "llama2-70b-sim", "prompt": "a\\u0000b", "max_tokens": 3}')
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["prompt_tokens"] == 3 and resp.json()["usage"]["completion_tokens"] == 3
