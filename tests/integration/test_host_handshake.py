"""The socket's front door: hello, token, protocol, and hostile or broken input.

Every test starts a real host (a detached subprocess) and talks to it over a real socket.
Whatever a peer sends, it may cost that peer its connection -- never the host.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from intloom.client.client import Client
from intloom.errors import IntloomError
from intloom.host.server import CONTROL_SLOTS, Limits
from intloom.protocol.messages import MAX_FRAME, PROTOCOL, ErrorReply, HelloOk, StatusReply
from tests.helpers import Project, eventually, one_source_project
from tests.integration.host_support import (
    closed,
    encode,
    error_code,
    frame,
    hello_frame,
    metadata,
    nested_body,
    raw,
    reply,
    serves,
    socket_closed,
    start,
    token_of,
)


def _greeted(project: Project, port: int, n: int) -> list[socket.socket]:
    """``n`` connections that said hello with the project's token and were greeted: each
    holds one of the host's connection slots until closed."""
    greeted = []
    for _ in range(n):
        sock = raw(port)
        greeted.append(sock)
        sock.sendall(hello_frame(token_of(project)))
        assert isinstance(reply(sock), HelloOk)
    return greeted


def test_hello_ok_matches_service_json(project: Project) -> None:
    service = start(project).service
    with Client.connect(project.root) as client:
        assert client.hello.instance_id == service.instance_id
        assert client.hello.pid == service.pid
        assert client.hello.project_root == str(project.root)
        assert client.hello.protocol == PROTOCOL
        status = client.status()
    assert status.instance_id == service.instance_id
    assert status.port == service.port


def test_wrong_token_is_refused_and_closed_host_still_serves(project: Project) -> None:
    service = start(project).service
    with raw(service.port) as sock:
        sock.sendall(hello_frame("x" * 43))
        assert error_code(reply(sock)) == "UNAUTHORIZED"
        assert closed(sock)
    assert serves(project.root, service.instance_id)


def test_a_peer_without_the_token_learns_nothing_of_the_host(project: Project) -> None:
    """A wrong protocol was answered before the token was checked, naming the host's pid
    and intloom version to a peer that had no token."""
    service = start(project).service
    with raw(service.port) as sock:
        sock.sendall(hello_frame("x" * 43, protocol=PROTOCOL + 1))
        response = reply(sock)
        assert error_code(response) == "UNAUTHORIZED"
        assert closed(sock)
    assert isinstance(response, ErrorReply)
    assert str(service.pid) not in response.error.message, response.error.message
    assert serves(project.root, service.instance_id)


def test_wrong_protocol_is_refused(project: Project) -> None:
    service = start(project).service
    with raw(service.port) as sock:
        sock.sendall(hello_frame(token_of(project), protocol=PROTOCOL + 1))
        response = reply(sock)
        assert error_code(response) == "PROTOCOL_MISMATCH"
        assert closed(sock)
    assert serves(project.root, service.instance_id)
    # A client of another intloom prints these words as they are: which intloom the host is
    # and how to restart it with the client's, not "restart the host with this version".
    assert isinstance(response, ErrorReply)
    message = response.error.message
    assert (f"protocol {PROTOCOL + 1}; this host (pid {service.pid}, intloom "
            f"{service.package_version}) speaks {PROTOCOL}") in message, message
    assert (f"(intloom stop) or kill -TERM {service.pid} (a graceful stop), then run intloom "
            "start with the client's") in message, message


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", id="http"),
        pytest.param(frame(b"\xc1\xc1\xc1garbage"), id="undecodable-body"),
        pytest.param((MAX_FRAME + 1).to_bytes(4, "big"), id="oversized-length"),
        # Before the hello, a frame may not be near MAX_FRAME: no unauthenticated peer can
        # make the host buffer megabytes (refused at the prefix, no body needed).
        pytest.param((Limits().hello_frame + 1).to_bytes(4, "big"), id="oversized-hello"),
        pytest.param(MAX_FRAME.to_bytes(4, "big"), id="max-frame-before-hello"),
        pytest.param(b"\x00\x00\x00\x00", id="zero-length"),
    ],
)
def test_garbage_first_frame_gets_an_error_and_close(project: Project, payload: bytes) -> None:
    service = start(project).service
    with raw(service.port) as sock:
        sock.sendall(payload)
        assert error_code(reply(sock)) == "INVALID_REQUEST"
        assert closed(sock)
    assert serves(project.root, service.instance_id)


