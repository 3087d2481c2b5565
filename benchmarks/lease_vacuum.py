"""A long job against vacuum and against idle_in_transaction_session_timeout, lease and strict.

    python -m benchmarks.lease_vacuum [--server URL] [--cases vacuum,idle] [--modes lease,strict]
        [--long-seconds 60] [--jobs 50000] [--idle-job-seconds 30] [--idle-timeout 5s] [--quick]

Every case runs on a scratch database of its own, dropped afterwards; the JSON result goes
under ``benchmarks/results/`` (``lease-vacuum-<time>``). ``--quick`` is a smoke run (a 4 s
long job, 2,000 short jobs, a 2.5 s job under a 1 s timeout), not a figure.

``vacuum``: one job that sleeps ``--long-seconds`` runs in the given commit mode on queue
``long`` (a drainer of its own, in this process, whose pool's connections are named
``cronlock-long``). Once its handler runs, ``--jobs`` no-op jobs are enqueued on queue
``short`` and drained by a batch-mode drainer (``cronlock-short``), each completion leaving
the job's previous row version dead (and, in the lease mode, the long job's committed claim
one more). Then, while the long job still runs, ``VACUUM (VERBOSE) cronlock.jobs`` runs and
its heap lines are kept: ``had N dead item identifiers removed`` counts every dead version it
freed (those the drain's own page pruning had already cut to line pointers, and the tuples it
removed itself, ``tuples: N removed``); ``N are dead but not yet removable`` the ones a
transaction still needs. The share removed is the first over both. ``pgstattuple``'s dead
tuples (where the extension is available) are counted before and after, as a second view.
Autovacuum is off for the scratch table (an autoanalyze's snapshot would hold dead rows too),
and the backends holding a transaction id or a snapshot just before VACUUM are kept
(``horizon_at_vacuum``).
While the long job's handler runs, ``pg_stat_activity`` is sampled every
``--sample-interval`` seconds: for each cronlock connection (the long job's worker: its pool,
``cronlock-drainer:long`` and ``cronlock-liveness:long``; the short drain's apart), how many
samples saw ``backend_xid`` or ``backend_xmin`` set and in which state, the oldest such
transaction, and the most samples in a row one backend held one (a transaction held across
the handler is in every sample; a heartbeat's or a sweep's, milliseconds long, in one at
most).

``idle``: a login role of its own gets ``ALTER ROLE … SET idle_in_transaction_session_timeout``
(``--idle-timeout``), as a managed PostgreSQL sets it; a drainer connecting as that role runs
one job that sleeps ``--idle-job-seconds`` and then writes a row in its session. What is kept:
the drain's result, the job's row and whether its row was written.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

import cronlock
from cronlock import schema
from cronlock.database import Database

from .run import DEFAULT_SERVER, machine, write_check
from .scratch import scratch_database, with_schema

__all__ = ["main", "measure_idle", "measure_vacuum"]

LONG, SHORT = "long", "short"
LONG_WORKER = ("cronlock-long", "cronlock-drainer:long", "cronlock-liveness:long")

# Benchmark data and probes, not cronlock's SQL.
DEAD_TUPLES = "SELECT dead_tuple_count FROM pgstattuple('cronlock.jobs')"
ACTIVITY = """
SELECT pid, application_name, state, backend_xid IS NOT NULL, backend_xmin IS NOT NULL,
       extract(epoch FROM now() - xact_start)::float8
FROM pg_stat_activity
WHERE datname = current_database() AND application_name LIKE 'cronlock%'
  AND pid <> pg_backend_pid()
