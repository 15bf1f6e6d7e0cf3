"""Temp files that an interrupted write of the host's metadata left in ``.intloom/``.

Every metadata file is written through an exclusive temp file beside it
(``.service.lock.<16 hex>.tmp``, ``.service.json.<16 hex>.tmp``,
``.connection.json.<16 hex>.tmp``), removed once the write is done or has failed. Only a
crash in between leaves one. Nothing reads them, and nothing removes them: ``recover``
removes only ``service.json`` and ``service.lock`` (DESIGN section 3). They are reported,
so that a person can tell what they are, and kept byte-identical.

One is there for a moment during every write too (a starting host's lock, its
``service.json``), so a temp file is called left behind only when its writer is provably
gone, as an owner is (ownership checks fail closed): its writer holds it under an OS lock
(``fsutil.hold_temp``) from right after creating it, and a crash lets the lock go. Held:
being written, not reported. Free: left behind -- unless it changed within the last
``_SETTLED`` seconds (its writer may be between creating and locking it), or the lock
could not be probed; such a one is reported as undecided.
"""

from __future__ import annotations

import os
import re
import stat
import time
from typing import Final, NamedTuple

import msgspec

from intloom.fsutil import os_lock
from intloom.project import ProjectPaths

__all__ = ["TempFile", "Temps", "Unsure", "metadata_temps"]

# Exactly the names fsutil.replace_files and metadata.create_lock_file give their temp
# files in .intloom/; any other name is not ours to explain.
_TEMP: Final = re.compile(r"\.(service\.lock|service\.json|connection\.json)\.[0-9a-f]{16}\.tmp")
# A writer locks its temp file two system calls after creating it: one found unlocked
# sooner than this after its last change may be in that gap (or in a starting host paused
# there), not left behind.
_SETTLED: Final = 2.0


class TempFile(msgspec.Struct, frozen=True):
    """A temp file left by an interrupted write: its path (from the project's root), the
    file it was written for, and its size in bytes."""

    path: str
    target: str
    size: int


class Unsure(NamedTuple):
    """A temp file whose writer may be live: why that cannot be told, and whether its lock
    could be probed at all (if not, only a look at who has it open can tell)."""

    temp: TempFile
    why: str
    probed: bool


class Temps(NamedTuple):
    """``left``: temp files whose writer is provably gone (left by an interrupted write).
    ``unsure``: ones whose writer may be live (not locked yet, or its lock not probeable)."""

    left: list[TempFile]
    unsure: list[Unsure]


def metadata_temps(paths: ProjectPaths) -> Temps:
    """The temp files of metadata writes in ``.intloom/``, by name; regular files only,
    never through a link, opened only to probe their lock (never read or written). Ones
    being written (their writer holds the lock) are left out. Empty when ``.intloom/``
    cannot be read (the runtime_dir check reports that)."""
    found = Temps([], [])
    try:
        fd = os.open(paths.state, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return found
    try:
        names = sorted(os.listdir(fd))
        for name in names:
            match = _TEMP.fullmatch(name)
            if match is None:
                continue
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue  # gone meanwhile: a write that has just finished
            if not stat.S_ISREG(st.st_mode):
                continue
            lock, reason = os_lock(paths.state / name)
            if lock in ("held", "absent"):
                continue  # being written, or done meanwhile
            temp = TempFile(f"{paths.state.name}/{name}", match.group(1), st.st_size)
            age = time.time() - st.st_mtime  # its creation's, for one not locked
            if lock != "free":
                found.unsure.append(Unsure(temp, f"its lock cannot be probed ({reason})",
                                           probed=False))
            elif age < _SETTLED:
                found.unsure.append(Unsure(temp, f"changed {max(age, 0):.1f} s ago and not "
                                           "locked yet: its writer may be creating it",
                                           probed=True))
            else:
                found.left.append(temp)
    except OSError:
        return Temps([], [])
    finally:
        os.close(fd)
    return found
