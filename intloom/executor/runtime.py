"""The Runtime: owns every Run of a host, drives user code, and writes the journal.

This is the I/O edge around the pure machine (``intloom.runtime.machine``): it calls user
code (sync Steps in daemon threads, async Steps on the loop), appends records through a
``JournalPort`` and makes them durable before anything observable happens:

* ``executing`` is durable before user code starts (one flush per Step: the previous
  Step's ``step_result`` and routing records go down in the same batch);
* ``effect_started`` is durable before an effect is called;
* ``waiting`` is durable before a wait is exposed, ``answered`` before an answer is delivered,
  and ``terminal`` before a Run is reported ended.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import hashlib
import hmac
import secrets
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Literal, NamedTuple

import msgspec

from intloom.authoring.agent import AgentResult
from intloom.authoring.compat import (
    cursor_problem,
    failed_sources_note,
    not_defined_note,
    schema_problem,
    state_problem,
    what_changed,
)
from intloom.authoring.context import Recovery
from intloom.authoring.interaction import Confirmation, QuestionAnswer, validate_answer
from intloom.authoring.loader import LoadedWorkflow
from intloom.authoring.workflow import AgentStep
from intloom.errors import BLANK_INTENT, MAX_MESSAGE, ErrorView, IntloomError, clip, error_view
from intloom.executor import clock
from intloom.executor.driver import (
    AgentClaim,
    Driver,
    RunObserver,
    RunSlot,
    check_effect_ids,
    running_code,
    still_claimed,
    user_raised,
    without_claim_advice,
)
from intloom.executor.history import kept, plain_view
from intloom.executor.updates import RunUpdate
from intloom.protocol.messages import MAX_PAGE, RestoreSummary
from intloom.runtime.limits import (
    MAX_AGENT_ID,
    MAX_INTENT_BYTES,
    MAX_LOGGED_MESSAGE,
    MAX_RECORD_BYTES,
    MAX_REQUEST_BYTES,
    intent_too_large,
)
from intloom.runtime.machine import (
    NOT_RESTORED,
    IllegalTransition,
    RunState,
    Verdict,
    apply,
    fold_routed,
    interrupted_message,
    restart_verdict,
    to_view,
    unreadable,
)
from intloom.runtime.model import PendingAgentCall, RunView, shown_action
from intloom.runtime.plainjson import json_problem, wire_problem
from intloom.runtime.ports import CheckpointFailed, JournalPort, RecordTooLarge
from intloom.runtime.records import (
    UNENCODABLE,
    Answered,
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

__all__ = [
    "HeldRun",
    "RestoredRun",
    "RunUpdate",
    "Runtime",
    "incompatibility",
    "strict_refusal",
]

_MAX_RECEIPTS = 256
# What one task's receipts may hold (their ids, inputs as canonical JSON, outputs as sent),
# counted before a new call runs: a call that crosses it still keeps its receipt, so a task
# holds at most this plus one request and one reply frame until it ends. The id counts: it is
# the receipt's key, as large as a frame allows, and uncounted 256 of them held ~1 GiB.
_MAX_RECEIPT_BYTES = 32 << 20
# Tool inputs are compared as values: the same JSON object with its keys in another order is
# the same input (an Agent may re-serialise its arguments on a retry).
_CANONICAL: Final = msgspec.msgpack.Encoder(order="deterministic")
_encoder: Final = msgspec.msgpack.Encoder()  # a view's size on the wire, for list pages
MAX_FINISHED: Final = 1000
ENDED_HISTORY: Final = 200  # history entries an ended Run keeps (attach shows them)
# How much of another message (an Agent's failure, a Run's error) an Agent's refusal quotes:
# such a message may run to thousands of characters (an Agent's log, an effect's key), and
# the refusal's own fact and fix must stay in view.
_QUOTED: Final = 200
# A Run's RUN_INTERRUPTED reason, quoted whole in the usual case (the Step, the effect, its
# key and start: ~200-400 characters, and cut at 200 it lost what was in flight), bounded
# when an effect's key or a Step's name runs long.
_QUOTED_REASON: Final = 600
# Records that carry what user code handed over (an exception's text, an effect's name and
# key, a request for a person or an Agent): ``Runtime.append`` bounds them (``_bounded``).
_BOUNDED: Final = frozenset({Terminal, EffectStarted, EffectDone, Waiting})
# What the journal refuses of a record (too large, or not encodable): RUN_STATE_INVALID.
_UNJOURNALED: Final = (RecordTooLarge, *UNENCODABLE)
# Runs a stop's suspension (``suspend``, ``outlook``) passes over between two yields to the
# event loop: passing over 95,000 Runs in one go (14 s) left the host's bound on it
# (``Host._release``) to a timeout that could not fire, and Status unanswered meanwhile.
_SUSPEND_BATCH: Final = 2000


def _one_number_type(value: Any) -> Any:
    """``value`` with each integral float (exact in a double) as the int it equals: JSON has
    one type of number, and an Agent that re-serialises ``1.0`` as ``1`` (JavaScript does)
    resends the same input, which was refused as "other input". Plain JSON, bounded in depth
    (``_plain_json``)."""
    # Without recursion: an output nested 1,000 levels (what _plain_json allows) ran out of
    # Python's stack here, after the checks that refuse with nothing recorded.
    holder: list[Any] = [value]
    todo: list[tuple[Any, Any]] = [(holder, 0)]  # (the copy to write into, the key)
    while todo:
        into, key = todo.pop()
        item = into[key]
        kind = type(item)
        if kind is float:
            if item.is_integer() and abs(item) <= _EXACT:
                into[key] = int(item)
        elif kind is dict:
            into[key] = mapping = dict(item)
            todo.extend((mapping, name) for name in mapping)
        elif kind is list:
            into[key] = items = list(item)
            todo.extend((items, i) for i in range(len(items)))
    return holder[0]


_EXACT: Final = 2.0 ** 53


class RestoredRun(msgspec.Struct, frozen=True):
    """One Run as the store read it back: its folded state, or why it cannot be restored."""

    run_id: str
    state: RunState | None
    problem: str | None = None  # corrupt / incompatible: reported, never loaded
    # The store's verdict on the journal itself (an "incompatible" one: a newer format).
    status: Literal["ok", "corrupt", "incompatible"] = "ok"
    # Held only for a lost segment (the store's ``RunJournal.lost``): that segment, and the
    # Run's snap/live/ snapshot, whose removal accepts the loss (docs/recovery.md).
    lost: str | None = None
    snapshot: str | None = None
    # The newest intloom that wrote a segment holding its records (``RunJournal.written_by``).
    written_by: str = ""


def _mismatch(state: RunState, workflows: Mapping[str, LoadedWorkflow],
              withheld: Mapping[str, str], failed: Sequence[str] = (), *,
              advice: bool = True) -> str | None:
    """Why the loaded Workflows cannot continue this (readable) journal, or None; without
    what to do about it when ``advice`` is False (see ``incompatibility``)."""
    lw = workflows.get(state.workflow)
    if lw is None:
        # A Workflow two sources define is loaded from neither (LoadResult.withheld): say
        # so, rather than only that it is not loaded.
        why = withheld.get(state.workflow)
        if why is not None:
            keep = "; keep only the source the Run started with in intloom.toml"
            return f"incompatible workflow: {why}{keep if advice else ''}"
        return (f"incompatible workflow: Workflow {state.workflow!r} is not loaded"
                f"{failed_sources_note(failed, advice=advice) or not_defined_note(workflows)}")
    if lw.identity != state.identity:
        return (
            f"incompatible identity: Workflow {state.workflow!r} changed since the Run "
            f"started (journal {state.identity[:12]}, loaded {lw.identity[:12]}"
            f"{what_changed(lw, state)})"
        )
    changed = schema_problem(lw, state)
    if changed is not None:
        return f"incompatible schema: {changed}"
    moved = cursor_problem(lw, state)
    if moved is not None:
        return f"incompatible definition: {moved}"
    saved = state_problem(lw, state)
    if saved is not None:
        return f"incompatible schema: {saved}"
    return None


def incompatibility(
    state: RunState | None, workflows: Mapping[str, LoadedWorkflow], package_version: str,
    withheld: Mapping[str, str] | None = None, failed: Sequence[str] = (), *,
    advice: bool = True, written_by: str = "",
) -> str | None:
    """Why this Run's journal cannot be restored by what is loaded now, or None.
    ``withheld``: why a Workflow some source defines is not loaded (LoadResult.withheld);
    ``failed``: the sources of intloom.toml that failed to load (LoadResult.failed);
    ``advice`` False: the facts without what to do, as a Run cancelled while held records
    them (the fix to continue it no longer applies once it has ended)."""
    if state is None:
        return None
    return unreadable(state, package_version, written_by) or _mismatch(
        state, workflows, withheld or {}, failed, advice=advice)


class _Halt(NamedTuple):
    """How the host's end of work is worded to an Agent it cut off: a stop, or a suspension
    the host outlives (its log failed), which must not be called a stop."""

    lead: str  # "The host stopped"
    grace: str  # "the stop's grace"
    stops: str  # "while the host stops"
    why: str  # "" or " " + the reason the Runs were suspended


def _agent_tasks(runs: list[RestoredRun]) -> dict[str, str]:
    """Per restored Run waiting on an Agent task, that task's id: the log's Tool calls of it
    are the ones its interruption names (``tool_calls_cut``)."""
    return {item.run_id: item.state.pending_agent_call.id for item in runs
            if item.state is not None and item.state.pending_agent_call is not None}


def _halt(reason: str | None) -> _Halt:
    if reason is None:
        return _Halt("The host stopped", "the stop's grace", "while the host stops", "")
    return _Halt("The host suspended its Runs", "the grace", "once the host has suspended "
                 "its Runs", f" {reason}")


class _ToolRaised(Exception):
    """An IntloomError a Tool raised itself (``intloom.IntloomError`` is public): the Tool's
    failure, TOOL_EXECUTION_FAILED. Passed on as itself, its code reached the Agent as the
    host's -- a retryable BUSY, say, whose retry ran the Tool again."""

    def __init__(self, error: IntloomError) -> None:
        super().__init__(error.code)
        self.error = error


async def _tool_output(call: Awaitable[Any]) -> Any:
    """What a Tool returned; an IntloomError it raised, as ``_ToolRaised``. A Tool has no
    ctx, so nothing of the host's raises into it."""
    try:
        return await call
    except IntloomError as exc:
        raise _ToolRaised(exc) from None


# A Tool whose output is refused ran to its end: "nothing was kept, so the call may be made
# again" invited a retry that ran it again (a second charge) and was refused the same way.
_RAN_UNKEPT: Final = ("The Tool ran to its end (it may have acted), but no receipt was kept: "
                      "the same call sent again runs it again, and is refused the same way "
                      "until the Tool is fixed (then intloom stop and intloom start).")


def _stopped_in_on_complete(run_id: str, call_id: str, outcome: str, refused: str = "",
                            reason: str | None = None) -> IntloomError:
    """What an Agent is told when its completion's on_complete ran while the host stopped
    (``refused``: what on_complete said of the result, when it refused it; ``reason``: why
    the Runs were suspended, when the host stays up)."""
    halt = _halt(reason)
    return IntloomError(
        "CLI_SERVICE_CLOSING",
        f"{halt.lead} while Agent task {call_id}'s on_complete ran (outcome {outcome!r}): "
        f"{refused}the completion was not recorded, since "
        f"nothing is written {halt.stops}. The next start reports Run {run_id} "
        f"RUN_INTERRUPTED (claims are not restored); once it has started, start a new Run "
        f"for this work.{halt.why}",
    )


def _ended_meanwhile(slot: RunSlot, call_id: str) -> None:
    """CONFLICT, as without a stop, when the Run ended (was cancelled) while Agent task
    ``call_id``'s on_complete ran: the next start does not load it, so it is not told (nor
    does the stop report) that the Run comes back RUN_INTERRUPTED."""
    if slot.state.phase == "terminal":
        raise IntloomError("CONFLICT", _not_current_task(slot, slot.view(), call_id))


class HeldRun:
    """A Run the restore did not load (DESIGN §6: reported, its journal kept as it is).

    The host still knows it, so a request about it says why it is held and what to do
    instead of "not known". ``dismissible``: its journal reads back whole, in a format and
    protocol this intloom writes, and only the loaded Workflow (its source, a State schema)
    keeps it from continuing -- ``cancel`` may then end it by appending a terminal record.
    A damaged or foreign journal is never written to.
    """

    def __init__(self, run_id: str, state: RunState | None, problem: str, code: str,
                 *, dismissible: bool, lost: str | None = None,
                 snapshot: str | None = None, fact: str | None = None) -> None:
        self.run_id = run_id
        # ``problem`` without its advice to continue the Run: what a cancel records, since
        # the Run has then ended and "fix the source and restart" no longer applies to it.
        self.fact = fact if fact is not None else problem
        self.lost = lost  # see RestoredRun
        self.snapshot = snapshot
        self.state = state
        self.problem = problem
        self.code = code
        self.dismissible = dismissible
        # What the last host's log says of a Tool call (or an Agent's completion) its Agent
        # task left unfinished: logged with run_needs_attention, so that the host that
        # restores it later still names it, and recorded by a cancel.
        self.tool_call: str | None = None
        self.ended: RunView | None = None  # cancelled by this host: its terminal view
        self.lock = asyncio.Lock()  # one cancel appends; a concurrent one waits for it

    def error(self) -> IntloomError:
        rid = self.run_id
        if self.ended is not None:
            return IntloomError(
                "CONFLICT",
                f"Run {rid} was cancelled while it was held, so it has ended and takes no "
                f"answer or Agent call. intloom inspect {rid} shows its journal.",
            )
        if self.dismissible:
            fix = (
                "Put back the exact Workflow source the Run started with (as intloom.toml "
                "lists it, and any module outside it that its definition comes from) and "
                "restart the host (intloom stop, then intloom start) to continue it, or end "
                f"it for good with intloom cancel {rid}."
            )
        elif self.code == "JOURNAL_CORRUPT":
            fix = (
                "Its journal is kept untouched: the Run cannot be answered, and cannot be "
                "cancelled, since nothing is appended to a damaged journal; it stays held at "
                f"every start. intloom inspect {rid} shows what was found and which file holds "
                "it: check the effects it names by hand, and if you have a copy of that file "
                "from before the damage (a backup), put it back and restart the host."
            )
            if self.lost is not None and self.snapshot is not None:
                # The way out docs/recovery.md gives when there is no copy: without it, a
                # user with no backup was left with a Run held for good.
                fix += (
                    f" Without a copy of {self.lost}, you may accept the loss: stop the host, "
                    f"move {self.snapshot} out of the runtime directory and start it again; "
                    "the Run is then restored from its last readable record, so a Step whose "
                    "records were lost may run again (check the effects intloom inspect "
                    f"{rid} names first)."
                )
        else:
            fix = (
                "Its journal is kept untouched: this intloom does not append to a journal "
                "another version wrote, so the Run cannot be answered or cancelled here. Run "
                f"the intloom version that wrote it to continue or end it; intloom inspect {rid} "
                "shows what was found."
            )
        return IntloomError(
            self.code, f"Run {rid} is held, not restored (it needs attention): "
            f"{self.problem}. {fix}",
        )


