"""Cron expressions as cron reads them, and the slot a moment belongs to."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import islice

import pytest

from cronlock import CronSchedule, InvalidCron


def at(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[arg-type,misc]


def test_slot_is_the_latest_fire_time_at_or_before() -> None:
    every_15 = CronSchedule.parse("*/15 * * * *")
    assert every_15.slot_at(at(2026, 11, 29, 10, 15, 2)) == at(2026, 11, 29, 10, 15)
    assert every_15.slot_at(at(2026, 11, 29, 10, 15)) == at(2026, 11, 29, 10, 15)
    assert every_15.slot_at(at(2026, 11, 29, 10, 14, 59)) == at(2026, 11, 29, 10, 0)


def test_slot_of_a_rare_schedule_is_found() -> None:
    leap_day = CronSchedule.parse("0 12 29 2 *")
    assert leap_day.slot_at(at(2026, 11, 29)) == at(2024, 2, 29, 12)
    yearly = CronSchedule.parse("@yearly")
    assert yearly.slot_at(at(2026, 11, 29)) == at(2026, 1, 1)


@pytest.mark.parametrize(
    ("weekday", "expected"),
    [("0", "Sunday"), ("7", "Sunday"), ("1", "Monday"), ("sun", "Sunday"), ("6", "Saturday")],
)
def test_day_of_week_numbers_follow_cron(weekday: str, expected: str) -> None:
    # APScheduler 3 alone would read 0 as Monday.
    schedule = CronSchedule.parse(f"0 0 * * {weekday}")
    fire = schedule.next_fire_time(at(2026, 11, 25))  # a Wednesday
    assert fire is not None
    assert fire.strftime("%A") == expected


def test_weekday_ranges_and_steps() -> None:
    workdays = CronSchedule.parse("0 9 * * 1-5")
    fires = [f.strftime("%a") for f in islice(workdays.fire_times(at(2026, 11, 28)), 5)]
    assert fires == ["Mon", "Tue", "Wed", "Thu", "Fri"]
    every_other = CronSchedule.parse("0 9 * * */2")  # cron: Sun, Tue, Thu, Sat (28th: a Sat)
    fires = [f.strftime("%a") for f in islice(every_other.fire_times(at(2026, 11, 28)), 4)]
    assert fires == ["Sat", "Sun", "Tue", "Thu"]


def test_day_of_month_or_day_of_week() -> None:
    # cron fires when either restricted field matches; APScheduler alone needs both.
    schedule = CronSchedule.parse("0 0 1 * mon")
    fires = [f.date().isoformat() for f in islice(schedule.fire_times(at(2026, 11, 28)), 3)]
    assert fires == ["2026-11-30", "2026-12-01", "2026-12-07"]


def test_timezone_is_applied_and_slots_are_utc() -> None:
    madrid = CronSchedule.parse("30 2 * * *", "Europe/Madrid")
    slot = madrid.slot_at(at(2026, 11, 29, 12))
    assert slot == at(2026, 11, 29, 1, 30)
    assert slot is not None and slot.tzinfo is UTC


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("61 * * * *", "higher than the maximum"),
        ("* * *", "expected 5 fields"),
        ("*/0 * * * *", "Increment must be higher than 0"),
        ("0 0 30 2 *", "never fires"),
        ("0 0 * * 8", "out of 0-7"),
        ("not a cron", "expected 5 fields"),
    ],
)
def test_invalid_expressions_are_clear_errors(expression: str, message: str) -> None:
    with pytest.raises(InvalidCron, match=message) as error:
        CronSchedule.parse(expression)
    assert expression in str(error.value)
    assert "\n" not in str(error.value)


def test_unknown_timezone() -> None:
    with pytest.raises(InvalidCron, match="unknown timezone 'Mars/Olympus'"):
        CronSchedule.parse("* * * * *", "Mars/Olympus")
