"""The shipped configs are valid: cluster.yaml for the Ray launcher, serve_config.yaml for
Serve's schema and our AppConfig (so `ray up` and `serve run` fail on nothing we ship)."""

import copy

import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config
from ray.serve.schema import ServeDeploySchema

from app.config import AppConfig
from core.paths import ROOT, SERVE_CONFIG
from deployments.serve_adapter import AppAutoscalingPolicy


def test_cluster_yaml_validates_offline() -> None:
    config = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    validate_config(prepare_config(copy.deepcopy(config)))
    assert config["available_node_types"]["h100x8"]["resources"]["GPU"] == 8


def test_serve_config_matches_serve_schema_and_app_config() -> None:
    config = yaml.safe_load(SERVE_CONFIG.read_text())
    schema = ServeDeploySchema.model_validate(config)
    app = schema.applications[0]
    AppConfig.model_validate(app.args)
    AppAutoscalingPolicy(**{k: v for k, v in app.autoscaling_policy["policy_kwargs"].items()})


def test_bad_app_config_names_the_field() -> None:
    config = yaml.safe_load(SERVE_CONFIG.read_text())
    args = config["applications"][0]["args"]
    args["pools"][0]["autoscaling"] = {"min_replicas": 5, "max_replicas": 2}
    with pytest.raises(ValueError, match="min_replicas must be <= max_replicas"):
        AppConfig.model_validate(args)
    args["pools"][0]["autoscaling"] = {"max_replica": 2}
    with pytest.raises(ValueError, match="max_replica"):
        AppConfig.model_validate(args)


def _shipped_args() -> dict:
    return yaml.safe_load(SERVE_CONFIG.read_text())["applications"][0]["args"]


@pytest.mark.parametrize(("edit", "field", "rule"), [
    (lambda a: a["pools"][0].update(autoscaling={"min_replicas": 1, "max_replicas": 2, "initial_replicas": 3}),
     "pools.0.autoscaling", "initial_replicas must be within [min_replicas, max_replicas] = [1, 2], not 3"),
    (lambda a: a["pools"][1].update(name=a["pools"][0]["name"]), "pools[].name", "pool names must be unique"),
    (lambda a: a["pools"][2].update(classes=["LS", "LM"]), "pools[].classes",
     "length classes served by no pool: ['LL']"),
    (lambda a: a["pools"][2].update(classes=["LS", "LM", "LL", "SS"]), "pools[2].classes",
     "length class SS is in pools"),
    (lambda a: a["pools"][0].update(classes=["XX"]), "pools[0].classes", "unknown length class 'XX'; known: ['SS'"),
    (lambda a: a["pools"][0]["engine"].update(model="gpt-17"), "",
     "pools[0].engine.model: unknown model 'gpt-17'; "
     "known: ['bloom-176b', 'llama2-13b', 'llama2-70b', 'llama3.1-70b', 'llama3.1-8b']"),
    (lambda a: a["pools"][1]["engine"].update(hardware="tpu-v9"), "", "pools[1].engine.hardware: unknown GPU 'tpu-v9'"),
    (lambda a: a["pools"][2]["engine"].update(model="llama3.1-70b", throttllem={"model": "llama2-70b"}), "",
     "pools[2].engine.throttllem.model ('llama2-70b') must be the engine's ('llama3.1-70b')"),
    (lambda a: a.update(default_service_class="gold"), "", "default_service_class 'gold' is not in services"),
    (lambda a: a.update(api_keys=[{"sha256": "0" * 64, "tenant": "t", "service_class": "gold"}]), "",
     "api_keys[0].service_class (tenant 't'): unknown service class 'gold'"),
    (lambda a: a.update(api_keys=[{"sha256": "0" * 64, "tenant": "t"}], admin_keys=[{"sha256": "0" * 64}]), "",
     "admin_keys[0].sha256: the same key as api_keys[0]"),
    (lambda a: a.update(api_keys=[{"sha256": "sk-raw-key", "tenant": "t"}]), "api_keys.0.sha256",
     "String should match pattern"),
    (lambda a: a.update(api_keys_file="/nonexistent/keys.yaml"), "", "api_keys_file '/nonexistent/keys.yaml': cannot"),
    (lambda a: a.update(rate_limit_burst_s=0), "rate_limit_burst_s", "greater than 0"),
    (lambda a: a.update(pools_typo=[]), "pools_typo", "Extra inputs are not permitted"),
])
def test_bad_config_is_rejected_naming_the_field_and_the_rule(edit, field: str, rule: str) -> None:
    args = _shipped_args()
    edit(args)
    with pytest.raises(ValueError) as err:
        AppConfig.model_validate(args).resolved()
    assert rule in str(err.value) and field in str(err.value)
    assert "sk-raw-key" not in str(err.value)  # values are not echoed: a pasted key stays out of logs


