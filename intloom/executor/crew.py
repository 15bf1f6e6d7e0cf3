"""Worker threads that each drive many Runs' sync Steps, a round at a time (crews).

A sync Step must not run on the event loop (it may block). Handed from the loop to a worker
and back, each Step cost two thread wake-ups and GIL hand-offs, and the loop's asyncio
bookkeeping besides (64 sync Runs: ~27 us of CPU per Step against ~19 here). A crew is a
worker thread that drives its Runs' consecutive sync Steps itself: in a round it advances
each Run to its next boundary (the Step's result, its route, the next Step's ``executing``),
then makes the round's records durable with one flush, shows them, and starts the next round.
A lone Run is a crew of one.

No Run may hold up the others for long. While a crew drives two or more Runs the loop looks
at it every tick; once its thread has been advancing one Run for ``budget_s`` (a Step that
blocks: a request, a lock, a sleep), the crew's other Runs move to a new crew on another
thread, and the blocked thread keeps only that Run. Likewise, once a round's advances have
taken ``round_s`` together, the Runs not yet advanced move to a new crew: Steps that each
wait a little (I/O) then run side by side, a crew per few Runs. Not when the process was
busy on its CPUs meanwhile (``_busy``): the round then waited for the GIL (the loop busy
with async Runs, another crew), which another thread would only wait for too. A crew split
off goes back into the open crew (the one arrivals join) after a round that took less than
``budget_s``, or one that waited for the GIL: one Step that blocked does not leave its Run
flushing on its own for the rest of the Run.

A Run is handed over as a generator (``Driver._steps_here``): ``send(None)`` advances it to
its next boundary, where it yields what ``flush`` is given (its Run) once its records are
appended; it returns its result when it gives the Run back to the loop. ``flush(tags)``
makes everything appended so far durable and returns, per tag, None or the exception to
throw into that generator (its Run's checkpoint failed). ``done(ok, value)`` receives each
generator's result or exception, on the crew's thread; it must not raise.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Generator
from typing import Any, Final

from intloom.executor.workers import Workers

__all__ = ["Crews"]

# How long one Run's advance may run before the crew's other Runs move to a thread of their
# own (a Step that blocks). The loop's look comes every ~1 ms however short the tick is (the
# epoll selector rounds its timeout up to whole milliseconds).
_BUDGET_S: Final = 0.001
# How long a round's advances may take together before the Runs not yet advanced move to a
# new crew. 64 trivial sync Steps take a crew ~1 ms on a 2-vCPU VM (`scripts/bench
# concurrency --kind sync`: ~1.35 ms per round of 64 Steps with its flush).
_ROUND_S: Final = 0.004
# How often the loop looks at the crews while one drives two or more Runs.
_TICK_S: Final = 0.0005

Flush = Callable[[list[Any]], list[BaseException | None]]


def _busy(began: float, cpu_began: float) -> bool:
    """True when the process spent at least half the time since ``began`` (perf_counter)
    on CPU: its threads were running, so a crew's slow round waited for the GIL, not for
    I/O, a lock or a sleep -- and splitting it would only add a thread that waits too."""
    return time.process_time() - cpu_began >= (time.perf_counter() - began) / 2
Done = Callable[[bool, Any], None]


class _Member:
    """One Run in a crew: its generator, where its result goes, and what its flush said."""

    __slots__ = ("done", "gen", "tag", "throw")

    def __init__(self, gen: Generator[Any, None, Any], done: Done) -> None:
        self.gen = gen
        self.done = done
        self.tag: Any = None  # what it yielded last: its flush is due
        self.throw: BaseException | None = None  # its flush failed: raised at its next advance


class _Crew:
    """One thread's Runs. Every field is read and written under ``Crews._lock``."""

    __slots__ = ("closed", "due", "queue", "refused", "since", "size")

    def __init__(self) -> None:
        self.queue: deque[_Member] = deque()  # to advance in this round (arrivals join it)
        self.due: list[_Member] = []  # advanced this round: their flush is due
        self.size = 0  # Runs it drives: queued, due, being advanced or flushed
        # When the advance now running began (None: none is): read by the loop's look.
        self.since: float | None = None
        # It takes no arrivals: it was split, or split off a crew that was not the open one
        # (either goes back into the open crew after a round under ``budget_s``), or its
        # thread is leaving (nothing left).
        self.closed = False
        # The ``since`` of the advance for which a split found no thread to start: the look
        # does not try again (a thread start per tick) until another advance is held up.
        self.refused: float | None = None


