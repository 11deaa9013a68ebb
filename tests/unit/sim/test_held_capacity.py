"""The references beside the oracle floor: the clairvoyant floor paying start-ups, and the
peak burst's GPUs held all run."""

from __future__ import annotations

import numpy as np

from sim.config import SimConfig
from sim.held_capacity import WindowPower
from sim.oracle import oracle_energy
from sim.workload import fit_context, load_trace, window

IDLE_W = 10.0


def _power(loads: list[int | None], gpus: int = 4, busy_w: float = 100.0) -> np.ndarray:
    """Each window's power with N GPUs on: a load of g GPUs needs g, each drawing busy_w."""
    on = np.arange(gpus + 1)
    rows = []
    for g in loads:
        if g is None:
            rows.append(on * IDLE_W)
        else:
            rows.append(np.where(on >= g, g * busy_w + (on - g) * IDLE_W, np.inf))
    return np.array(rows, dtype=float)


def test_a_gap_shorter_than_a_start_keeps_the_gpus_on_and_a_longer_one_turns_them_off():
    """Two bursts of 2 GPUs apart by a gap: idling through it costs gap x 2 x IDLE_W, turning
    off and on again 2 starts; the floor takes the cheaper, and so chooses by the gap's length."""
    window_s, start_j = 1.0, 5 * IDLE_W  # a start costs 5 windows of idling
    for gap, kept in ((3, True), (8, False)):
        power = _power([2, *[None] * gap, 2])
        floor = WindowPower(power, window_s, start_j, 0).clairvoyant_floor()
        busy_j = 2 * 2 * 100.0
        expected = busy_j + (gap * 2 * IDLE_W if kept else 2 * start_j)
        assert floor.energy_j == expected
        assert floor.peak_gpus == 2
        assert floor.gpu_hours == ((gap + 2) * 2 if kept else 4) / 3600.0


def test_the_floor_lies_between_free_switching_and_the_best_constant_count():
    rng = np.random.default_rng(3)
    loads = [None if x < 0.4 else int(x * 4) for x in rng.random(60)]
    power = _power(loads)
    free_j = power.min(axis=1).sum()
    for start_j in (0.0, 20.0, 1e9):
        refs = WindowPower(power, 1.0, start_j, 0)
        floor, held = refs.clairvoyant_floor(), refs.peak_held()
        assert free_j - 1e-9 <= floor.energy_j <= held.energy_j + 1e-9
        if start_j == 0.0:
            assert floor.energy_j == free_j
    held = WindowPower(power, 1.0, 0.0, 0).peak_held()
    assert held.peak_gpus == max(g for g in loads if g is not None)


def test_on_the_coding_trace_holding_its_bursts_gpus_costs_well_over_the_floor():
    w = fit_context(window(load_trace("code"), 0, 300), 8192)
    config = SimConfig()
    oracle = oracle_energy(w, config)
    refs = WindowPower.of(w, config, batch_pace_s=oracle.batch_pace_s)
    floor, held = refs.clairvoyant_floor(), refs.peak_held()
    assert refs.uncarried_windows == 0
    # Paying start-ups and carrying 5 s windows costs more than free minutes ...
    assert oracle.energy_j < floor.energy_j <= held.energy_j
    # ... and its first minutes' bursts, minutes apart, make holding their GPUs cost far more.
    assert held.energy_j > 1.5 * floor.energy_j
    assert held.gpu_hours > 2 * floor.gpu_hours
