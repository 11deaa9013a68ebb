"""Tenant and admin keys: hashed config and key files, 401/403, admin endpoints, no key in logs.

The pure part checks app.auth and the config; the Ray part goes through real HTTP with
the openai client against the app started as users start it (LocalServe).
"""

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from pydantic import ValidationError

from app.auth import ADMIN_DISABLED, Authenticator, token_digest
from app.classify import Classifier
from app.config import AdminKey, ApiKey, AppConfig, hash_key, load_key_file
from app.openai_api import APIError
from app.rate_limit import TenantLimiter
from core.classes import LengthClassConfig, default_service_classes
from tests.live_app import wait_for
from wattwise.local_serve import LocalServe

MODEL = "llama2-70b-sim"
TENANT_KEY = "sk-tenant-3f9a1c"
SLO_KEY = "sk-tenant-with-slo-77d2"  # from the keys file, with its own targets
ADMIN_KEY = "sk-admin-b41e0c"
WRONG_KEY = "sk-wrong-c0ffee-5150"


def _auth() -> Authenticator:
    return Authenticator(
        [ApiKey(sha256=hash_key(TENANT_KEY), tenant="acme", service_class="batch", ttft_s=0.5)],
        [AdminKey(sha256=hash_key(ADMIN_KEY), name="ops")], "interactive")


def test_tenant_key_maps_to_tenant_class_and_slo() -> None:
    tenant = _auth().tenant(f"Bearer {TENANT_KEY}")
    assert (tenant.name, tenant.service_class, tenant.slo_override) == ("acme", "batch", {"ttft_s": 0.5})
    assert _auth().tenant(f"bearer   {TENANT_KEY} ").name == "acme"  # scheme is case-insensitive


@pytest.mark.parametrize("header", [None, "", "Bearer ", f"Basic {TENANT_KEY}", f"Bearer {WRONG_KEY}",
                                    f"Bearer {ADMIN_KEY}", "Bearer " + "x" * 10_000])
def test_bad_tenant_key_is_401_without_echoing_it(header: str | None) -> None:
    with pytest.raises(APIError) as err:
        _auth().tenant(header)
    assert err.value.status == 401 and err.value.code == "invalid_api_key"
    assert WRONG_KEY not in json.dumps(err.value.body()) and TENANT_KEY not in json.dumps(err.value.body())


def test_admin_needs_an_admin_key() -> None:
    auth = _auth()
    assert auth.admin(f"Bearer {ADMIN_KEY}").name == "ops"
    with pytest.raises(APIError) as err:
        auth.admin(f"Bearer {TENANT_KEY}")
    assert err.value.status == 403 and err.value.code == "admin_key_required"
    for header in (None, f"Bearer {WRONG_KEY}"):
        with pytest.raises(APIError) as err:
            auth.admin(header)
        assert err.value.status == 401


def test_admin_endpoints_are_closed_without_admin_keys() -> None:
    auth = Authenticator([ApiKey(sha256=hash_key(TENANT_KEY), tenant="acme")], [], "interactive")
    with pytest.raises(APIError) as err:
        auth.admin(f"Bearer {TENANT_KEY}")
    assert err.value.status == 403 and err.value.code == "admin_disabled"
    assert "admin_keys" in err.value.message and err.value.message == ADMIN_DISABLED


def test_no_tenant_keys_means_open_api_with_header_class() -> None:
    auth = Authenticator([], [], "interactive")
    assert auth.tenant(None, "batch").service_class == "batch"
    assert auth.tenant(f"Bearer {WRONG_KEY}").name == "default"


def test_token_digest_is_the_configured_hash() -> None:
    assert token_digest(f"Bearer {TENANT_KEY}") == hash_key(TENANT_KEY)
    assert token_digest("Bearer") is None and token_digest(TENANT_KEY) is None


def test_hashes_and_raw_keys_stay_out_of_reprs_and_config_errors() -> None:
    key = ApiKey(sha256=hash_key(TENANT_KEY), tenant="acme")
    config = AppConfig(api_keys=[key], admin_keys=[AdminKey(sha256=hash_key(ADMIN_KEY))])
    for text in (repr(key), str(config), repr(config), repr(_auth())):
        assert hash_key(TENANT_KEY) not in text and hash_key(ADMIN_KEY) not in text
    # A raw key pasted where its hash belongs: the error names the field, not the key.
    with pytest.raises(ValidationError) as err:
        AppConfig.model_validate({"api_keys": [{"sha256": TENANT_KEY, "tenant": "acme"}]})
    assert "api_keys.0.sha256" in str(err.value) and TENANT_KEY not in str(err.value)


def _keys_file(tmp_path: Path, content: Any, suffix: str = ".yaml") -> str:
    path = tmp_path / f"keys{suffix}"
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    return str(path)


def test_key_file_yaml_list_and_json_mapping(tmp_path: Path) -> None:
    listed = _keys_file(tmp_path, [{"sha256": hash_key(TENANT_KEY), "tenant": "acme", "tbt_s": 0.05}])
    tenants, admins = load_key_file(listed)
    assert [k.tenant for k in tenants] == ["acme"] and admins == []
    mapping = _keys_file(tmp_path, json.dumps({"api_keys": [{"sha256": hash_key(TENANT_KEY), "tenant": "acme"}],
                                               "admin_keys": [{"sha256": hash_key(ADMIN_KEY), "name": "ops"}]}),
                         ".json")
    config = AppConfig(api_keys_file=mapping)
    assert [k.tenant for k in config.api_keys] == ["acme"] and [k.name for k in config.admin_keys] == ["ops"]
    assert config.api_keys_file is None  # read once; the keys travel with the config
    assert AppConfig.model_validate(config.model_dump(mode="json")).api_keys == config.api_keys