def held_reason(problem: str, most: int = 200) -> str:
    """The first clause of why a Run is held (up to its first " (" or "; "), for a line
    per Run in ``start`` and ``status``; ``doctor`` says the rest."""
    cuts = [i for i in (problem.find(" ("), problem.find("; ")) if i > 0]
    short = problem[:min(cuts)] if cuts else problem
    return short if len(short) <= most else short[:most - 1] + "…"


def strict_refusal(attention: list[tuple[str, str]]) -> IntloomError:
    """``start --strict``'s error for Runs that cannot be restored: (run id, why) each."""
    run_id, why = attention[0]
    return IntloomError(
        "JOURNAL_INCOMPATIBLE",
        f"--strict: {len(attention)} Run(s) cannot be restored; first: Run {run_id}: {why}. "
        "Run intloom doctor; files were kept as they are.",
    )


def _check_request(code: str, what: str, request: Any, fix: str) -> None:
    """STEP_INTERACTION_INVALID when ``request`` is over MAX_REQUEST_BYTES as JSON."""
    try:
        size = len(msgspec.json.encode(request))
    except UNENCODABLE:
        return  # not JSON: the journal's own check names it (RUN_STATE_INVALID)
    if size > MAX_REQUEST_BYTES:
        raise IntloomError(
            "STEP_INTERACTION_INVALID",
            f"{code}: {what} is {size:,} bytes as JSON, over the "
            f"{MAX_REQUEST_BYTES:,}-byte limit; nothing was recorded and the Run does not "
            f"wait. {fix}",
        )


def _plain_json(value: Any, what: str) -> None:
    """INVALID_REQUEST when ``value`` is not plain JSON data (bytes, NaN, a set...)."""
    problem = json_problem(value)
    if problem is not None:
        raise IntloomError("INVALID_REQUEST", f"{what} is not plain JSON data: {problem}; "
                           "nothing was recorded. Send str, numbers, booleans, null, lists "
                           "and objects with string keys.")


_RUN_ID_WANTED: Final = ("the id of a Run (RUN-<UTC>-<random>: Client.runs() lists them, as "
                         "intloom runs does)")


def _nonempty(value: str, name: str, what: str, limit: int | None = None) -> None:
    # Blank counts as empty: a claim id of spaces was taken, and the Agent that then sent
    # its real id was refused CONFLICT for a claim it never made.
    if not value.strip():
        fact = "empty" if not value else f"blank ({value!r})"
        raise IntloomError("INVALID_REQUEST", f"{name} is {fact}; give {what}.")
    if limit is not None and len(value) > limit:
        raise IntloomError("INVALID_REQUEST", f"{name} is {len(value):,} characters long, over "
                           f"the {limit:,}-character limit; nothing was done. Give {what}, "
                           "short (a counter, a UUID).")


def _tool_not_running(slot: RunSlot, call_id: str, verb: str) -> None:
    """BUSY while a Tool call of the task runs: its task must not end under it."""
    running = slot.agent.tool_running
    if running is not None:
        raise IntloomError(
            "BUSY", f"Tool call {running} of Agent task {call_id} is still running; the task "
            f"can be {verb} once it has returned (retry then).")


def _too_large(state: RunState, record: Any, exc: RecordTooLarge) -> str:
    """Why the journal refused ``record`` as too large, naming the code whose State it holds
    (``state``: the Run before it) in the words of docs/authoring.md's Limits. Built only on
    that refusal: the record class's name ("StepResult") meant nothing to a Step's author."""
    code = running_code(state)
    limit = f"{exc.size:,} bytes encoded, beyond the journal's {exc.limit:,} bytes per record"
    saved = getattr(record, "state", None)
    if isinstance(saved, bytes):
        what = ("the State it returned" if type(record) is StepReady
                else "its wait (with the State it left)" if type(record) is Waiting
                else "its result (the outcome with the State it left)")
        return (f"{code} left a State of {len(saved):,} bytes as JSON: {what} is {limit}, "
                "so nothing was recorded. Keep the Stage's State to what a restart needs: "
                "write large data to a file (or a store of your own) and keep its path or id "
                "in the State.")
    return (f"{code}: its {type(record).__struct_config__.tag} record is {limit}, so nothing "
            "was recorded. Keep a Stage's State and an effect's result small: write large "
            "data to a file (or a store of your own) and keep its path or id.")


def _phase(record: Any) -> str:
    """The record's phase as ``inspect`` shows it (``step_result``), not its class's name."""
    tag = type(record).__struct_config__.tag
    return tag if isinstance(tag, str) else type(record).__name__


def _ownership_lost(slot: RunSlot) -> IntloomError:
    return IntloomError(
        "EXECUTION_OWNERSHIP_LOST",
        f"Run {slot.run_id} no longer belongs to this execution (it was stopped, cancelled or "
        "failed); its remaining work was discarded.",
    )


def _record_at(slot: RunSlot, record: Any) -> str:
    """The Stage and Step ``record`` is about (its own, else the Run's cursor), as errors
    name them: "Run RUN: its step_result record cannot be written" named no Step."""
    stage = getattr(record, "stage", None)
    step = getattr(record, "step", None)
    if not isinstance(stage, str):
        stage, step = slot.state.cursor.stage, slot.state.cursor.step
    return f"Stage {stage!r}" if not isinstance(step, str) else f"Stage {stage!r}, Step {step!r}"


def _unjournalable(record: Any, exc: BaseException) -> str:
    """Why the journal refused ``record`` (where in it, what), that nothing was recorded, and
    the fix."""
    if isinstance(exc, UnicodeEncodeError) and isinstance(exc.object, str):
        text, at = exc.object, exc.start
        where = _text_at(record, text)
        named = f"{where} ({text[:40]!r})" if where else repr(text[:40])
        return (f"{named} is not valid Unicode: it holds a lone surrogate, {text[at]!r} at "
                f"index {at}; nothing was recorded. Text kept in the journal (a question, an "
                "outcome, an effect's name or key) must be valid Unicode: a lone surrogate "
                "comes from bytes decoded with errors='surrogateescape' (os.fsdecode, a file "
                "name); decode them with errors='replace', or keep their hex, instead.")
    found: str | None = None
    with contextlib.suppress(*UNENCODABLE):
        found = wire_problem(msgspec.to_builtins(record))
    fact = found.removeprefix("$.") if found is not None else f"{type(exc).__name__}: {exc}"
    return (f"{fact}; nothing was recorded. Values kept in the journal must be "
            "msgpack-encodable (integers within 64 bits).")


def _text_at(record: Any, text: str) -> str | None:
    """Where ``text`` first sits in ``record`` (``action.request[0].question``), if found."""
    with contextlib.suppress(*UNENCODABLE):
        stack: list[tuple[Any, str]] = [(msgspec.to_builtins(record), "")]
        while stack:
            item, path = stack.pop()
            if item is text or (isinstance(item, str) and item == text):
                return path.lstrip(".") or None
            if isinstance(item, dict):
                parts = [(v, f"{path}.{k}") for k, v in item.items()]
            elif isinstance(item, (list, tuple)):
                parts = [(v, f"{path}[{i}]") for i, v in enumerate(item)]
            else:
                continue
            stack.extend(reversed(parts))  # in order: a name is found before its key
    return None


def _journalable(value: Any, what: str) -> Any:
    """``value`` if the journal can hold it (msgpack: integers within 64 bits, plain types);
    INVALID_REQUEST naming it otherwise, before anything is recorded."""
    try:
        check_encodable(value)
    except UNENCODABLE as exc:
        raise IntloomError(
            "INVALID_REQUEST",
            f"{what} cannot be kept in the Run's journal ({exc}); nothing was recorded. Send "
            "JSON values whose integers fit in 64 bits.",
        ) from None
    return value


def _not_current(slot: RunSlot, action_id: str, elsewhere: RunSlot | None, sent: Any) -> str:
    """Why ``action_id`` cannot be answered now, and what can be. ``elsewhere``: another Run
    that waits on ``action_id``, which the answer was surely meant for; ``sent``: the
    refused answer, compared with the one recorded."""
    if elsewhere is not None:
        # Not "answer the one this Run waits on": the answer was written for the other
        # Run's questions, and sent here it would be taken for good.
        kind = elsewhere.state.pending_action
        what = f"{kind.kind} " if kind is not None else ""
        return (f"Action {action_id} is Run {elsewhere.run_id}'s pending {what}action, not Run "
                f"{slot.run_id}'s; nothing was recorded. Send the answer to the Run that asks "
                f"it: intloom answer {elsewhere.run_id} {action_id} ANSWER.")
    found = _answered_as(slot, action_id)
    same = None if found is None else _same_answer(sent, found[1])
    return _not_current_said(slot, action_id, None if found is None else found[0]) + \
        _same_note(same)


def _not_current_said(slot: RunSlot, action_id: str, gist: str | None) -> str:
    """``_not_current`` for an action answered as ``gist`` says (None: not answered)."""
    fact = (f"Action {action_id} is not (or no longer) Run {slot.run_id}'s unanswered action"
            if gist is None else
            # "Earlier", not "another": a retry of the very answer accepted before a lost
            # reply or a crash is refused here too.
            f"Action {action_id} of Run {slot.run_id} was already answered by an earlier "
            f"request ({gist})")
    call = slot.state.pending_agent_call
    action = slot.state.pending_action
    view = slot.view()
    if call is not None and call.id == action_id:
        return (f"{action_id} is Run {slot.run_id}'s Agent task, not a question or "
                "confirmation: a client Agent claims and completes it through intloom.client "
                "(Client.claim_agent_call, then Client.complete_agent_call).")
    if view.status == "waiting" and action is not None:
        return (f"{fact}; it waits on {action.id} ({action.kind}). Answer that one "
                f"(intloom attach {slot.run_id} shows it).")
    if gist is not None and view.status not in ("completed", "failed"):
        # Another answer won (the race, or earlier) and the Run goes on from it: name it,
        # not an empty "waiting" or "running".
        return (f"{fact}, which was accepted first; nothing was recorded of this answer. "
                f"intloom attach {slot.run_id} follows the Run on from that answer.")
    task = view.pending_agent_call
    if view.status == "waiting" and task is not None:
        # Not "no question or confirmation pending": the Run waits, on work no answer does.
        return (f"{fact}; it waits on client Agent task {task.id} ({task.phase}), which a "
                "client Agent claims and completes through intloom.client, not intloom "
                f"answer; nothing was recorded. intloom attach {slot.run_id} follows it to "
                "its next question.")
    error = view.last_error
    if view.status == "failed" and error is not None and error.code == "RUN_INTERRUPTED":
        then = ("it has been dismissed" if view.dismissed else
                f"intloom cancel {slot.run_id} dismisses it")
        return (f"{fact}; it was interrupted (RUN_INTERRUPTED: "
                f"{clip(error.message, _QUOTED_REASON)}) and takes no answer. Start a new "
                f"Run for this work; {then}.")
    # The answer that lost a race (to a cancel, another answer, the Run moving on) is told
    # what won, and that nothing of it was kept.
    if view.status == "completed":
        return (f"{fact}; it has completed and takes no answer; nothing was recorded "
                f"(intloom attach {slot.run_id} shows its history).")
    if view.status == "failed":
        why = ("was stopped (RUN_STOPPED, by a cancel: intloom cancel or Client.cancel)"
               if error is not None and error.code == "RUN_STOPPED" else
               f"has failed ({error.code if error is not None else 'no error recorded'})")
        return (f"{fact}; it {why} and takes no answer; nothing was recorded "
                f"(intloom attach {slot.run_id} shows how it ended).")
    return (f"{fact}; it is {view.status} with no question or confirmation pending; nothing "
            f"was recorded. intloom attach {slot.run_id} follows it to its next question.")


# The length of an action's id (clock.action_id): ASK- and 21 characters.
_ACTION_ID_LENGTH: Final = 25
_CALL_ID_LENGTH: Final = 26  # clock.call_id: "CALL-" and 21 characters
_RUN_ID_LENGTH: Final = 45  # clock.run_id: RUN-, a stamp to the ms, 21 random characters


def _ended_before(state: RunState, action_id: str, found: tuple[str, bool | None] | None
                  ) -> str:
    """Why an answer to a Run that ended, and that this host no longer holds, is refused:
    how the Run ended, and whether the journal holds an answer to ``action_id`` (its
    decision, and whether it is the refused one)."""
    rid = state.run_id
    fact = (f"Action {action_id} of Run {rid} was already answered by an earlier request "
            f"({found[0]})" if found is not None else
            f"Action {action_id} is not (or no longer) Run {rid}'s unanswered action")
    return (f"{fact}; the Run {_how_ended(state)} and takes no answer; nothing was recorded. "
            f"{_ENDED_BEFORE.format(rid=rid)}{_same_note(found[1] if found else None)}")


_ENDED_BEFORE: Final = ("It ended before this host started, or long enough ago that intloom "
                        "runs no longer lists it: intloom inspect {rid} shows its journal.")


def _how_ended(state: RunState) -> str:
    """How an ended Run ended, as a refusal says it: "has completed", "has failed (...)"."""
    error = state.last_error
    if state.status == "completed":
        return "has completed"
    if error is not None and error.code == "RUN_STOPPED":
        return "was stopped (RUN_STOPPED, by a cancel)"
    return f"has failed ({error.code if error is not None else 'no error recorded'})"


def _task_of_ended(state: RunState, call_id: str, completed: str | None) -> str:
    """Why an Agent's request about task ``call_id`` of a Run that ended, and that this host
    no longer holds, is refused: how the Run ended, and the outcome the journal holds for
    that task's completion (``completed``), when it holds one."""
    rid = state.run_id
    fact = f"Agent task {call_id} is not Run {rid}'s current task"
    if completed is not None:
        fact += (f": its completion (outcome {clip(completed, _QUOTED_REASON)!r}) was "
                 "recorded and the Run went on")
    return (f"{fact}; the Run {_how_ended(state)} and takes no more work; nothing was done. "
            f"{_ENDED_BEFORE.format(rid=rid)}")


