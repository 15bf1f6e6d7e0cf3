"""Which files a Workflow's identity covers: the Python files of the directory holding a
single-file entry, or every file of a package directory; never dot files, caches or
virtualenvs. Real files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from intloom.authoring.identity import source_files, workflow_identity
from intloom.errors import IntloomError

pytestmark = pytest.mark.timeout(30)


def _write(path: Path, text: str = "x = 1\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_single_file_entry_covers_its_directory_with_paths_relative_to_it(
    tmp_path: Path,
) -> None:
    entry = _write(tmp_path / "workflows" / "acc.py")
    _write(tmp_path / "workflows" / "helpers.py")
    _write(tmp_path / "workflows" / "lib" / "text.py")
    _write(tmp_path / "outside.py")  # beside the directory, not in it
    assert [rel for rel, _ in source_files(entry)] == ["acc.py", "helpers.py", "lib/text.py"]

    before = workflow_identity("acc", "1.0.0", entry)
    _write(tmp_path / "workflows" / "helpers.py", "x = 2\n")
    assert workflow_identity("acc", "1.0.0", entry) != before
    _write(tmp_path / "workflows" / "helpers.py")
    assert workflow_identity("acc", "1.0.0", entry) == before  # the same bytes, the same id
    _write(tmp_path / "outside.py", "x = 2\n")
    assert workflow_identity("acc", "1.0.0", entry) == before


def test_an_entry_at_the_project_root_skips_caches_tools_and_virtualenvs(
    tmp_path: Path,
) -> None:
    entry = _write(tmp_path / "flow.py")
    _write(tmp_path / "intloom.toml", 'workflows = ["flow.py"]\n')
    for skipped in ("__pycache__/flow.cpython-311.pyc", ".git/HEAD", ".intloom/service.json",
                    "node_modules/a/index.js", ".mypy_cache/x.json", ".pytest_cache/v",
                    ".ruff_cache/x", "stray.pyc", "stray.pyo",
                    ".venv/pyvenv.cfg", ".venv/lib/site.py", "env2/pyvenv.cfg",
                    "env2/bin/python.py", "pkg/.venv/pyvenv.cfg", "pkg/.venv/a.py"):
        _write(tmp_path / skipped)
    _write(tmp_path / "pkg" / "mod.py")
    assert [rel for rel, _ in source_files(entry)] == ["flow.py", "pkg/mod.py"]


def test_what_a_steps_writes_or_an_editor_leaves_beside_a_single_file_entry_is_not_source(
    tmp_path: Path,
) -> None:
    entry = _write(tmp_path / "flow.py")
    before = workflow_identity("flow", "1.0.0", entry)
    _write(tmp_path / "report.md", "# written by a Step\n")
    _write(tmp_path / "data" / "rows.csv", "a,b\n")
    _write(tmp_path / ".flow.py.swp", "vim")
    _write(tmp_path / "flow.py~", "backup")
    assert workflow_identity("flow", "1.0.0", entry) == before
    _write(tmp_path / "helpers.py")  # a module it could import is source
    assert workflow_identity("flow", "1.0.0", entry) != before


def test_a_package_entry_covers_its_data_files_but_not_dot_files(tmp_path: Path) -> None:
    package = tmp_path / "workflows" / "notes"
    _write(package / "__init__.py")
    _write(package / "prompt.txt", "Summarise.\n")
    _write(package / ".prompt.txt.swp", "vim")
    assert [rel for rel, _ in source_files(package)] == ["__init__.py", "prompt.txt"]


def test_a_symbolic_link_anywhere_in_the_tree_is_refused_by_name(tmp_path: Path) -> None:
    entry = _write(tmp_path / "workflows" / "acc.py")
    target = _write(tmp_path / "elsewhere.py")
    link = tmp_path / "workflows" / "helpers.py"
    os.symlink(target, link)
    with pytest.raises(IntloomError) as refused:
        source_files(entry)
    assert refused.value.code == "WORKFLOW_LOAD_FAILED"
    assert str(link) in refused.value.message
    assert "directory of its own" in refused.value.message
    # Where it leads, outside the tree it is in.
    assert f"is a symbolic link to {target}, outside its source tree" in refused.value.message


def test_the_scaffolded_advice_on_further_workflows_keeps_the_example_apart(
    tmp_path: Path,
) -> None:
    """intloom.toml said the identity "covers every file of the directory" and to "give
    each further Workflow a directory of its own": a newcomer made workflows/orders/, and
    editing it held the example's Runs (workflows/example.py covers workflows/ and below).
    What the comment says is checked here against what the identity does."""
    from intloom.scaffold import scaffold

    root = scaffold(tmp_path / "p")
    advice = (root / "intloom.toml").read_text()
    assert "every file" not in advice, advice
    assert "outside workflows/ (e.g. orders/" in advice, advice
    entry = root / "workflows" / "example.py"
    before = workflow_identity("example", "1.0.0", entry)
    _write(root / "orders" / "__init__.py")  # where the comment says to put one
    (root / "workflows" / "notes.txt").write_text("not Python\n")
    assert workflow_identity("example", "1.0.0", entry) == before
    _write(root / "workflows" / "orders" / "__init__.py")  # where it said nothing against
    assert workflow_identity("example", "1.0.0", entry) != before


def test_concepts_describes_a_single_file_entry_s_tree_as_the_identity_hashes_it(
    tmp_path: Path,
) -> None:
    """docs/concepts.md said the identity covers "every file of ... the directory holding
    its single-file entry": a data file beside it is not covered (authoring.md is right)."""
    from tests.helpers import REPO

    entry = _write(tmp_path / "workflows" / "flow.py")
    before = workflow_identity("flow", "1", entry)
    (tmp_path / "workflows" / "prompt.txt").write_text("not covered\n")
    assert workflow_identity("flow", "1", entry) == before
    text = " ".join((REPO / "docs" / "concepts.md").read_text().split())
    assert "or the Python files of the directory holding its single-file entry" in text


