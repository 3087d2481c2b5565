"""``benchmarks.startup`` measures what it says (no timing asserted): on a database it sets up
itself, every command of a round runs and is timed, and a run's overhead is its wall time less
the run's own time."""

from __future__ import annotations

from benchmarks import startup


def test_a_round_times_help_a_run_and_the_floor(database_url: str) -> None:
    startup.setup(database_url)
    tree = startup.ROOT
    samples = startup.measure([tree], database_url, rounds=1)
    assert {len(values) for values in samples.values()} == {1}
    assert {key.partition(": ")[2] for key in samples if key.startswith(str(tree))} == {
        "the run's imports that are not cronlock's: wall",
        "--help: wall",
        "--help: CPU",
        "run: own",
        "run: wall",
        "run: wall - own",
        "run: CPU",
    }
    (own,), (wall,), (overhead,) = (
        samples[f"{tree}: run: {k}"] for k in ("own", "wall", "wall - own")
    )
    assert 0 < own < wall and overhead == wall - own
