"""What a federation front door and a wattwise app say to each other beyond the OpenAI API.

The front calls each app with one of the app's admin keys in `ADMIN_KEY_HEADER`. Such a
call gets, on every event of a stream, the tokens that event carries (`PROGRESS_FIELD`):
the front tracks each cloud's progress in tokens, and can resume exactly. A stream that
broke on one cloud goes on at another as the gateway resumes one inside an app: the
request as the client sent it, plus `RESUME_FIELD` in its body, what the client already
holds. The app then answers with the same response id, only the rest of the text, times
from the original arrival and usage counting every token; its rate limit is not charged
again (the tokens were charged where the stream began), which is why only an admin key
may ask for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import ConfigDict, Field, StrictFloat, StrictInt, StrictStr

ADMIN_KEY_HEADER = "x-wattwise-admin-key"
RESUME_FIELD = "wattwise_resume"
PROGRESS_FIELD = "wattwise_progress"


@dataclass(frozen=True)
class HeldStream:
    """What the client holds of one streamed completion: enough for another ingress replica,
    or another cloud, to finish it (the same request id, times from the original arrival).
    A front sends it in `RESUME_FIELD`; the constraints are checked there, by the ingress
    (a pydantic TypeAdapter), and cost nothing where the gateway builds one per event
    (deployments.asgi_bridge.StreamState)."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    request_id: Annotated[StrictStr, Field(pattern=r"^[0-9a-zA-Z_-]{1,64}$")]
    arrival_s: Annotated[StrictFloat, Field(ge=0)]
    text: StrictStr = ""
    tokens: Annotated[StrictInt, Field(ge=0)] = 0
    first_token_s: StrictFloat | None = None
    last_token_s: StrictFloat | None = None
    retries: Annotated[StrictInt, Field(ge=0)] = 0  # replica failures the stream survived so far
    stall_s: Annotated[StrictFloat, Field(ge=0)] = 0.0  # the longest silence a resume cost the client
    events: Annotated[StrictInt, Field(ge=0)] = 0  # body parts (SSE events) sent: a chat role goes only in the first


def progress_of(event: dict[str, Any]) -> int | None:
    """The tokens an event of a federated stream carries (None: it says nothing)."""
    progress = event.get(PROGRESS_FIELD)
    tokens = progress.get("tokens") if isinstance(progress, dict) else None
    return tokens if isinstance(tokens, int) else None
