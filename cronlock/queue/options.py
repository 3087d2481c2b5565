"""How a drainer drains: one typed value, ``DrainOptions``, from the caller to the lanes.

``App.drainer``, ``App.drain``, the command line's ``drain`` and ``worker``, ``Drainer`` and its
lanes all take this one frozen value instead of re-declaring its fields at each layer. It is
checked once, when made (a ``ValueError`` or ``InvalidJobOption`` naming the field), and knows
the batch size each commit mode takes when none is given.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from ..sql.tables import DEFAULT_QUEUE
from ..sql.workers import WORKER_HEARTBEAT_SECONDS
from .jobs import check_queue
from .lease import DEFAULT_KEEPALIVE, Keepalive
from .liveness import DEFAULT_SWEEP_INTERVAL

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_HEARTBEAT_INTERVAL",
    "DEFAULT_POLL_INTERVAL",
    "CommitMode",
    "DrainOptions",
]

DEFAULT_BATCH_SIZE = 50  # below PostgreSQL's 64 cached subtransactions per backend
# Seconds between checks for due jobs when no notification comes (LISTEN/NOTIFY wakes at once).
DEFAULT_POLL_INTERVAL = 5.0
# Seconds between heartbeats (the workers row, the lock connection's ping): the interval the
# one liveness rule (sql.WORKER_ALIVE_WITHIN) counts beats of.
DEFAULT_HEARTBEAT_INTERVAL = WORKER_HEARTBEAT_SECONDS


class CommitMode(enum.StrEnum):
    STRICT = "strict"  # one job per transaction
    BATCH = "batch"  # one transaction (and one outcome UPDATE) per batch
    LEASE = "lease"  # the claim commits; handlers run outside any transaction (leased.py)


@dataclass(frozen=True)
class DrainOptions:
    """A drainer's options (see ``App.drainer`` for what each does). ``clock`` and ``rng`` are
    for tests: the retry backoff's time and jitter."""

    queue: str = DEFAULT_QUEUE
    commit_mode: CommitMode | str = CommitMode.STRICT
    batch_size: int | None = None
    concurrency: int = 1
    threads: int | None = None  # plain def handlers' pool (threads.py); None: concurrency
    shared: bool = False
    poll_interval: float = DEFAULT_POLL_INTERVAL
    heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL
    keepalive: Keepalive | None = DEFAULT_KEEPALIVE
    sweep_interval: float = DEFAULT_SWEEP_INTERVAL
    clock: Callable[[], datetime] | None = None
    rng: random.Random | None = None

    def __post_init__(self) -> None:
        check_queue(self.queue)
        object.__setattr__(self, "commit_mode", CommitMode(self.commit_mode))
        if (
            (self.batch_size is not None and self.batch_size < 1)
            or self.concurrency < 1
            or (self.threads is not None and self.threads < 1)
        ):
            raise ValueError("batch_size, concurrency and threads must be at least 1")

    @property
    def mode(self) -> CommitMode:
        return CommitMode(self.commit_mode)

    @property
    def batch(self) -> int:
        """Jobs per claim: 1 in strict mode, else the given size or the mode's default (1 in
        the lease mode, for long jobs; ``DEFAULT_BATCH_SIZE`` in batch mode)."""
        if self.mode is CommitMode.STRICT:
            return 1
        if self.mode is CommitMode.LEASE:
            return self.batch_size or 1
        return self.batch_size or DEFAULT_BATCH_SIZE
