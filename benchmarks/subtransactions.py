"""How many writing savepoints one transaction may hold before other sessions pay for it.

A writer updates N rows in one open transaction, with or without a SAVEPOINT around each
update; a reader meanwhile counts the table, which makes it check the visibility of every row
the writer touched. Past 64 subtransactions the reader's snapshot is "suboverflowed" and each
check consults the pg_subtrans SLRU: the reader's time and the SLRU's hits and reads show the
cost the DESIGN.md trap describes. Run::

    python -m benchmarks.subtransactions --dsn postgresql://root@127.0.0.1/test 64 1000 100000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import asyncpg

READS = 20
SLRU = "SELECT blks_hit, blks_read FROM pg_stat_slru WHERE name = 'Subtrans'"


async def measure(dsn: str, rows: int, savepoints: bool) -> dict[str, float]:
    setup = await asyncpg.connect(dsn)
    await setup.execute(
        "DROP TABLE IF EXISTS bench_subx;"
        " CREATE TABLE bench_subx (id int PRIMARY KEY, v int);"
        " INSERT INTO bench_subx SELECT g, 0 FROM generate_series(1, 100000) g"
    )
    await setup.execute("VACUUM ANALYZE bench_subx")
    writer, reader = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    transaction = writer.transaction()
    await transaction.start()
    for i in range(1, rows + 1):
        if savepoints:
            await writer.execute("SAVEPOINT item")
        await writer.execute("UPDATE bench_subx SET v = v + 1 WHERE id = $1", i)
        if savepoints:
            await writer.execute("RELEASE SAVEPOINT item")
    before = await reader.fetchrow(SLRU)
    timings = []
    for _ in range(READS):
        start = time.perf_counter()
        await reader.fetchval("SELECT count(*) FROM bench_subx WHERE v >= 0")
        timings.append((time.perf_counter() - start) * 1000)
    await asyncio.sleep(1.1)  # cumulative statistics are flushed about once a second
    after = await reader.fetchrow(SLRU)
    await transaction.rollback()
    await setup.execute("DROP TABLE bench_subx")
    for conn in (setup, writer, reader):
        await conn.close()
    return {
        "reader_median_ms": statistics.median(timings),
        "slru_hits": after[0] - before[0],
        "slru_reads": after[1] - before[1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://root@127.0.0.1:5432/test")
    parser.add_argument("rows", type=int, nargs="+")
    args = parser.parse_args()
    print("| rows written | savepoints | reader count(*) median | subtrans SLRU hits | reads |")
    print("|---:|---|---:|---:|---:|")
    for rows in args.rows:
        for savepoints in (False, True):
            r = asyncio.run(measure(args.dsn, rows, savepoints))
            print(
                f"| {rows:,} | {'yes' if savepoints else 'no'} | {r['reader_median_ms']:.1f} ms"
                f" | {r['slru_hits']:,.0f} | {r['slru_reads']:,.0f} |"
            )


if __name__ == "__main__":
    main()
