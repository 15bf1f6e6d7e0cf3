"""Says in the host's log when its event loop is blocked, and by what.

An async Step (a Tool, an ``on_complete``) that blocks -- ``time.sleep``, a blocking call,
long CPU work -- holds the loop, and with it every client: ``runs`` and ``stop`` time out
in their hello, and nothing said why. A thread of its own looks every ``look`` seconds at
when the loop last ran a heartbeat; once that is over ``after`` seconds ago, it logs
``loop_blocked`` with the code the loop's thread is in (the innermost frame of the project's
own files, else the innermost one) and the Run whose task runs there. The loop logs
``loop_unblocked`` with how long it was held once it runs again. Nothing is on the Step
path: the heartbeat is a timer, and the frame is read only when the loop is blocked.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Final

from intloom.executor.driver import RUN_TASK_PREFIX

if TYPE_CHECKING:
    from intloom.host.logfile import HostLog

__all__ = ["BLOCKED_AFTER", "LoopWatch", "blocking_code"]

BLOCKED_AFTER: Final = 2.0  # seconds without a heartbeat that count as a blocked loop
_LOOK: Final = 0.5
_INTLOOM: Final = str(Path(__file__).resolve().parent.parent) + "/"


def blocking_code(frame: FrameType | None, root: Path) -> str | None:
    """Where ``frame``'s stack is, as ``path:line in function``: the innermost frame of a
    file under ``root`` (the project's code), else the innermost frame outside intloom, else
    the innermost one; a path under ``root`` relative to it."""
    frames: list[FrameType] = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    if not frames:
        return None
    prefix = str(root) + "/"
    chosen = (next((f for f in frames if f.f_code.co_filename.startswith(prefix)), None)
              or next((f for f in frames if not f.f_code.co_filename.startswith(_INTLOOM)),
                      None)
              or frames[0])
    path = chosen.f_code.co_filename.removeprefix(prefix)
    return f"{path}:{chosen.f_lineno} in {chosen.f_code.co_name}"


class LoopWatch:
    """Started on the loop it watches (``start``), closed there (``close``)."""

    def __init__(self, log: HostLog, root: Path, *, after: float = BLOCKED_AFTER,
                 look: float = _LOOK) -> None:
        self._log = log
        self._root = root
        self._after = after
        self._look = look
        self._last = time.monotonic()
        self._blocked_since: float | None = None  # set by the watcher, cleared by the loop
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._beat()
        self._thread = threading.Thread(target=self._watch, name="intloom-loopwatch",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        if self._timer is not None:
            self._timer.cancel()
        if self._thread is not None:
            self._thread.join(timeout=2 * self._look)

    def _beat(self) -> None:
        now = time.monotonic()
        since = self._blocked_since
        if since is not None:
            self._blocked_since = None
            self._log.info("loop_unblocked", seconds=round(now - since, 3))
        self._last = now
        assert self._loop is not None
        self._timer = self._loop.call_later(self._look / 2, self._beat)

    def _watch(self) -> None:
        while not self._closed.wait(self._look):
            last = self._last
            held = time.monotonic() - last
            if held <= self._after or self._blocked_since is not None:
                continue
            self._blocked_since = last
            frame = sys._current_frames().get(self._loop_thread)
            task = asyncio.current_task(self._loop) if self._loop is not None else None
            name = task.get_name() if task is not None else ""
            run_id = name.removeprefix(RUN_TASK_PREFIX) if name.startswith(
                RUN_TASK_PREFIX) else None
            self._log.warning(
                "loop_blocked", seconds=round(held, 3), at=blocking_code(frame, self._root),
                runId=run_id,
                message="The host's event loop has run nothing for "
                f"{held:.1f} s: every client waits. An async Step (or Tool, or on_complete) "
                "that blocks holds it: make it a plain def (it runs on a worker thread) or "
                "use await asyncio.to_thread(...) for the blocking call.")
            del frame
