"""Questions and confirmations: request shapes, answer shapes, and their validation (pure)."""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any, Final

import msgspec

from intloom.errors import IntloomError
from intloom.runtime.plainjson import MAX_DEPTH, deeper_than, json_path

__all__ = [
    "Confirmation",
    "Option",
    "Question",
    "QuestionAnswer",
    "confirmation_request",
    "json_gap",
    "questions_request",
    "unencodable_part",
    "validate_answer",
]


class Option(msgspec.Struct, frozen=True, omit_defaults=True):
    """A suggested answer to a Question: a person picks its ``label``; the answer is its
    ``id``."""

    id: str
    label: str
    description: str | None = None


class Question(
    msgspec.Struct, frozen=True, omit_defaults=True, rename={"skippable": "isSkippable"}
):
    """One question for a person. ``options`` are suggestions; the answer is free text."""

    id: str
    question: str
    description: str | None = None
    options: list[Option] | None = None
    skippable: bool = False


class Confirmation(
    msgspec.Struct,
    frozen=True,
    omit_defaults=True,
    forbid_unknown_fields=True,
    rename={"confirmed": "isConfirmed"},
):
    """A person's answer to a confirmation: ``{"isConfirmed": bool, "feedback"?: str}``."""

    confirmed: bool
    feedback: str | None = None


class QuestionAnswer(
    msgspec.Struct,
    frozen=True,
    omit_defaults=True,
    forbid_unknown_fields=True,
    rename={"question_id": "questionId", "skipped": "isSkipped"},
):
    """One entry of a questions answer: skipped, or answered with non-blank text."""

    question_id: str
    skipped: bool
    answer: str | None = None


# Deeper than any task or context means to be, and well below what the journal can read back
# (a record nested ~975 levels, written on the loop, failed to decode at the next start: its
# Run was held, and before that the host failed to start). A value that holds itself is left
# to the encoders, which name it (RecursionError).
_MAX_DEPTH: Final = MAX_DEPTH
_SCALARS: Final = frozenset({str, int, bool, type(None)})
# What a JSON decode gives back as itself (None and bool are among the scalars above).
_JSON_KINDS: Final = (dict, list, str, int, float)
_FIX_SET: Final = "Pass a sorted list instead (sorted(...))."
_FIX_BYTES: Final = ("Pass text instead: decode it to str (or base64-encode it yourself, if "
                     "its reader expects that).")
_FIX_FLOAT: Final = 'Pass None or a string ("nan") instead, or leave the field out.'
_FIX_KEY: Final = "Use string keys ({str(k): v for k, v in ...})."
_FIX_DEEP: Final = f"Pass a tree of plain data at most {MAX_DEPTH} levels deep."


# What json_gap says of each kind of gap in a value sent to a client or an Agent (a fact
# completed by the gap's item and its type's name, then the fix).
SENT_GAPS: Final = {
    "float": ("is {item!r}, which JSON cannot carry (it has no NaN or infinity)", _FIX_FLOAT),
    "set": ("is a set, which JSON cannot carry (it would be sent as a list, in no set order)",
            _FIX_SET),
    "bytes": ("is bytes, which JSON cannot carry (it would be sent as base64 text)",
              _FIX_BYTES),
    "key": ("has the key {item!r} ({kind}), which JSON cannot carry (its keys are strings)",
            _FIX_KEY),
    "deep": (f"is nested more than {MAX_DEPTH} levels deep, deeper than intloom reads back "
             "from its journal", _FIX_DEEP),
}


