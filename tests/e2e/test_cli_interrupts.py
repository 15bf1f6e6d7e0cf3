"""Ctrl-C (SIGINT) on the real CLI: ``attach --json`` detaches with exit 0 and one JSON
document (the Run's view; the last one seen when the host cannot answer at that moment);
``logs --follow`` stops quietly.

Each test starts its CLI child with SIGINT at its default disposition (a test runner started
in the background has it ignored, and an ignored SIGINT is inherited), and kills and waits
for it in ``finally``; the hosts are reaped by the project fixtures.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest

from intloom.cli import exit_codes
from intloom.cli.app import main
from intloom.cli.commands import attach
from intloom.cli.commands.attach import _detach_json
from intloom.cli.options import CliState
from intloom.client.client import Client
from intloom.errors import IntloomError
from tests.helpers import REPO, Project, eventually, ok

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


@contextlib.contextmanager
def cli_child(project: Project, *args: str, background: bool = False
              ) -> Iterator[subprocess.Popen[str]]:
    """The real CLI as a child that Ctrl-C reaches (``background``: with SIGINT ignored, as
    a script's background job has it); killed and reaped on the way out."""
    previous = signal.signal(signal.SIGINT,
                             signal.SIG_IGN if background else signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "intloom", "--project", str(project.root), *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)},
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def connected(proc: subprocess.Popen[str], port: int) -> bool:
    """``proc`` holds a connection to the host (it got past start-up and is attaching)."""
    assert proc.poll() is None, proc.communicate(timeout=10)
    return connections(proc, port) >= 1


def connections(proc: subprocess.Popen[str], port: int) -> int:
    """How many connections ``proc`` holds to the host on ``port``."""
    try:
        held = psutil.Process(proc.pid).net_connections(kind="tcp")
    except psutil.NoSuchProcess:
        return 0
    return sum(1 for c in held if c.status == psutil.CONN_ESTABLISHED and c.raddr
               and c.raddr.port == port)


