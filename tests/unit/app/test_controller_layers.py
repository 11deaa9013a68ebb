"""`policy: wattwise` refuses a pool that lacks the per-replica layers it plans around."""

import pytest
import yaml

from app.controller_layers import check_serve_file
from core.paths import SERVE_CONFIG
from wattwise.cli import main


def shipped() -> dict:
    return yaml.safe_load(SERVE_CONFIG.read_text(encoding="utf-8"))


def test_the_shipped_config_has_every_layer() -> None:
    check_serve_file(shipped())


def test_a_pool_without_throttllem_is_refused_by_name() -> None:
    config = shipped()
    del config["applications"][0]["args"]["pools"][1]["engine"]["throttllem"]
    with pytest.raises(ValueError, match=r"pools\[1\]\.engine\.throttllem \(pool 'medium'\)"):
        check_serve_file(config)


def test_another_policy_needs_no_layers() -> None:
    config = shipped()
    app = config["applications"][0]
    app["autoscaling_policy"]["policy_kwargs"] = {"policy": "utilisation"}
    for pool in app["args"]["pools"]:
        pool["engine"].pop("throttllem")
        pool["engine"]["interactive_first"] = False
    check_serve_file(config)


def test_wattwise_serve_refuses_before_starting_serve(tmp_path, capsys) -> None:
    config = shipped()
    config["applications"][0]["args"]["pools"][0]["engine"]["interactive_first"] = False
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    assert main(["serve", "--config", str(path)]) == 2
    assert "pools[0].engine.interactive_first" in capsys.readouterr().err


def test_a_pool_on_another_kv_budget_than_the_planners_is_refused_by_name() -> None:
    config = shipped()
    config["applications"][0]["args"]["pools"][2]["engine"]["throttllem"]["kv_budget"] = 0.9
    with pytest.raises(ValueError, match=r"pools\[2\]\.engine\.throttllem\.kv_budget \(pool 'long'\) is 0\.9"):
        check_serve_file(config)
    config["applications"][0]["autoscaling_policy"]["policy_kwargs"]["planner"] = {"kv_budget": 0.9}
    with pytest.raises(ValueError, match=r"pools\[0\]\.engine\.throttllem\.kv_budget \(pool 'short'\)"):
        check_serve_file(config)
