"""Loading the project's Workflows from the paths ``intloom.toml`` names.

Each entry is a Python file or a package directory, relative to the project root. Every
``intloom.Workflow`` bound at the top level of the imported module is registered. A broken
entry is reported with its path and the error, never a traceback; the others still load.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import keyword
import marshal
import os
import shlex
import signal
import stat
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import CodeType, FrameType, ModuleType, TracebackType
from typing import IO, Any, Final, NoReturn, TypeGuard, cast

import msgspec

from intloom.authoring.identity import (
    Reads,
    in_source_tree,
    in_virtualenv,
    source_root,
    workflow_identity,
)
from intloom.authoring.workflow import WORKFLOW_MODULE_PREFIX, DefinitionError, Workflow
from intloom.errors import ErrorView, IntloomError, LoadInterrupted, as_call, clip, message_of
from intloom.project import Config, link_leads, link_loop, special_file

__all__ = [
    "LoadResult",
    "LoadedWorkflow",
    "load_workflows",
    "load_workflows_offline",
    "raised_at",
    "slow_import_notice",
]


class LoadedWorkflow(msgspec.Struct, frozen=True):
    """A Workflow as the host knows it: the definition, where it came from, and its identity."""

    workflow: Workflow
    source: str
    identity: str
    schemas: dict[str, str]
    # Where it was loaded from (the entry's path as the loader opened it): "" for one not
    # loaded from a file.
    entry: str = ""

    @property
    def name(self) -> str:
        return self.workflow.name

    @property
    def version(self) -> str:
        return self.workflow.version

    def has_recover(self, stage: str, step: str | None) -> bool:
        return self.workflow.has_recover(stage, step)


class LoadResult(msgspec.Struct):
    workflows: dict[str, LoadedWorkflow] = msgspec.field(default_factory=dict)
    problems: list[tuple[str, ErrorView]] = msgspec.field(default_factory=list)
    # Workflow name -> why it is not loaded although a source defines it (two sources define
    # it): the restore and doctor hold its Runs for that reason, not as "changed".
    withheld: dict[str, str] = msgspec.field(default_factory=dict)
    # The sources whose import failed, each once: a Workflow that is not loaded may be
    # defined in one of them. Not every problem is one (a repeated entry, whose source
    # loaded from its first; a source withheld for a shared name, whose names are known).
    failed: list[str] = msgspec.field(default_factory=list)
    # Those of them that failed for want of file descriptors (SourceStarved): what is not
    # loaded says nothing of the project then, so doctor compares no Run with it.
    starved: list[str] = msgspec.field(default_factory=list)


# A checked hash-based .pyc (PEP 552): flags, then the source's hash, in place of Python's
# usual modification time and size.
_HASH_PYC_FLAGS: Final = 0b11  # hash-based, check_source
_PYC_HEAD: Final = 16  # magic, flags, the 8-byte source hash


class _FromSource(importlib.machinery.SourceFileLoader):
    """Loads the module from the bytes of its file, never from a ``__pycache__`` file judged
    by them: Python takes a cached file as current when the source has the size and
    modification second it recorded, so an edit of the same size within that second (a
    script, a checkout, a copy that keeps times) would run the old code under the identity
    of the new bytes. A cache is used only when it records the hash of the bytes just read
    (a checked hash-based .pyc, which this writes, and which Python itself also checks
    against the source): a large tree is not compiled again at every start."""

    def get_source(self, fullname: str) -> str | None:
        # What a traceback quotes of a module whose file is gone since the load (linecache
        # asks the loader only then): its lines were empty.
        kept = _TREES.kept_source(self.path)
        return (importlib.util.decode_source(kept) if kept is not None
                else super().get_source(fullname))

    def get_code(self, fullname: str) -> CodeType:
        # After the load, a module of a loaded tree is compiled from the bytes its identity
        # hashed, kept since: one a Step imports only once it runs was read from the disk
        # then, and an edit saved meanwhile (a git pull before a restart) failed that Run
        # for good, or ran code its journal's identity does not name.
        kept = _TREES.kept_source(self.path)
        if kept is None:
            _TREES.refuse_added(self.path)
        source = kept if kept is not None else self.get_data(self.path)
        _TREES.compiled_from(self.path, source)
        key = importlib.util.source_hash(source)
        try:
            cached: str | None = importlib.util.cache_from_source(self.path)
        except NotImplementedError:  # an interpreter without a cache tag
            cached = None
        # Whom the source may be read by: its cache may be read by no one else.
        try:
            readable = os.stat(self.path).st_mode & 0o044
        except OSError:
            readable = 0
        if cached is not None:
            code = _cached_code(cached, key, readable)
            if code is not None:
                return code
        code = self.source_to_code(source, self.path)
        # Not for a file gone since the load (``_kept_spec``): set_data would make its
        # directory again, where a rename took it away.
        if cached is not None and not sys.dont_write_bytecode and os.path.lexists(self.path):
            _cache_dir(os.path.dirname(cached))
            # set_data writes atomically and gives up quietly where it may not write. Never
            # writable by others, whatever the umask (0o666 & ~umask): _cached_code takes no
            # such file. Nor readable by those the source is not: a private source's code
            # (an API key in it, say) was cached 0644 for every user to read.
            self.set_data(cached, importlib.util.MAGIC_NUMBER
                          + _HASH_PYC_FLAGS.to_bytes(4, "little") + key + marshal.dumps(code),
                          _mode=0o600 | readable)
        return code


def _cache_dir(path: str) -> None:
    """Create ``__pycache__`` never writable by others: ``set_data`` makes it with Python's
    0o777 masked by the umask, so a host started under umask 000 left one any local user
    could put a .pyc in, which this loader refuses but plain ``python`` (the project's own
    tests, a script) runs as the project's user. So are the missing directories above it
    (under ``PYTHONPYCACHEPREFIX`` the cache is a tree of its own; os.makedirs gives its
    ``mode`` to the last one only). Existing ones are left as they are."""
    missing: list[str] = []
    while path and not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for each in reversed(missing):
        with contextlib.suppress(OSError):  # made meanwhile, or not ours to make: set_data's
            os.mkdir(each, 0o755)  # the umask only removes bits: never more than 0o755


def _cached_code(cached: str, key: bytes, readable: int = 0o044) -> CodeType | None:
    """The code in ``cached`` when it is a hash-based .pyc of this Python for source whose
    hash is ``key``, else None (absent, timestamp-based, stale, foreign or damaged).

    Only a file of this user's that no one else may write is taken: its source hash says
    which source it claims to be compiled from, not that its code is that source's. A host
    started under a lax umask (000) left ``__pycache__`` writable by all, and another user's
    .pyc carrying the right hash ran their code in every later start and doctor. Nor one
    that others may read beyond ``readable`` (the source's group and other read bits): not
    taken, it is written again with the source's (a 0600 source's cache, written 0644 by an
    intloom before 2026-12-05, or before a ``chmod`` of the source, stayed readable)."""
    try:
        fd = os.open(cached, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid()
                or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
                or st.st_mode & 0o044 & ~readable):
            return None
        with open(fd, "rb", closefd=False) as fh:
            data = fh.read()
    except OSError:
        return None
    finally:
        os.close(fd)
    if (len(data) <= _PYC_HEAD or data[:4] != importlib.util.MAGIC_NUMBER
            or not int.from_bytes(data[4:8], "little") & 0b1 or data[8:16] != key):
        return None
    try:
        code = marshal.loads(data[_PYC_HEAD:])
    except (EOFError, ValueError, TypeError):
        return None
    return code if isinstance(code, CodeType) else None


class _SourceTrees(importlib.abc.MetaPathFinder):
    """Finds the modules of the Workflows' source trees (the entries, the sibling modules
    they import, and what their Steps import later) as Python would, and loads them with
    ``_FromSource``: the code that runs is the code the identity hashed. Everything else
    (the standard library, installed packages) is left to the usual finders and caches."""

    def __init__(self) -> None:
        self.roots: set[Path] = set()
        # While load_workflows runs: the bytes each tree module was compiled from, by path
        # (as spelled, and resolved). The identity hashes these, not the file as it is when
        # hashed: a file saved between its import and the hashing would otherwise give the
        # code that runs the identity of other bytes.
        self.compiled: dict[str, bytes] | None = None
        # While load_workflows runs: the bytes read of the tree files not (yet) imported, by
        # path, with their lstat then (``workflow_identity``'s ``reads``): every single-file
        # Workflow of a directory hashes the whole directory, and each read every file again
        # (300 files: 44,850 reads; ``Reads``).
        self.reads: Reads | None = None
        # Each loaded Workflow's tree (root -> "name version"), and the bytes its identity
        # took of each Python file there, by path: a module a Step imports only once it
        # runs is compiled from them (``kept_source``), or the Run would run code its
        # journal's identity does not name (start says the host runs the code it loaded).
        # Python files only: a tree's other files (data, docs) are hashed, never imported.
        self.loaded_roots: dict[str, str] = {}
        self.sources: dict[str, bytes] = {}
        # ``sources`` indexed for ``_kept_spec``, as of ``_kept_for`` files (it only grows).
        self._kept_index: dict[str, dict[str, list[tuple[str, bool]]]] = {}
        self._kept_for = 0
        # Each loaded tree's project root (resolved), which paths in Run errors are shown
        # relative to (``raised_at``).
        self.projects: dict[str, Path] = {}

    def kept_source(self, path: str) -> bytes | None:
        """The bytes a loaded Workflow's identity took of the Python file at ``path``, once
        the load is over (``compiled`` is None); None for a file it did not take."""
        if self.compiled is not None or not self.sources:
            return None
        kept = self.sources.get(os.path.normpath(path))
        if kept is None:  # the same file spelled another way (a link, ``..``)?
            real = os.path.realpath(path)
            kept = next((data for other, data in self.sources.items()
                         if os.path.realpath(other) == real), None)
        return kept

    def refuse_added(self, path: str) -> None:
        """Refuse a module imported after the load (``compiled`` is None then) from a loaded
        Workflow's tree whose identity took no bytes of it (``kept_source``): added since.
        A tree no Workflow was loaded from is left as it was."""
        if self.compiled is not None or not self.loaded_roots:
            return
        spelled = os.path.normpath(path)
        label = next((label for root, label in self.loaded_roots.items()
                      if in_source_tree(Path(root), Path(spelled))
                      or in_source_tree(Path(os.path.realpath(root)),
                                        Path(os.path.realpath(path)))), None)
        if label is None:
            return
        raise ImportError(
            f"{path} changed since the host loaded Workflow {label} (it was not in the source "
            "tree then); its identity covers this file, so running it now would run code the "
            "Run's journal does not name. Nothing of it ran. To load the change: intloom "
            "stop, then intloom start (unfinished Runs of the changed Workflow are then "
            "held), or remove the file.", name=None, path=path)

    def compiled_from(self, path: str, source: bytes) -> None:
        if self.compiled is not None:
            # The first: a module imported again under another name is rare, and the first
            # is the one every later ``import`` of its usual name gets from sys.modules.
            self.compiled.setdefault(os.path.normpath(path), source)
            self.compiled.setdefault(os.path.realpath(path), source)

    def find_spec(self, fullname: str, path: Any = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if not self.roots:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        kept = self._kept_spec(fullname, path, spec)
        if kept is not None:
            return kept
        loader = spec.loader if spec is not None else None
        if (spec is None or type(loader) is not importlib.machinery.SourceFileLoader
                or spec.origin is None):
            return self._as_found(spec)
        origin = Path(spec.origin)
        if not any(in_source_tree(root, origin) for root in self.roots):
            # The same file by another spelling: a tree named through ``..`` or a linked
            # directory, whose module puts ``os.path.abspath`` or ``resolve()`` of its own
            # directory on sys.path (the roots are also registered resolved).
            real = Path(os.path.realpath(origin))
            if real == origin or not any(in_source_tree(root, real) for root in self.roots):
                return self._as_found(spec)
        spec.loader = _FromSource(fullname, spec.origin)
        return spec

    def _kept_spec(self, fullname: str, path: Any,
                   found: importlib.machinery.ModuleSpec | None
                   ) -> importlib.machinery.ModuleSpec | None:
        """A module of a loaded tree whose file is gone since the load (removed, or renamed
        by a checkout or a git pull), from the bytes the Workflow's identity took of it
        (``kept_source``), as an edit of the file is: the path finder no longer saw it, and
        a Step importing it failed its Run for good, or got what the name finds now (an
        empty namespace package where a folder of that name is left, a stale ``.pyc``, a
        module of that name further down ``sys.path``). Taken when it comes, in path order,
        before what the path finder ``found``, a package before a module, as at the load."""
        if self.compiled is not None or not self.sources:
            return None
        kept = self._kept_files().get(fullname.rpartition(".")[2])
        if kept is None:
            return None  # no loaded tree has a file of that name: most imports
        before = _entry_of(found)
        for entry in sys.path if path is None else path:
            if not isinstance(entry, str):
                continue
            base = os.path.normpath(os.path.abspath(entry or os.curdir))
            files = kept.get(base)
            if files is None:
                # A tree reached by another spelling (a linked directory, ``..``), as its
                # module may put ``realpath`` of its own directory on sys.path.
                files = kept.get(os.path.realpath(base))
            for rel, package in files or ():
                file = os.path.join(base, rel)
                if os.path.lexists(file):
                    return None  # there: the path finder's, whose loader takes kept bytes
                return importlib.util.spec_from_file_location(
                    fullname, file, loader=_FromSource(fullname, file),
                    submodule_search_locations=[os.path.dirname(file)] if package else None)
            if base == before:
                return None  # what the path finder found comes first, as at the load
        return None

    def _kept_files(self) -> dict[str, dict[str, list[tuple[str, bool]]]]:
        """The kept Python files by module name, then by the directory a ``sys.path`` or
        ``__path__`` entry names to find them (as spelled, and resolved), each as its path
        there and whether it is a package's ``__init__.py``, a package first."""
        if self._kept_for != len(self.sources):
            index: dict[str, dict[str, list[tuple[str, bool]]]] = {}
            for file in self.sources:
                head, tail = os.path.split(file)
                package = tail == "__init__.py"
                base, name = os.path.split(head) if package else (head, tail[:-3])
                rel = os.path.join(name, "__init__.py") if package else tail
                for spelled in dict.fromkeys((base, os.path.realpath(base))):
                    found = index.setdefault(name, {}).setdefault(spelled, [])
                    if package:
                        found.insert(0, (rel, True))
                    else:
                        found.append((rel, False))
            self._kept_index, self._kept_for = index, len(self.sources)
        return self._kept_index

    def _as_found(self, spec: importlib.machinery.ModuleSpec | None
                  ) -> importlib.machinery.ModuleSpec | None:
        """A module outside the trees, as the path finder found it, when that finder comes
        next on sys.meta_path: letting it run would only search the same path entries again
        (a Step lazily importing ~300 modules paid 20-30 ms for that). None when another
        finder sits between (an import hook inserted later), which must still be asked."""
        meta = sys.meta_path
        try:
            at = meta.index(self)
        except ValueError:
            return None
        if at + 1 < len(meta) and meta[at + 1] is importlib.machinery.PathFinder:
            return spec
        return None


