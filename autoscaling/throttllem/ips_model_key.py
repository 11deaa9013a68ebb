"""What throttLL'eM's M for a model and GPU is a function of, as a cache key: the perf
model's parameters its profile samples, the code that samples and fits (the profiler, the
batcher it drives, the model's own module) and scikit-learn's version. Computed without
importing scikit-learn, so a replica that reads M's cached tables starts without it."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

from autoscaling.throttllem import ips_profiling
from batching import continuous_batcher
from core.disk_cache import fingerprint
from energy.calibration import default_perf_model

_FIT_CODE = Path(__file__).parent / "ml_perf_model.py"


def ips_model_key(model: str, hardware: str, profile: str | None) -> str:
    perf = default_perf_model(model, hardware, profile)
    key = fingerprint((perf.gpu, perf.model, perf.fits, perf.decode_power), modules=(ips_profiling, continuous_batcher),
                      files=(_FIT_CODE,))
    return f"{model}-{hardware}-sklearn{version('scikit-learn')}-{key}"
