"""Crash leftovers: after a SIGKILL or a fatal error, nothing is cleaned up or killed behind
the user's back. start and stop refuse with CLI_SERVICE_BUSY and leave every byte in place."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from intloom.client.client import Client
from intloom.client.lifecycle import start_service, stop_service
from intloom.diagnostics.checks import Check
from intloom.errors import IntloomError
from intloom.fsutil import ensure_private_dir
from intloom.project import ProjectPaths
from tests.helpers import Project, eventually, ok, pid_alive, snapshot_files
from tests.integration.host_support import metadata, start


def test_sigkill_then_stop_is_busy_and_every_file_is_byte_identical(project: Project) -> None:
    start(project)
    project.kill_host()
    before = snapshot_files(project.root)
    with pytest.raises(IntloomError) as busy:
        stop_service(project.root)
    assert busy.value.code == "CLI_SERVICE_BUSY"
    assert "Cannot verify resource cleanup by the original instance" in busy.value.message
    assert snapshot_files(project.root) == before
    # start refuses too, and still touches nothing.
    with pytest.raises(IntloomError) as again:
        start_service(project.root)
    assert again.value.code == "CLI_SERVICE_BUSY"
    assert "intloom doctor" in again.value.message
    # And, as stop says it, that the host is gone and what to run (it said only "locked").
    pid = json.loads((project.state / "service.lock").read_text())["pid"]
    assert again.value.message.endswith(
        f"Its host (pid {pid}) has exited: it was killed or crashed, and left its files "
        "behind. Run intloom recover, then intloom start."), again.value.message
    assert snapshot_files(project.root) == before
    # Without connection.json recover refuses: start does not send the user to it.
    (project.state / "connection.json").rename(project.root / "connection.json.aside")
    with pytest.raises(IntloomError) as lost:
        start_service(project.root)
    assert lost.value.code == "CLI_SERVICE_BUSY"
    assert "Run intloom recover, then intloom start" not in lost.value.message, lost.value


def test_stale_service_lock_blocks_start_and_is_left_untouched(project: Project) -> None:
    ensure_private_dir(project.state)
    lock = project.state / "service.lock"
    lock.write_text(json.dumps({
        "version": 1, "pid": 9999999, "createTime": 1.0, "bootId": "", "instanceId":
        "33333333-3333-4333-8333-333333333333", "startedAt": "2026-01-01T00:00:00.000Z",
    }))
    lock.chmod(0o600)
    before = snapshot_files(project.root)
    with pytest.raises(IntloomError) as busy:
        start_service(project.root)
    assert busy.value.code == "CLI_SERVICE_BUSY"
    assert "intloom recover only after its owner has exited" in busy.value.message
    assert snapshot_files(project.root) == before
    with pytest.raises(IntloomError) as stop_busy:
        stop_service(project.root)
    assert stop_busy.value.code == "CLI_SERVICE_BUSY"
    assert snapshot_files(project.root) == before


def test_a_service_json_left_alone_is_replaced_by_start_and_an_invalid_one_kept(
    project: Project
) -> None:
    """Only a hand-deleted ``service.lock`` leaves a ``service.json`` alone (a host and
    recover remove ``service.json`` first). start takes a new lock and the journal's own,
    then replaces it (docs/recovery.md); an invalid one stops the start, byte-identical."""
    first = start(project).service
    project.kill_host()
    (project.state / "service.lock").unlink()
    second = start(project).service
    assert second.instance_id != first.instance_id
    assert metadata(project, "service.json")["instanceId"] == second.instance_id
    stop_service(project.root)

    service = project.state / "service.json"
    service.write_text('{"version": 1, "unexpected": true}')
    service.chmod(0o600)
    before = snapshot_files(project.root)
    with pytest.raises(IntloomError) as invalid:
        start_service(project.root)
    assert invalid.value.code == "CLI_SERVICE_METADATA_INVALID", invalid.value
    assert "service.json" in invalid.value.message, invalid.value.message
    assert snapshot_files(project.root) == before  # nothing written, nothing removed
    assert not (project.state / "service.lock").exists()


def test_a_live_lock_owner_that_is_no_host_is_busy_at_once(project: Project) -> None:
    """service.lock names a live process that never takes the OS lock (no host starting):
    start refuses once the lock has stayed free a moment, not after its whole timeout."""
    import psutil

    from intloom.host.metadata import boot_id

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        ensure_private_dir(project.state)
        lock = project.state / "service.lock"
        lock.write_text(json.dumps({
            "version": 1, "pid": sleeper.pid, "createTime":
            psutil.Process(sleeper.pid).create_time(), "bootId": boot_id(), "instanceId":
            "33333333-3333-4333-8333-333333333333", "startedAt": "2026-01-01T00:00:00.000Z",
        }))
        lock.chmod(0o600)
        before = snapshot_files(project.root)
        began = time.monotonic()
        with pytest.raises(IntloomError) as busy:
            start_service(project.root, timeout=30)
        took = time.monotonic() - began
    finally:
        sleeper.kill()
        sleeper.wait()
    assert busy.value.code == "CLI_SERVICE_BUSY"
    assert took < 15, f"start waited {took:.1f} s of its 30 s timeout for a host never starting"
    assert snapshot_files(project.root) == before


def test_fatal_error_logs_process_failed_and_leaves_the_log_unsealed(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INTLOOM_TEST_FATAL", "1")
    service = start(project).service
    _wait_dead(project, service.pid)
    assert service.log_file is not None
    log = project.state / "logs" / service.log_file
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines[0]["event"] == "log_opened"
    assert lines[-1]["event"] == "process_failed"
    assert lines[-1]["level"] == "fatal"
    assert "log_closed" not in {line["event"] for line in lines}
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    # What a crash leaves behind is for doctor and recover: stop refuses and touches nothing.
    before = snapshot_files(project.root)
    with pytest.raises(IntloomError) as busy:
        stop_service(project.root)
    assert busy.value.code == "CLI_SERVICE_BUSY"
    assert snapshot_files(project.root) == before
    # doctor quotes its last word: it said only that the owner had exited.
    ended = _last_host(project)
    assert ended.status == "attention", ended
    assert ended.message.startswith(
        f"The last host failed at {lines[-1]['time']}: RuntimeError: INTLOOM_TEST_FATAL is set: "
        "simulated fatal error after ready (.intloom/logs/"), ended.message
    assert snapshot_files(project.root) == before


BREAKER = """
import os

