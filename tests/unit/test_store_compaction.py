"""Restores read snapshots plus a bounded tail of the log, whatever a Run's age; terminal Runs
cost startup nothing. Costs are asserted from the reader's own counters, never from timing."""

from __future__ import annotations

import contextlib
import errno
import json
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import intloom.store.writer as writer
from intloom.runtime.machine import fold
from intloom.store import FaultPlan, read_history, read_runs, read_runs_report, verify
from intloom.store.compaction import NotSummarised
from tests.helpers import eventually
from tests.unit.test_store_support import abandon, by_id, open_store, walk

SEGMENT = 64 << 10


def _write(root: Path, run_id: str, records: list, *, batch: int = 500,  # type: ignore[type-arg]
           crash: bool = True) -> None:
    store = open_store(root, segment_bytes=SEGMENT)
    for start in range(0, len(records), batch):
        for record in records[start : start + batch]:
            store.append(run_id, record)
        store.sync_blocking()
    if crash:
        abandon(store)
    else:
        store.close_blocking()


def test_restoring_an_old_run_reads_a_bounded_tail(tmp_path: Path) -> None:
    long = walk("RUN-LONG", 20_000, 7)
    short = walk("RUN-SHORT", 100, 8)
    _write(tmp_path / "long", "RUN-LONG", long, batch=300)  # leaves a 200-record tail
    _write(tmp_path / "short", "RUN-SHORT", short)

    long_report = read_runs_report(tmp_path / "long")
    short_report = read_runs_report(tmp_path / "short")
    [journal] = long_report.runs
    assert journal.status == "ok" and journal.state == fold(long)
    assert len(list((tmp_path / "long" / "wal").iterdir())) > 10  # it did rotate
    # At most the segment the crash left open (plus one batch), never the Run's history.
    records_per_segment = SEGMENT // 100
    assert 0 < long_report.stats.records_decoded <= records_per_segment + 300
    assert long_report.stats.segments_read <= 2 and long_report.stats.snapshots_read == 1
    assert short_report.stats.records_decoded == 100

    # The whole log still holds every record: verify and inspect agree with the snapshot.
    [full] = verify(tmp_path / "long")
    assert full.status == "ok" and full.state == journal.state
    history = read_history(tmp_path / "long", "RUN-LONG")
    assert len(history) == 20_000 and all(h.verdict == "ok" for h in history)


def test_a_clean_close_leaves_nothing_to_replay(tmp_path: Path) -> None:
    records = walk("RUN-A", 3_000, 2)
    _write(tmp_path, "RUN-A", records, crash=False)
    report = read_runs_report(tmp_path)
    assert report.stats.segments_read == 0 and report.stats.records_decoded == 0
    assert report.runs[0].state == fold(records)


def test_repeated_crashes_do_not_grow_the_restore(tmp_path: Path) -> None:
    records = walk("RUN-A", 400, 3)
    for i in range(8):
        store = open_store(tmp_path, instance_id=f"INST-{i}")
        assert store.restored.stats.segments_read <= 1  # only the previous crash's segment
        for record in records[i * 50 : (i + 1) * 50]:
            store.append("RUN-A", record)
        store.sync_blocking()
        abandon(store)
    report = read_runs_report(tmp_path)
    assert report.stats.segments_read == 1 and report.stats.records_decoded == 50
    assert report.runs[0].state == fold(records)


def test_terminal_runs_cost_later_startups_nothing(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    for i in range(40):
        for record in walk(f"RUN-T{i:02d}", 8, i, terminal=True):
            store.append(f"RUN-T{i:02d}", record)
    live = walk("RUN-LIVE", 8, 99)
    for record in live:
        store.append("RUN-LIVE", record)
    store.sync_blocking()
    store.close_blocking()
    assert len(list((tmp_path / "snap" / "done").iterdir())) == 40
    report = read_runs_report(tmp_path)
    assert [j.run_id for j in report.runs] == ["RUN-LIVE"]  # terminal Runs are never restored
    assert report.stats.snapshots_read == 1 and report.stats.segments_read == 0
    assert report.runs[0].state == fold(live)
    everything = by_id(verify(tmp_path))
    assert len(everything) == 41
    assert everything["RUN-T07"].state == fold(walk("RUN-T07", 8, 7, terminal=True))


def test_a_run_ending_after_its_snapshot_moves_to_done(tmp_path: Path) -> None:
    records = walk("RUN-A", 10, 5, terminal=True)
    _write(tmp_path, "RUN-A", records[:6], crash=False)
    assert len(list((tmp_path / "snap" / "live").iterdir())) == 1
    store = open_store(tmp_path, instance_id="INST-2")
    for record in records[6:]:
        store.append("RUN-A", record)
    store.sync_blocking()
    store.close_blocking()
    assert not list((tmp_path / "snap" / "live").iterdir())
    assert read_runs(tmp_path) == []
    assert by_id(verify(tmp_path))["RUN-A"].state == fold(records)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 60),
    seed=st.integers(0, 10_000),
    data=st.data(),
)
def test_replaying_any_prefix_equals_folding_it(n: int, seed: int, data: st.DataObject) -> None:
    """Whatever the batching, rotation, crashes and host restarts, the store reads back the
    fold of exactly the records made durable."""
    records = walk("RUN-P", n, seed)
    k = data.draw(st.integers(1, n), label="prefix")
    segment = data.draw(st.sampled_from([400, 2_000, 1 << 20]), label="segment_bytes")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runtime"
        i = 0
        while i < k:
            store = open_store(root, segment_bytes=segment)
            hosts_share = data.draw(st.integers(1, k - i), label="host share")
            end = i + hosts_share
            while i < end:
                size = data.draw(st.integers(1, end - i), label="batch")
                for record in records[i : i + size]:
                    store.append("RUN-P", record)
                store.sync_blocking()
                i += size
            if data.draw(st.booleans(), label="crash"):
                abandon(store)
            else:
                store.close_blocking()
        expected = fold(records[:k])
        [journal] = read_runs(root)
        assert journal.status == "ok" and journal.state == expected
        [full] = verify(root)
        assert full.state == expected


