"""Finding the user's App from ``--app MODULE[:ATTR]``.

The current directory is importable, as with ``python -m``, so ``--app tasks`` finds the
``tasks`` package of the project the command is run from. Without ``:ATTR`` the module's
``app`` attribute is used, or its only App.
"""

from __future__ import annotations

import importlib
import os
import sys

from .app import App
from .errors import AppNotFound, CronlockError

__all__ = ["load_app"]


def load_app(spec: str) -> App:
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise AppNotFound(f"invalid --app {spec!r}: expected MODULE[:ATTR]")

    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except CronlockError:
        raise  # a bad registration (invalid cron, colliding keys) says it best itself
    except ModuleNotFoundError as exc:
        if module_name.endswith(".py") or "/" in module_name:
            dotted = module_name.removesuffix(".py").removeprefix("./").strip("/")
            guess = dotted.replace("/", ".") + (f":{attr}" if attr else "")
            raise AppNotFound(
                f"cannot import app module {module_name!r}: --app takes a module name, not a "
                f"file: did you mean `--app {guess}`? (from the directory that holds it)"
            ) from None
        if exc.name and module_name.startswith(exc.name):
            raise AppNotFound(
                f"cannot import app module {module_name!r}: no such module "
                f"(run from your project directory, or set --app / CRONLOCK_APP)"
            ) from None
        raise AppNotFound(f"cannot import app module {module_name!r}: {exc}") from None
    except Exception as exc:
        raise AppNotFound(
            f"cannot import app module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    except SystemExit as exc:  # a module that exits on import is not an App (nor our exit code)
        raise AppNotFound(
            f"cannot import app module {module_name!r}: it called sys.exit({exc.code!r}) "
            "on import (guard its script part with if __name__ == '__main__')"
        ) from None
    if attr:
        found = getattr(module, attr, None)
        if not isinstance(found, App):
            raise AppNotFound(f"{module_name!r} has no cronlock App named {attr!r}")
        return found
    if isinstance(getattr(module, "app", None), App):
        return module.app  # type: ignore[no-any-return]
    apps = [value for value in vars(module).values() if isinstance(value, App)]
    if len(apps) != 1:
        raise AppNotFound(
            f"{module_name!r} defines {len(apps)} cronlock Apps: "
            f"name one with --app {module_name}:ATTR"
        )
    return apps[0]
