"""Per-request SLO measures of a run."""

import numpy as np

from core.slo import SLO
from sim.metrics import e2e_deadline_met, slo_met
from sim.records import RequestLog


def _log() -> RequestLog:
    """Three requests of 11 tokens, TTFT target 1 s, TBT 0.1 s: an E2E deadline of 2 s."""
    log = RequestLog(3)
    log.done[:] = [True, True, False]
    log.output_tokens[:] = 11
    slo = SLO(ttft_s=1.0, tbt_s=0.1)
    log.slo_ttft_s[:], log.slo_tbt_s[:] = slo.ttft_s, slo.tbt_s
    log.slo_e2e_s[:] = slo.e2e_for(11)  # as RequestLog.finish records it
    log.ttft_s[:] = [1.5, 0.5, np.nan]  # the first is late, then makes it up
    log.mean_tbt_s[:] = [0.04, 0.2, np.nan]
    log.e2e_s[:] = log.ttft_s + 10 * log.mean_tbt_s
    return log


def test_a_late_first_token_made_up_meets_its_deadline_not_its_slo():
    log = _log()
    assert list(e2e_deadline_met(log)) == [True, False, False]  # 1.9 s; 2.5 s; never done
    assert list(slo_met(log)) == [False, False, False]