def _entry_of(spec: importlib.machinery.ModuleSpec | None) -> str | None:
    """The path entry the path finder found ``spec`` in; None for nothing found, or for a
    namespace package (a module file anywhere on the path comes before its portions)."""
    if spec is None or spec.origin is None or not spec.has_location:
        return None
    where = os.path.dirname(spec.origin)
    if spec.submodule_search_locations is not None:
        where = os.path.dirname(where)
    return os.path.normpath(os.path.abspath(where))


_TREES: Final = _SourceTrees()


def _from_source(entry: Path) -> None:
    """Loads what ``entry``'s source tree holds with ``_FromSource`` from now on."""
    try:
        root = source_root(entry)
    except OSError:
        # A path the OS will not examine (a name over 255 bytes): no module comes from it,
        # and _load_entry names it as this source's failure; raising here stopped them all.
        return
    _TREES.roots.add(root)
    _TREES.roots.add(Path(os.path.realpath(root)))  # see _SourceTrees.find_spec
    if _TREES not in sys.meta_path:
        # Just before the path finder, whose work it does: built-in and frozen modules are
        # still found first, as without it.
        at = next((i for i, finder in enumerate(sys.meta_path)
                   if finder is importlib.machinery.PathFinder), len(sys.meta_path))
        sys.meta_path.insert(at, _TREES)


