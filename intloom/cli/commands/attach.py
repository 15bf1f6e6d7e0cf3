"""``intloom attach RUN``: the Run's history, then its live events, answering on a terminal.

Decisions come from the Run's own views (``get_run``, ``wait_run``, ``answer`` replies on one
connection); the event stream, on a second connection, is only shown. Before each prompt and
before the final view, the display is given a moment to catch up with the view it acts on,
so the history is printed before the question it leads to.

A prompt is dropped as soon as what it asks for is no longer pending: each event the
stream shows wakes it, and the Run's view (``get_run``) decides whether it is still asked.
When it is not (answered elsewhere, cancelled, the host stopped or went away), attach goes
on from that view: it asks what the Run now waits on, or shows how it ended.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Final

import typer

from intloom.cli import exit_codes
from intloom.cli.commands.runs import RunArg, finish_run, left_suspended, refuse_bad_ids
from intloom.cli.inputs import interactive
from intloom.cli.options import CliState, command, sigterm_as_ctrl_c
from intloom.cli.readerwatch import READER_GONE_SIGNAL, ends_wait_when_reader_goes
from intloom.cli.render import Renderer, plain
from intloom.errors import IntloomError

if TYPE_CHECKING:
    from intloom.cli.prompts import Terminal
    from intloom.client.client import Client
    from intloom.protocol.messages import RunEvent
    from intloom.runtime.model import PendingAction, RunView

__all__ = ["attach"]

# How long the display may go without showing an event, while it lags the Run, before a
# prompt or the final view goes ahead anyway. Measured from the last event shown, not from
# the start of the wait: a slow reader (a pipe, a slow terminal) that is still being fed was
# cut off after 3 s in all, its remaining events dropped and the last one printed in the
# middle of the final view.
_CATCH_UP: Final = 3.0
# How long attach waits for the stream's first batch (the history) before it goes ahead:
# no display lag, but the host preparing it. The first follower of a restored Run waits for
# the host to read the Run's earlier records from the journal, seconds on a log of some GB:
# given only _CATCH_UP, attach printed the Run's view with no history (without a terminal),
# or prompted, the history then printed under the prompt.
_FIRST_BATCH: Final = 60.0
# How many of the latest events' views a follower keeps to place a view among them (the
# host's own history of a Run is bounded too: its last 1,000 flushes' events).
_KEEP_SEEN: Final = 4096
# Answers that leave the Run waiting: say why, then look again.
_RETRY_CODES: Final = frozenset({"INVALID_REQUEST", "CONFLICT"})
# How long a detach (Ctrl-C with --json) may take to look at the Run once more.
_DETACH_LOOK: Final = 2.0
# The longest a wait sleeps before it looks whether Ctrl-C came (how late a detach may be).
# A SIGINT that lands just before the main thread goes to sleep (or whose handler the kernel
# runs on the follower thread) is only flagged for the main thread, and wakes no wait: an
# untimed one slept on until the next event, which a Run waiting on an Agent task may not
# send for hours.
_SIGNAL_LOOK: Final = 0.1
# The signals that end a wait with a KeyboardInterrupt: SIGTERM as Ctrl-C does
# (sigterm_as_ctrl_c), and stdout's reader going (readerwatch), held off where SIGINT is.
_INTERRUPTS: Final = frozenset({signal.SIGINT, signal.SIGTERM, READER_GONE_SIGNAL})
# What a look at the Run says when its host is gone (the connection broke or was closed).
# A host that is stopping answers CLI_SERVICE_CLOSING until it goes: the same for a prompt.
_CONNECTION_LOST: Final = frozenset({"PROJECT_REQUEST_FAILED", "PROJECT_CONNECTION_FAILED",
                                     "CLI_SERVICE_CLOSING"})
# How a stream ends with events missing: its connection breaks (a follower too slow is
# cut), or the host would not open it for now (BUSY at its connection cap, its stop).
_STREAM_CUT: Final = frozenset({"PROJECT_REQUEST_FAILED", "PROJECT_CONNECTION_FAILED", "BUSY",
                                "CLI_SERVICE_CLOSING"})


def event_line(event: RunEvent) -> str:
    run = plain(event.run)
    cursor = run.get("cursor") or {}
    where = f"{cursor.get('stage', '-')}/{cursor.get('step') or '-'}"
    # An event that is no record (a host's stop, a restart) has its own time: the Run's
    # updatedAt, its last record's, hid how long it was down.
    detail = event.detail
    at = detail.get("at") if isinstance(detail, dict) else None
    when = at if isinstance(at, str) else run.get("updatedAt", "")
    line = f"{when}  {event.event:<16} {where:<24} {run.get('status', '')}"
    if isinstance(event.detail, str) and event.detail:
        line += f"  {event.detail}"
    elif isinstance(detail, dict):
        # What the record says, as inspect shows it: a Step that routed back to ask again
        # (an answer its code refused) showed the same question twice with no outcome.
        facts = [f"{key}={detail[key]}" for key in _SHOWN_FACTS if detail.get(key) is not None]
        if facts:
            line += "  " + " ".join(facts)
    return line.rstrip()


# The facts of an event's detail an event line shows (outcome of a step_result, the action
# an answer answered, an effect's name and key), in this order.
_SHOWN_FACTS: Final = ("outcome", "actionId", "name", "key")


def omitted_line(event: RunEvent, run_id: str) -> str | None:
    """The line that goes before a history that does not start at the Run's start (the host
    keeps a Run's last entries): without it the first event shown read as the first."""
    count = event.omitted
    if count <= 0:
        return None
    return (f"... {count:,} earlier event{'' if count == 1 else 's'} not shown: the host keeps "
            f"only a Run's recent history; intloom inspect {run_id} shows its whole journal.")


