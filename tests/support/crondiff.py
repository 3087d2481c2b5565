"""The differential check of cronlock's fire times against Debian cron's semantics.

Two oracles, neither sharing code with cronlock:

* cronsim (a maintained library that models Debian's cron, DST quirks included): for random
  expressions in several zones, from random moments (half of them near a DST transition),
  the next fire times must be cronlock's;
* ``debiancron.simulate``, Debian's main loop second by second: where cronsim and cronlock
  disagree, the loop decides. cronlock must agree with it; a cronsim answer it refutes is a
  known cronsim defect (after Lord Howe's half-hour shift its hour stepping skips the next
  day's 00:00 and 00:29, for example) and is counted as such.

The loop is also run on its own around DST transitions (``check_loop``): every job start cron
makes must map to a slot (``invocation_slot``), and the slots must be cronlock's fire times.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import random
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import cronfuzz
import debiancron
from cronsim import CronSim, CronSimError

from cronlock import CronSchedule, InvalidCron

EARLY = timedelta(seconds=5)  # the task defaults (SlotPolicy)
GRACE = timedelta(seconds=60)
COUNT = 6  # fire times compared per (expression, zone, moment)
WINDOW = timedelta(hours=3)  # the loop decides a disputed instant from this far around it


@dataclass
class Report:
    counts: Counter[str] = field(default_factory=Counter)
    disagreements: list[str] = field(default_factory=list)

    def add(self, other: Report) -> None:
        self.counts.update(other.counts)
        self.disagreements.extend(other.disagreements)


def cronsim_times(expression: str, zone: ZoneInfo, start: datetime, count: int) -> list[datetime]:
    """cronsim's next ``count`` distinct fire instants strictly after ``start``, in UTC.

    cronsim returns a fixed-time job's wall times in a gap as the same instant, once per wall
    time, and may start a fixed-time job's search at the first occurrence of a repeated hour
    (an instant before ``start``): both are filtered here.
    """
    five = debiancron.for_cronsim(cronfuzz.debian_five_fields(expression))
    iterator = CronSim(five, start.astimezone(zone))
    found: list[datetime] = []
    try:
        for _ in range(count * 40):
            moment = next(iterator).astimezone(UTC)
            if moment > start and (not found or moment > found[-1]):
                found.append(moment)
            if len(found) == count:
                break
    except StopIteration:
        pass
    return found


def loop_slots(
    schedule: CronSchedule, expression: str, start: datetime, end: datetime, busy: bool
) -> tuple[list[datetime], list[str]]:
    """The slots of the job starts Debian's loop makes in [start, end), and any ``no_slot``."""
    entries = [debiancron.entry("task", cronfuzz.debian_five_fields(expression))]
    if busy:
        entries.append(debiancron.BUSY)
    starts = debiancron.simulate(schedule.timezone, entries, start, end)
    slots: list[datetime] = []
    problems: list[str] = []
    for job in starts:
        if job.entry != "task":
            continue
        slot = schedule.invocation_slot(job.at, early=EARLY, grace=GRACE)
        if slot is None:
            problems.append(f"no_slot for the start at {job.at.isoformat()} (for {job.virtual})")
        elif not slots or slot != slots[-1]:
            slots.append(slot)
    return sorted(set(slots)), problems


def check_loop(
    expression: str, zone_name: str, start: datetime, end: datetime, *, busy: bool
) -> list[str]:
    """cronlock's fire times in [start, end) against Debian's loop started an hour before.

    Without ``busy`` the slots must be exactly the fire times. With it (a fixed-time job in
    every minute of the host, so cron's catch-up after a jump forward is as slow as it gets)
    no start may be ``no_slot`` and every slot must be a fire time, but a slot just after the
    jump may be taken by a late catch-up start: that is all that is asked.
    """
    schedule = CronSchedule.parse(expression, zone_name)
    slots, problems = loop_slots(schedule, expression, start - timedelta(hours=1), end, busy)
    fires = [t for t in itertools.takewhile(lambda t: t < end, schedule.fire_times(start))]
    tail = end - timedelta(minutes=15)  # a catch-up may still be running at the end
    seen = [s for s in slots if start < s < tail]
    expected = [t for t in fires if t < tail]
    if busy:
        extra = [s for s in seen if s not in fires]
        if extra:
            problems.append(f"slots that are not fire times: {[s.isoformat() for s in extra]}")
    elif seen != expected:
        problems.append(
            f"loop slots {[s.isoformat() for s in seen]} != fire times "
            f"{[t.isoformat() for t in expected]}"
        )
    return [f"{expression!r} in {zone_name}: {p}" for p in problems]


