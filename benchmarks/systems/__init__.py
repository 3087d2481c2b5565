"""The systems the harness measures, each behind the same small adapter (``base.QueueSystem``).

Each adapter module imports its own library only, so a 3.12-only peer (oban) can run in its
own interpreter without cronlock or the other peers installed there.
"""

from __future__ import annotations

import importlib

from .base import QueueSystem

__all__ = ["SYSTEMS", "load"]

# name -> module:class; imported lazily so that a missing peer only fails its own runs.
SYSTEMS = {
    "raw": "benchmarks.systems.raw:RawQueue",
    "procrastinate": "benchmarks.systems.procrastinate_queue:ProcrastinateQueue",
    "pgqueuer": "benchmarks.systems.pgqueuer_queue:PgQueuerQueue",
    "oban": "benchmarks.systems.oban_queue:ObanQueue",
    "cronlock": "benchmarks.systems.cronlock_queue:CronlockQueue",
}


def load(name: str) -> type[QueueSystem]:
    """The adapter class of system ``name``."""
    module_name, _, attr = SYSTEMS[name].partition(":")
    cls: type[QueueSystem] = getattr(importlib.import_module(module_name), attr)
    return cls
