"""The SLA planner's load predictors: the next adjustment interval's value of a series (request
count, ISL, OSL) from the intervals seen so far.

Dynamo (`components/planner/src/dynamo/planner/utils/load_predictor.py`; since moved to
`.../planner/core/load/predictors.py`) ships `constant` (the last value) and `arima`, its
default: `pmdarima.auto_arima` refit on the last `load_prediction_window_size` (50) points,
the last value until 5 points are in. pmdarima (and the statsmodels and pandas it needs) is
not a dependency here; `ArimaPredictor` follows auto_arima's defaults in small: the
differencing order from the KPSS test (level, 5%, short lag window, d <= 2), then the (p, q)
with the least AIC among p, q <= 2, an intercept (a drift once differenced) while d < 2, each
fitted by conditional least squares rather than exact likelihood. On a few dozen points
auto_arima's stepwise search rarely goes past order 2.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Protocol

import numpy as np
from scipy.optimize import least_squares

KPSS_CRITICAL_5PCT = 0.463  # level stationarity, 5% (Kwiatkowski et al. 1992, Table 1)
MAX_DIFFERENCES = 2
MAX_ORDER = 2


class LoadPredictor(Protocol):
    def add(self, value: float) -> None: ...

    def predict(self) -> float: ...


class ConstantPredictor:
    """Dynamo's `constant`: the next interval repeats the last."""

    def __init__(self) -> None:
        self.last = 0.0

    def add(self, value: float) -> None:
        self.last = value if math.isfinite(value) else 0.0

    def predict(self) -> float:
        return self.last


def kpss_stationary(y: np.ndarray) -> bool:
    """KPSS test of level stationarity at 5%, lags trunc(3 sqrt(n) / 13) (R's lshort, as pmdarima)."""
    n = len(y)
    e = y - y.mean()
    lags = int(3 * math.sqrt(n) / 13)
    s2 = float(e @ e) / n
    for lag in range(1, lags + 1):
        s2 += 2 / n * (1 - lag / (lags + 1)) * float(e[lag:] @ e[:-lag])
    if s2 <= 0:
        return True
    return float(np.sum(np.cumsum(e) ** 2)) / n**2 / s2 <= KPSS_CRITICAL_5PCT


def differences_needed(y: np.ndarray) -> int:
    d = 0
    while d < MAX_DIFFERENCES and len(y) > 3 and np.ptp(y) > 0 and not kpss_stationary(y):
        y, d = np.diff(y), d + 1
    return d


def _residuals(w: np.ndarray, p: int, q: int, params: np.ndarray, with_mean: bool) -> np.ndarray:
    mean = params[0] if with_mean else 0.0
    phi, theta = params[with_mean:with_mean + p], params[with_mean + p:]
    x = w - mean
    e = np.zeros(len(w))
    for t in range(p, len(w)):
        e[t] = x[t] - sum(phi[i] * x[t - 1 - i] for i in range(p)) - sum(
            theta[j] * e[t - 1 - j] for j in range(q) if t - 1 - j >= 0)
    return e


def _fit(w: np.ndarray, p: int, q: int, with_mean: bool) -> tuple[float, float] | None:
    """(AIC, one-step forecast of w) of ARMA(p, q) by conditional least squares; None if too
    few points for its parameters."""
    k = p + q + with_mean
    used = len(w) - p
    if used < k + 2:
        return None
    start = np.r_[[w.mean()] if with_mean else [], np.zeros(p + q)]
    bound = np.r_[[np.inf] if with_mean else [], np.full(p + q, 0.99)]
    fit = least_squares(lambda prm: _residuals(w, p, q, prm, with_mean)[p:], start, bounds=(-bound, bound))
    e = _residuals(w, p, q, fit.x, with_mean)
    sse = max(float(e[p:] @ e[p:]), 1e-12 * max(float(w @ w), 1e-12))
    mean = fit.x[0] if with_mean else 0.0
    phi, theta = fit.x[with_mean:with_mean + p], fit.x[with_mean + p:]
    x = w - mean
    forecast = mean + sum(phi[i] * x[-1 - i] for i in range(p)) + sum(theta[j] * e[-1 - j] for j in range(q))
    return used * math.log(sse / used) + 2 * (k + 1), float(forecast)


def arima_forecast(y: np.ndarray) -> float:
    """One-step forecast of `y` by the ARIMA(p, d, q) with the least AIC (see the module's note)."""
    d = differences_needed(y)
    w = np.diff(y, n=d) if d else y
    fits = [f for p in range(MAX_ORDER + 1) for q in range(MAX_ORDER + 1)
            if (f := _fit(w, p, q, with_mean=d < 2)) is not None]
    if not fits:
        return float(y[-1])
    step = min(fits)[1]
    if d == 0:
        return step
    if d == 1:
        return float(y[-1]) + step
    return float(2 * y[-1] - y[-2]) + step


class ArimaPredictor:
    """Dynamo's default `arima` predictor: the last value until `min_points` are in, then the
    auto-ARIMA forecast of the last `window` points, never below 0."""

    def __init__(self, window: int = 50, min_points: int = 5) -> None:
        self.values: deque[float] = deque(maxlen=window)
        self.min_points = min_points

    def add(self, value: float) -> None:
        self.values.append(value if math.isfinite(value) else 0.0)

    def predict(self) -> float:
        if not self.values:
            return 0.0
        y = np.asarray(self.values, dtype=float)
        if len(y) < self.min_points or np.ptp(y) == 0:
            return float(y[-1])
        return max(arima_forecast(y), 0.0)