def _import(root: Path, entry: Path) -> tuple[ModuleType, bool]:
    """The entry's module, and whether its import made a second copy of the package under
    its own name (``_second_copy``)."""
    digest = hashlib.sha256(str(entry).encode()).hexdigest()[:12]
    # Only a module of that name that this import made is a copy of its making: another
    # entry may import the package by its name, from the project root, as it may.
    there = entry.name in sys.modules
    if entry.is_dir():
        init = entry / "__init__.py"
        if not init.is_file():
            raise IntloomError(
                "WORKFLOW_LOAD_FAILED",
                f"{entry} is a directory without __init__.py. Name a .py file or a package.",
            )
        module_name = f"{WORKFLOW_MODULE_PREFIX}{digest}"
        spec = importlib.util.spec_from_file_location(
            module_name, init, loader=_FromSource(module_name, str(init)),
            submodule_search_locations=[str(entry)],
        )
    else:
        module_name = f"{WORKFLOW_MODULE_PREFIX}{digest}"
        spec = importlib.util.spec_from_file_location(
            module_name, entry, loader=_FromSource(module_name, str(entry)))
    if spec is None or spec.loader is None:
        raise IntloomError("WORKFLOW_LOAD_FAILED", f"{entry} cannot be imported as Python.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except IntloomError as exc:  # a definition mistake, raised by the call that made it
        sys.modules.pop(module_name, None)
        raise _told_of_copy(entry, _placed(root, exc, _innermost(root, exc.__traceback__)),
                            there) from None
    except LoadInterrupted:
        # The host's stop signal (host/daemon.py) or a real Ctrl-C here (_real_interrupts)
        # must end the import.
        sys.modules.pop(module_name, None)
        raise
    # A module's SystemExit (sys.exit(), argparse reading intloom's command line),
    # KeyboardInterrupt or any other BaseException (a class of its own, CancelledError,
    # pytest.skip's) is contained as a Step's is (executor/driver.py, _contained): it would
    # otherwise end the host, or the doctor and inspect that import it, with every Workflow.
    except BaseException as exc:
        sys.modules.pop(module_name, None)
        starved = isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)
        twin = None if there else _second_copy(entry)
        raise (SourceStarved if starved else IntloomError)(
            "WORKFLOW_LOAD_FAILED", f"Importing {entry} failed: {_failure(root, exc)}. "
            f"{_fix(exc, root)}{'' if twin is None else f' {twin}'}",
        ) from None
    return module, not there and _second_copy(entry) is not None


def _told_of_copy(entry: Path, exc: IntloomError, there: bool) -> IntloomError:
    """``exc``, a definition mistake of ``entry``, with ``_second_copy``'s words if they
    apply: the mistake may be the copy's doing. ``there``: a module of the package's name
    was there before its import, so no copy is of its making."""
    twin = None if there else _second_copy(entry)
    if twin is None:
        return exc
    return IntloomError(exc.code, f"{exc.message} {twin}", retryable=exc.retryable)


def _second_copy(entry: Path) -> str | None:
    """What to say when the package ``entry`` failed to load after a module of it imported
    it by its own name: that import made a second copy of the package (it is loaded under a
    private name, ``_import``), and the copy's Stages and classes are not the loaded ones.
    The load then failed with a fact that reads as false ("the Stage has no Step": its Steps
    were declared on the copy's Stage), or ``Step 'go' is defined twice``. None otherwise."""
    if not entry.is_dir():
        return None
    copy = sys.modules.get(entry.name)
    where = getattr(copy, "__file__", None)
    if not isinstance(where, str):
        return None
    try:
        inside = Path(os.path.realpath(where)).is_relative_to(os.path.realpath(entry))
    except (OSError, ValueError):
        return None
    if not inside:
        return None
    name = entry.name
    return (f"A module of {name}/ imports the package by its own name (import {name}, from "
            f"{name}.x import y): intloom loads a package entry under a private name, so that "
            "import ran a second copy of the package, whose Stages and classes are not the "
            f"loaded ones. Import within the package relatively (from . import x, from .x "
            "import y).")


class SourceStarved(IntloomError):
    """WORKFLOW_LOAD_FAILED for want of file descriptors while a source was imported, or
    while the import was set up (none was imported): the process's limit, not the module
    (``LoadResult.starved``)."""


def _beside(exc: ImportError, root: Path) -> str | None:
    """For an import of a module of the project that was not found, though it is a file
    beside the module that imports it (``from helpers import x`` in workflows/a.py, with
    workflows/helpers.py there) or a relative import in a single-file entry: how to import
    it. "pip install helpers" was said first: a stranger's package of that name, maybe."""
    where = _innermost(root, exc.__traceback__)
    if where is None:
        return None
    importer = root.resolve() / where[0]
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        top = exc.name.partition(".")[0]
        folder = importer.parent
        found = next((c for c in (folder / f"{top}.py", folder / top / "__init__.py")
                      if c.is_file()), None)
        if found is None or folder == root.resolve():
            return None
        parts = folder.relative_to(root.resolve()).parts
        beside = (f"{found.relative_to(root.resolve()).as_posix()} is beside {where[0]}, but "
                  "a Workflow's modules are imported from the project's root, which is on "
                  "sys.path, not from their own directory")
        if not all(part.isidentifier() and not keyword.iskeyword(part) for part in parts):
            # my-flows/ or 2026/ is no package name: "import my-flows.helpers" is no Python.
            return (f"{beside}, and {'/'.join(parts)}/ is no Python package name: rename the "
                    "directory to one (letters, digits and _, not first a digit), then import "
                    "the module by its path from the root; or list the directory as a package "
                    "entry (with an __init__.py) and import it relatively (from . import "
                    f"{top}). Then restart the host.")
        package = ".".join(parts)
        return (f"{beside}: import it as {package}.{top} (from {package}.{top} import ..., or "
                f"from {package} import {top}). Then restart the host.")
    if "no known parent package" in str(exc):
        parts = importer.parent.relative_to(root.resolve()).parts
        absolute = (f"from {'.'.join(parts)}.x import ..." if parts and all(
            part.isidentifier() for part in parts) else "from x import ..." if not parts
            else "from a directory named as a Python package")
        return (f"{where[0]} is imported as a single file, not as a module of a package, so a "
                "relative import (from .x import ...) has no package to start from: import "
                f"the module by its path from the project's root ({absolute}), or list the "
                "directory as a package entry (with an __init__.py). Then restart the host.")
    return None


