"""The bench that picks throttLL'eM alone's settings: its choice rule, and variants that run
the engine sizes their labels say."""

from __future__ import annotations

from bench.throttllem_engines import Outcome, choose, run
from bench.wattwise import workload
from sim.scenario import ThrottllemAlone
from sim.workload import window


def test_choice_is_the_most_tokens_per_joule_meeting_the_headline_on_every_tuning_window():
    frugal, safe, fragile = ThrottllemAlone(), ThrottllemAlone((8,), 0.2, 0.4), ThrottllemAlone((4, 8), 0.15, 0.3)
    tuning = {
        frugal: [Outcome(4.0, 0.999, 0.99), Outcome(4.0, 0.95, 0.9)],  # most tokens/J, misses on one window
        safe: [Outcome(2.0, 0.999, 0.99), Outcome(1.8, 0.995, 0.99)],
        fragile: [Outcome(3.0, 0.999, 0.99), Outcome(1.9, 0.991, 0.96)],
    }
    assert choose(tuning) == fragile  # its worst window (1.9x) beats safe's (1.8x)
    assert choose({frugal: tuning[frugal]}) is None


def test_variants_run_the_engine_sizes_they_name():
    """Code's first minutes on the bench's provisioned engines: held at TP8 they hold twice the
    GPUs of engines that may run TP4, and both complete every request."""
    w = window(workload("code", 24.0, 0), 0.0, 480.0)
    small = run(w, ThrottllemAlone((4, 8)))
    large = run(w, ThrottllemAlone((8,)))
    assert large["gpu_hours"] > 1.5 * small["gpu_hours"]
    assert small["completed"] == large["completed"] == len(w)