import intloom

wf = intloom.Workflow("breaker", version="1")
s = wf.stage("s")


@s.step("a", routes={"done": intloom.COMPLETE})
async def a(ctx: intloom.StepContext[None]) -> str:
    for fd in os.listdir("/proc/self/fd"):  # the event loop's own selector
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[eventpoll]":
                os.close(int(fd))
        except OSError:
            pass
    return "done"
"""


def test_a_host_whose_event_loop_fails_logs_process_failed(project: Project) -> None:
    """Workflow code that broke the event loop itself (closed its selector's descriptor):
    the exception left the loop, past every handler of the host's, and the host died with
    its traceback in /dev/null and no last word in its log."""
    (project.root / "workflows" / "breaker.py").write_text(BREAKER)
    (project.root / "intloom.toml").write_text('workflows = ["workflows/breaker.py"]\n')
    service = start(project).service
    with contextlib.suppress(IntloomError), Client.connect(project.root) as client:
        client.create_run("breaker", "x")  # its reply never comes: the host dies
    _wait_dead(project, service.pid)
    assert service.log_file is not None
    lines = (project.state / "logs" / service.log_file).read_text().splitlines()
    last = json.loads(lines[-1])
    assert (last["event"], last["error"]) == ("process_failed", "OSError"), last
    ended = _last_host(project)
    assert ended.message.startswith(f"The last host failed at {last['time']}: OSError: "), ended


HIJACK = """
import os

import intloom

wf = intloom.Workflow("hijack", version="1")
s = wf.stage("s")


@s.step("a", routes={"done": intloom.COMPLETE})
def a(ctx: intloom.StepContext[None]) -> str:
    for fd in os.listdir("/proc/self/fd"):  # the journal's segment now opens another file
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.endswith(".seg"):
            victim = os.open(ctx.intent, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(victim, int(fd))
            os.close(victim)
    return "done"
"""


def test_a_segment_descriptor_taken_over_by_another_file_is_never_written_through(
        project: Project) -> None:
    """Workflow code that closed the journal's descriptor and opened a file under its
    number: every later record went into that file (a user's, overwritten), the Runs the
    host called saved were lost at the next crash. The flush that finds it fails its own
    Runs' checkpoints; the others go on in a new segment, and a crash loses none of them."""
    (project.root / "workflows" / "hijack.py").write_text(HIJACK)
    (project.root / "intloom.toml").write_text(
        'workflows = ["workflows/example.py", "workflows/hijack.py"]\n')
    start(project)
    victim = project.root / "victim.bin"
    with Client.connect(project.root) as client:
        hijacked = client.create_run("hijack", str(victim))
        assert hijacked.last_error is not None, hijacked
        assert hijacked.last_error.code == "RUN_CHECKPOINT_FAILED", hijacked
        waiting = client.create_run("example", "notes")
        assert waiting.status == "waiting", waiting
    assert victim.read_bytes() == b""  # not one record written into it
    project.kill_host()
    ok(project.cli("recover", "--json"))
    restored = ok(project.cli("start", "--json"))["service"]["restore"]
    assert waiting.run_id in restored["waiting"], restored
    with Client.connect(project.root) as client:
        assert client.get_run(waiting.run_id).pending_action == waiting.pending_action


SEGV = """
import ctypes

import intloom

wf = intloom.Workflow("segv", version="1")
s = wf.stage("s")


def crash() -> None:
    ctypes.string_at(0)  # native code reading address 0: SIGSEGV


@s.step("a", routes={"done": intloom.COMPLETE})
def a(ctx: intloom.StepContext[None]) -> str:
    crash()
    return "done"
"""


def test_a_native_crash_leaves_its_traceback_in_the_log_and_doctor_names_its_line(
        project: Project) -> None:
    """A segmentation fault in native code a Step called: the host's stderr is /dev/null,
    so nothing said where it died. Python's fault handler writes into the log, doctor
    names the crash and the project's line, and logs shows the traceback as what it is."""
    (project.root / "workflows" / "segv.py").write_text(SEGV)
    (project.root / "intloom.toml").write_text(
        'workflows = ["workflows/example.py", "workflows/segv.py"]\n')
    service = start(project).service
    with contextlib.suppress(IntloomError), Client.connect(project.root) as client:
        client.create_run("segv", "x")  # its reply never comes: the host dies
    _wait_dead(project, service.pid)
    ended = _last_host(project)
    assert "Fatal Python error: Segmentation fault, in File " in ended.message, ended
    assert (f'called from File "{project.root / "workflows" / "segv.py"}", line 11 in crash'
            in ended.message), ended.message
    records = [json.loads(line) for line in project.cli("logs", "--json").stdout.splitlines()]
    dump = [r for r in records if r["event"] == "fault_dump"]
    assert dump and dump[0]["line"] == "Fatal Python error: Segmentation fault", dump[:2]
    assert all(r["level"] == "fatal" for r in dump)
    assert "unreadable_line" not in {r["event"] for r in records}
    text = project.cli("logs").stdout.splitlines()
    assert "- fatal   fault_dump Fatal Python error: Segmentation fault" in text, text[-5:]

    # The next host's log, torn in its first write (that host killed as it began): the
    # dump ended with the log before, and --all showed this line as its fault_dump too.
    ok(project.cli("recover", "--json"))
    torn = '{"time": "2999-01-01T00:00:00.000Z", "lev'
    (project.state / "logs" / "LOG-29990101T000000000Z.jsonl").write_text(torn)
    for tail in ((), ("--tail", "1"), ("--tail", "1000")):
        every = project.cli("logs", "--all", "--json", *tail)
        assert every.code == 0, every.stderr
        records = [json.loads(line) for line in every.stdout.splitlines()]
        assert [(r["event"], r.get("line")) for r in records[-1:]] == [
            ("unreadable_line", torn)], (tail, records[-3:])
        assert tail == ("--tail", "1") or dump[0] in records, tail


def _wait_dead(project: Project, pid: int) -> None:
    """Until the host has died and its OS lock on service.lock is free: a zombie's other
    threads may still hold it for a moment, and doctor, rightly, calls no owner gone until
    it is free (the CI once found no last_host check there)."""
    from intloom.fsutil import os_lock

    eventually(lambda: not pid_alive(pid)
               and os_lock(project.state / "service.lock")[0] != "held",
               timeout=10, what=f"the host (pid {pid}) to die and free its lock")


def _last_host(project: Project) -> Check:
    from intloom.diagnostics import run_doctor

    [check] = [c for c in run_doctor(project.root).checks if c.id == "last_host"]
    return check


def test_doctor_says_a_host_killed_ended_without_a_word_and_what_it_did_last(
        project: Project) -> None:
    """After a kill -9 doctor said the owners had exited, and nothing of how or when the host
    ended, though its log, kept for that, shows it stopped mid-way."""
    from intloom.diagnostics import run_doctor

    start(project)
    with Client.connect(project.root) as client:
        run = client.create_run("example", "notes")
    project.kill_host()
    ended = _last_host(project)
    assert ended.status == "attention", ended
    assert f"with run_waiting of Run {run.run_id}, and no stop or fatal error after it: the " \
           "host ended without a word. That is a SIGKILL" in ended.message, ended.message
    assert ended.next is not None and "journalctl -k" in ended.next, ended
    ok(project.cli("recover", "--json"))
    history = _last_host(project)  # its files cleaned up: its history, nothing to do
    assert (history.status, history.next) == ("ok", None), history
    assert history.message == ended.message
    ok(project.cli("start", "--json"))
    ok(project.cli("stop", "--json"))
    assert "last_host" not in {c.id for c in run_doctor(project.root).checks}


def test_doctor_says_how_the_last_host_ended_when_no_connection_json_blocks_recover(
        project: Project) -> None:
    """Blocked for want of connection.json (a first start killed before it saved one)
    while every owner is proven gone: doctor left out how the host ended, though its log
    said, as it says when recover may run."""
    start(project)
    project.kill_host()
    (project.state / "connection.json").unlink()  # as a host killed before saving it
    ended = _last_host(project)
    assert ended.status == "attention", ended
    assert "the host ended without a word. That is a SIGKILL" in ended.message, ended.message


def test_a_lock_removed_by_its_exiting_owner_while_start_judges_it_is_not_stale(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start during a stop: it reads the stopping host's service.lock, then the host
    removes it and exits before the owner is probed. The owner is gone, but so is its lock,
    so start launches a host. It used to refuse with CLI_SERVICE_BUSY ("use intloom recover
    only after its owner has exited") with nothing left to recover (about 1 start in 8 when
    run while a stop finished)."""
    import psutil

    from intloom.client import lifecycle
    from intloom.host.metadata import boot_id

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        ensure_private_dir(project.state)
        lock = project.state / "service.lock"
        lock.write_text(json.dumps({
            "version": 1, "pid": sleeper.pid, "createTime":
            psutil.Process(sleeper.pid).create_time(), "bootId": boot_id(), "instanceId":
            "33333333-3333-4333-8333-333333333333", "startedAt": "2026-01-01T00:00:00.000Z",
        }))
        lock.chmod(0o600)
        real = lifecycle._owner_alive
        probed: list[int] = []

        def exits_meanwhile(paths: ProjectPaths, pid: int, create_time: float, boot: str | None
                            ) -> bool:
            if not probed:
                probed.append(pid)
                lock.unlink()  # the stopping host removes its lock ...
                sleeper.kill()  # ... and exits
                sleeper.wait()
            return real(paths, pid, create_time, boot)

        monkeypatch.setattr(lifecycle, "_owner_alive", exits_meanwhile)
        result = start(project, timeout=60)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert probed == [sleeper.pid]
    assert result.reused is False
    assert metadata(project, "service.lock")["instanceId"] == result.service.instance_id


def test_logs_json_stays_jsonl_when_a_crash_tore_the_last_line(project: Project) -> None:
    """A host killed mid-write leaves a torn last line (and a full disk one mid-file):
    ``logs --json`` passed it on raw, so the stream it documents as JSONL no longer parsed
    (``intloom logs --json | jq`` failed on the very log a crash is debugged with)."""
    service = start(project).service
    project.kill_host()
    assert service.log_file is not None
    log = project.state / "logs" / service.log_file
    with open(log, "ab") as fh:
        fh.write(b'{"time": "2026-12-01T00:00:00.000Z", "level": "info", "event": "ru\x00\xff')
    before = snapshot_files(project.root)
    result = project.cli("logs", "--json")
    assert result.code == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert records[0]["event"] == "log_opened"
    assert records[-1]["event"] == "unreadable_line"
    assert records[-1]["level"] == "error"
    assert records[-1]["line"].startswith('{"time": "2026-12-01T00:00:00.000Z"')
    assert snapshot_files(project.root) == before


def _unread_bytes(port: int, peer: int) -> int:
    """Bytes the host's end of the connection 127.0.0.1:``port`` <- ``peer`` holds unread
    (its Recv-Q, from /proc/net/tcp)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, queues = fields[1], fields[2], fields[4]
        if int(local.split(":")[1], 16) == port and int(remote.split(":")[1], 16) == peer:
            return int(queues.split(":")[1], 16)
    return 0


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads /proc/net/tcp")
@pytest.mark.parametrize(("request_", "said"), [
    ("runs", "the request for the list of Runs"),
    # Said "without reading reading the Run" (and "without reading waiting on the Run").
    ("get_run", "the request for reading the Run"),
])
def test_a_request_the_host_never_read_is_said_not_done(
        project: Project, request_: str, said: str) -> None:
    # A host resets a connection only as it closes it with bytes unread: here a request sent
    # to a paused host that is then killed (a stopping host does the same with one that
    # comes too late). The client said PROJECT_REQUEST_FAILED, "the host may have acted on
    # it", though the host never read it.
    service = start(project).service
    client = Client.connect(project.root)
    assert client._sock is not None
    peer = client._sock.getsockname()[1]
    failed: list[IntloomError] = []

    def ask() -> None:
        try:
            if request_ == "runs":
                client.runs()
            else:
                client.get_run("RUN-1")
        except IntloomError as exc:
            failed.append(exc)

    asking = threading.Thread(target=ask, daemon=True)
    try:
        os.kill(service.pid, signal.SIGSTOP)
        asking.start()
        eventually(lambda: _unread_bytes(service.port, peer) > 0,
                   what="the request to wait unread in the paused host's socket")
        project.kill_host()
        asking.join(timeout=30)
        assert not asking.is_alive(), "the request never returned"
    finally:
        client.close()
    assert len(failed) == 1, failed
    error = failed[0]
    assert error.code == "PROJECT_CONNECTION_FAILED", error
    assert f"the host reset it without reading {said}: nothing was done" in (
        error.message), error.message
    assert "may have acted" not in error.message, error.message
