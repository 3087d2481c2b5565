"""Chunked periodic runs against today's one-transaction run, interleaved in one run.

    python -m benchmarks.chunked [SERVER_URL] [--rounds 5] [--case single:10000 ...]
        [--case chunked:100000:500 ...] [--variant NAME=ROOT ...]

A case is ``single:ITEMS`` (a task without ``commit_every``: the run is one transaction, as
before chunked runs existed) or ``chunked:ITEMS:N`` (``commit_every=N``). Each run is a
periodic task run by ``App.run`` in a subprocess of its own (``once``), on a fresh scratch
database: ITEMS rows, one ``UPDATE`` each inside ``run.item()``, the statement of
``benchmarks/savepoints.py`` plus ``xact = pg_current_xact_id()``, so that every row records
the transaction that committed it. Items/s is timed on the client's clock around
``App.run``, after a warm-up run of 1,000 items (then reset).

The savepoints per transaction are counted twice, on both sides of the wire: by the server,
the rows each transaction committed (``GROUP BY xact``: each was written in its own item's
savepoint, so a transaction's rows are the writing subtransactions it held), every run; and
by the client, the ``SAVEPOINT`` statements sent between a ``BEGIN`` and its ``COMMIT`` (an
asyncpg query logger on the run's connections), in one extra run per case after the timed
rounds, since the logger costs a few microseconds a statement. ``--variant NAME=ROOT`` runs
the ``single`` cases with ``PYTHONPATH`` set to another source tree too (a directory holding
a ``cronlock`` package: main before this change, say), to show the path without
``commit_every`` did not change. The runs go round-robin over cases and variants; each case's
median and range is printed at the end, and all of it written as JSON to
``benchmarks/results/chunked-*.json``. Each run also records the CPU time per item of its
process and of its server processes (from /proc: same host only), which a shared machine
disturbs far less than the wall clock. ``--reader`` adds another session counting the table
every 50 ms during each run, with its latency and the cluster's pg_subtrans SLRU hits and
reads over the run: what an overflowed subtransaction cache costs everyone else.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from benchmarks.scratch import scratch_database

ROOT = Path(__file__).resolve().parent.parent
WARMUP = 1000

SETUP = [
    "CREATE TABLE bench_items (id integer PRIMARY KEY, n integer NOT NULL DEFAULT 0, xact xid8)",
    "INSERT INTO bench_items (id) SELECT generate_series(1, $1::integer)",
]
RESET = "UPDATE bench_items SET n = 0, xact = NULL"
CHECK = "SELECT count(*) FILTER (WHERE n = 1), count(*) FROM bench_items"
PER_TRANSACTION = (
    "SELECT count(*) AS rows FROM bench_items WHERE xact IS NOT NULL GROUP BY xact ORDER BY 1"
)


async def _prepare(url: str, items: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            await conn.execute(SETUP[0])
            await conn.execute(SETUP[1], items)
        await conn.execute("VACUUM ANALYZE bench_items")
    finally:
        await conn.close()


async def _reset(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(RESET)
        await conn.execute("VACUUM ANALYZE bench_items")
    finally:
        await conn.close()


async def _per_transaction(url: str, items: int) -> list[int]:
    conn = await asyncpg.connect(url)
    try:
        once, total = await conn.fetchrow(CHECK)
        if once != items or total != items:
            raise RuntimeError(f"{once} of {total} items updated once, expected {items}")
        return [int(row["rows"]) for row in await conn.fetch(PER_TRANSACTION)]
    finally:
        await conn.close()


class SavepointCounter:
    """SAVEPOINT statements between BEGIN and COMMIT/ROLLBACK, per connection (an asyncpg
    query logger): the most any one transaction held, and how many transactions."""

    def __init__(self) -> None:
        self.open: dict[int, int] = {}
        self.most = 0
        self.transactions = 0

    def logger(self, connection_id: int) -> Any:
        def log(record: Any) -> None:
            for part in record.query.split(";"):
                verb = part.strip().upper()
                if verb.startswith("BEGIN"):
                    self.open[connection_id] = 0
                elif verb.startswith("SAVEPOINT"):
                    self.open[connection_id] = self.open.get(connection_id, 0) + 1
                elif verb.startswith(("COMMIT", "ROLLBACK")) and not verb.startswith("ROLLBACK TO"):
                    held = self.open.pop(connection_id, 0)
                    self.most = max(self.most, held)
                    self.transactions += 1

        return log


BACKENDS = "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"


def _cpu_ticks(pid: int) -> int:
    # /proc/PID/stat: utime and stime are fields 14 and 15, counted after the ")" of the name.
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


async def _server_ticks(url: str) -> dict[int, int]:
    """CPU ticks so far of every server process on the run's database (same host only)."""
    conn = await asyncpg.connect(url)
    try:
        pids = [row["pid"] for row in await conn.fetch(BACKENDS)]
    finally:
        await conn.close()
    return {pid: _cpu_ticks(pid) for pid in pids}