# A decorator of intloom's called the wrong way (a bare @stage.step, @stage.init()): the
# TypeError Python raises names the missing argument, not how the decorator is written.
_DECORATOR_USE: Final = {
    "Stage.step()": 'Declare a Step as @stage.step("name", routes={"outcome": "next_step"}) '
                    "above its def (routes map each outcome it returns to a Step, "
                    "intloom.ToStage(...) or intloom.COMPLETE)",
    "Stage.agent_step()": 'Declare an Agent Step as @stage.agent_step("name", '
                          'routes={"outcome": ...}) above its def',
    "Stage.init()": "Write @stage.init without parentheses, above def init(ctx) -> State",
}


def _fix(exc: BaseException, root: Path | None = None) -> str:
    if isinstance(exc, ImportError) and root is not None:
        beside = _beside(exc, root)
        if beside is not None:
            return beside
    if isinstance(exc, TypeError):
        use = next((u for call, u in _DECORATOR_USE.items() if str(exc).startswith(call)),
                   None)
        if use is not None:
            return f"{use}. Then restart the host."
    if isinstance(exc, _ExitCalled):
        return ("A Workflow module must not end the process when it is imported (os._exit() "
                "skips every handler: it would end the host, with every Workflow, without a "
                'word): put script code under `if __name__ == "__main__":`, then restart the '
                "host.")
    if isinstance(exc, SystemExit):
        return ("A Workflow module must not exit the process when it is imported (sys.exit(), "
                "or argparse's parse_args() reading intloom's command line): put script code "
                'under `if __name__ == "__main__":`, then restart the host.')
    if isinstance(exc, KeyboardInterrupt):
        return ("A Workflow module must not raise KeyboardInterrupt when it is imported: raise "
                "an exception instead, then restart the host.")
    if not isinstance(exc, Exception):
        return (f"A Workflow module must not raise {type(exc).__name__} (a BaseException, "
                "which the process keeps for itself) when it is imported: raise an exception "
                "instead, then restart the host.")
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        # The host runs the interpreter intloom is installed in (a venv, a pipx one): a
        # package installed for another Python is not found, and "fix the module" said
        # nothing of where to install it.
        top = exc.name.partition(".")[0]
        return (f"If {top!r} is a package, install it for the Python the host runs: "
                f"{shlex.quote(sys.executable)} -m pip install {shlex.quote(top)} (the name to "
                "install may differ from the module's: PyYAML provides yaml); if it is a "
                "module of the project, check its name and place. Then restart the host.")
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        # The process's limit, not the module: "Fix the module" sent the user to code that
        # may be fine (and doctor then held its Runs as if the source had changed).
        said = _out_of_descriptors(exc.errno)
        return f"{said[:1].upper()}{said[1:]}, while importing it: not the module's fault."
    return "Fix the module and restart the host."


def _out_of_descriptors(code: int | None) -> str:
    """What ran out, and the fix: the process's limit (EMFILE), which ``ulimit -n`` raises,
    or the system's file table (ENFILE), which it does not."""
    if code == errno.ENFILE:
        return ("the system's table of open files is full (ENFILE): close programs that hold "
                "many files, or raise fs.file-max, then run the command again")
    import resource

    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return ("the process ran out of file descriptors (EMFILE): raise ulimit -n in the "
                "shell and run the command again")
    more = max(1024, soft * 2)
    if hard != resource.RLIM_INFINITY:
        more = min(more, hard)
    fix = (f"raise it (ulimit -n {more}) in the shell and run the command again"
           if more > soft else "its hard limit allows no more: raise that (as root), or run "
           "fewer programs in this shell")
    return f"the process ran out of file descriptors (EMFILE; ulimit -n is {soft}): {fix}"


def _shown(root: Path, filename: str) -> str | None:
    """``filename`` relative to the project, or None when it is not a project file: frames of
    ``<frozen importlib._bootstrap>`` or ``<string>`` name no file (resolved, such a name
    would pass as a relative path under the working directory), and a package installed in a
    virtualenv inside the project (intloom's own files among them) is not the author's: the
    frame to name is the project file that called it."""
    if not filename or (filename.startswith("<") and filename.endswith(">")):
        return None
    path = Path(filename)
    if not path.is_absolute():
        return None
    resolved = path.resolve()
    if not resolved.is_relative_to(root) or in_virtualenv(root, resolved):
        return None
    return resolved.relative_to(root).as_posix()


def _innermost(root: Path, tb: TracebackType | None) -> tuple[str, int] | None:
    """The innermost frame of a project file (relative path, line): the one to look at."""
    root = root.resolve()
    found = None
    while tb is not None:
        shown_file = _shown(root, tb.tb_frame.f_code.co_filename)
        if shown_file is not None:
            found = (shown_file, tb.tb_lineno)
        tb = tb.tb_next
    return found


def raised_at(tb: TracebackType | None) -> tuple[str, int] | None:
    """Where in a loaded Workflow's source tree user code raised: the innermost frame of
    ``tb`` there (its path relative to the project, line), not intloom's own frames nor a
    library's, which the author did not write. None when no frame is in a loaded tree."""
    trees = [(Path(tree), project) for tree, project in _TREES.projects.items()]
    if not trees:
        return None
    shown: dict[str, str | None] = {}  # by file: a deep recursion repeats its files
    found = None
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name not in shown:
            shown[name] = _in_tree(trees, name)
        file = shown[name]
        if file is not None:
            found = (file, tb.tb_lineno)
        tb = tb.tb_next
    return found


def _in_tree(trees: list[tuple[Path, Path]], name: str) -> str | None:
    """``name`` (a frame's file) relative to its project, when it is in one of ``trees``."""
    path = Path(name)
    if not path.is_absolute():  # <frozen ...>, <string>
        return None
    real = Path(os.path.realpath(path))
    for tree, project in trees:
        if in_source_tree(tree, path) or in_source_tree(Path(os.path.realpath(tree)), real):
            return _shown(project, name)
    return None


def _placed(root: Path, exc: IntloomError, at: tuple[str, int] | None) -> IntloomError:
    """``exc`` naming the file and line it is about (``at``: a project file, or an
    absolute path ``_shown`` makes relative), first: "Step 'a' is defined twice" or a
    route to a Step that does not exist said where in which file only by its names."""
    if at is None:
        return exc
    shown = _shown(root.resolve(), at[0]) if os.path.isabs(at[0]) else at[0]
    if shown is None:
        return exc
    return IntloomError(exc.code, f"{shown}, line {at[1]}: {exc.message}",
                        retryable=exc.retryable)


_PACKAGE: Final = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _raised_in_intloom(exc: BaseException) -> str | None:
    """``intloom/<module>.py line N`` when the innermost frame of ``exc`` is intloom's own
    (checking a loaded Workflow, not running its code), else None: a fault there was called
    a Workflow's ("Fix the definition"), as with a msgspec too old for intloom."""
    tb = exc.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    path = os.path.abspath(tb.tb_frame.f_code.co_filename)
    if not path.startswith(_PACKAGE + os.sep):
        return None
    shown = os.path.relpath(path, os.path.dirname(_PACKAGE))
    return f"{shown} line {tb.tb_lineno}"