def _key(view: RunView) -> tuple[object, ...]:
    action = view.pending_action.id if view.pending_action else None
    call = view.pending_agent_call.id if view.pending_agent_call else None
    error = view.last_error.code if view.last_error else None
    return (view.status, view.updated_at, action, call, error)


def _wait(cond: threading.Condition, done: Callable[[], bool],
          timeout: float | None = None) -> None:
    """``cond.wait_for(done, timeout)`` (``cond`` held, main thread), in slices that let a
    pending Ctrl-C be raised (see ``_SIGNAL_LOOK``), between them only: Condition.wait
    releases the lock before the try that takes it back, and a KeyboardInterrupt raised
    between the two left it released (leaving ``with cond`` then failed: RuntimeError, exit
    70, not a detach). SIGINT is held off meanwhile; it comes once the slice ends."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not done():
        left = _SIGNAL_LOOK if deadline is None else min(_SIGNAL_LOOK,
                                                          deadline - time.monotonic())
        if left <= 0:
            return
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _INTERRUPTS)
        try:
            cond.wait(left)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a held SIGINT raises here


def _start_without_sigint(thread: threading.Thread) -> None:
    """Start ``thread`` with SIGINT held off (a thread takes its creator's signal mask).

    A Ctrl-C is sent to the process: while ``_wait`` holds SIGINT off on the main thread,
    the kernel would run its handler on another thread, which flags the main thread all the
    same, and the KeyboardInterrupt lands where the mask was to keep it out. With every
    thread of attach's holding it off, it waits, pending, for the main thread."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _INTERRUPTS)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


class _Follower(threading.Thread):
    """Prints the Run's events as they arrive; remembers how far it has got."""

    def __init__(self, root: Path, run_id: str, renderer: Renderer,
                 term: Terminal | None) -> None:
        super().__init__(name=f"attach-{run_id}", daemon=True)
        self._root = root
        self._run_id = run_id
        self._renderer = renderer
        self._term = term  # the prompts' terminal: woken by every event and by the end
        self._cond = threading.Condition()
        # The Run as the latest events showed it: what catch_up and past_task compare a view
        # with, which is recent. All of them were kept: ~670 B an event, 806 MB over 1.2M
        # events of one long Run followed to its end.
        self._seen: deque[RunView] = deque(maxlen=_KEEP_SEEN)
        self._taken = 0  # events shown so far (the deque's length stops growing)
        self._caught_up = False  # the history up to the subscription has all arrived
        self._late = False  # the history did not come within _FIRST_BATCH (said once)
        self._done = False
        self.final: RunView | None = None  # as the stream's final event showed the Run
        self.final_event: str | None = None  # that event's name ("suspended", "terminal", ...)
        self._client: Client | None = None
        # Held while an event is printed; once ``_closed`` is set under it, nothing more is,
        # so no event line lands in the middle of what attach prints after it.
        self._printing = threading.Lock()
        self._closed = False
        self.broken = False  # the stream ended on an error, not on its final event or close()
        self._answered: set[str] = set()  # the action ids the stream showed answered
        self.behind = False  # catch_up went ahead of the events (``behind_note``)
        self.broke_with: IntloomError | None = None  # that error

    def _show(self, event: RunEvent) -> None:
        before = omitted_line(event, self._run_id)
        lines = [event_line(event)] if before is None else [before, event_line(event)]
        with self._printing:
            if self._closed:
                return
            if self._term is None:
                self._renderer.lines(lines)
                return
            with self._term.output():
                self._renderer.lines(lines)

    def run(self) -> None:
        from intloom.client.client import Client

        try:
            with Client.connect(self._root) as client:
                self._client = client
                self.met(client.hello.features)
                for event in client.subscribe(self._run_id):
                    self._show(event)
                    self.took(event)
                    if self._term is not None:
                        self._term.wake()
                    if event.final:
                        break
        except IntloomError as exc:
            # The stream is a display only; the view on the main connection decides, and
            # says why when the host went away. One that still answers cut this stream
            # (a follower too slow for it), or refused it for now (its connection cap, its
            # stop): ``cut_short`` says so. A stream refused for the Run itself (one that
            # ended while held has none) misses nothing: the final view says it all.
            with self._cond:
                self.broken = not self._closed and exc.code in _STREAM_CUT
                self.broke_with = exc
        except Exception:
            # Not the stream's: stdout gone (``attach RUN | head -1``), which the final
            # view's print meets too, and which is no failure to speak of.
            pass
        finally:
            with self._cond:
                self._done = True
                self._cond.notify_all()
            if self._term is not None:
                self._term.wake()  # a dropped stream: the prompt looks whether the host is there

    def met(self, features: list[str]) -> None:
        """The host's features: one from before "caughtUp" never marks the history's end,
        so the display is not held back waiting for that mark."""
        from intloom.protocol.messages import CAUGHT_UP  # loaded with the client already

        if CAUGHT_UP not in features:
            with self._cond:
                self._caught_up = True
                self._cond.notify_all()

    def took(self, event: RunEvent) -> None:
        """Note a shown event: how far the display has got."""
        with self._cond:
            self._seen.append(event.run)
            self._taken += 1
            detail = event.detail
            if event.event == "answered" and isinstance(detail, dict):
                self._answered.add(str(detail.get("actionId")))
            self._caught_up = self._caught_up or event.caught_up or not event.history
            if event.final:
                self.final = event.run
                self.final_event = event.event
            self._cond.notify_all()

    def _reached(self, view: RunView) -> bool:
        """The display has shown ``view`` (``_since``), or the stream has ended."""
        if self._done:
            return True
        if not self._caught_up:
            # A restored Run's history shows this view twice: the earlier host's last event,
            # then ``restored``, which must not be printed after the prompt or the end.
            return False
        if view.status in ("completed", "failed"):
            return False  # the stream ends after the terminal event: wait for that
        return bool(self._since(view))

    def _since(self, view: RunView) -> list[RunView]:
        """What the stream showed from ``view`` on: from the first event showing this very
        state, or a later time (several records share a millisecond, so a timestamp alone
        does not place it)."""
        key = _key(view)
        for i, seen in enumerate(self._seen):
            # A view older than every one kept is passed by the first of them (later).
            if seen.updated_at > view.updated_at or _key(seen) == key:
                return list(itertools.islice(self._seen, i, None))
        return []

    def was_answered(self, action_id: str) -> bool:
        """Whether the stream showed ``action_id`` answered."""
        with self._cond:
            return action_id in self._answered

    def last_seen(self) -> RunView | None:
        """The Run as the last event shown showed it (None before any)."""
        with self._cond:
            return self._seen[-1] if self._seen else None

    def last_word(self) -> RunView | None:
        """The Run as the stream's final event showed it, once the stream has ended (given
        a moment to: a host going away ends it, with that event or without); else None."""
        with self._cond:
            _wait(self._cond, lambda: self._done, timeout=_CATCH_UP)
            return self.final

    def catch_up(self, view: RunView) -> None:
        """Wait until the display has shown ``view``, while it keeps showing events: it
        goes ahead once no event came for ``_CATCH_UP`` (for the first one, the history,
        ``_FIRST_BATCH``)."""
        with self._cond:
            if not self._seen and not self._late:
                _wait(self._cond, lambda: self._done or bool(self._seen),
                      timeout=_FIRST_BATCH)
                if not self._seen and not self._done:
                    self._late = True  # said once; later waits give it _CATCH_UP only
                    self._renderer.note(
                        f"The history of Run {self._run_id} did not arrive within "
                        f"{_FIRST_BATCH:g} s (the host reads a restored Run's earlier records "
                        "from its journal when it is first followed), so attach goes on "
                        f"without waiting for it. intloom inspect {self._run_id} shows "
                        "every record.")
            shown = -1
            while shown != self._taken and not self._reached(view):
                shown = self._taken
                _wait(self._cond, partial(self._moved_or_reached, view, shown),
                      timeout=_CATCH_UP)
            # Gone ahead of its events (stdout read too slowly for them, a stream stalled):
            # those not shown by now never are, since nothing is printed after the view.
            self.behind = not self._reached(view) and not self._done

    def _moved_or_reached(self, view: RunView, shown: int) -> bool:
        return self._reached(view) or self._taken != shown

    def behind_note(self) -> str:
        """What going ahead of the events means: 944 of 9,004 events were printed, in
        silence, when attach's stdout was read slowly (``attach RUN | (sleep 6; cat)``)."""
        return (f"attach went on to the Run's view before its events caught up with it (its "
                f"output was read more slowly than Run {self._run_id} produced them), so "
                "the events after the last one shown were not printed. intloom inspect "
                f"{self._run_id} shows every record.")

    def cut_short(self) -> bool:
        """The stream ended on an error before its final event: the events after the last
        one shown are missing from the display."""
        with self._cond:
            return self.broken and self.final is None

    def cut_note(self) -> str:
        """What ``cut_short`` means, from the stream's own error: one never opened (refused
        at the host's connection cap, or by a stopping host) was said to have been closed
        for reading too slowly."""
        with self._cond:
            return _cut_short(self._run_id, self.broke_with, opened=bool(self._seen))

    def past_task(self, view: RunView) -> None:
        """Block until the stream shows the Run no longer waiting on ``view``'s Agent task
        (the Agent completed or failed it, the Run was cancelled or suspended), or ended."""
        call = view.pending_agent_call
        assert call is not None

        def moved() -> bool:
            # Only what the stream showed from this very wait on: the Step's records before
            # the wait often share its millisecond, and taking them for a move asked again
            # at once, without end.
            return any(seen.status != "waiting" or seen.pending_agent_call is None
                       or seen.pending_agent_call.id != call.id
                       for seen in self._since(view))

        with self._cond:
            _wait(self._cond, lambda: self._done or moved())

    def suspended(self, view: RunView) -> bool:
        """The stream ended with the host suspending the Run, as ``view`` shows it: a host
        stop (or a log it cannot write) left it failed/RUN_INTERRUPTED at a saved boundary,
        for the next start to restore; not a Run that ended."""
        with self._cond:
            return (self.final_event == "suspended" and self.final is not None
                    and _key(self.final) == _key(view))

    def ended(self) -> bool:
        """The stream has ended (or could not be opened): no event will wake a wait."""
        with self._cond:
            return self._done

    def close(self, *, wait: bool = True) -> None:
        """End the stream. ``wait``: a print under way (a reader that does not read) is given
        a moment to end, as the final view printed after it would wait for it anyway; then
        nothing more is shown. A detach (Ctrl-C) or an error does not wait: it says nothing
        on stdout, and a detach is at once."""
        with self._cond:
            if self._closed:
                return
        held = wait and self._printing.acquire(timeout=_CATCH_UP)
        with self._cond:
            self._closed = True
        if held:
            self._printing.release()
        client = self._client
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()


class _MovedOn(Exception):
    """The action a prompt asks for is no longer pending; ``view`` is the Run now."""

    def __init__(self, view: RunView) -> None:
        super().__init__(view.run_id)
        self.view = view


def _still_asked(client: Client, run_id: str, action_id: str,
                 follower: _Follower) -> Callable[[], None]:
    """The prompt's check: raises ``_MovedOn`` once ``action_id`` is no longer pending."""

    def check() -> None:
        try:
            now = client.get_run(run_id)
        except IntloomError as exc:
            if exc.code not in _CONNECTION_LOST:
                raise
            last = follower.last_word()
            if last is not None and last.status in ("completed", "failed"):
                # A stopping host ended the stream with how the Run ended (suspended).
                raise _MovedOn(last) from None
            fact = ("The host is stopping" if exc.code == "CLI_SERVICE_CLOSING" else
                    "The connection to the host was lost")
            raise IntloomError(
                exc.code,
                f"{fact} while attach asked for {action_id} (the host stopped or was "
                "killed); nothing was answered here. Run intloom status, then intloom "
                f"attach {run_id}.",
                retryable=exc.retryable,
            ) from None
        action = now.pending_action
        if now.status != "waiting" or action is None or action.id != action_id:
            raise _MovedOn(now)

    return check


def _cut_short(run_id: str, error: IntloomError | None = None, *, opened: bool = True) -> str:
    if not opened and error is not None:
        return (f"The event stream of Run {run_id} could not be opened ({error.code}: "
                f"{error.message}), so none of its events were shown, only the Run as the "
                f"host reported it. intloom attach {run_id} tries again, and intloom inspect "
                f"{run_id} shows every record.")
    return (f"The event stream of Run {run_id} ended before its last event (a host closes the "
            "stream of a follower that reads its events too slowly: its log then says "
            "follower_too_slow), so the events after the last one shown are missing. intloom "
            f"attach {run_id} shows its recent history again, and intloom inspect {run_id} "
            "every record.")


def _look(client: Client, run_id: str, follower: _Follower, what: str) -> RunView:
    """The Run now; when its host stopped or went away, as the stream last showed it ended
    (a stopping host suspends it), else the connection's error, saying nothing was done."""
    try:
        return client.get_run(run_id)
    except IntloomError as exc:
        if exc.code not in _CONNECTION_LOST:
            raise
        last = follower.last_word()
        if last is not None and last.status in ("completed", "failed"):
            return last
        fact = ("The host is stopping" if exc.code == "CLI_SERVICE_CLOSING" else
                "The connection to the host was lost")
        raise IntloomError(
            exc.code,
            f"{fact} while attach followed Run {run_id} on {what} (the host stopped or was "
            f"killed); nothing was done here. Run intloom status, then intloom attach "
            f"{run_id}.",
            retryable=exc.retryable,
        ) from None


def _suspended_meanwhile(began: RunView, view: RunView) -> bool:
    """``view`` is failed/RUN_INTERRUPTED (not dismissed) and ``began`` was not failed: the
    host attach follows suspended the Run (only a start restores one RUN_INTERRUPTED, and
    attach keeps to one host instance). A stop can end the stream before its ``suspended``
    event (one still reading a restored Run's history, or refused at the cap), and the
    view alone then read as a Run that ended."""
    error = view.last_error
    return (began.status != "failed" and view.status == "failed" and not view.dismissed
            and error is not None and error.code == "RUN_INTERRUPTED")


def _follow(state: CliState, client: Client, run_id: str,
            view: RunView) -> tuple[RunView, bool]:
    """Wait, prompt and answer until the Run is terminal, or waits with no one to answer
    (without a terminal, no one answers here; on one, an Agent task is followed until the
    Agent completes or fails it). Returns the Run's view, and whether its host suspended it
    (``_Follower.suspended``)."""
    from intloom.cli.prompts import Terminal, ctrl_c_ignored, detach_hint, prompt_answer

    began = view
    term = Terminal() if interactive(state.json_mode) else None
    if term is not None:
        term.hint = detach_hint()
    follower = _Follower(state.root(), run_id, state.renderer, term)
    _start_without_sigint(follower)
    try:
        while True:
            if view.status == "running":
                view = client.wait_run(run_id)
                continue
            follower.catch_up(view)
            action = view.pending_action
            call = view.pending_agent_call
            if view.status == "waiting" and call is not None and term is not None:
                # Nothing to answer here, but attach follows the Run: the Agent's work goes
                # on elsewhere, then what the Run asks next is prompted for here.
                detach = (f"Ctrl-C is ignored here (so it was where intloom started): kill "
                          f"-TERM {os.getpid()} detaches." if ctrl_c_ignored() else
                          "Ctrl-C detaches.")
                term.say(f"Waiting for the client Agent to complete or fail task {call.id}; "
                         f"its events follow. {detach}")
                follower.past_task(view)
                view = _look(client, run_id, follower, f"its Agent task {call.id}")
                task = view.pending_agent_call
                if (follower.ended() and view.status == "waiting" and task is not None
                        and task.id == call.id):
                    # No stream (the host refused it or dropped it) to say when the task
                    # moves: asking again at once would loop without end.
                    term.say(f"The Run's event stream ended (or could not be opened) while it "
                             f"still waits on task {call.id}; attach stops following and "
                             f"leaves the Run as it was. Run intloom attach {run_id} again "
                             "to follow it.")
                    return view, False
                continue
            if view.status != "waiting" or action is None or term is None:
                if follower.cut_short():
                    state.renderer.note(follower.cut_note())
                elif follower.behind:
                    state.renderer.note(follower.behind_note())
                return view, follower.suspended(view) or _suspended_meanwhile(began, view)
            term.check = _still_asked(client, run_id, action.id, follower)
            term.instead = (f"intloom answer {run_id} {action.id} - (the answer as JSON on "
                            "standard input)")
            try:
                value = prompt_answer(plain(action), term)
            except _MovedOn as moved:
                if follower.suspended(moved.view) or _suspended_meanwhile(began, moved.view):
                    # Not "moved on elsewhere": nothing took the action, and the journal
                    # still ends at its wait, for the next start (restored when its Step
                    # has recover: then asked again, with the same id; else the next start
                    # reports it RUN_INTERRUPTED). Which is in the host's message, shown
                    # next: "the wait is kept" here contradicted it for a wait without one.
                    term.say(f"{action.id} was not answered: the host suspended the Run "
                             "while it waited (intloom stop, or a log it could not write); "
                             "nothing was answered here. What the next start does with the "
                             "wait follows.")
                else:
                    term.say(f"{action.id} is no longer pending (the Run moved on "
                             "elsewhere); nothing was answered here.")
                view = moved.view
                continue
            try:
                view = client.answer(run_id, action.id, value)
            except IntloomError as exc:
                if exc.code in _CONNECTION_LOST:
                    follower.last_word()  # the stream's last events, if they are on their way
                    if follower.was_answered(action.id):
                        raise _answer_taken(run_id, action, follower.last_seen(),
                                            exc) from None
                if exc.code not in _RETRY_CODES:
                    raise
                state.renderer.error(exc.view())
                view = client.get_run(run_id)
    except BaseException:
        follower.close(wait=False)
        raise
    finally:
        follower.close()
        if term is not None:
            term.close()


def _answer_taken(run_id: str, action: PendingAction, last: RunView | None,
                  exc: IntloomError) -> IntloomError:
    """The answer's reply lost (the host killed while the Run went on with it) when the
    stream had shown it answered: "No reply came for the answer ... the host may have acted
    on it ... check before retrying" read as an answer maybe lost, under the very lines that
    showed it taken. (An answer: another client's may have won the race; either way the
    action is answered.)"""
    asked, cursor = action.cursor, last.cursor if last is not None else None
    went = ""
    if cursor is not None and cursor.step:
        where = f"{cursor.stage}/{cursor.step}"
        went = (f", and its Step {where} went on with it"
                if (cursor.stage, cursor.step) == (asked.stage, asked.step)
                else f", and the Run went on to {where}")
    action_id = action.id
    return IntloomError(
        exc.code,
        f"An answer to {action_id} was taken: the Run's events showed it answered{went}. "
        "Then the connection to the host was lost before the Run's next wait or end, so "
        f"what became of the Run after that is not known here. Run intloom status (after a "
        f"crash, intloom doctor says what the next start does with it); intloom attach "
        f"{run_id} shows where it got. Do not answer it again.",
        retryable=False,
    )


def _attach_json(state: CliState, run_id: str) -> int:
    """Wait until the Run waits or ends, then print it; Ctrl-C detaches with the Run's view."""
    seen: RunView | None = None
    view: RunView | None = None
    try:
        with state.client(waits=True) as client:
            seen = client.get_run(run_id)
            view = client.wait_run(run_id) if seen.status == "running" else seen
    except (KeyboardInterrupt, typer.Abort):
        if view is None and state.reader_gone:
            return exit_codes.OK  # no one reads a document any more; main() ends it quietly
        if view is None:
            return _detach_json(state, run_id, seen)
        # Ctrl-C while the connection closed: the wait was over, and its end stands (a
        # failed Run exits 1, not 0 as a detach would).
    assert view is not None
    return finish_run(state, view)


def _detach_json(state: CliState, run_id: str, seen: RunView | None) -> int:
    """The one JSON document of a detach: the Run as it is now, else as last seen.

    The interrupted connection may hold half a reply, so a fresh one asks; a second Ctrl-C,
    or a host that cannot answer within a moment, leaves the view already seen (``seen`` is
    None only when Ctrl-C came before the first view, and then the fresh look must answer).
    """
    from intloom.client.client import Client

    try:
        with Client.connect(state.root(), timeout=_DETACH_LOOK,
                            request_timeout=_DETACH_LOOK) as client:
            seen = client.get_run(run_id)
    except (IntloomError, KeyboardInterrupt, typer.Abort):
        if seen is None:
            raise
    state.renderer.document({"run": seen})
    return exit_codes.OK


@command
def attach(state: CliState, run_id: RunArg) -> int:
    """Show a Run's history and live events; on a terminal, answer what it asks.

    Ctrl-C detaches and leaves the Run as it is. Exit 0 when it completes or still waits,
    1 when it fails or was stopped, 75 when its host stopped and suspended it (it has not
    ended: start the host, then attach again).
    """
    refuse_bad_ids(run_id)
    with sigterm_as_ctrl_c(state), ends_wait_when_reader_goes(partial(_reader_left, state)):
        if state.json_mode:
            return _attach_json(state, run_id)
        return _attach_text(state, run_id)


def _reached(state: CliState) -> int:
    """The exit code attach had reached when its reader went away: the Run's, when attach
    knew its end, else a detach's 0."""
    return exit_codes.OK if state.verdict is None else state.verdict


def _reader_left(state: CliState) -> None:
    """stdout's reader went away (``attach RUN | head -1`` had its line): attach ends now,
    as a detach, rather than at the Run's next event, its next write."""
    state.reader_gone = True


def _attach_text(state: CliState, run_id: str) -> int:
    followed: tuple[RunView, bool] | None = None
    detached = False
    failed: IntloomError | None = None
    try:
        with state.client(waits=True) as client:
            try:
                view = client.get_run(run_id)
                if view.status in ("completed", "failed"):
                    # Its end is known before its history is printed: a reader that goes
                    # away meanwhile (``attach RUN | head -1``) leaves the exit code the
                    # Run's (1 for a failed one), as --json does, not a detach's 0.
                    state.verdict = exit_codes.for_run_status(
                        view.status, suspended=left_suspended(view))
                try:
                    followed = _follow(state, client, run_id, view)
                except (KeyboardInterrupt, typer.Abort) as exc:
                    detached = True
                    if state.reader_gone:
                        return _reached(state)  # main() ends it quietly
                    state.after_ctrl_c(exc)
                    state.renderer.note(f"Detached from {run_id}; the Run is left as it "
                                        f"was. {state.intloom()} attach {run_id} attaches "
                                        "again.")
            except IntloomError as exc:
                failed = exc
                raise
    except (KeyboardInterrupt, typer.Abort) as exc:
        if failed is not None:
            # Ctrl-C while the connection closed on an error: the error stands.
            raise failed from None
        if state.reader_gone:
            return _reached(state)
        if not detached and followed is None:
            # Ctrl-C while connecting or asking for the first view: a detach all the same
            # (attach never touches the Run), not "Interrupted." and 130 a moment earlier.
            state.after_ctrl_c(exc)
            state.renderer.note(f"Detached from {run_id} before its first view; nothing was "
                                f"done to it. {state.intloom()} attach {run_id} attaches "
                                "again.")
            return exit_codes.OK
        # Ctrl-C while the connection closed: what was shown stands, and so does the end.
    if followed is None:
        return exit_codes.OK
    view, suspended = followed
    return finish_run(state, view, suspended=suspended)
