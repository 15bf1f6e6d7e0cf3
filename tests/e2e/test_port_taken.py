"""After a crash, another program on the project's saved port: status, doctor and recover
name the port and the program (never "a hung host"), doctor does not recommend a recover
that would refuse, and recover refuses with the documented message, touching nothing.

Real host killed by SIGKILL; real listeners in this process (one that accepts and never
replies, one that replies garbage), closed in ``finally``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from intloom.host.metadata import CREATE_TIME_TOLERANCE
from tests.helpers import Project, eventually, junk_listener, make_project, snapshot_files

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@contextlib.contextmanager
def silent_listener(port: int) -> Iterator[None]:
    """Accepts (the kernel completes the handshake) and never says a word."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(8)
    try:
        yield
    finally:
        sock.close()


def garbage_listener(port: int) -> contextlib.AbstractContextManager[None]:
    """Answers every connection with bytes that are no frame, then closes it."""
    return junk_listener(port, b"HTTP/1.0 400 Bad Request\r\n\r\nnot intloom\n" * 4)


@pytest.mark.parametrize("listener", [silent_listener, garbage_listener])
def test_a_foreign_listener_on_the_saved_port_is_named_and_recover_refuses(
    project: Project, listener: Callable[[int], contextlib.AbstractContextManager[None]],
) -> None:
    assert project.cli("start").code == 0
    port = json.loads((project.state / "connection.json").read_text())["port"]
    dead = project.kill_host()
    before = snapshot_files(project.state)

    with listener(port):
        status = project.cli("status", "--json")
        doctor = project.cli("doctor", "--json")
        refused = project.cli("recover", "--json")
        dry = project.cli("recover", "--dry-run", "--json")

    assert status.code == 0, status.stderr
    assert status.json["status"] == "blocked"
    message = status.json["message"]
    assert f"Port {port} on 127.0.0.1" in message and "in use by another process" in message
    # The listener, named by its process name only (never its command line).
    assert f"pid {os.getpid()} ({psutil.Process().name()})" in message, message
    assert " ".join(psutil.Process().cmdline()) not in message
    assert f"the recorded host (pid {dead}) has exited" in message
    assert "did not complete the hello" not in message and "hung" not in message
    assert {o["status"] for o in status.json["owners"]} == {"absent"}

    assert doctor.code == 4, doctor.stdout
    owners = [c for c in doctor.json["checks"] if c["id"].startswith("owner.")]
    assert len(owners) == 2
    for check in owners:
        assert check["status"] == "attention"
        assert f"port {port}" in check["message"] and "recover refuses" in check["message"]
        assert check["next"].startswith(f"Stop the process on port {port}"), check["next"]

    for result in (refused, dry):
        assert result.code == 1, result.stdout
        error = result.json["error"]
        assert error["code"] == "CLI_RECOVERY_BLOCKED"
        assert error["message"].startswith(
            "The project port is in use or unavailable. No recovery performed."
        ), error["message"]
        assert f"ss -ltnp 'sport = :{port}'" in error["message"]
        assert f"pid {os.getpid()}" in error["message"]
    assert snapshot_files(project.state) == before  # nothing touched

    # With the port free again, the ordinary path works: recover, then start.
    assert project.cli("recover", "--json").json["recovered"] is True
    assert project.cli("start").code == 0


def _recorded(port: int, command: Callable[[], Any]) -> tuple[Any, bytes]:
    """``command()``'s result, and every byte a listener on ``port`` (in this process)
    received while it ran."""
    received: list[bytes] = []
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(8)
    sock.settimeout(0)  # only ever polled, below: whatever connected is already queued
    try:
        result = command()
        with contextlib.suppress(BlockingIOError):
            while True:
                conn, _ = sock.accept()
                with conn:
                    conn.settimeout(1.0)
                    with contextlib.suppress(OSError):
                        received.append(conn.recv(65536))
    finally:
        sock.close()
    return result, b"".join(received)