"""
TUPLES_LINE = re.compile(
    r"tuples: (\d+) removed, (\d+) remain, (\d+) are dead but not yet removable"
)
# Dead row versions the drain's own page pruning had already cut to line pointers, and the
# tuples VACUUM removed itself: both are what this line counts as removed from the heap.
ITEMS_LINE = re.compile(r"had (\d+) dead item identifiers removed")
HORIZON_HOLDERS = """
SELECT pid, application_name, backend_type, state, backend_xid::text AS xid,
       backend_xmin::text AS xmin, left(query, 80) AS query
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL)
"""
JOB_ROW = """
SELECT status, attempt, retry_count, lost_runs, error_message, error_history::text
FROM cronlock.jobs WHERE id = $1
"""


def _named(url: str, application_name: str) -> str:
    """``url`` whose pooled connections carry ``application_name`` (pg_stat_activity)."""
    parts = urlsplit(url)
    query = "&".join(q for q in (parts.query, f"application_name={application_name}") if q)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


def _as_role(url: str, role: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, f"{role}@{host}", parts.path, parts.query, parts.fragment))


class Sampler:
    """Samples ``pg_stat_activity`` until stopped. Per cronlock connection name and state:
    how many samples saw it, how many of those had an xid or an xmin, the oldest transaction
    among those (``now() - xact_start``), and the most samples in a row one backend held one
    (a held transaction stays; a statement or commit in flight is one sample's)."""

    def __init__(self, url: str, interval: float) -> None:
        self.url = url
        self.interval = interval
        self.samples = 0
        self.seen: Counter[tuple[str, str]] = Counter()
        self.held: Counter[tuple[str, str, str]] = Counter()  # (name, state, "xid"/"xmin")
        self.oldest: dict[str, float] = {}  # name -> oldest transaction holding xid/xmin, s
        self.longest: dict[str, int] = {}  # name -> most consecutive samples one pid held
        self._streak: dict[int, int] = {}

    async def run(self, stop: asyncio.Event) -> None:
        conn = await asyncpg.connect(self.url)
        try:
            while not stop.is_set():
                holding: set[int] = set()
                rows = await conn.fetch(ACTIVITY)
                if stop.is_set():
                    # Stopped while the sample was in flight: it may have seen what came
                    # after (the strict mode's commit after the handler), so it is not kept.
                    break
                for pid, name, state, xid, xmin, age in rows:
                    state = state or ""
                    self.seen[(name, state)] += 1
                    if xid:
                        self.held[(name, state, "xid")] += 1
                    if xmin:
                        self.held[(name, state, "xmin")] += 1
                    if xid or xmin:
                        holding.add(pid)
                        self._streak[pid] = self._streak.get(pid, 0) + 1
                        self.longest[name] = max(self.longest.get(name, 0), self._streak[pid])
                        self.oldest[name] = max(self.oldest.get(name, 0.0), age or 0.0)
                for pid in set(self._streak) - holding:
                    del self._streak[pid]
                self.samples += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.interval)
        finally:
            await conn.close()

    def report(self) -> dict[str, Any]:
        def group(names: tuple[str, ...] | None) -> dict[str, Any]:
            def mine(name: str) -> bool:
                return name in names if names is not None else name not in LONG_WORKER

            return {
                "connection_samples": {
                    f"{n} ({s})": c for (n, s), c in sorted(self.seen.items()) if mine(n)
                },
                "with_xid_or_xmin": {
                    f"{n} ({s}) {what}": c
                    for (n, s, what), c in sorted(self.held.items())
                    if mine(n)
                },
                "oldest_holding_transaction_s": max(
                    (round(a, 3) for n, a in self.oldest.items() if mine(n)), default=None
                ),
                "most_samples_in_a_row_holding": max(
                    (c for n, c in self.longest.items() if mine(n)), default=0
                ),
            }

        return {
            "samples": self.samples,
            "interval_s": self.interval,
            "long_worker": group(LONG_WORKER),
            "others": group(None),
        }


async def _dead_tuples(conn: asyncpg.Connection, counted: bool) -> int | None:
    """The jobs table's dead tuples by ``pgstattuple`` (None where it is not installed)."""
    return int(await conn.fetchval(DEAD_TUPLES)) if counted else None


