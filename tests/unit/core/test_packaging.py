"""A wheel carries the top-level data and serve configs (issue 20 item 6); the full check,
building and running the wheel outside the checkout, is .ci/wheel_check (run by .ci/run)."""

import ast
from pathlib import Path

import pytest

from core import paths

ROOT = Path(__file__).resolve().parents[3]


def test_setup_ships_what_paths_reads() -> None:
    tree = ast.parse((ROOT / "setup.py").read_text())
    shipped = next(ast.literal_eval(node.value) for node in ast.walk(tree)
                   if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "SHIPPED")
    assert tuple(shipped) == paths.SHIPPED
    for name in paths.SHIPPED:
        assert (ROOT / name).exists(), name


def test_checkout_files_are_found_in_place() -> None:
    assert paths.shipped("serve_config.yaml") == ROOT / "serve_config.yaml"
    assert paths.shipped("data/azure/AzureLLMInferenceTrace_conv.csv").is_file()


def test_missing_file_names_both_places(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(paths, "ROOT", tmp_path)
    with pytest.raises(FileNotFoundError, match="_resources"):
        paths.shipped("data/nothing-here.csv")