def test_a_command_never_hands_the_token_to_a_program_on_a_dead_hosts_port(
    project: Project,
) -> None:
    assert project.cli("start").code == 0
    connection = json.loads((project.state / "connection.json").read_text())
    dead = project.kill_host()  # waits until the pid is gone and the port is free
    runs, received = _recorded(connection["port"], lambda: project.cli("runs", "--json"))
    assert runs.code == 1, runs.stdout
    error = runs.json["error"]
    assert error["code"] == "CLI_SERVICE_OFFLINE", error
    # Gone, or exited and not yet reaped (a zombie), as doctor would also say.
    assert (f"names pid {dead}, which no longer exists" in error["message"]
            or f"names pid {dead}, which has exited (a zombie" in error["message"]), error
    assert "Nothing was sent" in error["message"]
    # Its service.lock's owner is as provably gone: the way out is named, not another hop
    # through intloom status (which said "Run intloom status" before 2026-12-04).
    assert error["message"].endswith("Run intloom recover (intloom doctor says what it "
                                     "removes), then intloom start."), error
    assert received == b"", "a client connected to the program on the dead host's port"


def test_a_reused_pid_on_the_dead_hosts_port_is_not_handed_the_token(
    project: Project,
) -> None:
    """The dead host's pid now belongs to another live process -- this one, which also
    holds the port: pid and port both match, only the create time tells them apart."""
    # Only when they are further apart than the tolerance: run alone (-n 0), this process
    # could be under a second older than the host, which then reads as the same process.
    me = psutil.Process()
    eventually(lambda: time.time() - me.create_time() > 2 * CREATE_TIME_TOLERANCE,
               timeout=10, what="this process to be older than the create-time tolerance")
    assert project.cli("start").code == 0
    connection = json.loads((project.state / "connection.json").read_text())
    project.kill_host()
    service = project.state / "service.json"
    info = json.loads(service.read_text())
    info["pid"] = os.getpid()  # the recorded createTime stays the dead host's
    service.write_text(json.dumps(info))
    runs, received = _recorded(connection["port"], lambda: project.cli("runs", "--json"))
    assert runs.code == 1, runs.stdout
    error = runs.json["error"]
    assert error["code"] == "CLI_SERVICE_OFFLINE", error
    assert f"names pid {os.getpid()}, which now belongs to another process" in error["message"]
    assert "Nothing was sent" in error["message"]
    assert connection["token"].encode() not in received
    assert received == b""


def test_a_live_host_whose_create_time_moved_is_still_reached(project: Project) -> None:
    """A stepped wall clock moves the boot time every create time is derived from: the
    recorded createTime no longer matches the live host's. It still holds its OS lock, so
    the client goes on to the hello (whose identity check decides) instead of calling it
    gone and locking the user out."""
    assert project.cli("start").code == 0
    service = project.state / "service.json"
    info = json.loads(service.read_text())
    info["createTime"] += 5.0
    service.write_text(json.dumps(info))
    runs = project.cli("runs", "--json")
    assert runs.code == 0, runs.stdout
    assert project.cli("stop").code == 0


def test_doctor_says_the_next_start_fails_on_a_saved_port_another_program_took(
    project: Project,
) -> None:
    """A clean stop, then another program takes the saved port: doctor said healthy (exit 0,
    "connection · ok") while the next intloom start was bound to fail on that port. It now
    names the port and the program, with the fix, and exits 3."""
    assert project.cli("start").code == 0
    assert project.cli("stop").code == 0
    port = json.loads((project.state / "connection.json").read_text())["port"]
    before = snapshot_files(project.state)
    with silent_listener(port):
        doctor = project.cli("doctor", "--json")
        assert snapshot_files(project.state) == before
        started = project.cli("start", "--json")
    assert started.code == 1 and started.json["error"]["code"] == "CLI_SERVICE_UNAVAILABLE"
    assert doctor.code == 3, doctor.stdout
    assert doctor.json["health"] == "attention"
    [check] = [c for c in doctor.json["checks"] if c["id"] == "connection"]
    assert check["status"] == "attention", check
    assert f"Port {port} on 127.0.0.1" in check["message"], check
    assert f"pid {os.getpid()}" in check["message"], check
    assert "intloom start --port 0" in check["next"], check
    assert project.cli("doctor", "--json").code == 0  # the port free again: healthy


