"""Temp files that an interrupted write of the host's metadata left in ``.intloom/``.

Every metadata file is written through an exclusive temp file beside it
(``.service.lock.<16 hex>.tmp``, ``.service.json.<16 hex>.tmp``,
``.connection.json.<16 hex>.tmp``), removed once the write is done or has failed. Only a
crash in between leaves one. Nothing reads them, and nothing removes them: ``recover``
removes only ``service.json`` and ``service.lock`` (DESIGN section 3). They are reported,
so that a person can tell what they are, and kept byte-identical.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Final

import msgspec

from intloom.project import ProjectPaths

__all__ = ["TempFile", "metadata_temps"]

# Exactly the names fsutil.replace_files and metadata.create_lock_file give their temp
# files in .intloom/; any other name is not ours to explain.
_TEMP: Final = re.compile(r"\.(service\.lock|service\.json|connection\.json)\.[0-9a-f]{16}\.tmp")


class TempFile(msgspec.Struct, frozen=True):
    """A temp file left by an interrupted write: its path (from the project's root), the
    file it was written for, and its size in bytes."""

    path: str
    target: str
    size: int


def metadata_temps(paths: ProjectPaths) -> list[TempFile]:
    """The temp files of interrupted metadata writes in ``.intloom/``, by name; regular
    files only, never through a link, never opened. [] when ``.intloom/`` cannot be read
    (the runtime_dir check reports that)."""
    try:
        fd = os.open(paths.state, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    found: list[TempFile] = []
    try:
        for name in sorted(os.listdir(fd)):
            match = _TEMP.fullmatch(name)
            if match is None:
                continue
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue  # gone meanwhile: a write that has just finished
            if stat.S_ISREG(st.st_mode):
                found.append(TempFile(f"{paths.state.name}/{name}", match.group(1),
                                      st.st_size))
    except OSError:
        return []
    finally:
        os.close(fd)
    return found
