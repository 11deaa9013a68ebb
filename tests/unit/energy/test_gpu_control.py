"""NVML behind the GPU-control protocol, against a fake NVML with the real API's names
and errors; the clock governor's clamping, rate limit, records and fail-static reset."""

import pynvml
import pytest

from energy.clock_governor import ClockGovernor
from energy.gpu_control import GpuControlError, ModelledGpu, NvmlGpu, open_gpus
from energy.hardware import GPUS
from tests.fake_nvml import FakeNvml, PowerTrace


class FakeClock:
    def __init__(self) -> None:
        self.t_s = 0.0

    def __call__(self) -> float:
        return self.t_s


def fake_nvml(fail: frozenset[str] = frozenset(), init_error: bool = False, clock: FakeClock | None = None) -> FakeNvml:
    """Two devices drawing 123.456 W each."""
    return FakeNvml(power=PowerTrace(((0.0, 123.456),)), clock=clock or FakeClock(), fail=fail, init_error=init_error)


def test_the_fake_uses_only_real_nvml_names() -> None:
    fake = fake_nvml()
    names = [n for n in dir(fake) if n.startswith("nvml") or n.startswith("NVML_")]
    assert len(names) > 10
    for name in names:
        assert hasattr(pynvml, name), name


def test_nvml_reads_and_locks() -> None:
    clock = FakeClock()
    nvml = fake_nvml(clock=clock)
    gpu = NvmlGpu(nvml)
    assert gpu.device_count() == 2
    assert gpu.supported_clocks_mhz(0) == [800, 990, 1200, 1600, 1980]
    gpu.lock_clock(1, 1200)
    assert gpu.clock_mhz(1) == 1200 and nvml.locked() == {1: 1200}
    clock.t_s = 10.0
    assert gpu.power_w(0) == pytest.approx(123.456) and gpu.energy_j(0) == pytest.approx(1234.56)
    gpu.set_power_limit_w(0, 350)
    assert gpu.power_limit_w(0) == 350


def test_nvml_errors_become_gpu_control_errors() -> None:
    gpu = NvmlGpu(fake_nvml(fail=frozenset({"nvmlDeviceSetGpuLockedClocks"})))
    with pytest.raises(GpuControlError, match="Insufficient Permissions"):
        gpu.lock_clock(0, 1200)


def test_missing_nvml_falls_back_to_the_modelled_gpu(caplog) -> None:
    gpus = open_gpus(GPUS["h100-80gb"], fake_nvml(init_error=True))
    assert gpus.backend == "modelled"
    assert "falls back" in caplog.text


def test_real_nvml_without_a_gpu_falls_back() -> None:
    assert open_gpus(GPUS["h100-80gb"]).backend in ("nvml", "modelled")


def test_governor_clamps_rate_limits_and_records() -> None:
    nvml = fake_nvml()
    gov = ClockGovernor(NvmlGpu(nvml), min_interval_s=1.0)
    assert gov.set_clock(0, 1300, now_s=0.0) == 1200  # clamped down to a supported clock
    assert gov.set_clock(0, 1600, now_s=0.5) is None  # too soon after the last change
    assert gov.set_clock(0, 1200, now_s=0.6) == 1200  # no-op: allowed, nothing sent
    assert gov.set_clock(0, 1600, now_s=1.5) == 1600
    assert [c.note for c in gov.history] == ["locked", "rate limited", "locked"]
    assert nvml.locked() == {0: 1600}


def test_governor_resets_to_default_on_error_and_on_shutdown() -> None:
    nvml = fake_nvml(fail=frozenset({"nvmlDeviceSetGpuLockedClocks"}))
    gov = ClockGovernor(NvmlGpu(nvml))
    nvml.lock_outside(0, 990)  # left locked by an earlier run
    assert gov.set_clock(0, 1200, now_s=0.0) is None
    assert 0 not in nvml.locked()  # fail static: back to driver-managed clocks
    assert gov.history[-1].note == "reset to default"
    ok = fake_nvml()
    gov = ClockGovernor(NvmlGpu(ok))
    gov.set_clock(1, 800, now_s=0.0)
    gov.restore_all(now_s=1.0)
    assert ok.locked() == {}


def test_modelled_gpu_refuses_unsupported_clocks() -> None:
    gpu = ModelledGpu(GPUS["h100-80gb"], count=1)
    with pytest.raises(GpuControlError):
        gpu.lock_clock(0, 1234)
    with pytest.raises(GpuControlError):
        gpu.clock_mhz(3)


def test_nvml_lock_error_resets_and_holds_default_clocks() -> None:
    nvml = fake_nvml(fail=frozenset({"nvmlDeviceSetGpuLockedClocks"}))
    gov = ClockGovernor(NvmlGpu(nvml), min_interval_s=0.0, hold_default_s=10.0)
    nvml.lock_outside(0, 990)
    assert gov.set_clock(0, 1200, now_s=0.0) is None
    assert 0 not in nvml.locked()
    assert gov.set_clock(0, 1200, now_s=5.0) is None  # held at default: NVML not even asked
    assert gov.history[-1].note == "held at default after an error"
    fixed = fake_nvml()
    gov.gpus = NvmlGpu(fixed)  # the driver recovered
    assert gov.set_clock(0, 1200, now_s=11.0) == 1200  # after the hold it throttles again
    assert fixed.locked() == {0: 1200}


def test_nvml_read_error_restores_default_clocks() -> None:
    clock = FakeClock()
    nvml = fake_nvml(clock=clock)
    gov = ClockGovernor(NvmlGpu(nvml), hold_default_s=10.0)
    assert gov.set_clock(1, 800, now_s=0.0) == 800
    clock.t_s = 1.0
    assert gov.energy_j(1, now_s=1.0) == pytest.approx(123.456)
    nvml.fail.add("nvmlDeviceGetTotalEnergyConsumption")
    assert gov.energy_j(1, now_s=2.0) is None
    assert 1 not in nvml.locked()  # the GPU we could not read runs at default clocks
    assert [c.note for c in gov.history[-2:]] == [
        "read failed: nvmlDeviceGetTotalEnergyConsumption failed: Insufficient Permissions", "reset to default"]
    assert gov.set_clock(1, 800, now_s=3.0) is None


def test_restore_all_never_raises_even_if_nvml_cannot_count() -> None:
    nvml = fake_nvml()
    gov = ClockGovernor(NvmlGpu(nvml))
    gov.set_clock(1, 800, now_s=0.0)
    nvml.fail.add("nvmlDeviceGetCount")
    gov.restore_all(now_s=1.0)
    assert nvml.locked() == {}
