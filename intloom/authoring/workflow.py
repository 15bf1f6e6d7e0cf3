"""Declaring Workflows: Stages with a typed State, Steps routed on outcomes, Agent Steps.

Definition mistakes fail at once with ``WORKFLOW_DEFINITION_INVALID`` naming the Workflow,
the Stage, the Step and the fix; an outcome with no route fails the Run at run time with
``STEP_OUTCOME_NOT_HANDLED``.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar, overload

import msgspec

from intloom.errors import IntloomError

if TYPE_CHECKING:
    from intloom.authoring.agent import AgentResult
    from intloom.authoring.context import Recovery, StepContext

__all__ = [
    "COMPLETE",
    "AgentStep",
    "Complete",
    "Stage",
    "Step",
    "ToStage",
    "Tool",
    "Workflow",
]

S = TypeVar("S")
# A Stage State: checked at run time too (stage()), for users without a type checker.
StructT = TypeVar("StructT", bound=msgspec.Struct)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
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


Target = str | ToStage | Complete


@dataclass(frozen=True)
class Tool:
    """A capability a client Agent may call through the host, once per tool call id."""

    name: str
    fn: Callable[..., Any]
    description: str = ""


def _shown_type(value: object) -> str:
    """A class as its author wrote it: ``St``, ``probe_state.Notes``, ``dict``. A Workflow
    module is imported under an internal name (``WORKFLOW_MODULE_PREFIX``), which means nothing
    to its author; the class's own name is what they can find in their file."""
    if not isinstance(value, type):
        return f"{value!r} (a {type(value).__name__}, not a class)"
    module = value.__module__
    if module == "builtins" or module.startswith(WORKFLOW_MODULE_PREFIX):
        return value.__qualname__
    return f"{module}.{value.__qualname__}"


def _bad(workflow: str, where: str, fact: str, fix: str) -> IntloomError:
    return IntloomError(
        "WORKFLOW_DEFINITION_INVALID", f"Workflow {workflow!r}, {where}: {fact}. {fix}"
    )


def _check_name(workflow: str, where: str, kind: str, name: object) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise _bad(
            workflow, where, f"{kind} name {name!r} is not valid",
            "Use 1-64 letters, digits, '_', '-' or '.', starting with a letter or digit.",
        )
    return name


class Step(Generic[S]):
    """A code Step: ``fn(ctx) -> outcome`` (sync or async), with optional ``recover``."""

    kind = "code"

    def __init__(
        self, stage: Stage[S], name: str, fn: Callable[..., Any], routes: Mapping[str, Target]
    ) -> None:
        self.stage = stage
        self.name = name
        self.fn = fn
        self.routes: dict[str, Target] = dict(routes)
        self.is_async = inspect.iscoroutinefunction(fn)
        self.recover_fn: Callable[..., Any] | None = None
        self.__doc__ = fn.__doc__

    @functools.cached_property
    def where(self) -> str:  # asked on every run of the Step, used in its errors
        return f"Stage {self.stage.name!r}, Step {self.name!r}"

    def recover(self, fn: Callable[[StepContext[S], Recovery], Any]) -> Callable[..., Any]:
        """Declare the cross-process continuation of this Step's wait (used after a restart)."""
        wf = self.stage.workflow.name
        if self.recover_fn is not None:
            raise _bad(wf, self.where, "recover is declared twice", "Keep one recover entry.")
        if not callable(fn):
            raise _bad(wf, self.where, "recover must decorate a function", "Decorate a def.")
        self.recover_fn = fn
        return fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


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
        self.tools = {t.name: t for t in tools}
        self.complete_fn: Callable[..., Any] | None = None

    def recover(self, fn: Callable[[StepContext[S], Recovery], Any]) -> Callable[..., Any]:
        """Refused: an Agent task is never restored (claims, owner tokens and Tool receipts
        live only in the host's memory), so a ``recover`` here could never run."""
        raise _bad(
            self.stage.workflow.name, self.where,
            "recover cannot be declared on an Agent Step: after a restart its task is "
            "always reported RUN_INTERRUPTED (claims, owner tokens and Tool receipts are "
            "not restored)",
            "Remove the recover entry; keep what a new Run would need in the Stage State.",
        )

    def on_complete(self, fn: Callable[[StepContext[S], AgentResult], Any]
                    ) -> Callable[..., Any]:
        """Declare how the Agent's completion changes the State: ``fn(ctx, result) -> None``
        may assign ``ctx.state``; that State is saved with the Agent's outcome. It runs
        before anything is written: if it raises, the completion is refused (the task stays
        claimed) and the Agent is told why."""
        wf = self.stage.workflow.name
        if self.complete_fn is not None:
            raise _bad(wf, self.where, "on_complete is declared twice",
                       "Keep one on_complete entry.")
        if not callable(fn):
            raise _bad(wf, self.where, "on_complete must decorate a function", "Decorate a def.")
        self.complete_fn = fn
        return fn


