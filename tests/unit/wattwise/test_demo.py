"""The demo's reading of its serving stack's CPU (wattwise.demo.StackCpu)."""

import os

import pytest

from wattwise.demo import StackCpu


def test_stack_cpu_counts_each_process_from_the_first_reading_and_a_new_one_from_zero() -> None:
    before = {1: ("ray::ServeReplica:wattwise:Ingress", 10.0), 2: ("raylet", 4.0), 3: ("ray::IDLE", 7.0)}
    after = {1: ("ray::ServeReplica:wattwise:Ingress", 40.0), 2: ("raylet", 5.0),
             4: ("ray::ServeReplica:wattwise:Ingress", 6.0)}  # pid 3 ended; pid 4 started since
    cpu = StackCpu.between(before, after, wall_s=10.0)
    assert cpu.by_process_s == {"ray::ServeReplica:wattwise:Ingress": 36.0, "raylet": 1.0}
    assert cpu.machine_share == pytest.approx(37.0 / (10.0 * (os.cpu_count() or 1)))
