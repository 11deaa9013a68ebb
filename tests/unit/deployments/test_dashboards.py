"""The Grafana dashboard and the Prometheus alerts name only metrics the code exports.

A renamed or removed metric would leave a panel empty and an alert silent without any
error anywhere; this test reads the metric definitions from the code (the first argument
of every Counter / Gauge / Histogram constructor, found with `ast`) and fails on any name
the dashboard or the alert rules use that the code does not define. Ray exports custom
metrics with the prefix `ray_`, histograms as `_bucket`, `_count` and `_sum` series.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import ray
import yaml

from deployments.metrics import _ITL_BOUNDS_S, _LATENCY_BOUNDS_S

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "dashboards" / "wattwise.json"
ALERTS = ROOT / "dashboards" / "alerts.yaml"
CODE_DIRS = ("app", "autoscaling", "core", "deployments", "energy", "engines")
METRIC_KINDS = {"Counter", "Gauge", "Histogram"}
# Ray's own Serve metrics the dashboard uses; checked against Ray's source below.
RAY_SERVE_METRICS = {"ray_serve_deployment_replica_healthy"}
NAME = re.compile(r"\bray_[a-z0-9_]+\b")


def _defined_metrics() -> dict[str, str]:
    """{exported Prometheus name: kind} for every metric constructed in the project's code."""
    names: dict[str, str] = {}
    for folder in CODE_DIRS:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                func = node.func
                kind = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                first = node.args[0]
                if kind in METRIC_KINDS and isinstance(first, ast.Constant) and isinstance(first.value, str):
                    names[f"ray_{first.value}"] = kind
    return names


def _exported(defined: dict[str, str]) -> set[str]:
    out = set()
    for name, kind in defined.items():
        out |= {f"{name}_bucket", f"{name}_count", f"{name}_sum"} if kind == "Histogram" else {name}
    return out


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _dashboard_exprs() -> list[str]:
    dash = _dashboard()
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            exprs.append(var["definition"])
            exprs.append(var["query"]["query"])
    return exprs


def _alert_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def test_the_metric_reader_sees_the_code() -> None:
    """The check below is only as good as this reader: it must find known definitions."""
    defined = _defined_metrics()
    assert defined["ray_wattwise_time_to_first_token_seconds"] == "Histogram"
    assert defined["ray_wattwise_gpu_clock_mhz"] == "Gauge"
    assert defined["ray_wattwise_fail_static"] == "Gauge"  # ray.util.metrics, in autoscaling/
    assert defined["ray_wattwise_request_retries_total"] == "Counter"
    assert "ray_wattwise_time_to_first_token_seconds_bucket" in _exported(defined)
    assert "ray_wattwise_no_such_metric" not in _exported(defined)


def test_dashboard_and_alerts_name_only_defined_metrics() -> None:
    exported = _exported(_defined_metrics())
    used = {name for expr in _dashboard_exprs() + [r["expr"] for r in _alert_rules()] for name in NAME.findall(expr)}
    unknown = used - exported - RAY_SERVE_METRICS
    assert not unknown, f"dashboard/alerts use metrics no code defines: {sorted(unknown)}"
    assert len(used & exported) >= 15  # the dashboard covers the serving path, not a corner of it


def test_ray_serve_metrics_exist_in_ray() -> None:
    serve_src = Path(ray.__file__).parent / "serve"
    text = "\n".join(p.read_text(errors="ignore") for p in serve_src.rglob("*.py"))
    for name in RAY_SERVE_METRICS:
        assert f'"{name.removeprefix("ray_")}"' in text, name


def test_every_pool_panel_topic_is_there() -> None:
    titles = " | ".join(p["title"] for p in _dashboard()["panels"]).lower()
    for topic in ("request rate", "ttft", "tbt", "slo attainment", "energy per output token", "power", "clock",
                  "replicas", "queues", "retries", "fail-static"):
        assert topic in titles, topic


def test_dashboard_is_well_formed() -> None:
    dash = _dashboard()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dash["templating"]["list"]}
    for expr in _dashboard_exprs():
        for ref in re.findall(r"\$\{?([a-z_]+)", expr):
            assert ref in variables or ref.startswith("__"), f"{ref} is not a dashboard variable"
    for panel in dash["panels"]:
        assert panel["datasource"] == "${datasource}" and panel["targets"]


def test_slo_choices_are_histogram_bucket_bounds() -> None:
    """SLO attainment reads the bucket at the SLO: a value between bounds would match nothing."""
    choices = {v["name"]: v for v in _dashboard()["templating"]["list"] if v["type"] == "custom"}
    for name, bounds in (("ttft_slo_s", _LATENCY_BOUNDS_S), ("tbt_slo_s", _ITL_BOUNDS_S)):
        for option in choices[name]["options"]:
            assert float(option["value"]) in bounds, (name, option["value"])
    for rule in _alert_rules():
        for le in re.findall(r'le=~?"([0-9.]+)"', rule["expr"]):
            assert float(le) in _LATENCY_BOUNDS_S, (rule["alert"], le)


def test_alerts_cover_fail_static_slo_burn_and_stale_plan() -> None:
    rules = {r["alert"]: r for r in _alert_rules()}
    assert "ray_wattwise_fail_static" in rules["WattwiseFailStatic"]["expr"]
    assert "ray_wattwise_plan_age_seconds" in rules["WattwisePlanStale"]["expr"]
    assert "time_to_first_token" in rules["WattwiseTtftSloBurn"]["expr"]
    for rule in rules.values():
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "page"} and rule["annotations"]["summary"]
