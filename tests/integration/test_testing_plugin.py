"""The testing kit as a user's project has it: the example (tests/integration/test_testing_kit.py)
copied into a project of its own, with no conftest.py, run by pytest in a process of its own with
only the plugin's fixtures (the installed entry point, else ``-p cronlock.testing.plugin`` when
the installed metadata predates it) and every warning an error."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "integration" / "test_testing_kit.py"
CONFIG = """\
[tool.pytest.ini_options]
asyncio_mode = "auto"
asyncio_default_fixture_loop_scope = "function"
filterwarnings = ["error", "ignore::UserWarning:platformdirs.*"]
"""


def test_a_project_of_its_own_runs_the_example_with_the_plugin_alone(tmp_path: Path) -> None:
    shutil.copy(EXAMPLE, tmp_path / "test_signup.py")
    (tmp_path / "pyproject.toml").write_text(CONFIG)
    installed = entry_points(group="pytest11", name="cronlock")
    plugin = [] if installed else ["-p", "cronlock.testing.plugin"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_XDIST_WORKER", None)

    done = subprocess.run(
        [sys.executable, "-m", "pytest", *plugin, "-p", "no:cacheprovider", "-q"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert "7 passed" in done.stdout
