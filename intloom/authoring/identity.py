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

import errno
import functools
import hashlib
import json
import os
import stat
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Final

from intloom.errors import IntloomError
from intloom.project import link_leads
from intloom.runtime.records import PROTOCOL_VERSION

__all__ = [
    "Reads",
    "in_source_tree",
    "in_virtualenv",
    "named_files",
    "source_files",
    "source_root",
    "source_stats",
    "touched_since",
    "workflow_identity",
    "written_since",
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
    return [(rel, path) for rel, path, _st in _source_stats(entry)]


def source_stats(entry: Path) -> list[tuple[str, Path, os.stat_result]]:
    """``source_files``, each with the lstat it was judged by (a link is refused, so it is
    the file's own)."""
    return _source_stats(entry)


# How many of the files an edit likely touched are named.
_NAMED_FILES: Final = 3


def named_files(names: list[str]) -> str:
    """``a.py, b.py and 2 more``."""
    more = len(names) - _NAMED_FILES
    return ", ".join(names[:_NAMED_FILES]) + (f" and {more} more" if more > 0 else "")


def touched_since(entry: Path, since: float) -> bool:
    """Whether any file or directory of ``entry``'s source tree was written, created,
    renamed or removed (a directory's times move then) after ``since`` (a POSIX time), by
    the later of its modification and inode change times, which no tool sets back. True
    when the tree cannot be listed: only a False lets a caller skip hashing it."""
    dirs: list[tuple[str, _Sig]] = []
    try:
        files = _source_stats(entry, dirs)
    except (OSError, IntloomError):
        return True
    after = int(since * 1e9)
    if any(sig[0] == -1 or max(sig[3], sig[4]) > after for _path, sig in dirs):
        return True
    return any(max(st.st_mtime_ns, st.st_ctime_ns) > after for _rel, _path, st in files)


def written_since(entry: Path, since: float) -> list[Path] | None:
    """The files of ``entry``'s source tree modified after ``since`` (a POSIX time): likely
    an edit, a hint from file times, not a proof. None when the tree cannot be listed."""
    try:
        return [path for _rel, path, st in _source_stats(entry) if st.st_mtime > since]
    except (OSError, IntloomError):
        return None


def _source_stats(entry: Path, dirs: list[tuple[str, _Sig]] | None = None
                  ) -> list[tuple[str, Path, os.stat_result]]:
    """``source_files``, each with the lstat it was judged by; ``dirs`` receives each
    directory that decided the listing, with its lstat taken before it was listed."""
    if entry.is_symlink():
        raise _refuse_link(entry, entry.parent)
    root = source_root(entry)
    python_only = root != entry
    if dirs is not None:
        dirs.append(_dir_seen(str(root)))
    out: list[tuple[str, Path, os.stat_result]] = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=_unreadable(root),
                                                followlinks=False):
        base = Path(dirpath)
        for d in list(dirnames):
            if d in _SKIP or d.startswith("."):
                dirnames.remove(d)
            elif (base / d).is_symlink():
                raise _refuse_link(base / d, root)
            else:
                if dirs is not None:
                    # Before os.walk lists it; a virtualenv's too (its pyvenv.cfg removed
                    # would make it part of the tree).
                    dirs.append(_dir_seen(os.path.join(dirpath, d)))
                if _is_virtualenv(base / d):
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
            out.append((path.relative_to(root).as_posix(), path, st))
    out.sort(key=lambda item: item[0])
    return out


# What an lstat says of a file or directory that changes when it is written to (its ctime
# at least), created, removed or replaced: device, inode, size, mtime and ctime (ns).
_Sig = tuple[int, int, int, int, int]


def _sig(st: os.stat_result) -> _Sig:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _dir_seen(path: str) -> tuple[str, _Sig]:
    try:
        return path, _sig(os.lstat(path))
    except OSError:
        return path, (-1, -1, -1, -1, -1)  # never an lstat's: the listing is taken again


