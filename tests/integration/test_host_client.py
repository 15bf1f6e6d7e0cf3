"""The client's verification of what it connects to, against a scripted fake host.

A fake host lets each test break one thing on purpose (a lost reply, a wrong identity) over a
real socket, with real metadata files written the way the host writes them.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest

from intloom.client.client import Client
from intloom.errors import IntloomError
from intloom.fsutil import ensure_private_dir
from intloom.host.metadata import Connection, ServiceInfo, write_connection, write_service
from intloom.host.ownership import new_token
from intloom.project import ProjectPaths
from intloom.protocol.framing import decode_first, decode_request, recv_frame, send_frame
from intloom.protocol.messages import PROTOCOL, HelloOk
from tests.helpers import Project, snapshot_files

INSTANCE = "11111111-1111-4111-8111-111111111111"

Script = Callable[[socket.socket, list[object]], None]


class FakeHost:
    """Accepts connections on 127.0.0.1 and runs ``script`` for each; records what it got."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.received: list[object] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(10)
                with contextlib.suppress(OSError):
                    self.script(conn, self.received)

    def close(self) -> None:
        # close() alone does not wake an accept() blocked in another thread on Linux;
        # shutdown() does (it fails with EINVAL), so the thread ends at once.
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self._thread.join(timeout=5)
        assert not self._thread.is_alive(), "the fake host's thread did not end"


def publish(root: Path, port: int, *, pid: int | None = None) -> str:
    paths = ProjectPaths(root)
    ensure_private_dir(paths.state)
    token = new_token()
    write_connection(paths.connection_json, Connection(
        version=1, project_root=str(root), port=port, token=token))
    pid = pid or os.getpid()
    write_service(paths.service_json, ServiceInfo(
        version=1, project_root=str(root), pid=pid, create_time=psutil.Process(pid).create_time(),
        instance_id=INSTANCE, port=port, started_at="2026-01-01T00:00:00.000Z",
        package_version="0.1.0", protocol_version=PROTOCOL))
    return token


def hello_then(after: Callable[[socket.socket, list[object]], None]) -> Script:
    def script(conn: socket.socket, received: list[object]) -> None:
        received.append(decode_first(recv_frame(conn)))
        send_frame(conn, HelloOk(instance_id=INSTANCE, pid=os.getpid(),
                                 project_root=str(conn_root[0]), protocol=PROTOCOL))
        after(conn, received)
    return script


conn_root: list[Path] = []


@pytest.fixture
def fake(project: Project) -> Iterator[Callable[[Script], FakeHost]]:
    hosts: list[FakeHost] = []
    conn_root[:] = [project.root.resolve()]

    def make(script: Script) -> FakeHost:
        host = FakeHost(script)
        hosts.append(host)
        return host

    yield make
    for host in hosts:
        host.close()


def take_request_then_hang_up(conn: socket.socket, received: list[object]) -> None:
    """A host that reads one request and closes the connection without replying."""
    received.append(msgspec.msgpack.decode(recv_frame(conn)))


def test_reply_lost_mid_request_is_request_failed_and_never_resent(
    project: Project, fake: Callable[[Script], FakeHost]
) -> None:
    host = fake(hello_then(take_request_then_hang_up))
    publish(project.root, host.port)
    with Client.connect(project.root) as client, pytest.raises(IntloomError) as failed:
        client.cancel("RUN-1")
    assert failed.value.code == "PROJECT_REQUEST_FAILED"
    message = failed.value.message
    assert "not replayed" in message
    # The fact (no reply to the cancel of RUN-1: the host may be gone) and the fix, in the
    # words of the command, not the protocol's.
    assert message.startswith("No reply came for the cancel (Run RUN-1): the connection "
                              "closed: the host may have stopped or crashed"), message
    assert "Run intloom status" in message and "intloom attach RUN-1" in message
    assert message.count("closed") == 1, message  # the fact once, not again in brackets
    requests = [r for r in host.received if isinstance(r, dict)]
    assert requests == [{"op": "cancel", "runId": "RUN-1"}]


