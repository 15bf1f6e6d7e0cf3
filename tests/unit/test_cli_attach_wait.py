"""attach's waits on its event thread's condition, in this process, with a real SIGINT."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
from typing import Any

import pytest

from intloom.cli.commands.attach import _start_without_sigint, _wait
from tests.helpers import REPO

pytestmark = pytest.mark.timeout(30)


def test_ctrl_c_in_a_wait_leaves_the_condition_held_for_its_with_block() -> None:
    """Condition.wait releases its lock, then enters the try that takes it back: a Ctrl-C
    raised between the two left it released, and leaving ``with cond`` then failed with
    RuntimeError (attach exited 70, "cannot release un-acquired lock") instead of
    detaching. The SIGINT is raised in that very window here."""
    cond = threading.Condition()
    release_save = cond._release_save  # type: ignore[attr-defined]

    def released_then_interrupted() -> Any:
        state = release_save()
        signal.raise_signal(signal.SIGINT)
        return state

    cond._release_save = released_then_interrupted  # type: ignore[attr-defined]
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), cond:
            _wait(cond, lambda: False)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert cond.acquire(blocking=False)  # released by the with block, not left held
    cond.release()


def test_a_ctrl_c_sent_to_the_process_waits_for_the_slice_whatever_thread_could_take_it(
) -> None:
    """Ctrl-C is sent to the process, not to a thread: with SIGINT held off on the main
    thread, the kernel ran the handler on attach's event thread, which flagged the main
    thread anyway, and the KeyboardInterrupt landed in the window the mask was there to
    close. attach's own threads are started with SIGINT held off, so it waits for the
    slice's end, on the main thread.

    Run in a fresh interpreter: the kernel may hand the signal to any thread that does not
    hold it off, and a test runner's own threads (pytest-xdist's, a plugin's) would take it
    there as attach's would have."""
    child = subprocess.run(
        [sys.executable, "-c", "from tests.unit.test_cli_attach_wait import "
         "_interrupted_in_the_window as f; f()"],
        cwd=REPO, capture_output=True, text=True, timeout=20,
    )
    assert child.returncode == 0, child.stderr


def _interrupted_in_the_window() -> None:
    assert threading.active_count() == 1, threading.enumerate()
    idle = threading.Event()
    other = threading.Thread(target=idle.wait, daemon=True)
    _start_without_sigint(other)
    cond = threading.Condition()
    release_save = cond._release_save  # type: ignore[attr-defined]
    handled_r, handled_w = os.pipe()
    os.set_blocking(handled_w, False)

    def released_then_interrupted() -> Any:
        state = release_save()
        os.kill(os.getpid(), signal.SIGINT)
        # Whichever thread runs the C handler writes to the wakeup fd: until it has, the
        # main thread is not flagged. Held off everywhere, it is not run at all here.
        select.select([handled_r], [], [], 0.5)
        return state

    cond._release_save = released_then_interrupted  # type: ignore[attr-defined]
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    wakeup = signal.set_wakeup_fd(handled_w, warn_on_full_buffer=False)
    try:
        with pytest.raises(KeyboardInterrupt), cond:
            _wait(cond, lambda: False)
    finally:
        signal.set_wakeup_fd(wakeup)
        signal.signal(signal.SIGINT, previous)
        idle.set()
        other.join(timeout=10)
        os.close(handled_r)
        os.close(handled_w)
    assert cond.acquire(blocking=False)
    cond.release()


def _views() -> tuple[Any, Any]:
    from intloom.runtime.model import Cursor, RunView

    at = "2026-12-01T00:00:01.000Z"
    running = RunView(run_id="RUN-1", flow_name="f", cursor=Cursor(stage="s", step="a"),
                      status="running", created_at=at, updated_at=at)
    done = RunView(run_id="RUN-1", flow_name="f", cursor=Cursor(stage="s", step="a"),
                   status="completed", created_at=at, updated_at="2026-12-01T00:00:02.000Z")
    return running, done


