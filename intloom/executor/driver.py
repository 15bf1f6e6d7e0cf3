"""Driving one Run: the loop that turns the machine's phase into the next piece of work.

``RunSlot`` holds a live Run (its state, what is shown, its waiters and subscribers);
``Driver`` runs user code for it and appends the records that bracket that code.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import os
import reprlib
import threading
import traceback
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator
from functools import partial
from typing import TYPE_CHECKING, Any, Final, NoReturn

import msgspec

from intloom.authoring.agent import AgentResult
from intloom.authoring.context import (
    OVER,
    ContextHooks,
    InitContext,
    StepContext,
    abandoned,
    finish,
    left_behind,
    unawaited,
)
from intloom.authoring.interaction import (
    confirmation_request,
    json_gap,
    questions_request,
    unencodable_part,
)
from intloom.authoring.loader import LoadedWorkflow, raised_at
from intloom.authoring.savecheck import encode_state as _encode_state
from intloom.authoring.savecheck import state_codec as _state_codec
from intloom.authoring.workflow import AgentStep, Complete, Stage, Step, Tool, ToStage
from intloom.errors import CATALOGUE, ErrorView, IntloomError, as_call, clip, error_view, message_of
from intloom.executor import clock
from intloom.executor.crew import Crews
from intloom.executor.history import FACTS, pack, shown, unpack
from intloom.executor.history import STATE_KEPT as _STATE_KEPT
from intloom.executor.history import Entry as _Entry
from intloom.executor.history import Event as _Event
from intloom.executor.history import detail as _detail
from intloom.executor.history import kept as _kept
from intloom.executor.history import plain_view as _plain_view
from intloom.executor.rounds import Rounds
from intloom.executor.updates import RunUpdate
from intloom.executor.workers import Inbox, NoThread, Workers
from intloom.runtime.limits import MAX_EFFECT_ID, MAX_OUTCOME, MAX_RECORD_BYTES
from intloom.runtime.machine import (
    IllegalTransition,
    RunState,
    Verdict,
    apply,
    fold_executing,
    fold_step_ready,
    fold_step_result,
    restart_verdict,
    to_view,
)
from intloom.runtime.model import Cursor, PendingAgentCall, RunView, WaitingAction
from intloom.runtime.plainjson import MAX_DEPTH, deeper_than, wire_problem
from intloom.runtime.ports import CheckpointFailed, JournalPort
from intloom.runtime.records import (
    OUTCOME_UNKNOWN,
    UNENCODABLE,
    EffectDone,
    EffectStarted,
    Executing,
    Header,
    Record,
    StagePending,
    StepReady,
    StepResult,
    Terminal,
    Waiting,
    check_encodable,
    encode_record,
)

if TYPE_CHECKING:
    from intloom.executor.runtime import Runtime

__all__ = ["RUN_TASK_PREFIX", "AgentClaim", "Driver", "RunObserver", "RunSlot",
           "check_effect_ids", "code_at", "running_code", "still_claimed", "user_raised",
           "without_claim_advice"]

# A Run's task is named for it (``run:<run id>``): what holds a blocked event loop is then
# named by its Run (host/loopwatch.py), and so is a task a stop abandons.
RUN_TASK_PREFIX: Final = "run:"

# (event, run id, detail, status): told of a Run's milestones, e.g. to write the host log.
# (event, run id, detail, status) -> whether the host log now holds it (None: not said).
RunObserver = Callable[[str, str, Any, str], "bool | None"]
# Milestones worth a log line; per-record phases (executing, effect_*) stay in the journal.
_MILESTONES = frozenset({
    "created", "restored", "waiting", "answered", "claimed", "agent_completed", "terminal",
    "failed", "suspended", "dismissed",
})

# A Run's history: the last publishes (each one flush's events; a Step is one flush).
_HISTORY = 1000
_ENDED = frozenset({"completed", "failed"})
# Phases a journal ends at while user code runs (a Step, an initialiser, a recover entry).
_IN_USER_CODE = frozenset({"executing", "effect_started", "effect_done"})
# Whether a user function is a coroutine function, asked once per function, not per call.
# Plain references: user functions live as long as their loaded Workflow (the host's life),
# and a WeakKeyDictionary builds a weak reference on every lookup.
_ASYNC: dict[Callable[..., Any], bool] = {}
_QUIET = ("EXECUTION_OWNERSHIP_LOST", "RUN_CHECKPOINT_FAILED")
# Where the thread driving a Run's sync Steps gave the Run back to the loop (_steps_here).
_NEXT = "next"  # not a sync Step: the loop runs it
_SYNC = "sync"  # the route ended the Run: make it durable
_BACK = "back"  # a stop, a lost Run or a new Stage: back to _drive
_AWAIT = "await"  # the sync Step returned an awaitable: the loop awaits it
_Future = asyncio.Future
_new_object = object.__new__


def _at_cursor(slot: RunSlot) -> tuple[Step[Any], bool]:
    """The Step at the Run's cursor, and whether it is async (asked through the cache first,
    without _is_async's frame)."""
    cursor = slot.state.cursor
    step = slot.lw.workflow.stages[cursor.stage].steps[cursor.step or ""]
    try:
        return step, _ASYNC[step.fn]
    except (KeyError, TypeError):
        return step, _is_async(step.fn)


def _is_async(fn: Callable[..., Any]) -> bool:
    try:
        found = _ASYNC.get(fn)
        if found is None:
            found = _ASYNC[fn] = inspect.iscoroutinefunction(fn)
        return found
    except TypeError:  # unhashable: ask every time
        return inspect.iscoroutinefunction(fn)


# Set on an exception an effect's function raised (``_Hooks``): the Step's failure then
# names that effect, which ran and is journaled done with the error (inspect showed it; the
# Run's error named only the Step).
_FROM_EFFECT: Final = "_intloom_effect"
# Assigned, not imported: Python 3.11 compiles ``name.method()`` on an imported name as an
# attribute load, which never specialises and binds a new method object on every call (a
# record's facts are looked up for each of the three records per Step).
_FACTS: Final = FACTS


def _user_failed(where: str, exc: BaseException) -> IntloomError:
    effect = getattr(exc, _FROM_EFFECT, None)
    raised_by = (f", from effect {effect[0]!r} (key {effect[1]!r}), journaled done with that "
                 "error" if isinstance(effect, tuple) and len(effect) == 2 else "")
    # Where in the Workflow's source it raised: the Step's name alone left an author with many
    # Steps (and helpers) to guess. Said right after the exception's type, ahead of its text,
    # which may be cut (MAX_MESSAGE); no traceback, which a record could not hold.
    return IntloomError("STEP_EXECUTION_FAILED",
                        f"{where} raised {_placed(exc)}{_grouped(exc)}{raised_by}")


def _placed(exc: BaseException) -> str:
    """``_raised`` with the line of the Workflow's source that raised it, if one did."""
    at = raised_at(exc.__traceback__)
    return _raised(exc, f" at line {at[1]} of {at[0]}" if at is not None else "")


# How many of an exception group's exceptions its Run's error names.
_GROUP_SHOWN: Final = 3


def _grouped(exc: BaseException) -> str:
    """What an exception group holds (an asyncio.TaskGroup's, say), each with its own line:
    the group's own message, "unhandled errors in a TaskGroup (1 sub-exception)", named
    neither what was raised nor where."""
    if isinstance(exc, _Escaped) and exc.group is not None:
        exc = exc.group  # held back as an exit (a KeyboardInterrupt in it), named all the same
    if not isinstance(exc, BaseExceptionGroup):
        return ""
    leaves: list[BaseException] = []
    total = 0
    pending: list[BaseException] = [exc]  # depth first, in order; no recursion: any depth
    while pending:
        one = pending.pop()
        if isinstance(one, BaseExceptionGroup):
            pending.extend(reversed(one.exceptions))
            continue
        total += 1
        if len(leaves) < _GROUP_SHOWN:
            leaves.append(one)
    shown = "; ".join(_placed(_contained(leaf)) for leaf in leaves)
    more = f"; and {total - len(leaves)} more" if total > len(leaves) else ""
    return f": {shown}{more}" if shown else ""


def _mark_effect(exc: BaseException, name: str, key: str) -> None:
    with contextlib.suppress(AttributeError, TypeError):  # an exception with __slots__
        setattr(exc, _FROM_EFFECT, (name, key))


async def _left_behind(ctx: StepContext[Any], where: str | Step[Any],
                       raised: BaseException | None) -> None:
    """Raise STEP_INTERACTION_INVALID when user code that is over (it returned, or raised
    ``raised``) left a confirm/ask/aeffect call of ``ctx`` un-awaited (``unawaited``): its
    question was never asked, or its effect never ran, and the Run must not go on as if they
    had. Not over a host's stop or a lost Run (cancelled, ownership lost): those calls are
    only closed, and the Run is left to the restart table."""
    left = unawaited(ctx, raised is None)
    if left is None or isinstance(raised, asyncio.CancelledError) or (
            isinstance(raised, IntloomError) and raised.code in _QUIET):
        return
    facts, fix, running = left
    if running:
        # Cancelled with their effect started: its effect_done (cancelled, outcome unknown)
        # goes in before the Run's terminal, or inspect would show the effect in flight.
        await asyncio.wait(running)
    if not facts:
        return  # only a raising Step's tasks were cancelled: its own error stands
    if not isinstance(where, str):
        where = where.where
    then = ""
    if isinstance(raised, IntloomError):
        then = f" It then failed with {raised.code}: {raised.message}"
    elif raised is not None:
        then = f" It then raised {_raised(_contained(raised))}"
    if then and not then.endswith("."):
        then += "."
    raise IntloomError("STEP_INTERACTION_INVALID",
                       clip(f"{where} {facts}. {fix}{then}")) from None


# How every refusal of a completion by on_complete ends: the Agent may try again.
_STILL_CLAIMED: Final = ("Nothing was recorded and the task stays claimed: complete it "
                         "again with a corrected output, or fail it.")


def without_claim_advice(message: str) -> str:
    """An on_complete refusal's message without its advice to complete the task again (for
    a host that stopped meanwhile, which drops the claim)."""
    return message.removesuffix(f" {_STILL_CLAIMED}")


def _refused_effects(ctx: StepContext[Any], where: str, raised: BaseException | None
                     ) -> None:
    """``_left_behind`` for an Agent Step's ``on_complete``, where ctx.aeffect is the only
    call that returns before it is refused (confirm and ask are refused at the call), and
    refused again when it begins (so no task of it is waited for): one never awaited is
    named with the fix that works there, not "await it"."""
    left = unawaited(ctx, raised is None)
    if left is None or not left[0] or isinstance(raised, asyncio.CancelledError):
        return
    raise IntloomError(
        "STEP_INTERACTION_INVALID",
        clip(f"{where} {left[0]}; on_complete cannot run effects at all: it only folds the "
             f"Agent's result into ctx.state. Do that work in the Step the outcome routes to. "
             f"{_STILL_CLAIMED}"),
    ) from None


def _raised(exc: BaseException, at: str = "") -> str:
    """What user code raised, as errors name it: its type and message, or, for what
    ``_contained`` had to carry in a stand-in, the original and what to do instead; ``at``
    (where it raised) follows the type."""
    if isinstance(exc, _Escaped):
        return f"{exc.named}{at}{exc.why}"
    text = message_of(exc)
    return f"{type(exc).__name__}{at}: {text}" if text else f"{type(exc).__name__}{at}"


def user_raised(exc: BaseException) -> str:
    """``_placed`` for the runtime (a Tool's exception): never the stand-in's own name, and
    the line of the Workflow's source that raised it, as for a Step's. A Tool's exception
    fails its call, not the Run, and the stand-in's advice says so."""
    return _placed(exc).replace(_INSTEAD, "raise an exception instead to fail the Tool call)")


_INSTEAD: Final = "raise an exception instead to fail the Run)"


class _Escaped(Exception):
    """Stands in for a BaseException user code raised that must not travel as itself
    (``_contained``), and keeps how to name it."""

    def __init__(self, exc: BaseException) -> None:
        name = type(exc).__name__
        # A BaseExceptionGroup (an exit or interrupt in it): ``_grouped`` lists what it holds.
        self.group = exc if isinstance(exc, BaseExceptionGroup) else None
        if isinstance(exc, Exception):  # StopIteration: an ordinary mistake
            text = message_of(exc)
            self.named, self.why = name, f": {text}" if text else ""
        elif self.group is not None:
            self.named = name
            self.why = f": {self.group.message} (it holds an exit or an interrupt)"
        else:
            what = ("exit the process, which is the host of every Run"
                    if isinstance(exc, SystemExit) else
                    "interrupt the process, which is the host of every Run"
                    if isinstance(exc, KeyboardInterrupt) else
                    f"raise {name}, a BaseException the host keeps for itself")
            self.named = as_call(exc)
            self.why = f" (Workflow code must not {what}; {_INSTEAD}"
        super().__init__(f"{self.named}{self.why}")
        # The original's frames: the Run's error says where in the Workflow it was raised.
        self.__traceback__ = exc.__traceback__
        effect = getattr(exc, _FROM_EFFECT, None)
        if effect is not None:  # raised by an effect's function: the error names the effect
            setattr(self, _FROM_EFFECT, effect)


