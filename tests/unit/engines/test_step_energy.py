"""A replica's energy step by step, against a fake NVML whose counter integrates a known power
trace: each step's joules go to its requests by their share of its work, the GPUs' joules while
no request is inside are idle energy, and requests plus idle are the counter's whole rise; the
model's joules are booked the same way beside them. A fleet's energy counts each replica once,
measured where it is."""

from __future__ import annotations

import pytest

from core.efficiency import replica_energy_series
from energy.gpu_control import NvmlGpu
from engines.step_energy import StepEnergy
from tests.fake_nvml import FakeNvml, PowerTrace

# Watts per GPU: 100 until 10 s, 300 until 20 s, 100 after; two GPUs.
TRACE = PowerTrace(((0.0, 100.0), (10.0, 300.0), (20.0, 100.0)))
MODEL_IDLE_W = 50.0


class FakeClock:
    def __init__(self) -> None:
        self.t_s = 0.0

    def __call__(self) -> float:
        return self.t_s


def _meter() -> tuple[StepEnergy, FakeNvml, FakeClock]:
    clock = FakeClock()
    nvml = FakeNvml(count=2, power=TRACE, clock=clock)
    return StepEnergy(NvmlGpu(nvml), [0, 1], MODEL_IDLE_W, clock), nvml, clock


def test_steps_share_the_counters_joules_by_work_and_the_rest_is_idle() -> None:
    meter, _nvml, clock = _meter()
    clock.t_s = 5.0
    meter.idle()  # "a" enters an empty replica: 0-5 s were idle (2 GPUs x 100 W)
    clock.t_s = 12.0
    meter.on_step({"a": 3, "b": 1}, modelled_j=100.0)  # 5-10 s at 200 W, 10-12 s at 600 W: 2,200 J
    clock.t_s = 15.0
    meter.on_step({"a": 1, "b": 1}, modelled_j=60.0)  # 1,800 J
    assert meter.take_j("a") == pytest.approx(2200 * 3 / 4 + 900)
    clock.t_s = 16.0
    meter.on_step({}, modelled_j=None)  # a step with none of ours in it: idle
    meter.idle()  # "b" left: the replica idles from here
    assert meter.take_j("b") == pytest.approx(2200 / 4 + 900)
    clock.t_s = 25.0
    meter.idle()  # the next request enters: 16-20 s at 600 W, 20-25 s at 200 W
    measured = meter.measured
    assert measured is not None
    assert measured.idle_j == pytest.approx(1000 + 600 + 2400 + 1000)
    # Requests plus idle: the counter's whole rise over the 25 s, 2 x (1,000 + 3,000 + 500) J.
    assert measured.total_j == pytest.approx(9000) == measured.idle_j + (2200 + 1800)
    modelled = meter.modelled
    assert modelled is not None
    assert modelled.idle_j == pytest.approx(MODEL_IDLE_W * (5 + 1 + 9)) and modelled.total_j == pytest.approx(
        modelled.idle_j + 160)


def test_a_failed_read_is_booked_at_the_next_reading_and_nothing_is_lost() -> None:
    meter, nvml, clock = _meter()
    meter.idle()
    clock.t_s = 2.0
    nvml.fail.add("nvmlDeviceGetTotalEnergyConsumption")
    meter.on_step({"a": 1}, modelled_j=None)  # unread: nothing booked, nothing raised
    nvml.fail.clear()
    clock.t_s = 4.0
    meter.on_step({"a": 1}, modelled_j=None)
    assert meter.take_j("a") == pytest.approx(4 * 200)


def test_without_nvml_a_request_is_told_the_models_share() -> None:
    meter = StepEnergy(None, [], MODEL_IDLE_W, FakeClock())
    meter.on_step({"a": 1, "b": 3}, modelled_j=40.0)
    assert meter.measured is None and meter.take_j("a") == pytest.approx(10.0) and meter.power_w() == 0.0
    assert StepEnergy(None, [], None).take_j("a") == 0.0  # neither: 0 J, not invented


def test_a_fleet_counts_each_replica_once_measured_where_it_is() -> None:
    series = {'e{pool="p",replica="gpu",source="nvml"}': 900.0, 'e{pool="p",replica="gpu",source="model"}': 700.0,
              'e{pool="p",replica="sim",source="model"}': 500.0}
    assert replica_energy_series(series) == {'e{pool="p",replica="gpu",source="nvml"}': 900.0,
                                             'e{pool="p",replica="sim",source="model"}': 500.0}
