"""Client-side times of a streamed completion (wattwise/streamed_completion.py)."""

import pytest

from wattwise.streamed_completion import StreamedCompletion


def test_times_are_measured_from_the_send() -> None:
    done = StreamedCompletion(sent_s=10.0, first_token_s=10.25, last_token_s=12.25, completion_tokens=5)
    assert (done.ttft_s, done.e2e_s, done.mean_tbt_s) == pytest.approx((0.25, 2.25, 0.5))


def test_a_one_token_answer_has_no_gap_and_no_answer_has_no_times() -> None:
    one = StreamedCompletion(sent_s=1.0, first_token_s=1.5, last_token_s=1.5, completion_tokens=1)
    assert one.mean_tbt_s == 0.0  # as the simulator records it
    nothing = StreamedCompletion(sent_s=1.0)
    assert (nothing.ttft_s, nothing.e2e_s, nothing.mean_tbt_s) == (None, None, None)
