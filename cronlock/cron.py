"""Cron expressions: parsing, validation, fire times and the slot a moment belongs to.

APScheduler 3.x computes the fire times, but its crontab reading differs from cron's in two
ways that would make tasks fire on the wrong days, so this module translates first:

* day-of-week numbers: cron counts 0 (or 7) = Sunday, APScheduler 3 counts 0 = Monday. Numeric
  day-of-week fields are rewritten as day names, which both read alike.
* day-of-month *and* day-of-week restricted (``0 0 1 * mon``): cron fires when *either*
  matches, APScheduler when both do. Such an expression becomes two triggers whose fire times
  are merged.

The slot of a moment is the latest fire time at or before it: for ``*/15 * * * *`` invoked at
10:15:02 the slot is 10:15:00. Slots are returned in UTC.

Daylight-saving time, in a task's IANA zone (the policy README.md documents):

* spring forward, a wall time that does not exist (02:30 when clocks jump 02:00 -> 03:00)
  fires once, at the instant it would have been without the jump: 02:30 read with the old
  offset, which is 03:30 new time (PEP 495's ``fold=0`` reading). Where that instant is a
  slot anyway (``*/30`` across a one-hour jump), the two wall times are one slot, fired once.
* fall back, a wall time that happens twice (02:30 when clocks go 03:00 -> 02:00) fires once,
  at its first occurrence.

APScheduler 3's CronTrigger with a zone does neither reliably: it fires a repeated 02:30
twice, and for ``0 * * * *`` in Australia/Lord_Howe (a 30-minute jump at 02:00) it never
fires the missing 02:00 at all. So its triggers here run in UTC over *wall-clock* times,
where nothing is missing or repeated, and this module maps wall times to instants.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.cron import CronTrigger

from .errors import InvalidCron

__all__ = ["CronSchedule", "parse_timezone"]

_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_TICK = timedelta(microseconds=1)
# Longer than any daylight-saving shift in the tz database (at most two hours).
_DST_MARGIN = timedelta(hours=3)
# Windows searched backwards for the latest fire time; the last covers a leap day (Feb 29).
_LOOKBACK = (
    timedelta(minutes=1),
    timedelta(hours=1),
    timedelta(days=1),
    timedelta(days=8),
    timedelta(days=32),
    timedelta(days=367),
    timedelta(days=8 * 366),
)


def parse_timezone(name: str | None) -> ZoneInfo:
    """An IANA zone by name (UTC when None)."""
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidCron(
            f"unknown timezone {name!r} (use an IANA name such as 'Europe/Madrid')"
        ) from None


def _expand_dow_token(token: str) -> list[int]:
    base, _, step_text = token.partition("/")
    step = int(step_text) if step_text else 1
    if step < 1:
        raise ValueError(f"step must be at least 1 in {token!r}")
    if base == "*":
        lo, hi = 0, 6
    elif "-" in base:
        lo_text, hi_text = base.split("-", 1)
        lo, hi = int(lo_text), int(hi_text)
    else:
        lo = int(base)
        hi = 6 if step_text else lo
    if not (0 <= lo <= 7 and 0 <= hi <= 7) or lo > hi:
        raise ValueError(f"day of week {token!r} is out of 0-7")
    return [day % 7 for day in range(lo, hi + 1, step)]


def _translate_dow(field_text: str) -> str:
    """Rewrite cron's numeric days of week (0/7 = Sunday) as names APScheduler reads alike."""
    if field_text in ("*", "?") or not any(ch.isdigit() for ch in field_text):
        return field_text
    days: set[int] = set()
    for token in field_text.split(","):
        if any(ch.isalpha() for ch in token):
            raise ValueError(f"mixing day names and numbers in {token!r} is not supported")
        days.update(_expand_dow_token(token))
    return ",".join(_DAY_NAMES[day] for day in sorted(days))


