"""Declaring Workflows: Stages with a typed State, Steps routed on outcomes, Agent Steps.

Definition mistakes fail at once with ``WORKFLOW_DEFINITION_INVALID`` naming the Workflow,
the Stage, the Step and the fix; an outcome with no route fails the Run at run time with
``STEP_OUTCOME_NOT_HANDLED``.
"""

from __future__ import annotations

import collections
import hashlib
import inspect
import pathlib
import re
import sys
import types
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    Generic,
    TypeVar,
    Union,
    get_args,
    get_origin,
    overload,
)

import msgspec

from intloom.authoring.savecheck import encode_state, nonfinite_note
from intloom.errors import IntloomError, LoadInterrupted, a_an, as_call, clip, message_of
from intloom.runtime.limits import MAX_LABEL, MAX_TOOLS_BYTES

if TYPE_CHECKING:
    from intloom.authoring.agent import AgentResult
    from intloom.authoring.context import Recovery, StepContext

__all__ = [
    "COMPLETE",
    "AgentStep",
    "Complete",
    "DefinitionError",
    "Stage",
    "Step",
    "ToStage",
    "Tool",
    "Workflow",
    "callable_name",
]

S = TypeVar("S")
# A Stage State: checked at run time too (stage()), for users without a type checker.
StructT = TypeVar("StructT", bound=msgspec.Struct)
# \Z, not $: $ also matches before a final newline, which let "notes\n" through.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
# The loader imports each Workflow source under this prefix (+ a hash of its path), so two
# sources may share a file name; errors show a user's class without it (_shown_type).
WORKFLOW_MODULE_PREFIX: Final = "_intloom_wf_"


class Complete:
    """Route target that completes the Run."""

    _instance: Complete | None = None

    def __new__(cls) -> Complete:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "intloom.COMPLETE"


COMPLETE: Final = Complete()


@dataclass(frozen=True)
class ToStage:
    """Route target that enters another Stage (at its first Step, with a fresh State)."""

    stage: str

    def __post_init__(self) -> None:
        # Built before it is given to a Step, so only the call itself can be named. A list
        # here failed the whole source at load with "TypeError: unhashable type: 'list'",
        # naming neither the route nor the fix.
        # A Stage or Step object (a decorated function is a Step) was shown as
        # "<intloom.authoring.workflow.Stage object at 0x...>", its name nowhere.
        if isinstance(self.stage, Stage):
            raise IntloomError("WORKFLOW_DEFINITION_INVALID", (
                f"intloom.ToStage(...): the Stage name is Stage {self.stage.name!r} itself "
                "(what wf.stage(...) returned), not a string. Pass its name: "
                f'intloom.ToStage("{self.stage.name}").'))
        if isinstance(self.stage, Step):
            step, stage = self.stage.name, self.stage.stage.name
            raise IntloomError("WORKFLOW_DEFINITION_INVALID", (
                f"intloom.ToStage(...): the Stage name is Step {step!r} of Stage {stage!r} "
                "itself (what its decorator returned), not a string. ToStage enters a Stage "
                f'at its first Step: intloom.ToStage("{stage}"); within Stage {stage!r}, '
                f'route to the Step by its name: "{step}".'))
        if not isinstance(self.stage, str):
            raise IntloomError("WORKFLOW_DEFINITION_INVALID", (
                f"intloom.ToStage({self.stage!r}): the Stage name {_shown_value(self.stage)} "
                'is not a string. Pass the name of the Stage to enter, e.g. '
                'intloom.ToStage("publish").'))
        object.__setattr__(self, "stage", _plain(self.stage))  # frozen


Target = str | ToStage | Complete
# What the host calls, as a type checker sees a user's functions: a Step typed against
# another Stage's State, or returning no outcome string, was accepted (``Callable[..., Any]``)
# and failed only at run time. Sync or async: the host awaits what an ``async def`` returns.
StepFn = Callable[["StepContext[S]"], "str | Awaitable[str]"]
# None: it assigned ctx.state instead (as a Step does), or its Stage has no State.
InitFn = Callable[["StepContext[S]"], "S | Awaitable[S | None] | None"]
RecoverFn = Callable[["StepContext[S]", "Recovery"], "str | Awaitable[str]"]
CompleteFn = Callable[["StepContext[S]", "AgentResult"], "Awaitable[None] | None"]
AgentFn = Callable[["StepContext[S]"], Any]


@dataclass(frozen=True)
class Tool:
    """A capability a client Agent may call through the host, once per tool call id."""

    name: str
    fn: Callable[[Any], Any]  # called with the input the Agent sent
    description: str = ""

    def __post_init__(self) -> None:
        # A Tool is built before it is given to a Step, so no Workflow can be named yet: the
        # call itself is, as the author wrote it.
        where = f"intloom.Tool({self.name!r}, ...)"
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise IntloomError("WORKFLOW_DEFINITION_INVALID", (
                f"{where}: the Tool name {_name_fact(self.name)}. {_NAME_RULE}"))
        object.__setattr__(self, "name", _plain(self.name))  # frozen
        if not callable(self.fn):
            raise IntloomError("WORKFLOW_DEFINITION_INVALID", (
                f"{where}: fn {_shown_value(self.fn)} is not callable. Pass the function the "
                "Agent's calls run, e.g. intloom.Tool(\"search\", search)."))
        kind = generator_kind(self.fn)
        if kind is not None:
            # Calling one returns a generator, never what it yields: every call the Agent
            # made was refused at run time as "not plain JSON data", its body never run.
            shown = callable_name(self.fn)
            consume = (f"an async function (`async def tool(input): return [x async for x in "
                       f"{shown}(input)]`)" if kind == "an async generator" else
                       f"a normal function (`def tool(input): return list({shown}(input))`)")
            raise IntloomError("WORKFLOW_DEFINITION_INVALID", (
                f"{where}: {shown} is {kind} function (it has `yield`): calling it returns "
                f"{kind} object, never its result, and its body would never run. Return a "
                f"list instead of yielding, or consume the generator inside {consume} and "
                "pass that."))
        if not _accepts(self.fn, 1):
            raise IntloomError("WORKFLOW_DEFINITION_INVALID", (
                f"{where}: {callable_name(self.fn)}{_signature(self.fn)} cannot be called "
                "with one argument, the input the Agent sent. Declare it as "
                "`def tool(input): ...`."))
        if not isinstance(self.description, str):
            raise IntloomError("WORKFLOW_DEFINITION_INVALID", (
                f"{where}: description {_shown_value(self.description)} is not a string. "
                "Pass text, or leave it out."))
        object.__setattr__(self, "description", _plain(self.description))
        try:
            self.description.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate: no view could carry it
            raise IntloomError("WORKFLOW_DEFINITION_INVALID", (
                f"{where}: description holds {self.description[exc.start]!r} at character "
                f"{exc.start:,}, half of a surrogate pair, which no view of the task can "
                "carry. Pass valid Unicode text.")) from None