class Reads:
    """What one load took of its source trees, for the next Workflow it hashes: each tree's
    listing, with the lstat of every directory that decided it, and each file's bytes, with
    its lstat then. A listing is taken again when a directory's lstat changed (a file added,
    removed or renamed there), and a file read again when its lstat changed (its ctime
    moves at each write), so each Workflow's identity covers its tree as it is when hashed,
    as when each one walked and read it all (300 single-file Workflows of a directory:
    44,850 reads and 90,000 lstats, 7.1 s of load on a busy 2-core VM; 1.6 s so)."""

    def __init__(self) -> None:
        self.listings: dict[tuple[str, bool], tuple[list[tuple[str, _Sig]],
                                                    list[tuple[str, Path, os.stat_result]]]] = {}
        self.files: dict[str, tuple[_Sig, bytes]] = {}
        self.real: dict[str, str] = {}  # a path's realpath, for ``compiled`` by its other name
        self.digests: dict[str, tuple[bytes, bytes]] = {}  # path -> (bytes, their sha256)

    def listing(self, entry: Path) -> list[tuple[str, Path, os.stat_result]]:
        root = source_root(entry)
        key = (os.path.normpath(root), root != entry)
        kept = self.listings.get(key)
        if kept is not None and not entry.is_symlink():
            dirs, files = kept
            if all(_dir_seen(path)[1] == seen for path, seen in dirs):
                fresh: list[tuple[str, Path, os.stat_result]] = []
                for rel, path, _st in files:
                    try:
                        st = os.lstat(path)
                    except OSError:
                        break
                    if not stat.S_ISREG(st.st_mode):
                        break
                    fresh.append((rel, path, st))
                else:
                    return fresh
        dirs = []
        files = _source_stats(entry, dirs)
        self.listings[key] = (dirs, files)
        return files


# A file past this size is hashed a chunk at a time as it is read, when the caller keeps no
# bytes (``reads`` None: status, flows, doctor, a start reusing its host): a 2 GiB model in a
# package tree cost each of them 2 GiB of memory, read whole, and again for each Workflow.
_STREAMED_OVER: Final = 8 << 20
_CHUNK: Final = 1 << 20


class _Streamed:
    """A large file of a tree, read (and hashed) only when an identity is computed."""

    __slots__ = ()


_STREAMED: Final = _Streamed()

# A source tree's files with the bytes taken for each (or ``_STREAMED``), by (its root,
# Python files only).
Trees = MutableMapping[tuple[str, bool], list[tuple[str, Path, bytes | _Streamed]]]


def workflow_identity(name: str, version: str, entry: Path,
                      compiled: Mapping[str, bytes] | None = None,
                      hashed: MutableMapping[str, bytes] | None = None,
                      trees: Trees | None = None, reads: Reads | None = None) -> str:
    """``compiled``: the bytes the loader compiled each imported module from, by path (as
    spelled, and resolved); they stand for that file, whatever it holds by now. ``hashed``
    receives the sha256 of the bytes taken for each file, by its normalised path: what a
    module imported later must still hold to be the code this identity names. ``trees``:
    the trees already read by the caller, which this adds to; the Workflows of one source
    tree (every single-file entry of a directory shares it) then read it once, not once
    each (300 files in ``workflows/`` were 90,000 reads for one ``intloom status``).
    ``reads``: what earlier calls took of the trees (``Reads``), which this adds to: a
    listing or a file is taken again when its lstat changed (the loader's Workflows, each
    hashed right after its import: a tree cannot be read once for all of them)."""
    h = hashlib.sha256()
    h.update(json.dumps([name, version, PROTOCOL_VERSION]).encode())
    for rel, path, data in _tree(entry, compiled, trees, reads):
        if isinstance(data, _Streamed):
            digest = _stream(h, rel, path, entry)
            if hashed is not None:
                hashed[os.path.normpath(path)] = digest
            continue
        h.update(_head(rel, len(data)))
        h.update(data)
        if hashed is not None:
            spelled = os.path.normpath(path)
            if reads is None:
                hashed[spelled] = hashlib.sha256(data).digest()
            else:
                done = reads.digests.get(spelled)
                if done is None or done[0] is not data:
                    done = reads.digests[spelled] = (data, hashlib.sha256(data).digest())
                hashed[spelled] = done[1]
    return h.hexdigest()


