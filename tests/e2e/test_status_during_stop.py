"""A host in the last part of its stop: it has closed its listener (after suspending its
Runs) but still writes their snapshots, then removes its files. A real host is held at that
moment (``INTLOOM_TEST_HOLD_UNLISTENED``) while status, doctor, recover and start look at
it: they used to say a live owner blocked the project ("Do not delete locks"), or blame a
hung host at the hello; it is a host shutting down, and the project is offline once it has
exited."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from intloom.client import Client, hostlog, lifecycle
from intloom.client.lifecycle import STOP_TIMEOUT_ENV
from intloom.errors import IntloomError
from intloom.host.toolcalls import LOG_TAIL
from tests.helpers import Project, eventually, pid_alive

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

HOOK = "INTLOOM_TEST_HOLD_UNLISTENED"
RUNS = 1_600


def started_with_the_hook(project: Project, gate: Path) -> int:
    """A started host that will hold its stop once its listener is closed; its pid."""
    assert project.cli("start", env={HOOK: str(gate)}).code == 0
    return project.host_pid()


def stopped_until_held(pid: int, gate: Path) -> None:
    """SIGTERM the host, then wait until its stop has closed its listener and holds."""
    os.kill(pid, signal.SIGTERM)
    eventually(lambda: Path(f"{gate}.held").exists(), timeout=120,
               what="the stop to close its listener")


def test_a_host_that_stopped_listening_on_its_way_out_is_shutting_down(
    project: Project, tmp_path: Path,
) -> None:
    gate = tmp_path / "go"
    pid = started_with_the_hook(project, gate)
    port = int(project.cli("--json", "status").json["service"]["port"])
    metadata = {name: (project.state / name).read_bytes()
                for name in ("service.json", "service.lock")}
    start: subprocess.Popen[str] | None = None
    try:
        stopped_until_held(pid, gate)
        said = (f"The service is shutting down: the host (pid {pid}) has stopped listening "
                f"on 127.0.0.1:{port} and is saving its Runs, then exits.")

        status = project.cli("--json", "status")
        assert status.code == 0, status
        assert status.json["status"] == "blocked", status.json
        assert status.json["message"].startswith(said), status.json["message"]
        text = project.cli("status")
        assert said in text.stdout, text
        # A passing state says what to do itself: no "Do not delete locks" under it.
        assert "Do not delete locks" not in text.stdout, text

        doctor = project.cli("--json", "doctor")
        assert doctor.code == 4 and doctor.json["message"].startswith(said), doctor
        # Its owner checks say the same of each file: they said the host "does not answer
        # as this project's host (it may be starting or stopping)".
        checks = {c["id"]: c for c in doctor.json["checks"]}
        for name in ("service.json", "service.lock"):
            check = checks[f"owner.{name.replace('.', '_')}"]
            assert check["message"].startswith(
                f"{name} names pid {pid}, which is alive and shutting down (its stop has "
                "begun)"), check
            assert check["next"].startswith("Wait for it to exit"), check

        recover = project.cli("--json", "recover")
        assert recover.code != 0, recover
        assert recover.json["error"]["code"] == "CLI_RECOVERY_BLOCKED", recover.json
        assert recover.json["error"]["message"].startswith(said), recover.json
        assert {name: (project.state / name).read_bytes()
                for name in metadata} == metadata  # nothing was removed

        # A command that needs the host hears the same, not "offline ... Connection refused".
        runs = project.cli("--json", "runs")
        assert runs.code == 1, runs
        assert runs.json["error"]["code"] == "CLI_SERVICE_CLOSING", runs.json
        assert runs.json["error"]["message"].startswith(said), runs.json

        # As the message says, a start waits for the host to exit, then starts a new one;
        # after a second it says whom it waits for (it said "another start's host").
        start = subprocess.Popen(
            [sys.executable, "-m", "intloom", "--project", str(project.root), "start"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "NO_COLOR": "1"})
        assert start.stderr is not None
        first = eventually(start.stderr.readline, timeout=60, what="the start's first note")
        assert first.startswith(f"Waiting for the host (pid {pid}) to finish shutting down"), (
            first)
    finally:
        gate.touch()
    assert start is not None
    try:
        out, err = start.communicate(timeout=120)
    finally:
        if start.poll() is None:
            start.kill()
            start.wait(timeout=10)
        project.track_host()
    assert start.returncode == 0, (out, err)
    assert "another start" not in err, err
    assert not pid_alive(pid)
    assert project.host_pid() != pid
    assert project.cli("stop").code == 0


def test_a_stop_of_thousands_of_runs_is_shutting_down_too(
    project: Project, tmp_path: Path,
) -> None:
    # Its stop logs a line per Run after service_stopping: past ~1,450 Runs the line left
    # the end of the log that status read, and the host was taken for a hung one.
    gate = tmp_path / "go"
    pid = started_with_the_hook(project, gate)

    def create(part: int) -> None:
        with Client.connect(project.root) as client:
            for n in range(part, RUNS, 8):
                client.create_run("example", f"run {n}", wait=False)

    with ThreadPoolExecutor(8) as pool:  # eight clients: their Runs share each fsync
        list(pool.map(create, range(8)))
    try:
        stopped_until_held(pid, gate)
        log = max((project.state / "logs").glob("LOG-*.jsonl"))
        lines = log.read_bytes()
        assert len(lines) - lines.index(b'"event":"service_stopping"') > LOG_TAIL
        status = project.cli("--json", "status")
        assert status.json["status"] == "blocked", status.json
        assert status.json["message"].startswith(
            f"The service is shutting down: the host (pid {pid}) has stopped listening"), (
            status.json["message"])
    finally:
        gate.touch()
    eventually(lambda: not pid_alive(pid), timeout=120, what="the host to exit")
    assert project.cli("--json", "status").json["status"] == "offline"


def test_start_over_a_host_paused_on_its_way_out_says_so_at_once(
    project: Project, tmp_path: Path,
) -> None:
    # It used to wait for the host to exit until its --timeout, then blame initialization.
    gate = tmp_path / "go"
    pid = started_with_the_hook(project, gate)
    try:
        stopped_until_held(pid, gate)
        os.kill(pid, signal.SIGSTOP)
        start = project.cli("--json", "start", "--timeout", "20", timeout=120)
        assert start.code != 0, start
        error = start.json["error"]
        assert error["code"] == "CLI_SERVICE_UNAVAILABLE", error
        assert error["message"].startswith(
            f"The project's host (pid {pid}) was shutting down"), error["message"]
        assert f"Resume it with kill -CONT {pid}: it then finishes its stop" in error["message"]
    finally:
        os.kill(pid, signal.SIGCONT)
        gate.touch()
    eventually(lambda: not pid_alive(pid), timeout=120, what="the host to exit")
    assert project.cli("start").code == 0
    assert project.host_pid() != pid
    assert project.cli("stop").code == 0


def test_start_waiting_for_that_host_searches_its_log_once_per_poll(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The refused connection had searched the log (Client.connect, to say "shutting down"),
    # then start searched it again to know the host was stopping: two backward scans of a
    # log of up to 64 MiB every 50 ms.
    gate = tmp_path / "go"
    pid = started_with_the_hook(project, gate)
    scans: list[int] = []
    polls: list[int] = []
    search, saved = hostlog.last_line, lifecycle._saved_service

    def counted_search(*args: Any, **kwargs: Any) -> Any:
        scans.append(1)
        return search(*args, **kwargs)

    def counted_poll(*args: Any, **kwargs: Any) -> Any:
        polls.append(1)
        return saved(*args, **kwargs)

    try:
        stopped_until_held(pid, gate)
        monkeypatch.setattr(hostlog, "last_line", counted_search)
        monkeypatch.setattr(lifecycle, "_saved_service", counted_poll)
        with pytest.raises(IntloomError) as raised:
            lifecycle.start_service(project.root, timeout=1.0)
        assert raised.value.code == "CLI_SERVICE_TIMEOUT", raised.value
        assert f"for the host (pid {pid}) to finish shutting down" in str(raised.value)
        assert len(polls) >= 3, polls
        assert 0 < len(scans) <= len(polls), (len(scans), len(polls))
    finally:
        gate.touch()
    eventually(lambda: not pid_alive(pid), timeout=120, what="the host to exit")


def test_a_second_stop_waits_for_the_first_as_long_as_its_log_says(
    project: Project, tmp_path: Path,
) -> None:
    # Refused at its port, it waited its own 10 s (1 s here), then said "Cannot verify
    # resource cleanup" of a host that went on to stop cleanly.
    gate = tmp_path / "go"
    pid = started_with_the_hook(project, gate)
    second: subprocess.Popen[str] | None = None
    try:
        stopped_until_held(pid, gate)
        log = max((project.state / "logs").glob("LOG-*.jsonl")).read_text()
        within = next(json.loads(line)["within"] for line in log.splitlines()
                      if '"event":"service_stopping"' in line)
        assert within > 10, within  # the first stop's bound outlasts the wait below
        second = subprocess.Popen(
            [sys.executable, "-m", "intloom", "--project", str(project.root), "--json", "stop"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, STOP_TIMEOUT_ENV: "1"})
        with pytest.raises(subprocess.TimeoutExpired):
            second.wait(timeout=3)  # past its own 1 s: it waits for the first stop
    finally:
        gate.touch()
    assert second is not None
    try:
        out, err = second.communicate(timeout=60)
    finally:
        if second.poll() is None:
            second.kill()
            second.wait(timeout=10)
    assert second.returncode == 0, (out, err)
    assert json.loads(out)["stopped"] is True, out
    assert not pid_alive(pid)


IN_GRACE = '''
import time
from pathlib import Path

import intloom

GATE = Path(__file__).resolve().parent.parent / "gate"
wf = intloom.Workflow("grace", version="1")
s = wf.stage("s")


@s.step("a", routes={"ok": intloom.COMPLETE})
def a(ctx: intloom.StepContext[None]) -> str:
    (GATE.parent / "started").write_text("1")
    while not GATE.exists():
        time.sleep(0.05)
    return "ok"
'''


def test_start_over_a_host_paused_in_its_stops_grace_says_it_finishes_its_stop(
    tmp_path: Path,
) -> None:
    """A host paused (SIGSTOP) while its stop's grace ran, still listening: start timed out
    its hello and said "Resume it with kill -CONT PID: it then serves again, and intloom
    start reuses it". Resumed, it finishes its stop and exits; start says so."""
    from tests.helpers import one_source_project, reaped

    for project in reaped(one_source_project(tmp_path, "grace", IN_GRACE)):
        _start_over_a_host_paused_in_its_grace(project)


