"""OpenAI sampling fields of a request body -> core.sampling.Sampling, validated.

The request schemas accept unknown fields (clients send many); the ones an engine acts
on are checked here so a bad value is a 400 naming the field, not an engine error.
"""

from __future__ import annotations

from typing import Any

from app.openai_api import APIError
from core.sampling import Sampling

MAX_STOP_SEQUENCES = 4


def _number(extra: dict[str, Any], name: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    value = extra.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value > hi or value < lo or (
            lo_open and value == lo):
        raise APIError(400, f"Invalid value for '{name}': must be a number in {'(' if lo_open else '['}{lo}, {hi}].",
                       param=name)
    return float(value)


def sampling_of(body: Any) -> Sampling:
    extra = dict(body)  # the declared fields (app.openai_api) and any unknown ones
    stop = extra.get("stop")
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if len(stops) > MAX_STOP_SEQUENCES or not all(isinstance(s, str) and s for s in stops):
        raise APIError(400, f"Invalid value for 'stop': up to {MAX_STOP_SEQUENCES} non-empty strings.", param="stop")
    seed = extra.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise APIError(400, "Invalid value for 'seed': must be an integer.", param="seed")
    return Sampling(
        temperature=_number(extra, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(extra, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        stop=stops, seed=seed, ignore_eos=extra.get("ignore_eos") is True,
    )
