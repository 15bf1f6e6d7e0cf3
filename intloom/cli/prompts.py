"""Terminal prompts for a pending question or confirmation (``intloom attach``).

Prompts and what they show go to stderr; only the Run's final view goes to stdout. A
prompt that is cancelled (Ctrl-C, EOF) raises ``typer.Abort``: the Run keeps waiting.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
import typer

from intloom.cli.render import printable

__all__ = ["prompt_answer"]


def _show(text: str) -> None:
    """A line of what is asked: Workflow text, escaped as the Renderer escapes it."""
    typer.echo(printable(text), err=True)


def _confirmation(request: Any) -> dict[str, Any]:
    context = request.get("context") if isinstance(request, Mapping) else request
    _show("Confirmation requested:")
    for line in msgspec.json.format(msgspec.json.encode(context), indent=2).splitlines():
        _show(line.decode("utf-8"))
    # No default: a stray Enter must not decide (declining may re-run earlier Steps).
    confirmed = typer.confirm("Confirm?", default=None, err=True)
    feedback = str(
        typer.prompt("Feedback (optional, Enter to skip)", default="", show_default=False, err=True)
    )
    answer: dict[str, Any] = {"isConfirmed": confirmed}
    if feedback.strip():
        answer["feedback"] = feedback
    return answer


def _option_line(number: int, option: Mapping[str, Any]) -> str:
    """``  2. won't fix [wontfix] (close it as is)``: the id is what picking it answers."""
    oid = str(option.get("id"))
    label = str(option.get("label") or oid)
    shown = label if label == oid else f"{label} [{oid}]"
    extra = f" ({option['description']})" if option.get("description") else ""
    return f"  {number}. {shown}{extra}"


def _question(question: Mapping[str, Any]) -> dict[str, Any]:
    """One question's answer entry. A number picks an option and answers with its id (the
    stable identifier a Step routes on; the label is for people and may change); any other
    text is the answer as typed (options are suggestions)."""
    qid = str(question.get("id"))
    skippable = bool(question.get("isSkippable", False))
    _show(f"{question.get('question', qid)}")
    if question.get("description"):
        _show(f"  {question['description']}")
    options = [o for o in question.get("options") or [] if isinstance(o, Mapping)]
    for number, option in enumerate(options, start=1):
        _show(_option_line(number, option))
    hint = "a number or your own answer" if options else "your answer"
    if skippable:
        hint += "; Enter skips"
    while True:
        raw = str(typer.prompt(f"[{hint}]", default="", show_default=False, err=True)).strip()
        if not raw and skippable:
            return {"questionId": qid, "isSkipped": True}
        # ASCII digits only: str.isdigit() also accepts "²", which int() refuses.
        if options and raw.isascii() and raw.isdigit():
            number = int(raw)
            if 1 <= number <= len(options):
                option = options[number - 1]
                return {"questionId": qid, "isSkipped": False, "answer": str(option.get("id"))}
            # A mistyped pick must not become the answer "7": a Step routing on option ids
            # would fail on it.
            _show(
                f"There is no option {number}: type a number from 1 to {len(options)}, or "
                "your own answer (a number alone always picks an option; to answer with a "
                "number, use intloom answer)."
            )
            continue
        if raw:
            return {"questionId": qid, "isSkipped": False, "answer": raw}
        _show("This question needs an answer.")


def prompt_answer(action: Mapping[str, Any]) -> Any:
    """Ask a person for the answer to ``action`` (a PendingAction as plain data)."""
    request = action.get("request")
    if action.get("kind") == "confirmation":
        return _confirmation(request)
    questions = [q for q in request or [] if isinstance(q, Mapping)]
    return [_question(q) for q in questions]