def test_a_large_data_file_is_hashed_as_it_is_read_and_names_the_same_identity(
        tmp_path: Path) -> None:
    """status, flows, doctor and a reusing start read every file of a tree whole to hash
    it: a 2 GiB model beside the code cost each of them 2 GiB of memory. A file past 8 MiB
    is hashed a chunk at a time, to the same identity (and digest) the loader's whole read
    gives, which is what the host's journals hold."""
    import hashlib
    import tracemalloc

    from intloom.authoring.identity import Reads

    package = tmp_path / "workflows" / "model"
    _write(package / "__init__.py")
    size = 24 << 20
    with open(package / "weights.bin", "wb") as fh:
        for i in range(size >> 20):
            fh.write(bytes([i]) * (1 << 20))
    whole: dict[str, bytes] = {}
    loaded = workflow_identity("m", "1", package, hashed=whole, reads=Reads())
    streamed: dict[str, bytes] = {}
    tracemalloc.start()
    try:
        got = workflow_identity("m", "1", package, hashed=streamed, trees={})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == loaded
    assert streamed == whole
    assert streamed[str(package / "weights.bin")] == hashlib.sha256(
        (package / "weights.bin").read_bytes()).digest()
    assert peak < 4 << 20, f"peak {peak} bytes while hashing a {size}-byte file"
    # The same file edited: another identity.
    with open(package / "weights.bin", "r+b") as fh:
        fh.seek(size // 2)
        fh.write(b"\xff")
    assert workflow_identity("m", "1", package, trees={}) != loaded


def test_a_large_file_replaced_after_its_listing_is_refused_not_waited_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A streamed file is opened when an identity is computed, which for a tree shared by
    several Workflows is after its listing: a FIFO put there since blocked the command for
    ever, and a symbolic link was "cannot be read ... Make it readable"."""
    from intloom.authoring import identity

    monkeypatch.setattr(identity, "_STREAMED_OVER", 8)
    package = tmp_path / "workflows" / "model"
    _write(package / "__init__.py")
    data = _write(package / "weights.bin", "0123456789abcdef")
    trees: identity.Trees = {}
    first = workflow_identity("m", "1", package, trees=trees)
    assert first == workflow_identity("m", "1", package, reads=identity.Reads())
    data.unlink()
    os.mkfifo(data)
    with pytest.raises(IntloomError) as fifo:
        workflow_identity("m", "1", package, trees=trees)
    assert "was replaced by something that is not a regular file" in fifo.value.message
    data.unlink()
    data.symlink_to(package / "__init__.py")
    with pytest.raises(IntloomError) as link:
        workflow_identity("m", "1", package, trees=trees)
    assert f"{data} is a symbolic link" in link.value.message, link.value.message


_SET_DEFAULTS = """
import msgspec, intloom
class Review(msgspec.Struct):
    reviewers: frozenset[str] = frozenset({"alice", "bob", "carol", "dave", "erin", "frank"})
    maybe: frozenset[str] | None = frozenset({"x", "y", "z", "w"})
    approved: bool = False
wf = intloom.Workflow("fz", version="1")
st = wf.stage("review", state=Review)
@st.step("ask", routes={"ok": intloom.COMPLETE})
def ask(ctx):
    return "ok"
print(wf.schemas()["review"])
"""


def test_a_set_default_gives_one_state_fingerprint_in_every_process() -> None:
    """A ``frozenset[str]`` default was written into the State's schema in iteration order,
    which follows the process's hash seed: its Stage's fingerprint differed at every start,
    and every Run waiting there was held ("the State schema of Stage 'review' changed")
    although nothing had."""
    import subprocess
    import sys

    prints = set()
    for seed in ("1", "2", "3", "4"):
        done = subprocess.run([sys.executable, "-c", _SET_DEFAULTS], capture_output=True,
                              text=True, timeout=60,
                              env={**os.environ, "PYTHONHASHSEED": seed})
        assert done.returncode == 0, done.stderr
        prints.add(done.stdout.strip())
    assert len(prints) == 1, prints


def test_a_set_of_numbers_keeps_the_fingerprint_it_had() -> None:
    """A set of ints hashes to itself: its default's order, and the fingerprint, were the same
    in every process before sets were sorted. Sorting it too changed that fingerprint once,
    and every Run waiting in its Stage was held after the upgrade."""
    import hashlib

    import msgspec

    import intloom

    class Ids(msgspec.Struct):
        ids: frozenset[int] = frozenset({2, 10})

    wf = intloom.Workflow("ids", version="1")
    st = wf.stage("s", state=Ids)

    @st.step("a", routes={"ok": intloom.COMPLETE})
    def a(ctx: object) -> str:
        return "ok"

    as_before = msgspec.json.encode(msgspec.json.schema(Ids), order="sorted")
    assert b'"default":[2,10]' in as_before, as_before
    assert wf.schemas()["s"] == hashlib.sha256(as_before).hexdigest()
