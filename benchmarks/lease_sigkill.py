"""SIGKILL of lease-mode workers while they run jobs: is every job completed exactly once, and
how fast is a dead worker's job back?

    python -m benchmarks.lease_sigkill [--server URL] [--kills 20] [--job-seconds 0.5]
        [--shared] [--quick]

Two real ``cronlock worker --commit-mode lease`` processes serve one queue of a scratch
database (exclusive by default: one active, one standing by; ``--shared``: both active). Jobs
sleep ``--job-seconds`` and then insert their number into ``kill_log`` in their session, so
that the insert commits with the job's completion or not at all. Then, ``--kills`` times: wait
for a job that a live worker is running (``processing``, its ``owner`` the worker's id in the
workers table), SIGKILL that worker (the client's clock just before the kill), and start a new
worker in its place. Every kill is timed from the database's own records of that job: *back*
is the ``at`` of the ``error_history`` entry the sweep that returned it wrote (``now()`` of
that transaction), *started again* its next claim's ``started_at``, *completed* its
``completed_at``. In the end every job must be ``completed`` and every number be in
``kill_log`` exactly once. Same host: one clock. The JSON result goes under
``benchmarks/results/`` (``lease-sigkill-<time>``).

The module is also the workers' app (``--app benchmarks.lease_sigkill``): one job type,
``work``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

import cronlock

from .run import DEFAULT_SERVER, machine, write_check
from .scratch import scratch_database, with_schema
from .stats import percentile

__all__ = ["app", "main", "measure"]

ROOT = Path(__file__).resolve().parent.parent
JOB_SECONDS = float(os.environ.get("LEASE_KILL_JOB_SECONDS", "0.5"))

app = cronlock.App()


@app.job("work", max_retries=0)
async def work(session: AsyncSession, payload: Any) -> None:
    """Sleep JOB_SECONDS, then write the job's number: committed with its completion."""
    await asyncio.sleep(JOB_SECONDS)
    await session.execute(text("INSERT INTO kill_log (n) VALUES (:n)"), {"n": payload["n"]})


# Benchmark data and probes, not cronlock's SQL.
KILL_LOG = "CREATE TABLE kill_log (n integer NOT NULL, at timestamptz NOT NULL DEFAULT now())"
# A job a live worker is in the middle of (between a quarter and three quarters of its sleep).
RUNNING = """
SELECT j.id, w.pid FROM cronlock.jobs j JOIN cronlock.workers w ON w.id = j.owner
WHERE j.status = 'processing' AND w.pid = ANY($1::integer[])
  AND now() - j.started_at BETWEEN $2 * interval '1 second' AND $3 * interval '1 second'
ORDER BY j.started_at LIMIT 1
"""
# Due one after another (a bulk insert's jobs would share one run_at, and a job returned to
# the queue would then wait behind the others of its insert: the claim's order is run_at).
ENQUEUE = """
INSERT INTO cronlock.jobs (job_type, payload, run_at)
SELECT 'work', jsonb_build_object('n', i), now() + (i - $1) * interval '1 millisecond'
FROM generate_series($1::integer, $2::integer) AS i
"""
PENDING = "SELECT count(*) FROM cronlock.jobs WHERE status = 'pending'"
WORKERS = "SELECT pid, state FROM cronlock.workers WHERE pid = ANY($1::integer[])"
RETURNED = """
SELECT (e ->> 'at')::timestamptz FROM cronlock.jobs, jsonb_array_elements(error_history) AS e
WHERE id = $1 AND e ? 'lost_run' ORDER BY (e ->> 'at')::timestamptz LIMIT 1
"""
AGAIN = """
SELECT status, attempt, started_at, completed_at, lost_runs FROM cronlock.jobs WHERE id = $1
"""
STATUSES = "SELECT status, count(*) FROM cronlock.jobs GROUP BY status ORDER BY status"
LOGGED = "SELECT n, count(*) FROM kill_log GROUP BY n"
LOST_RUNS = "SELECT lost_runs, count(*) FROM cronlock.jobs GROUP BY lost_runs ORDER BY lost_runs"
POLL = 0.01


