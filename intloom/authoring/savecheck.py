"""The save check of a Stage State: what the journal keeps of it, and what it refuses.

A State is saved as JSON and a restart keeps it only if it decodes as its type and re-encodes
to the same bytes; a value JSON cannot carry as itself (a set in a part typed Any, a
datetime's time-zone rules) would reach the next Step as another value. ``encode_state``
checks a State a Step (initialiser, recover, on_complete) left, on the Step path; the same
check runs on each Stage's default State when a Workflow is validated (``Workflow.validate``),
so a default it would refuse is a definition error at load, not a failure of every Run.
"""

from __future__ import annotations

import datetime
import math
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

import msgspec

from intloom.authoring.compat import deterministic_json
from intloom.authoring.interaction import json_gap, unencodable_part
from intloom.errors import IntloomError, a_an, clip
from intloom.runtime.plainjson import MAX_DEPTH, json_path
from intloom.runtime.records import UNENCODABLE

if TYPE_CHECKING:
    from intloom.authoring.workflow import Step

__all__ = ["CODECS", "Keeps", "any_gap", "encode_state", "extra_fields", "has_set",
           "nonfinite_note", "state_codec"]


class Keeps(Protocol):
    """What ``encode_state`` keeps the decoded State on (the executor's RunSlot)."""

    decoded: tuple[bytes, Any] | None


# Per Stage State type, its decoder, whether it re-encodes as is, how it is saved otherwise,
# and whether its decode runs code of its own (state_codec); kept for the process's life, as
# the Workflows are.
_Codec = tuple[Callable[[bytes], Any], "bool | None", "bool | _AnyParts", bool]
CODECS: dict[type, _Codec] = {}


# Field types whose every valid value re-encodes to the bytes it was encoded to: a State made
# of these alone is saved as encoded (the hot path), anything else as its decoded value's
# encoding (encode_state). Not float (an int there decodes to a float: 0 -> 0.0), nor sets
# (their order), dates, UUIDs, decimals or bytes (other string forms decode), nor Structs
# (a subclass's extra fields are dropped by the decode); int dict keys neither ("01" -> 1).
_SAME_AGAIN = (msgspec.inspect.IntType, msgspec.inspect.StrType, msgspec.inspect.BoolType,
               msgspec.inspect.NoneType, msgspec.inspect.AnyType, msgspec.inspect.LiteralType,
               msgspec.inspect.EnumType)


def _same_again(info: msgspec.inspect.Type) -> bool:
    """Whether every valid value of ``info`` re-encodes to its own bytes (see _SAME_AGAIN)."""
    mi = msgspec.inspect
    if isinstance(info, _SAME_AGAIN):
        return True
    if isinstance(info, (mi.ListType, mi.VarTupleType)):
        return _same_again(info.item_type)
    if isinstance(info, mi.TupleType):
        return all(_same_again(item) for item in info.item_types)
    if isinstance(info, mi.DictType):
        return isinstance(info.key_type, mi.StrType) and _same_again(info.value_type)
    if isinstance(info, mi.UnionType):
        return all(_same_again(member) for member in info.types)
    return False


# Types whose values never hold a set (leaves of a State type).
_NO_SET = (msgspec.inspect.IntType, msgspec.inspect.FloatType, msgspec.inspect.StrType,
           msgspec.inspect.BoolType, msgspec.inspect.NoneType, msgspec.inspect.AnyType,
           msgspec.inspect.BytesType, msgspec.inspect.ByteArrayType,
           msgspec.inspect.MemoryViewType, msgspec.inspect.DateTimeType,
           msgspec.inspect.DateType, msgspec.inspect.TimeType, msgspec.inspect.TimeDeltaType,
           msgspec.inspect.UUIDType, msgspec.inspect.DecimalType, msgspec.inspect.ExtType,
           msgspec.inspect.RawType, msgspec.inspect.LiteralType, msgspec.inspect.EnumType)


