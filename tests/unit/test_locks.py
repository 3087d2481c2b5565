"""Invariant 1: a lock key is a pure function of (namespace, name), equal in every process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import cronlock
from cronlock import App, LockKeyCollision, lock_key, namespace_key


def test_keys_are_pinned() -> None:
    # The mapping is an on-disk contract: changing it lets old and new deployments overlap.
    assert lock_key("reindex-fts") == -987143703
    assert lock_key("drain") == -349255540
    assert namespace_key("cron") == 944166202


def test_keys_fit_int4() -> None:
    for name in ("", "a", "x" * 1000, "ñandú", "task-25612"):
        assert -(2**31) <= lock_key(name) < 2**31
        assert -(2**31) <= namespace_key(name) < 2**31


def test_integer_namespaces_are_taken_as_they_are() -> None:
    assert namespace_key(7) == 7
    with pytest.raises(ValueError, match="int4"):
        namespace_key(2**31)


@pytest.mark.parametrize("seeds", [("0", "1"), ("12345", "random")])
def test_equal_across_processes_with_different_hash_seeds(seeds: tuple[str, str]) -> None:
    program = (
        "import json, cronlock; "
        "print(json.dumps([cronlock.lock_key('reindex-fts'), cronlock.namespace_key('cron'), "
        "hash('reindex-fts')]))"
    )
    outputs = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", program],
                env={"PYTHONHASHSEED": seed, "PATH": ""},
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        for seed in seeds
    ]
    assert outputs[0][:2] == outputs[1][:2] == [-987143703, 944166202]
    assert outputs[0][2] != outputs[1][2]  # what the reference's hash() would have used


def test_colliding_registration_is_rejected() -> None:
    # Found by search: two names whose 32-bit keys collide.
    assert lock_key("task-25612") == lock_key("task-28422")
    app = App()

    @app.periodic("task-25612", cron="* * * * *")
    async def first(run: cronlock.Run) -> None:
        pass

    with pytest.raises(LockKeyCollision, match=r"task-25612.*task-28422.*same lock key"):
        app.periodic("task-28422", cron="* * * * *")

    # In another namespace the same key is another lock.
    app.periodic("task-28422", cron="* * * * *", namespace="reports")(first)
    assert set(app.tasks) == {"task-25612", "task-28422"}
