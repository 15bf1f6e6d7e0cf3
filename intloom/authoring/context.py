"""What a Step sees: ``StepContext`` (state, intent, effects, waits) and ``Recovery``.

The context is a thin surface over the executor, which implements :class:`ContextHooks`:
every effect and wait goes through it so it can be journaled before it happens.
"""

from __future__ import annotations

import asyncio
import inspect
import operator
import sys
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterator
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, TypeVar, overload

import msgspec

from intloom.authoring.interaction import Confirmation, Question, QuestionAnswer
from intloom.authoring.workflow import callable_name, generator_kind
from intloom.errors import IntloomError, a_an
from intloom.runtime.model import PendingAction

__all__ = ["OVER", "ContextHooks", "InitContext", "Recovery", "StepContext", "finish",
           "left_behind", "running_here", "unawaited"]

S = TypeVar("S")
T = TypeVar("T")


class _Over:
    """The State type of a context that is over (``finish``): it has no instances, so an
    assignment through that context fails the check every assignment makes."""


# For the driver, which finishes a Step's context as ``finish`` does, without its frame.
OVER: Final = _Over


class Recovery(msgspec.Struct, frozen=True):
    """What ``recover`` receives after a restart: the saved action and the accepted answer.

    ``action.request`` is what the client was shown: ``{"context": ...}`` (the value given
    to ``ctx.confirm``) for a confirmation, the questions as plain dicts for ``ctx.ask``."""

    action: PendingAction
    answer: Any  # Confirmation for a confirmation, list[QuestionAnswer] for questions


class ContextHooks(Protocol):
    """Implemented by the executor; each call is journaled before anything observable happens."""

    loop_thread: threading.Thread

    def effect_sync(self, name: str, key: str, call: Callable[[], Any]) -> Any: ...

    def effect_async(self, name: str, key: str, call: Callable[[], Any]
                     ) -> Coroutine[Any, Any, Any]: ...

    def wait(self, kind: str, request: Any, state: Any) -> Awaitable[Any]: ...

    def before_wait(self, kind: str) -> None:
        """Raise when this context may not wait at all (whatever the Step's kind)."""

    def running(self) -> str | None:
        """The Run's user code running now, as errors name it; None when none is."""


