"""The public surface is exactly ``cronlock.__all__`` (as httpx asserts its own), plus
``__version__`` and the optional ``cronlock.http``."""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from importlib import metadata

import pytest

import cronlock


def test_all_is_sorted_and_complete() -> None:
    public = sorted(name for name in vars(cronlock) if not name.startswith("_"))
    submodules = {name for name in public if type(getattr(cronlock, name)).__name__ == "module"}
    assert cronlock.__all__ == sorted(cronlock.__all__)
    assert sorted(set(public) - submodules - {"annotations"}) == cronlock.__all__


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


def test_version_is_the_installed_distributions() -> None:
    assert cronlock.__version__ == metadata.version("cronlock")


def test_the_drainer_options_are_typed_keywords() -> None:
    for method in (cronlock.App.drainer, cronlock.App.drain):
        kinds = {p.kind for name, p in inspect.signature(method).parameters.items()}
        assert inspect.Parameter.VAR_KEYWORD not in kinds, method
    # The app gives the drainer its own database, handlers and tracing (cronlock.tracing).
    given = {"database", "handlers", "tracing"}
    drainer = set(inspect.signature(cronlock.Drainer).parameters) - given
    assert drainer == set(inspect.signature(cronlock.App.drainer).parameters) - {"self"}
    # Each default is the Drainer's own.
    for name, parameter in inspect.signature(cronlock.App.drainer).parameters.items():
        if name != "self":
            assert parameter.default == inspect.signature(cronlock.Drainer).parameters[name].default


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
