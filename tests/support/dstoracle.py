"""The documented DST policy (Debian cron's) as an oracle, for a few expressions.

Each wall time matching the fields fires: once if it exists once; if it is repeated, at its
first occurrence, and for a wildcard job (minute or hour field starting with '*') at its
second too; if it does not exist, a fixed-time job fires at the instant of the jump, a
wildcard job not at all.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

# (zone, the local dates of its 2026 spring-forward and fall-back)
TRANSITIONS = [
    ("Europe/Madrid", date(2026, 3, 29), date(2026, 10, 25)),
    ("America/New_York", date(2026, 3, 8), date(2026, 11, 1)),
    ("Australia/Lord_Howe", date(2026, 10, 4), date(2026, 4, 5)),  # a 30-minute shift
]

# expression: (minutes, hours, fixed-time)
FIELDS = {
    "30 2 * * *": ([30], [2], True),
    "0,30 2 * * *": ([0, 30], [2], True),
    "*/30 * * * *": ([0, 30], list(range(24)), False),
    "0 * * * *": ([0], list(range(24)), False),
}


def _jump(zone: ZoneInfo, wall: datetime) -> datetime:
    """The instant the clock jumps over the missing ``wall``: the first minute after it."""
    moment = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    while moment.astimezone(zone).replace(tzinfo=None) < wall:
        moment += timedelta(minutes=1)
    return moment


def expected(zone: ZoneInfo, expression: str, first: date, days: int) -> list[datetime]:
    minutes, hours, fixed = FIELDS[expression]
    instants = set()
    for offset in range(days):
        d = first + timedelta(days=offset)
        for hour in hours:
            for minute in minutes:
                wall = datetime(d.year, d.month, d.day, hour, minute)
                once = wall.replace(tzinfo=zone).astimezone(UTC)
                twice = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
                if once == twice:
                    instants.add(once)
                elif once < twice:  # repeated
                    instants.update([once] if fixed else [once, twice])
                elif fixed:  # missing
                    instants.add(_jump(zone, wall))
    return sorted(instants)