def json_gap(value: Any, at: Any = None, says: dict[str, tuple[str, str]] = SENT_GAPS
             ) -> tuple[str, str] | None:
    """Where ``value``, as a Step built it, holds what JSON cannot carry as itself -- a set,
    bytes, NaN or an infinity, a key that is not a string -- and the fix; None when nothing
    does. Asked of the value itself: msgspec.to_builtins, which prepares it for the wire,
    turns a set into a list in no set order and bytes into base64 text, and keeps NaN, which
    the JSON a client reads has no token for; the client would get another value, silently.
    The same values a client sends are refused (runtime/plainjson.py), and a Tool's output.
    ``at``: where ``value`` sits in what holds it (json_path's place), for the path named;
    ``says``: the words for each kind of gap (``SENT_GAPS``'s keys; with ``type`` and
    ``tuple`` too, a tuple and a value JSON holds only converted are gaps)."""
    stack: list[tuple[Any, tuple[Any, str | int] | None, int]] = [(value, at, 0)]
    # Each container is walked once: one a value holds in two places has the same gaps in
    # both, and one that holds itself twice has 2**depth paths (the walk never ended).
    seen: set[int] = set()

    def gap(kind: str, place: Any, item: Any) -> tuple[str, str]:
        fact, fix = says[kind]
        return (f"{json_path(place)} {fact.format(item=item, kind=type(item).__name__)}",
                fix)

    # Kept (a State part typed Any, which the next Step gets back from JSON): a tuple, and
    # anything JSON holds only converted, are gaps too; sent, they are shown as JSON has them.
    kept = "type" in says
    while stack:
        item, place, depth = stack.pop()
        kind = type(item)
        if kind in _SCALARS:
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                return gap("float", place, item)
            continue
        if isinstance(item, (set, frozenset)):
            return gap("set", place, item)
        if isinstance(item, (bytes, bytearray, memoryview)):
            return gap("bytes", place, item)
        if kept:
            if isinstance(item, tuple):
                return gap("tuple", place, item)
            if isinstance(item, enum.Enum) or not isinstance(item, _JSON_KINDS):
                return gap("type", place, item)
        if id(item) in seen:
            continue
        if depth >= _MAX_DEPTH:
            if isinstance(item, (list, tuple, dict, msgspec.Struct)) or (
                    dataclasses.is_dataclass(item) and not isinstance(item, type)):
                # Named where the walk began: the item's own path is _MAX_DEPTH steps long.
                return gap("deep", at, item)
            continue
        seen.add(id(item))
        if isinstance(item, (list, tuple)):
            stack.extend((part, (place, i), depth + 1) for i, part in enumerate(item)
                         if type(part) not in _SCALARS)
        elif isinstance(item, dict):
            for key, part in item.items():
                if not isinstance(key, str):
                    return gap("key", place, key)
                if type(part) not in _SCALARS:
                    stack.append((part, (place, key), depth + 1))
        elif isinstance(item, msgspec.Struct):
            stack.extend((getattr(item, f.name), (place, f.encode_name), depth + 1)
                         for f in msgspec.structs.fields(item))
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            stack.extend((getattr(item, f.name), (place, f.name), depth + 1)
                         for f in dataclasses.fields(item))
    return None


def unencodable_part(value: Any) -> str | None:
    """``$.meta.handle is object``: the first part of ``value`` msgspec's JSON encoder
    refuses, by its path as encoded (a renamed field by its encoded name), or None (when no
    single part is to blame). On an error path only: "cannot be encoded as JSON (Encoding
    objects of type object is unsupported)" left the user to search a whole State for it."""
    stack: list[tuple[Any, tuple[Any, str | int] | None, int]] = [(value, None, 0)]
    seen: set[int] = set()
    while stack:
        item, place, depth = stack.pop()
        if (type(item) in _SCALARS and type(item) is not int) or item is msgspec.UNSET:
            continue  # (an int may have more digits than JSON text takes; UNSET is left out)
        parts: list[tuple[str | int, Any]] | None = None
        if id(item) not in seen and depth < _MAX_DEPTH:
            if isinstance(item, msgspec.Struct):
                parts = [(f.encode_name, getattr(item, f.name))
                         for f in msgspec.structs.fields(item)]
            elif dataclasses.is_dataclass(item) and not isinstance(item, type):
                parts = [(f.name, getattr(item, f.name)) for f in dataclasses.fields(item)]
            elif isinstance(item, dict):
                for key in item:
                    try:
                        msgspec.json.encode({key: None})
                    except (TypeError, OverflowError, msgspec.EncodeError, UnicodeEncodeError,
                            RecursionError, ValueError):
                        return f"{json_path(place)} has the key {key!r} ({type(key).__name__})"
                parts = [(key if isinstance(key, str) else repr(key), part)
                         for key, part in item.items()]
            elif isinstance(item, (list, tuple, set, frozenset)):
                parts = list(enumerate(item))
        if parts is not None:
            seen.add(id(item))
            stack.extend((part, (place, key), depth + 1) for key, part in reversed(parts))
            continue
        try:
            msgspec.json.encode(item)
        except (TypeError, OverflowError, msgspec.EncodeError, UnicodeEncodeError,
                RecursionError, ValueError):
            return f"{json_path(place)} is {type(item).__name__}"
    return None


