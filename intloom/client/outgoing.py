"""A request as the client sends it, or INVALID_REQUEST before a byte is sent.

The values a caller hands over (an answer, a Tool's input, an Agent's output, an intent) are
theirs to fix: a value msgpack cannot hold is named by its path in the request, with the
limit and what to send instead, and the connection stays usable.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Final

import msgspec

from intloom.errors import IntloomError
from intloom.project import locale_misreads
from intloom.protocol.framing import FrameError, encode_frame
from intloom.protocol.messages import (
    MAX_FRAME,
    Answer,
    CallTool,
    CompleteAgentCall,
    CreateRun,
    Request,
)
from intloom.runtime.limits import intent_too_large

__all__ = ["frame_of", "not_unicode_at"]

# What msgpack raises for a value it cannot hold: an integer beyond 64 bits, a str with a lone
# surrogate (what bytes that are not UTF-8 decode to from argv), nesting deeper than the
# stack, an object that is not plain data.
_UNENCODABLE: Final = (OverflowError, UnicodeEncodeError, RecursionError, TypeError,
                       msgspec.EncodeError)
_INT_RANGE: Final = range(-(1 << 63), 1 << 64)
_NOTHING_CHANGED: Final = "Nothing was sent, so nothing changed."


def _big_int(value: object) -> bool:
    return isinstance(value, int) and value not in _INT_RANGE


def _not_utf8(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _label(key: object) -> str:
    """A dict key as a path step that can itself be printed (no surrogates, bounded)."""
    text = key if isinstance(key, str) else repr(key)
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= 40 else text[:37] + "..."


def _find(value: object, where: str, bad: Callable[[object], bool]) -> str | None:
    """The path of the first item of ``value`` (or key) for which ``bad`` holds. Iterative,
    so a tree nested as deep as the decoder allows cannot exhaust the stack here; each
    container is walked once, so a value that contains itself cannot loop it."""
    stack: list[tuple[str, object]] = [(where, value)]
    walked: set[int] = set()
    while stack:
        path, item = stack.pop()
        if bad(item):
            return path
        if isinstance(item, dict | list | tuple):
            if id(item) in walked:
                continue
            walked.add(id(item))
        children: list[tuple[str, object]] = []
        if isinstance(item, dict):
            for key, child in item.items():
                if bad(key):
                    return f"{path} (the key {_label(key)})"
                children.append((f"{path}.{_label(key)}", child))
        elif isinstance(item, list | tuple):
            children = [(f"{path}[{i}]", child) for i, child in enumerate(item)]
        stack.extend(reversed(children))
    return None


def _cycle_at(value: object, where: str) -> tuple[str, str] | None:
    """Where ``value`` (at ``where``) holds one of its own containers inside itself: the
    path of the reference and of the container it refers back to. Iterative, as ``_find``;
    the containers open at each step are exactly the current item's ancestors."""
    stack: list[tuple[str, object, bool]] = [(where, value, False)]
    open_at: dict[int, str] = {}
    closed: set[int] = set()
    while stack:
        path, item, leaving = stack.pop()
        if not isinstance(item, dict | list | tuple):
            continue
        if leaving:
            del open_at[id(item)]
            closed.add(id(item))
            continue
        if id(item) in open_at:
            return path, open_at[id(item)]
        if id(item) in closed:
            continue  # shared, not circular: walked once
        open_at[id(item)] = path
        stack.append((path, item, True))
        if isinstance(item, dict):
            children = [(f"{path}.{_label(key)}", child) for key, child in item.items()]
        else:
            children = [(f"{path}[{i}]", child) for i, child in enumerate(item)]
        stack.extend((child_path, child, False) for child_path, child in reversed(children))
    return None


def not_unicode_at(value: object, where: str) -> str | None:
    """The path (from ``where``) of the first str in ``value``, or key, holding a lone
    surrogate: text that is not valid Unicode, so neither msgpack nor JSON can carry it."""
    return _find(value, where, _not_utf8)


def _culprit(request: Request, bad: Callable[[object], bool] | None = None) -> str:
    """Where in ``request`` msgpack gave up: a wire-named path such as ``answer.feedback``,
    found with ``bad``, else the first field that does not encode on its own."""
    fields = msgspec.structs.fields(type(request))
    for info in fields:
        found = None if bad is None else _find(getattr(request, info.name), info.encode_name, bad)
        if found is not None:
            return found
    for info in fields:
        try:
            msgspec.msgpack.encode(getattr(request, info.name))
        except _UNENCODABLE:
            return info.encode_name
    return "a value"


