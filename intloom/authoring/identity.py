"""Workflow identity: a sha256 over what the Workflow is and every byte it is made of.

identity = sha256( json([name, version, PROTOCOL_VERSION])
                   + for each file of the source tree, sorted by relative path:
                     json([relpath, size]) + the file's bytes )

The source tree is a directory: a package entry's own directory (every file), or, for a
single-file entry, the Python files (``.py``, ``.pyi``) of the directory holding it and
below. A single file alone is not enough: the Workflow imports its sibling modules (``from
workflows.helpers import label``), and a Run must not continue on changed code just because
the change sits in a helper. Only Python files, there: a single-file entry may sit at the
project root, beside the reports and data its Steps write, which must not hold its Runs.
Relative paths are taken from that directory. Dot files and directories (editor swap
files, ``.git``, ``.venv``, tool caches), ``__pycache__``, ``node_modules`` and virtualenvs
are not part of it. Symlinks are refused where they could hide source: an identity must be
over bytes we own, not wherever a link points today.

A module the loader imported is hashed as the bytes it was compiled from (``compiled``), not
read again: a file saved between its import and the hashing would otherwise give the code
that runs the identity of bytes that never ran.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path

from intloom.errors import IntloomError
from intloom.project import link_leads
from intloom.runtime.records import PROTOCOL_VERSION

__all__ = [
    "in_source_tree",
    "in_virtualenv",
    "source_files",
    "source_root",
    "workflow_identity",
]

# Directories that are never source: bytecode caches (rewritten by merely running the code)
# and JavaScript dependencies. Every dot name is skipped too: version control, intloom's own
# state, tool caches, virtualenvs named .venv, editor swap and backup files.
_SKIP = frozenset({"__pycache__", "node_modules"})
_SKIP_SUFFIXES = (".pyc", ".pyo")
# What a single-file entry's tree holds (its Python neighbours; see the module docstring).
_PYTHON = (".py", ".pyi")


def _refuse_link(path: Path, root: Path) -> IntloomError:
    return IntloomError(
        "WORKFLOW_LOAD_FAILED",
        f"{path} is a symbolic link {link_leads(path, root, 'its source tree')}, in the "
        f"source tree {root}. A Workflow's identity covers the bytes of its source files "
        "there; replace the link with the file it points to, or keep the Workflow in a "
        "directory of its own.",
    )


def _is_virtualenv(path: Path) -> bool:
    """A virtualenv (``python -m venv``, virtualenv, uv) marks its root with ``pyvenv.cfg``:
    an entry at the project root must not hash the installed packages of ``.venv``."""
    return (path / "pyvenv.cfg").is_file()


def in_virtualenv(root: Path, path: Path) -> bool:
    """Whether ``path``, under ``root``, lies in a virtualenv made inside it (``.venv``):
    its packages, intloom's own files among them, are installed there, not the project's."""
    parent = root
    for part in path.relative_to(root).parts[:-1]:
        parent = parent / part
        if _is_virtualenv(parent):
            return True
    return False


def _unreadable(root: Path) -> Callable[[OSError], None]:
    """os.walk's error handler: a directory it cannot list would silently drop its files
    from the identity, so it is an error that names the directory."""

    def fail(exc: OSError) -> None:
        raise IntloomError(
            "WORKFLOW_LOAD_FAILED",
            f"{exc.filename} in the source tree {root} cannot be listed "
            f"({exc.strerror or exc}); the Workflow's identity covers its source files there. "
            "Make it readable, or move the Workflow into a directory of its own.",
        ) from None

    return fail


def source_root(entry: Path) -> Path:
    """The directory whose files make up the entry's source tree."""
    return entry if entry.is_dir() else entry.parent


