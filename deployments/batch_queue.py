"""The global batch queue (Chiron §5.3) as a Serve deployment over the durable BatchStore.

One replica owns the SQLite file. It feeds pending requests, earliest deadline first,
to the ingress's batch path (which picks batch replicas, else mixed ones) with a bounded
number in flight, records each result, and reports the queue's request groups as
autoscaling metrics for Chiron's global autoscaler. The bound is the configured
`max_in_flight`, or more while the controller's plan says the queue's deadlines need it
(the one controller's Chiron layer, `ClusterPlan.batch_in_flight`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ray import serve

from app.batch_deferral import DeferralConfig, DeferralPlanner
from app.batch_store import BatchInputError, BatchStore, PendingRequest
from app.grid_signal import HourlyGridSignal
from autoscaling.chiron.batch_queue import OutputLengthStats, QueuedBatchRequest
from autoscaling.chiron.queue_summary import summarise_queue
from core.plan import ClusterPlan
from deployments.plan_store import follow_plan

logger = logging.getLogger("ray.serve")
CHARS_PER_TOKEN = 4  # a job line's prompt, counted roughly: what the deferral's slot budget needs


def job_line_tokens(body: dict[str, Any]) -> float:
    """A Batch API line's prompt and output budget in tokens, roughly."""
    prompt = body.get("prompt") or " ".join(str(m.get("content") or "") for m in body.get("messages") or []
                                            if isinstance(m, dict))
    output = body.get("max_tokens") or body.get("max_completion_tokens") or 256
    return len(str(prompt)) / CHARS_PER_TOKEN + float(output)


@serve.deployment
class BatchQueue:
    def __init__(self, db_path: str, ingress_name: str = "Ingress", max_in_flight: int = 32,
                 poll_s: float = 0.5, deferral: dict[str, Any] | None = None) -> None:
        self.store = BatchStore(db_path)
        config = DeferralConfig.model_validate(deferral or {})
        self.region = config.region
        # Deferral into cleaner (or cheaper) hours: when each job's lines are released.
        self.deferral = DeferralPlanner.of(config, HourlyGridSignal.from_config(config.grid)) if config.enabled \
            else None
        self.ingress_name = ingress_name
        self.in_flight_floor = max_in_flight  # the configured bound
        self.max_in_flight = max_in_flight  # the bound now: the floor, or the plan's if higher
        self.poll_s = poll_s
        self.lengths = OutputLengthStats()
        self._in_flight: set[tuple[str, int]] = set()
        self._worker: asyncio.Task | None = None
        self._follower: asyncio.Task | None = None

    # ---- the API the ingress forwards ----------------------------------------------
    def add_file(self, content: bytes, filename: str, purpose: str) -> dict[str, Any]:
        return self.store.add_file(content, filename, purpose, time.time())

    def file(self, file_id: str) -> dict[str, Any] | None:
        return self.store.file(file_id)

    def file_content(self, file_id: str) -> bytes | None:
        return self.store.file_content(file_id)

    def create_batch(self, input_file_id: str, endpoint: str, completion_window: str) -> dict[str, Any]:
        self._ensure_worker()
        try:
            return self.store.create_batch(input_file_id, endpoint, completion_window, time.time(),
                                           None if self.deferral is None else self._release)
        except BatchInputError as exc:
            return {"error": str(exc)}

    def _release(self, lines: list[tuple[str, dict[str, Any]]], deadline_s: float) -> float:
        """When a new job's lines go out: the cleanest slot its deadline leaves room for."""
        assert self.deferral is not None  # only called with deferral on
        now = time.time()
        self.deferral.forget_before(self.deferral.signal.slot_of(now))
        cost = sum(job_line_tokens(body) for _, body in lines)
        placement = self.deferral.place(now, deadline_s, cost, [self.region])
        if placement.release_s > now:
            logger.info("batch job of %d lines deferred %.0f s to slot %d (%s)", len(lines), placement.release_s - now,
                        placement.slot, self.deferral.objective)
        return placement.release_s

    def batch(self, batch_id: str) -> dict[str, Any] | None:
        self._ensure_worker()
        return self.store.batch(batch_id)

    # ---- the worker ----------------------------------------------------------------
    def _ensure_worker(self) -> None:
        """Start the worker and the plan follower (Serve's first health check does, on the
        replica's loop: the sync API methods run in threads and find both running)."""
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._work())
        if self._follower is None or self._follower.done():
            app_name = serve.get_replica_context().app_name
            self._follower = asyncio.get_running_loop().create_task(follow_plan(app_name, self.apply_plan))

    def apply_plan(self, plan: ClusterPlan) -> None:
        """The controller's bound on requests out at once, never below the configured one."""
        self.max_in_flight = plan.queue_in_flight(self.in_flight_floor)

    async def check_health(self) -> None:
        """Serve calls this every few seconds: it also restarts the worker after a restart."""
        self._ensure_worker()

    async def _work(self) -> None:
        ingress = serve.get_deployment_handle(self.ingress_name, serve.get_replica_context().app_name)
        while True:
            room = self.max_in_flight - len(self._in_flight)
            for req in self.store.pending(time.time(), limit=room) if room > 0 else []:
                self._in_flight.add((req.batch_id, req.line))
                self.store.mark_running(req)
                asyncio.get_running_loop().create_task(self._run(ingress, req))
            await asyncio.sleep(self.poll_s)

    async def _run(self, ingress: Any, req: PendingRequest) -> None:
        try:
            ok, response = await ingress.run_batch_request.remote(req.body, req.deadline_s)
        except Exception as exc:  # recorded as the request's error; the batch still completes
            logger.exception("batch request %s/%s failed", req.batch_id, req.custom_id)
            ok, response = False, {"message": f"{type(exc).__name__}: {exc}", "type": "server_error"}
        if ok:
            self.lengths.observe(response.get("usage", {}).get("completion_tokens", 0))
        self.store.finish(req, response, ok, time.time())
        self._in_flight.discard((req.batch_id, req.line))

    def record_autoscaling_stats(self) -> dict[str, float]:
        queue = [QueuedBatchRequest(p.enqueued_s, p.deadline_s) for p in self.store.pending(time.time())]
        return summarise_queue(queue, self.lengths)
