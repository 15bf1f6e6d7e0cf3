"""Reading the host logs (``.intloom/logs/LOG-<UTC>.jsonl``): whole, or as they grow.

A host instance writes one file; a restart starts a new one, so following the log means
reading the current file's new lines and moving on to each newer file as it appears. Files
are opened without following links and only ever read.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

__all__ = ["LogTail", "log_files"]

_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def log_files(logs_dir: Path) -> list[Path]:
    """The log files, oldest first (their names sort by UTC time); links are skipped."""
    try:
        names = os.listdir(logs_dir)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for name in names:
        if not (name.startswith("LOG-") and name.endswith(".jsonl")):
            continue
        path = logs_dir / name
        try:
            if stat.S_ISREG(os.lstat(path).st_mode):
                found.append(path)
        except FileNotFoundError:
            continue
    return sorted(found)


class LogTail:
    """Hands each complete new line of the logs, in order, to ``emit``.

    ``all_files`` starts from the oldest file; otherwise from the newest (or, when there is
    none yet, from the first one to appear). A line still being written is held back until
    its newline arrives.
    """

    def __init__(self, logs_dir: Path, emit: Callable[[str], None], *, all_files: bool) -> None:
        self._dir = logs_dir
        self._emit = emit
        self._current: Path | None = None
        self._offset = 0
        self._partial = b""
        if not all_files:
            existing = log_files(logs_dir)
            self._current = existing[-1] if existing else None

    def pump(self) -> None:
        """Emit what was appended since the last pump, then every newer file's lines."""
        if self._current is not None:
            self._read_from(self._current)
        for path in log_files(self._dir):
            if self._current is not None and path <= self._current:
                continue
            if self._partial:
                # A newer host exists, so the older file will not grow: show its torn end.
                self._emit(self._partial.decode("utf-8", errors="replace"))
            self._current, self._offset, self._partial = path, 0, b""
            self._read_from(path)

    def finish(self) -> None:
        """A last line with no newline yet, emitted as it is: called when not following, so
        a crashed host's torn last line is shown (marked by the printer) rather than held
        back for ever."""
        if self._partial.strip():
            self._emit(self._partial.decode("utf-8", errors="replace"))
        self._partial = b""

    def _read_from(self, path: Path) -> None:
        try:
            fd = os.open(path, _READ)
        except OSError:
            return
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return
            os.lseek(fd, self._offset, os.SEEK_SET)
            chunks = []
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
        finally:
            os.close(fd)
        data = b"".join(chunks)
        self._offset += len(data)
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        for line in lines:
            if line.strip():
                self._emit(line.decode("utf-8", errors="replace"))