def _task_outcome(records: Iterable[Record], call_id: str) -> str | None:
    """The outcome ``records`` (a Run's journal) hold for Agent task ``call_id``'s
    completion, or None."""
    task = False  # whether the records read so far are that task's
    for record in records:
        if type(record) is Waiting:
            task = record.agent_call is not None and record.agent_call.id == call_id
        elif task and type(record) is StepResult:
            return record.outcome
    return None


def _answered_as(slot: RunSlot, action_id: str) -> tuple[str, Any] | None:
    """How ``action_id`` was answered, when it was (as a refusal names it, and the answer as
    journaled), else None."""
    if slot.last_answer is not None and slot.last_answer[0] == action_id:
        return slot.last_answer[1], slot.last_answer[2]
    answered = slot.state.answered_action  # a restored Run's, before its Step returns
    if answered is not None and answered.id == action_id:
        return _answer_gist(slot.state.answer), slot.state.answer
    if slot.recalled is not None:  # read from the journal (Runtime._recall_answers)
        return slot.recalled[1].get(action_id)
    return None


def _same_answer(sent: Any, recorded: Any) -> bool | None:
    """Whether ``sent`` (a request's answer, decoded JSON) is the answer ``recorded`` (as
    journaled): each in the form validation gives it (a confirmation's ``feedback`` left
    out when absent, questions by id, in any order). None when ``sent`` is no answer of
    that kind: nothing is claimed of it then."""
    def plain(answer: Any) -> bytes | None:
        try:
            if isinstance(answer, dict):
                return msgspec.json.encode(msgspec.convert(answer, Confirmation))
            if isinstance(answer, list):
                items = msgspec.convert(answer, list[QuestionAnswer])
                return msgspec.json.encode(sorted(items, key=lambda q: q.question_id))
        except (msgspec.ValidationError, TypeError):
            return None
        return None

    mine, theirs = plain(sent), plain(recorded)
    return None if mine is None or theirs is None else mine == theirs


def _same_note(same: bool | None) -> str:
    """Whether the recorded answer is this very one, as a refusal ends: a retry after a
    lost reply was told only "already answered by an earlier request", which reads as if
    another person's answer had won."""
    if same:
        return (" The recorded answer is the same as this one: if you sent it before and its "
                "reply was lost, yours was recorded, and there is nothing more to do.")
    if same is False:
        return " The recorded answer is not this one."
    return ""


def _from_answer(state: RunState) -> str | None:
    """What a cancel cuts when the Run was going on from an accepted answer (its Step resumed
    with it, or its recover was given it), else None: "The Run was stopped." alone left the
    person whose answer had been accepted (their ``answer`` got that view as its reply) not
    knowing that it was, nor whether the Step had acted on it."""
    action = state.answered_action
    if action is None or state.status != "running" or state.phase == "waiting":
        return None
    cursor = state.cursor
    code = (f"the recover entry of Step {cursor.stage}/{cursor.step}"
            if state.executing_kind == "recover" else f"Step {cursor.stage}/{cursor.step}")
    done = state.last_effect
    since = (f"; effect {done.name!r} (key {done.key!r}) had run since" if done is not None
             else "; no effect had run since")
    return (f"{code} was going on from the accepted answer to {action.kind} {action.id} "
            f"({_answer_gist(state.answer)}){since}")


# How much of what a cancelled wait asked its cancel's message quotes (--json of the Run's
# inspect shows all of it).
_ASKED_GIST: Final = 120


def _running(state: RunState) -> str | None:
    """The code a cancel cuts when the Run was inside a Step, its initialiser or its recover
    outside any effect, as a restart names it, else None: "The Run was stopped." said
    nothing of the Step that was running (a stop named it)."""
    if state.status != "running" or state.phase not in ("executing", "effect_done"):
        return None
    return restart_verdict(state, has_recover=False).reason


def _between(state: RunState) -> str | None:
    """Where a cancel that lands between two Steps finds the Run (a Step's result not yet
    routed, the next Step or Stage not yet begun), else None: "The Run was stopped." alone
    left the view's cursor on the Step that had returned, as if it had been cut."""
    if state.status != "running" or state.phase not in ("step_result", "step_ready",
                                                        "stage_pending"):
        return None
    cursor = state.cursor
    if state.phase == "step_result":
        return (f"between Steps: Step {cursor.stage}/{cursor.step} had returned "
                f"{state.outcome!r} and nothing was cut; the Step it routes to had not begun")
    ahead = (f"Step {cursor.stage}/{cursor.step}" if state.phase == "step_ready"
             else f"Stage {cursor.stage}")
    return f"between Steps: {ahead} had not begun, and nothing was cut"


def _waited_on(state: RunState) -> str | None:
    """The wait a cancel ends, when the Run waits on a person or a client Agent (what was
    asked, by whom), else None: "The Run was stopped." alone left the person who had been
    asked (or the Agent's owner) to find out that their answer or task was now refused."""
    if state.status != "waiting":
        return None
    cursor = state.cursor
    where = f"Step {cursor.stage}/{cursor.step}"
    action, call = state.pending_action, state.pending_agent_call
    if action is not None:
        asked = action.request  # a confirmation's context, as intloom runs shows it
        if action.kind == "confirmation" and isinstance(asked, dict) and "context" in asked:
            asked = asked["context"]
        return (f"{where} waited on {action.kind} {action.id} for a person "
                f"({_gist(asked)}); that wait is ended, and an answer to it is refused")
    if call is not None:
        return (f"{where} waited on client Agent task {call.id} ({call.phase}, for Agent "
                f"{call.agent_id!r}: {_gist(call.request)}); the task is withdrawn, and the "
                "Agent's further requests for it are refused")
    return None


def _gist(request: Any) -> str:
    """What a wait asked, as compact JSON cut to ``_ASKED_GIST`` characters."""
    try:
        text = msgspec.json.encode(request).decode()
    except (TypeError, ValueError, UnicodeDecodeError):
        text = repr(request)
    return clip(text, _ASKED_GIST)


def _answer_gist(answer: Any) -> str:
    """An accepted answer, as a refusal names it: its decision, never a person's text."""
    if isinstance(answer, dict) and isinstance(answer.get("isConfirmed"), bool):
        return "confirmed" if answer["isConfirmed"] else "declined"
    if isinstance(answer, list):
        return f"answers to {len(answer)} question{'s' if len(answer) != 1 else ''}"
    return "an answer"


def _not_current_task(slot: RunSlot, view: RunView, call_id: str,
                      completed: str | None = None) -> str:
    """Why Agent task ``call_id`` takes no more requests, and what the Agent can do.
    ``completed``: the outcome the Run's journal holds for that task's completion, when an
    earlier host recorded one (``Runtime._recall_completion``)."""
    fact = f"Agent task {call_id} is not Run {slot.run_id}'s current task"
    if completed is not None:
        # A retry whose reply was lost with its host: told only that the Run was
        # interrupted and to start a new Run, the Agent took its work for lost.
        fact += (f": its completion (outcome {clip(completed, _QUOTED_REASON)!r}) was "
                 "recorded and the Run went on")
    call, action, error = view.pending_agent_call, slot.state.pending_action, view.last_error
    if view.status == "waiting" and call is not None:
        return f"{fact}: the Run now waits on Agent task {call.id} ({call.phase}); use that one."
    if view.status == "waiting" and action is not None:
        return (f"{fact}: the Run now waits on {action.kind} {action.id} for a person; the "
                "Agent has nothing to do until a new task appears in the Run's view.")
    if view.status == "completed":
        return f"{fact}: the Run has completed and takes no more work."
    if view.status == "failed" and error is not None and error.code == "RUN_INTERRUPTED":
        quoted = clip(error.message, _QUOTED_REASON)
        if completed is not None:
            return (f"{fact}, then was interrupted (RUN_INTERRUPTED: {quoted}). Nothing was "
                    "done. Start a new Run for what it had left to do; intloom cancel "
                    f"{slot.run_id} dismisses it.")
        # A Run interrupted while it waited on a task says so in its own evidence.
        lost = "" if NOT_RESTORED in quoted else f"; {NOT_RESTORED}"
        return (f"{fact}: the Run was interrupted (RUN_INTERRUPTED: {quoted}){lost}. Start a "
                f"new Run for this work; intloom cancel {slot.run_id} dismisses it.")
    if view.status == "failed":
        code = error.code if error is not None else "failed"
        return f"{fact}: the Run has ended failed ({code}) and takes no more work."
    return (f"{fact}: the Run is {view.status}; a new task, if any, appears in its view "
            "(Client.get_run).")


class _AgentEnd(msgspec.Struct, frozen=True):
    """How an Agent task ended: what a retry must repeat to be answered as the first was."""

    call_id: str
    owner_token: str
    verb: str  # "complete" or "fail"
    # The outcome, or the failure message, as a refusal quotes it: an Agent's failure
    # message may run to pages (its whole log), and the refusal's fact and fix must stay in
    # view. What a retry must repeat is the hash in ``output``.
    shown: str
    output: bytes  # sha256 of the completion's output, or of the whole failure message

    def same(self, other: _AgentEnd) -> bool:
        """The same request, whoever's token it carries (checked on its own)."""
        return (self.verb, self.shown, self.output) == (other.verb, other.shown, other.output)


def _ended_as(first: _AgentEnd, this: _AgentEnd) -> str:
    """How ``first`` ended (or ends) its task, as a refusal of ``this`` request names it:
    "another output" when the outcome is the one this request sent, which alone would read
    as if the two were the same."""
    if first.verb == "fail":
        return f"failed: {first.shown}"
    other = (" and another output" if this.verb == "complete" and this.shown == first.shown
             else "")
    return f"completed with outcome {first.shown}{other}"


class _UnderWay:
    """A completion whose on_complete runs (``AgentClaim.completing``): what it sent, and
    set once it is recorded or refused."""

    def __init__(self, end: _AgentEnd) -> None:
        self.end = end
        self.settled = asyncio.Event()


def _not_under_way(slot: RunSlot, call_id: str, end: _AgentEnd) -> None:
    """While another completion's on_complete runs: CONFLICT at once, which a retry could not
    change if that completion is recorded (it was BUSY, and its retry then got CONFLICT)."""
    running = slot.agent.completing
    if not isinstance(running, _UnderWay):
        return
    what = "completion" if end.verb == "complete" else "failure"
    raise IntloomError(
        "CONFLICT",
        f"Agent task {call_id} is being completed by another request, with "
        f"{_ended_as(running.end, end).removeprefix('completed with ')}; this {what} was not "
        f"recorded. Once that completion is recorded the task has ended; if its on_complete "
        f"refuses it, the task stays claimed and this {what} can be sent again.",
    )


