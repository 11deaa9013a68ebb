"""Build one replica's admission and clock policies around a shared projector.

The same factory serves the simulator (one call per simulated replica), the real-time
modelled engine in Ray Serve and vLLM replicas (with M corrected from their engine's steps:
autoscaling.throttllem.online_ips). M is trained once per machine and tabulated once per
(TP, batch limit, KV capacity), and the tables are kept on disk: a replica whose tables are
there reads them without fitting or importing M (scikit-learn, ~2 s of CPU).
"""

from __future__ import annotations

from functools import lru_cache

from autoscaling.throttllem import ips_table as ips_table_module
from autoscaling.throttllem.admission import ThrottllemAdmission
from autoscaling.throttllem.clock import ThrottllemClock
from autoscaling.throttllem.config import ThrottllemConfig
from autoscaling.throttllem.ips_model_key import ips_model_key
from autoscaling.throttllem.ips_table import IpsTable
from autoscaling.throttllem.online_ips import OnlineIpsTable
from autoscaling.throttllem.projector import ReplicaProjector
from batching.continuous_batcher import BatcherConfig
from core.disk_cache import cached_pickle, fingerprint
from energy.calibration import default_perf_model
from energy.perf_model import PerfModel


@lru_cache(maxsize=32)
def ips_table(model: str, hardware: str, profile: str | None, tp: int, batch_max: int, kv_blocks_max: int,
              batch_levels: int, kv_levels: int) -> IpsTable:
    clocks = default_perf_model(model, hardware, profile).gpu.supported_clocks_mhz()
    grid = (tp, tuple(clocks), batch_max, kv_blocks_max, batch_levels, kv_levels)
    key = f"{ips_model_key(model, hardware, profile)}-{fingerprint(grid, modules=(ips_table_module,))}"

    def tabulate() -> IpsTable:
        from autoscaling.throttllem.ml_perf_model import default_ips_model  # scikit-learn: only on a miss

        return IpsTable(default_ips_model(model, hardware, profile), tp, clocks, batch_max, kv_blocks_max,
                        batch_levels, kv_levels)

    return cached_pickle(f"ips-table-{key}.pkl", tabulate)


def learnt_ips_table(config: ThrottllemConfig, tp: int, batch_max: int, kv_blocks: int) -> OnlineIpsTable:
    """M for one engine shape, to be corrected from that engine's steps (its batch grid up to
    the largest batch the engine takes: the replica's limit moves at run time)."""
    profile = ips_table(config.model, config.hardware, config.profile, tp, batch_max, kv_blocks,
                        config.tuning.table_batch_levels, config.tuning.table_kv_levels)
    return OnlineIpsTable(profile, config.tuning.learn_prior_steps, config.tuning.learn_refresh_steps)


def replica_policies(
    perf: PerfModel, batcher_config: BatcherConfig, config: ThrottllemConfig = ThrottllemConfig(),
    learnt: OnlineIpsTable | None = None,
) -> tuple[ThrottllemAdmission, ThrottllemClock]:
    """`learnt`: M as the replica's engine corrects it (a vLLM replica's); None: the profile's."""
    if (perf.model.name, perf.gpu.name) != (config.model, config.hardware):
        raise ValueError(f"throttLL'eM is configured for {config.model} on {config.hardware}, "
                         f"the replica runs {perf.model.name} on {perf.gpu.name}")

    def table_for(tp: int, batch_max: int, kv_blocks: int) -> IpsTable:
        if learnt is not None:
            return learnt.table
        return ips_table(config.model, config.hardware, config.profile, tp, batch_max, kv_blocks,
                         config.tuning.table_batch_levels, config.tuning.table_kv_levels)

    config = config.resolved()
    tp = batcher_config.tensor_parallel
    kv_tokens = batcher_config.kv_capacity_tokens or perf.kv_capacity_tokens(tp)
    table_for(tp, batcher_config.batch_limit, max(kv_tokens // batcher_config.block_size, 1))  # warm: not on a request
    projector = ReplicaProjector(config, table_for, batcher_config.block_size)
    return ThrottllemAdmission(projector), ThrottllemClock(projector, config)
