"""The public surface is exactly ``cronlock.__all__`` (as httpx asserts its own), plus
``__version__`` and the optional ``cronlock.http``."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import sys
import tomllib
import types
from pathlib import Path

import pytest

import cronlock


def test_all_is_sorted_and_complete() -> None:
    public = sorted(name for name in dir(cronlock) if not name.startswith("_"))
    submodules = {name for name in public if type(getattr(cronlock, name)).__name__ == "module"}
    assert cronlock.__all__ == sorted(cronlock.__all__)
    assert sorted(set(public) - submodules - {"annotations"}) == cronlock.__all__
    # Every public name is there once one is asked for (they are loaded together).
    assert set(cronlock.__all__) <= set(vars(cronlock))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        cronlock.Nope  # type: ignore[attr-defined]  # noqa: B018


def test_public_names_belong_to_cronlock() -> None:
    for name in cronlock.__all__:
        obj = getattr(cronlock, name)
        # A type alias keeps its origin's module; a union of them (JobHandler) has none.
        if isinstance(obj, types.GenericAlias | types.UnionType):
            continue
        assert obj.__module__ == "cronlock", name


def test_errors_have_one_base_and_default_messages() -> None:
    for name in cronlock.__all__:
        obj = getattr(cronlock, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, cronlock.CronlockError)
            assert str(obj()) == (obj.__doc__ or "").strip()


def test_what_a_user_writes_is_public() -> None:
    # A handler (async def or plain def) and a task body have names a user can annotate with.
    assert "[sqlalchemy.ext.asyncio.session.AsyncSession," in str(cronlock.JobHandler)
    assert "[sqlalchemy.orm.session.Session," in str(cronlock.JobHandler)
    assert "Run" in str(cronlock.TaskBody)
    # Serving, migrating and reading the status from code, without the command line.
    for serve in (cronlock.serve_worker, cronlock.serve_drain, cronlock.serve_scheduler):
        assert inspect.iscoroutinefunction(serve)
        assert {"stop", "handle_signals"} <= set(inspect.signature(serve).parameters)
    # A worker rides out a lost database as its Reconnect says (None: it ends).
    assert inspect.signature(cronlock.serve_worker).parameters["reconnect"].default == (
        cronlock.Reconnect()
    )
    assert inspect.iscoroutinefunction(cronlock.App.migrate)
    assert inspect.iscoroutinefunction(cronlock.App.status)
    # The drainer's claimed job is the drainer's: a handler gets (session, payload), asks
    # for its job's context, and may return JobCancel or JobSnooze as its outcome.
    assert "Job" not in cronlock.__all__
    assert {"JobCancel", "JobContext", "JobSnooze", "NoCurrentJob", "current_job"} <= set(
        cronlock.__all__
    )
    assert inspect.signature(cronlock.current_job).parameters == {}
    assert inspect.signature(cronlock.current_job).return_annotation in ("JobContext",)
    assert set(inspect.signature(cronlock.JobContext).parameters) == {
        "id",
        "job_type",
        "queue",
        "attempt",
        "max_retries",
        "enqueued_at",
    }


def test_the_version_is_semver_and_its_one_source() -> None:
    # MAJOR.MINOR.PATCH, with a PEP 440 pre-release or dev suffix (0.3.0.dev0, 1.0.0rc1).
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?(\.dev\d+)?", cronlock.__version__)
    project = tomllib.loads((Path(cronlock.__file__).parents[1] / "pyproject.toml").read_text())
    assert project["project"]["dynamic"] == ["version"]
    assert project["tool"]["hatch"]["version"]["path"] == "cronlock/__init__.py"


def test_the_drainer_options_are_one_typed_value() -> None:
    """App.drainer, App.drain and Drainer take one DrainOptions (changed by its own field
    names, checked when made), not a parameter list of their own each (issue 22, item 4)."""
    fields = {f.name for f in dataclasses.fields(cronlock.DrainOptions)}
    assert {"queue", "commit_mode", "batch_size", "sweep_interval", "clock", "rng"} <= fields
    for method in (cronlock.App.drainer, cronlock.App.drain, cronlock.Drainer):
        parameters = inspect.signature(method).parameters
        assert parameters["options"].kind is inspect.Parameter.POSITIONAL_ONLY or (
            method is cronlock.Drainer
        )
        assert not fields & set(parameters), method  # no field re-declared
    app = cronlock.App()
    app.use_database("postgresql://localhost/nothing")
    drainer = app.drainer(cronlock.DrainOptions(commit_mode="lease"), sweep_interval=2.0)
    assert drainer.options.sweep_interval == 2.0 and drainer.commit_mode.value == "lease"
    assert drainer.batch_size == 1
    with pytest.raises(TypeError, match="no_such_option"):
        app.drainer(no_such_option=1)
    with pytest.raises(ValueError, match="at least 1"):
        cronlock.DrainOptions(concurrency=0)


def test_tracing_is_public_and_says_which_extra_it_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    tracing = importlib.import_module("cronlock.tracing")
    assert {"instrument", "uninstrument", "Tracing"} <= set(tracing.__all__)
    monkeypatch.delitem(sys.modules, "cronlock.tracing")
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(cronlock.ConfigurationError, match=r"pip install 'cronlock\[otel\]'"):
        importlib.import_module("cronlock.tracing")


def test_http_is_public_and_says_which_extra_it_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    http = importlib.import_module("cronlock.http")
    assert {"create_api", "create_router"} <= set(http.__all__)
    # Without the extra: one line saying what to install, not a missing-module traceback.
    for name in [m for m in sys.modules if m == "cronlock.http" or m.startswith("cronlock.http.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "fastapi", None)
    with pytest.raises(cronlock.ConfigurationError, match=r"pip install 'cronlock\[http\]'"):
        importlib.import_module("cronlock.http")