def source_files(entry: Path) -> list[tuple[str, Path]]:
    """(relative path, path) of every file in the entry's source tree, sorted."""
    if entry.is_symlink():
        raise _refuse_link(entry, entry.parent)
    root = source_root(entry)
    python_only = root != entry
    out: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=_unreadable(root),
                                                followlinks=False):
        base = Path(dirpath)
        for d in list(dirnames):
            if d in _SKIP or d.startswith("."):
                dirnames.remove(d)
            elif (base / d).is_symlink():
                raise _refuse_link(base / d, root)
            elif _is_virtualenv(base / d):
                dirnames.remove(d)
        for name in filenames:
            if name.startswith(".") or (python_only and not name.endswith(_PYTHON)):
                continue
            path = base / name
            try:
                st = os.lstat(path)
            except FileNotFoundError:  # removed since the listing (a tool's temp file)
                continue
            if stat.S_ISLNK(st.st_mode):
                raise _refuse_link(path, root)
            # A socket or FIFO (a tool's, in a project-root tree) has no bytes to hash, and
            # reading a FIFO would block the host's start.
            if not stat.S_ISREG(st.st_mode) or name.endswith(_SKIP_SUFFIXES):
                continue
            out.append((path.relative_to(root).as_posix(), path))
    out.sort()
    return out


# A source tree's files with the bytes taken for each, by (its root, Python files only).
Trees = MutableMapping[tuple[str, bool], list[tuple[str, Path, bytes]]]


def workflow_identity(name: str, version: str, entry: Path,
                      compiled: Mapping[str, bytes] | None = None,
                      hashed: MutableMapping[str, bytes] | None = None,
                      trees: Trees | None = None) -> str:
    """``compiled``: the bytes the loader compiled each imported module from, by path (as
    spelled, and resolved); they stand for that file, whatever it holds by now. ``hashed``
    receives the sha256 of the bytes taken for each file, by its normalised path: what a
    module imported later must still hold to be the code this identity names. ``trees``:
    the trees already read by the caller, which this adds to; the Workflows of one source
    tree (every single-file entry of a directory shares it) then read it once, not once
    each (300 files in ``workflows/`` were 90,000 reads for one ``intloom status``)."""
    h = hashlib.sha256()
    h.update(json.dumps([name, version, PROTOCOL_VERSION]).encode())
    for rel, path, data in _tree(entry, compiled, trees):
        h.update(json.dumps([rel, len(data)]).encode())
        h.update(data)
        if hashed is not None:
            hashed[os.path.normpath(path)] = hashlib.sha256(data).digest()
    return h.hexdigest()


def _tree(entry: Path, compiled: Mapping[str, bytes] | None,
          trees: Trees | None) -> list[tuple[str, Path, bytes]]:
    """(relative path, path, bytes) of every file in the entry's source tree, sorted."""
    if entry.is_symlink():
        raise _refuse_link(entry, entry.parent)  # whatever tree it would share
    root = source_root(entry)
    key = (os.path.normpath(root), root != entry)
    if trees is not None and key in trees:
        return trees[key]
    out: list[tuple[str, Path, bytes]] = []
    for rel, path in source_files(entry):
        try:
            data = _compiled(compiled, path) if compiled else None
            if data is None:
                data = path.read_bytes()
        except OSError as exc:
            # The loader reports IntloomErrors per source; anything else would stop the host.
            raise IntloomError(
                "WORKFLOW_LOAD_FAILED",
                f"{path} in the source tree {source_root(entry)} cannot be read "
                f"({exc.strerror or exc}); the Workflow's identity covers its source files there. "
                "Make it readable, or move the Workflow into a directory of its own.",
            ) from None
        out.append((rel, path, data))
    if trees is not None:
        trees[key] = out
    return out


def _compiled(compiled: Mapping[str, bytes], path: Path) -> bytes | None:
    # The spelling first (no system call: the loader's paths are spelled as the walk's);
    # resolved only for a file not found so (a tree named through a link or ``..``).
    found = compiled.get(os.path.normpath(path))
    return found if found is not None else compiled.get(os.path.realpath(path))


def in_source_tree(root: Path, path: Path) -> bool:
    """Whether ``path`` (a Python file) lies in the source tree rooted at ``root`` as
    ``source_files`` walks it: not under a dot directory, a skipped one or a virtualenv."""
    try:
        rel = path.relative_to(root)
    except ValueError:
        return False
    parent = root
    for part in rel.parts[:-1]:
        parent = parent / part
        if part in _SKIP or part.startswith(".") or _is_virtualenv(parent):
            return False
    return not rel.name.startswith(".")