def _contained(exc: BaseException) -> BaseException:
    """User code's SystemExit/KeyboardInterrupt must fail its Run, not end the host; its
    StopIteration must reach the driver (a future refuses to carry one)."""
    if isinstance(exc, (Exception, asyncio.CancelledError)) and not isinstance(
            exc, StopIteration):
        return exc
    return _Escaped(exc)


class AgentClaim:
    """The in-memory claim on one client Agent task. Never persisted: a restart interrupts it.

    Each task gets a new one (``RunSlot.agent``): a Tool call still running when its task
    ended (a cancel, a stop) settles on its own task's claim, never on the next task's."""

    def __init__(self) -> None:
        self.claim_id: str | None = None
        self.owner_token: str | None = None
        self.receipts: dict[str, tuple[bytes, str, Any]] = {}
        self.receipt_bytes = 0  # the receipts' ids, inputs and outputs, encoded (their bound)
        self.tool_running: str | None = None  # the tool_call_id of the Tool call running
        # The completion whose on_complete handler is running for this task (the runtime's
        # record of its request), so that another request can be told how it differs.
        self.completing: object | None = None


class RunSlot:
    """A live Run. ``state`` is everything appended; ``shown`` is what has been published
    (durable and exposed) -- views are built from ``shown`` only.

    A Run is driven by one thread at a time (the loop, or the worker driving its sync Steps),
    but the loop may append (a cancel) or read (a follower) while a worker drives it:
    ``lock`` makes an append (fold, journal, keep) and a publish's bookkeeping atomic. It is
    taken only while ``on_thread`` (raised by the loop before a worker starts, lowered by
    that worker, locked, when it is done): the loop alone needs no lock, and a busy Run
    would pay five round trips per Step for nothing.
    """

    # Slots, not an instance dict: past 30 attributes, CPython 3.11 keeps an instance's in a
    # dict of its own, and then never specialises a call of its methods (``slot.apply``,
    # three per Step, went through the generic attribute lookup) and reads each attribute
    # through a hint into that dict.
    __slots__ = (
        "_events", "_events_beside", "_events_published", "_packed", "_packing",
        "_stable_waiters", "_subscribers", "after_end", "agent", "checkpoint_where", "context",
        "decoded", "history", "hooks", "last_answer", "lock", "lw", "observer",
        "on_thread", "outcome_from", "override", "owned", "recalled", "recovering",
        "restored_seq", "restored_wait", "run_id", "shown", "state", "steps_on_thread",
        "suspend_reason", "suspended", "task", "thread_ctx", "waiter",
    )

    def __init__(
        self, state: RunState, lw: LoadedWorkflow, observer: RunObserver | None = None
    ) -> None:
        self.observer = observer
        self.lock = threading.Lock()
        self.on_thread = False
        self.steps_on_thread = 0  # Steps a worker drove (a counter for tests and benchmarks)
        self.run_id = state.run_id
        self.state = state
        self.shown = state
        self.lw = lw
        self.owned = True
        self.suspended = False
        self.suspend_reason: str | None = None  # why, when it is not a host stop
        self.restored_wait = False
        # The last answer this host accepted (action id, its decision, the answer as
        # journaled): an answer that comes after it is told what won, and whether it is
        # that same answer (a retry after a lost reply). Memory only, like claims.
        self.last_answer: tuple[str, str, Any] | None = None
        # Every answer the Run's journal holds (action id -> its decision and the answer),
        # read on a refusal's path when memory cannot tell (an earlier host accepted it),
        # and the seq it was read up to (``Runtime._recall_answers``).
        self.recalled: tuple[int, dict[str, tuple[str, Any]]] | None = None
        # The seq the Run was restored at (None: created by this host). Its earlier records
        # are read from the journal into the history when a follower first asks (_seed).
        self.restored_seq: int | None = None
        self.recovering = False  # restored at the recover row while its journal says executing
        self.override: ErrorView | None = None
        self.checkpoint_where: str | None = None  # where a failed checkpoint's cause is
        # What returned the outcome being routed, when not the Step itself (its recover):
        # an unrouted outcome names it. Memory only: a restart routes a saved outcome.
        self.outcome_from: str | None = None
        self.waiter: asyncio.Future[Any] | None = None
        self.task: asyncio.Task[None] | None = None
        self.context: contextvars.Context | None = None  # its task's
        self.agent = AgentClaim()
        # One _Entry per publish (its events, the shown state, and the view only when it
        # is not the plain view of that state: an override or a suspension; otherwise built
        # when a follower asks).
        self.history: deque[_Entry] = deque(
            maxlen=_HISTORY)
        # An ended Run's earlier entries, packed (executor.history), in front of ``history``;
        # ``keep_history`` packs them, ``entries_locked`` reads them back.
        self._packed: bytes | None = None
        self._packing = False
        self._events: list[_Event] = []
        self._events_published = 0
        # Events the history got beside those counted in _events_published: a publish's
        # own event, and (restored Runs) one per earlier record in the journal. With it,
        # how many a follower is not shown is a subtraction (``attach``), not a count kept
        # on every publish.
        self._events_beside = 0
        # (event, detail) shown by the publish that first shows the Run ended, after its
        # ``terminal`` (Runtime._ended_with): a cancel's "failed", a dismissal.
        self.after_end: tuple[str, Any] | None = None
        # Woken only when a publish leaves the Run waiting or ended: a client waiting for
        # that is not woken by every record of a busy Run (3 per Step).
        self._stable_waiters: list[asyncio.Future[None]] = []
        self.hooks: _Hooks | None = None  # the Driver's side of its Steps' contexts
        # The context of the Step a worker thread is running (or ran last) for this Run:
        # a cancel or a stop's cut finishes it from the loop at once, as the loop path's
        # finally does, not when the Step returns (Driver._on_thread).
        self.thread_ctx: StepContext[Any] | None = None
        # (bytes, value): the last State _encode_state checked, decoded; the next context
        # built on those very bytes takes the value instead of decoding them again (once:
        # that Step may change it). Dropped when _drive returns: nothing follows at once.
        self.decoded: tuple[bytes, Any] | None = None
        # Each follower's sink, called on the loop with the updates of one publish as that
        # publish runs: a follower's bytes go out in the same loop iteration as the flush
        # that made them durable, not a task wake-up (and a whole busy iteration) later.
        self._subscribers: set[Callable[[list[RunUpdate]], None]] = set()

    @classmethod
    def new(cls, header: Header, lw: LoadedWorkflow, observer: RunObserver | None) -> RunSlot:
        return cls(apply(None, header), lw, observer)

    def apply(self, record: Record, state: RunState) -> None:
        """Keep ``record``, whose fold onto the current state is ``state``."""
        self.state = state
        # The record's facts (a str, a tuple of two) stand for its detail until someone reads
        # it (_detail): no dict is made per event, and the history packs as it is (``pack``).
        # The cursor is the record's own: a flush often holds one Step's result and the next
        # Step's start, and its events must not all show where the last one left the Run.
        if type(record) is Waiting:
            self._events.append(_event_of(record, state))
        else:  # _event_of's common case, without its call (three records per Step)
            facts = _FACTS.get(type(record))
            self._events.append(
                _Event(state.phase, None if facts is None else facts(record), state.cursor))

    def apply_routed(self, result: StepResult, ready: StepReady, executing: Executing | None,
                     state: RunState) -> None:
        """``apply`` of a routed Step's step_result, the next Step's step_ready and (when
        given) its executing, ``state`` the fold after the last (``fold_routed``): their
        events as ``apply`` makes them, each with the cursor its own fold left."""
        cursor = self.state.cursor
        if cursor.stage != result.stage or cursor.step != result.step:
            cursor = Cursor(stage=result.stage, step=result.step)
        events = self._events
        events.append(_Event("step_result", result.outcome, cursor))
        cursor = state.cursor  # the executing's, which left the step_ready's as it was
        if executing is not None and (cursor.stage != ready.stage or cursor.step != ready.step):
            cursor = Cursor(stage=ready.stage, step=ready.step)
        events.append(_Event("step_ready", None, cursor))
        if executing is not None:
            events.append(_Event("executing", None, state.cursor))
        self.state = state

    def view(self) -> RunView:
        st = self.shown
        if st.phase == "terminal" or not self._overridden():
            return _plain_view(st)
        if self.override is not None:
            view = to_view(st, status="failed", last_error=self.override)
            if self.override.code == "RUN_INTERRUPTED":
                # Restored so: nothing resumes it, on this start or any later one, so it is
                # over for a program testing ``phase`` (docs/cli.md), though its journal
                # still ends where it did (``inspect``) until ``cancel`` dismisses it. One
                # this host stopped (a failed checkpoint) may resume at the next start.
                view = msgspec.structs.replace(view, phase="terminal")
            return view
        stopped = self.suspend_reason or "The host stopped."
        verdict = self._verdict()
        if verdict.row != "interrupted":
            message = (f"{stopped} The Run continues from its last saved boundary on the next "
                       "start, as the restart table allows.")
        elif self.state.phase in _IN_USER_CODE:
            # User code was cut mid-Step: the journal cannot prove what it did.
            message = (f"{stopped} It stopped while {verdict.reason}; the next start reports "
                       "the Run RUN_INTERRUPTED and replays nothing.")
        else:  # a wait without recover, an Agent task
            message = (f"{stopped} The next start reports the Run RUN_INTERRUPTED: "
                       f"{verdict.reason}.")
        return to_view(  # suspended
            st, status="failed",
            last_error=ErrorView(code="RUN_INTERRUPTED", message=message),
        )

    def cut_verdict(self) -> str | None:
        """What was running, when user code was cut mid-Step and the next start will report
        the Run RUN_INTERRUPTED; None when it continues (a boundary, or a recover entry)."""
        if self.state.phase not in _IN_USER_CODE:
            return None
        verdict = self._verdict()
        return verdict.reason if verdict.row == "interrupted" else None

    def next_start(self) -> Verdict | None:
        """What the next start does with the Run (the restart table's row) when that is
        already settled, else None. Settled: an ended Run (by what is durable, ``shown``: a
        Run restored RUN_INTERRUPTED and dismissed here has ended, though it keeps its
        override; one whose terminal record failed to flush has not); a Run restored
        RUN_INTERRUPTED (its journal, and so its row, is as this start found it); a waiting
        Run (nothing moves it while the host stops). Not settled: a Run still running (a
        stop gives its Step the grace to reach a boundary), or one that failed here."""
        restored_interrupted = (self.override is not None
                                and self.override.code == "RUN_INTERRUPTED")
        if (self.shown.phase == "terminal" or restored_interrupted
                or (self.override is None and self.state.phase == "waiting")):
            return self._verdict()
        return None

    def outlook(self) -> Verdict | None:
        """For a Run this host suspended: what the next start does with it (the restart
        table's row for its journal as it now ends). None for any other Run: an ended one,
        or one that failed here (a failed checkpoint restores from its last durable record,
        which its state in memory may have gone past)."""
        if not self.suspended or self.override is not None or self.state.phase == "terminal":
            return None
        return self._verdict()

    def _verdict(self) -> Verdict:
        """The restart table's row for the Run's journal as appended so far."""
        cursor = self.state.cursor
        return restart_verdict(self.state, self.lw.has_recover(cursor.stage, cursor.step))

    def _overridden(self) -> bool:
        """The view is not simply the shown state's (a failure or suspension outside it)."""
        return self.override is not None or self.suspended

    def mark(self) -> tuple[RunState, int]:
        """What has been appended so far: publish up to here once it is durable."""
        if not self.on_thread:
            return self.state, self._events_published + len(self._events)
        lock = self.lock
        lock.acquire()  # not ``with``: see publish_here
        try:
            return self.state, self._events_published + len(self._events)
        finally:
            lock.release()

    def off_thread(self) -> None:
        """From the worker that drove the Run: it will not touch the Run again."""
        with self.lock:
            self.on_thread = False

    def publish(
        self, event: str | None = None, detail: Any = None,
        upto: tuple[RunState, int] | None = None,
    ) -> None:
        """Tell subscribers: show what a flush made durable (up to ``upto``) and/or ``event``.

        Only a flush advances what is shown. Records appended by other coroutines while a
        flush was running are not covered by it: they stay unshown until their own flush.
        Loop thread only (subscribers and waiters are the loop's); see ``publish_here``.
        """
        if (upto is not None and event is None and not self.on_thread and not self._subscribers
                and self.override is None and not self.suspended and self.after_end is None):
            # A Step's flush (one publish per Step) of a Run nobody follows, neither failed
            # nor suspended: what the general path below does then, without its tests and
            # locals for what cannot be (no lock, no event of its own, no view, no follower;
            # callgrind, 64 async Runs: 118.2-118.4k -> 116.1-117.0k instructions per Step).
            state, position = upto
            events = self._events
            if events and position - self._events_published == len(events):
                # _advance's usual case (the flush covers everything appended), without its
                # frame.
                if state.seq > self.shown.seq:
                    self.shown = state
                self._events = []
                self._events_published = position
            else:
                events = self._advance(upto)
            stable = self._stable_waiters
            if events:
                # _kept(shown), without its frame when it keeps the state as it is (no output,
                # a small State: a Step's usual case, once per Step).
                shown = self.shown
                stage_state = shown.stage_state
                if shown.output is not None or (stage_state is not None
                                                and len(stage_state) >= _STATE_KEPT):
                    shown = _kept(shown)
                self.history.append(_Entry(tuple(events), shown, None))
                if self._packing:
                    self._pack()
                if self.observer is not None:
                    for ev in events:  # a loop, not any() over a generator: once per Step
                        if ev.name in _MILESTONES:
                            self._observe(events, None)
                            break
            if stable and self.shown.status != "running":
                self._wake_stable()
            return
        lock = self.lock if self.on_thread else None
        if lock is not None:
            lock.acquire()
        try:
            events = self._advance(upto)
            if self.after_end is not None and events and self.shown.phase == "terminal":
                # In this publish, after the end: a follower's stream ends with its batch.
                events.append(_Event(*self.after_end, None))
                self._events_beside += 1
                self.after_end = None
            if event is not None:
                events.append(_Event(event, detail, None))  # where the shown state is
                self._events_beside += 1
            # Views are built only for whoever reads one now (a follower, the log, a
            # waiter): a busy Run nobody follows publishes once per Step.
            shown, subscribers, observer = self.shown, self._subscribers, self.observer
            overridden = self.override is not None or self.suspended  # as _overridden()
            # Not for followers when nothing is new: ``show_early`` showed it already.
            view = self.view() if (subscribers and events) or overridden else None
            if events:
                kept = view if overridden and shown.phase != "terminal" else None
                # A tuple, not the list: a tuple of gc=False events is untracked by the
                # cyclic collector at its first pass (a list would stay tracked), so a long
                # history costs full collections nothing; the entry itself is never tracked
                # (executor.history).
                self.history.append(_Entry(tuple(events), _kept(shown), kept))
                if self._packing:  # an ended Run's late event (a cancel's, a dismissal)
                    self._pack()
            stable = self._stable_waiters
        finally:
            if lock is not None:
                lock.release()
        if events and (subscribers or observer is not None):
            if subscribers:
                assert view is not None
                updates = [RunUpdate(event=ev.name, run=_at(view, ev.cursor),
                                     detail=_detail(ev.name, ev.info))
                           for ev in events]
                for sink in tuple(subscribers):  # a sink may unsubscribe (its stream ended)
                    sink(updates)
            if observer is not None:
                view = self._observe(events, view)
        if not stable:
            return
        # Without an override the view's status is the shown state's: no view to build.
        status = view.status if view is not None else shown.status
        if status != "running":
            self._wake_stable()

    def _observe(self, events: list[_Event], view: RunView | None) -> RunView | None:
        """Tell the observer (the host log) the milestones among ``events``; returns the
        view, built here if ``view`` was None and a milestone needed it."""
        observer = self.observer
        assert observer is not None
        for ev in events:
            if ev.name in _MILESTONES:
                if view is None:
                    view = self.view()
                detail = _detail(ev.name, ev.info)
                error = view.last_error
                if ev.name == "terminal" and error is not None:
                    # The host log said only "failed": why (a Step's exception, its file
                    # and line) was in the journal and the Run's view alone.
                    detail = {"code": error.code, "message": error.message}
                # A suspended Run's view reads failed/RUN_INTERRUPTED to its clients (the
                # host is going); the log keeps what the Run was: every Run waiting at a
                # stop read as failed to a grep for failures.
                observer(ev.name, self.run_id, detail,
                         self.shown.status if ev.name == "suspended" else view.status)
        return view

    def _wake_stable(self) -> None:
        """Wake whoever waits for the Run to be waiting or ended (it now is)."""
        with self.lock:
            stable, self._stable_waiters = self._stable_waiters, []
        for waiter in stable:
            if not waiter.done():
                waiter.set_result(None)

    @property
    def followed(self) -> bool:
        """Somebody is attached (``subscribe``): what a flush makes durable is worth showing
        at once."""
        return bool(self._subscribers)

    def publish_here(self, upto: tuple[RunState, int]) -> bool:
        """``publish(upto=upto)`` from the thread driving the Run's sync Steps, when nobody
        on the loop needs telling (no follower, no override, no milestone for the log, and
        nobody waiting for a stable Run that this leaves stable). Returns False, having
        done nothing, when somebody does: then the loop must publish.

        Waking the loop for every Step nobody follows would cost a thread wake-up and a GIL
        hand-off per Step (measured on a 2-vCPU VM: ~60 us of CPU per sync Step).
        """
        state = upto[0]
        lock = self.lock
        # acquire/release, not ``with``: a with-statement on a lock costs ~1.5k instructions
        # more (callgrind), and this runs once per sync Step.
        lock.acquire()
        try:
            if (self._subscribers or self.override is not None or self.suspended
                    or self.after_end is not None):  # self._overridden(), without its frame
                return False
            if self._stable_waiters and state.status != "running":
                return False
            count = upto[1] - self._events_published  # <= 0: a later publish showed them
            pending = self._events[:count] if 0 < count < len(self._events) else (
                self._events if count > 0 else [])
            if self.observer is not None:
                for event in pending:  # a loop, not any() over a generator: once per Step
                    if event.name in _MILESTONES:
                        return False
            events = self._advance(upto)
            if events:
                self.history.append(_Entry(tuple(events), _kept(self.shown), None))
        finally:
            lock.release()
        return True

    def _advance(self, upto: tuple[RunState, int] | None) -> list[_Event]:
        """Show the state ``upto`` and take its events off the unshown list (locked)."""
        if upto is None:
            return []
        state, position = upto
        if state.seq > self.shown.seq:  # flushes complete in order; never show less
            self.shown = state
        count = position - self._events_published
        if count <= 0:
            return []
        if count == len(self._events):  # the usual case: everything appended
            events, self._events = self._events, []
        else:
            events = self._events[:count]
            self._events = self._events[count:]
        self._events_published += count
        return events

    def keep_history(self, entries: int) -> None:
        """An ended Run: keep only the last ``entries`` of the history, from now on too (an
        earlier host's history seeded later included), packed (``executor.history``)."""
        with self.lock:
            if (self.history.maxlen or 0) > entries:
                self.history = deque(self.history, maxlen=entries)
            self._packing = True
            self._pack()

    def _pack(self) -> None:
        """Move the entries held as objects into the packed blob (locked)."""
        if not self.history:
            return
        kept = self.entries_locked()
        blob = pack(kept)
        if blob is not None:
            self._packed = blob
            self.history = deque(maxlen=self.history.maxlen)

    def entries_locked(self) -> list[_Entry]:
        """The history, oldest first: the packed entries and those held as objects, the last
        ``history.maxlen`` of them (the caller holds ``lock``)."""
        if self._packed is None:
            return list(self.history)
        entries = [*unpack(self._packed, self.state), *self.history]
        return entries[-(self.history.maxlen or 0):]

    def history_size(self) -> int:
        """How many entries the history holds (unpacks it: for tests and diagnostics)."""
        with self.lock:
            return len(self.entries_locked())

    def _seed(self, entries: list[_Entry]) -> None:
        """Put a restored Run's earlier entries (``_earlier_entries``) in front of its history,
        once."""
        with self.lock:
            if self.restored_seq is None:  # another follower seeded it meanwhile
                return
            # One event per record after the header (_earlier_entries), shown or not.
            self._events_beside += max(0, self.restored_seq - 1)
            self.restored_seq = None
            held = self.entries_locked()
            room = (self.history.maxlen or 0) - len(held)
            if entries and room > 0:
                self._packed = None
                self.history = deque([*entries[-room:], *held], maxlen=self.history.maxlen)
                if self._packing:
                    self._pack()

    async def until_stable(self) -> None:
        """Return at the next publish that leaves the Run waiting or ended."""
        waiter = asyncio.get_running_loop().create_future()
        with self.lock:
            if len(self._stable_waiters) > 32:  # clients that gave up waiting
                self._stable_waiters = [w for w in self._stable_waiters if not w.done()]
            self._stable_waiters.append(waiter)
        await waiter

    def deliver(self, answer: Any) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(answer)

    def revoke(self, exc: BaseException) -> None:
        self.owned = False
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def suspend(self, reason: str | None = None) -> None:
        if self.shown.phase == "terminal" or self.override is not None:
            return
        self.suspended = True
        self.suspend_reason = reason
        self.revoke(IntloomError("EXECUTION_OWNERSHIP_LOST"))
        # When: the view's updatedAt is its last record's, and a stop writes none.
        self.publish("suspended", {"at": clock.now()})

    async def seed(
        self, earlier: Callable[[], list[Record]] | None = None,
        offload: Callable[..., Awaitable[Any]] | None = None,
    ) -> None:
        """Before a follower attaches: for a restored Run, read its records up to the
        restore from the journal (``earlier``, blocking; run by ``offload`` on a worker
        thread, once per Run): an earlier host's history."""
        if earlier is not None and self.restored_seq is not None:
            run = offload if offload is not None else asyncio.to_thread
            self._seed(await run(_earlier_entries, earlier))

    def attach(self, sink: Callable[[list[RunUpdate]], None]) -> list[RunUpdate]:
        """Subscribe ``sink`` to every later publish (loop thread) and return the history so
        far: the caller hands the history on before it next awaits, so nothing is lost or
        repeated between them. ``detach`` ends it."""
        with self.lock:  # no publish between the history read and the subscription
            self._subscribers.add(sink)
            entries = self.entries_locked()
            published = self._events_published + self._events_beside
        updates = [
            RunUpdate(event=ev.name, run=_at(view, ev.cursor), detail=_detail(ev.name, ev.info),
                      history=True)
            for entry in entries
            for view in (shown(entry),)
            for ev in entry.events
        ]
        # The history is bounded (_HISTORY, an ended Run's keep_history): say on its first
        # entry how much came before it, so that a follower does not take it for the start.
        omitted = published - len(updates)
        if omitted > 0 and updates:
            updates[0] = msgspec.structs.replace(updates[0], omitted=omitted)
        return updates

    def detach(self, sink: Callable[[list[RunUpdate]], None]) -> None:
        with self.lock:
            self._subscribers.discard(sink)

    def ended(self) -> bool:
        return self.view().status in _ENDED

    async def follow(
        self, earlier: Callable[[], list[Record]] | None = None,
        offload: Callable[..., Awaitable[Any]] | None = None,
    ) -> AsyncIterator[list[RunUpdate]]:
        """History so far, then live updates, in batches: everything published since the
        follower last woke goes out together. (The host's streams take the publishes as
        they happen instead: ``attach``.) ``earlier``, ``offload``: as ``seed``'s.
        """
        await self.seed(earlier, offload)
        queue: deque[RunUpdate] = deque()
        wake: list[asyncio.Future[None] | None] = [None]

        def sink(updates: list[RunUpdate]) -> None:
            queue.extend(updates)
            waiter = wake[0]
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

        history = self.attach(sink)
        try:
            if history:
                yield history
            if self.ended():
                return
            loop = asyncio.get_running_loop()
            while True:
                while not queue:
                    waiter = wake[0] = loop.create_future()
                    await waiter
                batch = list(queue)
                queue.clear()
                for i, item in enumerate(batch):
                    if item.run.status in _ENDED:
                        # Every event of the publish that ended the Run shows it ended: the
                        # ones after the first (the ``terminal``) go out too.
                        end = i + 1
                        while end < len(batch) and batch[end].run.status in _ENDED:
                            end += 1
                        yield batch[:end]
                        return
                yield batch
        finally:
            self.detach(sink)


