"""PNG plots of runs side by side: energy, replicas per pool, clocks, latency CDFs."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from sim.metrics import J_PER_KWH
from sim.simulator import RawRun


def log_seconds_axis(axis: matplotlib.axis.Axis) -> None:
    """A log axis of seconds labelled 0.1, 0.2, 0.5, 1, ... instead of crowded 10^-1 powers."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    axis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
    axis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    axis.set_minor_formatter(FuncFormatter(lambda x, _: ""))


def plot_runs(runs: dict[str, RawRun], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []

    def save(fig: plt.Figure, name: str) -> None:
        path = out_dir / name
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)

    fig, ax = plt.subplots(figsize=(8, 4))
    for policy, raw in runs.items():
        ax.plot(np.asarray(raw.series.t_s) / 60, np.asarray(raw.series.energy_j) / J_PER_KWH, label=policy)
    ax.set(xlabel="time (min)", ylabel="cumulative energy (kWh)", title="Energy over time")
    ax.legend()
    save(fig, "energy.png")

    for field, ylabel, name in (("ready", "ready replicas", "replicas.png"),
                                ("clock_mhz", "mean clock (MHz)", "clock.png")):
        fig, axes = plt.subplots(len(runs), 1, figsize=(8, 2.2 * len(runs)), sharex=True, squeeze=False)
        for ax, (policy, raw) in zip(axes[:, 0], runs.items()):
            t = np.asarray(raw.series.t_s) / 60
            for pool, values in getattr(raw.series, field).items():
                ax.step(t, values, where="post", label=pool)
            ax.set(ylabel=ylabel, title=policy)
            ax.legend(fontsize="small", loc="upper right")
        axes[-1, 0].set_xlabel("time (min)")
        save(fig, name)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for policy, raw in runs.items():
        for ax, values in zip(axes, (raw.log.ttft_s, raw.log.mean_tbt_s)):
            v = np.sort(values[~np.isnan(values)])
            ax.plot(v, np.arange(1, len(v) + 1) / max(len(v), 1), label=policy)
    axes[0].set(xscale="log", xlabel="TTFT (s)", ylabel="CDF")
    axes[1].set(xscale="log", xlabel="mean TBT per request (s)", ylabel="CDF")
    for ax in axes:
        log_seconds_axis(ax.xaxis)
    axes[0].legend()
    save(fig, "latency_cdf.png")
    return paths