class Runtime:
    """Facade used by the host. Every method raises ``IntloomError`` with a catalogue code."""

    def __init__(
        self,
        workflows: Mapping[str, LoadedWorkflow],
        journal: JournalPort,
        *,
        package_version: str,
        on_event: RunObserver | None = None,
        max_finished: int = MAX_FINISHED,
        withheld: Mapping[str, str] | None = None,
        failed: Sequence[str] = (),
    ) -> None:
        self.workflows = dict(workflows)
        self.withheld = dict(withheld or {})  # see incompatibility
        self.failed = tuple(failed)  # see incompatibility
        self.on_event = on_event
        self.journal = journal
        self.package_version = package_version
        self.runs: dict[str, RunSlot] = {}
        # The last task each Run's Agent ended: a retry that repeats it gets the Run's view
        # again instead of CONFLICT (its reply may have been lost). Memory only, like claims.
        self._agent_ended: dict[str, _AgentEnd] = {}
        # The Agent task each Run was waiting on when a cancel ended it: a request naming
        # that task with another Run's id was told to "use" that other Run's task, one
        # another Agent may hold, where it is told whose task it is (``_task_owner``).
        self._agent_cancelled: dict[str, str] = {}
        # Agent work running in the host (a Tool call, an on_complete handler): a stop gives
        # it the Steps' grace, and names what is still running then. Done when it returns.
        self._agent_work: dict[asyncio.Future[None], tuple[str, str]] = {}
        # The tasks of Agent work (a Tool call, on_complete) the host itself cancelled
        # (_unless_cut): any other cancel of one is the Workflow code's own, a refusal.
        self.host_cancelled: weakref.WeakSet[asyncio.Future[Any]] = weakref.WeakSet()
        self._agent_dropped: builtins.list[tuple[str, str]] = []  # its results a stop refused
        # Set when a stop's grace has run out (suspend): a Tool call or on_complete still
        # running then is answered CLI_SERVICE_CLOSING before the host exits (_unless_cut).
        self._grace_over = asyncio.Event()
        # Why suspend was called when the host outlives it (its log failed): None for a stop.
        self._suspended_for: str | None = None
        # Ended Runs stay listed for `runs` and `get`, the oldest dropped past the cap (their
        # journal keeps them for inspect); without it a long-lived host grows ~10 KB per Run.
        self.max_finished = max_finished
        self._finished: dict[str, None] = {}  # ended Runs still held, oldest first
        # Each Run's position in `runs` (1, 2, ...; never reused): a list page resumes after
        # the last position it showed, whichever Runs ended or were dropped meanwhile.
        self._position: dict[str, int] = {}
        self._positions = 0
        self._dropped: dict[str, int] = {}  # status counts of the ended Runs no longer held
        self.attention: list[tuple[str, str]] = []
        self.held: dict[str, HeldRun] = {}  # Runs the restore did not load, by id
        self.closing = False
        self._restored = False
        self._to_start: list[RunSlot] = []
        self.driver = Driver(self)

    # ------------------------------------------------------------------ restore

    def restore(self, runs: list[RestoredRun], *, strict: bool = False,
                tool_calls: Callable[[Mapping[str, str]], Mapping[str, str]] | None = None
                ) -> RestoreSummary:
        """Classify restored Runs by the restart table. Once, before any Run exists.

        ``tool_calls``: per Run, what the last host's log says of a Tool call its Agent task
        left running or had made (not journaled), given the task each Run waited on; called
        at most once, and only for an interrupted Run that waited on an Agent task."""
        cut: Mapping[str, str] | None = None
        if self._restored or self.runs:
            raise IntloomError("CONFLICT", "restore runs once, before any Run is created.")
        self._restored = True
        resumed: list[str] = []
        waiting: list[str] = []
        interrupted: list[str] = []
        attention: list[str] = []
        terminal = 0
        for item in runs:
            state = item.state
            if state is not None and state.phase == "terminal" and item.problem is None:
                terminal += 1
                continue
            problem = item.problem or self._incompatibility(state, item.written_by)
            if problem is not None or state is None:
                message = problem or "nothing restorable was found in its journal"
                self.attention.append((item.run_id, message))
                attention.append(item.run_id)
                held = self.held[item.run_id] = self._held(item, message)
                if (state is not None and tool_calls is not None and (
                        state.pending_agent_call is not None
                        or (state.phase == "executing" and state.executing_kind == "agent"))):
                    # Only the last host's log has it: held for one start, it was lost.
                    if cut is None:
                        cut = tool_calls(_agent_tasks(runs))
                    held.tool_call = cut.get(state.run_id)
                continue
            lw = self.workflows[state.workflow]
            verdict = restart_verdict(state, lw.has_recover(state.cursor.stage, state.cursor.step))
            slot = RunSlot(state=state, lw=lw, observer=self.on_event)
            slot.restored_seq = state.seq
            self._keep(slot)
            shown: dict[str, Any] = {"row": verdict.row, "reason": verdict.reason}
            if verdict.row == "interrupted":
                slot.owned = False
                also = None
                if tool_calls is not None and (
                        state.pending_agent_call is not None
                        or (state.phase == "executing" and state.executing_kind == "agent")):
                    if cut is None:
                        cut = tool_calls(_agent_tasks(runs))
                    also = cut.get(state.run_id)
                if also is not None:
                    shown["toolCall"] = also  # logged, for the host after this one
                # Clipped: it names the effect in flight, whose key a journal written before
                # MAX_EFFECT_ID existed may hold at any length.
                slot.override = ErrorView(
                    code="RUN_INTERRUPTED", message=clip(interrupted_message(state, also)),
                    retryable=False,
                )
                interrupted.append(state.run_id)
            elif verdict.row == "restore_wait":
                slot.restored_wait = True
                waiting.append(state.run_id)
            else:  # resume, route, recover
                slot.recovering = verdict.row == "recover" and state.phase == "executing"
                self._to_start.append(slot)
                resumed.append(state.run_id)
            # Published once the row is applied: the event shows the Run as restored (an
            # interrupted one failed), not as its last record left it.
            # ``at``: the restore's time (the view's updatedAt is its last record's, written
            # by the earlier host), so that a follower sees the downtime.
            slot.publish("restored", {**shown, "at": clock.now()})
        if strict and attention:
            raise strict_refusal(self.attention)
        return RestoreSummary(
            resumed=resumed,
            waiting=waiting,
            interrupted=interrupted,
            needs_attention=attention,
            terminal_skipped=terminal,
        )

    def _incompatibility(self, state: RunState | None, written_by: str = "") -> str | None:
        return incompatibility(state, self.workflows, self.package_version, self.withheld,
                               self.failed, written_by=written_by)

    def _held(self, item: RestoredRun, why: str) -> HeldRun:
        state = item.state
        if item.problem is not None or state is None:  # the journal itself is at fault
            code = "JOURNAL_INCOMPATIBLE" if item.status == "incompatible" else "JOURNAL_CORRUPT"
            return HeldRun(item.run_id, state, why, code, dismissible=False, lost=item.lost,
                           snapshot=item.snapshot)
        whole = unreadable(state, self.package_version, item.written_by) is None
        fact = incompatibility(state, self.workflows, self.package_version, self.withheld,
                               self.failed, advice=False, written_by=item.written_by)
        return HeldRun(item.run_id, state, why, "JOURNAL_INCOMPATIBLE", dismissible=whole,
                       fact=fact)

    def start_restored(self) -> None:
        """Launch the Runs that resume (needs a running event loop)."""
        for slot in self._to_start:
            self.driver.launch(slot)
        self._to_start.clear()

    # ------------------------------------------------------------------ records

    def append(self, slot: RunSlot, record: Any, *, force: bool = False) -> None:
        """Apply a record to the Run and hand it to the journal (not yet durable).

        Also called from the thread driving the Run's sync Steps: there a failed checkpoint
        is raised as it is (``CheckpointFailed``), for the loop to settle (``settle``).
        A record that carries what user code handed over is bounded first (``_bounded``).
        """
        if type(record) in _BOUNDED:  # before anything is folded or journaled
            record = self._bounded(slot, record)
        self.append_boundary(slot, record, force=force)

    def append_boundary(self, slot: RunSlot, record: Any,
                        fold: Callable[[RunState, Any], RunState] = apply, *,
                        force: bool = False) -> None:
        """``append`` for a Step's own boundaries (step_ready, executing, step_result), whose
        fields ``_bounded`` never checks: a chain of Steps appends three per Step, and the
        check measured ~900 instructions per Step (callgrind, one sync Run). ``fold``: the
        machine's fold of that kind of record (``fold_executing``...) when the caller knows
        it, which checks what ``apply`` checks (with the machine's folds checking for
        themselves, callgrind, 64 async Runs: 114.9-115.1k -> 112.5-112.9k)."""
        failed: CheckpointFailed | None
        if not slot.on_thread and slot.owned:
            # No worker drives the Run (always so for an async Step's records): nothing to
            # lock, so no try/finally and no test of a lock on this path (callgrind, 64 async
            # Runs, four pairs: 111.4-112.1k -> 110.8-111.4k). Folded, then journaled, then
            # kept: a record the machine refuses or the journal cannot encode leaves the Run
            # exactly as it was.
            try:
                state = fold(slot.state, record)
                self.journal.append(slot.run_id, record, state)
                slot.apply(record, state)
                return
            except CheckpointFailed as exc:  # an earlier batch of this Run failed
                failed = exc
            except _UNJOURNALED as exc:
                raise self._unjournaled(slot, record, exc) from None
        else:
            # Locked while a worker drives the Run: the loop may append (a cancel) meanwhile.
            # Released before a failure is handled: fail_checkpoint publishes, which locks.
            failed = None
            lock = slot.lock if slot.on_thread else None
            if lock is not None:
                lock.acquire()
            try:
                if not slot.owned and not force:
                    raise _ownership_lost(slot)
                state = fold(slot.state, record)  # as above
                self.journal.append(slot.run_id, record, state)
                slot.apply(record, state)
            except CheckpointFailed as exc:
                failed = exc
            except _UNJOURNALED as exc:
                raise self._unjournaled(slot, record, exc) from None
            finally:
                if lock is not None:
                    lock.release()
        if failed is not None:  # the Run cannot write
            if threading.current_thread() is not self.driver.loop_thread:
                raise failed
            self.fail_checkpoint(slot, failed.cause)
            raise IntloomError("RUN_CHECKPOINT_FAILED") from None

    def append_routed(self, slot: RunSlot, result: StepResult, ready: StepReady,
                      executing: Executing | None) -> None:
        """``append_boundary`` of a Step's routed ``step_result`` and the next Step's
        ``step_ready``, then, when given, that Step's ``executing`` (it is called next): one
        fold for all (``fold_routed``), one journal call for all, all or none of them kept.
        On the loop or on the thread driving the Run, as ``append_boundary``."""
        failed: CheckpointFailed | None = None
        # Locked while a worker drives the Run: the loop may append (a cancel) meanwhile.
        lock = slot.lock if slot.on_thread else None
        if lock is not None:
            lock.acquire()
        try:
            if not slot.owned:
                raise _ownership_lost(slot)
            state = fold_routed(slot.state, result, ready, executing)
            self.journal.append_many(slot.run_id, (result, ready) if executing is None
                                     else (result, ready, executing), state)
            slot.apply_routed(result, ready, executing, state)
        except CheckpointFailed as exc:  # an earlier batch of this Run failed
            failed = exc
        except _UNJOURNALED as exc:  # the State, which step_result holds first
            raise self._unjournaled(slot, result, exc) from None
        finally:
            if lock is not None:
                lock.release()
        if failed is not None:  # as append_boundary
            if threading.current_thread() is not self.driver.loop_thread:
                raise failed
            self.fail_checkpoint(slot, failed.cause)
            raise IntloomError("RUN_CHECKPOINT_FAILED") from None

    def _unjournaled(self, slot: RunSlot, record: Any, exc: Exception) -> IntloomError:
        """The error for a record the journal refused (too large, or not encodable)."""
        if isinstance(exc, RecordTooLarge):
            return IntloomError("RUN_STATE_INVALID", _too_large(slot.state, record, exc))
        return IntloomError(
            "RUN_STATE_INVALID",
            f"Run {slot.run_id}, {_record_at(slot, record)}: its {_phase(record)} record "
            f"cannot be written to the journal: {_unjournalable(record, exc)}",
        )

    def _bounded(self, slot: RunSlot, record: Any) -> Any:
        """``record`` within the limits of ``intloom.runtime.limits``: an error message cut
        to ``MAX_MESSAGE`` (the full text, bounded too, goes to the host log), or
        STEP_INTERACTION_INVALID for a request or an effect id past its limit, raised before
        anything of it is recorded. Every such record passes here, whichever code built it."""
        if type(record) is Terminal:
            error = record.error
            if error is not None and len(error.message) > MAX_MESSAGE:
                self._log_cut(slot, f"lastError ({error.code})", error.message)
                record = msgspec.structs.replace(
                    record, error=msgspec.structs.replace(error, message=clip(error.message)))
        elif type(record) is EffectDone:
            if record.error is not None and len(record.error) > MAX_MESSAGE:
                self._log_cut(slot, f"effect {record.name!r} ({record.key})", record.error)
                record = msgspec.structs.replace(record, error=clip(record.error))
        elif type(record) is EffectStarted:
            check_effect_ids(slot.state, record.name, record.key)
        elif record.action is not None:  # Waiting, for a person
            kind = record.action.kind
            what = ("the context given to ctx.confirm" if kind == "confirmation"
                    else "the questions given to ctx.ask")
            _check_request(running_code(slot.state), what, record.action.request,
                           "Keep what a person reads short: put large data in a file (or a "
                           "store of your own) and show its path or a summary instead.")
        elif record.agent_call is not None:  # Waiting, for a client Agent
            _check_request(running_code(slot.state), "the Agent task it returned",
                           record.agent_call.request,
                           "Put large input where the Agent's Tools can read it (a file, a "
                           "store of your own) and pass a reference (a path, an id) instead.")
        return record

    def _log_cut(self, slot: RunSlot, what: str, message: str) -> None:
        """The host log keeps what a Run's record could not (up to MAX_LOGGED_MESSAGE)."""
        if self.on_event is None or threading.current_thread() is not self.driver.loop_thread:
            return
        self.on_event("message_cut", slot.run_id, {
            "what": what, "characters": len(message), "kept": MAX_MESSAGE,
            "message": clip(message, MAX_LOGGED_MESSAGE),
        }, slot.view().status)

    async def sync(self, slot: RunSlot) -> None:
        """Make everything appended durable; a failed batch fails exactly its Runs."""
        try:
            upto = slot.mark()
            if slot.followed:  # as an async Step's ``executing`` (Driver._run_step)
                self.journal.when_durable(functools.partial(self.show_early, slot, upto))
            await self.journal.sync(slot.run_id)
            self.show_durable(slot, upto)
        except (CheckpointFailed, OSError) as exc:
            self.settle(slot, exc)

    def show_early(self, slot: RunSlot, upto: tuple[RunState, int]) -> None:
        """``when_durable``'s call, ahead of the Run's task: show its followers what the
        flush made durable up to ``upto``, unless the flush failed for it (its task settles
        that). The task's own ``show_durable`` then finds nothing new to show."""
        if self.journal.failure(slot.run_id) is None:
            slot.publish(upto=upto)

    def show_durable(self, slot: RunSlot, upto: tuple[RunState, int]) -> None:
        """``sync``'s end, once the journal has made the Run durable up to ``upto`` (its
        ``mark()`` before the flush): show it, and retire the Run if that ended it."""
        slot.publish(None, None, upto)  # positional: a call CPython 3.11 specialises
        if slot.shown.phase == "terminal":
            self.retire(slot)

    def sync_crew(self, slots: list[RunSlot]) -> list[BaseException | None]:
        """``sync`` from a crew's thread (``executor.crew``) for the Runs it advanced this
        round: one flush makes every record appended so far durable; then each Run is shown
        -- on this thread when nobody on the loop needs telling, else through the loop.
        Returns, per Run, None or what its Step loop must raise: its failed checkpoint (for
        the loop to settle, ``settle``)."""
        marks = [slot.mark() for slot in slots]
        journal = self.journal
        # One flush for all: a Run's own failure is asked of it below (``failure``), as
        # ``sync(run_id)`` would raise it, whichever flush held its records.
        # Not contextlib.suppress: three Python calls per round, so per Step of a lone Run.
        try:  # noqa: SIM105
            journal.sync_threadsafe(None)
        except CheckpointFailed:
            pass
        told: list[BaseException | None] = []
        loop = self.driver.loop
        assert loop is not None, "a Run is driven on a thread only after launch()"
        for slot, upto in zip(slots, marks, strict=True):
            failed = journal.failure(slot.run_id)
            if failed is not None:
                told.append(failed)
                continue
            try:
                if not slot.publish_here(upto):
                    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is told
                        loop.call_soon_threadsafe(slot.publish, None, None, upto)
            except Exception as exc:  # the host's failure: raised in the Run's task
                told.append(exc)
                continue
            told.append(None)
        return told

    def settle(self, slot: RunSlot, exc: CheckpointFailed | OSError) -> None:
        """A checkpoint failed: its Runs fail. Raises RUN_CHECKPOINT_FAILED when ``slot`` is
        one of them (an OSError is ``slot``'s own); returns when its records are durable."""
        if isinstance(exc, CheckpointFailed):
            for run_id in exc.run_ids:
                # ``slot`` is not listed yet while its creation is made durable: its cause
                # must still reach the log.
                other = slot if run_id == slot.run_id else self.runs.get(run_id)
                if other is not None:
                    self.fail_checkpoint(other, exc.cause)
            if slot.run_id in exc.run_ids:
                raise IntloomError("RUN_CHECKPOINT_FAILED") from None
            return
        self.fail_checkpoint(slot, exc.strerror or str(exc))
        raise IntloomError("RUN_CHECKPOINT_FAILED") from None

    def retire(self, slot: RunSlot) -> None:
        """An ended Run: keep it listed, and drop the oldest ended ones past ``max_finished``.

        Its history keeps its last ``ENDED_HISTORY`` entries: a host lists up to
        ``max_finished`` ended Runs, and each running Run's ``_HISTORY`` entries (a state
        each) kept for all of them would be hundreds of MB for long Runs."""
        slot.keep_history(ENDED_HISTORY)
        slot.agent = AgentClaim()  # a cancelled task's receipts (Tool outputs) go with it
        # Nor its last Stage State (up to a record's 64 MiB), which no view shows and nothing
        # reads once the Run ended: kept, a host held the States of the last 1,000 ended
        # Runs, +46 MB per Run for 45 MB States. The journal holds it (intloom inspect).
        slot.state, slot.shown, slot.decoded = kept(slot.state), kept(slot.shown), None
        self._finished[slot.run_id] = None
        while len(self._finished) > self.max_finished:
            oldest = next(iter(self._finished))
            del self._finished[oldest]
            gone = self.runs.pop(oldest, None)
            self._position.pop(oldest, None)
            self._agent_ended.pop(oldest, None)
            self._agent_cancelled.pop(oldest, None)
            if gone is not None:
                status = gone.view().status
                self._dropped[status] = self._dropped.get(status, 0) + 1

    def _log_cause(self, run_id: str, detail: dict[str, Any], status: str) -> str:
        """Log a failed checkpoint's cause (the view never carries it, DESIGN §3), and say
        where it can be read -- or that the log could not take it either."""
        logged = self.on_event is None or self.on_event(
            "checkpoint_failed", run_id, {"code": "RUN_CHECKPOINT_FAILED", **detail},
            status) is not False
        if logged:
            return f"The host log has the cause (intloom logs {run_id})."
        return ("The host could not write the cause to its log either (the disk is full or "
                "failing); intloom inspect shows where the journal stops.")

    def stopped_by_checkpoint(self) -> int:
        """How many Runs this host holds that a failed checkpoint stopped: a suspension does
        not suspend them, and what a host says it did to its Runs must not count them."""
        return sum(1 for slot in self.runs.values() if slot.checkpoint_where is not None)

    def fail_checkpoint(self, slot: RunSlot, cause: str) -> None:
        """RUN_CHECKPOINT_FAILED: the Run stops; nothing more is written for it."""
        if slot.view().status in ("completed", "failed"):
            return
        slot.owned = False
        # The view carries no cause (DESIGN §3): the OS error, the segment and the offset go
        # to the host log, and the journal keeps a void notice where the batch failed.
        where = slot.checkpoint_where = self._log_cause(slot.run_id, {"cause": cause}, "failed")
        slot.override = ErrorView(
            code="RUN_CHECKPOINT_FAILED",
            # Not "cannot safely continue": the next start brings the Run back from its last
            # durable record by the restart table (DESIGN §6), which may wait, resume or end.
            message="The Run recovery checkpoint could not be saved, so this host stopped the "
            "Run; earlier effects are not rolled back. What the next intloom start does with "
            "it depends on its last durable checkpoint (the restart table): intloom doctor "
            f"previews it. {where}",
        )
        slot.revoke(IntloomError("RUN_CHECKPOINT_FAILED"))
        if self.runs.get(slot.run_id) is slot:
            slot.publish("failed", {"code": "RUN_CHECKPOINT_FAILED"})
        # else its creation failed: the Run was never listed, and its refusal says "No Run
        # was created"; a run_failed in the log had a log reader count a Run that was not.

    # ------------------------------------------------------------------ requests

    def _slot(self, run_id: str) -> RunSlot:
        slot = self.runs.get(run_id)
        if slot is None:
            # An empty id was NOT_FOUND, "Run '' is not known", where an empty action id is
            # INVALID_REQUEST: a request that names no Run is malformed, not unlucky.
            _nonempty(run_id, "run_id", _RUN_ID_WANTED)
            held = self.held.get(run_id)
            if held is not None:
                raise held.error()
            raise IntloomError(
                "NOT_FOUND",
                f"Run {run_id!r} is not known to this host.{self._not_a_run(run_id)} intloom "
                "runs lists the current Runs; intloom inspect reads any Run's journal offline.",
            )
        return slot

    def _waiting_on(self, action_id: str, but: RunSlot | None = None) -> RunSlot | None:
        """The Run (other than ``but``) whose view waits on question or confirmation
        ``action_id``, if any. Only on a refusal's path: it looks at every Run."""
        if not action_id.startswith("ASK-"):
            return None
        for slot in tuple(self.runs.values()):  # a snapshot: a worker may retire a Run
            if slot is but:
                continue
            view = slot.view()
            if (view.status == "waiting" and view.pending_action is not None
                    and view.pending_action.id == action_id):
                return slot
        return None

    def _not_a_run(self, run_id: str) -> str:
        """What an id given as a Run's is, when it is an action's (RUN and ACTION swapped)."""
        owner = self._waiting_on(run_id)
        if owner is not None:
            return (f" {run_id} is the id of Run {owner.run_id}'s pending action, not of a "
                    f"Run: give {owner.run_id} as the Run (intloom answer takes the Run's id, "
                    "then the action's).")
        if run_id.startswith("CALL-"):
            # An Agent's ids swapped: "intloom answer takes ..." told it of a command it
            # does not use, and not whose task the id is.
            for slot in tuple(self.runs.values()):  # a snapshot, as in _waiting_on
                task = slot.view().pending_agent_call
                if task is not None and task.id == run_id:
                    return (f" {run_id} is the id of Run {slot.run_id}'s Agent task, not of a "
                            f"Run: give {slot.run_id} as the Run (claim_agent_call, call_tool, "
                            "complete_agent_call and fail_agent_call take the Run's id, then "
                            "the task's).")
        if run_id.startswith(("ASK-", "CALL-")):
            return (f" {run_id} is an action's or an Agent task's id, not a Run's (a Run's id "
                    "begins RUN-; intloom answer takes the Run's id, then the action's).")
        return ""

    def _admit(self) -> None:
        if self.closing:
            raise IntloomError("CLI_SERVICE_CLOSING", "The host is stopping; no new work.")

    async def create_run(self, workflow: str, intent: str) -> RunView:
        """Create a Run (durable ``stage_pending`` first) and start it; returns at once."""
        self._admit()
        lw = self.workflows.get(workflow)
        if lw is None:
            known = ", ".join(sorted(self.workflows)) or "none"
            raise IntloomError(
                "NOT_FOUND",
                f"Workflow {workflow!r} is not loaded (loaded: {known}). Check intloom.toml and "
                "intloom flows.",
                retryable=False,
            )
        if not isinstance(intent, str):
            raise IntloomError("INVALID_REQUEST", f"The intent is a {type(intent).__name__}, "
                               "not text; no Run was created. Say what the Run is for.")
        if not intent.strip():
            # As the CLI words it: "must be non-blank text" named no fix.
            raise IntloomError("INVALID_REQUEST", f"{BLANK_INTENT} (empty or only "
                               "whitespace); no Run was created. Say what the Run is for.")
        size = len(intent.encode("utf-8", "surrogatepass"))
        if size > MAX_INTENT_BYTES:
            raise IntloomError("INVALID_REQUEST", intent_too_large(size))
        now = clock.now()
        run_id = clock.run_id(now)
        header = Header(
            at=now,
            run_id=run_id,
            workflow=lw.name,
            workflow_version=lw.version,
            identity=lw.identity,
            schemas=lw.schemas,
            intent=intent,
            package_version=self.package_version,
        )
        slot = RunSlot.new(header, lw, self.on_event)
        self.journal.append(run_id, header)
        self.append(slot, StagePending(at=now, stage=lw.workflow.entry.name))
        try:
            await self.sync(slot)  # durable before the Run is visible
        except IntloomError as exc:
            if exc.code != "RUN_CHECKPOINT_FAILED":
                raise
            # The Run never became visible: no view of it will carry the failure, so the
            # refusal names it, where its cause is, and that nothing of it ran.
            where = f" {slot.checkpoint_where}" if slot.checkpoint_where else ""
            failure = self.journal.failure(run_id)
            fix = (" The host's journal takes no more checkpoints (after a failed write no "
                   "new segment could be created), so every Run's next one fails until the "
                   "host restarts: intloom status names the cause and what to fix (space, "
                   "inodes, or a flag or permission in .intloom/runtime); run intloom stop, "
                   "fix it, then intloom start, and run the command again."
                   if failure is not None and failure.lasting else
                   " Check the disk that holds .intloom/runtime (free space, permissions), "
                   "then run the command again.")
            raise IntloomError(
                "RUN_CHECKPOINT_FAILED",
                f"No Run was created: the first checkpoint of Run {run_id} (Workflow "
                f"{lw.name!r}) could not be saved, so none of its Steps ran.{where}{fix}",
            ) from None
        self._keep(slot)
        slot.publish("created")
        self.driver.launch(slot)
        return slot.view()

    async def wait_stable(self, run_id: str) -> RunView:
        """The Run's view once it is waiting or terminal."""
        ended = self._held_ended(run_id) or await self.ended_view(run_id)
        if ended is not None:
            return ended
        slot = self._slot(run_id)
        while True:
            view = slot.view()
            if view.status != "running":
                return view
            await slot.until_stable()

    def get(self, run_id: str) -> RunView:
        ended = self._held_ended(run_id)
        if ended is not None:
            return ended
        return self._slot(run_id).view()

    async def get_any(self, run_id: str) -> RunView:
        """``get``, and the view of a Run that ended before this host started
        (``ended_view``) rather than NOT_FOUND."""
        try:
            return self.get(run_id)
        except IntloomError as exc:
            if exc.code != "NOT_FOUND":
                raise
            ended = await self.ended_view(run_id)
            if ended is None:
                raise
            return ended

    async def ended_view(self, run_id: str) -> RunView | None:
        """The last view of a Run this host does not hold because it ended before the host
        started (a start restores unfinished Runs only), as its journal holds it; None for
        any other id. After a restart, ``cancel RUN`` repeated returned NOT_FOUND where
        DESIGN has it return the same snapshot, and ``attach``/``get_run`` of a Run that
        had completed said it was "not known". Only for ids shaped as a Run's; reading
        fails quietly (NOT_FOUND follows)."""
        state = await self._ended_state(run_id)
        return None if state is None else plain_view(state)  # a dismissal shown, too

    async def _ended_state(self, run_id: str) -> RunState | None:
        """The journal's last state of a Run this host does not hold and that has ended
        (``JournalPort.ended``); None for any other id, and when it cannot be read."""
        if (run_id in self.runs or run_id in self.held or not run_id.startswith("RUN-")
                or len(run_id) != _RUN_ID_LENGTH):
            return None
        try:
            state: RunState | None = await self.driver.offload(self.journal.ended, run_id)
        except Exception:  # NOT_FOUND is worded without it
            return None
        return state

    def _held_ended(self, run_id: str) -> RunView | None:
        """The view of a held Run this host cancelled (None for any other Run)."""
        held = self.held.get(run_id) if run_id not in self.runs else None
        return held.ended if held is not None else None

    def _keep(self, slot: RunSlot) -> None:
        """List ``slot`` in ``runs``, after every Run listed so far."""
        self._positions += 1
        self._position[slot.run_id] = self._positions
        self.runs[slot.run_id] = slot

    def list(self, flow: str | None = None) -> list[RunView]:
        return [s.view() for s in self.runs.values() if flow is None or s.state.workflow == flow]

    def list_page(self, flow: str | None, after: int, page_bytes: int
                  ) -> tuple[builtins.list[RunView], int]:
        """The views of the Runs listed after position ``after`` that fit in ``page_bytes``
        encoded bytes (capped at MAX_PAGE; at least one Run), and the position to ask for the
        next page after (0: none). Views are bounded (``_bounded``), so a Run too large for a
        page alone is one an earlier intloom recorded: RESPONSE_TOO_LARGE names it."""
        budget = min(page_bytes, MAX_PAGE)
        views: builtins.list[RunView] = []
        used = last = 0
        position = self._position
        for run_id, slot in self.runs.items():
            at = position[run_id]
            if at <= after or (flow is not None and slot.state.workflow != flow):
                continue
            view = slot.view()
            size = len(_encoder.encode(view))
            if views and used + size > budget:
                return views, last
            if size > MAX_PAGE:
                raise IntloomError(
                    "RESPONSE_TOO_LARGE",
                    f"Run {run_id}'s view is {size:,} bytes, over the {MAX_PAGE:,}-byte limit "
                    "of a reply, so the Runs cannot be listed past it (its request was "
                    "recorded by an intloom without size limits). End it with intloom cancel "
                    f"{run_id}, or answer it; intloom inspect {run_id} reads its journal.",
                )
            views.append(view)
            used += size
            last = at
        return views, 0

    async def answer(self, run_id: str, action_id: str, answer: Any, *,
                     wait: bool = True) -> RunView:
        """Accept an answer (CONFLICT / INVALID_REQUEST otherwise); returns the next stable
        view, or (``wait`` False) the view once the answer is durable."""
        self._admit()
        # An empty id was CONFLICT, "Action  is not (or no longer) ...": a double space.
        # The Run first, as the arguments come (and as _slot refuses it).
        _nonempty(run_id, "run_id", _RUN_ID_WANTED)
        _nonempty(action_id, "action_id", "the id of the action the Run waits on "
                  "(pendingAction.id, ASK-...)")
        await self._refuse_if_ended(run_id, action_id, answer)
        slot = self._slot(run_id)
        action = slot.state.pending_action
        if slot.view().status != "waiting" or action is None or action.id != action_id:
            if self._waiting_on(action_id, slot) is None:  # else that Run's, not an answer
                await self._recall_answers(slot, action_id)
            # Last: what a racing request appended meanwhile is shown (see _caught_up).
            await self._caught_up(slot)
            raise IntloomError("CONFLICT", _not_current(slot, action_id,
                                                        self._waiting_on(action_id, slot),
                                                        answer))
        try:
            typed = validate_answer(action.kind, action.request, answer)
        except IntloomError as exc:
            raise IntloomError(
                exc.code,
                f"The answer to {action_id} of Run {run_id} was refused: {exc.message} Nothing "
                f"was recorded; the Run still waits on it (intloom attach {run_id} shows it).",
            ) from None
        broken = self.journal.broken
        if broken is not None:
            # Taken, it failed its checkpoint and the Run with it (RUN_CHECKPOINT_FAILED),
            # though nothing made that failure new: the journal was known dead.
            raise IntloomError(
                "RUN_CHECKPOINT_FAILED",
                f"The answer to {action_id} of Run {run_id} was not taken: the host's journal "
                f"takes no more checkpoints ({broken}), so it could not be saved. Nothing was "
                "recorded; the Run still waits on it. intloom status names the cause and what "
                "to fix: run intloom stop, fix it, then intloom start, which brings the Run "
                f"back by the restart table (waiting on {action_id} again when its Step has "
                "recover; intloom doctor previews it), and answer it then.",
            )
        # From here to the append nothing awaits: the first valid answer wins.
        now = clock.now()
        plain = _journalable(msgspec.to_builtins(typed), "The answer")
        self.append(slot, Answered(at=now, action_id=action_id, answer=plain))
        slot.last_answer = (action_id, _answer_gist(plain), plain)
        if slot.restored_wait:
            slot.restored_wait = False
            # `answered` is durable before recover sees the answer
            await self._answer_saved(slot, action_id)
            self.driver.launch(slot)  # the driver continues through recover
        else:
            self.append(
                slot, Executing(at=now, stage=slot.state.cursor.stage, step=slot.state.cursor.step)
            )
            await self._answer_saved(slot, action_id)
            slot.deliver(typed)
        return await self.wait_stable(run_id) if wait else slot.view()

    async def _refuse_if_ended(self, run_id: str, action_id: str, answer: Any) -> None:
        """CONFLICT, as for a Run this host holds, for an answer to a Run that ended and is no
        longer held: one that ended before this host started (the retry of an answer whose
        reply a crash took), or ended here long ago. "Not known to this host" said neither
        that the Run had ended nor that the answer had been taken. Returns for any other
        id (NOT_FOUND follows). Only for ids shaped as a Run's; reading fails quietly."""
        state = await self._ended_state(run_id)
        if state is None:
            return
        found: tuple[str, bool | None] | None = None
        if action_id.startswith("ASK-"):
            with contextlib.suppress(Exception):  # the refusal is worded without it
                records = await self.driver.offload(self.journal.history, run_id, state.seq)
                found = next(((_answer_gist(r.answer), _same_answer(answer, r.answer))
                              for r in records
                              if type(r) is Answered and r.action_id == action_id), None)
        raise IntloomError("CONFLICT", _ended_before(state, action_id, found))

    async def _recall_answers(self, slot: RunSlot, action_id: str) -> None:
        """Before a refusal of ``action_id``: when memory cannot tell how it was answered,
        read the answers the Run's journal holds (``slot.recalled``). Memory holds only this
        host's last answer, so the retry of an answer accepted before a crash (its reply
        lost with the host) was told its action was "not (or no longer)" the Run's, and not
        that its answer had been taken. Only for an id shaped as an action's (``ASK-`` and 21
        characters, clock.action_id) that no other Run waits on, once per seq of the Run;
        reading fails quietly (the refusal then says what memory knows)."""
        if (not action_id.startswith("ASK-") or len(action_id) != _ACTION_ID_LENGTH
                or _answered_as(slot, action_id) is not None):
            return
        # What is durable, so the journal reads it back. An answer appended and not yet
        # durable is this host's last one, which memory names (slot.last_answer).
        seq = slot.shown.seq
        if slot.recalled is not None and slot.recalled[0] == seq:
            return
        try:
            records = await self.driver.offload(self.journal.history, slot.run_id, seq)
        except Exception:  # a refusal is worded without it
            return
        slot.recalled = (seq, {record.action_id: (_answer_gist(record.answer), record.answer)
                               for record in records if type(record) is Answered})

    async def _answer_saved(self, slot: RunSlot, action_id: str) -> None:
        """``sync`` for an answer. Its failure is the answerer's to hear in full: the reply
        is the only place that says the answer was lost (the Run's view says only that a
        checkpoint failed), and that the Run's failure is not the answer's doing."""
        await self._saved(slot, lambda where: (
            f"The answer to {action_id} of Run {slot.run_id} could not be saved: the "
            f"checkpoint that held it failed, so it was not delivered and the Run stopped "
            f"(failed/RUN_CHECKPOINT_FAILED); earlier effects are not rolled back.{where} "
            "Check the disk that holds .intloom/runtime (free space, permissions), then "
            "run intloom stop and intloom start: the Run comes back from its last saved "
            f"record by the restart table (waiting on {action_id} again when its Step has "
            "recover), and you answer it again."))

    async def _saved(self, slot: RunSlot, refusal: Callable[[str], str]) -> None:
        """``sync`` for a person's request (an answer, a cancel): a failed checkpoint is
        RUN_CHECKPOINT_FAILED with ``refusal(where)``, ``where`` naming the cause's place."""
        try:
            await self.sync(slot)
        except IntloomError as exc:
            if exc.code != "RUN_CHECKPOINT_FAILED":
                raise
            where = f" {slot.checkpoint_where}" if slot.checkpoint_where else ""
            raise IntloomError("RUN_CHECKPOINT_FAILED", refusal(where)) from None

    async def cancel(self, run_id: str) -> tuple[RunView, bool]:
        """Cancel: failed/RUN_STOPPED. Returns (view, already_ended)."""
        # A stop suspends the Runs as they are: a cancel in its grace would end one the
        # stop's report names as cut, and the host refuses it anyway (Server._dispatch).
        self._admit()
        held = self.held.get(run_id) if run_id not in self.runs else None
        if held is not None:
            return await self._cancel_held(held)
        ended_state = await self._ended_state(run_id)
        if ended_state is not None:  # ended before this host started: the same snapshot
            # A dismissed Run says False, as a repeat on the host that dismissed it does
            # (it said True after a restart, for the same dismissal).
            return plain_view(ended_state), not ended_state.dismissed
        slot = self._slot(run_id)
        if self.journal.failure(run_id) is not None:
            # Nothing more of the Run is written in this process, so no cancel can be: a
            # repeat after a cancel whose checkpoint failed said "The Run has ended; no stop
            # is needed" (the end it holds is in memory only), and the next start brought it
            # back all the same.
            where = f" {slot.checkpoint_where}" if slot.checkpoint_where else ""
            raise IntloomError(
                "RUN_CHECKPOINT_FAILED",
                f"The cancel of Run {run_id} cannot be saved on this host: a checkpoint of the "
                "Run failed, so nothing more of it is written here and its cancel is not on "
                "disk; the next start brings the Run back from its last saved record by the "
                f"restart table.{where} Check the disk that holds .intloom/runtime (free "
                "space, permissions), then run intloom stop and intloom start, and cancel it "
                f"again (intloom cancel {run_id}) at once: a Run that resumes at that start "
                "may run a Step before the cancel comes.")
        # A worker driving the Run appends under this lock: whether the Run has ended and
        # taking it from that worker are decided at once (it may be appending its end).
        with slot.lock:
            view = slot.view()
            ended = slot.state.phase == "terminal"
            live = not ended and view.status not in ("completed", "failed")
            cut = None  # what the cancel leaves in flight, as a restart would name it
            if live:
                slot.owned = False
                if slot.state.effect_in_flight is not None:
                    cut = (f"{restart_verdict(slot.state, has_recover=False).reason}; it is "
                           "not called again")
                else:
                    # A Tool call or on_complete goes on after the cancel (user code is never
                    # stopped mid-call): named as a stop names it, not left to "stopped.".
                    cut = next((what for working, what in self._agent_work.values()
                                if working == run_id),
                               _from_answer(slot.state) or _waited_on(slot.state)
                               or _running(slot.state) or _between(slot.state))
        if ended:
            if slot.shown.phase != "terminal":
                # Another request (a cancel, or the Run's own last Step) appended the end and
                # is making it durable: the view is still the one before it ("waiting",
                # "running"), and a cancel that says the Run has ended must show that end.
                with contextlib.suppress(IntloomError):  # a failed flush: the view says so
                    await self.sync(slot)
                view = slot.view()
            return view, not slot.state.dismissed
        if not live:
            if slot.override is not None and slot.override.code == "RUN_INTERRUPTED":
                # Dismiss: record it so the Run stops coming back; its evidence stays. A
                # restart interrupts every wait on an Agent task, whose Agent may still hold
                # it: remembered as a live cancel's task is.
                self._note_cancelled(slot)
                self.append(
                    slot,
                    Terminal(at=clock.now(), status="failed", error=slot.override, dismissed=True),
                    force=True,
                )
                await self._ended_with(slot, "dismissed", None, self._cancel_saved)
                return slot.view(), False
            return view, True
        # An effect cut in flight may have reached its target: say so, as a stop or a
        # restart does, instead of only "The Run was stopped.".
        error = error_view("RUN_STOPPED") if cut is None else error_view(
            "RUN_STOPPED", f"The Run was stopped while {cut}.")
        self._note_cancelled(slot)
        self.append(
            slot,
            Terminal(at=clock.now(), status="failed", error=error),
            force=True,
        )
        slot.revoke(IntloomError("EXECUTION_OWNERSHIP_LOST"))
        await self._ended_with(slot, "failed", {"code": "RUN_STOPPED"}, self._cancel_saved)
        return slot.view(), False

    def _note_cancelled(self, slot: RunSlot) -> None:
        """Remember the Agent task a cancel (or a dismissal) ends with its Run, before its
        ``terminal`` clears it from the state (``_task_owner``)."""
        task = slot.state.pending_agent_call
        if task is not None:
            self._agent_cancelled[slot.run_id] = task.id

    @staticmethod
    async def _ended_with(slot: RunSlot, event: str, detail: Any,
                          save: Callable[[RunSlot], Awaitable[None]]) -> None:
        """``save(slot)``, the flush that makes the Run's end durable, with ``event`` shown
        in the publish that shows that end. Published after it, it reached no follower:
        their stream ends with the batch holding ``terminal``, and only a later attach saw
        it (in the history, then ``end``)."""
        slot.after_end = (event, detail)
        try:
            await save(slot)
        finally:
            left, slot.after_end = slot.after_end, None
        if left is not None:  # no publish showed the end (none was due): shown on its own
            slot.publish(event, detail)

    async def _cancel_saved(self, slot: RunSlot) -> None:
        """``sync`` for a cancel (or a dismissal): its failure says that the cancel is not on
        disk, so the next start brings the Run back, and what to do."""
        await self._saved(slot, lambda where: (
            f"The cancel of Run {slot.run_id} could not be saved: the checkpoint that held "
            "it failed, so the Run stopped here (failed/RUN_CHECKPOINT_FAILED) but its "
            "cancel is not on disk, and the next start brings the Run back from its last "
            f"saved record by the restart table.{where} Check the disk that holds "
            ".intloom/runtime (free space, permissions), then run intloom stop and "
            f"intloom start, and cancel it again (intloom cancel {slot.run_id})."))

    async def _cancel_held(self, held: HeldRun) -> tuple[RunView, bool]:
        """End a held Run for good: one terminal record appended to its journal, nothing
        rewritten, so no start holds it again (DESIGN §6 keeps its records as they are).
        Only a dismissible one (``HeldRun``); a damaged journal is never written to."""
        run_id = held.run_id
        async with held.lock:
            if held.ended is not None:
                return held.ended, True
            if not held.dismissible or held.state is None:
                raise held.error()
            # Its code may have been cut (mid-effect, mid-Step, or an Agent task claimed):
            # say so, as a cancel of a live Run does; no restart names it once the Run has
            # ended. Only what is interrupted whatever the code declares: a held Run's
            # code (its recover entry) is not loaded.
            verdicts = [restart_verdict(held.state, has_recover=has) for has in (False, True)]
            cut = (f" {verdicts[0].reason}." if all(v.row == "interrupted" for v in verdicts)
                   else "")
            if held.tool_call is not None:
                cut += f" Also, {held.tool_call}."
            record = Terminal(
                at=clock.now(), status="failed",
                error=error_view(
                    "RUN_STOPPED",
                    clip(f"The Run was stopped while it was held, not restored: "
                         f"{held.fact}.{cut}"),
                ),
            )
            try:
                after = apply(held.state, record)
            except IllegalTransition as exc:  # e.g. a journal that ends at its header
                raise IntloomError(
                    "JOURNAL_INCOMPATIBLE",
                    f"Run {run_id} is held, and its journal cannot take a terminal record "
                    f"where it ends ({exc}); it is kept untouched. intloom inspect {run_id} "
                    "shows it.",
                ) from None
            try:
                self.journal.append(run_id, record, after)
                await self.journal.sync(run_id)
            except (CheckpointFailed, OSError) as exc:
                cause = exc.cause if isinstance(exc, CheckpointFailed) else (
                    exc.strerror or str(exc))
                where = self._log_cause(run_id, {"cause": cause, "during": "cancel"}, "held")
                raise IntloomError(
                    "RUN_CHECKPOINT_FAILED",
                    f"Run {run_id}: its cancel could not be written, so it is still held. Its "
                    f"earlier records are unchanged. {where} Fix the disk and retry after a "
                    "restart.",
                ) from None
            held.state = after
            held.ended = to_view(after)
        if self.on_event is not None:
            self.on_event("failed", run_id, {"code": "RUN_STOPPED"}, "failed")
        return held.ended, False

    def subscribe(self, run_id: str) -> AsyncIterator[builtins.list[RunUpdate]]:
        """History so far (an earlier host's too, for a restored Run), then live updates
        until the Run is terminal, in batches."""
        slot = self._slot(run_id)
        if slot.restored_seq is None:
            return slot.follow()
        return slot.follow(functools.partial(self.journal.history, run_id, slot.restored_seq),
                           self.driver.offload)

    async def attach(
        self, run_id: str, sink: Callable[[builtins.list[RunUpdate]], None]
    ) -> tuple[RunSlot, builtins.list[RunUpdate]]:
        """``subscribe``, pushed: ``sink`` gets the updates of each later publish as it runs
        (on the loop), and this returns the history so far (an earlier host's too), to be
        handed on before the caller next awaits. ``slot.detach(sink)`` ends it."""
        slot = self._slot(run_id)
        if slot.restored_seq is not None:
            await slot.seed(functools.partial(self.journal.history, run_id, slot.restored_seq),
                            self.driver.offload)
        return slot, slot.attach(sink)

    # ------------------------------------------------------------------ agent tasks

    async def _caught_up(self, slot: RunSlot) -> None:
        """Before a refusal is worded from the Run's view: make durable, and so shown, what
        another request has appended (a cancel's end, an answer), which the view does not
        show until then. Without it the loser of a race was told of the wait it lost."""
        if slot.shown.seq < slot.state.seq:
            with contextlib.suppress(IntloomError):  # a failed flush: the view says so
                await self.sync(slot)

    async def _agent_slot(self, run_id: str, call_id: str
                          ) -> tuple[RunSlot, PendingAgentCall]:
        slot = await self._agent_run(run_id, call_id)
        _nonempty(call_id, "call_id", "the id of the Run's Agent task (pendingAgentCall.id)")
        call = slot.state.pending_agent_call
        if slot.view().status != "waiting" or call is None or call.id != call_id:
            owner = self._task_owner(call_id)
            if owner is not None and owner != run_id:
                # Told of this Run's own task ("use that one"), the Agent was sent to a task
                # another Agent may hold, when it had only paired its task with a wrong Run.
                raise IntloomError(
                    "CONFLICT", f"Agent task {call_id} is Run {owner}'s task, not Run "
                    f"{run_id}'s; nothing was done. Send the request with run id {owner}.")
            completed = await self._recall_completion(slot, call_id)
            await self._caught_up(slot)
            raise IntloomError("CONFLICT", _not_current_task(slot, slot.view(), call_id,
                                                             completed))
        return slot, call

    async def _recall_completion(self, slot: RunSlot, call_id: str) -> str | None:
        """Before a refusal of ``call_id`` that memory cannot explain (a task of an earlier
        host: its claims and ends are not restored): the outcome the Run's journal records
        for that task's completion, or None. Only for an id shaped as a task's
        (clock.call_id) that this host does not know; reading fails quietly."""
        if (not call_id.startswith("CALL-") or len(call_id) != _CALL_ID_LENGTH
                or call_id in (end.call_id for end in self._agent_ended.values())):
            return None
        try:
            records = await self.driver.offload(self.journal.history, slot.run_id,
                                                slot.shown.seq)
        except Exception:  # a refusal is worded without it
            return None
        return _task_outcome(records, call_id)

    async def _agent_run(self, run_id: str, call_id: str) -> RunSlot:
        """``_slot`` for an Agent's request about task ``call_id``: CONFLICT, as for a Run
        this host holds, when the Run has ended and is no longer held (it ended before this
        host started: the retry of a completion whose reply a crash or a stop took; or it
        ended here long ago), naming the outcome its journal holds for that task's
        completion. "Not known to this host" told an Agent whose work had been recorded that
        its id was wrong."""
        if run_id not in self.runs and run_id not in self.held:
            state = await self._ended_state(run_id)
            if state is not None:
                completed = None
                if call_id.startswith("CALL-") and len(call_id) == _CALL_ID_LENGTH:
                    with contextlib.suppress(Exception):  # the refusal is worded without it
                        completed = _task_outcome(await self.driver.offload(
                            self.journal.history, run_id, state.seq), call_id)
                raise IntloomError("CONFLICT", _task_of_ended(state, call_id, completed))
        return self._slot(run_id)

    def _task_owner(self, call_id: str) -> str | None:
        """The Run whose current or last ended Agent task is ``call_id``, if this host knows it
        (only on a refusal: it looks through every Run)."""
        for rid, slot in self.runs.items():
            call = slot.state.pending_agent_call
            if call is not None and call.id == call_id:
                return rid
        return (next((rid for rid, end in self._agent_ended.items() if end.call_id == call_id),
                     None)
                or next((rid for rid, task in self._agent_cancelled.items() if task == call_id),
                        None))

    def _check_owner(self, slot: RunSlot, owner_token: str) -> None:
        call = slot.state.pending_agent_call
        self._check_owner_of(slot.agent.owner_token, owner_token,
                             call.id if call is not None else None)

    async def claim_agent_call(
        self, run_id: str, call_id: str, claim_id: str
    ) -> tuple[str, PendingAgentCall]:
        self._admit()
        _nonempty(claim_id, "claim_id", "an id the Agent picks for its claim", MAX_AGENT_ID)
        slot, call = await self._agent_slot(run_id, call_id)
        if slot.agent.claim_id is not None:
            if slot.agent.claim_id != claim_id or slot.agent.owner_token is None:
                # No lease ends a claim: an Agent that died with a claim_id nobody knows
                # holds its task for good, and only a cancel frees it.
                raise IntloomError(
                    "CONFLICT", f"Agent task {call_id} is claimed by another claim; a task has "
                    "one claim at a time. Retry with the claim_id that claimed it, or leave "
                    "the task to that Agent; a claim has no lease, so if that Agent is gone "
                    f"for good, intloom cancel {run_id} ends the task with its Run.")
            return slot.agent.owner_token, call
        slot.agent.claim_id = claim_id
        slot.agent.owner_token = secrets.token_urlsafe(32)
        claimed = msgspec.structs.replace(call, phase="claimed")
        self.append(slot, Waiting(at=clock.now(), agent_call=claimed, state=slot.state.stage_state))
        await self.sync(slot)  # publishes the record as the ``claimed`` event (_event_of)
        return slot.agent.owner_token, claimed

    async def call_tool(
        self,
        run_id: str,
        call_id: str,
        owner_token: str,
        tool_call_id: str,
        tool: str,
        input: Any,
    ) -> tuple[Any, bool]:
        self._admit()
        slot, _call = await self._agent_slot(run_id, call_id)
        self._check_owner(slot, owner_token)
        _nonempty(tool_call_id, "tool_call_id", "an id the Agent picks for each Tool call",
                  MAX_AGENT_ID)
        _plain_json(input, f"The input of Tool call {tool_call_id}")
        claim = slot.agent  # this task's: a task ending meanwhile does not touch the next one
        # The same JSON value, whatever its keys' order or its numbers' spelling.
        encoded = _CANONICAL.encode(_one_number_type(input))
        receipt = claim.receipts.get(tool_call_id)
        if receipt is not None:
            if receipt[1] != tool:
                raise IntloomError(
                    "CONFLICT", f"Tool call {tool_call_id} was already made to Tool "
                    f"{receipt[1]!r}, not {tool!r}; use a new id for a new call.")
            if receipt[0] != encoded:
                raise IntloomError(
                    "CONFLICT",
                    f"Tool call {tool_call_id} was already made with other input; use a new id.",
                )
            return receipt[2], True
        step = slot.lw.workflow.stages[slot.state.cursor.stage].steps[slot.state.cursor.step or ""]
        tools = getattr(step, "tools", {})
        if tool not in tools:
            # "declared: []" gave a Python repr and no fix: say what the Agent may call, and
            # where a missing Tool is declared.
            declared = (f"declares {', '.join(repr(name) for name in sorted(tools))}"
                        if tools else "declares no Tools")
            raise IntloomError(
                "INVALID_REQUEST",
                f"Tool {tool!r} is not declared on {step.where}, which {declared}; nothing was "
                "run. An Agent calls only the Tools its task lists (pending_agent_call.tools); "
                "to give it this one, declare it on the Step (tools=[intloom.Tool(name, fn)]).",
            )
        if len(claim.receipts) >= _MAX_RECEIPTS:
            # A limit, not a busy resource: retrying never helps (it was BUSY, retryable).
            raise IntloomError(
                "CONFLICT",
                f"Agent task {call_id} has made {_MAX_RECEIPTS} Tool calls, the most one task "
                f"may make (each keeps its receipt until the task ends); Tool call "
                f"{tool_call_id} was not run. Repeating an earlier call (its tool_call_id and "
                "input) still returns its output; otherwise complete or fail the task.",
            )
        if claim.receipt_bytes >= _MAX_RECEIPT_BYTES:
            raise IntloomError(
                "CONFLICT",
                f"Agent task {call_id} keeps {claim.receipt_bytes / (1 << 20):.1f} MiB of Tool "
                f"call receipts (ids, inputs and outputs), past the "
                f"{_MAX_RECEIPT_BYTES >> 20} MiB one task may keep until it ends; Tool call "
                f"{tool_call_id} was not run. Repeating an earlier call (its tool_call_id and "
                "input) still returns its output; otherwise complete or fail the task, and keep "
                "large data out of Tool call ids, inputs and outputs (pass a path or an id).",
            )
        if claim.tool_running is not None:
            raise IntloomError("BUSY", f"Tool call {claim.tool_running} of this task is "
                               "running; a task runs one Tool call at a time. Retry once it "
                               "has returned.")
        if claim.completing is not None:
            raise IntloomError("BUSY", f"Agent task {call_id} is being completed (its "
                               f"on_complete runs); Tool call {tool_call_id} was not run. Once "
                               "that completion is recorded the task has ended; if on_complete "
                               "refuses it, the task stays claimed and this call can be sent "
                               "again.")
        claim.tool_running = tool_call_id
        # Logged, not journaled (a receipt is not restored): after a kill during the call,
        # the log says which Tool was running, where the restart names only the task.
        ids = {"callId": call_id, "toolCallId": tool_call_id, "tool": tool}
        self._log_tool(slot, "tool_started", ids)
        began = time.monotonic()
        ended = "raised"
        try:
            async with self._agent_working(
                    run_id, f"client Agent task {call_id} was running Tool call {tool_call_id} "
                    f"(Tool {tool!r}) and its outcome is unknown"):
                output = await self._unless_cut(
                    _tool_output(self.driver.call_user(tools[tool].fn, input)),
                    lambda: self._tool_cut(slot, run_id, call_id, tool_call_id, tool))
            returned = json_problem(output)
            if returned is not None:
                # The Agent would get something else (a set as a list, bytes as base64).
                raise IntloomError(
                    "TOOL_EXECUTION_FAILED",
                    clip(f"Tool {tool!r} returned what is not plain JSON data: {returned}. "
                         f"{_RAN_UNKEPT} Return str, numbers, booleans, null, lists and "
                         "objects with string keys."))
            unsendable = wire_problem(output)
            if unsendable is not None:
                # JSON, but not what the reply (msgpack) carries: the Tool returned it, it
                # did not raise (an OverflowError here read as if the Tool had failed).
                raise IntloomError(
                    "TOOL_EXECUTION_FAILED",
                    clip(f"Tool {tool!r} returned what cannot be sent: {unsendable}. "
                         f"{_RAN_UNKEPT} Return large integers as strings and text as valid "
                         "Unicode."))
            sent = len(msgspec.msgpack.encode(output))
            ended = "returned"
        except IntloomError as exc:
            ended = exc.code  # the output refused, or the call cut by a stop
            raise
        except (Exception, asyncio.CancelledError) as exc:
            task = asyncio.current_task()
            if isinstance(exc, asyncio.CancelledError) and (task is None or task.cancelling()):
                ended = "cancelled"
                raise  # this request's own cancellation (its connection gone, a stop)
            if isinstance(exc, _ToolRaised):
                exc = exc.error  # named as the Tool raised it
            # A CancelledError the Tool raised itself: passed on, it ended the request with
            # no reply, as if the host had crashed.
            # No receipt: the Agent must learn that resending the call (as receipts invite)
            # runs the Tool again, after it may have acted; cut so that this is never lost.
            raised = clip(f"Tool {tool!r} raised {user_raised(exc)}", 3600)
            raise IntloomError(
                "TOOL_EXECUTION_FAILED",
                f"{raised.removesuffix('.')}. No receipt was kept, so the same call sent again "
                "runs the Tool again (it may have acted before it raised); to run it once "
                "only, do not send this call again.",
            ) from None
        finally:
            claim.tool_running = None
            self._log_tool(slot, "tool_ended", {
                **ids, "outcome": ended, "ms": round((time.monotonic() - began) * 1000, 1)})
        claim.receipts[tool_call_id] = (encoded, tool, output)
        claim.receipt_bytes += (len(tool_call_id.encode("utf-8", "surrogatepass"))
                                + len(encoded) + sent)
        return output, False

    def _log_tool(self, slot: RunSlot, event: str, fields: dict[str, Any]) -> None:
        if self.on_event is not None:
            self.on_event(event, slot.run_id, fields, slot.view().status)

    async def _unless_cut(self, work: Awaitable[Any],
                          cut: Callable[[], IntloomError]) -> Any:
        """``work``'s result, unless a stop's grace runs out first (``suspend``): ``cut()``
        is raised then, so the caller is told what the stop did (CLI_SERVICE_CLOSING) rather
        than finding its connection closed as the host exits (PROJECT_REQUEST_FAILED, "the
        host may have stopped or crashed")."""
        task = asyncio.ensure_future(work)
        over = asyncio.ensure_future(self._grace_over.wait())
        try:
            await asyncio.wait((task, over), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            self.host_cancelled.add(task)
            task.cancel()
            raise
        finally:
            over.cancel()
        if task.done():
            return task.result()
        # Cut as a Step past the grace is (Driver.drain): an async Tool is cancelled; a sync
        # one's thread cannot be, and its result goes nowhere.
        self.host_cancelled.add(task)
        task.cancel()
        task.add_done_callback(_retrieved)
        raise cut()

    def _tool_cut(self, slot: RunSlot, run_id: str, call_id: str, tool_call_id: str,
                  tool: str) -> IntloomError:
        """What an Agent whose Tool call a stop cut is told, as for an on_complete the stop
        cut (``_stopped_in_on_complete``); CONFLICT, as without a stop, when the Run has
        ended meanwhile (a cancel): the next start does not load it."""
        _ended_meanwhile(slot, call_id)
        halt = _halt(self._suspended_for)
        return IntloomError(
            "CLI_SERVICE_CLOSING",
            f"{halt.lead} while Tool call {tool_call_id} (Tool {tool!r}) of Agent task "
            f"{call_id} ran: the Tool was still running when {halt.grace} ran out, so its "
            f"outcome is unknown and no output is returned. The next start reports Run "
            f"{run_id} RUN_INTERRUPTED (claims, owner tokens and Tool receipts are not "
            f"restored); once it has started, start a new Run for this work.{halt.why}",
        )

    def _on_complete_cut(self, slot: RunSlot, run_id: str, call_id: str, outcome: str
                         ) -> IntloomError:
        """What an Agent whose on_complete a stop cut is told (as for a Tool call); CONFLICT,
        as without a stop, when the Run has ended meanwhile (a cancel)."""
        _ended_meanwhile(slot, call_id)
        return _stopped_in_on_complete(
            run_id, call_id, outcome,
            f"it was still running when {_halt(self._suspended_for).grace} ran out, and ",
            self._suspended_for)

    @contextlib.asynccontextmanager
    async def _agent_working(self, run_id: str, what: str) -> AsyncIterator[None]:
        """Agent work (a Tool call, on_complete) in flight for ``suspend``: ``what`` says,
        in words, what a stop cuts if it is still running at the end of the grace."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._agent_work[done] = (run_id, what)
        try:
            yield
        finally:
            del self._agent_work[done]
            done.set_result(None)

    async def _repeated(self, slot: RunSlot, call_id: str, owner_token: str,
                        end: _AgentEnd) -> RunView | None:
        """The Run's view when this request repeats how ``call_id`` already ended; None when
        the task has not ended; CONFLICT when it ended otherwise."""
        done = self._agent_ended.get(slot.run_id)
        if done is None or done.call_id != call_id:
            return None
        if not hmac.compare_digest(done.owner_token, owner_token):
            # Not "claim_agent_call again for the token": an ended task takes no claim.
            how = (f"failed: {done.shown}" if done.verb == "fail" else
                   f"completed with outcome {done.shown}")
            await self._caught_up(slot)
            raise IntloomError(
                "CONFLICT",
                f"Agent task {call_id} has ended ({how}), and the owner token does not match "
                "the claim that ended it, so this is not that claim's retry; nothing was done. "
                + _not_current_task(slot, slot.view(), call_id))
        if not done.same(end):
            raise IntloomError(
                "CONFLICT",
                f"Agent task {call_id} was already {_ended_as(done, end)}; a retry must "
                "repeat the same request (the first one is what the Run recorded).",
            )
        # The first request's records may still be on their way to disk: answer with what
        # they led to, never with the task they ended.
        view = slot.view()
        while view.status == "running" or (
                view.pending_agent_call is not None and view.pending_agent_call.id == call_id):
            await slot.until_stable()
            view = slot.view()
        return view

    def _check_owner_of(self, token: str | None, owner_token: str,
                        call_id: str | None = None) -> None:
        task = f"Agent task {call_id}" if call_id else "The Agent task"
        if token is None:
            raise IntloomError("CONFLICT", f"{task} is not claimed: claim it first "
                               "(claim_agent_call), then use the owner token the claim returns.")
        if not hmac.compare_digest(token, owner_token):
            raise IntloomError(
                "CONFLICT",
                f"The owner token does not match {task.replace('The A', 'the A')}'s claim; "
                "nothing was done. Use the token its claim returned (claim_agent_call again "
                "with the same claim_id returns it), or, if another Agent holds the claim, "
                "leave the task to it.")

    async def complete_agent_call(
        self, run_id: str, call_id: str, owner_token: str, outcome: str, output: Any
    ) -> RunView:
        self._admit()
        # Checked before anything is appended.
        _plain_json(output, "The Agent task's output")
        _journalable(output, "The Agent task's output")
        slot = await self._agent_run(run_id, call_id)
        # The value, not key order, nor 1.0 against 1 (a Tool call's retry is compared so):
        # an Agent that re-serialises its output retries the same completion.
        end = _AgentEnd(call_id, owner_token, "complete", repr(outcome),
                        hashlib.sha256(_CANONICAL.encode(_one_number_type(output))).digest())
        while True:
            repeated = await self._repeated(slot, call_id, owner_token, end)
            if repeated is not None:
                return repeated
            slot, _call = await self._agent_slot(run_id, call_id)
            self._check_owner(slot, owner_token)
            cursor = slot.state.cursor
            step = slot.lw.workflow.stages[cursor.stage].steps[cursor.step or ""]
            if outcome not in step.routes:
                raise IntloomError(
                    "INVALID_REQUEST",
                    f"Outcome {outcome!r} is not routed by {step.where}; routed: "
                    f"{sorted(step.routes)}. Nothing was recorded: the task stays claimed; "
                    "complete it with one of those outcomes.",
                )
            running = slot.agent.completing
            if not isinstance(running, _UnderWay) or not running.end.same(end):
                break
            # The same completion sent again while the first one's on_complete runs (its
            # reply lost, or its client timed out): it gets what that one leads to, as a
            # retry sent after it does (it was BUSY, to be retried until then).
            await running.settled.wait()
            done = self._agent_ended.get(run_id)
            if self.closing and (done is None or done.call_id != call_id):
                # Not recorded, and the stop lets nothing begin: told as the first one is.
                _ended_meanwhile(slot, call_id)
                raise _stopped_in_on_complete(run_id, call_id, outcome,
                                              reason=self._suspended_for)
        assert isinstance(step, AgentStep)
        _not_under_way(slot, call_id, end)
        _tool_not_running(slot, call_id, "completed")
        under_way = _UnderWay(end)
        slot.agent.completing = under_way
        try:
            await self._complete(slot, step, run_id, call_id, owner_token, outcome, output, end)
        finally:
            # After the completion is recorded (or refused): a request waiting on it then
            # finds the task ended, or still claimed.
            under_way.settled.set()
        return await self.wait_stable(run_id)

    async def _complete(self, slot: RunSlot, step: AgentStep[Any], run_id: str, call_id: str,
                        owner_token: str, outcome: str, output: Any, end: _AgentEnd) -> None:
        """complete_agent_call's on_complete, then its records, durable, and the Run let go
        on from them."""
        cursor = slot.state.cursor
        # Logged, as a Tool call is (not journaled: nothing of on_complete is, until its
        # result): after a kill while it ran, the restart named only the claimed task, not
        # that the Agent had finished and its completion was lost.
        ids = {"callId": call_id, "outcome": clip(outcome, 200)}
        self._log_tool(slot, "completion_started", ids)
        ended = "raised"
        try:
            async with self._agent_working(
                    run_id, f"client Agent task {call_id}'s on_complete was running (outcome "
                    f"{outcome!r}); the completion was not recorded"):
                state = await self._unless_cut(
                    self.driver.absorb(slot, step, AgentResult(outcome, output)),
                    lambda: self._on_complete_cut(slot, run_id, call_id, outcome))
            ended = "returned"
        except IntloomError as exc:
            ended = exc.code
            if not self.closing or exc.code == "CLI_SERVICE_CLOSING":
                raise
            _ended_meanwhile(slot, call_id)
            # Its refusal says the task stays claimed, to be completed again: the stop that
            # came meanwhile drops the claim, so that would send the Agent round for nothing.
            raise _stopped_in_on_complete(
                run_id, call_id, outcome, f"it refused the result ({exc.code}: "
                f"{clip(without_claim_advice(exc.message), 500)}), and ",
                self._suspended_for) from None
        finally:
            slot.agent.completing = None
            if ended == "returned" and self.closing:
                # Returned, but a stopping host records nothing (below): logged as cut, so
                # that the next host names the lost completion, as after a kill. A refusal
                # keeps its code: that result would not have been recorded anyway.
                ended = "CLI_SERVICE_CLOSING"
            if ended != "returned":
                self._log_tool(slot, "completion_ended", {**ids, "ended": ended})
            # Returned: logged once its records are durable (below): a kill before then
            # loses the completion, and the log's start without an end says so.
        # The handler may have taken a while: a cancel or a stop may have come meanwhile.
        if self.closing:
            _ended_meanwhile(slot, call_id)
            # It ran in the stop's grace, but nothing is recorded while the host stops: the
            # stop names it (suspend reads this after the grace), never silently.
            self._agent_dropped.append((run_id, (
                f"client Agent task {call_id}'s on_complete ran (outcome {outcome!r}) while the "
                "host stopped; the completion was not recorded")))
            # The Agent is told the same (it got "no new work", as if nothing had begun).
            raise _stopped_in_on_complete(run_id, call_id, outcome,
                                          reason=self._suspended_for)
        try:
            self._admit()
            slot, _call = await self._agent_slot(run_id, call_id)
            self._check_owner(slot, owner_token)
            now = clock.now()
            result = StepResult(at=now, stage=cursor.stage, step=cursor.step or "",
                                outcome=outcome, state=state, output=output)
            # Measured before the Executing goes in: refused by the journal after it, the Run
            # would wait on a task that no request could complete any more.
            size = len(encode_record(result)) + len(run_id) + 64  # + the frame's own fields
            if size > MAX_RECORD_BYTES:
                raise still_claimed(IntloomError(
                    "STAGE_STATE_INVALID",
                    f"{step.where} on_complete left a State of {len(state or b''):,} bytes as "
                    f"JSON: with the Agent's output, the completion's record is {size:,} bytes "
                    f"encoded, beyond the journal's {MAX_RECORD_BYTES:,} bytes per record. Keep "
                    "the State small: write large data to a file and keep its path.",
                ), f"{step.where} on_complete")
            self.append(slot, Executing(at=now, stage=cursor.stage, step=cursor.step, kind="agent"))
            self.append(slot, result)
            slot.agent = AgentClaim()
            self._agent_ended[run_id] = end
            await self.sync(slot)  # the outcome is durable before routing or reporting
        except BaseException as exc:
            # Refused after on_complete returned (the Run moved on, a record too large), or
            # its records failed: not recorded, and said so in the log.
            self._log_tool(slot, "completion_ended", {
                **ids, "ended": exc.code if isinstance(exc, IntloomError) else "raised"})
            raise
        self._log_tool(slot, "completion_ended", {**ids, "ended": "recorded"})
        self.driver.launch(slot)

    async def fail_agent_call(
        self, run_id: str, call_id: str, owner_token: str, message: str
    ) -> RunView:
        # As complete_agent_call: an Agent giving up its task while the host stops is told
        # the host is stopping, not CONFLICT because the stop suspended the task meanwhile.
        self._admit()
        slot = await self._agent_run(run_id, call_id)
        _nonempty(message, "message", "why the Agent gives the task up")
        end = _AgentEnd(call_id, owner_token, "fail", clip(repr(message), _QUOTED),
                        hashlib.sha256(message.encode("utf-8", "surrogatepass")).digest())
        repeated = await self._repeated(slot, call_id, owner_token, end)
        if repeated is not None:
            return repeated
        slot, _call = await self._agent_slot(run_id, call_id)
        self._check_owner(slot, owner_token)
        _not_under_way(slot, call_id, end)
        _tool_not_running(slot, call_id, "failed")
        cursor = slot.state.cursor
        now = clock.now()
        self.append(slot, Executing(at=now, stage=cursor.stage, step=cursor.step, kind="agent"))
        # Cut to MAX_MESSAGE by append (``_bounded``), with a marker; the log keeps more.
        err = ErrorView(
            code="AGENT_TASK_FAILED",
            message=f"The client Agent failed task {call_id}: {message}",
        )
        self.append(slot, Terminal(at=now, status="failed", error=err))
        slot.agent = AgentClaim()
        self._agent_ended[run_id] = end
        await self._ended_with(slot, "failed", {"code": "AGENT_TASK_FAILED"}, self.sync)
        return slot.view()

    # ------------------------------------------------------------------ lifecycle

    async def suspend(self, grace: float = 10.0,
                      reason: str | None = None) -> builtins.list[tuple[str, str]]:
        """Host stop: Runs stop at their next boundary; checkpoints are kept; nothing is rewritten.

        Steps already running get ``grace`` seconds to reach their boundary; what is still
        running then is abandoned, and the next start reports it RUN_INTERRUPTED. ``reason``
        replaces "The host stopped." in the Runs' views (the host may stay up, e.g. after its
        log failed). Returns those abandoned Runs: (run id, what was running, in words).
        """
        self.closing = True
        self.driver.stopping = True
        self._suspended_for = reason
        # A copy: the loop yields (see _SUSPEND_BATCH), and a Run may be dropped meanwhile.
        for n, slot in enumerate(builtins.list(self.runs.values()), 1):
            if slot.view().status == "waiting":
                slot.suspend(reason)
            if n % _SUSPEND_BATCH == 0:
                await asyncio.sleep(0)
        # Tools and on_complete handlers get the same grace as Steps (they are user code
        # with outside effects too): a stop must not end the process under them unannounced.
        work = builtins.list(self._agent_work)
        pending, _ = await asyncio.gather(
            self.driver.drain(grace),
            asyncio.wait(work, timeout=grace) if work else asyncio.sleep(0))
        cut: builtins.list[tuple[str, str]] = []
        for n, (run_id, slot) in enumerate(builtins.list(self.runs.items()), 1):
            # A task still running may show its Run waiting already (a flush shown ahead
            # of the task's turn): suspended too, so nothing it does reaches the journal.
            if slot.task in pending or slot.view().status == "running":
                # Its task is cancelled after this (Driver.cut), and it was taken from it
                # already (Driver.drain): nothing the Step does with the cancellation
                # reaches the journal.
                slot.suspend(reason)
                what = slot.cut_verdict()
                if what is not None:
                    cut.append((run_id, what))
            if n % _SUSPEND_BATCH == 0:
                await asyncio.sleep(0)
        await self.driver.cut(pending)
        cut.extend(self._agent_dropped)
        # Not a Run that ended (a cancel) while its Tool call or on_complete ran: the next
        # start does not load it, so it does not come back RUN_INTERRUPTED.
        cut.extend(item for item in self._agent_work.values() if not self._ended(item[0]))
        self._grace_over.set()  # after the list: work answered now leaves _agent_work
        return cut

    def _ended(self, run_id: str) -> bool:
        slot = self.runs.get(run_id)
        return slot is not None and slot.shown.phase == "terminal"

    async def outlook(self) -> tuple[builtins.list[tuple[str, Verdict]], int]:
        """After ``suspend``: each suspended Run with what the next start does with it, and
        how many other Runs are unfinished as this host found or left them -- restored as
        RUN_INTERRUPTED and not dismissed, held, or failed by a checkpoint (the next start
        restores that one from its last durable record): it reports each of them again."""
        out: builtins.list[tuple[str, Verdict]] = []
        others = 0
        for n, (run_id, slot) in enumerate(builtins.list(self.runs.items()), 1):
            verdict = slot.outlook()
            if verdict is not None:
                out.append((run_id, verdict))
            elif slot.shown.phase != "terminal":
                # What is durable, not what was appended: a terminal record whose flush
                # failed leaves the Run unfinished on disk, and the next start restores it.
                others += 1
            if n % _SUSPEND_BATCH == 0:
                await asyncio.sleep(0)
        others += sum(1 for held in self.held.values() if held.ended is None)
        return out, others

    def counts(self) -> dict[str, int]:
        out = {"running": 0, "waiting": 0, "completed": 0, "failed": 0}
        for status, n in self._dropped.items():
            out[status] += n
        for slot in self.runs.values():
            out[slot.view().status] += 1
        return out

    def recovery_for(self, slot: RunSlot) -> Recovery:
        state = slot.state
        assert state.answered_action is not None
        action = state.answered_action
        typed = validate_answer(action.kind, action.request, state.answer)
        return Recovery(action=shown_action(action, state.workflow), answer=typed)


def _retrieved(task: asyncio.Future[Any]) -> None:
    """Reads what a Tool left behind after its call was cut: asyncio would otherwise log
    "exception was never retrieved" for it on the host's stderr."""
    if not task.cancelled():
        task.exception()
