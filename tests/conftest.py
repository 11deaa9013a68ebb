"""The tiers: tests/unit/ (pure, seconds), tests/ray/ (start a local Ray cluster or a Serve
app, one at a time within a run), tests/vllm/ (run vLLM; skipped without the [cpu] or [gpu]
extra). A run collects them in that order, so a pure failure shows first, and marks them:
`-m ray` / `-m vllm` select a tier, `tests/unit` is the quick loop. Two runs may share a
machine (.ci/run runs the Ray tier beside the others): every cluster a test starts binds
ports of its own and ends only its own processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import ast_parse_guard

ast_parse_guard.install()

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "ray", "vllm")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vllm: runs vLLM (tests/vllm/; needs the [cpu] or [gpu] extra)")


def _tier(item: pytest.Item) -> int:
    try:
        return TIERS.index(item.path.resolve().relative_to(TESTS).parts[0])
    except (ValueError, IndexError):
        return len(TIERS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = _tier(item)
        if tier == 1:
            item.add_marker(pytest.mark.ray)
        elif tier == 2:
            item.add_marker(pytest.mark.vllm)
    items.sort(key=_tier)  # stable: a module's tests stay together and in order