def _failure(root: Path, exc: BaseException) -> str:
    """The exception's type and message, and where in the project it was raised."""
    root = root.resolve()
    if isinstance(exc, SyntaxError):
        # A SyntaxError is raised by the compiler, not from a frame of the bad file: its
        # traceback ends in importlib. The file, line and text are on the exception itself.
        where = _shown(root, exc.filename or "") or exc.filename or "the module"
        at = f"{where}, line {exc.lineno}" if exc.lineno else where
        if exc.lineno and exc.offset:
            at += f", column {exc.offset}"
        text = (exc.text or "").strip()
        shown = f": `{clip(text, 500)}`" if text else ""
        return f"{type(exc).__name__}: {clip(str(exc.msg), 500)} ({at}){shown}"
    innermost = _innermost(root, exc.__traceback__)
    where = f" (line {innermost[1]} of {innermost[0]})" if innermost else ""
    # An exit or interrupt is named as the driver names a Step's (``SystemExit(2)``).
    # An exception without a message is named alone (``raise ValueError``), as a Step's is.
    text = message_of(exc) if isinstance(exc, Exception) else ""
    what = (f"os._exit({exc.code!r})" if isinstance(exc, _ExitCalled)
            else f"{type(exc).__name__}: {text}" if text
            else type(exc).__name__ if isinstance(exc, Exception) else as_call(exc))
    # Cut: the message is shown by start, status and flows (MAX_MESSAGE, docs/authoring.md).
    return f"{clip(what)}{where}"


class _ExitCalled(BaseException):
    """``os._exit(code)`` called by a module while it was imported (``_exits_contained``)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@contextlib.contextmanager
def _exits_contained() -> Iterator[Callable[[], None]]:
    """While the modules import, ``os._exit`` in the importing thread raises ``_ExitCalled``,
    a load failure of that source as ``sys.exit()`` is: it ended the host with the other
    Workflows, and doctor, inspect and start --foreground with no word at all (exit status
    0 for ``os._exit(0)``), as no Python code runs after it. A process the module forked, or
    another thread, gets the real one, and so does a call after the imports through a
    reference taken meanwhile (``from os import _exit``). Yields what to call after each
    import: a process the module forked that went on out of it (``if os.fork(): os._exit(0)``,
    a module that daemonizes) ends there, rather than go on as a second host, doctor..."""
    real = os._exit
    pid, thread = os.getpid(), threading.current_thread()
    active = True

    def contained(code: int) -> NoReturn:
        if not active or os.getpid() != pid or threading.current_thread() is not thread:
            real(code)
        raise _ExitCalled(code)

    def strayed() -> None:
        if os.getpid() != pid:
            with contextlib.suppress(Exception):
                sys.stderr.write(f"intloom: process {os.getpid()}, forked by a Workflow module "
                                 "while it was imported, went on out of its import; it ends "
                                 "here (the process that imported it goes on).\n")
                sys.stderr.flush()
            real(1)

    setattr(os, "_exit", contained)  # noqa: B010 -- mypy refuses assigning a module function
    try:
        yield strayed
    finally:
        active = False
        setattr(os, "_exit", real)  # noqa: B010


class _Interrupted(LoadInterrupted):
    """A Ctrl-C while the modules import (see ``_real_interrupts``)."""


@contextlib.contextmanager
def _real_interrupts() -> Iterator[None]:
    """A module's own KeyboardInterrupt is a load failure (``_import``), but a Ctrl-C
    pressed while a CLI command (doctor, inspect) imports must still stop that command: it
    arrives as ``_Interrupted``, which the loader does not contain, and leaves as the
    KeyboardInterrupt the CLI expects. Only where SIGINT has Python's default handler on the
    main thread: the host installs its own around the imports (host/daemon.py)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise _Interrupted

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    except _Interrupted:
        raise KeyboardInterrupt from None
    finally:
        signal.signal(signal.SIGINT, previous)


def load_workflows_offline(root: Path, config: Config) -> LoadResult:
    """``load_workflows`` for the read-only tools (doctor, inspect): no bytecode is written,
    and what the modules write while they are imported is shown on stderr afterwards, under
    a line saying whose it is (``_their_output``), so that the one JSON document a ``--json``
    command writes to stdout stays whole."""
    saved = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        # The notice writes to stderr as it was before _their_output takes it over.
        with slow_import_notice() as progress, _their_output(), _in_directory(root), \
                _stdin_at_end():
            return load_workflows(root, config, progress=progress)
    except OSError as exc:
        if exc.errno not in (errno.EMFILE, errno.ENFILE):
            raise
        # Setting the import up (its output's spool, stdin on /dev/null) took descriptors
        # a low ulimit -n did not leave: CLI_INTERNAL_ERROR, exit 70, "report it", was said.
        # SourceStarved: doctor's next step is the limit, not "fix the Workflow sources".
        raise SourceStarved(
            "WORKFLOW_LOAD_FAILED",
            f"The Workflow sources were not imported: {_out_of_descriptors(exc.errno)}.",
        ) from None
    finally:
        sys.dont_write_bytecode = saved


# A source still importing after this many seconds is named on stderr. Test hook: the
# environment variable below, in seconds.
_SLOW_IMPORT_S: Final = 10.0
IMPORT_NOTICE_ENV: Final = "INTLOOM_TEST_IMPORT_NOTICE"


def slow_import_after() -> float:
    """Seconds after which a source still importing is named (doctor, inspect, start)."""
    return float(os.environ.get(IMPORT_NOTICE_ENV) or _SLOW_IMPORT_S)


@contextlib.contextmanager
def slow_import_notice() -> Iterator[Callable[[str | None], None]]:
    """A module that waits or loops when imported (a network call, a lock, a prompt on
    another stream) kept doctor, inspect and ``start --foreground`` silent forever: a
    watcher names the source they are stuck in, once, and how to stop. Yields
    ``progress(rel)``: the source being imported now, None between sources."""
    after = slow_import_after()
    try:
        fd = os.dup(2)
    except OSError:  # no stderr to tell
        yield lambda _rel: None
        return
    current: list[tuple[str, float] | None] = [None]
    done = threading.Event()

    def progress(rel: str | None) -> None:
        current[0] = None if rel is None else (rel, time.monotonic())

    def watch() -> None:
        told: tuple[str, float] | None = None
        while not done.wait(min(after, 1.0)):
            now = current[0]
            if now is None or now is told or time.monotonic() - now[1] < after:
                continue
            told = now
            shown = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in now[0])
            line = (f"Still importing {shown} after {after:g} s: a Workflow source that waits "
                    "or loops while it is imported keeps this command (and every intloom "
                    f"start) waiting. Ctrl-C stops it; check what {shown} does when it is "
                    "imported.\n")
            with contextlib.suppress(OSError):
                os.write(fd, line.encode("utf-8", "backslashreplace"))

    watcher = threading.Thread(target=watch, name="intloom-import-notice", daemon=True)
    watcher.start()
    try:
        yield progress
    finally:
        done.set()
        watcher.join()
        os.close(fd)