def _at(view: RunView, cursor: Cursor | None) -> RunView:
    """``view`` as of an event: with the cursor of the record behind it (None: the view's)."""
    if cursor is None or cursor is view.cursor or cursor == view.cursor:
        return view
    return msgspec.structs.replace(view, cursor=cursor)


def _event_of(record: Record, state: RunState) -> _Event:
    """The event ``record`` (folded into ``state``) is published as: the phase it leaves the
    Run at, but ``claimed`` for an Agent task's claim, whose record is a Waiting that only
    moves the task to claimed: as another ``waiting`` it showed the Run waiting twice in a
    row, the claim's own event right after it. (A claim's dict detail costs a tracked
    object, once per task, not per Step.)"""
    if type(record) is Waiting and record.agent_call is not None and (
            record.agent_call.phase == "claimed"):
        return _Event("claimed", {"callId": record.agent_call.id}, state.cursor)
    facts = _FACTS.get(type(record))
    return _Event(state.phase, None if facts is None else facts(record), state.cursor)


def _earlier_entries(earlier: Callable[[], list[Record]]) -> list[_Entry]:
    """History entries for a restored Run's records (``earlier()``, read from its journal):
    one per record, as each would have been published (flush boundaries are not recorded),
    the last ``_HISTORY`` of them. On a worker thread: the read and the fold take as long as
    the Run's journal is; the loop only splices the result in. Nothing when the journal
    cannot be read now: the history is a display; ``inspect`` reports what is wrong."""
    try:
        records = earlier()
    except (IntloomError, OSError):
        return []
    entries: deque[_Entry] = deque(maxlen=_HISTORY)
    state: RunState | None = None
    for record in records:
        try:
            state = apply(state, record)
        except IllegalTransition:
            break  # the journal read back whole; a refusal is the restore's to report
        if type(record) is not Header:
            entries.append(_Entry((_event_of(record, state),), _kept(state), None))
    return list(entries)


