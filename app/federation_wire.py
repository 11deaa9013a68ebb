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

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

ADMIN_KEY_HEADER = "x-wattwise-admin-key"
RESUME_FIELD = "wattwise_resume"
PROGRESS_FIELD = "wattwise_progress"


class ResumeState(BaseModel):
    """What the client holds of a stream another cloud began (asgi_bridge.StreamState's fields)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    request_id: str = Field(pattern=r"^[0-9a-zA-Z_-]{1,64}$")
    arrival_s: float = Field(ge=0)
    text: str = ""
    tokens: int = Field(default=0, ge=0)
    first_token_s: float | None = None
    last_token_s: float | None = None
    retries: int = Field(default=0, ge=0)
    stall_s: float = Field(default=0.0, ge=0)
    events: int = Field(default=0, ge=0)


def progress_of(event: dict[str, Any]) -> int | None:
    """The tokens an event of a federated stream carries (None: it says nothing)."""
    progress = event.get(PROGRESS_FIELD)
    tokens = progress.get("tokens") if isinstance(progress, dict) else None
    return tokens if isinstance(tokens, int) else None
