"""A project directory moved (or renamed) while its host ran: the store's closing snapshots
and manifest were written by the old path. With a copy of the project put back there
(``cp -a``), they landed in the copy's runtime directory, beside another journal."""

from __future__ import annotations

import shutil
from pathlib import Path

from intloom.store import read_runs_report
from tests.helpers import snapshot_files
from tests.unit.test_store_support import by_id, open_store, walk

A = walk("RUN-A", 8, 1)


def test_a_store_whose_directory_moved_writes_nothing_into_a_copy_at_the_old_path(
        tmp_path: Path) -> None:
    root = tmp_path / "proj" / "runtime"
    store = open_store(root)
    for record in A[:4]:
        store.append("RUN-A", record)
    store.sync_blocking()
    moved = tmp_path / "moved"
    (tmp_path / "proj").rename(moved)
    shutil.copytree(moved, tmp_path / "proj", symlinks=True)  # the copy put back
    copied = snapshot_files(root)
    for record in A[4:]:
        store.append("RUN-A", record)
    store.sync_blocking()
    store.close_blocking()

    assert snapshot_files(root) == copied  # the copy: not a byte written
    [(exc, when)] = store.unsummarised
    assert when == "stop" and exc.what == "snapshots", exc
    assert (f"the runtime directory this host opened was moved while it ran; it is now "
            f"{moved / 'runtime'}, and {root} is another directory, so nothing was written "
            "by that path") == exc.cause
    assert exc.fix is not None and "After moving a project directory" in exc.fix
    # Where it went, the log holds every record (sealed through the segment's descriptor):
    # the next start there restores the Run to its last record, reading the segment.
    assert by_id(read_runs_report(moved / "runtime").runs)["RUN-A"].state.seq == len(A)
    # And the copy restores the Run as it was copied.
    assert by_id(read_runs_report(root).runs)["RUN-A"].state.seq == 4


def test_a_store_whose_directory_moved_rotates_no_segment_into_the_old_path(
        tmp_path: Path) -> None:
    """The same move under a busy host: a rotation created its new segment (and its
    compaction the snapshots and manifest) by the old path, in the copy's wal/."""
    records = walk("RUN-B", 40, 2)
    root = tmp_path / "proj" / "runtime"
    store = open_store(root, segment_bytes=1024)
    store.append("RUN-B", records[0])
    store.sync_blocking()
    moved = tmp_path / "moved"
    (tmp_path / "proj").rename(moved)
    shutil.copytree(moved, tmp_path / "proj", symlinks=True)
    copied = snapshot_files(root)
    for record in records[1:]:
        store.append("RUN-B", record)
        store.sync_blocking()
    store.close_blocking()

    assert snapshot_files(root) == copied
    assert [(exc.what, when) for exc, when in store.unsummarised] == [
        ("segment", "rotation"), ("snapshots", "stop")]  # the rotation said once
    assert sorted(p.name for p in (moved / "runtime" / "wal").iterdir()) == ["0000000001.seg"]
    assert by_id(read_runs_report(moved / "runtime").runs)["RUN-B"].state.seq == len(records)


def test_a_wal_directory_swapped_for_a_link_gets_no_segment_through_it(
        tmp_path: Path) -> None:
    """Replaced by a link while the writer runs, ``wal/`` is not rotated into: the open
    segment grows on (by its descriptor), the refusal is told once, and once ``wal/`` is put
    back every record is in it."""
    from intloom.runtime.machine import fold

    root = tmp_path / "runtime"
    real = tmp_path / "wal-real"
    records = walk("RUN-A", 3_000, 3)
    store = open_store(root, segment_bytes=64 << 10)
    try:
        store.append("RUN-A", records[0])
        store.sync_blocking()
        (root / "wal").rename(real)
        (root / "wal").symlink_to(real)
        for i, record in enumerate(records[1:], 1):
            store.append("RUN-A", record)
            if i % 100 == 0:
                store.sync_blocking()
        store.sync_blocking()
    finally:
        store.close_blocking()
    assert [p.name for p in real.iterdir()] == ["0000000001.seg"]  # nothing through the link
    told = [(exc.what, exc.cause) for exc, when in store.unsummarised if when == "rotation"]
    wal = root / "wal"
    assert told == [("segment", f"Checkpoint store path {wal} is a symbolic link; intloom "
                     f"never follows links in its state; it leads to the directory {real}: "
                     f"to use that directory, put it in the link's place (rm {wal}; mv "
                     f"{real} {wal}) or bind-mount it at {wal}; then try again. Moved aside "
                     "instead, the link is replaced by a new, empty directory, without what "
                     f"{real} holds.")], told
    (root / "wal").unlink()  # as told
    real.rename(root / "wal")
    report = read_runs_report(root)
    assert by_id(report.runs)["RUN-A"].state == fold(records)
