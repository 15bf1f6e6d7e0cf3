"""Reading the host logs (``.intloom/logs/LOG-<UTC>.jsonl``): whole, or as they grow.

A host instance writes one file; a restart starts a new one, so following the log means
reading the current file's new lines and moving on to each newer file as it appears. Files
are opened without following links and only ever read.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import stat
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Final

from intloom.errors import IntloomError
from intloom.fsutil import not_regular
from intloom.project import scan_logs as project_scan_logs

__all__ = ["Line", "LogTail", "Take", "log_files", "scan_logs", "unlistable"]

_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK: Final = 1 << 16  # bytes read from a log at a time
# The most of one line kept: a host writes none longer (a record's text is cut at 64 KiB),
# and a line with no end (a zero-filled tail after a power cut) was joined and split again at
# every chunk -- a minute and 2 GB for 100 MB -- and then shown whole.
_LINE_CAP: Final = 1 << 20

Skipped = Callable[[Path, str], None]  # a log-named entry that is no log, and what it is
Foreign = Callable[[Path], None]  # an entry under a name no host writes in logs/
Refused = Callable[[Path, OSError], None]  # a log file the OS would not open, and its error
Reread = Callable[[Path, str], None]  # a followed file read again from its start, and why
Line = tuple[Path, int, str]  # a line of the logs: its file, the byte it starts at, its text
# Given the lines of the logs last first, takes as many of them as it needs, and stops.
Take = Callable[[Iterator[Line]], None]


def _pread(fd: int, size: int, offset: int) -> bytes:
    """Every read of a log's bytes goes through here, so that a test can count them."""
    return os.pread(fd, size, offset)


def _lines_back(fd: int, end: int) -> Iterator[tuple[int, int, bytes]]:
    """The lines of ``fd`` up to byte ``end``, last first, each as (the byte it starts at,
    its length without the newline, its first ``_LINE_CAP`` bytes): first what follows the
    last newline (b"" when the file ends with one). Stops early when the file shrinks
    under it: its lines left out, the tail starts earlier than it needs, never later."""
    cap = _LINE_CAP
    stop = pos = end  # the line sought ends at ``stop``; the bytes from ``pos`` on are read
    # Of that line, what was read so far, last first; None once past the cap (a zero-filled
    # tail's hundreds of MB): its head is then read again from its start, once found.
    pieces: list[bytes] | None = []
    held = 0  # their length
    while True:
        size = min(_CHUNK, pos)
        data = _pread(fd, size, pos - size) if size else b""
        if len(data) != size:
            return
        pos -= size
        right = size
        while (newline := data.rfind(b"\n", 0, right)) >= 0 or pos == 0:
            begin = pos + newline + 1  # 0 at the start of the file (rfind gives -1)
            if pieces is not None:
                head = (data[newline + 1:right] + b"".join(reversed(pieces)))[:cap]
            else:
                head = _pread(fd, cap, begin)
                if len(head) != min(cap, stop - begin):
                    return
            yield begin, stop - begin, head
            if newline < 0:
                return
            stop, right, pieces, held = pos + newline, newline, [], 0
        if pieces is not None:
            pieces.append(data[:right])
            held += right
            if held > cap:
                pieces = None


def scan_logs(logs_dir: Path) -> tuple[list[Path], list[tuple[Path, str]], list[Path]]:
    """``intloom.project.scan_logs``, with a directory that cannot be listed or searched as
    STORAGE_ERROR (``unlistable``): unhandled, a logs/ (or .intloom/) its user may not read
    or search ended intloom logs with CLI_INTERNAL_ERROR, exit 70."""
    try:
        return project_scan_logs(logs_dir)
    except OSError as exc:
        raise unlistable(logs_dir, exc) from None


