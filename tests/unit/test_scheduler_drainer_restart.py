"""`scheduler --with-drainer`: a drainer that ends on its own is started again; one told to stop
is not. (A stand-in drainer: what is tested is the supervision, not the queue.)"""

from __future__ import annotations

import asyncio
from typing import Any

from cronlock.cli import _drainer_service
from cronlock.outcome import DrainResult, RunStatus


class StandInDrainer:
    def __init__(self, app: StandInApp) -> None:
        self.app = app
        self.stopped = asyncio.Event()

    async def work(self) -> DrainResult:
        self.app.started += 1
        if self.app.started == 1:  # the first one loses its database at once
            return DrainResult("default", RunStatus.FAILED, {}, error="lost its database")
        self.app.running.set()
        await self.stopped.wait()
        return DrainResult("default", RunStatus.COMPLETED, {})

    def stop(self) -> None:
        self.stopped.set()

    def abort(self) -> None:
        self.stopped.set()


class StandInApp:
    def __init__(self) -> None:
        self.started = 0
        self.running = asyncio.Event()

    def drainer(self, **_: Any) -> StandInDrainer:
        return StandInDrainer(self)


async def test_a_drainer_that_ends_on_its_own_starts_again() -> None:
    app = StandInApp()
    stop = asyncio.Event()
    serving = asyncio.create_task(_drainer_service(app, 1.0, restart_delay=0)(stop))  # type: ignore[arg-type]
    await asyncio.wait_for(app.running.wait(), 10)
    assert app.started == 2
    stop.set()
    await asyncio.wait_for(serving, 10)
    assert app.started == 2  # stopped with the scheduler: not started again
