"""Runs' async Steps driven on the loop a round at a time, not by a task wake-up per Step.

Each Run has a task (``Driver._drive``). Each of its Steps ends in a wait for the flush that
makes its boundary durable, and the task woke from that wait through asyncio's machinery:
``call_soon``, a ``Handle``, the loop's queue, ``Context.run``, the task's step -- ~10.7k
instructions per wake-up where a plain ``send`` to the same coroutine costs ~2.3k
(callgrind, 64 tasks yielding in turn). Here one loop callback per round advances every
member's coroutine with ``send``: each runs until it waits for the round's flush (a bare
``yield``), and the next round is queued behind that flush (``Store.sync`` queues the flush
first). 64 async Runs: ~102.3k -> ~96.2k instructions per Step.

A member's coroutine runs as its own task would run it: in its task's context, with its task
as the loop's current task (``asyncio.current_task()``, ``asyncio.timeout``). Whatever else
it waits for (a future: a Step that awaits I/O, a sync Step's thread) goes back to its task,
which awaits the rest itself (``_carry_on``); so does its end, its exception, and a
cancellation of its task, which is thrown in where the round left the coroutine -- where the
task would have thrown it.
"""

from __future__ import annotations

import asyncio
import contextvars
import types
from asyncio.tasks import _enter_task, _leave_task
from collections.abc import Coroutine, Generator
from functools import partial
from typing import Any, Final

__all__ = ["Rounds"]

# How a member left its round (``_Member.how``).
_RETURNED: Final = 1
_RAISED: Final = 2
_AWAITS: Final = 3  # it yielded a future (``yielded``): its task awaits it


class _Member:
    __slots__ = ("context", "coro", "future", "how", "task", "value", "yielded")

    def __init__(self, coro: Coroutine[Any, Any, Any], task: asyncio.Task[Any],
                 context: contextvars.Context, future: asyncio.Future[None]) -> None:
        self.coro = coro
        self.task = task
        self.context = context
        self.future = future  # done: its task takes the coroutine back
        self.how = 0  # still in the rounds
        self.value: Any = None
        self.yielded: Any = None  # what the coroutine yielded last (None: a bare yield)


class Rounds:
    """The Runs whose coroutines are driven together on one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._members: list[_Member] = []
        self._queued = False  # a round is queued on the loop

    async def drive(self, coro: Coroutine[Any, Any, Any], context: contextvars.Context) -> Any:
        """Await ``coro`` in the current task (which runs in ``context``), driven by the
        rounds while it only waits for flushes and futures of this loop."""
        loop = self.loop
        task = asyncio.current_task()
        assert task is not None
        member = _Member(coro, task, context, loop.create_future())
        self._join(member)
        cancelled: BaseException | None = None
        try:
            await member.future
        except asyncio.CancelledError as exc:  # the task was cancelled: done with the rounds
            cancelled = exc
        except BaseException:  # GeneratorExit: the task's coroutine closed with the loop
            member.future.cancel()  # no round touches it again
            coro.close()
            raise
        how = member.how
        if how == _RETURNED:
            if cancelled is not None:
                raise cancelled
            return member.value
        if how == _RAISED:
            raised: BaseException = member.value
            member.value = None
            try:
                raise raised
            finally:
                del raised  # its traceback holds this frame
        yielded, member.yielded = member.yielded, None
        if cancelled is not None:
            # Where its task's cancel would have reached it: the future it awaits cancelled,
            # the cancellation thrown in where it waits.
            if yielded is not None:
                yielded.cancel()
            return await _carry_on(coro, None, cancelled)
        return await _carry_on(coro, yielded, None)  # what a round does not serve

    def _join(self, member: _Member) -> None:
        self._members.append(member)
        if not self._queued:
            self._queued = True
            self.loop.call_soon(self._round)

    def _back(self, member: _Member, _future: Any) -> None:
        """The future ``member`` awaited is done: it goes on in the next round."""
        member.yielded = None
        if not member.future.done():
            self._join(member)

    def _round(self) -> None:
        """Advance every member once (loop callback, outside any task)."""
        self._queued = False
        members = self._members
        if not members:
            return
        loop = self.loop
        kept: list[_Member] = []
        self._members = kept
        try:
            for member in members:
                future = member.future
                if future.done():  # its task was cancelled: it takes the coroutine back
                    continue
                task = member.task
                _enter_task(loop, task)
                try:
                    yielded = member.context.run(member.coro.send, None)
                except StopIteration as stop:
                    member.how, member.value = _RETURNED, stop.value
                except BaseException as exc:
                    member.how, member.value = _RAISED, exc
                    del exc
                else:
                    if yielded is None:  # a bare yield: the next round (behind the flush)
                        if not future.done():
                            kept.append(member)
                        continue
                    member.yielded = yielded
                    # A future of this loop, awaited as its task would: resumed once done.
                    if (isinstance(yielded, asyncio.Future) and yielded._asyncio_future_blocking
                            and yielded.get_loop() is loop):
                        yielded._asyncio_future_blocking = False
                        yielded.add_done_callback(partial(self._back, member))
                        continue
                    member.how = _AWAITS  # anything else: its task makes of it what it does
                finally:
                    _leave_task(loop, task)
                if not future.done():
                    future.set_result(None)
        finally:
            if self._members and not self._queued:
                self._queued = True
                loop.call_soon(self._round)


@types.coroutine
def _carry_on(coro: Coroutine[Any, Any, Any], yielded: Any,
              throw: BaseException | None) -> Generator[Any, Any, Any]:
    """Go on driving ``coro`` in the current task from where a round left it: suspended at
    ``yielded`` (a future it awaits), or, with ``throw``, to be thrown that first."""
    try:
        if throw is not None:
            yielded = coro.throw(throw)
        while True:
            try:
                sent = yield yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:
                yielded = coro.throw(exc)
            else:
                yielded = coro.send(sent)
    except StopIteration as stop:
        return stop.value