def test_a_read_whose_reply_is_lost_is_not_said_to_have_been_acted_on(
    project: Project, fake: Callable[[Script], FakeHost]
) -> None:
    """A request that only reads (attach following a Run when its host is killed) changed
    nothing in the host: its failure says it is safe to send again, not that the host may
    have acted on it."""
    host = fake(hello_then(take_request_then_hang_up))
    publish(project.root, host.port)
    with Client.connect(project.root) as client, pytest.raises(IntloomError) as failed:
        client.wait_run("RUN-1")
    # retryable as the message says (a script reads it): it was the code's False
    assert (failed.value.code, failed.value.retryable) == ("PROJECT_REQUEST_FAILED", True)
    message = failed.value.message
    assert message.startswith("No reply came for waiting on the Run (Run RUN-1): the "
                              "connection closed: the host may have stopped or crashed"), message
    assert "acted on it" not in message and "not replayed" not in message, message
    assert ("It only reads, so it is safe to send again: run intloom status, then intloom "
            "attach RUN-1 once a host runs.") in message, message
    requests = [r for r in host.received if isinstance(r, dict)]
    assert requests == [{"op": "wait_run", "runId": "RUN-1"}]  # sent once, never resent


def test_hello_from_another_instance_is_metadata_invalid(
    project: Project, fake: Callable[[Script], FakeHost]
) -> None:
    def impostor(conn: socket.socket, received: list[object]) -> None:
        recv_frame(conn)
        send_frame(conn, HelloOk(instance_id="22222222-2222-4222-8222-222222222222",
                                 pid=os.getpid(), project_root=str(project.root.resolve()),
                                 protocol=PROTOCOL))

    host = fake(impostor)
    publish(project.root, host.port)
    with pytest.raises(IntloomError) as refused:
        Client.connect(project.root)
    assert refused.value.code == "CLI_SERVICE_METADATA_INVALID"
    assert "does not match the saved project identity" in refused.value.message


def test_missing_connection_is_offline_and_creates_nothing(project: Project) -> None:
    before = snapshot_files(project.root)
    with pytest.raises(IntloomError) as offline:
        Client.connect(project.root)
    assert offline.value.code == "CLI_SERVICE_OFFLINE"
    assert offline.value.message == "Run intloom start in this project first."
    assert snapshot_files(project.root) == before
    assert not project.state.exists()


@pytest.mark.parametrize("where", ["workflows", "elsewhere", "missing"])
def test_connect_outside_a_project_root_says_so_not_offline(project: Project,
                                                             where: str) -> None:
    """With the project's host running, a subdirectory, an unrelated directory or a path
    that does not exist all said CLI_SERVICE_OFFLINE ("Run intloom start in this project
    first"): a false fact. They are CLI_PROJECT_INVALID, naming the path, and, as the CLI's
    --project does, the project a subdirectory is inside (an Agent started in its Workflow's
    directory with Client.connect(".")) and a path that does not exist as such."""
    publish(project.root, 1)
    path = {"workflows": project.root / "workflows", "elsewhere": project.root.parent,
            "missing": project.root / "nope"}[where]
    with pytest.raises(IntloomError) as refused:
        Client.connect(path)
    assert refused.value.code == "CLI_PROJECT_INVALID", refused.value
    fact = {"workflows": f"has no intloom.toml: it is inside the project {project.root}.",
            "elsewhere": "has no intloom.toml.", "missing": "does not exist."}[where]
    fix = f": pass {project.root}" if where == "workflows" else ""
    assert refused.value.message == (
        f"{path.resolve()} {fact} Client.connect takes a project's root, the directory that "
        f"holds intloom.toml{fix}. Nothing was sent.")


def test_connect_to_a_path_too_long_for_the_os_is_project_invalid(project: Project) -> None:
    """A root the OS refuses to look at (a name over 255 bytes) said
    CLI_SERVICE_METADATA_INVALID, "connection.json cannot be opened ... Check it (ls -l)":
    a file that cannot exist. The CLI calls that path CLI_PROJECT_INVALID, and so does the
    client, naming the path, why, and what to pass instead."""
    publish(project.root, 1)
    path = project.root / ("n" * 300)
    with pytest.raises(IntloomError) as refused:
        Client.connect(path)
    assert refused.value.code == "CLI_PROJECT_INVALID", refused.value
    message = refused.value.message
    assert f"{path} cannot be examined (File name too long)" in message, message
    assert "the directory that holds intloom.toml" in message and "Nothing was sent" in message


def test_connect_to_the_config_file_names_the_root_to_pass(project: Project) -> None:
    """Client.connect("intloom.toml") said CLI_SERVICE_METADATA_INVALID: ".../intloom.toml/
    .intloom/connection.json cannot be opened: Not a directory", as if metadata were bad."""
    publish(project.root, 1)
    with pytest.raises(IntloomError) as refused:
        Client.connect(project.root / "intloom.toml")
    assert refused.value.code == "CLI_PROJECT_INVALID", refused.value
    message = refused.value.message
    assert f"{project.root / 'intloom.toml'} is a file, not a directory" in message, message
    assert f"(here {project.root.resolve()})" in message and "Nothing was sent" in message


