"""The store's files are private, written atomically, and never reached through a link."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from intloom.errors import IntloomError
from intloom.runtime.machine import fold
from intloom.store import read_history, read_runs, read_runs_report, verify, verify_report
from intloom.store.snapshots import snapshot_name
from tests.helpers import snapshot_files
from tests.unit.test_store_support import abandon, by_id, open_store, run_child, walk


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _fill(root: Path, runs: int = 3, n: int = 12, *, close: bool = True) -> None:
    store = open_store(root)
    for i in range(runs):
        for record in walk(f"RUN-{i}", n, i):
            store.append(f"RUN-{i}", record)
        store.sync_blocking()
    if close:
        store.close_blocking()
    else:
        abandon(store)


def test_every_directory_is_0700_and_every_file_0600(tmp_path: Path) -> None:
    root = tmp_path / ".intloom" / "runtime"
    _fill(root)
    _fill(root, runs=2, n=20)  # a second host instance, terminal and live snapshots
    dirs = [p for p in [root, *root.rglob("*")] if p.is_dir()]
    files = [p for p in root.rglob("*") if p.is_file()]
    assert {d.relative_to(root).as_posix() for d in dirs} == {
        ".", "wal", "snap", "snap/live", "snap/done"}
    assert all(_mode(d) == 0o700 for d in dirs), {str(d): oct(_mode(d)) for d in dirs}
    assert files and all(_mode(f) == 0o600 for f in files), {str(f): oct(_mode(f)) for f in files}
    assert not [f for f in files if f.name.startswith(".")], "a temp file was left behind"
    assert len(list((root / "wal").iterdir())) == 2  # one new segment per host instance


def test_snapshots_and_manifest_are_replaced_atomically(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "runtime"
    _fill(root)
    # Held open, the old files keep their inodes: none can be handed to a new file (a
    # replacement written twice could otherwise get its first version's inode back).
    paths = {p.name: p for p in [*(root / "snap" / "live").iterdir(), root / "manifest.json"]}
    # A new inode alone does not show the name was never missing (unlinked, then written or
    # renamed to): each rename is noted with whether its target was still there.
    renamed_over: set[Path] = set()
    rename = os.rename

    def noted(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if Path(dst).exists() and Path(src).name.startswith(f".{Path(dst).name}."):
            renamed_over.add(Path(dst))
        rename(src, dst)

    monkeypatch.setattr(os, "rename", noted)
    with contextlib.ExitStack() as held:
        old = {name: held.enter_context(path.open("rb")) for name, path in paths.items()}
        store = open_store(root)
        for record in walk("RUN-0", 14, 0)[12:]:
            store.append("RUN-0", record)
        store.sync_blocking()
        store.close_blocking()
        # Renamed over: the old inode has no name left, and the name a new inode.
        replaced = sorted(name for name, f in old.items() if os.fstat(f.fileno()).st_nlink == 0)
        for name in replaced:
            assert paths[name].stat().st_ino != os.fstat(old[name].fileno()).st_ino
            assert paths[name] in renamed_over, (name, renamed_over)
    assert len(replaced) == 2 and "manifest.json" in replaced, replaced
    assert not [p for p in root.rglob(".*") if p.is_file()]


def test_reading_a_missing_store_creates_nothing(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    assert read_runs(root) == []
    assert verify(root) == []
    assert read_history(root, "RUN-0") == []
    assert not root.exists()


def test_a_symlinked_runtime_dir_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    _fill(target)
    before = snapshot_files(target)
    link = tmp_path / "runtime"
    link.symlink_to(target)
    for action in (lambda: read_runs(link), lambda: verify(link), lambda: open_store(link)):
        with pytest.raises(IntloomError) as info:
            action()
        assert info.value.code == "STORAGE_ERROR"
        assert str(link) in info.value.message and "symbolic link" in info.value.message
    assert snapshot_files(target) == before
    assert not (target / "wal" / "0000000002.seg").exists()


def test_a_symlinked_segment_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    _fill(root, close=False)
    outside = tmp_path / "outside.seg"
    outside.write_bytes(b"not yours")
    os.chmod(outside, 0o600)
    (root / "wal" / "0000000002.seg").symlink_to(outside)
    for action in (lambda: read_runs(root), lambda: verify(root), lambda: open_store(root)):
        with pytest.raises(IntloomError) as info:
            action()
        assert info.value.code == "STORAGE_ERROR"
        assert "0000000002.seg" in info.value.message
    assert outside.read_bytes() == b"not yours"


def test_a_symlinked_snapshot_holds_back_only_its_run_and_is_never_followed(
    tmp_path: Path,
) -> None:
    """A link at one Run's snapshot refused the whole store (STORAGE_ERROR): no Run
    restored. It is that Run's problem, as a damaged snapshot is: reported, never followed
    nor written through, and the Run read from the log."""
    root = tmp_path / "runtime"
    _fill(root)
    live = root / "snap" / "live"
    victim = live / snapshot_name("RUN-1")
    outside = tmp_path / "outside.snap"
    outside.write_bytes(victim.read_bytes())
    os.chmod(outside, 0o600)
    victim.unlink()
    victim.symlink_to(outside)
    kept = outside.read_bytes()
    rel = f"snap/live/{victim.name}"
    for report in (read_runs_report(root), verify_report(root)):
        assert [(f.path, f.kind) for f in report.files] == [(rel, "corrupt")], report.files
        assert "is a symbolic link; intloom never follows links" in report.files[0].problem
        assert {j.run_id: j.state for j in report.runs} == {
            f"RUN-{i}": fold(walk(f"RUN-{i}", 12, i)) for i in range(3)}
    store = open_store(root)
    store.append("RUN-1", walk("RUN-1", 13, 1)[-1])  # its Run goes on, from the log
    store.sync_blocking()
    store.close_blocking()  # and its snapshot is not written through the link
    assert outside.read_bytes() == kept and victim.is_symlink()
    assert by_id(read_runs(root))["RUN-1"].state == fold(walk("RUN-1", 13, 1))


@pytest.mark.parametrize("kind", ["symlink", "directory", "mode-0644"])
def test_an_unusable_done_snapshot_is_reported_and_never_written_over(
    tmp_path: Path, kind: str
) -> None:
    """snap/done/ holds one file per ended Run: one that is a link, a directory or open to
    others made every inspect (a verify) fail STORAGE_ERROR, and a compaction in which a
    Run ending at that name failed whole (no snapshot, no manifest written)."""
    root = tmp_path / "runtime"
    store = open_store(root)
    for run_id, seed in (("RUN-END", 4), ("RUN-LIVE", 5)):
        for record in walk(run_id, 8, seed):
            store.append(run_id, record)
    store.sync_blocking()
    store.close_blocking()
    done = root / "snap" / "done" / snapshot_name("RUN-END")
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious")
    os.chmod(outside, 0o600)
    if kind == "symlink":
        done.symlink_to(outside)
    elif kind == "directory":
        done.mkdir(mode=0o700)
    else:
        done.write_bytes(b"planted")
        done.chmod(0o644)
    before = os.lstat(done)
    told: list[str] = []
    store = open_store(root, instance_id="INST-2")
    store.on_unsummarised = lambda exc, when: told.append(f"{when}: {exc}")
    store.append("RUN-END", walk("RUN-END", 8, 4, terminal=True)[-1])  # RUN-END ends here
    store.sync_blocking()
    store.close_blocking()
    assert told == []  # the close's compaction wrote every snapshot and the manifest
    after = os.lstat(done)
    assert (after.st_mode, after.st_ino, after.st_size) == (
        before.st_mode, before.st_ino, before.st_size)
    assert outside.read_bytes() == b"precious"
    rel = f"snap/done/{done.name}"
    report = verify_report(root)
    assert (rel, "corrupt") in {(f.path, f.kind) for f in report.files}, report.files
    ended = by_id(report.runs)["RUN-END"]
    assert ended.status == "ok" and ended.state is not None
    assert ended.state.phase == "terminal"
    assert [j.run_id for j in read_runs(root)] == ["RUN-LIVE"]
    assert [h.verdict for h in read_history(root, "RUN-LIVE")] == ["ok"] * 8


def test_group_or_other_bits_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    _fill(root)
    os.chmod(root, 0o755)
    with pytest.raises(IntloomError) as info:
        read_runs(root)
    assert info.value.code == "STORAGE_ERROR" and "0755" in info.value.message
    # One sentence: the fix follows the fact after "; " (it said "; Run chmod 700 ...").
    assert info.value.message == (f"Checkpoint store path {root} has mode 0755; it must be "
                                  f"0700; run chmod 700 {root}, then try again."), info.value
    os.chmod(root, 0o700)
    segment = root / "wal" / "0000000001.seg"
    os.chmod(segment, 0o644)
    # Below the manifest's start (a clean close): no start reads it, nor does a verify,
    # which names it; a restore that must read it refuses it.
    [finding] = verify_report(root).files
    assert (finding.path, finding.kind) == ("wal/0000000001.seg", "corrupt")
    assert finding.problem.startswith("has mode 0644; private files must be 0600; it was "
                                      "not read"), finding
    (root / "manifest.json").rename(tmp_path / "manifest.json")
    for read in (read_runs, verify):
        with pytest.raises(IntloomError) as info:
            read(root)
        assert "0644" in info.value.message and "0000000001.seg" in info.value.message
    assert _mode(segment) == 0o644  # reported, never "fixed"


def test_unexpected_files_are_reported_and_left_alone(tmp_path: Path) -> None:
    from intloom.store import verify_report

    root = tmp_path / "runtime"
    _fill(root)
    stray = root / "wal" / "notes.txt"
    stray.write_text("mine")
    os.chmod(stray, 0o600)
    report = verify_report(root)
    assert [f.path for f in report.files if f.kind == "unexpected"] == ["wal/notes.txt"]
    assert all(j.status == "ok" for j in report.runs)
    open_store(root).close_blocking()
    assert stray.read_text() == "mine"


def test_many_snapshot_files_are_written_in_bounded_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compaction writes one file per busy Run: more than are held open at once
    (_FILES_AT_ONCE) all land; a fault in a later group keeps the earlier groups' files."""
    from intloom.fsutil import WRITE_FAULT_ENV
    from intloom.store.files import _FILES_AT_ONCE, atomic_write_many

    count = 2 * _FILES_AT_ONCE + 3
    items = [(f"RUN-{i:04d}.snap", f"state {i}".encode()) for i in range(count)]
    atomic_write_many(tmp_path, items)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == dict(items)
    newer = [(name, data + b" newer") for name, data in items]
    failing = newer[_FILES_AT_ONCE + 1][0]  # in the second group
    monkeypatch.setenv(WRITE_FAULT_ENV, f"{failing}=EIO")
    with pytest.raises(OSError) as info:  # a compaction that fails leaves the manifest as is
        atomic_write_many(tmp_path, newer)
    assert info.value.errno == errno.EIO
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert sorted(after) == sorted(dict(items))  # no temp file left
    assert [after[name] for name, _ in newer[:_FILES_AT_ONCE]] == [
        data for _, data in newer[:_FILES_AT_ONCE]]
    assert [after[name] for name, _ in items[_FILES_AT_ONCE:]] == [
        data for _, data in items[_FILES_AT_ONCE:]]


