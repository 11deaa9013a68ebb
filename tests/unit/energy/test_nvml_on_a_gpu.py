"""NvmlGpu's reads against a real GPU's NVML, skipped where none answers (CI, this project's
development machines): the clocks, power and energy counter that the clock governor and the
J/token accounting read. It never locks a clock or sets a power limit: a lent or shared GPU's
settings are not a test's to change (tests/unit/energy/test_gpu_control.py covers the writes
against a fake NVML)."""

import time

import pytest

from energy.gpu_control import GpuControlError, NvmlGpu


def real_nvml() -> NvmlGpu:
    try:
        return NvmlGpu()
    except (GpuControlError, ImportError, OSError) as exc:
        pytest.skip(f"no NVML answers here: {exc}")


def test_a_real_gpu_reports_its_clocks_power_and_a_rising_energy_counter():
    gpu = real_nvml()
    assert gpu.device_count() >= 1
    clocks = gpu.supported_clocks_mhz(0)
    assert len(clocks) > 1 and clocks == sorted(clocks) and 100 <= clocks[0] < clocks[-1] <= 4000
    limit_w = gpu.power_limit_w(0)
    assert 50 <= limit_w <= 2000
    assert 0 < gpu.clock_mhz(0) <= clocks[-1]
    assert 0 < gpu.power_w(0) <= 1.2 * limit_w
    start_j = gpu.energy_j(0)
    deadline = time.monotonic() + 120  # NVML refreshes the counter on its own period; an idle GPU still draws
    while gpu.energy_j(0) <= start_j and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gpu.energy_j(0) > start_j
