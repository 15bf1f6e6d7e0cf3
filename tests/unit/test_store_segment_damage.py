"""Damage a crash cannot leave is never read as a crash: a segment's file header, a stray
file under a segment's name, and a segment's last frame. Real files, real stores."""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec
import pytest

from intloom.errors import IntloomError
from intloom.runtime.machine import fold
from intloom.store import read_history, read_runs_report, verify_report
from intloom.store.framing import scan_segment, segment_name, segment_number
from intloom.store.snapshots import decode_manifest, encode_manifest
from tests.helpers import snapshot_files
from tests.unit.test_store_support import (
    abandon,
    by_id,
    crashed_with_run_a,
    frames_end,
    frames_of,
    open_store,
    walk,
    write_after_frames,
)

SEG2 = "wal/0000000002.seg"
MAX_SEGMENT = 9_999_999_999  # the highest number a ten-digit name holds


def _booted_ns() -> int:
    return time.time_ns() - time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def _crashed(root: Path) -> None:
    """RUN-A ended up in a snapshot by a clean stop (segment 1); RUN-B's ten records are
    all in segment 2, whose host was killed (what the reviewer's Run 4 was)."""
    store = open_store(root)
    for record in walk("RUN-A", 6, 1):
        store.append("RUN-A", record)
    store.sync_blocking()
    store.close_blocking()
    store = open_store(root, instance_id="INST-2")
    for record in walk("RUN-B", 10, 2):
        store.append("RUN-B", record)
    store.sync_blocking()
    abandon(store)


def _flip(path: Path, offset: int, bit: int) -> bytes:
    data = bytearray(path.read_bytes())
    data[offset] ^= bit
    path.write_bytes(bytes(data))
    return bytes(data)


def _restart(root: Path, instance_id: str) -> None:
    open_store(root, instance_id=instance_id).close_blocking()


@pytest.mark.parametrize(("offset", "fact"), [
    (11, "its header length field reads"),  # points ~1 MiB past the end of the file
    (0, "its segment marker is damaged"),
])
def test_a_damaged_segment_header_holds_its_runs_at_every_start(
    tmp_path: Path, offset: int, fact: str
) -> None:
    root = tmp_path / "runtime"
    _crashed(root)
    damaged = _flip(root / SEG2, offset, 0x10)

    for instance in ("INST-3", "INST-4", "INST-5"):
        report = read_runs_report(root)
        files = {(f.path, f.kind): f.problem for f in report.files}
        assert list(files) == [(SEG2, "corrupt")], files  # damage: not torn, not foreign
        assert fact in files[SEG2, "corrupt"]
        runs = by_id(report.runs)
        assert runs["RUN-B"].status == "corrupt"
        assert f"its records 1..10 are in {SEG2}, which has a damaged file header" in (
            runs["RUN-B"].problem)
        assert runs["RUN-A"].status == "ok"
        full = by_id(verify_report(root).runs)
        assert full["RUN-B"].status == "corrupt" and full["RUN-A"].status == "ok"
        # A start holds it, pins the segment, and the next start reports it again.
        _restart(root, instance)
        assert (root / SEG2).read_bytes() == damaged

    # The records themselves check out: inspect lists them, in order.
    history = read_history(root, "RUN-B")
    assert [(h.seq, h.verdict) for h in history] == [(n, "ok") for n in range(1, 11)]


def test_a_header_cut_short_by_a_crash_is_still_torn(tmp_path: Path) -> None:
    """What a crash while the next host created its segment leaves: the manifest still the
    last close's (a host names its segment only once the header is durable; named, a cut
    header is a lost segment: test_store_lost_segment)."""
    root = tmp_path / "runtime"
    _crashed(root)
    path = root / SEG2
    whole = path.read_bytes()
    header_end = frames_of(path, "RUN-B")[0].offset
    manifest = decode_manifest(root / "manifest.json", (root / "manifest.json").read_bytes())
    (root / "manifest.json").write_bytes(encode_manifest(
        msgspec.structs.replace(manifest, open=0)))
    for keep in (5, 20, header_end - 1):
        path.write_bytes(whole[:keep])
        assert scan_segment(path.name, 2, path.read_bytes()).status == "torn_header", keep
        [finding] = read_runs_report(root).files
        assert (finding.path, finding.kind) == (SEG2, "torn")