# verify's read of a store with no descriptor left to it (``ulimit -n``): every number below
# the soft limit is taken once its modules are imported.
_NO_DESCRIPTOR_LEFT = r"""
import os, resource, sys
from pathlib import Path
from intloom.errors import IntloomError
from intloom.store import verify_report

resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
taken = []
try:
    while True:
        taken.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
try:
    verify_report(Path(sys.argv[1]))
except IntloomError as exc:
    print(exc.code, exc.message)
"""


def test_a_store_listed_with_no_descriptor_left_names_the_limit(tmp_path: Path) -> None:
    """verify out of file descriptors said "move the offending path aside (or chmod it ...)"
    of wal/: advice that would have moved the journal away."""
    root = tmp_path / "runtime"
    _fill(root)
    done = subprocess.run([sys.executable, "-c", _NO_DESCRIPTOR_LEFT, str(root)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    said = done.stdout
    assert said.startswith("STORAGE_ERROR ") and "Too many open files" in said, said
    assert "ulimit -n" in said, said
    assert "aside" not in said and "chmod" not in said, said
    assert sorted(os.listdir(root / "wal")), "the journal is where it was"


def _snapshot_temp(fd: int) -> bool:
    return ".snap." in os.readlink(f"/proc/self/fd/{fd}")


def test_a_close_fsyncs_its_snapshot_files_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop's compaction writes one snapshot per Run written since the last one: fsynced
    one after another, each waited for a journal commit of its own (10,000 waiting Runs took
    a stop past its 10 s bound, 33 s on a busy disk). Together, the file system commits
    them at once; each is still fsynced before any is renamed."""
    store = open_store(tmp_path / "runtime")
    for i in range(8):
        for record in walk(f"RUN-{i}", 3, i):
            store.append(f"RUN-{i}", record)
    store.sync_blocking()
    real_fsync = os.fsync
    two_at_once = threading.Barrier(2)
    met: list[bool] = []

    def fsync(fd: int) -> None:
        if not met and _snapshot_temp(fd):
            # The first two snapshot fsyncs meet here only if they are in flight together.
            with contextlib.suppress(threading.BrokenBarrierError):
                two_at_once.wait(timeout=2.0)
                met.append(True)
            two_at_once.abort()  # and never again: later fsyncs pass straight through
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    store.close_blocking()
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert met, "the close fsynced its snapshot files one after another"
    assert len(list((tmp_path / "runtime" / "snap" / "live").iterdir())) == 8
    report = read_runs_report(tmp_path / "runtime")
    assert sorted(j.status for j in report.runs) == ["ok"] * 8
    assert report.stats.records_decoded == 0  # a clean close: the snapshots say it all


def test_snapshot_files_fsynced_together_are_renamed_only_if_every_one_is_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from intloom.store.files import atomic_write_many

    items = [(f"RUN-{i:04d}.snap", f"state {i}".encode()) for i in range(10)]
    atomic_write_many(tmp_path, items, at_once=True)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == dict(items)
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if ".RUN-0007.snap." in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError) as info:
        atomic_write_many(tmp_path, [(name, b"newer") for name, _ in items], at_once=True)
    assert info.value.errno == errno.EIO
    # One group: nothing renamed, no temp file left.
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == dict(items)


def test_a_host_removes_the_temp_files_a_killed_compaction_left(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    # A real SIGKILL between the snapshot temps' fsync and their renames (close compacts).
    child = run_child(root, """
        import os, signal
        store = open_store(root)
        for i in range(3):
            for record in walk(f"RUN-{i}", 12, i):
                store.append(f"RUN-{i}", record)
        store.sync_blocking()
        real_rename = os.rename
        def rename(src, dst, *args, **kwargs):
            if str(src).endswith(".tmp"):
                os.kill(os.getpid(), signal.SIGKILL)
            return real_rename(src, dst, *args, **kwargs)
        os.rename = rename
        store.close_blocking()
    """)
    assert child.returncode == -9, child.stderr
    live = root / "snap" / "live"
    left = [p.name for p in live.iterdir() if p.name.endswith(".tmp")]
    assert len(left) == 3, left
    # Dot files that are not ours (by name or by kind) stay exactly as they are.
    notes = live / ".notes.tmp"
    notes.write_bytes(b"someone else's\x00bytes")
    lookalike_dir = live / f".{'a' * 64}.snap.{'0' * 16}.tmp"
    lookalike_dir.mkdir()
    wanted = {run_id: j.state for run_id, j in by_id(read_runs(root)).items()}
    assert sorted(wanted) == ["RUN-0", "RUN-1", "RUN-2"]

    store = open_store(root)
    try:
        assert {r.run_id: r.state for r in store.restored.runs} == wanted
        assert not [n for n in left if (live / n).exists()], "a leftover temp file was kept"
        assert notes.read_bytes() == b"someone else's\x00bytes"
        assert lookalike_dir.is_dir()
    finally:
        store.close_blocking()
    assert {run_id: j.state for run_id, j in by_id(read_runs(root)).items()} == wanted


def test_unexpected_files_in_the_store_are_reported_and_kept(
        tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    _fill(root, runs=2, n=20)
    before = {j.run_id: j.state for j in read_runs(root)}
    strays = {"junk.txt": b"root", "snap/notes": b"snap", "snap/done/old.snap": b"done",
              "snap/live/x.txt": b"live", "wal/readme": b"wal"}
    for rel, data in strays.items():
        (root / rel).write_bytes(data)
    restored = read_runs_report(root)
    # A start does not list snap/done (one file per ended Run); a verify reads it all.
    assert sorted(f.path for f in restored.files if f.kind == "unexpected") == sorted(
        rel for rel in strays if not rel.startswith("snap/done/"))
    verified = verify_report(root)
    assert sorted(f.path for f in verified.files if f.kind == "unexpected") == sorted(strays)
    assert {rel: (root / rel).read_bytes() for rel in strays} == strays
    assert {j.run_id: j.state for j in restored.runs} == before  # nothing else changed


@pytest.mark.parametrize("change", ["truncate", "chmod"])
def test_a_segment_changed_under_the_writer_is_told_at_its_seal(
        tmp_path: Path, change: str) -> None:
    """Cut short or opened to others by another program while a host appends to it: the
    host goes on by descriptor, and says so (store_file_problem) when it seals it."""
    root = tmp_path / "runtime"
    records = walk("RUN-A", 30, 3)
    store = open_store(root)
    try:
        for record in records[:20]:
            store.append("RUN-A", record)
        store.sync_blocking()
        [segment] = sorted((root / "wal").iterdir())
        if change == "truncate":
            os.truncate(segment, segment.stat().st_size - 40)
        else:
            os.chmod(segment, 0o640)
        for record in records[20:]:
            store.append("RUN-A", record)
        store.sync_blocking()
    finally:
        store.close_blocking()
    [told] = store.kept_files
    assert (told.path, told.kind) == (f"wal/{segment.name}", "corrupt")
    if change == "truncate":
        found = re.match(r"is (\d+) bytes, but this host made it (\d+) \(its frames end at "
                         r"\d+\): another program cut it short or wrote to it while the host "
                         r"ran", told.problem)
        assert found is not None, told
        assert int(found[2]) - int(found[1]) == 40
    else:
        assert told.problem == ("has mode 0640; private files must be 0600 (changed while "
                                "this host wrote it)")
    assert _mode(segment) == (0o640 if change == "chmod" else 0o600)  # never "fixed"


def test_a_manifest_replaced_by_a_directory_while_the_writer_runs_is_told_and_kept(
        tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    records = walk("RUN-A", 12, 3)
    store = open_store(root)
    try:
        for record in records[:6]:
            store.append("RUN-A", record)
        store.sync_blocking()
        (root / "manifest.json").rename(tmp_path / "manifest.json")
        (root / "manifest.json").mkdir(mode=0o700)
        (root / "manifest.json" / "inside").write_bytes(b"keep")
        for record in records[6:]:
            store.append("RUN-A", record)
        store.sync_blocking()
    finally:
        store.close_blocking()
    [told] = store.kept_files
    assert (told.path, told.kind) == ("manifest.json", "corrupt")
    assert told.problem.startswith("is not a regular file; no new manifest is written over "
                                   "it, so the next start reads every segment"), told
    assert (root / "manifest.json" / "inside").read_bytes() == b"keep"
    report = read_runs_report(root)
    assert [f.path for f in report.files] == ["manifest.json"] and report.stats.full
    assert by_id(report.runs)["RUN-A"].state == fold(records)


@pytest.mark.parametrize("closing", ["blocking", "async"])
def test_a_store_never_begun_writes_nothing_and_leaves_a_crash_to_the_next(
        tmp_path: Path, closing: str) -> None:
    """The host opens its store before it listens and begins it (its segment, the manifest,
    the crashed host's leftovers summarised) only once nothing but a stop can end its start:
    a start that fails in between leaves the runtime directory byte for byte as it found it,
    a crash's unsealed segment and all, for the next start to summarise."""
    import asyncio

    root = tmp_path / "runtime"
    _fill(root, close=False)  # a crashed host's segment, not summarised yet
    before = snapshot_files(root)
    store = open_store(root, begin=False)
    assert {r.run_id for r in store.restored.runs} == {"RUN-0", "RUN-1", "RUN-2"}
    with pytest.raises(RuntimeError, match=r"before Store\.begin"):
        store.append("RUN-9", walk("RUN-9", 1, 9)[0])
    if closing == "blocking":
        store.close_blocking()
    else:
        asyncio.run(store.close())
    assert snapshot_files(root) == before
    # The next store begins as after any crash: its own segment, the leftovers summarised.
    nxt = open_store(root)
    nxt.close_blocking()
    assert sorted(p.name for p in (root / "wal").iterdir()) == ["0000000001.seg",
                                                                "0000000002.seg"]
    assert {p.name for p in (root / "snap" / "live").iterdir()} == {
        snapshot_name(f"RUN-{i}") for i in range(3)}


def test_a_segment_begun_with_no_descriptor_left_names_the_limit(tmp_path: Path) -> None:
    """The host's check before it listens keeps a descriptor for the segment, but Workflow
    threads may take it meanwhile: ``begin`` out of descriptors says so, not "check the
    disk"."""
    import resource

    root = tmp_path / "runtime"
    store = open_store(root, begin=False)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    taken: list[int] = []
    try:
        # No descriptor number left below the limit: each hole below it filled first.
        highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1, hard))
        with contextlib.suppress(OSError):
            while True:
                taken.append(os.open(os.devnull, os.O_RDONLY))
        with pytest.raises(IntloomError) as refused:
            store.begin()
    finally:
        for fd in taken:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    store.close_blocking()
    assert refused.value.code == "STORAGE_ERROR", refused.value
    assert "ulimit -n" in refused.value.message, refused.value.message
    assert "check the disk" not in refused.value.message, refused.value.message
    assert not list((root / "wal").iterdir())
