"""Damage is located precisely, blamed on the Run it hit, reported, and never repaired:
every damaged file stays byte-identical through reads and through a new host's open."""

from __future__ import annotations

import re
import shutil
import struct
import zlib
from pathlib import Path

import msgspec
import pytest

from intloom.runtime.machine import fold
from intloom.runtime.ports import CheckpointFailed
from intloom.runtime.records import Record, StepReady
from intloom.store import (
    FaultPlan,
    RunJournal,
    read_history,
    read_runs,
    read_runs_report,
    verify,
    verify_report,
)
from intloom.store import history as history_module
from intloom.store.framing import SegmentScan, scan_segment
from intloom.store.snapshots import (
    decode_manifest,
    encode_manifest,
    encode_snapshot,
    read_snapshot,
    snapshot_name,
)
from tests.helpers import snapshot_files
from tests.unit.test_store_support import (
    abandon,
    by_id,
    flip,
    frames_end,
    frames_of,
    header,
    left_behind,
    open_store,
    walk,
    went_on_after_a_failed_write,
)

RUNS = {"RUN-A": 1, "RUN-B": 2, "RUN-C": 3}
N = 12


def _crashed_host(root: Path, *, close: bool = False) -> Path:
    """Three Runs interleaved in one segment, left as a crash leaves it (or closed cleanly)."""
    store = open_store(root)
    records = {run: walk(run, N, seed) for run, seed in RUNS.items()}
    for i in range(N):
        for run in RUNS:
            store.append(run, records[run][i])
        store.sync_blocking()
    return left_behind(store, close=close)


def _expected(run: str, n: int = N):  # type: ignore[no-untyped-def]
    return fold(walk(run, N, RUNS[run])[:n])


def test_verify_names_a_damaged_first_record_under_a_snapshot(tmp_path: Path) -> None:
    """A closed host's snapshots cover every record; RUN-B's first is then damaged. verify
    (which judges every record) said "records 1..1 are missing from the log ... the
    segments that held them are gone or cut short", of a segment in its place."""
    root = tmp_path / "runtime"
    segment = _crashed_host(root, close=True)
    first = frames_of(segment, "RUN-B")[0]
    flip(segment, first.end - 3)
    b = by_id(verify(root))["RUN-B"]
    assert b.status == "corrupt", b
    assert (f"record 1 at wal/0000000001.seg offset {first.offset}") in (b.problem or ""), b
    assert "fails its checksum (its snapshot" in (b.problem or "") and "missing" not in (
        b.problem or ""), b


@pytest.mark.parametrize("where", ["payload", "magic", "length"])
def test_a_flipped_byte_blames_one_run_with_its_location(tmp_path: Path, where: str) -> None:
    root = tmp_path / "runtime"
    segment = _crashed_host(root)
    hit = frames_of(segment, "RUN-B")[5]  # record 6 of RUN-B, mid-segment
    offset = {"payload": hit.end - 3, "magic": hit.offset + 1, "length": hit.offset + 6}[where]
    flip(segment, offset)
    damaged = segment.read_bytes()

    runs = by_id(read_runs(root))
    assert runs["RUN-A"].status == "ok" and runs["RUN-A"].state == _expected("RUN-A")
    assert runs["RUN-C"].status == "ok" and runs["RUN-C"].state == _expected("RUN-C")
    b = runs["RUN-B"]
    assert b.status == "corrupt" and b.problem is not None
    assert "wal/0000000001.seg" in b.problem and f"offset {hit.offset}" in b.problem
    assert "record 6" in b.problem
    assert b.state == _expected("RUN-B", 5)  # the last good record, for display only
    assert segment.read_bytes() == damaged

    report = read_runs_report(root)
    assert [(f.path, f.kind) for f in report.files] == [("wal/0000000001.seg", "corrupt")]
    verdicts = [h.verdict for h in read_history(root, "RUN-B")]
    assert verdicts[5] == "damaged" and verdicts.count("ok") == N - 1

    # A new host opens the same directory: the damage is retired into a verdict, not fixed.
    store = open_store(root, instance_id="INST-2")
    assert by_id(store.restored.runs)["RUN-B"].status == "corrupt"
    store.close_blocking()
    assert segment.read_bytes() == damaged
    again = by_id(read_runs(root))
    assert again["RUN-B"].status == "corrupt" and again["RUN-B"].problem == b.problem
    assert again["RUN-A"].state == _expected("RUN-A")
    assert by_id(verify(root))["RUN-B"].status == "corrupt"
    assert segment.read_bytes() == damaged


def test_a_damaged_segment_put_back_from_a_copy_restores_the_run(tmp_path: Path) -> None:
    """JOURNAL_CORRUPT's advice is to put back a copy from before the damage: a host that
    held the Run (and snapshotted it as corrupt) must not keep holding it on that verdict."""
    root = tmp_path / "runtime"
    segment = _crashed_host(root)
    good = segment.read_bytes()
    hit = frames_of(segment, "RUN-B")[5]
    flip(segment, hit.end - 3)
    store = open_store(root, instance_id="INST-2")  # holds it, snapshots it as corrupt
    assert by_id(store.restored.runs)["RUN-B"].status == "corrupt"
    store.close_blocking()
    live = root / "snap" / "live" / snapshot_name("RUN-B")
    assert b"corrupt" in live.read_bytes()  # the verdict the next start used to trust

    # Still damaged: held again, for the same reason.
    assert by_id(read_runs(root))["RUN-B"].status == "corrupt"

    segment.write_bytes(good)  # the copy from before the damage
    runs = by_id(read_runs(root))
    assert runs["RUN-B"].status == "ok" and runs["RUN-B"].state == _expected("RUN-B")
    store = open_store(root, instance_id="INST-3")
    assert by_id(store.restored.runs)["RUN-B"].state == _expected("RUN-B")
    store.close_blocking()
    assert b"corrupt" not in live.read_bytes()  # an ok snapshot now: no re-read needed
    assert by_id(read_runs(root))["RUN-B"].state == _expected("RUN-B")
    assert segment.read_bytes() == good


@pytest.mark.parametrize("copy", ["removed", "older", "partial"])
def test_a_corrupt_run_whose_damage_is_gone_from_the_log_stays_held(
    tmp_path: Path, copy: str,
) -> None:
    """The segment with the damage removed, or put back from a copy older than the damaged
    record, or from one taken while the host still wrote (it ends at record 9 of every Run,
    where the damaged read saw RUN-B reach 12): a read that stops short of where the Run was
    seen to get proves nothing past its end, and the Run stays held. The whole copy put back
    at last restores it, also after a start that found the segment gone."""
    root = tmp_path / "runtime"
    segment = _crashed_host(root)
    good = segment.read_bytes()
    hit = frames_of(segment, "RUN-B")[5]
    older = (good[:hit.offset] if copy == "older"  # from before record 6 was written
             else good[:max(frames_of(segment, run)[8].end for run in RUNS)])
    flip(segment, hit.end - 3)
    store = open_store(root, instance_id="INST-2")
    held = by_id(store.restored.runs)["RUN-B"]
    assert held.status == "corrupt"
    store.close_blocking()
    aside = tmp_path / segment.name
    if copy == "removed":
        segment.rename(aside)
    else:
        segment.write_bytes(older)
    for run in (by_id(read_runs(root))["RUN-B"], by_id(verify(root))["RUN-B"]):
        assert run.status == "corrupt" and run.problem == held.problem, run
        assert run.state == _expected("RUN-B", 5)
    store = open_store(root, instance_id="INST-3")
    assert by_id(store.restored.runs)["RUN-B"].status == "corrupt"
    store.close_blocking()
    if copy == "removed":
        aside.rename(segment)
    segment.write_bytes(good)  # the whole copy, at last: nothing was lost on the way
    assert by_id(read_runs(root))["RUN-B"].state == _expected("RUN-B")