def compare(expression: str, zone_name: str, start: datetime) -> Report:
    """One (expression, zone, moment) against cronsim, the loop deciding disagreements."""
    report = Report()
    zone = ZoneInfo(zone_name)
    try:
        schedule = CronSchedule.parse(expression, zone_name)
    except InvalidCron as exc:
        if "never fires" not in str(exc):
            report.disagreements.append(f"{expression!r}: cronlock refuses it: {exc}")
            return report
        # Debian's cron accepts it and never runs it; cronlock refuses it at registration.
        try:
            theirs = cronsim_times(expression, zone, start, 1)
        except CronSimError:
            theirs = []
        if theirs:
            report.disagreements.append(f"{expression!r}: refused as never firing: {theirs}")
        report.counts["never fires: refused"] += 1
        return report
    try:
        theirs = cronsim_times(expression, zone, start, COUNT)
    except CronSimError as exc:
        report.disagreements.append(f"{expression!r}: cronsim refuses it: {exc}")
        return report
    ours = list(itertools.islice(schedule.fire_times(start), len(theirs)))
    report.counts["compared"] += 1
    report.counts["fire times compared"] += len(ours)
    if ours == theirs:
        return report
    # The loop decides each instant only one of them names (up to where both lists reach),
    # over a few hours around it.
    reach = min(ours[-1], theirs[-1]) if ours and theirs else None
    disputed = sorted(t for t in set(ours) ^ set(theirs) if reach is None or t <= reach) or [
        max(ours + theirs)
    ]
    for moment in disputed:
        problems = check_loop(expression, zone_name, moment - WINDOW, moment + WINDOW, busy=False)
        if problems:
            report.disagreements.append(
                f"{expression!r} in {zone_name} after {start.isoformat()}: cronlock "
                f"{[t.isoformat() for t in ours]}, cronsim {[t.isoformat() for t in theirs]}"
            )
            report.disagreements.extend(problems)
            return report
    report.counts[f"cronsim refuted by the loop ({zone_name})"] += 1
    return report


def run(expressions: int, seed: int, zones: tuple[str, ...] = cronfuzz.ZONES[:5]) -> Report:
    """``expressions`` random expressions, each in every one of ``zones``."""
    rng = random.Random(seed)
    near = {name: cronfuzz.transitions(ZoneInfo(name), 2024, 2030) for name in zones}
    report = Report()
    for _ in range(expressions):
        expression = cronfuzz.expression(rng)
        report.counts["expressions"] += 1
        for zone_name in zones:
            report.add(compare(expression, zone_name, cronfuzz.start_moment(rng, near[zone_name])))
    return report


def run_loop(
    expressions: int, seed: int, zones: tuple[str, ...] = cronfuzz.ZONES[:5], busy: bool = False
) -> Report:
    """Debian's loop across each zone's 2026 transitions for random expressions."""
    rng = random.Random(seed)
    report = Report()
    windows = {}
    for name in zones:
        jumps = cronfuzz.transitions(ZoneInfo(name), 2026, 2026)
        # Zones without DST get a plain day.
        windows[name] = jumps or [datetime(2026, 6, 1, 12, tzinfo=UTC)]
    for _ in range(expressions):
        expression = cronfuzz.expression(rng)
        try:
            CronSchedule.parse(expression)
        except InvalidCron:
            continue
        for name in zones:
            jump = rng.choice(windows[name])
            problems = check_loop(
                expression,
                name,
                jump - timedelta(hours=12),
                jump + timedelta(hours=12),
                busy=busy,
            )
            report.counts["loop windows"] += 1
            report.disagreements.extend(problems)
    return report


def _chunk(kind: str, expressions: int, seed: int, busy: bool) -> Report:
    if kind == "run":
        return run(expressions, seed)
    return run_loop(expressions, seed, busy=busy)


def run_parallel(
    kind: str, expressions: int, seed: int, *, busy: bool = False, processes: int | None = None
) -> Report:
    """``run`` (kind ``"run"``) or ``run_loop`` (``"loop"``) over ``expressions`` in chunks,
    one process per core: chunk ``i`` is seeded ``seed * 1000 + i``, so a run is as
    reproducible as a single-process one, only over other expressions."""
    processes = processes or os.cpu_count() or 1
    chunks = processes * 8  # small enough that one slow chunk does not hold the end back
    sizes = [expressions // chunks + (i < expressions % chunks) for i in range(chunks)]
    report = Report()
    context = multiprocessing.get_context("fork")  # the children inherit tests/support's path
    with ProcessPoolExecutor(max_workers=processes, mp_context=context) as pool:
        futures = [
            pool.submit(_chunk, kind, size, seed * 1000 + i, busy)
            for i, size in enumerate(sizes)
            if size
        ]
        for future in futures:
            report.add(future.result())
    return report