class StepContext(Generic[S]):
    """The Step's view of its Run. ``state`` is the Stage State; assign a new value to change it."""

    # The confirm/ask/aeffect calls this context made (``_Unawaited``), for ``unawaited`` to
    # check once the Step is over; None until the first (most Steps make none). Set in
    # __init__, not a class default: the driver reads it once per Step, and CPython 3.11
    # never specialises a read that finds a class attribute through an instance.
    _calls: list[_Unawaited[Any]] | None
    # Whether the Stage had no State, once ``finish`` has put ``_Over`` in its place: read
    # on the error path only, so a class default: a Step pays nothing for it.
    _stateless: bool = False
    # The calls of each effect name that took a default key, and, key -> (the effect's
    # name, whether it raised, whether the key was its default), the keys this Step's
    # effects took: made by the first effect (``_key``), as a Step that runs none (most)
    # need not build two dicts.
    _effect_counts: dict[str, int] | None = None
    _used_keys: dict[str, tuple[str, bool, bool]]
    # " recover" in the context given to a Step's ``recover``: its mistakes are named as
    # recover's (the Step's body, where its author looked, did not run). A class default, as
    # ``_stateless``: a Step pays nothing for it.
    _part: str = ""
    # The wait (its kind and action id) this context's code stopped awaiting before it was
    # answered (``abandoned``), for ``unawaited``: a class default, as ``_stateless``.
    _abandoned: tuple[str, str] | None = None
    # How many entries ``_calls`` may hold before the finished ones are dropped (``_track``).
    _prune_at: int = 256
    # The thread (not the host's loop) that was told, once, that this context is over
    # (``_stale``): a class default, as ``_stateless``.
    _refused_on: threading.Thread | None = None

    def __init__(  # not keyword-only: see Driver._ctx
        self,
        run_id: str,
        intent: str,
        stage: str,
        step: str | None,
        state: S,
        state_type: type[S] | None,
        hooks: ContextHooks,
    ) -> None:
        # Read-only below: errors and the journal name the Step by them, so a Step that
        # assigned ctx.step had its later errors name another Step.
        self._run_id = run_id
        self._intent = intent
        self._stage = stage
        self._step = step
        self._state = state
        # ``_Over`` once the code this context was given to is over (``finish``): a context
        # kept past it (in a global, a closure, a thread) would have its effects and waits
        # journaled as those of whatever code of the Run runs then, and a State assigned
        # through it would be lost. The type every assignment checks anyway says so: a Step
        # running pays nothing for it (a flag of its own measured ~18 ns per assignment).
        self._state_type: type[Any] | None = state_type
        self._hooks = hooks
        self._calls = None

    @property
    def run_id(self) -> str:
        """The Run's id (read-only)."""
        return self._run_id

    if not TYPE_CHECKING:  # read-only to a type checker, which flags an assignment

        @run_id.setter
        def run_id(self, value: object) -> None:
            raise self._fixed("run_id", "the Run")

    @property
    def intent(self) -> str:
        """The intent the Run was created with (read-only)."""
        return self._intent

    if not TYPE_CHECKING:  # read-only to a type checker, which flags an assignment

        @intent.setter
        def intent(self, value: object) -> None:
            raise self._fixed("intent", "the Run's intent, as it was created with")

    @property
    def stage(self) -> str:
        """The Stage running (read-only)."""
        return self._stage

    if not TYPE_CHECKING:  # read-only to a type checker, which flags an assignment

        @stage.setter
        def stage(self, value: object) -> None:
            raise self._fixed("stage", "the Stage running")

    @property
    def step(self) -> str | None:
        """The Step running; None in a Stage initialiser (read-only)."""
        return self._step

    if not TYPE_CHECKING:  # read-only to a type checker, which flags an assignment

        @step.setter
        def step(self, value: object) -> None:
            raise self._fixed("step", "the Step running")

    def _twin_state(self, given: type[Any], declared: type[Any]) -> IntloomError:
        """Two classes of one name: "assigned ctx.state a S; State is a S" contradicted
        itself. Most often one module imported under two names."""
        name = declared.__name__
        return IntloomError(
            "STAGE_STATE_INVALID",
            f"{self.where} assigned ctx.state {a_an(name)} of module {given.__module__}, but "
            f"Stage {self.stage!r} State is the {name} of module {declared.__module__}: two "
            "classes of one name, most often one module imported under two names. intloom "
            "loads a package entry under a private name, so a module of the package that "
            "imports it by its own name (from mypkg.models import S) gets a second copy of "
            "what its relative imports get (from .models import S): import within the "
            "package relatively.",
        )

    def _fixed(self, field: str, what: str) -> IntloomError:
        return IntloomError(
            "STEP_INTERACTION_INVALID",
            f"{self.where} assigned ctx.{field}, which is read-only: it is {what}, as the "
            "journal and every error name it, and it stays as it was. Keep a value of your "
            "own in a local variable, or in ctx.state to keep it between Steps.",
        )

    @property
    def state(self) -> S:
        """The Stage State; assign a value of the Stage's State type to replace it."""
        return self._state

    @state.setter
    def state(self, value: S) -> None:
        state_type = self._state_type
        if state_type is not None:
            if not isinstance(value, state_type):
                if state_type is _Over:  # no value is an instance of it
                    if value is None and self._stateless:
                        return  # what a running Step of a Stage without State may assign
                    raise self._stale_state()
                name = state_type.__name__
                if type(value).__qualname__ == state_type.__qualname__:
                    raise self._twin_state(type(value), state_type)
                given = "None" if value is None else a_an(type(value).__name__)
                raise IntloomError(
                    "STAGE_STATE_INVALID",
                    f"{self.where} assigned ctx.state {given}; Stage "
                    f"{self.stage!r} State is {a_an(name)}. Assign {a_an(name)} "
                    f"(`ctx.state = {name}(...)`) or change a field of ctx.state.",
                )
        elif value is not None:
            # It would be saved, but no later context decodes it: the value would be lost.
            raise IntloomError(
                "STAGE_STATE_INVALID",
                f"{self.where} assigned ctx.state {a_an(type(value).__name__)}, but Stage "
                f"{self.stage!r} has no State. Declare one (`wf.stage({self.stage!r}, "
                "state=YourStruct)`) to keep it between Steps.",
            )
        self._state = value

    if not TYPE_CHECKING:  # the same property to a type checker, which reads the def above
        # Read through a C getter, not the def above: CPython 3.11 calls a property's Python
        # getter through a frame of its own, and a Step reads ctx.state at least once
        # (callgrind, 64 async Runs of a Step reading it twice: ~0.6k fewer instructions
        # per Step).
        state = property(operator.attrgetter("_state"), state.fset, doc=state.__doc__)

    def _key(self, name: str, key: str | None) -> str:
        """The journal key of an effect about to start, refused when the journal could not
        tell it apart: a key names one effect of the Step (a RUN_INTERRUPTED message names the
        one in flight by it). A call that raised may be retried under its own key: it is
        journaled as done (failed), so the key still names one effect in flight."""
        if not isinstance(name, str) or not name:
            raise IntloomError(
                "STEP_INTERACTION_INVALID",
                f"{self.where} started an effect named {name!r}; its name is what the journal "
                "and RUN_INTERRUPTED messages call it. Give it a non-empty name, e.g. "
                '`ctx.effect("charge-card", charge, order)`.',
            )
        counts = self._effect_counts
        if counts is None:
            # The keys first: an effect started from another of the Step's threads meanwhile
            # (refused alongside this one, with a message) that finds the counts finds them.
            self._used_keys = {}
            counts = self._effect_counts = {}
        defaulted = key is None
        if key is None:
            n = counts.get(name, 0) + 1
            counts[name] = n
            key = f"{name}#{n}"
        elif not isinstance(key, str) or not key:
            raise IntloomError(
                "STEP_INTERACTION_INVALID",
                f"{self.where} gave effect {name!r} the key {key!r}. Give it a non-empty "
                "string key, or leave key= out to get the default (name#n, counting the "
                "calls of that name in the Step).",
            )
        used = self._used_keys.get(key)
        if used is not None and (used[0] != name or not used[1]):
            holder = (f"effect {used[0]!r}" if used[0] != name
                      else "an earlier call of it that did not fail")
            whose = "the default key" if used[2] else "the key"
            if defaulted:
                # The user gave this call no key: naming "the key 'x#2'" as if given sent
                # them looking for a key= they never wrote. The clash is with a key= they did
                # write (defaults never repeat: each name counts its own calls).
                other = "the earlier call" if used[0] == name else holder
                raise IntloomError(
                    "STEP_INTERACTION_INVALID",
                    f"{self.where} started effect {name!r} without key=, so its key defaulted "
                    f"to {key!r} (name#n: call {counts[name]} of {name!r} "
                    f"without key= in this Step), already the key= given to {holder} in this "
                    "Step. A key names one effect in the journal (RUN_INTERRUPTED names the "
                    f"effect in flight by it): pass this call of {name!r} a key= of its own, "
                    f"or give {other} another key= (one not of the form name#n).",
                )
            if used[0] != name:
                # Whether or not that effect raised: a retry is a call of the same name under
                # the same key, so "only a call that raised" read as if this one qualified.
                other = used[0]
                raise IntloomError(
                    "STEP_INTERACTION_INVALID",
                    f"{self.where} gave effect {name!r} the key {key!r}, already {whose} of "
                    f"{holder} in this Step. A key names one effect in the journal "
                    f"(RUN_INTERRUPTED names the effect in flight by it), so {key!r} belongs "
                    f"to effect {other!r}: only a call of {other!r} may reuse it, to retry it "
                    f"after it raised. Give effect {name!r} its own key (or leave key= "
                    "out: the default, name#n, counts the calls of each name), or call "
                    f"{other!r} under {key!r} if this call is its retry.",
                )
            raise IntloomError(
                "STEP_INTERACTION_INVALID",
                f"{self.where} gave effect {name!r} the key {key!r}, already {whose} of "
                f"{holder} in this Step. A key names one effect in the journal "
                "(RUN_INTERRUPTED names the effect in flight by it): give each effect its own "
                "key, or leave key= out (the default, name#n, counts the calls of each name). "
                "Only a call that raised may be retried under its key.",
            )
        self._used_keys[key] = (name, False, defaulted)
        return key

    def _failed(self, name: str, key: str) -> None:
        """The effect under ``key`` raised: a retry may reuse its key (``_key``)."""
        self._used_keys[key] = (name, True, self._used_keys[key][2])

    def _stale(self, call: str, what: str, skipped: str) -> IntloomError:
        """The refusal of ``call`` through this context once its code is over: the journal
        would record it as the code running now (``what``: an effect, a wait), whose
        restart facts it would then falsify."""
        here = threading.current_thread()
        if here is not self._hooks.loop_thread:
            if self._refused_on is here:
                # Told already, and calling again: a retry loop that catches everything, on
                # the thread of a sync Step the Run no longer waits for (a cancel, a stop's
                # grace that ran out). Refused at once, it spun at 100 % of a core until the
                # host exited, or for good after a cancel. Nothing it calls can be recorded
                # any more, so the thread waits here until the host exits (workers are
                # daemon threads; a Step never waits for another's thread). Never on the
                # loop: that would hold up every Run.
                _PARKED.wait()
            self._refused_on = here
        over, recorded = self._over_while()
        return IntloomError(
            "STEP_INTERACTION_INVALID",
            f"{call} was called through the ctx given to {over}. A ctx acts only while the "
            f"code it was given to runs: the journal would have recorded this {what} "
            f"{recorded}. Nothing was recorded and {skipped}. {_KEEP_NONE}",
        )

    def _stale_state(self) -> IntloomError:
        """The refusal of ``ctx.state = ...`` through this context once its code is over:
        nothing reads its State any more, so the value would be lost without a word. In a
        Stage without State, nothing would have kept it even then: that is said too."""
        over, _recorded = self._over_while()
        if self._stateless:
            fact = (f"Stage {self.stage!r} has no State, so nothing keeps a value assigned "
                    "to ctx.state, and that ctx's code is over as well")
            fix = (f"Declare a State (`wf.stage({self.stage!r}, state=YourStruct)`) and "
                   "assign the running Step's own ctx.state")
        else:
            fact = ("its State was saved when that code returned (or dropped with it), and "
                    "nothing reads it again")
            fix = "Assign the running Step's own ctx.state"
        return IntloomError(
            "STEP_INTERACTION_INVALID",
            f"ctx.state was assigned through the ctx given to {over}. A ctx acts only while "
            f"the code it was given to runs: {fact}, so this value would have been lost. "
            f"Nothing was changed. {fix} (pass its ctx to helpers as an argument); do not "
            "keep one in a global or a closure for a later Step.",
        )

    def _over_while(self) -> tuple[str, str]:
        """This context's code, said to be over, and what ran then (an error path only);
        and how the journal would have recorded a call made now."""
        running = self._hooks.running()
        if running is None:
            during = "no code of the Run was running"
            recorded = "under no running code at all"
        elif running == self.where:
            during = "a later execution of that Step was running"
            recorded = "as made by that later execution"
        else:
            during = f"{running} was running"
            recorded = f"as made by {running}"
        return (f"{self.where}, which was over (it had returned or raised, or the Run had "
                "stopped waiting for it: a cancel, or a stop's grace that ran out), while "
                f"{during}", recorded)

    # ``name`` and ``fn`` positional-only: a function taking its own ``name`` or ``fn``
    # argument (``ctx.effect("create", create_user, name="bob")``) got "multiple values for
    # argument 'name'" instead of it. ``key=`` stays intloom's own idempotency key.
    def effect(self, name: str, fn: Callable[..., T], /, *args: Any, key: str | None = None,
               **kwargs: Any) -> T:
        """Run an external call as a journaled effect (sync Steps).

        ``effect_started`` is durable before ``fn`` is called, so if the host dies while it
        runs, the Run is reported RUN_INTERRUPTED naming this effect; it is never re-run.
        """
        if not isinstance(name, str):
            raise _not_a_name(self.where, "ctx.effect", name, (fn, *args), key, kwargs)
        if self._state_type is _Over:
            raise self._stale(f"ctx.effect({name!r}, ...)", "effect",
                              "the effect was not called")
        if threading.current_thread() is self._hooks.loop_thread:
            # Named as every other refusal of the call names its code: "Step s/None" was how
            # an async initialiser was called here, and nothing said the effect had not run.
            raise IntloomError(
                "STEP_INTERACTION_INVALID",
                f"{self.where} is async and called ctx.effect({name!r}, ...), which is for "
                "sync code: it would run the effect on the host's event loop, holding up "
                "every Run. The effect was not called and nothing was recorded. Write "
                "`result = await ctx.aeffect(...)` there.",
            )
        if not callable(fn):
            raise _not_a_function(self.where, "ctx.effect", name, fn)
        if inspect.iscoroutinefunction(fn):
            raise IntloomError(
                "STEP_INTERACTION_INVALID",
                f"{self.where} passed {callable_name(fn)!r}, an async function, to "
                "ctx.effect, which calls it in this sync Step: it would return a coroutine "
                "that never runs. The effect was not called and nothing was recorded. Make "
                f"{self._code} `async def` and write `await ctx.aeffect(...)`, or pass a sync "
                "function.",
            )
        generator = _a_generator(self.where, "ctx.effect", fn)
        if generator is not None:
            raise generator
        key = self._key(name, key)
        try:
            return self._hooks.effect_sync(  # type: ignore[no-any-return]
                name, key, lambda: fn(*args, **kwargs)
            )
        except BaseException:
            self._failed(name, key)
            raise

    # The value an awaited ``ctx.aeffect`` gives is what ``fn`` returns (awaited when it is
    # awaitable): typed Any, every use of it went unchecked.
    # ``name`` and ``fn`` positional-only, as in ``effect``.
    @overload
    def aeffect(self, name: str, fn: Callable[..., Awaitable[T]], /, *args: Any,
                key: str | None = None, **kwargs: Any) -> Coroutine[Any, Any, T]: ...
    @overload
    def aeffect(self, name: str, fn: Callable[..., T], /, *args: Any,
                key: str | None = None, **kwargs: Any) -> Coroutine[Any, Any, T]: ...

    def aeffect(self, name: str, fn: Callable[..., Any], /, *args: Any,
                key: str | None = None, **kwargs: Any) -> Coroutine[Any, Any, Any]:
        """Run an external call as a journaled effect (async Steps); ``fn`` may be async.

        ``fn`` is called on the host's event loop, like the async Step itself: a sync ``fn``
        must not block (``asyncio.to_thread`` as ``fn`` hands a blocking call to a thread).
        Refused at the call in a sync Step: there the coroutine would never be awaited and
        the effect would silently never run.
        """
        if not isinstance(name, str):
            raise _not_a_name(self.where, "await ctx.aeffect", name, (fn, *args), key, kwargs)
        if self._state_type is _Over:
            raise self._stale(f"ctx.aeffect({name!r}, ...)", "effect",
                              "the effect was not called")
        if threading.current_thread() is not self._hooks.loop_thread:
            elsewhere = _another_loop(self.where, "aeffect", "result = await ctx.aeffect(...)",
                                      self._code)
            if elsewhere is not None:
                raise elsewhere
            raise IntloomError(
                "STEP_INTERACTION_INVALID",
                f"{self.where} is sync and called ctx.aeffect, whose effect runs only when "
                "awaited in an async Step. Use `ctx.effect(...)` in a sync Step, or make "
                f"{self._code} `async def` and write `result = await ctx.aeffect(...)`.",
            )
        if not callable(fn):
            raise _not_a_function(self.where, "await ctx.aeffect", name, fn)
        generator = _a_generator(self.where, "ctx.aeffect", fn)
        if generator is not None:
            raise generator
        key = self._key(name, key)
        return self._track(_Unawaited(self._aeffect(name, key, lambda: fn(*args, **kwargs)),
                                      self, "aeffect", (name, key)))

    async def _aeffect(self, name: str, key: str, call: Callable[[], Any]) -> Any:
        try:
            return await self._hooks.effect_async(name, key, call)
        except BaseException:
            self._failed(name, key)
            raise

    @property
    def where(self) -> str:
        """The Step (its ``recover``, or a Stage initialiser) this context belongs to, as
        errors name it."""
        if self.step is None:
            return f"Stage {self.stage!r} initialiser"
        return f"Stage {self.stage!r}, Step {self.step!r}{self._part}"

    @property
    def _code(self) -> str:
        """The code this context was given to, as a fix names it ("make the Step async")."""
        if self.step is None:
            return "the initialiser"
        return "recover" if self._part else "the Step"

    def _track(self, call: _Unawaited[T]) -> _Unawaited[T]:
        """Keep ``call`` for ``unawaited``: one never awaited would otherwise be dropped
        without a word (no question asked, no effect run, the Step's outcome recorded)."""
        calls = self._calls
        if calls is None:
            calls = self._calls = []
        calls.append(call)
        if len(calls) >= self._prune_at:
            # A Step awaiting ctx.aeffect in a long loop kept every call until it ended
            # (~360 bytes each): only one not yet finished can be named at the end. Dropped in
            # bulk, each time the list doubles, so a call costs O(1) on average.
            calls[:] = [c for c in calls
                        if inspect.getcoroutinestate(c._coro) != inspect.CORO_CLOSED]
            self._prune_at = max(StepContext._prune_at, 2 * len(calls))
        return call

    def _async_only(self, call: str, example: str) -> None:
        """confirm/ask wait for a person, which only an async Step can do: called from a sync
        one (always on a worker thread) they would return a coroutine nobody awaits."""
        if threading.current_thread() is not self._hooks.loop_thread:
            elsewhere = _another_loop(self.where, call, example, self._code)
            if elsewhere is not None:
                raise elsewhere
            raise IntloomError(
                "STEP_INTERACTION_INVALID",
                f"{self.where} is sync and called ctx.{call}, which waits for a person and "
                f"works only in an async Step. Make {self._code} `async def` and write "
                f"`{example}`.",
            )

    def confirm(self, context: Any) -> Coroutine[Any, Any, Confirmation]:
        """Ask a person to confirm; the Run waits (durably) until they answer.

        Await it in an async Step: ``answer = await ctx.confirm({...})``.
        """
        if self._state_type is _Over:
            raise self._stale("ctx.confirm(...)", "wait", "nobody was asked to confirm")
        self._hooks.before_wait("confirmation")
        self._async_only("confirm", _EXAMPLES["confirm"])
        return self._track(_Unawaited(self._confirm(context), self, "confirm", context))

    async def _confirm(self, context: Any) -> Confirmation:
        try:
            answer = await self._hooks.wait("confirmation", context, self._state)
        except asyncio.CancelledError as exc:
            self._abandoned = getattr(exc, _ABANDONED, None) or self._abandoned
            raise
        assert isinstance(answer, Confirmation)
        return answer

    def ask(self, questions: list[Question]) -> Coroutine[Any, Any, list[QuestionAnswer]]:
        """Ask a person questions; returns one answer per question (possibly skipped).

        Await it in an async Step: ``answers = await ctx.ask([intloom.Question(...)])``.
        """
        if self._state_type is _Over:
            raise self._stale("ctx.ask([...])", "wait", "its questions were not asked")
        self._hooks.before_wait("questions")
        self._async_only("ask", _EXAMPLES["ask"])
        _check_questions(self.where, questions)
        return self._track(_Unawaited(self._ask(questions), self, "ask", questions))

    async def _ask(self, questions: list[Question]) -> list[QuestionAnswer]:
        try:
            answer = await self._hooks.wait("questions", questions, self._state)
        except asyncio.CancelledError as exc:
            self._abandoned = getattr(exc, _ABANDONED, None) or self._abandoned
            raise
        assert isinstance(answer, list)
        return answer


