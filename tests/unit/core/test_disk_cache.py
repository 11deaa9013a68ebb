"""A result kept on disk is built once per machine, rebuilt when its file is torn, and an
unwritable cache costs only the build. The trained predictor loaded from it predicts as the
one just trained."""

from pathlib import Path

import numpy as np

from core import disk_cache
from core.classes import LengthClassConfig
from core.disk_cache import cached_pickle, fingerprint
from prediction.predictor_config import PredictorConfig
from prediction.predictor_factory import make_bucket_predictor


def test_a_result_is_built_once_then_read_and_rebuilt_when_torn(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(disk_cache, "CACHE_DIR", tmp_path)
    builds = []

    def build() -> dict[str, list[int]]:
        builds.append(1)
        return {"rows": [1, 2, 3]}

    assert cached_pickle("r.pkl", build) == cached_pickle("r.pkl", build) == {"rows": [1, 2, 3]}
    assert len(builds) == 1 and [p.name for p in tmp_path.iterdir()] == ["r.pkl"]  # no temporary left
    (tmp_path / "r.pkl").write_bytes((tmp_path / "r.pkl").read_bytes()[:5])  # torn
    assert cached_pickle("r.pkl", build) == {"rows": [1, 2, 3]} and len(builds) == 2
    assert cached_pickle("r.pkl", build) == {"rows": [1, 2, 3]} and len(builds) == 2  # written whole again


def test_an_unwritable_cache_costs_only_the_build(tmp_path: Path, monkeypatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setattr(disk_cache, "CACHE_DIR", blocker / "cache")
    assert cached_pickle("r.pkl", lambda: 7) == 7


def test_the_fingerprint_moves_with_the_value_the_code_and_the_data(tmp_path: Path) -> None:
    data = tmp_path / "pairs.jsonl"
    data.write_text("a")
    base = fingerprint(("config", 1), modules=(disk_cache,), files=(data,))
    assert base == fingerprint(("config", 1), modules=(disk_cache,), files=(data,))
    assert base != fingerprint(("config", 2), modules=(disk_cache,), files=(data,))
    assert base != fingerprint(("config", 1), files=(data,))
    data.write_text("b")
    assert base != fingerprint(("config", 1), modules=(disk_cache,), files=(data,))


def test_a_predictor_read_from_the_cache_predicts_as_one_just_trained(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(disk_cache, "CACHE_DIR", tmp_path)
    config = PredictorConfig(online_sample_rate=0.0)
    trained = make_bucket_predictor(config, LengthClassConfig())
    assert len(list(tmp_path.iterdir())) == 1
    read = make_bucket_predictor(config, LengthClassConfig())
    assert read is not trained
    prompts = ["Write a long essay about the history of Rome.", "hi", "Translate to French: good morning"]
    tokens = [12, 1, 8]
    assert np.array_equal(read.model.predict_proba(prompts, tokens), trained.model.predict_proba(prompts, tokens))
    assert np.array_equal(read.errors.confusion(), trained.errors.confusion())