def _utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _shown_type(value: object) -> str:
    """A class as its author wrote it: ``St``, ``probe_state.Notes``, ``dict``. A Workflow
    module is imported under an internal name (``WORKFLOW_MODULE_PREFIX``), which means nothing
    to its author; the class's own name is what they can find in their file."""
    if not isinstance(value, type):
        return f"{value!r} ({a_an(type(value).__name__)}, not a class)"
    module = value.__module__
    if module == "builtins" or module.startswith(WORKFLOW_MODULE_PREFIX):
        return value.__qualname__
    return f"{module}.{value.__qualname__}"


class DefinitionError(IntloomError):
    """``WORKFLOW_DEFINITION_INVALID``, with ``at``: the file and line that declared what it
    names (a Step's decorator, a ``wf.stage(...)`` call), when it is found after the module
    was imported (``Workflow.validate``), where no frame of the author's file is left to
    name it. The loader shows ``at`` relative to the project."""

    at: tuple[str, int] | None = None


# The internal module name as a type's repr (``Optional[...]``, a union) and msgspec's own
# messages spell it: a user's class inside a type that is not a class is named as
# _shown_type names a class, as its author wrote it.
_MODULE_NAMED = re.compile(rf"\b{WORKFLOW_MODULE_PREFIX}[0-9a-f]+\.")


# What names the default State to ``encode_state`` (``_check_state``), cut from its message.
_DEFAULT: Final = "\x00default"


def _bad(workflow: str, where: str, fact: str, fix: str,
         at: tuple[str, int] | None = None) -> DefinitionError:
    fact, fix = _MODULE_NAMED.sub("", fact), _MODULE_NAMED.sub("", fix)
    error = DefinitionError(
        "WORKFLOW_DEFINITION_INVALID", f"Workflow {workflow!r}, {where}: {fact}. {fix}"
    )
    error.at = at
    return error


def _caller(depth: int) -> tuple[str, int]:
    """The file and line ``depth`` frames above the caller: the author's declaration."""
    frame = sys._getframe(depth + 1)
    return frame.f_code.co_filename, frame.f_lineno


# ASCII, as _NAME is: "letters" let an author read "étape" as one, and be refused by it.
_NAME_RULE: Final = ("Use 1-64 ASCII letters (A-Z, a-z), digits, '_', '-' or '.', starting with "
                     "a letter or digit.")


def _shown_value(value: object) -> str:
    kind = type(value).__name__
    return f"{value!r} ({'an' if kind[:1] in 'aeiou' else 'a'} {kind})"


def _name_fact(name: object) -> str:
    if not isinstance(name, str):
        return f"{_shown_value(name)} is not a string"
    return f"{name!r} is not valid"


def _check_name(workflow: str, where: str, kind: str, name: object) -> str:
    """``name`` as plain text, once it is a valid name."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise _bad(workflow, where, f"{kind} name {_name_fact(name)}", _NAME_RULE)
    return _plain(name)


def _plain(text: str) -> str:
    """``text`` as an exact ``str``. A subclass of str passed every check and then failed
    every record and reply that carried it (msgspec encodes no str subclass but enums):
    each Run at its first record, and ``flows`` for all of the host's Workflows."""
    return text if type(text) is str else str.__str__(text)


def _check_label(workflow: str, where: str, what: str, text: str, fix: str) -> None:
    """Refuse a version or an agent id that no view of a Run can carry (a lone surrogate:
    every Run failed, or the host's start) or that would swell every view (``MAX_LABEL``)."""
    if len(text) > MAX_LABEL:
        raise _bad(workflow, where, f"{what} is {len(text):,} characters long, over the "
                   f"{MAX_LABEL}-character limit (every view of its Runs shows it)", fix)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _bad(workflow, where, f"{what} holds {text[exc.start]!r} at character "
                   f"{exc.start:,}, half of a surrogate pair, which no view of its Runs can "
                   "carry (text decoded with errors='surrogateescape', os.fsdecode)",
                   fix) from None


def generator_kind(fn: object) -> str | None:
    """"a generator" or "an async generator" when ``fn`` is such a function (it has
    ``yield``: calling it returns a generator, never a result), else None. Named in the
    refusals of one as a Step, a Tool or an effect."""
    if inspect.isasyncgenfunction(fn):
        return "an async generator"
    if inspect.isgeneratorfunction(fn):
        return "a generator"
    return None