@dataclass(frozen=True)
class CronSchedule:
    """A validated five-field cron expression evaluated in one timezone."""

    expression: str
    timezone: ZoneInfo
    _triggers: tuple[CronTrigger, ...] = field(repr=False, compare=False)

    @classmethod
    def parse(cls, expression: str, timezone: str | tzinfo | None = None) -> CronSchedule:
        zone = (
            timezone
            if isinstance(timezone, ZoneInfo)
            else parse_timezone(None if timezone is None else str(timezone))
        )
        text = " ".join(expression.split())
        fields = _ALIASES.get(text.lower(), text).split(" ")
        if len(fields) != 5:
            raise InvalidCron(
                f"invalid cron expression {expression!r}: expected 5 fields "
                f"(minute hour day month weekday), got {len(fields)}"
            )
        minute, hour, day, month, weekday = fields
        try:
            weekday = _translate_dow(weekday)
            variants = [(day, weekday)]
            if day not in ("*", "?") and weekday not in ("*", "?"):
                variants = [(day, "*"), ("*", weekday)]  # cron: either may match
            triggers = tuple(
                CronTrigger(
                    minute=minute, hour=hour, day=d, month=month, day_of_week=w, timezone=UTC
                )
                for d, w in variants
            )
        except ValueError as exc:
            raise InvalidCron(f"invalid cron expression {expression!r}: {exc}") from None
        schedule = cls(expression=text, timezone=zone, _triggers=triggers)
        if schedule.next_fire_time(datetime(2000, 1, 1, tzinfo=UTC)) is None:
            raise InvalidCron(f"invalid cron expression {expression!r}: it never fires")
        return schedule

    def next_fire_time(self, after: datetime) -> datetime | None:
        """The first fire time at or after ``after`` (aware), in UTC."""
        after = after.astimezone(UTC)
        wall_after = self._wall(after)
        if self._steady(after):
            wall = self._next_wall(wall_after)
            if wall is None:
                return None
            instant = self._instant(wall)
            if self._steady(instant):
                return instant
        # Near a transition wall-clock order and instant order differ (02:30 in a spring gap
        # is later than 03:15), so search every wall time that can map at or after ``after``.
        best: datetime | None = None
        limit: datetime | None = None
        wall = self._next_wall(wall_after - _DST_MARGIN)
        while wall is not None and (limit is None or wall <= limit):
            instant = self._instant(wall)
            if instant >= after and (best is None or instant < best):
                best = instant
                limit = limit or wall + _DST_MARGIN
            wall = self._next_wall(wall + _TICK)
        return best

    def _wall(self, moment: datetime) -> datetime:
        """The naive wall-clock time of an instant in the task's zone."""
        return moment.astimezone(self.timezone).replace(tzinfo=None)

    def _instant(self, wall: datetime) -> datetime:
        # fold=0: a repeated wall time is its first occurrence; one that does not exist is read
        # with the offset before the jump.
        return wall.replace(tzinfo=self.timezone).astimezone(UTC)

    def _steady(self, moment: datetime) -> bool:
        """No offset change within the margin around ``moment``."""
        before = (moment - _DST_MARGIN).astimezone(self.timezone).utcoffset()
        return before == (moment + _DST_MARGIN).astimezone(self.timezone).utcoffset()

    def _next_wall(self, wall: datetime) -> datetime | None:
        """The first wall time at or after ``wall`` that the fields match.

        The triggers run in UTC on wall-clock times, where no time is missing or repeated;
        the zone is applied by ``_instant``, which is where the DST policy lives.
        """
        found = [t.get_next_fire_time(None, wall.replace(tzinfo=UTC)) for t in self._triggers]
        times = [f for f in found if f is not None]
        return min(times).replace(tzinfo=None) if times else None

    def min_interval(self, after: datetime, samples: int = 64) -> timedelta | None:
        """The shortest gap between consecutive fire times among the next ``samples``."""
        times = list(itertools.islice(self.fire_times(after), samples + 1))
        gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
        return min(gaps) if gaps else None

    def fire_times(self, after: datetime) -> Iterator[datetime]:
        """Fire times strictly after ``after``, in UTC, in order."""
        current = self.next_fire_time(after + _TICK)
        while current is not None:
            yield current
            current = self.next_fire_time(current + _TICK)

    def slot_at(self, moment: datetime) -> datetime | None:
        """The latest fire time at or before ``moment``, in UTC (None if there never was one)."""
        for window in _LOOKBACK:
            first = self.next_fire_time(moment - window)
            if first is None or first > moment:
                continue
            slot = first
            for later in self.fire_times(first):
                if later > moment:
                    break
                slot = later
            return slot
        return None
