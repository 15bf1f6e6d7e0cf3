"""intloom.Client as a program uses it, against a real host: where it may be called from and
what each failure says."""

from __future__ import annotations

import json
import os
import pickle
import signal
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from intloom.client.client import Client, ServiceStarting
from intloom.client.lifecycle import stop_service
from intloom.errors import IntloomError
from tests.helpers import Project, eventually, lock_free, one_source_project, pid_alive, reaped
from tests.integration.host_support import start, start_on_a_thread

pytestmark = pytest.mark.timeout(60)

SELF_CALL = textwrap.dedent('''
    import asyncio
    from pathlib import Path

    import msgspec

    import intloom
    from intloom.client import Client

    ROOT = Path(__file__).resolve().parent.parent


    class Seen(msgspec.Struct):
        pid: int = 0


    wf = intloom.Workflow("selfcall", version="1")
    main = wf.stage("main", state=Seen)


    def host_pid() -> int:
        with Client.connect(ROOT) as client:
            return client.status().pid


    @main.step("on_loop", routes={"done": intloom.COMPLETE, "thread": "in_thread",
                                  "later": "connected_off_loop"})
    async def on_loop(ctx: intloom.StepContext[Seen]) -> str:
        if ctx.intent in ("thread", "later"):
            return ctx.intent
        ctx.state = Seen(pid=host_pid())
        return "done"


    @main.step("in_thread", routes={"done": intloom.COMPLETE})
    async def in_thread(ctx: intloom.StepContext[Seen]) -> str:
        ctx.state = Seen(pid=await asyncio.to_thread(host_pid))
        return "done"


    @main.step("connected_off_loop", routes={"done": intloom.COMPLETE})
    async def connected_off_loop(ctx: intloom.StepContext[Seen]) -> str:
        client = await asyncio.to_thread(Client.connect, ROOT, request_timeout=30)
        try:
            ctx.state = Seen(pid=client.status().pid)  # on the loop: refused, not stalled
        finally:
            client.close()
        return "done"
''')


@pytest.fixture
def self_calling(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "selfcall", SELF_CALL))



def test_a_client_on_the_hosts_own_loop_is_refused_at_once_naming_the_fix(
        self_calling: Project) -> None:
    """An async Step connecting to its own project's host blocked the host's event loop for
    the hello's whole timeout (every Run and the CLI stalled 5 s), then failed with "a hung,
    paused or busy host, or another program on the port ... run intloom doctor". It is now
    refused before anything is sent, saying why and how to call it; the way it names works."""
    service = start(self_calling).service
    with Client.connect(self_calling.root) as client:
        failed = client.create_run("selfcall", "loop")
        assert failed.status == "failed", failed
        assert failed.last_error is not None
        assert failed.last_error.code == "INVALID_REQUEST", failed.last_error
        message = failed.last_error.message
        assert f"event loop of this project's host (pid {service.pid})" in message, message
        assert "await asyncio.to_thread(...)" in message, message
        assert "hung, paused or busy" not in message, message
        # The advice holds: the same call on a worker thread reaches the host.
        done = client.create_run("selfcall", "thread")
        assert done.status == "completed", done
        assert client.status().pid == service.pid


def test_a_client_connected_off_the_loop_then_used_on_it_is_refused_at_once(
        self_calling: Project) -> None:
    """A Client connected on a worker thread (asyncio.to_thread) and then called on the
    host's own loop blocked that loop for the request's whole timeout (every Run and the CLI
    stalled), then failed as if the host were hung: only Client.connect was checked. Each
    request is refused before it is sent, as connect is."""
    service = start(self_calling).service
    with Client.connect(self_calling.root) as client:
        failed = client.create_run("selfcall", "later")
        assert failed.status == "failed", failed
        assert failed.last_error is not None
        assert failed.last_error.code == "INVALID_REQUEST", failed.last_error
        message = failed.last_error.message
        assert message.startswith("A Status request was made through a Client on the event "
                                  f"loop of this project's host (pid {service.pid})"), message
        assert "Nothing was sent" in message and "asyncio.to_thread" in message, message
        assert client.status().pid == service.pid  # the host's loop was never held


