"""The ownership table lives once, in code; the docs show it as it is."""

from pathlib import Path

from autoscaling.ownership import DECISIONS, markdown_table
from autoscaling.registry import make_policy
from autoscaling.utilisation import UtilisationPolicy

ONE_CONTROLLER = Path(__file__).resolve().parents[3] / "docs" / "one-controller.md"


def test_docs_show_the_code_table() -> None:
    assert markdown_table() in ONE_CONTROLLER.read_text(encoding="utf-8"), (
        "docs/one-controller.md's ownership table differs from autoscaling.ownership.DECISIONS: "
        "paste markdown_table()'s output into the page")


def test_each_decision_has_one_row() -> None:
    names = [d.decision for d in DECISIONS]
    assert len(names) == len(set(names))


def test_llumnix_is_the_utilisation_autoscaler_by_another_name() -> None:
    assert isinstance(make_policy("llumnix"), UtilisationPolicy)
