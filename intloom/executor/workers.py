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
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Final

__all__ = ["Inbox", "NoThread", "Workers"]

_IDLE_S: Final = 30.0


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
    Runs given back by crews within one loop iteration (a stop, Stages ending together),
    that is one syscall (and one wake-up of the loop) per Run. Here only the first result of
    a batch wakes the loop; the others join the batch it drains.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[asyncio.Future[Any], bool, Any,
                                Callable[[Any], None] | None]] = []
        self._scheduled = False  # a drain is due on the loop: the items will be taken

    def put(self, future: asyncio.Future[Any], ok: bool, value: Any,
            dropped: Callable[[Any], None] | None = None) -> None:
        """From any thread: settle ``future`` on the loop (a result, or an exception).
        ``dropped``: called on the loop with a result nobody waits for any more (the future
        was cancelled while the call ran), to release what it holds."""
        lock = self._lock
        # acquire/release rather than ``with`` here and in _drain: a with-statement on a
        # lock costs ~1.5k instructions more (callgrind).
        lock.acquire()
        try:
            self._items.append((future, ok, value, dropped))
            wake = not self._scheduled
            if wake:
                self._scheduled = True
        finally:
            lock.release()
        if wake:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
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
