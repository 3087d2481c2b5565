"""An app whose import waits: it writes the file ``$STARTING`` and waits (up to 30 s) until
the file ``$GO`` exists, so a test can signal a command while it is still starting up."""

from __future__ import annotations

import os
import time
from pathlib import Path

from testapps import jobs

Path(os.environ["STARTING"]).write_text("importing\n")
_deadline = time.monotonic() + 30
while not Path(os.environ["GO"]).exists() and time.monotonic() < _deadline:
    time.sleep(0.01)

app = jobs.create_app()
