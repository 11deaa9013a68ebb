"""Who is calling: a bearer API key -> a tenant (service class, SLO, limits), or an operator.

Keys are found by a dict lookup on the sha256 of the presented token, so the stored
hashes are never compared byte by byte with client input (no timing leak), and the raw
token is never stored, logged or echoed: errors say only that the key is wrong.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from app.config import AdminKey, ApiKey
from app.openai_api import APIError

BEARER = "bearer "
# No real key is longer; a longer header is refused without hashing it.
MAX_KEY_CHARS = 512
ADMIN_DISABLED = (
    "Admin endpoints are disabled: no admin_keys are configured. Add `admin_keys: [{sha256: <sha256 hex of "
    "the key>, name: <who>}]` to the app's args in serve_config.yaml (or an `admin_keys` list to api_keys_file)."
)


@dataclass(frozen=True)
class Tenant:
    name: str
    service_class: str
    # The key's own targets (ttft_s / tbt_s), applied over the service class's.
    slo_override: dict[str, float] = field(default_factory=dict)


def _unauthorized(what: str) -> APIError:
    return APIError(401, f"Incorrect or missing {what}. Send it as 'Authorization: Bearer <key>'.",
                    code="invalid_api_key")


def token_digest(authorization: str | None) -> str | None:
    """sha256 hex of the bearer token in an Authorization header, None if there is none."""
    if not authorization or authorization[: len(BEARER)].lower() != BEARER:
        return None
    token = authorization[len(BEARER):].strip()
    if not token or len(token) > MAX_KEY_CHARS:
        return None
    return hashlib.sha256(token.encode()).hexdigest()


class Authenticator:
    """Tenant keys and admin keys by hash. Without tenant keys the API is open (the
    service class then comes from the X-Service-Class header); without admin keys the
    admin endpoints are closed."""

    def __init__(self, api_keys: list[ApiKey], admin_keys: list[AdminKey], default_service_class: str) -> None:
        self._tenants = {k.sha256: k for k in api_keys}
        self._admins = {k.sha256: k for k in admin_keys}
        self._default_service_class = default_service_class

    def __repr__(self) -> str:
        return f"Authenticator({len(self._tenants)} tenant keys, {len(self._admins)} admin keys)"

    def tenant(self, authorization: str | None, requested_class: str | None = None) -> Tenant:
        if not self._tenants:
            return Tenant("default", requested_class or self._default_service_class)
        key = self._tenants.get(token_digest(authorization) or "")
        if key is None:
            raise _unauthorized("API key")
        return Tenant(key.tenant, key.service_class, _slo_override(key))

    def admin(self, authorization: str | None) -> AdminKey:
        """The admin key presented; 401 without a valid key, 403 with a tenant's key."""
        if not self._admins:
            raise APIError(403, ADMIN_DISABLED, "permission_error", code="admin_disabled")
        digest = token_digest(authorization) or ""
        if digest in self._admins:
            return self._admins[digest]
        if digest in self._tenants:
            raise APIError(403, "This API key is a tenant key; admin endpoints need an admin key.",
                           "permission_error", code="admin_key_required")
        raise _unauthorized("admin key")


def _slo_override(key: ApiKey) -> dict[str, Any]:
    return {name: value for name, value in (("ttft_s", key.ttft_s), ("tbt_s", key.tbt_s)) if value is not None}
