"""Mico's dispatch across clouds (§3.3), online: the one object that places requests in the
federation front door and in the simulator's multi-cluster runs.

A request costs its predicted tokens (prompt plus the predictor's output). It goes to the
cloud with the least outstanding predicted tokens per unit of capacity (app.dispatch's
online rule). Outstanding work falls as the cloud computes it (app.token_ledger), so a
cloud that computes slowly keeps its load and gets less. Two back-offs handle what the
prediction gets wrong:

- a cloud whose measured progress falls behind (the tokens per second each of its running
  requests gets, against the best cloud's) counts with its capacity scaled down by as much
  (`BackOffSettings.below`, never under `floor`): the speed its capacity predicted, it
  does not deliver;
- a cloud that drained its work takes requests that have not started elsewhere while each
  would start sooner there, transfer included (the paper's offloading to an idle cloud,
  app.offload); the runtime moves them and calls `move`.

A cloud that failed (no answer, 5xx, 503) takes nothing for its Retry-After, else for a
rest that doubles with each failure in a row. Pure: no clock, no I/O; times are passed in.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from app.cloud_load import CloudLoad
from app.dispatch import rank_by_load
from app.offload import ClusterLoad, Move, TransferCost, Waiting, offload_to_idle
from app.token_ledger import TokenLedger


@dataclass(frozen=True)
class BackOffSettings:
    window_s: float = 10.0  # time constant of the measured progress and throughput (EWMA)
    below: float = 0.8  # a cloud progressing slower than this share of the best one is backed off
    floor: float = 0.1  # the least share of its capacity a backed-off cloud keeps
    failure_s: float = 1.0  # a cloud failing without a Retry-After rests this long, doubled per failure in a row
    max_failure_s: float = 30.0
    report_ttl_s: float = 10.0  # a cloud's own report counts this long
    carbon_weight: float = 0.0  # a cloud twice as carbon-intensive as the cleanest counts (1 + w) times as loaded


@dataclass
class _Cloud:
    capacity: float | None  # configured; None: the cloud's report, else 1
    reported: CloudLoad | None = None
    reported_at_s: float = -math.inf
    foreign_tokens: float = 0.0  # outstanding work the cloud reported beyond what this front sent it
    down_until_s: float = -math.inf
    failures: int = 0  # in a row
    done_tokens: float = 0.0  # progress since the last tick
    running_at_tick: int = 0  # requests started and not finished there, at the last tick
    stream_tokens_per_s: float | None = None  # EWMA: tokens per second per running request
    throughput_tokens_per_s: float | None = None  # EWMA of the progress rate
    speed: float = 1.0  # the back-off: the share of its capacity it counts with
    dispatched_tokens: float = 0.0  # predicted tokens placed here in all (moves included)
    waiting: dict[str, Waiting] = field(default_factory=dict)  # placed, not started, in order


@dataclass(frozen=True)
class CloudStatus:
    """One cloud as the dispatcher sees it (metrics, /admin/clouds, benches)."""

    outstanding_tokens: float
    foreign_tokens: float
    capacity: float
    speed: float
    stream_tokens_per_s: float | None
    throughput_tokens_per_s: float | None
    available: bool
    waiting: int  # placed there, not started
    running: int  # started there, not finished
    dispatched_tokens: float


class CloudDispatcher:
    def __init__(self, n_clouds: int, capacities: Sequence[float | None] | None = None,
                 settings: BackOffSettings = BackOffSettings(), transfer: TransferCost = TransferCost()) -> None:
        if n_clouds < 1:
            raise ValueError("a dispatcher needs at least one cloud")
        capacities = list(capacities) if capacities is not None else [None] * n_clouds
        if len(capacities) != n_clouds or any(c is not None and c <= 0 for c in capacities):
            raise ValueError(f"capacities must be positive, one per cloud; got {capacities}")
        self.settings, self.transfer = settings, transfer
        self.ledger = TokenLedger(n_clouds)
        self._clouds = [_Cloud(c) for c in capacities]
        self._where: dict[str, int] = {}
        self._held = [0] * n_clouds  # requests placed on each cloud, not finished
        self._cursor = 0  # ties go round-robin, as Mico's borrowed queries do
        self._last_tick_s: float | None = None

    @property
    def n_clouds(self) -> int:
        return len(self._clouds)

    # ---- placing -------------------------------------------------------------------
    def choose(self, cost_tokens: float, now_s: float, exclude: Collection[int] = (),
               intensity_g_per_kwh: Mapping[int, float] | None = None) -> int | None:
        """The cloud for a request of `cost_tokens`: the least (load + cost) / capacity among
        the available ones not in `exclude`; None if there is none. With a carbon weight, a
        cloud's capacity counts less the dirtier its grid is than the cleanest candidate's."""
        n = self.n_clouds
        candidates = [k % n for k in range(self._cursor, self._cursor + n) if k % n not in exclude
                      and self.available(k % n, now_s)]
        if not candidates:
            return None
        self._cursor = (self._cursor + 1) % n
        weights = [self.capacity(k) * self._clouds[k].speed for k in candidates]
        if intensity_g_per_kwh and self.settings.carbon_weight > 0:
            cleanest = min(intensity_g_per_kwh.get(k, math.inf) for k in candidates)
            if 0 < cleanest < math.inf:
                weights = [w / (1 + self.settings.carbon_weight * (intensity_g_per_kwh.get(k, cleanest) / cleanest - 1))
                           for w, k in zip(weights, candidates, strict=True)]
        loads = [self.load_tokens(k, now_s) for k in candidates]
        return candidates[rank_by_load(loads, weights, cost_tokens)[0]]

    def dispatch(self, cloud: int, request_id: str, cost_tokens: float, prompt_tokens: int) -> None:
        """The request was sent to `cloud`; it waits there until `started`."""
        self.ledger.add(cloud, request_id, cost_tokens)
        self._where[request_id] = cloud
        self._held[cloud] += 1
        state = self._clouds[cloud]
        state.waiting[request_id] = Waiting(request_id, cost_tokens, prompt_tokens)
        state.dispatched_tokens += cost_tokens

    def started(self, request_id: str) -> None:
        """Its first token came: it can no longer be moved."""
        cloud = self._where.get(request_id)
        if cloud is not None:
            self._clouds[cloud].waiting.pop(request_id, None)

    def progress(self, request_id: str, tokens: float) -> None:
        """`tokens` of the request were computed (prompt or output)."""
        cloud = self._where.get(request_id)
        if cloud is None:
            return
        self.started(request_id)
        before = self.ledger.left_tokens(request_id)
        self.ledger.progress(request_id, tokens)
        self._clouds[cloud].done_tokens += before - self.ledger.left_tokens(request_id)

    def finish(self, request_id: str) -> None:
        """Done, failed or given up where it was: what its prediction left is dropped."""
        cloud = self._where.pop(request_id, None)
        if cloud is None:
            return
        self._clouds[cloud].waiting.pop(request_id, None)
        self._held[cloud] -= 1
        self.ledger.finish(request_id)

    def move(self, request_id: str, to_cloud: int) -> None:
        """The runtime moved a request that had not started (an offload or a failover)."""
        source = self._where[request_id]
        waiting = self._clouds[source].waiting.pop(request_id, None)
        left = self.ledger.left_tokens(request_id)
        self.ledger.move(request_id, to_cloud)
        self._where[request_id] = to_cloud
        self._held[source] -= 1
        self._held[to_cloud] += 1
        self._clouds[source].dispatched_tokens -= left
        target = self._clouds[to_cloud]
        target.dispatched_tokens += left
        if waiting is not None:
            target.waiting[request_id] = waiting

    def cloud_of(self, request_id: str) -> int | None:
        return self._where.get(request_id)

    # ---- what the clouds tell --------------------------------------------------------
    def report(self, cloud: int, load: CloudLoad, now_s: float) -> None:
        """A cloud's own report: its capacity, and work this front did not send it."""
        state = self._clouds[cloud]
        state.reported, state.reported_at_s = load, now_s
        state.foreign_tokens = max(load.outstanding_tokens - self.ledger.load_tokens[cloud], 0.0)

    def failed(self, cloud: int, now_s: float, retry_after_s: float | None = None) -> None:
        state = self._clouds[cloud]
        state.failures += 1
        rest_s = retry_after_s if retry_after_s is not None else min(
            self.settings.failure_s * 2 ** (state.failures - 1), self.settings.max_failure_s)
        state.down_until_s = max(state.down_until_s, now_s + rest_s)

    def succeeded(self, cloud: int) -> None:
        self._clouds[cloud].failures = 0

    def available(self, cloud: int, now_s: float) -> bool:
        return now_s >= self._clouds[cloud].down_until_s

    def retry_after_s(self, now_s: float) -> float:
        """How long until some cloud takes requests again (0: one does now)."""
        return max(min(c.down_until_s for c in self._clouds) - now_s, 0.0)

    def capacity(self, cloud: int) -> float:
        state = self._clouds[cloud]
        if state.capacity is not None:
            return state.capacity
        if state.reported is not None and state.reported.capacity_gpus > 0:
            return float(state.reported.capacity_gpus)
        return 1.0

    def load_tokens(self, cloud: int, now_s: float) -> float:
        """What this front has outstanding there, plus what the cloud's fresh report adds."""
        state = self._clouds[cloud]
        fresh = now_s - state.reported_at_s <= self.settings.report_ttl_s
        return self.ledger.load_tokens[cloud] + (state.foreign_tokens if fresh else 0.0)

    # ---- the back-offs ----------------------------------------------------------------
    def tick(self, now_s: float) -> None:
        """Measure each cloud's progress since the last tick and set its speed."""
        if self._last_tick_s is not None and now_s > self._last_tick_s:
            dt_s = now_s - self._last_tick_s
            alpha = 1.0 - math.exp(-dt_s / self.settings.window_s)
            for k, state in enumerate(self._clouds):
                running = max((state.running_at_tick + self._running(k)) / 2, 1.0)
                if state.done_tokens > 0:
                    state.stream_tokens_per_s = _ewma(state.stream_tokens_per_s,
                                                      state.done_tokens / (running * dt_s), alpha)
                    state.throughput_tokens_per_s = _ewma(state.throughput_tokens_per_s, state.done_tokens / dt_s,
                                                          alpha)
            self._set_speeds()
        self._last_tick_s = now_s
        for k, state in enumerate(self._clouds):
            state.done_tokens, state.running_at_tick = 0.0, self._running(k)

    def _running(self, cloud: int) -> int:
        return self._held[cloud] - len(self._clouds[cloud].waiting)

    def _set_speeds(self) -> None:
        best = max((c.stream_tokens_per_s or 0.0 for c in self._clouds), default=0.0)
        for state in self._clouds:
            rate = state.stream_tokens_per_s
            behind = rate is not None and best > 0 and rate < self.settings.below * best
            state.speed = max(self.settings.floor, rate / best) if behind and rate is not None else 1.0

    def offloads(self, now_s: float, idle: Collection[int] | None = None) -> list[Move]:
        """Requests not started on busy clouds that an idle cloud (of `idle`, or any) should
        take, each idle cloud in turn; the runtime moves them and calls `move`."""
        rates = self._rates_tokens_per_s()
        moves: list[Move] = []
        taken: set[str] = set()
        for k in range(self.n_clouds) if idle is None else idle:
            if not self.available(k, now_s) or self.load_tokens(k, now_s) >= 1.0 or rates[k] <= 0:
                continue
            busy = [self._cluster_load(j, rates[j], taken, now_s) for j in range(self.n_clouds)
                    if j != k and rates[j] > 0 and self._clouds[j].waiting]
            found = offload_to_idle(ClusterLoad(k, 0.0, [], rates[k]), busy, self.transfer)
            moves.extend(found)
            taken.update(m.request_id for m in found)
        return moves

    def _rates_tokens_per_s(self) -> list[float]:
        """Each cloud's measured throughput; one not measured yet gets the mean per unit of
        capacity of those that are (0 while none is)."""
        measured = [(c.throughput_tokens_per_s, self.capacity(k)) for k, c in enumerate(self._clouds)
                    if c.throughput_tokens_per_s]
        per_unit = sum(t for t, _ in measured) / sum(cap for _, cap in measured) if measured else 0.0
        return [c.throughput_tokens_per_s or per_unit * self.capacity(k) for k, c in enumerate(self._clouds)]

    def _cluster_load(self, cloud: int, rate: float, taken: set[str], now_s: float) -> ClusterLoad:
        """A busy cloud as app.offload sees it: its waiting requests behind the rest of its
        work (this front's and, from its report, other clients')."""
        waiting = [w for w in self._clouds[cloud].waiting.values() if w.request_id not in taken]
        running = self.load_tokens(cloud, now_s) - sum(w.cost_tokens for w in waiting)
        return ClusterLoad(cloud, max(running, 0.0), waiting, rate)

    def status(self, cloud: int, now_s: float) -> CloudStatus:
        state = self._clouds[cloud]
        return CloudStatus(self.ledger.load_tokens[cloud], state.foreign_tokens, self.capacity(cloud), state.speed,
                           state.stream_tokens_per_s, state.throughput_tokens_per_s, self.available(cloud, now_s),
                           len(state.waiting), self._running(cloud), state.dispatched_tokens)


def _ewma(previous: float | None, sample: float, alpha: float) -> float:
    return sample if previous is None else previous + alpha * (sample - previous)
