"""Input hardening against the running app: a fuzz run of the published spec with zero 5xx,
and early rejection over HTTP (tests/unit/app/test_openapi.py checks the spec and the field
validation in process).

schemathesis generates bodies, path parameters and queries from our spec, valid ones
(positive) and invalid ones (negative); each case goes over real HTTP with a tenant key,
an admin key, a wrong key or none. Any 5xx or broken connection is a failure: bad input
must be a 4xx in OpenAI's format. Print the counts with `-s`.
"""

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from app.config import hash_key
from tests.factories import keep_every_pool
from wattwise.local_serve import LocalServe

KEY = "sk-fuzz-tenant-91ab"
MODEL = "llama2-70b-sim"
EXAMPLES_PER_MODE = 60  # per operation and mode; keeps the module under 2 minutes here
MAX_FUZZ_TOKENS = 16  # valid requests are served: keep generations short


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServe]:
    db = tmp_path_factory.mktemp("batches") / "batches.sqlite"

    def edit(config: dict[str, Any]) -> None:
        args = config["applications"][0]["args"]
        args["api_keys"] = [{"sha256": hash_key(KEY), "tenant": "fuzz"}]
        args["default_max_tokens"] = 8
        args["batch_api"] = {"db_path": str(db)}
        keep_every_pool(config)

    with LocalServe(edit=edit) as local:
        yield local


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
    keys = {"tenant": KEY, "admin": served.admin_key, "wrong": "sk-wrong-fuzz", "none": None}
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
    return httpx.post(f"{served.base_url}/v1/completions", content=content, timeout=60,
                      headers={"authorization": f"Bearer {KEY}", "content-type": "application/json", **(headers or {})})


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