class InitContext(StepContext[S]):
    """A Stage initialiser's context: the Stage has no State yet (the initialiser returns
    its first), and an earlier Stage's State was released when the Run left it. Read before
    the initialiser assigned one, ``ctx.state`` was None under a type that says otherwise:
    mypy passed ``ctx.state.n + 1`` and the Run failed with "'NoneType' object has no
    attribute 'n'". A Step's context pays nothing for this (a subclass, made only for an
    initialiser)."""

    @property
    def state(self) -> S:
        state_type = self._state_type
        if state_type is None or state_type is _Over or self._state is not None:
            # A Stage without State (None), a context that is over, or a State the
            # initialiser assigned itself: as any context.
            return self._state
        name = state_type.__name__
        raise IntloomError(
            "STEP_INTERACTION_INVALID",
            f"{self.where} read ctx.state before assigning it: an initialiser starts with "
            f"no State, and returns the Stage's first (`return {name}(...)`); an earlier "
            "Stage's State is released when the Run leaves that Stage. Build it from "
            "ctx.intent, or from what earlier Steps stored outside their State (a file, a "
            "database).",
        )

    @state.setter
    def state(self, value: S) -> None:
        StepContext.state.fset(self, value)  # type: ignore[attr-defined]


def _another_loop(where: str, call: str, example: str, code: str) -> IntloomError | None:
    """The refusal of ``ctx.<call>`` made on an event loop of a thread's own (``asyncio.run``
    handed to ``asyncio.to_thread`` by an async Step, or run by a sync one): "is sync" named a
    fact the author of an async Step could not find. None on a thread without a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return None
    return IntloomError(
        "STEP_INTERACTION_INVALID",
        f"{where} called ctx.{call} on an event loop other than the host's (asyncio.run in a "
        "thread, say), where the journal cannot follow it; nothing was recorded. Write "
        f"`{example}` in {code} itself, on the host's loop (make it `async def` if it is not; "
        "hand only blocking calls to a thread).",
    )


# Never set: what a thread calling again through a ctx that is over waits on (``_stale``).
_PARKED: Final = threading.Event()

_KEEP_NONE: Final = ("Use the ctx the running Step was given (pass it to helpers as an "
                     "argument); do not keep one in a global or a closure for a later Step.")


def _not_a_function(where: str, call: str, name: str, fn: object) -> IntloomError:
    """The refusal of an effect given what cannot be called, most often what a call of its
    function returned (``ctx.effect("charge", charge(order))``): that failed in the effect as
    "'dict' object is not callable", journaled as the effect's failure, though the call had
    run already, outside the journal."""
    if inspect.iscoroutine(fn):
        fn.close()  # never awaited: closed, it warns nobody on the host's stderr
        what = (f"a coroutine ({getattr(fn, '__qualname__', '?')}(...) was called, not "
                "passed; it never ran)")
    else:
        shown = "None" if fn is None else a_an(type(fn).__name__)
        what = (f"{shown}, which cannot be called (if a call returned it, that call ran "
                "outside the journal)")
    return IntloomError(
        "STEP_INTERACTION_INVALID",
        f"{where} passed {what} to {call}({name!r}, ...) as the effect's function. The effect "
        f"was not called and nothing was recorded. Pass the function and its arguments, "
        f"uncalled: `{call}({name!r}, fn, *args)`.",
    )


def _not_a_name(where: str, call: str, name: object, args: tuple[Any, ...], key: object,
                kwargs: dict[str, Any]) -> IntloomError:
    """The refusal of an effect whose first argument is not its name, most often its
    function with the name left out (``ctx.effect(create_user, "bob")``): that was told
    "bob", a str, "cannot be called", and shown a fix with the function's repr as the name."""
    if callable(name):
        shown = callable_name(name)
        label = getattr(name, "__name__", None)
        if not isinstance(label, str) or not label.isidentifier():
            label = "name"  # a lambda's "<lambda>", a callable object's missing __name__
        given = [_arg_shown(arg) for arg in args]
        given += [f"{k}={_arg_shown(v)}" for k, v in
                  [*kwargs.items(), *([("key", key)] if key is not None else [])]]
        rest = ", ".join(given)
        if len(rest) > 80:  # a fix to copy, not the data: long arguments are elided
            rest = "..."
        what = f"the function {shown}"
        example = f'{call}("{label}", {shown}{", " + rest if rest else ""})'
    else:
        what = "None" if name is None else f"{_arg_shown(name)} ({a_an(type(name).__name__)})"
        example = f'{call}("charge-card", charge, order)'
    return IntloomError(
        "STEP_INTERACTION_INVALID",
        f"{where} called {call} with {what} as its first argument, which is the effect's "
        "name: what the journal and RUN_INTERRUPTED messages call it. The effect was not "
        "called and nothing was recorded. Pass the name first, then the function and its "
        f"arguments: `{example}`.",
    )