def test_attach_waits_for_a_display_that_lags_but_still_shows_events(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A slow reader (``intloom attach RUN | slow``) kept being fed, but 3 s after the Run
    ended attach printed the final view anyway and closed the stream: the last ~100 of
    3,000 Steps' events and ``terminal`` were never shown, and one event line landed in the
    middle of the final view. The wait now gives up only after that long with no event."""
    import time

    from intloom.cli import commands
    from intloom.cli.commands.attach import _Follower
    from intloom.cli.render import Renderer
    from intloom.protocol.messages import RunEvent

    monkeypatch.setattr(commands.attach, "_CATCH_UP", 0.3)
    running, done = _views()
    follower = _Follower(tmp_path, "RUN-1", Renderer(), None)
    follower.met(["caughtUp"])

    def feed() -> None:  # an event every 0.1 s for 1 s: well past 0.3 s in all
        for _ in range(10):
            time.sleep(0.1)  # the pace of a slow display, not a wait for an event
            follower.took(RunEvent(run=running, event="executing"))
        follower.took(RunEvent(run=done, event="terminal", final=True))
        with follower._cond:
            follower._done = True  # as run() does once the final event is shown
            follower._cond.notify_all()

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    follower.catch_up(done)
    assert follower.final is not None, "the final view went ahead of the events still shown"
    feeder.join(timeout=10)

    # No event at all (not even the history, which the host may be slow to send: it is
    # given _FIRST_BATCH, not _CATCH_UP): it still goes ahead, and says so.
    monkeypatch.setattr(commands.attach, "_FIRST_BATCH", 0.3)
    stalled = _Follower(tmp_path, "RUN-1", Renderer(), None)
    stalled.met(["caughtUp"])
    started = time.monotonic()
    stalled.catch_up(done)
    assert time.monotonic() - started < 5
    assert "The history of Run RUN-1 did not arrive within 0.3 s" in capsys.readouterr().err


def test_a_follower_keeps_a_bounded_tail_of_the_views_it_showed(tmp_path: Any) -> None:
    """attach kept the view of every event it showed: 806 MB over 1.2M events of one long
    Run followed to its end. It keeps the latest, and still places a view among them: one
    older than all it kept has been passed; a newer one has not been reached."""
    import msgspec

    from intloom.cli.commands import attach
    from intloom.cli.commands.attach import _Follower
    from intloom.cli.render import Renderer
    from intloom.protocol.messages import RunEvent

    running, _ = _views()
    follower = _Follower(tmp_path, "RUN-1", Renderer(), None)
    follower.met(["caughtUp"])
    first = msgspec.structs.replace(running, updated_at="2026-12-05T00:00:00.000Z")
    total = attach._KEEP_SEEN * 3
    for i in range(total):
        at = f"2026-12-05T00:{i // 60000 % 60:02d}:{i // 1000 % 60:02d}.{i % 1000:03d}Z"
        follower.took(RunEvent(run=msgspec.structs.replace(running, updated_at=at),
                               event="executing"))
    assert len(follower._seen) == attach._KEEP_SEEN
    assert follower._taken == total
    assert follower._reached(first)  # long passed, though no longer kept
    later = msgspec.structs.replace(running, updated_at="2026-12-05T23:00:00.000Z")
    assert not follower._reached(later)


def test_an_event_is_never_printed_once_attach_closed_its_stream(
        tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """The event thread printed an event it had read after attach had closed the stream and
    gone on to print the final view: the line landed between "Completed" and "Run"."""
    from intloom.cli.commands.attach import _Follower
    from intloom.cli.render import Renderer
    from intloom.protocol.messages import RunEvent

    running, _ = _views()
    follower = _Follower(tmp_path, "RUN-1", Renderer(), None)
    follower._show(RunEvent(run=running, event="executing"))
    follower.close()
    follower._show(RunEvent(run=running, event="step_result"))
    out = capsys.readouterr().out
    assert "executing" in out and "step_result" not in out, out

    # A detach does not wait for a print stuck on a reader that does not read: Ctrl-C with
    # ``attach RUN | less`` detached at once, and must go on doing so.
    import time

    stuck = _Follower(tmp_path, "RUN-1", Renderer(), None)
    stuck._printing.acquire()  # an event's print under way, blocked
    started = time.monotonic()
    stuck.close(wait=False)
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("cut", ["by the host", "stdout gone"])
def test_attach_says_when_its_event_stream_ended_before_the_runs_last_event(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], cut: str) -> None:
    """A host closes the stream of a follower too slow for its backlog (follower_too_slow):
    attach then printed the Run's final view after an event list that stopped mid-way, with
    nothing saying that events were missing. A reader gone (``attach RUN | head -1``) is no
    such cut: nothing is said on stderr then (docs/cli.md, Exit codes)."""
    from intloom.cli.commands.attach import _follow
    from intloom.cli.options import CliState
    from intloom.client.client import Client
    from intloom.errors import IntloomError
    from intloom.protocol.messages import RunEvent

    running, done = _views()

    class Cut:
        hello = type("Hello", (), {"features": ["caughtUp"]})()

        def __enter__(self) -> Cut:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def close(self) -> None:
            pass

        def subscribe(self, run_id: str) -> Any:
            yield RunEvent(run=running, event="executing", history=True, caught_up=True)
            if cut == "stdout gone":
                raise BrokenPipeError(32, "Broken pipe")  # as printing the next event does
            raise IntloomError("PROJECT_REQUEST_FAILED", "the connection closed")

    monkeypatch.setattr(Client, "connect", classmethod(lambda cls, root, **kw: Cut()))
    (tmp_path / "intloom.toml").write_text("workflows = []\n")
    state = CliState()
    state.project = tmp_path
    view, suspended = _follow(state, Cut(), "RUN-1", done)  # type: ignore[arg-type]
    assert view is done and not suspended
    err = capsys.readouterr().err
    if cut == "stdout gone":
        assert err == ""
        return
    assert "The event stream of Run RUN-1 ended before its last event" in err, err
    assert "intloom attach RUN-1" in err and "follower_too_slow" in err, err


def test_a_history_that_does_not_start_at_the_runs_start_says_so_first(
        tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """An ended Run keeps its last history entries: attach printed the first one kept as if
    it were the Run's start. The host's ``omitted`` count comes first, as a line of its own."""
    from intloom.cli.commands.attach import _Follower
    from intloom.cli.render import Renderer
    from intloom.protocol.messages import RunEvent

    running, _ = _views()
    follower = _Follower(tmp_path, "RUN-1", Renderer(), None)
    follower._show(RunEvent(run=running, event="executing", history=True, omitted=1234))
    follower._show(RunEvent(run=running, event="step_result", history=True))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3, lines
    assert lines[0] == ("... 1,234 earlier events not shown: the host keeps only a Run's "
                        "recent history; intloom inspect RUN-1 shows its whole journal.")
    assert "executing" in lines[1] and "step_result" in lines[2], lines


def test_a_stop_or_a_restart_is_shown_at_its_own_time_not_the_last_records() -> None:
    """A Run's view keeps its last record's updatedAt through a stop and a restart (neither
    writes a record): ``suspended`` and ``restored`` lines showed it, hiding the downtime.
    They show the time their event carries; a record's event shows the view's time."""
    from intloom.cli.commands.attach import event_line
    from intloom.protocol.messages import RunEvent

    running, _ = _views()
    later = "2099-01-01T00:00:00.000Z"
    restored = event_line(RunEvent(run=running, event="restored",
                                   detail={"row": "restore_wait", "reason": "r", "at": later}))
    suspended = event_line(RunEvent(run=running, event="suspended", detail={"at": later}))
    record = event_line(RunEvent(run=running, event="executing"))
    assert restored.startswith(f"{later}  restored "), restored
    assert suspended.startswith(f"{later}  suspended "), suspended
    assert record.startswith(f"{running.updated_at}  executing "), record
    assert running.updated_at != later


def test_an_event_line_shows_a_step_results_outcome_and_an_answers_action() -> None:
    """A Step that routed back to ask again (its code refused the answer) showed, in attach,
    ``step_result main/ask running`` twice, with nothing to say why; inspect shows the
    outcome, and so does the line now."""
    from intloom.cli.commands.attach import event_line
    from intloom.protocol.messages import RunEvent

    running, _ = _views()
    routed = event_line(RunEvent(run=running, event="step_result",
                                 detail={"outcome": "invalid"}))
    answered = event_line(RunEvent(run=running, event="answered",
                                   detail={"actionId": "ASK-1"}))
    effect = event_line(RunEvent(run=running, event="effect_done",
                                 detail={"name": "charge", "key": "order-7"}))
    assert routed.endswith("  outcome=invalid"), routed
    assert answered.endswith("  actionId=ASK-1"), answered
    assert effect.endswith("  name=charge key=order-7"), effect
    assert not event_line(RunEvent(run=running, event="suspended",
                                   detail={"at": running.updated_at})).endswith("=")