def test_request_before_hello_is_refused(project: Project) -> None:
    service = start(project).service
    with raw(service.port) as sock:
        sock.sendall(encode({"op": "status"}))
        response = reply(sock)
        assert error_code(response) == "INVALID_REQUEST"
        assert "hello" in response.error.message  # type: ignore[union-attr]
        assert closed(sock)
    assert serves(project.root, service.instance_id)


def test_bad_request_after_hello_keeps_the_connection(project: Project) -> None:
    service = start(project).service
    with raw(service.port) as sock:
        sock.sendall(hello_frame(token_of(project)))
        assert isinstance(reply(sock), HelloOk)
        sock.sendall(encode({"op": "no_such_request"}))
        assert error_code(reply(sock)) == "INVALID_REQUEST"
        sock.sendall(frame(nested_body(100_000)))  # beyond msgspec's depth: RecursionError
        refused = reply(sock)
        assert error_code(refused) == "INVALID_REQUEST"
        assert "nested too deeply" in refused.error.message  # type: ignore[union-attr]
        # An id of megabytes: the error quoted it whole, a reply past the frame limit, sent
        # as RESPONSE_TOO_LARGE "please report it" and logged as a host fault.
        for op, size in (("get_run", MAX_FRAME - 64), ("subscribe", 1 << 20)):
            sock.sendall(encode({"op": op, "runId": "R" * size}))
            missing = reply(sock)
            assert error_code(missing) == "NOT_FOUND", missing
            message = missing.error.message  # type: ignore[union-attr]
            assert len(message) < 1000 and f"({size:,} characters)" in message, message
        sock.sendall(encode({"op": "status"}))
        answer = reply(sock)
        assert isinstance(answer, StatusReply)
        assert answer.service.instance_id == service.instance_id


def test_oversized_request_after_hello_closes_only_that_connection(project: Project) -> None:
    service = start(project).service
    with raw(service.port) as sock:
        sock.sendall(hello_frame(token_of(project)))
        assert isinstance(reply(sock), HelloOk)
        sock.sendall((MAX_FRAME + 1).to_bytes(4, "big") + b"\x00" * 1024)
        assert error_code(reply(sock)) == "INVALID_REQUEST"
        assert closed(sock)
    assert serves(project.root, service.instance_id)


