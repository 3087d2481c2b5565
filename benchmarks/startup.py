"""What a command costs before it does anything (issue 26, item 4): every crontab line pays
``cronlock``'s start-up at every slot on every host.

    python -m benchmarks.startup --database-url URL [--setup] [--rounds 7] [--tree DIR ...]
        [--importtime]

For each source tree (``--tree``, default this one; give two to compare a branch with main in
one run), it runs ``cronlock --help`` and ``cronlock --app tasks run refresh-post-stats
--manual --json`` as cron would, a fresh process each time, by this environment's console
script with ``PYTHONPATH`` set to the tree; ``python -c pass`` gives the interpreter's own
floor, and a script importing what the tree's run imports that is not cronlock's or the app's
(SQLAlchemy, asyncpg, click, the standard library) the floor no cut in cronlock can lower.
The trees take turns command by command in each round, so a busy moment of the machine falls
on both. A run's overhead is its wall time minus the run's own ``duration_ms`` (what its JSON
line says the run took); the total wall time is printed too, since the statements a run sends
are built on their first use, inside the run's own time. The database must be migrated and
hold the demo tables (``--setup`` creates both). Prints the median (min..max) of ``--rounds``
rounds, in milliseconds, with the processes' CPU time (user + system), which the other
sessions of a shared machine move less than the wall time. Bytecode is cached, as an
installed package's is, in a directory of the run's own (the warm-up round fills it).
``--importtime`` adds each tree's ``-X importtime`` self times per top-level package.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN_TASK = ("--app", "tasks", "run", "refresh-post-stats", "--manual", "--json")


def console_script() -> str:
    """This environment's ``cronlock`` script itself (not a version manager's shim, which
    would add its own start-up)."""
    return str(Path(sysconfig.get_path("scripts")) / "cronlock")


def timed(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, str]:
    """Wall and CPU (user + system) milliseconds of ``command`` run in ``cwd`` (the tree, as
    a crontab line runs in its project: ``python -m`` puts the directory first on the path),
    and its stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    process = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    wall = (time.perf_counter() - start) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {process.returncode}: {process.stderr}")
    return wall, cpu, process.stdout


def floor_script(env: dict[str, str], tree: Path) -> str:
    """A ``python -c`` script importing what the run imports that is neither cronlock's nor
    the app's (SQLAlchemy, asyncpg, click, the standard library): what no cut in cronlock
    can take away. The list is the run's own ``-X importtime`` report."""
    process = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "cronlock", *RUN_TASK],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    names = [
        line.rpartition("|")[2].strip()
        for line in process.stderr.splitlines()[1:]
        if line.startswith("import time:")
    ]
    others = sorted({n for n in names if n.split(".")[0] not in {"cronlock", "tasks"}})
    return (
        "import importlib\n"
        f"for name in {others!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception:\n"
        "        pass\n"
    )