def callable_name(fn: object) -> str:
    """A function as its author knows it (its name, without an enclosing function's)."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    # A function defined in a function is "outer.<locals>.name": its author knows it as name.
    return name.rpartition("<locals>.")[2] if isinstance(name, str) else repr(fn)


def _signature(fn: Callable[..., Any]) -> str:
    """The parameters, which are what is wrong (the return annotation is left out)."""
    try:
        signature = inspect.signature(fn, follow_wrapped=False)
    except (TypeError, ValueError):
        return "(...)"
    return str(signature.replace(return_annotation=inspect.Signature.empty))


def _accepts(fn: Callable[..., Any], count: int) -> bool:
    """Whether ``fn`` can be called with ``count`` positional arguments, as the host calls
    it. True when its signature cannot be read (some builtins): only what is known to fail
    is refused, so a ``functools.partial``, a bound method or a ``*args`` function passes.
    A decorated function is judged by the wrapper the host calls, not by ``__wrapped__``."""
    try:
        signature = inspect.signature(fn, follow_wrapped=False)
    except (TypeError, ValueError):
        return True
    try:
        signature.bind(*(None,) * count)
    except TypeError:
        return False
    return True


def _check_fn(workflow: str, where: str, what: str, fn: object, params: str,
              example: str) -> None:
    """Refuse now what the host could not call later: ``what`` (the decorator, as written)
    applied to something that is not callable, or to a function that does not take the
    ``params`` the host passes. Found at run time, either would fail every Run of the
    Workflow (a ``recover`` only after a restart)."""
    if not callable(fn):
        raise _bad(workflow, where, f"{what} must decorate a function, not {_shown_value(fn)}",
                   f"Decorate a def: {example}.")
    kind = generator_kind(fn)
    if kind is not None:
        # Calling one returns a generator, never what it yields: every Run of the Workflow
        # failed at this Step with "returned <generator object ...>", not at load.
        raise _bad(workflow, where,
                   f"{what} decorates {callable_name(fn)}, which is {kind} function (it has "
                   "`yield`): calling it returns a generator, never its result",
                   f"Use `return` instead of `yield`: {example}.")
    count = params.count(",") + 1
    if not _accepts(fn, count):
        arguments = "one argument" if count == 1 else f"{count} arguments"
        raise _bad(
            workflow, where,
            f"{what} decorates {callable_name(fn)}{_signature(fn)}, which cannot be called "
            f"with {arguments} ({params})",
            f"Declare it as {example}.",
        )


class Step(Generic[S]):
    """A code Step: ``fn(ctx) -> outcome`` (sync or async), with optional ``recover``."""

    kind = "code"
    declared_at: tuple[str, int] | None = None  # the decorator's file and line
    where: str  # the Step as errors name it: ``Stage 'draft', Step 'write'``

    def __init__(
        self, stage: Stage[S], name: str, fn: Callable[..., Any], routes: Mapping[str, Target]
    ) -> None:
        self.stage = stage
        self.name = name
        self.fn = fn
        # Read-only: a Step that changed a route while Runs ran (every later Run took it, a
        # restart forgot it) wrote a cursor at a Step that does not exist.
        self.routes: Mapping[str, Target] = types.MappingProxyType(dict(routes))
        self.is_async = inspect.iscoroutinefunction(fn)
        self.recover_fn: Callable[..., Any] | None = None
        self.__doc__ = fn.__doc__
        # The Step as errors name it, asked on every run of the Step. Made here, not cached
        # at its first read: a ``functools.cached_property`` writes to the instance's
        # ``__dict__``, and touching that turns the attributes into a dict that CPython
        # 3.11 reads through its generic path (~4x slower), ~10 reads per Step.
        self.where = f"Stage {stage.name!r}, Step {name!r}"
        # The class's kind, copied onto the instance: the executor reads it once per Step,
        # and CPython 3.11 never specialises a read that finds a class attribute through
        # an instance.
        self.kind = self.kind

    def __setattr__(self, name: str, value: Any) -> None:
        # Its attributes too, not only its mappings' entries: `step.routes = {...}` rewired
        # every later Run as `step.routes[...] = ...` did. ``getattr``, not
        # ``self.__dict__.get``: reading ``__dict__`` slows every attribute read (``where``).
        stage = getattr(self, "stage", None)
        if stage is not None and stage.workflow._loaded:
            stage.workflow._refuse_if_loaded(self.where, f"{name} was assigned")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        self.stage.workflow._refuse_if_loaded(self.where, f"{name} was deleted")
        object.__delattr__(self, name)

    def recover(self, fn: RecoverFn[S]) -> RecoverFn[S]:
        """Declare the cross-process continuation of this Step's wait (used after a restart)."""
        wf = self.stage.workflow.name
        self.stage.workflow._refuse_if_loaded(self.where, "@step.recover was called")
        if self.recover_fn is not None:
            raise _bad(wf, self.where, "recover is declared twice", "Keep one recover entry.")
        _check_fn(wf, self.where, "@step.recover", fn, "ctx, saved",
                  "`def name(ctx, saved: intloom.Recovery) -> str`")
        self.recover_fn = fn
        return fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    if not TYPE_CHECKING:  # a type checker keeps reporting on_complete as no code Step's
        # A property, not a ``__getattr__``: a class with one has every attribute read of its
        # instances go through it (no specialised LOAD_ATTR), and the executor reads a Step's
        # attributes ~10 times per Step (callgrind: ~350 instructions each).
        @property
        def on_complete(self) -> Any:
            """Not for a code Step: reading it raises ``WORKFLOW_DEFINITION_INVALID`` saying
            that ``on_complete`` belongs to Agent Steps (``stage.agent_step(...)``)."""
            raise _bad(
                self.stage.workflow.name, self.where,
                "on_complete belongs to Agent Steps, and this is a code Step (declared "
                "with `stage.step(...)`), whose function returns its outcome itself",
                "Declare it with `stage.agent_step(...)` to have an Agent do its work, or "
                "remove the on_complete entry and change ctx.state in the Step.",
            )


class AgentStep(Step[S]):
    """A Step whose work is done by a client Agent: ``fn(ctx)`` returns the task request."""

    kind = "agent"

    def __init__(
        self,
        stage: Stage[S],
        name: str,
        fn: Callable[..., Any],
        routes: Mapping[str, Target],
        agent: str,
        tools: Sequence[Tool],
    ) -> None:
        super().__init__(stage, name, fn, routes)
        self.agent = agent
        self.tools: Mapping[str, Tool] = types.MappingProxyType({t.name: t for t in tools})
        self.complete_fn: Callable[..., Any] | None = None

    def recover(self, fn: RecoverFn[S]) -> RecoverFn[S]:
        """Refused: an Agent task is never restored (claims, owner tokens and Tool receipts
        live only in the host's memory), so a ``recover`` here could never run."""
        raise _bad(
            self.stage.workflow.name, self.where,
            "recover cannot be declared on an Agent Step: after a restart its task is "
            "always reported RUN_INTERRUPTED (claims, owner tokens and Tool receipts are "
            "not restored)",
            "Remove the recover entry; keep what a new Run would need in the Stage State.",
        )

    def on_complete(self, fn: CompleteFn[S]) -> CompleteFn[S]:
        """Declare how the Agent's completion changes the State: ``fn(ctx, result) -> None``
        may assign ``ctx.state``; that State is saved with the Agent's outcome. It runs
        before anything is written: if it raises, the completion is refused (the task stays
        claimed) and the Agent is told why."""
        wf = self.stage.workflow.name
        self.stage.workflow._refuse_if_loaded(self.where, "@step.on_complete was called")
        if self.complete_fn is not None:
            raise _bad(wf, self.where, "on_complete is declared twice",
                       "Keep one on_complete entry.")
        _check_fn(wf, self.where, "@step.on_complete", fn, "ctx, result",
                  "`def name(ctx, result: intloom.AgentResult) -> None`")
        self.complete_fn = fn
        return fn


