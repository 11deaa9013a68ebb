"""The shipped configs are valid: cluster.yaml for the Ray launcher, serve_config.yaml for
Serve's schema and our AppConfig (so `ray up` and `serve run` fail on nothing we ship)."""

import copy

import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config
from ray.serve.schema import ServeDeploySchema

from app.config import AppConfig
from autoscaling.serve_adapter import AppAutoscalingPolicy
from wattwise.paths import ROOT, SERVE_CONFIG


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
