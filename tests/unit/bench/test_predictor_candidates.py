"""The predictor bench's candidates: the decision rule between bucket distributions and the
per-label-source winners bench.predictor scores on test."""

import inspect

import numpy as np

from bench.predictor_candidates import CANDIDATES, WINNERS, decide


def test_the_median_splits_a_bimodal_distribution_where_the_mode_picks_a_side():
    proba = np.zeros((1, 10))
    proba[0, [0, 5, 9]] = [0.45, 0.15, 0.40]  # short, or runs to the cap
    assert decide(proba, argmax=0)[0] == 5  # the median: a length neither mode produces
    assert decide(proba, argmax=1)[0] == 0


def test_every_winner_names_a_candidate_and_parameters_it_takes():
    by_name = {c.name: c for c in CANDIDATES}
    for source, winners in WINNERS.items():
        for name, params in winners.items():
            assert name in by_name, (source, name)
            assert set(params) <= set(inspect.signature(by_name[name].predict).parameters), (source, name)
            assert set(params) <= set(by_name[name].grid), (source, name)  # a winner of the sweep, not a new value
            assert all(v in by_name[name].grid[k] for k, v in params.items()), (source, name)
