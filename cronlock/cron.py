"""Cron expressions as Debian's cron reads them: parsing, fire times, and the slot of a moment.

cronlock's fire times must be the times at which the cron that invokes ``cronlock run`` fires
(DESIGN.md, invariant 10), so this module reads expressions with Debian cron's grammar and
rules (Vixie cron 3.0 with Debian's patches; cronie and Vixie cron 4 agree on all of it) rather
than APScheduler's, which refuses some of cron's syntax and reads the day fields differently:

* Fields are bit sets, as in cron: lists, ranges, steps (``20-21/3`` is ``20``; ``*/100`` in
  the minute field is ``0``), three-letter month and day names in any case, ``0`` and ``7``
  for Sunday, ``@yearly`` … ``@hourly``.
* The day rule: when the day-of-month or the day-of-week field *starts with* ``*`` (``*``,
  ``*/2``), a day must match both fields; only when both are restricted without a leading
  ``*`` does a day matching either fire (``0 12 */2 * 1-5``: odd days that are weekdays).
* What cron refuses is refused, with one line saying why; so is what cron accepts but would
  never run (``@reboot`` has no slots; ``5-1`` is an empty range; ``0 0 30 2 *`` never
  fires) and what cron silently truncates (``1-5-7`` is ``1-5`` to cron).

Daylight-saving time follows Debian's cron, which tells a *fixed-time* job (neither the minute
nor the hour field starts with ``*``) from a *wildcard* one:

* clocks jump forward: a fixed-time wall time that does not exist fires once, at the instant
  of the jump (02:30 in a 02:00 -> 03:00 gap fires at 03:00 new time; several such times are
  that one slot); a wildcard job's missing times do not fire;
* clocks go back: a repeated wall time fires at its first occurrence for a fixed-time job and
  at both occurrences for a wildcard one (``0 * * * *`` fires twice in the repeated hour).

(Debian also has rules for jumps of under 5 minutes, where every job catches up, and of 3
hours or more, where the clock is simply reset; they are applied too.) Slots are instants,
returned in UTC. ``invocation_slot`` maps a cron invocation to its slot, allowing for the
delay with which cron runs the jobs it catches up after a jump forward.
"""

from __future__ import annotations

import functools
import itertools
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .errors import InvalidCron

__all__ = ["CronSchedule", "parse_timezone"]

# Debian's crontab(5) names; @reboot is known so that it gets its own message.
_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# (name, low, high, names) per field, in crontab order.
_FIELDS = (
    ("minute", 0, 59, None),
    ("hour", 0, 23, None),
    ("day-of-month", 1, 31, None),
    ("month", 1, 12, _MONTHS),
    ("day-of-week", 0, 7, _DAYS),
)
_MINUTE = timedelta(minutes=1)
_TICK = timedelta(microseconds=1)
# Longer than any daylight-saving shift in the tz database (at most two hours): within this of
# an offset change, wall-clock order and instant order may differ and the slow path is taken.
_MARGIN = timedelta(hours=3)
# Debian cron's classes of clock jumps (cron.c): a jump forward of under 5 minutes catches up
# every job, one of 3 hours or more none; one back of more than 3 hours runs everything again.
_SMALL_JUMP = timedelta(minutes=5)
_LARGE_JUMP = timedelta(hours=3)
# After a jump forward cron starts the fixed-time jobs of each skipped minute in turn and
# sleeps 10 s after every minute that started any (cron.c, "DST begins"); with the minutes
# that pass meanwhile, a job can start up to ~12 s per skipped minute after the jump.
_CATCH_UP_PER_MINUTE = timedelta(seconds=12)
_LARGE_JUMP_MINUTES = 180
# Fire times are searched this far; an expression with none from 2000 on is refused.
_HORIZON_YEARS = 400
_UTC_KEYS = frozenset({"UTC", "Etc/UTC", "Etc/UCT", "UCT", "Etc/Universal", "Universal", "Zulu",
                       "Etc/Zulu", "GMT", "Etc/GMT", "Etc/GMT0", "Etc/GMT+0", "Etc/GMT-0", "GMT0",
                       "GMT+0", "GMT-0", "Etc/Greenwich", "Greenwich"})  # fmt: skip


