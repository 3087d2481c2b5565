"""The documented DST policy as an oracle: each wall time matching the fields fires once, at
the instant its ``fold=0`` reading names (first occurrence; a missing one with the old offset)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

# (zone, the local dates of its 2026 spring-forward and fall-back)
TRANSITIONS = [
    ("Europe/Madrid", date(2026, 3, 29), date(2026, 10, 25)),
    ("America/New_York", date(2026, 3, 8), date(2026, 11, 1)),
    ("Australia/Lord_Howe", date(2026, 10, 4), date(2026, 4, 5)),  # a 30-minute shift
]

FIELDS = {
    "30 2 * * *": ([30], [2]),
    "*/30 * * * *": ([0, 30], list(range(24))),
    "0 * * * *": ([0], list(range(24))),
}


def expected(zone: ZoneInfo, expression: str, first: date, days: int) -> list[datetime]:
    minutes, hours = FIELDS[expression]
    instants = set()
    for offset in range(days):
        d = first + timedelta(days=offset)
        for hour in hours:
            for minute in minutes:
                wall = datetime(d.year, d.month, d.day, hour, minute, tzinfo=zone)  # fold=0
                instants.add(wall.astimezone(UTC))
    return sorted(instants)
