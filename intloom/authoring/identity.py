"""Workflow identity: a sha256 over what the Workflow is and every byte it is made of.

identity = sha256( json([name, version, PROTOCOL_VERSION])
                   + for each file of the source tree, sorted by relative path:
                     json([relpath, size]) + the file's bytes )

The source tree of a package entry is its directory (without ``__pycache__``, ``.git`` and
``.intloom``); of a single-file entry, that file. Symlinks are refused: an identity must be
over bytes we own, not wherever a link points today.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

from intloom.errors import IntloomError
from intloom.runtime.records import PROTOCOL_VERSION

__all__ = ["source_files", "workflow_identity"]

_SKIP = frozenset({"__pycache__", ".git", ".intloom", ".mypy_cache", ".pytest_cache"})


def _refuse_link(path: Path) -> IntloomError:
    return IntloomError(
        "WORKFLOW_LOAD_FAILED",
        f"{path} is a symbolic link. A Workflow's identity covers the bytes of its source "
        "tree; replace the link with the file it points to.",
    )


def source_files(entry: Path) -> list[tuple[str, Path]]:
    """(relative path, path) of every file in the entry's source tree, sorted."""
    if entry.is_symlink():
        raise _refuse_link(entry)
    if entry.is_file():
        return [(entry.name, entry)]
    out: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(entry, followlinks=False):
        base = Path(dirpath)
        for d in list(dirnames):
            if d in _SKIP:
                dirnames.remove(d)
            elif (base / d).is_symlink():
                raise _refuse_link(base / d)
        for name in filenames:
            path = base / name
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                raise _refuse_link(path)
            if name.endswith((".pyc", ".pyo")):
                continue
            out.append((path.relative_to(entry).as_posix(), path))
    out.sort()
    return out


def workflow_identity(name: str, version: str, entry: Path) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([name, version, PROTOCOL_VERSION]).encode())
    for rel, path in source_files(entry):
        data = path.read_bytes()
        h.update(json.dumps([rel, len(data)]).encode())
        h.update(data)
    return h.hexdigest()