def parse_timezone(name: str | None) -> ZoneInfo:
    """An IANA zone by name (UTC when None)."""
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidCron(
            f"unknown timezone {name!r} (use an IANA name such as 'Europe/Madrid')"
        ) from None


class _FieldError(ValueError):
    """One field's problem; parse() adds the expression."""


def _number(text: str, name: str, low: int, high: int, names: tuple[str, ...] | None) -> int:
    if text.isdigit() and text.isascii():
        value = int(text)
    elif names is not None and text.lower() in names:
        return names.index(text.lower()) + low
    elif names is not None and text.isalpha():
        raise _FieldError(f"unknown {name} name {text!r} (cron's are {', '.join(names)})")
    elif not text:
        raise _FieldError(f"empty {name} value")
    else:
        raise _FieldError(f"{text!r} is not a {name} (cron takes numbers, ranges, steps, lists)")
    if not low <= value <= high:
        raise _FieldError(f"{name} {value} is out of range {low}-{high}")
    return value


def _parse_field(text: str, index: int) -> int:
    """A crontab field as a bit set (bit n set: the value n matches), as cron builds it."""
    name, low, high, names = _FIELDS[index]
    bits = 0
    for item in text.split(","):
        base, slash, step_text = item.partition("/")
        if base == "*":
            first, last = low, high
        elif base.startswith("*"):
            # cron reads '*' and ignores what follows it up to the next comma.
            raise _FieldError(f"{item!r}: '*' takes only a step (*/N)")
        else:
            first_text, dash, last_text = base.partition("-")
            if "-" in last_text:
                # cron stops reading the field at the second dash and ignores the rest.
                raise _FieldError(f"{item!r} has two dashes (cron would read only its start)")
            first = _number(first_text, name, low, high, names)
            last = _number(last_text, name, low, high, names) if dash else first
            if slash and not dash:
                raise _FieldError(
                    f"a step needs a range: write {first_text}-{high}/{step_text} for {item!r} "
                    "(Debian's cron refuses it)"
                )
            if last < first:
                hint = " (Sunday is 0: write mon-sat,sun or 1-7)" if names is _DAYS else ""
                raise _FieldError(f"range {base!r} goes backwards: it is empty to cron{hint}")
        step = 1
        if slash:
            if not (step_text.isdigit() and step_text.isascii()):
                raise _FieldError(f"step {step_text!r} in {item!r} is not a number")
            step = int(step_text)
            if step < 1:
                raise _FieldError(f"step must be at least 1 in {item!r}")
        for value in range(first, last + 1, step):
            bits |= 1 << value
    return bits


def _values(bits: int, low: int, high: int) -> tuple[int, ...]:
    return tuple(v for v in range(low, high + 1) if bits >> v & 1)


