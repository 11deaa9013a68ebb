"""Control policies by name, for serve_config.yaml and `wattwise simulate --policy`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autoscaling.baselines import (
    PoolPlanConfig,
    ScaleFreqPolicy,
    ScaleInstPolicy,
    ScaleShardPolicy,
    StaticPolicy,
)
from autoscaling.chiron.policy import ChironConfig, ChironPolicy
from autoscaling.dynamollm.policy import make_dynamollm
from autoscaling.serve_autoscaler import ServeAutoscalerConfig, ServeAutoscalerPolicy
from autoscaling.sla_planner.policy import SlaPlannerConfig, SlaPlannerPolicy
from autoscaling.throttllem.autoscaler import ThrottllemAutoscaler
from autoscaling.throttllem.config import ThrottllemScalingConfig
from autoscaling.utilisation import UtilisationConfig, UtilisationPolicy
from autoscaling.wattwise import make_wattwise
from core.policy import ControlPolicy

POLICIES: dict[str, Callable[..., ControlPolicy]] = {
    # The one controller: every paper as a layer (the default).
    "wattwise": make_wattwise,
    "utilisation": lambda **kw: UtilisationPolicy(UtilisationConfig(**kw)),
    # Baselines (DynamoLLM §V-A; Llumnix as in Chiron; Triton-like as in throttLL'eM).
    "singlepool": lambda **kw: StaticPolicy(PoolPlanConfig(**kw), "singlepool"),
    "multipool": lambda **kw: StaticPolicy(PoolPlanConfig(**kw), "multipool"),
    "static-max-clock": lambda **kw: StaticPolicy(PoolPlanConfig(**kw), "static-max-clock"),
    "scaleinst": lambda **kw: ScaleInstPolicy(PoolPlanConfig(**kw)),
    "scaleshard": lambda ttft_s=None, **kw: ScaleShardPolicy(PoolPlanConfig(**kw), ttft_s),
    "scalefreq": lambda ttft_s=None, **kw: ScaleFreqPolicy(PoolPlanConfig(**kw), ttft_s),
    # Seed policies.
    "dynamollm": make_dynamollm,
    "throttllem": lambda **kw: ThrottllemAutoscaler(ThrottllemScalingConfig(**kw)),
    "chiron": lambda **kw: ChironPolicy(ChironConfig(**kw)),
    # Splitwise provisions its prompt and token pools once (§IV-D); its work is in routing.
    "splitwise": lambda **kw: StaticPolicy(PoolPlanConfig(**kw), "splitwise"),
    # Baselines a careful operator would run (docs/baselines.md): the cheapest fixed plan found
    # with hindsight (sim.best_static searches it), Ray Serve's autoscaler, Dynamo's SLA planner.
    "best-static": lambda **kw: StaticPolicy(PoolPlanConfig(**kw), "best-static"),
    "serve-autoscaler": lambda **kw: ServeAutoscalerPolicy(ServeAutoscalerConfig(**kw)),
    "sla-planner": lambda **kw: SlaPlannerPolicy(SlaPlannerConfig(**kw)),
}
# Other names for a registered policy: Chiron's and DynamoLLM's papers call the utilisation
# autoscaler Llumnix's.
ALIASES: dict[str, str] = {"llumnix": "utilisation"}


def make_policy(name: str, **kwargs: Any) -> ControlPolicy:
    try:
        factory = POLICIES[ALIASES.get(name, name)]
    except KeyError:
        raise ValueError(f"unknown control policy {name!r}; known: {sorted([*POLICIES, *ALIASES])}") from None
    return factory(**kwargs)