def test_silent_and_half_sent_connections_are_closed_after_the_hello_timeout(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INTLOOM_TEST_HELLO_TIMEOUT", "0.5")
    service = start(project).service
    with raw(service.port) as silent, raw(service.port) as partial:
        partial.sendall(b"\x00\x00\x01\x00abc")  # a frame header that promises 256 bytes
        assert closed(silent)
        assert closed(partial)
    assert serves(project.root, service.instance_id)


def test_idle_authenticated_connection_is_closed(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INTLOOM_TEST_IDLE_TIMEOUT", "0.5")
    service = start(project).service
    with raw(service.port) as sock:
        sock.sendall(hello_frame(token_of(project)))
        assert isinstance(reply(sock), HelloOk)
        assert closed(sock)
    assert serves(project.root, service.instance_id)


def test_an_authenticated_peer_that_stops_mid_frame_is_closed_after_the_frame_timeout(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A frame begun and never finished held up to 4 MiB of the host's memory for the idle
    # timeout (600 s): 100 such peers took its RSS from 31 MiB to 432 MiB for ten minutes.
    # Once its length prefix has come, the rest must follow within the frame timeout.
    monkeypatch.setenv("INTLOOM_TEST_FRAME_TIMEOUT", "0.5")
    service = start(project).service
    with raw(service.port) as sock:
        sock.sendall(hello_frame(token_of(project)))
        assert isinstance(reply(sock), HelloOk)
        sock.sendall(frame(b"\x00" * 1_000_000)[:500_000])
        refused = reply(sock)
        assert error_code(refused) == "INVALID_REQUEST"
        message = refused.error.message  # type: ignore[union-attr]
        assert "of a frame of 1000000 bytes" in message, message
        assert "The connection was closed" in message, message
        assert closed(sock)
    assert serves(project.root, service.instance_id)


def test_a_client_whose_idle_connection_the_host_closed_connects_again_before_sending(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An Agent holding one Client across a long model call found its next request
    "PROJECT_REQUEST_FAILED ... the host may have stopped or crashed" once the host had
    closed the idle connection, with the host alive and the request never received. Nothing
    is sent on a connection the host has closed: the client connects again (to the same
    host instance) and the request goes through."""
    monkeypatch.setenv("INTLOOM_TEST_IDLE_TIMEOUT", "0.5")
    service = start(project).service
    with Client.connect(project.root) as client:
        first = client._sock
        assert first is not None
        first.settimeout(10)
        # Until the host's idle timeout closed it (an end of file waits in the socket).
        eventually(lambda: _eof_waiting(first), timeout=10, what="the idle close")
        assert client.status().instance_id == service.instance_id
        assert client._sock is not None and client._sock is not first


def _eof_waiting(sock: socket.socket) -> bool:
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except ConnectionResetError:
        return True


def test_peer_that_stops_reading_is_closed_after_the_write_timeout(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INTLOOM_TEST_WRITE_TIMEOUT", "0.5")
    service = start(project).service
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", service.port))
    outcome: list[BaseException] = []

    def flood() -> None:
        # Pipeline requests and never read a reply: the host's send buffer fills, its write
        # blocks, and only the write timeout can end the connection.
        status = encode({"op": "status"})
        try:
            sock.sendall(hello_frame(token_of(project)))
            while True:
                sock.sendall(status * 64)
        except OSError as exc:
            outcome.append(exc)

    with sock:
        sender = threading.Thread(target=flood, daemon=True)
        sender.start()
        sender.join(timeout=20)
        assert not sender.is_alive(), "the host never closed a peer that stopped reading"
    # Reset or broken pipe: the host closed the connection (a send timeout would mean it
    # kept it open, still blocked on the peer).
    assert outcome and not isinstance(outcome[0], TimeoutError), outcome
    assert serves(project.root, service.instance_id)


def start_limited(project: Project, descriptors: int) -> None:
    """``intloom start`` under ``ulimit -n descriptors``."""
    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors, descriptors))

    started = subprocess.run(
        [sys.executable, "-m", "intloom", "--project", str(project.root), "start", "--json"],
        preexec_fn=low_limit, capture_output=True, text=True, timeout=60,
        env={**os.environ, "NO_COLOR": "1"})
    project.track_host()
    assert started.returncode == 0, started.stderr


def test_a_host_short_of_descriptors_refuses_connections_saying_why(project: Project) -> None:
    # A host started under `ulimit -n 64`, then more clients than it has descriptors for.
    # Each must hear back -- served, or BUSY naming the limit and the fix -- instead of
    # waiting unaccepted for its hello to time out; and the log must not flood with one
    # line per failed accept (asyncio retries them every second: a thousand lines a second).
    start_limited(project, 64)
    port, token = metadata(project, "connection.json")["port"], token_of(project)
    socks = [raw(port) for _ in range(80)]
    try:
        for sock in socks:
            sock.sendall(hello_frame(token))
        replies = [reply(sock) for sock in socks]
    finally:
        for sock in socks:
            sock.close()
    busy = [r for r in replies if not isinstance(r, HelloOk)]
    assert busy and {error_code(r) for r in busy} == {"BUSY"}
    message = busy[0].error.message  # type: ignore[union-attr]
    assert "of its 64 file descriptors open" in message and "ulimit -n" in message, message
    assert f"kill -TERM {metadata(project, 'service.json')['pid']}" in message, message
    # Served again once the host has seen those connections close (it may not have yet).
    instance = metadata(project, "service.json")["instanceId"]
    eventually(lambda: _serves_quietly(project, instance), timeout=10,
               what="the host to serve once the clients closed")
    log = next((project.state / "logs").glob("LOG-*.jsonl")).read_text().splitlines()
    events = [json.loads(line)["event"] for line in log]
    assert "task_error" not in events
    assert events.count("connections_not_accepted") <= 1


_OPENER = textwrap.dedent("""
    import os
    from pathlib import Path

    import msgspec
    import intloom

    class S(msgspec.Struct):
        n: int = 0

    wf = intloom.Workflow("opener", version="1.0.0")
    st = wf.stage("work", state=S)

    @st.step("tick", routes={"again": "tick", "done": intloom.COMPLETE})
    def tick(ctx: intloom.StepContext[S]) -> str:
        os.close(os.open("opened.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        ctx.state = S(n=ctx.state.n + 1)
        return "done" if Path("enough").exists() else "again"
""")


def test_a_burst_of_connections_leaves_the_steps_their_descriptors(tmp_path: Path) -> None:
    """Under ulimit -n 64, bursts of 120 plain connects (no token needed) failed a Run that
    was stepping: its Step's open() got EMFILE. asyncio accepted up to 100 at a time before
    any reached the descriptor check; the check is now made as each is accepted."""
    project = one_source_project(tmp_path, "opener", _OPENER)
    try:
        start_limited(project, 64)
        flowed = project.cli("flow", "opener", "--intent", "open a file per Step", "--detach",
                             "--json")
        run_id = flowed.json["run"]["runId"]
        port = metadata(project, "connection.json")["port"]
        for _ in range(4):  # each burst of 120 passes the limit of 64 on its own
            burst = []
            for _ in range(120):
                with contextlib.suppress(OSError):  # refused or reset: the host's choice
                    burst.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            for sock in burst:
                sock.close()
        (project.root / "enough").touch()

        def ended() -> dict[str, Any] | None:
            # BUSY until the host has seen the burst's connections close.
            run: dict[str, Any] | None = project.cli("attach", run_id, "--json").json.get("run")
            return run if run is not None and run["status"] != "running" else None

        run = eventually(ended, timeout=30, what="the Run to end")
        assert run["status"] == "completed", run
        log = project.cli("logs", "--json").stdout.replace(" ", "")
        assert '"reason":"too_few_descriptors"' in log, "the bursts never reached the limit"
    finally:
        project.track_host()
        project.reap()


def test_connection_cap_refuses_the_extra_connection(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INTLOOM_TEST_MAX_CONNECTIONS", "3")
    service = start(project).service
    held: list[socket.socket] = []
    try:
        held.extend(_greeted(project, service.port, 3))
        # Past the cap, a connection is served a status or a stop only.
        with Client.connect(project.root) as client, pytest.raises(IntloomError) as refused:
            client.runs()
        assert refused.value.code == "BUSY"
        held.extend(_greeted(project, service.port, CONTROL_SLOTS))
        # Past those, the hello itself is refused.
        with pytest.raises(IntloomError) as refused:
            Client.connect(project.root)
        assert refused.value.code == "BUSY"
    finally:
        for sock in held:
            sock.close()
    # Freed slots are usable again.
    eventually(lambda: _serves_quietly(project, service.instance_id), timeout=10,
               what="the host to accept connections again")


def test_stop_and_status_still_work_when_the_connection_cap_is_reached(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A script that leaks its clients holds every slot for the idle timeout (600 s): stop
    # was refused BUSY ("The service rejected shutdown"), status said "blocked", and the
    # only way out was a signal. A stop or a status must still get through; other requests
    # stay refused, saying so.
    monkeypatch.setenv("INTLOOM_TEST_MAX_CONNECTIONS", "3")
    service = start(project).service
    held: list[socket.socket] = []
    try:
        held.extend(_greeted(project, service.port, 3))
        status = project.cli("status", "--json")
        assert status.code == 0, (status.stdout, status.stderr)
        assert status.json.get("service", {}).get("instanceId") == service.instance_id, (
            status.stdout)
        runs = project.cli("runs", "--json")
        assert runs.code == 1 and runs.json["error"]["code"] == "BUSY", runs.stdout
        message = runs.json["error"]["message"]
        assert "already serves 3 connections" in message, message
        assert "ListRuns request was refused; nothing was done" in message, message
        stopped = project.cli("stop", "--json")
        assert stopped.code == 0 and stopped.json["stopped"] is True, (stopped.stdout,
                                                                        stopped.stderr)
        # Every held connection is closed by the stop, not left to the idle timeout.
        assert all(closed(sock) for sock in held)
    finally:
        for sock in held:
            sock.close()
    assert not (project.state / "service.json").exists()


def test_a_stop_refused_at_the_connection_cap_says_how_to_stop_the_host(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With every slot taken, past the cap too, intloom stop said only "The service rejected
    # shutdown (BUSY: ... Close idle clients and retry.)": no pid, no other way to stop it.
    monkeypatch.setenv("INTLOOM_TEST_MAX_CONNECTIONS", "1")
    service = start(project).service
    held: list[socket.socket] = []
    try:
        held.extend(_greeted(project, service.port, 1 + CONTROL_SLOTS))
        stopped = project.cli("stop", "--json")
    finally:
        for sock in held:
            sock.close()
    assert stopped.code == 1, stopped.stdout
    error = stopped.json["error"]
    assert error["code"] == "CLI_SERVICE_UNAVAILABLE", error
    assert "the stop request was not sent and it runs on" in error["message"], error
    assert f"kill -TERM {service.pid}" in error["message"], error
    assert serves(project.root, service.instance_id)


def test_control_slots_held_by_silent_peers_free_up_for_a_stop_within_seconds(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Four peers past the cap that said hello and then nothing held every control slot for
    # the 30 s hello timeout: intloom stop was refused (BUSY) all that time.
    monkeypatch.setenv("INTLOOM_TEST_MAX_CONNECTIONS", "1")
    service = start(project).service
    held: list[socket.socket] = []
    try:
        held.extend(_greeted(project, service.port, 1 + CONTROL_SLOTS))
        # The silent control connections are closed by the host, well before the hello
        # timeout; the one inside the cap stays (it is idle, not past the cap).
        for sock in held[1:]:
            try:
                assert closed(sock)
            except TimeoutError:
                pytest.fail("a silent control connection was still open after 10 s")

        def stopped() -> bool:
            result = project.cli("stop", "--json")
            return result.code == 0 and result.json["stopped"] is True

        eventually(stopped, timeout=10, what="intloom stop to be served past the cap")
    finally:
        for sock in held:
            sock.close()
    assert not (project.state / "service.json").exists()


def test_connections_refused_at_the_cap_are_logged_once_with_a_count(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A client retrying its BUSY in a loop wrote one connection_refused line per attempt
    # (~1,100 lines, 140 KB, a second), without end.
    monkeypatch.setenv("INTLOOM_TEST_MAX_CONNECTIONS", "1")
    service = start(project).service
    held: list[socket.socket] = []
    try:
        held.extend(_greeted(project, service.port, 1 + CONTROL_SLOTS))
        for _ in range(30):
            with raw(service.port) as sock:
                assert error_code(reply(sock)) == "BUSY"
    finally:
        for sock in held:
            sock.close()
    log = next((project.state / "logs").glob("LOG-*.jsonl")).read_text().splitlines()
    refused = [entry for entry in map(json.loads, log) if entry["event"] == "connection_refused"]
    assert len(refused) == 1, refused[:3]
    assert refused[0]["reason"] == "too_many_connections" and refused[0]["times"] == 1
    assert serves(project.root, service.instance_id)


def _serves_quietly(project: Project, instance_id: str) -> bool:
    try:
        return serves(project.root, instance_id)
    except IntloomError:
        return False


def test_stop_with_a_foreign_instance_id_is_a_conflict(project: Project) -> None:
    service = start(project).service
    with Client.connect(project.root) as client, pytest.raises(IntloomError) as refused:
        client.stop("00000000-0000-4000-8000-000000000000")
    assert refused.value.code == "CONFLICT"
    assert serves(project.root, service.instance_id)


def test_wrong_token_refusals_are_logged_once_with_a_count(project: Project) -> None:
    # Each wrong-token connection wrote its own connection_refused line: a peer retrying a
    # stale token (or a flood of them) filled the log.
    service = start(project).service
    for _ in range(30):
        with raw(service.port) as sock:
            sock.sendall(hello_frame("x" * 43))
            assert error_code(reply(sock)) == "UNAUTHORIZED"
    assert serves(project.root, service.instance_id)
    log = next((project.state / "logs").glob("LOG-*.jsonl")).read_text().splitlines()
    refused = [entry for entry in map(json.loads, log) if entry["event"] == "connection_refused"]
    assert len(refused) == 1, refused[:3]
    assert refused[0]["reason"] == "unauthorized" and refused[0]["times"] == 1, refused
    assert refused[0]["client"], refused


def test_peers_without_the_token_cannot_hold_every_slot_from_the_users_own_clients(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any local user, without the token, held all 256 slots and the 4 control slots by
    connecting again as each hello timed out: the user's status, runs and stop were refused
    BUSY for as long as it went on. Connections that have not said hello are capped; past
    the cap the oldest of them is closed, and the user's client, which says its hello at
    once, is served."""
    monkeypatch.setenv("INTLOOM_TEST_MAX_CONNECTIONS", "8")
    monkeypatch.setenv("INTLOOM_TEST_MAX_UNPROVEN", "4")
    service = start(project).service
    silent = [raw(service.port) for _ in range(12)]  # connected, never a hello
    try:
        eventually(lambda: all(socket_closed(sock) for sock in silent[:8]), timeout=10,
                   what="the host to close the oldest of the connections without a hello")
        with Client.connect(project.root) as client:
            assert client.status().instance_id == service.instance_id
            assert client.runs() == []
        # The newest are still held (each until its hello timeout), only they.
        assert not any(socket_closed(sock) for sock in silent[9:])
    finally:
        for sock in silent:
            sock.close()
    log = project.cli("logs", "--json").stdout
    assert '"reason":"unproven_evicted"' in log.replace(" ", ""), log

