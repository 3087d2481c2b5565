"""A task's slots over a window, each with its outcome: the dashboard's slot picture.

The schedule says which slots there were (walked back from now, at most ``MAX_CELLS``); the
task's rows since the window's first slot say what became of each (one range of
``ix_runs_task_started_at``). A slot's outcome is its claiming row's status (completed,
partial, failed, missed), else ``skipped`` when only skips were recorded for it (the lock was
busy: the task was running, not forgotten; a chunked run's claiming row may also say
running or interrupted), else, with no row at all: ``due`` while it is
within its grace, ``missed`` once past it (nobody fired it; the scheduler or the task's next
run records the row), or ``none`` before the task's history begins (it did not exist yet, or
retention removed those rows; leading ones are left out of the picture). A task this app does
not register has no schedule here: its picture is the slots its rows name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from .. import sql
from ..app import App
from ..outcome import RUN_CLAIMING_STATUSES
from ..periodic.task import PeriodicTask

__all__ = ["MAX_CELLS", "OUTCOMES", "Cell", "SlotPicture", "slot_picture"]

# The most slots one picture shows (the latest ones): a day of a minutely task.
MAX_CELLS = 1440
# Rows read for one picture at most (skips can be many per slot).
MAX_ROWS = 20_000
_TICK = timedelta(microseconds=1)
_CLAIMING = {status.value for status in RUN_CLAIMING_STATUSES}

# Every outcome a cell can have, with the word its legend and its text say.
OUTCOMES = {
    "completed": "completed",
    "partial": "partial: some items failed",
    "failed": "failed",
    "skipped": "skipped: the lock was busy",
    "missed": "missed: nobody ran it",
    "running": "running now (a chunked run)",
    "interrupted": "interrupted: its process or lock was lost mid-run",
    "due": "due: within its grace",
    "none": "no record: before the task's history",
}


@dataclass(frozen=True)
class Cell:
    slot: datetime
    outcome: str
    run_id: int | None
    recorded: bool  # False: no row (a missed slot nobody recorded yet, due, or none)
    items_ok: int = 0
    items_failed: int = 0

    @property
    def text(self) -> str:
        """What the cell says to a screen reader and on hover, beside its colour."""
        words = OUTCOMES.get(self.outcome, self.outcome)
        if self.outcome == "missed" and not self.recorded:
            words += " (not recorded yet)"
        if self.items_failed:
            ok = "1 item" if self.items_ok == 1 else f"{self.items_ok:,} items"
            words += f", {ok} ok, {self.items_failed:,} failed"
        return words


@dataclass(frozen=True)
class SlotPicture:
    start: datetime
    end: datetime
    cells: tuple[Cell, ...]
    truncated: bool  # the window held more than MAX_CELLS slots: the latest are shown
    history_from: datetime | None = None  # the task's first row, when inside the window

    def counts(self) -> dict[str, int]:
        found: dict[str, int] = dict.fromkeys(OUTCOMES, 0)
        for cell in self.cells:
            found[cell.outcome] = found.get(cell.outcome, 0) + 1
        return found


def _cell(slot: datetime, rows: list[Mapping[str, Any]]) -> Cell | None:
    claiming = [row for row in rows if row["status"] in _CLAIMING]
    if claiming:
        row = claiming[-1]
        return Cell(slot, row["status"], row["id"], True, row["items_ok"], row["items_failed"])
    if rows:
        return Cell(slot, "skipped", rows[-1]["id"], True)
    return None


async def slot_picture(
    app: App,
    name: str,
    *,
    now: datetime,
    window: timedelta,
) -> SlotPicture:
    """The slots of task ``name`` in (now - window, now], oldest first."""
    task: PeriodicTask | None = app.tasks.get(name)
    start = now - window
    slots: list[datetime] = []
    truncated = False
    if task is not None:
        cursor = now
        while (slot := task.schedule.slot_at(cursor)) is not None and slot > start:
            if len(slots) == MAX_CELLS:
                truncated = True
                break
            slots.append(slot)
            cursor = slot - _TICK
        slots.reverse()
    early = task.policy.early if task is not None else timedelta(0)
    since = (slots[0] if slots else start) - early
    async with app.database.connect() as conn:
        rows = (
            await conn.execute(
                sql.RUN_OF_TASK_SINCE, {"task": name, "since": since, "limit": MAX_ROWS}
            )
        ).mappings()
        by_slot: dict[datetime, list[Mapping[str, Any]]] = {}
        for row in rows:
            if row["slot"] is not None:
                by_slot.setdefault(row["slot"], []).append(dict(row))
        history = (await conn.execute(sql.RUN_LAST_SLOT_PER_TASK, {"tasks": [name]})).one_or_none()
    first_row = None if history is None else history.first_started_at
    if task is None:
        slots = sorted(slot for slot in by_slot if slot > start)[-MAX_CELLS:]
    cells = []
    for slot in slots:
        cell = _cell(slot, by_slot.get(slot, []))
        if cell is None:
            if task is not None and slot + task.policy.grace >= now:
                cell = Cell(slot, "due", None, False)
            elif first_row is None or slot < first_row - early:
                cell = Cell(slot, "none", None, False)
            else:
                cell = Cell(slot, "missed", None, False)
        cells.append(cell)
    # Slots before the task's history began are left out (a task declared yesterday would
    # show a day of them); the picture says where its history starts.
    while cells and cells[0].outcome == "none":
        cells.pop(0)
    return SlotPicture(
        start=start,
        end=now,
        cells=tuple(cells),
        truncated=truncated,
        history_from=first_row if first_row is not None and first_row > start else None,
    )
