"""Between workloads: the bench's jobs deleted and the table vacuumed, so each workload starts
from an empty queue without the previous one's dead rows."""

from __future__ import annotations

from . import sql as bench_sql
from .scratch import Scratch

__all__ = ["clear_jobs"]


async def clear_jobs(scratch: Scratch) -> None:
    engine = scratch.database.engine
    async with engine.begin() as conn:
        await conn.execute(bench_sql.BENCH_JOBS_DELETE, {"queue": scratch.queue})
    async with engine.connect() as conn:
        vacuum = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await vacuum.execute(bench_sql.BENCH_JOBS_VACUUM)