def test_an_empty_segment_is_called_empty_not_a_header_it_ends_inside(tmp_path: Path) -> None:
    """A zero-byte segment after the last (a crash right after its creation, or a stray
    file) was "torn: ends inside its file header", yet it has no header. Still torn (what
    such a crash leaves), it is said to be empty, and is kept byte-identical."""
    root = tmp_path / "runtime"
    _crashed(root)
    empty = root / "wal" / segment_name(3)
    empty.write_bytes(b"")
    empty.chmod(0o600)
    before = snapshot_files(root)
    for report in (read_runs_report(root), verify_report(root)):
        [finding] = [f for f in report.files if f.path == "wal/0000000003.seg"]
        assert (finding.kind, finding.problem) == ("torn", (
            "has 0 bytes (an empty file, no header): what a crash right after the segment "
            "was created leaves, or a full disk that refused its header; it holds no "
            "record")), finding
    assert snapshot_files(root) == before and empty.exists()


def test_a_stray_file_with_the_highest_segment_name_is_refused_not_numbered_past(
    tmp_path: Path,
) -> None:
    root = tmp_path / "runtime"
    _crashed(root)
    stray = root / "wal" / segment_name(MAX_SEGMENT)
    stray.write_bytes(b"junk\n")
    stray.chmod(0o600)
    before = snapshot_files(root)

    assert ("wal/9999999999.seg", "foreign") in {(f.path, f.kind)
                                                 for f in read_runs_report(root).files}
    with pytest.raises(IntloomError) as refused:
        open_store(root, instance_id="INST-3")
    assert refused.value.code == "STORAGE_ERROR"
    message = refused.value.message
    assert str(stray) in message and "highest segment number" in message
    assert "move it out" in message
    assert snapshot_files(root) == before  # refused before writing anything
    # What status and doctor say a start would run into (startProblem): they said nothing,
    # and previewed the Runs as restoring.
    from intloom.store.reader import refused_file

    said = refused_file(root)
    assert said is not None and said.message == message, said

    stray.unlink()  # what the message says to do (here the file was junk)
    store = open_store(root, instance_id="INST-3")
    assert store._number == 3
    store.close_blocking()


def test_segment_names_and_numbers_agree() -> None:
    assert segment_name(MAX_SEGMENT) == "9999999999.seg"
    with pytest.raises(ValueError):
        segment_name(MAX_SEGMENT + 1)
    assert segment_number("9999999999.seg") == MAX_SEGMENT
    assert segment_number("10000000000.seg") is None
    # Non-ASCII digits used to be taken for a number (and some made int() raise).
    assert segment_number("\u0660" * 10 + ".seg") is None
    assert segment_number("\u00b2" + "0" * 9 + ".seg") is None


def _flip_last_frame(root: Path) -> tuple[int, bytes]:
    last = frames_of(root / SEG2, "RUN-B")[-1]
    # Its length ends exactly where the frames do (the zeros after them are unused room).
    assert last.end == frames_end(root / SEG2)
    return last.offset, _flip(root / SEG2, last.end - 4, 0x01)


def test_a_complete_last_frame_failing_its_checksum_this_boot_is_damage(
    tmp_path: Path,
) -> None:
    root = tmp_path / "runtime"
    _crashed(root)
    offset, damaged = _flip_last_frame(root)
    assert (root / SEG2).stat().st_mtime_ns > _booted_ns() + 2 * 10**9  # written this boot

    report = read_runs_report(root)
    [finding] = report.files
    assert (finding.path, finding.kind) == (SEG2, "corrupt")
    assert "incomplete" not in finding.problem and "whole length" in finding.problem
    runs = by_id(report.runs)
    assert runs["RUN-B"].status == "corrupt" and not runs["RUN-B"].torn_tail
    assert f"record 10 at {SEG2} offset {offset} fails its checksum" in runs["RUN-B"].problem
    assert runs["RUN-A"].status == "ok"
    assert [h.verdict for h in read_history(root, "RUN-B")][-1] == "damaged"
    assert by_id(verify_report(root).runs)["RUN-B"].status == "corrupt"
    for instance in ("INST-3", "INST-4"):
        _restart(root, instance)
        assert by_id(read_runs_report(root).runs)["RUN-B"].status == "corrupt"
    assert (root / SEG2).read_bytes() == damaged


