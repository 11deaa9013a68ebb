"""The batch-replica bound's arithmetic: what the composite spends on batch work, and what
moving it onto replicas of its own could save at most."""

import pytest

from bench.batch_replicas import BatchShare


def test_batch_work_is_what_it_adds_to_the_interactive_requests_alone() -> None:
    share = BatchShare("job", composite_j=100.0, interactive_alone_j=80.0, slo_met=1.0, batch_floor_j=15.0)
    assert share.composite_batch_j == pytest.approx(20.0)
    assert share.batch_share == pytest.approx(0.20)
    assert share.moved_saving_share == pytest.approx(0.05)


def test_spare_capacity_cheaper_than_replicas_of_its_own_leaves_nothing_to_move() -> None:
    share = BatchShare("mix", composite_j=130.0, interactive_alone_j=115.0, slo_met=1.0, batch_floor_j=55.0)
    assert share.moved_saving_share < 0