def _arg_shown(value: object) -> str:
    """An argument as a fix shows it: a function by its name; anything else by its repr,
    which is user code and may raise, or be long."""
    if callable(value):
        return callable_name(value)
    try:
        text = repr(value)
    except Exception:
        return "..."
    return text if len(text) <= 40 else "..."


def _a_generator(where: str, call: str, fn: object) -> IntloomError | None:
    """The refusal of a generator function (or an async one) as an effect's function, or
    None. Calling one returns a generator, never what it yields: the effect was journaled
    done with "<generator object ...>" before its body ever ran, and never ran it after."""
    # Named only once refused: callable_name may fall back to repr(fn), user code that may
    # be slow (a partial holding megabytes) or raise, on every effect that is no generator.
    kind = generator_kind(fn)
    if kind is None:
        return None
    shown = callable_name(fn)
    consume = (f"an async function given to `await ctx.aeffect(...)` (`async def collect(): "
               f"return [x async for x in {shown}(...)]`)" if kind == "an async generator"
               else f"a normal function (`lambda: list({shown}(...))`)")
    return IntloomError(
        "STEP_INTERACTION_INVALID",
        f"{where} passed {shown!r}, {kind} function (it has `yield`), to {call}, which "
        f"calls it and records what it returns: {kind} object, whose body would never run. "
        "The effect was not called and nothing was recorded. Return a list instead of "
        f"yielding, or consume the generator inside {consume} and pass that.",
    )