def _cycle(request: Request) -> tuple[str, str] | None:
    """The first reference cycle in ``request``'s fields (``_cycle_at``), by wire name."""
    for info in msgspec.structs.fields(type(request)):
        found = _cycle_at(getattr(request, info.name), info.encode_name)
        if found is not None:
            return found
    return None


def _misread(request: Request) -> str | None:
    """The locale's fix, when the request's first lone surrogate is in UTF-8 bytes Python
    read as ASCII (``locale_misreads``), else None: then the bytes themselves are at fault."""
    hit: list[str] = []

    def bad(value: object) -> bool:
        if _not_utf8(value):
            hit.append(typing.cast(str, value))
            return True
        return False

    for info in msgspec.structs.fields(type(request)):
        if _find(getattr(request, info.name), info.encode_name, bad) is not None:
            break
    return locale_misreads(hit[0]) if hit else None


def _unsendable(request: Request, exc: BaseException) -> IntloomError:
    """INVALID_REQUEST for a request msgpack cannot encode: which value, why, what to do."""
    if isinstance(exc, OverflowError):
        fact = (f"{_culprit(request, _big_int)} is an integer beyond 64 bits, which neither "
                "the protocol nor a Run's journal can hold (msgpack: -2**63 to 2**64-1). Send "
                "it as a string, or as a number in that range")
    elif isinstance(exc, UnicodeEncodeError):
        culprit = _culprit(request, _not_utf8)
        misread = _misread(request)
        fact = (f"{culprit} cannot be read: {misread}" if misread is not None else
                f"{culprit} holds text that is not valid Unicode (a lone surrogate, as bytes "
                "that are not UTF-8 decode to). Send UTF-8 text")
    elif isinstance(exc, RecursionError):
        cycle = _cycle(request)
        # "Flatten it" cannot end a value that holds itself: msgpack recursed round it.
        fact = (f"{cycle[0]} refers back to {cycle[1]}, which holds it (a reference cycle), "
                "so it has no end to send. Send a copy without the cycle (copy.deepcopy "
                "keeps it)" if cycle is not None else
                f"{_culprit(request)} is nested too deeply. Flatten it")
    else:
        fact = (f"{_culprit(request)} cannot be encoded ({exc}). Send "
                "plain data: dict, list, str, int, float, bool or None")
    return IntloomError(
        "INVALID_REQUEST",
        f"Cannot send the {type(request).__name__} request: {fact}. {_NOTHING_CHANGED}",
    )


# Per request type, its fields of a plain type (``str`` ids, names and an intent, ``bool``
# ``wait``, ``str | None`` ``flow``), with the types each accepts and their name: msgspec
# encodes whatever a field holds, and the host's refusal of, say, ``None`` there spoke of its
# protocol ("the frame is not a valid request ... at `$.intent`"), after it was sent.
_PLAIN: Final = (str, bool, int)
_PLAIN_FIELDS: dict[type, tuple[tuple[str, tuple[type, ...], str], ...]] = {}


def _a(kind: type) -> str:
    return f"{'an' if kind is int else 'a'} {kind.__name__}"


def _accepts(annotation: object) -> tuple[tuple[type, ...], str] | None:
    """The types a field annotated ``annotation`` takes, and their name, when it is plain."""
    if annotation in _PLAIN:
        assert isinstance(annotation, type)
        return (annotation,), _a(annotation)
    args = typing.get_args(annotation)
    if len(args) == 2 and type(None) in args:
        (inner,) = (arg for arg in args if arg is not type(None))
        if inner in _PLAIN:
            return (inner, type(None)), f"{_a(inner)} or None"
    return None


def _plain_fields(kind: type) -> tuple[tuple[str, tuple[type, ...], str], ...]:
    found = _PLAIN_FIELDS.get(kind)
    if found is None:
        found = _PLAIN_FIELDS[kind] = tuple(
            (f.name, *accepts) for f in msgspec.structs.fields(kind)
            if (accepts := _accepts(f.type)) is not None)
    return found


def _wrong_type(request: Request) -> IntloomError | None:
    for name, types, shown in _plain_fields(type(request)):
        value = getattr(request, name)
        # A bool is an int to isinstance, not to the host's decoder.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            return IntloomError(
                "INVALID_REQUEST",
                f"Cannot send the {type(request).__name__} request: {name} must be "
                f"{shown}, not {type(value).__name__}. {_NOTHING_CHANGED}",
            )
    return None


# The caller's own value in each request that carries one (an answer, a Tool's input, an
# Agent's output), which the docs promise is plain JSON data.
_DATA_FIELDS: Final[dict[type, str]] = {Answer: "answer", CallTool: "input",
                                        CompleteAgentCall: "output"}


