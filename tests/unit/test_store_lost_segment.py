"""A segment that was created and is gone is noticed, never restored past as if it had not
been: the Runs whose next records it may have held are held, not resumed from an older
point (which would run a finished Step again). Real files, real stores; the crash is
``abandon`` (what a SIGKILL leaves)."""

from __future__ import annotations

import signal
from pathlib import Path

import msgspec
import pytest

from intloom.runtime.machine import fold
from intloom.runtime.records import Record
from intloom.store import StoreReport, read_runs_report, verify_report
from intloom.store import reader as reader_module
from intloom.store.files import list_names
from intloom.store.framing import segment_name
from intloom.store.snapshots import (
    SnapshotError,
    decode_manifest,
    encode_manifest,
    snapshot_name,
)
from tests.unit.test_store_support import (
    abandon,
    by_id,
    open_store,
    run_child,
    walk,
    went_on_after_a_failed_write,
)

SEG2 = "wal/0000000002.seg"
A = walk("RUN-A", 12, 1)
B = walk("RUN-B", 4, 2)


def _both_held(root: Path, report: StoreReport, gap: str, instance: str) -> None:
    """RUN-A (records 7..12 in segment 2) and RUN-B held, RUN-A's problem naming ``gap``;
    a host then opened as ``instance`` numbers its segment past segment 2."""
    runs = by_id(report.runs)
    assert runs["RUN-A"].status == "corrupt", runs["RUN-A"]
    problem = runs["RUN-A"].problem or ""
    assert gap in problem and "record 7" in problem, problem
    # RUN-B wrote nothing there, but nothing left shows that: it is held too.
    assert runs["RUN-B"].status == "corrupt"
    assert by_id(verify_report(root).runs)["RUN-A"].status == "corrupt"
    store = open_store(root, instance_id=instance)
    # Its number is not taken again: a copy put back must not clash with a new file.
    assert store._number > 2
    store.close_blocking()


def _rotated_then_killed(root: Path) -> int:
    """A host (INST-2) whose segment rotated, killed before its rotation's compaction wrote
    the manifest (put back as it was): only the seal names the newest segment, returned."""
    store = open_store(root, instance_id="INST-1")
    store.close_blocking()
    store = open_store(root, instance_id="INST-2", segment_bytes=1024)
    before = (root / "manifest.json").read_bytes()  # as it is until the rotation's compaction
    for record in walk("RUN-A", 60, 3):
        store.append("RUN-A", record)
        store.sync_blocking()
    newest = store._number
    abandon(store)
    assert newest > 2, "the segment should have rotated"
    (root / "manifest.json").write_bytes(before)
    return newest


def _closed(root: Path, run_id: str, records: list[Record]) -> None:
    """A first host (INST-1) that wrote ``records`` and stopped cleanly."""
    store = open_store(root, instance_id="INST-1")
    for record in records:
        store.append(run_id, record)
    store.sync_blocking()
    store.close_blocking()


def _clean_then_crashed(root: Path) -> None:
    """RUN-A's first 6 records and RUN-B's 4 in segment 1, closed cleanly; then a host that
    was killed wrote RUN-A's records 7..12, all in its own segment 2."""
    store = open_store(root, instance_id="INST-1")
    for record in A[:6]:
        store.append("RUN-A", record)
    for record in B:
        store.append("RUN-B", record)
    store.sync_blocking()
    store.close_blocking()
    store = open_store(root, instance_id="INST-2")
    for record in A[6:]:
        store.append("RUN-A", record)
    store.sync_blocking()
    abandon(store)


