"""Terminal prompts for a pending question or confirmation (``intloom attach``).

Prompts and what they show go to stderr; only the Run's final view goes to stdout. A
prompt that is cancelled (Ctrl-C, EOF) raises ``typer.Abort``: the Run keeps waiting.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
import typer

__all__ = ["prompt_answer"]


def _show(text: str) -> None:
    typer.echo(text, err=True)


def _confirmation(request: Any) -> dict[str, Any]:
    context = request.get("context") if isinstance(request, Mapping) else request
    _show("Confirmation requested:")
    _show(msgspec.json.format(msgspec.json.encode(context), indent=2).decode("utf-8"))
    # No default: a stray Enter must not decide (declining may re-run earlier Steps).
    confirmed = typer.confirm("Confirm?", default=None, err=True)
    feedback = str(
        typer.prompt("Feedback (optional, Enter to skip)", default="", show_default=False, err=True)
    )
    answer: dict[str, Any] = {"isConfirmed": confirmed}
    if feedback.strip():
        answer["feedback"] = feedback
    return answer


def _question(question: Mapping[str, Any]) -> dict[str, Any]:
    qid = str(question.get("id"))
    skippable = bool(question.get("isSkippable", False))
    _show(f"{question.get('question', qid)}")
    if question.get("description"):
        _show(f"  {question['description']}")
    options = [o for o in question.get("options") or [] if isinstance(o, Mapping)]
    for number, option in enumerate(options, start=1):
        extra = f" ({option['description']})" if option.get("description") else ""
        _show(f"  {number}. {option.get('label', option.get('id'))}{extra}")
    hint = "a number or your own answer" if options else "your answer"
    if skippable:
        hint += "; Enter skips"
    while True:
        raw = str(typer.prompt(f"[{hint}]", default="", show_default=False, err=True)).strip()
        if not raw and skippable:
            return {"questionId": qid, "isSkipped": True}
        if raw.isdigit() and 1 <= int(raw) <= len(options):
            option = options[int(raw) - 1]
            return {
                "questionId": qid,
                "isSkipped": False,
                "answer": str(option.get("label", option.get("id"))),
            }
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