class Stage(Generic[S]):
    """A named group of Steps sharing one typed State; its first Step is its entry."""

    def __init__(self, workflow: Workflow, name: str, state: type[S] | None) -> None:
        self.workflow = workflow
        self.name = name
        self.state_type = state
        self.steps: dict[str, Step[S]] = {}
        self.init_fn: Callable[..., Any] | None = None

    @property
    def entry(self) -> Step[S]:
        return next(iter(self.steps.values()))

    def _add(self, step: Step[S]) -> Step[S]:
        if step.name in self.steps:
            raise _bad(
                self.workflow.name, f"Stage {self.name!r}", f"Step {step.name!r} is defined twice",
                "Give every Step in a Stage its own name.",
            )
        self.steps[step.name] = step
        return step

    def _check_routes(self, step_name: str, routes: Mapping[str, Target]) -> None:
        where = f"Stage {self.name!r}, Step {step_name!r}"
        if not isinstance(routes, Mapping) or not routes:
            raise _bad(
                self.workflow.name, where, "routes must be a non-empty mapping",
                'Map each outcome to a Step name, intloom.ToStage("name") or intloom.COMPLETE.',
            )
        for outcome, target in routes.items():
            _check_name(self.workflow.name, where, "outcome", outcome)
            if not isinstance(target, (str, ToStage, Complete)):
                raise _bad(
                    self.workflow.name, where, f"outcome {outcome!r} routes to {target!r}",
                    'Route to a Step name, intloom.ToStage("name") or intloom.COMPLETE.',
                )

    def step(
        self, name: str, *, routes: Mapping[str, Target]
    ) -> Callable[[Callable[..., Any]], Step[S]]:
        """Declare a code Step. Its function returns an outcome string found in ``routes``."""
        _check_name(self.workflow.name, f"Stage {self.name!r}", "Step", name)
        self._check_routes(name, routes)

        def decorate(fn: Callable[..., Any]) -> Step[S]:
            return self._add(Step(self, name, fn, routes))

        return decorate

    def agent_step(
        self,
        name: str,
        *,
        routes: Mapping[str, Target],
        tools: Sequence[Tool] = (),
        agent: str = "default",
    ) -> Callable[[Callable[..., Any]], AgentStep[S]]:
        """Declare an Agent Step: its function returns the task for a client Agent."""
        _check_name(self.workflow.name, f"Stage {self.name!r}", "Step", name)
        self._check_routes(name, routes)
        names = [t.name for t in tools]
        if len(set(names)) != len(names) or not all(isinstance(t, Tool) for t in tools):
            raise _bad(
                self.workflow.name, f"Stage {self.name!r}, Step {name!r}",
                f"tools {names} are not distinct intloom.Tool objects",
                "Declare each Tool once with intloom.Tool(name, fn).",
            )

        def decorate(fn: Callable[..., Any]) -> AgentStep[S]:
            step = AgentStep(self, name, fn, routes, agent, tools)
            self._add(step)
            return step

        return decorate

    def init(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Declare the Stage initialiser: ``fn(ctx) -> State`` (runs as a durable boundary)."""
        if self.init_fn is not None:
            raise _bad(
                self.workflow.name, f"Stage {self.name!r}", "init is declared twice",
                "Keep one initialiser per Stage.",
            )
        self.init_fn = fn
        return fn


class Workflow:
    """A named, versioned Workflow. Its first Stage is the entry."""

    def __init__(self, name: str, *, version: str) -> None:
        _check_name(str(name), "definition", "Workflow", name)
        if not isinstance(version, str) or not version.strip():
            raise _bad(name, "definition", f"version {version!r} is empty",
                       'Pass version="1.0.0" (any non-empty label).')
        self.name = name
        self.version = version
        self.stages: dict[str, Stage[Any]] = {}

    @overload
    def stage(self, name: str, *, state: type[StructT]) -> Stage[StructT]: ...
    @overload
    def stage(self, name: str, *, state: None = None) -> Stage[None]: ...

    def stage(self, name: str, *, state: type[S] | None = None) -> Stage[S] | Stage[None]:
        """Declare a Stage; ``state`` is a msgspec.Struct type with defaults for every field."""
        _check_name(self.name, "definition", "Stage", name)
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
        self.stages[name] = stage
        return stage

    @property
    def entry(self) -> Stage[Any]:
        return next(iter(self.stages.values()))

    def validate(self) -> None:
        """Check the whole graph: every route names something that exists."""
        if not self.stages:
            raise _bad(
                self.name, "definition", "it has no Stage", "Declare one with wf.stage(...)."
            )
        for stage in self.stages.values():
            if not stage.steps:
                raise _bad(self.name, f"Stage {stage.name!r}", "the Stage has no Step",
                           "Declare one with @stage.step(...).")
            if stage.state_type is not None and stage.init_fn is None:
                try:
                    stage.state_type()
                except TypeError:
                    raise _bad(
                        self.name, f"Stage {stage.name!r}",
                        f"State {stage.state_type.__name__} has fields without defaults",
                        "Give every field a default, or declare @stage.init to build it.",
                    ) from None
            for step in stage.steps.values():
                for outcome, target in step.routes.items():
                    if isinstance(target, str) and target not in stage.steps:
                        raise _bad(
                            self.name, step.where,
                            f"outcome {outcome!r} routes to Step {target!r}, which Stage "
                            f"{stage.name!r} does not have",
                            f"Use one of {sorted(stage.steps)}, or intloom.ToStage(...).",
                        )
                    if isinstance(target, ToStage) and target.stage not in self.stages:
                        raise _bad(
                            self.name, step.where,
                            f"outcome {outcome!r} routes to Stage {target.stage!r}, which does "
                            "not exist",
                            f"Use one of {sorted(self.stages)}.",
                        )

    def has_recover(self, stage: str, step: str | None) -> bool:
        st = self.stages.get(stage)
        found = st.steps.get(step) if st is not None and step is not None else None
        return found is not None and found.recover_fn is not None

    def schemas(self) -> dict[str, str]:
        """Each Stage's State schema fingerprint (sha256 of its JSON Schema)."""
        import hashlib

        out: dict[str, str] = {}
        for stage in self.stages.values():
            if stage.state_type is None:
                out[stage.name] = "none"
                continue
            schema = msgspec.json.encode(msgspec.json.schema(stage.state_type), order="sorted")
            out[stage.name] = hashlib.sha256(schema).hexdigest()
        return out
