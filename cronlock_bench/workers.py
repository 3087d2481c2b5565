"""Real ``cronlock worker`` processes on the scratch schema, for latency and recovery.

Each is started as the command line (``python -m cronlock worker``) with the bench's app
(``cronlock_bench.app``), the scratch schema and queue in its environment. Which one is active
is read from the ``workers`` table their heartbeats write. Leaving the context kills every
child still alive, whatever happened.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import time
from types import TracebackType
from typing import IO

from . import sql as bench_sql
from .scratch import Scratch

__all__ = ["WORKER_APP", "Workers"]

WORKER_APP = "cronlock_bench.app"
START_TIMEOUT = 60.0
POLL = 0.02


class Workers:
    def __init__(self, scratch: Scratch) -> None:
        self.scratch = scratch
        self.children: list[asyncio.subprocess.Process] = []
        self._logs: dict[int, IO[bytes]] = {}

    async def __aenter__(self) -> Workers:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for child in self.children:
            if child.returncode is None:
                child.kill()
            await child.wait()
        for log in self._logs.values():
            log.close()

    def _environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CRONLOCK_")}
        env["CRONLOCK_DATABASE_URL"] = self.scratch.url
        env["CRONLOCK_SCHEMA"] = self.scratch.schema
        env["CRONLOCK_APP"] = WORKER_APP
        return env

    async def start(self) -> asyncio.subprocess.Process:
        """A worker, returned once its heartbeat is in the workers table (standby or active)."""
        log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in __aexit__, with the child)
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "cronlock",
            "worker",
            "--queue",
            self.scratch.queue,
            "--grace-period",
            "5",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=log,
            env=self._environment(),
        )
        self.children.append(child)
        self._logs[child.pid] = log
        deadline = time.monotonic() + START_TIMEOUT
        while child.pid not in await self.states():
            if child.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"a worker did not start: {self._last_words(child)}")
            await asyncio.sleep(POLL)
        return child

    def _last_words(self, child: asyncio.subprocess.Process) -> str:
        log = self._logs[child.pid]
        log.seek(0)
        lines = log.read().decode(errors="replace").strip().splitlines()
        if child.returncode is None:
            return "no heartbeat in time"
        return f"exit {child.returncode}: " + (lines[-1] if lines else "no output")

    def alive(self) -> list[asyncio.subprocess.Process]:
        return [child for child in self.children if child.returncode is None]

    async def states(self) -> dict[int, str]:
        """pid → state of the live children, as their heartbeats last wrote it."""
        live = {child.pid for child in self.alive()}
        async with self.scratch.database.connect() as conn:
            rows = await conn.execute(bench_sql.BENCH_WORKERS, {"queue": self.scratch.queue})
            return {pid: state for pid, state in rows if pid in live}

    async def active(self, within: float = START_TIMEOUT) -> asyncio.subprocess.Process:
        """The active worker, once the table shows one active and every other live child a
        standby (a state changes at the next heartbeat, within two seconds)."""
        deadline = time.monotonic() + within
        while True:
            states = await self.states()
            actives = [pid for pid, state in states.items() if state == "active"]
            complete = len(states) == len(self.alive())
            if (
                complete
                and len(actives) == 1
                and len(states) - 1 == sum(state == "standby" for state in states.values())
            ):
                return next(c for c in self.children if c.pid == actives[0])
            if time.monotonic() > deadline:
                raise RuntimeError(f"no single active worker in time: {states}")
            await asyncio.sleep(POLL)

    @staticmethod
    async def kill(child: asyncio.subprocess.Process) -> None:
        child.kill()  # SIGKILL: no goodbye; its transaction dies with its socket
        await child.wait()

    @staticmethod
    async def stop(child: asyncio.subprocess.Process, within: float = 10.0) -> None:
        if child.returncode is None:
            child.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(child.wait(), within)
            except TimeoutError:
                child.kill()
                await child.wait()
