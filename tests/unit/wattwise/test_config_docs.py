"""docs/configuration.md is what `wattwise config-docs` prints from the schema (issue 20 item 4)."""

from pathlib import Path

from app.config import AppConfig
from federation.config import FederationConfig
from wattwise.config_docs import NO_DESCRIPTION, models, render

PAGE = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def test_configuration_page_is_current() -> None:
    assert PAGE.read_text(encoding="utf-8") == render(), (
        "docs/configuration.md is stale: run `wattwise config-docs --out docs/configuration.md`")


def test_every_model_and_field_is_on_the_page() -> None:
    page = render()
    for model in [*models(AppConfig), *models(FederationConfig)]:
        assert f"## {model.__name__}\n" in page
        for name in model.model_fields:
            assert f"| `{name}` |" in page


def test_app_config_fields_are_described() -> None:
    """app/config.py's own models describe every field."""
    from app import config
    own = [m for m in models(AppConfig) if m.__module__ == config.__name__]
    assert own
    missing = [f"{m.__name__}.{n}" for m in own for n, f in m.model_fields.items() if not f.description]
    assert not missing, missing


def test_every_reachable_field_is_described() -> None:
    """Every field reachable from AppConfig or FederationConfig, in whichever module its model
    lives, has a description."""
    found = [*models(AppConfig), *models(FederationConfig)]
    assert len(found) > 1
    missing = [f"{m.__module__}.{m.__name__}.{n}" for m in found
               for n, f in m.model_fields.items() if not (f.description or "").strip()]
    assert not missing, missing
    assert NO_DESCRIPTION not in render()


def test_policy_and_simulator_configs_are_described() -> None:
    """What users set through policy_kwargs or `wattwise simulate` describes every field too."""
    from autoscaling.baselines import PoolPlanConfig
    from autoscaling.chiron.policy import ChironConfig
    from autoscaling.dynamollm.policy import DynamoLLMConfig
    from autoscaling.throttllem.config import ThrottllemScalingConfig
    from autoscaling.utilisation import UtilisationConfig
    from sim.config import SimConfig
    from sim.splitwise import SplitwiseSimConfig

    roots = (SimConfig, SplitwiseSimConfig, DynamoLLMConfig, ChironConfig, UtilisationConfig, PoolPlanConfig,
             ThrottllemScalingConfig)
    found = {m for root in roots for m in models(root)}
    missing = sorted(f"{m.__module__}.{m.__name__}.{n}" for m in found
                     for n, f in m.model_fields.items() if not (f.description or "").strip())
    assert not missing, missing
