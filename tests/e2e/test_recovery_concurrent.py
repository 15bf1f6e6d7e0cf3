"""``recover``, ``recover`` and ``start`` launched at once after a crash, round after round.

Every round must end with exactly one recovery, documented errors for the others, and a
working host whose ``service.lock`` names the live instance. The port guard and the OS lock
are what serialise them; nothing here waits for one command before launching the next.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from intloom.diagnostics import diagnose
from tests.helpers import CliResult, Project

pytestmark = pytest.mark.e2e

# Each round costs about half a second of three CLI processes. The suite runs 8: a race
# that 8 rounds never hit is still found by the deeper run the issue asked for, fifty
# rounds or more: INTLOOM_RECOVERY_ROUNDS=50 scripts/test tests/e2e/test_recovery_concurrent.py
ROUNDS = int(os.environ.get("INTLOOM_RECOVERY_ROUNDS", "8"))

RECOVER_ERRORS = {"CLI_RECOVERY_BLOCKED", "CLI_RECOVERY_CONFLICT"}
START_ERRORS = {"CLI_SERVICE_BUSY", "CLI_SERVICE_UNAVAILABLE", "CLI_SERVICE_CLOSING"}


def _kill_host(project: Project) -> int:
    """SIGKILL the host; the diagnosis then sees only gone owners."""
    pid = project.kill_host()
    assert diagnose(project.root, probe=False).status == "recovery_required"
    return pid


def _launch(project: Project, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "intloom", "--project", str(project.root), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "NO_COLOR": "1"},
    )


def _finish(proc: subprocess.Popen[str]) -> CliResult:
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return CliResult(proc.returncode, out, err)


def _error_code(result: CliResult) -> str:
    assert result.code != 0
    assert "Traceback" not in result.stderr, result.stderr
    code: str = result.json["error"]["code"]
    return code


def _ensure_running(project: Project) -> dict[str, Any]:
    result = project.cli("start", "--json")
    assert result.code == 0, (result.stdout, result.stderr)
    service: dict[str, Any] = result.json["service"]
    return service


@pytest.mark.timeout(max(150, 3 * ROUNDS))
def test_recover_recover_start_at_once_after_a_crash(project: Project) -> None:
    _ensure_running(project)
    outcomes: list[tuple[str, ...]] = []
    for round_no in range(ROUNDS):
        _kill_host(project)
        procs = [
            _launch(project, "recover", "--json"),
            _launch(project, "recover", "--json"),
            _launch(project, "start", "--json"),
        ]
        try:
            first, second, start = (_finish(p) for p in procs)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            project.track_host()

        recovered = 0
        seen: list[str] = []
        for result in (first, second):
            if result.code == 0:
                doc = result.json
                assert doc["dryRun"] is False
                if doc["recovered"]:
                    recovered += 1
                    assert doc["paths"] == [".intloom/service.json", ".intloom/service.lock"]
                    seen.append("recovered")
                else:
                    assert doc["paths"] == []
                    seen.append("nothing_to_do")
            else:
                code = _error_code(result)
                assert code in RECOVER_ERRORS, (round_no, result)
                seen.append(code)
        assert recovered == 1, (round_no, first, second, start)
        if start.code == 0:
            seen.append("started")
        else:
            code = _error_code(start)
            assert code in START_ERRORS, (round_no, start)
            seen.append(code)
        outcomes.append(tuple(seen))

        # Whatever interleaving happened, the project is startable and consistent.
        service = _ensure_running(project)
        lock = json.loads((project.state / "service.lock").read_text())
        assert lock["instanceId"] == service["instanceId"]
        assert lock["pid"] == service["pid"]
    # Every outcome was one of the documented ones; print the mix for the curious.
    print(sorted(set(outcomes)))
