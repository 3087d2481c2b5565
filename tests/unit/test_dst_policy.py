"""Daylight-saving time, as README's "Timezones and daylight-saving time" documents it.

The rules are Debian cron's: a fixed-time job (neither minute nor hour starts with '*') fires
a missing wall time once at the jump and a repeated one once; a wildcard job skips a missing
wall time and fires a repeated one twice. Each case is also run through a simulation of
Debian's cron loop (tests/support/debiancron.py): every start it makes maps to a slot, and
the slots are cronlock's fire times.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from crondiff import check_loop
from dstoracle import FIELDS, TRANSITIONS
from dstoracle import expected as oracle

from cronlock import CronSchedule

EARLY, GRACE = timedelta(seconds=5), timedelta(seconds=60)


def expected(zone: ZoneInfo, expression: str, day: date) -> list[datetime]:
    return oracle(zone, expression, day - timedelta(days=1), 3)


def window(zone: ZoneInfo, day: date) -> tuple[datetime, datetime]:
    start = datetime.combine(day - timedelta(days=1), datetime.min.time(), zone)
    end = datetime.combine(day + timedelta(days=2), datetime.min.time(), zone)
    return start.astimezone(UTC), end.astimezone(UTC)


def fired(schedule: CronSchedule, zone: ZoneInfo, day: date) -> list[datetime]:
    start, end = window(zone, day)
    out = []
    for moment in schedule.fire_times(start - timedelta(microseconds=1)):
        if moment >= end:
            break
        out.append(moment)
    return out


CASES = [
    (zone, day, kind, expression)
    for zone, spring, fall in TRANSITIONS
    for day, kind in ((spring, "spring"), (fall, "fall"))
    for expression in FIELDS
]


@pytest.mark.parametrize(("zone_name", "day", "kind", "expression"), CASES)
def test_fire_times_follow_the_documented_policy(
    zone_name: str, day: date, kind: str, expression: str
) -> None:
    zone = ZoneInfo(zone_name)
    schedule = CronSchedule.parse(expression, zone_name)
    times = fired(schedule, zone, day)
    assert times == expected(zone, expression, day)
    assert len(times) == len(set(times))  # zero duplicates
    for moment in times:  # the slot computation agrees with the fire times
        assert schedule.slot_at(moment) == moment
        assert schedule.slot_at(moment + timedelta(seconds=1)) == moment
        assert schedule.invocation_slot(moment + timedelta(seconds=1), early=EARLY, grace=GRACE)


@pytest.mark.parametrize(("zone_name", "day", "kind", "expression"), CASES)
@pytest.mark.parametrize("busy", [False, True], ids=["quiet-host", "busy-host"])
def test_debians_loop_fires_the_same_slots(
    zone_name: str, day: date, kind: str, expression: str, busy: bool
) -> None:
    start, end = window(ZoneInfo(zone_name), day)
    assert check_loop(expression, zone_name, start, end, busy=busy) == []


def local(moment: datetime, zone: str) -> str:
    return moment.astimezone(ZoneInfo(zone)).strftime("%H:%M%z")


def on_day(schedule: CronSchedule, zone: str, day: date) -> list[str]:
    return [
        local(t, zone)
        for t in fired(schedule, ZoneInfo(zone), day)
        if t.astimezone(ZoneInfo(zone)).date() == day
    ]


def test_fixed_time_examples() -> None:
    """The README's examples, spelled out."""
    madrid = CronSchedule.parse("30 2 * * *", "Europe/Madrid")
    assert on_day(madrid, "Europe/Madrid", date(2026, 3, 29)) == ["03:00+0200"]  # at the jump
    assert on_day(madrid, "Europe/Madrid", date(2026, 10, 25)) == ["02:30+0200"]  # once, first
    both = CronSchedule.parse("0,30 2 * * *", "Europe/Madrid")
    assert on_day(both, "Europe/Madrid", date(2026, 3, 29)) == ["03:00+0200"]  # one slot
    new_york = CronSchedule.parse("30 2 * * *", "America/New_York")
    assert on_day(new_york, "America/New_York", date(2026, 3, 8)) == ["03:00-0400"]
    assert on_day(new_york, "America/New_York", date(2026, 11, 1)) == ["02:30-0500"]
    lord_howe = CronSchedule.parse("30 2 * * *", "Australia/Lord_Howe")
    # Clocks jump 02:00 -> 02:30 there: 02:30 exists.
    assert on_day(lord_howe, "Australia/Lord_Howe", date(2026, 10, 4)) == ["02:30+1100"]
    lord_howe_0200 = CronSchedule.parse("0 2 * * *", "Australia/Lord_Howe")
    assert on_day(lord_howe_0200, "Australia/Lord_Howe", date(2026, 10, 4)) == ["02:30+1100"]


