"""Runs across the host's lifecycle: a wait survives stop/start, and hostile traffic on the
socket never disturbs a Run in flight."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import threading
import time
from typing import Any

import pytest

from intloom.client import lifecycle
from intloom.client.client import Client
from intloom.client.lifecycle import stop_service, stop_service_report
from intloom.errors import IntloomError
from intloom.executor import clock
from intloom.protocol.messages import MAX_FRAME, RunEvent
from intloom.runtime.model import RunView
from tests.helpers import Project, eventually, foreground_host, pid_alive, snapshot_files
from tests.integration.host_support import (
    closed,
    connection_closed,
    encode,
    error_code,
    hello_frame,
    raw,
    reply,
    start,
)

GATED = textwrap.dedent('''
    """A Step that blocks on a gate file, so a test can hold a Run in flight."""

    from __future__ import annotations

    import time
    from pathlib import Path

    import msgspec

    import intloom


    class Box(msgspec.Struct):
        value: str = ""


    wf = intloom.Workflow("gated", version="1.0.0")
    main = wf.stage("main", state=Box)
    HERE = Path(__file__).resolve().parent.parent


    def held_call(intent: str) -> str:
        with open(HERE / "calls.log", "a") as fh:
            fh.write(intent + "\\n")
        deadline = time.monotonic() + 30  # longer than any test holds it
        while not (HERE / "gate").exists():
            if time.monotonic() > deadline:  # fails the Run, with why, not a hang
                raise TimeoutError(f"{HERE / 'gate'} was not created within 30 s: the test "
                                   "holding this Step never let it go on")
            time.sleep(0.01)  # user code: an external call that takes a while
        return intent.upper()


    @main.step("work", routes={"done": "review"})
    def work(ctx: intloom.StepContext[Box]) -> str:
        ctx.state = Box(value=ctx.effect("held-call", held_call, ctx.intent))
        return "done"


    @main.step("review", routes={"ok": intloom.COMPLETE, "no": "work"})
    async def review(ctx: intloom.StepContext[Box]) -> str:
        answer = await ctx.confirm({"value": ctx.state.value})
        return "ok" if answer.confirmed else "no"
''')


def test_waiting_run_survives_stop_and_start_then_completes(project: Project) -> None:
    start(project)
    with Client.connect(project.root) as client:
        waiting = client.create_run("example", "release notes")
    assert waiting.status == "waiting"
    assert waiting.pending_action is not None
    action_id = waiting.pending_action.id
    assert stop_service(project.root) is True

    restarted = start(project).service
    assert restarted.restore is not None
    assert restarted.restore.waiting == [waiting.run_id]
    with Client.connect(project.root) as client:
        assert client.get_run(waiting.run_id) == waiting
        assert [r.run_id for r in client.runs()] == [waiting.run_id]
        # An empty action id was CONFLICT, "Action  is not (or no longer) ...".
        with pytest.raises(IntloomError) as empty:
            client.answer(waiting.run_id, "", {"isConfirmed": True})
        assert empty.value.code == "INVALID_REQUEST", empty.value
        assert empty.value.message.startswith("action_id is empty; give the id of the action")
        done = client.answer(waiting.run_id, action_id, {"isConfirmed": True})
    assert done.status == "completed"

    assert stop_service(project.root) is True
    start(project)
    with Client.connect(project.root) as client:
        assert client.runs() == []  # terminal Runs of earlier hosts are never reloaded
        # Its stream is its end alone: the first batch's last event, so caught up (a client
        # waiting for the mark, as the host advertises it, never saw it here).
        [end] = list(client.subscribe(waiting.run_id))
        assert (end.event, end.final, end.caught_up) == ("end", True, True), end


def test_hostile_traffic_never_disturbs_a_run_in_flight(project: Project) -> None:
    (project.root / "workflows" / "gated.py").write_text(GATED)
    (project.root / "intloom.toml").write_text(
        'workflows = ["workflows/example.py", "workflows/gated.py"]\n'
    )
    service = start(project).service
    run = _gated_run_started(project)

    payloads = [
        b"GET / HTTP/1.1\r\n\r\n",
        (MAX_FRAME + 1).to_bytes(4, "big"),
        hello_frame("A" * 43),
        encode({"op": "cancel", "runId": run.run_id}),  # before the hello: refused
    ]
    for payload in payloads:
        with raw(service.port) as sock:
            sock.sendall(payload)
            assert error_code(reply(sock)) in {"INVALID_REQUEST", "UNAUTHORIZED"}
            assert closed(sock)
    half_open = raw(service.port)
    half_open.sendall(b"\x00\x00\x10")  # three bytes of a header, then silence
    try:
        with Client.connect(project.root) as client:
            assert client.get_run(run.run_id).status == "running"
        (project.root / "gate").touch()
        with Client.connect(project.root) as client:
            waiting = client.wait_run(run.run_id)
            assert waiting.status == "waiting"
            assert waiting.pending_action is not None
            assert waiting.pending_action.request == {"context": {"value": "PAYLOAD"}}
            done = client.answer(run.run_id, waiting.pending_action.id, {"isConfirmed": True})
        assert done.status == "completed"
    finally:
        half_open.close()
    assert (project.root / "calls.log").read_text() == "payload\n"  # the effect ran once


def test_stop_while_a_step_runs_suspends_it_and_restart_reports_interrupted(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INTLOOM_TEST_SUSPEND_GRACE", "0.5")
    (project.root / "workflows" / "gated.py").write_text(GATED)
    (project.root / "intloom.toml").write_text('workflows = ["workflows/gated.py"]\n')
    start(project)
    seen: list[RunView] = []

    def flow() -> None:  # a client waiting on the Run, as `intloom flow` does
        with Client.connect(project.root) as client:
            seen.append(client.create_run("gated", "payload"))

    waiter = threading.Thread(target=flow)
    waiter.start()
    try:
        eventually(lambda: (project.root / "calls.log").exists(), timeout=10,
                   what="the effect to start")
        stopped = project.cli("stop", "--timeout", "20")
    finally:
        waiter.join(timeout=30)
    assert stopped.code == 0, stopped.stderr
    # The waiting client is not told the Run continues from a saved boundary.
    [run] = seen
    assert run.last_error is not None and run.last_error.code == "RUN_INTERRUPTED"
    assert "It stopped while Step main/work was running effect 'held-call'" in (
        run.last_error.message), run.last_error.message
    assert "continues from its last saved boundary" not in run.last_error.message
    assert run.phase == "effect_started"  # suspended, not over: the next start decides
    # The stop says which Run it cut, and not that every Run was suspended at a checkpoint.
    lines = stopped.stdout.splitlines()
    assert ("1 Run still had a Step, Tool or on_complete running when the stop began that "
            "did not reach its checkpoint (the stop's grace ran out") in lines[0], lines
    assert "RUN_INTERRUPTED" in lines[0]
    assert lines[1].startswith(f"  {run.run_id}: Step main/work was running effect 'held-call'")
    assert len(lines) == 2, lines  # it was the only unfinished Run: no "other" to suspend
    view = _restarted_interrupted(project, run.run_id)
    assert view.last_error is not None and "held-call" in view.last_error.message
    # Over (docs/cli.md: a program tests ``phase``), though its journal ends at the effect.
    assert view.phase == "terminal", view
    assert project.cli("inspect", run.run_id, "--json").json["run"]["phase"] == "effect_started"
    # Never replayed: the effect was called once, by the first host.
    (project.root / "gate").touch()
    assert (project.root / "calls.log").read_text() == "payload\n"
    # With no Step running, the stop suspended nothing; the Run restored as interrupted
    # (not dismissed) comes back so at the next start, and the stop says so.
    again = project.cli("stop", "--timeout", "20")
    assert again.code == 0, again.stderr
    assert again.stdout == (
        "The original service instance stopped. 1 Run stays unfinished as this host found or "
        "left it (interrupted earlier and not dismissed, held, or failed by a checkpoint): the "
        "next start reports it again (intloom doctor previews it).\n"), again.stdout



def test_a_foreground_host_stopped_by_ctrl_c_names_the_run_it_cut(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C on ``start --foreground`` is the same stop as ``intloom stop``: a Step still
    running when the grace ends is cut, and the terminal is told which Run the next start
    reports RUN_INTERRUPTED, not only that checkpoints are kept."""
    monkeypatch.setenv("INTLOOM_TEST_SUSPEND_GRACE", "0.2")
    (project.root / "workflows" / "gated.py").write_text(GATED)
    (project.root / "intloom.toml").write_text('workflows = ["workflows/gated.py"]\n')
    with foreground_host(project) as proc:
        with Client.connect(project.root) as client:
            run = client.create_run("gated", "payload", wait=False)
        eventually(lambda: (project.root / "calls.log").exists(), timeout=10,
                   what="the effect to start")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    (project.root / "gate").touch()
    assert proc.returncode == 0, (out, err)
    assert "Traceback" not in err
    lines = err.splitlines()
    assert lines[-2].startswith(
        "The service stopped; checkpoints are kept for the next intloom start. 1 Run still "
        "had a Step, Tool or on_complete running when the stop began that did not reach its "
        "checkpoint"), lines
    assert "RUN_INTERRUPTED" in lines[-2]
    assert lines[-1].startswith(f"  {run.run_id}: Step main/work was running effect "
                                "'held-call'"), lines


