"""Whether a value a client sent is plain JSON data, as the docs promise Agents and Tools.

msgpack carries more than JSON (bytes, non-finite floats, non-string keys): a value built in
Python may hold them, and the journal would keep a different value (bytes as base64, NaN as
null) than the one the Agent sent. ``json_problem`` names the first such part instead.
"""

from __future__ import annotations

from typing import Any

__all__ = ["json_problem"]


def json_problem(value: Any) -> str | None:
    """Where ``value`` stops being plain JSON (``$.a[2] is bytes``), or None when it is."""
    stack: list[tuple[Any, str]] = [(value, "$")]
    while stack:
        item, path = stack.pop()
        if item is None or isinstance(item, (bool, int, str)):
            continue
        if isinstance(item, float):
            if item - item != 0.0:  # NaN or an infinity (math stays out of the engine)
                return f"{path} is {item!r}, which JSON cannot hold"
            continue
        if isinstance(item, (list, tuple)):
            stack.extend((part, f"{path}[{i}]") for i, part in enumerate(item))
            continue
        if isinstance(item, dict):
            for key, part in item.items():
                if not isinstance(key, str):
                    kind = type(key).__name__
                    return f"{path} has the key {key!r} ({kind}); JSON keys are strings"
                stack.append((part, f"{path}.{key}"))
            continue
        return f"{path} is {type(item).__name__}, not JSON data"
    return None