@dataclass(frozen=True)
class _Fields:
    """The parsed fields: bit sets for days, sorted values for times of day."""

    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    hour_bits: int
    minute_bits: int
    dom_bits: int  # bit d: day of month d
    month_bits: int  # bit m: month m
    dow_bits: int  # bit w: weekday w, 0 = Sunday (cron's 7 folded onto 0)
    days_and: bool  # a day field starts with '*': both must match

    def day_matches(self, day: date) -> bool:
        dom = self.dom_bits >> day.day & 1
        dow = self.dow_bits >> (day.toordinal() % 7) & 1  # ordinal 7 is a Sunday
        return bool(dom & dow) if self.days_and else bool(dom | dow)

    def time_at_or_after(self, hour: int, minute: int) -> tuple[int, int] | None:
        if self.hour_bits >> hour & 1:
            i = bisect_left(self.minutes, minute)
            if i < len(self.minutes):
                return hour, self.minutes[i]
        j = bisect_right(self.hours, hour)
        return (self.hours[j], self.minutes[0]) if j < len(self.hours) else None

    def time_at_or_before(self, hour: int, minute: int) -> tuple[int, int] | None:
        if self.hour_bits >> hour & 1:
            i = bisect_right(self.minutes, minute)
            if i:
                return hour, self.minutes[i - 1]
        j = bisect_left(self.hours, hour)
        return (self.hours[j - 1], self.minutes[-1]) if j else None

    def next_wall(self, start: datetime) -> datetime | None:
        """The first matching wall-clock minute at or after ``start`` (naive, whole minute)."""
        day = start.date()
        limit = day.year + _HORIZON_YEARS
        found = self.time_at_or_after(start.hour, start.minute)
        while day.year <= limit:
            if not self.month_bits >> day.month & 1:
                year, month = day.year, day.month
                while True:
                    year, month = (year + 1, 1) if month == 12 else (year, month + 1)
                    if self.month_bits >> month & 1:
                        break
                day, found = date(year, month, 1), (self.hours[0], self.minutes[0])
                continue
            if found is not None and self.day_matches(day):
                return datetime(day.year, day.month, day.day, *found)
            day += timedelta(days=1)
            found = (self.hours[0], self.minutes[0])
        return None

    def prev_wall(self, start: datetime) -> datetime | None:
        """The last matching wall-clock minute at or before ``start`` (naive, whole minute)."""
        day = start.date()
        limit = day.year - _HORIZON_YEARS
        found = self.time_at_or_before(start.hour, start.minute)
        while day.year >= limit:
            if not self.month_bits >> day.month & 1:
                year, month = day.year, day.month
                while True:
                    year, month = (year - 1, 12) if month == 1 else (year, month - 1)
                    if self.month_bits >> month & 1:
                        break
                if year < 1:
                    return None
                following = date(year + 1, 1, 1) if month == 12 else date(year, month + 1, 1)
                day, found = following - timedelta(days=1), (self.hours[-1], self.minutes[-1])
                continue
            if found is not None and self.day_matches(day):
                return datetime(day.year, day.month, day.day, *found)
            if day.toordinal() == 1:
                return None
            day -= timedelta(days=1)
            found = (self.hours[-1], self.minutes[-1])
        return None


def _parse_fields(text: str) -> tuple[_Fields, bool]:
    """The fields of a five-field expression, and whether it is a fixed-time job."""
    parts = text.split()
    bits = [_parse_field(part, i) for i, part in enumerate(parts)]
    minute_bits, hour_bits, dom_bits, month_bits, dow_bits = bits
    if dow_bits & (1 | 1 << 7):
        dow_bits |= 1
    fields = _Fields(
        minutes=_values(minute_bits, 0, 59),
        hours=_values(hour_bits, 0, 23),
        hour_bits=hour_bits,
        minute_bits=minute_bits,
        dom_bits=dom_bits,
        month_bits=month_bits,
        dow_bits=dow_bits & 0x7F,
        days_and=parts[2].startswith("*") or parts[4].startswith("*"),
    )
    return fields, not (parts[0].startswith("*") or parts[1].startswith("*"))


@functools.lru_cache(maxsize=256)
def _jump_instant(zone: ZoneInfo, before: datetime, after: datetime) -> datetime:
    """The instant in (before, after] at which ``zone``'s offset changes (to the second)."""
    offset = before.astimezone(zone).utcoffset()
    while after - before > timedelta(seconds=1):
        middle = before + (after - before) / 2
        middle = middle.replace(microsecond=0)
        if middle <= before:
            middle = before + timedelta(seconds=1)
        if middle.astimezone(zone).utcoffset() == offset:
            before = middle
        else:
            after = middle
    return after


def _ceil_minute(wall: datetime) -> datetime:
    floor = wall.replace(second=0, microsecond=0)
    return floor if floor == wall else floor + _MINUTE


