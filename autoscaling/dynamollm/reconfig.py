"""The rule that a controller reconfigures only when the energy saved over the next epoch
pays for it (DynamoLLM §IV-B); what reconfiguring costs is core.overheads' one table."""

from __future__ import annotations


def worth_reconfiguring(power_now_w: float, power_new_w: float, epoch_s: float, cost_j: float) -> bool:
    """Energy saved over the coming epoch exceeds the one-off cost of getting there."""
    return (power_now_w - power_new_w) * epoch_s > cost_j
