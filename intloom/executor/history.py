"""A Run's history entries, and an ended Run's history packed into one compressed blob.

A host lists up to 1,000 ended Runs, and ``attach`` replays each one's history. Kept as
objects, an entry (its events, the state it showed: a 27-field struct with its own strings,
the records behind its events) costs ~1 KB, so 1,000 ended Runs of 20 Steps held ~20 MB
that nobody may ever read, and long Runs (200 entries each) ~170 MB. Packed, an entry keeps
only what a follower is sent -- its events' names, details and cursors, and the view it
showed -- and consecutive entries differ in a few fields: 200 entries pack to ~1 KB in
~0.3 ms, once per ended Run. They are unpacked only for a follower.
"""

from __future__ import annotations

import zlib
from typing import Any, Final

import msgspec

from intloom.runtime.machine import RunState, to_view
from intloom.runtime.model import Cursor, RunView
from intloom.runtime.records import Answered, EffectDone, EffectStarted, StepResult

__all__ = ["DETAILED", "Entry", "Event", "detail", "pack", "plain_view", "unpack"]

# An event: its name, its detail (``detail`` reads it) and the cursor of the record behind it
# (None: the cursor of the view it is published with).
Event = tuple[str, Any, Cursor | None]
# A history entry: one publish's events, the state it showed, and its view when that is not
# the plain view of the state. Unpacked entries carry their view and no state.
Entry = tuple[tuple[Event, ...], RunState | None, RunView | None]
# Records whose event carries a detail; the record itself stands for it until read.
DETAILED: Final[frozenset[type]] = frozenset({StepResult, EffectStarted, EffectDone, Answered})

_encoder: Final = msgspec.msgpack.Encoder()
# Details are the host's own dicts ({"code": ...}, {"outcome": ...}) or None.
_decoder: Final = msgspec.msgpack.Decoder(list[tuple[tuple[Event, ...], RunView]])
# Level 1: higher levels gain little on entries this repetitive and cost more on the loop.
_LEVEL: Final = 1


def detail(info: Any) -> Any:
    """An event's detail: given as is, or read off the record that carries it."""
    if isinstance(info, StepResult):
        return {"outcome": info.outcome}
    if isinstance(info, (EffectStarted, EffectDone)):
        return {"name": info.name, "key": info.key}
    if isinstance(info, Answered):
        return {"actionId": info.action_id}
    return info


def plain_view(state: RunState) -> RunView:
    """A Run's view when nothing outside its journal (an override, a suspension) applies."""
    view = to_view(state)
    return msgspec.structs.replace(view, dismissed=True) if state.dismissed else view


def shown(entry: Entry) -> RunView:
    """The view an entry showed."""
    _, state, view = entry
    if view is not None:
        return view
    assert state is not None, "an entry without a view has its state"
    return plain_view(state)


def pack(entries: list[Entry]) -> bytes | None:
    """``entries`` as a follower would be sent them, packed; None when a detail does not
    encode (then keep the objects)."""
    sent = [(tuple([(name, detail(info) if type(info) in DETAILED else info, cursor)
                    for name, info, cursor in events]), shown(entry))
            for entry in entries for events in (entry[0],)]
    try:
        return zlib.compress(_encoder.encode(sent), _LEVEL)
    except (TypeError, ValueError, OverflowError):
        return None


def unpack(blob: bytes) -> list[Entry]:
    """The entries ``pack`` packed, each with its view."""
    return [(events, None, view) for events, view in _decoder.decode(zlib.decompress(blob))]
