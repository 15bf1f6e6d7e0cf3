"""Journal records: one per durable boundary of a Run (DESIGN section 5).

A Run's journal is a ``Header`` followed by these records, in order. Records are the
engine's events: :func:`intloom.runtime.machine.apply` folds them into a
:class:`~intloom.runtime.machine.RunState`. Stage State travels as the exact JSON bytes the
State encoded to, so a restore can re-decode them with today's schema and compare.

Fields are only ever added with defaults; a tag is never reused for another meaning.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Literal

import msgspec

from intloom.errors import ErrorView
from intloom.runtime.model import PendingAgentCall, WaitingAction

__all__ = [
    "FORMAT1_FORMAT",
    "FORMAT1_PROTOCOL",
    "FORMAT_VERSION",
    "OUTCOME_UNKNOWN",
    "PROTOCOL_VERSION",
    "Answered",
    "EffectDone",
    "EffectStarted",
    "Executing",
    "ExecutingKind",
    "Header",
    "Record",
    "StagePending",
    "StepReady",
    "StepResult",
    "Terminal",
    "Waiting",
    "decode_record",
    "encode_record",
]

# The on-disk journal format. Bump on any change a reader of the old version would
# misread; docs/format.md and CHANGELOG.md say what changed.
FORMAT_VERSION: Final = 1
# The Workflow protocol version, hashed into every Workflow identity. Raise it (a date) with
# any change of what Workflow code receives or may return (``StepContext``, ``Recovery``,
# ``AgentResult``, answers' shapes): a Run begun under the old one is then held, not handed
# values its code does not expect. 2026-12-03's ``Recovery.action.kind`` values did not
# raise it (CHANGELOG, "Socket protocol 2").
PROTOCOL_VERSION: Final = "2026-11-30"
# What a format-1 header record that leaves out ``format`` or ``protocol`` (the writer omits a
# field at its default) was written with: format 1's, fixed when it was defined. Tied to the
# two above, an intloom that bumped the protocol read every Run written before as of its own
# protocol, and held it as a changed Workflow (or its journal as corrupt) rather than as
# another intloom's.
FORMAT1_FORMAT: Final = 1
FORMAT1_PROTOCOL: Final = "2026-11-30"

ExecutingKind = Literal["init", "step", "recover", "agent"]


class _Rec(msgspec.Struct, frozen=True, tag_field="phase", omit_defaults=True, gc=False):
    at: str


class Header(_Rec, tag="header", frozen=True):
    """First record of every Run: what it needs to be restored, and by what."""

    run_id: str
    workflow: str
    workflow_version: str
    identity: str
    schemas: dict[str, str]
    intent: str
    format: int = FORMAT1_FORMAT
    package_version: str = ""
    protocol: str = FORMAT1_PROTOCOL


class StagePending(_Rec, tag="stage_pending", frozen=True):
    """Run created (before it is visible) or routing entered a new Stage."""

    stage: str


class StepReady(_Rec, tag="step_ready", frozen=True):
    """Stage State initialised, or routing chose the next Step in the Stage."""

    stage: str
    step: str
    state: bytes | None = None


class Executing(_Rec, tag="executing", frozen=True):
    """Durable before user code (a Step, a Stage initialiser, a recover handler) starts."""

    stage: str
    step: str | None
    kind: ExecutingKind = "step"


class EffectStarted(_Rec, tag="effect_started", frozen=True):
    """Durable before an effect is called, so an interruption can name it."""

    name: str
    key: str


# How an ``effect_done`` error ends when the effect was cancelled before it returned (a
# timeout in its Step): what it set going (a call handed to a thread) may still have run on,
# so a Run interrupted after it must not be told that nothing was in flight (the fold marks
# it: RunState.last_effect_unknown).
OUTCOME_UNKNOWN: Final = "its outcome is unknown"


class EffectDone(_Rec, tag="effect_done", frozen=True):
    """The recorded result of an effect (evidence; never replayed into user code)."""

    name: str
    key: str
    ok: bool = True
    result: Any = None
    error: str | None = None


class StepResult(_Rec, tag="step_result", frozen=True):
    """The Step returned an outcome; the new Stage State is saved with it."""

    stage: str
    step: str
    outcome: str
    state: bytes | None = None
    output: Any = None


class Waiting(_Rec, tag="waiting", frozen=True):
    """Durable before a question, confirmation or Agent task is exposed."""

    action: WaitingAction | None = None
    agent_call: PendingAgentCall | None = None
    state: bytes | None = None


class Answered(_Rec, tag="answered", frozen=True):
    """An answer was accepted, before it is delivered."""

    action_id: str
    answer: Any = None


class Terminal(_Rec, tag="terminal", frozen=True):
    """Completed, failed or cancelled. ``dismissed`` marks a cancelled RUN_INTERRUPTED Run."""

    status: Literal["completed", "failed"]
    error: ErrorView | None = None
    dismissed: bool = False


Record = (
    Header
    | StagePending
    | StepReady
    | Executing
    | EffectStarted
    | EffectDone
    | StepResult
    | Waiting
    | Answered
    | Terminal
)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Record)


# The record's canonical bytes (msgpack): the encoder's own method rather than a wrapper,
# as the store calls it for every record (three per Step).
encode_record: Callable[[Record], bytes] = _encoder.encode


# What encoding a record raises for a value it cannot hold (an int beyond 64 bits, an object
# that is not plain data, a str with a lone surrogate, a value that holds itself or is nested
# deeper than the stack), and what JSON encoding raises for an int of more than 4,300 digits
# (ValueError: Python's int-to-text limit; a State holding one failed its Run as the host's
# CLI_INTERNAL_ERROR).
UNENCODABLE: Final = (OverflowError, TypeError, msgspec.EncodeError, UnicodeEncodeError,
                      RecursionError, ValueError)


def check_encodable(value: Any) -> None:
    """Raise one of ``UNENCODABLE`` if a record could not hold ``value``."""
    _encoder.encode(value)


def decode_record(data: bytes) -> Record:
    """Decode one record; raises ``msgspec.DecodeError`` or ``msgspec.ValidationError``.
    The journal's readers use ``intloom.store.depth.decode_record``, which draws the line
    for deeply nested records at the same depth from any stack (this module is the pure
    engine: no recursion limits, no locks)."""
    try:
        return _decoder.decode(data)
    except RecursionError:
        raise msgspec.DecodeError("a value in the record is nested too deeply to decode "
                                  "here (Python's recursion limit)") from None
