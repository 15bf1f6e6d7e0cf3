"""The open segment's descriptor: whose file it still is, and room written ahead of it.

Both exist for the one figure a lone Run is measured by, the cost of a flush. An
``fdatasync`` that only overwrites blocks the file already has writes its data and nothing
else; one that makes the file longer also commits the file system's journal (the new size),
and so does one after anything read the inode's attributes since its last change (``fstat``
asks for its change counter, which the next write must then raise and log). Measured on a
2-vCPU VM (2026-12-06, alternating in one process): ~190 us per flush when appending or when
each flush began with an ``fstat``, ~135 us overwriting preallocated blocks without one.

So a segment is preallocated ahead of its writes, and the per-flush check that its
descriptor was not closed and reused by Workflow code reads ``/proc/self/fdinfo`` (which
names the inode without asking it anything) instead of calling ``fstat``.
"""

from __future__ import annotations

import contextlib
import os
from typing import Final

__all__ = ["PREALLOCATE_BYTES", "SEGMENT_DESCRIPTORS", "FdIdentity", "preallocate",
           "pwrite_all"]

# How far past a batch a segment is preallocated. Each extension costs one flush a journal
# commit: one in ~1,700 for a lone Run of trivial Steps. A crashed host leaves at most this
# much of zeros at its segment's end (a sealed segment has none: its writer cuts them off).
PREALLOCATE_BYTES: Final = 1 << 20
# What the open segment holds open: its own descriptor and its fdinfo entry's (FdIdentity).
SEGMENT_DESCRIPTORS: Final = 2


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Write every byte of ``data`` at ``offset`` (os.pwrite may write fewer than asked)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def preallocate(fd: int, start: int, end: int) -> None:
    """Give the file of ``fd`` blocks for ``[start, end)``, zeros to a reader, its size ``end``
    at least. OSError when the file system refuses (full, or no ``fallocate``): then nothing
    is promised, and writing on without it is what every format-1 writer did."""
    os.posix_fallocate(fd, start, end - start)


class FdIdentity:
    """Whether a descriptor still opens the file it opened, checked without ``fstat``.

    Its ``/proc/self/fdinfo`` entry (position, flags, mount and inode number) is read once
    while the descriptor is known to be ours; a later read giving the same bytes is the same
    open file. Only an entry that names the inode counts (Linux 5.14 on). Anything else (no
    procfs, no inode there, the entry changed, this class's own descriptor closed by
    someone) falls back to ``fstat``, which decides: a check fails closed, and only gets
    slower.
    """

    __slots__ = ("_dev_ino", "_info", "_info_id", "_seen")

    def __init__(self, fd: int, dev_ino: tuple[int, int]) -> None:
        self._dev_ino = dev_ino
        self._info = -1
        self._info_id: tuple[int, int] | None = None
        self._seen = b""
        self._watch(fd)

    def _watch(self, fd: int) -> None:
        self._release()
        try:
            info = os.open(f"/proc/self/fdinfo/{fd}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            st = os.fstat(info)
            seen = os.pread(info, 4096, 0)
        except OSError:
            os.close(info)
            return
        if b"\nino:\t%d\n" % self._dev_ino[1] not in seen:
            # Kernels before 5.14 name no inode there: two files of one mount opened alike
            # (a database a Step opens read-write, say) read the same, so only fstat tells.
            os.close(info)
            return
        self._info, self._info_id, self._seen = info, (st.st_dev, st.st_ino), seen

    def holds(self, fd: int) -> bool:
        """Whether ``fd`` still opens the file it did at ``__init__``."""
        if self._info >= 0:
            try:
                if os.pread(self._info, 4096, 0) == self._seen:
                    return True
            except OSError:
                pass
        try:
            st = os.fstat(fd)
        except OSError:
            return False
        if (st.st_dev, st.st_ino) != self._dev_ino:
            return False
        self._watch(fd)  # ours after all: what changed was the entry, or our view of it
        return True

    def _release(self) -> None:
        info, self._info = self._info, -1
        if info < 0:
            return
        # Closed only if still the procfs entry it opened: Workflow code that closed it may
        # have opened something else under its number since.
        with contextlib.suppress(OSError):
            st = os.fstat(info)
            if (st.st_dev, st.st_ino) == self._info_id:
                os.close(info)

    def close(self) -> None:
        """Close the descriptor this check reads through (never the one it checks)."""
        self._release()
