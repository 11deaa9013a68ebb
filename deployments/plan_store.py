"""Where the controller publishes its plan (a PublishedPlan) and the runtime picks it up.

Serve's autoscaling policy returns only replica counts; the rest of a plan (TP,
clocks, batch limits, routing weights, which deployment serves each shadow-TP pool)
goes to this named actor, which replicas and the ingress poll. A missing or stale plan
leaves them serving as they were. Operators' settings live here too, so every ingress
and replica sees the same and they outlive restarts: clock pins and drained pools are
layered over each plan; TP pins are applied by the controller (a pool's TP may mean a
shadow rollout, never a replica re-sharding).

The store survives node loss: Ray restarts it elsewhere (max_restarts=-1) and it reloads
its state from the GCS key-value store, which lives on the head node, not on the dead
one. The controller re-publishes its plan every few seconds, so a restart also gets the
newest plan without waiting for it to change. A reader whose store handle dies for good
looks the store up again by name; `wattwise_plan_age_seconds` shows how old its plan is.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnschedulableError
from ray.experimental import internal_kv
from ray.util import metrics as ray_metrics

from app.cloud_load import ViewLoad
from core.published_plan import PublishedPlan

NAMESPACE = "wattwise"
# Override fields the controller applies to its plan instead of the store layering them.
CONTROLLER_FIELDS = frozenset({"tensor_parallel"})
# A reader logs (once per stale spell) when its plan is older than this; the controller
# re-publishes every REPUBLISH_S, so only a stuck controller or store gets here.
STALE_PLAN_S = 60.0
# What a call to a store that Ray will not bring back raises (its restarts exhausted, or it
# was pinned to a node that is gone): look it up again by name, which recreates it.
STORE_GONE = (ActorDiedError, ActorUnschedulableError)
logger = logging.getLogger("ray.serve")


@dataclass(frozen=True)
class PlanReply:
    """The store's answer to a reader: its version, when the controller last published
    (wall-clock seconds; None before the first plan), and the plan if the reader lacks it."""

    version: int
    published_at_s: float | None
    plan: dict[str, Any] | None


@dataclass
class StoredState:
    """What the store persists so a restart (its node died) loses nothing."""

    version: int = 0
    plan: dict[str, Any] | None = None
    published_at_s: float | None = None
    # An operator's settings (POST /admin/clocks, /admin/tensor_parallel, /admin/drain):
    # plan field -> {deployment: value}, layered over every published plan until cleared.
    overrides: dict[str, dict[str, Any]] | None = None
    # The controller's shadow TP rollouts per pool (autoscaling.shadow_rollout.report).
    rollouts: dict[str, Any] | None = None


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class PlanStore:
    def __init__(self, app_name: str) -> None:
        self._key = f"plan-{app_name}".encode()
        state = self._load(app_name)
        self.version = state.version
        self.plan = state.plan
        self.published_at_s = state.published_at_s
        self.overrides: dict[str, dict[str, Any]] = state.overrides or {}
        self.rollouts: dict[str, Any] = state.rollouts or {}
        self.load: ViewLoad | None = None  # the controller's last view of the replicas' work (not persisted)

    def _load(self, app_name: str) -> StoredState:
        """The state a previous incarnation saved (a restart after its node died), if any."""
        saved = internal_kv._internal_kv_get(self._key, namespace=NAMESPACE)
        if not saved:
            return StoredState()
        try:
            state = pickle.loads(saved)
        except Exception:  # saved by an incompatible version: start empty rather than crash-loop
            logger.exception("wattwise: the saved plan of %r is unreadable; starting without it", app_name)
            return StoredState()
        logger.warning("wattwise: plan store of %r recovered plan version %d", app_name, state.version)
        return state

    def _save(self) -> None:
        state = StoredState(self.version, self.plan, self.published_at_s, self.overrides, self.rollouts)
        internal_kv._internal_kv_put(self._key, pickle.dumps(state), overwrite=True, namespace=NAMESPACE)

    def publish(self, plan: dict[str, Any], rollouts: dict[str, Any] | None = None) -> int:
        """Take the controller's plan; an unchanged one only refreshes its age."""
        self.published_at_s = time.time()
        changed = plan != self.plan or (rollouts is not None and rollouts != self.rollouts)
        if plan != self.plan:
            self.plan = plan
            self.version += 1
        if rollouts is not None:
            self.rollouts = rollouts
        if changed:
            self._save()
        return self.version

    def overrides_of(self, field: str) -> dict[str, Any]:
        """The operators' settings of one plan field: {deployment: value}."""
        return dict(self.overrides.get(field, {}))

    def override(self, field: str, deployment: str, value: Any | None) -> int:
        """Pin `field` (e.g. clock_mhz) of one deployment; None removes the pin."""
        layer = self.overrides.setdefault(field, {})
        if value is None:
            layer.pop(deployment, None)
        else:
            layer[deployment] = value
        self.version += 1
        self._save()
        return self.version

    def effective(self) -> dict[str, Any] | None:
        """The published plan with the operator's overrides on top."""
        layers = {field: layer for field, layer in self.overrides.items() if layer and field not in CONTROLLER_FIELDS}
        if not layers:
            return self.plan
        plan = dict(self.plan or {})
        for field, layer in layers.items():
            plan[field] = {**plan.get(field, {}), **layer}
        return plan

    def get(self, known_version: int = -1) -> PlanReply:
        """The plan if newer than `known_version` (else None, to keep replies small)."""
        return PlanReply(self.version, self.published_at_s,
                         self.effective() if self.version != known_version else None)

    def report_load(self, load: ViewLoad) -> None:
        """The controller's sum of its replicas' work, for GET /admin/load (a federation front)."""
        self.load = load

    def last_load(self) -> ViewLoad | None:
        return self.load

    def admin_view(self) -> dict[str, Any]:
        return {"version": self.version, "plan": self.plan, "overrides": self.overrides, "rollouts": self.rollouts}


