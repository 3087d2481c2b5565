"""One measurement in one process: ``python -m benchmarks.agent WORKLOAD SYSTEM URL OPTIONS``.

The orchestrator (``benchmarks.run``) starts an agent per run, with the interpreter the system
needs (oban-py needs Python 3.12), on a scratch database it created; the agent installs the
system's schema, measures, and prints one JSON object on its last stdout line. Workloads:

- ``drain``: enqueue N no-op jobs in bulk, then process them all; throughput is N over the
  database's first-claim-to-last-completion window (the wall time of the call is kept too).
- ``enqueue``: bulk enqueue of N jobs in one call, then M jobs one at a time, each in its own
  transaction; rates on the client's clock (enqueue has no server-side timestamps to read).
- ``latency``: an idle worker in a child process (``serve``); jobs enqueued one at a time at
  a steady rate; latency is the job's completion timestamp in the database minus the client's
  clock read just before its enqueue began (same host, same clock).
- ``recovery``: an active worker and a standby (two ``serve`` children), jobs at a steady
  rate, SIGKILL of the active one; the time from the kill (client clock) to the first job
  completed after it (database).
- ``savepoints``: the periodic path (``benchmarks.savepoints``), ``raw`` or ``cronlock``.
- ``serve``: the idle worker itself, until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from typing import Any

from .stats import percentile
from .systems import load
from .systems.base import QueueSystem

__all__ = ["main"]

READY = "ready"
WARMUP_JOBS = 5


async def _drain(system: QueueSystem, n: int) -> dict[str, Any]:
    started = time.perf_counter()
    await system.enqueue_bulk(n)
    enqueue_s = time.perf_counter() - started
    started = time.perf_counter()
    await system.drain()
    wall_s = time.perf_counter() - started
    window = await system.window()
    if window.completed != n:
        raise RuntimeError(f"{system.name}: {window.completed} of {n} jobs completed")
    return {
        "n": n,
        "seconds": window.seconds,
        "jobs_per_s": n / window.seconds if window.seconds > 0 else float("inf"),
        "wall_s": wall_s,
        "wall_jobs_per_s": n / wall_s,
        "enqueue_bulk_s": enqueue_s,
        **({"p95_ms": window.p95_ms} if window.p95_ms is not None else {}),
        **(
            {"reported_p95_ms": system.reported_p95_ms}
            if system.reported_p95_ms is not None
            else {}
        ),
    }


async def _enqueue(system: QueueSystem, bulk: int, single: int) -> dict[str, Any]:
    started = time.perf_counter()
    await system.enqueue_bulk(bulk)
    bulk_s = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(single):
        await system.enqueue_one()
    single_s = time.perf_counter() - started
    return {
        "bulk_n": bulk,
        "bulk_s": bulk_s,
        "bulk_per_s": bulk / bulk_s,
        "single_n": single,
        "single_s": single_s,
        "single_per_s": single / single_s,
    }


async def _wait_completed(
    system: QueueSystem, ids: list[object], within: float
) -> dict[object, float]:
    deadline = time.monotonic() + within
    while True:
        done = await system.completed_at(ids)
        if len(done) == len(ids):
            return done
        if time.monotonic() > deadline:
            raise RuntimeError(f"{system.name}: {len(done)} of {len(ids)} jobs completed in time")
        await asyncio.sleep(0.05)


async def _start_worker(argv: list[str]) -> asyncio.subprocess.Process:
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.agent", "serve", *argv, stdout=asyncio.subprocess.PIPE
    )
    assert worker.stdout is not None
    line = await asyncio.wait_for(worker.stdout.readline(), 60)
    if line.decode().strip() != READY:
        raise RuntimeError(f"the worker did not start: {line!r}")
    return worker


async def _stop_worker(worker: asyncio.subprocess.Process) -> None:
    if worker.returncode is None:
        worker.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(worker.wait(), 30)
        except TimeoutError:
            worker.kill()
            await worker.wait()


async def _latency(
    system: QueueSystem,
    argv: list[str],
    rate: float,
    seconds: float,
    producers: list[QueueSystem] | None = None,
) -> dict[str, Any]:
    """Steady enqueues from ``producers`` (each its own connection), an idle worker process.

    One producer enqueueing one job at a time cannot reach 500 jobs/s on a busy 2-core machine
    for every library, so faster rates are split over several producers, each sending its
    share on the same schedule; the rate actually achieved is reported.
    """
    producers = producers or [system]
    worker = await _start_worker(argv)
    try:
        # Warm-up jobs: the worker is listening and its connections are open before timing.
        warm = [await p.enqueue_one() for p in producers for _ in range(WARMUP_JOBS)]
        await _wait_completed(system, warm, within=60)
        count = max(int(rate * seconds), 1)
        sent: list[tuple[object, float]] = []
        start = time.monotonic()

        async def produce(producer: QueueSystem, first: int) -> None:
            for i in range(first, count, len(producers)):
                delay = start + i / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                before = time.time()
                sent.append((await producer.enqueue_one(), before))

        await asyncio.gather(*(produce(p, k) for k, p in enumerate(producers)))
        achieved = count / (time.monotonic() - start) if count > 1 else rate
        done = await _wait_completed(system, [job for job, _ in sent], within=120 + seconds)
    finally:
        await _stop_worker(worker)
    latencies = [(done[job] - before) * 1000 for job, before in sent]
    return {
        "rate": rate,
        "achieved_rate": achieved,
        "producers": len(producers),
        "jobs": count,
        "p50_ms": percentile(latencies, 50),
        "p95_ms": percentile(latencies, 95),
        "p99_ms": percentile(latencies, 99),
        "max_ms": max(latencies),
    }


async def _steady(
    system: QueueSystem, rate: float, until: asyncio.Event, sent: list[tuple[object, float]]
) -> None:
    start = time.monotonic()
    i = 0
    while not until.is_set():
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        before = time.time()
        sent.append((await system.enqueue_one(), before))
        i += 1


async def _recovery(
    system: QueueSystem, argv: list[str], rate: float, seconds: float
) -> dict[str, Any]:
    active = await _start_worker(argv)
    standby: asyncio.subprocess.Process | None = None
    try:
        warm = [await system.enqueue_one() for _ in range(WARMUP_JOBS)]
        await _wait_completed(system, warm, within=60)  # only one worker: it is the active one
        standby = await _start_worker(argv)
        sent: list[tuple[object, float]] = []
        stop_sending = asyncio.Event()
        sender = asyncio.create_task(_steady(system, rate, stop_sending, sent))
        await asyncio.sleep(seconds / 2)
        killed_at = time.time()
        active.kill()  # SIGKILL: no goodbye, its transaction dies with its socket
        await active.wait()
        await asyncio.sleep(seconds / 2)
        stop_sending.set()
        await sender
        done = await _wait_completed(system, [job for job, _ in sent], within=120)
    finally:
        for worker in (active, standby):
            if worker is not None:
                await _stop_worker(worker)
    after = [at for at in done.values() if at > killed_at]
    if not after:
        raise RuntimeError("no job completed after the kill")
    return {
        "jobs": len(sent),
        "rate": rate,
        "recovery_s": min(after) - killed_at,
        "completed": len(done),
    }


async def _savepoints(system: str, url: str, items: int, profile: str | None) -> dict[str, Any]:
    from . import savepoints

    if system == "raw":
        return await savepoints.run_raw(url, items)
    if system == "cronlock":
        return await savepoints.run_cronlock(url, items, profile)
    raise SystemExit(f"no savepoint workload for {system!r}")


async def _serve(system: QueueSystem) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    def ready() -> None:
        print(READY, flush=True)

    await system.serve(stop, ready)


async def _run(args: argparse.Namespace) -> dict[str, Any] | None:
    options: dict[str, Any] = json.loads(args.options)
    if args.workload == "savepoints":
        return await _savepoints(args.system, args.url, args.n, args.profile)
    system = load(args.system)(args.url, options)
    try:
        if args.workload == "serve":
            await _serve(system)
            return None
        await system.install()
        if args.workload == "drain":
            return await _drain(system, args.n)
        if args.workload == "enqueue":
            return await _enqueue(system, args.n, args.single)
        if args.workload == "latency":
            worker_argv = [args.system, args.url, args.options]
            extra = [load(args.system)(args.url, options) for _ in range(args.producers - 1)]
            try:
                return await _latency(
                    system, worker_argv, args.rate, args.seconds, [system, *extra]
                )
            finally:
                for producer in extra:
                    await producer.close()
        if args.workload == "recovery":
            worker_argv = [args.system, args.url, args.options]
            return await _recovery(system, worker_argv, args.rate, args.seconds)
        raise SystemExit(f"unknown workload {args.workload!r}")
    finally:
        with contextlib.suppress(Exception):
            await system.close()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.agent", description=__doc__)
    p.add_argument(
        "workload", choices=["drain", "enqueue", "latency", "recovery", "savepoints", "serve"]
    )
    p.add_argument("system")
    p.add_argument("url")
    p.add_argument("options", nargs="?", default="{}", help="the adapter's options, as JSON")
    p.add_argument("--n", type=int, default=1000, help="jobs to drain, or to enqueue in bulk")
    p.add_argument("--single", type=int, default=1000, help="jobs to enqueue one at a time")
    p.add_argument("--rate", type=float, default=50.0, help="jobs per second (latency)")
    p.add_argument("--seconds", type=float, default=10.0, help="how long to send (latency)")
    p.add_argument("--producers", type=int, default=1, help="enqueueing connections (latency)")
    p.add_argument("--profile", help="write a cProfile of the cronlock savepoint run here")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    # Peers log at INFO per job; their logging is not what is measured.
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    result = asyncio.run(_run(args))
    if result is not None:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