def confirmation_request(context: Any, where: str) -> dict[str, Any]:
    """The wire request of a confirmation; ``context`` must be JSON-encodable. ``where``
    names the Step asking (``Stage 'a', Step 'b'``), for the error."""
    gap = json_gap(context)
    if gap is not None:
        raise IntloomError(
            "STEP_INTERACTION_INVALID",
            f"{where}: the context given to ctx.confirm cannot be shown as it is: {gap[0]}; "
            f"nothing was recorded and nobody was asked. {gap[1]}",
        )
    try:
        msgspec.json.encode(context)
        # Encodable here, but a restart decodes the request from deeper in the stack.
        too_deep = deeper_than(msgspec.to_builtins(context))
    except RecursionError:
        too_deep = True
    except (TypeError, msgspec.EncodeError, UnicodeEncodeError, ValueError) as exc:
        part = unencodable_part(context)
        raise IntloomError(
            "STEP_INTERACTION_INVALID",
            f"{where}: the context given to ctx.confirm is not JSON-encodable "
            f"({f'{part}: ' if part else ''}{exc}). Pass plain data (str, numbers, bools, "
            "None, lists, dicts, msgspec Structs).",
        ) from None
    if too_deep:
        raise IntloomError(
            "STEP_INTERACTION_INVALID",
            f"{where}: the context given to ctx.confirm holds itself, or is nested too deeply "
            f"(more than {MAX_DEPTH} levels), to be recorded. Pass a tree of plain data a few "
            "hundred levels deep at most; a person reads it at a prompt.",
        )
    return {"context": context}


def _repeated(ids: list[str]) -> list[str]:
    return sorted({i for i in ids if ids.count(i) > 1})


def _wrong_field(where: str, index: int, shown: str) -> IntloomError:
    return IntloomError(
        "STEP_INTERACTION_INVALID",
        f"{where}: question {index} given to ctx.ask has a field of the wrong type "
        f"({shown}); nothing was asked. Give each field of intloom.Question its declared "
        "type: id, question, description, and each option's id and label, as str "
        "(id=str(n) for a number: an answer names its question by that text); options as a "
        "list of intloom.Option (options=[intloom.Option(id=\"yes\", label=\"Yes\")], not "
        "[\"yes\"]); skippable as bool.",
    )


def _check_blank(where: str, index: int, q: Question) -> None:
    """A blank option id could never be picked: a pick answers with the option's id, and a
    blank answer is refused, so the person at ``intloom attach`` was told the option they
    chose "needs a non-blank answer" and the Run could only go on with typed text. A blank
    question shows a person nothing to answer, and a blank id is an answer's only name for
    its question (the CLI printed ``"questionId":""`` to send)."""
    said = f"{where}: question {index} given to ctx.ask"
    if not q.id.strip():
        fact, fix = (f"has the blank id {q.id!r}",
                     'Give it an id an answer can name it by (id="topic").')
    elif not q.question.strip():
        fact, fix = (f"({q.id!r}) has the blank text {q.question!r}",
                     "Give it the question a person reads and answers (question=\"...?\").")
    else:
        blank = [o for o in q.options or [] if not o.id.strip()]
        if not blank:
            return
        fact, fix = (f"({q.id!r}) has an option with the blank id {blank[0].id!r} (label "
                     f"{blank[0].label!r}), which a person could pick but never send: a "
                     "picked option answers with its id, and a blank answer is refused",
                     'Give every option a non-blank id (intloom.Option(id="none", '
                     'label="None of these")).')
    raise IntloomError("STEP_INTERACTION_INVALID", f"{said} {fact}; nothing was asked. {fix}")


def questions_request(questions: list[Question], where: str) -> list[Any]:
    """The wire request of ``ctx.ask``; ``where`` names the Step asking, for the errors."""
    if not questions:
        raise IntloomError(
            "STEP_INTERACTION_INVALID",
            f"{where}: ctx.ask was given no questions. Pass at least one intloom.Question.",
        )
    # Field types before the id checks, which read ids and options as their types:
    # options=["yes", "no"] failed the Step with "AttributeError: 'str' object has no
    # attribute 'id'", and an id that is a list with "TypeError: unhashable type".
    wire: list[dict[str, Any]] = []
    for index, question in enumerate(questions):
        try:
            item = msgspec.to_builtins(question)
        except RecursionError:  # a Struct checks no field type: one may hold itself
            raise IntloomError(
                "STEP_INTERACTION_INVALID",
                f"{where}: a question given to ctx.ask holds itself, or is nested too deeply, "
                "to be encoded (RecursionError). Give each field of intloom.Question its "
                "declared type (str; a list of intloom.Option for options).",
            ) from None
        except TypeError as exc:  # a field holding what is no plain data (an object())
            raise _wrong_field(where, index, str(exc)) from None
        wire.append(item)
        try:
            # A Struct checks no field type when built: Question(id=0) was asked, and no
            # answer could name it (an answer's questionId is text), so the Run waited for
            # ever on a question its own answer command could not answer.
            msgspec.convert(item, Question)
        except msgspec.ValidationError as exc:
            raise _wrong_field(where, index, str(exc).replace("`$", f"`question {index}", 1)
                               ) from None
    for index, q in enumerate(questions):
        _check_blank(where, index, q)
    ids = [q.id for q in questions]
    if len(set(ids)) != len(ids):
        raise IntloomError(
            "STEP_INTERACTION_INVALID",
            f"{where}: the question ids given to ctx.ask repeat {_repeated(ids)} (all ids: "
            f"{ids}). Give every question of one ctx.ask its own id.",
        )
    for q in questions:
        option_ids = [o.id for o in q.options or []]
        if len(set(option_ids)) != len(option_ids):
            raise IntloomError(
                "STEP_INTERACTION_INVALID",
                f"{where}: the options of question {q.id!r} repeat the ids "
                f"{_repeated(option_ids)}. Give every option of a question its own id.",
            )
    for item, q in zip(wire, questions, strict=True):
        # Always present (the request's shape is {id, question, description?, options?,
        # isSkippable}); omit_defaults would drop it when false.
        item["isSkippable"] = q.skippable
    return wire