def _any_part(info: msgspec.inspect.Type, hit: Callable[[msgspec.inspect.Type], bool | None],
              unknown: bool, seen: set[type] | None = None) -> bool:
    """Whether a value of ``info`` may hold a part ``hit`` says True of (False: none below
    it; None: look inside), walking Structs, containers and unions; ``unknown``: what a type
    it does not know is taken to hold."""
    mi = msgspec.inspect
    seen = set() if seen is None else seen
    said = hit(info)
    if said is not None:
        return said
    if isinstance(info, mi.Metadata):  # Annotated[..., Meta(...)]
        return _any_part(info.type, hit, unknown, seen)
    if isinstance(info, (mi.StructType, mi.DataclassType, mi.TypedDictType,
                         mi.NamedTupleType)):
        if info.cls in seen:
            return False  # a type that refers to itself: already being looked at
        seen.add(info.cls)
        return any(_any_part(field.type, hit, unknown, seen) for field in info.fields)
    if isinstance(info, (mi.ListType, mi.VarTupleType, mi.SetType, mi.FrozenSetType)):
        return _any_part(info.item_type, hit, unknown, seen)
    if isinstance(info, mi.TupleType):
        return any(_any_part(item, hit, unknown, seen) for item in info.item_types)
    if isinstance(info, (mi.DictType, mi.FrozenDictType)):
        return (_any_part(info.key_type, hit, unknown, seen)
                or _any_part(info.value_type, hit, unknown, seen))
    if isinstance(info, mi.UnionType):
        return any(_any_part(member, hit, unknown, seen) for member in info.types)
    return unknown


def _post_init(info: msgspec.inspect.Type) -> bool | None:
    """True for a Struct or dataclass with a ``__post_init__`` (a decode runs it)."""
    mi = msgspec.inspect
    if (isinstance(info, (mi.StructType, mi.DataclassType))
            and getattr(info.cls, "__post_init__", None) is not None):
        return True
    return None


def _a_set(info: msgspec.inspect.Type) -> bool | None:
    if isinstance(info, _NO_SET):
        return False
    if isinstance(info, (msgspec.inspect.SetType, msgspec.inspect.FrozenSetType)):
        return True
    return None


def has_set(info: msgspec.inspect.Type, seen: set[type] | None = None) -> bool:
    """Whether a value of ``info`` may hold a set or frozenset, whose iteration order (and
    so its encoding) depends on the process's hash seed. A type it does not know may."""
    return _any_part(info, _a_set, True, seen)


def state_codec(state_type: type) -> _Codec:
    """The Stage State type's decode, bound once (looking the method up at each call added
    ~40 ns, ~30 % of a small State's decode); whether an instance of exactly that type
    always re-encodes to its own bytes (its fields are all _SAME_AGAIN): True, False, or None
    when it does but is typed Any somewhere, so that such States take the path where their
    parts typed Any are checked; and how encode_state saves it when it is not saved as
    encoded: True when it may hold a set (saved in sorted order), False when not, or, for a
    type with parts typed Any, those parts (``_AnyParts``, which knows about sets too). A
    State with no part typed Any pays nothing for that check: saved as encoded, it takes the
    path it took before; re-encoded, one identity test more at most (next to an encode).
    Last, whether its decode runs code of its own (a ``__post_init__`` in it, nested too):
    a State of such a type must read back as itself (``_settled``), checked only for them
    (one more decode per save). Kept here, not asked of a function of its own per save (a
    frame per Step; callgrind, 64 async Runs: 107.2-107.3k -> 106.6-106.7k)."""
    codec = CODECS.get(state_type)
    if codec is None:
        info = msgspec.inspect.type_info(state_type)
        same: bool | None = isinstance(info, msgspec.inspect.StructType) and all(
            _same_again(field.type) for field in info.fields)
        sets = has_set(info)
        resave: bool | _AnyParts = _AnyParts.of(info, sets) or sets
        if same and not isinstance(resave, bool):
            same = None
        try:
            builds = _any_part(info, _post_init, False)
        except Exception:
            builds = False  # the schema check has judged the type already
        codec = CODECS[state_type] = (msgspec.json.Decoder(state_type).decode, same, resave,
                                      builds)
    return codec


