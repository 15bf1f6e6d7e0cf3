"""Noticing that stdout's reader went away while a command waits with nothing to print.

``intloom logs --follow | grep -m1 run_terminal`` and ``intloom attach RUN | head -1`` had
what they wanted, but the command learnt that its reader was gone only at its next write:
the host's next log line, the Run's next event, which on an idle host or under a long Step
may be hours away, the pipeline hanging meanwhile. As coreutils' ``tail -f`` does, the
command watches the pipe (poll reports POLLERR on a write end whose reader closed it) and
ends then, as that next write would have ended it: quietly, the reader having gone.

Only a pipe or a socket is watched: a terminal that goes away hangs the command up
(SIGHUP), and a file has no reader to lose.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import stat
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Final

__all__ = ["READER_GONE_SIGNAL", "ends_wait_when_reader_goes", "on_reader_gone"]

# The signal that ends the main thread's wait once the reader went: a real one, sent to the
# main thread, wakes a blocking call there (a socket read), which a flag alone would not.
# Not SIGINT: one started in the background by a script (``... | head -1 &``) ignores it,
# and an ignored SIGINT would not end the wait. Held off where attach holds SIGINT off.
READER_GONE_SIGNAL: Final = signal.SIGRTMIN
# The signals a command's waits take as Ctrl-C, and that one: held off on the watching
# thread, which must not be the one the kernel hands them to (the main thread's blocking
# wait would not wake; attach's _start_without_sigint says the same).
_HELD: Final = frozenset({signal.SIGINT, signal.SIGTERM, READER_GONE_SIGNAL})


def _watched_fd() -> int | None:
    """stdout's descriptor when it is a pipe or a socket; None otherwise (or no stdout)."""
    try:
        fd = sys.stdout.fileno()
        mode = os.fstat(fd).st_mode
    except (AttributeError, OSError, ValueError):
        return None
    return fd if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) else None


@contextlib.contextmanager
def on_reader_gone(gone: Callable[[], None]) -> Iterator[None]:
    """Call ``gone`` once, from a watching thread, if stdout's reader goes away inside the
    block. The watch ends with the block."""
    fd = _watched_fd()
    if fd is None:
        yield
        return
    wake_r, wake_w = os.pipe2(os.O_CLOEXEC)
    watcher = threading.Thread(target=_watch, args=(fd, wake_r, gone),
                               name="intloom-reader-watch", daemon=True)
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)  # the thread takes this mask
    try:
        watcher.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.write(wake_w, b"x")
        watcher.join()
        os.close(wake_r)
        os.close(wake_w)


def _watch(fd: int, wake: int, gone: Callable[[], None]) -> None:
    poller = select.poll()
    poller.register(fd, 0)  # only POLLERR / POLLHUP / POLLNVAL: never asked for, always said
    poller.register(wake, select.POLLIN)
    while True:
        for ready, events in poller.poll():
            if ready == wake:
                return
            if events & select.POLLNVAL:
                return  # stdout closed under the command: nothing left to watch
            gone()
            return


@contextlib.contextmanager
def ends_wait_when_reader_goes(left: Callable[[], None]) -> Iterator[None]:
    """Inside the block (main thread), a KeyboardInterrupt ends the main thread's wait as
    Ctrl-C does once stdout's reader goes away, after ``left()`` says so (a flag the
    command's handlers read, to end quietly)."""
    fired = threading.Event()

    def interrupted(_signo: int, _frame: object) -> None:
        if fired.is_set():  # not a stray signal from elsewhere
            raise KeyboardInterrupt

    def gone() -> None:
        left()
        fired.set()
        ident = threading.main_thread().ident
        if ident is not None:  # always, once the interpreter runs
            signal.pthread_kill(ident, READER_GONE_SIGNAL)

    previous = signal.signal(READER_GONE_SIGNAL, interrupted)
    try:
        with on_reader_gone(gone):
            yield
    finally:
        signal.signal(READER_GONE_SIGNAL, previous)