async def _vacuum_verbose(conn: asyncpg.Connection) -> dict[str, Any]:
    """``VACUUM (VERBOSE)`` of the jobs table: its INFO lines, and what the heap's tuples line
    says (the first such line is the heap's; the TOAST table's follows)."""
    lines: list[str] = []

    def listen(_conn: Any, message: Any) -> None:
        lines.append(str(message.message))

    conn.add_log_listener(listen)
    try:
        started = time.perf_counter()
        await conn.execute("VACUUM (VERBOSE) cronlock.jobs")
        seconds = time.perf_counter() - started
    finally:
        conn.remove_log_listener(listen)
    found = next((m for line in lines if (m := TUPLES_LINE.search(line))), None)
    items = next((m for line in lines if (m := ITEMS_LINE.search(line))), None)
    if found is None or items is None:
        raise RuntimeError(f"no tuples or dead items line in VACUUM VERBOSE's output: {lines}")
    removed, remain, not_removable = (int(g) for g in found.groups())
    return {
        "tuples_removed": removed,
        "dead_items_removed": int(items.group(1)),
        "remain": remain,
        "dead_not_removable": not_removable,
        "seconds": round(seconds, 3),
        "verbose": lines,
    }


def _apps(
    url: str, long_seconds: float
) -> tuple[cronlock.App, cronlock.App, dict[str, asyncio.Event]]:
    events = {"started": asyncio.Event(), "finished": asyncio.Event()}
    long_app = cronlock.App()

    @long_app.job("long", max_retries=0, queue=LONG)
    async def long(_session: AsyncSession, _payload: Any) -> None:
        events["started"].set()
        await asyncio.sleep(long_seconds)  # the job's own work: nothing of the database's
        events["finished"].set()

    short_app = cronlock.App()

    @short_app.job("noop", queue=SHORT)
    async def noop(_session: AsyncSession, _payload: Any) -> None:
        return None

    long_app.use_database(_named(url, "cronlock-long"))
    short_app.use_database(_named(url, "cronlock-short"))
    return long_app, short_app, events


async def measure_vacuum(
    server: str, mode: str, *, long_seconds: float, jobs: int, sample_interval: float
) -> dict[str, Any]:
    """One ``vacuum`` case (see the module docstring)."""
    async with scratch_database(server, "lease_vacuum") as url:
        await with_schema(url)
        conn = await asyncpg.connect(url)
        long_app, short_app, events = _apps(url, long_seconds)
        sampler = Sampler(url, sample_interval)
        sampling: asyncio.Task[None] | None = None
        try:
            try:
                await conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
                counted = True
            except asyncpg.PostgresError:  # a server without the contrib modules
                counted = False
            async with long_app.database.session() as session:
                long_job = (await long_app.enqueue_tx(session, "long", {})).id
                await session.commit()
            # Only the drainers may hold the horizon back: an autoanalyze of the table, whose
            # snapshot is not a vacuum's, would keep the drain's dead rows as well.
            await conn.execute("ALTER TABLE cronlock.jobs SET (autovacuum_enabled = off)")
            await conn.execute("VACUUM cronlock.jobs")  # from a table without dead rows
            long_drain = asyncio.create_task(long_app.drainer(queue=LONG, commit_mode=mode).drain())
            await asyncio.wait_for(events["started"].wait(), 60)
            # Sampling ends as the handler does, before the outcome's commit.
            sampling = asyncio.create_task(sampler.run(events["finished"]))
            async with short_app.database.session() as session:
                await short_app.enqueue_many_tx(session, "noop", [{}] * jobs)
                await session.commit()
            started = time.perf_counter()
            drained = await short_app.drainer(queue=SHORT, commit_mode="batch").drain()
            drain_seconds = time.perf_counter() - started
            if drained.stats["processed"] != jobs:
                raise RuntimeError(f"the short drain ended {drained.to_dict()}")
            before = await _dead_tuples(conn, counted)
            horizon = [dict(r) for r in await conn.fetch(HORIZON_HOLDERS)]
            vacuum = await _vacuum_verbose(conn)
            after = await _dead_tuples(conn, counted)
            during = not events["finished"].is_set()
            if not during:
                raise RuntimeError(
                    "the long job ended before VACUUM ran: give it more --long-seconds"
                )
            long_result = await asyncio.wait_for(long_drain, long_seconds + 60)
            await sampling
            row = await conn.fetchrow(JOB_ROW, long_job)
        finally:
            if sampling is not None and not sampling.done():
                sampling.cancel()
            await conn.close()
            await long_app.aclose()
            await short_app.aclose()
    # Every dead version VACUUM met: removed (line pointers freed) or not yet removable.
    found = vacuum["dead_items_removed"] + vacuum["dead_not_removable"]
    removed_share = vacuum["dead_items_removed"] / found if found else 0.0
    return {
        "case": f"vacuum {mode}",
        "commit_mode": mode,
        "long_seconds": long_seconds,
        "jobs": jobs,
        "drain_seconds": round(drain_seconds, 3),
        "drain_jobs_per_s": round(jobs / drain_seconds, 1),
        # Row versions the drain left dead: one per completion, and in the lease mode one
        # more for the long job's committed claim.
        "dead_produced": jobs + (mode == "lease"),
        "dead_found_by_vacuum": found,
        "dead_tuples_before": before,
        "dead_tuples_after": after,
        "removed_share": round(removed_share, 6),
        "vacuum": vacuum,
        "vacuum_during_long_job": during,
        # The backends of the database with a transaction id or a snapshot just before VACUUM.
        "horizon_at_vacuum": horizon,
        "long_job": {"status": row["status"], "attempt": row["attempt"]},
        "long_drain": long_result.to_dict(),
        "activity": sampler.report(),
    }


