"""Periodic tasks: the declaration and its slot policy (``task``), a run under the task's
advisory lock with one recorded outcome (``run``), the savepoint of each item (``items``), and
a chunked run's commits (``chunks``) and lock connection (``guard``)."""

from __future__ import annotations

from .run import Run, execute, record_missed, run_slot
from .task import Misfire, PeriodicTask, SlotPolicy, TaskBody, resolve_slot

__all__ = [
    "Misfire",
    "PeriodicTask",
    "Run",
    "SlotPolicy",
    "TaskBody",
    "execute",
    "record_missed",
    "resolve_slot",
    "run_slot",
]