@contextlib.contextmanager
def _stdin_at_end() -> Iterator[None]:
    """The host imports the modules with stdin on /dev/null: so do the read-only tools. A
    module calling ``input()`` when imported (a key missing from the environment) fails to
    load in the host (EOFError), while doctor sat waiting on the terminal behind a prompt it
    had set aside with the module's output, and what was typed made it say the source
    loads. Descriptor 0 and ``sys.stdin`` are both put back afterwards."""
    try:
        kept: int | None = os.dup(0)
    except OSError:  # no stdin at all: reading it fails as at /dev/null
        kept = None
    try:
        empty = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        if kept is not None:
            os.close(kept)
        raise
    previous = sys.stdin
    try:
        os.dup2(empty, 0)
        with open(os.devnull, encoding="utf-8") as nothing:
            sys.stdin = nothing
            try:
                yield
            finally:
                sys.stdin = previous
    finally:
        if kept is not None:
            os.dup2(kept, 0)
            os.close(kept)
        else:
            with contextlib.suppress(OSError):
                os.close(0)
        os.close(empty)


@contextlib.contextmanager
def _in_directory(root: Path) -> Iterator[None]:
    """The host imports the modules in the project root (its working directory): so do the
    read-only tools, or a module reading ``data/prompt.txt`` when imported failed to load in
    doctor run from a subdirectory (or with --project from elsewhere) though the host loads
    it. The command's own working directory is put back afterwards."""
    try:
        previous = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:  # the working directory is gone or unreadable: nothing to put back
        previous = None
    try:
        os.chdir(root)
    except OSError:
        if previous is not None:
            os.close(previous)
        yield
        return
    try:
        yield
    finally:
        if previous is not None:
            with contextlib.suppress(OSError):
                os.fchdir(previous)
            os.close(previous)


# What is shown of the modules' output, at most.
_THEIR_OUTPUT_SHOWN: Final = 64 * 1024


