"""Cron expressions as cron reads them, and the slot a moment belongs to."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
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


@pytest.mark.parametrize(
    ("expression", "days"),
    [
        # A day field starting with '*' makes cron AND the two: odd days that are weekdays.
        ("0 12 */2 * 1-5", ["11-03", "11-05", "11-09", "11-11", "11-13"]),
        ("0 12 1-31/2 * 1-5", ["11-01", "11-02", "11-03", "11-04", "11-05"]),  # OR
        ("0 12 */10 * sun", ["11-01", "01-31", "02-21", "03-21", "04-11"]),  # AND
        ("0 12 *,11 * sun", ["11-01", "11-08", "11-15", "11-22", "11-29"]),  # '*' first: AND
        ("0 12 11,* * sun", ["11-01", "11-02", "11-03", "11-04", "11-05"]),  # no '*' first: OR
    ],
)
def test_the_day_rule_is_debians(expression: str, days: list[str]) -> None:
    fires = islice(CronSchedule.parse(expression).fire_times(at(2026, 10, 31, 23)), len(days))
    assert [f.strftime("%m-%d") for f in fires] == days


@pytest.mark.parametrize(
    ("expression", "minutes"),
    [
        ("20-21/3 * * * *", [20]),  # a step larger than its range: the first value
        ("*/100 * * * *", [0]),
        ("0-59/25 * * * *", [0, 25, 50]),
        ("07,5-6 * * * *", [5, 6, 7]),
        ("*/20,45 * * * *", [0, 20, 40, 45]),
    ],
)
def test_what_cron_accepts_is_accepted(expression: str, minutes: list[int]) -> None:
    schedule = CronSchedule.parse(expression)
    fires = islice(schedule.fire_times(at(2026, 11, 29, 10) - timedelta(microseconds=1)), 8)
    assert sorted({f.minute for f in fires if f.hour == 10}) == minutes


@pytest.mark.parametrize(
    ("expression", "first"),
    [
        ("0 0 * jan-MAR/2 *", "2027-01-01"),
        ("0 0 * * Sat-sat", "2026-12-05"),
        ("0 0 * * 5-7", "2026-12-04"),  # 7 is Sunday too
        ("0 0 * * */4", "2026-12-03"),  # 0 and 4 of cron's 0-7: Sunday and Thursday
        ("0 0 * feb-feb/5 *", "2027-02-01"),
        ("@weekly", "2026-12-06"),
        ("@monthly", "2026-12-01"),
        ("@annually", "2027-01-01"),
        ("@midnight", "2026-12-01"),
    ],
)
def test_names_and_aliases(expression: str, first: str) -> None:
    fire = CronSchedule.parse(expression).next_fire_time(at(2026, 11, 30, 0, 1))
    assert fire is not None and fire.date().isoformat() == first


def test_timezone_is_applied_and_slots_are_utc() -> None:
    madrid = CronSchedule.parse("30 2 * * *", "Europe/Madrid")
    slot = madrid.slot_at(at(2026, 11, 29, 12))
    assert slot == at(2026, 11, 29, 1, 30)
    assert slot is not None and slot.tzinfo is UTC


def test_fixed_time_is_debians_reading() -> None:
    assert CronSchedule.parse("30 2 * * *").fixed_time
    assert CronSchedule.parse("0-59/15 1-3 * * *").fixed_time
    assert CronSchedule.parse("@daily").fixed_time
    assert not CronSchedule.parse("*/15 2 * * *").fixed_time
    assert not CronSchedule.parse("0 * * * *").fixed_time
    assert not CronSchedule.parse("@hourly").fixed_time


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        # What cron refuses.
        ("61 * * * *", "minute 61 is out of range 0-59"),
        ("* 24 * * *", "hour 24 is out of range 0-23"),
        ("0 0 0 * *", "day-of-month 0 is out of range 1-31"),
        ("0 0 * 13 *", "month 13 is out of range 1-12"),
        ("0 0 * * 8", "day-of-week 8 is out of range 0-7"),
        ("* * *", "expected 5 fields"),
        ("not a cron", "expected 5 fields"),
        ("*/0 * * * *", "step must be at least 1"),
        ("5/10 * * * *", "a step needs a range: write 5-59/10"),
        ("1,,2 * * * *", "empty minute value"),
        ("? * * * *", "'?' is not a minute"),
        ("0 0 L * *", "'L' is not a day-of-month"),
        ("0 0 * * sunday", "unknown day-of-week name 'sunday'"),
        ("0 0 * * jan", "unknown day-of-week name 'jan'"),
        ("*/x * * * *", "step 'x' in '*/x' is not a number"),
        ("@HOURLY", "cron reads only @hourly"),
        ("@often", "unknown @-name"),
        # What has no slot meaning, or that cron reads otherwise than it looks.
        ("@reboot", "@reboot runs once at boot and has no slots"),
        ("0 0 * * * *", "got 6: cron has no seconds or year field"),
        ("0 0 30 2 *", "never fires"),
        ("5-1 * * * *", "range '5-1' goes backwards"),
        ("0 0 * * mon-sun", "Sunday is 0: write mon-sat,sun or 1-7"),
        ("1-5-7 * * * *", "has two dashes"),
        ("*5 * * * *", "'*' takes only a step"),
    ],
)
def test_invalid_expressions_are_clear_errors(expression: str, message: str) -> None:
    with pytest.raises(InvalidCron, match=re.escape(message)) as error:
        CronSchedule.parse(expression)
    assert expression in str(error.value)
    assert "\n" not in str(error.value)


def test_unknown_timezone() -> None:
    with pytest.raises(InvalidCron, match="unknown timezone 'Mars/Olympus'"):
        CronSchedule.parse("* * * * *", "Mars/Olympus")


def test_invocation_slot_is_the_slot_within_early_and_grace() -> None:
    every_15 = CronSchedule.parse("*/15 * * * *")
    early, grace = timedelta(seconds=5), timedelta(seconds=60)
    slot = every_15.invocation_slot
    assert slot(at(2026, 11, 29, 10, 15, 2), early=early, grace=grace) == at(2026, 11, 29, 10, 15)
    assert slot(at(2026, 11, 29, 10, 14, 58), early=early, grace=grace) == at(2026, 11, 29, 10, 15)
    assert slot(at(2026, 11, 29, 10, 16, 30), early=early, grace=grace) is None
