"""`wattwise gpu-check` on the CPU against the fake NVML: it reads what wattwise reads, locks and
resets a clock, sweeps prefill and decode steps over clocks (a tiny random Llama here, on the
CPU) beside the profile's prediction, and leaves the GPU unlocked."""

from __future__ import annotations

import re

import pytest

from tests.fake_nvml import FakeNvml, PowerTrace
from wattwise.gpu_check import main

TINY = ["--hidden", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--intermediate", "128",
        "--vocab", "256", "--batch", "2", "--prompt-tokens", "16", "--seconds", "0.05", "--clocks", "3"]


def test_gpu_check_reads_locks_sweeps_and_leaves_the_gpu_as_found(capsys: pytest.CaptureFixture[str]) -> None:
    nvml = FakeNvml(count=2, power=PowerTrace(((0.0, 250.0),)))
    assert main(["--gpu", "1", *TINY], nvml=nvml) == 0
    out = capsys.readouterr().out
    assert "NVML: 2 GPUs; GPU 1: 5 clocks 800-1980 MHz" in out and "energy counter: rising" in out
    assert "clock lock: asked 1200 MHz, read back 1200 MHz; after reset 1980 MHz" in out
    rows = re.findall(r"^\s+(\d+)\s+(prefill|decode)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+\|\s+([\d.]+)\s+([\d.]+)$", out,
                      re.MULTILINE)
    assert [(int(c), phase) for c, phase, *_ in rows] == [
        (clock, phase) for clock in (800, 1200, 1980) for phase in ("prefill", "decode")]
    for _clock, _phase, tokens, step_ms, j_per_token, predicted_ms, predicted_j in rows:
        assert int(tokens) in (2, 32) and float(step_ms) > 0 and float(predicted_ms) > 0 and float(predicted_j) > 0
        assert float(j_per_token) > 0  # the counter rose while the steps ran (250 W on the fake)
    # Each swept clock was locked on GPU 1, and it was reset at the end.
    assert [args[1:] for args in nvml.calls("nvmlDeviceSetGpuLockedClocks")] == [
        [1, 1200], [1, 800], [1, 1200], [1, 1980]]
    assert nvml.locked() == {}


def test_the_gpu_is_reset_even_when_a_check_fails() -> None:
    nvml = FakeNvml(count=1, fail=frozenset({"nvmlDeviceGetClockInfo"}))
    with pytest.raises(Exception, match="Insufficient Permissions"):
        main(TINY, nvml=nvml)
    assert [args[1:] for args in nvml.calls("nvmlDeviceResetGpuLockedClocks")] == [[0]]