class Stage(Generic[S]):
    """A named group of Steps sharing one typed State; its first Step is its entry."""

    declared_at: tuple[str, int] | None = None  # the file and line of its wf.stage(...)

    def __init__(self, workflow: Workflow, name: str, state: type[S] | None) -> None:
        self.workflow = workflow
        self.name = name
        self.state_type = state
        self._steps: dict[str, Step[S]] = {}
        self.steps: Mapping[str, Step[S]] = types.MappingProxyType(self._steps)
        self.init_fn: Callable[..., Any] | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        workflow = getattr(self, "workflow", None)  # not __dict__: see Step.where
        if workflow is not None and workflow._loaded:
            workflow._refuse_if_loaded(f"Stage {self.name!r}", f"{name} was assigned")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        self.workflow._refuse_if_loaded(f"Stage {self.name!r}", f"{name} was deleted")
        object.__delattr__(self, name)

    @property
    def entry(self) -> Step[S]:
        """The first Step declared: where a Run entering the Stage starts."""
        return next(iter(self.steps.values()))

    def _add(self, step: Step[S]) -> Step[S]:
        self.workflow._refuse_if_loaded(step.where, "@stage.step(...) was called")
        if step.name in self.steps:
            raise _bad(
                self.workflow.name, f"Stage {self.name!r}", f"Step {step.name!r} is defined twice",
                "Give every Step in a Stage its own name.",
            )
        self._steps[step.name] = step
        return step

    def _check_routes(self, step_name: str, routes: Mapping[str, Target]) -> dict[str, Target]:
        """``routes``, each name in it as plain text."""
        where = f"Stage {self.name!r}, Step {step_name!r}"
        if not isinstance(routes, Mapping) or not routes:
            raise _bad(
                self.workflow.name, where, "routes must be a non-empty mapping",
                'Map each outcome to a Step name, intloom.ToStage("name") or intloom.COMPLETE.',
            )
        checked: dict[str, Target] = {}
        for outcome, target in routes.items():
            plain = _check_name(self.workflow.name, where, "outcome", outcome)
            if not isinstance(target, (str, ToStage, Complete)):
                what, fix = self._wrong_target(target)
                raise _bad(self.workflow.name, where, f"outcome {outcome!r} routes to {what}",
                           fix)
            checked[plain] = _plain(target) if isinstance(target, str) else target
        return checked

    def _wrong_target(self, target: object) -> tuple[str, str]:
        """A route target that is none of a name, ToStage and COMPLETE, as its author knows
        it, and the fix: the Step or Stage object itself (a decorated function is one) was
        shown as ``<intloom.authoring.workflow.Step object at 0x...>``."""
        usual = 'Route to a Step name, intloom.ToStage("name") or intloom.COMPLETE.'
        if isinstance(target, Step):
            if target.stage is self:
                return (f"Step {target.name!r} itself, not its name",
                        f"Route to it by name: {target.name!r}.")
            return (f"Step {target.name!r} of Stage {target.stage.name!r} itself",
                    f'A route leaves the Stage only through its first Step: '
                    f'intloom.ToStage("{target.stage.name}").')
        if isinstance(target, Stage):
            return (f"Stage {target.name!r} itself",
                    f'Route to it with intloom.ToStage("{target.name}").')
        if target is ToStage:
            return ("the class intloom.ToStage",
                    'Route to intloom.ToStage("name"), naming the Stage to enter.')
        if callable(target):
            return f"the {type(target).__name__} {callable_name(target)!r}", usual
        return clip(repr(target), 200), usual

    def _check_tools(self, step_name: str, tools: object) -> list[Tool]:
        """``tools`` as a list of distinct ``intloom.Tool``s. A function passed as it is, a
        single Tool or a dict of functions raised AttributeError or TypeError at import,
        naming neither the Step nor the fix."""
        where = f"Stage {self.name!r}, Step {step_name!r}"
        wrap = 'Wrap each function: tools=[intloom.Tool("name", fn)].'
        if isinstance(tools, Tool):
            raise _bad(self.workflow.name, where, f"tools is the single Tool {tools.name!r}, "
                       "not a list of them", f"Pass a list: tools=[intloom.Tool({tools.name!r}, "
                       "...)].")
        if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Iterable):
            raise _bad(self.workflow.name, where,
                       f"tools is {_shown_value(tools)}, not a list of intloom.Tool", wrap)
        found = list(tools)  # once: a generator would be empty the second time
        for i, tool in enumerate(found):
            if isinstance(tool, Tool):
                continue
            fn = callable_name(tool) if callable(tool) else ""
            if fn.isidentifier():  # a function, named as its author wrote it
                raise _bad(self.workflow.name, where,
                           f"tools[{i}] is the function {fn}, not an intloom.Tool",
                           f'Wrap it: intloom.Tool("{fn}", {fn}).')
            raise _bad(self.workflow.name, where,
                       f"tools[{i}] is {_shown_value(tool)}, not an intloom.Tool", wrap)
        names = [t.name for t in found]
        if len(set(names)) != len(names):
            # By name: an Agent calls a Tool by its name, so two Tools (or one listed twice)
            # under one name cannot both be called; "not distinct objects" misnamed it.
            twice = sorted({n for n in names if names.count(n) > 1})
            same = all(found[i] is found[j] for n in twice
                       for i, a in enumerate(names) if a == n
                       for j, b in enumerate(names) if b == n)
            why = ("the same Tool listed twice" if same
                   else "an Agent calls a Tool by its name")
            raise _bad(
                self.workflow.name, where,
                f"tools {names} name {', '.join(repr(n) for n in twice)} more than once ({why})",
                "List each Tool once, each under a name of its own: intloom.Tool(name, fn).",
            )
        sizes = {t.name: len(t.name) + _utf8_size(t.description) for t in found}
        if sum(sizes.values()) > MAX_TOOLS_BYTES:
            largest = max(sizes, key=lambda name: sizes[name])
            raise _bad(
                self.workflow.name, where,
                f"its Tools' names and descriptions are {sum(sizes.values()):,} bytes as UTF-8 "
                f"(Tool {largest!r}: {sizes[largest]:,}), over the {MAX_TOOLS_BYTES:,}-byte "
                "limit: every view of its task shows them",
                "Keep each description to what the Agent needs to pick and call the Tool; put "
                "longer documentation where a Tool can read it.",
            )
        return found

    def step(
        self, name: str, *, routes: Mapping[str, Target]
    ) -> Callable[[StepFn[S]], Step[S]]:
        """Declare a code Step. Its function returns an outcome string found in ``routes``."""
        name = _check_name(self.workflow.name, f"Stage {self.name!r}", "Step", name)
        self.workflow._refuse_if_loaded(f"Stage {self.name!r}, Step {name!r}",
                                        "@stage.step(...) was called")
        routes = self._check_routes(name, routes)

        def decorate(fn: StepFn[S]) -> Step[S]:
            if fn is self.init_fn:
                # Stacked on @stage.init: the initialiser (it returns a State) became the Step
                # too, and every Run failed there, its State taken for an outcome.
                raise _bad(self.workflow.name, f"Stage {self.name!r}, Step {name!r}",
                           f"@stage.step(...) decorates {callable_name(fn)}, the Stage's "
                           "initialiser (@stage.init returned it)",
                           "Decorate a def of its own: `def name(ctx) -> str`.")
            _check_fn(self.workflow.name, f"Stage {self.name!r}, Step {name!r}",
                      "@stage.step(...)", fn, "ctx", "`def name(ctx) -> str` (or `async def`)")
            step = Step(self, name, fn, routes)
            step.declared_at = _caller(1)
            return self._add(step)

        return decorate

    def agent_step(
        self,
        name: str,
        *,
        routes: Mapping[str, Target],
        tools: Sequence[Tool] = (),
        agent: str = "default",
    ) -> Callable[[AgentFn[S]], AgentStep[S]]:
        """Declare an Agent Step: its function returns the task for a client Agent."""
        name = _check_name(self.workflow.name, f"Stage {self.name!r}", "Step", name)
        self.workflow._refuse_if_loaded(f"Stage {self.name!r}, Step {name!r}",
                                        "@stage.agent_step(...) was called")
        routes = self._check_routes(name, routes)
        declared = self._check_tools(name, tools)
        # The Agent id is in every view of the Run (pendingAgentCall.agentId): one that is
        # no string made each reply listing the Run undecodable (`runs` failed for all).
        # Only that is refused, not the name rule: ids such as "claude code" were accepted,
        # and a Workflow that loaded before must not start failing its load (its Runs held).
        if not isinstance(agent, str) or not agent.strip():
            raise _bad(self.workflow.name, f"Stage {self.name!r}, Step {name!r}",
                       f"agent {_shown_value(agent)} is not a string" if not isinstance(
                           agent, str) else f"agent {agent!r} is blank",
                       'Name the Agent that takes its tasks, e.g. agent="reviewer"')
        _check_label(self.workflow.name, f"Stage {self.name!r}, Step {name!r}", "agent",
                     agent, 'Name the Agent that takes its tasks in valid Unicode text, '
                     'e.g. agent="reviewer"')
        agent = _plain(agent)

        def decorate(fn: AgentFn[S]) -> AgentStep[S]:
            _check_fn(self.workflow.name, f"Stage {self.name!r}, Step {name!r}",
                      "@stage.agent_step(...)", fn, "ctx",
                      "`def name(ctx) -> dict` returning the task")
            step = AgentStep(self, name, fn, routes, agent, declared)
            step.declared_at = _caller(1)
            self._add(step)
            return step

        return decorate

    def init(self, fn: InitFn[S]) -> InitFn[S]:
        """Declare the Stage initialiser: ``fn(ctx) -> State`` (runs as a durable boundary)."""
        self.workflow._refuse_if_loaded(f"Stage {self.name!r}", "@stage.init was called")
        if self.init_fn is not None:
            raise _bad(
                self.workflow.name, f"Stage {self.name!r}", "init is declared twice",
                "Keep one initialiser per Stage.",
            )
        if isinstance(fn, Step):
            # Stacked on a Step's decorator: it loaded, and every Run failed entering the
            # Stage (the Step's outcome taken for its State).
            raise _bad(self.workflow.name, f"Stage {self.name!r}",
                       f"@stage.init decorates Step {fn.name!r} (what the Step's decorator "
                       "returned), not a function",
                       "Decorate a def of its own: `def name(ctx) -> State`.")
        _check_fn(self.workflow.name, f"Stage {self.name!r}", "@stage.init", fn, "ctx",
                  "`def name(ctx) -> State`")
        self.init_fn = fn
        return fn