NAP = textwrap.dedent('''
    import asyncio

    import msgspec

    import intloom


    class Nothing(msgspec.Struct):
        pass


    wf = intloom.Workflow("nap", version="1")
    main = wf.stage("main", state=Nothing)


    @main.step("nap", routes={"done": intloom.COMPLETE})
    async def nap(ctx: intloom.StepContext[Nothing]) -> str:
        await asyncio.sleep(float(ctx.intent))
        return "done"
''')


@pytest.fixture
def napping(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "nap", NAP))


def _in(thread: threading.Thread, function: str) -> bool:
    """True while ``thread`` runs ``function`` (anywhere in its stack)."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


@pytest.mark.parametrize("read", ["wait_run", "subscribe"])
def test_a_read_whose_client_another_thread_closed_is_not_said_to_have_been_acted_on(
        napping: Project, read: str) -> None:
    """A watcher thread in wait_run (or iterating subscribe) whose Client the program closed
    was told "It was not replayed, since the host may have acted on it ... before retrying"
    (and a stream, "No reply came"): a read changes nothing, so it says that it only reads
    and may be sent again on a new connection."""
    start(napping)
    client = Client.connect(napping.root, request_timeout=None)
    failed: list[IntloomError] = []
    try:
        run = client.create_run("nap", "30", wait=False)

        def watch() -> None:
            try:
                if read == "wait_run":
                    client.wait_run(run.run_id)
                else:
                    for _ in client.subscribe(run.run_id):
                        pass
            except IntloomError as exc:
                failed.append(exc)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        eventually(lambda: _in(watcher, "_receive"), what="the request to wait for its reply")
    finally:
        client.close()
    watcher.join(timeout=10)
    assert not watcher.is_alive(), "the read went on after close()"
    (error,) = failed
    assert (error.code, error.retryable) == ("PROJECT_REQUEST_FAILED", True), error
    message = error.message
    assert "this Client was closed (Client.close" in message, message
    assert "may have acted" not in message, message
    assert "It only reads, so nothing changed" in message, message
    if read == "subscribe":
        assert message.startswith(
            f"The event stream of Run {run.run_id} ended before its final event"), message


def test_a_client_whose_host_stopped_says_to_connect_again(project: Project) -> None:
    """One Client kept across a host's stop: its next request said only "connecting again
    failed (CLI_SERVICE_OFFLINE: ... Run intloom start.) Nothing was sent.", and a program
    that started the host and retried on the same Client was refused again. The message now
    says that this Client is done and to connect a new one once a host serves (or, for a
    person at the command line, to run the command again: not to write Python)."""
    start(project)
    with Client.connect(project.root) as client:
        assert stop_service(project.root) is True
        with pytest.raises(IntloomError) as first:
            client.status()
        assert first.value.code == "PROJECT_CONNECTION_FAILED", first.value
        assert first.value.retryable is False
        message = first.value.message
        assert "connecting again failed (CLI_SERVICE_OFFLINE: " in message, message
        assert message.endswith(
            "Nothing was sent. This Client stays closed: once a host serves, connect again "
            "(Client.connect, or the intloom command again) and send it there."), message
        assert isinstance(first.value.__cause__, IntloomError)
        assert first.value.__cause__.code == "CLI_SERVICE_OFFLINE"


def test_a_client_whose_host_was_replaced_says_so_at_every_request(project: Project) -> None:
    """One Client kept across a restart: its first request was refused (another host
    instance runs the project), but every request after it said "the host closed it, and
    connecting again failed", though connecting had worked and found the new host."""
    start(project)
    with Client.connect(project.root) as client:
        old = client.hello.instance_id
        assert stop_service(project.root) is True
        new = start(project).service.instance_id
        assert new != old
        for _ in range(2):
            with pytest.raises(IntloomError) as refused:
                client.status()
            message = refused.value.message
            assert refused.value.code == "PROJECT_CONNECTION_FAILED", refused.value
            assert "connecting again failed" not in message, message
            assert old in message and new in message, message
            assert "Nothing was sent" in message, message