def replies_read(proc: subprocess.Popen[str], port: int) -> bool:
    """``proc`` holds a connection to the host on ``port`` with nothing unread in its
    receive queue (/proc/net/tcp's rx_queue): every reply sent to it so far was read."""
    if not connected(proc, port):
        return False
    ours = {c.laddr.port for c in psutil.Process(proc.pid).net_connections(kind="tcp")
            if c.raddr and c.raddr.port == port}
    for line in Path(f"/proc/{proc.pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, queues = fields[1], fields[2], fields[4]
        if (int(local.split(":")[1], 16) in ours and int(remote.split(":")[1], 16) == port
                and int(queues.split(":")[1], 16) != 0):
            return False
    return True


def host_port(project: Project) -> int:
    port: int = json.loads((project.state / "connection.json").read_text())["port"]
    return port


def running_run(project: Project) -> tuple[str, Path]:
    """A Run of ``reference`` held inside its first Step, and the gate file that holds it."""
    ok(project.cli("start", "--json"))
    gates = project.root / "gates"
    gates.mkdir()
    hold = gates / "step:fetch.hold"
    hold.write_text("held")
    run = ok(project.cli("flow", "reference", "--intent", "stay running", "--detach", "--json"))
    eventually((gates / "step:fetch.entered").exists, timeout=15, what="the Step to be held")
    return str(run["run"]["runId"]), hold


def ctrl_c_as_clients_close(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C lands as each of this process's own Clients closes (attach's, a detach's look),
    once it closed; never in a thread (attach's follower keeps its own connection)."""
    closing = Client.__exit__

    def interrupted(self: Client, *exc: object) -> None:
        closing(self, *exc)
        if threading.current_thread() is threading.main_thread():
            raise KeyboardInterrupt

    monkeypatch.setattr(Client, "__exit__", interrupted)


def one_document(out: str) -> Any:
    assert len(out.splitlines()) == 1, out
    return json.loads(out)


def test_attach_json_detaches_on_ctrl_c_with_the_runs_view(proj: Project) -> None:
    run_id, hold = running_run(proj)
    port = host_port(proj)
    with cli_child(proj, "attach", run_id, "--json") as proc:
        eventually(lambda: connected(proc, port), timeout=20, what="attach to connect")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, (out, err)
    assert err == ""
    doc = one_document(out)
    assert set(doc) == {"run"}
    assert (doc["run"]["runId"], doc["run"]["status"]) == (run_id, "running")
    # Detaching left the Run alone: released, it goes on to its first wait.
    hold.unlink()
    eventually(
        lambda: ok(proj.cli("runs", "--json"))["runs"][0]["status"] == "waiting",
        timeout=20, what="the Run to reach its first wait",
    )


def test_a_detach_prints_the_last_view_when_the_host_cannot_answer(
    proj: Project, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What attach --json does after Ctrl-C, in this process against a host that accepts
    connections (the kernel does) but never answers: one short look, then the view it has."""
    # Each detach below waits out its whole look on the paused host: a shorter look shows
    # the same outcome without 2 x 2 s of waiting.
    monkeypatch.setattr(attach, "_DETACH_LOOK", 0.5)
    run_id, hold = running_run(proj)
    with Client.connect(proj.root) as client:
        seen = client.get_run(run_id)
    state = CliState(json_mode=True)
    state.project = proj.root
    host = proj.host_pid()
    os.kill(host, signal.SIGSTOP)
    try:
        began = time.monotonic()
        assert _detach_json(state, run_id, seen) == exit_codes.OK
        took = time.monotonic() - began
        # Before attach had a view there is nothing to print but why the look failed.
        with pytest.raises(IntloomError) as unanswered:
            _detach_json(state, run_id, None)
    finally:
        os.kill(host, signal.SIGCONT)
    assert took < 10, took  # a short look, not a request's timeout
    assert unanswered.value.code == "CLI_SERVICE_UNAVAILABLE"
    doc = one_document(capsys.readouterr().out)
    assert doc == {"run": json.loads(msgspec.json.encode(seen))}
    assert (doc["run"]["runId"], doc["run"]["status"]) == (run_id, "running")
    hold.unlink()


def test_attach_detaches_on_ctrl_c_before_its_first_view(project: Project) -> None:
    """Ctrl-C while attach (text mode) still waited for its host's first answer exited 130
    "Interrupted.", where a moment later it detached with 0: the host is paused here, so
    attach is connected and waits for the hello's reply, before any view of the Run."""
    ok(project.cli("start", "--json"))
    port, host = host_port(project), project.host_pid()
    os.kill(host, signal.SIGSTOP)
    try:
        with cli_child(project, "attach", "RUN-20260101T000000000Z-x") as proc:
            eventually(lambda: connected(proc, port), timeout=20, what="attach to connect")
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=20)
    finally:
        os.kill(host, signal.SIGCONT)
    assert (proc.returncode, out) == (exit_codes.OK, ""), (proc.returncode, out, err)
    # With --project, from a working directory outside the project: the command reaches it.
    assert err == ("Detached from RUN-20260101T000000000Z-x before its first view; nothing "
                   f"was done to it. intloom --project {shlex.quote(str(project.root))} "
                   "attach RUN-20260101T000000000Z-x attaches again.\n"), err


def test_ctrl_c_while_attach_closes_after_its_view_keeps_what_was_shown(
    project: Project, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C landing as attach's connection closes, after it followed the Run to a wait:
    the end is printed as without it, never "before its first view" (which it said)."""
    ok(project.cli("start", "--json"))
    run = ok(project.cli("flow", "example", "--intent", "notes", "--json"))["run"]
    assert run["status"] == "waiting"
    ctrl_c_as_clients_close(monkeypatch)
    code = main(["--project", str(project.root), "attach", run["runId"]])
    out, err = capsys.readouterr()
    assert code == exit_codes.OK, (out, err)
    assert "before its first view" not in err, err
    assert "Waiting for an answer" in out, out
    monkeypatch.undo()
    assert ok(project.cli("runs", "--json"))["runs"][0]["status"] == "waiting"


def test_ctrl_c_while_attach_closes_on_an_error_keeps_the_error(
    project: Project, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C landing as attach's connection closes on an error (here, no such Run): the
    error stands, with its code and exit code, never "Detached from RUN before its first
    view" and exit 0 (which it said)."""
    ok(project.cli("start", "--json"))
    ctrl_c_as_clients_close(monkeypatch)
    code = main(["--project", str(project.root), "attach", "RUN-NOPE"])
    out, err = capsys.readouterr()
    assert code == exit_codes.FAILURE, (code, out, err)
    assert "NOT_FOUND" in err and "RUN-NOPE" in err, err
    assert "Detached" not in err, err


def test_ctrl_c_while_attach_json_closes_after_its_wait_keeps_the_end(
    project: Project, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """attach --json of a Run that ended (here cancelled: failed/RUN_STOPPED), with Ctrl-C
    landing as its connection closes: the end stands, exit 1, where it detached with 0."""
    ok(project.cli("start", "--json"))
    run_id = ok(project.cli("flow", "example", "--intent", "notes", "--json"))["run"]["runId"]
    ok(project.cli("cancel", run_id, "--json"))
    ctrl_c_as_clients_close(monkeypatch)
    code = main(["--project", str(project.root), "attach", run_id, "--json"])
    out, err = capsys.readouterr()
    assert code == exit_codes.RUN_FAILED, (code, out, err)
    doc = one_document(out)
    assert (doc["run"]["runId"], doc["run"]["status"]) == (run_id, "failed")
    assert doc["run"]["lastError"]["code"] == "RUN_STOPPED"


def one_line_log(project: Project) -> None:
    """The project's logs/ with one log of one record (event "first"), as a host leaves it."""
    logs = project.state / "logs"
    logs.mkdir(parents=True, mode=0o700)
    os.chmod(project.state, 0o700)
    log = logs / "LOG-20260101T000000000Z.jsonl"
    log.write_text(json.dumps({"time": "T1", "level": "info", "event": "first"}) + "\n")
    os.chmod(log, 0o600)


def followed_first_line(proc: subprocess.Popen[str]) -> str:
    """The first line ``logs --follow`` printed (within 20 s)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 20)
    assert ready, "logs --follow printed nothing"
    return proc.stdout.readline()


def test_logs_follow_stops_on_ctrl_c_without_a_word(project: Project) -> None:
    one_line_log(project)
    with cli_child(project, "logs", "--follow") as proc:
        assert "first" in followed_first_line(proc)
        # The watcher runs a thread of its own: with it, Ctrl-C lands inside the watch.
        eventually(lambda: psutil.Process(proc.pid).num_threads() > 1, timeout=20,
                   what="logs --follow to watch")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, (out, err)
    assert err == "", err  # watchfiles' "KeyboardInterrupt caught, stopping watch" is gone


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_logs_follow_stopped_while_it_prints_the_backlog_exits_0(
        project: Project, signum: signal.Signals) -> None:
    """Ctrl-C while ``logs --follow`` still printed the records already in the log (a long
    log, or a reader slower than it) ended it with exit 130 and "Interrupted.", where
    docs/cli.md says it stops with 0 as it does once it watches. A SIGTERM there killed it
    (143): its handler was set only once the backlog was out."""
    logs = project.state / "logs"
    logs.mkdir(parents=True, mode=0o700)
    os.chmod(project.state, 0o700)
    log = logs / "LOG-20260101T000000000Z.jsonl"
    record = {"time": "T1", "level": "info", "event": "backlog", "detail": "x" * 100}
    log.write_text((json.dumps(record) + "\n") * 2000)  # far more than a pipe holds
    os.chmod(log, 0o600)

    def pipe_full(proc: subprocess.Popen[str]) -> bool:
        with open(f"/proc/{proc.pid}/wchan", encoding="ascii") as fh:
            return "pipe_write" in fh.read()  # asleep in a write to the full pipe

    with cli_child(project, "logs", "--follow") as proc:
        # Unread, the pipe fills: the CLI is stopped mid-backlog, in its write.
        eventually(lambda: pipe_full(proc), timeout=20, what="the backlog to fill the pipe")
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, (proc.returncode, err)
    assert err == "", err
    assert out.count("backlog") < 2000, "the Ctrl-C came after the backlog"


# Delivers a real SIGINT to the CLI process while it imports its commands (as a Ctrl-C
# pressed right after Enter, or one that stops a shell loop of intloom commands, does),
# then runs the console command as the ``intloom`` script would.
_CTRL_C_WHILE_IMPORTING = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)

class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == "typer":
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, CtrlC())
from intloom.cli.entry import run
sys.argv = ["intloom", *sys.argv[1:]]
run()
"""


@pytest.mark.parametrize("json_mode", [False, True])
def test_ctrl_c_while_the_cli_imports_exits_130_without_a_traceback(
    project: Project, json_mode: bool
) -> None:
    args = ["--project", str(project.root), "runs", *(["--json"] if json_mode else [])]
    proc = subprocess.run(
        [sys.executable, "-c", _CTRL_C_WHILE_IMPORTING, *args],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == exit_codes.INTERRUPTED, (proc.stdout, proc.stderr)
    assert proc.stdout == ""  # nothing on stdout, not even with --json (docs/cli.md)
    # As for a Ctrl-C during the command: one word on stderr, no traceback.
    assert proc.stderr == ("" if json_mode else "Interrupted.\n"), proc.stderr


def test_the_console_script_imports_little_before_its_ctrl_c_guard() -> None:
    """What the ``intloom`` script imports before ``run()`` can catch a Ctrl-C (the package,
    ``intloom.cli``, the entry module) is a window in which one printed a traceback: typing
    (~2 ms on a 2-vCPU VM) and threading were imported there. Only modules the interpreter
    had not imported at start-up count: they are the ones that take time."""
    probe = ("import sys; before = set(sys.modules); import intloom.cli.entry; "
             "print(' '.join(sorted(set(sys.modules) - before)))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    new = set(proc.stdout.split())
    assert new <= {"intloom", "intloom.cli", "intloom.cli.entry", "intloom.cli.exit_codes",
                   "gc", "collections.abc"}, sorted(new)


def _waiting_with_the_next_step_held(proj: Project) -> tuple[str, str, Path, int]:
    """A started host, a ``reference`` Run waiting on its confirmation, and the Step after
    it held by its gate: the Run's id, its action's, the gate's file and the host's port."""
    ok(proj.cli("start", "--json"))
    run = ok(proj.cli("flow", "reference", "--intent", "x", "--json"))["run"]
    assert run["status"] == "waiting", run
    gates = proj.root / "gates"
    gates.mkdir()
    hold = gates / "step:fetch.hold"
    hold.write_text("held")
    return run["runId"], run["pendingAction"]["id"], hold, host_port(proj)


def _answer_recorded(proj: Project, proc: subprocess.Popen[str], port: int) -> None:
    """Until the Step after the answer runs and ``proc`` has read the answer's reply (sent
    before that Step ran): the answer is recorded, and ``answer`` waits for the Run."""
    entered = proj.root / "gates" / "step:fetch.entered"
    eventually(entered.exists, timeout=15, what="the Step held")
    eventually(lambda: replies_read(proc, port), timeout=20, what="answer to wait")


@pytest.mark.parametrize(("sig", "code", "said"), [
    (signal.SIGINT, exit_codes.INTERRUPTED, ""),
    # SIGTERM (a supervisor, a timeout, kill) ended flow's wait with exit 143 and not a word.
    (signal.SIGTERM, exit_codes.TERMINATED, "Stopped waiting (SIGTERM). "),
])
def test_ctrl_c_or_sigterm_while_flow_waits_says_the_run_goes_on(
        proj: Project, sig: signal.Signals, code: int, said: str) -> None:
    ok(proj.cli("start", "--json"))
    gates = proj.root / "gates"
    gates.mkdir()
    hold = gates / "step:fetch.hold"
    hold.write_text("held")
    port = host_port(proj)
    with cli_child(proj, "flow", "reference", "--intent", "wait here") as proc:
        eventually((gates / "step:fetch.entered").exists, timeout=15, what="the Step held")
        # The host replied to the creation before the Step began; once flow has read that
        # reply it knows the Run's id.
        eventually(lambda: replies_read(proc, port), timeout=20, what="flow to wait")
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == code, (out, err)
    assert out == ""
    assert err.startswith(said), err
    # Silence left people guessing whether the Run was lost with the command.
    # The CLI ran with --project, from a working directory outside the project.
    [run] = ok(proj.cli("runs", "--json"))["runs"]
    assert run["status"] == "running"
    # The Run is created by one request and waited for by another, so its id is known: it
    # was "not known here" when one request did both.
    intloom = f"intloom --project {shlex.quote(str(proj.root))}"
    assert f"Run {run['runId']} goes on in the host: {intloom} attach {run['runId']} " \
        "follows it." in err, err
    assert len(err.splitlines()) == 1, err  # said once: not followed by "Interrupted."
    hold.unlink()


def test_a_host_gone_while_flow_waits_names_the_run_it_created(proj: Project) -> None:
    """The error of a wait that failed says the Run exists: its advice to run the request
    again would, for flow, create a second Run."""
    ok(proj.cli("start", "--json"))
    gates = proj.root / "gates"
    gates.mkdir()
    (gates / "step:fetch.hold").write_text("held")
    port = host_port(proj)
    with cli_child(proj, "flow", "reference", "--intent", "wait here") as proc:
        eventually((gates / "step:fetch.entered").exists, timeout=15, what="the Step held")
        eventually(lambda: replies_read(proc, port), timeout=20, what="flow to wait")
        proj.kill_host()
        out, err = proc.communicate(timeout=20)
    assert proc.returncode != 0, (out, err)
    assert out == ""
    assert "Traceback" not in err, err
    named = re.search(r"This command created Run (RUN-\S+), which is not lost: running "
                      r"intloom --project \S+ flow again would create another Run\.", err)
    assert named is not None, err
    run_id = named.group(1)
    assert f"attach {run_id}" in err, err
    # The Run named is the one the killed host's journal holds.
    assert ok(proj.cli("inspect", run_id, "--json"))["run"]["runId"] == run_id, err


@pytest.mark.parametrize(("sig", "code", "said"), [
    (signal.SIGINT, exit_codes.INTERRUPTED, ""),
    (signal.SIGTERM, exit_codes.TERMINATED, "Stopped waiting (SIGTERM). "),
])
def test_ctrl_c_or_sigterm_while_answer_waits_names_the_run_to_attach(
        proj: Project, sig: signal.Signals, code: int, said: str) -> None:
    run_id, action, hold, port = _waiting_with_the_next_step_held(proj)
    with cli_child(proj, "answer", run_id, action, '{"isConfirmed": false}') as proc:
        _answer_recorded(proj, proc, port)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == code, (out, err)
    assert out == ""
    assert err.startswith(said), err
    # Said for certain: "If the host took the answer, the Run goes on with it" left the
    # person to find out by sending it again, of an answer recorded before the Step ran.
    assert "The answer was recorded, and the Run goes on with it: " in err, err
    # --project, from a working directory outside the project: the command reaches it.
    assert f"intloom --project {shlex.quote(str(proj.root))} attach {run_id}" in err, err
    hold.unlink()


def test_doctor_stuck_importing_a_workflow_says_which_and_ctrl_c_ends_it(
    tmp_path: Path,
) -> None:
    """A Workflow module that waits when imported (a network call, a lock) kept doctor
    silent forever; it now names the source it is stuck in, on stderr."""
    root = tmp_path / "proj"
    (root / "workflows" / "stuck").mkdir(parents=True)
    (root / "workflows" / "stuck" / "stuck.py").write_text(
        "import threading\nthreading.Event().wait()\n")
    (root / "intloom.toml").write_text('workflows = ["workflows/stuck/stuck.py"]\n')
    project = Project(root=root)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "intloom", "--project", str(root), "doctor", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO),
                 "INTLOOM_TEST_IMPORT_NOTICE": "0.2"},
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        assert proc.stderr is not None
        ready, _, _ = select.select([proc.stderr], [], [], 30)
        assert ready, "doctor said nothing while stuck"
        line = proc.stderr.readline()
        assert line.startswith("Still importing workflows/stuck/stuck.py after "), line
        assert "Ctrl-C" in line
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == exit_codes.INTERRUPTED, (out, err)
        assert out == "" and "Traceback" not in err, (out, err)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)
        project.reap()


def test_sigterm_detaches_attach_and_exits_143(proj: Project) -> None:
    run_id, hold = running_run(proj)
    port = host_port(proj)
    with cli_child(proj, "attach", run_id) as proc:
        eventually(lambda: connected(proc, port), timeout=20, what="attach to connect")
        # Connected is not following: a SIGTERM while it still asks for the first view is
        # "Detached ... before its first view" (a loaded machine got there). This case is
        # the one after it: following, with the stream's connection of its own.
        eventually(lambda: connections(proc, port) >= 2, timeout=20,
                   what="attach to follow the Run")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == exit_codes.TERMINATED, (out, err)
    assert f"Detached from {run_id}; the Run is left as it was." in err, err
    assert "Traceback" not in err, err
    [run] = ok(proj.cli("runs", "--json"))["runs"]
    assert run["status"] == "running"
    hold.unlink()


def test_attach_whose_stream_missed_the_suspend_says_the_run_goes_on(
    proj: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stop whose suspend event never reached attach's stream (here the stream is refused
    # at the connection cap; a restored Run's history still being read does the same) left
    # attach with only the main connection's view, failed/RUN_INTERRUPTED: it said
    # "Failure does not undo committed data", as for a Run that ended.
    monkeypatch.setenv("INTLOOM_TEST_MAX_CONNECTIONS", "1")
    monkeypatch.setenv("INTLOOM_TEST_SUSPEND_GRACE", "1")
    run_id, hold = running_run(proj)
    port = host_port(proj)
    with cli_child(proj, "attach", run_id) as proc:
        eventually(lambda: connected(proc, port), timeout=20, what="attach to connect")
        stopped = proj.cli("stop", "--json")
        assert stopped.code == 0 and stopped.json["stopped"] is True, stopped
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == exit_codes.RUN_SUSPENDED, (out, err)
    assert "Suspended by its host, not ended" in out, out
    assert "Failure does not undo committed data" not in out, out
    assert f"Suspended · The Run {run_id} was suspended by its host, not ended" in err, err
    hold.unlink()


def test_attach_json_at_a_run_a_stop_suspends_exits_75_and_1_once_a_start_decides(
    proj: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """attach --json following a busy Run, then intloom stop: the Run is suspended, not
    ended (its view failed/RUN_INTERRUPTED, its phase not terminal), and attach exits 75,
    RUN_SUSPENDED, where it exited 1 as for a failed Run. Cut mid-Step by the stop's grace,
    the next start reports it RUN_INTERRUPTED: attached again, it has failed (1)."""
    monkeypatch.setenv("INTLOOM_TEST_SUSPEND_GRACE", "1")
    run_id, hold = running_run(proj)
    port = host_port(proj)
    with cli_child(proj, "attach", run_id, "--json") as proc:
        eventually(lambda: connected(proc, port), timeout=20, what="attach to connect")
        ok(proj.cli("stop", "--json"))
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 75, (out, err)  # exit_codes.RUN_SUSPENDED
    run = one_document(out)["run"]
    assert (run["status"], run["lastError"]["code"]) == ("failed", "RUN_INTERRUPTED"), run
    assert run["phase"] != "terminal" and "next start reports the Run" in \
        run["lastError"]["message"], run
    assert err == "", err
    hold.unlink()
    ok(proj.cli("start", "--json"))
    again = proj.cli("attach", run_id, "--json")
    assert again.code == exit_codes.RUN_FAILED, (again.stdout, again.stderr)
    assert (again.json["run"]["phase"], again.json["run"]["lastError"]["code"]) == (
        "terminal", "RUN_INTERRUPTED"), again.json
    ok(proj.cli("stop", "--json"))


def _stuck_project(project: Project, source: str, name: str) -> None:
    (project.root / "workflows" / "__init__.py").write_text("")
    (project.root / "workflows" / f"{name}.py").write_text(source)
    (project.root / "intloom.toml").write_text(f'workflows = ["workflows/{name}.py"]\n')


def test_ctrl_c_on_a_stop_under_way_says_the_host_goes_on_stopping(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while stop waited for a host in its grace said only "Interrupted.": the host
    went on and stopped, which nothing said."""
    from tests.integration.test_host_signals import GATE_STEP

    _stuck_project(project, GATE_STEP, "stuck")
    monkeypatch.setenv("INTLOOM_TEST_SUSPEND_GRACE", "45")
    ok(project.cli("start", "--json"))
    pid = project.host_pid()
    try:
        ok(project.cli("flow", "stuck", "--intent", "go", "--detach", "--json"))
        eventually((project.root / "entered").exists, timeout=10, what="the Step to start")
        log = next((project.state / "logs").glob("LOG-*.jsonl"))
        with cli_child(project, "stop") as proc:
            eventually(lambda: "service_stopping" in log.read_text(), timeout=15,
                       what="the stop to begin")
            proc.send_signal(signal.SIGINT)
            _out, err = proc.communicate(timeout=20)
        assert proc.returncode == exit_codes.INTERRUPTED, err
        assert err.startswith(f"Stopped waiting (Ctrl-C). The host (pid {pid}) is stopping "
                              "and goes on"), err
        assert "Interrupted." not in err, err
    finally:
        (project.root / "gate").touch()
    eventually(lambda: not (project.state / "service.json").exists(), timeout=20,
               what="the host to finish its stop")


def _importing_host(project: Project) -> int:
    """The pid of the host a start launched, once it imports its (slow) Workflow; reaped
    with the project."""
    eventually((project.root / "importing").exists, timeout=20,
               what="the host to import its Workflows")
    pid = int(json.loads((project.state / "service.lock").read_text())["pid"])
    project.pids.add(pid)
    return pid


def test_ctrl_c_on_a_stop_waiting_for_a_starting_host_says_it_was_not_asked(
        project: Project) -> None:
    """Ctrl-C while stop waited for a host still starting (it asks once the host serves)
    said "No host serves the project now: intloom status says whether it is offline", and
    the host served moments later, never asked to stop."""
    from tests.integration.test_host_signals import SLOW_IMPORT

    _stuck_project(project, SLOW_IMPORT, "slow")
    try:
        with cli_child(project, "start") as starter:
            pid = _importing_host(project)
            with cli_child(project, "stop") as stopper:
                stderr = stopper.stderr
                assert stderr is not None
                said: list[str] = []
                reader = threading.Thread(target=lambda: said.append(stderr.readline()))
                reader.start()
                reader.join(timeout=20)  # stop's note that it waits for the host to serve
                assert said and "is still starting" in said[0], said
                stopper.send_signal(signal.SIGINT)
                _out, err = stopper.communicate(timeout=20)
            assert stopper.returncode == exit_codes.INTERRUPTED, err
            assert err.startswith(f"Stopped waiting (Ctrl-C). The host (pid {pid}) is still "
                                  "starting and was not asked to stop"), err
            assert f"kill -TERM {pid}" in err, err
            (project.root / "gate").touch()
            starter.communicate(timeout=30)
        assert starter.returncode == 0  # as it said: the host served, never asked to stop
    finally:
        (project.root / "gate").touch()
    ok(project.cli("stop", "--json"))


def test_ctrl_c_on_a_start_says_it_stopped_the_host_it_launched(project: Project) -> None:
    """Ctrl-C while start waited for the host it launched (importing its Workflows): start
    stopped that host, and said only "Interrupted."."""
    from tests.integration.test_host_signals import SLOW_IMPORT

    _stuck_project(project, SLOW_IMPORT, "slow")
    try:
        with cli_child(project, "start") as proc:
            pid = _importing_host(project)
            proc.send_signal(signal.SIGINT)
            _out, err = proc.communicate(timeout=30)
    finally:
        (project.root / "gate").touch()
    assert proc.returncode == exit_codes.INTERRUPTED, err
    assert err.startswith(f"Interrupted: the host this start launched (pid {pid}) had not "
                          "served yet, so it was stopped: the start did not happen."), err
    eventually(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status()
               == psutil.STATUS_ZOMBIE, timeout=10, what="the launched host to exit")


def test_a_host_gone_after_an_answer_was_recorded_says_not_to_send_it_again(
        proj: Project) -> None:
    """``answer`` delivers, then waits for the Run: a host killed while the Step after the
    answer ran gave the wait's own error (``retryable``, "safe to send again", naming a
    WaitRun the person never sent), of an answer that is recorded and that sent again is
    refused."""
    run_id, action, hold, port = _waiting_with_the_next_step_held(proj)
    with cli_child(proj, "--json", "answer", run_id, action, '{"isConfirmed": false}') as proc:
        _answer_recorded(proj, proc, port)
        proj.kill_host()
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 1, (out, err)
    error = json.loads(out)["error"]
    assert error["retryable"] is False, error
    assert error["message"].startswith("The answer was recorded, but following the Run "
                                       "failed: "), error
    assert "Do not send the answer again: it is recorded" in error["message"], error
    assert f"attach {run_id}" in error["message"], error
    hold.unlink()