class Workers:
    """The ``cronlock worker`` children of one run; every one still alive is killed at the
    end, whatever happened."""

    def __init__(self, url: str, shared: bool, job_seconds: float) -> None:
        self.url = url
        self.shared = shared
        self.job_seconds = job_seconds
        self.children: list[asyncio.subprocess.Process] = []
        self.logs: dict[int, IO[bytes]] = {}

    def alive(self) -> list[int]:
        return [c.pid for c in self.children if c.returncode is None]

    async def start(self, conn: asyncpg.Connection) -> asyncio.subprocess.Process:
        """A worker, returned once its heartbeat is in the workers table."""
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("CRONLOCK_")},
            "CRONLOCK_DATABASE_URL": self.url,
            "LEASE_KILL_JOB_SECONDS": str(self.job_seconds),
            "PYTHONPATH": os.pathsep.join(
                p for p in (os.environ.get("PYTHONPATH", ""), str(ROOT)) if p
            ),
        }
        args = [sys.executable, "-m", "cronlock", "--app", "benchmarks.lease_sigkill"]
        args += [*os.environ.get("LEASE_KILL_WORKER_FLAGS", "").split(), "worker"]
        args += ["--commit-mode", "lease", "--poll-interval", "0.1"]
        if self.shared:
            args.append("--shared")
        log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        child = await asyncio.create_subprocess_exec(
            *args,
            cwd=ROOT,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=log,
        )
        self.children.append(child)
        self.logs[child.pid] = log
        deadline = time.monotonic() + 60
        while not await conn.fetchval(WORKERS.replace("pid, state", "count(*)"), [child.pid]):
            if child.returncode is not None or time.monotonic() > deadline:
                log.seek(0)
                tail = log.read().decode(errors="replace").strip().splitlines()[-3:]
                raise RuntimeError(f"a worker did not start: {' | '.join(tail)}")
            await asyncio.sleep(POLL)
        return child

    async def ready(self, conn: asyncpg.Connection) -> None:
        """Until the table shows every live child, one active (every one, when shared)."""
        deadline = time.monotonic() + 60
        while True:
            states = dict(await conn.fetch(WORKERS, self.alive()))
            actives = sum(state == "active" for state in states.values())
            if len(states) == len(self.alive()) and actives == (len(states) if self.shared else 1):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the workers did not become ready: {states}")
            await asyncio.sleep(POLL)

    async def kill(self, pid: int) -> None:
        child = next(c for c in self.children if c.pid == pid)
        child.send_signal(signal.SIGKILL)
        await child.wait()

    async def close(self) -> None:
        for child in self.children:
            if child.returncode is None:
                child.send_signal(signal.SIGTERM)
        for child in self.children:
            try:
                await asyncio.wait_for(child.wait(), 15)
            except TimeoutError:
                child.kill()
                await child.wait()
        for log in self.logs.values():
            log.close()


async def _until(conn: asyncpg.Connection, query: str, *args: Any, within: float = 60) -> Any:
    deadline = time.monotonic() + within
    while (row := await conn.fetchrow(query, *args)) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out on {query.split()[0:4]} {args}")
        await asyncio.sleep(POLL)
    return row


