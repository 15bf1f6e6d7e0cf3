"""``start --foreground`` under a supervisor, a pipe or a terminal: its standard streams,
its signals, and what it says and exits with when it ends.

The host and its Workflows' code run in the command's process and share its stdout and
stderr; and a supervisor may start it with one of them closed."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import (
    REPO,
    Project,
    eventually,
    foreground_host,
    ok,
    one_source_project,
    spawn_foreground,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

PRINTS = '''
import sys
import msgspec
import intloom

class S(msgspec.Struct):
    n: int = 0

wf = intloom.Workflow("prints", version="1")
main = wf.stage("main", state=S)

@main.step("say", routes={"done": intloom.COMPLETE})
def say(ctx: intloom.StepContext[S]) -> str:
    print("said on stdout")
    print("said on stderr", file=sys.stderr)
    return "done"
'''


def test_a_json_foreground_host_keeps_stdout_for_its_document_and_its_steps_never_fail_on_a_reader_gone(  # noqa: E501
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``--json``, a Step's ``print`` came on stdout after the start's document (no
    JSON reader reads that), and only once 8 KiB had gathered or the host stopped (stdout
    piped: a supervisor's log); and a Step that printed once stderr's reader had gone
    (``2>&1 | head -1``, a closed terminal) failed its Run with BrokenPipeError."""
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)  # as a supervisor starts it
    project = one_source_project(tmp_path, "prints", PRINTS)
    try:
        with foreground_host(project, "--json") as proc:
            assert proc.stderr is not None and proc.stdout is not None
            started = json.loads(proc.stdout.readline())  # the document, once it serves
            assert started["service"]["pid"] == proc.pid, started
            run = ok(project.cli("flow", "prints", "--intent", "x", "--json"))["run"]
            assert run["status"] == "completed", run
            seen: list[str] = []
            err = proc.stderr.fileno()

            def said() -> bool | None:
                ready, _, _ = select.select([err], [], [], 0.05)
                if ready:
                    seen.append(os.read(err, 4096).decode())
                return "said on stdout\n" in "".join(seen) or None

            eventually(said, timeout=5, what="the Step's print on stderr while it serves")
            proc.stderr.close()  # the reader of stderr goes away
            run = ok(project.cli("flow", "prints", "--intent", "y", "--json"))["run"]
            assert run["status"] == "completed", run
            proc.send_signal(signal.SIGTERM)
            with proc.stdout:
                rest = proc.stdout.read()
            assert proc.wait(timeout=30) == 0
        assert rest == "", rest  # nothing after the one document
    finally:
        project.reap()


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


SLOW_IMPORT = '''
import pathlib
import time
pathlib.Path("importing").touch()
time.sleep(30)
'''


def test_ctrl_c_before_a_foreground_host_serves_is_an_interrupted_command(
        tmp_path: Path) -> None:
    """Ctrl-C while the Workflows import (a slow start in a terminal): the command exited 1
    with CLI_SERVICE_CLOSING, with --json as a document on stdout, where docs/cli.md says
    Ctrl-C exits 130 with nothing on stdout. (SIGTERM there stays CLI_SERVICE_CLOSING.)"""
    project = one_source_project(tmp_path, "slow", SLOW_IMPORT)
    proc = spawn_foreground(project, "--json")
    try:
        eventually(lambda: (project.root / "importing").exists() or None, timeout=20,
                   what="the Workflow's import to begin")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert (proc.returncode, out, err) == (130, "", "")
        assert not (project.state / "service.lock").exists()  # it released its files
    finally:
        project.reap()


def test_a_foreground_start_keeps_its_timeout(tmp_path: Path) -> None:
    """``start --foreground --timeout N`` with a Workflow that takes 30 s to import: the
    timeout bounded nothing, and the command waited the 30 s, then served."""
    project = one_source_project(tmp_path, "slow", SLOW_IMPORT)
    try:
        # 3 s, not less: on a loaded 2-core VM a deadline of 0.5 s came before the host had
        # begun the import (its interpreter and intloom still loading), which the message
        # then rightly did not blame.
        result = project.cli("start", "--foreground", "--timeout", "3", "--json",
                             timeout=20)
        assert result.code == 1, result
        error = result.json["error"]
        assert error["code"] == "CLI_SERVICE_TIMEOUT", error
        assert "the host was stopped at the deadline (SIGTERM) and released its files" \
            in error["message"], error
        # Like a background start's timeout, it names the source the import was stuck in.
        assert "It was still importing workflows/slow.py (for " in error["message"], error
        assert not (project.state / "service.lock").exists()
    finally:
        project.reap()