def check_effect_ids(state: RunState, name: str, key: str, via: str = "ctx.effect") -> None:
    """STEP_INTERACTION_INVALID for an effect name or key past ``MAX_EFFECT_ID``, naming
    the call (``via``) that was given it."""
    for what, value in (("name", name), ("key", key)):
        if len(value) > MAX_EFFECT_ID:
            raise IntloomError(
                "STEP_INTERACTION_INVALID",
                f"{running_code(state)}: the effect {what} given to {via} is {len(value):,} "
                f"characters ({clip(repr(value), 60)}), over the {MAX_EFFECT_ID:,}-character "
                "limit; the effect was not called and nothing was recorded. Use a short name, "
                "and a short key (a hash or an id of the data rather than the data itself).",
            )


def code_at(cursor: Cursor) -> str:
    """The user code at ``cursor`` (a Step, or a Stage's initialiser), as errors about what
    it handed over name it."""
    return f"{_where(cursor)} initialiser" if cursor.step is None else _where(cursor)


def running_code(state: RunState) -> str:
    """``code_at`` the Run's cursor, naming a Step's ``recover`` when that is what runs: an
    error about what it did sent its author to the Step's body, which did not run."""
    code = code_at(state.cursor)
    return f"{code} recover" if state.executing_kind == "recover" else code


def _effect_left_running(state: RunState, exc: Exception) -> IntloomError | None:
    """The Run's error when user code ended (a sync Step returned, say) while an effect it had
    handed to a thread of its own still ran: what the code left (its outcome, its State) may
    not be journaled before that effect's end, and the machine refused it as such."""
    if not isinstance(exc, IllegalTransition) or exc.got in ("effect_started", "effect_done"):
        return None
    running = state.effect_in_flight
    shown = "the effect is shown in flight (its outcome unknown; check its target)"
    if (running is None and exc.previous == "effect_started" and exc.seq == state.seq
            and state.phase == "effect_done"):
        # The effect ended between the refusal and now (its end reached the loop first):
        # still the Step's mistake, not the host's fault (CLI_INTERNAL_ERROR).
        running = state.last_effect
        shown = "the effect ended just after, its end recorded (intloom inspect shows it)"
    if running is None:
        return None
    # An initialiser returns a State, not an outcome: "its outcome" sent its author looking
    # for one.
    left = "the State it returned" if state.cursor.step is None else "its outcome"
    return IntloomError(
        "STEP_INTERACTION_INVALID",
        f"{running_code(state)} returned while effect {running.name!r} (key {running.key!r}) "
        "was still running, in a thread of its own: an effect's end is journaled before what "
        f"follows it, so {left} was not recorded, and {shown}. Wait for (join) each thread "
        f"that uses ctx before {_code_kind(state)} returns.",
    )


def _code_kind(state: RunState) -> str:
    """The user code running, as a fix names it: "make the Step `async def`"."""
    if state.cursor.step is None:
        return "the initialiser"
    return "recover" if state.executing_kind == "recover" else "the Step"


def _where(cursor: Cursor) -> str:
    """The Step at ``cursor`` as errors name it (``Step.where``'s form)."""
    if cursor.step is None:
        return f"Stage {cursor.stage!r}"
    return f"Stage {cursor.stage!r}, Step {cursor.step!r}"


def still_claimed(exc: IntloomError, where: str) -> IntloomError:
    """``exc``, raised by (or for) an Agent Step's ``on_complete``, saying where, that the
    completion recorded nothing, and what the Agent can do."""
    if exc.code == "EXECUTION_OWNERSHIP_LOST" or _STILL_CLAIMED in exc.message:
        return exc
    message = exc.message
    step = where.removesuffix(" on_complete")
    if not message.startswith(where):
        # "Stage 'a', Step 'b' assigned ..." names the Step: say it was its on_complete.
        message = (where + message[len(step):] if message.startswith(step + " ")
                   else f"{where}: {message}")
    return IntloomError(exc.code, f"{message} {_STILL_CLAIMED}", retryable=exc.retryable)


def _not_an_outcome(where: str, outcome: Any, step: Step[Any]) -> IntloomError:
    """STEP_RESULT_INVALID for what a Step (or ``recover``) returned instead of an outcome.
    An awaitable is named as one: ``return helper(ctx)`` in an ``async def`` Step, for
    ``return await helper(ctx)``, read "returned <coroutine object helper at 0x...>" as if
    the Step had returned a strange value, and the coroutine's "never awaited" warning went
    to the host's /dev/null."""
    routes = sorted(step.routes)
    if inspect.isawaitable(outcome):
        if inspect.iscoroutine(outcome):
            outcome.close()  # it never runs: no "never awaited" warning on top
        return IntloomError(
            "STEP_RESULT_INVALID",
            f"{where} returned {_shown(outcome, 200)} without awaiting it, so it never ran. "
            f"Await it and return its outcome (`return await ...`), a non-empty outcome "
            f"string, one of {routes}.",
        )
    return IntloomError(
        "STEP_RESULT_INVALID",
        f"{where} returned {_shown(outcome, 200)}; return a non-empty outcome string, one of "
        f"{routes}.",
    )


class _TooDeep(Exception):
    """A value nested deeper than ``plainjson.MAX_DEPTH``, for ``_plain``."""


def _plain(value: Any, task_of: Step[Any] | None = None) -> Any:
    """A JSON/msgpack-safe copy of an effect's result, for the journal (evidence only), or
    of the Agent task ``task_of`` returned."""
    if task_of is not None:
        if value is None:
            # Almost always a forgotten ``return``: it was published as a task of null, which
            # the Agent could only guess at, while a code Step returning None is refused.
            raise IntloomError(
                "STEP_INTERACTION_INVALID",
                f"{task_of.where} returned None, not an Agent task; nothing was recorded and "
                "no task was published. Return the task for the Agent: the JSON data it is to "
                "work on (`return {\"topic\": ctx.intent}`); a function that ends without "
                "`return` returns None.",
            )
        if inspect.isawaitable(value):
            # ``return helper(ctx)`` in an ``async def`` one, for ``return await helper(ctx)``:
            # refused as "$ is coroutine (TypeError)", as if the task held a strange value,
            # and the "never awaited" warning went to the host's /dev/null (as _not_an_outcome).
            if inspect.iscoroutine(value):
                value.close()
            raise IntloomError(
                "STEP_INTERACTION_INVALID",
                f"{task_of.where} returned {_shown(value, 200)} without awaiting it, so it "
                "never ran; nothing was recorded and no task was published. Await it and "
                "return the task it gives (`return await ...`).",
            )
        gap = json_gap(value)
        if gap is not None:
            raise IntloomError(
                "STEP_INTERACTION_INVALID",
                f"{task_of.where} returned an Agent task ({type(value).__name__}) that cannot "
                f"be sent as it is: {gap[0]}; nothing was recorded and no task was "
                f"published. {gap[1]}",
            )
    try:
        plain = msgspec.to_builtins(value)
        if deeper_than(plain):
            # It would encode here, and then not decode where a restart reads it back.
            raise _TooDeep
        check_encodable(plain)  # to_builtins lets through what msgpack refuses (2**70)
        return plain
    except _TooDeep:
        if task_of is not None:
            raise IntloomError(
                "STEP_INTERACTION_INVALID",
                f"{task_of.where} returned an Agent task ({type(value).__name__}) nested more "
                f"than {MAX_DEPTH} levels deep; nothing was recorded and no task was "
                "published. Return a tree of plain data a few hundred levels deep at most.",
            ) from None
        return {"repr": _shown(value)}
    except RecursionError:
        if task_of is not None:
            # The Agent works on the task itself: a repr of it would be no task at all.
            raise IntloomError(
                "STEP_INTERACTION_INVALID",
                f"{task_of.where} returned an Agent task ({type(value).__name__}) that holds "
                "itself, or is nested too deeply, to be encoded (RecursionError); nothing was "
                "recorded and no task was published. Return a tree of plain data a few "
                "hundred levels deep at most.",
            ) from None
        return {"repr": _shown(value)}
    except UNENCODABLE as exc:
        if task_of is not None:
            # As above: the Agent would get {"repr": ...}, a task the Step never returned.
            raise IntloomError(
                "STEP_INTERACTION_INVALID",
                f"{task_of.where} returned an Agent task ({type(value).__name__}) that cannot "
                f"be encoded: {_unencodable_at(value, exc)}; nothing was recorded and no task "
                "was published. Return plain data: str (valid Unicode), integers within 64 "
                "bits, floats, booleans, lists and dicts with str keys, and None inside a list "
                "or dict (not as the whole task, which is refused as a forgotten return).",
            ) from None
        return {"repr": _shown(value)}


def _unencodable_at(value: Any, exc: BaseException) -> str:
    """Where in ``value`` msgpack gave up (``$.n is an integer beyond 64 bits``), else what it
    raised."""
    with contextlib.suppress(*UNENCODABLE):
        found = wire_problem(msgspec.to_builtins(value))
        if found is not None:
            return found
    part = unencodable_part(value)  # what to_builtins refuses too (an object())
    return f"{part} ({type(exc).__name__})" if part else f"{type(exc).__name__}: {message_of(exc)}"


def _shown(value: Any, limit: int | None = None) -> str:
    """``value``'s repr: for the journal (no ``limit``), its first 1,000 characters; for a
    message, cut to ``limit`` by ``clip``, whose marker counts what the whole repr had. A
    value too deep for repr (RecursionError; one that merely holds itself reprs as
    ``[[...]]``), or whose __repr__ raises, is described instead: the effect is over and its
    ``effect_done`` must be written whatever its result is."""
    try:
        text = repr(value)
    except Exception as exc:
        try:
            # reprlib stops at a few levels and catches what an item's repr raises.
            short = reprlib.repr(value)
        except Exception:
            short = f"<{type(value).__name__}>"
        text = f"{short} (its full repr raised {type(exc).__name__})"
    return text[:1000] if limit is None else clip(text, limit)


class _Refused:
    """The hooks of an ``on_complete`` context: it only folds a result into the State, so
    effects and waits are refused (no ``executing`` record stands before it)."""

    def __init__(self, loop_thread: threading.Thread, where: str) -> None:
        self.loop_thread = loop_thread
        self._where = where

    def _refuse(self, what: str) -> IntloomError:
        return IntloomError(
            "STEP_INTERACTION_INVALID",
            f"{self._where} on_complete cannot {what}: it only folds the Agent's result into "
            "ctx.state. Do that work in the Step the outcome routes to.",
        )

    def effect_sync(self, name: str, key: str, call: Callable[[], Any]) -> Any:
        raise self._refuse(f"run effect {name!r}")

    async def effect_async(self, name: str, key: str, call: Callable[[], Any]) -> Any:
        raise self._refuse(f"run effect {name!r}")

    def before_wait(self, kind: str) -> None:
        # At the call, so a sync on_complete hears this, not "make the Step async".
        raise self._refuse(f"wait for a {kind} answer")

    async def wait(self, kind: str, request: Any, state: Any) -> Any:
        raise self._refuse(f"wait for a {kind} answer")

    def running(self) -> str | None:
        # Never asked: an on_complete context is not finished (``finish``), since all it
        # could act through is refused here anyway, whenever it is called.
        return None


# Why a wait or an effect alongside another is refused, and the fix.
_ONE_AT_A_TIME: Final = (
    "a Step waits for one answer at a time, and not while an effect runs, since the journal "
    "records each on its own, one after another. Nothing of this call was recorded. Await "
    "each ctx.confirm, ctx.ask and ctx.aeffect before the next (not together in "
    "asyncio.gather).")