def test_a_lost_segment_a_host_opened_holds_the_runs_it_may_have_moved_on(
    tmp_path: Path,
) -> None:
    root = tmp_path / "runtime"
    _clean_then_crashed(root)
    lost = root / SEG2
    kept = lost.read_bytes()
    lost.unlink()

    for instance in ("INST-3", "INST-4"):
        report = read_runs_report(root)
        findings = {(f.path, f.kind): f.problem for f in report.files}
        assert (SEG2, "missing") in findings, findings
        assert "put it back from a copy" in findings[SEG2, "missing"]
        # Before: RUN-A came back at record 6, as if records 7..12 had never been written.
        _both_held(root, report, f"{SEG2}, which is missing,", instance)
        assert not lost.exists()

    lost.write_bytes(kept)  # the copy, put back: RUN-A is read to its end
    lost.chmod(0o600)
    runs = by_id(read_runs_report(root).runs)
    assert runs["RUN-A"].status == "ok", runs["RUN-A"]
    assert runs["RUN-A"].state is not None and runs["RUN-A"].state.seq == 12


def test_a_host_whose_snapshots_failed_at_open_still_names_its_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a crash, a host's open snapshots the Runs the crashed segment holds, then
    writes the manifest naming its own new segment (``open``). When those snapshots failed
    (EIO, a quota), the manifest was not written at all: that segment, lost later, was
    named by nothing, and a Run that went on in it came back from an older point."""
    from intloom.fsutil import WRITE_FAULT_ENV

    root = tmp_path / "runtime"
    store = open_store(root, instance_id="INST-1")
    for record in A[:6]:
        store.append("RUN-A", record)
    store.sync_blocking()
    abandon(store)  # a crash: RUN-A's records 1..6 in segment 1, no snapshot
    monkeypatch.setenv(WRITE_FAULT_ENV, "*.snap=EIO")
    store = open_store(root, instance_id="INST-2")
    assert [(exc.what, when) for exc, when in store.unsummarised] == [("snapshots", "open")]
    assert decode_manifest(root / "manifest.json", (root / "manifest.json").read_bytes()).open == 2
    for record in A[6:]:
        store.append("RUN-A", record)
    store.sync_blocking()
    abandon(store)  # killed again, RUN-A's records 7..12 in segment 2 only
    monkeypatch.delenv(WRITE_FAULT_ENV)
    (root / SEG2).unlink()

    report = read_runs_report(root)
    assert (SEG2, "missing") in {(f.path, f.kind) for f in report.files}, report.files
    run = by_id(report.runs)["RUN-A"]
    # Before: 'ok' at record 6, as if records 7..12 had never been written.
    assert run.status == "corrupt" and "record 7" in (run.problem or ""), run


def test_without_a_copy_moving_a_held_runs_snapshot_aside_accepts_the_loss(
    tmp_path: Path,
) -> None:
    """No copy of the lost segment: a person who accepts that its records are gone moves the
    Run's live/ snapshot aside (docs/recovery.md), and the Run is judged from the log that
    is left, from where it is readable. Nothing else frees it."""
    root = tmp_path / "runtime"
    _clean_then_crashed(root)
    (root / SEG2).unlink()
    open_store(root, instance_id="INST-3").close_blocking()
    open_store(root, instance_id="INST-4").close_blocking()
    assert by_id(read_runs_report(root).runs)["RUN-B"].status == "corrupt"

    live = root / "snap" / "live" / snapshot_name("RUN-B")
    live.rename(tmp_path / live.name)
    runs = by_id(read_runs_report(root).runs)
    assert runs["RUN-B"].status == "ok" and runs["RUN-B"].state == fold(B), runs["RUN-B"]
    assert runs["RUN-A"].status == "corrupt"  # only the Run whose snapshot was moved


def test_a_lost_segment_a_rotation_created_is_noticed_before_the_manifest_names_it(
    tmp_path: Path,
) -> None:
    """A full segment is sealed once the next one exists; its compaction writes the manifest
    later, on its own thread. Killed in between, only the seal says the next one existed."""
    root = tmp_path / "runtime"
    newest = _rotated_then_killed(root)
    gone = f"wal/{segment_name(newest)}"
    (root / gone).unlink()

    report = read_runs_report(root)
    assert (gone, "missing") in {(f.path, f.kind) for f in report.files}, report.files
    run = by_id(report.runs)["RUN-A"]
    assert run.status == "corrupt" and f"{gone}, which is missing," in (run.problem or ""), run


def test_nothing_is_missing_after_clean_stops_and_crashes(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    _clean_then_crashed(root)
    for instance in ("INST-3", "INST-4"):
        report = read_runs_report(root)
        assert [f for f in report.files if f.kind == "missing"] == []
        assert {r.run_id: r.status for r in report.runs} == {"RUN-A": "ok", "RUN-B": "ok"}
        open_store(root, instance_id=instance).close_blocking()


# Written by the build before manifest format 3 (a clean close of one Run), byte for byte.
FORMAT_2 = (b'{"format":2,"start":2,"pinned":[],"voids":[],"updatedAt":"2026-12-01T12:20:58.97'
            b'1034+00:00","live":{"count":1,"sha256":"a07a645b697c27bbcd4ac3a4c7f17b8f1099334'
            b'6748101e14d09516eb6f50654"},"checksum":"3634000d"}\n')


def test_a_format_2_manifest_is_still_read_and_the_next_host_writes_format_3(
    tmp_path: Path,
) -> None:
    manifest = decode_manifest(tmp_path / "manifest.json", FORMAT_2)
    assert (manifest.format, manifest.start, manifest.open) == (2, 2, 0)
    assert encode_manifest(manifest) == FORMAT_2  # its checksum covers no `open` key
    with pytest.raises(SnapshotError, match="format 2 has an `open` field"):
        decode_manifest(tmp_path / "manifest.json",
                        FORMAT_2.replace(b'"checksum"', b'"open":2,"checksum"'))

    root = tmp_path / "runtime"
    _closed(root, "RUN-A", A[:6])
    path = root / "manifest.json"
    written = decode_manifest(path, path.read_bytes())
    assert (written.format, written.open) == (3, 0)  # closed: nothing open
    path.write_bytes(encode_manifest(msgspec.structs.replace(written, format=2)))
    report = read_runs_report(root)
    assert report.files == [] and not report.stats.full  # trusted: only live/ is read
    assert by_id(report.runs)["RUN-A"].status == "ok"
    store = open_store(root, instance_id="INST-2")
    opened = decode_manifest(path, path.read_bytes())
    assert (opened.format, opened.open) == (3, store._number)  # written at every open
    store.close_blocking()


def test_moving_a_held_runs_snapshot_aside_accepts_a_loss_a_seal_named(
    tmp_path: Path,
) -> None:
    """As above, for a segment a rotation created, named only by the seal of the one before
    it. Moving the snapshot aside makes the read take the whole log, so the seal is read
    again: the loss, already accepted, must not hold the Run again (the seal's segment is
    below the manifest's start, where a bounded read passes it over too)."""
    root = tmp_path / "runtime"
    newest = _rotated_then_killed(root)
    (root / "wal" / segment_name(newest)).unlink()
    open_store(root, instance_id="INST-3").close_blocking()
    open_store(root, instance_id="INST-4").close_blocking()
    assert by_id(read_runs_report(root).runs)["RUN-A"].status == "corrupt"

    live = root / "snap" / "live" / snapshot_name("RUN-A")
    live.rename(tmp_path / live.name)
    run = by_id(read_runs_report(root).runs)["RUN-A"]
    assert run.status == "ok", run
    store = open_store(root, instance_id="INST-5")
    assert by_id(store.restored.runs)["RUN-A"].status == "ok"
    store.close_blocking()
    assert by_id(read_runs_report(root).runs)["RUN-A"].status == "ok"


def test_a_foreign_file_moved_out_of_wal_is_not_reported_missing(tmp_path: Path) -> None:
    """A file intloom did not write, under a segment's name, is reported `foreign` and
    pinned; the advice is to move it out. Once it is out, nothing was lost and no Run is
    held for it: a start reading the manifest that still pins its number must not call it a
    missing segment that held Runs' records (which `start --strict` would refuse, at every
    start, and doctor would tell to put back from a copy)."""
    root = tmp_path / "runtime"
    _closed(root, "RUN-B", B)
    stray = root / "wal" / "0000000002.seg"
    stray.write_bytes(b"not a segment")
    stray.chmod(0o600)
    store = open_store(root, instance_id="INST-2")
    assert (SEG2, "foreign") in {(f.path, f.kind) for f in store.restored.files}
    store.close_blocking()
    path = root / "manifest.json"
    assert 2 in decode_manifest(path, path.read_bytes()).pinned

    stray.rename(tmp_path / stray.name)  # the advice followed
    report = read_runs_report(root)
    assert report.files == [], report.files
    assert by_id(report.runs)["RUN-B"].status == "ok"


def test_a_lost_replacement_segment_a_failed_write_created_is_noticed(
    tmp_path: Path,
) -> None:
    """A write failed, so the host went on in a replacement segment (its first frame the
    void notice for the failed bytes), then was killed. That segment is one a host created
    like any other: gone at the next start, the Runs whose records it may have held are held
    (not resumed from before it), and the failed batch stays void."""
    root = tmp_path / "runtime"
    _closed(root, "RUN-A", A[:6])  # restores now start at segment 2
    # Records 7 and 8 in wal/0000000002.seg; the host goes on in segment 3.
    replacement = went_on_after_a_failed_write(root, A[6:8], A[8:])
    assert replacement == 3
    lost = root / "wal" / segment_name(replacement)
    kept = lost.read_bytes()
    lost.unlink()

    report = read_runs_report(root)
    assert (f"wal/{lost.name}", "missing") in {(f.path, f.kind) for f in report.files}
    runs = by_id(report.runs)
    # Before: RUN-A came back at record 8, as if records 9..12 had never been written.
    assert runs["RUN-A"].status == "corrupt", runs["RUN-A"]
    assert "RUN-X" not in runs  # its batch failed: the void notice is not lost with the file
    lost.write_bytes(kept)
    lost.chmod(0o600)
    runs = by_id(read_runs_report(root).runs)
    assert runs["RUN-A"].status == "ok" and runs["RUN-A"].state == fold(A), runs["RUN-A"]


def test_a_host_killed_after_a_failed_write_leaves_nothing_missing(tmp_path: Path) -> None:
    """The replacement segment named at once (above), then a real SIGKILL at the next flush:
    the next start finds every segment named, no Run held, the failed batch void."""
    root = tmp_path / "runtime"
    child = run_child(root, """
        from intloom.runtime.ports import CheckpointFailed
        store = open_store(root, instance_id="INST-1")
        a = walk("RUN-A", 12, 1)
        store.append("RUN-A", a[0]); store.sync_blocking()      # flush 1
        store.append("RUN-X", header("RUN-X"))
        try:
            store.sync_blocking("RUN-X")                        # flush 2 fails
        except CheckpointFailed:
            pass
        store.append("RUN-A", a[1]); store.sync_blocking()      # flush 3: killed after it
        print("survived")
    """, "fail_sync=2,crash_after_sync=3")
    assert child.returncode == -signal.SIGKILL, (child.returncode, child.stderr)
    manifest = decode_manifest(root / "manifest.json", (root / "manifest.json").read_bytes())
    assert manifest.open == 2 and [v.segment for v in manifest.voids] == [1]
    report = read_runs_report(root)
    assert [f for f in report.files if f.kind == "missing"] == [], report.files
    runs = by_id(report.runs)
    assert set(runs) == {"RUN-A"} and runs["RUN-A"].status == "ok", runs
    assert runs["RUN-A"].state == fold(A[:2])
    open_store(root, instance_id="INST-2").close_blocking()
    assert by_id(read_runs_report(root).runs)["RUN-A"].state == fold(A[:2])


def test_a_read_beside_a_running_host_that_rotates_finds_nothing_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """doctor and inspect read the store while its host runs. The host rotates between the
    read's listing of wal/ and its reading of the manifest and the segments: the seal and
    the manifest then name a segment the listing does not have. It was created, not lost:
    no Run may be held for it, no file reported missing."""
    root = tmp_path / "runtime"
    store = open_store(root, instance_id="INST-1", segment_bytes=1024)
    wal = root / "wal"
    store.append("RUN-A", A[0])
    store.sync_blocking()
    listed = list_names(wal)  # the read lists wal/ ...
    for record in A[1:]:  # ... the host rotates meanwhile ...
        store.append("RUN-A", record)
        store.sync_blocking()
    store._join_compaction()
    assert store._number > 1 and listed == [segment_name(1)]

    def stale(path: Path) -> list[str]:
        return listed if path == wal else list_names(path)

    monkeypatch.setattr(reader_module, "list_names", stale)  # ... then reads on
    report = read_runs_report(root)
    assert [f for f in report.files if f.kind == "missing"] == [], report.files
    assert by_id(report.runs)["RUN-A"].status == "ok", by_id(report.runs)["RUN-A"]
    store.close_blocking()


def test_a_read_beside_a_host_that_rotated_twice_does_not_call_its_manifest_damaged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two rotations between the read's listing of wal/ and its reading of the manifest:
    the manifest names a start two past the last segment listed, which a manifest can never
    be, so it was reported damaged (doctor: a corrupt manifest.json, the whole log read).
    Looked at again, the log has those segments."""
    root = tmp_path / "runtime"
    store = open_store(root, instance_id="INST-1", segment_bytes=1024)
    wal = root / "wal"
    listed = list_names(wal)  # the read lists wal/ ...
    for record in walk("RUN-A", 60, 3):  # ... the host rotates, more than once, meanwhile
        store.append("RUN-A", record)
        store.sync_blocking()
    store._join_compaction()
    manifest = decode_manifest(root / "manifest.json", (root / "manifest.json").read_bytes())
    assert manifest.start > len(listed) + 1, (manifest.start, listed)
    first = [True]

    def stale_once(path: Path) -> list[str]:
        if path == wal and first[0]:
            first[0] = False
            return listed
        return list_names(path)

    monkeypatch.setattr(reader_module, "list_names", stale_once)  # ... then reads on
    report = read_runs_report(root)
    assert report.files == [], report.files
    assert not report.stats.full and by_id(report.runs)["RUN-A"].status == "ok"
    store.close_blocking()


def test_the_segment_a_clean_close_sealed_lost_is_missing_and_its_number_never_reused(
    tmp_path: Path,
) -> None:
    """A clean close's manifest names the segment after its own as the restore's start. With
    that segment deleted, a host used to take its number for its own segment, below the start
    the manifest (judged damaged, so kept) still named; once that file existed the manifest
    was trusted again, and a crash then lost every Run whose records were only there."""
    root = tmp_path / "runtime"
    _closed(root, "RUN-A", A[:6])
    open_store(root, instance_id="INST-2").close_blocking()  # manifest: start 3, open 0
    (root / SEG2).unlink()

    report = read_runs_report(root)
    findings = {(f.path, f.kind): f.problem for f in report.files}
    assert (SEG2, "missing") in findings and "manifest.json" not in {p for p, _ in findings}
    assert by_id(report.runs)["RUN-A"].state == fold(A[:6])
    store = open_store(root, instance_id="INST-3")
    assert store._number == 3 and not (root / SEG2).exists()
    for record in B:
        store.append("RUN-B", record)  # only in the new segment: no snapshot before a crash
    store.sync_blocking()
    abandon(store)

    runs = by_id(read_runs_report(root).runs)
    assert runs["RUN-B"].state == fold(B), sorted(runs)
    assert runs["RUN-A"].state == fold(A[:6])


def test_the_last_two_segments_lost_lose_no_run_a_later_host_wrote(tmp_path: Path) -> None:
    """Further ahead of the log, the manifest is damage, read around; the host that finds it
    numbers its segment at its start. Before, it numbered segment 2, below that start; after
    two crashes the log caught up with the manifest, which was trusted again, and the Runs
    both hosts wrote were gone."""
    root = tmp_path / "runtime"
    _closed(root, "RUN-A", A[:6])
    for instance in ("INST-2", "INST-3"):
        open_store(root, instance_id=instance).close_blocking()  # manifest: start 4
    for number in (2, 3):
        (root / "wal" / segment_name(number)).unlink()
    written = {"RUN-B": B, "RUN-C": walk("RUN-C", 5, 3)}
    for instance, run_id in (("INST-4", "RUN-B"), ("INST-5", "RUN-C")):
        store = open_store(root, instance_id=instance)
        assert store._number >= 4
        for record in written[run_id]:
            store.append(run_id, record)
        store.sync_blocking()
        abandon(store)
    runs = by_id(read_runs_report(root).runs)
    assert runs["RUN-A"].state == fold(A[:6])
    assert runs["RUN-B"].state == fold(B) and runs["RUN-C"].state == fold(written["RUN-C"])


@pytest.mark.parametrize("wipe", ["emptied", "header cut", "zeroed"])
def test_a_segment_a_host_wrote_found_wiped_holds_its_runs_as_if_it_were_gone(
    tmp_path: Path, wipe: str,
) -> None:
    """The segment the manifest names as its host's open one, there but with nothing of it
    left to read (emptied, cut inside its header, overwritten with zeros), was read as a
    harmless torn file ("not corruption") or a stray one: RUN-A came back at record 6, its
    records 7..12 silently gone, while the same segment deleted held it. A crash leaves
    such a file only while creating a segment, before anything names it."""
    root = tmp_path / "runtime"
    _clean_then_crashed(root)
    wiped = root / SEG2
    size = wiped.stat().st_size
    with open(wiped, "r+b") as fh:
        if wipe == "zeroed":
            fh.write(bytes(size))
        else:
            fh.truncate(0 if wipe == "emptied" else 10)
    left = wiped.read_bytes()

    for instance in ("INST-3", "INST-4"):
        report = read_runs_report(root)
        findings = {f.path: (f.kind, f.problem) for f in report.files}
        kind, problem = findings[SEG2]
        if instance == "INST-3" or wipe != "zeroed":
            assert kind == "missing" and "holds none of its records" in problem, findings
            assert ("manifest.json names it as the segment its host was writing" if instance
                    == "INST-3" else "an earlier start pinned it") in problem, problem
        else:  # as any file under a segment's name that is none: never called harmless
            assert kind == "foreign" and "does not start with the intloom segment" in problem
        assert [f.path for f in report.files].count(SEG2) == 1, report.files
        _both_held(root, report, f"{SEG2}, which holds none of its records,", instance)
        assert wiped.read_bytes() == left  # kept as it was found


def test_a_segment_a_seal_names_found_emptied_holds_its_run(tmp_path: Path) -> None:
    """The same for a segment only a seal names (a rotation's, before its compaction wrote
    the manifest): emptied, it was a torn file, and the Run came back at its seal."""
    root = tmp_path / "runtime"
    newest = _rotated_then_killed(root)
    emptied = f"wal/{segment_name(newest)}"
    (root / emptied).write_bytes(b"")

    report = read_runs_report(root)
    findings = {f.path: (f.kind, f.problem) for f in report.files}
    assert findings[emptied][0] == "missing", findings
    assert "holds none of its records: it has 0 bytes" in findings[emptied][1]
    assert "was sealed once it had been created" in findings[emptied][1]
    run = by_id(report.runs)["RUN-A"]
    assert run.status == "corrupt", run
    assert f"{emptied}, which holds none of its records," in (run.problem or ""), run
    assert (root / emptied).read_bytes() == b""