class Workflow:
    """A named, versioned Workflow. Its first Stage is the entry."""

    def __init__(self, name: str, *, version: str) -> None:
        name = _check_name(str(name), "definition", "Workflow", name)
        if not isinstance(version, str):
            raise _bad(name, "definition", f"version {_shown_value(version)} is not a string",
                       f'Pass it as text: version="{version}" (any non-empty label).')
        if not version.strip():
            raise _bad(name, "definition", f"version {version!r} is empty",
                       'Pass version="1.0.0" (any non-empty label).')
        _check_label(name, "definition", "version", version,
                     'Pass a short label in valid Unicode text, e.g. version="1.0.0".')
        version = _plain(version)
        self.name = name
        self.version = version
        self._stages: dict[str, Stage[Any]] = {}
        self.stages: Mapping[str, Stage[Any]] = types.MappingProxyType(self._stages)
        # Set by the host's loader once the Workflow is checked (loader.load_source): from
        # then on Runs execute it, and the graph they run on must not change under them.
        self._loaded = False
        # The file that declared it: the loader tells a source that defines a Workflow from
        # one that binds another source's by importing it (loader._register). The line is
        # for validate's errors (DefinitionError.at).
        self.declared_at = _caller(1)
        self.declared_in: str = self.declared_at[0]

    @overload
    def stage(self, name: str, *, state: type[StructT]) -> Stage[StructT]: ...
    @overload
    def stage(self, name: str, *, state: None = None) -> Stage[None]: ...

    def stage(self, name: str, *, state: type[S] | None = None) -> Stage[S] | Stage[None]:
        """Declare a Stage; ``state`` is a msgspec.Struct type with defaults for every field."""
        name = _check_name(self.name, "definition", "Stage", name)
        self._refuse_if_loaded(f"Stage {name!r}", "wf.stage(...) was called")
        if name in self.stages:
            raise _bad(self.name, f"Stage {name!r}", "the Stage is defined twice",
                       "Give every Stage its own name.")
        if state is not None and not (
            isinstance(state, type) and issubclass(state, msgspec.Struct)
        ):
            raise _bad(
                self.name, f"Stage {name!r}",
                f"state {_shown_type(state)} is not a msgspec.Struct type",
                "Declare the State as `class MyState(msgspec.Struct): ...`.",
            )
        stage: Stage[S] = Stage(self, name, state)
        stage.declared_at = _caller(1)
        self._stages[name] = stage
        return stage

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_loaded", False):  # not __dict__: see Step.where
            self._refuse_if_loaded("definition", f"{name} was assigned")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        self._refuse_if_loaded("definition", f"{name} was deleted")
        object.__delattr__(self, name)

    def _refuse_if_loaded(self, where: str, what: str) -> None:
        """Refuse to change a Workflow the host has loaded. A Stage or Step added while
        Runs ran was taken by the Runs after it and forgotten by the next restart (its Runs
        then held at a Step the code no longer had); a ``recover`` added late changed what
        a restart does for a wait begun before it."""
        if self._loaded:
            raise _bad(
                self.name, where,
                f"{what} after the host loaded the Workflow, while its Runs run on it",
                "Declare every Stage, Step, init, recover and on_complete at the top level "
                "of the source, where the host loads them at its start.",
            )

    @property
    def entry(self) -> Stage[Any]:
        """The first Stage declared: where every Run starts."""
        return next(iter(self.stages.values()))

    def validate(self) -> None:
        """Check the whole graph: every route names something that exists. An error names
        the file and line that declared what it is about (``DefinitionError.at``)."""
        if not self.stages:
            raise _bad(
                self.name, "definition", "it has no Stage", "Declare one with wf.stage(...).",
                self.declared_at,
            )
        for stage in self.stages.values():
            try:
                self._validate_stage(stage)
            except DefinitionError as exc:
                if exc.at is None:
                    exc.at = stage.declared_at
                raise
        self._check_completes()

    def _reached(self) -> tuple[list[Step[Any]], bool]:
        """The Steps a Run can reach from the entry (the first Stage's first Step), in the
        order a walk of the routes finds them, and whether one of them routes to COMPLETE.

        Routes are the only edges: ``recover`` and an Agent's completion are routed by the
        Step's own routes, an answer reaches a Step only through the outcome that Step
        returns, and an initialiser routes nothing. So the graph is all there is to see."""
        first = self.entry.entry
        found: dict[tuple[str, str], Step[Any]] = {(first.stage.name, first.name): first}
        todo = collections.deque([first])
        completes = False
        while todo:
            step = todo.popleft()
            for target in step.routes.values():
                if isinstance(target, Complete):
                    completes = True
                    continue
                nxt = (self.stages[target.stage].entry if isinstance(target, ToStage)
                       else step.stage.steps[target])
                key = (nxt.stage.name, nxt.name)
                if key not in found:
                    found[key] = nxt
                    todo.append(nxt)
        return list(found.values()), completes

    def _check_completes(self) -> None:
        """Refuse a graph in which no route from the entry reaches COMPLETE: it loaded, and
        each of its Runs could only go round, wait or fail, which no load said."""
        reached, completes = self._reached()
        if completes:
            return
        first = reached[0]
        shown = _steps_shown(reached)
        # A Step that does end the Run, but that nothing leads to: the fix is a route to it.
        ending = [step for stage in self.stages.values() for step in stage.steps.values()
                  if any(isinstance(t, Complete) for t in step.routes.values())]
        many = len(reached) > 1
        routes = "none of them routes an" if many else "it routes no"
        fact = (f"no Run of it could ever complete: from its entry ({first.where}) the "
                f"routes reach only {shown}, and {routes} outcome to intloom.COMPLETE (a Run "
                "could only go round, wait or fail)")
        fix = ('Route the outcome that ends the Run to intloom.COMPLETE (routes={"done": '
               f"intloom.COMPLETE}}) in {'one of those Steps' if many else 'that Step'}")
        if ending:
            step = ending[0]
            fact += (f"; {step.where} routes to intloom.COMPLETE, but no route from the "
                     "entry leads to it")
            # A plain name routes within a Stage; ToStage enters a Stage at its first Step.
            if any(other.stage is step.stage for other in reached):
                fix += (f', or route an outcome of a Step of Stage {step.stage.name!r} to '
                        f'"{step.name}"')
            elif step is step.stage.entry:
                fix += f', or route an outcome to intloom.ToStage("{step.stage.name}")'
        raise _bad(self.name, "definition", fact, fix + ".", self.declared_at)

    def unreached(self) -> list[str]:
        """What no route from the entry leads to, as ``Stage 'a' (no route enters it)`` or
        ``Stage 'a', Step 'b'``: no Run ever runs it. Not refused, unlike a graph that cannot
        complete: a Step may be kept for later, and the Runs run as declared. The host logs
        it and doctor says it (``unreached_note``)."""
        reached = {(step.stage.name, step.name) for step in self._reached()[0]}
        out: list[str] = []
        for stage in self.stages.values():
            left = [name for name in stage.steps if (stage.name, name) not in reached]
            if len(left) == len(stage.steps):
                out.append(f"Stage {stage.name!r} (no route enters it)")
            elif left:
                out.extend(f"Stage {stage.name!r}, Step {name!r}" for name in left)
        return out

    def _validate_stage(self, stage: Stage[Any]) -> None:
        if not stage.steps:
            raise _bad(self.name, f"Stage {stage.name!r}", "the Stage has no Step",
                       "Declare one with @stage.step(...).")
        if stage.state_type is not None:
            self._check_state(stage, stage.state_type)
        for step in stage.steps.values():
            for outcome, target in step.routes.items():
                if (isinstance(target, str) and target not in stage.steps
                        and target in self.stages):
                    raise _bad(
                        self.name, step.where,
                        f"outcome {outcome!r} routes to {target!r}, which is a Stage, not "
                        f"a Step of Stage {stage.name!r} (a plain name routes within the "
                        "Stage)",
                        f'Route to it with intloom.ToStage("{target}").', step.declared_at,
                    )
                owners = [name for name, other in self.stages.items()
                          if isinstance(target, str) and target in other.steps]
                if isinstance(target, str) and target not in stage.steps and owners:
                    # A Step of another Stage: a Run enters a Stage at its first Step only.
                    raise _bad(
                        self.name, step.where,
                        f"outcome {outcome!r} routes to Step {target!r}, which is a Step of "
                        f"Stage {owners[0]!r}, not of Stage {stage.name!r} (a plain name "
                        "routes within the Stage)",
                        f'Route to Stage {owners[0]!r} with intloom.ToStage("{owners[0]}"), '
                        "which enters it at its first Step, or use one of "
                        f"{sorted(stage.steps)}.", step.declared_at,
                    )
                if isinstance(target, str) and target not in stage.steps:
                    # "COMPLETE" (or "complete", "end") as text is a Step name like any
                    # other: the fix named only Steps and ToStage, never how to end the Run.
                    raise _bad(
                        self.name, step.where,
                        f"outcome {outcome!r} routes to Step {target!r}, which Stage "
                        f"{stage.name!r} does not have",
                        f"Use one of {sorted(stage.steps)}, intloom.ToStage(...), or "
                        "intloom.COMPLETE (not the text) to end the Run.",
                        step.declared_at,
                    )
                if isinstance(target, ToStage) and target.stage not in self.stages:
                    raise _bad(
                        self.name, step.where,
                        f"outcome {outcome!r} routes to Stage {target.stage!r}, which does "
                        "not exist",
                        f"Use one of {sorted(self.stages)}.", step.declared_at,
                    )

    def unreached_note(self) -> str | None:
        """``unreached`` as one sentence for the host log and doctor, or None."""
        unreached = self.unreached()
        if not unreached:
            return None
        shown = "; ".join(unreached[:12]) + (
            f" ({len(unreached) - 12} more)" if len(unreached) > 12 else "")
        return (f"Workflow {self.name!r}: no route from its entry ({self.entry.entry.where}) "
                f"leads to {shown}, so no Run runs {'them' if len(unreached) > 1 else 'it'}. "
                "Route an outcome there if it is meant to run (a Step by its name within "
                "its Stage, a Stage by intloom.ToStage), or leave it if it is kept for later.")

    def has_recover(self, stage: str, step: str | None) -> bool:
        """Whether Step ``step`` of Stage ``stage`` declares a ``recover``."""
        st = self.stages.get(stage)
        found = st.steps.get(step) if st is not None and step is not None else None
        return found is not None and found.recover_fn is not None

    def _check_state(self, stage: Stage[Any], state: type[Any]) -> None:
        """The State type must build its default (unless ``init`` builds it) and have a JSON
        Schema (its fingerprint, ``schemas``): found at run time, either would fail every
        Run that enters the Stage, or stop the host from loading any Workflow."""
        where = f"Stage {stage.name!r}"
        shown = _shown_type(state)
        _state_schema(self.name, where, state)
        mixed = _mixed_keys(state)
        if mixed is not None:
            path, key = mixed
            raise _bad(
                self.name, where,
                f"State {shown} field {path!r} is a dict keyed by {key}: a JSON object's keys "
                "are all text, so keys of two types can be one key there (1 and \"1\"), and a "
                "restart reads each back as one of them: entries were lost, and keys came "
                "back as the other type, without a word",
                "Key it by one type (str, or int), and keep which kind a key is in the value "
                "or in the key string.",
            )
        keyed = _unkeyable(state)
        if keyed is not None:
            path, key = keyed
            raise _bad(
                self.name, where,
                f"State {shown} field {path!r} is a dict keyed by {key}, which JSON cannot "
                "key an object by (msgspec encodes only str-like or number-like keys): the "
                "first Run to store an entry there would fail",
                "Key it by str (or int), and keep the parts in the value or join them into "
                "the key string.",
            )
        if stage.init_fn is not None:
            return
        required = [f.name for f in msgspec.structs.fields(state) if f.required]
        if required:
            raise _bad(
                self.name, where,
                f"State {shown} has fields without defaults ({', '.join(required)})",
                "Give every field a default, or declare @stage.init to build it.",
            )
        try:
            default = state()
        # User code: a __post_init__, a default_factory. Its exit or interrupt is contained
        # as an import's is (loader._import): it ended the host's start (CLI_INTERNAL_ERROR,
        # every Workflow with it) and doctor with its status.
        except LoadInterrupted:  # the process's own signal: not this code's failure
            raise
        except BaseException as exc:
            # message_of: the exception's __str__ is user code too, and may raise.
            raised = (f"{type(exc).__name__}: {clip(message_of(exc), 500)}"
                      if isinstance(exc, Exception) else as_call(exc))
            raise _bad(
                self.name, where,
                f"State {shown}() raised {raised}, so the Stage has no default State",
                "Make the default State valid (check __post_init__ and default_factory), or "
                "declare @stage.init to build it.",
            ) from None
        # Each Run saves the default as its type decodes it (executor/driver.py,
        # _encode_state): a default that does not decode failed every Run entering the
        # Stage, as if a Step had left that State, and no load said so.
        try:
            msgspec.json.decode(msgspec.json.encode(default), type=state)
        except Exception as exc:  # a __post_init__ runs again when it decodes
            fact = message_of(exc) if isinstance(exc, msgspec.ValidationError) else (
                f"{type(exc).__name__}: {message_of(exc)}")
            raise _bad(
                self.name, where,
                f"the default State {shown}() does not fit its declared types: "
                f"{clip(fact, 500)}{nonfinite_note(exc, default)}, so every Run entering the "
                "Stage would fail there",
                "Give each field a default of its declared type, or declare @stage.init to "
                "build the State.",
            ) from None
        # Decoding is not all a saved State passes (encode_state): a part typed Any holding
        # a set, a datetime in a zone with rules, say, decode, and the save refused them,
        # failing every Run entering the Stage while load and doctor said nothing.
        try:
            encode_state(default, _DEFAULT, state)
        except IntloomError as exc:
            said = exc.message.removeprefix(f"{_DEFAULT}: the Stage State it left")
            for end in ("; this State was not saved.", " This State was not saved."):
                said = said.removesuffix(end)
            raise _bad(
                self.name, where, f"the default State {shown}(){said.rstrip('. ')}",
                "Every Run entering the Stage would fail there, as the check that refused "
                "it is the one each saved State passes: change that default, or declare "
                "@stage.init to build the State.",
            ) from None

    def schemas(self) -> dict[str, str]:
        """Each Stage's State schema fingerprint (sha256 of its JSON Schema)."""
        out: dict[str, str] = {}
        for stage in self.stages.values():
            if stage.state_type is None:
                out[stage.name] = "none"
                continue
            schema = _state_schema(self.name, f"Stage {stage.name!r}", stage.state_type)
            out[stage.name] = hashlib.sha256(schema).hexdigest()
        return out


