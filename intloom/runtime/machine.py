"""The pure Run state machine.

``apply(state, record)`` folds one journal record into a Run's state, refusing any
transition the table forbids. ``restart_verdict`` says which row of the restart table
(DESIGN section 6) applies to a Run whose journal ends where ``state`` stands. Nothing here
touches a file, a socket, a clock or a thread: the executor and the store are the edges.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final, Literal

import msgspec

from intloom.errors import CATALOGUE, ErrorView
from intloom.runtime.model import (
    Cursor,
    EffectRef,
    PendingAgentCall,
    RunStatus,
    RunView,
    WaitingAction,
    shown_action,
)
from intloom.runtime.records import (
    OUTCOME_UNKNOWN,
    PROTOCOL_VERSION,
    Answered,
    EffectDone,
    EffectStarted,
    Executing,
    ExecutingKind,
    Header,
    Record,
    StagePending,
    StepReady,
    StepResult,
    Terminal,
    Waiting,
)

# What a restart drops of a client Agent's task; a refusal that quotes a Run's evidence
# checks for it, so as not to say it twice.
NOT_RESTORED: Final = "claims, owner tokens and Tool receipts are not restored"

__all__ = [
    "ALLOWED",
    "FOLD_FIELDS",
    "FOLD_VERSION",
    "NOT_RESTORED",
    "IllegalTransition",
    "Phase",
    "RestartRow",
    "RunState",
    "Verdict",
    "apply",
    "fold",
    "fold_executing",
    "fold_routed",
    "fold_step_ready",
    "fold_step_result",
    "interrupted_message",
    "newest_version",
    "restart_verdict",
    "to_view",
    "unreadable",
]

Phase = Literal[
    "header",
    "stage_pending",
    "step_ready",
    "executing",
    "effect_started",
    "effect_done",
    "step_result",
    "waiting",
    "answered",
    "terminal",
]

# phase of the last record -> phases that may follow it. Everything else is refused.
ALLOWED: Final[dict[str | None, frozenset[str]]] = {
    None: frozenset({"header"}),
    "header": frozenset({"stage_pending"}),
    "stage_pending": frozenset({"executing", "step_ready", "terminal"}),
    "step_ready": frozenset({"executing", "terminal"}),
    # executing -> executing only for `recover` taking over an answer the Step never acted on.
    "executing": frozenset(
        {"executing", "step_ready", "effect_started", "step_result", "waiting", "terminal"}
    ),
    "effect_started": frozenset({"effect_done", "terminal"}),
    # effect_done -> step_ready only for a Stage initialiser that ran an effect (its State).
    "effect_done": frozenset(
        {"effect_started", "step_ready", "step_result", "waiting", "terminal"}
    ),
    "step_result": frozenset({"step_ready", "stage_pending", "terminal"}),
    "waiting": frozenset({"answered", "waiting", "executing", "terminal"}),
    "answered": frozenset({"executing", "terminal"}),
    "terminal": frozenset(),
}


class IllegalTransition(Exception):
    """A record that may not follow the Run's current phase (a damaged or foreign journal)."""

    def __init__(self, run_id: str, seq: int, previous: str | None, got: str, why: str) -> None:
        self.run_id = run_id
        self.seq = seq
        self.previous = previous
        self.got = got
        self.why = why
        super().__init__(
            f"Run {run_id or '?'}: record {seq} ({got}) cannot follow "
            f"{previous or 'the start of the journal'}: {why}"
        )


# The fold's version, written in every snapshot (``Snapshot.fold``): raised whenever ``apply``
# comes to derive a field a snapshot of the version before lacks and a restart decides by.
# A snapshot an older fold wrote says that field's default where the records say otherwise
# (a recover that had called an effect, read as one that had not: run again, it called the
# effect twice), so a reader folds that Run again from its records.
FOLD_VERSION: Final = 1
# The fields of RunState that each fold version added: a snapshot of an older fold lacks
# them (read as their defaults), and so may differ from the log's fold in them alone.
FOLD_FIELDS: Final[dict[int, tuple[str, ...]]] = {
    # Before snapshots said their fold (2026-12-05): recover_resumed and recover_effect
    # (2026-12-02), last_effect_unknown (2026-12-04).
    1: ("recover_resumed", "recover_effect", "last_effect_unknown"),
}


