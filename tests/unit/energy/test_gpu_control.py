"""NVML behind the GPU-control protocol, against a fake NVML with the real API's names
and errors; the clock governor's clamping, rate limit, records and fail-static reset."""

from types import SimpleNamespace

import pynvml
import pytest

from energy.clock_governor import ClockGovernor
from energy.gpu_control import GpuControlError, ModelledGpu, NvmlGpu, open_gpus
from energy.hardware import GPUS


class FakeNVMLError(Exception):
    pass


def fake_nvml(fail: set[str] = frozenset(), init_error: bool = False) -> SimpleNamespace:
    """NVML's functions as nvidia-ml-py names them, over two 8-GPU-style devices."""
    state = {"locked": {}, "limit": {0: 700_000, 1: 700_000}}

    def maybe_fail(name):
        if name in fail:
            raise FakeNVMLError(f"{name}: Insufficient Permissions")

    def fn(name, body):
        def call(*args):
            maybe_fail(name)
            return body(*args)
        call.__name__ = name
        return call

    def init():
        if init_error:
            raise FakeNVMLError("NVML Shared Library Not Found")

    api = {
        "nvmlInit": init,
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetSupportedMemoryClocks": lambda h: [2619, 1593],
        "nvmlDeviceGetSupportedGraphicsClocks": lambda h, mem: [1980, 1600, 1200, 990, 800],
        "nvmlDeviceSetGpuLockedClocks": lambda h, lo, hi: state["locked"].__setitem__(h, (lo, hi)),
        "nvmlDeviceResetGpuLockedClocks": lambda h: state["locked"].pop(h, None),
        "nvmlDeviceGetClockInfo": lambda h, kind: state["locked"].get(h, (1980, 1980))[0],
        "nvmlDeviceGetPowerManagementLimit": lambda h: state["limit"][h],
        "nvmlDeviceSetPowerManagementLimit": lambda h, mw: state["limit"].__setitem__(h, mw),
        "nvmlDeviceGetPowerUsage": lambda h: 123_456,
        "nvmlDeviceGetTotalEnergyConsumption": lambda h: 9_000_000,
    }
    module = SimpleNamespace(**{name: fn(name, body) for name, body in api.items()})
    module.NVMLError = FakeNVMLError
    module.NVML_CLOCK_GRAPHICS = 0
    module.state = state
    return module


def test_the_fake_uses_only_real_nvml_names() -> None:
    fake = fake_nvml()
    for name in vars(fake):
        if name.startswith("nvml") or name.startswith("NVML_"):
            assert hasattr(pynvml, name), name


def test_nvml_reads_and_locks() -> None:
    nvml = fake_nvml()
    gpu = NvmlGpu(nvml)
    assert gpu.device_count() == 2
    assert gpu.supported_clocks_mhz(0) == [800, 990, 1200, 1600, 1980]
    gpu.lock_clock(1, 1200)
    assert gpu.clock_mhz(1) == 1200 and nvml.state["locked"][1] == (1200, 1200)
    assert gpu.power_w(0) == pytest.approx(123.456) and gpu.energy_j(0) == pytest.approx(9000.0)
    gpu.set_power_limit_w(0, 350)
    assert gpu.power_limit_w(0) == 350


def test_nvml_errors_become_gpu_control_errors() -> None:
    gpu = NvmlGpu(fake_nvml(fail={"nvmlDeviceSetGpuLockedClocks"}))
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
    assert nvml.state["locked"][0] == (1600, 1600)


def test_governor_resets_to_default_on_error_and_on_shutdown() -> None:
    nvml = fake_nvml(fail={"nvmlDeviceSetGpuLockedClocks"})
    gov = ClockGovernor(NvmlGpu(nvml))
    nvml.state["locked"][0] = (990, 990)  # left locked by an earlier run
    assert gov.set_clock(0, 1200, now_s=0.0) is None
    assert 0 not in nvml.state["locked"]  # fail static: back to driver-managed clocks
    assert gov.history[-1].note == "reset to default"
    ok = fake_nvml()
    gov = ClockGovernor(NvmlGpu(ok))
    gov.set_clock(1, 800, now_s=0.0)
    gov.restore_all(now_s=1.0)
    assert ok.state["locked"] == {}


def test_modelled_gpu_refuses_unsupported_clocks() -> None:
    gpu = ModelledGpu(GPUS["h100-80gb"], count=1)
    with pytest.raises(GpuControlError):
        gpu.lock_clock(0, 1234)
    with pytest.raises(GpuControlError):
        gpu.clock_mhz(3)


def test_nvml_lock_error_resets_and_holds_default_clocks() -> None:
    nvml = fake_nvml(fail={"nvmlDeviceSetGpuLockedClocks"})
    gov = ClockGovernor(NvmlGpu(nvml), min_interval_s=0.0, hold_default_s=10.0)
    nvml.state["locked"][0] = (990, 990)
    assert gov.set_clock(0, 1200, now_s=0.0) is None
    assert 0 not in nvml.state["locked"]
    assert gov.set_clock(0, 1200, now_s=5.0) is None  # held at default: NVML not even asked
    assert gov.history[-1].note == "held at default after an error"
    fixed = fake_nvml()
    gov.gpus = NvmlGpu(fixed)  # the driver recovered
    assert gov.set_clock(0, 1200, now_s=11.0) == 1200  # after the hold it throttles again
    assert fixed.state["locked"][0] == (1200, 1200)


def test_nvml_read_error_restores_default_clocks() -> None:
    nvml = fake_nvml()
    gov = ClockGovernor(NvmlGpu(nvml), hold_default_s=10.0)
    assert gov.set_clock(1, 800, now_s=0.0) == 800
    assert gov.energy_j(1, now_s=1.0) == pytest.approx(9000.0)
    nvml.nvmlDeviceGetTotalEnergyConsumption = _raising("nvmlDeviceGetTotalEnergyConsumption")
    assert gov.energy_j(1, now_s=2.0) is None
    assert 1 not in nvml.state["locked"]  # the GPU we could not read runs at default clocks
    assert [c.note for c in gov.history[-2:]] == [
        "read failed: nvmlDeviceGetTotalEnergyConsumption failed: Insufficient Permissions", "reset to default"]
    assert gov.set_clock(1, 800, now_s=3.0) is None


def test_restore_all_never_raises_even_if_nvml_cannot_count() -> None:
    nvml = fake_nvml()
    gov = ClockGovernor(NvmlGpu(nvml))
    gov.set_clock(1, 800, now_s=0.0)
    nvml.nvmlDeviceGetCount = _raising("nvmlDeviceGetCount")
    gov.restore_all(now_s=1.0)
    assert nvml.state["locked"] == {}


def _raising(name: str):
    def call(*args):
        raise FakeNVMLError("Insufficient Permissions")
    call.__name__ = name
    return call