# What msgpack carries as itself. Anything else msgspec encodes converted: a Decimal or a UUID
# as text, a date as ISO text, an Enum as its value, a Struct or a dataclass as an object.
# (bytes, a non-finite float and a key that is not a string go as themselves, and the host
# refuses them; a set is refused here, as _set_sent says.)
_AS_ITSELF: Final = (dict, list, tuple, str, int, float, type(None), bytes, bytearray,
                     memoryview, set, frozenset, msgspec.msgpack.Ext)


def _not_as_itself(value: object) -> bool:
    if isinstance(value, _AS_ITSELF):
        return isinstance(value, set | frozenset)
    if isinstance(value, msgspec.Struct):
        # intloom's own answer types encode to exactly the shapes the host decodes.
        from intloom.authoring.interaction import Confirmation, QuestionAnswer

        return not isinstance(value, Confirmation | QuestionAnswer)
    return True


def _shown_as(value: object) -> str:
    """What msgspec would send for ``value``, briefly (an error path only)."""
    try:
        shown = repr(msgspec.to_builtins(value))
    except Exception:  # a Struct holding what msgspec refuses: name the type alone
        return ""
    return f", which would be sent as {shown if len(shown) <= 80 else shown[:77] + '...'}"


def _set_sent(request: Request) -> IntloomError | None:
    """INVALID_REQUEST for a part of the caller's value that would not arrive as itself.

    A set: msgpack sends it as a list, in no set order, and the host cannot tell it from one,
    so an Agent's ``{"tags": {"a", "b"}}`` was recorded and routed as ``["b", "a"]`` although
    the docs say a set is refused (the host refuses what it can see: bytes, NaN, a key that
    is not a string). Likewise a Decimal, a UUID, a date, an Enum, a Struct or a dataclass,
    which msgspec encodes as text or an object: the host, which refuses them from a Tool,
    recorded another value than the one sent (an aware datetime alone reached it as itself,
    and was refused)."""
    name = _DATA_FIELDS.get(type(request))
    if name is None:
        return None
    value = getattr(request, name)
    where = _find(value, name, _not_as_itself)
    if where is None:
        return None
    item = _item_at(value, _not_as_itself)
    if isinstance(item, set | frozenset):
        fact = ("is a set, which JSON cannot carry (it would be sent as a list, in no set "
                "order). Send a sorted list (sorted(...))")
    else:
        fact = (f"is {type(item).__name__}{_shown_as(item)}, not as itself: the value must be "
                "plain JSON data (dict, list, str, int, float, bool or None). Convert it "
                "yourself to what the receiver should get (str(...), float(...), "
                "msgspec.to_builtins(...))")
    return IntloomError(
        "INVALID_REQUEST",
        f"Cannot send the {type(request).__name__} request: {where} {fact}. {_NOTHING_CHANGED}",
    )


def _item_at(value: object, bad: Callable[[object], bool]) -> object:
    """The first item (or key) of ``value`` for which ``bad`` holds, in ``_find``'s order."""
    found: list[object] = []

    def first(item: object) -> bool:
        if bad(item):
            found.append(item)
            return True
        return False

    _find(value, "", first)
    return found[0] if found else None


def frame_of(request: Request) -> bytes:
    """``request`` as a frame, or INVALID_REQUEST before a byte is sent: the values a caller
    hands over (an answer, a Tool's input, an Agent's output, an intent) are theirs to fix,
    and the connection stays usable."""
    wrong = _wrong_type(request)
    if wrong is not None:
        raise wrong
    try:
        frame = encode_frame(request)
    except _UNENCODABLE as exc:
        raise _unsendable(request, exc) from None
    except FrameError:
        if isinstance(request, CreateRun) and isinstance(request.intent, str):
            # The frame's bound refused it first; the host's own, 1 MiB, is the one to meet:
            # named alone, a caller shrank the intent to 4 MB and was refused again.
            size = len(request.intent.encode("utf-8", "surrogatepass"))
            raise IntloomError("INVALID_REQUEST",
                               f"{intent_too_large(size)} {_NOTHING_CHANGED}") from None
        size = len(msgspec.msgpack.encode(request))
        raise IntloomError(
            "INVALID_REQUEST",
            f"Cannot send the {type(request).__name__} request: it is {size} bytes encoded, "
            f"over the {MAX_FRAME}-byte frame limit. Send a smaller value. {_NOTHING_CHANGED}",
        ) from None
    # After the encoding, whose refusals (a big integer, say) name the fact msgpack hit.
    wrong = _set_sent(request)
    if wrong is not None:
        raise wrong
    return frame
