"""The backoff of a wait for a lost database (``cronlock.outage``): doubling, capped, jittered
into the upper half of each interval, and a policy that refuses nonsense."""

from __future__ import annotations

import random

import pytest

from cronlock import Reconnect


def test_the_delays_double_up_to_the_cap_each_in_its_upper_half() -> None:
    policy = Reconnect(first_delay=0.1, max_delay=1.5)
    rng = random.Random(7)
    ceilings = [0.1, 0.2, 0.4, 0.8, 1.5, 1.5, 1.5]
    for attempt, ceiling in enumerate(ceilings, start=1):
        delays = [policy.delay(attempt, rng) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays), attempt
        assert max(delays) - min(delays) > ceiling / 4  # jittered, not one value


def test_a_huge_attempt_number_stays_at_the_cap() -> None:
    assert Reconnect(max_delay=2.0).delay(10_000, random.Random(1)) <= 2.0


@pytest.mark.parametrize(
    "options",
    [
        {"first_delay": 0},
        {"first_delay": 2.0, "max_delay": 1.0},
        {"give_up_after": -1},
    ],
)
def test_a_policy_that_cannot_work_is_refused(options: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Reconnect(**options)