def test_the_store_keeps_nothing_per_run_once_the_run_has_ended(tmp_path: Path) -> None:
    """A host's store kept the next seq of every Run it ever wrote (and a restore of every
    ended Run in the log it read): ~200 B per Run for the host's life, and the run id
    strings behind them pinned allocator memory. Only unfinished Runs keep one now."""
    root = tmp_path / "runtime"
    store = open_store(root)
    ended = {f"RUN-END-{i}": walk(f"RUN-END-{i}", 12, seed=i, terminal=True) for i in range(20)}
    open_ = {f"RUN-OPEN-{i}": walk(f"RUN-OPEN-{i}", 12, seed=i) for i in range(3)}
    for run_id, records in {**ended, **open_}.items():
        for record in records:
            store.append(run_id, record)
    store.sync_blocking()
    assert set(store._heads) == set(open_)
    abandon(store)  # a crash: the restore reads the ended Runs back from the log

    again = open_store(root)
    try:
        assert set(again._heads) == set(open_)
        run_id = "RUN-OPEN-0"  # an unfinished Run continues where its journal ended
        again.append(run_id, walk(run_id, 13, seed=0)[12])
        again.sync_blocking()
        assert [e.seq for e in read_history(root, run_id)] == list(range(1, 14))
    finally:
        again.close_blocking()


