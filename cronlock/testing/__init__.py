"""cronlock's testing kit: test a user's own jobs and periodic tasks against real PostgreSQL.

- ``cronlock.testing.plugin``, the pytest plugin (entry point ``cronlock``): a freshly
  migrated database per test (``cronlock_database_url``), copied from a template migrated
  once (``DatabasePool``), and ``cronlock_clock``, a ``TestClock`` on it.
- ``TestClock``: one frozen time for Python (cronlock's clock seams) and for the database's
  ``now()``; ``set`` and ``advance`` move both.
- ``enqueued`` / ``assert_enqueued``: the jobs of a type whose payload matches, read from the
  jobs table; the assertion's failure lists what was enqueued.
- ``drain_until_idle``: drain until nothing is due, moving a clock through backoffs; ``eager``
  drains what a block enqueued when it ends.

docs/how-to/testing.md walks through it; tests/integration/test_testing_kit.py is its example.
"""

from __future__ import annotations

from .clock import TestClock
from .databases import SERVER_ENV, ConnectionsLeftOpen, DatabasePool, server_url
from .queue import Drained, assert_enqueued, drain_until_idle, eager, enqueued

__all__ = [
    "SERVER_ENV",
    "ConnectionsLeftOpen",
    "DatabasePool",
    "Drained",
    "TestClock",
    "assert_enqueued",
    "drain_until_idle",
    "eager",
    "enqueued",
    "server_url",
]