def _check_questions(where: str, questions: Any) -> None:
    """ctx.ask's argument is a list of intloom.Question: a dict or a bare string would fail
    later, inside intloom, as an AttributeError that names neither the Step nor the fix."""
    fix = ('Pass a list of intloom.Question, e.g. '
           '[intloom.Question(id="topic", question="What is it about?")].')
    if isinstance(questions, Iterator):
        # A generator expression, map(...): named by its type, not "<generator object
        # <genexpr> at 0x...>", and with the one-character fix.
        if inspect.isgenerator(questions):
            questions.close()
        raise IntloomError(
            "STEP_INTERACTION_INVALID",
            f"{where}: ctx.ask was given {a_an(type(questions).__name__)}, not a list of "
            "questions; nothing was asked. Make it a list: `[intloom.Question(...) for ...]` "
            "rather than `(... for ...)`, or `list(...)` of it.",
        )
    if not isinstance(questions, (list, tuple)):
        raise IntloomError(
            "STEP_INTERACTION_INVALID",
            f"{where}: ctx.ask was given {type(questions).__name__} "
            f"{_short(questions)}, not a list of questions. {fix}",
        )
    for index, item in enumerate(questions):
        if not isinstance(item, Question):
            raise IntloomError(
                "STEP_INTERACTION_INVALID",
                f"{where}: question {index} given to ctx.ask is {type(item).__name__} "
                f"{_short(item)}, not an intloom.Question. {fix}",
            )


