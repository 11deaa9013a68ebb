"""The KV budget: the share of a replica's KV cache its work may fill, one value for all who ask.

A replica is not full at its last KV block. throttLL'eM's admission reserves each request's
projected peak, so a replica loaded to the block turns prompts away at the door while its
decodes finish; at the low clocks the deadlines allow, requests stay longer and fill it
sooner. So every layer of the one controller reads the same share:

- DynamoLLM's planner sizes a pool so that its steady batch fills at most this much
  (`ShapePlannerConfig.kv_budget`);
- throttLL'eM's clock runs flat out once interactive requests hold more
  (`ThrottllemConfig.kv_budget`), and its autoscaler sizes engines to it;
- the routing rank prefers a replica where the prompt still fits within it
  (`core.replica_choice`).

`wattwise serve` refuses a `policy: wattwise` app whose pools' throttLL'eM budget differs from
its planner's (`app.controller_layers`). Baselines and the oracle keep the physical bound (1.0).
Splitwise's token machines have their own (`token_kv_budget`, 0.95: its paper's §IV-B).

0.8 was chosen over 0.85 and 0.9 on the first halves of conv, code, the batch mix and the job
and on the day with seed 0 (`58e7cd5`), and checked on the day with seed 1 (the tuning log,
docs/results/2026-12-05-tuning-log.md).
"""

KV_BUDGET = 0.8