class Crews:
    """The crews driving sync Steps for Runs on one event loop."""

    def __init__(self, workers: Workers, loop: asyncio.AbstractEventLoop, flush: Flush, *,
                 budget_s: float = _BUDGET_S, round_s: float = _ROUND_S,
                 tick_s: float = _TICK_S) -> None:
        self._workers = workers
        self.loop = loop
        self._flush = flush
        self._budget_s = budget_s
        self._round_s = round_s
        self._tick_s = tick_s
        # One lock for every crew: a split moves Runs from one to another.
        self._lock = threading.Lock()
        self._open: _Crew | None = None  # the crew arrivals join
        self._live: set[_Crew] = set()
        self._looking = False  # a look is scheduled on the loop
        self.splits = 0  # how many times Runs moved to a new crew (tests, benchmarks)

    def join(self, gen: Generator[Any, None, Any], done: Done) -> None:
        """From the loop: drive ``gen`` in a crew. Raises ``NoThread`` (and ``gen`` is never
        advanced) when no worker thread could be started for a new crew."""
        member = _Member(gen, done)
        with self._lock:
            crew = self._open
            fresh = crew is None or crew.closed
            if fresh:
                crew = self._open = _Crew()
                self._live.add(crew)
            assert crew is not None
            crew.queue.append(member)
            crew.size += 1
            if fresh:
                try:
                    self._workers.submit(lambda: self._run(crew))
                except BaseException:
                    crew.closed = True
                    self._live.discard(crew)
                    self._open = None
                    raise
            look = crew.size >= 2 and not self._looking
            if look:
                self._looking = True
        if look:
            self.loop.call_later(self._tick_s, self._look)

    # ------------------------------------------------------------------ the crew's thread

    def _run(self, crew: _Crew) -> None:
        lock = self._lock
        flush = self._flush
        clock = time.perf_counter
        cpu = time.process_time
        round_s = self._round_s
        while True:
            used = 0.0
            # The process's CPU time over the round's: a round slow for want of the GIL
            # (the loop or another crew busy in Python) is not one that waited outside it.
            began_round, cpu_round = clock(), cpu()
            while True:
                lock.acquire()  # not ``with``: a with-statement costs more, once per Step
                try:
                    queue = crew.queue
                    if not queue:
                        break
                    if used >= round_s and len(queue) > 1:
                        if (not _busy(began_round, cpu_round)
                                and self._split(crew, keep_due=True)):
                            break
                        # No thread to split to, or no waiting to spread: again after
                        # another round's worth.
                        used = 0.0
                    member = queue.popleft()
                    began = crew.since = clock()
                finally:
                    lock.release()
                gen = member.gen
                throw, member.throw = member.throw, None
                tag: Any = None
                try:
                    tag = gen.send(None) if throw is None else gen.throw(throw)
                except StopIteration as stop:
                    self._leave(crew, member, True, stop.value)
                    del member, gen, throw
                except BaseException as exc:  # delivered to the Run's task
                    self._leave(crew, member, False, exc)
                    # Its traceback holds this frame: with these locals still set, the frame
                    # held the member, its future, that exception (``throw``, when a failed
                    # flush was thrown in) and so the frames of the Step that raised (its
                    # locals: a State of megabytes) in a cycle, freed only by a full
                    # collection, which an idle host may not run for hours.
                    del member, gen, throw
                else:
                    member.tag = tag
                    lock.acquire()
                    crew.since = None
                    crew.due.append(member)
                    lock.release()
                used += clock() - began
            lock.acquire()
            try:
                due, crew.due = crew.due, []
                if not due:
                    if not crew.queue:
                        # Nothing left: the next arrival starts a new crew (checked under the
                        # lock, so no arrival is left with no thread to drive it).
                        self._close(crew)
                        return
                    continue  # arrivals joined while the round ran: advance them
            finally:
                lock.release()
            try:
                failed = flush([member.tag for member in due])
            except BaseException as exc:  # the flush itself broke: every Run is told
                failed = [exc] * len(due)
            for member, raised in zip(due, failed, strict=True):
                member.tag = None
                member.throw = raised
            # The failures are the members' now: held here too, a Run that raises one again
            # (a failed checkpoint) would tie this frame to it, as above.
            del failed, raised, member
            lock.acquire()
            try:
                crew.queue.extendleft(reversed(due))  # the same order as before, arrivals after
                # Split off, and its Runs are cheap again (the Step that blocked is done),
                # or its round only waited for the GIL, which another thread does not help:
                # back into the open crew, whose flushes they share again.
                if (crew.closed and (used < self._budget_s or _busy(began_round, cpu_round))
                        and self._merge(crew)):
                    return
            finally:
                lock.release()

    def _leave(self, crew: _Crew, member: _Member, ok: bool, value: Any) -> None:
        with self._lock:
            crew.since = None
            crew.size -= 1
        member.done(ok, value)

    def _close(self, crew: _Crew) -> None:
        """Under the lock: the crew's thread leaves."""
        crew.closed = True
        self._live.discard(crew)
        if self._open is crew:
            self._open = None

    # ------------------------------------------------------------------ splits and merges

    def _merge(self, crew: _Crew) -> bool:
        """Under the lock: hand the split-off ``crew``'s Runs (all flushed, none being
        advanced) to the open crew; True: its thread leaves. With no open crew, ``crew``
        becomes the open one and its thread goes on."""
        into = self._open
        if into is None or into.closed:
            crew.closed = False
            self._open = crew
            return False
        into.queue.extend(crew.queue)
        into.size += crew.size
        crew.queue.clear()
        crew.size = 0
        self._close(crew)
        self._look_soon(into)
        return True

    def _look_soon(self, crew: _Crew) -> None:
        """Under the lock, from a crew's thread: ``crew`` may drive two or more Runs now."""
        if crew.size >= 2 and not self._looking:
            self._looking = True
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody looks
                self.loop.call_soon_threadsafe(self._look)

    def _split(self, crew: _Crew, *, keep_due: bool) -> bool:
        """Under the lock: move ``crew``'s queued Runs (and, unless ``keep_due``, those whose
        flush is due) to a new crew on another thread. ``crew`` keeps what its thread is
        advancing (or flushing) and takes no arrivals any more. False: no thread could be
        started; nothing moved, and the crew's thread goes on driving them all. Its thread
        flushes what it took out of ``due`` on its own (``due`` is then empty).

        The Runs whose flush is due stay due in the new crew: each has appended a boundary
        (a Step's ``executing``) that must be durable before the Run goes on."""
        due = [] if keep_due else crew.due
        if not crew.queue and not due:
            return False
        new = _Crew()
        new.queue.extend(crew.queue)
        new.due = list(due)
        new.size = len(new.queue) + len(new.due)
        try:
            self._workers.submit(lambda: self._run(new))
        except RuntimeError:  # no thread could be started: a process or memory limit
            return False
        crew.queue.clear()
        if not keep_due:
            crew.due = []
        crew.size -= new.size
        crew.closed = True
        self._live.add(new)
        if self._open is crew or self._open is None:
            self._open = new
        else:
            # Split off a crew that was itself split off: not the open crew either, so it
            # goes back into that one once cheap, like ``crew`` (open, it never would).
            new.closed = True
        self.splits += 1
        self._look_soon(new)
        return True

    def _look(self) -> None:
        """On the loop, every tick while a crew drives two or more Runs: split a crew whose
        thread has been advancing one Run for ``budget_s``."""
        now = time.perf_counter()
        with self._lock:
            for crew in tuple(self._live):
                since = crew.since
                if (crew.size >= 2 and since is not None and now - since >= self._budget_s
                        and crew.refused != since
                        and not self._split(crew, keep_due=False)):
                    crew.refused = since
            busy = self._looking = any(crew.size >= 2 for crew in self._live)
        if busy:
            self.loop.call_later(self._tick_s, self._look)
