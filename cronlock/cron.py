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
"""

from __future__ import annotations

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
                    minute=minute, hour=hour, day=d, month=month, day_of_week=w, timezone=zone
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
        found = [t.get_next_fire_time(None, after) for t in self._triggers]
        times = [f for f in found if f is not None]
        return min(times).astimezone(UTC) if times else None

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
