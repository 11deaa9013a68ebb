"""throttLL'eM's clock throttling as the batcher's ClockPolicy (throttLL'eM paper §IV-E).

After an admission (and every `clock_refresh_s` as requests finish) a binary search
finds the lowest supported clock at which the projection still passes the scheduler's
TBT and deadline checks; while a lost request runs, max clock instead (best effort).
The paper's scoreboard holds admitted requests only: prompts waiting to prefill also
get their TTFT (autoscaling/throttllem/prompt_deadlines.py), checked at every step
while any is still to prefill, so a burst raises the clock before the queue makes them
late. An interactive prompt that admission refused (the running batch's projected KV or
TBT leaves it no room) waits for running requests to finish, which no prefill-time search
sees: until it is admitted, max clock (best effort, as for a lost request), so the batch
ahead of it drains as fast as it can. So does a batch whose interactive requests hold over
`kv_budget` of the KV cache, before a prompt is refused: requests stay as long as
their steps take, so at the low clocks the deadlines allow, a replica serving long prompts
fills its KV, and once a prompt is refused, blocks free only as requests finish, seconds
later (the day: all 16 misses were prompts refused for KV on one TP2 replica holding 41
requests at 800-1,100 MHz).
The search goes no lower than the clock at which a decode step costs the least energy above
the floor (`energy_floor`; throttLL'eM's own sweet spot, §III-A): below it a step's work
stretches faster than its power falls (energy.perf_model), so saving SLO slack there spends
energy. Raising is asked at once; lowering (inside the band) at most every
`clock_lower_interval_s`. A clock asked reaches the GPUs late: the replica forwards it to
the node's GPU-control actor periodically, and the lock takes effect after its latency
(core.overheads; the batcher models the same). So a raise for a prompt is searched knowing
the present clock runs until then, and the clock stays at least at the one from which a
raise still saves the largest recent burst of prompts (`ready_prompt_window_s`): below it a
burst's prefill would have run at the low clock for a whole lag.
"""

from __future__ import annotations

from autoscaling.throttllem.config import ThrottllemConfig
from autoscaling.throttllem.projector import ReplicaProjector
from autoscaling.throttllem.prompt_arrivals import Burst, PromptArrivals
from autoscaling.throttllem.prompt_deadlines import (
    PrefillWork,
    burst_ready_clock_mhz,
    decode_share_s,
    prompt_deadline_clock_mhz,
)
from autoscaling.throttllem.slo_checks import lowest_passing_clock
from batching.continuous_batcher import ClockedBatch


