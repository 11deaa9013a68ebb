"""Splitwise under the loss of machines (issue 18 item 1): one of the prompt pool's two
replicas (each on a machine of its own) lost while its KV is being handed off, then both
(the whole prompt pool: its requests run whole on the token replicas), on a local
multi-node Ray cluster running serve_config.splitwise.yaml (tests/ray/test_node_loss.py has the cluster and the
accounting; this cluster is another module's so that the two never run at once).

Run with `-s` to see the table:
    flock /tmp/ray.lock env RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 \
        .venv/bin/python -m pytest -s tests/ray/test_splitwise_node_loss.py
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.ray.test_node_loss import LiveCluster, _live, _lose

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def live() -> Iterator[LiveCluster]:
    yield from _live(splitwise=True)


def test_losing_a_splitwise_prompt_replica_mid_hand_off_loses_no_stream(live: LiveCluster) -> None:
    # The burst's prompts are prefilled together; at the first token their KV (~20 MB each)
    # is on its way to the token replicas, and the prompt replica's machine dies (the object
    # store's copy with it): a token replica still fetching recomputes the prompt.
    result = _lose(live, "prompt-replica", "pool-prompt", at_first_token=True)
    assert result.accepted > 0 and result.completed == result.accepted  # none lost, none ended in an error


def test_losing_the_whole_prompt_pool_runs_its_requests_on_the_token_replicas(live: LiveCluster) -> None:
    # No prompt replica is left until the replacement machines join (after the streams):
    # prompts waiting for one, or lost with it, run whole on their token replica, and new
    # requests go to a token replica borrowed into the mixed pool (nothing waits for a machine).
    result = _lose(live, "prompt-pool", "pool-prompt", at_first_token=True, every=True)
    assert result.accepted > 0 and result.completed == result.accepted  # none refused: the token pool ran them