def test_a_complete_last_frame_failing_its_checksum_from_before_boot_is_named_honestly(
    tmp_path: Path,
) -> None:
    """Written before the OS last started, a crash of the OS may have left the frame's pages
    unwritten: it is read as torn, but never called an incomplete frame."""
    root = tmp_path / "runtime"
    _crashed(root)
    offset, _damaged = _flip_last_frame(root)
    before_boot = _booted_ns() - 3600 * 10**9
    os.utime(root / SEG2, ns=(before_boot, before_boot))

    report = read_runs_report(root)
    [finding] = report.files
    assert (finding.path, finding.kind) == (SEG2, "torn")
    assert "incomplete" not in finding.problem
    assert f"complete-length last frame at offset {offset}" in finding.problem
    assert "a crash mid-write or damage" in finding.problem
    runs = by_id(report.runs)
    assert runs["RUN-B"].status == "ok" and runs["RUN-B"].torn_tail
    assert runs["RUN-B"].state == fold(walk("RUN-B", 10, 2)[:9])
    assert [h.verdict for h in read_history(root, "RUN-B")][-1] == "torn"


@pytest.mark.parametrize("size", [200, (1 << 20) + 1])  # past what a Damage keeps of them
def test_appended_bytes_that_are_no_frame_are_not_called_one(tmp_path: Path, size: int) -> None:
    """200 bytes after a segment's last frame were reported as "its last frame has its
    whole length but fails its checksum": there is no frame marker there at all. (Zeros
    there are now the room a format-2 writer preallocates: these are not zeros.)"""
    root = tmp_path / "runtime"
    _crashed(root)
    seg = root / SEG2
    end = write_after_frames(seg, b"\x01" * size)
    [finding] = read_runs_report(root).files
    assert finding.kind == "corrupt", finding
    assert finding.problem == (
        f"bytes {end}..{end + size} are damaged (its last bytes do not begin with a frame's "
        "marker, and the segment was last written after the OS last started, so no crash can "
        "have torn it)"), finding
    before_boot = _booted_ns() - 3600 * 10**9  # what an OS crash may leave: torn
    os.utime(seg, ns=(before_boot, before_boot))
    [finding] = read_runs_report(root).files
    assert finding.kind == "torn" and finding.problem.startswith(
        f"ends with {size} bytes at offset {end} that do not begin with a frame's marker: a "
        "crash mid-write or damage."), finding


def test_a_last_frame_written_in_the_future_is_not_judged_by_its_time(
    tmp_path: Path,
) -> None:
    """An mtime ahead of the clock (it was ahead before a crash, and corrected since) says
    nothing about the boot: the frame is read as torn, as from before the boot."""
    root = tmp_path / "runtime"
    _crashed(root)
    _flip_last_frame(root)
    ahead = time.time_ns() + 3600 * 10**9
    os.utime(root / SEG2, ns=(ahead, ahead))
    [finding] = read_runs_report(root).files
    assert finding.kind == "torn", finding
    assert by_id(read_runs_report(root).runs)["RUN-B"].torn_tail