def test_missing_service_json_is_offline(project: Project) -> None:
    publish(project.root, 1)
    (project.state / "service.json").unlink()
    with pytest.raises(IntloomError) as offline:
        Client.connect(project.root)
    assert offline.value.code == "CLI_SERVICE_OFFLINE"


def test_refused_connection_is_offline(project: Project) -> None:
    with socket.create_server(("127.0.0.1", 0)) as placeholder:
        free_port = int(placeholder.getsockname()[1])
    publish(project.root, free_port)
    with pytest.raises(IntloomError) as offline:
        Client.connect(project.root)
    assert offline.value.code == "CLI_SERVICE_OFFLINE"


@pytest.mark.parametrize("value", ["soon", "0", "-1", "nan"])
def test_a_hello_cap_that_is_no_positive_number_is_ignored(
        project: Project, fake: Callable[[Script], FakeHost], monkeypatch: pytest.MonkeyPatch,
        value: str) -> None:
    """The test hook capping the client's hello raised a bare ValueError for a word, and
    made the socket non-blocking for 0: a test hook must never fail a connection."""
    from intloom.client.client import HELLO_CAP_ENV

    host = fake(hello_then(lambda conn, received: None))
    publish(project.root, host.port)
    monkeypatch.setenv(HELLO_CAP_ENV, value)
    with Client.connect(project.root) as client:
        assert client.hello.instance_id == INSTANCE


def _a_wait_unanswered(release: threading.Event, served: list[int],
                       silent_hello: int | None = None) -> tuple[Any, Script]:
    """A fake host's script, and the Run view it serves: the first connection's request gets
    no reply until ``release`` (a Step that goes on), the ``silent_hello``-th connection's
    hello none at all, and every other request the view. ``served`` counts connections."""
    from intloom.protocol.messages import RunReply
    from intloom.runtime.model import Cursor, RunView

    view = RunView(run_id="RUN-1", flow_name="f", cursor=Cursor(stage="s"),
                   status="waiting", created_at="T0", updated_at="T1")

    def script(conn: socket.socket, received: list[object]) -> None:
        served[0] += 1
        with contextlib.suppress(Exception):  # the interrupted client closes its ends
            if served[0] == silent_hello:
                recv_frame(conn)
                return
            hello_then(lambda _c, _r: None)(conn, received)
            request = recv_frame(conn)
            if served[0] == 1:
                release.wait(10)
                return
            received.append(decode_request(request))
            send_frame(conn, RunReply(run=view))

    return view, script


def _signalled_in_a_read(signum: int, call: Callable[[], object]) -> BaseException:
    """What ``call`` raised when ``signum`` came to this thread while it waited in a read
    (a Ctrl-C, or a deadline's SIGALRM)."""
    import signal

    from tests.helpers import eventually
    from tests.unit.test_client_ctrl_c import _asleep_in_a_syscall

    main, main_ident = threading.get_native_id(), threading.get_ident()

    def send() -> None:
        eventually(lambda: _asleep_in_a_syscall(main), timeout=10, what="a read")
        signal.pthread_kill(main_ident, signum)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        call()
    except BaseException as exc:
        return exc
    finally:
        sender.join(timeout=10)
    raise AssertionError(f"signal {signum} did not interrupt the call")


def test_ctrl_c_while_connecting_again_leaves_the_client_able_to_connect(
    project: Project, fake: Callable[[Script], FakeHost]
) -> None:
    """A request interrupted before its reply (Ctrl-C in wait_run) makes the next one connect
    again; a second Ctrl-C during that connect (a busy host, slow to answer the hello) left
    the Client shut for good, saying "…, and connecting again failed" (it had not failed),
    though nothing was in flight and connecting again was as safe as before."""
    import signal

    from intloom.protocol.messages import GetRun

    release = threading.Event()
    served = [0]
    # The hello of the connect that Ctrl-C ends (the second): no answer.
    view, script = _a_wait_unanswered(release, served, silent_hello=2)
    host = fake(script)
    publish(project.root, host.port)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with Client.connect(project.root) as client:
            calls: list[Callable[[], object]] = [lambda: client.wait_run("RUN-1"),
                                                 lambda: client.get_run("RUN-1")]
            for call in calls:  # Ctrl-C in the wait, then in the connect the next one makes
                assert isinstance(_signalled_in_a_read(signal.SIGINT, call),
                                  KeyboardInterrupt)
            release.set()
            assert client.get_run("RUN-1") == view
    finally:
        release.set()
        signal.signal(signal.SIGINT, previous)
    assert served[0] == 3 and isinstance(host.received[-1], GetRun)


