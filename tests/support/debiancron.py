"""An explicit oracle of when Debian's cron starts a job: its main loop, simulated second by second.

Written from the algorithm of Debian cron 3.0pl1-162's cron.c (with the Debian patches
"Better timeskip handling" and the GMT-offset fix for #1019716), not from its code:

* cron wakes one second into every minute of its *clock*, the wall-clock minute of the host's
  zone, and compares it with its *virtual time*, the minute it has run all jobs up to;
* one minute later (the normal case): every job matching the new minute runs;
* 2 to 5 minutes later: every job of each minute in between runs, in turn;
* 6 to 180 minutes later (a jump forward, as DST begins): the *wildcard* jobs (minute or hour
  field starting with ``*``) of the current minute run, then the *fixed-time* jobs of every
  minute in between, in turn, until caught up or the clock moves on;
* 0 to 179 minutes earlier (DST ends): only wildcard jobs run, and virtual time waits;
* anything larger: virtual time is reset and the current minute runs everything.

Whenever a catch-up step ran a job, cron sleeps 10 s before the next (``sleep(10)``).
The fields of each entry come from cronsim's parser, independent of cronlock's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from cronfuzz import FIELDS
from cronsim import CronSim

EPOCH = datetime(1970, 1, 1)


def _value(text: str, index: int) -> int:
    low, _, names = FIELDS[index]
    if names is not None and text.lower() in names:
        return names.index(text.lower()) + low
    return int(text)


def for_cronsim(expression: str) -> str:
    """``expression`` as cronsim reads it as Debian does.

    cronsim 2.8 reads a one-value range with a step (``27-27/1``, ``thu-4/2``) as ``27-31``;
    to Debian's cron (and cronlock) it is ``27``. Writing the value alone keeps Debian's
    meaning; nothing else is rewritten.
    """
    parts = expression.split()
    if len(parts) != 5:
        return expression
    out = []
    for index, part in enumerate(parts):
        items = []
        for item in part.split(","):
            base, slash, _ = item.partition("/")
            first, dash, last = base.partition("-")
            if slash and dash and _value(first, index) == _value(last, index):
                item = first
            items.append(item)
        out.append(",".join(items))
    return " ".join(out)


@dataclass(frozen=True)
class Entry:
    name: str
    matches: Callable[[datetime], bool]  # a naive wall-clock minute
    wildcard: bool


def entry(name: str, five_fields: str) -> Entry:
    sim = CronSim(for_cronsim(five_fields), datetime(2000, 1, 1))
    parts = five_fields.split()

    def matches(wall: datetime) -> bool:
        if wall.minute not in sim.minutes or wall.hour not in sim.hours:
            return False
        if wall.month not in sim.months:
            return False
        dom = wall.day in sim.days
        weekday = (wall.weekday() + 1) % 7  # 0 = Sunday
        dow = weekday in sim.weekdays or (weekday == 0 and 7 in sim.weekdays)
        return (dom and dow) if sim.day_and else (dom or dow)

    return Entry(name, matches, parts[0].startswith("*") or parts[1].startswith("*"))


# A host whose crontabs have a fixed-time job in every minute (``0-59 0-23 * * *``): every
# catch-up step then sleeps, the latest cron can be.
BUSY = Entry("busy", lambda wall: True, wildcard=False)


@dataclass(frozen=True)
class Start:
    entry: str
    at: datetime  # the real instant the job starts (UTC)
    virtual: datetime  # the wall-clock minute cron ran it for


def simulate(zone: ZoneInfo, entries: list[Entry], start: datetime, end: datetime) -> list[Start]:
    """Every job start of ``entries`` between ``start`` and ``end`` (cron started at ``start``)."""

    def offset(second: int) -> int:
        moment = datetime.fromtimestamp(second, UTC).astimezone(zone)
        found = moment.utcoffset()
        assert found is not None
        return int(found.total_seconds())

    now = int(start.timestamp())
    stop = int(end.timestamp())
    gmt_off = offset(now)
    clock = (now + gmt_off) // 60
    running = virtual = clock
    queue: list[tuple[Entry, int]] = []
    started: list[Start] = []

    def set_time() -> None:
        nonlocal gmt_off, clock
        gmt_off = offset(now)
        clock = (now + gmt_off) // 60

    def find(minute: int, wild: bool, fixed: bool) -> None:
        wall = EPOCH + timedelta(minutes=minute)
        for e in entries:
            wanted = (wild and e.wildcard) or (fixed and not e.wildcard)
            # cron queues a job once
            if wanted and e.matches(wall) and all(q is not e for q, _ in queue):
                queue.append((e, minute))

    def run_queue() -> int:
        count = len(queue)
        for e, minute in queue:
            at = datetime.fromtimestamp(now, UTC)
            started.append(Start(e.name, at, EPOCH + timedelta(minutes=minute)))
        queue.clear()
        return count

    while now < stop:
        while True:  # sleep to one second into the next minute of the clock
            wait = (running + 1) * 60 - (now + gmt_off) + 1
            now += wait if 0 < wait < 65 else 1
            set_time()
            if clock != running:
                break
        running = clock
        diff = running - virtual
        if diff == 1:
            virtual = running
            find(virtual, True, True)
        elif 1 < diff <= 5:
            while True:
                if run_queue():
                    now += 10
                virtual += 1
                find(virtual, True, True)
                if virtual >= running:
                    break
        elif 5 < diff <= 180:
            find(running, True, False)
            while True:
                if run_queue():
                    now += 10
                virtual += 1
                find(virtual, False, True)
                set_time()
                if not (virtual < running and clock == running):
                    break
        elif -180 < diff <= 0:
            find(running, True, False)
        else:
            virtual = running
            find(running, True, True)
        run_queue()
    return [s for s in started if s.at < end]