@contextlib.asynccontextmanager
async def _role_with_idle_timeout(url: str, setting: str) -> Any:
    """A login role whose sessions get ``idle_in_transaction_session_timeout``, with the
    rights a worker needs on the scratch database; its name. Dropped afterwards."""
    role = f"lease_idle_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f"CREATE ROLE {role} LOGIN")
        await conn.execute(
            f"ALTER ROLE {role} SET idle_in_transaction_session_timeout = '{setting}'"
        )
        await conn.execute(f"GRANT USAGE ON SCHEMA cronlock TO {role}")
        await conn.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA cronlock TO {role}")
        await conn.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA cronlock TO {role}")
        await conn.execute(f"GRANT ALL ON idle_log TO {role}")
        yield role
    finally:
        with contextlib.suppress(asyncpg.PostgresError):
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role
            )
            await conn.execute(f"DROP OWNED BY {role}")
            await conn.execute(f"DROP ROLE {role}")
        await conn.close()


async def measure_idle(
    server: str, mode: str, *, job_seconds: float, idle_timeout: str
) -> dict[str, Any]:
    """One ``idle`` case (see the module docstring)."""
    async with scratch_database(server, "lease_idle") as url:
        database = Database(url)
        try:
            await schema.upgrade(database)
            async with database.engine.begin() as conn:
                await conn.execute(text("CREATE TABLE idle_log (at timestamptz DEFAULT now())"))
        finally:
            await database.dispose()
        async with _role_with_idle_timeout(url, idle_timeout) as role:
            worker = cronlock.App()

            @worker.job("long", max_retries=0)
            async def long(session: AsyncSession, _payload: Any) -> None:
                await asyncio.sleep(job_seconds)  # the job's own work, a long one
                await session.execute(text("INSERT INTO idle_log DEFAULT VALUES"))

            worker.use_database(_as_role(url, role))
            conn = await asyncpg.connect(url)
            try:
                seen = await conn.fetchval(
                    "SELECT setconfig::text FROM pg_db_role_setting s JOIN pg_roles r "
                    "ON r.oid = s.setrole WHERE r.rolname = $1",
                    role,
                )
                async with worker.database.session() as session:
                    job_id = (await worker.enqueue_tx(session, "long", {})).id
                    await session.commit()
                started = time.perf_counter()
                result = await asyncio.wait_for(
                    worker.drain(commit_mode=mode, max_seconds=job_seconds * 3),
                    job_seconds * 6 + 60,
                )
                seconds = time.perf_counter() - started
                row = await conn.fetchrow(JOB_ROW, job_id)
                written = await conn.fetchval("SELECT count(*) FROM idle_log")
            finally:
                await conn.close()
                await worker.aclose()
    return {
        "case": f"idle {mode}",
        "commit_mode": mode,
        "job_seconds": job_seconds,
        "idle_in_transaction_session_timeout": idle_timeout,
        "role_settings": seen,
        "seconds": round(seconds, 3),
        "drain": result.to_dict(),
        "job": dict(row),
        "rows_written": int(written),
        "completed": row["status"] == "completed" and written == 1,
    }