def _spool() -> IO[bytes]:
    """An anonymous file to hold what the imports write. In memory where the system has
    one (memfd): on a full disk, where doctor and inspect are needed most, no temporary
    directory was usable and both failed as an internal error (exit 70)."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None:
        with contextlib.suppress(OSError):
            return open(memfd_create("intloom-import-output", os.MFD_CLOEXEC), "w+b")
    return tempfile.TemporaryFile()


@contextlib.contextmanager
def _their_output() -> Iterator[None]:
    """Everything the imported modules write -- ``print``, ``sys.stderr``, and file
    descriptors 1 and 2 themselves (``os.write``, a C library's banner, a program they run)
    -- goes to a spool meanwhile, and then to stderr under a line naming it as theirs:
    fd 1 would break a ``--json`` document, and argparse's ``usage: intloom ... error:
    unrecognized arguments: doctor --json`` read as intloom refusing its own command line."""
    for stream in (sys.__stdout__, sys.__stderr__, sys.stdout, sys.stderr):
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):
                stream.flush()  # what was written before goes where it was meant to
    kept: list[tuple[int, int]] = []
    with _spool() as spool:
        try:
            for fd in (1, 2):
                with contextlib.suppress(OSError):  # a descriptor the caller closed: none
                    kept.append((fd, os.dup(fd)))
                    os.dup2(spool.fileno(), fd)
            text = open(spool.fileno(), "w", buffering=1, encoding="utf-8",  # noqa: SIM115
                        errors="replace", closefd=False)
            with text, contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
                yield
        finally:
            for stream in (sys.__stdout__, sys.__stderr__):
                if stream is not None:
                    with contextlib.suppress(OSError, ValueError):
                        stream.flush()  # written during the import: theirs too
            for fd, saved in kept:
                os.dup2(saved, fd)
                os.close(saved)
            spool.seek(0)
            data = spool.read(_THEIR_OUTPUT_SHOWN + 1)
            if data.strip():
                shown = data[:_THEIR_OUTPUT_SHOWN].decode("utf-8", "replace").rstrip("\n")
                more = " (cut at 64 KiB)" if len(data) > _THEIR_OUTPUT_SHOWN else ""
                with contextlib.suppress(OSError, ValueError):
                    sys.stderr.write(
                        f"Workflow sources wrote this while they were imported{more}:\n"
                        + textwrap.indent(shown, "  | ", lambda line: True) + "\n")
                    sys.stderr.flush()


def _source_key(entry: Path) -> Path:
    """What makes two entries one source: the real path of the directories leading to it
    (``lnkdir/x.py`` with lnkdir a link to workflows/ is workflows/x.py), and a package's
    ``__init__.py`` is its package. Compared by spelling only (normpath), such a pair was
    two sources defining the same Workflows: neither loaded, and the message said to
    delete the "copy" or rename its Workflow. The entry itself is not resolved: a link
    there is refused as one (_load_entry), not reported as a repeat of its target."""
    spelled = Path(os.path.normpath(entry))
    key = Path(os.path.realpath(spelled.parent)) / spelled.name
    if key.name == "__init__.py" and not key.is_symlink():
        return key.parent
    return key


def load_workflows(root: Path, config: Config, *,
                   progress: Callable[[str | None], None] | None = None) -> LoadResult:
    """Import every entry and register its Workflows. Problems are collected, not raised.
    ``progress`` is told each entry as its import begins, and None once it ended."""
    result = LoadResult()
    if str(root) not in sys.path:
        # Lets a Workflow import sibling modules of the project, as a script would.
        sys.path.insert(0, str(root))
    listed: dict[Path, str] = {}  # each source's path -> its first entry
    for rel in config.workflows:
        # Every tree before any import: an entry may import a module of a later entry's
        # tree, which must not run from its __pycache__ either.
        _from_source(root / rel)
    # Each entry's Workflows, or why it failed: registered only once every entry is read, so
    # that a Workflow two sources define is found whichever order intloom.toml lists them in.
    sources: list[tuple[str, Path, dict[str, LoadedWorkflow] | ErrorView]] = []
    repeated: set[int] = set()  # the indexes in ``sources`` of entries listed again
    with _real_interrupts(), _exits_contained() as strayed, _compiled_kept():
        for rel in config.workflows:
            entry = root / rel
            # The same source listed twice (or spelled two ways) is one source: importing it
            # again would run its module twice and report its Workflows as defined twice.
            key = _source_key(entry)
            first = listed.get(key)
            if first is not None:
                same = "twice" if first == rel else f"twice (as {first!r} and {rel!r})"
                repeated.add(len(sources))
                sources.append((rel, entry, IntloomError(
                    "WORKFLOW_LOAD_FAILED",
                    f"{rel} is listed in intloom.toml {same}; it is loaded once, from the "
                    "first. Remove the repeated entry from 'workflows'.",
                ).view()))
                continue
            listed[key] = rel
            if progress is not None:
                progress(rel)
            try:
                sources.append((rel, entry, _load_entry(root, rel, entry)))
            except IntloomError as exc:
                if isinstance(exc, SourceStarved):
                    result.starved.append(rel)
                sources.append((rel, entry, exc.recordable()))
            except Exception as exc:  # a fault no check foresaw: this source only, named
                # _failure: str(exc) is user code (it raised out of the load, so that no
                # source loaded), and an exception without arguments read "raised X: ."
                ours = _raised_in_intloom(exc)
                sources.append((rel, entry, (IntloomError(
                    "CLI_INTERNAL_ERROR",
                    f"{rel}: checking its Workflows failed inside intloom, at {ours}: "
                    f"{_failure(root, exc)}. A fault of intloom or of a package it needs, not "
                    "of the Workflow: pip check shows a dependency of the wrong version; if "
                    "none is, report it with this message.",
                ) if ours is not None else IntloomError(
                    "WORKFLOW_DEFINITION_INVALID",
                    f"{rel}: checking its Workflows raised {_failure(root, exc)}. Fix the "
                    "definition and restart the host.",
                )).view()))
            finally:
                strayed()
                if progress is not None:
                    progress(None)
    _register(sources, result)
    result.failed = list(dict.fromkeys(
        rel for index, (rel, _entry, outcome) in enumerate(sources)
        if not isinstance(outcome, dict) and index not in repeated))
    return result


@contextlib.contextmanager
def _compiled_kept() -> Iterator[None]:
    """Keep the bytes the tree modules are compiled from (``_SourceTrees.compiled``) while
    the entries are imported and hashed, and forget them then: a Step importing a tree
    module later must not grow them for the host's life."""
    _TREES.compiled = {}
    _TREES.reads = Reads()
    try:
        yield
    finally:
        _TREES.compiled = None
        _TREES.reads = None


def _register(sources: list[tuple[str, Path, dict[str, LoadedWorkflow] | ErrorView]],
              result: LoadResult) -> None:
    """Add each source's Workflows to ``result``, or its problem. A Workflow name two sources
    define is loaded from neither: picking the first listed would continue its Runs on
    whichever copy intloom.toml happens to name first (or hold them as "changed"), when
    nothing tells which definition they belong to."""
    definers: dict[str, list[str]] = {}
    for rel, _entry, outcome in sources:
        if isinstance(outcome, dict):
            for name in outcome:
                definers.setdefault(name, []).append(rel)
    entries = {rel: entry for rel, entry, _outcome in sources}
    for rel, _entry, outcome in sources:
        if not isinstance(outcome, dict):
            result.problems.append((rel, outcome))
            continue
        shared = {name: definers[name] for name in outcome if len(definers[name]) > 1}
        if not shared:
            result.workflows.update(outcome)
            continue
        # The whole source is withheld, as any source that fails (_load_entry): a half-loaded
        # file would run some of its Workflows while start reports it as failed.
        imported = _imported(shared, sources, entries)
        # Imported: one Workflow object bound in several sources, not two definitions.
        said = ({name: _bound_in(name, home, importers) for name, home, importers in imported}
                if imported else {name: _defined_in(name, rels) for name, rels in shared.items()})
        facts = list(said.values())
        result.problems.append((rel, IntloomError(
            "WORKFLOW_DEFINITION_INVALID",
            _imported_message(rel, imported) if imported else
            _several_message(rel, facts, shared, entries),
        ).view()))
        for name in outcome:
            if name in shared:
                which = "neither" if len(shared[name]) == 2 else "none of them"
                result.withheld[name] = f"{said[name]}, so {which} is loaded"
            else:
                result.withheld.setdefault(
                    name, f"Workflow {name!r} is not loaded, since its source {rel} is not: "
                    f"{facts[0]}")


def _imported(shared: dict[str, list[str]],
              sources: list[tuple[str, Path, dict[str, LoadedWorkflow] | ErrorView]],
              entries: dict[str, Path]) -> list[tuple[str, str, list[str]]]:
    """(name, the source that declares it, the sources that bind it by importing it) for
    each shared name whose every binding was declared in one source's own file: the others
    imported that Workflow (``from workflows.b import wf``), which a top-level binding loads
    from them too. Empty unless that holds for every shared name."""
    found: list[tuple[str, str, list[str]]] = []
    for name, rels in shared.items():
        declared = {os.path.realpath(outcome[name].workflow.declared_in)
                    for rel, _entry, outcome in sources
                    if rel in rels and isinstance(outcome, dict)}
        if len(declared) != 1:
            return []
        [where] = declared
        home = [rel for rel in rels if _holds(entries[rel], where)]
        if len(home) != 1:
            return []
        found.append((name, home[0], [rel for rel in rels if rel != home[0]]))
    return found


def _holds(entry: Path, path: str) -> bool:
    """Whether the file ``path`` is the entry's own: the entry file, or in its package."""
    real = os.path.realpath(entry)
    return path == real or (os.path.isdir(real) and path.startswith(real + os.sep))


def _imported_message(rel: str, imported: list[tuple[str, str, list[str]]]) -> str:
    """The problem of ``rel`` when its Workflows are shared only because a source imports
    them: the copy advice ("keep one", "delete it") would have them delete the module
    that other source imports."""
    facts = [f"{_bound_in(name, home, importers)}, and a Workflow bound at the top level of "
             "a listed module is loaded from it" for name, home, importers in imported]
    homes = list(dict.fromkeys(home for _name, home, _others in imported))
    importers = sorted({other for _name, _home, others in imported for other in others})
    count = len(set(homes) | set(importers))
    modules = ", ".join(_module_of(home) for home in homes)
    return (f"{'; '.join(facts)}: so {'neither file is' if count == 2 else 'none of them is'} "
            f"loaded, and the Runs of {', '.join(repr(n) for n, _h, _o in imported)} are held. "
            f"In {' and '.join(importers)}, import the module ({modules}) and use its Workflow "
            "through it, rather than binding the Workflow itself at the top level; or take "
            f"{' and '.join(homes)} out of 'workflows' in intloom.toml; then restart the host "
            "(intloom stop, intloom start).")


def _bound_in(name: str, home: str, importers: list[str]) -> str:
    """The fact of a Workflow ``home`` declares that other sources import (``_imported``)."""
    return (f"Workflow {name!r} of {home} is also bound at the top level of "
            f"{' and '.join(importers)}, which import{'s' if len(importers) == 1 else ''} it")


def _module_of(rel: str) -> str:
    """``import workflows.b`` for the entry ``workflows/b.py``, as the project root on
    ``sys.path`` lets a module import it."""
    parts = list(Path(os.path.normpath(rel)).with_suffix("").parts)
    if not parts or ".." in parts or not all(part.isidentifier() for part in parts):
        return f"the module of {rel}"
    return f"import {'.'.join(parts)}"


def _defined_in(name: str, rels: list[str]) -> str:
    if len(rels) == 2:
        return f"Workflow {name!r} is defined in both {rels[0]} and {rels[1]}"
    return f"Workflow {name!r} is defined in {', '.join(rels[:-1])} and {rels[-1]}"


def _several_message(rel: str, facts: list[str], shared: dict[str, list[str]],
                     entries: dict[str, Path]) -> str:
    """The problem of source ``rel``, which defines Workflows other sources define too."""
    others = sorted({other for rels in shared.values() for other in rels if other != rel})
    one = len(others) == 1
    names = ", ".join(repr(name) for name in shared)
    text = (f"{'; '.join(facts)}, so {'neither file' if one else 'none of these files'} is "
            f"loaded, and the Runs of {names} are held: nothing tells which definition they "
            f"belong to. Keep one: take the other {'file' if one else 'files'} out of "
            "'workflows' in intloom.toml, or give each Workflow a name of its own; then "
            "restart the host (intloom stop, intloom start).")
    # A copy beside the original (workflows/order_copy.py) stays in the original's source
    # tree once unlisted or renamed, and so in its identity: the Runs would stay held.
    beside = [other for other in others
              if in_source_tree(source_root(entries[rel]), entries[other])
              or in_source_tree(source_root(entries[other]), entries[rel])]
    if beside:
        text += (f" {rel} and {', '.join(beside)} share a source tree, which a Workflow's "
                 "identity covers: a copy left there holds the Runs as changed, so delete it or "
                 "move it to a directory of its own.")
    return text


def _not_python(entry: Path) -> str | None:
    """What ``entry`` is when it cannot be a Workflow source, else None. Any file was run
    as Python: a listed FIFO held start and doctor until their deadline (reading it waited
    for a writer), and README.md or a listed intloom.toml was executed as code."""
    try:
        mode = os.stat(entry).st_mode
    except OSError:
        return None  # _import names what the OS says of it
    if stat.S_ISDIR(mode):
        return None
    special = special_file(mode)
    if special is not None:
        return special
    if entry.suffix != ".py":
        return "not a Python file (its name does not end in .py)"
    return None


def _near_miss(root: Path, rel: str) -> str:
    """The rest of a missing entry's message: the path under ``root`` it is a slip of (a
    missing .py, another case, a stray space, a typo), found part by part among what each
    directory holds; else where the path stops existing. "does not exist ... Fix the path"
    alone left the user to find out which part was wrong."""
    import difflib

    parts = [part for part in rel.split("/") if part not in ("", ".")]
    have: list[str] = []
    for at, part in enumerate(parts):
        here = root.joinpath(*have)
        try:
            found = part == ".." or (here / part).exists()
        except OSError:  # a directory you may not search: the entry's own error says more
            return ""
        if found:
            have.append(part)
            continue
        try:
            names = sorted(os.listdir(here))
        except NotADirectoryError:
            return f" {'/'.join(have)} is a file, not a directory."
        except OSError:
            return ""
        last = at == len(parts) - 1
        fits = [name for name in names
                if name.casefold() in {part.strip().casefold(),
                                       (part.strip() + ".py").casefold() if last else ""}]
        if not fits:  # a typo of the name, compared without its suffix (.py weighs much)
            stems = {Path(name).stem: name for name in names
                     if Path(name).suffix == Path(part).suffix}
            fits = [stems[stem] for stem in difflib.get_close_matches(
                Path(part).stem, list(stems), n=1, cutoff=0.75)]
        if not fits:
            where = "/".join(have)
            return f" {where + '/' if where else 'The project root'} holds no {part!r}."
        have.append(fits[0])
    if have == parts:
        return ""
    meant = "/".join(have)
    return f" Did you mean {meant!r}" + (
        " (without the spaces)?" if meant == rel.strip() else "?")


def _held(value: object) -> Iterable[object]:
    """What a list, tuple or dict (its values) bound in a source holds, read as the built-in
    type reads it: a subclass's own ``__iter__`` or ``values()`` is user code, and may
    raise. Nothing for any other value."""
    kind = type(value)
    if issubclass(kind, dict):
        return dict.values(cast("dict[object, object]", value))
    if issubclass(kind, list):
        return list.__iter__(cast("list[object]", value))
    if issubclass(kind, tuple):
        return tuple.__iter__(cast("tuple[object, ...]", value))
    return ()


def _is_workflow(value: object) -> TypeGuard[Workflow]:
    """Whether ``value`` is a Workflow, judged by ``type()``, which reads no attribute of it:
    isinstance consults ``__class__``, which a lazy proxy (Django's unconfigured settings)
    raises from."""
    return issubclass(type(value), Workflow)


def _load_entry(root: Path, rel: str, entry: Path) -> dict[str, LoadedWorkflow]:
    """Import one entry and return its Workflows, all of them or none (an IntloomError)."""
    try:
        missing = not entry.exists() and not entry.is_symlink()
    except OSError as exc:  # pathlib answers False only for a missing path, not for these
        raise IntloomError(
            "WORKFLOW_LOAD_FAILED",
            f"{rel} (from intloom.toml) cannot be examined under {root} "
            f"({exc.strerror or exc}). Fix the path.",
        ) from None
    loop = link_loop(root, rel)
    if loop is not None:
        raise IntloomError("WORKFLOW_LOAD_FAILED", loop)
    if missing:
        raise IntloomError(
            "WORKFLOW_LOAD_FAILED",
            f"{rel} (from intloom.toml) does not exist under {root}."
            + _near_miss(root, rel) + " Fix the path.",
        )
    if entry.is_symlink():
        raise IntloomError(
            "WORKFLOW_LOAD_FAILED",
            f"{rel} (from intloom.toml) is a symbolic link {link_leads(entry, root)}; "
            "intloom loads a Workflow from the real file or package only: a source's "
            "identity covers its own bytes, not wherever a link points today. Name the "
            "real file or package in 'workflows' in intloom.toml instead.",
        )
    other = _not_python(entry)
    if other is not None:
        raise IntloomError(
            "WORKFLOW_LOAD_FAILED",
            f"{rel} (from intloom.toml) is {other}, and a Workflow source is a Python file "
            "(its name ends in .py) or a package (a directory with __init__.py); nothing "
            "of it was read. Name a .py file or a package in 'workflows' in intloom.toml.",
        )
    module, copied = _import(root, entry)
    # A copy, in one step: a thread the module started may bind names meanwhile. Each value
    # is judged by _is_workflow and _held, which run none of its code: isinstance on a lazy
    # proxy failed the whole source ("checking its Workflows raised ...").
    bound = vars(module).copy()
    # One Workflow object may be bound to several names; the first names it.
    found: dict[Workflow, str] = {}
    for name, value in bound.items():
        if _is_workflow(value):
            found.setdefault(value, name)
    if not found:
        # Made, and kept only in a list or a dict (ALL = [make("a"), make("b")]): named, so
        # that "defines no Workflow" does not send the author looking for a missing one.
        held = {name: [v.name for v in _held(value) if _is_workflow(v)]
                for name, value in bound.items()
                if type(name) is str and not name.startswith("__")}
        kept = next(((name, names) for name, names in held.items() if names), None)
        inside = (f": {kept[0]} holds Workflows {', '.join(map(repr, kept[1]))}, which are "
                  "not bound to names of their own" if kept else "")
        raise IntloomError(
            "WORKFLOW_LOAD_FAILED",
            f"{rel} defines no intloom.Workflow at module level{inside}. Bind each to a name, "
            'e.g. wf = intloom.Workflow("name", version="1.0.0").',
        )
    # A source loads whole or not at all: a half-loaded file would run some of its
    # Workflows while `start` reports it as failed.
    mine: dict[str, tuple[LoadedWorkflow, str]] = {}
    for wf, name in found.items():
        try:
            wf.validate()
        except DefinitionError as exc:
            raise _told_of_copy(entry, _placed(root, exc, exc.at), not copied) from None
        if wf.name in mine:
            raise IntloomError(
                "WORKFLOW_DEFINITION_INVALID",
                f"{rel} defines Workflow {wf.name!r} twice ({mine[wf.name][1]} and "
                f"{name}). Give each its own name.",
            )
        hashed: dict[str, bytes] = {}
        mine[wf.name] = (LoadedWorkflow(
            workflow=wf,
            source=rel,
            identity=workflow_identity(wf.name, wf.version, entry, _TREES.compiled, hashed,
                                       reads=_TREES.reads),
            schemas=wf.schemas(),
            entry=str(entry),
        ), name)
        if _TREES.reads is not None:  # the bytes ``hashed`` was computed from
            for path in hashed:
                taken = _TREES.reads.digests.get(path)
                if taken is not None and path.endswith(".py"):
                    _TREES.sources.setdefault(path, taken[0])
        _TREES.loaded_roots.setdefault(os.path.normpath(source_root(entry)),
                                       f"{wf.name} {wf.version}")
        _TREES.projects.setdefault(os.path.normpath(source_root(entry)), root.resolve())
    for lw, _name in mine.values():
        # Runs execute it from here on (Workflow._refuse_if_loaded). Set past its own
        # refusal: one Workflow object bound by two sources (both import it from a module
        # neither lists) is met twice, and _register then loads neither, as designed.
        object.__setattr__(lw.workflow, "_loaded", True)
    return {wf_name: lw for wf_name, (lw, _name) in mine.items()}
