"""How deep a record or snapshot of the journal may nest, the same for every reader.

msgspec's own limit is Python's recursion limit less the stack below the caller, so a value
written from a shallow stack could be read by one reader and refused by another (doctor, a
few frames shallower than a start, previewed as resumable a Run the start held). Every
reader of the journal decodes through here. It lives in the store, not in the pure engine
(``intloom.runtime``): it raises the recursion limit for a call, under a lock.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, Final, TypeVar

import msgspec

from intloom.runtime.records import Record, encode_record

__all__ = ["READ_DEPTH", "TooDeep", "decode_bounded", "decode_record", "nested_too_deep"]

_decoder = msgspec.msgpack.Decoder(Record)

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
    """Decode one record of the journal; raises ``msgspec.DecodeError`` or
    ``msgspec.ValidationError``. A record nested more than ``READ_DEPTH`` deep is refused by
    every reader alike (a restore runs deep inside a start; raised as RecursionError, it
    failed the whole start)."""
    if len(data) <= READ_DEPTH:
        try:  # decode_bounded's fast path, one call fewer: a restore decodes ~84k records
            return _decoder.decode(data)
        except RecursionError:
            pass
        return decode_bounded(_decoder.decode, data)
    try:
        record = _decoder.decode(data)
    except (RecursionError, msgspec.DecodeError, msgspec.ValidationError):
        return decode_bounded(_decoder.decode, data)  # says it as the checks say it
    # A Stage State is opaque bytes in the record (nothing in them nests it): nesting takes
    # one byte per level of what is outside them. Counting a State's bytes too cost a
    # restore of Runs with 20 KB States ~9x its decoding.
    state = getattr(record, "state", None)
    if len(data) - (len(state) if state else 0) <= READ_DEPTH or (
            data.translate(_CONTAINERS).count(1) <= READ_DEPTH):
        return record
    # Decoded from this stack already: how deep it nests is read off the record itself, which
    # costs a walk of its containers; decoding it again, untyped, then typed with room (the
    # slow path) cost ~8x a plain decode for an effect result of 1,000 small maps.
    if len(encode_record(record)) != len(data):
        # Keys the record type does not know (skipped by the typed decode, and so by the
        # walk below) or another writer's encoding: the slow path reads every byte.
        return decode_bounded(_decoder.decode, data)
    if _deeper_than_read_depth(record):
        raise TooDeep(f"a value in it is nested too deeply to decode (more than {READ_DEPTH} "
                      "levels, the most intloom reads)")
    return record


def _deeper_than_read_depth(record: Record) -> bool:
    """Whether a decoded record nests containers more than ``READ_DEPTH`` deep, counted as
    ``nested_too_deep`` counts its msgpack: the record's own map is level 1; a Struct, a
    map, an array (a list, a tuple, a set) is a level; a map's keys are not walked. By
    exact type, not isinstance: a decoded value holds no subclass of them, and isinstance
    against Struct's metaclass made the walk ~20x a plain decode."""
    level: list[Any] = [record]
    depth = 1
    while level:
        if depth > READ_DEPTH:
            return True
        below: list[Any] = []
        for item in level:
            kind = type(item)
            if kind is dict:
                parts: Any = item.values()
            elif kind is list or kind is tuple or kind is set or kind is frozenset:
                parts = item
            else:  # a Struct: only those reach here (see _CONTAINER_TYPES)
                parts = [getattr(item, name) for name in kind.__struct_fields__]
            for part in parts:
                kind = type(part)
                if kind in _CONTAINER_TYPES or (kind not in _SCALAR_TYPES
                                                and hasattr(kind, "__struct_fields__")):
                    below.append(part)
        level, depth = below, depth + 1
    return False


_CONTAINER_TYPES: Final = frozenset({dict, list, tuple, set, frozenset})
_SCALAR_TYPES: Final = frozenset({str, int, float, bool, bytes, type(None)})