def test_a_segment_missing_at_a_start_is_read_again_once_put_back(tmp_path: Path) -> None:
    """A host's write failed, so its Run went on in a second segment; the host then crashed.
    The first of the two is missing at the next start: the Run's records jump (held, rightly).
    The start that saw that must not forget the missing segment: put back, it is read and
    the Run restores from its whole journal."""
    root = tmp_path / "runtime"
    records = _closed_at_record_4(root)  # restores now start at segment 2
    # Records 5 and 6 in wal/0000000002.seg; RUN-A goes on in wal/0000000003.seg.
    went_on_after_a_failed_write(root, records[4:6], records[6:])
    segment = root / "wal" / "0000000002.seg"
    copy = tmp_path / segment.name
    segment.rename(copy)

    store = open_store(root, instance_id="INST-3")
    held = by_id(store.restored.runs)["RUN-A"]
    store.close_blocking()
    assert held.status == "corrupt" and "records 5..6 are missing" in (held.problem or "")
    assert by_id(read_runs(root))["RUN-A"].status == "corrupt"

    copy.rename(segment)  # put back, e.g. from a backup
    kept = segment.read_bytes()
    for runs in (read_runs(root), verify(root)):
        assert by_id(runs)["RUN-A"].status == "ok" and by_id(runs)["RUN-A"].state == fold(records)
    assert "RUN-X" not in by_id(read_runs(root))  # its failed batch stays void
    store = open_store(root, instance_id="INST-4")
    assert by_id(store.restored.runs)["RUN-A"].state == fold(records)
    store.close_blocking()
    assert by_id(read_runs(root))["RUN-A"].state == fold(records)
    assert segment.read_bytes() == kept


def test_a_gap_across_a_stray_high_numbered_file_pins_a_bounded_set_of_numbers(
    tmp_path: Path,
) -> None:
    """A stray file named wal/0000300000.seg made the next hosts number their segments after
    it. RUN-A's records 5..6 went to the first of those, which is missing at a start that
    reads the whole log (its live/ snapshot moved aside): its seqs jump from segment 1 to
    300002. The 299,998 numbers between were never files; pinned, every manifest after
    would have listed them all. The number next to the gap is pinned, and the copy put
    back restores the Run."""
    root = tmp_path / "runtime"
    records = _closed_at_record_4(root)
    stray = root / "wal" / "0000300000.seg"
    stray.write_bytes(b"not a segment")
    stray.chmod(0o600)
    for i, part in ((2, records[4:6]), (3, records[6:])):
        store = open_store(root, instance_id=f"INST-{i}")
        for record in part:
            store.append("RUN-A", record)
        store.sync_blocking()
        store.close_blocking()
    segment = root / "wal" / "0000300001.seg"
    segment.rename(tmp_path / segment.name)
    live = root / "snap" / "live" / snapshot_name("RUN-A")
    live.rename(tmp_path / live.name)

    store = open_store(root, instance_id="INST-4")
    assert by_id(store.restored.runs)["RUN-A"].status == "corrupt"
    store.close_blocking()
    manifest = decode_manifest(root / "manifest.json",
                               (root / "manifest.json").read_bytes())
    assert 300001 in manifest.pinned and len(manifest.pinned) <= 300
    assert by_id(read_runs(root))["RUN-A"].status == "corrupt"
    # Named at every start, one finding per run of consecutive numbers, not one per number.
    missing = [f for f in read_runs_report(root).files if f.kind == "missing"]
    assert "wal/0000300001.seg" in {f.path for f in missing}
    assert 1 < len(missing) <= 3, missing
    assert any(", as are the " in f.problem for f in missing), missing
    (tmp_path / segment.name).rename(segment)  # put back
    assert by_id(read_runs(root))["RUN-A"].state == fold(records)


def test_an_ended_run_begun_in_a_pinned_segment_is_not_restored_from_it(
    tmp_path: Path,
) -> None:
    """A segment stays pinned while a Run in it is held (here: damage). Another Run began in
    it, went on in the next host's segment and was cancelled there; that host's close moved
    restores past both and filed the Run in done/. Every later restore reads the pinned
    segment, where the ended Run's journal stops at its first records: read from scratch,
    it would come back unfinished and be resumed (its Steps run again)."""
    root = tmp_path / "runtime"
    z = _ended_after_a_pinned_segment(root)
    assert (root / "snap" / "done" / snapshot_name("RUN-Z")).exists()

    assert "RUN-Z" not in by_id(read_runs(root))
    store = open_store(root, instance_id="INST-3")
    restored = by_id(store.restored.runs)
    store.close_blocking()
    assert "RUN-Z" not in restored and restored["RUN-B"].status == "corrupt"
    assert by_id(verify(root))["RUN-Z"].state == fold(z)


@pytest.mark.parametrize("done_file", ["damaged", "moved_out"])
def test_an_ended_run_begun_in_a_pinned_segment_without_its_done_file_is_not_resumed(
    tmp_path: Path, done_file: str,
) -> None:
    """As above, but the ended Run's done/ file is damaged, or moved out as its report
    says to: read from the pinned segment alone, the Run stopped at record 3, unfinished
    (it would be resumed, its next record numbered 4 a second time). The whole log shows
    it ended: it is not restored, and a damaged file is reported and kept, a moved one
    written again."""
    root = tmp_path / "runtime"
    z = _ended_after_a_pinned_segment(root)
    done = root / "snap" / "done" / snapshot_name("RUN-Z")
    if done_file == "damaged":
        flip(done, 40)
    else:
        done.rename(tmp_path / done.name)
    kept = done.read_bytes() if done.exists() else None
    rel = f"snap/done/{done.name}"

    for i in range(2):
        report = read_runs_report(root)
        assert "RUN-Z" not in by_id(report.runs)
        reported = (rel, "corrupt") in {(f.path, f.kind) for f in report.files}
        assert reported == (done_file == "damaged")
        store = open_store(root, instance_id=f"INST-{i + 3}")
        restored = by_id(store.restored.runs)
        store.close_blocking()
        assert "RUN-Z" not in restored and restored["RUN-B"].status == "corrupt"
        if done_file == "damaged":
            assert done.read_bytes() == kept
        else:
            written = read_snapshot(done)  # written again, from the whole log
            assert written is not None and written.state == fold(z)
    assert by_id(verify(root))["RUN-Z"].state == fold(z)


@pytest.mark.parametrize("byte", [13, 20])  # the seq field's top byte, and its lowest
def test_a_damaged_seq_is_no_seq_the_run_must_reach(tmp_path: Path, byte: int) -> None:
    """A damaged frame's seq is a claim of its bytes: flipped, it claimed seq 6 + 0x5A<<56
    (or 92), which went into ``reached``, and no clean copy could ever free the Run."""
    root = tmp_path / "runtime"
    segment = _crashed_host(root)
    good = segment.read_bytes()
    flip(segment, frames_of(segment, "RUN-B")[5].offset + byte)
    store = open_store(root, instance_id="INST-2")
    assert by_id(store.restored.runs)["RUN-B"].status == "corrupt"
    store.close_blocking()
    snap = read_snapshot(root / "snap" / "live" / snapshot_name("RUN-B"))
    assert snap is not None and snap.status == "corrupt" and snap.reached == N, snap
    segment.write_bytes(good)
    assert by_id(read_runs(root))["RUN-B"].state == _expected("RUN-B")


def test_a_corrupt_snapshot_from_before_reached_keeps_its_verdict(tmp_path: Path) -> None:
    """A corrupt snapshot written before it recorded how far its Run got: nothing says
    what a re-read must reach, so the verdict stands even once the segment reads clean."""
    root = tmp_path / "runtime"
    segment = _crashed_host(root)
    good = segment.read_bytes()
    flip(segment, frames_of(segment, "RUN-B")[5].end - 3)
    store = open_store(root, instance_id="INST-2")
    store.close_blocking()
    live = root / "snap" / "live" / snapshot_name("RUN-B")
    snap = read_snapshot(live)
    assert snap is not None and snap.status == "corrupt" and snap.reached == N
    live.write_bytes(encode_snapshot(msgspec.structs.replace(snap, reached=0)))
    segment.write_bytes(good)
    assert by_id(read_runs(root))["RUN-B"].status == "corrupt"


def test_damage_to_a_runs_last_record_is_still_reported(tmp_path: Path) -> None:
    """No later record shows a gap, so the damaged frame itself must be blamed."""
    root = tmp_path / "runtime"
    segment = _crashed_host(root)
    last_a = frames_of(segment, "RUN-A")[-1]
    flip(segment, last_a.end - 2)
    runs = by_id(read_runs(root))
    assert runs["RUN-A"].status == "corrupt"
    assert f"offset {last_a.offset}" in (runs["RUN-A"].problem or "")
    assert runs["RUN-B"].status == runs["RUN-C"].status == "ok"