class _Hooks:
    """The executor side of ``StepContext``: journals effects and waits before they happen."""

    def __init__(self, driver: Driver, slot: RunSlot, loop: asyncio.AbstractEventLoop) -> None:
        self.driver = driver
        self.slot = slot
        self.loop = loop
        self.loop_thread = driver.loop_thread

    async def _begin(self, name: str, key: str, via: str) -> None:
        rt = self.driver.rt
        if (via == "ctx.aeffect" and self.driver.stopping
                and (not self.slot.owned or self.slot.state.effect_in_flight is not None)):
            # The stop cut this async Step's effect (it stays in flight, for the next start
            # to name) and the Step calls another: a retry loop catching everything around
            # ctx.aeffect. Refused at once, that loop spun on the host's event loop without
            # yielding, as around ctx.confirm (see wait). It waits for the stop instead.
            await self.loop.create_future()
        if not self.slot.owned:
            # Ended under the Step (an effect's end it could not record, a cancel): said
            # before the checks below, which would call an effect the Run's end cut short
            # "still running".
            raise IntloomError(
                "EXECUTION_OWNERSHIP_LOST",
                f"Run {self.slot.run_id} has ended (it was stopped, cancelled or failed); "
                f"effect {name!r} (key {key!r}) was not called and nothing was recorded.",
            )
        check_effect_ids(self.slot.state, name, key, via)  # named by the call it is
        running = self.slot.state.effect_in_flight
        pending = self.slot.state.pending_action
        busy: str | None = None
        if running is not None:
            # Called from inside another effect's function, or alongside it (asyncio.gather,
            # threads): the journal brackets one effect at a time, so this one is refused
            # before anything of it is recorded or called.
            busy = (f"effect {running.name!r} (key {running.key!r}) was still running: effects "
                    "cannot be nested or run at the same time, each is journaled on its own. "
                    "Call them one after another in the Step, not from inside another "
                    "effect's function.")
        elif pending is not None:
            # Alongside a wait of the same Step (asyncio.gather): the journal cannot record an
            # effect while the Run waits, which surfaced as the machine's IllegalTransition.
            busy = (f"its wait on {pending.kind} {pending.id} was still unanswered: "
                    f"{_ONE_AT_A_TIME}")
        if busy is not None:
            raise IntloomError(
                "STEP_INTERACTION_INVALID",
                f"{running_code(self.slot.state)} started effect {name!r} (key {key!r}) while "
                f"{busy}",
            )
        rt.append(self.slot, EffectStarted(at=clock.now(), name=name, key=key))
        await rt.sync(self.slot)
        if via == "ctx.aeffect":
            # One turn of the loop with the effect in flight: an effect started alongside it
            # (asyncio.gather, a TaskGroup) begins now and is refused, as documented. A flush
            # made inline (an idle host) never yielded, so the same Step passed on an idle
            # host and failed on a busy one.
            await asyncio.sleep(0)
        if not self.slot.owned:  # cancelled or stopped while the start was being flushed
            raise IntloomError(
                "EXECUTION_OWNERSHIP_LOST", "The Run was stopped; the effect was not called."
            )

    async def _end(self, name: str, key: str, ok: bool, result: Any, error: str | None) -> None:
        # Durable before the Step goes on: its code after the effect is as observable as the
        # effect, and a crash there must find the effect's result (a payment id, say) in
        # the journal, not an effect in flight whose outcome is unknown (DESIGN §5).
        rt = self.driver.rt
        if self.slot.state.phase == "terminal":
            # Ended under an effect a thread of the Step's ran (the Step raised meanwhile):
            # the machine would refuse the record after the Run's end.
            raise IntloomError(
                "EXECUTION_OWNERSHIP_LOST",
                f"Run {self.slot.run_id} ended while effect {name!r} (key {key!r}) ran; its "
                "end was not recorded (the journal shows it in flight, its outcome unknown).",
            )
        record = EffectDone(at=clock.now(), name=name, key=key, ok=ok, result=result,
                            error=error)
        try:
            rt.append(self.slot, record)
        except IntloomError as exc:
            if exc.code != "RUN_STATE_INVALID":
                raise
            await self._unrecorded(record)
        await rt.sync(self.slot)

    async def _unrecorded(self, record: EffectDone) -> NoReturn:
        """End the Run when an effect's end cannot be journaled (a result beyond a record's
        limit). The effect ran, yet the journal holds it in flight, so nothing more of the Run
        can be recorded: left to the Step, the refusal said "nothing was recorded" (as if the
        effect had not run), a Step that caught it and went on was failed as the host's
        CLI_INTERNAL_ERROR (IllegalTransition), and its next effect was refused as nested in
        one still running."""
        slot = self.slot
        state = slot.state
        code = running_code(state)
        try:  # measured as the store frames it (Runtime.complete_agent_call does the same)
            size = len(encode_record(record)) + len(slot.run_id) + 64
            fact = (f"a result the journal cannot hold: {size:,} bytes encoded, and a record "
                    f"holds at most {MAX_RECORD_BYTES:,}")
        except UNENCODABLE as exc:
            fact = f"a result the journal cannot encode ({type(exc).__name__}: {exc})"
        error = IntloomError(
            "RUN_STATE_INVALID",
            f"{code}: effect {record.name!r} (key {record.key!r}) ran and returned {fact}, "
            "so its end was not recorded: the journal shows it started with its outcome "
            "unknown, and the Run cannot go on, whatever the Step does next. The effect did "
            "run: check its target before starting the work again. Return less from an "
            "effect: write large data to a file (or a store of your own) and return its path "
            "or id.",
        )
        await self.driver._fail(slot, error.view())
        slot.owned = False  # the Step's outcome, and any later effect, go unrecorded
        raise error

    def _on_loop(self, make: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run a journal coroutine on the host's loop from a Step's thread, and wait for it."""
        coro = make()
        try:
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        except RuntimeError:  # the loop is gone: the host stopped under this Step
            coro.close()
            raise IntloomError(
                "EXECUTION_OWNERSHIP_LOST", "The host stopped while this Step was running."
            ) from None
        future.result()

    def effect_sync(self, name: str, key: str, call: Callable[[], Any]) -> Any:
        self._on_loop(lambda: self._begin(name, key, "ctx.effect"))
        try:
            value = call()
        except BaseException as exc:
            # SystemExit, KeyboardInterrupt, CancelledError raised by the function end the
            # effect too: left without an effect_done, the journal held it in flight and a
            # retry under its key was refused as nested in an effect "still running".
            error = (f"{type(exc).__name__}: {message_of(exc)}" if isinstance(exc, Exception)
                     else _raised(exc))
            self._on_loop(lambda: self._end(name, key, False, None, error))
            _mark_effect(exc, name, key)
            raise
        if inspect.isawaitable(value):
            # A sync callable that returned a coroutine (an async function behind a lambda,
            # say): nothing awaits it here, so what it stands for never ran. Recorded as a
            # failure, never as done.
            if inspect.iscoroutine(value):
                value.close()
            # Its function was called, though: what it did before it returned (a charge
            # sent, then a future of its reply) happened. "It never ran" said otherwise.
            problem = (f"effect {name!r} (key {key!r}) returned {type(value).__name__}, an "
                       "awaitable that a sync Step cannot await: its function was called, "
                       "so what it did before it returned may have happened, but the "
                       "awaitable it returned was never awaited")
            self._on_loop(lambda: self._end(name, key, False, None, f"{problem}."))
            raise IntloomError(
                "STEP_INTERACTION_INVALID",
                f"{running_code(self.slot.state)}: {problem}; its effect_done records it "
                f"failed. Make {_code_kind(self.slot.state)} `async def` and write `await "
                "ctx.aeffect(...)`.",
            )
        self._on_loop(lambda: self._end(name, key, True, _plain(value), None))
        return value

    async def effect_async(self, name: str, key: str, call: Callable[[], Any]) -> Any:
        try:
            await self._begin(name, key, "ctx.aeffect")
        except asyncio.CancelledError:
            running = self.slot.state.effect_in_flight
            if (self.slot.owned and not self.driver.cutting and running is not None
                    and running.key == key):
                # The Step cancelled it while its effect_started was being flushed (a
                # timeout, a task it cancelled, a gather's sibling failing): left without
                # an end, the journal held in flight an effect that never ran, and the
                # Step's retry and every later effect were refused as nested in it.
                ended = left_behind(asyncio.current_task())
                why = ("a timeout or a cancel in the Step" if ended is None else
                       f"its Step {ended} before the task that ran it had ended")
                await self._end(name, key, False, None, "CancelledError: cancelled before "
                                f"its function was called ({why}); it did not run")
            raise
        try:
            value = call()
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:
            await self._end(name, key, False, None,
                            f"{type(exc).__name__}: {message_of(exc)}")
            _mark_effect(exc, name, key)
            raise
        except asyncio.CancelledError:
            if self.slot.owned and not self.driver.cutting:
                # Not the host's doing (a stop past its grace, a Run cancel: then nothing is
                # recorded and the next start names the effect in flight). The Step cancelled
                # it (asyncio.wait_for around it), or its function raised CancelledError
                # itself: the effect is over, so later effects and a retry may start.
                task = asyncio.current_task()
                ended = left_behind(task)
                if ended == "returned":
                    how = ("cancelled because its Step returned without awaiting the task "
                           "that ran it")
                elif ended == "raised":
                    how = "cancelled because its Step raised before the task that ran it had ended"
                elif task is not None and task.cancelling():
                    how = "cancelled before it returned (a timeout in the Step)"
                else:
                    how = "raised by the effect"
                await self._end(name, key, False, None,
                                f"CancelledError: {how}; {OUTCOME_UNKNOWN}")
            raise
        except BaseException as exc:  # SystemExit, KeyboardInterrupt: as effect_sync's
            await self._end(name, key, False, None, _raised(exc))
            _mark_effect(exc, name, key)
            raise
        await self._end(name, key, True, _plain(value), None)
        return value

    def running(self) -> str | None:
        state = self.slot.state
        if state.executing_kind is None or state.phase == "terminal":
            return None
        return running_code(state)

    def before_wait(self, kind: str) -> None:
        """A Step may wait (whether it awaits properly is the context's to check); an
        initialiser may not. At the call, so a sync initialiser hears this rather than
        "make it async" (the journal's "only a running Step may wait" came next)."""
        cursor = self.slot.state.cursor
        if self.slot.state.executing_kind == "init":
            raise IntloomError(
                "STEP_INTERACTION_INVALID",
                f"{code_at(cursor)} cannot wait for a {kind} answer: an initialiser only "
                "builds the Stage's State when the Stage is entered, and only a Step waits "
                "(with recover to continue the wait after a restart). Nothing was recorded "
                "and nobody was asked. Ask in a Step of the Stage.",
            )

    async def wait(self, kind: str, request: Any, state: Any) -> Any:
        slot = self.slot
        rt = self.driver.rt
        where = running_code(slot.state)
        # A second wait, or a wait while an effect runs, alongside it (asyncio.gather): the
        # journal records one at a time, and the first one's record is still being flushed
        # (slot.waiter is set only after it), so the state is what says so.
        asked = "a confirmation" if kind == "confirmation" else "questions"
        pending = slot.state.pending_action
        running = slot.state.effect_in_flight
        if self.driver.stopping and (pending is not None or not slot.owned):
            # The stop ended this Step's wait (its cancellation) and the Step asks again: a
            # retry loop that catches everything around ctx.confirm. Refused at once, that
            # loop spun on the host's event loop without ever yielding, so the stop never got
            # past its grace, no other Run or command was served, and the refusals it kept
            # (one per call) grew the host until the OOM killer ended it, its files left
            # stale. Nobody can answer a wait now; it waits for the stop, whose cut cancels
            # it again (the wait already recorded restores on the next start).
            await self.loop.create_future()
        if pending is not None or slot.waiter is not None:
            what = (f"its wait on {pending.kind} {pending.id} was still unanswered" if pending
                    else "its previous wait was still being answered")
            raise IntloomError("STEP_INTERACTION_INVALID",
                               f"{where} asked for {asked} while {what}: {_ONE_AT_A_TIME}")
        if running is not None:
            raise IntloomError(
                "STEP_INTERACTION_INVALID",
                f"{where} asked for {asked} while effect {running.name!r} (key "
                f"{running.key!r}) was still running: {_ONE_AT_A_TIME}")
        stage = slot.lw.workflow.stages[slot.state.cursor.stage]
        wire = (
            confirmation_request(request, where) if kind == "confirmation"
            else questions_request(request, where)
        )
        action = WaitingAction(
            id=clock.action_id(),
            kind=kind,  # type: ignore[arg-type]
            request=wire,
            cursor=slot.state.cursor,
            created_at=clock.now(),
        )
        rt.append(slot, Waiting(at=action.created_at, action=action,
                                state=_encode_state(state, where, stage.state_type)))
        try:
            await rt.sync(slot)
        except asyncio.CancelledError as exc:
            if slot.owned and not self.driver.cutting and not self.driver.stopping:
                # The Step cancelled its wait (asyncio.wait_for's timeout) while the waiting
                # record was being made durable: the journal waits for the answer all the
                # same, so the Step cannot go on to an outcome (as below, once shown).
                abandoned(exc, kind, action.id)
            raise
        if self.driver.stopping:
            # The wait is durable and restores on the next start; nobody can answer it now.
            slot.suspend()
            raise IntloomError("EXECUTION_OWNERSHIP_LOST", "The host is stopping.")
        # No await between the publish in sync() and this line: no answer can arrive first.
        slot.waiter = self.loop.create_future()
        try:
            return await slot.waiter
        except asyncio.CancelledError as exc:
            if slot.owned and not self.driver.cutting and not self.driver.stopping:
                # Not the host's doing (a cancel, a stop): the Step cancelled its own wait
                # (asyncio.wait_for around it), while the journal still waits for the answer.
                abandoned(exc, kind, action.id)
            raise
        finally:
            slot.waiter = None


def _close(value: Any) -> None:
    """Release a sync call's result that nobody will await: a coroutine is closed (left to
    the collector, it would warn "never awaited" on a stderr nobody reads)."""
    if inspect.iscoroutine(value):
        value.close()


def _let_go(handed: tuple[str, Any]) -> None:
    """Release what the thread driving a Run's sync Steps handed back (``_steps_here``) to
    a driver that no longer waits for it (cancelled in the hand-off): a Step's awaitable is
    closed and its ctx finished, as when the loop awaits it (``_run_step``)."""
    how, pending = handed
    if how == _AWAIT:
        _step, ctx, awaiting = pending
        finish(ctx)
        _close(awaiting)


def _handed_back(slot: RunSlot, journal: JournalPort, inbox: Inbox,
                 future: asyncio.Future[tuple[str, Any]], ok: bool, result: Any) -> None:
    """A crew's ``done`` for ``Driver._on_thread``: on the crew's thread, once it gives the
    Run back. Nothing here may raise."""
    if not ok:
        try:
            result = _contained(result)
        except Exception as failed:  # naming it failed: the future must still settle
            result = failed
    slot.thread_ctx = None  # not kept alive with the slot
    if not slot.owned:
        # A Step that returned after a cancel or a stop took its Run: its State, decoded
        # by the refused _record_outcome, is not kept with an ended Run's slot.
        slot.decoded = None
    slot.off_thread()
    journal.unshare()
    inbox.put(future, ok, result, _let_go)


def _let_go_of(future: asyncio.Future[Any],
               release: Callable[[Any], None] = _let_go) -> None:
    """``release`` the result of a worker's ``future`` the awaiting task was cancelled out
    of, if it holds one (an error holds nothing to release)."""
    if future.done() and not future.cancelled() and future.exception() is None:
        release(future.result())


class Driver:
    """Runs Runs: one asyncio task per live Run, user code in daemon threads or on the loop."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.stopping = False
        # True once a stop's grace is over and the Steps still running are being cancelled:
        # only those cancellations are the host's (an effect then stays in flight).
        self.cutting = False
        self.tasks: set[asyncio.Task[None]] = set()
        self.loop_thread = threading.current_thread()
        self.workers = Workers()
        # The loop Runs are driven on (set by launch): asyncio.get_running_loop() costs a
        # getpid() syscall per call, and the Step path would ask it for every Step.
        self.loop: asyncio.AbstractEventLoop | None = None
        self._inbox: Inbox | None = None
        # Drive the sync Steps of Runs on that loop, many Runs per worker thread (see Crews).
        self._crews: Crews | None = None
        # Drive the async Steps of Runs on that loop a round at a time (see Rounds).
        self._rounds: Rounds | None = None

    def launch(self, slot: RunSlot) -> None:
        self.loop_thread = threading.current_thread()
        loop = self.loop = asyncio.get_running_loop()
        if self._crews is None or self._crews.loop is not loop:
            self._crews = Crews(self.workers, loop, self.rt.sync_crew)
        if self._rounds is None or self._rounds.loop is not loop:
            self._rounds = Rounds(loop)
        # Its own context, kept: the rounds run its Steps in it (Rounds).
        slot.context = contextvars.copy_context()
        task = loop.create_task(self._drive(slot), name=f"{RUN_TASK_PREFIX}{slot.run_id}",
                                context=slot.context)
        slot.task = task
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def drain(self, grace: float) -> set[asyncio.Task[None]]:
        """Wait up to ``grace`` seconds for the Runs' tasks to end; the ones still running
        then, marked as cut (``cutting``), their Runs taken from them at once, not yet
        cancelled: the caller suspends those Runs (``RunSlot.suspend``, which names what was
        cut), then cancels what is left (``cut``)."""
        if not self.tasks:
            return set()
        _done, pending = await asyncio.wait(set(self.tasks), timeout=grace)
        self.cutting = True
        # Taken with no await in between: left owned until the caller reached them (its
        # loop yields every few thousand Runs), a Step went on past the grace, began effects
        # and wrote its outcome or its end during the stop.
        for slot in self.rt.runs.values():
            if slot.task in pending:
                # Under the Run's lock, as a cancel takes it: a worker driving the Run checks
                # ``owned`` and appends under it, and an append after the stop had named the
                # Run cut mid-Step was made durable by the close (the restart then routed the
                # outcome the stop's report had called interrupted).
                with slot.lock:
                    slot.owned = False
        return pending

    @staticmethod
    async def cut(pending: set[asyncio.Task[None]]) -> None:
        """Cancel the tasks a stop's grace left running, and give them 1 s to end. Their
        Runs were taken from them first: a Step that catches the cancellation and raises
        something else, or returns, had its failure or its outcome written as the Run's
        end, during the stop, where the next start was to report it RUN_INTERRUPTED."""
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=1.0)

    async def call_user(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call user code: async on the loop; sync on a daemon worker thread (never blocks the
        loop, and a hung Step cannot keep the host from exiting)."""
        if _is_async(fn):
            try:
                return await fn(*args)
            except (Exception, asyncio.CancelledError):
                raise
            except BaseException as exc:
                # An exit, an interrupt or a BaseException class of user code's own: past the
                # callers' handlers, it left the Run running for ever (a Stage's init, an
                # effect, recover) or dropped the request's connection (a Tool, on_complete).
                raise _contained(exc) from None
        return await self._call_sync(fn, *args)

    def _loop_inbox(self) -> Inbox:
        """Where worker threads hand results to the running loop (one Inbox per loop)."""
        loop = self.loop
        if loop is None or not loop.is_running():
            loop = asyncio.get_running_loop()
        inbox = self._inbox
        if inbox is None or inbox.loop is not loop:
            inbox = self._inbox = Inbox(loop)
        return inbox

    async def offload(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` (blocking host work) on one of the host's own worker threads: never
        the loop's default executor, which user code fills (``asyncio.to_thread`` in Steps)."""
        return await self._call_sync(fn, *args)

    async def _call_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn`` (not a coroutine function) on a worker thread; its result, awaited if it is
        awaitable."""
        future = self._start_sync(self._loop_inbox(), fn, *args)
        try:
            result = await future
        except asyncio.CancelledError:
            _let_go_of(future, _close)  # as in _on_thread
            raise
        if type(result) is not str and inspect.isawaitable(result):  # an outcome is a str
            result = await result
        return result

    def _start_sync(self, inbox: Inbox, fn: Callable[..., Any], *args: Any,
                    ) -> asyncio.Future[Any]:
        """``fn(*args)`` started on a worker thread: the future of what it returns or raises,
        settled through ``inbox`` (the running loop's), for ``_call_sync`` to await."""
        # What loop.create_future() returns, without its Python frame (asyncio's own loop).
        future: asyncio.Future[Any] = _Future(loop=inbox.loop)

        def body() -> None:
            if future.done():
                # The task awaiting it was cancelled (a cancel, a stop's cut) before a
                # worker took the call up: it never starts.
                return
            try:
                result = fn(*args)
            except BaseException as exc:  # delivered to the awaiting driver
                try:
                    contained = _contained(exc)
                except Exception as failed:
                    # Naming it failed: the future must still settle, or the Run waits on
                    # it for ever (this thread would end with nothing delivered).
                    contained = failed
                inbox.put(future, False, contained, None)
                return
            inbox.put(future, True, result, _close)

        self.workers.submit(body)
        return future

    # ------------------------------------------------------------------ the loop

    async def _drive(self, slot: RunSlot) -> None:
        rt = self.rt
        try:
            while slot.owned:
                phase = slot.state.phase
                if phase == "step_ready":  # the common phases first: this runs per Step
                    if self.stopping:
                        await rt.sync(slot)
                        return
                    rounds = self._rounds
                    if rounds is not None and slot.context is not None and self._in_rounds(slot):
                        await rounds.drive(self._run_step(slot), slot.context)
                    else:
                        await self._run_step(slot)
                elif phase == "step_result":
                    if self._route(slot, self._step(slot), clock.now()):
                        await rt.sync(slot)
                elif phase == "header":
                    # Restored from a journal that ends at its header (a torn creation batch):
                    # nothing ran yet; entering the entry Stage is the boundary it stopped at.
                    entry = slot.lw.workflow.entry.name
                    rt.append(slot, StagePending(at=clock.now(), stage=entry))
                elif phase == "stage_pending":
                    if not await self._enter_stage(slot):
                        return
                elif phase == "answered" or (phase == "executing" and slot.recovering):
                    if self.stopping:
                        return
                    slot.recovering = False
                    await self._run_recover(slot)
                else:
                    # waiting (exposed; answers drive it) or terminal: nothing to run.
                    return
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is None or not slot.owned or self.cutting:
                return  # the host's cancellation: a stop, or the Run cancelled
            if task.cancelling():
                if self.stopping:
                    return  # left to the restart table, as every Run a stop finds running
                # Asked for, but not by the host, which cancels a Run's task only once it has
                # let go of the Run (a cancel, a checkpoint lost) or cut its stop: by user code
                # (asyncio.current_task().cancel(), a watchdog's call_later). Ending quietly
                # left the Run "running" for ever -- or waiting, with nothing to take the
                # answer -- and one that had ended shown as running.
                while task.cancelling():
                    task.uncancel()
                await self._cancelled_by_user(slot)
                return
            # Raised by user code, not asked for by anyone: left to end the task quietly, the
            # Run would stay "running" with nothing driving it.
            await self._fail(slot, _user_failed(_where(slot.state.cursor), exc).view())
        except IntloomError as exc:
            if not slot.owned:
                return
            if exc.code in _QUIET and (self.cutting or self.stopping
                                       or slot.state.phase == "terminal"):
                return
            if exc.code in _QUIET or exc.code not in CATALOGUE:
                # The host raises these codes only once the Run is no longer its own (a
                # cancel, a stop, a failed checkpoint), and every code it raises is in the
                # catalogue: user code raised this one (intloom.IntloomError is public).
                # Returned quietly, it left the Run "running" for ever, and the Agent whose
                # completion led to it with no reply.
                exc = _user_failed(_where(slot.state.cursor), exc)
            await self._fail(slot, exc.recordable())
        except Exception as exc:  # a bug of ours must fail the Run, not leave it "running"
            stray = _effect_left_running(slot.state, exc) if slot.owned else None
            if stray is not None:
                await self._fail(slot, stray.view())
                slot.owned = False  # the stray effect's end goes unrecorded, as after a cancel
            elif slot.owned:
                self._log_fault(slot, exc)
                await self._fail(slot, error_view(
                    "CLI_INTERNAL_ERROR",
                    f"The host could not start a thread for the Run's code at "
                    f"{_where(slot.state.cursor)} ({exc}): a process or thread limit "
                    "(ulimit -u, a cgroup's pids.max) or memory is exhausted. That code did "
                    "not run; the Run was stopped. Raise the limit or run fewer Runs at once, "
                    "then start the Run again." if isinstance(exc, NoThread) else
                    f"The host failed while driving the Run ({type(exc).__name__}); the Run "
                    "was stopped. Inspect it with intloom inspect.",
                ))
        finally:
            slot.decoded = None

    def _log_fault(self, slot: RunSlot, exc: Exception) -> None:
        """The host log keeps what the Run's CLI_INTERNAL_ERROR may not say (docs/lifecycle.md:
        error details go to the log): the exception and the line that raised it. Without it
        nothing anywhere said what had failed, and the report asked for had nothing in it."""
        observer = self.rt.on_event
        if observer is None:
            return
        frames = traceback.extract_tb(exc.__traceback__)
        at = (f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno} in {frames[-1].name}"
              if frames else "")
        with contextlib.suppress(Exception):  # the Run is failed all the same
            observer("internal_error", slot.run_id, {
                "error": type(exc).__name__, "detail": clip(message_of(exc), 500), "at": at,
            }, slot.view().status)

    async def _cancelled_by_user(self, slot: RunSlot) -> None:
        """The Run's task was cancelled by its own code: a Run that ended is made durable and
        shown as it ended; any other fails, saying so."""
        # Let go of first, as a cancel does (Runtime.cancel): a crew's thread waiting on this
        # Run's round went on to its next Step, on a Run that had failed.
        slot.owned = False
        if slot.state.phase != "terminal":
            self.rt.append(slot, Terminal(at=clock.now(), status="failed", error=error_view(
                "STEP_EXECUTION_FAILED",
                f"{_where(slot.state.cursor)}: the task that runs the Run was cancelled by "
                "Workflow code (asyncio.current_task().cancel(), or a cancel() of that task "
                "left to run later), which the host does only to stop or cancel a Run; the "
                "Run was stopped here. To give up on something the Step awaits, put "
                "asyncio.timeout(...) around it; never cancel the current task.",
            )), force=True)
        # Made durable and shown in a task of its own: the same code may cancel this task
        # again (a watchdog that cancels until the task is done), which left the end unshown,
        # the Run "running" for ever.
        shown = asyncio.ensure_future(self._durable(slot))
        while not shown.done():
            try:
                await asyncio.shield(shown)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if self.cutting or task is None:
                    raise  # the host's own: its stop cuts what is left
                while task.cancelling():
                    task.uncancel()

    async def _durable(self, slot: RunSlot) -> None:
        with contextlib.suppress(IntloomError):  # a failed flush: the view says so
            await self.rt.sync(slot)

    async def _fail(self, slot: RunSlot, error: ErrorView) -> None:
        rt = self.rt
        if not slot.owned or slot.state.phase == "terminal":
            return
        rt.append(slot, Terminal(at=clock.now(), status="failed", error=error))
        with contextlib.suppress(IntloomError):
            await rt.sync(slot)

    def _ctx(self, slot: RunSlot, step: str | None, stage: Stage[Any] | None = None,
             hooks: ContextHooks | None = None,
             kind: type[StepContext[Any]] = StepContext) -> StepContext[Any]:
        st = slot.state
        if stage is None:
            stage = slot.lw.workflow.stages[st.cursor.stage]
        if hooks is None:
            # self._hooks(slot), without its frame when the Run's hooks are this loop's (the
            # case of every Step but a Run's first here): one fewer call per Step.
            mine, loop = slot.hooks, self.loop
            hooks = (mine if mine is not None and loop is not None and mine.loop is loop
                     else self._hooks(slot))
        value: Any = None
        if stage.state_type is not None and st.stage_state is not None:
            kept = slot.decoded
            if kept is not None and kept[0] is st.stage_state:
                value = kept[1]
                slot.decoded = None
            else:
                value = _state_codec(stage.state_type)[0](st.stage_state)
        # StepContext(...) without type.__call__, which hands __init__ its keywords as a new
        # dict (through tp_init); a method call passes them as they are (one per Step:
        # ~470 -> ~210 ns here). Positional, in __init__'s order (run_id, intent, stage,
        # step, state, state_type, hooks): CPython 3.11 specialises a call without keywords
        # only. With step.kind and ctx._calls read off the instance (callgrind, 64 async
        # Runs: 118.2-118.4k -> 117.1-117.3k instructions per Step).
        ctx: StepContext[Any] = _new_object(kind)
        ctx.__init__(  # type: ignore[misc]
            st.run_id, st.intent, stage.name, step, value, stage.state_type, hooks)
        return ctx

    def _hooks(self, slot: RunSlot) -> _Hooks:
        hooks = slot.hooks
        loop = self.loop
        if loop is None:
            loop = asyncio.get_running_loop()
        if hooks is None or hooks.loop is not loop:
            hooks = slot.hooks = _Hooks(self, slot, loop)
        return hooks

    async def _user(self, slot: RunSlot, where: str, fn: Callable[..., Any],
                    ctx: StepContext[Any], *args: Any) -> Any:
        """Call ``fn(ctx, *args)`` (an initialiser, an Agent Step's function, a ``recover``);
        what it raised, or left un-awaited on ``ctx``, fails the Run naming ``where``."""
        try:
            try:
                returned = await self.call_user(fn, ctx, *args)
            finally:
                finish(ctx)
        except (IntloomError, asyncio.CancelledError) as exc:
            if ctx._calls is not None:
                await _left_behind(ctx, where, exc)
            raise
        except Exception as exc:
            if ctx._calls is not None:
                await _left_behind(ctx, where, exc)
            raise _user_failed(where, exc) from None
        if ctx._calls is not None:
            await _left_behind(ctx, where, None)
        return returned

    async def _enter_stage(self, slot: RunSlot) -> bool:
        rt = self.rt
        stage = slot.lw.workflow.stages[slot.state.cursor.stage]
        value: Any = None
        if stage.init_fn is not None:
            if self.stopping:
                await rt.sync(slot)
                return False
            rt.append(slot, Executing(at=clock.now(), stage=stage.name, step=None, kind="init"))
            await rt.sync(slot)
            ctx = self._ctx(slot, None, kind=InitContext)
            value = await self._user(slot, f"Stage {stage.name!r} initialiser", stage.init_fn, ctx)
            if value is None and stage.state_type is not None and ctx._state is not None:
                # It assigned ctx.state (checked then) and returned nothing, as a Step does:
                # the State it made was dropped, and the Run failed "returned NoneType".
                value = ctx._state
            if stage.state_type is not None and not isinstance(value, stage.state_type):
                name = stage.state_type.__name__
                raise IntloomError(
                    "STAGE_STATE_INVALID",
                    f"Stage {stage.name!r} initialiser returned {type(value).__name__}, not "
                    f"{name}. Return the Stage's first State: `return {name}(...)`.",
                )
            if stage.state_type is None and value is not None:
                # As ctx.state assigned in such a Stage: no context decodes it, it would be
                # thrown away while the Stage's Steps see None.
                raise IntloomError(
                    "STAGE_STATE_INVALID",
                    f"Stage {stage.name!r} initialiser returned {type(value).__name__} "
                    f"{_shown(value, 80)}, but Stage {stage.name!r} has no State, so it "
                    f"would be lost. Declare one (`wf.stage({stage.name!r}, "
                    "state=YourStruct)`) to keep it for the Stage's Steps, or return None.",
                )
        elif stage.state_type is not None:
            value = stage.state_type()
        made_by = "initialiser" if stage.init_fn is not None else "default State"
        rt.append(
            slot,
            StepReady(at=clock.now(), stage=stage.name, step=stage.entry.name,
                      state=_encode_state(value, f"Stage {stage.name!r} {made_by}",
                                          stage.state_type, slot)),
        )
        return True

    @staticmethod
    def _in_rounds(slot: RunSlot) -> bool:
        """The Step at the cursor runs on the loop, by the rounds (Rounds): an async Step.
        Not an Agent Step (its task is the Agent's), nor a sync Step (a crew drives it)."""
        step, is_async = _at_cursor(slot)
        return is_async and step.kind != "agent"

    def _step(self, slot: RunSlot) -> Step[Any]:
        cursor = slot.state.cursor
        return slot.lw.workflow.stages[cursor.stage].steps[cursor.step or ""]

    async def _run_step(self, slot: RunSlot) -> None:
        """Run the Step at the cursor, and the Steps it routes to within its Stage, while
        nothing else is due (a stop, a lost Run, a new Stage, a wait or the end go back to
        _drive). This runs per Step: no _user or call_user frame, no turn of _drive."""
        rt = self.rt
        # The next Step, when the last one's route also appended its executing (_to_next).
        begun: Step[Any] | None = None
        while True:
            if begun is not None:  # an async Step (not an Agent's): its executing is appended
                step, begun = begun, None
                fn = step.fn
                is_async = True
            else:  # the first Step here, or one after a route that appended no executing
                step, is_async = _at_cursor(slot)
                fn = step.fn
                if is_async or step.kind == "agent":
                    rt.append_boundary(
                        slot, Executing(at=clock.now(), stage=step.stage.name, step=step.name),
                        fold_executing)
            awaiting: Any = None  # what the Step returned, when a thread ran it
            if not is_async and step.kind != "agent":  # driven by a crew (_steps_here)
                how, pending = await self._on_thread(slot)
                if how == _SYNC:
                    await rt.sync(slot)
                    return
                if how == _BACK:
                    return
                if how == _NEXT:
                    if self.stopping:  # as after a route below: _drive makes it durable
                        return
                    continue
                step, ctx, awaiting = pending  # _AWAIT: its outcome is awaited here
            else:  # an async Step, or an Agent Step's task: its executing is appended
                # rt.sync(slot), without its coroutine: one fewer per Step, and one level
                # fewer for every resumption of this task to pass through (callgrind, 64
                # async Runs: ~1.0-1.6k fewer instructions per Step).
                try:
                    # slot.mark() and rt.show_durable(slot, upto) below, without their frames
                    # when no worker drives the Run (always, for an async Step; callgrind,
                    # 64 async Runs: 115.3-116.2k -> 114.6-114.8k instructions per Step).
                    upto = ((slot.state, slot._events_published + len(slot._events))
                            if not slot.on_thread else slot.mark())
                    if slot._subscribers:  # slot.followed, without the property's frame
                        # Shown as soon as the flush ends, not at this task's turn after it,
                        # which comes once the Runs woken before it have each run a Step.
                        rt.journal.when_durable(partial(rt.show_early, slot, upto))
                    await rt.journal.sync(slot.run_id)
                    slot.publish(None, None, upto)
                    if slot.shown.phase == "terminal":
                        rt.retire(slot)
                except (CheckpointFailed, OSError) as exc:
                    rt.settle(slot, exc)
                # self._ctx(slot, step.name, stage), without its frame in its usual case: the
                # Run's hooks are this loop's, and the State is the one the last Step left,
                # kept decoded by _encode_state (once per Step; callgrind, 64 async Runs:
                # 107.9k -> 107.1-107.2k).
                st, stage = slot.state, step.stage
                hooks, kept = slot.hooks, slot.decoded
                if (hooks is not None and hooks.loop is self.loop and kept is not None
                        and kept[0] is st.stage_state and stage.state_type is not None):
                    slot.decoded = None
                    ctx = _new_object(StepContext)
                    ctx.__init__(  # type: ignore[misc]
                        st.run_id, st.intent, stage.name, step.name, kept[1], stage.state_type,
                        hooks)
                else:
                    ctx = self._ctx(slot, step.name, stage)
            if step.kind == "agent":
                request = await self._user(slot, step.where, step.fn, ctx)
                tools: dict[str, Tool] = getattr(step, "tools", {})
                call = PendingAgentCall(
                    id=clock.call_id(),
                    agent_id=getattr(step, "agent", "default"),
                    phase="available",
                    request=_plain(request, step),
                    tools=sorted(tools),
                    created_at=clock.now(),
                    tool_descriptions={name: tool.description
                                       for name, tool in sorted(tools.items())
                                       if tool.description},
                )
                rt.append(slot, Waiting(at=call.created_at, agent_call=call,
                                        state=_encode_state(ctx.state, step,
                                                            step.stage.state_type)))
                await rt.sync(slot)
                return
            try:  # errors converted as _user converts them
                try:
                    outcome = await (fn(ctx) if awaiting is None else awaiting)
                finally:
                    # finish(ctx), without its frame (once per Step; with _kept's in publish,
                    # callgrind, 64 async Runs, four pairs: 108.2-109.3k -> 107.3-108.4k).
                    if ctx._state_type is None:
                        ctx._stateless = True
                    ctx._state_type = OVER
            except (IntloomError, asyncio.CancelledError) as exc:
                if ctx._calls is not None:
                    await _left_behind(ctx, step, exc)
                raise
            except Exception as exc:
                if ctx._calls is not None:
                    await _left_behind(ctx, step, exc)
                raise _user_failed(step.where, exc) from None
            except BaseException as exc:
                # An exit, an interrupt, a group holding one (an async Step's TaskGroup) or any
                # other BaseException of user code (a class of its own): each escaped to
                # _drive and left the Run running for ever.
                if ctx._calls is not None:
                    await _left_behind(ctx, step, exc)
                raise _user_failed(step.where, _contained(exc)) from None
            if ctx._calls is not None:  # it called confirm, ask or aeffect: all awaited?
                await _left_behind(ctx, step, None)
            target = step.routes.get(outcome) if type(outcome) is str else None
            if type(target) is str:
                begun = self._to_next(slot, step, outcome, ctx, target, True)
                if self.stopping or not slot.owned:
                    return
                continue
            at = self._record_outcome(slot, step, outcome, ctx)
            # Routing is its own boundary (its own record), but nothing happens between the
            # two: route here rather than through another turn of _drive.
            if self._route(slot, step, at):
                await rt.sync(slot)
                return
            if self.stopping or not slot.owned or slot.state.phase != "step_ready":
                return

    async def _on_thread(self, slot: RunSlot) -> tuple[str, Any]:
        """Drive the Run's sync Steps in a crew, on a worker thread (``_steps_here``), until
        it gives the Run back; a failed checkpoint it met is settled here, on the loop."""
        inbox = self._loop_inbox()
        future: asyncio.Future[tuple[str, Any]] = inbox.loop.create_future()
        journal = self.rt.journal
        # Raised here, on the loop, before the thread exists: the loop never takes either
        # unlocked path while the thread may touch the Run or the store.
        slot.on_thread = True
        journal.share()
        try:
            crews = self._crews
            assert crews is not None, "a Run is driven only after launch()"
            # The future goes to the thread in a partial, not a closure: a closure's cell
            # would tie it to this frame for good (see the finally below).
            crews.join(self._steps_here(slot),
                       partial(_handed_back, slot, journal, inbox, future))
        except BaseException:  # no thread will lower them
            journal.unshare()
            slot.off_thread()
            raise
        try:
            return await future
        except asyncio.CancelledError:
            # Cancelled in the hand-off (the thread's result had reached the future, the
            # task had not resumed): nobody else will release it. Cancelled before, the
            # future was cancelled with the task and the Inbox releases what comes.
            _let_go_of(future)
            # A cancel or a stop's cut: the Step the thread may still be running is no
            # longer waited for, so its ctx refuses from now on, as on the loop path.
            ctx = slot.thread_ctx
            if ctx is not None:
                finish(ctx)
            raise
        except (CheckpointFailed, OSError) as exc:
            self.rt.settle(slot, exc)  # raises: the thread only reports its own Run's failure
            raise IntloomError("RUN_CHECKPOINT_FAILED") from None
        finally:
            # What the thread raised is in the future, and its traceback holds this frame:
            # a cycle through this local kept the Step's frames (its locals, a State of
            # megabytes) alive until a full collection, which an idle host may not run for
            # hours (~49 MB held per failed Run of a Step that had built a 50 MB string).
            del future

    def _steps_here(self, slot: RunSlot) -> Generator[RunSlot, None, tuple[str, Any]]:
        """The Step loop of ``_run_step``, advanced by a crew's worker thread (``Crews``),
        for consecutive sync Steps.

        Each Step still costs an ``executing`` record made durable before the Step is called
        and a ``step_result`` after it, exactly as on the loop: at each ``executing`` this
        yields its Run, and the crew makes the round's records durable with one flush and
        shows them (``Runtime.sync_crew``) before it advances the Run again. What this saves
        is the thread hand-offs and the loop's bookkeeping per Step of calling a sync Step
        from the loop. It gives the Run back to the loop at any boundary that needs the
        loop: a Step that is not sync, a new Stage, the end, a stop or a lost Run.
        """
        rt = self.rt
        # The next Step, when the last one's route also appended its executing (_to_next):
        # a stop asked for since is seen at the next Step (the executing is there to keep).
        begun: Step[Any] | None = None
        while True:
            if begun is not None:  # a sync Step (not an Agent's): its executing is appended
                step, begun = begun, None
                fn = step.fn
            else:
                if self.stopping:  # before each Step, and while the loop handed the Run over
                    return _BACK, None
                step, is_async = _at_cursor(slot)
                fn = step.fn
                if is_async or step.kind == "agent":
                    return _NEXT, None
                rt.append_boundary(
                    slot, Executing(at=clock.now(), stage=step.stage.name, step=step.name),
                    fold_executing)
            yield slot  # the crew makes it durable and shows it (Runtime.sync_crew)
            # Shown to the loop before ownership and the cut are checked: a cancel or a cut
            # after the check finds this ctx to finish (_on_thread); one before it, the
            # Step never called. A cut leaves the Run owned until the stop takes it
            # (slot.suspend), hence ``cutting``: one attribute read per Step.
            ctx = slot.thread_ctx = self._ctx(slot, step.name, step.stage)
            if not slot.owned or self.cutting:
                # Cancelled, or cut by a stop, while its executing was being written: on the
                # loop, either would have ended the task in its await, before the Step was
                # called.
                return _BACK, None
            slot.steps_on_thread += 1
            try:
                outcome = fn(ctx)
            except (IntloomError, asyncio.CancelledError):
                finish(ctx)
                raise
            except BaseException as exc:  # converted as _run_step converts them
                finish(ctx)
                raise _user_failed(step.where, _contained(exc)) from None
            if type(outcome) is not str and inspect.isawaitable(outcome):
                return _AWAIT, (step, ctx, outcome)  # finished once the loop has awaited it
            # finish(ctx), and the route to the next Step of the Stage, as _run_step does
            # them, without their frames (see there).
            if ctx._state_type is None:
                ctx._stateless = True
            ctx._state_type = OVER
            target = step.routes.get(outcome) if type(outcome) is str else None
            if type(target) is str:
                begun = self._to_next(slot, step, outcome, ctx, target, False)
                if not slot.owned:
                    return _BACK, None
                continue
            if self._route(slot, step, self._record_outcome(slot, step, outcome, ctx)):
                return _SYNC, None
            if not slot.owned or slot.state.phase != "step_ready":
                return _BACK, None  # (a stop is seen at the top of the next turn)

    def _to_next(self, slot: RunSlot, step: Step[Any], outcome: str, ctx: StepContext[Any],
                 target: str, on_loop: bool) -> Step[Any] | None:
        """The common case, an outcome routed to the next Step of the Stage:
        _record_outcome and _route as they do it, without their frames and their tests for
        the other cases (a route's name is never empty). Routing is its own boundary.

        Unless the host is stopping, the next Step's executing is appended with them when
        that Step runs where this one did (``on_loop``: an async Step, else a sync one; not
        an Agent Step): that Step is returned, to be called next. None: it was not."""
        at = clock.now()
        stage = step.stage
        saved = _encode_state(ctx._state, step, stage.state_type, slot)
        nxt = stage.steps[target]
        following: Step[Any] | None = None
        if not self.stopping and nxt.kind != "agent":
            try:  # _is_async(fn), without its frame
                here = _ASYNC[nxt.fn] is on_loop
            except (KeyError, TypeError):
                here = _is_async(nxt.fn) is on_loop
            if here:
                following = nxt
        self.rt.append_routed(
            slot, StepResult(at=at, stage=stage.name, step=step.name, outcome=outcome,
                             state=saved),
            StepReady(at=at, stage=stage.name, step=target, state=saved),
            None if following is None else Executing(at=at, stage=stage.name, step=target))
        slot.outcome_from = None
        return following

    def _record_outcome(self, slot: RunSlot, step: Step[Any], outcome: Any,
                        ctx: StepContext[Any], where: str | None = None) -> str:
        """Append the Step's ``step_result``; returns its time stamp. ``where``: what
        returned it, when not the Step itself (its ``recover``)."""
        if not isinstance(outcome, str) or not outcome:
            raise _not_an_outcome(where or step.where, outcome, step)
        if type(outcome) is not str:
            # A str subclass (numpy.str_, a library's text type) is its text: the journal
            # holds plain strings, and refused it as a value it cannot encode.
            outcome = str.__str__(outcome)
        if outcome not in step.routes and len(outcome) > MAX_OUTCOME:
            # No route is that long: not worth a record.
            raise IntloomError(
                "STEP_OUTCOME_NOT_HANDLED",
                f"{where or step.where} returned an outcome of {len(outcome):,} characters "
                f"({_shown(outcome, 80)}), over the {MAX_OUTCOME:,}-character limit; it was not "
                f"recorded. Return one of its routes: {sorted(step.routes)}.",
            )
        at = clock.now()
        # ctx._state, not the ctx.state property: one call fewer per Step.
        self.rt.append_boundary(
            slot,
            StepResult(at=at, stage=step.stage.name, step=step.name, outcome=outcome,
                       state=_encode_state(ctx._state, where or step, step.stage.state_type,
                                           slot)),
            fold_step_result,
        )
        return at

    async def absorb(self, slot: RunSlot, step: AgentStep[Any], result: AgentResult
                     ) -> bytes | None:
        """The Stage State after the Agent Step's ``on_complete`` saw the Agent's result
        (the State unchanged without one). Nothing is written: the handler runs before the
        completion's records, so a refusal leaves the task as it was."""
        if step.complete_fn is None:
            return slot.state.stage_state
        ctx = self._ctx(slot, step.name, step.stage, _Refused(self.loop_thread, step.where))
        where = f"{step.where} on_complete"
        try:
            returned = await self.call_user(step.complete_fn, ctx, result)
        except asyncio.CancelledError as exc:
            if ctx._calls is not None:
                _refused_effects(ctx, where, exc)
            # The handler runs in a task of its own (Runtime._unless_cut), which only the
            # host cancels besides the handler itself: "cancelling()" was true for the
            # handler's own cancel too (asyncio.current_task().cancel(), a watchdog's
            # call_later), passed on, and the request ended with no reply.
            task = asyncio.current_task()
            if task is None or task in self.rt.host_cancelled:
                raise  # the host's (a stop past its grace, the request's connection gone)
            # The handler's own: passed on, it ended the request with no reply, as if the
            # host had crashed. Refused as anything else it raises.
            raise IntloomError(
                "INVALID_REQUEST",
                f"{where} refused the Agent's result (outcome {result.outcome!r}): "
                f"{clip(_raised(exc))}. {_STILL_CLAIMED}",
            ) from None
        except IntloomError as exc:
            # A misused ctx (a State of the wrong type, an effect): the Agent must learn, as
            # for any refusal, that nothing was recorded and what it can do.
            if ctx._calls is not None:
                _refused_effects(ctx, where, exc)
            raise still_claimed(exc, where) from None
        except Exception as exc:
            if ctx._calls is not None:
                _refused_effects(ctx, where, exc)
            # What on_complete raises refuses the result; it does not fail the Run.
            # Where in the source, as a Step's and a Tool's failure say (it was the one not to).
            raised = _placed(exc).replace(_INSTEAD, "raise an exception instead to refuse the "
                                          "result)")
            raise IntloomError(
                "INVALID_REQUEST",
                f"{where} refused the Agent's result (outcome {result.outcome!r}): "
                f"{clip(raised)}. {_STILL_CLAIMED}",
            ) from None
        if ctx._calls is not None:
            _refused_effects(ctx, where, None)
        if returned is not None:
            raise IntloomError(
                "STEP_RESULT_INVALID",
                f"{where} returned {_shown(returned, 200)}; it must return None and "
                f"assign ctx.state instead. {_STILL_CLAIMED}",
            )
        try:
            return _encode_state(ctx.state, where, step.stage.state_type)
        except IntloomError as exc:
            raise still_claimed(exc, where) from None

    async def _run_recover(self, slot: RunSlot) -> None:
        rt = self.rt
        step = self._step(slot)
        recovery = rt.recovery_for(slot)
        rt.append(
            slot, Executing(at=clock.now(), stage=step.stage.name, step=step.name, kind="recover")
        )
        await rt.sync(slot)
        ctx = self._ctx(slot, step.name)
        ctx._part = " recover"  # what it does wrong is named as recover's, not the Step's
        await self._keys_before_the_wait(slot, ctx)
        assert step.recover_fn is not None
        where = f"{step.where} recover"
        outcome = await self._user(slot, where, step.recover_fn, ctx, recovery)
        self._record_outcome(slot, step, outcome, ctx, where)
        slot.outcome_from = where

    async def _keys_before_the_wait(self, slot: RunSlot, ctx: StepContext[Any]) -> None:
        """Give ``recover``'s context the effect keys the Step took before its wait, from the
        journal: recover continues that Step, whose code after the wait it stands in for.
        Started afresh, a recover that called the Step's effect under its key again (an
        order's id) ran it a second time, where the Step's own code was refused, and default
        keys (``name#n``) counted from 1 again, two effects under one key in the journal."""
        try:
            records = await self.offload(self.rt.journal.history, slot.run_id,
                                         slot.state.seq)
        except (IntloomError, OSError):
            return  # as before: recover runs; the journal's reader reports what is wrong
        done: dict[str, tuple[str, bool]] = {}
        for record in records:
            if type(record) is StepReady:
                # A Step's run begins here (its executing comes again after each answer it
                # got in the same host, so that marks no new run): the last is the one that
                # waited.
                done = {}
            elif type(record) is EffectDone:
                done[record.key] = (record.name, not record.ok)
        if not done:
            return
        counts: dict[str, int] = {}
        used: dict[str, tuple[str, bool, bool]] = {}
        for key, (name, failed) in done.items():
            number = key.removeprefix(f"{name}#")
            defaulted = number != key and number.isdigit()
            if defaulted:
                counts[name] = max(counts.get(name, 0), int(number))
            used[key] = (name, failed, defaulted)
        ctx._effect_counts, ctx._used_keys = counts, used

    def _route(self, slot: RunSlot, step: Step[Any], at: str) -> bool:
        """Append where the Step's outcome leads (stamped ``at``); True when that record
        ends the Run and must be durable now (a new Stage or Step is made durable with its
        own ``executing``: nothing is observable in between)."""
        rt = self.rt
        st = slot.state
        outcome = st.outcome or ""
        target = step.routes.get(outcome)
        by, slot.outcome_from = slot.outcome_from, None
        if type(target) is str:  # the next Step of the Stage (the common case first)
            # Tested before the isinstance tests below, each a lookup and a call of the
            # class's __instancecheck__ (with _is_async's frame in _run_step, callgrind, 64
            # async Runs: ~1.0k fewer instructions per Step).
            # DESIGN §5: routing to the next Step of the Stage is its own boundary.
            rt.append_boundary(slot, StepReady(at=at, stage=st.cursor.stage, step=target,
                                               state=st.stage_state), fold_step_ready)
            return False
        if target is None:
            # The name of where an outcome leads, returned for the outcome: "add a route
            # for it" sent the author to add a second route where the first was right.
            leads = sorted(name for name, to in step.routes.items()
                           if to == outcome or getattr(to, "stage", None) == outcome)
            fix = (f"{outcome!r} is where outcome {leads[0]!r} leads: return {leads[0]!r}"
                   if leads else
                   f"Add a route for it{', or return one of them' if by else ''}")
            rt.append(
                slot,
                Terminal(
                    at=at,
                    status="failed",
                    error=error_view(
                        "STEP_OUTCOME_NOT_HANDLED",
                        f"{by or step.where} returned outcome {outcome!r}, which the Step's "
                        f"routes do not handle ({sorted(step.routes)}). {fix}.",
                    ),
                ),
            )
            return True
        if isinstance(target, Complete):
            rt.append(slot, Terminal(at=at, status="completed"))
            return True
        if isinstance(target, ToStage):
            rt.append(slot, StagePending(at=at, stage=target.stage))
        else:  # a subclass of str
            rt.append_boundary(slot, StepReady(at=at, stage=st.cursor.stage, step=target,
                                               state=st.stage_state), fold_step_ready)
        return False