def _short(value: Any, limit: int = 80) -> str:
    try:
        text = repr(value)
    except Exception:  # too deep for repr (RecursionError), or a __repr__ that raises
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


# What a Step reads off an answer (Confirmation, QuestionAnswer): read off the un-awaited call
# instead, they are the mistake _Unawaited names.
_ANSWER_FIELDS = frozenset({"confirmed", "feedback", "question_id", "skipped", "answer"})
# How confirm and ask are written when awaited, as the errors about them show the fix
# (aeffect's names its effect: ``_Unawaited.example``).
_EXAMPLES: Final = {
    "confirm": "answer = await ctx.confirm(...)",
    "ask": "answers = await ctx.ask([...])",
}
# What did not happen because a call was never awaited.
_SKIPPED: Final = {
    "confirm": "nobody was asked to confirm and the Run did not wait for an answer",
    "ask": "its questions were never asked and the Run did not wait for answers",
    "aeffect": "the effect never ran",
}


class _Unawaited(Coroutine[Any, Any, T]):
    """What ctx.confirm/ask/aeffect return: a coroutine (it awaits, and asyncio.create_task
    takes it, exactly like the ``async def`` it wraps), but used without ``await`` (``answer
    = ctx.confirm(...)`` then ``answer.confirmed``) it raises an error naming the Step and
    the fix, not "'coroutine' object has no attribute ...". Dropped without ``await``, it is
    named when the Step is over (``unawaited``)."""

    __slots__ = ("_call", "_coro", "_ctx", "_detail", "_task")

    def __init__(self, coro: Coroutine[Any, Any, T], ctx: StepContext[Any], call: str,
                 detail: Any) -> None:
        self._coro = coro
        self._ctx = ctx
        self._call = call  # confirm, ask or aeffect
        # What names the call in an error: the context, the questions, (name, key). Kept
        # as given: the text is built only for an error.
        self._detail = detail
        # The task that first ran it: the Step's own, or one it started -- directly
        # (create_task(ctx.aeffect(...))) or through a coroutine of its own that awaits it.
        self._task: asyncio.Task[Any] | None = None

    def __await__(self) -> Generator[Any, None, T]:
        if self._task is None:
            self._task = asyncio.current_task()
        return self._coro.__await__()

    def send(self, value: Any) -> Any:
        if self._task is None:
            self._task = asyncio.current_task()
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if val is None and tb is None:  # the one-argument form: the others are deprecated
            return self._coro.throw(typ)
        return self._coro.throw(typ, val, tb)

    def close(self) -> None:
        self._coro.close()

    def named(self) -> str:
        """The call as errors name it: ``ctx.aeffect('charge', ...) (key 'charge#1')``."""
        if self._call == "aeffect":
            name, key = self._detail
            return f"ctx.aeffect({name!r}, ...) (key {key!r})"
        if self._call == "ask":
            ids = [getattr(q, "id", "?") for q in self._detail]
            return f"ctx.ask([...]) (questions {_short(ids)})"
        return f"ctx.confirm({_short(self._detail, 60)})"

    def example(self) -> str:
        if self._call == "aeffect":
            return f"result = await ctx.aeffect({self._detail[0]!r}, ...)"
        return _EXAMPLES[self._call]

    def _misuse(self) -> IntloomError:
        # It will not be awaited now; closing it spares a "never awaited" RuntimeWarning on
        # top of this error, and ``unawaited`` a second report of it.
        self._coro.close()
        return IntloomError(
            "STEP_INTERACTION_INVALID",
            f"{self._ctx.where} used the result of {self.named()} without awaiting it. "
            f"Write `{self.example()}` in an async Step.",
        )

    def __getattr__(self, name: str) -> Any:
        if name in _ANSWER_FIELDS:
            raise self._misuse()
        # Anything else is asked of the coroutine, as of the ``async def``'s own: asyncio
        # probes cr_frame, gi_frame, __qualname__ (task reprs) and must get what it expects.
        return getattr(self._coro, name)

    def __iter__(self) -> Iterator[Any]:
        raise self._misuse()

    def __getitem__(self, key: Any) -> Any:
        raise self._misuse()

    def __len__(self) -> int:
        raise self._misuse()

    def __bool__(self) -> bool:
        raise self._misuse()