def _restarted_interrupted(project: Project, run_id: str) -> RunView:
    """Start the host again: ``run_id`` is restored, and only it, as RUN_INTERRUPTED."""
    restarted = start(project).service
    assert restarted.restore is not None
    assert restarted.restore.interrupted == [run_id]
    with Client.connect(project.root) as client:
        view = client.get_run(run_id)
    assert view.status == "failed"
    assert view.last_error is not None and view.last_error.code == "RUN_INTERRUPTED"
    return view


STUBBORN = textwrap.dedent('''
    """Async Steps that never reach a boundary: one swallows its cancellation, one waits on
    a thread of the default executor."""

    from __future__ import annotations

    import asyncio
    import time
    from pathlib import Path

    import msgspec

    import intloom


    class Box(msgspec.Struct):
        value: str = ""


    wf = intloom.Workflow("stubborn", version="1.0.0")
    main = wf.stage("main", state=Box)
    HERE = Path(__file__).resolve().parent.parent


    @main.step("pick", routes={"spin": "spin", "block": "block"})
    def pick(ctx: intloom.StepContext[Box]) -> str:
        return ctx.intent


    @main.step("spin", routes={"done": intloom.COMPLETE})
    async def spin(ctx: intloom.StepContext[Box]) -> str:
        (HERE / "spinning").touch()
        while True:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                pass  # user code that ignores the host's cancellation


    @main.step("block", routes={"done": intloom.COMPLETE})
    async def block(ctx: intloom.StepContext[Box]) -> str:
        (HERE / "spinning").touch()
        # Cancelling the Step ends its task, but the thread sleeps on in the default executor.
        await asyncio.to_thread(time.sleep, 120)
        return "done"
''')


@pytest.mark.parametrize("intent", ["spin", "block"])
def test_a_step_that_swallows_cancellation_does_not_outlive_the_stop(
    project: Project, monkeypatch: pytest.MonkeyPatch, intent: str
) -> None:
    monkeypatch.setenv("INTLOOM_TEST_SUSPEND_GRACE", "0.5")
    (project.root / "workflows" / "stubborn.py").write_text(STUBBORN)
    (project.root / "intloom.toml").write_text('workflows = ["workflows/stubborn.py"]\n')
    pid = start(project).service.pid
    with Client.connect(project.root) as client:
        run = client.create_run("stubborn", intent, wait=False)
    eventually(lambda: (project.root / "spinning").exists(), timeout=10,
               what="the Step to start")
    runtime = project.state / "runtime"
    stopped = stop_service_report(project.root, timeout=20)
    assert stopped.stopped is True
    # Named as cut, even by a Step that swallows its cancellation.
    assert [cut.run_id for cut in stopped.cut] == [run.run_id], stopped
    journal = snapshot_files(runtime)  # the stop's final checkpoint
    # The stop released everything; the process follows within a bound, whatever the Step does.
    eventually(lambda: not pid_alive(pid), timeout=10, what=f"host pid {pid} to exit")
    assert snapshot_files(runtime) == journal
    (log,) = (project.state / "logs").iterdir()
    # Only a task that ignored its cancellation is reported abandoned (the stop's own
    # helpers never are); the blocked thread is not a task.
    assert ("tasks_abandoned" in log.read_text()) == (intent == "spin")
    _restarted_interrupted(project, run.run_id)


def test_a_client_whose_stream_was_closed_early_serves_the_next_request(
    project: Project,
) -> None:
    """A program that reads a Run's history and stops (`break`, or the generator closed)
    found its Client unusable: the next request raised "This client is closed. Connect
    again." although the program never closed it. Nothing is in flight then, so the Client
    connects again -- to the same host instance only, as after an idle close."""
    start(project)
    with Client.connect(project.root) as client:
        waiting = client.create_run("example", "notes")
        for event in client.subscribe(waiting.run_id):
            if event.run.status == "waiting":
                break  # the generator is closed when the loop's iterator is dropped
        assert client.get_run(waiting.run_id).status == "waiting"
        stream = client.subscribe(waiting.run_id)
        next(stream)
        stream.close()
        assert [r.run_id for r in client.runs()] == [waiting.run_id]
    with pytest.raises(IntloomError) as closed_by_us:  # closed by the program: stays closed
        client.get_run(waiting.run_id)
    assert closed_by_us.value.code == "PROJECT_CONNECTION_FAILED"
    assert "Client.close" in closed_by_us.value.message, closed_by_us.value.message


