"""The Batch API queue follows the one controller's plan for how many requests it may have
out on the pools at once, never below the configured bound."""

from pathlib import Path

from core.plan import ClusterPlan
from core.roles import BATCH_QUEUE_DEPLOYMENT
from deployments.batch_queue import BatchQueue


def test_the_queue_sends_more_at_once_while_the_plan_says_its_deadlines_need_it(tmp_path: Path) -> None:
    queue = BatchQueue.func_or_class(str(tmp_path / "batches.sqlite"), max_in_flight=32)
    assert queue.max_in_flight == 32
    queue.apply_plan(ClusterPlan(batch_in_flight={BATCH_QUEUE_DEPLOYMENT: 400}))
    assert queue.max_in_flight == 400
    queue.apply_plan(ClusterPlan(batch_in_flight={BATCH_QUEUE_DEPLOYMENT: 5}))  # the job drained
    assert queue.max_in_flight == 32
    queue.apply_plan(ClusterPlan())  # a plan without the layer's entry: the configured bound
    assert queue.max_in_flight == 32
