#!/usr/bin/env python
"""The project's manage.py, as ``django-admin startproject`` writes one (its package is
``djangosite``, one directory up on the path)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djangosite.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