def _text_of_json(raw: Any) -> str:
    """What to say of an answer that is a string holding JSON (the text a CLI's answer
    takes, passed to ``Client.answer`` as it is): "got `str`" alone did not say why."""
    if not isinstance(raw, str) or not raw.lstrip().startswith(("{", "[")):
        return ""
    return (" It was given as a string of JSON text: pass the value itself (json.loads of "
            "the text) to Client.answer.")


def validate_answer(kind: str, request: Any, raw: Any) -> Confirmation | list[QuestionAnswer]:
    """The typed answer, or INVALID_REQUEST naming what is wrong. ``raw`` is decoded JSON."""
    if kind == "confirmation":
        try:
            return msgspec.convert(raw, Confirmation)
        except msgspec.ValidationError as exc:
            # A questions answer sent here: "Expected `object`, got `array`" alone did not
            # say that the action is of the other kind.
            other = (" This action is a confirmation, not questions."
                     if isinstance(raw, list) else _text_of_json(raw))
            raise IntloomError(
                "INVALID_REQUEST",
                f"A confirmation answer is {{\"isConfirmed\": bool, \"feedback\"?: str}} "
                f"({exc}).{other}",
            ) from None
    questions = {q["id"]: q for q in request}
    asked = ", ".join(map(repr, questions))
    try:
        answers = msgspec.convert(raw, list[QuestionAnswer])
    except msgspec.ValidationError as exc:
        other = (" This action asks questions, not for a confirmation."
                 if isinstance(raw, dict) and "isConfirmed" in raw else _text_of_json(raw))
        # The ids to answer: a person who sent the wrong shape has no entry to copy them from.
        raise IntloomError(
            "INVALID_REQUEST",
            "A questions answer is a list of {\"questionId\", \"isSkipped\", \"answer\"?} "
            f"({exc}), one entry for each question asked here: {asked}.{other}",
        ) from None
    seen: set[str] = set()
    for item in answers:
        q = questions.get(item.question_id)
        if q is None:
            raise IntloomError(
                "INVALID_REQUEST",
                f"Question id {item.question_id!r} is not asked here; answer only {asked}.",
            )
        if item.question_id in seen:
            raise IntloomError(
                "INVALID_REQUEST",
                f"Question {item.question_id!r} is answered twice; send one entry per question.",
            )
        seen.add(item.question_id)
        skippable = bool(q.get("isSkippable", False))
        if item.skipped:
            if not skippable:
                raise IntloomError(
                    "INVALID_REQUEST",
                    f"Question {item.question_id!r} cannot be skipped; send its answer with "
                    '"isSkipped": false.',
                )
            if item.answer is not None:
                raise IntloomError(
                    "INVALID_REQUEST",
                    f"Skipped question {item.question_id!r} has an answer; drop the answer, "
                    'or send it with "isSkipped": false.',
                )
        elif item.answer is None or not item.answer.strip():
            skip = ', or skip it with "isSkipped": true' if skippable else ""
            raise IntloomError(
                "INVALID_REQUEST",
                f'Question {item.question_id!r} needs a non-blank "answer"{skip}.',
            )
    missing = [question_id for question_id in questions if question_id not in seen]
    if missing:
        raise IntloomError(
            "INVALID_REQUEST",
            f"Questions not answered: {', '.join(map(repr, missing))}; send one entry for "
            f"each of {asked} (a skippable one with \"isSkipped\": true).",
        )
    # In the order the Step asked, whatever order the client sent: a Step reads answers[0]
    # as its first question's answer.
    order = {question_id: i for i, question_id in enumerate(questions)}
    return sorted(answers, key=lambda item: order[item.question_id])
