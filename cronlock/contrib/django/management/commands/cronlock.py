"""``manage.py cronlock ARGS``: cronlock's command line (``cronlock --help``) on the project's
App (``cronlock.contrib.django.worker``), its database the cronlock backends' Django database.

Everything after ``cronlock`` is cronlock's, parsed by cronlock's own command line: Django's
options do not apply (``-v`` is cronlock's), but ``--settings`` and ``--pythonpath``, which
``manage.py`` reads before any command, are taken out. ``crontab`` prints lines that run this
same ``manage.py`` with this same Python, unless given ``--cronlock``. The exit code is
cronlock's.
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

__all__ = ["APP_SPEC", "Command", "run"]

APP_SPEC = "cronlock.contrib.django:app"
_DJANGO_OPTIONS = ("--settings", "--pythonpath")


def _without_django_options(arguments: list[str]) -> list[str]:
    kept: list[str] = []
    skip = False
    for argument in arguments:
        if skip:
            skip = False
        elif argument in _DJANGO_OPTIONS:
            skip = True
        elif not argument.startswith(tuple(f"{o}=" for o in _DJANGO_OPTIONS)):
            kept.append(argument)
    return kept


def run(arguments: list[str], *, manage: str, prog: str) -> None:
    """cronlock's command line with ``arguments`` on the project's App; exits (SystemExit)
    with its code. ``manage`` is the path of ``manage.py``, for the crontab lines."""
    from cronlock.cli import cli

    arguments = list(arguments)
    if "crontab" in arguments and "--cronlock" not in arguments:
        at = arguments.index("crontab") + 1
        command = f"{shlex.quote(sys.executable)} {shlex.quote(os.path.abspath(manage))} cronlock"
        arguments[at:at] = ["--cronlock", command]
    cli.main(args=["--app", APP_SPEC, *arguments], prog_name=prog)


class Command(BaseCommand):
    help = "cronlock's command line for this project: worker, drain, scheduler, crontab, run, …"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("arguments", nargs="*", help="cronlock's command and its options")

    def run_from_argv(self, argv: list[str]) -> None:
        run(
            _without_django_options(argv[2:]),
            manage=argv[0],
            prog=f"{os.path.basename(argv[0])} {argv[1]}",
        )

    def handle(self, *args: Any, **options: Any) -> None:  # call_command("cronlock", ...)
        run(list(options["arguments"]), manage=sys.argv[0], prog="cronlock")