def test_a_foreground_timeout_outside_an_import_does_not_blame_the_import(
        tmp_path: Path) -> None:
    """The foreground --timeout message always said "make the Workflow modules quicker to
    import", even when the deadline came while the host took its lock or restored Runs.
    With no Workflow listed there is no import to blame: it points at the log instead."""
    project = one_source_project(tmp_path, "unused", "")
    (project.root / "intloom.toml").write_text("workflows = []\n")
    try:
        result = project.cli("start", "--foreground", "--timeout", "0.001", "--json",
                             timeout=20)
        assert result.code == 1, result
        error = result.json["error"]
        assert error["code"] == "CLI_SERVICE_TIMEOUT", error
        assert error["message"].endswith(
            "released its files. Start again with a longer --timeout, or see "
            ".intloom/logs/ for the slow step."), error
        assert "import" not in error["message"], error
    finally:
        project.reap()



STUCK = '''
import pathlib
import time
import msgspec
import intloom

class S(msgspec.Struct):
    n: int = 0

wf = intloom.Workflow("stuck", version="1")
main = wf.stage("main", state=S)

@main.step("nap", routes={"done": intloom.COMPLETE})
def nap(ctx: intloom.StepContext[S]) -> str:
    pathlib.Path("stepping").touch()
    time.sleep(30)  # on a thread: the stop's grace waits for it
    return "done"
'''


def test_a_second_ctrl_c_says_what_the_stop_kept(tmp_path: Path) -> None:
    """A second Ctrl-C ends the process from inside the host (``os._exit``): a stop that
    kept its files there (the project directory moved meanwhile) exited 1 without a word,
    where the first Ctrl-C alone says STORAGE_ERROR with the fix."""
    project = one_source_project(tmp_path, "stuck", STUCK)
    flow: subprocess.Popen[bytes] | None = None
    try:
        with foreground_host(project) as proc:
            flow = subprocess.Popen(
                [sys.executable, "-m", "intloom", "flow", "stuck", "--intent", "x"],
                cwd=project.root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": str(REPO)})
            eventually(lambda: (project.root / "stepping").exists() or None,
                       what="the Step to run")
            moved = tmp_path / "moved"
            project.root.rename(moved)
            proc.send_signal(signal.SIGINT)
            logs = moved / ".intloom" / "logs"
            eventually(lambda: any("signal_received" in log.read_text()
                                   for log in logs.glob("LOG-*.jsonl")) or None,
                       what="the first Ctrl-C to be taken")
            proc.send_signal(signal.SIGINT)
            _out, err = proc.communicate(timeout=30)
        assert proc.returncode == 1, err
        assert "Failure · STORAGE_ERROR: The host stopped, but the project directory was " \
            "moved while this host ran" in err, err
        assert f"intloom start in {moved}" in err, err
    finally:
        if flow is not None:
            flow.kill()
            flow.wait(timeout=10)
        project.reap()


def test_a_foreground_host_whose_log_failed_ends_with_log_write_failed(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """A log that fails while the host serves (a full disk) makes the host exit 1 when
    stopped (docs/lifecycle.md); its foreground command said CLI_INTERNAL_ERROR, exit 70
    (a bug in intloom), and sent the reader to that very log."""
    monkeypatch.setenv("INTLOOM_TEST_LOG_FAIL_AT", "signal_received")
    with foreground_host(project) as proc:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, err
    assert "Failure · LOG_WRITE_FAILED: The host stopped, but its log " in err, err
    assert "(No space left on device" in err and "Free disk space" in err, err


def test_a_start_that_waited_out_its_timeout_on_a_starting_host_names_that_host(
        tmp_path: Path) -> None:
    """A second terminal's ``start`` (``--foreground`` or not) while the first terminal's
    host still imports its Workflows: at its --timeout it said CLI_SERVICE_BUSY "locked ...
    no live host answers ... intloom recover", of a live host that status calls starting."""
    project = one_source_project(tmp_path, "slow", SLOW_IMPORT)
    proc = spawn_foreground(project)
    try:
        eventually(lambda: (project.root / "importing").exists() or None, timeout=20,
                   what="the Workflow's import to begin")
        for options in (("--foreground",), ()):
            result = project.cli("start", *options, "--timeout", "1", "--json", timeout=20)
            assert result.code == 1, result
            error = result.json["error"]
            assert error["code"] == "CLI_SERVICE_TIMEOUT", (options, error)
            assert f"The service is starting (pid {proc.pid}, since " in error["message"], error
            assert "recover" not in error["message"], error
        assert proc.poll() is None  # the first terminal's start goes on
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        project.reap()


def test_a_foreground_host_keeps_the_stop_signals_it_was_started_with_ignored(
        project: Project) -> None:
    """``nohup intloom start --foreground &`` (SIGHUP ignored), or ``cmd &`` in a script
    (SIGINT ignored): the host handled them anyway, so closing the terminal stopped the
    nohup'd host. SIGTERM still stops it."""

    def ignoring() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen(
        [sys.executable, "-m", "intloom", "start", "--foreground"], cwd=project.root,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ignoring,
        env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)})
    project.pids.add(proc.pid)
    try:
        eventually(lambda: (project.state / "service.json").exists() or None, timeout=20,
                   what="the foreground host to serve")
        proc.send_signal(signal.SIGHUP)
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        events = [json.loads(line) for log in (project.state / "logs").glob("LOG-*.jsonl")
                  for line in log.read_text().splitlines()]
        received = [e["signal"] for e in events if e["event"] == "signal_received"]
        assert received == ["SIGTERM"], received
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        project.reap()


