"""stdout and stderr written as blocking streams, whatever mode a parent handed them over in.

A parent may leave them non-blocking (``O_NONBLOCK``, an event loop's pipes): a reader slower
than the pipe's buffer then made a write fail with EAGAIN, the output cut there
(``CLI_OUTPUT_FAILED``, saying to free space), and under ``PYTHONUNBUFFERED=1`` Python
dropped the rest of a partial write and the command exited 0 with half a JSON document.

A pipe or a terminal is opened again through ``/proc``: a description of this process's
own, made blocking, so the parent's keeps its mode and a subprocess (a Step's, under ``start
--foreground``) inherits a blocking one. Anything else (a socket), or a reopen refused, is
written through ``Patient``, which waits when a write would block, and the description is
left as it is: the parent shares it.
"""

from __future__ import annotations

import io
import os
import select
import stat
import sys
from typing import Any, TextIO

__all__ = ["Patient", "blocking_output", "text_writer"]


class Patient(io.RawIOBase):
    """Descriptor ``fd`` written whole, as a blocking one, whatever its mode: a write that
    would block (EAGAIN) waits until the descriptor takes more."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd
        self.name = fd  # as a FileIO over a descriptor says it (sys.stdout.name)

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data: Any) -> int:
        # Whole: a TextIOWrapper over it (write_through, as under -u) ignores a short count.
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            try:
                done += os.write(self._fd, view[done:])
            except BlockingIOError:
                select.select([], [self._fd], [])
        return done


def _reopened(fd: int) -> bool:
    """Put a blocking description of this process's own on ``fd``, a non-blocking pipe or
    terminal; whether that was done."""
    try:
        kind = os.fstat(fd).st_mode
        if not (stat.S_ISFIFO(kind) or stat.S_ISCHR(kind)):
            return False
        # O_NONBLOCK for the open itself: a pipe whose reader is gone would block it for ever.
        again = os.open(f"/proc/self/fd/{fd}",
                        os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        os.set_blocking(again, True)
        os.dup2(again, fd)
    except OSError:
        return False
    finally:
        os.close(again)
    return True


def text_writer(fd: int, *, encoding: str, errors: str = "strict",
                line_buffering: bool = False, write_through: bool = False) -> TextIO:
    """A text stream over ``fd`` that writes as a blocking one (``Patient`` when ``fd`` is
    non-blocking; an ordinary file otherwise). The descriptor stays open when it is closed."""
    if os.get_blocking(fd):
        return open(fd, "w", encoding=encoding, errors=errors,
                    closefd=False, buffering=1 if line_buffering else -1)
    raw = Patient(fd)
    # As Python builds an unbuffered stdout (-u): the text layer straight over the raw one.
    buffer: Any = raw if write_through else io.BufferedWriter(raw)
    return io.TextIOWrapper(buffer, encoding=encoding, errors=errors,
                            line_buffering=line_buffering, write_through=write_through)


def blocking_output() -> None:
    """Make ``sys.stdout`` and ``sys.stderr`` write as blocking streams (the module's doc)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(stream, io.TextIOWrapper):
            continue
        try:
            fd = stream.fileno()
            if os.get_blocking(fd):
                continue
            stream.flush()
        except (OSError, ValueError):
            continue
        if _reopened(fd):
            continue
        setattr(sys, name, text_writer(
            fd, encoding=stream.encoding, errors=stream.errors or "strict",
            line_buffering=stream.line_buffering, write_through=stream.write_through))