async def measure(
    server: str, *, kills: int, job_seconds: float, shared: bool, backlog: int = 6
) -> dict[str, Any]:
    async with scratch_database(server, "lease_sigkill") as url:
        await with_schema(url)
        conn = await asyncpg.connect(url)
        workers = Workers(url, shared, job_seconds)
        records: list[dict[str, Any]] = []
        missed = 0  # kills that came as the job committed: not counted, done again
        jobs = 0
        try:
            await conn.execute(KILL_LOG)
            for _ in range(2):
                await workers.start(conn)
            while len(records) < kills:
                await workers.ready(conn)
                if await conn.fetchval(PENDING) < backlog:  # a few due jobs, always
                    await conn.execute(ENQUEUE, jobs + 1, jobs + backlog)
                    jobs += backlog
                job_id, victim = await _until(
                    conn, RUNNING, workers.alive(), job_seconds / 4, job_seconds * 3 / 4
                )
                killed_at = datetime.now(UTC)
                await workers.kill(victim)
                deadline = time.monotonic() + 60
                while (row := await conn.fetchrow(AGAIN, job_id))["status"] != "completed":
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"job {job_id} not completed after a kill")
                    await asyncio.sleep(POLL)
                back = await conn.fetchval(RETURNED, job_id)
                await workers.start(conn)
                if back is None:
                    missed += 1  # it had committed as the kill came
                    continue
                record = {
                    "job": str(job_id),
                    "victim": victim,
                    "back_s": (back - killed_at).total_seconds(),
                    "started_again_s": (row["started_at"] - killed_at).total_seconds(),
                    "completed_s": (row["completed_at"] - killed_at).total_seconds(),
                    "attempt": row["attempt"],
                    "lost_runs": row["lost_runs"],
                }
                records.append(record)
                print(
                    f"kill {len(records):2} of {kills}: back {record['back_s'] * 1000:6.0f} ms, "
                    f"started again {record['started_again_s'] * 1000:6.0f} ms, completed "
                    f"{record['completed_s'] * 1000:6.0f} ms",
                    flush=True,
                )
            # The rest of the jobs: every one completed, every number written once.
            deadline = time.monotonic() + jobs * job_seconds + 120
            while await conn.fetchval(
                "SELECT count(*) FROM cronlock.jobs WHERE status <> 'completed'"
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"not drained: {await conn.fetch(STATUSES)}")
                await asyncio.sleep(0.05)
            statuses = {s: int(c) for s, c in await conn.fetch(STATUSES)}
            logged = {int(n): int(c) for n, c in await conn.fetch(LOGGED)}
            lost_runs = {int(r): int(c) for r, c in await conn.fetch(LOST_RUNS)}
        finally:
            await workers.close()
            await conn.close()
    twice = sorted(n for n, c in logged.items() if c > 1)
    missing = sorted(set(range(1, jobs + 1)) - set(logged))

    def summary(key: str) -> dict[str, float]:
        values = [r[key] for r in records]
        return {
            "p50": round(percentile(values, 50), 3),
            "p95": round(percentile(values, 95), 3),
            "max": round(max(values), 3),
        }

    return {
        "kills": kills,
        "shared": shared,
        "job_seconds": job_seconds,
        "jobs": jobs,
        "missed_kills": missed,
        "statuses": statuses,
        "lost_runs": lost_runs,
        "written_once": len(logged) - len(twice),
        "written_twice": twice,
        "not_written": missing,
        "every_job_once": statuses == {"completed": jobs} and not twice and not missing,
        "back_s": summary("back_s"),
        "started_again_s": summary("started_again_s"),
        "completed_s": summary("completed_s"),
        "records": records,
    }


def _report(result: dict[str, Any]) -> str:
    lines = [
        f"{result['kills']} SIGKILLs, {'shared' if result['shared'] else 'exclusive'} workers, "
        f"{result['jobs']} jobs of {result['job_seconds']:g} s: statuses {result['statuses']}, "
        f"lost runs {result['lost_runs']}, written twice {len(result['written_twice'])}, "
        f"not written {len(result['not_written'])}: every job once: {result['every_job_once']}"
    ]
    for key, name in (
        ("back_s", "kill -> back in the queue"),
        ("started_again_s", "kill -> started again"),
        ("completed_s", "kill -> completed"),
    ):
        s = result[key]
        lines.append(
            f"{name:28} p50 {s['p50'] * 1000:6.0f} ms  p95 {s['p95'] * 1000:6.0f} ms  "
            f"max {s['max'] * 1000:6.0f} ms"
        )
    return "\n".join(lines)


async def _main(args: argparse.Namespace) -> None:
    started = datetime.now(UTC)
    if args.quick:
        args.kills, args.job_seconds = 2, 0.3
    result = await measure(
        args.server, kills=args.kills, job_seconds=args.job_seconds, shared=args.shared
    )
    print(_report(result))
    if args.no_write:
        print(json.dumps({k: result[k] for k in ("every_job_once", "statuses")}))
        return
    fields = {
        "command": "python -m benchmarks.lease_sigkill " + " ".join(args.argv),
        "quick": args.quick,
        "machine": machine(),
        "load_at_end": os.getloadavg(),
        **result,
    }
    out = await write_check("lease-sigkill", started, args.server, fields)
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--server", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_SERVER))
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--job-seconds", type=float, default=0.5)
    parser.add_argument("--shared", action="store_true", help="two --shared workers")
    parser.add_argument("--quick", action="store_true", help="a smoke run, not a figure")
    parser.add_argument("--no-write", action="store_true", help="print only (tests)")
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