# The attribute ``abandoned`` sets on the CancelledError that ended a wait the Step itself
# cancelled (never on one of the host's: a stop, a cancel of the Run).
_ABANDONED: Final = "_intloom_abandoned_wait"


def abandoned(exc: asyncio.CancelledError, kind: str, action_id: str) -> None:
    """Mark ``exc`` as ending the wait ``action_id`` (``kind``) that its Step cancelled
    itself (asyncio.wait_for's timeout, a cancelled task): the journal still waits for the
    answer, so the Step cannot go on to an outcome (``unawaited`` names it)."""
    setattr(exc, _ABANDONED, (kind, action_id))


def finish(ctx: StepContext[Any]) -> None:
    """The code ``ctx`` was given to is over (it returned or raised), or the Run no longer
    waits for it (a cancel, or a stop's grace that ran out, while a sync Step's thread still
    runs it): from now on its effects and waits are refused (``StepContext._stale``), never
    journaled as another Step's, and so is a State assigned through it (``_stale_state``),
    which nothing would read."""
    if ctx._state_type is None:
        ctx._stateless = True
    ctx._state_type = _Over


def running_here() -> StepContext[Any] | None:
    """The context of the code (a Step, an initialiser, ``recover``) that this call comes
    from, found on the calling thread's stack: the innermost one not over. None on a thread
    that runs no such code (a thread a Step started, any other program).

    Looked up by ``Client.wait_run`` and ``Client.subscribe`` in the host's own process
    only (a Step waiting for its own Run is refused): the Step path records nothing for
    it, so a Step pays nothing."""
    frame = sys._getframe(1)
    while frame is not None:
        for value in frame.f_locals.values():
            if isinstance(value, StepContext) and value._state_type is not _Over:
                return value
        frame = frame.f_back  # type: ignore[assignment]
    return None


