"""Who owns each decision of the one controller: the table docs/one-controller.md shows.

One table, in code, so the docs cannot drift from it (tests/unit/autoscaling/test_ownership.py
renders it and compares). `core.plan_ownership.compose` enforces the plan-entry half of it at
run time: an entry written by two layers is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

# The policy's entries of `compose`, in the order it stacks them: each writes its own plan entries
# and may read an earlier one's (the shapes are sized on Chiron's and the catch-up's floors).
SLO_GUARD = "slo guard"
DYNAMOLLM_SHAPES = "dynamollm shapes"
DYNAMOLLM_FOLDING = "dynamollm folding"
CHIRON = "chiron"
CATCH_UP = "catch-up"
PLAN_LAYERS = (SLO_GUARD, CHIRON, CATCH_UP, DYNAMOLLM_SHAPES, DYNAMOLLM_FOLDING)


@dataclass(frozen=True)
class Decision:
    decision: str
    owner: str
    runs_in: str
    detail: str  # how the owner decides, for a reader of the code (not rendered in the docs)
    plan_layer: str = ""  # the policy's compose entry that writes it, where it is a plan entry


DECISIONS: tuple[Decision, ...] = (
    Decision(
        "replicas, TP and clock band of each length-class pool", "DynamoLLM's shape planner",
        "this policy, every `plan_interval_s`; TP only when the saving pays the restart",
        "PoolShapePlanner over the energy profile: every TP x clock x instance count, the least power, plus "
        "`held_gpu_w` (200 W) per GPU held in a steady pool, meeting the SLOs. The band's floor is the planned "
        "clock, or the least-power carrying clock for a steady pool without a batch backlog whose replicas "
        "pick each step's clock. TP changes on pool epochs, when the saving pays the restart.",
        plan_layer=DYNAMOLLM_SHAPES),
    Decision(
        "which pools serve (routing weights): at low load a pool folds into one serving longer inputs",
        "DynamoLLM's pool folding", "this policy, on pool epochs",
        "PoolFolding: the cheapest partition (the same power plus GPUs' worth) of the pools into neighbours; a "
        "short prompt's TTFT budget pays for one prefill of the longer classes it shares replicas with, or half "
        "a step where the replicas prefill by TTFT deadline; not while a pool warms up; a bursty pool does not "
        "newly fold; a class moves only once its new pool serves its planned shape (RouteHandover).",
        plan_layer=DYNAMOLLM_FOLDING),
    Decision(
        "which pool serves an interactive request while its own is backed up",
        "overflow between pools (Splitwise's join-the-shortest-queue, per pool)",
        "the ingress and the simulator's router",
        "app.pool_overflow: a replica with over `backed_up_tokens` (16,000) prompt tokens to prefill refuses a "
        "request that has another serving pool to try; one with under half of that takes it."),
    Decision(
        "which replica of a pool a request joins", "the routing rank: KV room, then prompt work ahead, then queue",
        "Serve's `kv_aware` router and the simulator's dispatch",
        "core.replica_choice ranks the replicas; deployments.kv_router applies it in Serve."),
    Decision(
        "how much capacity batch work gets", "Chiron: the batch mean, raised by Algorithm 2 for deadlines",
        "this policy, inside the planner's load",
        "Batch load planned at its mean over a long window, no burst margin; Algorithm 2 on the global queue's "
        "request groups raises it to the rate at which no group misses its deadline "
        "(`batch_rate_floor_per_s`, a floor under each class's planned batch load).",
        plan_layer=CHIRON),
    Decision(
        "how many batch requests are out at once", "Chiron (`batch_in_flight`)",
        "this policy; the Batch API queue follows it",
        "Algorithm 2's rate times the time one spends on a replica; never below the Batch API's max_in_flight.",
        plan_layer=CHIRON),
    Decision(
        "interactive before batch; batch preempted for interactive", "Chiron's mixed replicas",
        "each replica's batcher (`interactive_first`)",
        "Batch work is preempted when the batch limit, the KV or the admission chain keeps an interactive "
        "prompt out."),
    Decision(
        "admission, and each engine step's clock inside the band", "throttLL'eM",
        "each replica's batcher hooks; a vLLM replica runs the same chains after each step (admission at its "
        "gate, the clock on GPUs)",
        "batching.hook_chains; the clock also meets the TTFT of the prompts waiting to prefill."),
    Decision(
        "the tokens one step may prefill, and in which order",
        "the iteration layer (chunks sized to the TBT target, prompts by TTFT deadline)",
        "each replica's batcher; vLLM's scheduler subclass",
        "Sarathi-Serve's chunk sizing (batching.step_budget): chunks whose step fits the tightest TBT target at "
        "the clock the replica runs; prompts earliest TTFT deadline first, a late prompt behind those on time "
        "(batching.continuous_batcher; engines.vllm_deadline_scheduler on vLLM)."),
    Decision(
        "a request's length class and projected output", "Mico's predictor",
        "the ingress; the simulator's classifier",
        "Its measured overrun widens throttLL'eM's projections."),
    Decision(
        "the speed shapes are costed at", "DynamoLLM's planner, dilated by the step times replicas measure",
        "replicas time steps; this policy reads them",
        "A pool whose engines run f times slower is planned as the profile's at f times the load and 1/f of the "
        "SLOs; such a pool neither folds nor changes TP (batching.step_speed)."),
    Decision(
        "catch-up after a burst", "this policy: a floor on instances from the interactive backlog", "every plan",
        "`backlog_instances`: the waiting interactive requests over `overload_queue_per_replica` each; "
        "`late_ttft_s`: a mean TTFT over target earns one instance beyond the forecast. Floors the shapes "
        "read; while instances start, the band's floor is what the ready replicas need to carry the load.",
        plan_layer=CATCH_UP),
    Decision(
        "which classes it stops saving for", "the SLO guard", "this policy, every plan",
        "autoscaling.slo_guard: a class whose attainment over the replicas' trailing window fell below target, "
        "until it held the target for `recover_hold_s`; its pools get the top clock, `load_margin` more "
        "planned load at the TP they run, and no folding.",
        plan_layer=SLO_GUARD),
)


def markdown_table() -> str:
    """The table as docs/one-controller.md shows it."""
    lines = ["| decision | owner | where it runs |", "| --- | --- | --- |"]
    lines += [f"| {d.decision} | {d.owner} | {d.runs_in} |" for d in DECISIONS]
    return "\n".join(lines)