# What to declare instead of a field type msgspec cannot describe, for the ones people reach
# for; anything else gets the general advice.
_INSTEAD: Final[dict[type, str]] = {
    object: "typing.Any (any JSON data)",
    complex: "two float fields, or a str",
}


def _and(names: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _steps_shown(steps: Sequence[Step[Any]], limit: int = 12) -> str:
    """``Stage 'a', Steps 'w' and 'r'; Stage 'b', Step 'p'``: Steps grouped by Stage, in the
    order given, at most ``limit`` of them named."""
    by_stage: dict[str, list[str]] = {}
    for step in steps[:limit]:
        by_stage.setdefault(step.stage.name, []).append(repr(step.name))
    parts = []
    for stage, names in by_stage.items():
        parts.append(f"Stage {stage!r}, Step{'s' if len(names) > 1 else ''} {_and(names)}")
    more = f" ({len(steps) - limit} more)" if len(steps) > limit else ""
    return "; ".join(parts) + more


def _untagged(annotation: object) -> list[type]:
    """The untagged Structs of the first union in ``annotation`` holding two or more: msgspec
    cannot tell them apart in JSON, so such a union has no schema until they are tagged."""
    args = get_args(annotation)
    if get_origin(annotation) in (Union, types.UnionType):
        structs = [a for a in args if isinstance(a, type) and issubclass(a, msgspec.Struct)
                   and a.__struct_config__.tag is None]
        if len(structs) > 1:
            return structs
    for arg in args:
        found = _untagged(arg)
        if found:
            return found
    return []


def _tag_fix(field: str, annotation: object) -> str | None:
    """The fix for a field whose union holds untagged Structs: declaring another type (the
    general advice) would lose the Structs, and a tag is msgspec's own fix."""
    untagged = _untagged(annotation)
    if not untagged:
        return None
    shown = [_shown_type(t) for t in untagged]
    return (f"Tag the Structs in {field!r}: msgspec tells {_and(shown)} apart in JSON "
            f"only by a tag, so declare each with one (`class {untagged[0].__name__}("
            f"msgspec.Struct, tag=True)`), or declare {field!r} as a single Struct type.")


def _instead(annotation: object) -> str:
    if isinstance(annotation, type):
        if issubclass(annotation, pathlib.PurePath):
            return "str (store str(path); build the Path where it is used)"
        if annotation in _INSTEAD:
            return _INSTEAD[annotation]
    return ("a JSON type: str, int, float, bool, None, list/dict of those, datetime, bytes, "
            "another msgspec.Struct, or typing.Any")


# Dict key types msgspec's JSON encoder refuses (it takes str-like and number-like keys),
# by their msgspec.inspect class names: the schema and the decoder accept them, so an empty
# default passes, and only a stored entry fails.
_UNKEYABLE: Final = frozenset({
    "BoolType", "NoneType", "TupleType", "VarTupleType", "NamedTupleType", "ListType",
    "SetType", "FrozenSetType", "DictType", "StructType", "DataclassType", "TypedDictType",
    "AttrsType",
})


def _unkeyable_key(key: Any) -> bool:
    """Whether a dict key type (msgspec.inspect) is one JSON cannot key an object by: one of
    ``_UNKEYABLE``, or a Literal of booleans or None only (``Literal[True]``)."""
    if type(key).__name__ in _UNKEYABLE:
        return True
    if type(key).__name__ != "LiteralType":
        return False
    values: tuple[Any, ...] = tuple(getattr(key, "values", ()))
    return bool(values) and all(v is None or isinstance(v, bool) for v in values)


def _key_shown(key: Any) -> str:
    """A dict key type (msgspec.inspect) as a message names it."""
    if type(key).__name__ == "LiteralType":
        return f"Literal{list(getattr(key, 'values', ()))}"
    name = getattr(getattr(key, "cls", None), "__name__", None)
    plain = type(key).__name__.removesuffix("Type")
    return name or {"None": "None", "VarTuple": "tuple", "Decimal": "Decimal",
                    "UUID": "UUID"}.get(plain, plain.lower())


def _dict_keys(state: type[Any]) -> Iterator[tuple[str, tuple[Any, ...]]]:
    """Each dict in ``state``'s type (msgspec.inspect), as its path (as encoded) and the
    types its keys may be (one, or a union's members); none when the type cannot be read."""
    import msgspec.inspect as mi

    try:
        root = mi.type_info(state)
    except Exception:
        return  # _state_schema has judged the type already
    stack: list[tuple[Any, str]] = [(root, "")]
    seen: set[int] = set()
    while stack:
        info, path = stack.pop()
        if id(info) in seen:
            continue
        seen.add(id(info))
        kind = type(info).__name__
        if isinstance(info, mi.DictType):
            yield (path.lstrip(".") or "(the State itself)",
                   info.key_type.types if isinstance(info.key_type, mi.UnionType)
                   else (info.key_type,))
            stack.append((info.value_type, f"{path}[...]"))
        elif kind in ("StructType", "DataclassType", "TypedDictType", "AttrsType",
                      "NamedTupleType"):
            stack.extend((f.type, f"{path}.{getattr(f, 'encode_name', f.name)}")
                         for f in info.fields)
        elif isinstance(info, mi.UnionType):
            stack.extend((t, path) for t in info.types)
        elif hasattr(info, "item_type"):
            stack.append((info.item_type, f"{path}[...]"))
        elif hasattr(info, "item_types"):
            stack.extend((t, f"{path}[...]") for t in info.item_types)


def _numeric_text(value: object) -> bool:
    """Whether text ``value`` reads as a number (a JSON key ``"5"`` is then an int's too)."""
    try:
        float(str(value))
    except ValueError:
        return False
    return True


def _key_kinds(key: Any) -> set[str]:
    """What a keyable dict key type (msgspec.inspect) writes as a JSON key: ``number`` (int,
    float, an int Literal or Enum value) and/or ``digits`` (text that may read as a number:
    any str, a Decimal, a str Literal or Enum value such as "5"); neither for text that
    never does (a datetime, a UUID, "red")."""
    import msgspec.inspect as mi

    if isinstance(key, (mi.IntType, mi.FloatType)):
        return {"number"}
    if isinstance(key, (mi.StrType, mi.DecimalType)):
        return {"digits"}
    if isinstance(key, (mi.LiteralType, mi.EnumType)):
        values = (getattr(key, "values", ()) if isinstance(key, mi.LiteralType)
                  else [member.value for member in key.cls])
        kinds: set[str] = set()
        for value in values:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                kinds.add("number")
            elif isinstance(value, str) and _numeric_text(value):
                kinds.add("digits")
        return kinds
    return set()


def _mixed_keys(state: type[Any]) -> tuple[str, str] | None:
    """The first dict field of ``state`` (its path) whose keys may be a number or text that
    reads as one (``int | str``, ``Decimal | int``, ``Literal[1, "1"]``, an Enum of "5"
    beside int), and that key type as shown; None when there is none. A JSON object's keys
    are all text, so ``1`` and ``"1"`` are one key there, and a decode reads it as one type
    (``Literal["a"] | str``, ``int | float``, ``datetime | int`` read back as they were)."""
    for path, keys in _dict_keys(state):
        keyable = [key for key in keys if not _unkeyable_key(key)]
        kinds = [_key_kinds(key) for key in keyable]
        numbers = any("number" in k for k in kinds)
        digits = any("digits" in k for k in kinds)
        if numbers and digits:
            return path, " | ".join(_key_shown(key) for key in keyable)
    return None


def _unkeyable(state: type[Any]) -> tuple[str, str] | None:
    """The first dict field of ``state`` (its path, as encoded) whose key type JSON cannot
    carry, and that type as shown; None when there is none (or the type cannot be read)."""
    for path, keys in _dict_keys(state):
        # A union with one keyable member (int | None) keys what its Runs store by it.
        if all(_unkeyable_key(key) for key in keys):
            return path, _key_shown(keys[0])
    return None


def _sets_sorted(node: Any) -> Any:
    """``node`` (a JSON Schema) with each default of a set field (``uniqueItems``) in a fixed
    order. msgspec lists a ``frozenset`` default in its iteration order, which for strings
    follows the process's hash seed: the fingerprint changed at every start, and every Run
    waiting in the Stage was held as "the State schema changed" though nothing had."""
    if isinstance(node, list):
        return [_sets_sorted(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _sets_sorted(value) for key, value in node.items()}
    default = out.get("default")
    if isinstance(default, list) and _is_set(out) and _seeded(default):
        out["default"] = sorted(default, key=lambda item: msgspec.json.encode(item,
                                                                             order="sorted"))
    return out


def _seeded(value: Any) -> bool:
    """Whether a set default's JSON holds text: its members hashed by the process's seed (a
    str, bytes, a date), so their order changed from one process to the next. Numbers hash
    to themselves, and a set of them kept its order, and its fingerprint, in every process:
    sorted now, it would change once, holding every Run waiting in its Stage."""
    if isinstance(value, str):
        return True
    if isinstance(value, list):
        return any(_seeded(item) for item in value)
    if isinstance(value, dict):
        return any(_seeded(item) for item in value.values())
    return False


def _is_set(schema: dict[str, Any]) -> bool:
    """Whether a property's schema is a set's (or a union holding one)."""
    if schema.get("uniqueItems") is True:
        return True
    return any(isinstance(member, dict) and member.get("uniqueItems") is True
               for member in schema.get("anyOf", ()))


def _state_schema(workflow: str, where: str, state: type[Any]) -> bytes:
    """The State's JSON Schema, encoded for its fingerprint; a type without one is a
    definition mistake naming the field (the schema is what a restart checks a saved State
    against, so a State without one could never be restored)."""
    try:
        return msgspec.json.encode(_sets_sorted(msgspec.json.schema(state)), order="sorted")
    except Exception as whole:
        if isinstance(whole, NameError):
            # An annotation that names what the module does not hold at run time: "declare
            # its fields with a JSON type" was said of a `datetime` imported for type checkers.
            missing = f"{whole.name!r}" if whole.name else "a name"
            raise _bad(
                workflow, where,
                f"State {_shown_type(state)}'s field annotations name {missing}, which its "
                f"module does not define when it runs ({clip(str(whole), 300)})",
                "Import it at the module's top level, not under `if TYPE_CHECKING:` (a State's "
                "types are read at run time, to check and save it), and define the State class "
                "at module level, not inside a function.",
            ) from None
        # msgspec says which type, not which field: try the fields one by one.
        reason = f"{type(whole).__name__}: {clip(str(whole), 500)}"
        try:
            fields = msgspec.structs.fields(state)
        except Exception:
            fields = ()
        for f in fields:
            try:
                msgspec.json.schema(f.type)
            except Exception as exc:
                cause = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
                raise _bad(
                    workflow, where,
                    f"State {_shown_type(state)} field {f.name!r} has type "
                    f"{_shown_annotation(f.type)}, which has no JSON Schema"
                    + (f" ({clip(cause, 500)})" if cause else ""),
                    _tag_fix(f.name, f.type) or f"Declare {f.name!r} as {_instead(f.type)}.",
                ) from None
        raise _bad(
            workflow, where, f"State {_shown_type(state)} has no JSON Schema ({reason})",
            f"Declare its fields with {_instead(None)}.",
        ) from None


def _shown_annotation(annotation: object) -> str:
    return _shown_type(annotation) if isinstance(annotation, type) else repr(annotation)
