"""The feature-by-mode matrix (DESIGN.md invariant 12): what every feature promises in each
commit mode (strict, batch, lease) and queue mode (exclusive, shared), as data.

``MATRIX`` maps a feature to its expectation in each of the six cells: ``WORKS``, an explicit
``Refused(message)`` (the one line a user gets at registration or enqueue), or
``KnownBroken(reason)``: promised to work, failing today for the reason given (issue 22). A new
feature adds a row, a new mode a column. ``tests/integration/test_matrix.py`` runs every cell
(a known-broken cell is a strict xfail: the run fails the day it starts to pass, so that it is
flipped to ``WORKS``), and ``tests/unit/test_matrix_readme.py`` checks that the README's table
("Features in every mode") says what this says: ✓ for a cell that works, ``refused: …`` for a
refusal, and ✗ for a known-broken cell until it is fixed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

COMMIT_MODES: Final = ("strict", "batch", "lease")
QUEUE_MODES: Final = ("exclusive", "shared")


@dataclass(frozen=True, order=True)
class Cell:
    """One column of the matrix: a commit mode and whether the queue is shared."""

    commit_mode: str
    queue_mode: str

    @property
    def shared(self) -> bool:
        return self.queue_mode == "shared"

    @property
    def lease(self) -> bool:
        return self.commit_mode == "lease"

    @property
    def header(self) -> str:
        """The README's column header: ``strict``, ``strict, shared``, …"""
        return self.commit_mode if not self.shared else f"{self.commit_mode}, shared"

    @property
    def id(self) -> str:
        return f"{self.commit_mode}-{self.queue_mode}"


CELLS: Final = tuple(Cell(c, q) for c in COMMIT_MODES for q in QUEUE_MODES)


@dataclass(frozen=True)
class Works:
    """The feature holds in this cell."""


@dataclass(frozen=True)
class Refused:
    """The feature is refused in this cell with this one line, at registration or enqueue."""

    message: str


@dataclass(frozen=True)
class KnownBroken:
    """Promised to work, failing today (what happens, for the one who fixes it)."""

    reason: str


Expectation = Works | Refused | KnownBroken
WORKS: Final = Works()

ISSUE = "issue 22"


def every(expectation: Expectation = WORKS, **cells: Expectation) -> dict[Cell, Expectation]:
    """One row: ``expectation`` in every cell but those named (``lease_shared=…``)."""
    row: dict[Cell, Expectation] = {cell: expectation for cell in CELLS}
    for name, given in cells.items():
        commit_mode, _, queue_mode = name.partition("_")
        cell = Cell(commit_mode, queue_mode)
        if cell not in row:
            raise ValueError(f"no cell {name!r}")
        row[cell] = given
    return row


# The rows, in the README's order. Each row's cells say what the test of that feature asserts
# there (tests/integration/test_matrix.py, one scenario per row).
MATRIX: Final[Mapping[str, Mapping[Cell, Expectation]]] = {
    "dedup key: while waiting": every(),
    "dedup key: while running": every(),
    "dedup key: a retry of a job whose key another job took": every(),
    "dedup key: concurrent enqueues": every(),
    "per-key concurrency limit": every(),
    "priority": every(),
    "delay and run_at": every(),
    "retries and backoff": every(),
    "timeout (the job type's)": every(),
    "timeout (per job, at enqueue)": every(),
    "JobCancel and JobSnooze returned": every(),
    "cooperative cancel of a running job": every(),
    "queue pause and resume": every(),
    "tracing spans": every(),
    "a lost worker: its job runs again, not charged; its late completion is fenced": every(),
    "a job that keeps losing its worker is stopped": every(),
    "a plain def handler: its writes commit with its job": every(),
    "an unknown job type": every(),
    "results: Decimal and dates": every(),
    "app.wait: woken by the completion": every(),
    "typed payload: the handler receives the model": every(),
    "typed payload: a stored payload that no longer fits fails its attempt": every(),
    "depends_on: a job runs after its parents, and is cancelled with a failed one": every(),
}


# -- the docs' table (docs/explanation/guarantees.md, once the README's) --------------------

README_SECTION: Final = "## Features in every mode"
YES: Final = "✓"
BROKEN: Final = f"✗ ({ISSUE})"


def shown(expectation: Expectation) -> str:
    """How the README shows a cell: what works, what is refused, and what is broken today."""
    if isinstance(expectation, Works):
        return YES
    if isinstance(expectation, Refused):
        return f"refused: {expectation.message}"
    return BROKEN


def table_of(matrix: Mapping[str, Mapping[Cell, Expectation]]) -> dict[str, dict[str, str]]:
    """The matrix as the README shows it: feature → column header → cell text."""
    return {
        feature: {cell.header: shown(row[cell]) for cell in CELLS}
        for feature, row in matrix.items()
    }


def render(matrix: Mapping[str, Mapping[Cell, Expectation]]) -> str:
    """The README's table for ``matrix`` (what to paste when a row or a cell changes)."""
    lines = [
        "| feature | " + " | ".join(cell.header for cell in CELLS) + " |",
        "|---|" + "---|" * len(CELLS),
    ]
    for feature, cells in table_of(matrix).items():
        lines.append(f"| {feature} | " + " | ".join(cells.values()) + " |")
    return "\n".join(lines)


class TableError(AssertionError):
    """The README's matrix table is missing or malformed."""


def parse_table(readme: str) -> dict[str, dict[str, str]]:
    """The first table under ``README_SECTION``: feature → column header → cell text."""
    start = readme.find(f"\n{README_SECTION}\n")
    if start < 0:
        raise TableError(f"the README has no section {README_SECTION!r}")
    body = readme[start + len(README_SECTION) + 2 :]
    end = re.search(r"^#{1,2} ", body, flags=re.MULTILINE)
    section = body[: end.start()] if end else body
    rows = [line.strip() for line in section.splitlines() if line.strip().startswith("|")]
    if len(rows) < 3:
        raise TableError(f"no table under {README_SECTION!r}")

    def cells(line: str) -> list[str]:
        return [text.strip() for text in line.strip("|").split("|")]

    header, rule, *data = rows
    names = cells(header)
    if not all(re.fullmatch(r":?-+:?", c) for c in cells(rule)):
        raise TableError(f"the table's second line is not its rule: {rule!r}")
    table: dict[str, dict[str, str]] = {}
    for line in data:
        values = cells(line)
        if len(values) != len(names):
            raise TableError(f"{len(values)} cells where the header has {len(names)}: {line!r}")
        feature, *rest = values
        if feature in table:
            raise TableError(f"feature {feature!r} twice")
        table[feature] = dict(zip(names[1:], rest, strict=True))
    return table