def test_wildcard_counts_on_transition_days() -> None:
    madrid = CronSchedule.parse("*/30 * * * *", "Europe/Madrid")
    spring = on_day(madrid, "Europe/Madrid", date(2026, 3, 29))
    assert len(spring) == 46  # a 23-hour day: the missing 02:00 and 02:30 do not fire
    assert "03:00+0200" in spring
    fall = on_day(madrid, "Europe/Madrid", date(2026, 10, 25))
    assert len(fall) == 50  # a 25-hour day: the repeated 02:00 and 02:30 fire twice
    assert fall.count("02:30+0200") == 1 and fall.count("02:30+0100") == 1
    lord_howe = CronSchedule.parse("*/30 * * * *", "Australia/Lord_Howe")
    assert len(on_day(lord_howe, "Australia/Lord_Howe", date(2026, 10, 4))) == 47
    back = on_day(lord_howe, "Australia/Lord_Howe", date(2026, 4, 5))
    assert back.count("01:30+1100") == 1 and back.count("01:30+1030") == 1
    hourly = CronSchedule.parse("0 * * * *", "Australia/Lord_Howe")
    # 02:00 does not exist on 2026-10-04 there, and an hourly job is a wildcard one.
    assert len(on_day(hourly, "Australia/Lord_Howe", date(2026, 10, 4))) == 23


def test_catch_up_after_the_jump_keeps_its_slot() -> None:
    """cron starts the skipped minutes' fixed-time jobs 10 s apart: late, still the slot."""
    madrid = CronSchedule.parse("0-59/5 2,3 * * *", "Europe/Madrid")
    jump = datetime(2026, 3, 29, 1, tzinfo=UTC)  # 02:00 CET -> 03:00 CEST
    assert madrid.slot_at(jump + timedelta(seconds=1)) == jump
    late = jump + timedelta(minutes=9)  # past the grace, within cron's catch-up
    assert madrid.invocation_slot(late, early=EARLY, grace=GRACE) == jump + timedelta(minutes=5)
    assert (
        madrid.invocation_slot(jump + timedelta(minutes=3), early=EARLY, grace=GRACE) == jump
    )  # 03:03 is no fire time: still the jump's slot
    nowhere = jump + timedelta(minutes=30, seconds=90)
    assert madrid.invocation_slot(nowhere, early=EARLY, grace=GRACE) is None


def test_a_wall_clock_cron_in_the_repeated_hour_belongs_to_the_first_occurrence() -> None:
    """cronie with CRON_TZ fires a fixed-time job at both 02:30s: the second is that slot."""
    madrid = CronSchedule.parse("30 2 * * *", "Europe/Madrid")
    first = datetime(2026, 10, 25, 0, 30, tzinfo=UTC)  # 02:30 CEST
    second = datetime(2026, 10, 25, 1, 30, 2, tzinfo=UTC)  # 02:30 CET
    assert madrid.invocation_slot(second, early=EARLY, grace=GRACE) == first


def test_a_run_started_by_crons_catch_up_belongs_to_the_jumps_slot() -> None:
    """The run path maps invocations with the schedule's rule: cron starting a skipped hour's
    sixty fixed-time minutes 10 s apart reaches `cronlock run` ten minutes after the jump,
    past the 60 s grace, and that is still the jump's slot, never `no_slot`."""
    from cronlock import App
    from cronlock.periodic import resolve_slot

    app = App()

    @app.periodic("each-minute-of-two", cron="0-59 2 * * *", timezone="Europe/Madrid")
    async def body(run: object) -> None:
        return None

    task = app.task("each-minute-of-two")
    jump = datetime(2026, 3, 29, 1, tzinfo=UTC)  # 02:00 CET -> 03:00 CEST
    assert resolve_slot(task, jump + timedelta(minutes=10)) == jump
    assert resolve_slot(task, jump + timedelta(minutes=30)) is None