def _summary(case: dict[str, Any]) -> str:
    if case["case"].startswith("vacuum"):
        v = case["vacuum"]
        held = case["activity"]["long_worker"]
        return (
            f"{case['case']:14} {case['jobs']:,} jobs drained in {case['drain_seconds']:.1f} s "
            f"beside a {case['long_seconds']:g} s job; VACUUM found "
            f"{case['dead_found_by_vacuum']:,} dead versions ({case['dead_produced']:,} "
            f"produced): {v['dead_items_removed']:,} removed ({case['removed_share']:.2%}), "
            f"{v['dead_not_removable']:,} not removable; dead tuples by pgstattuple "
            f"{case['dead_tuples_before']} before, {case['dead_tuples_after']} after; the "
            f"long job's worker in {case['activity']['samples']} samples: with xid/xmin "
            f"{held['with_xid_or_xmin'] or 'never'}, oldest such transaction "
            f"{held['oldest_holding_transaction_s']} s"
        )
    job = case["job"]
    return (
        f"{case['case']:14} a {case['job_seconds']:g} s job under "
        f"idle_in_transaction_session_timeout={case['idle_in_transaction_session_timeout']}: "
        f"{'completed' if case['completed'] else 'NOT completed'} (job {job['status']}, "
        f"attempt {job['attempt']}, drain {case['drain']['status']}"
        f"{': ' + str(case['drain'].get('error')) if case['drain'].get('error') else ''}) "
        f"in {case['seconds']:.1f} s"
    )


async def _main(args: argparse.Namespace) -> None:
    started = datetime.now(UTC)
    if args.quick:
        args.long_seconds, args.jobs = 4.0, 2000
        args.idle_job_seconds, args.idle_timeout = 2.5, "1s"
    cases: list[dict[str, Any]] = []
    for name in args.cases.split(","):
        for mode in args.modes.split(","):
            if name == "vacuum":
                case = await measure_vacuum(
                    args.server,
                    mode,
                    long_seconds=args.long_seconds,
                    jobs=args.jobs,
                    sample_interval=args.sample_interval,
                )
            elif name == "idle":
                case = await measure_idle(
                    args.server,
                    mode,
                    job_seconds=args.idle_job_seconds,
                    idle_timeout=args.idle_timeout,
                )
            else:
                raise SystemExit(f"unknown case {name!r} (vacuum, idle)")
            cases.append(case)
            print(_summary(case), flush=True)
    if args.no_write:
        return
    fields = {
        "command": "python -m benchmarks.lease_vacuum " + " ".join(args.argv),
        "quick": args.quick,
        "machine": machine(),
        "load_at_end": os.getloadavg(),
        "cases": cases,
    }
    out = await write_check("lease-vacuum", started, args.server, fields)
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> None:
    import sys

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--server", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_SERVER))
    parser.add_argument("--cases", default="vacuum,idle")
    parser.add_argument("--modes", default="lease,strict")
    parser.add_argument("--long-seconds", type=float, default=60.0)
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--idle-job-seconds", type=float, default=30.0)
    parser.add_argument("--idle-timeout", default="5s")
    parser.add_argument("--sample-interval", type=float, default=0.25)
    parser.add_argument("--quick", action="store_true", help="a smoke run, not a figure")
    parser.add_argument("--no-write", action="store_true", help="print only (tests)")
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