def unawaited(ctx: StepContext[Any], returned: bool
              ) -> tuple[str, str, list[asyncio.Task[Any]]] | None:
    """What the Step owning ``ctx`` left of its confirm/ask/aeffect calls, once it is over
    (``returned``: it returned; otherwise it raised): None when it awaited each one, else
    (the facts -- empty when only tasks were cancelled, the Step having raised --, the fix,
    the tasks cancelled here that had begun: the caller waits for them, so an effect they
    ran is journaled done before the Run ends). The caller checks
    ``ctx._calls is not None`` first, so a Step that made no call pays no call.

    A call never awaited is closed (no "never awaited" RuntimeWarning, which nobody would
    see: the host's stderr goes nowhere) and named: a confirmation gate or an effect must
    not be skipped without a word. A call handed to a task (asyncio.create_task, gather)
    that has not finished when the Step returns is named too, and its task cancelled: it
    would otherwise act after the Step's result is recorded, as part of the next Step. When
    the Step raised, such a task is cancelled too (a gather's sibling after the first
    failure), silently: the Step's own error is the one reported."""
    calls, ctx._calls = ctx._calls, None  # the Step is over: no cycle through its context
    if calls is None:
        return None
    created: list[_Unawaited[Any]] = []
    suspended: list[_Unawaited[Any]] = []
    for call in calls:
        state = inspect.getcoroutinestate(call._coro)
        if state == inspect.CORO_CREATED:
            created.append(call)
        elif state == inspect.CORO_SUSPENDED:
            suspended.append(call)
    dropped = ctx._abandoned if returned else None
    if not created and not suspended and dropped is None:
        return None
    # A call not begun is found through the task created with it; one begun knows its task.
    tasks = _tasks_of(created) if created else {}
    facts: list[str] = []
    fixes: list[str] = []
    if dropped is not None:
        # Its outcome would follow a wait the journal still holds open (the answer may yet
        # come): no record can, so the Run fails here, naming the wait.
        kind, action_id = dropped
        facts.append(
            f"stopped waiting for its {kind} {action_id} before it was answered (its await "
            "was cancelled: a timeout such as asyncio.wait_for's, or a cancel of the task "
            "awaiting it), while its journal held the Run at that wait, so no outcome could "
            "follow it and the Run fails here, its wait closed with it")
        waited = "confirm" if kind == "confirmation" else "ask"
        fixes.append(f"Await ctx.{waited}(...) until it is answered: a wait has no timeout (a "
                     "person can decline it, or cancel the Run)")
    for call in created:
        task = tasks.get(id(call))
        if task is None:
            call._coro.close()
            facts.append(f"called {call.named()} without awaiting it, so "
                         f"{_SKIPPED[call._call]}")
            fixes.append(f"Write `{call.example()}`")
            continue
        task.cancel()  # not begun: its coroutine is closed without running
        if returned:
            facts.append(f"returned before the task it handed {call.named()} to had begun, "
                         "so that task was cancelled")
            fixes.append(_AWAIT_TASK)
    running: list[asyncio.Task[Any]] = []
    for call in suspended:
        # Cancelled whether the Step returned or raised (a gather's sibling after the first
        # failure): the Run ends with its Step, and an effect left running would end after
        # the Run's terminal record, where its effect_done can no longer be written.
        task = call._task
        if task is not None and not task.done() and task is not asyncio.current_task():
            _LEFT_BEHIND[task] = returned
            task.cancel()
            running.append(task)
            if returned:
                facts.append(f"returned while the task it handed {call.named()} to was "
                             "still running, so that task was cancelled")
        elif returned:
            facts.append(f"returned while {call.named()} was still running")
        if returned:
            fixes.append(_AWAIT_TASK)
    if not facts and not running:
        return None
    return "; it ".join(facts), ". ".join(dict.fromkeys(fixes)) + ".", running


# Tasks ``unawaited`` cancelled because their Step ended without them, with whether it
# returned (else it raised): an effect they ran records that as its cause, not a timeout
# (``left_behind``).
_LEFT_BEHIND: weakref.WeakKeyDictionary[asyncio.Task[Any], bool] = weakref.WeakKeyDictionary()


def left_behind(task: asyncio.Task[Any] | None) -> str | None:
    """How the Step that started ``task`` ended ("returned", "raised") when it was cancelled
    because of that end; None for any other task."""
    if task is None or task not in _LEFT_BEHIND:
        return None
    return "returned" if _LEFT_BEHIND[task] else "raised"


_AWAIT_TASK: Final = ("Await each task you start (asyncio.create_task, asyncio.gather) before "
                      "the Step returns, or await the call itself")


def _tasks_of(calls: list[_Unawaited[Any]]) -> dict[int, asyncio.Task[Any]]:
    """The tasks created with ``calls`` (not begun: a task's coroutine is then the call
    itself), by the call's id: asyncio keeps no way back from a coroutine to its task, so
    every task is looked at (only when a Step left a call)."""
    wanted = {id(call) for call in calls}
    try:
        every = asyncio.all_tasks()
    except RuntimeError:  # no running loop: no task can drive them
        return {}
    return {id(task.get_coro()): task for task in every if id(task.get_coro()) in wanted}
