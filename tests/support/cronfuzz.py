"""Random crontab expressions in all the syntax Debian's cron accepts, and moments to test them at.

The generator writes what crontab(5) allows: lists, ranges, steps (also larger than their
range, ``20-21/3``), ``*`` and ``*/N``, three-letter names in any case, ``0``/``7`` for
Sunday, leading zeros, and the @-names. ``debian_five_fields`` expands an @-name the way
crontab(5) defines it (written here again, not taken from cronlock).
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# (low, high, names) per field: minute hour day-of-month month day-of-week.
FIELDS = ((0, 59, None), (0, 23, None), (1, 31, None), (1, 12, MONTHS), (0, 7, DAYS))
AT_NAMES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
ZONES = (
    "Europe/Madrid",
    "America/New_York",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "UTC",
    "America/St_Johns",
    "Pacific/Chatham",
)


def debian_five_fields(expression: str) -> str:
    return AT_NAMES.get(expression, expression)


def _value(rng: random.Random, index: int, value: int) -> str:
    low, _, names = FIELDS[index]
    if names is not None and value - low < len(names) and rng.random() < 0.4:
        name = names[value - low]
        return rng.choice((name, name.upper(), name.capitalize()))
    if rng.random() < 0.05:
        return f"0{value}"  # cron reads leading zeros
    return str(value)


def _step(rng: random.Random, span: int) -> int:
    if rng.random() < 0.15:
        return rng.randint(span, span + 40)  # larger than the range: its first value only
    return rng.randint(1, max(1, min(span, 30)))


def _item(rng: random.Random, index: int, star: float) -> str:
    low, high, _ = FIELDS[index]
    roll = rng.random()
    if roll < star:
        return "*"
    if roll < star + 0.2:
        return f"*/{_step(rng, high - low + 1)}"
    if roll < star + 0.5:
        return _value(rng, index, rng.randint(low, high))
    first = rng.randint(low, high)
    last = rng.randint(first, high)
    text = f"{_value(rng, index, first)}-{_value(rng, index, last)}"
    if rng.random() < 0.5:
        text += f"/{_step(rng, last - first + 1)}"
    return text


# How often a field is '*': days are usually unrestricted, times of day less often.
_STAR = (0.25, 0.4, 0.55, 0.6, 0.55)


def expression(rng: random.Random) -> str:
    if rng.random() < 0.03:
        return rng.choice(tuple(AT_NAMES))
    parts = []
    for index in range(5):
        count = 1 if rng.random() < 0.75 else rng.randint(2, 4)
        items = [_item(rng, index, _STAR[index] if count == 1 else 0.05) for _ in range(count)]
        parts.append(",".join(items))
    return " ".join(parts)


def transitions(zone: ZoneInfo, first_year: int, last_year: int) -> list[datetime]:
    """The instants (UTC) at which ``zone``'s offset changes, to the minute."""
    found = []
    moment = datetime(first_year, 1, 1, tzinfo=UTC)
    end = datetime(last_year + 1, 1, 1, tzinfo=UTC)
    step = timedelta(hours=6)
    offset = moment.astimezone(zone).utcoffset()
    while moment < end:
        later = moment + step
        if later.astimezone(zone).utcoffset() != offset:
            lo, hi = moment, later
            while hi - lo > timedelta(minutes=1):
                mid = lo + (hi - lo) / 2
                if mid.astimezone(zone).utcoffset() == offset:
                    lo = mid
                else:
                    hi = mid
            found.append(hi.replace(second=0, microsecond=0))
            offset = later.astimezone(zone).utcoffset()
        moment = later
    return found


def start_moment(rng: random.Random, near: list[datetime]) -> datetime:
    """A whole-second instant: half near a transition of the zone, half anywhere in 2024-2030."""
    if near and rng.random() < 0.5:
        base = rng.choice(near)
        return base + timedelta(seconds=rng.randint(-36 * 3600, 6 * 3600))
    start = datetime(2024, 1, 1, tzinfo=UTC)
    return start + timedelta(seconds=rng.randrange(6 * 365 * 86400))
