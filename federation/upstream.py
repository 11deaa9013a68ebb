"""HTTP to one cloud: its load report, and a completion streamed back event by event.

The front always asks a cloud for a stream (with usage), whatever its client asked: the
events carry the tokens each added (app.federation_wire), so the front knows what a
failure leaves to resume, for unary requests too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from app.cloud_load import CloudLoad
from app.federation_wire import ADMIN_KEY_HEADER
from federation.config import CloudConfig

# What the front passes on of its client's headers (the rest stay between client and front).
FORWARDED_HEADERS = ("authorization", "x-service-class")
DONE = "[DONE]"


class Unreachable(Exception):
    """The cloud did not answer, or its stream broke off."""


@dataclass(frozen=True)
class Refused:
    """The cloud answered with an error before streaming (its OpenAI error body as is)."""

    status: int
    body: bytes
    retry_after_s: float | None

    @property
    def overloaded(self) -> bool:
        """Worth another cloud: 5xx, 503 overload; a 429 only excludes this cloud for the request."""
        return self.status >= 500


class UpstreamStream:
    """One cloud's SSE response: parsed events, then None for [DONE]."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self._lines = response.aiter_lines()

    async def next(self) -> dict[str, Any] | None:
        """The next event; None after [DONE]. Raises Unreachable if the stream breaks or ends
        without [DONE], or an event is not JSON."""
        try:
            async for line in self._lines:
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data.strip() == DONE:
                    return None
                event = json.loads(data)
                if not isinstance(event, dict):
                    raise ValueError("an event that is not a JSON object")
                return event
        except (httpx.HTTPError, ValueError) as exc:
            raise Unreachable(f"the stream broke ({type(exc).__name__}: {exc})") from None
        raise Unreachable("the stream ended without [DONE]")

    async def close(self) -> None:
        await self._response.aclose()


class CloudClient:
    def __init__(self, config: CloudConfig, connect_timeout_s: float,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        """`transport`: httpx's default, or a test's fake at the HTTP edge."""
        self.config = config
        self.http = httpx.AsyncClient(base_url=config.url, transport=transport, timeout=httpx.Timeout(
            None, connect=connect_timeout_s), limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))

    @property
    def name(self) -> str:
        return self.config.name

    async def load(self) -> CloudLoad:
        """GET /admin/load. Raises Unreachable if the cloud does not answer it with 200."""
        try:
            response = await self.http.get("/admin/load", headers=self._admin(), timeout=10.0)
        except httpx.HTTPError as exc:
            raise Unreachable(f"{type(exc).__name__}: {exc}") from None
        if response.status_code != 200:
            raise Unreachable(f"GET /admin/load answered {response.status_code}")
        try:
            return CloudLoad(**response.json())
        except (TypeError, ValueError) as exc:
            raise Unreachable(f"GET /admin/load answered an unreadable body ({exc})") from None

    async def open(self, path: str, body: dict[str, Any], client_headers: Mapping[str, str],
                   service_class: str) -> UpstreamStream | Refused:
        """POST a streamed completion. Raises Unreachable if no answer comes."""
        headers = {name: client_headers[name] for name in FORWARDED_HEADERS if name in client_headers}
        key = self.config.api_keys.get(service_class)
        if key is not None:
            headers["authorization"] = f"Bearer {key.get_secret_value()}"
        headers.update(self._admin_header())
        request = self.http.build_request("POST", path, json=body, headers=headers)
        try:
            response = await self.http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise Unreachable(f"{type(exc).__name__}: {exc}") from None
        if response.status_code == 200:
            return UpstreamStream(response)
        try:
            content = await response.aread()
        except httpx.HTTPError as exc:
            raise Unreachable(f"{type(exc).__name__}: {exc}") from None
        finally:
            await response.aclose()
        if not _is_openai_error(content):
            # Not the cloud's app: another server took its address (a port freed when the cloud
            # died, handed to a local process), or a proxy's page. Its 401 says nothing of the
            # request: try another cloud, as if this one did not answer.
            raise Unreachable(f"POST {path} answered {response.status_code} without an OpenAI error body")
        return Refused(response.status_code, content, _retry_after_s(response.headers.get("retry-after")))

    def _admin(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.config.admin_key.get_secret_value()}"}

    def _admin_header(self) -> dict[str, str]:
        return {ADMIN_KEY_HEADER: self.config.admin_key.get_secret_value()}

    async def close(self) -> None:
        await self.http.aclose()


def _is_openai_error(content: bytes) -> bool:
    """Whether a body is the app's error: a JSON object whose "error" is an object."""
    try:
        body = json.loads(content)
    except ValueError:
        return False
    return isinstance(body, dict) and isinstance(body.get("error"), dict)


def _retry_after_s(value: str | None) -> float | None:
    try:
        return max(float(value), 0.0) if value is not None else None
    except ValueError:
        return None
