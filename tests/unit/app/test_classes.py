"""Length classes at their boundaries (DynamoLLM Table IV) and SLO composition."""

import pytest

from app.classify import Classifier, UnknownServiceClass
from app.config import AppConfig
from core.classes import LengthClassConfig, default_service_classes
from core.slo import SLO


@pytest.mark.parametrize(
    ("prompt", "output", "expected"),
    [(1, 1, "SS"), (255, 99, "SS"), (256, 99, "MS"), (1023, 100, "MM"), (1024, 349, "LM"), (8192, 350, "LL"),
     (255, 350, "SL")],
)
def test_boundaries(prompt: int, output: int, expected: str) -> None:
    assert LengthClassConfig().classify(prompt, output) == expected


def test_nine_classes_and_table_iv_slos() -> None:
    cfg = LengthClassConfig()
    assert len(cfg.names()) == 9
    assert cfg.slo("SL") == SLO(ttft_s=0.25, tbt_s=0.1)
    assert cfg.slo("LS") == SLO(ttft_s=2.0, tbt_s=0.1)


def test_thresholds_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="short < medium"):
        LengthClassConfig(input_short_lt=2000)


def test_interactive_tightened_by_length_class_batch_not() -> None:
    cfg = AppConfig()
    clf = Classifier(cfg.lengths, default_service_classes(), cfg.pool_of_class())
    inter, pool = clf.classify("a", 300, 50, 50, "interactive", 0.0)
    assert (inter.length_class, pool) == ("MS", "pool-medium")
    assert inter.slo.ttft_s == 0.4 and inter.slo.tbt_s == 0.1  # Table IV beats Chiron's 10 s / 200 ms
    batch, _ = clf.classify("b", 300, 50, 50, "batch", 0.0)
    assert batch.slo.ttft_s == 3600 and batch.slo.tbt_s == 2.0
    with pytest.raises(UnknownServiceClass):
        clf.classify("c", 300, 50, 50, "gold", 0.0)


def test_e2e_deadline_from_ttft_and_tbt() -> None:
    assert SLO(ttft_s=1, tbt_s=0.1).e2e_for(11) == pytest.approx(2.0)
    assert SLO(ttft_s=1, tbt_s=0.1, e2e_s=5).e2e_for(11) == 5


@pytest.mark.parametrize(
    ("pools", "message"),
    [
        ([{"name": "a", "classes": ["SS"]}], "served by no pool"),
        ([{"name": "a", "classes": ["SS", "XX"]}], "unknown length class"),
        ([{"name": "a", "classes": LengthClassConfig.names()}, {"name": "b", "classes": ["SS"]}], "is in pools"),
    ],
)
def test_bad_pool_layouts_rejected(pools: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AppConfig(pools=pools)
