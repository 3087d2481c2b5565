"""``cronlock status`` and ``list`` a person scans in a second (issue 16, point 11): aligned
columns, relative times without microseconds, the last real run shown however many skips
followed it, no no_slot skips filling the rows, the 15-minute rates, and a list that names
the job types and gives a UTC task one time column."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

from cli import invoke_async
from sqlalchemy import insert

from cronlock import Database
from cronlock.sql.tables import runs


async def _rows(database: Database, *rows: dict[str, object]) -> None:
    async with database.engine.begin() as conn:
        await conn.execute(insert(runs), list(rows))


def _run(task: str, status: str, started: datetime, **extra: object) -> dict[str, object]:
    return {
        "task": task,
        "status": status,
        "started_at": started,
        "finished_at": started + timedelta(milliseconds=250),
        "items_ok": 0,
        "items_failed": 0,
        "failures": [],
        "trigger": "cron",
        "slot": None,
        "skip_reason": None,
        **extra,
    }


async def test_status_shows_the_last_real_run_not_no_slot_skips(
    database: Database, database_url: str
) -> None:
    now = datetime.now(UTC).replace(microsecond=123456)
    real = _run("thousand", "partial", now - timedelta(hours=3), items_ok=990, items_failed=10,
                slot=(now - timedelta(hours=3)).replace(second=0, microsecond=0))  # fmt: skip
    skips = [
        _run("thousand", "skipped", now - timedelta(minutes=50 - i), skip_reason="lock_busy",
             slot=(now - timedelta(minutes=50 - i)).replace(second=0, microsecond=0))
        for i in range(6)
    ]  # fmt: skip
    no_slots = [
        _run("thousand", "skipped", now - timedelta(minutes=5 - i), skip_reason="no_slot")
        for i in range(5)
    ]
    await _rows(database, real, *skips, *no_slots)

    shown = await invoke_async("--app", "testapps.items", "status", database_url=database_url)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    block = out[out.index("thousand: ") :].split("\nqueue")[0].splitlines()
    assert block[0].startswith("thousand: last success 3 h ago (")
    assert block[1].startswith("  OVERDUE ")  # its */5 slots since the skips have no outcome
    header, *table = block[2:]
    assert header.split() == ["STARTED", "STATUS", "SLOT", "TOOK", "DETAIL"]
    assert len(table) == 6  # the last five (lock_busy skips) and the last real run
    assert all("no_slot" not in line for line in table)
    assert "partial" in table[-1] and "990 ok, 10 failed" in table[-1] and "3 h ago" in table[-1]
    # Aligned: every row's STATUS starts where the header's does.
    column = header.index("STATUS")
    assert {line[column : column + 7] for line in table[:-1]} == {"skipped"}
    assert not re.search(r"\d{2}:\d{2}:\d{2}\.\d", out)  # no microseconds
    assert "last 1 runs" not in out and " runs\n" not in out
    rates = [
        line.split() for line in out.splitlines() if line.strip().startswith(("PER", "failed"))
    ]
    assert rates[0] == ["PER", "MINUTE", "1", "min", "5", "min", "15", "min"]
    assert len(rates[1]) == 4  # failed: 1, 5 and 15 minutes

    report = json.loads(
        (
            await invoke_async(
                "--app", "testapps.items", "status", "--json", database_url=database_url
            )
        ).stdout
    )
    [thousand] = [t for t in report["tasks"] if t["task"] == "thousand"]
    assert [r["skip_reason"] for r in thousand["last_runs"]] == ["lock_busy"] * 5
    assert thousand["last_real_run"]["status"] == "partial"


async def test_list_names_the_job_types_and_one_time_for_a_utc_task(database_url: str) -> None:
    listed = await invoke_async("--app", "tasks", "list", "--count", "1", database_url=database_url)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    header = lines[0].split()
    assert header == ["NAME", "CRON", "TIMEZONE", "LOCK", "(ns,", "key)", "MISFIRE", "NEXT"]
    [reindex] = [line for line in lines if line.startswith("reindex-fts")]
    assert re.search(r" UTC .* \d{4}-\d\d-\d\d \d\d:\d\dZ  in \d+ (s|min)$", reindex), reindex
    assert reindex.count("Z") == 1  # no second, identical UTC column
    types = lines[lines.index("JOB TYPE         QUEUE    RETRIES  TIMEOUT  HANDLER") :]
    assert [line.split()[0] for line in types[1:]] == [
        "generate_report",
        "process_payment",
        "send_email",
    ]
    as_json = json.loads(
        (await invoke_async("--app", "tasks", "list", "--json", database_url=database_url)).stdout
    )
    assert {t["job_type"] for t in as_json["job_types"]} == {
        "generate_report",
        "process_payment",
        "send_email",
    }