SLRU = "SELECT blks_hit, blks_read FROM pg_stat_slru WHERE name = 'Subtrans'"
READ = "SELECT count(*) FROM bench_items WHERE n >= 0"


class Reader:
    """Another session reading the run's table while it works: every READ_EVERY seconds a
    count that checks the visibility of every row the run touched. While a backend holds
    more than 64 subtransactions, every snapshot is suboverflowed and those checks consult
    pg_subtrans (README, "Savepoints and the subtransaction cache")."""

    READ_EVERY = 0.05

    def __init__(self, url: str) -> None:
        self.url = url
        self.timings: list[float] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._slru: tuple[int, int] = (0, 0)

    async def start(self) -> None:
        self._conn = await asyncpg.connect(self.url)
        self._slru = tuple(await self._conn.fetchrow(SLRU))
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            await self._conn.fetchval(READ)
            self.timings.append((time.perf_counter() - started) * 1000)
            await asyncio.sleep(self.READ_EVERY)

    async def stop(self) -> dict[str, Any]:
        self._stop.set()
        assert self._task is not None
        await self._task
        await asyncio.sleep(1.1)  # cumulative statistics are flushed about once a second
        hits, reads = await self._conn.fetchrow(SLRU)
        await self._conn.close()
        ordered = sorted(self.timings)
        return {
            "reads": len(ordered),
            "read_ms_median": statistics.median(ordered),
            "read_ms_p95": ordered[int(0.95 * (len(ordered) - 1))],
            "read_ms_max": ordered[-1],
            "subtrans_slru_hits": hits - self._slru[0],
            "subtrans_slru_reads": reads - self._slru[1],
        }