def test_damage_in_a_compacted_segment_is_found_by_verify_only(tmp_path: Path) -> None:
    """Startup does not read retired segments (that is the point); verify reads them all."""
    root = tmp_path / "runtime"
    segment = _crashed_host(root, close=True)
    hit = frames_of(segment, "RUN-C")[3]
    flip(segment, hit.end - 1)
    damaged = segment.read_bytes()
    runs = by_id(read_runs(root))
    assert all(j.status == "ok" for j in runs.values())
    full = by_id(verify(root))
    assert full["RUN-C"].status == "corrupt"
    assert f"offset {hit.offset}" in (full["RUN-C"].problem or "")
    assert full["RUN-A"].status == "ok" and full["RUN-A"].state == _expected("RUN-A")
    assert segment.read_bytes() == damaged


def test_damage_read_only_because_the_manifest_is_damaged_is_covered_by_snapshots(
        tmp_path: Path) -> None:
    """With ``manifest.json`` damaged a start reads every segment, compacted ones too. Damage
    there, in a record an intact ``snap/live/`` snapshot covers, is a file finding: the Run
    restores from its snapshot (recovery.md), and only ``verify`` blames the Run."""
    root = tmp_path / "runtime"
    segment = _crashed_host(root, close=True)
    hit = frames_of(segment, "RUN-C")[3]
    flip(segment, hit.end - 1)
    (root / "manifest.json").write_bytes(b'{"format": 1, "start": "two"}')
    damaged = segment.read_bytes()
    report = read_runs_report(root)
    assert report.stats.full
    assert ("wal/0000000001.seg", "corrupt") in {(f.path, f.kind) for f in report.files}
    runs = by_id(report.runs)
    assert runs["RUN-C"].status == "ok" and runs["RUN-C"].state == _expected("RUN-C")
    assert by_id(verify(root))["RUN-C"].status == "corrupt"
    assert segment.read_bytes() == damaged


