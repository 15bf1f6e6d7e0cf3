"""The README's main-job command runs to its end: start, a Run, a stop, a SIGKILL, recover."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.e2e


def test_demo_survives_a_stop_and_a_crash() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.demo_main"],
        capture_output=True, text=True, timeout=50, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "Restore  resumed 0 · waiting 1" in out
    assert "CLI_SERVICE_BUSY" in out  # stop refuses to touch a crashed host's files
    assert "Recovery plan: .intloom/service.json, .intloom/service.lock." in out
    assert "Completed · example" in out
    assert out.rstrip().endswith("nothing ran twice.")
    # Run in the project, as `cd` then `intloom ...` reads: no command to copy needs
    # --project, and none ends by saying where such commands must run.
    assert "--project" not in out, out
    assert "The intloom commands above are for" not in out, out