def importtime_report(tree: Path, database_url: str, runs: int = 3) -> list[str]:
    """The run's ``-X importtime`` self times summed per top-level package, the largest
    first, as min..max over ``runs`` runs. A module ``importlib`` loads is not in the report
    (what it imports is): ``cronlock.sql``'s statement modules, loaded on first use, are
    built inside the run, so their cost is in the run's own time, not in its overhead."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONLOCK_")}
    env.update(CRONLOCK_DATABASE_URL=database_url, PYTHONPATH=str(tree))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="cronlock-startup-pycache-")
    totals: dict[str, list[float]] = defaultdict(list)
    for index in range(runs + 1):  # the first fills the bytecode cache
        process = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "cronlock", *RUN_TASK],
            env=env,
            cwd=tree,
            capture_output=True,
            text=True,
            check=True,
        )
        sums: dict[str, float] = defaultdict(float)
        for line in process.stderr.splitlines()[1:]:
            if line.startswith("import time:"):
                self_us, _, name = line[len("import time:") :].split("|")
                sums[name.strip().split(".")[0]] += int(self_us) / 1000
        if index:
            sums["(all)"] = sum(sums.values())
            for package, ms in sums.items():
                totals[package].append(ms)
    ranked = sorted(totals.items(), key=lambda item: -statistics.median(item[1]))
    return [f"{package} {min(ms):.0f}..{max(ms):.0f} ms" for package, ms in ranked[:9]]


def measure(trees: list[Path], database_url: str, rounds: int) -> dict[str, list[float]]:
    script = console_script()
    samples: dict[str, list[float]] = defaultdict(list)
    floors: dict[Path, str] = {}
    base = {k: v for k, v in os.environ.items() if not k.startswith("CRONLOCK_")}
    base["CRONLOCK_DATABASE_URL"] = database_url
    # Bytecode cached, as an installed package's is, in a directory of this run's own: the
    # trees are not written to, and the warm-up round fills it.
    base.pop("PYTHONDONTWRITEBYTECODE", None)
    base["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="cronlock-startup-pycache-")
    for round_ in range(rounds + 1):  # round 0 warms the page cache and is dropped
        row: dict[str, float] = {}
        wall, cpu, _ = timed([sys.executable, "-c", "pass"], base, ROOT)
        row["python -c pass: wall"] = wall
        row["python -c pass: CPU"] = cpu
        for tree in trees:
            env = {**base, "PYTHONPATH": str(tree)}
            if tree not in floors:
                floors[tree] = floor_script(env, tree)
            wall, cpu, _ = timed([sys.executable, "-c", floors[tree]], env, tree)
            row[f"{tree}: the run's imports that are not cronlock's: wall"] = wall
            wall, cpu, _ = timed([script, "--help"], env, tree)
            row[f"{tree}: --help: wall"] = wall
            row[f"{tree}: --help: CPU"] = cpu
            wall, cpu, out = timed([script, *RUN_TASK], env, tree)
            own = json.loads(out)["duration_ms"]
            row[f"{tree}: run: own"] = own
            row[f"{tree}: run: wall"] = wall
            row[f"{tree}: run: wall - own"] = wall - own
            row[f"{tree}: run: CPU"] = cpu
        if round_ > 0:
            for key, value in row.items():
                samples[key].append(value)
    return samples


# Run in a process of its own, as the commands are: this one imports neither cronlock nor the app.
_SETUP_DEMO = """
import asyncio, sys
from cronlock.database import Database
from tasks.models import setup_demo

async def go(url):
    database = Database(url)
    async with database.session() as session:
        await setup_demo(session)
        await session.commit()
    await database.dispose()

asyncio.run(go(sys.argv[1]))
"""


def setup(database_url: str) -> None:
    """Migrate the database and create the demo tables the run reads."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONLOCK_")}
    env["PYTHONPATH"] = str(ROOT)
    subprocess.run(
        [console_script(), "--database-url", database_url, "migrate"], env=env, cwd=ROOT, check=True
    )
    subprocess.run([sys.executable, "-c", _SETUP_DEMO, database_url], env=env, cwd=ROOT, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tree", action="append", type=Path, help="a source tree (repeatable)")
    parser.add_argument("--setup", action="store_true", help="migrate and create the demo tables")
    parser.add_argument(
        "--importtime", action="store_true", help="also each tree's -X importtime, per package"
    )
    args = parser.parse_args()
    if args.setup:
        setup(args.database_url)
    trees = [t.resolve() for t in args.tree] if args.tree else [ROOT]
    samples = measure(trees, args.database_url, args.rounds)
    width = max(len(k) for k in samples)
    for key, values in samples.items():
        print(
            f"{key:<{width}}  {statistics.median(values):7.0f} ms"
            f"  ({min(values):.0f}..{max(values):.0f})"
        )
    if args.importtime:
        for tree in trees:
            print(
                f"{tree}: -X importtime, self per package:",
                ", ".join(importtime_report(tree, args.database_url)),
            )


if __name__ == "__main__":
    main()
