"""One Splitwise run on the simulator, its pools sized as given (else for the peak).

The provisioning search over pool sizes (§IV-D) is sim.provision's."""

from __future__ import annotations

from typing import Any

from autoscaling.registry import make_policy
from core.classes import LengthClassConfig
from sim.config import SimConfig
from sim.metrics import summarise
from sim.scenario import splitwise_pools
from sim.splitwise import SplitwiseSimConfig, SplitwiseSimulator
from sim.workload import Workload


def run_splitwise(
    w: Workload, config: SimConfig, prompt: int | None = None, token: int | None = None,
    token_clock_mhz: float | None = None, splitwise: SplitwiseSimConfig | None = None,
) -> tuple[dict[str, Any], SplitwiseSimulator]:
    """One Splitwise run with the given pool sizes (else sized for the peak)."""
    splitwise = splitwise or SplitwiseSimConfig()
    pools = splitwise_pools(w, config, LengthClassConfig(), prompt, token, token_clock_mhz, splitwise.scheduling)
    policy = make_policy("splitwise", replicas={s.name: s.replicas for s in pools},
                         tensor_parallel={s.name: s.tensor_parallel for s in pools},
                         clock_mhz={s.name: int(s.clock_mhz) for s in pools}, model=config.model,
                         hardware=config.hardware)
    sim = SplitwiseSimulator(w, policy, pools, config, splitwise=splitwise)
    return summarise(sim.run(), config), sim