def test_compaction_idle_waits_for_the_compaction_a_rotation_started(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``scripts/bench`` waits on it between measurements, so that one measurement's
    snapshots never run into the next one (its baseline)."""
    release, started = _compactions_held(monkeypatch)
    store = open_store(tmp_path, segment_bytes=SEGMENT)
    try:
        assert store.compaction_idle(timeout=0)  # none yet
        for record in walk("RUN-A", 2_000, 3):
            store.append("RUN-A", record)
            if started.is_set():
                break
            store.sync_blocking()
        assert started.is_set(), "no rotation started a compaction"
        assert not store.compaction_idle(timeout=0.05)  # still held
        release.set()
        assert store.compaction_idle(timeout=10)
    finally:
        release.set()
        store.close_blocking()
def test_a_compaction_that_gets_no_thread_is_skipped_and_checkpoints_go_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Under a process or thread limit a rotation's compaction may find no thread. Skipped,
    # it costs a later restore some reading, said as a compaction that failed; raised, it
    # failed a batch already on disk and poisoned the writer, so that every later checkpoint
    # of the host failed ("internal error in the checkpoint writer").
    real_start = threading.Thread.start

    def no_compactor(self: threading.Thread) -> None:
        if self.name == "intloom-compact":
            raise RuntimeError("can't start new thread")
        real_start(self)

    records = walk("RUN-A", 2_000, 3)
    store = open_store(tmp_path, segment_bytes=SEGMENT)
    monkeypatch.setattr(threading.Thread, "start", no_compactor)
    for first in range(0, len(records), 200):
        for record in records[first : first + 200]:
            store.append("RUN-A", record)
        store.sync_blocking()
    monkeypatch.undo()
    assert len(list((tmp_path / "wal").iterdir())) > 2  # it did rotate
    skipped = {(exc.what, when) for exc, when in store.unsummarised}
    assert skipped == {("snapshots", "rotation")}
    assert "no thread could be started" in store.unsummarised[0][0].cause
    assert "ulimit -u" in (store.unsummarised[0][0].fix or "")
    store.close_blocking()
    [journal] = read_runs(tmp_path)
    assert journal.status == "ok" and journal.state == fold(records)


def test_a_rotation_that_fails_is_told_once_and_not_tried_at_every_flush(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Out of descriptors (a Step holding them, ulimit -n), a rotation creates its segment,
    # then cannot open the directory to fsync it. Tried again at every flush, each attempt
    # left one more header-only segment: ~10,000 files in seconds, and nothing said why.
    def no_descriptor(path: Path) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    records = walk("RUN-A", 2_000, 5)
    store = open_store(tmp_path, segment_bytes=SEGMENT)
    monkeypatch.setattr(writer, "fsync_dir", no_descriptor)
    for first in range(0, len(records), 10):  # 200 flushes, ~200 KB: ~3 segments' worth
        for record in records[first : first + 10]:
            store.append("RUN-A", record)
        store.sync_blocking()
    monkeypatch.undo()
    segments = list((tmp_path / "wal").iterdir())
    assert len(segments) <= 5, len(segments)  # one try per segment's worth written
    told = [(exc.what, when) for exc, when in store.unsummarised]
    assert told == [("segment", "rotation")], told
    assert "ulimit -n" in (store.unsummarised[0][0].fix or "")
    store.close_blocking()
    [journal] = read_runs(tmp_path)
    assert journal.status == "ok" and journal.state == fold(records)


def test_a_segment_after_a_failed_rotation_rotates_at_the_usual_size(tmp_path: Path) -> None:
    # A rotation that cannot create its segment (a full disk) is tried again once another
    # segment's worth is written. The retry point was measured in the failed segment's
    # bytes and kept after the retry succeeded: the next segment grew to the failed one's
    # size before it rotated (after a long disk-full episode, hundreds of MB that a restore
    # after a crash decodes, instead of at most ``segment_bytes``).
    records = walk("RUN-A", 4_000, 5)
    store = open_store(tmp_path, segment_bytes=SEGMENT,
                       faults=FaultPlan(fail_segment=frozenset({2})))  # the 1st rotation's
    for first in range(0, len(records), 10):
        for record in records[first : first + 10]:
            store.append("RUN-A", record)
        store.sync_blocking()
    store.close_blocking()
    sizes = [p.stat().st_size for p in sorted((tmp_path / "wal").iterdir())]
    assert sizes[0] >= 2 * SEGMENT, sizes  # the failed rotation: it grew one more segment
    assert all(size < SEGMENT + (8 << 10) for size in sizes[1:]), sizes  # one batch past
    assert len(sizes) >= 4, sizes
    [journal] = read_runs(tmp_path)
    assert journal.status == "ok" and journal.state == fold(records)


def test_a_rotation_an_immutable_wal_refuses_names_the_flag_not_free_disk_space(
    tmp_path: Path,
) -> None:
    """A rotation whose new segment wal/ refused (chattr +i: EPERM) said, in the log and in
    status, "Free disk space, or file descriptors (ulimit -n)": it now says what refused."""
    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed")
    told: list[NotSummarised] = []
    records = walk("RUN-A", 4_000, 5)
    store = open_store(tmp_path, segment_bytes=SEGMENT)
    store.on_unsummarised = lambda exc, when: told.append(exc)
    wal = tmp_path / "wal"
    if subprocess.run(["chattr", "+i", str(wal)], capture_output=True).returncode != 0:
        store.close_blocking()
        pytest.skip("chattr +i is not supported here (CAP_LINUX_IMMUTABLE, filesystem)")
    try:
        for first in range(0, len(records), 10):
            for record in records[first : first + 10]:
                store.append("RUN-A", record)
            store.sync_blocking()
    finally:
        subprocess.run(["chattr", "-i", str(wal)], check=True)
    store.close_blocking()
    [refused] = [exc for exc in told if exc.what == "segment"]
    assert f"{wal} is immutable (chattr +i)" in str(refused.fix), refused.fix
    assert f"chattr -i {wal}" in str(refused.fix), refused.fix
    assert "Free disk space" not in str(refused.fix), refused.fix


def test_a_stops_bound_on_the_close_grows_with_the_snapshots_it_writes(tmp_path: Path) -> None:
    """A close writes one snapshot per Run written since its last: a fixed 10 s cut a stop
    with 10,000 new waiting Runs short (~0.35 ms a snapshot measured, on a busy 2-vCPU VM),
    and the next start read the whole log and wrote them all again."""
    from intloom.host.daemon import store_close_bound

    store = open_store(tmp_path)
    for i in range(3):
        for record in walk(f"RUN-{i}", 4, i):
            store.append(f"RUN-{i}", record)
    store.sync_blocking()
    assert store.snapshots_due() == 3
    store.close_blocking()
    assert store.snapshots_due() == 0
    assert store_close_bound(0) == 10.0
    assert store_close_bound(20_000) >= 20_000 * 0.00035 * 2  # twice the measured cost


def test_a_close_stops_a_rotations_compaction_and_writes_its_snapshots_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rotation's compaction fsyncs one snapshot after another (15 s for 10,700 Runs at
    load 6); a close waited for all of it before writing every snapshot again, together, and
    the stop's bound on the close, which counts only those, cut it short. The close now
    stops that compaction after the group of files it is writing, and writes the rest."""
    import intloom.store.files as files
    from intloom.fsutil import replace_files

    real = replace_files
    groups: list[str] = []  # the thread that wrote each group of live/ snapshot files
    writing = threading.Event()  # the compaction is at its first group of live/ files
    store = open_store(tmp_path, segment_bytes=SEGMENT)

    def closing() -> bool:
        flag = getattr(store, "_closing", None)
        return isinstance(flag, threading.Event) and flag.is_set()

    def held(directory: Path, group: list[tuple[str, bytes]], **kwargs: Any) -> None:
        name = threading.current_thread().name
        if name == "intloom-compact" and directory.name == "live" and not groups:
            writing.set()
            # Its first group is held until the close has begun (not past 5 s: an intloom
            # whose close does not say so lets the compaction write everything).
            with contextlib.suppress(AssertionError):
                eventually(lambda: closing() or None, timeout=5, what="the close to begin")
        if directory.name == "live":
            groups.append(name)
        real(directory, group, **kwargs)

    monkeypatch.setattr(files, "replace_files", held)
    runs: list[str] = []
    while store._compactor is None and len(runs) < 2_000:  # Runs until the log rotates
        run_id = f"RUN-{len(runs):04d}"
        for record in walk(run_id, 8, len(runs)):
            store.append(run_id, record)
        store.sync_blocking()
        runs.append(run_id)
    assert store._compactor is not None, "no rotation started a compaction"
    assert len(runs) > 64, len(runs)  # more than one group of snapshot files for it
    # The close begins once the compaction writes (begun before, it stops the compaction
    # before its first group, which tells nothing of a group under way).
    assert writing.wait(timeout=10), "the rotation's compaction never wrote its snapshots"
    store.close_blocking()
    assert groups.count("intloom-compact") == 1, groups  # then it stopped
    assert groups.count("MainThread") == -(-len(runs) // 64), groups  # the close: every Run
    journals = read_runs(tmp_path)
    assert sorted(j.run_id for j in journals) == runs
    assert all(j.status == "ok" for j in journals)
    assert len(list((tmp_path / "snap" / "live").iterdir())) == len(runs)


def test_a_fifo_planted_at_a_snapshot_before_a_rotation_is_kept(tmp_path: Path) -> None:
    """A compaction behind a rotation leaves a file planted at a Run's snapshot name as it
    is, tells of it once, writes the other Runs' snapshots, and looks again next time."""
    import os
    import stat

    from intloom.store.snapshots import snapshot_name

    planted = tmp_path / "snap" / "live" / snapshot_name("RUN-A")
    store = open_store(tmp_path, segment_bytes=SEGMENT)
    a, b = walk("RUN-A", 3_000, 3), walk("RUN-B", 3_000, 4)
    try:
        store.append("RUN-A", a[0])
        store.sync_blocking()
        os.mkfifo(planted, 0o600)
        for i in range(1, 3_000):
            store.append("RUN-A", a[i])
            store.append("RUN-B", b[i - 1])
            if i % 100 == 0:
                store.sync_blocking()
        store.sync_blocking()
        assert store.compaction_idle(timeout=30)
        assert stat.S_ISFIFO(os.lstat(planted).st_mode)
        assert (tmp_path / "snap" / "live" / snapshot_name("RUN-B")).is_file()
        assert [p.path for p in store.kept_files] == [f"snap/live/{planted.name}"]
    finally:
        store.close_blocking()
    assert stat.S_ISFIFO(os.lstat(planted).st_mode)
    report = read_runs_report(tmp_path)
    assert [f.path for f in report.files] == [f"snap/live/{planted.name}"]
    assert report.stats.full  # the log stands in for the planted file
    runs = by_id(report.runs)
    assert runs["RUN-A"].state == fold(a[:3_000])
    assert runs["RUN-B"].state == fold(b[:2_999])


def test_an_ended_runs_planted_live_file_is_not_unlinked(tmp_path: Path) -> None:
    import os
    import stat

    from intloom.store.snapshots import snapshot_name

    records = walk("RUN-A", 10, 5, terminal=True)
    _write(tmp_path, "RUN-A", records[:6], crash=False)
    live = tmp_path / "snap" / "live" / snapshot_name("RUN-A")
    store = open_store(tmp_path, instance_id="INST-2")
    try:
        for record in records[6:]:
            store.append("RUN-A", record)
        store.sync_blocking()
        live.unlink()
        os.mkfifo(live, 0o600)
    finally:
        store.close_blocking()
    assert stat.S_ISFIFO(os.lstat(live).st_mode)  # neither renamed over nor unlinked
    assert [p.path for p in store.kept_files] == [f"snap/live/{live.name}"]
    assert by_id(verify(tmp_path))["RUN-A"].state == fold(records)


def _damage_in_place(path: Path) -> bytes:
    """Write over ``path``'s bytes through the same inode, as an editor or a stray ``>``
    does: still a private regular file of ours, only its content is wrong."""
    damaged = b"GARBAGE-EVIDENCE"
    with open(path, "r+b") as fh:
        fh.truncate(0)
        fh.write(damaged)
    return damaged


def _both(store: writer.Store, a: list[Any], b: list[Any], steps: range) -> None:
    """Append RUN-A's and RUN-B's records ``steps``, a flush every 100 (segments rotate
    on the way), then wait for the compaction the last rotation started."""
    for i in steps:
        store.append("RUN-A", a[i])
        store.append("RUN-B", b[i])
        if i % 100 == 0:
            store.sync_blocking()
    store.sync_blocking()
    assert store.compaction_idle(timeout=30)


def test_a_snapshot_damaged_after_this_host_wrote_it_is_never_renamed_over(
        tmp_path: Path) -> None:
    """A live/ snapshot this host wrote, damaged while it ran: a restore (doctor) reports it
    and says it was "left as it is", and the next compaction renamed a new snapshot over it.
    It is kept byte-identical through later rotations and the close, told of once, and the
    log stands in for it."""
    from intloom.store.snapshots import snapshot_name

    live = tmp_path / "snap" / "live" / snapshot_name("RUN-A")
    store = open_store(tmp_path, segment_bytes=SEGMENT)
    a, b = walk("RUN-A", 6_000, 3), walk("RUN-B", 6_000, 4)
    try:
        _both(store, a, b, range(3_000))
        assert live.is_file()  # written by this host's rotation
        damaged = _damage_in_place(live)
        _both(store, a, b, range(3_000, 6_000))
        assert live.read_bytes() == damaged
        assert [p.path for p in store.kept_files] == [f"snap/live/{live.name}"]
        assert "was changed since this host wrote it" in store.kept_files[0].problem
    finally:
        store.close_blocking()
    assert live.read_bytes() == damaged  # the close's snapshots did not replace it either
    report = read_runs_report(tmp_path)
    assert f"snap/live/{live.name}" in [f.path for f in report.files]
    runs = by_id(report.runs)
    assert runs["RUN-A"].state == fold(a)
    assert runs["RUN-B"].state == fold(b)


@pytest.mark.parametrize("moved_out", [False, True])
def test_an_older_snapshot_put_back_while_the_host_ran_never_rolls_its_run_back(
        tmp_path: Path, moved_out: bool) -> None:
    """An older, whole snapshot of a Run copied back over the one this host wrote (a backup
    put back) is kept, as a damaged one is, but it reads as a good snapshot: named in the
    manifest's live set, the next restore trusted it and read only from the manifest's
    start, and the Run came back at the older copy's seq, with no finding. Every restore
    reads the whole log instead, also once the file is moved out."""
    import os
    import shutil

    from intloom.store.snapshots import snapshot_name

    live = tmp_path / "snap" / "live" / snapshot_name("RUN-A")
    store = open_store(tmp_path, segment_bytes=SEGMENT)
    a, b = walk("RUN-A", 6_000, 3), walk("RUN-B", 6_000, 4)
    old = tmp_path / "older.snap"
    try:
        _both(store, a, b, range(2_000))
        shutil.copy2(live, old)  # a backup, taken while the host ran
        _both(store, a, b, range(2_000, 4_000))
        with open(live, "r+b") as fh:  # put back in place
            fh.truncate(0)
            fh.write(old.read_bytes())
        _both(store, a, b, range(4_000, 6_000))
        assert live.read_bytes() == old.read_bytes()
        assert [p.path for p in store.kept_files] == [f"snap/live/{live.name}"]
    finally:
        store.close_blocking()
    assert live.read_bytes() == old.read_bytes()
    if moved_out:
        os.rename(live, tmp_path / "moved-out.snap")
    report = read_runs_report(tmp_path)
    assert report.stats.full  # the whole log, not the older copy and the tail after start
    runs = by_id(report.runs)
    assert runs["RUN-A"].status == "ok" and runs["RUN-A"].state == fold(a)
    assert runs["RUN-B"].state == fold(b)


def test_a_snapshot_touched_or_copied_back_unchanged_is_still_this_hosts(
        tmp_path: Path) -> None:
    """Its bytes the ones this host wrote (a touch, a backup tool putting back what it
    copied): no change, so it is written over as usual, and nothing is told."""
    import os
    import shutil

    from intloom.store.snapshots import snapshot_name

    live = tmp_path / "snap" / "live" / snapshot_name("RUN-A")
    store = open_store(tmp_path, segment_bytes=SEGMENT)
    a = walk("RUN-A", 6_000, 3)
    try:
        for i in range(6_000):
            store.append("RUN-A", a[i])
            if i % 100 == 0:
                store.sync_blocking()
                if i == 3_000:
                    assert store.compaction_idle(timeout=30)
                    os.utime(live, (1, 1))  # touched
                    copy = tmp_path / "copy.snap"
                    shutil.copy2(live, copy)
                    os.replace(copy, live)  # another inode, the same bytes
        store.sync_blocking()
        assert store.compaction_idle(timeout=30)
        assert store.kept_files == []
    finally:
        store.close_blocking()
    report = read_runs_report(tmp_path)
    assert not report.stats.full and report.files == []
    assert by_id(report.runs)["RUN-A"].state == fold(a)


def test_an_ended_runs_snapshot_damaged_while_the_host_ran_is_not_unlinked(
        tmp_path: Path) -> None:
    """The snapshot an earlier host wrote, read whole by this host's restore, damaged while
    this host ran: once the Run ended, its live/ copy was unlinked without a word. It is
    read before it is removed (this host never wrote it), and kept."""
    records = walk("RUN-A", 10, 5, terminal=True)
    _write(tmp_path, "RUN-A", records[:6], crash=False)
    from intloom.store.snapshots import snapshot_name

    live = tmp_path / "snap" / "live" / snapshot_name("RUN-A")
    store = open_store(tmp_path, instance_id="INST-2")
    try:
        damaged = _damage_in_place(live)
        for record in records[6:]:
            store.append("RUN-A", record)
        store.sync_blocking()
    finally:
        store.close_blocking()
    assert live.read_bytes() == damaged
    assert [p.path for p in store.kept_files] == [f"snap/live/{live.name}"]
    assert by_id(verify(tmp_path))["RUN-A"].state == fold(records)


def test_a_snapshot_or_manifest_its_owner_cannot_read_is_that_files_finding(
    tmp_path: Path,
) -> None:
    """``chmod 000`` on one Run's snapshot (or on the manifest) refused the whole store with
    STORAGE_ERROR where the mode binds (no Run restored; verify and inspect failed), and a
    compaction renamed over it where it does not (root). It is judged from its mode: that
    Run is read from the log, the others from their snapshots, and the file is kept."""
    import os
    import stat

    from intloom.store.snapshots import snapshot_name

    store = open_store(tmp_path)
    a, b = walk("RUN-A", 5, 1), walk("RUN-B", 5, 2)
    try:
        for run_id, records in (("RUN-A", a[:3]), ("RUN-B", b[:3])):
            for record in records:
                store.append(run_id, record)
        store.sync_blocking()
    finally:
        store.close_blocking()  # snapshots and the manifest written
    locked = tmp_path / "snap" / "live" / snapshot_name("RUN-A")
    manifest = tmp_path / "manifest.json"
    kept = {path: path.read_bytes() for path in (locked, manifest)}
    for path in kept:
        path.chmod(0)
    report = read_runs_report(tmp_path)
    assert sorted(f.path for f in report.files) == sorted(
        ["manifest.json", f"snap/live/{locked.name}"]), report.files
    assert all("is not readable by its owner (mode 0000)" in f.problem for f in report.files)
    assert all(f"chmod 600 {path}" in next(f.problem for f in report.files
                                           if path.name in f.path) for path in kept)
    runs = by_id(report.runs)
    assert runs["RUN-A"].state == fold(a[:3]) and runs["RUN-B"].state == fold(b[:3])
    store = open_store(tmp_path)  # a host over it: writes, compacts on close
    try:
        for record in a[3:]:
            store.append("RUN-A", record)
        store.sync_blocking()
    finally:
        store.close_blocking()
    for path, data in kept.items():  # never renamed over, nor read and rewritten
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0, path
        path.chmod(0o600)
        assert path.read_bytes() == data, path


# A store under a 64 KiB file size limit (``ulimit -f``), in a process of its own.
_LIMITED = r'''
import asyncio, resource, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from tests.unit.test_store_support import open_store, walk
from intloom.store.reader import verify_report

limit = 64 << 10
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
root = Path(sys.argv[1])
store = open_store(root)
'''


def _limited(tmp_path: Path, body: str, *args: str) -> str:
    """What the store under the limit, doing ``body``, prints."""
    script = tmp_path / "limited.py"
    script.write_text(_LIMITED + body)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "runtime"),
                           str(Path(__file__).resolve().parents[2]), *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


FILE_LIMITED = r'''
records = walk("RUN-A", 3_000, 5)
sizes = [int(size) for size in sys.argv[3].split(",")]
threaded = inline = 0  # batches past the limit's room, written on the store's thread, inline
Store = type(store)
submit, write_out = Store._submit, Store._write_out


def submitted(self, batch):
    global threaded
    threaded += self._beyond_limit(len(batch.data))
    submit(self, batch)


def written_out(self, batch):  # on the caller's thread: the loop, or sync_blocking's
    global inline
    inline += self._beyond_limit(len(batch.data))
    write_out(self, batch)


# On the class: a Store has slots, no instance dict to shadow a method in.
Store._submit, Store._write_out = submitted, written_out


async def flushed() -> None:
    await store.sync("RUN-A")


first = 0
while first < len(records):
    count = sizes[0]
    sizes.append(sizes.pop(0))
    for record in records[first : first + count]:
        store.append("RUN-A", record)
    if sys.argv[4] == "loop":
        asyncio.run(flushed())
    else:
        store.sync_blocking()  # raised CheckpointFailed (EFBIG) once the segment reached the limit
    first += count
store.close_blocking()
sizes = sorted(p.stat().st_size for p in (root / "wal").glob("*.seg"))
print(len(sizes), max(sizes) < limit, threaded, inline)
'''


SEAL_LIMITED = r'''
store._segment_bytes = limit  # rotating at half the limit would keep every batch far below it
near = 0
for record in walk("RUN-A", 3_000, 5):
    store.append("RUN-A", record)
    end = store._size + sum(map(len, store._pending_frames))
    if end >= limit - 90:  # a batch that ends closer to the limit than a seal frame takes
        near += 1  # the first, alone in its segment; then each after batches of 40
        store.sync_blocking()
    elif near and len(store._pending_frames) >= 80:  # 40 records: a head and a body each
        store.sync_blocking()
store.close_blocking()
report = verify_report(root)
print(near, [(f.path, f.kind) for f in report.files])
'''


def test_a_segment_keeps_room_for_its_seal_below_the_file_size_limit(tmp_path: Path) -> None:
    """A batch that ended within a seal frame's size of ``ulimit -f`` left the rotation
    after it no room for the seal: it failed EFBIG part-way, and verify called the
    segment's end damaged. Such a batch now goes to a new segment, and one that fills a
    segment of its own to there leaves it unsealed."""
    printed = _limited(tmp_path, SEAL_LIMITED)
    near, files = printed.split(" ", 1)
    assert int(near) >= 3 and files.strip() == "[]", printed


TOO_BIG_A_BATCH = r'''
from intloom.runtime.ports import CheckpointFailed
from intloom.runtime.records import Executing, StagePending, StepReady, StepResult
from tests.unit.test_store_support import header

big = b'"' + b"x" * 40_000 + b'"'  # two States of it: more than the limit in one batch
for record in (header("RUN-A"), StagePending(at="t1", stage="draft"),
               StepReady(at="t2", stage="draft", step="s1", state=big),
               Executing(at="t3", stage="draft", step="s1", kind="step"),
               StepResult(at="t4", stage="draft", step="s1", outcome="ok", state=big,
                          output=None)):
    store.append("RUN-A", record)
try:
    store.sync_blocking()
except CheckpointFailed as exc:
    print(exc.cause)
store.close_blocking()
'''


def test_a_batch_bigger_than_the_file_size_limit_names_the_limit(tmp_path: Path) -> None:
    """One checkpoint batch bigger than ``ulimit -f`` allows fails EFBIG even in a segment of
    its own, and its cause said only "File too large (EFBIG)": not the limit, nor that the
    host inherits it from the shell that started it."""
    cause = _limited(tmp_path, TOO_BIG_A_BATCH)
    assert "File too large (EFBIG)" in cause, cause
    assert "ulimit -f" in cause and "raise it" in cause, cause


@pytest.mark.parametrize(("batches", "flush"), [("10", "thread"), ("300,500", "thread"),
                                               ("300,500", "loop")])
def test_segments_rotate_below_the_file_size_limit(tmp_path: Path, batches: str,
                                                   flush: str) -> None:
    """Under ``ulimit -f`` (inherited from the shell that started the host), a segment that
    reached the limit failed the batch that crossed it (EFBIG), a Run at every segment's
    end. Segments now rotate at half the limit; and before a batch too big for what is left
    (300 records of ~90 bytes take a segment to ~28 KiB, just below half of 64 KiB, where
    the next 500 would cross the limit). A lone Run's flush, which the loop writes itself,
    hands such a batch to the store's thread: the rotation after it waits for the
    compaction the first one began."""
    printed = _limited(tmp_path, FILE_LIMITED, batches, flush)
    count, below, threaded, inline = printed.split()
    assert int(count) > 2 and below == "True", printed
    if flush == "loop":  # never on the loop
        assert int(threaded) >= 3 and inline == "0", printed


# A store's close with exactly ``sys.argv[3]`` descriptors left to it (``ulimit -n``): every
# number below the soft limit but those is taken, and the store's own lie above it, so the
# ones its close lets go are no use to it either.
_FEW_DESCRIPTORS = r"""
import json, os, resource, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from tests.unit.test_store_support import open_store, walk
from intloom.host.boot import _watch_compactions
from intloom.host.logfile import HostLog

LIMIT = 64
root = Path(sys.argv[1])
low = []
while (fd := os.open(os.devnull, os.O_RDONLY)) < LIMIT:
    low.append(fd)
os.close(fd)
store = open_store(root)
for n in range(100):
    for record in walk(f"RUN-{n:03d}", 3, n):
        store.append(f"RUN-{n:03d}", record)
store.sync_blocking()
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, hard))
left = int(sys.argv[3])
for fd in low[len(low) - left:] if left else []:
    os.close(fd)
store.close_blocking()
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
for fd in low[:len(low) - left]:
    os.close(fd)
log = HostLog.open(root.parent / "logs")  # what the host logs of it, and status shows
last: list[str] = []
_watch_compactions(store, log, last)
print(json.dumps([len(os.listdir(root / "snap" / "live")), last]))
"""


def _few_descriptors(tmp_path: Path, left: int) -> tuple[int, list[str]]:
    """How many snapshots a close of 100 busy Runs wrote with ``left`` descriptors, and
    the ``store_compaction_failed`` message (status's) if one failed."""
    script = tmp_path / "few.py"
    script.write_text(_FEW_DESCRIPTORS)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "runtime"),
                           str(Path(__file__).resolve().parents[2]), str(left)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    written, last = json.loads(done.stdout)
    return written, last