def test_a_closed_client_stays_closed_when_its_open_stream_is_dropped_later(
    project: Project,
) -> None:
    """``close()`` while a subscribe stream was open, the stream dropped after: closing the
    stream marked the Client as one to connect again, and its next request quietly did.
    A Client the program closed stays closed."""
    start(project)
    with Client.connect(project.root) as client:
        waiting = client.create_run("example", "notes")
        stream = client.subscribe(waiting.run_id)
        next(stream)
        client.close()
        stream.close()
        with pytest.raises(IntloomError) as closed_by_us:
            client.get_run(waiting.run_id)
    assert closed_by_us.value.code == "PROJECT_CONNECTION_FAILED"
    assert "Client.close" in closed_by_us.value.message, closed_by_us.value.message


class _Interrupted(BaseException):
    """Raised by a signal handler in the main thread, as Ctrl-C raises KeyboardInterrupt."""


def test_a_stream_interrupted_as_its_request_went_leaves_the_client_usable(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C just as subscribe's request went out: the host streamed on a connection the
    Client kept for requests, and the next one read an event as its reply
    (PROJECT_RESPONSE_INVALID), which closed the Client for good."""
    from intloom.protocol.messages import Subscribe

    start(project)
    real = Client._send
    once = [True]

    def sent_then_interrupted(self: Client, request: Any) -> Any:
        sock = real(self, request)
        if isinstance(request, Subscribe) and once[0]:
            once[0] = False
            raise _Interrupted  # as a signal handler raises it when sendall returns
        return sock

    monkeypatch.setattr(Client, "_send", sent_then_interrupted)
    with Client.connect(project.root) as client:
        waiting = client.create_run("example", "notes")
        with pytest.raises(_Interrupted):
            next(client.subscribe(waiting.run_id))
        assert not once[0]
        assert client.get_run(waiting.run_id).status == "waiting"
        stream = client.subscribe(waiting.run_id)  # not "already streaming"
        assert next(stream).run.run_id == waiting.run_id
        stream.close()
        assert client.get_run(waiting.run_id).status == "waiting"


def test_a_stream_interrupted_in_its_wait_leaves_the_client_usable(project: Project) -> None:
    """A stream interrupted while it waits for the next event (Ctrl-C, say): only a closed
    generator shut its connection, so the next request went out on the half-read stream
    and failed "the host may have stopped or crashed". The stream's connection is shut
    as a closed one's is, and the next request connects again."""
    start(project)
    main = threading.main_thread().ident
    assert main == threading.get_ident()

    def interrupt(signum: int, frame: Any) -> None:
        raise _Interrupted

    def in_its_wait() -> bool:
        frame = sys._current_frames().get(main)  # where the main thread is now
        while frame is not None:
            if frame.f_code.co_name == "recv_frame":
                return True
            frame = frame.f_back
        return False

    def when_it_waits() -> None:
        eventually(in_its_wait, timeout=10, what="subscribe to wait for the next event")
        os.kill(os.getpid(), signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        with Client.connect(project.root) as client:
            waiting = client.create_run("example", "notes")
            stream = client.subscribe(waiting.run_id)
            while next(stream).run.status != "waiting":
                pass  # the history, up to the Run's wait: the stream waits for live events
            sender = threading.Thread(target=when_it_waits)
            sender.start()
            with pytest.raises(_Interrupted):
                next(stream)
            sender.join(timeout=10)
            assert client.get_run(waiting.run_id).status == "waiting"
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_subscribe_streams_history_then_live_events_until_final(project: Project) -> None:
    start(project)
    with Client.connect(project.root) as client:
        waiting = client.create_run("example", "notes")
    assert waiting.pending_action is not None
    events: list[RunEvent] = []
    follower = Client.connect(project.root)
    stream = follower.subscribe(waiting.run_id)
    try:
        while True:  # the history, up to the wait
            event = next(stream)
            events.append(event)
            if event.run.status == "waiting":
                break
        assert all(e.history for e in events)
        assert events[0].event == "stage_pending"
        with Client.connect(project.root) as client:
            client.answer(waiting.run_id, waiting.pending_action.id, {"isConfirmed": True})
        live = list(stream)
    finally:
        follower.close()
    assert live, "no live events after the answer"
    assert not any(e.history for e in live)
    assert live[-1].final
    assert live[-1].run.status == "completed"
    # The last flush holds the last step_result and the terminal, both with the ended view:
    # the stream ends after the terminal, not at the first of them.
    assert [e.event for e in live[-2:]] == ["step_result", "terminal"]
    assert all(not e.final for e in [*events, *live[:-1]])


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_a_restored_runs_history_includes_what_the_earlier_host_did(
    project: Project, how: str
) -> None:
    """attach shows "the Run's history so far": after a restart that is the earlier host's
    records too (read from the journal), each event with the cursor of its own record,
    then ``restored``. It used to start at ``restored``."""
    start(project)
    with Client.connect(project.root) as client:
        waiting = client.create_run("example", "notes")
    before: list[tuple[str, str | None, str]] = []
    follower = Client.connect(project.root)
    try:
        for e in follower.subscribe(waiting.run_id):  # its history, up to the wait
            if e.event != "created":  # an announcement, not a record
                before.append((e.event, e.run.cursor.step, e.run.status))
            if e.run.status == "waiting":
                break
    finally:
        follower.close()
    assert before and before[-1] == ("waiting", "review", "waiting")
    # Each event shows its own record's Step, though one flush held write's end and
    # review's start (they all showed review).
    assert ("step_result", "write", "running") in before
    assert ("effect_done", "write", "running") in before
    if how == "stop":
        assert stop_service(project.root, timeout=20) is True
    else:
        project.kill_host()
        assert project.cli("recover", "--json").code == 0
    restart_at = clock.now()
    start(project)
    follower = Client.connect(project.root)
    stream = follower.subscribe(waiting.run_id)
    try:
        history = []
        while True:
            event = next(stream)
            assert event.history, event
            history.append(event)
            if event.event == "restored":
                break
    finally:
        follower.close()
    assert [(e.event, e.run.cursor.step, e.run.status) for e in history[:-1]] == before
    assert history[0].event == "stage_pending"
    assert [e.omitted for e in history] == [0] * len(history)  # the whole of it: no marker
    effect = next(e for e in history if e.event == "effect_done")
    assert effect.run.cursor.step == "write" and effect.detail == {
        "name": "compose", "key": "compose#1"}
    assert history[-1].run.status == "waiting"
    assert history[-1].run.pending_action == waiting.pending_action
    # ``restored`` says when: the view's updatedAt is the earlier host's last record's.
    assert history[-1].detail["at"] >= restart_at > history[-1].run.updated_at, (
        history[-1].detail, restart_at, history[-1].run.updated_at)


def test_a_followers_suspended_event_says_when_the_host_stopped(project: Project) -> None:
    """A stop writes no record, so the view's updatedAt is the Run's last record's: the
    ``suspended`` event carries the stop's own time (attach prints it)."""
    start(project)
    with Client.connect(project.root) as client:
        waiting = client.create_run("example", "notes")
    assert waiting.status == "waiting"
    follower = Client.connect(project.root)
    rest: list[RunEvent] = []
    reader = threading.Thread(target=lambda: rest.extend(follower.subscribe(waiting.run_id)))
    try:
        reader.start()
        eventually(lambda: any(e.event == "waiting" for e in rest), what="the Run's history")
        stop_at = clock.now()
        assert stop_service(project.root, timeout=20) is True
        reader.join(timeout=20)
        assert not reader.is_alive(), "the stream did not end with the host's stop"
    finally:
        follower.close()
        reader.join(timeout=10)
    suspended = [e for e in rest if e.event == "suspended"]
    assert len(suspended) == 1, [e.event for e in rest]
    at = suspended[0].detail["at"]
    assert at >= stop_at > suspended[0].run.updated_at, (at, stop_at, suspended[0].run)


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_a_restored_interrupted_runs_events_show_it_failed(
    asks_project: Project, how: str
) -> None:
    """Each event shows the Run's status after it: from ``restored`` on, a Run restored as
    RUN_INTERRUPTED is failed. ``restored`` and the closing ``end`` used to show the status
    of its last record (waiting), as if the wait could still be answered."""
    project = asks_project
    start(project)
    with Client.connect(project.root) as client:
        waiting = client.create_run("triage", "ticket 7")
    assert waiting.status == "waiting"
    if how == "stop":
        assert stop_service(project.root, timeout=20) is True
    else:
        project.kill_host()
        assert project.cli("recover", "--json").code == 0
    restored = start(project).service.restore
    assert restored is not None and restored.interrupted == [waiting.run_id]
    with Client.connect(project.root) as client:
        events = list(client.subscribe(waiting.run_id))
    names = [e.event for e in events]
    assert "restored" in names and events[-1].final, names
    at = names.index("restored")
    earlier, after = events[:at], events[at:]
    # What the earlier host did is shown as it was: the Run ran, then waited.
    assert earlier[-1].event == "waiting" and earlier[-1].run.status == "waiting"
    for event in after:
        assert event.run.status == "failed", (event.event, event.run.status)
        assert event.run.last_error is not None
        assert event.run.last_error.code == "RUN_INTERRUPTED", event.event
        assert event.run.pending_action is None, event.event


def test_a_command_during_a_stop_is_told_the_host_is_stopping(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the stop waits for a Step (the grace), the host still answers: commands get
    CLI_SERVICE_CLOSING, not a closed port, and status does not call it a stuck owner."""
    # A grace no check below can outlast: with 3 s, two CLI commands on a loaded machine
    # took longer, the host had stopped, and status said "offline". The gate opens once the
    # start below has been told the host is stopping, so nobody waits the grace out.
    monkeypatch.setenv("INTLOOM_TEST_SUSPEND_GRACE", "40")
    (project.root / "workflows" / "gated.py").write_text(GATED)
    (project.root / "intloom.toml").write_text('workflows = ["workflows/gated.py"]\n')
    start(project)
    _gated_run_started(project)
    stopped: list[bool] = []
    stopper = threading.Thread(target=lambda: stopped.append(stop_service(project.root,
                                                                          timeout=30)))
    stopper.start()
    try:
        def closing() -> dict[str, Any] | None:
            result = project.cli("runs", "--json")
            error = (result.json or {}).get("error")
            return error if error and error["code"] == "CLI_SERVICE_CLOSING" else None

        error = eventually(closing, timeout=10, what="runs to be refused as closing")
        assert "shutting down" in error["message"], error
        status = project.cli("status", "--json")
        # Said for status, not the refusal of a request (no request was refused).
        assert status.json["message"] == (
            "The service is shutting down: it is suspending its Runs, then exits. intloom "
            "status says offline once it has; intloom start waits for that, then starts a "
            "new host."), status.stdout
        # A start meanwhile waits for the stopping host to let go, then launches a new one.
        real_live_service = lifecycle._live_service
        told: list[str] = []

        def live_service(root: Any) -> Any:  # the real one; the Step goes on once refused
            try:
                return real_live_service(root)
            except IntloomError as exc:
                if exc.code == "CLI_SERVICE_CLOSING" and not told:
                    told.append(exc.code)
                    (project.root / "gate").touch()
                raise

        monkeypatch.setattr(lifecycle, "_live_service", live_service)
        restarted = start(project, timeout=30)
        assert told == ["CLI_SERVICE_CLOSING"], "the start never met the stopping host"
        assert restarted.reused is False
    finally:
        (project.root / "gate").touch()  # the Step reaches its boundary; the stop completes
        stopper.join(timeout=40)
    assert stopped == [True]


AGENT_TASK = textwrap.dedent('''
    from typing import Any

    import intloom

    wf = intloom.Workflow("agentic", version="1")
    main = wf.stage("main")


    @main.agent_step("look", routes={"found": intloom.COMPLETE})
    def look(ctx: intloom.StepContext[None]) -> Any:
        return {"topic": ctx.intent}
''')


def test_a_wait_longer_than_the_request_timeout_says_the_run_goes_on(project: Project) -> None:
    """A Step that runs longer than the Python client's request timeout (300 s by default;
    an LLM chain can): create_run said "the host did not reply in time ... once a host
    runs, check with intloom runs", as if the host were gone. It is fine, and the Run goes
    on: the message says so, and how to wait as long as the Steps take."""
    (project.root / "workflows" / "gated.py").write_text(GATED)
    (project.root / "intloom.toml").write_text(
        'workflows = ["workflows/example.py", "workflows/gated.py"]\n'
    )
    start(project)
    try:
        with (Client.connect(project.root, request_timeout=0.5) as client,
              pytest.raises(IntloomError) as late):
            client.create_run("gated", "slow")
        message = late.value.message
        assert late.value.code == "PROJECT_REQUEST_FAILED"
        assert "once a host runs" not in message, message
        assert "within 0.5 s" in message and "may still be going on" in message, message
        assert "request_timeout=None" in message and "wait=False" in message, message
        with Client.connect(project.root) as client:
            [run] = [r for r in client.runs() if r.flow_name == "gated"]
            assert run.status == "running"  # created, and going on
    finally:
        (project.root / "gate").touch()


def _gated_run_started(project: Project, client: Client | None = None) -> RunView:
    """A Run of the gated Workflow, created (through ``client``, else a connection of its
    own) and seen running its effect: its Step holds a stop in its grace."""
    if client is None:
        with Client.connect(project.root) as own:
            return _gated_run_started(project, own)
    run = client.create_run("gated", "payload", wait=False)
    eventually(lambda: (project.root / "calls.log").exists(), timeout=10,
               what="the effect to start")
    return run


def _beside_gated(project: Project, monkeypatch: pytest.MonkeyPatch, grace: str,
                  other: str = "example", *, recover: bool = True) -> None:
    """Start a host with the gated Workflow (its Step holds a stop in its grace, ``grace``
    seconds, until the gate file exists) beside ``other``: the example (its wait without
    recover unless ``recover``) or agentic (an Agent task)."""
    monkeypatch.setenv("INTLOOM_TEST_SUSPEND_GRACE", grace)
    if not recover:
        example = project.root / "workflows" / "example.py"
        text = example.read_text()
        example.write_text(text[:text.index("@review.recover")])  # its wait without recover
    (project.root / "workflows" / "gated.py").write_text(GATED)
    if other == "agentic":
        (project.root / "workflows" / "agentic.py").write_text(AGENT_TASK)
    (project.root / "intloom.toml").write_text(
        f'workflows = ["workflows/{other}.py", "workflows/gated.py"]\n')
    start(project)


def _refused_during_a_stop(client: Client, project: Project,
                           requests: dict[str, Any]) -> dict[str, str]:
    """Stop the host (a gated Run holds the stop in its grace until the gate opens) and send
    each request on ``client``'s connection, opened before: each one's refusal message."""
    stopped: list[bool] = []
    stopper = threading.Thread(
        target=lambda: stopped.append(stop_service(project.root, timeout=30)))
    stopper.start()
    messages: dict[str, str] = {}
    try:
        def closing() -> bool:
            try:
                client.workflows()
            except IntloomError as exc:
                return exc.code == "CLI_SERVICE_CLOSING"
            return False

        eventually(closing, timeout=10, what="the stop to begin")
        for name, send in requests.items():
            with pytest.raises(IntloomError) as refusal:
                send()
            assert refusal.value.code == "CLI_SERVICE_CLOSING", refusal.value
            messages[name] = refusal.value.message
    finally:
        (project.root / "gate").touch()
        stopper.join(timeout=40)
    assert stopped == [True]
    return messages


def _gate_opens_at_the_next_hello(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next stop_service opens the gate (the held Step reaches its boundary, and the
    host's stop completes) once its hello is answered or refused: by then it has seen the
    host. A gate opened before it looks lets a loaded machine finish that stop first, and
    the stop then finds the host offline (``False``) instead of waiting for it."""

    class OpensTheGate(Client):
        @classmethod
        def connect(cls, root: Any, **kwargs: Any) -> Client:
            try:
                return Client.connect(root, **kwargs)
            finally:
                (project.root / "gate").touch()

    monkeypatch.setattr(lifecycle, "Client", OpensTheGate)


def test_a_stop_that_times_out_while_the_host_stops_says_to_run_stop_again(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``stop --timeout`` ending while the host was still suspending its Runs (a Step in
    its grace) said "Run intloom doctor", as for a host that may be hung: the stop is under
    way, and what helps is to wait for it. Both the stop that sent the request and one run
    meanwhile (its hello refused: the host is stopping) say so; a further stop then ends
    once the Step reaches its boundary."""
    _beside_gated(project, monkeypatch, "20")
    _gated_run_started(project)
    pid = project.host_pid()
    try:
        for said in ("The stop request was sent once and not resent.",
                     "The stop request was not sent: the host was already stopping."):
            timed_out = project.cli("stop", "--timeout", "1", "--json")
            assert timed_out.code == 1, (timed_out.stdout, timed_out.stderr)
            error = timed_out.json["error"]
            message = error["message"]
            assert error["code"] == "CLI_SERVICE_TIMEOUT", error
            assert message.startswith(f"The host (pid {pid}) is still stopping: "), message
            assert said in message, message
            assert "Run intloom stop again to wait for it" in message, message
            assert "Run intloom doctor." not in message, message
        _gate_opens_at_the_next_hello(project, monkeypatch)
        assert stop_service(project.root, timeout=30) is True
    finally:
        (project.root / "gate").touch()  # already open, unless a check above failed
    # A stop returns once the host has released its files; its process exits after that.
    eventually(lambda: not pid_alive(pid), what=f"pid {pid} to exit after its stop")


def _stop_reconnecting_to_a_stopping_host(project: Project, monkeypatch: pytest.MonkeyPatch,
                                          timeout: float, *, pause: bool = False
                                          ) -> tuple[IntloomError, float]:
    """``stop_service(timeout=...)`` whose hello was answered just before another stop
    began, and whose connection the stopping host then closed (its idle timeout, 1 s, while
    a gated Run holds the stop in its grace) before its request went out: the client
    connects again, to a host that is shutting down (``pause``: paused by SIGSTOP, so the
    new hello is never answered). The stop's error and how long it took; the gate is then
    opened and the host stopped."""
    monkeypatch.setenv("INTLOOM_TEST_IDLE_TIMEOUT", "1")
    _beside_gated(project, monkeypatch, "20")
    _gated_run_started(project)
    pid = project.host_pid()
    calls: list[str] = []

    class HelloBeforeTheOtherStop(Client):
        @classmethod
        def connect(cls, root: Any, **kwargs: Any) -> Client:
            client = Client.connect(root, **kwargs)  # the stop's own, hello answered
            if not calls:
                calls.append(client.hello.instance_id)
                with Client.connect(project.root) as other:
                    assert other.stop(client.hello.instance_id) is True
                eventually(lambda: connection_closed(client), timeout=10,
                           what="the host to close the idle connection")
                if pause:
                    os.kill(pid, signal.SIGSTOP)
            return client

    monkeypatch.setattr(lifecycle, "Client", HelloBeforeTheOtherStop)
    try:
        began = time.monotonic()
        with pytest.raises(IntloomError) as failed:
            stop_service(project.root, timeout=timeout)
        took = time.monotonic() - began
    finally:
        if pause:
            os.kill(pid, signal.SIGCONT)
    assert calls, "the stop never connected"
    _gate_opens_at_the_next_hello(project, monkeypatch)
    assert stop_service(project.root, timeout=30) is True
    # A stop returns once the host has released its files; its process exits after that.
    eventually(lambda: not pid_alive(pid), what=f"pid {pid} to exit after its stop")
    return failed.value, took


@pytest.mark.timeout(90)
def test_a_stop_whose_reconnect_is_refused_as_stopping_says_to_run_stop_again(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop whose connection the host closed before its request went out connects again,
    and the host refuses that hello: it is shutting down. Its timeout said "Run intloom
    doctor", as for a host that may be hung (the refusal only appeared inside the reconnect
    error's message), where the already-stopping hello refusal says to run stop again."""
    error, _ = _stop_reconnecting_to_a_stopping_host(project, monkeypatch, 4)
    assert error.code == "CLI_SERVICE_TIMEOUT", error
    message = error.message
    assert " is still stopping: " in message, message
    assert "The stop request was not sent: " in message, message
    assert "Run intloom stop again to wait for it" in message, message
    assert "Run intloom doctor." not in message, message


@pytest.mark.timeout(90)
def test_a_stop_that_reconnects_keeps_to_its_timeout(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reconnect of a stop whose connection the host closed used the client's own 5 s
    hello timeout: against a stopping host that does not answer (paused), ``--timeout 3``
    took over 6 s. It gets what is left of the timeout."""
    error, took = _stop_reconnecting_to_a_stopping_host(project, monkeypatch, 3, pause=True)
    # The reconnect's hello went unanswered within what was left; then the pause is read.
    assert error.code == "CLI_SERVICE_UNAVAILABLE", error
    assert "was asked to stop, and is stopped by a signal" in error.message, error.message
    # 3 s, plus one poll and the hello's bound below, generously on a shared 2-core machine.
    assert took < 4.5, (took, error.message)


@pytest.mark.parametrize("recover", [True, False])
def test_an_answer_refused_during_a_stop_says_nothing_was_done_and_whether_to_resend(
    project: Project, monkeypatch: pytest.MonkeyPatch, recover: bool
) -> None:
    """A Client connected before the stop (an Agent, attach) got a bare "The service is
    shutting down." for its answer: not what was refused, whether it was recorded, or what
    to do. It is told; with recover, the wait it answered comes back unchanged after a start.
    Without recover, the next start reports that Run RUN_INTERRUPTED, so "run it again once
    the service is offline" could never succeed: it is told so, with the table's reason."""
    _beside_gated(project, monkeypatch, "5", recover=recover)
    with Client.connect(project.root) as client:
        waiting = client.create_run("example", "notes")
        action = waiting.pending_action
        assert action is not None, waiting
        _gated_run_started(project, client)
        message = _refused_during_a_stop(client, project, {
            "answer": lambda: client.answer(waiting.run_id, action.id, {"isConfirmed": True}),
        })["answer"]
    assert f"The Answer request about Run {waiting.run_id} was refused; nothing was done" in (
        message), message
    again = "Run it again once intloom status says the service is offline"
    start(project)
    with Client.connect(project.root) as client:
        if recover:
            assert again in message, message
            assert client.get_run(waiting.run_id) == waiting
            done = client.answer(waiting.run_id, action.id, {"isConfirmed": True})
            assert done.status == "completed", done
            return
        assert again not in message, message
        assert (f"The next start reports Run {waiting.run_id} RUN_INTERRUPTED (Step "
                f"draft/review waits on confirmation {action.id} but its Step has no recover "
                "entry), so sending it again then cannot succeed") in message, message
        after = client.get_run(waiting.run_id)
    assert after.last_error is not None and after.last_error.code == "RUN_INTERRUPTED", after


def test_a_read_or_cancel_refused_during_a_stop_is_told_to_send_it_again_when_it_can(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GetRun or Cancel of a Run waiting on an Agent task, and a GetRun of a Run whose Step
    was still running (in the stop's grace), were told "the next start reports the Run
    RUN_INTERRUPTED, so sending it again then cannot succeed; start a new Run": both work
    after the next start (a cancel dismisses an interrupted Run), and that Step reached its
    boundary, so the Run was not interrupted at all."""
    _beside_gated(project, monkeypatch, "20", "agentic")
    with Client.connect(project.root) as client:
        agentic = client.create_run("agentic", "look")
        assert agentic.pending_agent_call is not None, agentic
        call = agentic.pending_agent_call.id
        gated = _gated_run_started(project, client)
        messages = _refused_during_a_stop(client, project, {
            "get agentic": lambda: client.get_run(agentic.run_id),
            "cancel agentic": lambda: client.cancel(agentic.run_id),
            "get gated": lambda: client.get_run(gated.run_id),
            "claim": lambda: client.claim_agent_call(agentic.run_id, call, "agent-1"),
        })
    again = "Run it again once intloom status says the service is offline"
    for name in ("get agentic", "cancel agentic", "get gated"):
        assert again in messages[name], messages
        assert "cannot succeed" not in messages[name], messages
    assert (f"The next start reports Run {agentic.run_id} RUN_INTERRUPTED (Step main/look "
            f"waits on client Agent task {call} (available)") in messages["claim"], messages
    assert "sending it again then cannot succeed" in messages["claim"], messages
    start(project)
    with Client.connect(project.root) as client:
        # Resumed at the boundary after its Step: running until review's wait is reached.
        assert client.wait_run(gated.run_id).status == "waiting"  # not interrupted
        view, _ = client.cancel(agentic.run_id)
    assert view.last_error is not None and view.last_error.code == "RUN_INTERRUPTED", view
    assert view.dismissed, view


def test_a_request_about_an_ended_run_refused_during_a_stop_is_not_told_to_send_it_again(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GetRun, Cancel or Subscribe of a Run that had ended, refused during a stop, is told
    to send it again after the next start, which answers it from the Run's journal (it was
    NOT_FOUND there: a start loads unfinished Runs only). An Answer to it cannot succeed
    then, and is told so, and that intloom inspect reads the Run's journal."""
    _beside_gated(project, monkeypatch, "20")
    with Client.connect(project.root) as client, Client.connect(project.root) as follower:
        waiting = client.create_run("example", "notes")
        assert waiting.pending_action is not None, waiting
        ended = client.answer(waiting.run_id, waiting.pending_action.id, {"isConfirmed": True})
        assert ended.status == "completed", ended
        _gated_run_started(project, client)
        messages = _refused_during_a_stop(client, project, {
            "get": lambda: client.get_run(ended.run_id),
            "cancel": lambda: client.cancel(ended.run_id),
            "subscribe": lambda: next(iter(follower.subscribe(ended.run_id))),
            "answer": lambda: client.answer(ended.run_id, waiting.pending_action.id,
                                            {"isConfirmed": True}),
        })
    for name, message in messages.items():
        if name == "answer":
            assert (f"Run {ended.run_id} has ended, so sending it again then cannot succeed; "
                    f"intloom inspect {ended.run_id} reads its journal") in message, message
            assert "Run it again" not in message, message
        else:
            assert "Run it again once intloom status says the service is offline" in message, (
                name, message)
    start(project)
    with Client.connect(project.root) as client:
        assert client.get_run(ended.run_id) == ended
        assert client.cancel(ended.run_id) == (ended, True)


@pytest.mark.parametrize("how", ["dismissed", "held"])
def test_a_run_ended_by_a_cancel_after_a_restart_is_not_told_to_send_it_again(
    project: Project, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A Run restored RUN_INTERRUPTED and dismissed, or held and cancelled, has ended: a
    GetRun, Cancel or Subscribe of it refused during a stop is told to send it again after
    the next start, which answers it from the Run's journal."""
    _beside_gated(project, monkeypatch, "20", "agentic")
    with Client.connect(project.root) as client:
        agentic = client.create_run("agentic", "look")
    assert stop_service(project.root, timeout=30) is True
    if how == "held":  # its source changed: held, not restored
        (project.root / "workflows" / "agentic.py").write_text(AGENT_TASK + "# changed\n")
    start(project)
    run_id = agentic.run_id
    with Client.connect(project.root) as client, Client.connect(project.root) as follower:
        ended, _ = client.cancel(run_id)
        assert ended.status == "failed", ended
        _gated_run_started(project, client)
        messages = _refused_during_a_stop(client, project, {
            "get": lambda: client.get_run(run_id),
            "cancel": lambda: client.cancel(run_id),
            "subscribe": lambda: next(iter(follower.subscribe(run_id))),
        })
    for name, message in messages.items():
        assert "Run it again once intloom status says the service is offline" in message, (
            name, message)
    start(project)
    with Client.connect(project.root) as client:
        assert client.get_run(run_id) == ended  # a dismissal too: the same snapshot
        # A dismissal answers as on the host that dismissed it (already_ended False).
        assert client.cancel(run_id) == (ended, how != "dismissed")


def test_an_answer_to_a_run_restored_interrupted_refused_during_a_stop_is_not_told_to_retry(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An Answer to a Run this start restored RUN_INTERRUPTED (a wait without recover),
    refused during a stop, was told "run it again once the service is offline": the next
    start reports the Run RUN_INTERRUPTED again, and the answer is CONFLICT. A read or a
    cancel of it (which dismisses it) is still told to send it again."""
    _beside_gated(project, monkeypatch, "20", recover=False)
    with Client.connect(project.root) as client:
        waiting = client.create_run("example", "notes")
    action = waiting.pending_action
    assert action is not None, waiting
    assert stop_service(project.root, timeout=30) is True
    start(project)
    run_id = waiting.run_id
    with Client.connect(project.root) as client:
        restored = client.get_run(run_id)
        assert restored.last_error is not None, restored
        assert restored.last_error.code == "RUN_INTERRUPTED", restored
        _gated_run_started(project, client)
        messages = _refused_during_a_stop(client, project, {
            "answer": lambda: client.answer(run_id, action.id, {"isConfirmed": True}),
            "get": lambda: client.get_run(run_id),
            "cancel": lambda: client.cancel(run_id),
        })
    assert (f"The next start reports Run {run_id} RUN_INTERRUPTED (Step draft/review waits on "
            f"confirmation {action.id} but its Step has no recover entry), so sending it "
            "again then cannot succeed") in messages["answer"], messages
    assert "Run it again" not in messages["answer"], messages
    for name in ("get", "cancel"):
        assert "Run it again once intloom status says the service is offline" in messages[name]
    start(project)
    with Client.connect(project.root) as client:
        with pytest.raises(IntloomError) as later:
            client.answer(run_id, action.id, {"isConfirmed": True})
        assert later.value.code == "CONFLICT", later.value
        view, _ = client.cancel(run_id)
    assert view.dismissed, view


def test_a_client_shared_by_threads_gives_each_its_own_reply(project: Project) -> None:
    """Replies are matched to requests by order on one connection: two threads calling one
    Client at once took each other's replies (532 of 600 got the other Run's view)."""
    start(project)
    with Client.connect(project.root) as client:
        runs = [client.create_run("example", f"notes {i}").run_id for i in range(2)]
        wrong: list[tuple[str, str]] = []
        errors: list[BaseException] = []

        def ask(run_id: str) -> None:
            try:
                for _ in range(150):
                    got = client.get_run(run_id).run_id
                    if got != run_id:
                        wrong.append((run_id, got))
            except BaseException as exc:  # reported below, with the others
                errors.append(exc)

        threads = [threading.Thread(target=ask, args=(run_id,)) for run_id in runs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(t.is_alive() for t in threads)
        assert (errors, wrong) == ([], [])

        # While it streams, the connection is the stream's: a request is refused, unsent.
        stream = client.subscribe(runs[0])
        first = next(stream)
        with pytest.raises(IntloomError) as refused:
            client.get_run(runs[1])
        assert refused.value.code == "INVALID_REQUEST"
        assert f"streaming Run {runs[0]}'s events" in refused.value.message
        assert "Nothing was sent" in refused.value.message
        assert next(stream).history and first.history  # the stream goes on undisturbed
        stream.close()


def test_the_python_client_example_in_docs_cli_runs_as_written(project: Project) -> None:
    import contextlib
    import io
    import os
    import re

    from tests.helpers import REPO

    text = (REPO / "docs" / "cli.md").read_text()
    section = text[text.index("## The Python client"):]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    start(project)
    out = io.StringIO()
    here = os.getcwd()
    os.chdir(project.root)
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code.group(1), "docs/cli.md", "exec"), {"__name__": "example"})
    finally:
        os.chdir(here)
    assert out.getvalue() == "completed\n"


def test_the_asyncio_cancel_example_in_docs_cli_ends_the_request_at_once(
        project: Project) -> None:
    """A task awaiting ``asyncio.to_thread(client.wait_run, ...)`` cancelled: the thread
    waited on for its reply and asyncio.run with it. docs/cli.md's example closes the
    Client; asyncio.run returns while the Run still runs its Step."""
    import asyncio
    import re

    from intloom.client import RunView
    from tests.helpers import REPO

    (project.root / "workflows" / "gated.py").write_text(GATED)
    (project.root / "intloom.toml").write_text('workflows = ["workflows/gated.py"]\n')
    text = (REPO / "docs" / "cli.md").read_text()
    section = text[text.index("The client has no async API"):]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None and "async def wait_at_most" in code.group(1)
    scope: dict[str, Any] = {"asyncio": asyncio, "Client": Client, "RunView": RunView}
    exec(compile(code.group(1), "docs/cli.md", "exec"), scope)
    start(project)
    try:
        with Client.connect(project.root) as client:
            run = client.create_run("gated", "payload", wait=False)
            eventually(lambda: (project.root / "calls.log").exists(), timeout=10,
                       what="the effect to start")
            assert asyncio.run(scope["wait_at_most"](client, run.run_id, 0.3)) is None
        with Client.connect(project.root) as other:  # the Step has not ended: not waited for
            assert other.get_run(run.run_id).status == "running"
    finally:
        (project.root / "gate").touch()


def test_client_runs_of_an_unloaded_workflow_is_not_found_as_the_cli_says(
        project: Project) -> None:
    """The CLI is an adapter over the client: ``runs(flow=...)`` of a Workflow the host did
    not load answers what ``intloom runs --flow`` says, not an empty list (as if it had
    loaded it and it had no Runs)."""
    start(project)
    with Client.connect(project.root) as client:
        assert client.runs("example") == []  # loaded, no Runs yet: an empty list
        with pytest.raises(IntloomError) as missing:
            client.runs("nope")
    assert missing.value.code == "NOT_FOUND"
    assert "'nope' is not loaded by this host" in missing.value.message
    cli = project.cli("runs", "--flow", "nope", "--json")
    assert cli.code == 1
    assert cli.json["error"] == {"code": "NOT_FOUND", "message": missing.value.message,
                                 "retryable": False}


def test_a_wait_outlasted_by_a_paused_host_does_not_claim_the_steps_still_run(
    project: Project,
) -> None:
    """A request that waits on its Run, unanswered within ``request_timeout``: the client
    said the Run's Steps "were still running" and "the Run goes on in the host" -- which
    it cannot know: a host paused (SIGSTOP) or hung gives no reply either. It says what it
    knows, and how to check."""
    service = start(project).service
    with Client.connect(project.root, request_timeout=0.5) as client:
        os.kill(service.pid, signal.SIGSTOP)
        try:
            with pytest.raises(IntloomError) as late:
                client.create_run("example", "notes")
        finally:
            os.kill(service.pid, signal.SIGCONT)
    message = late.value.message
    assert late.value.code == "PROJECT_REQUEST_FAILED"
    assert "were still running" not in message, message
    assert "goes on in the host" not in message, message
    assert "No reply came for" in message and "within 0.5 s" in message, message
    assert "if the host is running" in message, message
    assert "intloom runs" in message and "wait_run" in message, message
    assert "request_timeout=None" in message, message
    assert not late.value.retryable  # a create: sent again, it may create a second Run


def test_a_wait_run_outlasted_is_retryable_as_every_read_is(project: Project) -> None:
    """A wait_run past ``request_timeout`` said retryable=False, though it only reads and its
    message says to call it again (a broken connection's wait_run said True)."""
    service = start(project).service
    with Client.connect(project.root, request_timeout=0.5) as client:
        run = client.create_run("example", "notes", wait=False)
        os.kill(service.pid, signal.SIGSTOP)
        try:
            with pytest.raises(IntloomError) as late:
                client.wait_run(run.run_id)
        finally:
            os.kill(service.pid, signal.SIGCONT)
    assert late.value.code == "PROJECT_REQUEST_FAILED", late.value
    assert late.value.retryable, late.value
    assert f"wait_run({run.run_id!r})" in late.value.message, late.value.message


def test_an_answer_after_a_client_cancel_does_not_credit_the_cli(project: Project) -> None:
    """An answer to a Run a program cancelled through Client.cancel was told the Run "was
    stopped (RUN_STOPPED, by intloom cancel)": the cancel need not have come from the CLI."""
    start(project)
    with Client.connect(project.root) as client:
        waiting = client.create_run("example", "notes")
        assert waiting.pending_action is not None
        client.cancel(waiting.run_id)
        with pytest.raises(IntloomError) as late:
            client.answer(waiting.run_id, waiting.pending_action.id, {"isConfirmed": True})
    assert late.value.code == "CONFLICT", late.value
    message = late.value.message
    assert "by intloom cancel)" not in message, message
    assert "was stopped (RUN_STOPPED, by a cancel: intloom cancel or Client.cancel)" in (
        message), message


def test_an_answer_without_wait_replies_once_it_is_durable(project: Project) -> None:
    """``answer(..., wait=False)`` replies once the answer is saved, as ``create_run``'s
    does once the Run is: an answer whose next Steps outlast ``request_timeout`` failed
    PROJECT_REQUEST_FAILED though it had landed at once, and the timeout's advice
    (``create_run(..., wait=False)``) did not apply to it."""
    (project.root / "workflows" / "gated.py").write_text(GATED)
    (project.root / "intloom.toml").write_text(
        'workflows = ["workflows/example.py", "workflows/gated.py"]\n'
    )
    start(project)
    gate = project.root / "gate"
    gate.touch()
    with Client.connect(project.root, request_timeout=5) as client:
        waiting = client.create_run("gated", "payload")
        assert waiting.status == "waiting" and waiting.pending_action is not None, waiting
        gate.unlink()  # declined, the Run goes back to its gated Step, and stays there
        taken = client.answer(waiting.run_id, waiting.pending_action.id,
                              {"isConfirmed": False}, wait=False)
        assert (taken.status, taken.pending_action) == ("running", None), taken
        assert taken.cursor.step == "review", taken  # the answer is durable; Steps go on
        gate.touch()
        again = client.wait_run(waiting.run_id)
    assert again.status == "waiting" and again.pending_action is not None, again
    assert again.pending_action.id != waiting.pending_action.id


def test_an_answer_outlasted_suggests_answering_without_wait_where_the_host_has_it(
    project: Project,
) -> None:
    """An answer past ``request_timeout`` was told to "create Runs with create_run(...,
    wait=False)", which does not apply to it; it is told answer(..., wait=False), which
    this host honours (its hello's ``answerWait``)."""
    service = start(project).service
    with Client.connect(project.root, request_timeout=0.5) as client:
        assert "answerWait" in client.hello.features
        run = client.create_run("example", "notes")
        assert run.pending_action is not None, run
        os.kill(service.pid, signal.SIGSTOP)
        try:
            with pytest.raises(IntloomError) as late:
                client.answer(run.run_id, run.pending_action.id, {"isConfirmed": True})
        finally:
            os.kill(service.pid, signal.SIGCONT)
    message = late.value.message
    assert "or answer with answer(..., wait=False) and then call wait_run." in message, message
    assert "create_run(..., wait=False)" not in message, message
