"""`wattwise bench` finds every bench through its entry point, without importing bench/ by name."""

import ast
import importlib.util
from importlib.metadata import entry_points
from pathlib import Path

from wattwise.cli import main

BENCH_DIR = Path(__file__).resolve().parents[3] / "bench"


def test_every_registered_bench_names_a_function_that_exists() -> None:
    benches = list(entry_points(group="wattwise.benches"))
    assert len(benches) >= 20
    for ep in benches:
        module, _, function = ep.value.partition(":")
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, f"bench {ep.name}: no module {module}"
        defined = {node.name for node in ast.parse(Path(spec.origin).read_text(encoding="utf-8")).body
                   if isinstance(node, ast.FunctionDef)}
        assert function in defined, f"bench {ep.name}: {module} defines no {function}()"


def test_the_usage_lists_every_registered_bench(capsys) -> None:
    assert main(["bench"]) == 2
    usage = capsys.readouterr().err
    for ep in entry_points(group="wattwise.benches"):
        assert ep.name in usage


def test_a_bench_runs_through_its_entry_point(capsys) -> None:
    assert main(["bench", "model-check"]) == 0
    assert "DynamoLLM" in capsys.readouterr().out