# What any_gap says of what JSON cannot carry in a part of a State typed Any: the type
# says nothing of it, so it is saved as JSON makes it and the next Step gets that instead.
_KEPT_GAPS: Final = {
    "float": ("is {item!r}, in a part of the State typed Any: JSON has no NaN or infinity, "
              "so it would be saved as null and the next Step would get None",
              'Store None or a string ("nan") there instead.'),
    "set": ("is a set, in a part of the State typed Any: it would be saved as a list (in no "
            "set order) and the next Step would get that list",
            "Type the field as a set (e.g. `seen: set[str] = msgspec.field(default_factory="
            "set)`, saved and restored as a set), or store a sorted list (sorted(...))."),
    "bytes": ("is bytes, in a part of the State typed Any: it would be saved as base64 text "
              "and the next Step would get that text",
              "Type the field as bytes (saved and restored as bytes), or store text."),
    "key": ("has the key {item!r} ({kind}), in a part of the State typed Any: JSON keys are "
            "strings, so the next Step would get it as a string",
            "Type the dict's keys (e.g. `dict[int, str]`, restored as ints), or use string "
            "keys ({str(k): v for k, v in ...})."),
    "tuple": ("is a tuple, in a part of the State typed Any: it would be saved as a list and "
              "the next Step would get that list",
              "Type the field as a tuple (e.g. `pair: tuple[int, str]`, restored as a tuple), "
              "or store a list."),
    "deep": (f"is nested more than {MAX_DEPTH} levels deep, in a part of the State typed Any: "
             "deeper than intloom reads back from its journal",
             f"Keep it a tree of plain data at most {MAX_DEPTH} levels deep."),
    "type": ("is {kind}, in a part of the State typed Any: it would be saved as JSON writes "
             "it (text, a number or an object) and the next Step would get that, not the "
             "{kind}",
             "Type the field (e.g. `when: datetime`, `amount: Decimal`, `item: MyStruct`, "
             "restored as themselves), or store plain JSON data there (str(...), "
             "msgspec.to_builtins(...))."),
}


class _AnyParts:
    """Where a State type is typed Any: the ids of its type nodes (msgspec.inspect) that are,
    or hold, an Any, so that ``any_gap`` walks a value only along those."""

    def __init__(self, root: msgspec.inspect.Type, found: set[int], sets: bool) -> None:
        self.root = root
        self.found = found
        self.sets = sets  # whether the type may hold a set (``has_set``)

    @classmethod
    def of(cls, info: msgspec.inspect.Type, sets: bool) -> _AnyParts | None:
        """None when no part of ``info`` is typed Any (the State costs no check)."""
        found: set[int] = set()
        # A type that refers to itself is answered "not yet known to hold Any" while it is
        # being looked at; looking again until nothing changes settles it.
        while True:
            before = len(found)
            _mark_any(info, found, {})
            if len(found) == before:
                break
        return cls(info, found, sets) if id(info) in found else None


def _cls(info: Any) -> type:
    """The class of a Struct, dataclass or NamedTuple type: a generic one's (``Box[int]``)
    ``cls`` is its alias, which has no subclasses and refuses ``isinstance``."""
    cls = info.cls
    return typing.get_origin(cls) or cls  # type: ignore[no-any-return]


def _mark_any(info: msgspec.inspect.Type, found: set[int], done: dict[int, bool]) -> bool:
    """Whether ``info`` is or holds an Any; adds each node that does to ``found``."""
    mi = msgspec.inspect
    key = id(info)
    if key in done:
        return done[key]
    done[key] = key in found  # while it is being looked at (a type referring to itself)
    parts: list[msgspec.inspect.Type]
    if isinstance(info, mi.AnyType):
        parts = []
    elif isinstance(info, mi.Metadata):
        parts = [info.type]
    elif isinstance(info, (mi.StructType, mi.DataclassType, mi.TypedDictType,
                           mi.NamedTupleType)):
        parts = [field.type for field in info.fields]
    elif isinstance(info, (mi.ListType, mi.VarTupleType, mi.SetType, mi.FrozenSetType)):
        parts = [info.item_type]
    elif isinstance(info, mi.TupleType):
        parts = list(info.item_types)
    elif isinstance(info, (mi.DictType, mi.FrozenDictType)):
        parts = [info.key_type, info.value_type]
    elif isinstance(info, mi.UnionType):
        parts = list(info.types)
    else:
        parts = []
    # Every part is looked at (no short cut): the walk asks of each whether it holds Any.
    # A datetime or time is checked too (_zone_gap): its time zone may not survive JSON.
    # So is a Struct with subclasses: one of them with fields of its own would lose them.
    held = (isinstance(info, (mi.AnyType, mi.DateTimeType, mi.TimeType))
            or (isinstance(info, mi.StructType) and bool(_cls(info).__subclasses__()))) | any(
        [_mark_any(p, found, done) for p in parts])
    done[key] = held
    if held:
        found.add(key)
    return held


