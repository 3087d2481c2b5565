"""A module whose script part runs on import: it exits 5 (issue 16, point 6)."""

import sys

import cronlock

app = cronlock.App()

sys.exit(5)
