"""The loader hashes each Workflow's source tree right after importing it; the single-file
Workflows of one directory share that tree, and each one read every file of it again (300
files: 44,850 reads and 90,000 lstats, at every start and doctor). What one load
took is kept for the next Workflow it hashes, taken again only where an lstat changed: a
file edited or added during the load is still hashed as it is then."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from intloom.authoring.identity import workflow_identity
from intloom.authoring.loader import load_workflows
from intloom.project import Config

pytestmark = pytest.mark.timeout(60)

WORKFLOW = '''
import intloom

wf = intloom.Workflow("{name}", version="1")
s = wf.stage("s")


@s.step("a", routes={{"ok": intloom.COMPLETE}})
def a(ctx) -> str:
    return "ok"
'''


def _project(root: Path, names: list[str]) -> Config:
    (root / "workflows").mkdir(parents=True)
    for name in names:
        (root / "workflows" / f"{name}.py").write_text(WORKFLOW.format(name=name))
    return Config(workflows=tuple(f"workflows/{name}.py" for name in names), port=None)


def test_a_directory_of_single_file_workflows_is_read_once_per_load(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names = [f"w{i:02}" for i in range(40)]
    config = _project(tmp_path / "proj", names)
    read: list[str] = []
    real = Path.read_bytes

    def counted(self: Path) -> bytes:
        read.append(self.name)
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", counted)
    result = load_workflows(tmp_path / "proj", config)
    assert sorted(result.workflows) == names, result.problems
    # Each file not yet imported when the first Workflow is hashed, once; every other is
    # hashed from the bytes its import compiled (40 entries read them 780 times).
    assert len(read) == len(set(read)) == len(names) - 1, len(read)
    monkeypatch.undo()
    for name in names:
        assert result.workflows[name].identity == workflow_identity(
            name, "1", tmp_path / "proj" / "workflows" / f"{name}.py")


EDITS = '''
from pathlib import Path

import intloom

HERE = Path(__file__).resolve().parent
# Saved between the hashing of w0 (imported before this) and this Workflow's: the same size,
# so only the file's times tell; and a file added to the directory.
(HERE / "notes.py").write_text("NOTE = 2\\n")
(HERE / "added.py").write_text("ADDED = 1\\n")

wf = intloom.Workflow("w1", version="1")
s = wf.stage("s")


@s.step("a", routes={"ok": intloom.COMPLETE})
def a(ctx) -> str:
    return "ok"
'''


def test_a_file_saved_or_added_during_the_load_is_hashed_as_it_is_then(tmp_path: Path) -> None:
    root, before = tmp_path / "proj", tmp_path / "before"
    config = _project(root, ["w0", "w1", "w2"])
    (root / "workflows" / "w1.py").write_text(EDITS)
    (root / "workflows" / "notes.py").write_text("NOTE = 1\n")  # never imported
    shutil.copytree(root, before)
    result = load_workflows(root, config)
    assert sorted(result.workflows) == ["w0", "w1", "w2"], result.problems
    assert (root / "workflows" / "notes.py").read_text() == "NOTE = 2\n"
    # w0 was hashed before the edits: its tree as it was.
    assert result.workflows["w0"].identity == workflow_identity(
        "w0", "1", before / "workflows" / "w0.py")
    # w1 and w2, after: the edited file's new bytes, and the added file.
    for name in ("w1", "w2"):
        assert result.workflows[name].identity == workflow_identity(
            name, "1", root / "workflows" / f"{name}.py"), name


def test_the_offline_load_needs_no_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
) -> None:
    """doctor and inspect spool what the imported sources write in a temporary file: on a
    full disk (no usable /tmp, /var/tmp nor project directory) tempfile raised
    FileNotFoundError "No usable temporary directory found" and both failed as an internal
    error, exit 70, when they are needed most. The spool is in memory (memfd)."""
    import tempfile

    from intloom.authoring.loader import load_workflows_offline

    def no_directory(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError(2, "No usable temporary directory found")

    monkeypatch.setattr(tempfile, "TemporaryFile", no_directory)
    monkeypatch.setattr(tempfile, "mkstemp", no_directory)
    config = _project(tmp_path, ["spooled"])
    source = tmp_path / "workflows" / "spooled.py"
    source.write_text('import os\nprint("printed at import")\nos.write(1, b"fd banner\\n")\n'
                      + source.read_text())
    loaded = load_workflows_offline(tmp_path, config)
    assert not loaded.problems, loaded.problems
    assert list(loaded.workflows) == ["spooled"]
    err = capfd.readouterr().err
    assert "Workflow sources wrote this while they were imported:" in err, err
    assert "  | printed at import" in err and "  | fd banner" in err, err


def test_a_source_whose_import_ran_out_of_descriptors_is_not_called_broken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under a low `ulimit -n`, doctor said a source whose import hit EMFILE failed to load:
    "Fix the module and restart the host" (and held its Runs as changed). The fact is the
    process's limit, and the fix is to raise it."""
    import errno
    import resource

    from intloom.authoring.loader import load_workflows

    config = _project(tmp_path, ["fds"])
    source = tmp_path / "workflows" / "fds.py"
    source.write_text('import errno\nraise OSError(errno.EMFILE, "Too many open files")\n')
    loaded = load_workflows(tmp_path, config)
    [(_, problem)] = loaded.problems
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert problem.code == "WORKFLOW_LOAD_FAILED", problem
    assert (f"The process ran out of file descriptors (EMFILE; ulimit -n is {soft}): "
            in problem.message), problem.message
    assert problem.message.endswith(", while importing it: not the module's fault.")
    assert "Fix the module" not in problem.message
    # Never advice to lower the limit, and the system's table is not the process's.
    from intloom.authoring.loader import _out_of_descriptors

    for limit in (8, 20_000):
        monkeypatch.setattr(resource, "getrlimit", lambda _which, n=limit: (n, 1 << 20))
        assert f"(ulimit -n {max(1024, 2 * limit)})" in _out_of_descriptors(errno.EMFILE)
    assert "fs.file-max" in _out_of_descriptors(errno.ENFILE)


def test_an_offline_load_out_of_descriptors_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """doctor under `ulimit -n 10` failed CLI_INTERNAL_ERROR, exit 70, "report it": setting
    the import up (its output's spool, stdin on /dev/null) ran out of descriptors."""
    import errno

    from intloom.authoring import loader
    from intloom.errors import IntloomError

    def no_descriptor() -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(loader, "_spool", no_descriptor)
    with pytest.raises(IntloomError) as refused:
        loader.load_workflows_offline(tmp_path, _project(tmp_path, ["any"]))
    assert refused.value.code == "WORKFLOW_LOAD_FAILED"
    assert refused.value.message.startswith(
        "The Workflow sources were not imported: the process ran out of file descriptors "
        "(EMFILE; ulimit -n is "), refused.value.message
