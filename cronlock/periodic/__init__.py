"""Periodic tasks: the declaration, its slot policy and what its body receives (``task``), a
run under the task's advisory lock with one recorded outcome (``run``), the savepoint of each
item (``items``), and a chunked run's commits (``chunks``) and lock connection (``guard``)."""

from __future__ import annotations

from .run import execute, record_missed, run_slot
from .task import Misfire, PeriodicTask, Run, SlotPolicy, TaskBody, resolve_slot

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
