"""The standard streams of ``start --foreground``: the host and its Workflows' code run in
the command's process, and share its stdout and stderr for as long as the host serves.

Two promises hold there as for any command. With ``--json`` stdout carries one document:
what the Workflows print (a Step's ``print``, a subprocess's output, an import-time
message) goes to stderr instead. Each line goes out as it is printed, also into a pipe (a
supervisor's log). And a reader that goes away (``| head -1``, a closed
terminal) is no failure: what is printed after is dropped, where a Step's ``print`` raised
``BrokenPipeError`` (or EIO, the terminal closed) and failed its Run (STEP_EXECUTION_FAILED).
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import select
import sys
import threading
from typing import Any, TextIO, cast

from intloom.cli.blocking import text_writer
from intloom.cli.render import Renderer

__all__ = ["foreground_streams"]

# A pipe whose reader went away (``| head -1``); a terminal that was closed (its hangup).
_GONE = frozenset({errno.EPIPE, errno.EIO})


class _ReaderMayGo:
    """A standard stream whose reader may go away while the host serves: from then on,
    what is written to it is dropped, and its descriptor leads to ``/dev/null`` (a
    subprocess started later writes there, not into a closed pipe)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._gone = False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                return self._stream.write(text)
            except OSError as exc:
                if exc.errno not in _GONE:
                    raise
                self.went()
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except OSError as exc:
                if exc.errno not in _GONE:
                    raise
                self.went()

    def went(self) -> None:
        self._gone = True
        with contextlib.suppress(OSError, ValueError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
        # What the stream still buffers would fail its next flush, and Python's at exit.
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def foreground_streams(renderer: Renderer) -> None:
    """Set this process's streams up for a host serving in it (see the module's doc)."""
    if renderer.json_mode:
        # The document is written through a descriptor of its own; descriptor 1 leads to
        # stderr, so output written there below Python (a subprocess's) follows too.
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            kept = os.dup(sys.stdout.fileno())
            os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
            # A non-blocking stdout (a socket) is written through blocking.Patient, as
            # sys.stdout is (app.main): a plain file over it lost the document to EAGAIN.
            renderer.stdout = cast(TextIO, _ReaderMayGo(text_writer(kept, encoding="utf-8")))
    # Piped (a supervisor's log, | tee), stdout is block-buffered: what a Step printed
    # showed up 8 KiB at a time, or only when the host stopped.
    if isinstance(sys.stdout, io.TextIOWrapper):
        with contextlib.suppress(ValueError, OSError):
            sys.stdout.reconfigure(line_buffering=True)
    streams = [_ReaderMayGo(sys.stdout), _ReaderMayGo(sys.stderr)]
    sys.stdout, sys.stderr = (cast(TextIO, stream) for stream in streams)
    threading.Thread(target=_watch, args=(streams,), name="intloom-streams",
                     daemon=True).start()


def _watch(streams: list[_ReaderMayGo]) -> None:
    """Leads a stream to ``/dev/null`` as soon as its reader goes away, not at the host's
    next write to it: a Step's subprocess writing into the closed pipe meanwhile (``|
    head -1`` had its line) died of SIGPIPE and failed its Run."""
    poller = select.poll()
    watched: dict[int, list[_ReaderMayGo]] = {}
    for stream in streams:
        try:
            fd = stream.fileno()
        except (OSError, ValueError):  # closed, or no descriptor: nothing to watch
            continue
        if fd not in watched:
            poller.register(fd, 0)  # only POLLERR / POLLHUP: a reader gone, a hangup
        watched.setdefault(fd, []).append(stream)
    while watched:
        for fd, _events in poller.poll():
            poller.unregister(fd)
            for stream in watched.pop(fd, []):
                stream.went()