def test_a_first_start_under_the_test_ports_hook_listens_on_a_port_of_that_range(
        project: Project) -> None:
    """INTLOOM_TEST_PORTS reaches the host through the launcher: the port a first start
    picks (port 0) is one of the range's, saved and served (the suite's xdist workers rely
    on it to keep out of each other's saved ports)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    started = project.cli("start", "--json", env={"INTLOOM_TEST_PORTS": f"{free}-{free}"})
    assert started.code == 0, started.stderr
    assert started.json["service"]["port"] == free
    assert json.loads((project.state / "connection.json").read_text())["port"] == free
    assert project.cli("status", "--json").json["service"]["port"] == free


def test_a_taken_port_that_intloom_toml_sets_is_fixed_there(project: Project) -> None:
    """The refusal said "run intloom start --port 0", which helps once: intloom.toml's port
    wins over the saved one, so every later start failed again. The fix now follows where
    the port came from."""
    config = project.root / "intloom.toml"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        config.write_text(config.read_text() + f"port = {port}\n")
        refused = project.cli("start", "--json")
    assert refused.code == 1, refused.stdout
    assert refused.json["error"]["code"] == "CLI_SERVICE_UNAVAILABLE"
    message = refused.json["error"]["message"]
    assert f"127.0.0.1:{port}" in message and f"change port in {config}" in message, message
    # --port 0 alone would not help (every later start takes intloom.toml's port again);
    # nor would 0 there, which reuses the saved port: this very one.
    assert message.count("--port 0") == 1 and "remove it and run intloom start --port 0" \
        in message and "(0, " not in message, message
    # The listener is this test's process: named, and no comma before the verb.
    assert f"; pid {os.getpid()} ({psutil.Process().name()}) listens there" in message, message


def test_two_projects_set_to_one_port_name_the_project_that_holds_it(
        project: Project, tmp_path: Path) -> None:
    """Two projects whose intloom.toml set the same port: the second start said only
    "Address already in use", leaving the user to find which of their projects holds it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    other = make_project(tmp_path / "second")
    for each in (project, other):
        config = each.root / "intloom.toml"
        config.write_text(config.read_text() + f"port = {port}\n")
    try:
        assert project.cli("start").code == 0
        refused = other.cli("start", "--json")
    finally:
        other.reap()
    assert refused.code == 1, refused.stdout
    assert refused.json["error"]["code"] == "CLI_SERVICE_UNAVAILABLE"
    message = refused.json["error"]["message"]
    assert f"127.0.0.1:{port}" in message, message
    assert f"; pid {project.host_pid()} (" in message, message
    assert (f"), the intloom host of the project {project.root}, listens there (intloom "
            f"--project {project.root} stop frees it)") in message, message
    assert f"change port in {other.root / 'intloom.toml'}" in message, message


def _busy_after_a_crash(project: Project, command: str) -> tuple[int, int, str]:
    """Start a host, SIGKILL it, and run ``command`` while another program listens on the
    saved port: refused CLI_SERVICE_BUSY, nothing touched, no host launched. (The dead
    host's pid, the port, the refusal's message.)"""
    assert project.cli("start").code == 0
    port = json.loads((project.state / "connection.json").read_text())["port"]
    dead = project.kill_host()
    before = snapshot_files(project.state)
    with silent_listener(port):
        refused = project.cli(command, "--json")
    assert refused.code == 1, refused.stdout
    error = refused.json["error"]
    assert error["code"] == "CLI_SERVICE_BUSY"
    assert snapshot_files(project.state) == before
    return dead, port, error["message"]


def test_a_start_after_a_crash_names_the_program_on_the_saved_port(project: Project) -> None:
    """After a SIGKILL, another program on the saved port: status and doctor named it, but
    start said only "locked ... run intloom doctor", sending the reader to a recover that
    refuses. The refusal now names the port, its holder and the way out; it touches
    nothing."""
    dead, port, message = _busy_after_a_crash(project, "start")
    assert "Run intloom doctor; use intloom recover only after its owner has exited" in message
    assert f"Its owner (pid {dead}) has exited, but port {port} on 127.0.0.1" in message, message
    assert f"in use by another process (pid {os.getpid()} ({psutil.Process().name()}))" in message
    assert ("Stop that process (or wait until it has exited), then run intloom recover, then "
            "intloom start.") in message, message


def test_a_stop_after_a_crash_names_the_program_on_the_saved_port(project: Project) -> None:
    """The same for stop: "Its host has exited ... Run intloom doctor and explicitly recover"
    led to a recover that refuses on the taken port; the program is now named too."""
    dead, port, message = _busy_after_a_crash(project, "stop")
    assert f"Its host (pid {dead}) has exited and left" in message, message
    assert (f"it was killed or crashed. Every file was left as it is. But port {port} on "
            "127.0.0.1, this project's saved port, is in use by another process (pid "
            f"{os.getpid()} ({psutil.Process().name()}))") in message, message
    assert "Stop that process (or wait until it has exited), then run intloom recover" in message
