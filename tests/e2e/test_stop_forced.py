"""``intloom stop`` of a host that a second stop signal ended at once, during its grace:
its log says so (``signal_received`` ``force``, ``tasks_abandoned``), and the stop said
"Its log does not say what the stop did ... (the log cannot be read, or its last lines
were never written, as on a full disk)" of a log read whole. Real host, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO, Project, eventually, ok, one_source_project, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

SLOW = '''
import time

import intloom

wf = intloom.Workflow("slow", version="1")
main = wf.stage("main")


@main.step("work", routes={"done": intloom.COMPLETE})
def work(ctx: intloom.StepContext[None]) -> str:
    time.sleep(30)  # outlasts the stop's grace: the stop waits for it
    return "done"
'''


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "slow", SLOW))


def _events(log: Path) -> list[str]:
    return [json.loads(line)["event"] for line in log.read_text().splitlines()]


def test_a_stop_cut_short_by_a_second_signal_says_so(project: Project) -> None:
    service = ok(project.cli("start", "--json"))["service"]
    log = project.state / "logs" / service["logFile"]
    ok(project.cli("flow", "slow", "--intent", "go", "--detach", "--json"))
    eventually(lambda: ok(project.cli("runs", "--json"))["runs"][0]["phase"] == "executing",
               timeout=20, what="the Step to be running")
    stopping = subprocess.Popen(
        [sys.executable, "-m", "intloom", "--project", str(project.root), "stop"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)})
    try:
        eventually(lambda: "service_stopping" in _events(log), timeout=20,
                   what="the stop's grace to begin")
        os.kill(service["pid"], signal.SIGTERM)  # the second stop signal: at once
        out, err = stopping.communicate(timeout=30)
    finally:
        if stopping.poll() is None:
            stopping.kill()
            stopping.wait()
    assert stopping.returncode == 0, (out, err)
    events = _events(log)
    assert "log_closed" in events and "tasks_abandoned" in events, events
    assert "A second stop signal stopped the host at once" in out, out
    assert "Its log does not say" not in out, out
