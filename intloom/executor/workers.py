"""Daemon threads for sync user code, kept warm between calls.

Starting a thread costs ~100-150 us on a 2-vCPU VM -- as much as the fdatasync that makes a
Step durable -- while a parked worker picks the next call up in a few us. Workers are daemon
threads, so a hung Step never keeps the host from exiting, and there is no upper bound: every
sync call that runs at the same time has its own thread, because a Step may block for as long
as it likes while its effects wait on the event loop. A worker parked for ``idle_s`` ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

__all__ = ["Batch", "Inbox", "NoThread", "Relay", "Workers"]

_IDLE_S: Final = 30.0
# How long a Relay batch's calls may take one after another before the calls not yet
# started get workers of their own. 64 trivial sync Steps take a worker ~0.3-1 ms on a
# 2-vCPU VM; a batch of calls that each wait on something (a query, a lock) is spread out
# after this much, and one call that blocks is seen by the loop's next look.
_BUDGET_S: Final = 0.001
# How often the loop looks at a batch still running: it takes the results so far (it works
# on them while the worker goes on), and spreads out the batch if the running call has run
# for the budget (it blocks). The epoll selector rounds its timeout up to whole
# milliseconds, so a look comes every ~1 ms however short this is (64 sync Runs,
# `scripts/bench concurrency`, three runs each: 24-26k Steps/s asking for 0.3 ms, 22-23k
# asking for 1 ms, which a look just short of its due time rounds to ~2 ms).
_TICK_S: Final = 0.0003


class NoThread(RuntimeError):
    """No worker thread could be started: a process or thread limit (``ulimit -u``, a
    cgroup's ``pids.max``) or memory. The job was not queued: it never runs."""


class Workers:
    """Runs each submitted job on a parked worker, or on a new one when none is parked."""

    def __init__(self, *, idle_s: float = _IDLE_S, name: str = "intloom-step") -> None:
        self._idle_s = idle_s
        self._name = name
        # One token per parked worker no job has been promised to yet. A submit takes one
        # (a promise) and queues the job; whichever parked worker wakes first takes it. A
        # deque's append and pop are atomic: no lock round trip per job on either side
        # (each sync Step of a Run among others passed two).
        self._unpromised: deque[None] = deque()
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` on a worker thread. ``job`` must not raise (it reports its own result)."""
        try:
            self._unpromised.pop()
        except IndexError:
            # Started before the job is queued: a thread that cannot be started (a process
            # or memory limit) raises with nothing queued. Queued first, the job a caller
            # was told had failed ran later all the same, on a busy worker once it was free
            # (a refused Step's hand-over ended twice, a Tool ran for a failed call).
            try:
                threading.Thread(target=self._work, name=self._name, daemon=True).start()
            except RuntimeError as exc:  # "can't start new thread"
                raise NoThread(f"{exc}, with {threading.active_count()} threads running"
                               ) from None
        self._jobs.put(job)

    def _work(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self._idle_s)
            except queue.Empty:
                try:
                    self._unpromised.pop()  # nothing was promised to this worker: end it
                    return
                except IndexError:
                    continue  # every parked worker was promised a job: one is ours to take
            job()
            self._unpromised.append(None)


class Inbox:
    """Results of sync user code, handed to the event loop in batches.

    ``loop.call_soon_threadsafe`` writes to the loop's self-pipe on every call; with dozens of
    sync Steps finishing within one loop iteration, that is one syscall (and one wake-up of
    the loop) per Step. Here only the first result of a batch wakes the loop; the others
    join the batch it drains. A result put for a ``Relay`` batch still running waits for
    the batch (or its spill) to wake the loop.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[asyncio.Future[Any], bool, Any,
                                Callable[[Any], None] | None]] = []
        self._scheduled = False  # a drain is due on the loop: the items will be taken

    def put(self, future: asyncio.Future[Any], ok: bool, value: Any,
            dropped: Callable[[Any], None] | None = None,
            batch: Batch | None = None) -> None:
        """From any thread: settle ``future`` on the loop (a result, or an exception).
        ``dropped``: called on the loop with a result nobody waits for any more (the future
        was cancelled while the call ran), to release what it holds. ``batch``: the Relay
        batch this result belongs to; it waits for the batch's end or the loop's next look
        at the batch (``deliver_held``), unless the batch has spilled."""
        lock = self._lock
        # acquire/release rather than ``with`` here and in _drain: a with-statement on a
        # lock costs ~1.5k instructions more (callgrind), and each sync Step of a Run among
        # others passes put once (and _drain once per batch).
        lock.acquire()
        try:
            self._items.append((future, ok, value, dropped))
            wake = not self._scheduled and (batch is None or batch.spilled)
            if wake:
                self._scheduled = True
        finally:
            lock.release()
        if wake:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                self.loop.call_soon_threadsafe(self._drain)

    def deliver_held(self, batch: Batch, *, spill: bool, on_loop: bool) -> None:
        """Deliver what ``batch`` held back: it ended (a worker), or the loop looked at it
        (``spill``: nothing is held back for it from now on)."""
        lock = self._lock
        lock.acquire()
        try:
            if spill:
                batch.spilled = True
            wake = bool(self._items) and not self._scheduled
            if wake:
                self._scheduled = True
        finally:
            lock.release()
        if not wake:
            return
        if on_loop:
            self._drain()
        else:
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        lock = self._lock
        lock.acquire()  # not ``with``: see put
        try:
            items, self._items = self._items, []
            self._scheduled = False
        finally:
            lock.release()
        for future, ok, value, dropped in items:
            if future.done():  # cancelled while the call ran
                if ok and dropped is not None:
                    dropped(value)
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)


class Batch:
    """Calls a Relay hands to one worker, to run one after another."""

    __slots__ = ("done", "handed", "jobs", "running_since", "spilled", "spread", "tags")

    def __init__(self) -> None:
        self.jobs: deque[Callable[[Batch | None], None]] = deque()
        self.tags: list[Any] = []  # what the gate is handed, one per job
        # False while the batch's results wait for its end (or the loop's next look);
        # set once, to True, under the Inbox's lock (``deliver_held``), so a worker may
        # read it unlocked: a put that still saw False is taken by that spill's delivery.
        self.spilled = False
        self.handed = False  # to a worker (once)
        # Its calls not yet started went to workers of their own: its worker takes no more.
        self.spread = False
        # When the call its worker is running began (None: none yet). Written by the
        # worker, read by the loop's look.
        self.running_since: float | None = None
        self.done = False


class Relay:
    """Sync calls started within one turn of the event loop, run by one worker in turn.

    With many Runs in step, a flush wakes dozens of Runs in one loop iteration, and each
    starts a sync Step. Handed to a worker each, every Step costs a thread wake-up and a
    GIL hand-off, and the results come back spread over several loop iterations, so the
    next flushes hold fewer Runs each (measured with 64 sync Runs: 1.4-2.1 flushes per
    round of Steps instead of one). Here the calls started in one iteration go to one
    worker, which runs them one after another and hands their results back together.

    No call may hold up the others for long (the calls' order does not matter: each is
    one Run's). Once the batch has run for ``budget_s``, its worker gives each call not
    yet started a worker of its own before it starts the next; and every ``tick_s`` (in
    practice every ~1 ms: the selector's resolution) the loop takes the results so far and,
    if the running call has run for ``budget_s`` (it may block: a request, a lock), does
    the same. Behind calls that wait outside the GIL (I/O, a lock, a sleep) a call waits
    ~1-2 ms at most; behind one busy in Python code, the look and the helpers also wait
    for the GIL (the interpreter's switch interval, 5 ms, each time).

    ``gate(tags, go)``: called on the loop with the batch's tags once the batch is
    closed; it must settle (refuse) any call that must not start and then call ``go()``
    once, now or later, on the loop, to hand the batch over. A job skips a call the gate
    refused.
    """

    def __init__(self, inbox: Inbox, workers: Workers, *, tick_s: float = _TICK_S,
                 budget_s: float = _BUDGET_S,
                 gate: Callable[[list[Any], Callable[[], None]], None] | None = None
                 ) -> None:
        self._inbox = inbox
        self._workers = workers
        self._tick_s = tick_s
        self._budget_s = budget_s
        self._gate = gate
        self._open: Batch | None = None
        self._spreading = threading.Lock()  # taken only when a batch is due to spread

    def submit(self, job: Callable[[Batch | None], None], tag: Any = None) -> None:
        """On the loop: run ``job(batch)`` on a worker once this loop iteration's other
        ready callbacks have run (and the gate, given ``tag``, has). ``job`` puts its
        result in the Inbox with ``batch``."""
        batch = self._open
        if batch is None:
            batch = self._open = Batch()
            self._inbox.loop.call_soon(self._close_batch)
        batch.jobs.append(job)
        batch.tags.append(tag)

    def _close_batch(self) -> None:
        batch = self._open
        assert batch is not None
        self._open = None
        if self._gate is None:
            self._hand_over(batch)
        else:
            self._gate(batch.tags, lambda: self._hand_over(batch))

    def _hand_over(self, batch: Batch) -> None:
        if batch.handed:
            return
        batch.handed = True
        batch.tags = []
        single = len(batch.jobs) == 1
        if single:
            batch.spilled = True  # nothing to hold its result back for
        # Raises if no thread can be started (a limit), with nothing queued: the gate
        # refuses the batch's calls (``_durable``), whose Runs fail.
        self._workers.submit(lambda: self._run(batch))
        if not single:
            self._inbox.loop.call_later(self._tick_s, self._look, batch)

    def _run(self, batch: Batch) -> None:
        jobs = batch.jobs
        clock = time.perf_counter
        began = clock()
        budget = self._budget_s
        while not batch.spread:
            now = clock()
            # Due once a call has run and two or more wait (the last waits for nobody).
            if (now - began >= budget and batch.running_since is not None
                    and len(jobs) > 1):
                if self._spread(batch, on_loop=False):
                    break
                budget = math.inf  # no thread to spread to: this worker runs them all
            try:
                job = jobs.popleft()
            except IndexError:
                break
            batch.running_since = now
            job(batch)
        batch.done = True
        if not batch.spilled:
            self._inbox.deliver_held(batch, spill=True, on_loop=False)

    def _look(self, batch: Batch) -> None:
        """The loop's look at a batch still running (every tick until it ends)."""
        if batch.done or batch.spread:
            return
        since = batch.running_since
        if (since is not None and time.perf_counter() - since >= self._budget_s
                and self._spread(batch, on_loop=True)):
            return
        self._inbox.deliver_held(batch, spill=False, on_loop=True)
        self._inbox.loop.call_later(self._tick_s, self._look, batch)

    def _spread(self, batch: Batch, *, on_loop: bool) -> bool:
        """Deliver what the batch holds, hold nothing more, and give each call not yet
        started a worker of its own. Its own worker takes no more calls once it sees
        ``spread`` (set before the calls are counted, so at most one helper finds its call
        taken), which keeps the workers started to one per call left. False: no thread
        could be started; the batch's worker goes on taking its calls (and so do the
        helpers started before that)."""
        # The worker and the loop's look may both find the batch due at once. A check and
        # a set are two bytecodes (and on a free-threaded build not ordered at all): both
        # could pass, and every call left would get two helpers.
        with self._spreading:
            if batch.spread:  # once is enough
                return True
            batch.spread = True
        self._inbox.deliver_held(batch, spill=True, on_loop=on_loop)
        try:
            for _ in range(len(batch.jobs)):
                self._workers.submit(lambda: self._run_one(batch))
        except RuntimeError:  # "can't start new thread": a process or memory limit
            batch.spread = False
            return False
        return True

    @staticmethod
    def _run_one(batch: Batch) -> None:
        try:
            job = batch.jobs.popleft()
        except IndexError:
            return  # another worker took it
        job(None)
