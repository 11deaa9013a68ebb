"""The pure parts of the embedding-feature length benches (bench/predictor_embeddings.py and
bench/predictor_served_model.py): the on-disk cache, the grid and its labels, and the
standardisation of hidden states. The benches themselves (a model on the CPU) run by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import bench.predictor_embeddings as harness
from bench.predictor_embeddings import Config, EmbeddingBench, cached, grid
from bench.predictor_served_model import GRID, POOLINGS, standardise
from prediction.prompt_data import PromptPairs


def _pairs(*prompts: str) -> PromptPairs:
    n = len(prompts)
    return PromptPairs(list(prompts), [5] * n, [50] * n, [f"c{i}" for i in range(n)])


def test_cache_computes_once_per_prompt_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "CACHE_DIR", tmp_path)
    calls: list[int] = []

    def compute() -> dict[str, np.ndarray]:
        calls.append(1)
        return {"a": np.arange(6.0).reshape(2, 3)}

    first = cached("k", _pairs("x", "y"), compute)
    again = cached("k", _pairs("x", "y"), compute)
    cached("k", _pairs("x", "z"), compute)  # other prompts: another entry
    assert len(calls) == 2
    np.testing.assert_array_equal(first["a"], again["a"])


def test_grid_per_pooling_and_labels_name_it() -> None:
    assert len(grid()) == 32
    assert len(GRID) == 32 * len(POOLINGS)
    assert Config("sgd", "embedding", 1e-3).label() == "sgd embedding alpha=0.001 w=1"
    assert Config("logistic", "embedding", 1.0, pooling="last-token").label().startswith("last-token logistic")


def test_bench_picks_the_configs_pooling() -> None:
    train = {"p": np.zeros((1, 2)), "q": np.ones((1, 2))}
    bench = EmbeddingBench(_pairs("x"), _pairs("y"), train, {"p": np.zeros((1, 2)), "q": np.ones((1, 2))})
    assert bench.embeddings(Config("sgd", "embedding", 1.0, pooling="q"))[0][0, 0] == 1.0
    assert bench.embeddings(Config("sgd", "embedding", 1.0))[0][0, 0] == 0.0  # no pooling: the only/first one


def test_standardise_uses_train_statistics_and_unit_norm_on_average() -> None:
    rng = np.random.default_rng(0)
    train = rng.normal(size=(500, 16)) * np.array([1000.0] + [1.0] * 15)  # one huge dimension
    other = train[:10] + 1.0
    tr, ot = standardise(train, other)
    assert np.mean(np.linalg.norm(tr, axis=1) ** 2) == pytest.approx(1.0, rel=1e-4)
    assert np.abs(tr).max(axis=0)[0] < 1.0  # the huge dimension no longer dominates
    np.testing.assert_allclose(ot, (other - train.mean(0)) / (train.std(0) + 1e-6) / 4.0)
