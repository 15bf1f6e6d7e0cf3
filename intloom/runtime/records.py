"""Journal records: one per durable boundary of a Run (DESIGN section 5).

A Run's journal is a ``Header`` followed by these records, in order. Records are the
engine's events: :func:`intloom.runtime.machine.apply` folds them into a
:class:`~intloom.runtime.machine.RunState`. Stage State travels as the exact JSON bytes the
State encoded to, so a restore can re-decode them with today's schema and compare.

Fields are only ever added with defaults; a tag is never reused for another meaning.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, Final, Literal, TypeVar

import msgspec

from intloom.errors import ErrorView
from intloom.runtime.model import PendingAction, PendingAgentCall

__all__ = [
    "FORMAT_VERSION",
    "PROTOCOL_VERSION",
    "READ_DEPTH",
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
    "TooDeep",
    "Waiting",
    "decode_bounded",
    "decode_record",
    "encode_record",
    "nested_too_deep",
]

# The on-disk journal format. Bump on any change a reader of the old version would
# misread; docs/format.md and CHANGELOG.md say what changed.
FORMAT_VERSION: Final = 1
# The Workflow protocol version, hashed into every Workflow identity.
PROTOCOL_VERSION: Final = "2026-11-30"

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
    format: int = FORMAT_VERSION
    package_version: str = ""
    protocol: str = PROTOCOL_VERSION


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

    action: PendingAction | None = None
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
# deeper than the stack).
UNENCODABLE: Final = (OverflowError, TypeError, msgspec.EncodeError, UnicodeEncodeError,
                      RecursionError)


def check_encodable(value: Any) -> None:
    """Raise one of ``UNENCODABLE`` if a record could not hold ``value``."""
    _encoder.encode(value)


# The deepest nesting of msgpack containers a reader decodes (a record, a snapshot), counted
# from the outermost map, whatever the stack below the reader. msgspec's own limit is
# Python's recursion limit less that stack, so it differed between readers: doctor, a few
# frames shallower than a start, read a record ~10 levels deeper than the start refused, and
# previewed as resumable a Run the start held. The writer keeps values within
# plainjson.MAX_DEPTH (500), a few levels inside a record; this leaves room for records
# earlier builds wrote (a start ~30 frames deep read up to ~970).
READ_DEPTH: Final = 900

# A translate table: 1 for the bytes that may start a msgpack map or array (fixmap,
# fixarray, array 16/32, map 16/32). Nesting N deep takes at least N of them.
_CONTAINERS: Final = bytes(1 if 0x80 <= b < 0xA0 or 0xDC <= b <= 0xDF else 0
                           for b in range(256))
_ROOM: Final = threading.Lock()

T = TypeVar("T")


def _shallow(data: bytes) -> bool:
    """True when ``data`` cannot nest more than ``READ_DEPTH`` deep (the usual record): too
    few bytes, or too few that may start a container. Cheap: no decoding."""
    return len(data) <= READ_DEPTH or data.translate(_CONTAINERS).count(1) <= READ_DEPTH


def _with_room(decode: Callable[[bytes], T], data: bytes) -> T:
    """``decode(data)`` with room for ``READ_DEPTH`` levels below the caller's stack, however
    deep it is: the recursion limit is raised for the call, then put back."""
    depth = 0
    frame: FrameType | None = sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    with _ROOM:
        limit = sys.getrecursionlimit()
        need = depth + READ_DEPTH + 64
        if need > limit:
            sys.setrecursionlimit(need)
        try:
            return decode(data)
        finally:
            if need > limit:
                sys.setrecursionlimit(limit)


def nested_too_deep(data: bytes) -> bool:
    """Whether msgpack ``data`` nests containers more than ``READ_DEPTH`` deep, the same
    answer from any stack. Raises ``msgspec.DecodeError`` for bytes that are no msgpack."""
    if _shallow(data):
        return False
    try:
        value = _with_room(msgspec.msgpack.decode, data)
    except RecursionError:
        return True  # deeper than the room given, itself deeper than READ_DEPTH
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > READ_DEPTH:
            return True
        parts = item.values() if isinstance(item, dict) else item
        stack.extend((part, depth + 1) for part in parts if isinstance(part, (list, dict)))
    return False


class TooDeep(msgspec.DecodeError):
    """Bytes nested more than ``READ_DEPTH`` deep: refused by every reader alike."""


def decode_bounded(decode: Callable[[bytes], T], data: bytes) -> T:
    """``decode(data)`` if ``data`` nests at most ``READ_DEPTH`` deep, from any stack;
    ``TooDeep`` (a ``msgspec.DecodeError``) otherwise."""
    if len(data) <= READ_DEPTH or data.translate(_CONTAINERS).count(1) <= READ_DEPTH:
        try:  # the usual record, and no context manager: a restore decodes ~84k of them
            return decode(data)
        except RecursionError:
            pass  # a caller deep in the stack: decoded again with room below it
    if nested_too_deep(data):
        raise TooDeep(f"a value in it is nested too deeply to decode (more than {READ_DEPTH} "
                      "levels, the most intloom reads)")
    return _with_room(decode, data)


def decode_record(data: bytes) -> Record:
    """Decode one record; raises ``msgspec.DecodeError`` or ``msgspec.ValidationError``.
    A record nested more than ``READ_DEPTH`` deep is refused by every reader alike (a
    restore runs deep inside a start; raised as RecursionError, it failed the whole start)."""
    if len(data) <= READ_DEPTH or data.translate(_CONTAINERS).count(1) <= READ_DEPTH:
        try:  # decode_bounded's fast path, one call fewer: a restore decodes ~84k records
            return _decoder.decode(data)
        except RecursionError:
            pass
    return decode_bounded(_decoder.decode, data)