def test_a_compaction_with_few_descriptors_writes_its_snapshots_fewer_at_a_time(
        tmp_path: Path) -> None:
    """Under a low ``ulimit -n`` that a start accepts, the 64 snapshot files a compaction
    held open together never fit: it failed EMFILE at every open, rotation and stop, and
    each restart replayed more of the log."""
    written, last = _few_descriptors(tmp_path, 12)
    assert (written, last) == (100, []), last


def test_a_compaction_with_no_descriptor_left_names_the_limit_not_the_disk(
        tmp_path: Path) -> None:
    """Said "Free disk space, or fix the permissions of .intloom/runtime" of a disk that
    was fine."""
    written, last = _few_descriptors(tmp_path, 0)
    assert written == 0 and len(last) == 1, last
    assert "Too many open files" in last[0] and "ulimit -n" in last[0], last
    assert "Free disk space" not in last[0] and "permissions" not in last[0], last


def test_a_lone_runs_flush_leaves_a_rotations_wait_for_compaction_to_the_stores_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Run flushing alone, on the event loop (the disk being fast), that filled a segment
    while the last rotation's compaction still ran joined that compaction on the loop: with
    thousands of Runs to snapshot, every client, timer and stop froze for seconds. The
    flushes of several Runs already sent such a batch to the store's thread; so now does a
    lone Run's."""
    import asyncio

    release, started = _compactions_held(monkeypatch)
    real_join = writer.Store._join_compaction
    joined: list[str] = []

    def join(self: writer.Store) -> None:
        compactor = self._compactor
        if compactor is not None and compactor.is_alive() and not release.is_set():
            # Who waits for the held compaction: the loop here would wait 10 s, then fail.
            joined.append(threading.current_thread().name)
            release.set()
        real_join(self)

    monkeypatch.setattr(writer.Store, "_join_compaction", join)
    # Every flush on the loop, however slow this disk: the path under test.
    store = open_store(tmp_path, segment_bytes=SEGMENT, inline_max_sync_s=float("inf"))
    records = walk("RUN-A", 4_000, 3)

    async def main() -> None:
        for record in records:
            store.append("RUN-A", record)
            await store.sync("RUN-A")
            if joined:
                return

    try:
        asyncio.run(asyncio.wait_for(main(), timeout=60))
        assert started.is_set(), "no rotation started a compaction"
        assert store.inline_flushes > 0, "no flush was made on the loop"
        assert joined and "MainThread" not in joined, joined
    finally:
        release.set()
        store.close_blocking()