async def once(
    url: str, items: int, every: int | None, count: bool, read: bool = False
) -> dict[str, Any]:
    """One measured run in this process: the task on ``url``'s fresh database."""
    from sqlalchemy import Column, Integer, MetaData, Table, bindparam, event, func, update

    import cronlock
    from cronlock import schema

    await _prepare(url, items)
    bench_items = Table(
        "bench_items",
        MetaData(),
        Column("id", Integer, primary_key=True),
        Column("n", Integer),
        Column("xact"),
    )
    statement = (
        update(bench_items)
        .where(bench_items.c.id == bindparam("item"))
        .values(n=bench_items.c.n + 1, xact=func.pg_current_xact_id())
    )

    def body_of(limit: int) -> Any:
        async def body(run: cronlock.Run) -> None:
            for item in range(1, limit + 1):
                async with run.item(item) as session:
                    await session.execute(statement, {"item": item})

        return body

    app = cronlock.App()
    options: dict[str, Any] = {} if every is None else {"commit_every": every}
    app.periodic("bench-warmup", cron="* * * * *", **options)(body_of(min(WARMUP, items)))
    app.periodic("bench-run", cron="* * * * *", **options)(body_of(items))
    database = app.use_database(url)
    counter = SavepointCounter() if count else None
    if counter is not None:

        @event.listens_for(database.engine.sync_engine, "connect")
        def _log(dbapi_connection: Any, record: Any) -> None:
            dbapi_connection.driver_connection.add_query_logger(
                counter.logger(id(dbapi_connection))
            )

    try:
        await schema.upgrade(database)
        await app.run("bench-warmup", manual=True)
        await _reset(url)
        reader = Reader(url) if read else None
        if reader is not None:
            await reader.start()
        before = await _server_ticks(url)
        cpu = time.process_time()
        started = time.perf_counter()
        result = await app.run("bench-run", manual=True)
        seconds = time.perf_counter() - started
        client_cpu = time.process_time() - cpu
        after = await _server_ticks(url)  # the pool's connections are still open
        reading = None if reader is None else await reader.stop()
    finally:
        await app.aclose()
    if result.status.value != "completed" or result.items_ok != items:
        raise RuntimeError(f"the run ended {result.status.value} with {result.items_ok} items")
    per = await _per_transaction(url, items)
    outcome: dict[str, Any] = {
        "items": items,
        "commit_every": every,
        "seconds": seconds,
        "items_per_s": items / seconds,
        "chunks": result.chunks,
        # CPU per item: this process's, and its server processes' (the pool's connections;
        # the guard's; from /proc, 10 ms ticks), less disturbed by a shared machine than the
        # wall clock.
        "client_cpu_us_per_item": client_cpu / items * 1e6,
        "server_cpu_us_per_item": sum(after.get(pid, 0) - ticks for pid, ticks in before.items())
        / os.sysconf("SC_CLK_TCK")
        / items
        * 1e6,
        "transactions_with_items": len(per),
        "most_rows_in_a_transaction": max(per),
    }
    if reading is not None:
        outcome["reader"] = reading
    if counter is not None:
        outcome["most_savepoints_in_a_transaction"] = counter.most
        outcome["transactions_counted"] = counter.transactions
    return outcome


def _label(case: str, variant: str) -> str:
    return f"{case} [{variant}]"


