"""Daylight-saving time, as README's "Scheduling" documents it, for 02:30 daily and */30.

Spring forward: a wall time that does not exist fires once, read with the offset before the
jump (02:30 in a 02:00 -> 03:00 gap fires at 03:30 new time); where that is a slot anyway the
two are one slot. Fall back: a repeated wall time fires once, at its first occurrence.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from dstoracle import TRANSITIONS
from dstoracle import expected as oracle

from cronlock import CronSchedule


def expected(zone: ZoneInfo, expression: str, day: date) -> list[datetime]:
    return oracle(zone, expression, day - timedelta(days=1), 3)


def fired(schedule: CronSchedule, zone: ZoneInfo, day: date) -> list[datetime]:
    start = datetime.combine(day - timedelta(days=1), datetime.min.time(), zone)
    end = datetime.combine(day + timedelta(days=2), datetime.min.time(), zone)
    out = []
    for moment in schedule.fire_times(start.astimezone(UTC) - timedelta(microseconds=1)):
        if moment >= end:
            break
        out.append(moment)
    return out


CASES = [
    (zone, day, kind, expression)
    for zone, spring, fall in TRANSITIONS
    for day, kind in ((spring, "spring"), (fall, "fall"))
    for expression in ("30 2 * * *", "*/30 * * * *", "0 * * * *")
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


def local(moment: datetime, zone: str) -> str:
    return moment.astimezone(ZoneInfo(zone)).strftime("%H:%M%z")


def on_day(schedule: CronSchedule, zone: str, day: date) -> list[str]:
    return [
        local(t, zone)
        for t in fired(schedule, ZoneInfo(zone), day)
        if t.astimezone(ZoneInfo(zone)).date() == day
    ]


def test_daily_0230_examples() -> None:
    """The README's examples, spelled out."""
    madrid = CronSchedule.parse("30 2 * * *", "Europe/Madrid")
    assert on_day(madrid, "Europe/Madrid", date(2026, 3, 29)) == ["03:30+0200"]  # 02:30 missing
    assert on_day(madrid, "Europe/Madrid", date(2026, 10, 25)) == ["02:30+0200"]  # once, first
    new_york = CronSchedule.parse("30 2 * * *", "America/New_York")
    assert on_day(new_york, "America/New_York", date(2026, 3, 8)) == ["03:30-0400"]
    assert on_day(new_york, "America/New_York", date(2026, 11, 1)) == ["02:30-0500"]
    lord_howe = CronSchedule.parse("30 2 * * *", "Australia/Lord_Howe")
    # Clocks jump 02:00 -> 02:30 there: 02:30 exists.
    assert on_day(lord_howe, "Australia/Lord_Howe", date(2026, 10, 4)) == ["02:30+1100"]


def test_half_hourly_counts_on_transition_days() -> None:
    madrid = CronSchedule.parse("*/30 * * * *", "Europe/Madrid")
    spring = on_day(madrid, "Europe/Madrid", date(2026, 3, 29))
    assert len(spring) == 46  # a 23-hour day: 02:00 and 02:30 are the 03:00 and 03:30 slots
    fall = on_day(madrid, "Europe/Madrid", date(2026, 10, 25))
    assert len(fall) == 48  # a 25-hour day: the repeated 02:00 and 02:30 fire once each
    assert fall.count("02:30+0200") == 1 and "02:30+0100" not in fall
    lord_howe = CronSchedule.parse("*/30 * * * *", "Australia/Lord_Howe")
    assert len(on_day(lord_howe, "Australia/Lord_Howe", date(2026, 10, 4))) == 47
    back = on_day(lord_howe, "Australia/Lord_Howe", date(2026, 4, 5))
    assert back.count("01:30+1100") == 1 and "01:30+1030" not in back


def test_missing_wall_time_apscheduler_alone_never_fires() -> None:
    """APScheduler 3's zone-aware CronTrigger skips Lord Howe's missing 02:00 for `0 * * * *`."""
    hourly = CronSchedule.parse("0 * * * *", "Australia/Lord_Howe")
    times = on_day(hourly, "Australia/Lord_Howe", date(2026, 10, 4))
    assert "02:30+1100" in times  # 02:00 read with the old offset is 02:30 new time
    assert len(times) == 24
