"""Whether a value a client sent is plain JSON data, as the docs promise Agents and Tools.

msgpack carries more than JSON (bytes, non-finite floats, non-string keys): a value built in
Python may hold them, and the journal would keep a different value (bytes as base64, NaN as
null) than the one the Agent sent. ``json_problem`` names the first such part instead.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["MAX_DEPTH", "deeper_than", "json_path", "json_problem", "wire_problem"]


# Deeper than any JSON an Agent or a Tool means to send, and what stops a value that contains
# itself. Well inside msgspec's own limit, which is Python's recursion limit (1,000) less the
# stack below the call: a value accepted here is later encoded inside a record, a few frames
# deeper, after records before it were appended. At 1,000 an Agent's output ~950 deep passed
# and then failed its StepResult, after its Executing was appended.
MAX_DEPTH: Final = 500

_SCALARS: Final = frozenset({str, int, bool, type(None)})
# Where an item sits: (its container's place, its key or index), None for the value itself.
_Place = tuple["_Place", str | int] | None


def json_path(place: _Place) -> str:
    """``$.a[2]``: where an item sits, from (its container's place, its key or index)."""
    parts: list[str] = []
    while place is not None:
        place, key = place
        parts.append(f".{key}" if isinstance(key, str) else f"[{key}]")
    return "$" + "".join(reversed(parts))


def json_problem(value: Any) -> str | None:
    """Where ``value`` stops being plain JSON (``$.a[2] is bytes``), or None when it is.

    Paths are built only for the part named; a value nested deeper than ``MAX_DEPTH`` (one
    that contains itself, too) is named as such instead of being walked for ever."""
    stack: list[tuple[Any, _Place, int]] = [(value, None, 0)]
    while stack:
        item, place, depth = stack.pop()
        if item is None or isinstance(item, (bool, int, str)):
            continue
        if isinstance(item, float):
            if item - item != 0.0:  # NaN or an infinity (math stays out of the engine)
                return f"{json_path(place)} is {item!r}, which JSON cannot hold"
            continue
        if depth >= MAX_DEPTH and isinstance(item, (list, tuple, dict)):
            return (f"the value is nested more than {MAX_DEPTH} levels deep (or holds "
                    "itself)")
        if isinstance(item, (list, tuple)):
            for i, part in enumerate(item):
                if type(part) not in _SCALARS:  # scalars need no visit: a long list is cheap
                    stack.append((part, (place, i), depth + 1))
            continue
        if isinstance(item, dict):
            for key, part in item.items():
                if not isinstance(key, str):
                    kind = type(key).__name__
                    return (f"{json_path(place)} has the key {key!r} ({kind}); JSON keys are "
                            "strings")
                if type(part) not in _SCALARS:
                    stack.append((part, (place, key), depth + 1))
            continue
        return f"{json_path(place)} is {type(item).__name__}, not JSON data"
    return None


_INT_RANGE: Final = range(-(1 << 63), 1 << 64)


def _wire_fact(item: Any) -> str | None:
    if isinstance(item, int) and not isinstance(item, bool) and item not in _INT_RANGE:
        return "is an integer beyond 64 bits (msgpack holds -2**63 to 2**64-1)"
    if isinstance(item, str):
        try:
            item.encode("utf-8")
        except UnicodeEncodeError:
            return "holds text that is not valid Unicode (a lone surrogate)"
    return None


def wire_problem(value: Any) -> str | None:
    """Where plain JSON data ``value`` holds what msgpack cannot carry (``$.n is an integer
    beyond 64 bits``), or None. Call it on a value ``json_problem`` passed (bounded depth)."""
    stack: list[tuple[Any, _Place]] = [(value, None)]
    while stack:
        item, place = stack.pop()
        fact = _wire_fact(item)
        if fact is not None:
            return f"{json_path(place)} {fact}"
        if isinstance(item, (list, tuple)):
            stack.extend((part, (place, i)) for i, part in enumerate(item))
        elif isinstance(item, dict):
            for key, part in item.items():
                if _wire_fact(key) is not None:
                    return f"{json_path(place)} has a key that {_wire_fact(key)}"
                stack.append((part, (place, key)))
    return None


def deeper_than(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether plain data ``value`` (msgspec.to_builtins' output: lists, tuples, dicts and
    scalars) nests containers more than ``limit`` deep. What user code hands a record is
    checked here, not by whether it encodes: it is encoded from a worker thread's shallow
    stack and decoded at a restart from deep inside the start, where msgspec (bounded by
    Python's recursion limit less the stack below it) gives up sooner."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            parts: Any = item.values()
        elif isinstance(item, (list, tuple)):
            parts = item
        else:
            continue
        if depth >= limit:
            return True
        stack.extend((part, depth + 1) for part in parts
                     if isinstance(part, (list, tuple, dict)))
    return False