def any_gap(value: Any, parts: _AnyParts) -> tuple[str, str] | None:
    """Where a part of the State ``value`` typed Any holds what JSON cannot carry as itself
    (``json_gap``): saved, it would come back to the next Step as another value. Walks only
    the parts typed Any (and what leads to them); a value not of the shape its type says
    (decoding checked it against the type: a dict for a Struct, say) is not walked there."""
    mi = msgspec.inspect
    found = parts.found
    stack: list[tuple[Any, msgspec.inspect.Type, Any]] = [(value, parts.root, None)]
    while stack:
        item, info, place = stack.pop()
        if id(info) not in found:
            continue
        if isinstance(info, mi.AnyType):
            gap = json_gap(item, place, _KEPT_GAPS)
            if gap is not None:
                return gap
        elif isinstance(info, (mi.DateTimeType, mi.TimeType)):
            gap = _zone_gap(item, place)
            if gap is not None:
                return gap
        elif isinstance(info, mi.Metadata):
            stack.append((item, info.type, place))
        elif isinstance(info, mi.UnionType):
            # A Struct of a type the union names is walked as that type only: one member's
            # subclass may be another member (tagged), which the decode keeps as itself.
            exact = [m for m in info.types
                     if isinstance(m, mi.StructType) and type(item) is _cls(m)]
            stack.extend((item, member, place) for member in exact or info.types)
        elif isinstance(info, (mi.StructType, mi.DataclassType, mi.NamedTupleType)):
            cls = _cls(info)
            if isinstance(info, mi.StructType) and isinstance(item, cls) and (
                    type(item) is not cls):
                lost = extra_fields(item, cls)
                if lost:
                    base = cls.__name__
                    return (f"{json_path(place)} is {a_an(type(item).__name__)}, a subclass "
                            f"of its declared type {base}, with fields {base} does not have "
                            f"({', '.join(lost)}): it would be saved as {base}, and the next "
                            "Step would get it without them",
                            f"Declare them in {base}, or store {a_an(base)}.")
            if isinstance(item, cls):
                stack.extend((getattr(item, f.name), f.type, (place, f.encode_name))
                             for f in info.fields)
        elif isinstance(info, mi.TypedDictType):
            if isinstance(item, dict):
                stack.extend((item[f.name], f.type, (place, f.encode_name))
                             for f in info.fields if f.name in item)
        elif isinstance(info, (mi.ListType, mi.VarTupleType, mi.SetType, mi.FrozenSetType)):
            if isinstance(item, (list, tuple, set, frozenset)):
                stack.extend((part, info.item_type, (place, i)) for i, part in enumerate(item))
        elif isinstance(info, mi.TupleType):
            if isinstance(item, (list, tuple)):
                pairs = zip(item, info.item_types, strict=False)  # lengths: decode checked
                stack.extend((part, kind, (place, i)) for i, (part, kind) in enumerate(pairs))
        elif isinstance(info, (mi.DictType, mi.FrozenDictType)) and isinstance(item, dict):
            key_type = info.key_type
            while isinstance(key_type, mi.Metadata):  # Annotated[datetime, Meta(tz=True)]
                key_type = key_type.type
            keyed = isinstance(key_type, mi.AnyType)
            # A key is a datetime's (time's) text as a value is: its zone's rules are lost
            # the same way, and two keys that JSON writes alike would become one.
            zoned = isinstance(key_type, (mi.DateTimeType, mi.TimeType))
            for key, part in item.items():
                if keyed and not isinstance(key, str):
                    return json_gap({key: None}, place, _KEPT_GAPS)
                if zoned:
                    named = f"a key of {json_path(place)} ({clip(str(key), 60)})"
                    gap = _zone_gap(key, place, named)
                    if gap is not None:
                        return gap
                stack.append((part, info.value_type, (place, key)))
    return None