def test_a_rotation_waiting_for_a_compaction_leaves_the_tracks_lock_free(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker thread's flush (a crew's) that rotated while the last compaction ran waited
    for it holding the tracks' lock, and a stop begun meanwhile counted the snapshots due
    under that lock on the event loop: the loop froze until the compaction ended."""
    release, started = _compactions_held(monkeypatch)
    joining = threading.Event()
    real_join = writer.Store._join_compaction

    def join(self: writer.Store) -> None:
        compactor = self._compactor
        if compactor is not None and compactor.is_alive():
            joining.set()
        real_join(self)

    monkeypatch.setattr(writer.Store, "_join_compaction", join)
    store = open_store(tmp_path, segment_bytes=SEGMENT)
    records = walk("RUN-A", 4_000, 3)

    def flushes() -> None:
        for record in records:
            store.append("RUN-A", record)
            store.sync_blocking()
            if joining.is_set():
                return

    flusher = threading.Thread(target=flushes, name="flusher", daemon=True)
    counted: list[int] = []
    counter = threading.Thread(target=lambda: counted.append(store.snapshots_due()),
                               daemon=True)
    try:
        flusher.start()
        eventually(joining.is_set, timeout=30, what="a rotation to wait for the compaction")
        assert started.is_set() and not release.is_set()
        counter.start()
        counter.join(10)
        assert counted, "snapshots_due waited for the compaction"
    finally:
        release.set()
        flusher.join(30)
        counter.join(30)
        store.close_blocking()


def _compactions_held(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Every rotation's compaction held on its thread until the first event (``release``)
    is set (at most 30 s); the second (``started``) is set once one is held."""
    release, started = threading.Event(), threading.Event()
    real = writer.compact  # type: ignore[attr-defined]

    def held(*args: Any, **kwargs: Any) -> None:
        if threading.current_thread().name == "intloom-compact":
            started.set()
            assert release.wait(30)
        real(*args, **kwargs)

    monkeypatch.setattr(writer, "compact", held)
    return release, started