def test_an_incompatible_segment_is_reported_and_untouched(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    segment = _crashed_host(root)
    data = bytearray(segment.read_bytes())
    struct.pack_into(">H", data, 8, 3)  # the format field of the file header
    segment.write_bytes(bytes(data))
    frozen = segment.read_bytes()

    runs = by_id(read_runs(root))
    assert set(runs) == set(RUNS)
    for journal in runs.values():
        assert journal.status == "incompatible" and journal.state is None
        assert "format 3; this intloom reads 1 and 2" in (journal.problem or "")
    # inspect's record list: another format's frames are not this intloom's records (they
    # were listed "ok", decoded as format 1).
    entries = read_history(root, "RUN-A")
    assert entries and {e.verdict for e in entries} == {"undecodable"}, entries
    assert ("wal/0000000001.seg is format 3; this intloom reads 1 and 2"
            in (entries[0].problem or ""))

    store = open_store(root, instance_id="INST-2")  # other Runs still work beside it
    for record in walk("RUN-D", 4, 9):
        store.append("RUN-D", record)
    store.sync_blocking()
    store.close_blocking()
    store = open_store(root, instance_id="INST-3")
    store.close_blocking()
    runs = by_id(read_runs(root))
    assert runs["RUN-D"].status == "ok" and runs["RUN-D"].state == fold(walk("RUN-D", 4, 9))
    assert all(runs[r].status == "incompatible" for r in RUNS)  # still reported: pinned
    assert segment.read_bytes() == frozen
    kinds = {(f.path, f.kind) for f in verify_report(root).files}
    assert ("wal/0000000001.seg", "incompatible") in kinds


def test_an_unreadable_newer_segment_is_still_reported(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    (root / "wal").mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    segment = root / "wal" / "0000000001.seg"
    segment.write_bytes(b"ILOOMWAL" + struct.pack(">HII", 7, 0, 0) + b"\x00" * 64)
    segment.chmod(0o600)
    [journal] = read_runs(root)
    assert journal.status == "incompatible" and "format 7" in (journal.problem or "")
    assert "wal/0000000001.seg" in journal.run_id


def test_a_sequence_the_machine_refuses_is_corrupt_with_its_seq(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    store = open_store(root)
    records = walk("RUN-A", 4, 0)
    for record in records:
        store.append("RUN-A", record)
    store.append("RUN-A", StepReady(at="t", stage="elsewhere", step="x"))  # not its Stage
    store.sync_blocking()
    abandon(store)
    journal = by_id(read_runs(root))["RUN-A"]
    assert journal.status == "corrupt" and "seq 5" in (journal.problem or "")
    assert journal.state == fold(records)


def _more(root: Path, instance: str, upto: int) -> None:
    """A host that opens the store, writes every Run's next two records, and closes."""
    store = open_store(root, instance_id=instance)
    for i in range(upto - 2, upto):
        for run, seed in RUNS.items():
            store.append(run, walk(run, upto, seed)[i])
        store.sync_blocking()
    store.close_blocking()


def _all_restore(root: Path, n: int) -> None:
    runs = by_id(read_runs(root))
    assert set(runs) == set(RUNS)
    for run, seed in RUNS.items():
        assert runs[run].status == "ok" and runs[run].state == fold(walk(run, n, seed))


def test_a_damaged_manifest_is_read_around_but_never_overwritten(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    _crashed_host(root, close=True)
    manifest = root / "manifest.json"
    manifest.write_bytes(b'{"format": 1, "start": "two"}')
    runs = read_runs_report(root)
    assert runs.stats.full and all(j.status == "ok" for j in runs.runs)
    assert by_id(runs.runs)["RUN-B"].state == _expected("RUN-B")
    # Every Run restores; the manifest is reported at each start and never written over,
    # through appends, a clean close and a crash.
    for i, upto in enumerate((N + 2, N + 4), 2):
        store = open_store(root, instance_id=f"INST-{i}", segment_bytes=1024)  # rotates too
        assert ("manifest.json", "corrupt") in {(f.path, f.kind) for f in store.restored.files}
        assert all(j.status == "ok" for j in store.restored.runs)
        store.close_blocking()
        _more(root, f"INST-{i}b", upto)
        assert manifest.read_bytes() == b'{"format": 1, "start": "two"}'
        _all_restore(root, upto)
    store = open_store(root, instance_id="INST-9")
    store.append("RUN-A", walk("RUN-A", N + 5, RUNS["RUN-A"])[N + 4])
    store.sync_blocking()
    abandon(store)
    assert manifest.read_bytes() == b'{"format": 1, "start": "two"}'
    assert by_id(read_runs(root))["RUN-A"].state == fold(walk("RUN-A", N + 5, RUNS["RUN-A"]))
    # Moved out (what the report says to do), a new one is written and restores are bounded.
    manifest.rename(tmp_path / "manifest.json.bad")
    open_store(root, instance_id="INST-10").close_blocking()
    report = read_runs_report(root)
    assert not report.stats.full and report.stats.segments_read == 0
    assert by_id(report.runs)["RUN-B"].state == fold(walk("RUN-B", N + 4, RUNS["RUN-B"]))


def test_a_damaged_snapshot_falls_back_to_the_whole_log(tmp_path: Path) -> None:
    """The log is the durability point and is never cut short, so a full read rebuilds the
    Run behind a damaged snapshot exactly: it restores. Its file is never written over."""
    root = tmp_path / "runtime"
    _crashed_host(root, close=True)
    victim = root / "snap" / "live" / snapshot_name("RUN-B")
    flip(victim, 30)
    kept = victim.read_bytes()
    report = read_runs_report(root)
    assert report.stats.full
    assert [(f.path, f.kind) for f in report.files] == [(f"snap/live/{victim.name}", "corrupt")]
    assert all(j.status == "ok" and j.state == _expected(j.run_id) for j in report.runs)
    for i, upto in enumerate((N + 2, N + 4), 2):
        store = open_store(root, instance_id=f"INST-{i}")
        assert all(j.status == "ok" for j in store.restored.runs)
        assert len(store.restored.runs) == len(RUNS) and store.restored.files
        store.close_blocking()
        _more(root, f"INST-{i}b", upto)  # RUN-B keeps running, and so do the others
        assert victim.read_bytes() == kept
        _all_restore(root, upto)
    # Moved out (what the report says to do): its records are still read, from seq 1 (the
    # whole log once: they begin in a pinned segment, and no file says where it got to).
    victim.rename(tmp_path / "bad.snap")
    report = read_runs_report(root)
    assert not report.files
    assert by_id(report.runs)["RUN-B"].state == fold(walk("RUN-B", N + 4, RUNS["RUN-B"]))
    open_store(root, instance_id="INST-9").close_blocking()  # RUN-B gets a snapshot again
    assert victim.exists()
    report = read_runs_report(root)
    assert report.stats.segments_read == 0
    _all_restore(root, N + 4)


def test_a_damaged_snapshot_the_log_cannot_stand_in_for_needs_attention(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    _crashed_host(root, close=True)
    _more(root, "INST-2", N + 2)
    victim = root / "snap" / "live" / snapshot_name("RUN-B")
    flip(victim, 30)
    kept = victim.read_bytes()
    first = root / "wal" / "0000000001.seg"
    first.rename(tmp_path / first.name)  # the log's beginning is gone (not intloom's doing)
    store = open_store(root, instance_id="INST-3")
    runs = by_id(store.restored.runs)
    store.close_blocking()
    b = runs["RUN-B"]
    assert b.status == "corrupt" and b.problem is not None
    assert f"snap/live/{victim.name} fails its checksum" in b.problem
    assert "records 1..12 are missing" in b.problem
    assert runs["RUN-A"].status == runs["RUN-C"].status == "ok"  # from their snapshots
    assert victim.read_bytes() == kept
    assert by_id(read_runs(root))["RUN-B"].problem == b.problem


def _two_runs_crashed(root: Path) -> tuple[Path, str, str]:
    """RUN-A-0001's last record (an acknowledged `executing`) is followed by RUN-B's."""
    a, b = "RUN-A-0001", "RUN-B-0001"
    store = open_store(root)
    for record in walk(a, 3, 5):
        store.append(a, record)
    store.append(b, walk(b, 1, 6)[0])
    store.sync_blocking()
    store.append(a, walk(a, 4, 5)[3])
    store.sync_blocking()
    store.append(b, walk(b, 2, 6)[1])
    store.sync_blocking()
    abandon(store)
    return root / "wal" / "0000000001.seg", a, b


@pytest.mark.parametrize("where", ["run_id", "length", "run_id+payload"])
def test_damage_mid_segment_is_charged_to_every_run_that_may_own_it(
    tmp_path: Path, where: str
) -> None:
    """A Run's last record (an acknowledged `executing`) is damaged: it must never read back
    as a Run that stopped one record earlier (its Step would run again)."""
    root = tmp_path / "runtime"
    segment, a, b = _two_runs_crashed(root)
    last = frames_of(segment, a)[-1]
    assert walk(a, 4, 5)[3].__struct_config__.tag == "executing"
    # A flipped run-id byte makes the frame claim Run RUN-A-0000, which never existed; the
    # frame's crc still names its owner unless its payload is damaged too.
    rid = last.offset + 23 + len(a) - 1
    offsets = {"run_id": [rid], "length": [last.offset + 6], "run_id+payload": [rid, last.end - 2]}
    data = bytearray(segment.read_bytes())
    for offset in offsets[where]:
        data[offset] ^= 0x01
    segment.write_bytes(bytes(data))
    damaged = segment.read_bytes()

    report = read_runs_report(root)
    runs = by_id(report.runs)
    assert set(runs) == {a, b}  # no phantom Run from the damaged id
    assert runs[a].status == "corrupt" and runs[a].state == fold(walk(a, 3, 5))
    assert f"wal/0000000001.seg offset {last.offset}" in (runs[a].problem or "")
    assert "record 4" in (runs[a].problem or "")
    unknowable = "may have held its record 4" in (runs[a].problem or "")
    assert unknowable == (where == "run_id+payload")
    verdicts = [h.verdict for h in read_history(root, a)]
    assert verdicts == ["ok"] * 3 + ([] if unknowable else ["damaged"])
    assert runs[b].status == "ok" and runs[b].state == fold(walk(b, 2, 6))
    assert [(f.path, f.kind) for f in report.files] == [("wal/0000000001.seg", "corrupt")]
    assert by_id(verify(root))[a].status == "corrupt"

    # Open-time compaction retires the verdict, never a healthy snapshot of RUN-A-0001.
    for i in range(3):
        store = open_store(root, instance_id=f"INST-{i}")
        assert by_id(store.restored.runs)[a].status == "corrupt"
        store.close_blocking()
        again = by_id(read_runs(root))
        assert again[a].status == "corrupt" and again[a].problem == runs[a].problem
        assert again[b].status == "ok"
        assert segment.read_bytes() == damaged


@pytest.mark.parametrize("where", ["length", "payload", "run_id+payload"])
def test_an_idle_run_known_only_from_its_snapshot_may_own_the_damage(
    tmp_path: Path, where: str
) -> None:
    """Its next record (an answer, say) may be the damaged frame, unless the damaged bytes
    are provably one frame of another Run (by its crc, or by a consistent header)."""
    root = tmp_path / "runtime"
    segment = _idle_then_another(root)
    hit = frames_of(segment, "RUN-X")[1]
    for offset in {"length": [hit.offset + 6], "payload": [hit.end - 2],
                   "run_id+payload": [hit.offset + 24, hit.end - 2]}[where]:
        flip(segment, offset)
    runs = by_id(read_runs(root))
    x = runs["RUN-X"]  # its seqs show the gap whatever the damage
    assert x.status == "corrupt" and f"offset {hit.offset}" in (x.problem or "")
    idle = runs["RUN-IDLE"]
    assert idle.state == fold(walk("RUN-IDLE", 5, 1))
    if where == "run_id+payload":  # nothing says whose frame it was
        assert idle.status == "corrupt" and "record 6" in (idle.problem or "")
        assert f"offset {hit.offset}" in (idle.problem or "")
        assert "records 2..2 are missing" in (x.problem or "")
    else:
        assert idle.status == "ok"
        assert f"record 2 at wal/0000000002.seg offset {hit.offset} fails" in (x.problem or "")


def test_a_run_held_for_damage_no_run_owns_is_not_freed_by_a_copy_where_it_ends(
    tmp_path: Path,
) -> None:
    """docs/format.md: a Run held because unattributed damaged bytes "may have held its
    record 6" stays held when a clean copy, in which it ends at record 5, is put back. That
    copy and one taken before the damaged frame was written read the same for that Run (its
    snapshot does not say where the damage was), and the older copy proves nothing. Moving
    its snapshot aside has it judged from the whole log, as the docs say."""
    root = tmp_path / "runtime"
    segment = _idle_then_another(root)
    good = segment.read_bytes()
    hit = frames_of(segment, "RUN-X")[1]
    for offset in (hit.offset + 24, hit.end - 2):  # its run id and its payload: no owner
        flip(segment, offset)
    store = open_store(root, instance_id="INST-3")
    held = by_id(store.restored.runs)["RUN-IDLE"]
    store.close_blocking()
    assert held.status == "corrupt" and "may have held its record 6" in (held.problem or "")
    assert held.reached == 6

    seen: dict[str, RunJournal] = {}
    for copy, data in (("older", good[:hit.offset]), ("whole", good)):
        segment.write_bytes(data)
        seen[copy] = by_id(read_runs(root))["RUN-IDLE"]
    assert seen["older"] == seen["whole"]
    assert seen["whole"].status == "corrupt" and seen["whole"].problem == held.problem
    assert by_id(read_runs(root))["RUN-X"].state == fold(walk("RUN-X", 3, 2))

    live = root / "snap" / "live" / snapshot_name("RUN-IDLE")
    live.rename(tmp_path / live.name)
    idle = by_id(read_runs(root))["RUN-IDLE"]
    assert idle.status == "ok" and idle.state == fold(walk("RUN-IDLE", 5, 1))
    assert segment.read_bytes() == good


def test_a_run_incompatible_at_record_level_stays_reported(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    store = open_store(root)
    store.append("RUN-A", msgspec.structs.replace(header("RUN-A"), format=2))
    store.append("RUN-A", walk("RUN-A", 2, 0)[1])
    for record in walk("RUN-B", 2, 0):
        store.append("RUN-B", record)
    store.sync_blocking()
    abandon(store)
    segment = root / "wal" / "0000000001.seg"
    kept = segment.read_bytes()
    for n in range(3):
        store = open_store(root, instance_id=f"INST-{n}")
        runs = by_id(store.restored.runs)
        assert runs["RUN-A"].status == "incompatible"
        assert "format 2; this intloom reads 1 (a newer intloom wrote it: run an intloom that " \
            "reads format 2" in (runs["RUN-A"].problem or "")
        assert runs["RUN-B"].status == "ok" and runs["RUN-B"].state == fold(walk("RUN-B", 2, 0))
        store.close_blocking()
    assert by_id(read_runs(root))["RUN-A"].status == "incompatible"
    assert segment.read_bytes() == kept


def test_store_history_reads_a_runs_records_up_to_a_seq_and_stops_at_damage(
    tmp_path: Path,
) -> None:
    """``Store.history`` (an earlier host's records, for a restored Run's followers): the
    Run's own records in order, cut at ``upto_seq``, and at the first damaged one."""
    root = tmp_path / "runtime"
    segment = _crashed_host(root, close=True)
    store = open_store(root)
    try:
        assert store.history("RUN-A", N) == walk("RUN-A", N, RUNS["RUN-A"])
        assert store.history("RUN-A", 4) == walk("RUN-A", N, RUNS["RUN-A"])[:4]
        assert store.history("RUN-missing", N) == []
        flip(segment, frames_of(segment, "RUN-B")[5].end - 3)  # record 6 of RUN-B
        assert store.history("RUN-B", N) == walk("RUN-B", N, RUNS["RUN-B"])[:5]
        assert store.history("RUN-C", N) == walk("RUN-C", N, RUNS["RUN-C"])
    finally:
        store.close_blocking()


def test_store_history_passes_over_a_torn_record_the_next_host_wrote_again(
    tmp_path: Path,
) -> None:
    """A torn record never happened: the next host writes that seq again, in a later
    segment. ``Store.history`` reads on past the torn copy (it used to stop there)."""
    root = tmp_path / "runtime"
    records = walk("RUN-A", 8, 4)
    first = open_store(root)
    for record in records[:6]:
        first.append("RUN-A", record)
        first.sync_blocking()
    abandon(first)
    segment = root / "wal" / "0000000001.seg"
    data, end = segment.read_bytes(), frames_end(segment)
    # A crash in the middle of record 6: its last bytes never replaced the zeros there.
    segment.write_bytes(data[:end - 10] + bytes(len(data) - end + 10))
    second = open_store(root, instance_id="INST-2")  # another host: another instance id
    assert by_id(second.restored.runs)["RUN-A"].state.seq == 5
    for record in records[5:]:
        second.append("RUN-A", record)
    second.sync_blocking()
    second.close_blocking()
    assert [h.verdict for h in read_history(root, "RUN-A")][5:7] == ["torn", "ok"]
    third = open_store(root)
    try:
        assert third.history("RUN-A", 8) == records
    finally:
        third.close_blocking()


def test_store_history_decodes_only_the_segments_holding_the_run_or_a_void_notice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restored Run's followers read its earlier records back from the whole log: segments
    holding only other Runs' records are read but not decoded (a long log took ~20 ms per
    MiB). The void notice of the Run's failed batch sits in a segment without the Run, and
    must still be found: the record it voids never happened."""
    root = tmp_path / "runtime"
    a, b = walk("RUN-A", 6, 1), walk("RUN-B", 6, 2)
    store = open_store(root, faults=FaultPlan(fail_sync=frozenset({2}),
                                              keep_failed=frozenset({2})))
    store.append("RUN-A", a[0])
    store.append("RUN-B", b[0])
    store.sync_blocking()  # segment 1
    store.append("RUN-A", a[1])
    with pytest.raises(CheckpointFailed):
        store.sync_blocking()  # RUN-A's record 2 is void; the notice opens segment 2
    store.append("RUN-B", b[1])
    store.sync_blocking()
    abandon(store)  # a crash: no manifest repeats the notice
    store = open_store(root, instance_id="INST-3")
    store.append("RUN-B", b[2])  # segment 3: RUN-B alone
    store.sync_blocking()
    store.close_blocking()
    assert frames_of(root / "wal" / "0000000002.seg", "RUN-A") == []
    scanned: list[str] = []
    real = scan_segment

    def spy(name: str, number: int, data: bytes) -> SegmentScan:
        scanned.append(name)
        return real(name, number, data)

    monkeypatch.setattr(history_module, "scan_segment", spy)
    store = open_store(root, instance_id="INST-4")
    try:
        assert store.history("RUN-A", 6) == a[:1]
        assert scanned == ["0000000001.seg", "0000000002.seg"]
        scanned.clear()
        assert store.history("RUN-B", 6) == b[:3]
        assert scanned == ["0000000001.seg", "0000000002.seg", "0000000003.seg"]
    finally:
        store.close_blocking()
    scanned.clear()
    assert [h.verdict for h in read_history(root, "RUN-A")] == ["ok", "void"]
    assert len(scanned) >= 3  # inspect still reads every segment for damage


def _ended_and_live(root: Path) -> tuple[Path, Path]:
    """RUN-END ended and RUN-LIVE still runs, both in segment 1; a clean close snapshotted
    them (done/ and live/). Returns (done/ file of RUN-END, live/ file of RUN-LIVE)."""
    store = open_store(root)
    for record in walk("RUN-END", 8, 4, terminal=True):
        store.append("RUN-END", record)
    for record in walk("RUN-LIVE", 8, 5):
        store.append("RUN-LIVE", record)
    store.sync_blocking()
    store.close_blocking()
    done = root / "snap" / "done" / snapshot_name("RUN-END")
    live = root / "snap" / "live" / snapshot_name("RUN-LIVE")
    assert done.exists() and live.exists()
    return done, live


@pytest.mark.parametrize("how", ["manifest_moved_out", "live_snapshot_damaged"])
def test_a_damaged_done_snapshot_is_never_written_over(tmp_path: Path, how: str) -> None:
    """Whatever makes a start read an ended Run's records again (no manifest, or a damaged
    live snapshot that pins the segment), its damaged done/ file is reported and kept."""
    root = tmp_path / "runtime"
    done, live = _ended_and_live(root)
    flip(done, 40)
    kept = done.read_bytes()
    if how == "manifest_moved_out":
        (root / "manifest.json").rename(tmp_path / "manifest.json")
    else:
        flip(live, 30)
    rel = f"snap/done/{done.name}"
    report = read_runs_report(root)  # what doctor reads: the file a start reads is reported
    assert (rel, "corrupt") in {(f.path, f.kind) for f in report.files}
    for i in range(3):
        store = open_store(root, instance_id=f"INST-{i + 2}")
        assert (rel, "corrupt") in {(f.path, f.kind) for f in store.restored.files}
        assert [j.run_id for j in store.restored.runs] == ["RUN-LIVE"]
        store.close_blocking()
        assert done.read_bytes() == kept
    assert by_id(verify(root))["RUN-END"].state == fold(walk("RUN-END", 8, 4, terminal=True))
    # Moved out (what the report says to do), the next host writes it again from the log.
    done.rename(tmp_path / "bad.snap")
    open_store(root, instance_id="INST-9").close_blocking()
    assert done.exists() and done.read_bytes() != kept
    assert rel not in {f.path for f in read_runs_report(root).files}


def test_healthy_done_snapshots_are_not_rewritten_at_each_start(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    done, live = _ended_and_live(root)
    before = done.read_bytes()
    flip(live, 30)  # pins segment 1: every start reads RUN-END's records again
    for i in range(3):
        open_store(root, instance_id=f"INST-{i + 2}").close_blocking()
        assert done.read_bytes() == before


def test_a_run_ending_beside_a_damaged_done_file_is_not_restored_and_the_file_kept(
        tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    records = walk("RUN-X", 8, 6, terminal=True)
    store = open_store(root)
    for record in records[:-1]:
        store.append("RUN-X", record)
    store.sync_blocking()
    planted = root / "snap" / "done" / snapshot_name("RUN-X")
    planted.write_bytes(b"garbage: not a snapshot at all")
    planted.chmod(0o600)
    store.append("RUN-X", records[-1])
    store.sync_blocking()
    store.close_blocking()
    assert planted.read_bytes() == b"garbage: not a snapshot at all"
    report = read_runs_report(root)
    assert report.runs == []  # it ended: never restored as unfinished
    assert (f"snap/done/{planted.name}", "corrupt") in {(f.path, f.kind) for f in report.files}
    open_store(root, instance_id="INST-2").close_blocking()
    assert planted.read_bytes() == b"garbage: not a snapshot at all"
    planted.rename(tmp_path / "bad.snap")
    open_store(root, instance_id="INST-3").close_blocking()  # now it moves to done/
    assert planted.exists() and not list((root / "snap" / "live").iterdir())
    assert by_id(verify(root))["RUN-X"].state == fold(records)


def test_a_missing_live_snapshot_never_hides_its_run(tmp_path: Path) -> None:
    """Its Run's records sit in a segment the manifest no longer names: the manifest's list
    of live/ files tells the restore to read the whole log, which finds the Run."""
    root = tmp_path / "runtime"
    _crashed_host(root, close=True)  # every Run's records are before the manifest's start
    gone = root / "snap" / "live" / snapshot_name("RUN-B")
    gone.rename(tmp_path / gone.name)
    rel = f"snap/live/{gone.name}"
    report = read_runs_report(root)
    assert report.stats.full
    assert [(f.path, f.kind) for f in report.files] == [(rel, "missing")]
    assert "Run RUN-B has records in wal/0000000001.seg" in report.files[0].problem
    _all_restore(root, N)
    store = open_store(root, instance_id="INST-2")
    assert {j.run_id for j in store.restored.runs} == set(RUNS)
    assert (rel, "missing") in {(f.path, f.kind) for f in store.restored.files}
    store.close_blocking()
    assert gone.exists()  # written again from the log: the next restore is bounded again
    report = read_runs_report(root)
    assert not report.files and report.stats.segments_read == 0
    _all_restore(root, N)


def test_a_manifest_ahead_of_its_log_is_damage_and_kept(tmp_path: Path) -> None:
    """A checksum-valid manifest whose start is past the log's last segment + 1 would hide
    every Run of the segments it skips: it is reported, read around, never written over by
    the host that found it, and no Run is lost once that host's segments make it look
    consistent (before, a host numbered its segments below that start, and lost them)."""
    root = tmp_path / "runtime"
    _crashed_host(root, close=True)
    store = open_store(root, instance_id="INST-2")
    for record in walk("RUN-D", 5, 9):
        store.append("RUN-D", record)  # only in segment 2, no snapshot yet
    store.sync_blocking()
    abandon(store)
    manifest = root / "manifest.json"
    forged = decode_manifest(manifest, manifest.read_bytes())
    manifest.write_bytes(encode_manifest(msgspec.structs.replace(forged, start=99)))
    kept = manifest.read_bytes()
    report = read_runs_report(root)
    assert report.stats.full
    [problem] = [f for f in report.files if f.path == "manifest.json"]
    assert problem.kind == "corrupt" and "names segment 99" in problem.problem
    runs = by_id(report.runs)
    assert set(runs) == {*RUNS, "RUN-D"} and runs["RUN-D"].state == fold(walk("RUN-D", 5, 9))
    # The host numbers its segment at that start, never below it (a restore trusting the
    # manifest once the log has caught up would skip it), and snapshots every Run it read
    # (RUN-D's records are in a segment below that start), but never writes the manifest.
    store = open_store(root, instance_id="INST-3")
    assert store._number == 99
    e = walk("RUN-E", 4, 3)
    for record in e:
        store.append("RUN-E", record)
    store.sync_blocking()
    abandon(store)  # a crash: RUN-E is only in segment 99
    assert manifest.read_bytes() == kept
    runs = by_id(read_runs_report(root).runs)
    assert set(runs) == {*RUNS, "RUN-D", "RUN-E"}
    assert runs["RUN-D"].state == fold(walk("RUN-D", 5, 9)) and runs["RUN-E"].state == fold(e)


@pytest.mark.parametrize("field", [{"open": -2}, {"start": 10_000_000_000}, {"pinned": [-1]}])
def test_a_manifest_naming_a_segment_no_file_can_be_is_damage(
    tmp_path: Path, field: dict[str, object],
) -> None:
    """A checksum-valid manifest naming a segment number no ten-digit name can hold failed
    every read of the store with a ValueError (doctor, verify, inspect and start ended
    CLI_INTERNAL_ERROR, exit 70, and no Run was restored)."""
    root = tmp_path / "runtime"
    _crashed_host(root, close=True)
    manifest = root / "manifest.json"
    written = decode_manifest(manifest, manifest.read_bytes())
    manifest.write_bytes(encode_manifest(msgspec.structs.replace(written, **field)))
    kept = manifest.read_bytes()
    report = read_runs_report(root)
    [problem] = [f for f in report.files if f.path == "manifest.json"]
    [(name, _value)] = field.items()
    assert problem.kind == "corrupt" and f"at `$.{name}" in problem.problem, problem
    assert set(by_id(report.runs)) == set(RUNS) and report.stats.full
    assert manifest.read_bytes() == kept


def test_a_segment_copied_in_stays_a_duplicate_after_its_runs_were_held(tmp_path: Path) -> None:
    """A segment copied beside itself (cp 0000000001.seg 0000000002.seg): every Run is
    corrupt ("appears twice"). A host over it then closed, writing each held Run's snapshot
    (its fold up to the duplicate); judged again from that snapshot, the copy's records
    were skipped as summarised, and the next start restored all three over two histories."""
    root = tmp_path / "runtime"
    segment = _crashed_host(root)
    shutil.copy2(segment, root / "wal" / "0000000002.seg")  # cp -a
    first = by_id(read_runs(root))
    assert {run: j.status for run, j in first.items()} == dict.fromkeys(RUNS, "corrupt")
    assert all("appears twice" in (j.problem or "") for j in first.values())
    store = open_store(root, instance_id="INST-2")
    store.close_blocking()
    again = by_id(read_runs_report(root).runs)
    assert {run: j.status for run, j in again.items()} == dict.fromkeys(RUNS, "corrupt"), again
    assert all("appears twice" in (j.problem or "") for j in again.values()), again


def test_a_covered_record_in_a_later_segment_is_a_second_history(tmp_path: Path) -> None:
    """A closed host's snapshots cover every record of segment 1. A copy of that segment
    put in as a later one (from a backup, another project) was skipped as summarised: a
    start restored the Runs from their snapshots, doctor said verified, and only verify,
    reading from scratch, called them corrupt."""
    root = tmp_path / "runtime"
    segment = _crashed_host(root, close=True)
    _all_restore(root, N)
    shutil.copy2(segment, root / "wal" / "0000000009.seg")
    runs = by_id(read_runs_report(root).runs)
    assert {run: j.status for run, j in runs.items()} == dict.fromkeys(RUNS, "corrupt"), runs
    problem = runs["RUN-A"].problem or ""
    assert ("record 1, which its snapshot covers (written while wal/0000000001.seg was "
            "open), appears again in a later segment, at wal/0000000009.seg") in problem, problem


def _ended_after_a_pinned_segment(root: Path) -> list[Record]:
    """RUN-Z's first 3 records in segment 1, kept pinned by RUN-B's damage there; the next
    host restores RUN-Z, goes on with it in its own segment to its end, and closes (which
    files it in done/ and moves restores past both segments). Returns RUN-Z's records."""
    store = open_store(root)
    b, z = walk("RUN-B", 8, 2), walk("RUN-Z", 10, 5, terminal=True)
    for record in b:
        store.append("RUN-B", record)
    for record in z[:3]:
        store.append("RUN-Z", record)
    store.sync_blocking()
    abandon(store)
    segment = root / "wal" / "0000000001.seg"
    flip(segment, frames_of(segment, "RUN-B")[4].end - 3)  # RUN-B held: segment 1 pinned
    store = open_store(root, instance_id="INST-2")
    assert by_id(store.restored.runs)["RUN-Z"].state == fold(z[:3])
    for record in z[3:]:
        store.append("RUN-Z", record)
    store.sync_blocking()
    store.close_blocking()
    return z


def _closed_at_record_4(root: Path) -> list[Record]:
    """RUN-A's first 4 records, then a clean close (a snapshot at record 4, restores
    starting after segment 1). Returns all of RUN-A's records, for what follows."""
    records = walk("RUN-A", 8, RUNS["RUN-A"])
    store = open_store(root)
    for record in records[:4]:
        store.append("RUN-A", record)
    store.sync_blocking()
    store.close_blocking()
    return records


def _idle_then_another(root: Path) -> Path:
    """RUN-IDLE's 5 records in segment 1, then a crash; the next host snapshots it and
    writes RUN-X's 3 records, one flush each, in segment 2, then crashes. Returns segment 2."""
    store = open_store(root)
    for record in walk("RUN-IDLE", 5, 1):
        store.append("RUN-IDLE", record)
    store.sync_blocking()
    abandon(store)
    store = open_store(root, instance_id="INST-2")
    for record in walk("RUN-X", 3, 2):
        store.append("RUN-X", record)
        store.sync_blocking()
    abandon(store)
    return root / "wal" / "0000000002.seg"


def test_damaged_history_of_an_ended_run_is_no_missing_live_snapshot(tmp_path: Path) -> None:
    """An ended Run, filed in done/ by a clean close, then a byte flipped in one of its
    records in history the manifest leaves to snapshots: verify (what inspect reads) listed
    ``snap/live/<its snapshot> missing`` besides the damage, though an ended Run's snapshot
    is in done/ and nothing of it is missing from live/. The damage alone is reported, and
    the store stays byte-identical."""
    root = tmp_path / "runtime"
    store = open_store(root)
    for record in walk("RUN-E", N, 5, terminal=True):
        store.append("RUN-E", record)
        store.sync_blocking()
    store.close_blocking()
    assert (root / "snap" / "done" / snapshot_name("RUN-E")).exists()
    segment = root / "wal" / "0000000001.seg"
    flip(segment, frames_of(segment, "RUN-E")[3].end - 3)
    before = snapshot_files(root)

    report = verify_report(root)
    assert [(f.path, f.kind) for f in report.files] == [("wal/0000000001.seg", "corrupt")]
    assert by_id(report.runs)["RUN-E"].status == "corrupt"
    assert snapshot_files(root) == before


def test_a_damaged_snapshot_whose_run_no_record_names_says_the_run_is_not_restored(
    tmp_path: Path,
) -> None:
    """History below the manifest's start deleted (not detected: docs/format.md), then
    RUN-B's snapshot damaged: nothing left names RUN-B. The finding used to say "every
    segment was read instead", a fallback that found nothing; it now says that the Run is
    neither restored nor held and how to get it back. The file is kept byte-identical."""
    root = tmp_path / "runtime"
    _crashed_host(root, close=True).unlink()
    live = root / "snap" / "live" / snapshot_name("RUN-B")
    flip(live, len(live.read_bytes()) - 5)
    kept = live.read_bytes()
    report = read_runs_report(root)
    assert set(by_id(report.runs)) == {"RUN-A", "RUN-C"}
    [finding] = [f for f in report.files if f.path == f"snap/live/{live.name}"]
    assert finding.kind == "corrupt"
    assert "neither restored nor held" in finding.problem, finding
    assert "every segment was read instead" not in finding.problem
    open_store(root, instance_id="INST-2").close_blocking()
    assert live.read_bytes() == kept


def test_a_record_nested_too_deeply_to_decode_holds_its_run_not_the_host(
        tmp_path: Path) -> None:
    """An Agent's output ~980 levels deep was journaled, and decoding it back at the next
    start (a deeper stack) raised RecursionError out of the restore: the host failed to start
    (CLI_INTERNAL_ERROR) for every Run of the project, over one Run's record."""
    from intloom.runtime.records import Executing, StagePending, StepResult

    root = tmp_path / "runtime"
    store = open_store(root)
    deep = msgspec.Raw(b"\x91" * 100_000 + b"\x01")  # a list in a list ... far past any stack
    records: list[Record] = [
        header("RUN-A"), StagePending(at="t1", stage="s"),
        StepReady(at="t2", stage="s", step="s1"),
        Executing(at="t3", stage="s", step="s1", kind="step"),
        StepResult(at="t4", stage="s", step="s1", outcome="done", output=deep)]
    for record in records:
        store.append("RUN-A", record)
    for record in walk("RUN-B", N, 2):
        store.append("RUN-B", record)
    store.sync_blocking()
    abandon(store)

    runs = by_id(read_runs(root))
    assert runs["RUN-B"].status == "ok" and runs["RUN-B"].state == _expected("RUN-B")
    a = runs["RUN-A"]
    assert a.status == "corrupt" and a.problem is not None
    assert "record at wal/0000000001.seg" in a.problem
    assert "nested too deeply to decode" in a.problem, a.problem
    assert [h.verdict for h in read_history(root, "RUN-A")][-1] == "undecodable"
    store = open_store(root, instance_id="INST-2")  # a new host starts, and holds RUN-A
    assert by_id(store.restored.runs)["RUN-A"].status == "corrupt"
    store.close_blocking()


def test_a_snapshot_nested_too_deeply_to_decode_is_an_unusable_snapshot(tmp_path: Path) -> None:
    """The same for a snapshot: a Run waiting on an Agent task nested that deep is kept in
    its snapshot at a stop, and reading it back raised RecursionError instead of naming it."""
    from intloom.runtime.model import Cursor, WaitingAction
    from intloom.runtime.records import Executing, StagePending, Waiting
    from intloom.store.snapshots import Snapshot, SnapshotError, decode_snapshot

    deep = msgspec.Raw(b"\x91" * 100_000 + b"\x01")
    action = WaitingAction(id="ASK-1", kind="confirmation", request=deep,
                           cursor=Cursor(stage="s", step="s1"), created_at="t4")
    state = fold([header("RUN-A"), StagePending(at="t1", stage="s"),
                  StepReady(at="t2", stage="s", step="s1"),
                  Executing(at="t3", stage="s", step="s1", kind="step"),
                  Waiting(at="t4", action=action)])
    path = tmp_path / snapshot_name("RUN-A")
    data = encode_snapshot(Snapshot(run_id="RUN-A", seq=5, status="ok", state=state))
    with pytest.raises(SnapshotError) as unusable:
        decode_snapshot(path, data)
    assert "nested more deeply than intloom can decode" in unusable.value.fact


def test_a_snapshot_whose_body_says_another_format_than_its_fixed_field_is_unusable(
        tmp_path: Path) -> None:
    """As for a segment's header: the body is checksummed, the fixed field is not, and a
    writer makes them equal. One saying format 2 behind a fixed field of 1 was trusted."""
    from intloom.store.snapshots import Snapshot, SnapshotError, decode_snapshot

    state = fold([header("RUN-A")])
    body = msgspec.msgpack.encode(Snapshot(run_id="RUN-A", seq=1, status="ok", state=state,
                                           format=2))
    data = struct.pack(">8sHII", b"ILOOMSNP", 1, len(body), zlib.crc32(body)) + body
    with pytest.raises(SnapshotError) as unusable:
        decode_snapshot(tmp_path / snapshot_name("RUN-A"), data)
    assert unusable.value.fact == ("is damaged (its body says format 2, its fixed format "
                                   "field 1)")


def _resnapshot(path: Path, **changes: object) -> None:
    """Rewrite a snapshot's body with ``changes``, its crc and length made to match."""
    data = path.read_bytes()
    body = msgspec.msgpack.decode(data[18:])
    body.update(changes)
    new = msgspec.msgpack.encode(body)
    path.write_bytes(data[:10] + struct.pack(">II", len(new), zlib.crc32(new)) + new)


def test_a_snapshot_whose_seq_is_not_its_states_is_damaged_and_the_log_read(
        tmp_path: Path) -> None:
    """A writer sets a snapshot's ``seq`` from the state it holds. One claiming record 7
    over a state at record 5 was trusted: the restore skipped records 6 and 7 in the log as
    already summarised and brought RUN-A back at record 5, where its host had gone on."""
    root = tmp_path / "runtime"
    records = walk("RUN-A", 7, 1)
    store = open_store(root)
    for record in records[:5]:
        store.append("RUN-A", record)
    store.sync_blocking()
    store.close_blocking()  # snapshot at record 5
    store = open_store(root, instance_id="INST-2")
    for record in records[5:]:
        store.append("RUN-A", record)
    store.sync_blocking()
    abandon(store)  # records 6 and 7 in segment 2, which a restore reads
    snap = root / "snap" / "live" / snapshot_name("RUN-A")
    _resnapshot(snap, seq=7)
    kept = snap.read_bytes()

    report = read_runs_report(root)
    a = by_id(report.runs)["RUN-A"]
    assert a.status == "ok" and a.state == fold(records), a
    (finding,) = report.files
    assert finding.path == f"snap/live/{snap.name}" and finding.kind == "corrupt"
    assert finding.problem.startswith("is damaged (it says it covers record 7, but the state "
                                      "it holds is at record 5)"), finding
    assert snap.read_bytes() == kept


def test_a_snapshot_holding_another_runs_state_is_damaged(tmp_path: Path) -> None:
    """Its ``run_id`` matches its name, its state is another Run's: it was trusted."""
    from intloom.store.snapshots import Snapshot, SnapshotError, decode_snapshot

    state = fold([header("RUN-B")])
    data = encode_snapshot(Snapshot(run_id="RUN-A", seq=1, status="ok", state=state))
    with pytest.raises(SnapshotError) as unusable:
        decode_snapshot(tmp_path / snapshot_name("RUN-A"), data)
    assert unusable.value.fact == "is damaged (it names Run RUN-A but holds the state of Run RUN-B)"


def test_a_segment_cut_short_after_its_host_went_on_is_damage_not_a_torn_tail(
        tmp_path: Path) -> None:
    """A host appends to a segment only until it writes into the next one (a rotation seals
    the old one first), so a cut-short end of a segment whose host went on to write a later
    one is no crash's torn tail: it was cut short since. Read as torn ("a crash mid-append;
    not corruption", accepted by ``start --strict``), the Run whose last record was cut
    off, with the manifest and its snapshot gone (a read of the whole log), was restored
    one record earlier as if that record had never been written."""
    root = tmp_path / "runtime"
    a, b = walk("RUN-A", 12, 1), walk("RUN-B", 5_000, 2)
    store = open_store(root, instance_id="INST-1", segment_bytes=64 << 10)
    for record in a[:-1]:
        store.append("RUN-A", record)
    store.sync_blocking()
    i = 0
    while store._size < (64 << 10) - 2_000:  # RUN-B fills the segment near its rotation
        store.append("RUN-B", b[i])
        store.sync_blocking()
        i += 1
    store.append("RUN-A", a[-1])  # RUN-A's last record, in segment 1
    store.sync_blocking()
    while store._number == 1:  # ... then the rotation, and records in segment 2
        store.append("RUN-B", b[i])
        store.sync_blocking()
        i += 1
    for record in b[i : i + 20]:
        store.append("RUN-B", record)
    store.sync_blocking()
    abandon(store)
    first = root / "wal" / "0000000001.seg"
    data = first.read_bytes()
    last_a = [f for f in scan_segment(first.name, 1, data).frames if f.run_id == "RUN-A"][-1]
    assert last_a.seq == 12
    first.write_bytes(data[: last_a.offset + 20])  # cut inside RUN-A's record 12
    (root / "manifest.json").unlink()
    (root / "snap" / "live" / snapshot_name("RUN-A")).unlink()
    kept = snapshot_files(root)

    report = verify_report(root)
    [finding] = [f for f in report.files if f.path == "wal/0000000001.seg"]
    assert finding.kind == "corrupt", finding
    # The damage ends where its last non-zero byte does (zeros after it are the room a
    # format-2 writer preallocates): at most the 20 bytes kept.
    found = re.search(rf"bytes {last_a.offset}\.\.(\d+) at its end", finding.problem)
    assert found is not None and last_a.offset < int(found[1]) <= last_a.offset + 20, finding
    assert "went on to write wal/0000000002.seg" in finding.problem
    journal = by_id(read_runs(root))["RUN-A"]
    assert journal.status == "corrupt" and "may have held its record 12" in (journal.problem
                                                                             or ""), journal
    assert snapshot_files(root) == kept


def _snapshotted_then_left_behind(root: Path) -> None:
    """RUN-A's 12 records in segment 1, then RUN-B's until the manifest's start is segment
    3: RUN-A lives on in its live/ snapshot, which the manifest counts."""
    a, b = walk("RUN-A", 12, 1), walk("RUN-B", 5_000, 2)
    store = open_store(root, instance_id="INST-1", segment_bytes=64 << 10)
    for record in a:
        store.append("RUN-A", record)
    store.sync_blocking()
    i = 0
    while store._number < 3:  # a flush per 100 records: rotations come after a flush
        for record in b[i : i + 100]:
            store.append("RUN-B", record)
        store.sync_blocking()
        i += 100
    assert store.compaction_idle(30)
    abandon(store)


@pytest.mark.parametrize("cut", [False, True])
def test_a_live_snapshot_gone_with_the_segment_that_held_its_run_is_reported(
        tmp_path: Path, cut: bool) -> None:
    """A live/ snapshot deleted while the segment holding its Run's records was cut short:
    nothing that was read names that Run any more, and a start restored the other Runs as if
    it had never existed, the cut segment's finding the only word (of bytes, not of a Run).
    The manifest counted the live/ files it relied on: one more than anything left names
    is a Run lost. With that segment whole, the Run is read from it (its own finding)."""
    root = tmp_path / "runtime"
    _snapshotted_then_left_behind(root)
    manifest = (root / "manifest.json").read_bytes()
    assert b'"start":3' in manifest and b'"count":2' in manifest, manifest
    (root / "snap" / "live" / snapshot_name("RUN-A")).unlink()
    first = root / "wal" / "0000000001.seg"
    if cut:
        first.write_bytes(first.read_bytes()[:200])
    kept = {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    report = verify_report(root)
    gone = [f for f in report.files if f.path == "snap/live"]
    runs = {j.run_id for j in read_runs(root)}
    if not cut:
        assert runs == {"RUN-A", "RUN-B"} and gone == [], report.files
    else:
        assert runs == {"RUN-B"}
        [finding] = gone
        assert finding.kind == "missing"
        assert finding.problem.startswith(
            "holds 1 snapshot, where the manifest (written "), finding.problem
        assert ("relied on 2: at least 1 snapshot is gone with every trace of its Run (no "
                "record in the log and no file in snap/done/ names it") in finding.problem
        assert ("so its Run is neither restored nor held; copy back only the files missing "
                "from snap/live/ (cp -n from a copy made before the damage") in finding.problem
    assert {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()} == kept


def test_doctor_and_status_do_not_call_runs_lost_with_their_snapshots_rebuilt(
        tmp_path: Path) -> None:
    """doctor's journals check and status said of every ``missing`` snapshot finding that
    the next start "reads those Runs from the log and writes their snapshots again": not of
    snapshots lost with every record of their Runs, which nothing rebuilds."""
    from intloom.cli.render import service_lines
    from intloom.diagnostics.previews import preview_runs
    from intloom.project import ProjectPaths

    state = tmp_path / ".intloom"
    state.mkdir(mode=0o700)
    root = state / "runtime"
    _snapshotted_then_left_behind(root)
    (root / "snap" / "live" / snapshot_name("RUN-A")).unlink()
    first = root / "wal" / "0000000001.seg"
    first.write_bytes(first.read_bytes()[:200])

    check, _ = preview_runs(ProjectPaths(tmp_path), None, host_running=False)
    assert check.next is not None and "snap/live/ lost snapshots whose Runs nothing else " \
        "names" in check.next, check
    assert "writes their snapshots again" not in check.next, check.next
    [finding] = [f for f in verify_report(root).files if f.path == "snap/live"]
    lines = service_lines({"storeProblems": [msgspec.to_builtins(finding)]})
    assert "A missing snapshot was rebuilt from the log and written again." not in lines
    assert ("Snapshots were lost with every record of their Runs, which were not restored; "
            "intloom doctor says how to put them back.") in lines, lines