# ``intloom start --foreground`` whose look at service.lock came just before another
# terminal's start took it (the first look is made to find it absent): its own host then
# lost the race for the lock.
LATE_LOOK = '''
import sys
import intloom.client.lifecycle as lifecycle
looked = []
real = lifecycle._lock_owner
def late(paths):
    if not looked:
        looked.append(True)
        return "absent"
    return real(paths)
lifecycle._lock_owner = late
sys.argv = ["intloom", "start", "--foreground", "--timeout", "2", "--json"]
from intloom.cli.entry import run
run()
'''


def test_a_foreground_start_that_lost_the_race_for_the_lock_names_the_winner(
        tmp_path: Path) -> None:
    """Two ``start --foreground`` at once: the one whose host lost the race for the lock
    said CLI_SERVICE_BUSY "locked ... use intloom recover only after its owner has
    exited", of the other terminal's live host."""
    project = one_source_project(tmp_path, "slow", SLOW_IMPORT)
    winner = spawn_foreground(project)
    try:
        eventually(lambda: (project.root / "importing").exists() or None, timeout=20,
                   what="the first start's Workflow import to begin")
        loser = subprocess.run(
            [sys.executable, "-c", LATE_LOOK], cwd=project.root, capture_output=True,
            text=True, timeout=30, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert loser.returncode == 1, loser
        error = json.loads(loser.stdout)["error"]
        assert error["code"] == "CLI_SERVICE_TIMEOUT", error
        assert f"The service is starting (pid {winner.pid}, since " in error["message"], error
        assert winner.poll() is None  # the winner goes on starting
        winner.send_signal(signal.SIGTERM)
        winner.communicate(timeout=30)
    finally:
        project.reap()


ECHOES = '''
import subprocess
import msgspec
import intloom

class S(msgspec.Struct):
    n: int = 0

wf = intloom.Workflow("echoes", version="1")
main = wf.stage("main", state=S)

@main.step("say", routes={"done": intloom.COMPLETE})
def say(ctx: intloom.StepContext[S]) -> str:
    subprocess.run(["echo", "said by a child"], check=True)
    return "done"
'''


def test_a_steps_subprocess_writing_to_a_stdout_whose_reader_went_away_does_not_fail(
        tmp_path: Path) -> None:
    """``intloom start --foreground | head -1``: once head had gone, a Step's subprocess
    that wrote to stdout died of SIGPIPE (its Run failed, STEP_EXECUTION_FAILED), since
    nothing had been written there by the host itself to find the reader gone."""
    project = one_source_project(tmp_path, "echoes", ECHOES)
    try:
        with foreground_host(project) as proc:
            assert proc.stdout is not None
            assert proc.stdout.readline().startswith("Service started")
            proc.stdout.close()  # head -1 has its line, and exits
            run = ok(project.cli("flow", "echoes", "--intent", "x", "--json"))["run"]
            assert run["status"] == "completed", run
            proc.send_signal(signal.SIGTERM)
            _out, err = proc.communicate(timeout=30)
            assert proc.returncode == 0, err
    finally:
        project.reap()


def _spawn_with_ctrl_c(project: Project, *options: str,
                       sigint: Any = signal.SIG_DFL) -> subprocess.Popen[str]:
    """``intloom start --foreground`` with SIGINT as a terminal's shell gives it (``sigint``;
    a test runner started in the background has it ignored, which the child inherits)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "intloom", "start", "--foreground", *options],
        cwd=project.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, sigint),
        env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)})
    project.pids.add(proc.pid)
    return proc


def test_the_first_ctrl_c_with_a_step_running_says_what_the_stop_waits_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C with a Step still running: the terminal said nothing for up to the stop's
    grace, and nothing of a second Ctrl-C stopping at once."""
    monkeypatch.setenv("INTLOOM_TEST_SUSPEND_GRACE", "60")
    project = one_source_project(tmp_path, "stuck", STUCK)
    proc = _spawn_with_ctrl_c(project)
    flow: subprocess.Popen[bytes] | None = None
    try:
        assert proc.stderr is not None
        eventually(lambda: (project.state / "service.json").exists() or None, timeout=20,
                   what="the foreground host to serve")
        flow = subprocess.Popen(
            [sys.executable, "-m", "intloom", "flow", "stuck", "--intent", "x", "--detach"],
            cwd=project.root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(REPO)})
        eventually(lambda: (project.root / "stepping").exists() or None,
                   what="the Step to run")
        proc.send_signal(signal.SIGINT)
        lines: list[str] = []
        while not lines or not lines[-1].startswith("Stopping:"):
            line = proc.stderr.readline()
            assert line, f"stderr ended first: {lines}"
            lines.append(line)
        assert proc.poll() is None  # said while the stop waits, not once it is over
        assert lines[-1] == (
            "Stopping: waiting up to 60 s for the Steps of 1 running Run to reach their "
            "checkpoint (the next start reports what is still running then RUN_INTERRUPTED); "
            "a second Ctrl-C (or any stop signal) stops at once, without waiting.\n"), lines
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
        assert "The service stopped at once (a second Ctrl-C or signal)" in err, err
        assert err.count("Stopping:") == 0, err  # said once
    finally:
        if flow is not None:
            flow.kill()
            flow.wait(timeout=10)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        project.reap()


