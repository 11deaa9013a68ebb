"""Reconfiguration costs (DynamoLLM §III-D, §IV-B "Overhead Table") and the rule that a
controller reconfigures only when the energy saved over the next epoch pays for it.

Costs are downtime of the GPUs involved: a new instance burns idle power while it starts;
a re-shard stalls the instance for the plan's transfer time (energy.reshard, Table VI);
a clock change stalls it for ~50-200 ms.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from energy.reshard import layout_slices, plan_reshard


class OverheadTable(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    scale_out_s: float = Field(default=33.0, ge=0)  # warm node: engine setup + weights/KV install
    clock_change_s: float = Field(default=0.1, ge=0)
    nvlink_bytes_per_s: float = Field(default=300e9, gt=0)
    gpus_per_server: int = Field(default=8, gt=0)

    def reshard_s(self, from_tps: list[int], to_tps: list[int], model_bytes: float) -> float:
        """Transfer time of the best re-shard plan between two layouts of one server."""
        units = self.gpus_per_server
        plan = plan_reshard(layout_slices(from_tps, units), layout_slices(to_tps, units), model_bytes,
                            self.nvlink_bytes_per_s)
        return plan.time_s


def worth_reconfiguring(power_now_w: float, power_new_w: float, epoch_s: float, cost_j: float) -> bool:
    """Energy saved over the coming epoch exceeds the one-off cost of getting there."""
    return (power_now_w - power_new_w) * epoch_s > cost_j
