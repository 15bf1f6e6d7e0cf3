"""What a Step sees: ``StepContext`` (state, intent, effects, waits) and ``Recovery``.

The context is a thin surface over the executor, which implements :class:`ContextHooks`:
every effect and wait goes through it so it can be journaled before it happens.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar

import msgspec

from intloom.authoring.interaction import Confirmation, Question, QuestionAnswer
from intloom.errors import IntloomError
from intloom.runtime.model import PendingAction

__all__ = ["ContextHooks", "Recovery", "StepContext"]

S = TypeVar("S")
T = TypeVar("T")


class Recovery(msgspec.Struct, frozen=True):
    """What ``recover`` receives after a restart: the saved action and the accepted answer."""

    action: PendingAction
    answer: Any  # Confirmation for a confirmation, list[QuestionAnswer] for questions


class ContextHooks(Protocol):
    """Implemented by the executor; each call is journaled before anything observable happens."""

    loop_thread: threading.Thread

    def effect_sync(self, name: str, key: str, call: Callable[[], Any]) -> Any: ...

    def effect_async(self, name: str, key: str, call: Callable[[], Any]) -> Awaitable[Any]: ...

    def wait(self, kind: str, request: Any, state: Any) -> Awaitable[Any]: ...


class StepContext(Generic[S]):
    """The Step's view of its Run. ``state`` is the Stage State; assign a new value to change it."""

    def __init__(
        self,
        *,
        run_id: str,
        intent: str,
        stage: str,
        step: str | None,
        state: S,
        state_type: type[S] | None,
        hooks: ContextHooks,
    ) -> None:
        self.run_id = run_id
        self.intent = intent
        self.stage = stage
        self.step = step
        self._state = state
        self._state_type = state_type
        self._hooks = hooks
        self._effect_counts: dict[str, int] = {}

    @property
    def state(self) -> S:
        return self._state

    @state.setter
    def state(self, value: S) -> None:
        if self._state_type is not None and not isinstance(value, self._state_type):
            raise IntloomError(
                "STAGE_STATE_INVALID",
                f"Stage {self.stage!r} State must be a {self._state_type.__name__}, "
                f"not {type(value).__name__}.",
            )
        self._state = value

    def _key(self, name: str, key: str | None) -> str:
        if key is not None:
            return key
        n = self._effect_counts.get(name, 0) + 1
        self._effect_counts[name] = n
        return f"{name}#{n}"

    def effect(self, name: str, fn: Callable[..., T], *args: Any, key: str | None = None,
               **kwargs: Any) -> T:
        """Run an external call as a journaled effect (sync Steps).

        ``effect_started`` is durable before ``fn`` is called, so if the host dies while it
        runs, the Run is reported RUN_INTERRUPTED naming this effect; it is never re-run.
        """
        if threading.current_thread() is self._hooks.loop_thread:
            raise IntloomError(
                "STEP_INTERACTION_INVALID",
                f"Step {self.stage}/{self.step} is async: use `await ctx.aeffect(...)` there; "
                "ctx.effect is for sync Steps.",
            )
        return self._hooks.effect_sync(  # type: ignore[no-any-return]
            name, self._key(name, key), lambda: fn(*args, **kwargs)
        )

    async def aeffect(self, name: str, fn: Callable[..., Any], *args: Any,
                      key: str | None = None, **kwargs: Any) -> Any:
        """Run an external call as a journaled effect (async Steps); ``fn`` may be async."""
        return await self._hooks.effect_async(
            name, self._key(name, key), lambda: fn(*args, **kwargs)
        )

    async def confirm(self, context: Any) -> Confirmation:
        """Ask a person to confirm; the Run waits (durably) until they answer."""
        answer = await self._hooks.wait("confirmation", context, self._state)
        assert isinstance(answer, Confirmation)
        return answer

    async def ask(self, questions: list[Question]) -> list[QuestionAnswer]:
        """Ask a person questions; returns one answer per question (possibly skipped)."""
        answer = await self._hooks.wait("questions", questions, self._state)
        assert isinstance(answer, list)
        return answer
