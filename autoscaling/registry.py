"""Control policies by name, for serve_config.yaml and `wattwise simulate --policy`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autoscaling.utilisation import UtilisationConfig, UtilisationPolicy
from core.policy import ControlPolicy

POLICIES: dict[str, Callable[..., ControlPolicy]] = {
    "utilisation": lambda **kw: UtilisationPolicy(UtilisationConfig(**kw)),
}


def make_policy(name: str, **kwargs: Any) -> ControlPolicy:
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown control policy {name!r}; known: {sorted(POLICIES)}") from None
    return factory(**kwargs)
