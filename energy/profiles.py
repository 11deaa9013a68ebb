"""Named perf/power profiles: which measurements a PerfModel is fitted on, selectable by name.

`mlenergy-*`: the ML.ENERGY Leaderboard's 2026 vLLM runs (energy.mlenergy_calibration):
measured decode latency and a measured power curve over batch; prefill, clock scaling and
the TPs the leaderboard did not run are modelled (see that module). A 70B profile sizes
Llama-2-70B, 3.1-70B or 3.3-70B: they share one shape (80 layers, hidden 8192, 8 KV heads),
so pass the model you serve. Where one covers a model and GPU it is their default.
`splitwise-*`: Splitwise's 2023 sweeps (energy.calibration), the default before the
leaderboard's profiles and still the default where none covers the pair (A100, BLOOM). Their
steps run 1.5-4x longer than a current vLLM stack's on H100 (decode 1.5-1.8x at TP2, 2.5-4x at
TP8; prefill 2.8x) and they charge a constant decode power.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from energy.calibration import splitwise_perf_model
from energy.mlenergy_calibration import MlEnergySource, fit_profile
from energy.perf_model import PerfModel


@dataclass(frozen=True)
class Profile:
    hardware: str  # key of energy.hardware.GPUS
    models: tuple[str, ...]  # keys of energy.hardware.MODELS it can size; the first is the default
    build: Callable[[str], PerfModel]  # model key -> fitted PerfModel


def _splitwise(model: str, hardware: str) -> Profile:
    return Profile(hardware, (model,), lambda m: splitwise_perf_model(m, hardware))


_LLAMA3_70B = ("meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Llama-3.3-70B-Instruct")
_SERVES_70B = ("llama3.1-70b", "llama2-70b")

MLENERGY_SOURCES: dict[str, MlEnergySource] = {
    "mlenergy-llama3-70b-h100": MlEnergySource(
        _LLAMA3_70B, "H100", "h100-80gb", "llama3.1-70b", tp=4, extrapolated_tps=(2, 8)),
    "mlenergy-llama3-70b-b200": MlEnergySource(_LLAMA3_70B, "B200", "b200-180gb", "llama3.1-70b", tp=2),
    "mlenergy-llama3.1-8b-h100": MlEnergySource(
        ("meta-llama/Llama-3.1-8B-Instruct",), "H100", "h100-80gb", "llama3.1-8b", tp=1),
}


def _mlenergy(source: MlEnergySource) -> Profile:
    served = _SERVES_70B if source.model == "llama3.1-70b" else (source.model,)
    return Profile(source.hardware, served, lambda m: fit_profile(source, source.rows(), m))


PROFILES: dict[str, Profile] = {
    "splitwise-llama2-70b-h100": _splitwise("llama2-70b", "h100-80gb"),
    "splitwise-llama2-70b-a100": _splitwise("llama2-70b", "a100-80gb"),
    "splitwise-bloom-176b-h100": _splitwise("bloom-176b", "h100-80gb"),
    **{name: _mlenergy(source) for name, source in MLENERGY_SOURCES.items()},
}
PROFILE_NAMES: tuple[str, ...] = tuple(PROFILES)


def default_profile(model: str, hardware: str) -> str | None:
    """The current-stack profile that sizes `model` on `hardware`; None: Splitwise's fit is the default."""
    covering = [name for name in MLENERGY_SOURCES
                if PROFILES[name].hardware == hardware and model in PROFILES[name].models]
    return covering[0] if covering else None


def profile_label(profile: str | None, model: str, hardware: str) -> str:
    """The profile a run with `profile` uses, named for messages and headers."""
    return profile or default_profile(model, hardware) or "Splitwise's fit"


def perf_model_for(profile: str, model: str | None = None) -> PerfModel:
    """The PerfModel of a named profile, sized as `model` (default: the profile's own).
    Fitted once per process; the model is immutable so sharing it is safe."""
    try:
        entry = PROFILES[profile]
    except KeyError:
        raise ValueError(f"unknown perf profile {profile!r}; known: {list(PROFILE_NAMES)}") from None
    model = model or entry.models[0]
    if model not in entry.models:
        raise ValueError(f"perf profile {profile!r} sizes {list(entry.models)}, not {model!r}")
    return _fitted(profile, model)


@lru_cache(maxsize=16)
def _fitted(profile: str, model: str) -> PerfModel:
    return PROFILES[profile].build(model)
