"""A start commits when it writes ``service.json``: a stop signal before that ends the start,
one after it stops a host that served. A script that waits for ``service.json`` and then
sends Ctrl-C to ``start --foreground`` was told, now and then, that the start had been
interrupted before it served (exit 130, nothing on stdout): the host decided only once its
start-up returned, a moment after it wrote the file. ``INTLOOM_TEST_START_SIGNAL`` sends the
signal at either side of the commit, which no outside timing reaches reliably. Real host
processes, real signals."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.helpers import Project, eventually, spawn_foreground

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def _foreground(project: Project, where: str,
                monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    monkeypatch.setenv("INTLOOM_TEST_START_SIGNAL", f"{where}:SIGINT")
    proc = spawn_foreground(project)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    return proc.returncode, out, err


def _events(project: Project, starts: int = 1) -> list[dict[str, object]]:
    """The last start's log lines, once ``starts`` starts each wrote one (stamped names sort
    by time)."""
    logs = sorted((project.state / "logs").iterdir())
    assert len(logs) == starts, logs
    return [json.loads(line) for line in logs[-1].read_text().splitlines()]


def test_ctrl_c_right_after_service_json_stops_a_host_that_served(
    project: Project, monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, out, err = _foreground(project, "published", monkeypatch)
    assert code == 0, (out, err)  # 130 when the start's end decided, as before
    assert "Traceback" not in err, err
    assert "started" in out.lower(), out  # it reported ready, then said what the stop did
    events = [e["event"] for e in _events(project)]
    assert "startup_interrupted" not in events, events
    ready = events.index("service_ready")
    assert events.index("signal_received", ready) < events.index("service_stopping", ready)
    assert events[-1] == "log_closed", events
    assert not (project.state / "service.json").exists()
    assert not (project.state / "service.lock").exists()


def test_ctrl_c_before_service_json_ends_the_start(
    project: Project, monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, out, err = _foreground(project, "listening", monkeypatch)
    assert code == 130, (code, out, err)  # an interrupted command, as any other
    assert out == "", out
    logged = _events(project)
    events = [e["event"] for e in logged]
    assert "service_ready" not in events, events
    [interrupted] = [e for e in logged if e["event"] == "startup_interrupted"]
    assert (interrupted["signal"], interrupted["step"]) == ("SIGINT", "listening"), interrupted
    assert events[-1] == "log_closed", events
    assert not (project.state / "service.json").exists()
    assert not (project.state / "service.lock").exists()


def test_a_launched_host_signalled_on_either_side_of_the_commit(
    project: Project, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The background start says what happened: before the commit, CLI_SERVICE_CLOSING;
    after it, started (the host then stops, as a host that served does)."""
    monkeypatch.setenv("INTLOOM_TEST_START_SIGNAL", "listening:SIGTERM")
    refused = project.cli("--json", "start")
    assert refused.code != 0, refused
    assert refused.json["error"] == {
        "code": "CLI_SERVICE_CLOSING", "retryable": False,
        "message": "The host was asked to stop (SIGTERM) while it was starting; it did not "
        "start and released its files."}, refused
    assert not (project.state / "service.lock").exists()

    monkeypatch.setenv("INTLOOM_TEST_START_SIGNAL", "published:SIGTERM")
    started = project.cli("--json", "start")
    assert started.code == 0, started
    pid = started.json["service"]["pid"]
    project.pids.add(pid)
    eventually(lambda: not (project.state / "service.lock").exists(), timeout=30,
               what="the host to stop after it served")
    logged = _events(project, starts=2)
    events = [e["event"] for e in logged]
    assert events.count("service_ready") == 1 and events[-1] == "log_closed", events
    assert [e.get("signal") for e in logged if e["event"] == "signal_received"] == [
        "SIGTERM"], logged


def test_a_deadline_that_passes_after_the_commit_does_not_stop_the_host(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``start --foreground --timeout``'s timer asked whether the host had reported ready,
    which it does a moment after it writes service.json: a deadline in that moment stopped
    a host whose service.json had been written (CLI_SERVICE_TIMEOUT). It now asks the host,
    which decides at its commit. The start-up holds right after writing service.json
    (``INTLOOM_TEST_HOLD_PUBLISHED``) until the deadline has passed, so the timer always
    fires in that moment."""
    timeout = 6.0
    gate = tmp_path / "go"
    began = time.monotonic()
    monkeypatch.setenv("INTLOOM_TEST_HOLD_PUBLISHED", str(gate))
    proc = spawn_foreground(project, start_options=("--timeout", str(timeout)))
    try:
        eventually(lambda: Path(f"{gate}.held").exists(), timeout=timeout,
                   what="the start to write service.json within its --timeout")
        # The timer's moment: waited for on the clock, which is what it watches.
        eventually(lambda: time.monotonic() - began > timeout + 0.5, timeout=timeout + 5,
                   what="the deadline to pass")
        gate.touch()
        status = project.cli("--json", "status")
        assert status.code == 0 and status.json["service"]["pid"] == proc.pid, status
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 0, (out, err)
    assert "CLI_SERVICE_TIMEOUT" not in err and "Traceback" not in err, err
    # The deadline sent no SIGTERM: the only stop is the test's Ctrl-C.
    assert [(e["signal"], e["action"]) for e in _events(project)
            if e["event"] == "signal_received"] == [("SIGINT", "stop")]


def test_a_host_killed_right_after_service_json_names_both_files_it_left(
    project: Project, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SIGKILL right after the host wrote service.json: start said "the service.lock it may
    have left is stale", though it left service.json too (recover removes both)."""
    monkeypatch.setenv("INTLOOM_TEST_START_SIGNAL", "published:SIGKILL")
    refused = project.cli("--json", "start")
    project.track_host()
    assert refused.code != 0, refused
    message = refused.json["error"]["message"]
    assert "was killed by SIGKILL" in message, message
    assert ("the service.json and service.lock it left are stale, and intloom recover "
            "removes them before the next intloom start") in message, message
    assert (project.state / "service.json").exists()
    monkeypatch.delenv("INTLOOM_TEST_START_SIGNAL")
    assert project.cli("recover", "--json").code == 0
    assert not (project.state / "service.json").exists()
