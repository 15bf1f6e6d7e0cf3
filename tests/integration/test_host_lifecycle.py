"""start and stop against real detached hosts: reuse, restart identity, races, offline, logs."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from intloom.client import lifecycle
from intloom.client.client import Client
from intloom.client.lifecycle import StartResult, start_service, stop_service
from intloom.errors import IntloomError
from tests.helpers import Project, eventually, pid_alive, snapshot_files
from tests.integration.host_support import connection_closed, metadata, start, start_on_a_thread


def _log_lines(project: Project, name: str) -> list[dict[str, Any]]:
    text = (project.state / "logs" / name).read_text()
    return [json.loads(line) for line in text.splitlines()]


def test_start_writes_private_metadata_and_listens_on_localhost(project: Project) -> None:
    service = start(project).service
    assert stat.S_IMODE(project.state.stat().st_mode) == 0o700
    for name in ("service.json", "service.lock", "connection.json"):
        assert stat.S_IMODE((project.state / name).stat().st_mode) == 0o600, name
    conn = metadata(project, "connection.json")
    info = metadata(project, "service.json")
    lock = metadata(project, "service.lock")
    assert set(conn) == {"version", "projectRoot", "port", "token"}
    assert len(conn["token"]) == 43
    assert info["port"] == conn["port"] == service.port
    assert info["instanceId"] == lock["instanceId"] == service.instance_id
    assert info["pid"] == lock["pid"] == service.pid
    assert info["logFile"] == service.log_file


def test_start_twice_reuses_the_same_instance(project: Project) -> None:
    first = start(project)
    second = start(project)
    assert first.reused is False
    assert second.reused is True
    assert second.service.instance_id == first.service.instance_id


def test_the_client_api_takes_a_project_root_as_a_string(project: Project) -> None:
    root = str(project.root)  # as a user would pass it, not only a Path
    started = start_service(root)
    project.pids.add(started.service.pid)
    with Client.connect(root) as client:
        assert client.runs() == []
    assert stop_service(root) is True


def test_start_with_another_port_while_running_is_a_conflict(project: Project) -> None:
    service = start(project).service
    before = snapshot_files(project.state)
    with pytest.raises(IntloomError) as conflict:
        start_service(project.root, port=service.port + 1 if service.port < 65535 else 1024)
    assert conflict.value.code == "CLI_SERVICE_CONFLICT"
    assert snapshot_files(project.state) == before
    assert start(project, port=service.port).reused is True


def test_stop_then_start_keeps_port_and_token_with_a_new_instance(project: Project) -> None:
    first = start(project).service
    conn_before = (project.state / "connection.json").read_bytes()
    assert stop_service(project.root) is True
    assert not (project.state / "service.json").exists()
    assert not (project.state / "service.lock").exists()
    assert (project.state / "connection.json").read_bytes() == conn_before
    second = start(project).service
    assert second.instance_id != first.instance_id
    assert second.port == first.port
    assert (project.state / "connection.json").read_bytes() == conn_before


def test_clean_stop_seals_the_log(project: Project) -> None:
    service = start(project).service
    assert stop_service(project.root) is True
    assert service.log_file is not None
    path = project.state / "logs" / service.log_file
    assert stat.S_IMODE(path.stat().st_mode) == 0o400
    events = [line["event"] for line in _log_lines(project, service.log_file)]
    assert events[0] == "log_opened"
    assert events[-1] == "log_closed"
    assert "service_ready" in events and "service_stopped" in events
    for line in _log_lines(project, service.log_file):
        assert {"time", "level", "event"} <= set(line)
    # The token never reaches the log.
    token = metadata(project, "connection.json")["token"]
    assert token not in path.read_text()


def test_stop_when_offline_creates_nothing(project: Project) -> None:
    before = snapshot_files(project.root)
    assert stop_service(project.root) is False
    assert stop_service(project.root) is False
    assert snapshot_files(project.root) == before
    assert not project.state.exists()


def test_stop_of_a_path_that_is_no_project_says_so_not_offline(project: Project) -> None:
    """stop_service of a subdirectory of a project, or a typo, answered False ("nothing was
    running"), also while the project's host ran: the CLI's --project refuses such a path.
    It is CLI_PROJECT_INVALID, naming the project to pass, and creates nothing."""
    inside = project.root / "workflows"
    before = snapshot_files(project.root)
    with pytest.raises(IntloomError) as refused:
        stop_service(inside)
    assert refused.value.code == "CLI_PROJECT_INVALID"
    assert refused.value.message == (
        f"{inside} has no intloom.toml: it is inside the project {project.root}. stop_service "
        "takes a project's root, the directory that holds intloom.toml: pass "
        f"{project.root}. Nothing was sent.")
    with pytest.raises(IntloomError, match="does not exist"):
        stop_service(project.root / "nope")
    with pytest.raises(IntloomError, match=r"\. start_service takes a project's root"):
        start_service(inside)
    assert snapshot_files(project.root) == before


def test_stop_twice_is_offline_the_second_time(project: Project) -> None:
    pid = start(project).service.pid
    # A stop given no time sends nothing; it said "Run intloom doctor", which finds nothing.
    with pytest.raises(IntloomError) as late:
        stop_service(project.root, timeout=0)
    assert late.value.code == "CLI_SERVICE_TIMEOUT"
    assert late.value.message == (
        f"The stop request was not sent: the time ran out (0 s) before the host (pid {pid}) "
        "could be reached, so it runs on as it was. Run intloom stop again with a longer "
        "--timeout (the default is 10 s)."), late.value
    assert pid_alive(pid)
    assert stop_service(project.root) is True
    assert stop_service(project.root) is False


def _concurrently(fns: list[Callable[[], Any]]) -> list[Any]:
    results: list[Any] = [None] * len(fns)
    barrier = threading.Barrier(len(fns))

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = fns[i]()
        except BaseException as exc:  # collected and asserted on by the caller
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=50)
    return results


def test_concurrent_starts_make_one_host(project: Project) -> None:
    results = _concurrently([lambda: start_service(project.root) for _ in range(3)])
    for r in results:
        assert isinstance(r, StartResult), r
        project.pids.add(r.service.pid)
    assert len({r.service.instance_id for r in results}) == 1
    assert sorted(r.reused for r in results) == [False, True, True]
    assert metadata(project, "service.lock")["instanceId"] == results[0].service.instance_id


def test_concurrent_stops_both_succeed(project: Project) -> None:
    service = start(project).service
    results = _concurrently([lambda: stop_service(project.root) for _ in range(2)])
    # Both succeed; one may find the host already gone (offline), never an error.
    assert all(r is True or r is False for r in results), results
    assert True in results
    eventually(lambda: not pid_alive(service.pid), timeout=10, what="the host to exit")
    assert not (project.state / "service.json").exists()
    assert not (project.state / "service.lock").exists()


def test_a_stop_whose_connection_the_stopping_host_closed_waits_for_it(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two stops at once: the second connected (hello done) just before the first began the
    stop, which closes every connection, so its request finds the connection closed and
    connecting again refused (the host is stopping): nothing was sent. That stop must wait
    for the host to release the project like the first, not fail "rejected shutdown"
    (2 in 25 runs of the test above under load)."""
    service = start(project).service
    real = Client.stop

    def after_the_other_stop_began(self: Client, instance_id: str) -> bool:
        with Client.connect(project.root) as other:
            assert real(other, instance_id) is True
        # Until the stopping host has closed this client's idle connection.
        eventually(lambda: connection_closed(self), timeout=10,
                   what="the host to close the connection")
        return real(self, instance_id)

    monkeypatch.setattr(Client, "stop", after_the_other_stop_began)
    assert stop_service(project.root) is True
    # Released its files; the process itself may take a moment more to exit.
    eventually(lambda: not pid_alive(service.pid), timeout=10, what="the host to exit")
    assert not (project.state / "service.json").exists()


def test_invalid_config_fails_start_and_leaves_no_lock(project: Project) -> None:
    (project.root / "intloom.toml").write_text('workflows = []\nbogus = 1\n')
    with pytest.raises(IntloomError) as failed:
        start(project)
    assert failed.value.code == "INVALID_REQUEST"
    assert "bogus" in failed.value.message
    assert not (project.state / "service.lock").exists()
    assert not (project.state / "service.json").exists()


def test_occupied_saved_port_fails_start_with_a_clear_error(project: Project) -> None:
    service = start(project).service
    assert stop_service(project.root) is True
    with socket.create_server(("127.0.0.1", service.port)):
        with pytest.raises(IntloomError) as failed:
            start(project)
        assert failed.value.code == "CLI_SERVICE_UNAVAILABLE"
        assert str(service.port) in failed.value.message
    assert not (project.state / "service.lock").exists()
    # --port 0 picks a fresh port and records it, keeping the token.
    token = metadata(project, "connection.json")["token"]
    fresh = start(project, port=0).service
    assert metadata(project, "connection.json") == {
        "version": 1, "projectRoot": str(project.root.resolve()), "port": fresh.port,
        "token": token,
    }


def test_port_0_in_intloom_toml_picks_a_port_once_and_later_starts_reuse_it(
    project: Project,
) -> None:
    """The template says of intloom.toml's port "0 or absent: pick a free port once", and
    DESIGN reuses connection.json's port at every later start; with ``port = 0`` every start
    picked a new one, so a client given the port lost the host after each restart (and
    after a crash, recover + start broke recovery.md's "same port, same token")."""
    config = project.root / "intloom.toml"
    config.write_text(config.read_text() + "port = 0\n")
    first = start(project).service
    assert stop_service(project.root) is True
    again = start(project).service
    assert again.port == first.port
    assert metadata(project, "connection.json")["port"] == first.port


def _slow_import(project: Project, line: str) -> bytes:
    """Make the example Workflow run ``line`` at import time; returns the original source."""
    path = project.root / "workflows" / "example.py"
    original = path.read_bytes()
    path.write_bytes(original.replace(b"import msgspec\n", b"import msgspec\n" + line.encode()
                                      + b"\n", 1))
    return original


def test_a_start_deadline_during_a_slow_workflow_import_leaves_no_lock(
    project: Project,
) -> None:
    original = _slow_import(project, "import time; time.sleep(30)")
    with pytest.raises(IntloomError) as timed_out:
        start_service(project.root, timeout=2)
    project.track_host()
    error = timed_out.value
    assert error.code == "CLI_SERVICE_TIMEOUT"
    assert "stopped and released its files" in error.message
    # The SIGTERM interrupted the import: the host released everything itself.
    assert not (project.state / "service.lock").exists()
    assert not (project.state / "service.json").exists()
    (log,) = (project.state / "logs").iterdir()
    events = [line["event"] for line in _log_lines(project, log.name)]
    assert "startup_interrupted" in events and events[-1] == "log_closed"
    (project.root / "workflows" / "example.py").write_bytes(original)
    assert start(project).reused is False  # not CLI_SERVICE_BUSY


def test_a_host_killed_at_the_start_deadline_is_reported_with_its_lock_and_recover(
    project: Project, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The host ignores SIGTERM, so the launcher waits out its whole SIGTERM grace before the
    # SIGKILL: a shorter grace reaches the same kill without 3 s of waiting.
    monkeypatch.setattr(lifecycle, "_TERMINATE_GRACE", 0.5)
    start(project)
    assert stop_service(project.root)  # connection.json exists, so recover can clean up
    # A module that ignores SIGTERM: only the launcher's SIGKILL ends this host.
    original = _slow_import(
        project, "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "time.sleep(30)")
    with pytest.raises(IntloomError) as timed_out:
        start_service(project.root, timeout=2)
    project.track_host()
    error = timed_out.value
    assert error.code == "CLI_SERVICE_TIMEOUT"
    assert "was killed" in error.message and "has been stopped" not in error.message
    assert str(project.state / "service.lock") in error.message
    assert "intloom recover" in error.message
    pid = metadata(project, "service.lock")["pid"]
    assert f"pid {pid}" in error.message and not pid_alive(pid)
    (project.root / "workflows" / "example.py").write_bytes(original)
    recovered = project.cli("--json", "recover")
    assert recovered.code == 0, recovered
    assert not (project.state / "service.lock").exists()
    assert start(project).reused is False


def test_a_stop_that_waits_out_the_start_up_reports_what_the_stop_did_to_the_runs(
    project: Project, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stop that finds the host still starting (only service.lock) sends its request once
    the host serves, but read no log: it said "Unfinished Runs were suspended" with
    ``suspended: null`` and no cut Runs, whatever the host's log said of them."""
    hold = project.root / "hold"
    _slow_import(project, "import pathlib, time\n"
                 "while (pathlib.Path(__file__).parent.parent / 'hold').exists(): "
                 "time.sleep(0.01)")
    start(project)
    with Client.connect(project.root) as client:
        assert client.create_run("example", "notes").status == "waiting"
    assert stop_service(project.root) is True
    hold.write_text("")  # the next start waits in the import until it is gone
    started: list[StartResult] = []
    starting = threading.Thread(
        target=lambda: started.append(start_service(project.root, timeout=60)))
    starting.start()
    try:
        eventually(lambda: (project.state / "service.lock").exists(), timeout=30,
                   what="the host to take its lock")
        project.track_host()
        assert not (project.state / "service.json").exists()  # still starting
        real = lifecycle._released

        def released(*args: Any) -> bool:
            hold.unlink(missing_ok=True)  # the stop has observed the start-up: let it serve
            return real(*args)

        monkeypatch.setattr(lifecycle, "_released", released)
        result = lifecycle.stop_service_report(project.root, timeout=60)
    finally:
        hold.unlink(missing_ok=True)
        starting.join(timeout=60)
    restore = started[0].service.restore if started else None
    assert restore is not None and len(restore.waiting) == 1, started
    assert result.stopped is True
    assert result.suspended == 1, result  # the restored waiting Run, from the host's log


def _held_start(project: Project) -> tuple[Path, threading.Thread, list[Any]]:
    """A start (on a thread) whose host waits in its Workflow's import while ``hold`` exists;
    returns ``hold``, the thread and what the start came to, once the host holds its lock."""
    hold = project.root / "hold"
    _slow_import(project, "import pathlib, time\n"
                 "while (pathlib.Path(__file__).parent.parent / 'hold').exists(): "
                 "time.sleep(0.01)")
    hold.write_text("")
    starting, started = start_on_a_thread(project, timeout=60)
    eventually(lambda: (project.state / "service.lock").exists(), timeout=30,
               what="the host to take its lock")
    project.track_host()
    return hold, starting, started


def test_a_stop_without_timeout_waits_for_a_host_still_starting_and_stops_it(
    project: Project, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stop during a start that takes longer than the stop's 10 s (a slow import) gave up
    with CLI_SERVICE_TIMEOUT, its request unsent, and the host then served on. It now waits
    for the host to serve, up to 300 s as a start does, and then stops it."""
    monkeypatch.setattr(lifecycle, "_STOP_TIMEOUT", 0.3)  # the old deadline, passed below
    hold, starting, started = _held_start(project)
    told: list[str] = []
    began = [0.0]
    real = lifecycle._released

    def released(*args: Any) -> bool:
        # Each poll of the stop: the import goes on until the stop's old deadline is past.
        if began[0] == 0.0:
            began[0] = time.monotonic()
        elif time.monotonic() - began[0] > 1.5:  # past the old deadline and the note
            hold.unlink(missing_ok=True)
        return real(*args)

    monkeypatch.setattr(lifecycle, "_released", released)
    try:
        pid = metadata(project, "service.lock")["pid"]
        result = lifecycle.stop_service_report(project.root, starting=told.append)
    finally:
        hold.unlink(missing_ok=True)
        starting.join(timeout=60)
    assert result.stopped is True
    assert told == [f"The service (pid {pid}) is still starting: it is asked to stop once "
                    "it serves."]
    assert len(started) == 1 and isinstance(started[0], StartResult), started  # it served
    assert not (project.state / "service.lock").exists()
    # The lock is let go before the interpreter's own exit, which a loaded machine stretches.
    eventually(lambda: not pid_alive(pid), timeout=20, what=f"host {pid} to exit")


def test_a_stop_that_times_out_on_a_starting_host_gives_its_pid_to_stop_the_start(
    project: Project,
) -> None:
    """The timeout said "Run intloom doctor", which finds a live owner and nothing wrong. It
    now says the host was still starting, that nothing was sent, and how to stop the start:
    the kill -TERM it names ends it."""
    hold, starting, started = _held_start(project)
    try:
        pid = metadata(project, "service.lock")["pid"]
        stopped = project.cli("stop", "--timeout", "1.5")
        assert stopped.code == 1, stopped
        assert "CLI_SERVICE_TIMEOUT" in stopped.stderr
        assert (f"The service (pid {pid}) is still starting: it is asked to stop once it "
                "serves.") in stopped.stderr
        said = " ".join(stopped.stderr.split())
        assert f"The host (pid {pid}) was still starting after 1.5 s" in said
        assert "the stop request was not sent" in said and "intloom doctor" not in said
        assert f"kill -TERM {pid}" in said
        assert pid_alive(pid)  # a stop never signals
        os.kill(pid, signal.SIGTERM)  # what the message says to do
        starting.join(timeout=60)
    finally:
        hold.unlink(missing_ok=True)
        starting.join(timeout=60)
    assert len(started) == 1 and isinstance(started[0], IntloomError), started
    assert started[0].code == "CLI_SERVICE_CLOSING", started[0]
    eventually(lambda: not pid_alive(pid), timeout=30, what="the host to exit")
    assert not (project.state / "service.lock").exists()


def test_a_clean_stop_with_an_open_connection_logs_no_error(project: Project) -> None:
    """The stop cancels the sessions still open; that is no task error in the log."""
    service = start(project).service
    idle = socket.create_connection(("127.0.0.1", service.port))  # never says hello
    try:
        assert stop_service(project.root) is True
    finally:
        idle.close()
    assert service.log_file is not None
    lines = _log_lines(project, service.log_file)
    assert [line for line in lines if line["level"] in ("error", "fatal")] == [], lines
    assert lines[-1]["event"] == "log_closed"


@pytest.mark.parametrize("cut", [
    IntloomError("CLI_SERVICE_UNAVAILABLE", "The service at 127.0.0.1:1 did not complete the "
                 "hello (the connection was closed): ..."),
    IntloomError("PROJECT_CONNECTION_FAILED", "The host closed this client's connection, and "
                 "connecting again failed (CLI_SERVICE_OFFLINE: ...) Nothing was sent."),
])
def test_start_whose_connection_a_stopping_host_cuts_waits_and_launches(
    project: Project, monkeypatch: pytest.MonkeyPatch, cut: IntloomError
) -> None:
    """A start during a stop: the stopping host closes every connection (this start's, mid-
    hello or before its status request) before it removes its files. start failed with that
    cut connection ("another program on the port ... run intloom doctor", or "connecting
    again failed"; 2 starts in 150 when run while a stop finished); it now waits for the
    stopping host to release the project, then launches."""
    from intloom.client import lifecycle

    old = start(project).service
    real = lifecycle._live_service
    calls: list[int] = []

    def cut_by_the_stop(root: Any) -> Any:
        if not calls:
            calls.append(1)
            with Client.connect(project.root) as client:
                client.stop(old.instance_id)
            raise cut  # what the host closing our connection made of it
        return real(root)

    monkeypatch.setattr(lifecycle, "_live_service", cut_by_the_stop)
    result = start(project, timeout=60)
    assert calls == [1]
    assert result.reused is False
    assert result.service.instance_id != old.instance_id
    assert metadata(project, "service.json")["instanceId"] == result.service.instance_id


def test_start_against_a_hung_host_still_reports_it(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not every cut connection is a stop: a host that is not stopping is reported as it is,
    within a moment, and nothing is launched over it."""
    from intloom.client import lifecycle

    old = start(project).service

    def hung(root: Any) -> Any:
        raise IntloomError("CLI_SERVICE_UNAVAILABLE", "did not complete the hello (timed out)")

    monkeypatch.setattr(lifecycle, "_live_service", hung)
    with pytest.raises(IntloomError) as failed:
        start_service(project.root, timeout=30)
    assert failed.value.code == "CLI_SERVICE_UNAVAILABLE"
    assert metadata(project, "service.json")["instanceId"] == old.instance_id


def test_a_stop_whose_dead_host_another_command_cleans_up_claims_no_stop(
    project: Project, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A SIGKILLed host's files, removed by intloom recover while a stop polled (recover
    holds the OS lock, so the stop could not call them leftovers): the stop said "The
    original service instance stopped", of a host that had crashed. Nothing ran to stop: it
    says what it says once recover is done, that the service is not running."""
    import fcntl

    start(project)
    with Client.connect(project.root) as client:
        assert client.create_run("example", "notes").status == "waiting"
    project.kill_host()
    lock = os.open(project.state / "service.lock", os.O_RDONLY)
    real = lifecycle._released

    def released(*args: Any) -> bool:
        # What recover does under the OS lock, after the stop observed the files.
        (project.state / "service.json").unlink(missing_ok=True)
        (project.state / "service.lock").unlink(missing_ok=True)
        return real(*args)

    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        monkeypatch.setattr(lifecycle, "_released", released)
        result = lifecycle.stop_service_report(project.root, timeout=10)
    finally:
        os.close(lock)
    assert result.stopped is False, result


def test_a_starting_host_that_exits_unasked_is_not_said_to_have_lost_its_log(
    project: Project, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stop waiting for a host still starting, whose start is then given up (start
    --timeout, a Ctrl-C: the host gets SIGTERM and exits before it serves): the stop said its
    log "does not say what the stop did to the unfinished Runs (... as on a full disk)". The
    host never served, took on no Run, and was not stopped by this stop; it says so."""
    from intloom.cli.commands.service import stop_fields, stop_lines

    hold, starting, _started = _held_start(project)
    pid = metadata(project, "service.lock")["pid"]
    real = lifecycle._released

    def released(*args: Any) -> bool:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)  # what a start that gives up does to its host
        return real(*args)

    monkeypatch.setattr(lifecycle, "_released", released)
    try:
        result = lifecycle.stop_service_report(project.root, timeout=30)
    finally:
        hold.unlink(missing_ok=True)
        starting.join(timeout=60)
    assert (result.stopped, result.served, result.suspended) == (True, False, 0), result
    [line] = stop_lines(result)
    assert line.startswith("The original service instance stopped. It exited before it ever "
                           "served requests (its start was given up, or failed), not asked "
                           "by this stop"), line
    assert "full disk" not in line
    assert stop_fields(result)["served"] is False


def test_start_and_stop_refuse_at_once_a_starting_host_that_is_paused(
    project: Project,
) -> None:
    """A host paused (SIGSTOP) while it started: start and stop waited for it, silent, for
    300 s, and start's note advised kill -TERM, which a stopped process does not take until
    it is resumed. Both now say at once that it is paused, and how to go on."""
    hold, starting, started = _held_start(project)
    pid = metadata(project, "service.lock")["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(IntloomError) as stop_refused:
            lifecycle.stop_service_report(project.root, timeout=60)
        with pytest.raises(IntloomError) as start_refused:
            start_service(project.root, timeout=60)
    finally:
        os.kill(pid, signal.SIGCONT)
        hold.unlink(missing_ok=True)
        starting.join(timeout=60)
    for refused, doing in ((stop_refused.value, "Nothing was sent"),
                           (start_refused.value, "did not start a second host")):
        assert refused.code == "CLI_SERVICE_UNAVAILABLE", refused
        message = refused.message
        assert f"host (pid {pid}) is still starting" in message, message
        assert "stopped by a signal" in message and doing in message, message
        assert f"kill -CONT {pid}" in message, message
    assert len(started) == 1 and isinstance(started[0], StartResult), started  # it served
    assert stop_service(project.root) is True


def test_stop_refuses_at_once_a_live_lock_owner_that_does_not_hold_the_os_lock(
    project: Project,
) -> None:
    """A service.lock naming a live process that is no host (a forged lock, a .intloom/
    copied while its host started): start refused it at once, CLI_SERVICE_BUSY, but stop
    took it for a host still starting and waited its 300 s, then called it one."""
    import subprocess
    import sys

    from tests.unit.diagnostics_support import create_time, write_lock

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        write_lock(project.root, sleeper.pid, create_time(sleeper.pid))
        before = snapshot_files(project.state)
        with pytest.raises(IntloomError) as refused:  # not CLI_SERVICE_TIMEOUT, waited out
            lifecycle.stop_service_report(project.root, timeout=20)
        assert refused.value.code == "CLI_SERVICE_BUSY", refused.value
        assert "Run intloom doctor" in refused.value.message, refused.value.message
        assert snapshot_files(project.state) == before  # nothing touched
    finally:
        sleeper.kill()
        sleeper.wait()


def test_doctor_gives_a_live_host_whose_connection_json_is_gone_a_way_out_that_works(
    project: Project,
) -> None:
    """connection.json moved away while the host runs: doctor's connection check said to put
    it back "then run intloom recover", which refuses a running host (its owner checks said
    to leave the files alone). It now names the host and the kill -TERM that stops it."""
    from intloom.diagnostics import run_doctor

    pid = start(project).service.pid
    moved = project.root / "connection.json.moved"
    (project.state / "connection.json").rename(moved)
    try:
        check = {c.id: c for c in run_doctor(project.root).checks}["connection"]
    finally:
        moved.rename(project.state / "connection.json")
    assert check.status == "attention", check
    assert f"live owner (pid {pid})" in check.message, check.message
    assert check.next is not None and "intloom recover" not in check.next, check.next
    assert f"kill -TERM {pid}" in check.next, check.next
    assert stop_service(project.root) is True


def test_a_test_only_setting_is_logged_and_a_bad_one_named(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """The INTLOOM_TEST_* and INTLOOM_FAULT settings change what a host does (a lower
    connection cap, an injected crash) and a stray export of one said so nowhere; one that
    was not a number failed the start CLI_INTERNAL_ERROR (exit 70), naming nothing."""
    monkeypatch.setenv("INTLOOM_TEST_HELLO_TIMEOUT", "abc")
    failed = project.cli("start", "--json")
    assert failed.code == 1, (failed.stdout, failed.stderr)
    error = failed.json["error"]
    assert error["code"] == "INVALID_REQUEST", error
    assert error["message"] == (
        "INTLOOM_TEST_HELLO_TIMEOUT='abc' is not a number. It is a test-only setting of the "
        "host: unset it (unset INTLOOM_TEST_HELLO_TIMEOUT) and start again."), error
    monkeypatch.setenv("INTLOOM_TEST_HELLO_TIMEOUT", "20")
    start(project)
    lines = [json.loads(line) for line in project.cli("logs", "--json").stdout.splitlines()]
    armed = [line for line in lines if line["event"] == "test_hooks_armed"]
    assert len(armed) == 1 and "INTLOOM_TEST_HELLO_TIMEOUT=20" in armed[0]["hooks"], armed
    assert armed[0]["level"] == "warning"
