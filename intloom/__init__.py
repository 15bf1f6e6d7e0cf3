"""intloom: durable agent workflows on a local run host.

The authoring API is re-exported here. Names load lazily so that ``python -m intloom`` (the
CLI) does not pay for importing the authoring layer on every command.
"""

from __future__ import annotations

from importlib import import_module

# Not typing's: the console script imports this package before the CLI's Ctrl-C guard
# (intloom/cli/entry.py) can catch anything, and importing typing here took ~2 ms of that
# window: a Ctrl-C pressed just after Enter printed a traceback. Type checkers read any
# name TYPE_CHECKING as true.
TYPE_CHECKING = False

__version__ = "0.1.0"

__all__ = [
    "COMPLETE",
    "AgentResult",
    "AgentStep",
    "Confirmation",
    "IntloomError",
    "Option",
    "Question",
    "QuestionAnswer",
    "Recovery",
    "Stage",
    "Step",
    "StepContext",
    "ToStage",
    "Tool",
    "Workflow",
    "__version__",
]

_WHERE = {
    "COMPLETE": "intloom.authoring.workflow",
    "AgentResult": "intloom.authoring.agent",
    "AgentStep": "intloom.authoring.workflow",
    "Stage": "intloom.authoring.workflow",
    "Step": "intloom.authoring.workflow",
    "ToStage": "intloom.authoring.workflow",
    "Tool": "intloom.authoring.workflow",
    "Workflow": "intloom.authoring.workflow",
    "Confirmation": "intloom.authoring.interaction",
    "Option": "intloom.authoring.interaction",
    "Question": "intloom.authoring.interaction",
    "QuestionAnswer": "intloom.authoring.interaction",
    "Recovery": "intloom.authoring.context",
    "StepContext": "intloom.authoring.context",
    "IntloomError": "intloom.errors",
}

if TYPE_CHECKING:
    from typing import Any

    from intloom.authoring.agent import AgentResult
    from intloom.authoring.context import Recovery, StepContext
    from intloom.authoring.interaction import Confirmation, Option, Question, QuestionAnswer
    from intloom.authoring.workflow import (
        COMPLETE,
        AgentStep,
        Stage,
        Step,
        Tool,
        ToStage,
        Workflow,
    )
    from intloom.errors import IntloomError


# Not seen by type checkers: a module __getattr__ typed Any made every name imported from
# here check, a misspelt one too (`from intloom.client import RunVeiw` passed
# mypy --strict as Any, and failed at import).
if not TYPE_CHECKING:
    def __getattr__(name: str) -> Any:
        module = _WHERE.get(name)
        if module is None:
            raise AttributeError(f"module 'intloom' has no attribute {name!r}")
        value = getattr(import_module(module), name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted(__all__)
