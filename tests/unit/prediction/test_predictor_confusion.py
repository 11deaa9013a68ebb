"""The predictor's measured error is cached on disk apart from the predictor, so the processes
that need only the error (pool replicas, Serve's controller, the gateway) start without
scikit-learn."""

import subprocess
import sys
from pathlib import Path

import numpy as np

from core import disk_cache
from core.classes import LengthClassConfig
from prediction.predictor_config import PredictorConfig
from prediction.predictor_confusion import _measured_error, default_predictor_error

ROOT = Path(__file__).resolve().parents[3]


def test_the_cached_error_is_the_measured_one(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(disk_cache, "CACHE_DIR", tmp_path)
    default_predictor_error.cache_clear()
    try:
        cached = default_predictor_error()
    finally:
        default_predictor_error.cache_clear()
    assert any(p.name.startswith("predictor-error-") for p in tmp_path.iterdir())
    measured = _measured_error(PredictorConfig(online_sample_rate=0.0), LengthClassConfig())
    assert cached.buckets == measured.buckets and np.array_equal(cached.confusion, measured.confusion)


def test_a_pool_replica_starts_without_scikit_learn_once_the_cache_is_warm(tmp_path: Path) -> None:
    """What every non-ingress replica imports, and a pool's modelled engine with throttLL'eM (the
    predictor's error, M's tables), built a second time on the machine."""
    build = ("import sys; import app.config, deployments.gateway, deployments.rate_ledger, deployments.replica; "
             "from engines.factory import make_engine; make_engine({'tensor_parallel': 2, 'throttllem': {}}); ")
    check = build + "assert 'sklearn' not in sys.modules, 'scikit-learn was imported'"
    env = {"WATTWISE_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", build], cwd=ROOT, env=env, check=True, timeout=600)
    subprocess.run([sys.executable, "-c", check], cwd=ROOT, env=env, check=True, timeout=600)