def test_a_pool_moved_to_another_model_takes_throttllem_with_it() -> None:
    """`throttllem: {}` models the replica it runs in: the engine's model, GPU and profile."""
    args = _shipped_args()
    for pool in args["pools"]:
        pool["engine"].update(model="llama3.1-70b", profile="mlenergy-llama3-70b-h100")
    for pool in AppConfig.model_validate(args).resolved().pools:
        throttllem = pool.engine.throttllem
        assert throttllem is not None
        assert (throttllem.model, throttllem.hardware, throttllem.profile) == (
            "llama3.1-70b", "h100-80gb", "mlenergy-llama3-70b-h100")


@pytest.mark.parametrize(("kwargs", "rule"), [
    ({"policy": "nope"}, "unknown control policy 'nope'; known: ['best-static', 'chiron'"),
    ({"policy": "utilisation", "target_requests_per_replcia": 4}, "target_requests_per_replcia"),
    ({"policy": "utilisation", "target_requests_per_replica": -1}, "greater than 0"),
])
def test_bad_policy_config_is_rejected_by_name(kwargs: dict, rule: str) -> None:
    with pytest.raises(ValueError) as err:
        AppAutoscalingPolicy(**kwargs)
    assert rule in str(err.value)


@pytest.mark.parametrize("name", ["serve_config.cpu.yaml", "serve_config.gpu.yaml"])
def test_vllm_serve_configs_validate_and_place_replicas(name: str) -> None:
    """The real-engine configs (vLLM on CPU, and on GPUs for cluster.yaml, which cannot run
    here) pass Serve's schema and AppConfig; GPU pools ask for the GPUs their TP needs."""
    from deployments.builder import _pool_deployment

    schema = ServeDeploySchema.model_validate(yaml.safe_load((ROOT / name).read_text()))
    for app in schema.applications:
        config = AppConfig.model_validate(app.args)
        AppAutoscalingPolicy(**app.autoscaling_policy["policy_kwargs"])
        for pool in config.pools:
            assert pool.engine.kind == "vllm"
            deployment = _pool_deployment(pool, config)._bound_deployment
            bundles = deployment._replica_config.placement_group_bundles
            tp = pool.engine.tensor_parallel
            if pool.engine.device == "cpu":
                assert bundles is None and "num_gpus" not in deployment.ray_actor_options
            elif tp == 1:
                assert bundles is None and deployment.ray_actor_options["num_gpus"] == 1
            else:
                assert bundles[1:] == [{"GPU": 1}] * tp
                assert deployment._replica_config.placement_group_strategy == "STRICT_PACK"


def test_gpu_config_steps_fit_the_tbt_target_at_every_tp_a_pool_may_run() -> None:
    """The composite's vLLM pools chunk prefill as the simulated replicas do: vLLM's
    max_num_batched_tokens is the budget batching.step_budget gives Llama-3.1-70B on the
    pool's GPU for the tightest TBT target, at every TP the pool may be given."""
    from batching.step_budget import tbt_bounded_step_tokens
    from core.classes import LengthClassConfig
    from energy.calibration import default_perf_model

    schema = ServeDeploySchema.model_validate(yaml.safe_load((ROOT / "serve_config.gpu.yaml").read_text()))
    app = next(a for a in schema.applications if a.autoscaling_policy["policy_kwargs"]["policy"] == "wattwise")
    lengths = LengthClassConfig()
    for pool in AppConfig.model_validate(app.args).pools:
        perf = default_perf_model("llama3.1-70b", pool.engine.hardware)
        tbt_s = min(lengths.slo(c).tbt_s for c in LengthClassConfig.names())
        for tp in pool.tensor_parallel_options or [pool.engine.tensor_parallel]:
            assert pool.engine.max_num_batched_tokens == tbt_bounded_step_tokens(perf, tp, tbt_s, 8192), (pool.name, tp)
