"""The batch queue summarised as flat metrics, the form a Serve deployment can report
(record_autoscaling_stats) and the simulator can build: both runtimes use this one
function, so the global autoscaler sees the same thing in each."""

from __future__ import annotations

from autoscaling.chiron.batch_queue import OutputLengthStats, QueuedBatchRequest, RequestGroup, group_requests

MAX_GROUPS = 16


def summarise_queue(queue: list[QueuedBatchRequest], lengths: OutputLengthStats,
                    window_s: float = 300.0) -> dict[str, float]:
    groups = group_requests(queue, window_s)
    if len(groups) > MAX_GROUPS:  # fold the latest deadlines into the last group
        tail = groups[MAX_GROUPS - 1:]
        groups = [*groups[:MAX_GROUPS - 1], RequestGroup(tail[0].deadline_s, sum(g.count for g in tail))]
    metrics = {"batch_queue_length": float(len(queue)), "output_mean_tokens": lengths.mean,
               "output_std_tokens": lengths.std}
    for i, g in enumerate(groups):
        metrics[f"group.{i}.deadline_s"] = g.deadline_s
        metrics[f"group.{i}.count"] = float(g.count)
    return metrics


def groups_from_metrics(metrics: dict[str, float]) -> list[RequestGroup]:
    groups = []
    for i in range(MAX_GROUPS):
        count = metrics.get(f"group.{i}.count")
        if count is None:
            break
        groups.append(RequestGroup(metrics[f"group.{i}.deadline_s"], round(count)))
    return groups
