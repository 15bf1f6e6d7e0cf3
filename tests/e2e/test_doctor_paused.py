"""A host paused by a signal (SIGSTOP, Ctrl-Z) is named as paused, not "starting or
stopping": clients time out on it, and ``doctor`` says how to resume it. Real host; the
host is resumed and reaped even when the test fails."""

from __future__ import annotations

import json
import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import Project, eventually, one_source_project, spawn_foreground

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_doctor_names_a_paused_host_and_how_to_resume_it(project: Project) -> None:
    assert project.cli("start").code == 0
    pid = project.host_pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        # Each waits out its client's hello bound on the paused host: capped at 1 s (the
        # same unanswered hello) and run side by side, the waits are short and overlap.
        short = {"INTLOOM_TEST_CLIENT_HELLO_TIMEOUT": "1"}
        with ThreadPoolExecutor(2) as pool:
            asked_status = pool.submit(project.cli, "status", "--json", env=short)
            asked_doctor = pool.submit(project.cli, "doctor", "--json", env=short)
            status, doctor = asked_status.result(), asked_doctor.result()
    finally:
        os.kill(pid, signal.SIGCONT)
    assert status.json["status"] == "blocked", status.stdout
    # Which process is paused is read, not guessed among "hung, paused or busy".
    assert f"The host (pid {pid}) is stopped by a signal" in status.json["message"]
    assert f"kill -CONT {pid}" in status.json["message"]
    assert doctor.code == 4 and doctor.json["health"] == "blocked", doctor.stdout
    owner = next(c for c in doctor.json["checks"] if c["id"] == "owner.service_lock")
    assert owner["status"] == "attention"
    assert "paused" in owner["message"] and f"kill -CONT {pid}" in owner["next"]
    resumed = project.cli("status", "--json")  # resumed, it answers again
    assert resumed.code == 0 and resumed.json["service"]["pid"] == pid, resumed.stdout


SLOW_IMPORT = '''
import pathlib
import time
pathlib.Path("importing").touch()
time.sleep(60)
'''


def test_status_names_a_host_paused_while_starting(tmp_path: Path) -> None:
    """A host stopped by a signal while it imports its Workflows (no service.json yet):
    status said the generic "A resource owner still exists or its exit cannot be verified"
    and only doctor said it was paused. Status now says so, with the pid and kill -CONT."""
    project = one_source_project(tmp_path, "slow", SLOW_IMPORT)
    host = spawn_foreground(project, "--json")
    try:
        eventually(lambda: (project.root / "importing").exists() or None, timeout=30,
                   what="the Workflow's import to begin")
        lock = json.loads((project.state / "service.lock").read_text())
        assert lock["pid"] == host.pid, lock
        os.kill(host.pid, signal.SIGSTOP)
        try:
            status = project.cli("status", "--json")
        finally:
            os.kill(host.pid, signal.SIGCONT)
        assert status.json["status"] == "blocked", status.stdout
        message = status.json["message"]
        assert message.startswith(
            f"The host starting since {lock['startedAt']} (pid {host.pid}) is paused "
            "(stopped by a signal"), message
        assert f"kill -CONT {host.pid}" in message, message
    finally:
        project.reap()
        host.communicate(timeout=30)
