"""throttLL'eM's performance model M: iterations/s from (TP, batch, KV blocks, clock).

A gradient-boosted tree (throttLL'eM paper §IV-C1) trained on profiling samples, constrained
to be monotone in batch, KV (slower) and clock (faster) so the clock binary search
over it is sound. Scores follow the paper's Table III (R², MAPE, MAE on 90/10 and
10/90 splits), next to a linear model fitted on the same split.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.linear_model import LinearRegression
from sklearn.metrics import mean_absolute_error, mean_absolute_percentage_error, r2_score

from autoscaling.throttllem.ips_model_key import ips_model_key
from autoscaling.throttllem.ips_profiling import IpsSamples, profile_ips
from core.disk_cache import cached_pickle
from energy.calibration import default_perf_model

# Feature order: tp, batch, kv_blocks, clock_mhz (IpsSamples.features).
MONOTONE = (0, -1, -1, 1)


class IpsModel:
    """M: predicts iterations/s; never below `floor_ips` so 1/IPS stays finite."""

    def __init__(self, max_iter: int = 300, seed: int = 0, floor_ips: float = 0.05) -> None:
        self.regressor = HistGradientBoostingRegressor(
            max_iter=max_iter, learning_rate=0.1, monotonic_cst=list(MONOTONE), random_state=seed,
        )
        self.floor_ips = floor_ips

    def fit(self, samples: IpsSamples) -> IpsModel:
        self.regressor.fit(samples.features(), samples.ips)
        return self

    def predict(self, features: np.ndarray) -> np.ndarray:
        return np.maximum(self.regressor.predict(features), self.floor_ips)


@dataclass(frozen=True)
class Scores:
    r2: float
    mape_pct: float
    mae_ips: float


def score(pred: np.ndarray, true: np.ndarray) -> Scores:
    return Scores(float(r2_score(true, pred)), float(mean_absolute_percentage_error(true, pred) * 100),
                  float(mean_absolute_error(true, pred)))


def split_scores(samples: IpsSamples, train_share: float, seed: int = 0) -> dict[str, Scores]:
    """Held-out scores of M and of a linear model trained on the same random split."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(samples))
    cut = int(len(samples) * train_share)
    train, test = order[:cut], order[cut:]
    x, y = samples.features(), samples.ips
    gbr = IpsModel(seed=seed).fit(samples.subset(train))
    linear = LinearRegression().fit(x[train], y[train])
    return {"gbr": score(gbr.predict(x[test]), y[test]), "linear": score(linear.predict(x[test]), y[test])}


def group_fold_scores(samples: IpsSamples, groups: np.ndarray, train_share: float, folds: int = 10,
                      seed: int = 0) -> dict[str, Scores]:
    """Held-out scores by group (e.g. measurement run) over `folds` folds of the groups:
    train on 9 folds and test on 1 (train_share 0.9), or on 1 and test on 9 (0.1), once per
    fold, scored over all folds' held-out predictions pooled. Every group is held out, so
    the scores do not hang on which few runs one random 10% split happens to hold out."""
    ids = np.random.default_rng(seed).permutation(np.unique(groups))
    fold_of = dict(zip(ids.tolist(), (np.arange(len(ids)) % folds).tolist(), strict=True))
    fold = np.array([fold_of[g] for g in groups.tolist()])
    x, y = samples.features(), samples.ips
    pred: dict[str, list[np.ndarray]] = {"gbr": [], "linear": []}
    true: list[np.ndarray] = []
    for k in range(min(folds, len(ids))):
        train = fold != k if train_share >= 0.5 else fold == k
        pred["gbr"].append(IpsModel(seed=seed).fit(samples.subset(train)).predict(x[~train]))
        pred["linear"].append(LinearRegression().fit(x[train], y[train]).predict(x[~train]))
        true.append(y[~train])
    return {name: score(np.concatenate(p), np.concatenate(true)) for name, p in pred.items()}


@lru_cache(maxsize=4)
def default_profile(model: str = "llama2-70b", hardware: str = "h100-80gb", profile: str | None = None) -> IpsSamples:
    """The modelled engine's profile of every TP, collected once per process; `profile` names
    the perf model (energy.profiles) the engine runs, None the default for model and hardware."""
    return profile_ips(default_perf_model(model, hardware, profile))


@lru_cache(maxsize=4)
def default_ips_model(model: str = "llama2-70b", hardware: str = "h100-80gb", profile: str | None = None) -> IpsModel:
    """M for the built-in model, fitted once per machine: every replica of a Serve app
    needs it at start, and profiling plus the fit take ~10 s of a CPU (~30 s on a busy one,
    which starved running replicas while the demo scaled up). The cache file is keyed by
    what the samples and the fit are a function of (autoscaling.throttllem.ips_model_key), so
    a hit skips the profile and is never stale."""
    return cached_pickle(f"ips-model-{ips_model_key(model, hardware, profile)}.pkl",
                         lambda: IpsModel().fit(default_profile(model, hardware, profile)))