# The names of UTC's zones (ZoneInfo's keys, pytz's and dateutil's UTC): at offset 0 always,
# so JSON's "Z" (timezone.utc) loses nothing of them.
_UTC_NAMES: Final = frozenset({"UTC", "Etc/UTC", "Etc/Universal", "Etc/Zulu", "Universal", "GMT",
                               "Etc/GMT", "Zulu", "tzutc()"})


def _zone_gap(item: Any, place: Any, named: str | None = None) -> tuple[str, str] | None:
    """Where a State's datetime (or time) has a time zone JSON cannot carry, and the fix.
    JSON (RFC 3339) keeps a UTC offset, to the minute, and no zone: a ZoneInfo's datetime
    came back to the next Step at a fixed offset (its daylight-saving rules gone, so adding a
    day across a change gave the wrong hour), a time's ZoneInfo (which has no offset without
    a date) was dropped, and an offset with seconds was rounded (another instant)."""
    if not isinstance(item, (datetime.datetime, datetime.time)) or item.tzinfo is None:
        return None
    subject = json_path(place) if named is None else named  # named: a dict key's words
    zone = item.tzinfo
    offset = item.utcoffset()
    kind = type(item).__name__
    fix = ("Store it in UTC (`value.astimezone(datetime.timezone.utc)` for a datetime) and "
           "keep the zone's name in a str field (`zoneinfo.ZoneInfo(name)` rebuilds it), or "
           "give it a fixed offset of whole minutes (`datetime.timezone(timedelta(hours=1))`).")
    if offset is None:
        return (f"{subject} is a {kind} in time zone {str(zone)!r}, which has no "
                "UTC offset without a date: JSON would keep no zone at all, and the next Step "
                f"would get a naive {kind}", fix)
    if offset % datetime.timedelta(minutes=1):
        return (f"{subject} is a {kind} at UTC offset {offset}, which JSON writes to "
                f"the minute: the next Step would get another {kind}", fix)
    fixed = datetime.timezone(offset)
    if not offset and str(zone) in _UTC_NAMES:
        return None  # UTC by another class (ZoneInfo("UTC"), pytz.utc): it has no rules
    if type(zone) is not datetime.timezone or str(zone) != str(fixed):
        return (f"{subject} is a {kind} in time zone {str(zone)!r}, of which JSON "
                f"keeps only the UTC offset ({fixed}): the next Step would get a {kind} at "
                "that fixed offset, without the zone's name or its daylight-saving rules",
                fix)
    return None


def extra_fields(value: Any, declared: type) -> list[str]:
    """The fields of the Struct ``value`` (of a subclass of ``declared``) that ``declared``
    lacks: a decode as ``declared`` drops them."""
    own = getattr(type(value), "__struct_fields__", ())
    known = set(getattr(declared, "__struct_fields__", ()))
    return [name for name in own if name not in known]


def _check_subclass(value: Any, state_type: type, where: str | Step[Any]) -> None:
    """Refuse a State of a subclass of ``state_type`` with fields of its own: it is saved
    as ``state_type`` decodes it, so the next Step would get it without them."""
    lost = extra_fields(value, state_type)
    if not lost:
        return
    if not isinstance(where, str):
        where = where.where
    shown, base = type(value).__name__, state_type.__name__
    raise IntloomError(
        "STAGE_STATE_INVALID",
        f"{where}: the Stage State it left is {a_an(shown)}, a subclass of the Stage's State "
        f"type {base}, with fields {base} does not have ({', '.join(lost)}): it is saved as "
        f"{base}, so the next Step would get it without them. Declare them in {base}, or "
        f"assign {a_an(base)}; this State was not saved.",
    )


def _check_any(value: Any, parts: _AnyParts, where: str | Step[Any]) -> None:
    """Refuse the State ``value`` when a part of it typed Any holds what JSON cannot carry
    (``any_gap``): the next Step would get another value than the one left."""
    gap = any_gap(value, parts)
    if gap is not None:
        if not isinstance(where, str):
            where = where.where
        raise IntloomError(
            "STAGE_STATE_INVALID",
            f"{where}: the Stage State it left cannot be saved as it is: {gap[0]}. {gap[1]} "
            "This State was not saved.",
        )