def unlistable(logs_dir: Path, exc: OSError) -> IntloomError:
    """STORAGE_ERROR for a logs directory that cannot be listed: why, and the fix."""
    from intloom.fsutil import read_refusal, shell_arg

    if isinstance(exc, PermissionError):
        fact, fix = read_refusal(logs_dir)
        if fix.startswith("Run chmod u+r "):  # a directory is listed with r and searched with x
            fix = f"Run chmod 700 {shell_arg(logs_dir)}"
    else:
        fact = f"{logs_dir} cannot be listed ({exc.strerror or exc})"
        fix = "Check it (ls -ld shows what it is)"
    return IntloomError(
        "STORAGE_ERROR",
        f"The host logs cannot be listed: {fact}. Nothing was read, and nothing was changed. "
        f"{fix}, then run intloom logs again.",
    )


def log_files(logs_dir: Path) -> list[Path]:
    """The log files, oldest first; entries that are not regular files are left out."""
    return scan_logs(logs_dir)[0]


class LogTail:
    """Hands each complete new line of the logs, in order, to ``emit``.

    ``all_files`` starts from the oldest file; otherwise from the newest (or, when there is
    none yet, from the first one to appear). A line still being written is held back until
    its newline arrives. An entry named like a log that is not a regular file is handed to
    ``on_skipped`` once, with what it is. A file being followed that shrank (truncated, by
    hand or by a ``copytruncate`` rotation) or that another file replaced is read again from
    its start, and handed to ``on_reread`` with what happened to it. A log file that cannot
    be opened (EACCES: mode 0000, another user's) is handed to ``on_refused`` once, with the
    error: it was passed over in silence, as if it were empty. An entry under a name no host
    writes there (notes.txt, a renamed copy) is handed to ``on_foreign`` once: it too was
    passed over in silence.
    """

    def __init__(self, logs_dir: Path, emit: Callable[[str], None], *, all_files: bool,
                 on_skipped: Skipped | None = None, newest: Path | None = None,
                 on_reread: Reread | None = None, on_refused: Refused | None = None,
                 on_foreign: Foreign | None = None) -> None:
        self._dir = logs_dir
        self._on_foreign = on_foreign
        self._on_refused = on_refused
        self._emit = emit
        self._on_skipped = on_skipped
        self._on_reread = on_reread
        self._file: tuple[int, int] | None = None  # (st_dev, st_ino) of what ``_offset`` is in
        self._held: int | None = None  # that file, open (see ``_read_from``)
        self._reported: set[Path] = set()
        self._current: Path | None = None
        self._offset = 0
        self._partial = b""
        self._cut = 0  # bytes of the partial line past _LINE_CAP, read and not kept
        # Where the line being emitted starts: its file and byte offset (an unreadable line
        # is reported by both; ``emit`` takes the text alone).
        self.line_at: tuple[Path, int] | None = None
        # Names sort by the wall clock at each host's start, which may have been moved back
        # since an earlier host ran: the log of the host service.json names is the newest
        # whatever its name, and a file is new when it was not seen, not when it sorts later.
        self._newest = newest
        self._seen: set[Path] = set()
        if not all_files:
            existing = self._scan()
            self._seen.update(existing)
            self._current = existing[-1] if existing else None

    def _skip(self, path: Path, what: str) -> None:
        if path not in self._reported and self._on_skipped is not None:
            self._reported.add(path)
            self._on_skipped(path, what)

    def _scan(self) -> list[Path]:
        found, skipped, foreign = scan_logs(self._dir)
        for path, what in skipped:
            self._skip(path, what)
        for path in foreign:
            if path not in self._reported and self._on_foreign is not None:
                self._reported.add(path)
                self._on_foreign(path)
        return sorted(found, key=lambda path: (path == self._newest, path))

    def pump(self) -> None:
        """Emit what was appended since the last pump, then every newer file's lines."""
        if self._current is not None:
            self._read_from(self._current)
        for path in self._scan():
            if path in self._seen:
                continue
            self._seen.add(path)
            # A newer host exists, so the older file will not grow: show its torn end.
            self._torn_end()
            self._release()
            self._current, self._offset, self._partial, self._file = path, 0, b"", None
            self._cut = 0
            self._read_from(path)

    def pump_last(self, take: Take, *, finishing: bool) -> None:
        """The first ``pump`` of ``--tail N``, reading only the logs' ends: ``take`` is
        handed the lines this pump would emit (and ``finish``, when ``finishing``; else a
        last line with no newline yet is held back, and is no line of the tail), last first,
        read backwards a block at a time, and keeps what it needs of them. They, and the
        lines before them, are then read: none is emitted, and the next ``pump`` reads on
        from the newest file's end. A host's log grows for its life, and read whole for its
        last 20 lines it took 35 ms a MB; read again forward from the first line ``take``
        needed, a Run's few records among many were read twice."""
        paths = [] if self._current is None else [self._current]
        for path in self._scan():  # the files ``pump`` would read, in its order
            if path not in self._seen:
                self._seen.add(path)
                paths.append(path)
        if not paths:
            return
        newest = paths[-1]
        fd = _open_regular(newest)
        read: set[Path] = set()  # the files read backwards
        partial, cut, size = b"", 0, 0
        try:
            ends: Iterator[tuple[int, int, bytes]] | None = None
            if fd is not None:
                size = os.fstat(fd).st_size
                ends = _lines_back(fd, size)
                last = next(ends, None)  # what follows its last newline: b"" when none
                if last is not None and finishing:
                    ends = itertools.chain([last], ends)
                elif last is not None:  # held back until its newline comes, as ``pump`` does
                    partial, cut = last[2], last[1] - len(last[2])
                read.add(newest)
            with contextlib.closing(self._backwards(paths, ends, read)) as lines:
                take(lines)  # closed here: the file it stopped in is closed now
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        for path in paths[:-1]:
            if path not in read:
                # Wholly before the tail, so not read; but opened, as when it was read
                # whole: one that may not be read (mode 0000) still fails the command, and
                # one replaced by a FIFO is still named. Which records it held is not
                # known, so that it held none of the last N is no reason to keep quiet.
                opened = self._open(path)
                if opened is not None:
                    os.close(opened)
        self._release()
        self._current, self._offset, self._partial, self._file = newest, 0, b"", None
        self._cut = 0
        if fd is None:
            self._read_from(newest)  # named, when it still cannot be read; else read whole
            return
        self._held, self._file, self._offset = fd, _identity(fd), size
        self._partial, self._cut = partial, cut

    def _backwards(self, paths: list[Path], newest: Iterator[tuple[int, int, bytes]] | None,
                   read: set[Path]) -> Generator[Line, None, None]:
        """The lines of ``paths`` (those of the last, ``newest``: already open, and read by
        ``_lines_back``) ``pump`` would emit, last first, each file opened as it is reached
        (``read`` gets it) and closed once left. A file that cannot be opened has none:
        ``pump_last`` names it, in the files' order."""
        for index in range(len(paths) - 1, -1, -1):
            path = paths[index]
            if index == len(paths) - 1:
                if newest is not None:
                    yield from _lines(path, newest)
                continue
            fd = _open_regular(path)
            if fd is None:
                continue
            try:
                read.add(path)
                yield from _lines(path, _lines_back(fd, os.fstat(fd).st_size))
            finally:
                os.close(fd)

    def finish(self) -> None:
        """A last line with no newline yet, emitted as it is: called when not following, so
        a crashed host's torn last line is shown (marked by the printer) rather than held
        back for ever."""
        self._torn_end()
        self._partial, self._cut = b"", 0

    def _torn_end(self) -> None:
        """The line being read, which will not be completed (its file is left, or read
        again), shown as torn; one of only blanks (spaces, tabs, a CR: what a host killed
        mid-write may leave) holds nothing, and is skipped as a blank line is. An older
        log's such end was shown as an unreadable line, where the newest log's was skipped."""
        if self._partial.strip() or self._cut:
            self._emit_partial()

    def _emit_at(self, line: bytes, offset: int) -> None:
        self.line_at = None if self._current is None else (self._current, offset)
        self._emit(line.decode("utf-8", errors="surrogateescape"))

    def _emit_partial(self) -> None:
        self._emit_at(self._partial, self._offset - len(self._partial) - self._cut)

    def _open(self, path: Path) -> int | None:
        """``path`` opened for reading; None when it is gone or no regular file (named)."""
        try:
            fd = os.open(path, _READ)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # replaced by a link since it was listed
                self._skip(path, "a symbolic link")
            elif (exc.errno not in (errno.ENOENT, errno.ENOTDIR) and path not in self._reported
                  and self._on_refused is not None):
                self._reported.add(path)
                self._on_refused(path, exc)
            return None
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # replaced since it was listed
            os.close(fd)
            self._skip(path, not_regular(mode))
            return None
        return fd

    def close(self) -> None:
        """Close the file followed, which is kept open (``_read_from``) until then."""
        self._release()

    def _release(self) -> None:
        if self._held is not None:
            os.close(self._held)
            self._held = None

    def _read_from(self, path: Path) -> None:
        """Read on in the file being followed, kept open: one removed or moved away while
        followed is still read, as its host goes on writing into it (reopened by its name
        each time, it was lost). ``path`` naming another file now, or the file shrunk, is
        read again from its start: at the old offset, every line written after a
        truncation was lost until the file grew past it, then shown from mid-line."""
        opened = self._open(path)
        held = self._held
        if held is not None and opened is not None and _identity(opened) != self._file:
            self._read_fd(held)  # what the old file got before it was replaced
            self._release()
            held = None
            self._restart(path, "it was replaced by another file")
        if held is None:
            if opened is None:
                return
            self._held = held = opened
            self._file = _identity(opened)
        elif opened is not None:
            os.close(opened)
        size = os.fstat(held).st_size
        if size < self._offset:
            self._restart(path, f"it was truncated from {self._offset} to {size} bytes")
        self._read_fd(held)

    def _read_fd(self, fd: int) -> None:
        # A chunk at a time, its whole lines emitted before the next is read: the rest of
        # the file read at once, joined and split, held a host's log several times over
        # (a 13 MB log took `intloom logs RUN` to 63 MB; a host's log grows for its life).
        while chunk := _pread(fd, _CHUNK, self._offset):
            at = self._offset - len(self._partial) - self._cut
            self._offset += len(chunk)
            end = chunk.find(b"\n")
            if end < 0:  # the line goes on: kept up to the cap, never joined again
                self._keep(chunk)
                continue
            self._keep(chunk[:end])
            first, cut = self._partial, self._cut
            *lines, self._partial = chunk[end + 1:].split(b"\n")
            self._cut = 0
            if first.strip() or cut:  # a line past the cap is shown (cut), never blank
                self._emit_at(first, at)
            at += len(first) + cut + 1
            for line in lines:
                if line.strip() or len(line) > _LINE_CAP:
                    self._emit_at(line[:_LINE_CAP], at)
                at += len(line) + 1
            if len(self._partial) > _LINE_CAP:
                self._cut, self._partial = (len(self._partial) - _LINE_CAP,
                                            self._partial[:_LINE_CAP])

    def _keep(self, more: bytes) -> None:
        """More of the line being read, kept up to ``_LINE_CAP``; the rest counted."""
        room = _LINE_CAP - len(self._partial)
        if room > 0:
            self._partial += more[:room]
        self._cut += max(0, len(more) - max(room, 0))

    def _restart(self, path: Path, fact: str) -> None:
        self._torn_end()  # the end of a line not completed here: shown, not dropped
        self._offset, self._partial, self._cut = 0, b"", 0
        if self._on_reread is not None:
            self._on_reread(path, fact)


def _open_regular(path: Path) -> int | None:
    """``path`` opened for reading, or None: gone, refused, or no regular file (named by
    ``LogTail._open``, which opens it again for that)."""
    try:
        fd = os.open(path, _READ)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def _lines(path: Path, back: Iterator[tuple[int, int, bytes]]) -> Iterator[Line]:
    """Of the lines ``_lines_back`` gives, those ``LogTail`` emits (as ``_read_fd`` and
    ``_torn_end`` do: not blank, or past the cap), as ``Line``s of ``path``."""
    for at, length, head in back:
        if head.strip() or length > _LINE_CAP:
            yield path, at, head.decode("utf-8", errors="surrogateescape")


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino
