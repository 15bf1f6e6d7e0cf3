"""Says in the host's log when its event loop is blocked, and by what.

An async Step (a Tool, an ``on_complete``) that blocks -- ``time.sleep``, a blocking call,
long CPU work -- holds the loop, and with it every client: ``runs`` and ``stop`` time out
in their hello, and nothing said why. A thread of its own looks every ``look`` seconds at
when the loop last ran a heartbeat; once that is over ``after`` seconds ago, it logs
``loop_blocked`` with what holds the loop (``blocked_by``) and the Run whose task runs
there. The loop logs ``loop_unblocked`` with how long it was held once it runs again.
Nothing is on the Step path: the heartbeat is a timer, and frames are read only when the
loop is blocked.
"""

from __future__ import annotations

import asyncio
import sys
import sysconfig
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Final, Literal, NamedTuple

from intloom.executor.driver import RUN_TASK_PREFIX

if TYPE_CHECKING:
    from intloom.host.logfile import HostLog

__all__ = ["BLOCKED_AFTER", "Blocker", "LoopWatch", "blocked_by"]

BLOCKED_AFTER: Final = 2.0  # seconds without a heartbeat that count as a blocked loop
_LOOK: Final = 0.5
_INTLOOM: Final = str(Path(__file__).resolve().parent.parent) + "/"
# Where a loop thread waits for work: held there, it is not the loop's code that blocks.
_IDLE: Final = frozenset({"select", "poll", "epoll"})
# Python's own files and installed packages, which a project may hold (a conda or pixi
# environment inside it, a project that is $HOME with pyenv's or uv's Pythons): never the
# project's code, or selectors.py "held" the loop.
_PYTHON: Final = tuple(sorted({
    str(Path(p).resolve()) + "/" for p in (
        sys.prefix, sys.base_prefix, sys.exec_prefix,
        *(sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib", "purelib",
                                                      "platlib")))
    if p}))

Cause = Literal["step", "interpreter", "intloom"]

_ADVICE: Final[dict[Cause, str]] = {
    "step": "An async Step (or Tool, or on_complete) that blocks holds it: make it a plain "
            "def (it runs on a worker thread) or use await asyncio.to_thread(...) for the "
            "blocking call.",
    "interpreter": "The loop waits for work but could not take the interpreter: another "
                   "thread held it, most often a plain def Step or Tool in one long call "
                   "that keeps it (a regular expression on a large text, one huge "
                   "computation in C). Split the work, or run it in a subprocess "
                   "(concurrent.futures.ProcessPoolExecutor).",
    "intloom": "It is intloom's own work, not a Step's: if it recurs, report it with this "
               "line.",
}


class Blocker(NamedTuple):
    """What holds the loop: ``cause`` (``step``: the loop's thread runs a project's code;
    ``interpreter``: it waits for work, another thread held the GIL; ``intloom``: its own
    code), and where, as ``path:line in function`` (a project's path relative to it; None
    for ``interpreter``)."""

    cause: Cause
    at: str | None


def _where(frame: FrameType, root: str) -> str:
    path = frame.f_code.co_filename.removeprefix(root)
    return f"{path}:{frame.f_lineno} in {frame.f_code.co_name}"


def _projects(frame: FrameType, prefix: str) -> bool:
    """Whether ``frame`` runs a file of the project's own: under its root, and neither
    intloom (a checkout run from its own directory) nor an installed package (a virtual
    environment inside the project)."""
    name = frame.f_code.co_filename
    return (name.startswith(prefix) and not name.startswith(_INTLOOM)
            and "/site-packages/" not in name and not name.startswith(_PYTHON))


def _stack(frame: FrameType | None) -> list[FrameType]:
    """``frame`` and its callers, innermost first."""
    frames: list[FrameType] = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames


def blocked_by(frames: dict[int, FrameType], loop_thread: int, root: Path) -> Blocker:
    """What holds the loop whose thread is ``loop_thread``, from every thread's innermost
    frame (``sys._current_frames()``): the innermost frame of a project file on the loop's
    thread; else, when that thread waits for work (in ``select``), another thread that held
    the interpreter (not named: which one cannot be told); else intloom's own innermost
    frame on the loop's thread."""
    prefix = str(root) + "/"
    stack = _stack(frames.get(loop_thread))
    mine = next((f for f in stack if _projects(f, prefix)), None)
    if mine is not None:
        return Blocker("step", _where(mine, prefix))
    if stack and stack[0].f_code.co_name in _IDLE:
        # Which other thread held the interpreter cannot be told from here (each waits or
        # runs alike in its frames), and naming one named an idle Step as often as not.
        return Blocker("interpreter", None)
    ours = next((f for f in stack if f.f_code.co_filename.startswith(_INTLOOM)), None)
    chosen = ours or (stack[0] if stack else None)
    return Blocker("intloom", None if chosen is None else _where(chosen, prefix))


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
        """Raises what starting a thread raises (RuntimeError under a thread limit)."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        thread = threading.Thread(target=self._watch, name="intloom-loopwatch", daemon=True)
        thread.start()
        self._thread = thread
        self._beat()

    def close(self) -> None:
        self._closed.set()
        if self._timer is not None:
            self._timer.cancel()
        if self._thread is not None and self._thread is not threading.current_thread():
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
            blocker = blocked_by(sys._current_frames(), self._loop_thread, self._root)
            task = asyncio.current_task(self._loop) if self._loop is not None else None
            name = task.get_name() if task is not None else ""
            run_id = (name.removeprefix(RUN_TASK_PREFIX)
                      if blocker.cause == "step" and name.startswith(RUN_TASK_PREFIX) else None)
            if self._closed.is_set():
                return  # the host is ending: its log may be closing
            self._log.warning(
                "loop_blocked", seconds=round(held, 3), cause=blocker.cause, at=blocker.at,
                runId=run_id, message="The host's event loop has run nothing for "
                f"{held:.1f} s: every client waits. {_ADVICE[blocker.cause]}")
            # Set once the line is written: a loop that runs again meanwhile then logs its
            # loop_unblocked after it, never before (a reader takes the last line for now).
            self._blocked_since = last