def test_a_last_frame_cut_short_is_torn_whenever_it_was_written(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    _crashed(root)
    last = frames_of(root / SEG2, "RUN-B")[-1]
    path = root / SEG2
    path.write_bytes(path.read_bytes()[: last.end - 3])
    [finding] = read_runs_report(root).files
    assert finding.kind == "torn" and "incomplete frame" in finding.problem
    assert by_id(read_runs_report(root).runs)["RUN-B"].torn_tail


def test_records_after_a_seal_hold_their_run_and_are_never_read_as_its_records(
    tmp_path: Path,
) -> None:
    """A writer seals a segment last and never writes to it again, so a frame after the
    seal is corruption however its crc reads (docs/format.md). Valid record frames put
    there were read as the Run's next records: RUN-A came back two records further than its
    host wrote, by every read, and nothing was reported."""
    from intloom.runtime.records import encode_record
    from intloom.store.framing import KIND_RECORD, KIND_SEAL, SealNotice, encode_frame

    root = tmp_path / "runtime"
    records = walk("RUN-A", 8, 1)
    store = open_store(root)
    for record in records[:6]:
        store.append("RUN-A", record)
    for record in walk("RUN-B", 4, 2):
        store.append("RUN-B", record)
    store.sync_blocking()
    abandon(store)  # unsealed: a restore reads it
    seg = root / "wal" / segment_name(1)
    seal = encode_frame(KIND_SEAL, 0, b"", msgspec.msgpack.encode(SealNotice(at="t", frames=10)))
    late = b"".join(encode_frame(KIND_RECORD, seq, b"RUN-A", encode_record(record))
                    for seq, record in enumerate(records[6:], start=7))
    sealed_end = write_after_frames(seg, seal + late, end=True) + len(seal)
    kept = snapshot_files(root)

    for report in (read_runs_report(root), verify_report(root)):
        runs = by_id(report.runs)
        assert runs["RUN-B"].status == "ok" and runs["RUN-B"].state.seq == 4
        a = runs["RUN-A"]
        assert a.status == "corrupt" and a.state.seq == 6 and a.reached == 8, a
        assert f"offset {sealed_end} seq 7 follows that segment's seal" in (a.problem or ""), a
        (finding,) = [f for f in report.files if f.kind == "corrupt"]
        assert finding.path == "wal/0000000001.seg"
        assert "2 valid frame(s) follow its seal" in finding.problem, finding
    assert [e.verdict for e in read_history(root, "RUN-A")][6:] == ["damaged", "damaged"]
    _restart(root, "INST-2")  # a start holds RUN-A, keeps the segment as it is
    assert by_id(read_runs_report(root).runs)["RUN-A"].status == "corrupt"
    assert snapshot_files(root)["wal/0000000001.seg"] == kept["wal/0000000001.seg"]


def test_a_seal_that_names_a_run_is_reported(tmp_path: Path) -> None:
    """A seal's crc checks out but it names a Run and a seq, which no writer's seal does:
    it was taken as a clean seal without a word."""
    from intloom.store.framing import KIND_SEAL, SealNotice, encode_frame

    root = tmp_path / "runtime"
    seg = crashed_with_run_a(root, 4)
    payload = msgspec.msgpack.encode(SealNotice(at="t", frames=4))
    offset = write_after_frames(seg, encode_frame(KIND_SEAL, 5, b"RUN-A", payload), end=True)

    report = verify_report(root)
    (finding,) = [f for f in report.files if f.kind == "corrupt"]
    assert finding.problem == (f"its seal at offset {offset} names Run 'RUN-A' and seq 5 "
                               "(a seal names neither)"), finding


def _reheader(path: Path, **changes: object) -> None:
    """Rewrite a segment's header body with ``changes``, its crc and length made to match
    (the fixed format field left as it is): a header that checks out."""
    import struct
    import zlib

    from intloom.store.framing import SegmentHeader

    data = path.read_bytes()
    magic, fmt, length, _ = struct.unpack_from(">8sHII", data)
    header = msgspec.msgpack.decode(data[18:18 + length], type=SegmentHeader)
    body = msgspec.msgpack.encode(msgspec.structs.replace(header, **changes))
    path.write_bytes(struct.pack(">8sHII", magic, fmt, len(body), zlib.crc32(body)) + body
                     + data[18 + length:])


def test_a_header_whose_body_says_another_format_than_its_fixed_field_is_damaged(
    tmp_path: Path,
) -> None:
    """The header body's ``format`` is checksummed, the fixed field is not, and a writer
    makes them equal. A body saying format 2 behind a fixed field of 1 was read as format 1
    without a word, its Runs resumed. (A writer's fixed field is 2 now: the body says 1.)"""
    root = tmp_path / "runtime"
    seg = crashed_with_run_a(root, 5)
    _reheader(seg, format=1)
    kept = seg.read_bytes()

    for report in (read_runs_report(root), verify_report(root)):
        (finding,) = [f for f in report.files if f.kind == "corrupt"]
        assert finding.problem == ("has a damaged file header (its body says format 1, its "
                                   "fixed format field 2)"), finding
        a = by_id(report.runs)["RUN-A"]
        assert a.status == "corrupt" and "never resumed from" in (a.problem or ""), a
    _restart(root, "INST-2")
    assert by_id(read_runs_report(root).runs)["RUN-A"].status == "corrupt"
    assert seg.read_bytes() == kept


def test_a_newer_format_segment_names_the_version_found_read_and_the_fix(
    tmp_path: Path,
) -> None:
    """A segment a newer intloom wrote (fixed field and body both format 3) is refused with
    the versions and what to do; it said only "format 2; this intloom reads 1"."""
    import struct

    root = tmp_path / "runtime"
    seg = crashed_with_run_a(root, 3)
    _reheader(seg, format=3)
    data = bytearray(seg.read_bytes())
    struct.pack_into(">H", data, 8, 3)
    seg.write_bytes(bytes(data))

    report = read_runs_report(root)
    fact = ("is format 3; this intloom reads 1 and 2 (a newer intloom wrote it: run an "
            "intloom that reads format 3 to resume or end its Runs; the file is kept as it is)")
    assert [(f.path, f.kind, f.problem) for f in report.files] == [
        ("wal/0000000001.seg", "incompatible", fact)]
    a = by_id(report.runs)["RUN-A"]
    assert a.status == "incompatible", a
    assert a.problem == f"its records in wal/0000000001.seg, which {fact}"
    assert seg.read_bytes() == bytes(data)


def test_a_void_notice_after_a_seal_voids_nothing(tmp_path: Path) -> None:
    """A writer puts a void notice first in a fresh segment, never after a seal: one there
    is corruption, like a record there, and is not read. It was read as a notice all the
    same: it voided RUN-A's last four records, and every read took RUN-A back to record 4,
    to run again what its host had recorded as done."""
    from intloom.store.framing import (
        KIND_SEAL,
        KIND_VOID,
        SealNotice,
        VoidNotice,
        encode_frame,
    )

    root = tmp_path / "runtime"
    seg = crashed_with_run_a(root, 8)  # unsealed: a restore reads it
    data = seg.read_bytes()
    fifth = next(f.offset for f in scan_segment(seg.name, 1, data).frames if f.seq == 5)
    seal = encode_frame(KIND_SEAL, 0, b"", msgspec.msgpack.encode(SealNotice(at="t", frames=8)))
    void = encode_frame(KIND_VOID, 0, b"", msgspec.msgpack.encode(
        VoidNotice(segment=1, offset=fifth, cause="a write failed")))
    write_after_frames(seg, seal + void, end=True)

    for report in (read_runs_report(root), verify_report(root)):
        a = by_id(report.runs)["RUN-A"]
        assert a.status == "ok" and a.state.seq == 8, a
        (finding,) = [f for f in report.files if f.kind == "corrupt"]
        assert "1 valid frame(s) follow its seal" in finding.problem, finding
    assert [e.verdict for e in read_history(root, "RUN-A")] == ["ok"] * 8


@pytest.mark.parametrize("voided", ["its own", "a later"])
def test_a_void_notice_no_writer_writes_is_reported_and_holds_the_runs_it_names(
    tmp_path: Path, voided: str,
) -> None:
    """A writer's void notice is the first frame of the fresh segment that replaces a failed
    one, and voids that earlier segment's bytes. One appended to a segment, voiding that
    segment's own records (or a later one's), was obeyed: RUN-A vanished, and doctor, start,
    runs and verify all said everything checked out. It is reported, not obeyed, and the
    Run whose records it names is corrupt (held), its file kept as it is."""
    from intloom.store.framing import KIND_VOID, VoidNotice, encode_frame

    root = tmp_path / "runtime"
    seg = crashed_with_run_a(root, 8)
    data = seg.read_bytes()
    fifth = next(f.offset for f in scan_segment(seg.name, 1, data).frames if f.seq == 5)
    target = 1 if voided == "its own" else 2
    void = encode_frame(KIND_VOID, 0, b"", msgspec.msgpack.encode(
        VoidNotice(segment=target, offset=fifth, cause="forged")))
    at = write_after_frames(seg, void)
    kept = seg.read_bytes()

    fact = (f"its void notice at offset {at} voids wal/{segment_name(target)} from "
            f"offset {fifth}, which a writer never writes")
    for report in (read_runs_report(root), verify_report(root)):
        (finding,) = [f for f in report.files if f.kind == "corrupt"]
        assert finding.path == "wal/0000000001.seg" and finding.problem.startswith(fact), \
            finding
        a = by_id(report.runs)["RUN-A"]
        if voided == "its own":
            assert a.status == "corrupt", a
            assert (f"its record at wal/0000000001.seg offset {fifth} seq 5 is in bytes that "
                    f"the void notice at wal/0000000001.seg offset {at} voids") in (
                        a.problem or ""), a
        else:  # nothing of RUN-A's is in the bytes it names: read as written
            assert a.status == "ok" and a.state.seq == 8, a
    assert [e.verdict for e in read_history(root, "RUN-A")] == ["ok"] * 8
    _restart(root, "INST-2")
    a = by_id(read_runs_report(root).runs)["RUN-A"]
    assert a.status == ("corrupt" if voided == "its own" else "ok"), a
    assert seg.read_bytes() == kept


def test_a_snapshot_an_older_intloom_wrote_without_the_unknown_outcome_flag_agrees(
    tmp_path: Path,
) -> None:
    """``last_effect_unknown`` (2026-12-04) is folded from an ``effect_done`` whose outcome is
    unknown; a snapshot an older intloom wrote of the same records has no such key, so it
    reads False. verify, folding the log from its start, called that snapshot one that
    "disagrees with the log" and the Run corrupt after an upgrade. Any other difference is
    still one."""
    from intloom.store.snapshots import encode_snapshot, read_snapshot

    root = tmp_path / "runtime"
    path = _unknown_outcome_run(root)
    snap = read_snapshot(path)
    assert snap is not None and snap.state is not None and snap.state.last_effect_unknown

    def rewrite(fold: int = 0, **changes: object) -> None:
        assert snap is not None and snap.state is not None
        older = msgspec.structs.replace(
            snap, fold=fold, state=msgspec.structs.replace(snap.state, **changes))
        path.chmod(0o600)
        path.write_bytes(encode_snapshot(older))
        path.chmod(0o400)

    rewrite(last_effect_unknown=False)  # as an older intloom wrote it (its fold unsaid: 0)
    assert by_id(verify_report(root).runs)["RUN-1"].status == "ok"
    rewrite(last_effect_unknown=False, intent="other")
    run = by_id(verify_report(root).runs)["RUN-1"]
    assert run.status == "corrupt" and "disagrees with the log" in (run.problem or ""), run
    # A snapshot of this fold that lacks it is no older writer's: it disagrees.
    rewrite(fold=1, last_effect_unknown=False)
    run = by_id(verify_report(root).runs)["RUN-1"]
    assert run.status == "corrupt" and "disagrees with the log" in (run.problem or ""), run


def test_a_void_notice_after_other_runs_frames_is_not_obeyed_by_inspect_either(
    tmp_path: Path,
) -> None:
    """A notice appended to segment 2, after RUN-B's records, voiding RUN-A's records in
    segment 1: the reader refused it, but inspect's read kept only RUN-A's frames and the
    notices, so that notice was the first frame it kept, and RUN-A's records 5 and 6 were
    shown void. A writer's notice is judged by its place: where the frames begin."""
    from intloom.store.framing import KIND_VOID, VoidNotice, encode_frame

    root = tmp_path / "runtime"
    _crashed(root)
    seg1 = root / "wal" / segment_name(1)
    fifth = next(f.offset for f in scan_segment(seg1.name, 1, seg1.read_bytes()).frames
                 if f.seq == 5)
    seg2 = root / SEG2
    write_after_frames(seg2, encode_frame(KIND_VOID, 0, b"", msgspec.msgpack.encode(
        VoidNotice(segment=1, offset=fifth, cause="forged"))))
    (root / "manifest.json").unlink()  # every segment read: segment 1's records too

    a = by_id(verify_report(root).runs)["RUN-A"]
    assert a.status == "corrupt" and "a notice no writer writes there" in (a.problem or ""), a
    assert [e.verdict for e in read_history(root, "RUN-A")] == ["ok"] * 6


def test_an_older_folds_snapshot_whose_run_cannot_be_folded_again_is_held(
    tmp_path: Path,
) -> None:
    """A snapshot an older intloom wrote says the defaults for what its fold did not derive;
    a start folds that Run again from its first record. With record 1 damaged it went on
    from the snapshot instead, trusting those defaults, and the snapshot it then wrote was
    stamped this fold's, so no later start looked again. The Run is held, naming why."""
    from intloom.store.snapshots import encode_snapshot, read_snapshot
    from tests.unit.test_store_support import flip, frames_of

    root = tmp_path / "runtime"
    path = _unknown_outcome_run(root, one_flush_each=True)
    snap = read_snapshot(path)
    assert snap is not None and snap.state is not None and snap.fold == 1
    older = msgspec.structs.replace(snap, fold=0, state=msgspec.structs.replace(
        snap.state, last_effect_unknown=False))
    path.chmod(0o600)
    path.write_bytes(encode_snapshot(older))
    path.chmod(0o400)
    segment = next(seg for seg in sorted((root / "wal").glob("*.seg"))
                   if frames_of(seg, "RUN-1"))
    first = frames_of(segment, "RUN-1")[0]
    flip(segment, first.end - 2)  # record 1's payload
    [run] = [j for j in read_runs_report(root).runs if j.run_id == "RUN-1"]
    assert run.status == "incompatible", run
    assert ("was written by an older intloom (fold 0; this intloom's is 1), which did not "
            "record all that a restart decides by, and the log cannot fold it again: its "
            "records 1..1 are missing or damaged there") in (run.problem or ""), run
    # Readable from its first record, it is folded again instead (and restores).
    flip(segment, first.end - 2)
    [run] = [j for j in read_runs_report(root).runs if j.run_id == "RUN-1"]
    assert run.status == "ok" and run.state is not None and run.state.last_effect_unknown, run


def _unknown_outcome_run(root: Path, *, one_flush_each: bool = False) -> Path:
    """A Run whose last record is an ``effect_done`` of unknown outcome (folded to
    ``last_effect_unknown``), written and closed; the path of its ``live/`` snapshot."""
    from intloom.runtime.records import (
        OUTCOME_UNKNOWN,
        EffectDone,
        EffectStarted,
        Executing,
        StagePending,
        StepReady,
    )
    from intloom.store.snapshots import snapshot_name
    from tests.unit.test_store_support import header

    store = open_store(root)
    for record in (header("RUN-1"), StagePending(at="t", stage="a"),
                   StepReady(at="t", stage="a", step="s1"), Executing(at="t", stage="a", step="s1"),
                   EffectStarted(at="t1", name="slow", key="slow#1"),
                   EffectDone(at="t2", name="slow", key="slow#1", ok=False,
                              error=f"CancelledError: a timeout; {OUTCOME_UNKNOWN}")):
        store.append("RUN-1", record)
        if one_flush_each:
            store.sync_blocking()
    store.sync_blocking()
    store.close_blocking()
    return root / "snap" / "live" / snapshot_name("RUN-1")
