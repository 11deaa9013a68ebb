"""The per-replica layers the one controller needs in every pool, checked before the app starts.

`policy: wattwise` (the application's autoscaling policy) plans each pool's clock *band*; the
replicas' throttLL'eM hooks pick each step's clock inside it and admit requests, and Chiron's
interactive-first batcher lets batch work yield. A pool whose engine lacks them would run
silently as a plainer policy: the planner would price a clock the replicas never pick. The
policy and the pools live in different parts of a Serve config file (`autoscaling_policy` and
`args`), so the check reads the whole application.
"""

from __future__ import annotations

from typing import Any

from app.config import AppConfig
from autoscaling.dynamollm.shape_planner import ShapePlannerConfig
from engines.modelled_engine_config import ModelledEngineConfig

CONTROLLER = "wattwise"


def missing_layers(config: AppConfig) -> list[str]:
    """`pools[i].engine.FIELD` for each layer a pool's engine leaves out (interactive-first is
    the modelled engine's batcher; a vLLM engine orders by priority in its own scheduler)."""
    missing = []
    for i, pool in enumerate(config.pools):
        if pool.engine.throttllem is None:
            missing.append(f"pools[{i}].engine.throttllem (pool {pool.name!r}): throttLL'eM's admission and "
                           "per-step clock; `throttllem: {}` turns it on")
        if isinstance(pool.engine, ModelledEngineConfig) and not pool.engine.interactive_first:
            missing.append(f"pools[{i}].engine.interactive_first (pool {pool.name!r}): Chiron's batch work "
                           "yielding to interactive; `interactive_first: true`")
    return missing


def other_kv_budgets(config: AppConfig, planner_kv_budget: float) -> list[str]:
    """`pools[i].engine.throttllem.kv_budget` for each pool whose throttLL'eM reads another KV
    budget than the planner sizes the pool to (core.kv_budget: one value for every layer)."""
    return [f"pools[{i}].engine.throttllem.kv_budget (pool {pool.name!r}) is {t.kv_budget}, the planner's "
            f"(policy_kwargs.planner.kv_budget) {planner_kv_budget}: set both to one value"
            for i, pool in enumerate(config.pools)
            if (t := pool.engine.throttllem) is not None and t.kv_budget != planner_kv_budget]


def check_serve_file(serve_config: dict[str, Any]) -> None:
    """Raises ValueError naming each application run by the one controller whose pools lack a
    layer it needs or read another KV budget than its planner (a Serve config file's content,
    as `serve run` reads it)."""
    problems = []
    for app in serve_config.get("applications") or []:
        kwargs = (app.get("autoscaling_policy") or {}).get("policy_kwargs") or {}
        if kwargs.get("policy") != CONTROLLER:
            continue
        config = AppConfig.model_validate(app.get("args") or {})
        planner = ShapePlannerConfig.model_validate(kwargs.get("planner") or {})
        problems += [f"application {app.get('name')!r}: {m}"
                     for m in missing_layers(config) + other_kv_budgets(config, planner.kv_budget)]
    if problems:
        raise ValueError(f"policy: {CONTROLLER} needs its per-replica layers in every pool, on one KV budget:\n  "
                         + "\n  ".join(problems))
