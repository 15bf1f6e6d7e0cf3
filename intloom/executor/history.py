"""A Run's history entries, and an ended Run's history packed into one compressed blob.

A host lists up to 1,000 ended Runs, and ``attach`` replays each one's history. Kept as
objects, an entry (its events, the state it showed: a 27-field struct with its own strings)
costs ~1 KB, so 1,000 ended Runs of 20 Steps held ~20 MB that nobody may ever read, and long
Runs (200 entries each) ~170 MB. Packed, an entry keeps only what a follower is sent: its
events (names, the facts their details are made of, cursors) and the fields of the state a
view is made of; consecutive entries differ in a few of them. An ended Run's 200 entries
pack to ~1 KB in ~0.2 ms, once, on the loop; no view is built for it. They are unpacked
only for a follower.
"""

from __future__ import annotations

import operator
import zlib
from collections.abc import Callable
from typing import Any, Final

import msgspec

from intloom.errors import ErrorView
from intloom.runtime.machine import RunState, to_view
from intloom.runtime.model import Cursor, PendingAgentCall, RunView, WaitingAction
from intloom.runtime.records import Answered, EffectDone, EffectStarted, StepResult

__all__ = ["FACTS", "STATE_KEPT", "Entry", "Event", "detail", "kept", "pack", "plain_view", "shown",
           "unpack"]


# Events and entries are gc=False structs, not tuples: a busy Run keeps ~5 new objects per
# Step in its history, and tuples (tracked by the cyclic collector when made, untracked only
# at its next pass) set off a young collection every ~140 Steps, and full ones (5-8 ms
# each) that walk the whole history: with 64 busy Runs, 382 young, 34 middle and 3 full
# collections in 57,600 Steps, 84 ms in all (gc.callbacks). What they hold is plain data
# (strs, a tuple or list of two strs, a dict of strs, gc=False structs), and must stay so:
# a reference cycle through a gc=False struct would never be collected.
class Event(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """An event: its name, its detail (``detail`` reads it: a dict or None, or the ``FACTS``
    of the record behind it) and that record's cursor (None: the cursor of the view it is
    published with)."""

    name: str
    info: Any
    cursor: Cursor | None


class Entry(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """A history entry: one publish's events, the state it showed, and its view when that is
    not the plain view of the state (an override, a suspension)."""

    events: tuple[Event, ...]
    state: RunState
    view: RunView | None


# The records an event keeps facts of (as its detail), and those facts (the rest, a State or
# an effect's result, is in the journal).
FACTS: Final[dict[type, Callable[[Any], Any]]] = {
    StepResult: operator.attrgetter("outcome"),
    EffectStarted: operator.attrgetter("name", "key"),
    EffectDone: operator.attrgetter("name", "key"),
    Answered: operator.attrgetter("action_id"),
}

# The fields of a state its plain view is made of (``to_view``), beside those no record
# changes (run id, Workflow, version, creation time), which ``unpack`` takes from the Run.
_Shown = tuple[Cursor, str, str, WaitingAction | None, PendingAgentCall | None,
               ErrorView | None, str, bool]
_encoder: Final = msgspec.msgpack.Encoder()
_decoder: Final = msgspec.msgpack.Decoder(list[tuple[tuple[Event, ...], RunView | _Shown]])
# Level 1: higher levels gain little on entries this repetitive and cost more on the loop.
# Raw deflate (negative window bits): no zlib header, and no Adler-32 over the input, which
# guards nothing a blob that never leaves memory needs. Memory level 5, not zlib's 8: each
# compressor clears its hash table when made, and a table of 2^15 heads cleared for ~36 KB
# of input cost more than the matching; 2^12 find the same repeats in these entries
# (callgrind, 200 entries of a tick Run: ~2.3k -> ~1.4k instructions per entry for zlib,
# the same ~4.4 bytes per entry).
_LEVEL: Final = 1
_WBITS: Final = -15
_MEM_LEVEL: Final = 5


def detail(name: str, info: Any) -> Any:
    """An event's detail: given as is (a dict or None), or made of a record or its ``FACTS``."""
    if info is None or type(info) is dict:
        return info
    facts = FACTS.get(type(info))
    if facts is not None:
        info = facts(info)
    if name == "step_result":
        return {"outcome": info}
    if name in ("effect_started", "effect_done"):
        return {"name": info[0], "key": info[1]}
    if name == "answered":
        return {"actionId": info}
    return info


# The size of Stage State, in bytes, from which an entry keeps its state without it.
STATE_KEPT: Final = 1024


def kept(state: RunState) -> RunState:
    """``state`` as an entry keeps it: what its view is made of. Its Stage State and a
    Step's output are not shown to anyone, and a live Run keeps up to 1,000 entries: with
    each Step's State in its own, a Run with a 1 MB State held ~1 GB until it ended. Cut
    only from a big one: a replace per Step would cost every Run for a saving of a few
    hundred bytes an entry."""
    stage_state = state.stage_state
    if (stage_state is not None and len(stage_state) >= STATE_KEPT) or (
            state.output is not None):
        return msgspec.structs.replace(state, stage_state=None, output=None)
    return state


def plain_view(state: RunState) -> RunView:
    """A Run's view when nothing outside its journal (an override, a suspension) applies."""
    view = to_view(state)
    return msgspec.structs.replace(view, dismissed=True) if state.dismissed else view


def shown(entry: Entry) -> RunView:
    """The view an entry showed."""
    return entry.view or plain_view(entry.state)


def pack(entries: list[Entry]) -> bytes | None:
    """``entries`` packed; None when a detail does not encode (then keep the objects)."""
    sent = [(entry.events, entry.view if entry.view is not None else (
                 state.cursor, state.status, state.updated_at, state.pending_action,
                 state.pending_agent_call, state.last_error, state.phase, state.dismissed))
            for entry in entries for state in (entry.state,)]
    try:
        raw = _encoder.encode(sent)
    except (TypeError, ValueError, OverflowError):
        return None
    compressor = zlib.compressobj(_LEVEL, zlib.DEFLATED, _WBITS, _MEM_LEVEL)
    return compressor.compress(raw) + compressor.flush()


def unpack(blob: bytes, run: RunState) -> list[Entry]:
    """The entries ``pack`` packed; ``run`` is the Run's state now (its unchanging fields)."""
    entries: list[Entry] = []
    for events, part in _decoder.decode(zlib.decompress(blob, _WBITS)):
        if isinstance(part, RunView):
            entries.append(Entry(events, run, part))
            continue
        cursor, status, updated_at, action, call, error, phase, dismissed = part
        entries.append(Entry(events, msgspec.structs.replace(
            run, cursor=cursor, status=status, updated_at=updated_at, pending_action=action,
            pending_agent_call=call, last_error=error, phase=phase, dismissed=dismissed), None))
    return entries