@dataclass(frozen=True)
class CronSchedule:
    """A validated five-field cron expression evaluated in one timezone, as Debian's cron does."""

    expression: str
    timezone: ZoneInfo
    # Debian cron's "fixed-time job": neither minute nor hour starts with '*' (DST rules).
    fixed_time: bool = field(compare=False)
    _fields: _Fields = field(repr=False, compare=False)
    _utc: bool = field(repr=False, compare=False)

    @classmethod
    def parse(cls, expression: str, timezone: str | tzinfo | None = None) -> CronSchedule:
        if not isinstance(expression, str):
            raise InvalidCron(
                f"invalid cron expression {expression!r}: give a string such as '*/15 * * * *'"
            )
        zone = (
            timezone
            if isinstance(timezone, ZoneInfo)
            else parse_timezone(None if timezone is None else str(timezone))
        )
        text = " ".join(expression.split())
        five = text
        if text.startswith("@"):
            if text == "@reboot":
                raise InvalidCron(
                    f"invalid cron expression {expression!r}: @reboot runs once at boot and "
                    "has no slots (declare a schedule, or run the task from your boot script)"
                )
            if text not in _ALIASES:
                known = ", ".join(_ALIASES)
                lower = f" (cron reads only {text.lower()})" if text.lower() in _ALIASES else ""
                raise InvalidCron(
                    f"invalid cron expression {expression!r}: unknown @-name{lower}; "
                    f"cron's are {known}"
                )
            five = _ALIASES[text]
        count = len(five.split())
        if count != 5:
            more = (
                ": cron has no seconds or year field"
                if count in (6, 7)
                else (" (@reboot and the @-names stand alone)" if "@" in five else "")
            )
            raise InvalidCron(
                f"invalid cron expression {expression!r}: expected 5 fields "
                f"(minute hour day month weekday), got {count}{more}"
            )
        try:
            fields, fixed_time = _parse_fields(five)
        except _FieldError as exc:
            raise InvalidCron(f"invalid cron expression {expression!r}: {exc}") from None
        schedule = cls(
            expression=text,
            timezone=zone,
            fixed_time=fixed_time,
            _fields=fields,
            _utc=zone.key in _UTC_KEYS,
        )
        if fields.next_wall(datetime(2000, 1, 1)) is None:
            raise InvalidCron(f"invalid cron expression {expression!r}: it never fires")
        return schedule

    # -- the mapping of wall-clock times to instants (the DST rules) --

    def _offset(self, moment: datetime) -> timedelta:
        offset = moment.astimezone(self.timezone).utcoffset()
        assert offset is not None
        return offset

    def _steady(self, moment: datetime, offset: timedelta) -> bool:
        """The zone's offset is ``offset`` throughout the margin around ``moment``."""
        return self._offset(moment - _MARGIN) == offset == self._offset(moment + _MARGIN)

    def _instants(self, wall: datetime) -> tuple[datetime, ...]:
        """The instants at which a matching wall-clock minute fires (Debian cron's rules)."""
        first = wall.replace(tzinfo=self.timezone).astimezone(UTC)
        second = wall.replace(tzinfo=self.timezone, fold=1).astimezone(UTC)
        if first == second:
            return (first,)
        if first < second:  # a repeated wall time: ``first`` is its first occurrence
            again = not self.fixed_time or second - first > _LARGE_JUMP
            return (first, second) if again else (first,)
        # A wall time in a gap: read with the old offset it is ``first``, with the new one
        # ``second``; the jump lies between. cron catches fixed-time jobs up at the jump.
        gap = first - second
        if gap < _SMALL_JUMP or (self.fixed_time and gap < _LARGE_JUMP):
            return (_jump_instant(self.timezone, second, first),)
        return ()

    def next_fire_time(self, after: datetime) -> datetime | None:
        """The first fire time at or after ``after`` (aware), in UTC."""
        after = after.astimezone(UTC)
        if self._utc:
            wall = self._fields.next_wall(_ceil_minute(after.replace(tzinfo=None)))
            return None if wall is None else wall.replace(tzinfo=UTC)
        local = after.astimezone(self.timezone)
        offset = local.utcoffset()
        assert offset is not None
        if self._steady(after, offset):
            wall = self._fields.next_wall(_ceil_minute(local.replace(tzinfo=None)))
            if wall is None:
                return None
            instant = (wall - offset).replace(tzinfo=UTC)
            if self._steady(instant, offset):
                return instant
        return self._next_near_jump(after, local.replace(tzinfo=None, fold=0))

    def _next_near_jump(self, after: datetime, wall_after: datetime) -> datetime | None:
        # Near an offset change wall-clock order and instant order differ (a repeated 02:00
        # fires after the first 02:45), so every wall time that can map at or after ``after``
        # is looked at until one is found and the margin past it is covered.
        best: datetime | None = None
        stop: datetime | None = None
        wall = self._fields.next_wall(wall_after.replace(second=0, microsecond=0) - _MARGIN)
        while wall is not None and (stop is None or wall <= stop):
            for instant in self._instants(wall):
                if instant >= after and (best is None or instant < best):
                    best, stop = instant, stop or wall + _MARGIN
            wall = self._fields.next_wall(wall + _MINUTE)
        return best

    def slot_at(self, moment: datetime) -> datetime | None:
        """The latest fire time at or before ``moment``, in UTC (None if there never was one)."""
        moment = moment.astimezone(UTC)
        if self._utc:
            wall = self._fields.prev_wall(moment.replace(tzinfo=None, second=0, microsecond=0))
            return None if wall is None else wall.replace(tzinfo=UTC)
        local = moment.astimezone(self.timezone)
        offset = local.utcoffset()
        assert offset is not None
        floor = local.replace(tzinfo=None, second=0, microsecond=0, fold=0)
        if self._steady(moment, offset):
            wall = self._fields.prev_wall(floor)
            if wall is None:
                return None
            instant = (wall - offset).replace(tzinfo=UTC)
            if self._steady(instant, offset):
                return instant
        best: datetime | None = None
        stop: datetime | None = None
        wall = self._fields.prev_wall(floor + _MARGIN)
        while wall is not None and (stop is None or wall >= stop):
            for instant in self._instants(wall):
                if instant <= moment and (best is None or instant > best):
                    best, stop = instant, stop or wall - _MARGIN
            wall = self._fields.prev_wall(wall - _MINUTE)
        return best

    def fire_times(self, after: datetime) -> Iterator[datetime]:
        """Fire times strictly after ``after``, in UTC, in order."""
        current = self.next_fire_time(after + _TICK)
        while current is not None:
            yield current
            current = self.next_fire_time(current + _TICK)

    def min_interval(self, after: datetime, samples: int = 64) -> timedelta | None:
        """The shortest gap between consecutive fire times among the next ``samples``."""
        times = list(itertools.islice(self.fire_times(after), samples + 1))
        gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
        return min(gaps) if gaps else None

    # -- cron invocations --

    def _jump_before(self, moment: datetime, window: timedelta) -> datetime | None:
        """The instant of a jump forward (under 3 hours) in the ``window`` before ``moment``."""
        before, now = self._offset(moment - window), self._offset(moment)
        if not timedelta(0) < now - before < _LARGE_JUMP:
            return None
        return _jump_instant(self.timezone, moment - window, moment)

    def invocation_slot(
        self, moment: datetime, *, early: timedelta, grace: timedelta
    ) -> datetime | None:
        """The slot that an invocation at ``moment`` (a crontab line firing) belongs to.

        The next fire time if it is at most ``early`` ahead, else the latest if it is at most
        ``grace`` behind, else None (``no_slot``). Two allowances keep every invocation that
        cron makes inside its slot:

        * after a jump forward, cron runs the fixed-time jobs of every skipped minute (and of
          the minutes that pass meanwhile) in turn, 10 s apart whenever a minute had jobs:
          until ``grace`` plus 12 s per skipped minute after the jump, an invocation belongs
          to the latest slot at or after the jump however late it is;
        * in the second occurrence of a repeated wall time, an invocation at a fixed-time
          job's wall time (a cron that reads wall clocks only, such as cronie with CRON_TZ)
          belongs to that wall time's first occurrence, its slot.
        """
        moment = moment.astimezone(UTC)
        upcoming = self.next_fire_time(moment)
        if upcoming is not None and upcoming - moment <= early:
            return upcoming
        latest = self.slot_at(moment)
        if latest is None:
            return None
        if moment - latest <= grace:
            return latest
        if self._utc:
            return None
        jump_at = self._jump_before(moment, grace + _CATCH_UP_PER_MINUTE * _LARGE_JUMP_MINUTES)
        if jump_at is not None and latest >= jump_at:
            jump = self._offset(jump_at) - self._offset(jump_at - _TICK)
            allowance = _CATCH_UP_PER_MINUTE * (jump // _MINUTE + 2)
            if moment - jump_at <= grace + allowance:
                return latest
        local = moment.astimezone(self.timezone)
        if local.fold and self.fixed_time:
            wall = local.replace(tzinfo=None, fold=0)
            matching = self._fields.prev_wall(wall.replace(second=0, microsecond=0))
            if matching is not None and wall - matching <= grace:
                first = matching.replace(tzinfo=self.timezone).astimezone(UTC)
                if first in self._instants(matching):
                    return first
        return None
