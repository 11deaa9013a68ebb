"""Tenant and admin keys: hashed config and key files, 401/403, checked on app.auth and the
config (tests/ray/test_http_guards.py goes through real HTTP against a running app)."""

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from app.auth import ADMIN_DISABLED, Authenticator, token_digest
from app.classify import Classifier
from app.config import AdminKey, ApiKey, AppConfig, hash_key, load_key_file
from app.openai_api import APIError
from app.rate_limit import TenantLimiter
from core.classes import LengthClassConfig, default_service_classes

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
    config = AppConfig(api_keys_file=mapping).resolved()
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
    config = AppConfig(api_keys_file=path)  # validators only check; the file is read on resolving
    with pytest.raises(ValueError) as err:
        config.resolved()
    assert "api_keys_file" in str(err.value) and message in str(err.value)
    assert TENANT_KEY not in str(err.value)


def test_a_key_in_two_roles_or_a_tenant_with_two_limits_is_rejected(tmp_path: Path) -> None:
    tenant = {"sha256": hash_key(TENANT_KEY), "tenant": "acme"}
    with pytest.raises(ValidationError, match=r"admin_keys\[0\]\.sha256: the same key as api_keys\[0\]"):
        AppConfig(api_keys_file=_keys_file(tmp_path, [tenant]),
                  admin_keys=[{"sha256": hash_key(TENANT_KEY)}]).resolved()
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
