"""Workflow tree modules: cached by the hash of their bytes, never by time and size."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import py_compile
import sys
from pathlib import Path
from types import CodeType
from typing import Any

import pytest

from intloom.authoring.identity import workflow_identity
from intloom.authoring.loader import _FromSource, _SourceTrees, load_workflows
from intloom.project import Config


def _version(code: CodeType) -> str:
    scope: dict[str, Any] = {}
    exec(code, scope)
    return str(scope["VERSION"])


def test_a_tree_module_is_cached_by_the_hash_of_its_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiling a tree's modules at every start cost a 421-module tree ~0.7 s per start
    and per doctor; a stale timestamp cache must never run (an edit of the same size within
    the recorded second), and a hash-based one only for the very bytes it was made from."""
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    compiled: list[str] = []
    real = _FromSource.source_to_code

    def counting(self: _FromSource, data: Any, path: Any, **kw: Any) -> CodeType:
        compiled.append(str(path))
        return real(self, data, path, **kw)

    monkeypatch.setattr(_FromSource, "source_to_code", counting)
    src = tmp_path / "helpers.py"
    src.write_text('VERSION = "1.0.0"\n')
    py_compile.compile(str(src), invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
    then = os.stat(src).st_mtime_ns
    src.write_text('VERSION = "2.0.0"\n')  # the same size, and the recorded time put back
    os.utime(src, ns=(then, then))

    def load() -> str:
        return _version(_FromSource("helpers", str(src)).get_code("helpers"))

    assert load() == "2.0.0" and len(compiled) == 1  # the timestamp cache was not trusted
    cached = Path(importlib.util.cache_from_source(str(src)))
    data = cached.read_bytes()
    assert int.from_bytes(data[4:8], "little") == 0b11  # hash-based, checked (PEP 552)
    assert data[8:16] == importlib.util.source_hash(src.read_bytes())
    assert load() == "2.0.0" and len(compiled) == 1  # read back, not compiled again

    src.write_text('VERSION = "3.0.0"\n')
    os.utime(src, ns=(then, then))
    assert load() == "3.0.0" and len(compiled) == 2  # other bytes: compiled again

    cached.write_bytes(data[:20])  # a damaged cache is compiled over, never run
    assert load() == "3.0.0" and len(compiled) == 3


def _cached_under_umask_0(src: Path) -> Path:
    """``src``, a module, written and loaded under umask 000: its cache file."""
    src.write_text('VERSION = "1.0.0"\n')
    old = os.umask(0)
    try:
        assert _version(_FromSource("helpers", str(src)).get_code("helpers")) == "1.0.0"
    finally:
        os.umask(old)
    return Path(importlib.util.cache_from_source(str(src)))


def test_a_cache_someone_else_may_write_is_not_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host started under umask 000 left __pycache__ (and its .pyc) writable by all, and a
    .pyc another user wrote there with the source's hash ran their code at every later start
    and doctor: the hash says which source the file claims, not that its code is that
    source's. A cache is run only when it is this user's and no one else may write it; the
    host writes its own 0644, whatever the umask."""
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    src = tmp_path / "helpers.py"
    cached = _cached_under_umask_0(src)
    assert cached.stat().st_mode & 0o777 == 0o644, oct(cached.stat().st_mode)
    # Nor its directory, which Python made 0777 under that umask: plain python (the
    # project's tests, a script) runs a .pyc another user puts there.
    assert cached.parent.stat().st_mode & 0o777 == 0o755, oct(cached.parent.stat().st_mode)
    data = cached.read_bytes()
    planted = data[:16] + __import__("marshal").dumps(compile('VERSION = "evil"', "x", "exec"))
    cached.chmod(0o666)  # as another user could have left it
    cached.write_bytes(planted)
    assert _version(_FromSource("helpers", str(src)).get_code("helpers")) == "1.0.0"
    if os.geteuid() == 0:  # another user's file, however its mode reads
        cached.write_bytes(planted)
        cached.chmod(0o644)
        os.chown(cached, 65534, 65534)
        assert _version(_FromSource("helpers", str(src)).get_code("helpers")) == "1.0.0"


def test_a_cache_prefix_tree_is_made_writable_by_no_one_else(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under PYTHONPYCACHEPREFIX a source's cache sits in a tree of its own directories,
    which Python made 0777 under umask 000: anyone could swap a directory above the .pyc."""
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    prefix = tmp_path / "prefix"
    monkeypatch.setattr(sys, "pycache_prefix", str(prefix))
    src = tmp_path / "tree" / "helpers.py"
    src.parent.mkdir()
    cached = _cached_under_umask_0(src)
    assert cached.is_relative_to(prefix) and cached.is_file(), cached
    made = [cached.parent, *[p for p in cached.parent.parents if p.is_relative_to(prefix)]]
    assert len(made) > 3
    modes = {str(p): oct(p.stat().st_mode & 0o777) for p in made}
    assert set(modes.values()) == {"0o755"}, modes


@pytest.mark.parametrize(("source_mode", "cache_mode"),
                         [(0o600, 0o600), (0o640, 0o640), (0o666, 0o644), (0o400, 0o600)])
def test_a_cache_is_readable_by_no_one_the_source_is_not_readable_by(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source_mode: int,
        cache_mode: int) -> None:
    """A private (0600) Workflow source was cached 0644: its code, an API key in it say, was
    there for every local user to read (``strings`` on the .pyc)."""
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    src = tmp_path / "secret.py"
    src.write_text('VERSION = "sk-1"\n')
    src.chmod(source_mode)
    old = os.umask(0o022)
    try:
        assert _version(_FromSource("secret", str(src)).get_code("secret")) == "sk-1"
    finally:
        os.umask(old)
    cached = Path(importlib.util.cache_from_source(str(src)))
    assert cached.stat().st_mode & 0o777 == cache_mode, oct(cached.stat().st_mode)
    # And it is used again: this user's, writable by no one else.
    assert _version(_FromSource("secret", str(src)).get_code("secret")) == "sk-1"


def test_a_cache_readable_beyond_its_source_is_written_again_to_its_mode(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache written 0644 (by an intloom before the fix, or before the source was made
    private) stayed readable by every user: it was taken as it was, never written again."""
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    src = tmp_path / "secret.py"
    src.write_text('VERSION = "sk-2"\n')
    src.chmod(0o644)
    old = os.umask(0o022)
    try:
        assert _version(_FromSource("secret", str(src)).get_code("secret")) == "sk-2"
        cached = Path(importlib.util.cache_from_source(str(src)))
        assert cached.stat().st_mode & 0o777 == 0o644
        src.chmod(0o600)
        assert _version(_FromSource("secret", str(src)).get_code("secret")) == "sk-2"
    finally:
        os.umask(old)
    assert cached.stat().st_mode & 0o777 == 0o600, oct(cached.stat().st_mode)


def test_no_cache_is_written_where_bytecode_writing_is_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """doctor and inspect write nothing (they turn bytecode writing off)."""
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    src = tmp_path / "helpers.py"
    src.write_text('VERSION = "1.0.0"\n')
    assert _version(_FromSource("helpers", str(src)).get_code("helpers")) == "1.0.0"
    assert not (tmp_path / "__pycache__").exists()


def test_a_module_outside_the_trees_is_searched_for_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tree finder sits just before the path finder and asks it first: a module found
    outside the trees is handed back as found, not searched for a second time (a Step
    lazily importing ~300 modules paid 20-30 ms for that), and loaded by the usual
    loader; a tree module still runs from its source."""
    tree, outside = tmp_path / "tree", tmp_path / "outside"
    tree.mkdir()
    outside.mkdir()
    (tree / "tree_mod_x1.py").write_text("WHERE = 'tree'\n")
    (outside / "outside_mod_x1.py").write_text("WHERE = 'outside'\n")
    trees = _SourceTrees()
    trees.roots.add(tree)
    # In place of the host's own finder, which earlier tests of this process may have added.
    others = [f for f in sys.meta_path if not isinstance(f, _SourceTrees)]
    at = others.index(importlib.machinery.PathFinder)
    monkeypatch.setattr(sys, "meta_path", [*others[:at], trees, *others[at:]])
    monkeypatch.setattr(sys, "path", [str(tree), str(outside), *sys.path])
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    searched: list[str] = []
    real = importlib.machinery.PathFinder.find_spec

    def counting(fullname: str, path: Any = None, target: Any = None) -> Any:
        searched.append(fullname)
        return real(fullname, path, target)

    monkeypatch.setattr(importlib.machinery.PathFinder, "find_spec", counting)
    try:
        outside_mod = importlib.import_module("outside_mod_x1")
        tree_mod = importlib.import_module("tree_mod_x1")
    finally:
        sys.modules.pop("outside_mod_x1", None)
        sys.modules.pop("tree_mod_x1", None)
    assert searched.count("outside_mod_x1") == 1
    assert type(outside_mod.__loader__) is importlib.machinery.SourceFileLoader
    assert searched.count("tree_mod_x1") == 1
    assert type(tree_mod.__loader__) is _FromSource and tree_mod.WHERE == "tree"
    assert outside_mod.WHERE == "outside"

    # An import hook inserted between the two later is still asked, as without the tree
    # finder: nothing is answered over its head.
    asked: list[str] = []

    class Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
            asked.append(fullname)

    at = sys.meta_path.index(trees)
    sys.meta_path.insert(at + 1, Hook())
    try:
        importlib.import_module("outside_mod_x1")
    finally:
        sys.modules.pop("outside_mod_x1", None)
    assert asked == ["outside_mod_x1"]


# A Workflow at the project root that imports a helper beside it, and then saves both files
# anew: what an editor or a checkout does while the host starts, here at a known moment.
_HELPER = "intloom_test_saved_helper"  # a name no other test's module has in sys.modules
_SAVES_ITSELF = f'''
from pathlib import Path

import intloom
from {_HELPER} import VERSION

wf = intloom.Workflow("saved", version=VERSION)
main = wf.stage("main")


@main.step("go", routes={{"ok": intloom.COMPLETE}})
def go(ctx: intloom.StepContext[None]) -> str:
    return "ok"


here = Path(__file__)
here.with_name("{_HELPER}.py").write_text('VERSION = "2"\\n')
here.write_text(here.read_text() + "# saved after the import\\n")
'''


def test_the_identity_covers_the_bytes_that_ran_when_a_source_is_saved_after_its_import(
        tmp_path: Path) -> None:
    """The identity was hashed from the files as they were after the import: a source saved
    in between gave the code that ran the identity of bytes that never ran (a Run started
    on the old code went on with the new one after a restart; one started on the code that
    ran was held as changed). It covers the bytes each imported module was compiled from."""
    root, before = tmp_path / "proj", tmp_path / "before"
    for tree in (root, before):
        tree.mkdir()
        (tree / "wf.py").write_text(_SAVES_ITSELF)
        (tree / f"{_HELPER}.py").write_text('VERSION = "1"\n')
    try:
        result = load_workflows(root, Config(workflows=("wf.py",), port=None))
    finally:
        sys.modules.pop(_HELPER, None)
    loaded = result.workflows["saved"]
    assert loaded.version == "1"
    # What ran: the bytes before the saves (the tree in ``before`` holds them still).
    assert loaded.identity == workflow_identity("saved", "1", before / "wf.py")
    # The saves did happen: the files as they are now have another identity.
    assert (root / "wf.py").read_text().endswith("# saved after the import\n")
    assert workflow_identity("saved", "1", root / "wf.py") != loaded.identity