def test_a_foreground_host_started_with_sigint_ignored_says_what_stops_it(
        project: Project) -> None:
    """``cmd &`` in a script starts it with SIGINT ignored, which the host keeps ignored:
    its ready line still said "Ctrl-C stops the host gracefully"."""
    proc = _spawn_with_ctrl_c(project, sigint=signal.SIG_IGN)
    try:
        assert proc.stderr is not None
        lines: list[str] = []
        while not lines or not lines[-1].startswith("Running in the foreground"):
            line = proc.stderr.readline()
            assert line, f"stderr ended first: {lines}"
            lines.append(line)
        assert lines[-1] == (
            "Running in the foreground; Ctrl-C does not stop it (this command was started "
            "with SIGINT ignored, as cmd & in a script starts it): stop it with intloom stop "
            f"from another terminal, or kill -TERM {proc.pid}.\n"), lines
        ok(project.cli("stop", "--json"))  # what it says stops it does
        proc.communicate(timeout=30)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        project.reap()


def test_a_start_waiting_for_another_starts_host_says_so(tmp_path: Path) -> None:
    """A second terminal's ``start`` (``--foreground`` or not) without --timeout while the
    first terminal's host still imports its Workflows waited silently, for up to 300 s."""
    project = one_source_project(tmp_path, "slow", SLOW_IMPORT)
    first = spawn_foreground(project)
    try:
        eventually(lambda: (project.root / "importing").exists() or None, timeout=20,
                   what="the Workflow's import to begin")
        for options, then in ((("--foreground",), "says CLI_SERVICE_CONFLICT once it serves"),
                              ((), "reuses it once it serves")):
            second = subprocess.Popen(
                [sys.executable, "-m", "intloom", "start", *options], cwd=project.root,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)})
            project.pids.add(second.pid)
            try:
                assert second.stderr is not None
                line = second.stderr.readline()
                assert line.startswith(
                    f"Waiting for another start's host. The service is starting (pid "
                    f"{first.pid}, since "), (options, line)
                assert f"This start waits up to its --timeout (300 s) and {then}" in line, line
                assert f"kill -TERM {first.pid} stops that start." in line, line
                assert second.poll() is None  # said while it waits
            finally:
                second.kill()
                second.communicate(timeout=10)  # and closes its pipe
        assert first.poll() is None  # the first terminal's start goes on
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGTERM)
        first.communicate(timeout=30)
        project.reap()


