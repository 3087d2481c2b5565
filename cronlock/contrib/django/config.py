"""The project's settings as cronlock reads them: a backend's ``OPTIONS``, where its tasks may
live, and the database URL of a ``DATABASES`` entry.

A task runs on the worker only if its function is in one of the project's task modules: each
installed app's ``tasks`` module (a module or a package, with its submodules) and the modules
the backends' ``OPTIONS["MODULES"]`` name. The worker imports those and no other module: a job
row names its task by module path, and a path outside them is never imported, so a row cannot
make the worker import arbitrary code. An enqueue of a task defined elsewhere is refused
(``InvalidTask``), in the process that enqueues.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from sqlalchemy import URL

from ...sql.tables import SCHEMA
from .api import Task

__all__ = [
    "BackendOptions",
    "database_url",
    "find_task",
    "import_tasks",
    "in_modules",
    "task_modules",
]

# The libpq keywords of a Django database's OPTIONS that cronlock's URL takes (the others,
# the psycopg pool's or isolation level, are Django's own business).
_URL_OPTIONS = frozenset(
    {
        "sslmode",
        "sslcert",
        "sslkey",
        "sslrootcert",
        "sslcrl",
        "sslpassword",
        "target_session_attrs",
        "passfile",
        "connect_timeout",
        "options",
        "keepalives_idle",
        "keepalives_interval",
        "keepalives_count",
        "tcp_user_timeout",
    }
)
_KNOWN_OPTIONS = frozenset({"DATABASE", "SCHEMA", "MAX_RETRIES", "MODULES"})


@dataclass(frozen=True)
class BackendOptions:
    """A ``CronlockBackend``'s ``OPTIONS``: the Django database its jobs are written on (and
    its atomic blocks the enqueues join), cronlock's schema there, the retries a failed task
    gets (0: it fails as in Django's own backends), and the task modules beyond each app's
    ``tasks``."""

    database: str = "default"
    schema: str = SCHEMA
    max_retries: int = 0
    modules: tuple[str, ...] = ()

    @classmethod
    def of(cls, alias: str, options: Mapping[str, Any]) -> BackendOptions:
        unknown = sorted(set(options) - _KNOWN_OPTIONS)
        if unknown:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']: unknown {', '.join(unknown)} "
                f"(cronlock's are {', '.join(sorted(_KNOWN_OPTIONS))})"
            )
        database = options.get("DATABASE", cls.database)
        schema = options.get("SCHEMA", cls.schema)
        retries = options.get("MAX_RETRIES", cls.max_retries)
        modules = options.get("MODULES", ())
        if not isinstance(database, str) or not isinstance(schema, str) or not schema:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']: DATABASE and SCHEMA are names (strings)"
            )
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']['MAX_RETRIES'] must be a whole number, at least 0"
            )
        if isinstance(modules, str) or not all(isinstance(m, str) and m for m in modules):
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']['MODULES'] must be a list of module names"
            )
        return cls(database, schema, retries, tuple(modules))


def task_modules(extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The project's task modules: each installed app's ``tasks`` that exists, then
    ``extra`` (the apps must be loaded: ``django.setup()``)."""
    found = []
    for config in apps.get_app_configs():
        name = f"{config.name}.tasks"
        try:
            exists = importlib.util.find_spec(name) is not None
        except ImportError:
            exists = False
        if exists:
            found.append(name)
    return tuple(dict.fromkeys([*found, *extra]))


def in_modules(module: str, modules: Iterable[str]) -> bool:
    """Whether ``module`` is one of ``modules`` or inside one of them (a submodule)."""
    return any(module == root or module.startswith(root + ".") for root in modules)


def _walk(root: str) -> Iterator[ModuleType]:
    module = importlib.import_module(root)
    yield module
    path = getattr(module, "__path__", None)
    if path is not None:  # a package: its submodules too
        for info in pkgutil.walk_packages(path, prefix=f"{root}."):
            yield importlib.import_module(info.name)


def import_tasks(modules: Iterable[str]) -> list[Task[Any, Any]]:
    """Import ``modules`` (and a package's submodules): the tasks defined in them, each once
    (by module path), in the order found."""
    tasks: dict[str, Task[Any, Any]] = {}
    for root in modules:
        for module in _walk(root):
            for value in vars(module).values():
                if isinstance(value, Task) and value.func.__module__ == module.__name__:
                    tasks.setdefault(value.module_path, value)
    return list(tasks.values())


def find_task(module_path: str, modules: Iterable[str]) -> Task[Any, Any] | None:
    """The task at ``module_path`` if its module is one of ``modules`` (imported if it was
    not yet), else None: never an import outside them."""
    module_name, _, name = module_path.rpartition(".")
    if not module_name or not in_modules(module_name, modules):
        return None
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    found = getattr(module, name, None)
    if isinstance(found, Task) and found.module_path == module_path:
        return found
    return None


def database_url(alias: str) -> str:
    """A ``postgresql://`` URL for Django's database ``alias`` (its NAME, USER, PASSWORD,
    HOST, PORT and the libpq keywords of its OPTIONS), for cronlock's own connections."""
    if alias not in connections:
        raise ImproperlyConfigured(f"no database {alias!r} in DATABASES")
    params = connections[alias].settings_dict
    engine = str(params.get("ENGINE", ""))
    if not engine.startswith("django.db.backends.postgresql"):
        raise ImproperlyConfigured(
            f"DATABASES[{alias!r}] is {engine or 'not set'}: cronlock needs PostgreSQL"
        )
    host = str(params.get("HOST") or "")
    query = {
        key: str(value)
        for key, value in (params.get("OPTIONS") or {}).items()
        if key in _URL_OPTIONS
    }
    if host.startswith("/"):  # a Unix socket's directory
        query["host"] = host
        host = ""
    port = params.get("PORT")
    url = URL.create(
        "postgresql",
        username=params.get("USER") or None,
        password=params.get("PASSWORD") or None,
        host=host or None,
        port=int(port) if port else None,
        database=params.get("NAME") or None,
        query=query,
    )
    return url.render_as_string(hide_password=False)
