"""The client's request encoding (``frame_of``) names what cannot be sent, without looping."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from intloom.client.outgoing import frame_of
from intloom.errors import IntloomError
from intloom.protocol.messages import Answer, CallTool, CompleteAgentCall

# The host a socketpair stands in for: no process, so never this one (a Client checks
# that it is not called on its own host's event loop, by the host's pid).
NO_HOST: Any = SimpleNamespace(pid=0)

pytestmark = pytest.mark.timeout(20)


def test_a_value_that_contains_itself_is_refused_not_walked_for_ever() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(IntloomError) as info:  # msgpack refuses the big int (in a set)
        frame_of(Answer(run_id="RUN-1", action_id="ASK-1", answer=[{2**70}, cycle]))
    assert info.value.code == "INVALID_REQUEST" and "beyond 64 bits" in info.value.message


def test_the_path_of_a_big_integer_is_named() -> None:
    shared = {"n": 2**70}
    with pytest.raises(IntloomError) as info:
        frame_of(Answer(run_id="RUN-1", action_id="ASK-1",
                        answer={"a": [1, shared], "b": shared}))
    assert "answer.a[1].n is an integer beyond 64 bits" in info.value.message


@pytest.mark.parametrize(("request_", "said"), [
    (CompleteAgentCall(run_id="RUN-1", call_id="CALL-1", owner_token="t", outcome="found",
                       output={"tags": {"a", "b"}}),
     "CompleteAgentCall request: output.tags is a set, which JSON cannot carry (it would be "
     "sent as a list, in no set order). Send a sorted list"),
    (CallTool(run_id="RUN-1", call_id="CALL-1", owner_token="t", tool_call_id="tc-1",
              tool="search", input={"q": [1, frozenset({2})]}),
     "CallTool request: input.q[1] is a set"),
    (Answer(run_id="RUN-1", action_id="ASK-1", answer={"isConfirmed": True, "x": {1}}),
     "Answer request: answer.x is a set"),
])
def test_a_set_an_agent_sends_is_refused_not_sent_as_a_list(request_: Any, said: str) -> None:
    """The docs say a set in a Tool's input or a task's output is refused: msgpack sent it as
    a list, the host could not tell, and the Run recorded and routed ``["b", "a"]`` for
    ``{"a", "b"}``."""
    with pytest.raises(IntloomError) as info:
        frame_of(request_)
    assert info.value.code == "INVALID_REQUEST"
    assert said in info.value.message and "Nothing was sent" in info.value.message, \
        info.value.message


class _Found(msgspec.Struct):
    n: int = 1


@dataclasses.dataclass
class _Hit:
    n: int = 1


class _Color(enum.Enum):
    RED = "red"


@pytest.mark.parametrize(("value", "said"), [
    (decimal.Decimal("1.50"), "output.v is Decimal, which would be sent as '1.50'"),
    (uuid.UUID(int=5), "output.v is UUID, which would be sent as "
                       "'00000000-0000-0000-0000-000000000005'"),
    (datetime.datetime(2024, 1, 2), "output.v is datetime, which would be sent as "
                                    "'2024-01-02T00:00:00'"),
    (datetime.datetime(2024, 1, 2, tzinfo=datetime.UTC), "output.v is datetime"),
    (datetime.date(2024, 1, 2), "output.v is date, which would be sent as '2024-01-02'"),
    (_Color.RED, "output.v is _Color, which would be sent as 'red'"),
    (_Found(), "output.v is _Found, which would be sent as {'n': 1}"),
    (_Hit(), "output.v is _Hit, which would be sent as {'n': 1}"),
    ({uuid.UUID(int=5): 1}, "output.v (the key UUID('00000000-0000-0000-0000-0000000...) is UUID"),
])
def test_a_value_the_protocol_would_send_converted_is_refused_unsent(value: Any,
                                                                      said: str) -> None:
    """A Tool's input and a task's output must be plain JSON data, and a Tool returning a
    Decimal, a datetime or a Struct is refused so; but the Client sent them converted (a
    Decimal as text, a Struct as an object), and the host, which could not tell, recorded and
    routed another value than the Agent's. An aware datetime alone was refused, by the host
    (msgpack carries it as itself), while a naive one went as text."""
    with pytest.raises(IntloomError) as info:
        frame_of(CompleteAgentCall(run_id="RUN-1", call_id="CALL-1", owner_token="t",
                                   outcome="found", output={"v": value}))
    assert info.value.code == "INVALID_REQUEST"
    message = info.value.message
    assert message.startswith("Cannot send the CompleteAgentCall request: "), message
    assert said in message and message.endswith("Nothing was sent, so nothing changed."), message
    for request_ in (CallTool(run_id="RUN-1", call_id="CALL-1", owner_token="t",
                              tool_call_id="tc-1", tool="search", input=[value]),
                     Answer(run_id="RUN-1", action_id="ASK-1",
                            answer={"isConfirmed": True, "feedback": value})):
        with pytest.raises(IntloomError):
            frame_of(request_)
    # What JSON holds as itself still goes: a tuple is a list, an IntEnum an int.
    frame_of(CompleteAgentCall(run_id="RUN-1", call_id="CALL-1", owner_token="t",
                               outcome="found", output={"t": (1, "a"), "n": 2.5, "b": None}))


def test_an_answer_given_as_intlooms_own_answer_types_is_sent_as_their_wire_shape() -> None:
    """``intloom.Confirmation`` and ``intloom.QuestionAnswer`` encode to exactly the answer
    shapes the host decodes (``{"isConfirmed": ...}``, ``{"questionId": ...}``)."""
    import intloom
    from intloom.protocol.framing import decode_request

    for answer, wire in [
        (intloom.Confirmation(confirmed=True, feedback="ok"),
         {"isConfirmed": True, "feedback": "ok"}),
        ([intloom.QuestionAnswer(question_id="a", skipped=False, answer="x")],
         [{"questionId": "a", "isSkipped": False, "answer": "x"}]),
    ]:
        frame = frame_of(Answer(run_id="RUN-1", action_id="ASK-1", answer=answer))
        sent = decode_request(frame[4:])
        assert isinstance(sent, Answer) and sent.answer == wire


def test_a_zombie_host_is_said_to_have_exited_as_doctor_says_it(tmp_path: Path) -> None:
    """`runs` said the pid "no longer exists" where `status` (doctor's evidence) said, of the
    same process a moment later, that it is a zombie: an exited host not yet reaped."""
    import subprocess

    from intloom.client.client import _host_gone
    from tests.helpers import eventually

    def zombie() -> bool:
        with open(f"/proc/{child.pid}/stat", "rb") as fh:
            return fh.read().rpartition(b") ")[2][:1] == b"Z"

    child = subprocess.Popen(["true"])
    try:
        eventually(zombie, timeout=10, what="the child to exit, unreaped")
        why = _host_gone(child.pid, 0.0, tmp_path / "service.lock")
        assert why is not None and why.startswith("which has exited (a zombie"), why
    finally:
        child.wait()
    assert _host_gone(child.pid, 0.0, tmp_path / "service.lock") == (
        "which no longer exists (the host exited without cleaning up)")


def test_a_pid_reused_by_another_users_process_is_proven_gone_by_its_create_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A crashed host's pid taken by another user's process: ``kill(pid, 0)`` fails EPERM,
    which was taken for "alive", so its create time went unchecked and the client dialled
    whatever that user listened with on the port (only the listener's owner check, from
    /proc/net, kept the token from it). The process here is the test's own, its signal
    refused as another user's is; its create time is not the recorded one."""
    import os
    import subprocess
    import time

    from intloom.client.client import _host_gone

    child = subprocess.Popen(["sleep", "30"])
    real_kill = os.kill

    def refused(pid: int, sig: int) -> None:
        if pid == child.pid and sig == 0:
            raise PermissionError(1, "Operation not permitted")
        real_kill(pid, sig)

    try:
        monkeypatch.setattr(os, "kill", refused)
        recorded = time.time() - 3_600  # the crashed host's create time
        why = _host_gone(child.pid, recorded, tmp_path / "service.lock")
        monkeypatch.undo()
        assert why == ("which now belongs to another process (the host exited without "
                       "cleaning up and its pid was reused)"), why
    finally:
        child.kill()
        child.wait()


def test_runs_of_a_workflow_whose_package_failed_to_load_is_not_found() -> None:
    """A source that failed to load is listed by its path, and a package's path is often the
    name of the Workflow it defines (``triage``): ``runs(flow="triage")`` took it for a
    loaded Workflow and answered [] ("no Runs of Workflow 'triage'"), while its Runs were
    held and nothing could start one."""
    import socket

    from intloom.client.client import Client
    from intloom.protocol.messages import RunsReply, WorkflowInfo, WorkflowsReply

    replies: dict[str, Any] = {
        "ListRuns": RunsReply(runs=[], next_after=0),
        "ListWorkflows": WorkflowsReply(workflows=[
            WorkflowInfo(name="triage", version="", identity="", source="triage", stages=[],
                         ready=False, problem="WORKFLOW_LOAD_FAILED: ..."),
            WorkflowInfo(name="notes", version="1", identity="abc", source="notes.py",
                         stages=["main"])]),
    }

    class Canned(Client):
        def _call(self, request: Any, expect: type[Any]) -> Any:
            return replies[type(request).__name__]

    with socket.socket() as sock:
        client = Canned(sock, None, None, Path("/nowhere"),  # type: ignore[arg-type]
                        request_timeout=None)
        assert client.runs("notes") == []  # loaded, with no Runs
        with pytest.raises(IntloomError) as info:
            client.runs("triage")
    assert info.value.code == "NOT_FOUND"
    assert info.value.message == (
        "Workflow 'triage' is not loaded by this host, so it has no Runs here. intloom flows "
        "lists the loaded Workflows. 1 Workflow source(s) failed to load and may define it: "
        "triage (intloom flows says why; fix the source, then intloom stop and intloom start).")
    long = "w" * 3_000_000
    with socket.socket() as sock:
        client = Canned(sock, None, None, Path("/nowhere"),  # type: ignore[arg-type]
                        request_timeout=None)
        with pytest.raises(IntloomError) as info:
            client.runs(long)  # quoted as the host quotes a name it does not know
    assert info.value.message.startswith(
        f"Workflow '{'w' * 200}… (3,000,000 characters)' is not loaded by this host"), \
        info.value.message[:300]


@pytest.mark.parametrize(("request_", "said"), [
    ("create", "CreateRun request: wait must be a bool, not str"),
    ("runs", "ListRuns request: flow must be a str or None, not int"),
    ("page", "ListRuns request: page_bytes must be an int, not bool"),
])
def test_a_flag_or_an_optional_name_of_the_wrong_type_is_refused_unsent(
        request_: str, said: str) -> None:
    """``create_run(..., wait="no")`` or ``runs(3)`` was sent, and the host's refusal spoke
    of its protocol ("the frame is not a valid request (Expected `bool`, got `str` - at
    `$.wait`)"), as a str field's did before it was checked here."""
    from intloom.protocol.messages import CreateRun, ListRuns

    made: Any
    if request_ == "create":
        made = CreateRun(workflow="w", intent="i", wait="no")  # type: ignore[arg-type]
    elif request_ == "runs":
        made = ListRuns(flow=3, page_bytes=1, after=0)  # type: ignore[arg-type]
    else:
        made = ListRuns(flow=None, page_bytes=True, after=0)
    with pytest.raises(IntloomError) as info:
        frame_of(made)
    assert info.value.code == "INVALID_REQUEST"
    assert info.value.message == f"Cannot send the {said}. Nothing was sent, so nothing changed."
    frame_of(CreateRun(workflow="w", intent="i", wait=False))  # the right types still go
    frame_of(ListRuns(flow=None, page_bytes=1, after=0))


def _closed_while_waiting(request: Any) -> IntloomError:
    """The error of ``request(client)`` made on a thread through a Client whose host (one
    end of a socket pair) reads the request and never answers, once this thread closes
    that Client."""
    import socket
    import threading

    from intloom.client.client import Client

    ours, hosts = socket.socketpair()
    client = Client(ours, None, NO_HOST, Path("/nowhere"),  # type: ignore[arg-type]
                    request_timeout=5.0)
    failed: list[IntloomError] = []

    def call() -> None:
        try:
            request(client)
        except IntloomError as exc:
            failed.append(exc)

    with hosts:
        hosts.settimeout(5.0)
        worker = threading.Thread(target=call)
        worker.start()
        assert hosts.recv(1 << 16)  # the request is on its way: the host never answers it
        client.close()
        worker.join(timeout=10.0)
    assert not worker.is_alive()
    (exc,) = failed
    return exc


def test_a_client_closed_by_another_thread_ends_its_request_and_says_so() -> None:
    """An Agent's watchdog thread closed the Client while a Tool call waited for its reply:
    the call went on waiting (a bare close does not wake a blocked recv) and then blamed the
    host ("the connection closed: the host may have stopped or crashed ([Errno 9] Bad file
    descriptor)"), which was fine."""
    import time

    began = time.monotonic()
    exc = _closed_while_waiting(
        lambda client: client.call_tool("RUN-1", "CALL-1", "token", "tc-1", "search",
                                        {"q": "x"}))
    assert time.monotonic() - began < 4.0  # not the request_timeout
    assert exc.code == "PROJECT_REQUEST_FAILED"
    assert exc.message.startswith(
        "No reply came for Tool call tc-1 (Tool 'search') of Agent task CALL-1 (Run RUN-1): "
        "this Client was closed (Client.close, or the end of its with block, in another "
        "thread) while the request waited")
    assert "host may have stopped" not in exc.message
    assert "Sending the same call again" in exc.message and exc.retryable is True


def test_a_tool_call_past_the_request_timeout_says_it_may_still_run_and_how_to_resend() -> None:
    """A Tool slower than ``request_timeout``: the Agent was told to check with intloom
    attach (a Run's events show no Tool calls) "once a host runs" (it runs), not that the
    same call is safe to send again, its receipt answering it once the Tool returns."""
    import socket

    from intloom.client.client import Client

    ours, hosts = socket.socketpair()
    with hosts:
        client = Client(ours, None, NO_HOST, Path("/nowhere"),  # type: ignore[arg-type]
                        request_timeout=0.2)
        with pytest.raises(IntloomError) as info:
            client.call_tool("RUN-1", "CALL-1", "token", "tc-1", "search", {"q": "x"})
    assert (info.value.code, info.value.retryable) == ("PROJECT_REQUEST_FAILED", True)
    message = info.value.message
    assert message.startswith("No reply came for Tool call tc-1 (Tool 'search') of Agent task "
                              "CALL-1 (Run RUN-1) within 0.2 s. The Tool may still be running")
    assert "(the same tool_call_id, Tool and input)" in message and "attach" not in message


def test_a_completion_past_the_request_timeout_says_sending_it_again_is_safe() -> None:
    """A completion whose on_complete (or the Steps after it) outlasts ``request_timeout``:
    the Agent was told to create Runs with wait=False, which it does not do, and not that
    the same completion sent again is answered with the Run's view, never recorded twice."""
    import socket

    from intloom.client.client import Client

    ours, hosts = socket.socketpair()
    with hosts:
        client = Client(ours, None, NO_HOST, Path("/nowhere"),  # type: ignore[arg-type]
                        request_timeout=0.2)
        with pytest.raises(IntloomError) as info:
            client.complete_agent_call("RUN-1", "CALL-1", "token", "found", {"n": 1})
    assert (info.value.code, info.value.retryable) == ("PROJECT_REQUEST_FAILED", True)
    message = info.value.message
    assert message.startswith("No reply came for the completion of Agent task CALL-1 (Run "
                              "RUN-1) within 0.2 s. Its on_complete, or the Steps its outcome "
                              "leads to, may still be running"), message
    assert "the same outcome and output" in message and "wait=False" not in message
    assert "request_timeout=None" in message


@pytest.mark.parametrize(("given", "said"), [
    ({"request_timeout": 0}, "request_timeout is the seconds a request waits for its reply: "
                             "a finite number > 0, or None to wait as long as its Run takes"),
    ({"request_timeout": float("nan")}, "request_timeout is the seconds a request waits"),
    ({"timeout": -1}, "timeout is the seconds the hello may take: a finite number > 0."),
    ({"timeout": 0}, "timeout is the seconds the hello may take: a finite number > 0."),
])
def test_a_timeout_that_is_no_positive_number_of_seconds_is_refused_by_connect(
        tmp_path: Path, given: dict[str, float], said: str) -> None:
    """``request_timeout=0`` (no timeout, in many APIs) made the socket non-blocking: a
    create_run whose reply was not there at once said "the connection closed: the host may
    have stopped or crashed ([Errno 11] ...)" -- of a Run it had created; ``timeout=0``
    called a running host unavailable, and a negative or NaN one raised ValueError."""
    from intloom.client.client import Client

    with pytest.raises(IntloomError) as info:
        Client.connect(tmp_path, **given)
    assert info.value.code == "INVALID_REQUEST"
    name = next(iter(given))
    assert info.value.message.startswith(f"Client.connect({name}={given[name]!r}): {said}")
    assert info.value.message.endswith("Nothing was sent.")


@pytest.mark.parametrize("name", ["request_timeout", "timeout"])
def test_a_timeout_longer_than_a_socket_takes_is_refused_by_connect(
        tmp_path: Path, name: str) -> None:
    """``request_timeout=1e10`` passed connect's check ("a finite number > 0"), and the
    first request raised a bare OverflowError ("timestamp out of range for platform time_t")
    from the socket; ``timeout=1e10`` raised it from connect itself."""
    from intloom.client.client import Client

    with pytest.raises(IntloomError) as info:
        Client.connect(tmp_path, **{name: 1e10})
    assert info.value.code == "INVALID_REQUEST", info.value
    assert info.value.message.startswith(f"Client.connect({name}=10000000000.0): {name} is "), \
        info.value.message
    assert "at most 1e+09 (about 31 years; a socket takes no longer)" in info.value.message
    assert info.value.message.endswith("Nothing was sent.")


@pytest.mark.parametrize("call", ["stop_service", "start_service"])
def test_a_lifecycle_timeout_longer_than_a_socket_takes_is_refused(
        tmp_path: Path, call: str) -> None:
    """``stop_service(root, timeout=1e10)`` with a host running passed the deadline on to
    Client.connect, whose refusal then read "The service rejected shutdown
    (INVALID_REQUEST: Client.connect(timeout=...": the host had been asked nothing."""
    from intloom.client import lifecycle

    with pytest.raises(IntloomError) as info:
        getattr(lifecycle, call)(tmp_path, timeout=1e10)
    assert info.value.code == "INVALID_REQUEST", info.value
    assert info.value.message == (
        "The timeout 10000000000.0 is not a finite number of seconds from 0 to 1e+09 (about "
        "31 years); nothing was done. Pass one such as 30.")


@pytest.mark.parametrize("call", ["stop_service", "start_service"])
def test_a_lifecycle_call_given_the_config_file_names_the_root_to_pass(
        tmp_path: Path, call: str) -> None:
    """``stop_service("intloom.toml")`` raised a bare NotADirectoryError ('[Errno 20] Not a
    directory: .../intloom.toml/.intloom'), and start_service said the file "has no
    intloom.toml: it is inside the project": Client.connect names the root to pass."""
    from intloom.client import lifecycle

    config = tmp_path / "intloom.toml"
    config.write_text("workflows = []\n")
    with pytest.raises(IntloomError) as info:
        getattr(lifecycle, call)(config)
    assert info.value.code == "CLI_PROJECT_INVALID", info.value
    assert info.value.message == (
        f"{config} is a file, not a directory: {call} takes the project's root, the directory "
        f"that holds intloom.toml (here {tmp_path}). Nothing was sent.")


@pytest.mark.parametrize("call", ["Client.connect", "start_service", "stop_service"])
@pytest.mark.parametrize("root", [None, 5, b"/tmp"])
def test_a_root_that_is_no_path_is_refused(root: Any, call: str) -> None:
    """``Client.connect(os.environ.get("PROJECT"))`` with the variable unset raised a bare
    TypeError ("expected str, bytes or os.PathLike object, not NoneType") where every other
    argument of connect, and every request's, is refused INVALID_REQUEST naming it."""
    from intloom.client import lifecycle
    from intloom.client.client import Client

    made = Client.connect if call == "Client.connect" else getattr(lifecycle, call)
    with pytest.raises(IntloomError) as info:
        made(root)
    assert info.value.code == "INVALID_REQUEST", info.value
    assert info.value.message == (
        f"{call}({root!r}): the root is the path of a project's directory (the one "
        f"holding intloom.toml), a str or a pathlib.Path, not {type(root).__name__}. Nothing "
        "was sent.")


@pytest.mark.parametrize("call", ["Client.connect", "start_service", "stop_service"])
def test_an_empty_root_is_refused_not_taken_as_the_working_directory(
        call: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Path("")`` is ".": ``Client.connect(os.environ.get("ROOT", ""))`` reached the working
    directory's project (here a real one, which would have been started or stopped), where
    the CLI refuses an empty --project."""
    from intloom.client import lifecycle
    from intloom.client.client import Client

    (tmp_path / "intloom.toml").write_text("workflows = []\n")
    monkeypatch.chdir(tmp_path)
    made = Client.connect if call == "Client.connect" else getattr(lifecycle, call)
    with pytest.raises(IntloomError) as info:
        made("")
    assert info.value.code == "INVALID_REQUEST", info.value
    assert info.value.message.startswith(f"{call}(''): the root is an empty path"), info.value
    assert not (tmp_path / ".intloom").exists()  # nothing was started there


def test_a_started_host_that_no_thread_can_reap_is_no_failure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a process limit (a pids cgroup) the thread that reaps the started host could
    not start: the start, which had succeeded, failed CLI_INTERNAL_ERROR (exit 70)."""
    import subprocess
    import threading

    from intloom.client.lifecycle import _reap_later

    child = subprocess.Popen(["true"])
    try:
        def refused(self: threading.Thread) -> None:
            raise RuntimeError("can't start new thread")

        monkeypatch.setattr(threading.Thread, "start", refused)
        _reap_later(child)  # no error: the host is reaped by whoever inherits it
    finally:
        monkeypatch.undo()
        child.wait(timeout=10)


@pytest.mark.parametrize("end", ["complete", "fail"])
def test_an_agent_tasks_end_cut_by_close_says_the_same_one_is_safe_to_send_again(
        end: str) -> None:
    """A completion (or failure) of an Agent task whose Client another thread closed said
    "It was not replayed, since the host may have acted on it ... before retrying", not
    retryable: the Agent could not tell whether sending it again might complete the task
    twice, when the host answers the same one again with the first one's outcome."""
    exc = _closed_while_waiting(
        (lambda client: client.complete_agent_call("RUN-1", "CALL-1", "token", "done",
                                                   {"n": 1})) if end == "complete" else
        (lambda client: client.fail_agent_call("RUN-1", "CALL-1", "token", "no source")))
    assert exc.code == "PROJECT_REQUEST_FAILED" and exc.retryable is True, exc
    task = ("the completion of Agent task CALL-1" if end == "complete"
            else "giving up Agent task CALL-1")
    assert exc.message.startswith(
        f"No reply came for {task} (Run RUN-1): this Client was closed"), exc.message
    same = ("the same completion again (the same outcome and output)" if end == "complete"
            else "the same failure again (the same message)")
    assert f"Sending {same} is safe" in exc.message, exc.message
    assert "host may have acted on it" not in exc.message


@pytest.mark.parametrize(("port", "said"), [(True, "a bool"), (2.5, "2.5"), ("80", "'80'"),
                                            (-1, "-1"), (70_000, "70000")])
def test_start_service_refuses_a_port_that_is_no_port_before_launching_a_host(
        tmp_path: Path, port: object, said: str) -> None:
    """``start_service(root, port=True)`` (or 2.5) launched a host whose argv check made it
    exit at once: "the host exited during initialization ... Run intloom start again",
    which failed the same way; ``port="80"`` went through and was saved for every later
    start; -1 was refused in the CLI's words (``--port -1``) after a process had started."""
    from intloom.client.lifecycle import start_service

    (tmp_path / "intloom.toml").write_text('workflows = []\n')
    with pytest.raises(IntloomError) as info:
        start_service(tmp_path, port=port)  # type: ignore[arg-type]
    assert info.value.code == "INVALID_REQUEST", info.value
    assert info.value.message == (
        f"start_service(port={port!r}): a port is an int from 0 to 65535 (0: any free port; "
        f"None: intloom.toml's, else the saved one), not {said}; no host was launched. Pass "
        "one such as 8765, or None.")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["intloom.toml"]


@pytest.mark.parametrize("call", ["Client.connect", "start_service", "stop_service"])
def test_a_root_holding_a_nul_character_is_refused_by_name(tmp_path: Path, call: str) -> None:
    """``Client.connect("/p\\x00")`` raised a bare ValueError ("embedded null byte"), with no
    code, where every other root that is no project's gets one."""
    from intloom.client import lifecycle
    from intloom.client.client import Client

    fn = Client.connect if call == "Client.connect" else getattr(lifecycle, call)
    root = f"{tmp_path}\x00"
    with pytest.raises(IntloomError) as info:
        fn(root)
    assert info.value.code == "INVALID_REQUEST", info.value
    assert info.value.message == (
        f"{call}({root!r}): the root holds a NUL character, which no path can hold (a value "
        "read from a file or a C string, say); pass the project's root directory, the one "
        "holding intloom.toml. Nothing was sent.")