def plan_store(app_name: str):
    # mypy keeps a class decorator's input type (python/mypy#3135): this is Ray's ActorClass.
    return PlanStore.options(  # type: ignore[attr-defined]
        name=f"plan-{app_name}", namespace=NAMESPACE, get_if_exists=True, lifetime="detached"
    ).remote(app_name)


def plan_to_dict(plan: PublishedPlan) -> dict[str, Any]:
    return asdict(plan)


def plan_from_dict(data: dict[str, Any]) -> PublishedPlan:
    return PublishedPlan(**data)


class PlanAge:
    """`wattwise_plan_age_seconds` of one reader, and a log line when its plan goes stale."""

    def __init__(self, app_name: str, stale_after_s: float = STALE_PLAN_S) -> None:
        self.app_name, self.stale_after_s = app_name, stale_after_s
        self.gauge = ray_metrics.Gauge(
            "wattwise_plan_age_seconds", "Seconds since the controller last published the plan this process holds.",
            tag_keys=("application",))
        self._stale = False

    def update(self, published_at_s: float | None, now_s: float) -> float | None:
        if published_at_s is None:
            return None
        age_s = max(now_s - published_at_s, 0.0)
        self.gauge.set(age_s, {"application": self.app_name})
        stale = age_s > self.stale_after_s
        if stale and not self._stale:
            logger.warning("wattwise: the plan is %.0f s old (stale after %.0f s): is the controller stuck?",
                           age_s, self.stale_after_s)
        self._stale = stale
        return age_s


async def follow_plan(app_name: str, apply: Callable[[PublishedPlan], None], period_s: float = 1.0) -> None:
    """Poll the store forever, calling `apply` with each new plan. A store that died for
    good (not restarted by Ray) is looked up again by name, which recreates it."""
    store = plan_store(app_name)
    age = PlanAge(app_name)
    version, published_at_s = -1, None
    while True:
        try:
            reply: PlanReply = await store.get.remote(version)
            if reply.plan is not None:
                apply(plan_from_dict(reply.plan))
            version, published_at_s = reply.version, reply.published_at_s
        except STORE_GONE as exc:
            logger.warning("wattwise: the plan store is gone (%s); looking it up again", type(exc).__name__)
            store = plan_store(app_name)
        except Exception:  # the replica keeps serving on the last plan it had
            logger.exception("wattwise: reading the plan failed; keeping the last one")
        age.update(published_at_s, time.time())
        await asyncio.sleep(period_s)