class RunState(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """Everything the journal says about one Run, as of its last applied record."""

    run_id: str
    workflow: str
    workflow_version: str
    identity: str
    schemas: dict[str, str]
    intent: str
    format: int
    package_version: str
    protocol: str
    created_at: str
    updated_at: str
    phase: str
    seq: int
    cursor: Cursor
    status: RunStatus = "running"
    executing_kind: str | None = None
    stage_state: bytes | None = None
    outcome: str | None = None
    output: Any = None
    pending_action: WaitingAction | None = None
    pending_agent_call: PendingAgentCall | None = None
    answered_action: WaitingAction | None = None
    answer: Any = None
    effect_in_flight: EffectRef | None = None
    last_effect: EffectRef | None = None
    # The last effect was cancelled before it returned (its effect_done says its outcome is
    # unknown): what it set going may have run on. Added 2026-12-04, left out when False, so
    # a snapshot without it reads as before.
    last_effect_unknown: bool = False
    last_error: ErrorView | None = None
    dismissed: bool = False
    # recover waited and goes on after its answer in the same host: that answer's
    # ``executing`` says "step" (the code that waited resumes), and is recover's.
    recover_resumed: bool = False
    # The last effect the running recover entry started, kept across its waits: a restart
    # that continued such a wait would run recover again from its start, and call it again.
    recover_effect: EffectRef | None = None


# The folds of a Step's three records (step_ready, executing, step_result) build the next
# state positionally, in this order, RunState's own: ``msgspec.structs.replace`` looks every
# one of its 30 fields up in a dict of the keywords, ~2.2k instructions more per record
# (callgrind; the constructor's keywords cost more still). A field added to RunState must be
# added there too: this check refuses the import until it is.
_STEP_FIELDS: Final = (
    "run_id", "workflow", "workflow_version", "identity", "schemas", "intent", "format",
    "package_version", "protocol", "created_at", "updated_at", "phase", "seq", "cursor",
    "status", "executing_kind", "stage_state", "outcome", "output", "pending_action",
    "pending_agent_call", "answered_action", "answer", "effect_in_flight", "last_effect",
    "last_effect_unknown", "last_error", "dismissed", "recover_resumed", "recover_effect",
)
if RunState.__struct_fields__ != _STEP_FIELDS:
    raise RuntimeError("RunState's fields changed: update _STEP_FIELDS and the positional "
                       "folds of step_ready, executing and step_result in runtime/machine.py")


def _illegal(state: RunState | None, record: Record, why: str) -> IllegalTransition:
    return IllegalTransition(
        state.run_id if state else "",
        (state.seq + 1) if state else 1,
        state.phase if state else None,
        _phase_of(record),
        why,
    )


def _phase_of(record: Record) -> str:
    return type(record).__struct_config__.tag  # type: ignore[return-value]


def apply(state: RunState | None, record: Record) -> RunState:
    """Fold one record into the Run's state; raise IllegalTransition when the table forbids it.

    Each fold passes its fields to ``msgspec.structs.replace`` as plain keywords: merging a
    dict of common fields in (``**base``) made every record ~1 µs slower.
    """
    try:
        fold_one = _FOLD[type(record)]
    except KeyError:
        raise TypeError(f"not a journal record: {type(record).__name__}") from None
    if state is None:  # ALLOWED[None] admits only a header
        if type(record) is not Header:
            raise _illegal(state, record, _FORBIDDEN)
        return _apply_header(record)
    return fold_one(state, record)


# Each fold refuses first a record that may not follow the Run's phase (ALLOWED, read the
# other way round: the phases a record of that kind may follow, one set lookup), so that a
# caller that knows the record's kind (the executor, three records per Step) may call its
# fold (``fold_step_ready``, ``fold_executing``, ``fold_step_result``) for ``apply``: the
# same checks, without apply's frame, table lookup and None test (callgrind, 64 async Runs:
# 114.9-115.1k -> 112.5-112.9k instructions per Step, two pairs).
_FORBIDDEN: Final = "the transition table forbids it"


def _after(phase: str) -> frozenset[str]:
    """The phases a record of ``phase`` may follow."""
    return frozenset(previous for previous, then in ALLOWED.items()
                     if previous is not None and phase in then)


def _apply_header(record: Header) -> RunState:
    return RunState(
        run_id=record.run_id,
        workflow=record.workflow,
        workflow_version=record.workflow_version,
        identity=record.identity,
        schemas=dict(record.schemas),
        intent=record.intent,
        format=record.format,
        package_version=record.package_version,
        protocol=record.protocol,
        created_at=record.at,
        updated_at=record.at,
        phase="header",
        seq=1,
        cursor=Cursor(stage=""),
    )


_AFTER_STAGE_PENDING: Final = _after("stage_pending")


def _apply_stage_pending(state: RunState, record: StagePending) -> RunState:
    if state.phase not in _AFTER_STAGE_PENDING:
        raise _illegal(state, record, _FORBIDDEN)
    return msgspec.structs.replace(
        state,
        phase="stage_pending", seq=state.seq + 1, updated_at=record.at,
        cursor=Cursor(stage=record.stage),
        status="running",
        executing_kind=None,
        recover_resumed=False,
        recover_effect=None,
        stage_state=None,
        outcome=None,
        output=None,
        answered_action=None,
        answer=None,
        effect_in_flight=None,
    )


_AFTER_STEP_READY: Final = _after("step_ready")


def fold_step_ready(state: RunState, record: StepReady) -> RunState:
    """``apply(state, record)`` for a step_ready record."""
    if state.phase not in _AFTER_STEP_READY:
        raise _illegal(state, record, _FORBIDDEN)
    if state.phase in ("executing", "effect_done") and state.executing_kind != "init":
        raise _illegal(state, record, "only a Stage initialiser ends in step_ready")
    if record.stage != state.cursor.stage:
        raise _illegal(state, record, f"the Run is in Stage {state.cursor.stage!r}")
    # msgspec.structs.replace(state, phase="step_ready", seq=seq, updated_at=record.at,
    # cursor=Cursor(stage=record.stage, step=record.step), status="running",
    # executing_kind=None, recover_resumed=False, recover_effect=None,
    # stage_state=record.state, outcome=None, output=None, answered_action=None, answer=None),
    # built positionally (``_STEP_FIELDS``).
    return RunState(
        state.run_id, state.workflow, state.workflow_version, state.identity, state.schemas,
        state.intent, state.format, state.package_version, state.protocol, state.created_at,
        record.at, "step_ready", state.seq + 1, Cursor(stage=record.stage, step=record.step),
        "running", None, record.state, None, None, state.pending_action, state.pending_agent_call,
        None, None, state.effect_in_flight, state.last_effect, state.last_effect_unknown,
        state.last_error, state.dismissed, False, None,
    )


_AFTER_EFFECT_STARTED: Final = _after("effect_started")


def _apply_effect_started(state: RunState, record: EffectStarted) -> RunState:
    if state.phase not in _AFTER_EFFECT_STARTED:
        raise _illegal(state, record, _FORBIDDEN)
    if state.executing_kind not in ("step", "recover", "init"):
        raise _illegal(state, record, "effects run only inside user code")
    ref = EffectRef(name=record.name, key=record.key, started_at=record.at)
    return msgspec.structs.replace(
        state, phase="effect_started", seq=state.seq + 1, updated_at=record.at,
        effect_in_flight=ref,
        recover_effect=ref if state.executing_kind == "recover" else state.recover_effect)


_AFTER_EFFECT_DONE: Final = _after("effect_done")


def _apply_effect_done(state: RunState, record: EffectDone) -> RunState:
    if state.phase not in _AFTER_EFFECT_DONE:
        raise _illegal(state, record, _FORBIDDEN)
    open_ref = state.effect_in_flight
    if open_ref is None or (open_ref.name, open_ref.key) != (record.name, record.key):
        raise _illegal(state, record, "it does not close the effect that was started")
    unknown = not record.ok and (record.error or "").endswith(OUTCOME_UNKNOWN)
    return msgspec.structs.replace(state, phase="effect_done", seq=state.seq + 1,
                                   updated_at=record.at,
                                   effect_in_flight=None, last_effect=open_ref,
                                   last_effect_unknown=unknown)


_AFTER_STEP_RESULT: Final = _after("step_result")


def fold_step_result(state: RunState, record: StepResult) -> RunState:
    """``apply(state, record)`` for a step_result record."""
    if state.phase not in _AFTER_STEP_RESULT:
        raise _illegal(state, record, _FORBIDDEN)
    if state.executing_kind not in ("step", "recover", "agent"):
        raise _illegal(state, record, "a Stage initialiser has no outcome")
    # The Run's cursor when it does not move (as it does not, after a Step's executing), a
    # new one otherwise: tested here, not by a function of its own (a frame each in two of
    # a Step's three folds; callgrind, 64 async Runs: 112.7-112.8k -> 111.8-111.9k).
    cursor = state.cursor
    if cursor.stage != record.stage or cursor.step != record.step:
        cursor = Cursor(stage=record.stage, step=record.step)
    # msgspec.structs.replace(state, phase="step_result", seq=seq, updated_at=record.at,
    # cursor=cursor, status="running",
    # executing_kind=None, recover_resumed=False, recover_effect=None,
    # stage_state=record.state, outcome=record.outcome, output=record.output,
    # pending_action=None, pending_agent_call=None, answered_action=None, answer=None,
    # effect_in_flight=None), built positionally (``_STEP_FIELDS``).
    return RunState(
        state.run_id, state.workflow, state.workflow_version, state.identity, state.schemas,
        state.intent, state.format, state.package_version, state.protocol, state.created_at,
        record.at, "step_result", state.seq + 1, cursor, "running", None, record.state,
        record.outcome, record.output, None, None, None, None, None, state.last_effect,
        state.last_effect_unknown, state.last_error, state.dismissed, False, None,
    )


# A Step's outcome routed to the next Step of its Stage, whose executing may follow at once:
# each always may follow the one before (checked here, once).
if not ("step_result" in _after("step_ready") and "step_ready" in _after("executing")):
    raise RuntimeError("ALLOWED changed: fold_routed folds step_result, step_ready and "
                       "executing in a row")


def fold_routed(state: RunState, result: StepResult, ready: StepReady,
                executing: Executing | None) -> RunState:
    """``fold_step_result``, then ``fold_step_ready`` onto that, then (when given)
    ``fold_executing`` onto that: the state after the last, without the states between (two
    fewer built per Step of a chain; callgrind, 64 async Runs: ~3.5k fewer instructions per
    Step). Raises as those would; anything but the chain's usual shape (the same Stage, the
    executing of the Step made ready, a Step's) is folded one record at a time."""
    if (result.stage != ready.stage or state.phase not in _AFTER_STEP_RESULT
            or state.executing_kind not in ("step", "recover", "agent")
            or (executing is not None
                and (executing.kind != "step" or executing.stage != ready.stage
                     or executing.step != ready.step))):
        state = fold_step_ready(fold_step_result(state, result), ready)
        return state if executing is None else fold_executing(state, executing)
    # fold_step_result, fold_step_ready and fold_executing above, their fields taken through:
    # nothing of the step_result outlives the step_ready, which clears what it set.
    if executing is None:
        at, phase, seq, kind = ready.at, "step_ready", state.seq + 2, None
    else:
        at, phase, seq, kind = executing.at, "executing", state.seq + 3, "step"
    return RunState(
        state.run_id, state.workflow, state.workflow_version, state.identity, state.schemas,
        state.intent, state.format, state.package_version, state.protocol, state.created_at,
        at, phase, seq, Cursor(stage=ready.stage, step=ready.step), "running", kind,
        ready.state, None, None, None, None, None, None, None, state.last_effect,
        state.last_effect_unknown, state.last_error, state.dismissed, False, None,
    )


_AFTER_ANSWERED: Final = _after("answered")


def _apply_answered(state: RunState, record: Answered) -> RunState:
    if state.phase not in _AFTER_ANSWERED:
        raise _illegal(state, record, _FORBIDDEN)
    action = state.pending_action
    if action is None or action.id != record.action_id:
        raise _illegal(state, record, "it answers an action the Run is not waiting on")
    return msgspec.structs.replace(
        state,
        phase="answered", seq=state.seq + 1, updated_at=record.at,
        status="running",
        pending_action=None,
        answered_action=action,
        answer=record.answer,
        last_effect=None,  # from here on, an effect means the answer was acted on
        last_effect_unknown=False,
    )


_AFTER_TERMINAL: Final = _after("terminal")


def _apply_terminal(state: RunState, record: Terminal) -> RunState:
    if state.phase not in _AFTER_TERMINAL:
        raise _illegal(state, record, _FORBIDDEN)
    if record.status == "failed" and record.error is None:
        raise _illegal(state, record, "a failed Run must carry its error")
    return msgspec.structs.replace(
        state,
        phase="terminal", seq=state.seq + 1, updated_at=record.at,
        status=record.status,
        pending_action=None,
        pending_agent_call=None,
        last_error=record.error,
        dismissed=record.dismissed,
    )


# What each kind of user code may start after.
_EXECUTES_AFTER: Final[dict[str, tuple[str, ...]]] = {
    "init": ("stage_pending",),
    "step": ("step_ready",),
    "recover": ("answered",),
    "agent": ("waiting",),
}


_AFTER_EXECUTING: Final = _after("executing")


def fold_executing(state: RunState, record: Executing) -> RunState:
    """``apply(state, record)`` for an executing record."""
    if state.phase not in _AFTER_EXECUTING:
        raise _illegal(state, record, _FORBIDDEN)
    kind: ExecutingKind = record.kind
    if state.phase not in _EXECUTES_AFTER[kind] and not (
        (kind == "step" and state.phase == "answered")
        or (kind == "recover" and _answer_untouched(state))
    ):
        raise _illegal(state, record, f"{kind} cannot start after {state.phase}")
    if state.phase == "waiting" and state.pending_agent_call is None:
        raise _illegal(state, record, "only an Agent task resumes from a wait")
    cursor = state.cursor
    if record.stage != cursor.stage:
        raise _illegal(state, record, f"the Run is in Stage {cursor.stage!r}")
    if cursor.step != record.step:  # as in fold_step_result (the stage is the cursor's)
        cursor = Cursor(stage=record.stage, step=record.step)
    resumed = kind == "step" and state.phase == "answered" and state.executing_kind == "recover"
    # msgspec.structs.replace(state, phase="executing", seq=seq, updated_at=record.at,
    # cursor=cursor, status="running",
    # executing_kind="recover" if resumed else kind, recover_resumed=resumed,
    # recover_effect=state.recover_effect if resumed else None,
    # pending_agent_call=None if kind == "agent" else state.pending_agent_call),
    # built positionally (``_STEP_FIELDS``).
    return RunState(
        state.run_id, state.workflow, state.workflow_version, state.identity, state.schemas,
        state.intent, state.format, state.package_version, state.protocol, state.created_at,
        record.at, "executing", state.seq + 1, cursor, "running", "recover" if resumed else kind,
        state.stage_state, state.outcome, state.output,
        state.pending_action, None if kind == "agent" else state.pending_agent_call,
        state.answered_action, state.answer, state.effect_in_flight, state.last_effect,
        state.last_effect_unknown, state.last_error, state.dismissed, resumed,
        state.recover_effect if resumed else None,
    )


_AFTER_WAITING: Final = _after("waiting")


def _apply_waiting(state: RunState, record: Waiting) -> RunState:
    if state.phase not in _AFTER_WAITING:
        raise _illegal(state, record, _FORBIDDEN)
    if (record.action is None) == (record.agent_call is None):
        raise _illegal(state, record, "a wait carries exactly one action or Agent task")
    if state.phase == "waiting":
        # Only an Agent task changes phase (available -> claimed) while it waits.
        if state.pending_agent_call is None or record.agent_call is None:
            raise _illegal(state, record, "only an Agent task is re-published while waiting")
    elif state.executing_kind not in ("step", "recover"):
        raise _illegal(state, record, "only a running Step may wait")
    if record.action is not None and (
        record.action.cursor.stage != state.cursor.stage
        or record.action.cursor.step != state.cursor.step
    ):
        raise _illegal(state, record, "the action's cursor is not the Run's cursor")
    return msgspec.structs.replace(
        state,
        phase="waiting", seq=state.seq + 1, updated_at=record.at,
        status="waiting",
        pending_action=record.action,
        pending_agent_call=record.agent_call,
        stage_state=record.state if record.state is not None else state.stage_state,
    )


def _header_not_first(state: RunState, record: Header) -> RunState:
    raise _illegal(state, record, _FORBIDDEN)  # ALLOWED admits a header first only


# One fold per record type: a lookup instead of a chain of isinstance tests (this runs for
# every record a host appends and every record a restore reads).
_FOLD: Final[dict[type, Callable[[RunState, Any], RunState]]] = {
    Header: _header_not_first,
    StagePending: _apply_stage_pending,
    StepReady: fold_step_ready,
    Executing: fold_executing,
    EffectStarted: _apply_effect_started,
    EffectDone: _apply_effect_done,
    StepResult: fold_step_result,
    Waiting: _apply_waiting,
    Answered: _apply_answered,
    Terminal: _apply_terminal,
}


def _answer_untouched(state: RunState) -> bool:
    """The Step (or a recover that waited) resumed after an accepted answer and has not
    acted on it durably yet: its journal ends at ``executing`` with the answer saved and no
    effect since. A recover that a restart started with the answer is not: it is not run
    again."""
    return (
        state.phase == "executing"
        and (state.executing_kind == "step" or state.recover_resumed)
        and state.answered_action is not None
        and state.effect_in_flight is None
        and state.last_effect is None
    )


def fold(records: list[Record], start: RunState | None = None) -> RunState | None:
    """Fold records in order; the state after the last one."""
    state = start
    for record in records:
        state = apply(state, record)
    return state


# ---------------------------------------------------------------------------------------
# The restart table.

RestartRow = Literal[
    "resume",  # stage_pending / step_ready: resume from that boundary
    "route",  # step_result: apply routing with the saved outcome
    "restore_wait",  # waiting on a person, Code has recover: the same wait again
    "recover",  # answered, Code has recover: call recover with the saved answer
    "interrupted",  # anything whose outcome is uncertain: RUN_INTERRUPTED
    "terminal",  # kept for inspect, never loaded
]


class Verdict(msgspec.Struct, frozen=True, omit_defaults=True):
    """Which row of the restart table applies, and why, in words a user can act on."""

    row: RestartRow
    reason: str
    effect: EffectRef | None = None


def restart_verdict(state: RunState, has_recover: bool) -> Verdict:
    """The row of DESIGN section 6 for a Run whose journal ends at ``state``.

    ``has_recover`` says whether the Code at the Run's cursor declares a ``recover`` entry.
    """
    phase = state.phase
    where = _where(state.cursor)
    if phase == "terminal":
        if state.dismissed:
            return Verdict("terminal", "the Run was interrupted earlier and then dismissed")
        return Verdict("terminal", f"the Run ended {state.status}; kept for inspect only")
    if phase == "header":
        return Verdict("resume", "safe boundary: the Run was created and enters its first Stage")
    if phase == "stage_pending":
        return Verdict("resume", f"safe boundary: entering {where}")
    if phase == "step_ready":
        return Verdict("resume", f"safe boundary: {where} is ready to run")
    if phase == "step_result":
        return Verdict(
            "route", f"{where} finished with outcome {state.outcome!r}; routing resumes"
        )
    if phase in ("waiting", "answered") and state.pending_agent_call is not None:
        call = state.pending_agent_call
        return Verdict(
            "interrupted",
            f"{where} waits on client Agent task {call.id} ({call.phase}); {NOT_RESTORED}",
        )
    repeated = _recover_would_repeat(state)
    if phase == "waiting":
        assert state.pending_action is not None
        action = state.pending_action
        if repeated is not None:
            return Verdict("interrupted", f"the recover entry of {where} waits on "
                           f"{action.kind} {action.id} after it ran {repeated}")
        if has_recover:
            return Verdict(
                "restore_wait", f"{where} waits on {action.kind} {action.id}; the wait is restored"
            )
        return Verdict(
            "interrupted",
            f"{where} waits on {action.kind} {action.id} but its Step has no recover entry",
        )
    if phase == "answered" or _answer_untouched(state):
        action_id = state.answered_action.id if state.answered_action else "?"
        if repeated is not None:
            return Verdict("interrupted", f"the answer to {action_id} was accepted, but the "
                           f"recover entry of {where} had asked it after it ran {repeated}")
        if has_recover:
            if phase == "executing":
                # The answer may have reached the Step (its executing is written with the
                # answer, before the delivery): whatever ran after the await recorded no
                # effect, and is not run again. Said so: "the answer was accepted" alone
                # read as if nothing could have run since.
                who = ("the Step" if state.executing_kind == "step" else
                       "the recover entry that asked it")
                return Verdict("recover", f"the answer to {action_id} was accepted; any code "
                               f"{who} ran after it recorded no effect and is not run again; "
                               f"{where} continues in recover")
            return Verdict(
                "recover", f"the answer to {action_id} was accepted; {where} continues in recover"
            )
        return Verdict(
            "interrupted",
            f"the answer to {action_id} was accepted but {where} has no recover entry",
        )
    # executing, effect_started, effect_done: user code was running.
    kind = state.executing_kind or "step"
    if kind == "agent" and phase == "executing":
        # The first of a completion's two records (executing kind=agent, then its
        # step_result or terminal), flushed together: only a torn batch ends here. The
        # Step's code was not running; the Agent's completion was being recorded.
        return Verdict("interrupted", f"the completion of the client Agent task of {where} "
                       "was being recorded when the host went, and was not: the Agent's work "
                       "is lost (its Tools ran, once each)")
    # ``where`` already names the Step ("Step a/b") or the Stage ("Stage 'a'"): only the
    # initialiser and the recover entry need saying which part of it was running -- also of
    # an effect in flight, which its reader looks for in that code, not in the Step's.
    what = {"init": f"the initialiser of {where}",
            "recover": f"the recover entry of {where}"}.get(kind, where)
    if state.effect_in_flight is not None:
        eff = state.effect_in_flight
        return Verdict(
            "interrupted",
            f"{what} was running effect {eff.name!r} (key {eff.key!r}, started {eff.started_at}) "
            "and its outcome is unknown",
            effect=eff,
        )
    done = state.last_effect if phase == "effect_done" else None
    if done is not None and state.last_effect_unknown:
        # "no effect was in flight" was said of an effect its Step cancelled (a timeout)
        # while the call it handed to a thread ran on: the journal proves no such thing.
        return Verdict("interrupted", f"{what} was running after its effect {done.name!r} "
                       f"(key {done.key!r}) was cancelled before it returned, so its outcome "
                       "is unknown: what it had set going (a call handed to a thread, say) "
                       "may have run on (intloom inspect shows its record)", effect=done)
    if done is not None:
        return Verdict("interrupted", f"{what} was running after its effect {done.name!r} "
                       f"(key {done.key!r}) ended, its end recorded (intloom inspect shows "
                       "how); no effect was in flight")
    return Verdict("interrupted", f"{what} was running; no effect was in flight")


def _recover_would_repeat(state: RunState) -> str | None:
    """Why a wait of the recover entry (or its answer) cannot be continued, or None: the
    original coroutine is gone, so only recover run again from its start could continue it,
    and that would call the effect it recorded before asking again (DESIGN section 6: no
    replay)."""
    eff = state.recover_effect
    if eff is None:
        return None
    return (f"effect {eff.name!r} (key {eff.key!r}, started {eff.started_at}): recover would "
            "run again from its start and call it again")


def interrupted_message(state: RunState, also: str | None = None) -> str:
    """The RUN_INTERRUPTED message for a Run restored from ``state``: names the effect, if any.
    ``also``: what else is known of what was in flight (a Tool call, from a host log)."""
    default = CATALOGUE["RUN_INTERRUPTED"][0]
    verdict = restart_verdict(state, has_recover=False)
    more = f"; {also}" if also else ""
    return f"{default} Evidence: {verdict.reason}{more}."


def _where(cursor: Cursor) -> str:
    if cursor.step is None:
        return f"Stage {cursor.stage!r}"
    return f"Step {cursor.stage}/{cursor.step}"


def to_view(state: RunState, *, status: RunStatus | None = None,
            last_error: ErrorView | None = None) -> RunView:
    """The public view of a Run; the executor may override status/error for in-memory facts."""
    final_status = status or state.status
    return RunView(
        run_id=state.run_id,
        flow_name=state.workflow,
        cursor=state.cursor,
        status=final_status,
        created_at=state.created_at,
        updated_at=state.updated_at,
        pending_action=(shown_action(state.pending_action, state.workflow)
                        if final_status == "waiting" and state.pending_action is not None
                        else None),
        pending_agent_call=state.pending_agent_call if final_status == "waiting" else None,
        last_error=last_error or state.last_error,
        phase=state.phase,
        workflow_version=state.workflow_version,
    )


# Where a version's suffix puts it against its release, as pip orders them (PEP 440): a dev
# build or pre-release before it, a post-release after it. Longer tags first ("rc" before "r").
_SUFFIX_RANKS: Final = (("dev", 0), ("alpha", 1), ("a", 1), ("beta", 2), ("b", 2), ("rc", 3),
                        ("c", 3), ("pre", 3), ("post", 5), ("rev", 5), ("r", 5))
_RELEASE_RANK: Final = 4


def _leading_int(text: str) -> tuple[int, int]:
    """The ASCII number ``text`` starts with (0 for none) and how many characters it took."""
    end = 0
    while end < len(text) and "0" <= text[end] <= "9":
        end += 1
    return (int(text[:end]) if end else 0), end


def _version_key(v: str) -> tuple[tuple[int, ...], int, int]:
    """An intloom version in pip's order, for the checks that matter here: release numbers
    (trailing zeros dropped, so 1.0 is 1.0.0), then a pre-release, dev or post suffix. The
    digits of every piece were read as one number before, so 1.0.0rc1 was 1.0.1: newer than
    the 1.0.0 that follows it, whose host then held every Run the candidate wrote."""
    text = v.strip().lower().removeprefix("v").split("+", 1)[0]  # +local: same release
    numbers: list[int] = []
    while True:
        number, used = _leading_int(text)
        if not used:
            break
        numbers.append(number)
        text = text[used:]
        if not (text.startswith(".") and _leading_int(text[1:])[1]):
            break
        text = text[1:]
    while numbers and numbers[-1] == 0:
        numbers.pop()
    rest = text.lstrip(".-_")
    for tag, rank in _SUFFIX_RANKS:
        if rest.startswith(tag):
            return tuple(numbers), rank, _leading_int(rest[len(tag):].lstrip(".-_"))[0]
    return tuple(numbers), _RELEASE_RANK, 0


def unreadable(state: RunState, package_version: str, written_by: str = "") -> str | None:
    """Why this intloom (``package_version``) cannot take the journal's records as they
    are, or None. The host's restore and doctor's preview both ask it. ``written_by``: the
    newest intloom that wrote a segment holding any of the Run's records (their headers
    say), when the store read one (``RunJournal.written_by``)."""
    if state.protocol != PROTOCOL_VERSION:
        # Which side is newer decides the fix: "journal has X, this intloom speaks Y" left a
        # user to guess whether to upgrade or to go back to the intloom that wrote it.
        writer = (f"intloom {state.package_version}" if state.package_version
                  else "another intloom")
        said = (f"incompatible protocol: written by {writer} with Workflow protocol "
                f"{state.protocol}, {{}} than this intloom's {PROTOCOL_VERSION} "
                f"({package_version})")
        if state.protocol > PROTOCOL_VERSION:  # dates, YYYY-MM-DD
            return f"{said.format('newer')}; upgrade intloom"
        return (f"{said.format('older')}, which no longer runs it; continue or end the Run "
                f"with {writer}")
    if state.package_version and _version_key(state.package_version) > _version_key(
        package_version
    ):
        return (
            f"incompatible package: written by intloom {state.package_version}, newer than "
            f"this {package_version}; upgrade intloom"
        )
    if written_by and _version_key(written_by) > _version_key(package_version):
        # Begun by this intloom or an older one, then continued by a newer one (a downgrade
        # since): its header says only who began it, and the later records, whatever they
        # came to mean, were taken as this intloom's own.
        return (
            f"incompatible package: begun by intloom {state.package_version or 'an older one'}"
            f", continued by intloom {written_by}, newer than this {package_version}; upgrade "
            "intloom"
        )
    return None


def newest_version(versions: Iterable[str]) -> str:
    """The newest of ``versions`` in pip's order ("" for none)."""
    return max(versions, key=_version_key, default="")