def test_a_hello_failure_keeps_its_words_across_processes(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """A HelloFailed (here a paused host's) raised in a worker process (ProcessPoolExecutor,
    multiprocessing: they pickle it) arrived with the code as its message and its message as
    its cause: "CLI_SERVICE_UNAVAILABLE" was all the program could print."""
    from intloom.client.client import HELLO_CAP_ENV, HelloFailed

    service = start(project).service
    monkeypatch.setenv(HELLO_CAP_ENV, "0.3")
    os.kill(service.pid, signal.SIGSTOP)
    try:
        with pytest.raises(HelloFailed) as failed:
            Client.connect(project.root)
    finally:
        os.kill(service.pid, signal.SIGCONT)
    sent = failed.value
    assert f"The host (pid {service.pid}) is stopped by a signal" in sent.message
    got = pickle.loads(pickle.dumps(sent))
    assert type(got) is HelloFailed
    assert (got.code, got.message, got.cause, got.retryable, got.here, str(got)) == (
        sent.code, sent.message, sent.cause, sent.retryable, sent.here, str(sent))
    # Its repr names its own class: it read "IntloomError(...)" in a log's %r or a REPL.
    assert repr(sent) == f"HelloFailed('CLI_SERVICE_UNAVAILABLE', {sent.message!r})"
    assert repr(got) == repr(sent)


def test_a_request_a_paused_host_outwaits_says_it_is_paused(project: Project) -> None:
    """A host paused (SIGSTOP) under a connected Client: its request timed out with "the
    host did not reply in time" or "paused or hung", though Client.connect names the pause
    and its fix in the same situation."""
    service = start(project).service
    with Client.connect(project.root, request_timeout=0.5) as client:
        run = client.create_run("example", "notes")
        os.kill(service.pid, signal.SIGSTOP)
        try:
            with pytest.raises(IntloomError) as paused:
                client.get_run(run.run_id)
            assert paused.value.code == "PROJECT_REQUEST_FAILED"
            assert paused.value.retryable
            assert paused.value.message.endswith(
                f"The host (pid {service.pid}) is stopped by a signal (SIGSTOP, Ctrl-Z or "
                f"a debugger) and cannot reply until it is resumed: kill -CONT "
                f"{service.pid}."), paused.value.message
            # The next request connects again, and its hello says so too.
            with pytest.raises(IntloomError) as again:
                client.wait_run(run.run_id)
            assert f"Resume it with kill -CONT {service.pid}" in again.value.message
        finally:
            os.kill(service.pid, signal.SIGCONT)
        assert client.get_run(run.run_id).status == "waiting"


def test_a_request_past_its_timeout_leaves_the_client_able_to_follow_the_run(
        napping: Project) -> None:
    """wait_run past request_timeout said to "follow the Run with get_run or wait_run" (and
    create_run, to "find it with runs()"), but the Client refused every later request: "its
    connection broke during an earlier request", which it had not. As after Ctrl-C, the
    connection whose reply may still come is closed and the next request connects again, to
    the same host instance; the timed-out request is never sent again."""
    start(napping)
    with Client.connect(napping.root, request_timeout=0.5) as client:
        run = client.create_run("nap", "30", wait=False)
        with pytest.raises(IntloomError) as waited:
            client.wait_run(run.run_id)
        assert waited.value.code == "PROJECT_REQUEST_FAILED", waited.value
        assert "follow the Run with get_run or wait_run" in waited.value.message
        now = client.get_run(run.run_id)
        assert (now.run_id, now.status) == (run.run_id, "running"), now
        with pytest.raises(IntloomError) as created:
            client.create_run("nap", "30")
        assert "find it with runs()" in created.value.message, created.value
        naps = [view for view in client.runs() if view.flow_name == "nap"]
        assert len(naps) == 2, naps  # the timed-out create_run was sent once, not again


def test_a_host_starting_over_a_crashed_hosts_service_json_is_said_to_be_starting(
        project: Project) -> None:
    """A start over a service.json a dead host left (its lock gone, so start goes ahead and
    replaces the file once it serves): for the whole start-up, Client.connect said
    CLI_SERVICE_OFFLINE, "service.json names pid N, which no longer exists ... Run intloom
    status", not retryable, while a host was starting. It is now ServiceStarting, naming the
    starting host, retryable, as when no service.json is left."""
    first = start(project).service
    left = (project.state / "service.json").read_bytes()
    assert stop_service(project.root) is True
    eventually(lambda: not pid_alive(first.pid), what="the first host to exit")
    (project.state / "service.json").write_bytes(left)  # as a crash leaves it
    (project.state / "service.json").chmod(0o600)
    source = project.root / "workflows" / "example.py"
    hold = project.root / "hold"
    source.write_bytes(source.read_bytes().replace(
        b"import msgspec\n", b"import msgspec\nimport pathlib, time\n"
        b"while (pathlib.Path(__file__).parent.parent / 'hold').exists(): time.sleep(0.01)\n",
        1))
    hold.write_text("")
    starting, started = start_on_a_thread(project, timeout=60)
    try:
        eventually(lambda: not lock_free(project.state / "service.lock"), timeout=30,
                   what="the new host to hold its lock")
        project.track_host()
        pid = json.loads((project.state / "service.lock").read_bytes())["pid"]
        assert json.loads((project.state / "service.json").read_bytes())["pid"] == first.pid
        with pytest.raises(IntloomError) as refused:
            Client.connect(project.root)
        assert isinstance(refused.value, ServiceStarting), refused.value
        assert refused.value.code == "CLI_SERVICE_UNAVAILABLE"
        assert refused.value.retryable is True
        assert f"The service is starting (pid {pid}" in refused.value.message
    finally:
        hold.unlink(missing_ok=True)
        starting.join(timeout=60)
    assert len(started) == 1 and not isinstance(started[0], IntloomError), started
    with Client.connect(project.root) as client:
        assert client.status().pid == pid


def test_a_client_closed_while_it_connects_again_stays_closed(project: Project) -> None:
    """A Client whose stream was closed early connects again before its next request; a
    close() from another thread while that hello waited (a busy host) was undone when it
    completed: the request went out, every later one too, and the new socket was never
    closed (a ResourceWarning at exit). The closed Client now stays closed, nothing sent."""
    service = start(project).service
    client = Client.connect(project.root, timeout=30)
    outcome: list[object] = []
    try:
        run = client.create_run("example", "notes")
        for _ in client.subscribe(run.run_id):
            break  # the stream's connection is closed: the next request connects again

        def ask() -> None:
            try:
                outcome.append(client.status())
            except IntloomError as exc:
                outcome.append(exc)

        asking = threading.Thread(target=ask, daemon=True)
        os.kill(service.pid, signal.SIGSTOP)  # the hello waits until SIGCONT
        try:
            asking.start()
            eventually(lambda: _in(asking, "_reconnect") and _in(asking, "recv_frame"),
                       what="the request to wait in its new connection's hello")
            client.close()
        finally:
            os.kill(service.pid, signal.SIGCONT)
        asking.join(timeout=30)
        assert not asking.is_alive()
        (refused,) = outcome
        assert isinstance(refused, IntloomError), refused
        assert refused.code == "PROJECT_CONNECTION_FAILED", refused
        assert refused.message.startswith(
            "This Client has no connection: it was closed (Client.close"), refused.message
        assert "Nothing was sent" in refused.message
        with pytest.raises(IntloomError) as after:
            client.status()
        assert after.value.code == "PROJECT_CONNECTION_FAILED"
    finally:
        client.close()


@pytest.mark.parametrize("wrong", ["", "d1614619-99c9-4cd1-842f-5201ad0a1786"])
def test_a_stop_naming_another_instance_says_which_id_to_pass(
        project: Project, wrong: str) -> None:
    """Client.stop with an id that is not this host's said "not ; the stop request was
    refused. Check intloom status and retry" (an empty id unquoted, and a retry with it is
    refused the same). It now quotes the id, says the host runs on, and which id to pass."""
    service = start(project).service
    with Client.connect(project.root) as client:
        with pytest.raises(IntloomError) as refused:
            client.stop(wrong)
        assert refused.value.code == "CONFLICT"
        assert refused.value.message == (
            f"This host is instance {service.instance_id}, not {wrong!r}; the stop request "
            "was refused and the host runs on. Pass the id of the host to stop: the one its "
            "hello gave (Client.stop(client.hello.instance_id)), or intloom status shows it.")
        assert client.status().instance_id == service.instance_id


def test_a_stream_whose_host_died_says_the_stream_ended_not_that_no_reply_came(
        napping: Project) -> None:
    """A subscribe stream cut by its host's death, after events had come, said "No reply came
    for following the Run": it now says the event stream ended before its final event, and
    to subscribe again once a host runs."""
    start(napping)
    client = Client.connect(napping.root)
    seen = 0
    try:
        run = client.create_run("nap", "30", wait=False)
        with pytest.raises(IntloomError) as cut:
            for _ in client.subscribe(run.run_id):
                seen += 1
                if seen == 1:
                    napping.kill_host()
    finally:
        client.close()
    assert seen >= 1
    assert (cut.value.code, cut.value.retryable) == ("PROJECT_REQUEST_FAILED", True), cut.value
    message = cut.value.message
    assert message.startswith(
        f"The event stream of Run {run.run_id} ended before its final event: the connection "
        "closed: the host may have stopped or crashed"), message
    assert "No reply came" not in message
    assert message.endswith("It only reads, so it is safe to send again: run intloom status, "
                            f"then subscribe again (intloom attach {run.run_id}) once a host "
                            "runs."), message


_SHARED: list[Client] = []  # the parent's Client, as a forked pool's workers inherit it


def _read_in_child(job: tuple[int, list[str]]) -> tuple[int, list[str]]:
    """In a forked worker: read each Run through the inherited Client, many times over."""
    turn, run_ids = job
    client = _SHARED[0]
    wrong = []
    for k in range(60):
        run_id = run_ids[(turn + k) % len(run_ids)]
        got = client.get_run(run_id).run_id
        if got != run_id:
            wrong.append(f"{run_id} read as {got}")
    return os.getpid(), wrong


def test_processes_forked_after_connect_each_read_their_own_replies(project: Project) -> None:
    """A Client made before a multiprocessing pool (fork, Linux's default): the workers and
    the parent read replies off one socket, each taking the others' -- another Run's view,
    with no error, until a frame read from its middle failed."""
    import multiprocessing

    start(project)
    with Client.connect(project.root) as client:
        run_ids = [client.create_run("example", f"fork {i}").run_id for i in range(6)]
        _SHARED[:] = [client]
        try:
            with multiprocessing.get_context("fork").Pool(3) as pool:
                pending = pool.map_async(_read_in_child, [(i, run_ids) for i in range(6)])
                # The parent goes on with its own connection meanwhile.
                for k in range(60):
                    run_id = run_ids[k % len(run_ids)]
                    assert client.get_run(run_id).run_id == run_id
                results = pending.get(timeout=40)
        finally:
            _SHARED.clear()
        assert {pid for pid, _ in results} - {os.getpid()}, results
        assert [wrong for _, wrong in results if wrong] == []
        # The parent's connection was left as it was: it still serves, unshaken.
        assert {view.run_id for view in client.runs()} == set(run_ids)
