"""Run the provisioning search of autoscaling/splitwise/provisioning.py on the simulator."""

from __future__ import annotations

from typing import Any

from autoscaling.registry import make_policy
from autoscaling.splitwise.provisioning import Trial, cheapest
from core.classes import LengthClassConfig
from energy.hardware import GPUS
from sim.config import SimConfig
from sim.metrics import summarise
from sim.scenario import MAX_TP, splitwise_pools
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


def plan_splitwise(
    w: Workload, config: SimConfig, slo_attainment: float = 0.99, max_prompt: int = 8, max_token: int = 8,
    token_clock_mhz: float | None = None,
) -> tuple[Trial | None, list[Trial]]:
    """Cheapest prompt/token machine counts (TP8 each) whose run meets `slo_attainment`."""
    price = GPUS[config.hardware].price_per_hour if config.price_per_gpu_hour is None else config.price_per_gpu_hour

    def meets(prompt: int, token: int) -> bool:
        summary, _ = run_splitwise(w, config, prompt, token, token_clock_mhz)
        return summary["completed"] == len(w) and summary["slo_attainment"]["overall"] >= slo_attainment

    return cheapest(meets, lambda p, t: (p + t) * MAX_TP * price, max_prompt, max_token)