def _run_once(
    server: str, case: str, root: Path, *, count: bool = False, reader: bool = False
) -> dict[str, Any]:
    """``case`` in a subprocess with ``root`` first on PYTHONPATH, on a scratch database."""

    async def scratch() -> dict[str, Any]:
        async with scratch_database(server, prefix="bench_chunked") as url:
            command = [sys.executable, "-m", "benchmarks.chunked", "once", url, case]
            if count:
                command.append("--count")
            if reader:
                command.append("--reader")
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(ROOT)])}
            done = await asyncio.to_thread(
                subprocess.run,
                command,
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(f"{case}: {done.stderr.strip()[-2000:]}")
            result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
            return result

    return asyncio.run(scratch())


def _parse(case: str) -> tuple[int, int | None]:
    kind, *rest = case.split(":")
    if kind == "single" and len(rest) == 1:
        return int(rest[0]), None
    if kind == "chunked" and len(rest) == 2:
        return int(rest[0]), int(rest[1])
    raise SystemExit(f"bad case {case!r}: single:ITEMS or chunked:ITEMS:COMMIT_EVERY")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "once":
        parser = argparse.ArgumentParser(prog="benchmarks.chunked once")
        parser.add_argument("once")
        parser.add_argument("url")
        parser.add_argument("case")
        parser.add_argument("--count", action="store_true")
        parser.add_argument("--reader", action="store_true")
        args = parser.parse_args()
        items, every = _parse(args.case)
        print(json.dumps(asyncio.run(once(args.url, items, every, args.count, args.reader))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("server", nargs="?", default="postgresql://root@127.0.0.1:5432/postgres")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--case", action="append", dest="cases")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=ROOT")
    parser.add_argument(
        "--reader", action="store_true", help="another session reads the table during each run"
    )
    args = parser.parse_args()
    cases = args.cases or ["single:10000", "chunked:100000:500"]
    for case in cases:
        _parse(case)
    variants = {"this": ROOT}
    for spec in args.variant:
        name, _, root = spec.partition("=")
        variants[name] = Path(root).resolve()
    started = datetime.now(UTC)
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for round_ in range(1, args.rounds + 1):
        for case in cases:
            for name, root in variants.items():
                if name != "this" and not case.startswith("single"):
                    continue  # another tree may have no commit_every
                result = _run_once(args.server, case, root, reader=args.reader)
                runs[_label(case, name)].append(result)
                print(
                    f"# round {round_} {_label(case, name)}: {result['items_per_s']:,.0f} items/s,"
                    f" {result['seconds']:.2f} s, CPU/item {result['client_cpu_us_per_item']:.0f}"
                    f" + {result['server_cpu_us_per_item']:.0f} us,"
                    f" {result['transactions_with_items']} tx, at most"
                    f" {result['most_rows_in_a_transaction']} item savepoints in one",
                    file=sys.stderr,
                    flush=True,
                )
    counted = {case: _run_once(args.server, case, ROOT, count=True) for case in cases}
    summary = []
    for label, results in runs.items():
        rates = [r["items_per_s"] for r in results]
        summary.append(
            {
                "case": label,
                "runs": len(results),
                "items_per_s_median": statistics.median(rates),
                "items_per_s_min": min(rates),
                "items_per_s_max": max(rates),
                "seconds_median": statistics.median(r["seconds"] for r in results),
                "client_cpu_us_median": statistics.median(
                    r["client_cpu_us_per_item"] for r in results
                ),
                "server_cpu_us_median": statistics.median(
                    r["server_cpu_us_per_item"] for r in results
                ),
                "most_rows_in_a_transaction": max(r["most_rows_in_a_transaction"] for r in results),
                "transactions_with_items": results[0]["transactions_with_items"],
                **(
                    {
                        "reader_ms_median": statistics.median(
                            r["reader"]["read_ms_median"] for r in results
                        ),
                        "reader_ms_p95_median": statistics.median(
                            r["reader"]["read_ms_p95"] for r in results
                        ),
                        "subtrans_slru_hits_median": statistics.median(
                            r["reader"]["subtrans_slru_hits"] for r in results
                        ),
                        "subtrans_slru_reads_median": statistics.median(
                            r["reader"]["subtrans_slru_reads"] for r in results
                        ),
                    }
                    if "reader" in results[0]
                    else {}
                ),
            }
        )
    print(
        "| case | runs | items/s median (min..max) | time median | CPU per item, client"
        " + server (medians) | item savepoints, most in a transaction (server) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for row in summary:
        print(
            f"| {row['case']} | {row['runs']} | {row['items_per_s_median']:,.0f}"
            f" ({row['items_per_s_min']:,.0f}..{row['items_per_s_max']:,.0f})"
            f" | {row['seconds_median']:.2f} s"
            f" | {row['client_cpu_us_median']:.0f} + {row['server_cpu_us_median']:.0f} µs"
            f" | {row['most_rows_in_a_transaction']:,}"
            f" in {row['transactions_with_items']:,} transaction(s) |"
        )
    if any("reader_ms_median" in row for row in summary):
        print(
            "\n| case | reader count(*) median of medians | p95 (median) "
            "| subtrans SLRU hits | reads (cluster-wide, medians) |"
        )
        print("|---|---:|---:|---:|---:|")
        for row in summary:
            print(
                f"| {row['case']} | {row['reader_ms_median']:.1f} ms"
                f" | {row['reader_ms_p95_median']:.1f} ms"
                f" | {row['subtrans_slru_hits_median']:,.0f}"
                f" | {row['subtrans_slru_reads_median']:,.0f} |"
            )
    print("\n| case | SAVEPOINT statements, most in one transaction (client) | transactions |")
    print("|---|---:|---:|")
    for case, result in counted.items():
        print(
            f"| {case} | {result['most_savepoints_in_a_transaction']:,}"
            f" | {result['transactions_counted']:,} |"
        )
    out = ROOT / "benchmarks" / "results" / f"chunked-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(
        json.dumps(
            {
                "command": " ".join(["python -m benchmarks.chunked", *sys.argv[1:]]),
                "started": started.isoformat(),
                "variants": {name: str(root) for name, root in variants.items()},
                "summary": summary,
                "counted": counted,
                "runs": runs,
            },
            indent=2,
        )
    )
    print(f"\nwritten to {out.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
