"""A/B the drainer against the raw baselines: ``Drainer.drain()`` and the raw loops, interleaved.

    python -m benchmarks.drain_ab SERVER_URL [--n 10000] [--runs 5] [--variant NAME=ROOT ...]
        [--case strict --case batch:50 --case batch:500 --case raw-strict --case raw-batch:50 ...]
        [--case lease:1 --case raw-split:1 --case lease:500 --case raw-split:500 ...]
        [--case def-strict --case def-batch:50 ...] [--case pgqueuer-batch:500 ...]

Each run is its own subprocess (``once``) with ``PYTHONPATH`` set to a variant's source tree
(a directory holding a ``cronlock`` package, e.g. a symlink to a checkout's; ``raw-*`` and
``pgqueuer-*`` cases run once, not per variant: pgqueuer's ``QueueManager`` in drain mode with
that ``batch_size``, the harness's tuned peer), in a fresh scratch database (a ``def-``
case's no-op handler is a plain ``def``, run in the drainer's thread pool):
N no-op jobs are enqueued in bulk, then drained, and the rate is read from the database's
timestamps (first ``started_at`` to last ``completed_at``), as the harness does. The runs go
round-robin over cases and variants, ``--runs`` rounds (the variants in the other order
every other round), and each case's median and range is printed at the end. Each run also
prints, on stderr, the client's CPU time per job and the CPU time of the server process
behind the draining connection (from /proc: same host only), which a shared machine
disturbs far less than the wall clock. ``--profile FILE`` (with ``once``)
writes a cProfile of the drain.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _cpu_ticks(pid: int) -> int:
    # /proc/PID/stat: utime and stime are fields 14 and 15, counted after the ")" of the name.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _lane_pid(drainer: Any) -> int | None:
    # Private, and it moved: a list of lanes with ``raw`` before the drainer was split in
    # parts, a ``Lanes`` whose ``lanes`` have ``driver`` since; the A/B runs both.
    lanes = getattr(drainer._lanes, "lanes", drainer._lanes) or []
    driver = getattr(lanes[0], "driver", getattr(lanes[0], "raw", None)) if lanes else None
    return driver.get_server_pid() if driver is not None else None


async def _backend_cpu(task: asyncio.Task[Any], pid_of: Any) -> float:
    """CPU seconds (user + system) of the server process behind the draining connection, read
    from /proc until the task ends: the server's share of the work, less noisy than the wall
    clock on a shared machine (10 ms resolution)."""
    pid: int | None = None
    ticks = 0
    while not task.done():
        pid = pid or pid_of()
        if pid is not None:
            with contextlib.suppress(OSError, IndexError):
                ticks = _cpu_ticks(pid)
        await asyncio.sleep(0.005)
    await task
    return ticks / os.sysconf("SC_CLK_TCK")


_COSTS: dict[str, float] = {}  # the last run's CPU per job, in microseconds


def _print_costs(n: int, wall: float, client: float, server: float) -> None:
    _COSTS.update(client_us=client / n * 1e6, server_us=server / n * 1e6)
    print(
        f"# drain {wall:.3f} s wall; per job: client CPU {client / n * 1e6:.1f} us, "
        f"server CPU {server / n * 1e6:.1f} us",
        file=sys.stderr,
    )


async def _once_cronlock(
    url: str, n: int, mode: str, batch: int | None, profile: str, *, plain: bool = False
) -> float:
    from benchmarks.systems.cronlock_queue import CronlockQueue

    options: dict[str, Any] = {"commit_mode": mode, "batch_size": batch}
    system = CronlockQueue(url, {**options, "plain": True} if plain else options)
    try:
        await system.install()
        await system.enqueue_bulk(n)
        drainer = system._drainer()
        profiler = cProfile.Profile() if profile else None
        if profiler is not None:
            profiler.enable()
        wall, cpu = time.perf_counter(), time.process_time()
        drain = asyncio.create_task(drainer.drain())
        server = await _backend_cpu(drain, lambda: _lane_pid(drainer))
        result = drain.result()
        _print_costs(n, time.perf_counter() - wall, time.process_time() - cpu, server)
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile)
        if result.status.value != "completed" or result.stats["processed"] != n:
            raise RuntimeError(f"drain ended {result.status.value}: {result.to_dict()}")
        window = await system.window()
    finally:
        await system.close()
    return window.completed / window.seconds


async def _once_raw(url: str, n: int, mode: str, batch: int | None) -> float:
    from benchmarks.systems.raw import RawQueue

    system = RawQueue(url, {"mode": mode, "batch_size": batch or 1})
    try:
        await system.install()
        await system.enqueue_bulk(n)
        wall, cpu = time.perf_counter(), time.process_time()
        conn = await system._connection()
        drain = asyncio.create_task(system.drain())
        server = await _backend_cpu(drain, conn.get_server_pid)
        drain.result()
        _print_costs(n, time.perf_counter() - wall, time.process_time() - cpu, server)
        window = await system.window()
    finally:
        await system.close()
    return window.completed / window.seconds


async def _once_pgqueuer(url: str, n: int, batch: int | None) -> float:
    import asyncpg

    from benchmarks.systems.pgqueuer_queue import PgQueuerQueue

    system = PgQueuerQueue(url, {"batch_size": batch or 10})
    watcher = await asyncpg.connect(url)
    try:
        await system.install()
        await system.enqueue_bulk(n)
        found: list[int] = []

        async def find_backend() -> None:  # the drain's own connection, once it is open
            while not found:
                pid = await watcher.fetchval(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid() AND pid <> $1"
                    " AND backend_type = 'client backend'",
                    system._conn.get_server_pid(),
                )
                if pid is not None:
                    found.append(pid)
                await asyncio.sleep(0.002)

        wall, cpu = time.perf_counter(), time.process_time()
        drain = asyncio.create_task(system.drain())
        finder = asyncio.create_task(find_backend())
        server = await _backend_cpu(drain, lambda: found[0] if found else None)
        finder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await finder
        _print_costs(n, time.perf_counter() - wall, time.process_time() - cpu, server)
        window = await system.window()
    finally:
        await watcher.close()
        await system.close()
    return window.completed / window.seconds


async def once(server: str, case: str, n: int, profile: str) -> float:
    from benchmarks.scratch import scratch_database

    if case.startswith("pgqueuer-"):
        async with scratch_database(server, "drain_ab") as url:
            return await _once_pgqueuer(url, n, int(case.partition(":")[2] or 10))
    prefixed = case.startswith(("raw-", "def-"))
    system, _, rest = case.partition("-") if prefixed else ("cronlock", "", case)
    mode, _, size = rest.partition(":")
    batch = int(size) if size else None
    async with scratch_database(server, "drain_ab") as url:
        if system == "raw":
            return await _once_raw(url, n, mode, batch)
        return await _once_cronlock(url, n, mode, batch, profile, plain=system == "def")


def _run(server: str, case: str, n: int, root: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": f"{root}:{ROOT}"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.drain_ab",
            server,
            "once",
            "--case",
            case,
            "--n",
            str(n),
        ],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{case} in {root} failed: {done.stderr[-2000:]}")
    answer: dict[str, float] = json.loads(done.stdout)
    return answer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("server")
    parser.add_argument("command", nargs="?", default="compare", choices=["compare", "once"])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--case", action="append")
    parser.add_argument("--variant", action="append", default=[])
    parser.add_argument("--profile", default="")
    options = parser.parse_args()
    cases: list[str] = options.case or ["strict", "batch:50", "batch:500"]
    if options.command == "once":
        rate = asyncio.run(once(options.server, cases[0], options.n, options.profile))
        print(json.dumps({"rate": rate, **_COSTS}))
        return
    variants = dict(v.split("=", 1) for v in options.variant) or {"this": str(ROOT)}
    runs: dict[str, list[dict[str, float]]] = defaultdict(list)
    started = time.monotonic()
    for round_number in range(options.runs):
        for case in cases:
            alone = case.startswith(("raw-", "pgqueuer-"))
            targets = list(({"raw": "/nonexistent"} if alone else variants).items())
            if round_number % 2:  # every other round the other order: a run's place in its
                targets.reverse()  # round moved lease:1 by a tenth (BENCHMARKS.md)
            for name, root in targets:
                label = case if alone else f"{name} {case}"
                run = _run(options.server, case, options.n, root)
                runs[label].append(run)
                print(
                    f"{label}: {run['rate']:,.0f} jobs/s, CPU per job: client "
                    f"{run['client_us']:.1f} us, server {run['server_us']:.1f} us",
                    file=sys.stderr,
                    flush=True,
                )
    print(f"# {options.runs} rounds of N={options.n} in {time.monotonic() - started:.0f} s")
    for label, results in runs.items():
        rates = [r["rate"] for r in results]
        client = statistics.median(r["client_us"] for r in results)
        server = statistics.median(r["server_us"] for r in results)
        print(
            f"{label:24} median {statistics.median(rates):9,.0f}  "
            f"({min(rates):,.0f}..{max(rates):,.0f}) jobs/s; "
            f"median CPU per job: client {client:.1f} us, server {server:.1f} us"
        )


if __name__ == "__main__":
    main()
