"""throttLL'eM's bench: its variants run what their labels say."""

from __future__ import annotations

import numpy as np

from bench.throttllem import MAX_CLOCK_MHZ, STATIC, Headrooms, Timings, Variant, amplified, run, trace_window


def test_throttling_only_lowers_the_clock_of_a_lightly_loaded_engine():
    w = amplified(trace_window(0.0, 120.0), 4.0)  # TP8 at 0.4-4 req/s: far below its max load
    static = run(w, STATIC, Headrooms(), timings=None)
    timings = Timings()
    throttled = run(w, Variant("throttling only", autoscale=False, throttle=True), Headrooms(), timings)
    assert throttled["tp"] == static["tp"] == 8  # no autoscaling in either
    assert np.mean(timings.step_clock_mhz) < 0.8 * MAX_CLOCK_MHZ  # a static plan's clock does not pin it
    # +9%: decode's power falls little with the clock (energy.clock_fit), and below the
    # least-energy clock the search does not go (ThrottllemConfig.energy_floor).
    assert throttled["tpj"] > 1.05 * static["tpj"]
    assert throttled["completed"] == static["completed"] == len(w)