def _nonfinite(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` holds a NaN or an infinite float (an error path only)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if depth > 100:
        return False
    if isinstance(value, msgspec.Struct):
        value = msgspec.structs.asdict(value)
    if isinstance(value, dict):
        return any(_nonfinite(v, depth + 1) for v in value.values())
    if isinstance(value, list | tuple | set | frozenset):
        return any(_nonfinite(v, depth + 1) for v in value)
    return False


def nonfinite_note(exc: Exception, value: Any) -> str:
    """Why a decode of ``value`` encoded said "got null" of a float field (an error path):
    JSON has no NaN or infinity, msgspec writes them as null, and the decode then says so of
    a field that was never set to None. Empty when that is not the case."""
    return (" (JSON cannot hold NaN or infinity: a float field holding one is written as "
            "null)" if "got `null`" in str(exc) and _nonfinite(value) else "")


def encode_state(value: Any, where: str | Step[Any], state_type: type | None,
                  slot: Keeps | None = None) -> bytes | None:
    """The State's journal bytes; ``where`` names the Step (or initialiser) that set it.

    A Step is passed as itself and named only on failure: reading ``Step.where`` (then a
    cached_property) for every Step measured ~2.4k more instructions per Step (~1.7 %,
    callgrind, one sync Run).

    Encoding checks no field type (``items.append("x")`` into a ``list[int]`` encodes), and a
    restart keeps a State only if it decodes as ``state_type`` and re-encodes to the same
    bytes (``_mismatch``). So the bytes are decoded here, where the Step can still be named;
    when they might not re-encode the same (``state_codec``), the decoded value's encoding
    is saved instead: an int in a float field is saved as the float every later decode
    gives anyway. Given the ``slot`` (a Step's result, a Stage's first State: another Step
    follows at once), the decoded value is kept on it for the next Step's context
    (``Driver._ctx``), which would decode the same bytes: the check costs no extra decode.
    Not for a wait, which may last: the Run would hold its State twice all that time.
    """
    if value is None:
        return None
    try:
        data = msgspec.json.encode(value)
    except RecursionError:
        if not isinstance(where, str):
            where = where.where
        raise IntloomError(
            "STAGE_STATE_INVALID",
            f"{where}: the Stage State it left ({type(value).__name__}) holds itself, or is "
            "nested too deeply, to be encoded as JSON (RecursionError). Keep it a tree of "
            "plain data (no list, dict or Struct inside itself) a few hundred levels deep at "
            "most; this State was not saved.",
        ) from None
    except UNENCODABLE as exc:
        if not isinstance(where, str):
            where = where.where
        lone = _lone_surrogate(value) if isinstance(exc, UnicodeEncodeError) else None
        if lone is not None:
            raise IntloomError(
                "STAGE_STATE_INVALID",
                f"{where}: the Stage State it left ({type(value).__name__}) holds text that is "
                f"not valid Unicode: {lone}. A lone surrogate comes from bytes decoded with "
                "errors='surrogateescape' (os.fsdecode, a file name); decode them with "
                "errors='replace', keep their hex, or keep the bytes in a `bytes` field; "
                "this State was not saved.",
            ) from None
        part = unencodable_part(value)
        raise IntloomError(
            "STAGE_STATE_INVALID",
            f"{where}: the Stage State it left ({type(value).__name__}) cannot be encoded as "
            f"JSON ({f'{part}: ' if part else ''}{exc}). Keep its fields to plain data (str, "
            "numbers, bools, None, lists, dicts, msgspec Structs).",
        ) from None
    if state_type is None:
        return data
    decode, same, resave, builds = CODECS.get(state_type) or state_codec(state_type)
    try:
        decoded = decode(data)
    except msgspec.DecodeError as exc:
        if not isinstance(where, str):
            where = where.where
        why = nonfinite_note(exc, value)
        raise IntloomError(
            "STAGE_STATE_INVALID",
            f"{where}: the Stage State it left is not a valid {state_type.__name__}: "
            f"{exc}{why}. Give every field of {state_type.__name__} a value of its declared "
            "type; this State was not saved.",
        ) from None
    if not same or type(value) is not state_type:
        if type(value) is not state_type:
            _check_subclass(value, state_type, where)
        if resave is False:
            data = msgspec.json.encode(decoded)
        elif resave is True:
            # A set iterates in an order the process's hash seed decides; a restart must
            # re-encode the State to these same bytes, so sets (and with them dict keys)
            # are saved sorted, and the next Step gets the State as saved, not as left.
            data = deterministic_json(decoded)
            decoded = decode(data)
        else:  # parts typed Any: checked, then saved as the other States are
            _check_any(value, resave, where)
            if same is None and type(value) is state_type:
                pass  # it re-encodes as is (state_codec)
            elif resave.sets:
                data = deterministic_json(decoded)  # as above
                decoded = decode(data)
            else:
                data = msgspec.json.encode(decoded)
    if builds:
        sets = resave is True or (not isinstance(resave, bool) and resave.sets)
        data, decoded = _settled(data, decode, where, state_type, sets)
    if slot is not None:
        slot.decoded = (data, decoded)
    return data


def _settled(data: bytes, decode: Callable[[bytes], Any], where: str | Step[Any],
             state_type: type, sets: bool) -> tuple[bytes, Any]:
    """The bytes to save for a State type whose decode runs a ``__post_init__``, and what the
    next Step gets: ``data`` when they read back as themselves, as a restart checks
    (compat.state_problem); else the State as one read leaves it, when that reads back as
    itself (a ``__post_init__`` that normalises: strips, lowercases); else refused. One that
    changes fields at every read (appends to a list, say) changed the State at every Step,
    unnoticed, and the restart then held the Run, saying its code had changed, when nothing
    had."""
    from intloom.authoring.compat import deterministic_json

    again = decode(data)
    if data in (msgspec.json.encode(again), deterministic_json(again)):
        return data, again
    # Saved as the other States are: sets in order, dicts as they are otherwise.
    settled = deterministic_json(again) if sets else msgspec.json.encode(again)
    twice = decode(settled)
    if settled in (msgspec.json.encode(twice), deterministic_json(twice)):
        return settled, twice
    if not isinstance(where, str):
        where = where.where
    raise IntloomError(
        "STAGE_STATE_INVALID",
        f"{where}: the Stage State it left does not read back as itself: saved as "
        f"{clip(settled.decode('utf-8', 'replace'), 200)}, it decodes as "
        f"{state_type.__name__} to "
        f"{clip(msgspec.json.encode(twice).decode('utf-8', 'replace'), 200)} (a "
        "__post_init__ that changes fields again at every read runs at each Step, and at a "
        "restart, which would then hold the Run). Make __post_init__ give a State it has "
        "already built back as it is (only check, or set what is missing); this State was "
        "not saved.",
    )


def _lone_surrogate(value: Any) -> str | None:
    """``$.files[2] ('a\\udcff') holds a lone surrogate, '\\udcff' at index 1``: the first
    text (a value or a dict key) of the State ``value`` that UTF-8 cannot carry, by its path
    as the State is encoded (a renamed field by its encoded name), or None (an error path)."""
    try:
        plain = msgspec.to_builtins(value, str_keys=False)
    except (Exception, RecursionError):
        return None
    stack: list[tuple[Any, Any, int]] = [(plain, None, 0)]
    while stack:
        item, place, depth = stack.pop()
        texts: list[tuple[str, str]] = []
        if isinstance(item, str):
            texts.append((item, json_path(place)))
        elif depth < MAX_DEPTH and isinstance(item, dict):
            for key, part in reversed(item.items()):
                if isinstance(key, str):
                    texts.append((key, f"a key of {json_path(place)}"))
                stack.append((part, (place, key), depth + 1))
        elif depth < MAX_DEPTH and isinstance(item, (list, tuple, set, frozenset)):
            stack.extend((part, (place, i), depth + 1)
                         for i, part in reversed(list(enumerate(item))))
        for text, named in texts:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                return (f"{named} ({clip(repr(text), 60)}) holds a lone surrogate, "
                        f"{text[exc.start]!r} at index {exc.start}")
    return None