def _a_stop_in_its_grace(project: Project, *stop_args: str
                         ) -> tuple[int, subprocess.Popen[str]]:
    """A host started, its ``grace`` Step running (held by the gate), and an ``intloom
    --json stop`` (with ``stop_args``) under way: its pid and the stop's process, once the
    host's log says its stop began. The caller touches the gate and reaps the stop."""
    assert project.cli("start").code == 0
    pid = project.host_pid()
    assert project.cli("flow", "grace", "--intent", "i", "--detach").code == 0
    eventually(lambda: (project.root / "started").exists(), timeout=30,
               what="the Step to start")
    stop = subprocess.Popen(
        [sys.executable, "-m", "intloom", "--project", str(project.root), "--json", "stop",
         *stop_args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    logs = project.state / "logs"
    try:
        eventually(lambda: any(b'"service_stopping"' in log.read_bytes()
                               for log in logs.glob("LOG-*.jsonl")),
                   timeout=30, what="the host log's service_stopping")
    except BaseException:
        (project.root / "gate").touch()
        stop.kill()
        stop.communicate(timeout=30)
        raise
    return pid, stop


def _start_over_a_host_paused_in_its_grace(project: Project) -> None:
    # The stop, under way, meets the pause (it reads it at its next poll); so does start.
    pid, stop = _a_stop_in_its_grace(project, "--timeout", "6")
    try:
        os.kill(pid, signal.SIGSTOP)
        try:
            start = project.cli("--json", "start", "--timeout", "30", timeout=120)
            eventually(lambda: stop.poll() is not None, timeout=60,
                       what="the stop's --timeout to run out")
        finally:
            os.kill(pid, signal.SIGCONT)
        assert start.code != 0, start
        error = start.json["error"]
        assert error["code"] == "CLI_SERVICE_UNAVAILABLE", error
        assert error["message"].startswith(
            f"The project's host (pid {pid}) was shutting down"), error["message"]
        assert (f"Resume it with kill -CONT {pid}: it then finishes its stop and exits"
                in error["message"]), error["message"]
        assert "reuses it" not in error["message"], error["message"]
        # The stop whose request it took names the pause too ("still stopping ... run
        # intloom stop again to wait for it" was all it said, once its time ran out; it
        # reads the pause at its next poll now).
        out, _ = stop.communicate(timeout=60)
        assert stop.returncode == 1, out
        said = json.loads(out)["error"]
        assert said["code"] == "CLI_SERVICE_UNAVAILABLE", said
        assert (f"The project's host (pid {pid}) was asked to stop, and is stopped by a "
                "signal" in said["message"]), said["message"]
        assert f"Resume it with kill -CONT {pid}" in said["message"], said["message"]
    finally:
        (project.root / "gate").touch()
        if stop.poll() is None:
            stop.kill()
        stop.communicate(timeout=30)
    eventually(lambda: not pid_alive(pid), timeout=60, what="the host to exit")


def test_start_whose_timeout_runs_out_in_a_stops_grace_says_so(tmp_path: Path) -> None:
    """``intloom stop & intloom start --timeout N`` with a Step running: the host, still
    listening in its stop's grace, refuses start's hello with CLI_SERVICE_CLOSING, and once
    the timeout ran out start raised that refusal as it was, worded for a request about a
    Run ("intloom start waits for that", Agent tasks, not retryable)."""
    from tests.helpers import one_source_project, reaped

    for project in reaped(one_source_project(tmp_path, "grace", IN_GRACE)):
        _start_timing_out_in_a_stops_grace(project)


def _start_timing_out_in_a_stops_grace(project: Project) -> None:
    pid, stop = _a_stop_in_its_grace(project)
    try:
        # The Step waits on the gate: the grace (5 s) outlasts this start's timeout.
        start = project.cli("--json", "start", "--timeout", "1", timeout=60)
        assert start.code != 0, start
        error = start.json["error"]
        assert error["code"] == "CLI_SERVICE_TIMEOUT", error
        assert error["message"].startswith(
            f"intloom start waited its --timeout (1 s) for the host (pid {pid}) to finish "
            "shutting down: it is still in its stop's grace"), error["message"]
        assert "launched nothing" in error["message"], error["message"]
    finally:
        (project.root / "gate").touch()
        stop.communicate(timeout=60)
    eventually(lambda: not pid_alive(pid), timeout=60, what="the host to exit")


def test_a_stop_whose_host_is_killed_in_its_stop_says_so_and_names_recover(
        project: Project, tmp_path: Path) -> None:
    """``intloom stop``, then its host killed (SIGKILL) in its stop: stop guessed "it crashed
    meanwhile, or could not remove them (an immutable file, or a read-only .intloom ...)",
    a cause it had just ruled out by finding nothing that refuses their removal, and named
    no next step."""
    gate = tmp_path / "go"
    pid = started_with_the_hook(project, gate)
    with ThreadPoolExecutor(1) as pool:
        stopping = pool.submit(project.cli, "--json", "stop")
        eventually(lambda: Path(f"{gate}.held").exists(), timeout=60,
                   what="the stop to close its listener")
        os.kill(pid, signal.SIGKILL)
        result = stopping.result(timeout=90)
    eventually(lambda: not pid_alive(pid), timeout=30, what="the host to exit")
    assert result.code == 1, result
    message = result.json["error"]["message"]
    assert ("it exited after it was asked to stop, without removing them, and nothing seen "
            "here refuses their removal: most likely it was killed or crashed during its stop "
            "(a SIGKILL") in message, message
    assert "then run intloom recover" in message and "lsattr" not in message, message
