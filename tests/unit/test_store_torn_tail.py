"""A crash mid-append leaves a torn tail: the journal ends at the previous record, and that is
not corruption. Crashes are real: a child process SIGKILLs itself at the injected point."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest

from intloom.runtime.machine import fold
from intloom.store import read_history, read_runs, read_runs_report, verify
from intloom.store.framing import scan_segment
from tests.helpers import snapshot_files
from tests.unit.test_store_support import by_id, open_store, run_child, walk

CHILD = """
store = open_store(root)
a, b = walk("RUN-A", 8, 1), walk("RUN-B", 8, 2)
for i in range(3):
    store.append("RUN-A", a[i])
    store.append("RUN-B", b[i])
store.sync_blocking()                       # flush 1: both Runs, three records each
store.append("RUN-A", a[3]); store.sync_blocking()   # flush 2: RUN-A only
store.append("RUN-B", b[3]); store.sync_blocking()   # flush 3: RUN-B only
print("survived")
"""


def _child(root: Path, fault: str) -> None:
    proc = run_child(root, CHILD, fault)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr)
    assert "survived" not in proc.stdout


def test_torn_write_ends_the_journal_at_the_previous_record(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    _child(root, "torn_write=2")
    before = snapshot_files(root)
    runs = by_id(read_runs(root))
    a, b = walk("RUN-A", 8, 1), walk("RUN-B", 8, 2)
    assert runs["RUN-A"].status == "ok" and runs["RUN-A"].torn_tail
    assert runs["RUN-A"].state == fold(a[:3])
    assert runs["RUN-B"].status == "ok" and not runs["RUN-B"].torn_tail
    assert runs["RUN-B"].state == fold(b[:3])
    report = read_runs_report(root)
    assert [(f.path, f.kind) for f in report.files] == [("wal/0000000001.seg", "torn")]
    history = read_history(root, "RUN-A")
    assert [h.verdict for h in history] == ["ok", "ok", "ok", "torn"]
    assert snapshot_files(root) == before

    # A new host restores RUN-A at record 3 and carries on with the same seq 4.
    store = open_store(root, instance_id="INST-2")
    assert by_id(store.restored.runs)["RUN-A"].torn_tail
    store.append("RUN-A", a[3])
    store.sync_blocking()
    store.close_blocking()
    after = by_id(read_runs(root))
    assert after["RUN-A"].state == fold(a[:4]) and not after["RUN-A"].torn_tail
    assert (root / "wal" / "0000000001.seg").read_bytes() == before["wal/0000000001.seg"]
    full = by_id(verify(root))
    assert full["RUN-A"].status == "ok" and full["RUN-A"].state == fold(a[:4])


def test_crash_before_fdatasync_keeps_what_reached_the_page_cache(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    _child(root, "crash_before_sync=2")
    runs = by_id(read_runs(root))
    # The OS outlived the process: the unsynced batch is on disk and reads as valid.
    assert runs["RUN-A"].state == fold(walk("RUN-A", 8, 1)[:4])
    assert not runs["RUN-A"].torn_tail


def test_crash_after_fdatasync_loses_nothing(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    _child(root, "crash_after_sync=3")
    runs = by_id(read_runs(root))
    assert runs["RUN-A"].state == fold(walk("RUN-A", 8, 1)[:4])
    assert runs["RUN-B"].state == fold(walk("RUN-B", 8, 2)[:4])
    assert not any(j.torn_tail for j in runs.values())


@pytest.mark.parametrize("keep", [1, 5, 12, 13, 30, -1])
def test_a_truncated_copy_is_a_torn_tail_at_every_cut(tmp_path: Path, keep: int) -> None:
    """Cut the last frame anywhere (in its header, run id or payload): same verdict."""
    src = tmp_path / "src"
    store = open_store(src)
    a = walk("RUN-A", 6, 4)
    for record in a:
        store.append("RUN-A", record)
        store.sync_blocking()
    store._stop_worker()  # crash-like: no seal, no snapshots
    segment = src / "wal" / "0000000001.seg"
    last = scan_segment(segment.name, 1, segment.read_bytes()).frames[-1]
    copy = tmp_path / "copy"
    shutil.copytree(src, copy)
    cut = last.offset + (keep if keep > 0 else (last.end - last.offset) + keep)
    with open(copy / "wal" / "0000000001.seg", "r+b") as fh:
        fh.truncate(cut)
    journal = by_id(read_runs(copy))["RUN-A"]
    assert journal.status == "ok" and journal.state == fold(a[:5])
    # A torn frame is attributed once its header and run id made it to disk.
    assert journal.torn_tail == (cut - last.offset >= 23 + len("RUN-A"))
