"""The lane loop and the batch are written once, for every commit mode (issue 22).

A commit mode is a ``Commit`` strategy around ``Lanes`` (``queue/lanes.py``): how a batch is
claimed and how its outcomes are completed. It is never a subclass of ``Lanes`` that writes
the loop or the batch again (``LeasedLanes`` did, and a feature then had to be written twice).
The scan reads the code (its syntax tree), not the prose.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import cronlock
from cronlock.queue.lanes import Commit, InTransaction, Lanes
from cronlock.queue.leased import Leased

PACKAGE = Path(cronlock.__file__).resolve().parent
ONCE = {"_lane_loop", "_batches", "_batch", "_idle", "_refused"}


def test_the_lane_loop_and_the_batch_are_defined_once() -> None:
    defined: Counter[str] = Counter()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in ONCE:
                defined[node.name] += 1
    assert {name: defined[name] for name in ONCE} == dict.fromkeys(ONCE, 1)


def test_no_commit_mode_subclasses_the_lanes() -> None:
    assert Lanes.__subclasses__() == []


def test_every_commit_mode_has_the_whole_strategy() -> None:
    members = {name for name in vars(Commit) if not name.startswith("_")}
    members |= set(Commit.__annotations__)  # rolls_back, next_due
    assert members == {
        *("claim", "ran", "complete", "abandon", "cut", "lost", "cut_off"),
        *("rolls_back", "next_due"),
    }
    for mode in (InTransaction, Leased):
        assert members <= {*dir(mode), *mode.__annotations__}, mode