@pytest.mark.parametrize(("content", "message"), [
    (None, "cannot be read"),
    ("api_keys: [unclosed", "not valid JSON or YAML at line 1"),
    ("just a string", "must be a list of api key entries"),
    ({"tenants": []}, "must be a list of api key entries"),
    ({"api_keys": {"a": 1}}, "api_keys must be a list"),
    ([{"sha256": TENANT_KEY, "tenant": "acme"}], "api_keys[0].sha256: String should match pattern"),
    ([{"sha256": hash_key(TENANT_KEY)}], "api_keys[0].tenant: Field required"),
    ({"admin_keys": [{"sha256": hash_key(ADMIN_KEY), "role": "root"}]}, "admin_keys[0].role: Extra inputs"),
])
def test_bad_key_file_is_rejected_at_start_with_a_precise_message(tmp_path: Path, content: Any,
                                                                   message: str) -> None:
    path = str(tmp_path / "missing.yaml") if content is None else _keys_file(tmp_path, content)
    with pytest.raises(ValidationError) as err:
        AppConfig(api_keys_file=path)
    assert "api_keys_file" in str(err.value) and message in str(err.value)
    assert TENANT_KEY not in str(err.value)


def test_a_key_in_two_roles_or_a_tenant_with_two_limits_is_rejected(tmp_path: Path) -> None:
    tenant = {"sha256": hash_key(TENANT_KEY), "tenant": "acme"}
    with pytest.raises(ValidationError, match=r"admin_keys\[0\]\.sha256: the same key as api_keys\[0\]"):
        AppConfig(api_keys_file=_keys_file(tmp_path, [tenant]), admin_keys=[{"sha256": hash_key(TENANT_KEY)}])
    with pytest.raises(ValidationError, match=r"api_keys\[1\]: tenant 'acme' has requests_per_s"):
        AppConfig(api_keys=[tenant, {"sha256": hash_key(ADMIN_KEY), "tenant": "acme", "requests_per_s": 2}])


def test_key_slo_replaces_the_class_targets() -> None:
    classifier = Classifier(LengthClassConfig(), default_service_classes(),
                            dict.fromkeys(LengthClassConfig.names(), "pool"))
    plain, _ = classifier.classify("r1", 10, 10, 10, "interactive", 0.0)
    assert plain.slo.ttft_s == 0.25  # the SS class tightens interactive's 10 s
    own, _ = classifier.classify("r2", 10, 10, 10, "interactive", 0.0, slo_override={"ttft_s": 0.9})
    assert own.slo.ttft_s == 0.9 and own.slo.tbt_s == plain.slo.tbt_s


def test_refused_request_is_charged_to_no_bucket() -> None:
    limiter = TenantLimiter({"acme": (10.0, 5.0)}, burst_s=1.0)  # 10 requests, 5 tokens of burst
    assert limiter.retry_after_s("acme", 5, 0.0) is None
    assert limiter.retry_after_s("acme", 5, 0.0) == pytest.approx(1.0)  # tokens refuse...
    assert limiter.retry_after_s("acme", 5, 1.0) is None  # ...and the request bucket was not charged
    assert limiter.retry_after_s("other", 10**6, 0.0) is None


# ---- through the running app ------------------------------------------------------------
@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServe]:
    keys = tmp_path_factory.mktemp("keys") / "keys.yaml"
    keys.write_text(yaml.safe_dump({
        "api_keys": [{"sha256": hash_key(SLO_KEY), "tenant": "slo-co", "ttft_s": 0.9, "tbt_s": 0.15}],
        "admin_keys": [{"sha256": hash_key(ADMIN_KEY), "name": "ops"}],
    }))

    def edit(config: dict[str, Any]) -> None:
        args = config["applications"][0]["args"]
        args["api_keys"] = [{"sha256": hash_key(TENANT_KEY), "tenant": "acme"}]
        args["api_keys_file"] = str(keys)
        args["batch_api"] = {"enabled": False}
        # Two ingress replicas: operator settings must reach both, whichever one took the call.
        config["applications"][0].setdefault("deployments", []).append({"name": "Ingress", "num_replicas": 2})

    with LocalServe(edit=edit) as local:
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
    assert served.pool_replicas() == {"pool-short": 1, "pool-medium": 1, "pool-long": 1}
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
    time.sleep(2)  # the other ingress replica reads the plan store every second
    # Every request, whichever ingress replica takes it: the next larger pool takes short requests.
    assert [pool() for _ in range(12)] == ["pool-medium"] * 12
    assert _get(served, "/admin/plan", ADMIN_KEY).json()["drained"] == ["pool-short"]
    assert _post(served, "/admin/drain", {"pool": "pool-short", "drain": False}).json()["all_drained"] == []
    time.sleep(2)
    assert [pool() for _ in range(12)] == ["pool-short"] * 12


def _log_files() -> list[Path]:
    return [p for p in Path("/tmp/ray/session_latest/logs").rglob("*") if p.is_file()]


@pytest.mark.ray
def test_keys_never_reach_the_logs(served: LocalServe) -> None:
    """Last in this module: every key above was sent, good and bad; none may be logged."""
    _get(served, "/admin/pools", WRONG_KEY)
    _post(served, "/v1/completions", {"model": MODEL, "prompt": "x"}, key=WRONG_KEY)
    time.sleep(2)  # log flush
    texts = [served.log_path.read_text(errors="replace")]
    texts += [p.read_text(errors="replace") for p in _log_files()]
    everything = "\n".join(texts)
    assert "wattwise admin 'ops': drained pool-short" in everything  # the audit line: we read the right logs
    for secret in (TENANT_KEY, SLO_KEY, ADMIN_KEY, WRONG_KEY, served.admin_key):
        assert secret not in everything
