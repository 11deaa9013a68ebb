"""Splitwise's cluster-level scheduler (§IV-A) as one Serve replica per application.

The policy is the simulator's own SplitwiseScheduler. It lives in ONE replica so that
pending-token accounting and reservations stay consistent however many ingress
processes route requests: each asks it for a request's (prompt, token) replica pair.
It finds the phase pools' replicas by their Serve actor names and polls their pending
tokens (the replicas' record_routing_stats) every `report_period_s`; between polls its
reservations hold the tokens of work assigned but not yet landed on a replica.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter, defaultdict
from typing import Any

import ray
from ray import serve
from ray.exceptions import RayActorError
from ray.serve._private.common import REPLICA_ID_FULL_ID_STR_PREFIX

from app.splitwise_config import SplitwiseServeConfig
from autoscaling.splitwise.scheduler import MIXED, Placement, SplitwiseScheduler
from core.roles import Phase
from deployments.kv_handoff import await_ref

SERVE_NAMESPACE = "serve"


@serve.deployment(num_replicas=1, max_ongoing_requests=100_000, ray_actor_options={"num_cpus": 0.05})
class SplitwiseCoordinator:
    def __init__(self, phases: dict[str, str], settings: dict[str, Any]) -> None:
        self.phases = {deployment: Phase(phase) for deployment, phase in phases.items()}
        self.settings = SplitwiseServeConfig.model_validate(settings)
        self.scheduler = SplitwiseScheduler(self.settings.scheduling)
        self.app_name = serve.get_replica_context().app_name
        self._ids = itertools.count()
        self.known: dict[str, int] = {}  # Serve replica unique id -> scheduler id
        self.names: dict[int, tuple[str, str]] = {}  # scheduler id -> (deployment, unique id)
        self.actors: dict[str, Any] = {}  # unique id -> replica actor (not yet polled ones too)
        self.counts: Counter[str] = Counter()
        self.assigned_tokens: dict[str, Counter[str]] = defaultdict(Counter)  # phase -> replica -> tokens
        self._poller: asyncio.Task | None = None
        self._first_poll = asyncio.Event()

    # ---- replicas and their reports --------------------------------------------------
    def _live_replicas(self) -> dict[str, tuple[str, str]]:
        """unique id -> (deployment, actor name) of this app's phase replicas."""
        prefix = f"{REPLICA_ID_FULL_ID_STR_PREFIX}{self.app_name}#"
        found = {}
        for entry in ray.util.list_named_actors(all_namespaces=True):
            name = entry["name"] if isinstance(entry, dict) else entry
            if name.startswith(prefix):
                deployment, _, uid = name[len(prefix):].partition("#")
                if deployment in self.phases:
                    found[uid] = (deployment, name)
        return found

    async def _poll_once(self) -> None:
        live = await asyncio.to_thread(self._live_replicas)
        for uid in [u for u in self.actors if u not in live]:
            self.actors.pop(uid)
            self._forget(uid)
        for uid, (_, name) in live.items():
            if uid not in self.actors:
                try:
                    self.actors[uid] = ray.get_actor(name, namespace=SERVE_NAMESPACE)
                except ValueError:  # gone between the listing and now
                    continue
        uids = list(self.actors)
        stats = await asyncio.gather(
            *(asyncio.wait_for(await_ref(self.actors[u].record_routing_stats.remote()),
                               self.settings.report_period_s * 4)
              for u in uids), return_exceptions=True)
        for uid, reported in zip(uids, stats, strict=True):
            if isinstance(reported, RayActorError):  # dead (its node lost): no more work until it answers
                self._forget(uid)
                continue
            if not isinstance(reported, dict):
                continue  # starting, stopping or slow: counted once it answers
            if uid not in self.known:  # ready: it may be assigned work from now on
                rid = self.known[uid] = next(self._ids)
                deployment = live[uid][0]
                self.names[rid] = (deployment, uid)
                self.scheduler.add_replica(rid, self.phases[deployment])
            self.scheduler.ledger.report(self.known[uid], int(reported.get("pending_tokens", 0)))
        self.scheduler.rebalance(time.time())

    def _forget(self, uid: str) -> None:
        """Assign `uid` nothing until it answers a poll again (as a new scheduler replica)."""
        if uid in self.known:
            self.scheduler.remove_replica(self.known.pop(uid))

    async def _poll(self) -> None:
        while True:
            try:
                await self._poll_once()
            except Exception:  # a bad round must not end the polling
                self.counts["poll_errors"] += 1
            self._first_poll.set()
            await asyncio.sleep(self.settings.report_period_s)

    async def _ready(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self._poll())
        await self._first_poll.wait()

    async def check_health(self) -> None:
        await self._ready()

    # ---- the request path ----------------------------------------------------------
    def _describe(self, placement: Placement, phase: Phase, tokens: int) -> dict[str, Any]:
        deployment, uid = self.names[placement.replica_id]
        role = self.scheduler.role[placement.replica_id]
        self.counts[f"{phase.value}_on_{role.value}"] += 1
        self.assigned_tokens[phase.value][uid] += tokens
        return {"id": placement.replica_id, "ticket": placement.ticket, "deployment": deployment,
                "replica": uid, "role": role.value}

    async def assign(self, prompt_tokens: int, output_tokens: int) -> dict[str, Any] | None:
        """The (prompt, token) replica pair of a request, with its reservations; None
        while no replica of a phase is ready."""
        await self._ready()
        try:
            a = self.scheduler.assign(prompt_tokens, output_tokens, time.time())
        except RuntimeError:
            self.counts["unplaceable"] += 1
            return None
        if not self.settings.reservations:  # only reported load counts (herding baseline)
            self.scheduler.ledger.land(a.prompt.ticket)
            self.scheduler.ledger.land(a.token.ticket)
        self.counts["assigned"] += 1
        return {"prompt": self._describe(a.prompt, Phase.PROMPT, prompt_tokens),
                "token": self._describe(a.token, Phase.TOKEN, output_tokens)}

    def landed(self, ticket: int) -> None:
        """The work of a reservation reached its replica: its reports count it now."""
        self.scheduler.ledger.land(ticket)

    def finished(self, replica_id: int, phase: str, ticket: int, outcome: str | None = None) -> None:
        """A phase completed (or will never run) on the replica it was assigned to."""
        self.scheduler.ledger.land(ticket)
        self.scheduler.finished(replica_id, Phase(phase))
        if outcome:
            self.counts[outcome] += 1

    def unreachable(self, replica_id: int) -> None:
        """A phase could not reach its replica (lost with its machine, or not placing work):
        assign it nothing more until it answers a poll again."""
        self.counts["unreachable"] += 1
        _, uid = self.names[replica_id]
        if self.known.get(uid) == replica_id:  # not since re-added under a new id
            self._forget(uid)

    def count(self, event: str, n: int = 1) -> None:
        self.counts[event] += n

    def stats(self) -> dict[str, Any]:
        """Counters, roles and per-replica load (tests, the herding bench, dashboards)."""
        s = self.scheduler
        return {
            "counts": dict(self.counts),
            "roles": {self.names[r][1]: role.value for r, role in s.role.items()},
            "homes": {self.names[r][1]: home.value for r, home in s.home.items()},
            "deployments": {self.names[r][1]: self.names[r][0] for r in s.role},
            "pending_tokens": {self.names[r][1]: s.ledger.pending_tokens(r) for r in s.role},
            "assigned_tokens": {phase: dict(c) for phase, c in self.assigned_tokens.items()},
            "pulled_into_mixed": s.pulled_into_mixed,
            "repurposed": s.repurposed,
            "mixed_now": sum(1 for role in s.role.values() if role is MIXED),
        }

    def reset_stats(self) -> None:
        self.counts.clear()
        self.assigned_tokens.clear()
