"""``cronlock bench`` from start to end: the scratch schema, the steps in order, the report.

Repeats are interleaved (every section once, then again) so that a slow minute of a shared
machine spreads over the sections instead of hitting one. Whatever happens — a step that
fails, Ctrl-C, SIGTERM — the worker processes are killed and the scratch schema is dropped.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import platform
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from sqlalchemy.exc import DBAPIError

from cronlock.database import Database
from cronlock.queue.drainer import CommitMode

from . import sql as bench_sql
from .drain import measure_drain
from .enqueue import measure_enqueue
from .latency import measure_latency
from .options import BenchOptions
from .periodic import measure_periodic
from .progress import Progress
from .recovery import measure_recovery
from .report import summarise
from .scratch import Scratch, one_line, scratch_schema

__all__ = ["BenchFailed", "run_bench"]


class BenchFailed(Exception):
    """A step of the bench failed (or was interrupted); the scratch schema was dropped."""


@dataclass(frozen=True)
class Step:
    section: str
    label: str
    run: Callable[[Scratch, Progress], Awaitable[dict[str, Any]]]
    weight: float  # roughly the seconds it takes, for the progress bar


def plan(options: BenchOptions) -> list[Step]:
    steps: list[Step] = []
    for repeat in range(options.repeats):
        suffix = f" (run {repeat + 1} of {options.repeats})" if options.repeats > 1 else ""
        if options.runs("enqueue"):
            bulk, single = options.enqueue_bulk, options.enqueue_single
            label = f"enqueue {bulk:,} in bulk, {single:,} one at a time"
            run = partial(measure_enqueue, bulk=bulk, single=single)
            steps.append(Step("enqueue", label + suffix, run, bulk / 20_000 + single / 800))
        if options.runs("drain"):
            for n in options.sizes:
                for mode in options.modes:
                    label = f"drain {n:,} jobs, {mode.value}"
                    run = partial(measure_drain, n=n, mode=mode, batch_size=options.batch_size)
                    rate = 800 if mode is CommitMode.STRICT else 8_000
                    steps.append(Step("drain", label + suffix, run, 0.5 + n / rate))
        latency_rate, seconds = options.latency_rate, options.latency_seconds
        if options.runs("latency"):
            label = f"latency at {latency_rate:g} jobs/s for {seconds:g} s"
            run = partial(measure_latency, rate=latency_rate, seconds=seconds)
            steps.append(Step("latency", label + suffix, run, 3 + seconds))
        if options.runs("periodic"):
            label = f"periodic run over {options.items:,} items"
            run = partial(measure_periodic, items=options.items)
            steps.append(Step("periodic", label + suffix, run, 0.5 + options.items / 1_500))
        if options.runs("recovery"):
            kills = options.recovery_kills
            label = (
                f"recovery, {kills} SIGKILL{'s' if kills > 1 else ''} at {latency_rate:g} jobs/s"
            )
            run = partial(measure_recovery, kills=kills, rate=latency_rate)
            steps.append(Step("recovery", label + suffix, run, 2 + 3 * kills))
    return steps


async def environment(scratch: Scratch) -> dict[str, Any]:
    async with scratch.database.connect() as conn:
        server = (await conn.execute(bench_sql.BENCH_SERVER)).one()
    return {
        "cronlock": importlib.metadata.version("cronlock"),
        "postgresql": server.server_version,
        "fsync": server.fsync,
        "synchronous_commit": server.synchronous_commit,
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "cores": os.cpu_count(),
        "database": Database(scratch.url).display_url,
        "schema": scratch.schema,
    }


async def run_bench(url: str, options: BenchOptions, progress: Progress) -> dict[str, Any]:
    """Measure; return the report (``report.summarise``). Raises ``BenchFailed``."""
    main = asyncio.current_task()
    loop = asyncio.get_running_loop()
    terminated: list[int] = []

    def on_sigterm() -> None:
        terminated.append(signal.SIGTERM)
        if main is not None:
            main.cancel()

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    steps = plan(options)
    results: dict[str, list[dict[str, Any]]] = {}
    current = "setup"
    try:
        async with scratch_schema(url) as scratch:
            about = await environment(scratch)
            progress.start([max(round(10 * step.weight), 1) for step in steps])
            for step in steps:
                current = step.section
                progress.begin(step.label)
                if options.fail_at == step.section:
                    raise RuntimeError("failing on purpose (--fail-at)")
                results.setdefault(step.section, []).append(await step.run(scratch, progress))
                progress.end()
    except asyncio.CancelledError:
        if not terminated:
            raise  # Ctrl-C: asyncio.run turns it back into KeyboardInterrupt
        raise BenchFailed("stopped by SIGTERM; the scratch schema was dropped") from None
    except (RuntimeError, TimeoutError, OSError, DBAPIError) as exc:
        if current == "setup":
            raise  # no database, or not one the bench may use: a usage error
        message = one_line(exc) if isinstance(exc, DBAPIError | OSError) else str(exc)
        raise BenchFailed(
            f"the {current} step failed: {message}; the scratch schema was dropped"
        ) from None
    finally:
        progress.finish()
        loop.remove_signal_handler(signal.SIGTERM)
        sys.stderr.flush()
    return summarise(about, options, results)