def test_a_client_closed_as_a_request_begins_stays_closed_and_sends_nothing(
    project: Project, fake: Callable[[Script], FakeHost]
) -> None:
    """Client.close() from another thread while a request was being encoded: the request
    took the closed socket for one the host had closed (idle), connected again and was
    sent, and the Client the program had closed served on, its new socket never closed."""
    from intloom.protocol.messages import RunReply
    from intloom.runtime.model import Cursor, RunView

    view = RunView(run_id="RUN-1", flow_name="f", cursor=Cursor(stage="s"),
                   status="waiting", created_at="T0", updated_at="T1")
    served = [0]

    def script(conn: socket.socket, received: list[object]) -> None:
        served[0] += 1
        with contextlib.suppress(Exception):  # the first connection is closed by the client
            hello_then(lambda _c, _r: None)(conn, received)
            received.append(decode_request(recv_frame(conn)))
            send_frame(conn, RunReply(run=view))

    host = fake(script)
    publish(project.root, host.port)
    encoding, closed = threading.Event(), threading.Event()

    class Answer(dict[str, object]):
        def items(self) -> Any:  # read while the request is checked: close it now
            encoding.set()
            closed.wait(10)
            return super().items()

    client = Client.connect(project.root)

    def close_it() -> None:
        encoding.wait(10)
        client.close()
        closed.set()

    closer = threading.Thread(target=close_it, daemon=True)
    closer.start()
    try:
        with pytest.raises(IntloomError) as gone:
            client.answer("RUN-1", "ACT-1", Answer(isConfirmed=True))
    finally:
        closed.set()
        closer.join(timeout=10)
        client.close()
    assert gone.value.code == "PROJECT_CONNECTION_FAILED", gone.value
    assert "it was closed (Client.close" in gone.value.message, gone.value.message
    assert "Nothing was sent" in gone.value.message, gone.value.message
    assert served[0] == 1 and not any(type(r).__name__ == "Answer" for r in host.received)


@pytest.mark.parametrize("raised", [TimeoutError("my own deadline"),
                                    OSError("Couldn't open device!")],
                         ids=["TimeoutError", "OSError"])
def test_a_signal_handlers_own_exception_in_a_wait_reaches_the_program(
    project: Project, fake: Callable[[Script], FakeHost], raised: OSError
) -> None:
    """A deadline put on a call with ``signal.alarm`` and a handler that raises (Python's
    signal docs raise OSError): the reads took its TimeoutError for their own slice's and
    read on (the wait returned as if no deadline had come), and its OSError for a broken
    connection (PROJECT_REQUEST_FAILED, "the host may have stopped or crashed", the Client
    shut for good). The program's exception reaches it as it is, and the Client connects
    again for the next request, as after Ctrl-C."""
    import signal

    from intloom.protocol.messages import GetRun

    release = threading.Event()
    served = [0]
    view, script = _a_wait_unanswered(release, served)
    host = fake(script)
    publish(project.root, host.port)

    def handler(_signum: int, _frame: object) -> None:
        raise raised

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        with Client.connect(project.root) as client:
            assert _signalled_in_a_read(signal.SIGALRM,
                                        lambda: client.wait_run("RUN-1")) is raised
            release.set()
            assert client.get_run("RUN-1") == view
    finally:
        release.set()
        signal.signal(signal.SIGALRM, previous)
    assert served[0] == 2 and isinstance(host.received[-1], GetRun)


def test_a_signal_handlers_own_exception_while_connecting_reaches_the_program(
    project: Project, fake: Callable[[Script], FakeHost]
) -> None:
    """The same deadline while the hello waits for a busy host's answer: it was reported as
    the host's failure to answer (PROJECT_CONNECTION_FAILED or a paused host's words)."""
    import signal

    release = threading.Event()

    def script(conn: socket.socket, received: list[object]) -> None:
        with contextlib.suppress(Exception):
            recv_frame(conn)  # the hello, never answered
            release.wait(10)

    host = fake(script)
    publish(project.root, host.port)
    raised = TimeoutError("my own deadline")

    def handler(_signum: int, _frame: object) -> None:
        raise raised

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        assert _signalled_in_a_read(signal.SIGALRM,
                                    lambda: Client.connect(project.root)) is raised
    finally:
        release.set()
        signal.signal(signal.SIGALRM, previous)
