"""``start --foreground`` under a supervisor, a pipe or a terminal: its standard streams.

The host and its Workflows' code run in the command's process and share its stdout and
stderr; and a supervisor may start it with one of them closed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

def test_a_command_started_with_stdout_closed_works_as_with_dev_null(tmp_path: Path) -> None:
    """``intloom start --foreground >&-`` (or any command): Python sets sys.stdout to None,
    and the command failed as CLI_INTERNAL_ERROR (exit 70) before it did anything."""
    proc = subprocess.run(
        [sys.executable, "-m", "intloom", "status"], cwd=tmp_path, stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, timeout=30, preexec_fn=lambda: os.close(1),
        # NO_COLOR unset: with it, the first look at sys.stdout was skipped.
        env={**{k: v for k, v in os.environ.items() if k != "NO_COLOR"},
             "PYTHONPATH": str(REPO)})
    assert proc.returncode == 1, proc.stderr
    assert "Failure · CLI_PROJECT_INVALID" in proc.stderr, proc.stderr