class ThrottllemClock:
    def __init__(self, projector: ReplicaProjector, config: ThrottllemConfig) -> None:
        self.projector = projector
        self.config = config
        self._searched_s = float("-inf")
        self._lowered_s = float("-inf")
        # Interactive prompts seen arriving within `ready_prompt_window_s`, by TTFT target.
        self._prompts: dict[float, PromptArrivals] = {}
        self._newest_s = float("-inf")  # the latest arrival seen
        # The last answers of the two searches, where the next ones start (clock_search).
        self._target_index: int | None = None
        self._prompts_mhz: float | None = None
        self._ready_mhz: dict[float, float] = {}  # by TTFT target
        # Each TTFT target's largest burst's prefills, and what they were worked out for.
        self._bursts: dict[float, tuple[tuple[int, int, int, int], PrefillWork]] = {}
        self._efficient_mhz: dict[int, float] = {}  # by TP: the least-energy decode clock

    def efficient_clock_mhz(self, batcher: ClockedBatch) -> float:
        """The lowest clock worth running at: a decode step's least energy above the floor (the
        same at any batch, as every part of the step's work stretches alike). Over the GPU's
        clocks (M's table has the same ones), so it is known before the first step."""
        tp = batcher.tensor_parallel
        if tp not in self._efficient_mhz:
            clocks = [float(c) for c in batcher.perf.gpu.supported_clocks_mhz()]
            self._efficient_mhz[tp] = batcher.perf.least_energy_clock_mhz(8, 8 * 1000.0, tp, clocks)
        return self._efficient_mhz[tp]

    def lowest_clock_mhz(self, batcher: ClockedBatch) -> float:
        """The search's floor (`energy_floor`), for the planner to price; 0: the band's floor."""
        return self.efficient_clock_mhz(batcher) if self.config.energy_floor else 0.0

    def _observe_prompts(self, batcher: ClockedBatch, now_s: float) -> None:
        """Record the prompts that arrived since the last step, in arrival order (the queue
        holds them in deadline order), and forget those older than the window."""
        fresh = sorted((seq.request.arrival_s, seq.request.prompt_tokens, seq.request.slo.ttft_s)
                       for seq in batcher.waiting if seq.request.arrival_s > self._newest_s
                       and seq.request.service_class != "batch" and seq.generated == 0)
        for at, tokens, ttft_s in fresh:
            self._prompts.setdefault(ttft_s, PromptArrivals()).add(at, tokens)
        if fresh:
            self._newest_s = fresh[-1][0]
        horizon_s = now_s - self.config.tuning.ready_prompt_window_s
        for ttft_s in [t for t, arrivals in self._prompts.items() if not arrivals.forget_before(horizon_s)]:
            del self._prompts[ttft_s]
            self._bursts.pop(ttft_s, None)

    def ready_clock_mhz(self, batcher: ClockedBatch) -> float:
        """The clock below which the largest recent burst of prompts of each TTFT target (the
        most prompt tokens arriving within one raise's lag) could not be saved by a raise
        (prompt_deadlines.burst_ready_clock_mhz), each searched from its last answer."""
        lag_s = batcher.longest_clock_lag_s
        clocks = self.projector.synced_table.clocks_mhz
        ready = float(clocks[0])
        decode_s: float | None = None
        for ttft_s, arrivals in self._prompts.items():
            burst = arrivals.largest_burst(lag_s)
            if burst is None:
                continue
            decode_s = decode_share_s(batcher) if decode_s is None else decode_s
            work = self._burst_work(batcher, ttft_s, burst, decode_s)
            self._ready_mhz[ttft_s] = burst_ready_clock_mhz(
                batcher, clocks, work, ttft_s, self.config.tuning.ttft_headroom, self._ready_mhz.get(ttft_s))
            ready = max(ready, self._ready_mhz[ttft_s])
        return ready

    def _burst_work(self, batcher: ClockedBatch, ttft_s: float, burst: Burst, decode_s: float) -> PrefillWork:
        """The burst's prefills beside this step's decodes, worked out again only when the
        burst or the step's token budget changed (it usually stays for many refreshes)."""
        key = (burst.first, len(burst.tokens), batcher.tensor_parallel, batcher.step_tokens)
        kept = self._bursts.get(ttft_s)
        if kept is not None and kept[0] == key:
            return kept[1].beside(decode_s)
        work = PrefillWork.of_burst(batcher, burst.tokens, decode_s)
        self._bursts[ttft_s] = (key, work)
        return work

    def target_clock_mhz(self, now_s: float) -> float | None:
        """The lowest passing clock for the committed scoreboard (None: nothing runs)."""
        p = self.projector
        board = p.scoreboard
        if len(board) == 0:
            return None
        clocks = p.synced_table.clocks_mhz
        if board.lost.any():
            return float(clocks[-1])
        projection = p.project()
        index = lowest_passing_clock(p.synced_table, p.lookup(projection), projection, p.deadline_lines(projection),
                                     board.lost, now_s, p.tbt_s, p.headroom, self._target_index)
        self._target_index = index
        return float(clocks[index])

    def _kv_pressed(self, batcher: ClockedBatch) -> bool:
        """Interactive requests hold over `kv_budget` of the KV cache (batch requests'
        blocks do not count: an interactive prompt preempts them, Chiron's mixed replicas)."""
        limit = self.config.kv_budget * batcher.kv_blocks_total
        if batcher.kv_blocks_used <= limit:  # always so at a share of 1
            return False
        return sum(s.kv_blocks for s in batcher.running if s.request.service_class != "batch") > limit

    def choose_clock_mhz(self, batcher: ClockedBatch, now_s: float) -> float | None:
        p = self.projector
        p.sync(batcher, now_s)
        self._observe_prompts(batcher, now_s)
        clocks = p.synced_table.clocks_mhz
        refused = p.refused_prompt_id is not None and bool(batcher.waiting) \
            and batcher.waiting[0].request_id == p.refused_prompt_id
        flat_out = refused or self._kv_pressed(batcher)
        if flat_out:
            prompts: float | None = float(clocks[-1])
        else:
            prompts = prompt_deadline_clock_mhz(batcher, clocks, now_s, self.config.tuning.ttft_headroom,
                                                self._prompts_mhz)
            if prompts is not None:
                self._prompts_mhz = prompts
        if prompts is not None and batcher.clamp_to_band(prompts) > batcher.clock_target_mhz:
            return prompts
        if flat_out:  # already at the band's ceiling until the prompt is admitted or KV frees
            return None
        if not p.changed and now_s - self._searched_s < self.config.tuning.clock_refresh_s:
            return None
        p.changed = False
        self._searched_s = now_s
        target = self.target_clock_mhz(now_s)
        if prompts is not None:
            target = prompts if target is None else max(target, prompts)
        if self._prompts:
            ready = self.ready_clock_mhz(batcher)
            target = ready if target is None else max(target, ready)
        if target is None:
            return None
        if self.config.energy_floor:
            target = max(target, self.efficient_clock_mhz(batcher))
        # Inside the band: a choice below its floor is no change, and must not hold off the
        # next real lowering for `clock_lower_interval_s`.
        target = batcher.clamp_to_band(target)
        if target == batcher.clock_target_mhz:
            return None
        if target < batcher.clock_target_mhz:
            if now_s - self._lowered_s < self.config.tuning.clock_lower_interval_s:
                return None
            self._lowered_s = now_s
        return target