FLOODS = '''
import intloom

wf = intloom.Workflow("floods", version="1")
main = wf.stage("main")

@main.step("say", routes={"done": intloom.COMPLETE})
def say(ctx: intloom.StepContext[None]) -> str:
    for n in range(4000):  # far more than a pipe holds: blocks once its reader stalls
        print(f"line {n} " + "x" * 200, flush=True)
    return "done"
'''


def _blocked_writing_to_a_pipe(pid: int) -> bool:
    """Whether a thread of ``pid`` waits in the kernel to write to a full pipe."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            # "pipe_write", or "anon_pipe_write" on newer kernels (6.x).
            if (task / "wchan").read_text().strip().endswith("pipe_write"):
                return True
        except OSError:
            continue
    return False


def test_a_foreground_host_whose_output_pipe_is_full_still_stops_on_sigterm(
        tmp_path: Path) -> None:
    """A supervisor whose log reader stalls: the Step's prints filled the pipe, and the
    stop's notice to stderr, written on the event loop, blocked there, so neither the grace,
    a second SIGTERM nor ``intloom stop`` could end the host (only SIGKILL, then recover).
    The notice is written on a thread of its own: the stop goes on and releases the
    project's files."""
    project = one_source_project(tmp_path, "floods", FLOODS)
    read, write = os.pipe()  # its read end is never read: a stalled supervisor
    proc = subprocess.Popen(
        [sys.executable, "-m", "intloom", "start", "--foreground"], cwd=project.root,
        stdin=subprocess.DEVNULL, stdout=write, stderr=write,
        env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO),
             "INTLOOM_TEST_SUSPEND_GRACE": "1"})
    os.close(write)
    project.pids.add(proc.pid)
    try:
        service = project.state / "service.json"
        eventually(service.exists, timeout=30, what="the foreground host to serve")
        ok(project.cli("flow", "floods", "--intent", "go", "--detach", "--json"))
        eventually(lambda: _blocked_writing_to_a_pipe(proc.pid), timeout=20,
                   what="the Step to block on the full pipe")
        proc.send_signal(signal.SIGTERM)
        # Released: the stop ran its grace, cut the Step and removed its files.
        eventually(lambda: not service.exists()
                   and not (project.state / "service.lock").exists(), timeout=20,
                   what="the stop to release the project's files")
        log = next((project.state / "logs").glob("LOG-*.jsonl")).read_text()
        assert '"event":"log_closed"' in log, log[-2000:]
    finally:
        project.reap()
        proc.wait(timeout=10)
        os.close(read)