@functools.lru_cache(maxsize=1 << 16)
def _head(rel: str, size: int) -> bytes:
    # Each Workflow of a tree hashes every file of it: 1,000 single-file sources of one
    # directory made status encode a million of these (8 s of its 12 s, profiled). One
    # cache for the loader and the comparisons alike.
    return json.dumps([rel, size]).encode()


def _stream(h: hashlib._Hash, rel: str, path: Path, entry: Path) -> bytes:
    """Hash ``path`` into ``h`` as its header and bytes, as read a chunk at a time; returns
    its own sha256. Its size is taken from the open file, so a file written meanwhile (its
    bytes no longer that size) is refused rather than hashed as what it never held."""
    try:
        # Non-blocking: a FIFO put in its place since the listing must not hang the command.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # replaced by a link since the listing
            raise _refuse_link(path, source_root(entry)) from None
        raise _unreadable_file(path, entry, exc) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise IntloomError(
                "WORKFLOW_LOAD_FAILED",
                f"{path} in the source tree {source_root(entry)} was replaced by something "
                "that is not a regular file while it was read; the Workflow's identity covers "
                "its source files there. Try again.")
        size = st.st_size
        h.update(_head(rel, size))
        own = hashlib.sha256()
        left = size
        while left:
            chunk = os.read(fd, min(_CHUNK, left))
            if not chunk:
                break
            h.update(chunk)
            own.update(chunk)
            left -= len(chunk)
        if left or os.read(fd, 1):
            raise IntloomError(
                "WORKFLOW_LOAD_FAILED",
                f"{path} in the source tree {source_root(entry)} changed size while it was "
                "read (being written); the Workflow's identity covers its source files there. "
                "Try again once it is written.")
    except OSError as exc:
        raise _unreadable_file(path, entry, exc) from None
    finally:
        os.close(fd)
    return own.digest()


def _unreadable_file(path: Path, entry: Path, exc: OSError) -> IntloomError:
    # The loader reports IntloomErrors per source; anything else would stop the host.
    return IntloomError(
        "WORKFLOW_LOAD_FAILED",
        f"{path} in the source tree {source_root(entry)} cannot be read "
        f"({exc.strerror or exc}); the Workflow's identity covers its source files there. "
        "Make it readable, or move the Workflow into a directory of its own.",
    )


def _tree(entry: Path, compiled: Mapping[str, bytes] | None, trees: Trees | None,
          reads: Reads | None = None) -> list[tuple[str, Path, bytes | _Streamed]]:
    """(relative path, path, bytes or ``_STREAMED``) of every file in the entry's source
    tree, sorted."""
    if entry.is_symlink():
        raise _refuse_link(entry, entry.parent)  # whatever tree it would share
    root = source_root(entry)
    key = (os.path.normpath(root), root != entry)
    if trees is not None and key in trees:
        return trees[key]
    out: list[tuple[str, Path, bytes | _Streamed]] = []
    for rel, path, st in (_source_stats(entry) if reads is None else reads.listing(entry)):
        data: bytes | _Streamed | None
        try:
            if reads is None:
                data = _compiled(compiled, path) if compiled else None
                if data is None:
                    data = _STREAMED if st.st_size > _STREAMED_OVER else path.read_bytes()
            else:
                data = _kept(reads, compiled, path, st)
        except OSError as exc:
            raise _unreadable_file(path, entry, exc) from None
        out.append((rel, path, data))
    if trees is not None:
        trees[key] = out
    return out


def _kept(reads: Reads, compiled: Mapping[str, bytes] | None, path: Path,
          st: os.stat_result) -> bytes:
    """The bytes ``_tree`` takes for ``path``, from what ``reads`` kept when it can: the
    bytes compiled from it, else those read when its lstat was the one it has now (a write
    since moves its ctime at least), else read now."""
    spelled = os.path.normpath(path)
    if compiled:
        found = compiled.get(spelled)
        if found is None:
            real = reads.real.get(spelled)
            if real is None:
                real = reads.real[spelled] = os.path.realpath(path)
            found = compiled.get(real)
        if found is not None:
            return found
    seen = _sig(st)
    kept = reads.files.get(spelled)
    if kept is not None and kept[0] == seen:
        return kept[1]
    data = path.read_bytes()
    reads.files[spelled] = (seen, data)
    return data


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
