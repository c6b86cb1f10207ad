"""The warm-up's progress lines say how long is left, at the pace of the steps so far."""

from __future__ import annotations

from polar.tinymodel.warmup import progress


def test_the_time_left_is_the_mean_pace_times_the_steps_left() -> None:
    assert progress(20.0, 10, 60, early_stop=False) == "20 s, about 100 s left"


def test_a_loop_that_may_stop_early_says_at_most() -> None:
    assert progress(30.0, 3, 10, early_stop=True) == "30 s, at most about 70 s left"


def test_the_last_step_says_only_the_time_taken() -> None:
    assert progress(42.4, 60, 60, early_stop=False) == "42 s"
