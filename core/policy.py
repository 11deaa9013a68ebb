"""The one interface every control policy implements."""

from __future__ import annotations

from typing import Protocol

from core.plan import ClusterPlan
from core.view import ClusterView


class ControlPolicy(Protocol):
    """A snapshot in, a plan out. Implementations keep their own state between calls
    (EWMAs, hold timers) but never read the clock or touch the runtime."""

    def observe(self, view: ClusterView, now_s: float) -> ClusterPlan: ...
