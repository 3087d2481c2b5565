"""10,000 no-op jobs seeded with the bulk enqueue, then ``cronlock drain --json`` per commit mode.

    python benchmarks/drain_noop.py postgresql://user@host:5432/postgres [N] [drain options…]

Each mode gets a fresh database (created, migrated, dropped afterwards); the drain runs as the
real command line in a subprocess, and its JSON report is printed as it is.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import asyncpg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))

from testapps import jobs as testjobs  # noqa: E402

from cronlock import schema  # noqa: E402
from cronlock.database import Database  # noqa: E402


async def seed(url: str, count: int) -> float:
    database = Database(url)
    await schema.upgrade(database)
    app = testjobs.app
    app.use_database(url)
    try:
        async with database.session() as session:
            started = time.perf_counter()
            await app.enqueue_many_tx(session, "noop", [{"n": i} for i in range(count)])
            await session.commit()
            return time.perf_counter() - started
    finally:
        await app.aclose()
        await database.dispose()


async def admin(server: str, statement: str) -> None:
    conn = await asyncpg.connect(server)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def main() -> None:
    server = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    extra = sys.argv[3:]
    base = server.rsplit("/", 1)[0]
    for mode in ("strict", "batch"):
        name = f"cronlock_bench_{uuid.uuid4().hex[:8]}"
        asyncio.run(admin(server, f'CREATE DATABASE "{name}"'))
        url = f"{base}/{name}"
        try:
            seconds = asyncio.run(seed(url, count))
            print(f"# {mode}: enqueue_many of {count} jobs took {seconds:.3f} s", flush=True)
            done = subprocess.run(
                [sys.executable, "-m", "cronlock", "--app", "testapps.jobs", "drain", "--json",
                 "--commit-mode", mode, *extra],
                cwd=ROOT,
                env={"PYTHONPATH": f"{ROOT / 'tests' / 'support'}:{ROOT}",
                     "CRONLOCK_DATABASE_URL": url, "PATH": "/usr/bin:/bin"},
                capture_output=True,
                text=True,
                check=False,
            )  # fmt: skip
            print(json.dumps(json.loads(done.stdout)) if done.stdout else done.stderr)
        finally:
            asyncio.run(admin(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


if __name__ == "__main__":
    main()
