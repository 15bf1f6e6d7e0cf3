"""Format-2 segments: preallocated ahead of their writes, cut back at their seal.

A writer overwrites zeros it preallocated (an fdatasync then writes data only), so a segment
its host crashed in ends in zeros nobody wrote; a reader takes them for unused room, never
for damage, and judges a torn write by where its bytes end. A sealed segment has none."""

from __future__ import annotations

import errno
import os
import struct
from pathlib import Path

import pytest

from intloom.runtime.machine import fold
from intloom.store import read_runs, read_runs_report, verify_report
from intloom.store.framing import (
    FRAME_MAGIC,
    KIND_SEAL,
    SEGMENT_FORMAT,
    scan_segment,
    segment_name,
)
from intloom.store.reader import FileProblem
from intloom.store.segmentfile import PREALLOCATE_BYTES, FdIdentity
from tests.helpers import snapshot_files
from tests.unit.test_store_support import (
    by_id,
    crashed_with_run_a,
    frames_end,
    open_store,
    run_child,
    walk,
)


def _crashed(root: Path, records: int = 6) -> Path:
    return crashed_with_run_a(root, records)


def test_a_crashed_hosts_segment_ends_in_unused_zeros_that_are_not_damage(
        tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    segment = _crashed(root)
    data = segment.read_bytes()
    end = frames_end(segment)
    assert len(data) >= end + PREALLOCATE_BYTES // 2, (len(data), end)
    assert data[end:] == bytes(len(data) - end)
    scan = scan_segment(segment.name, 1, data)
    assert scan.header is not None and scan.header.format == SEGMENT_FORMAT == 2
    assert (scan.status, scan.damage, scan.sealed) == ("ok", [], False)
    assert scan.unused == len(data) - end
    before = snapshot_files(root)
    report = read_runs_report(root)
    assert [f for f in report.files if f.path.startswith("wal/")] == []
    [journal] = report.runs
    assert journal.status == "ok" and journal.state == fold(walk("RUN-A", 6, 1))
    assert not journal.torn_tail
    assert snapshot_files(root) == before  # read, never trimmed


def test_a_sealed_segment_ends_at_its_seal(tmp_path: Path) -> None:
    segment = crashed_with_run_a(tmp_path / "runtime", 6, close=True)
    scan = scan_segment(segment.name, 1, segment.read_bytes())
    assert scan.sealed and scan.damage == [] and scan.unused == 0
    assert scan.frames[-1].kind == KIND_SEAL and scan.frames[-1].end == scan.size


def test_a_rotated_segment_is_cut_back_to_its_seal(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    store = open_store(root, segment_bytes=64 << 10)
    records = walk("RUN-A", 1500, 4)
    for chunk in range(0, len(records), 50):
        for record in records[chunk:chunk + 50]:
            store.append("RUN-A", record)
        store.sync_blocking()
    names = sorted(p.name for p in (root / "wal").glob("*.seg"))
    assert len(names) >= 2, names
    first = root / "wal" / names[0]
    scan = scan_segment(first.name, 1, first.read_bytes())
    assert scan.sealed and scan.frames[-1].end == scan.size and scan.unused == 0
    store.close_blocking()
    [journal] = read_runs(root)
    assert journal.status == "ok" and journal.state == fold(records)


@pytest.mark.parametrize("keep", [1, 3, 6, 11, 20, -1])
def test_a_write_cut_short_in_the_zeros_is_a_torn_tail(tmp_path: Path, keep: int) -> None:
    """What a process killed mid-write leaves: a prefix of the batch where the zeros were.
    Its frame's length (once there) ends inside the zeros, not past the file, so "ends past
    the end of the file" alone would have called it damage."""
    root = tmp_path / "runtime"
    segment = _crashed(root, 6)
    end = frames_end(segment)
    frame = scan_segment(segment.name, 1, segment.read_bytes()).frames[-1]
    whole = segment.read_bytes()[frame.offset:frame.end]
    torn = whole[: keep if keep > 0 else len(whole) - 1]
    with open(segment, "r+b") as fh:
        fh.seek(end)
        fh.write(torn)
    report = verify_report(root)
    [finding] = [f for f in report.files if f.path.startswith("wal/")]
    assert finding.kind == "torn", finding
    [journal] = read_runs(root)
    assert journal.status == "ok" and journal.state == fold(walk("RUN-A", 6, 1))


def test_a_torn_prefix_ending_in_zero_bytes_is_still_cut_short(tmp_path: Path) -> None:
    """The marker and a length whose last bytes are zeros: where the written bytes end
    cannot be told from the zeros after them, and either way the frame is cut short."""
    root = tmp_path / "runtime"
    segment = _crashed(root, 6)
    end = frames_end(segment)
    with open(segment, "r+b") as fh:
        fh.seek(end)
        fh.write(FRAME_MAGIC + struct.pack(">I", 0x0100))  # length bytes 00 00 01 00
    scan = scan_segment(segment.name, 1, segment.read_bytes())
    [damage] = scan.damage
    assert damage.cut_short and damage.at_tail and damage.start == end
    assert scan.unused == scan.size - damage.end


def test_a_whole_last_frame_failing_its_checksum_before_the_zeros_is_still_damage(
        tmp_path: Path) -> None:
    """The zeros change nothing for a frame whose every byte is there: written this boot,
    it fails its checksum only if damaged, as in format 1."""
    root = tmp_path / "runtime"
    segment = _crashed(root, 6)
    frame = scan_segment(segment.name, 1, segment.read_bytes()).frames[-1]
    data = bytearray(segment.read_bytes())
    data[frame.offset + 20] ^= 0x5A  # inside the body, not its last bytes
    segment.write_bytes(bytes(data))
    scan = scan_segment(segment.name, 1, bytes(data))
    [damage] = scan.damage
    assert not damage.cut_short and damage.end == frame.end
    report = verify_report(root)
    [finding] = [f for f in report.files if f.path.startswith("wal/")]
    assert finding.kind == "corrupt", finding
    assert by_id(read_runs(root))["RUN-A"].status == "corrupt"


def test_zeros_after_a_seal_are_bytes_after_a_seal(tmp_path: Path) -> None:
    """A writer cuts its zeros off before it seals: any bytes after a seal, zeros too,
    were put there by something else."""
    segment = crashed_with_run_a(tmp_path / "runtime", 4, close=True)
    with open(segment, "ab") as fh:
        fh.write(bytes(4096))
    scan = scan_segment(segment.name, 1, segment.read_bytes())
    [damage] = scan.damage
    assert damage.after_seal and scan.unused == 0


def test_a_format_1_segment_ending_in_zeros_is_damaged_as_before(tmp_path: Path) -> None:
    """No format-1 writer preallocated: zeros at the end of one are no frame, as always."""
    root = tmp_path / "runtime"
    segment = _crashed(root, 6)
    end = frames_end(segment)
    data = bytearray(segment.read_bytes()[: end + 300])
    struct.pack_into(">H", data, 8, 1)  # the fixed format field
    scan = scan_segment(segment.name, 1, bytes(data))
    # The header body still says 2: the two disagree, a damaged header, frames still read.
    assert scan.status == "damaged_header"
    [damage] = scan.damage
    assert (damage.start, damage.end, damage.marked, scan.unused) == (end, end + 300, False, 0)


def test_flushes_never_ask_the_segments_inode_for_its_attributes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An ``fstat`` of the segment between flushes makes the next fdatasync commit the file
    system's journal (~55 us a flush on the bench VM): the per-flush check that the
    descriptor is still ours must not make one, nor may a flush grow the file."""
    root = tmp_path / "runtime"
    store = open_store(root)
    records = walk("RUN-A", 60, 2)
    store.append("RUN-A", records[0])
    store.sync_blocking()
    size = os.path.getsize(root / "wal" / segment_name(1))
    real_fstat = os.fstat
    seen: list[int] = []

    def fstat(fd: int) -> os.stat_result:
        seen.append(fd)
        return real_fstat(fd)

    monkeypatch.setattr(os, "fstat", fstat)
    for record in records[1:]:
        store.append("RUN-A", record)
        store.sync_blocking()
    monkeypatch.setattr(os, "fstat", real_fstat)
    assert store._fd not in seen, seen
    assert os.path.getsize(root / "wal" / segment_name(1)) == size
    store.close_blocking()


def test_a_refused_preallocation_writes_on_as_format_1_did(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(fd: int, start: int, end: int) -> None:
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr("intloom.store.writer.preallocate", refuse)
    root = tmp_path / "runtime"
    store = open_store(root)
    records = walk("RUN-A", 20, 3)
    for record in records:
        store.append("RUN-A", record)
        store.sync_blocking()
    segment = root / "wal" / segment_name(1)
    assert os.path.getsize(segment) == frames_end(segment)
    store.close_blocking()
    scan = scan_segment(segment.name, 1, segment.read_bytes())
    assert scan.sealed and scan.damage == [] and scan.frames[-1].end == scan.size
    [journal] = read_runs(root)
    assert journal.state == fold(records)


@pytest.mark.parametrize("past", [0, 1000])
def test_bytes_another_program_wrote_into_the_zeros_are_told_and_kept_at_the_seal(
        tmp_path: Path, past: int) -> None:
    """Neither cut off with the zeros nor written over by the seal (at the frames' end, where
    the seal would go, it overwrote them while the finding said they were kept)."""
    root = tmp_path / "runtime"
    store = open_store(root)
    told: list[FileProblem] = []
    store.on_kept_file = told.append
    store.append("RUN-A", walk("RUN-A", 1, 1)[0])
    store.sync_blocking()
    segment = root / "wal" / segment_name(1)
    end = frames_end(segment)
    with open(segment, "r+b") as fh:
        fh.seek(end + past)
        fh.write(b"not ours")
    kept = segment.read_bytes()
    store.close_blocking()
    [problem] = told
    assert problem.kind == "corrupt" and f"bytes at offset {end + past}" in problem.problem
    assert segment.read_bytes() == kept  # unsealed: it only lacks its clean-close mark


def test_a_seal_is_written_after_its_zeros_are_cut_off_durably(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One fdatasync for the cut and the seal: ext4 and XFS write the seal's block before
    they commit the smaller size, so a power loss could leave the seal followed by the old
    zeros, read as bytes after a seal (corruption)."""
    root = tmp_path / "runtime"
    store = open_store(root)
    store.append("RUN-A", walk("RUN-A", 1, 1)[0])
    store.sync_blocking()
    calls: list[str] = []
    for name in ("ftruncate", "fdatasync", "pwrite"):
        real = getattr(os, name)

        def traced(*args: object, _real: object = real, _name: str = name) -> object:
            calls.append(_name)
            return _real(*args)  # type: ignore[operator]

        monkeypatch.setattr(os, name, traced)
    store.close_blocking()
    monkeypatch.undo()
    cut = calls.index("ftruncate")
    assert calls[cut:cut + 4] == ["ftruncate", "fdatasync", "pwrite", "fdatasync"], calls


def test_a_damaged_seal_of_a_clean_close_is_damage_not_a_torn_tail(tmp_path: Path) -> None:
    """A close's seal said ``next`` 0 last, so it ended in a zero byte: one flipped byte in
    it read as a frame cut short where the zeros begin (torn, "a crash mid-append")."""
    segment = crashed_with_run_a(tmp_path / "runtime", 4, close=True)
    seal = scan_segment(segment.name, 1, segment.read_bytes()).frames[-1]
    assert seal.kind == KIND_SEAL and segment.read_bytes()[seal.end - 1] != 0
    data = bytearray(segment.read_bytes())
    data[seal.offset + 16] ^= 0x01
    segment.write_bytes(bytes(data))
    [finding] = [f for f in verify_report(tmp_path / "runtime").files
                 if f.path.startswith("wal/")]
    assert finding.kind == "corrupt" and "whole length" in finding.problem, finding


def test_an_fdinfo_entry_naming_no_inode_is_not_trusted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before Linux 5.14 the entry has no ``ino:`` line: a database a Step opened read-write
    on the same mount, under the segment's closed descriptor number, read the same bytes,
    and records went into it."""
    real = os.pread

    def older_kernel(fd: int, n: int, offset: int) -> bytes:
        return b"".join(line for line in real(fd, n, offset).splitlines(keepends=True)
                        if not line.startswith(b"ino:"))

    monkeypatch.setattr(os, "pread", older_kernel)
    fd = os.open(tmp_path / "segment", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    st = os.fstat(fd)
    check = FdIdentity(fd, (st.st_dev, st.st_ino))
    assert check.holds(fd)
    os.close(fd)
    other = os.open(tmp_path / "user.db", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        assert other == fd and not check.holds(fd)
    finally:
        os.close(other)
        check.close()


def test_the_descriptor_check_falls_back_to_fstat_and_fails_closed(tmp_path: Path) -> None:
    path = tmp_path / "a"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    st = os.fstat(fd)
    check = FdIdentity(fd, (st.st_dev, st.st_ino))
    assert check.holds(fd)
    # Its own procfs descriptor closed and taken by another file: the fstat decides.
    os.close(check._info)
    other = os.open(tmp_path / "b", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        assert check.holds(fd)
    finally:
        os.close(other)
    # The checked descriptor closed and its number taken by another file: not ours.
    os.close(fd)
    reused = os.open(tmp_path / "c", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        assert reused == fd
        assert not check.holds(fd)
    finally:
        os.close(reused)
        check.close()


def test_preallocation_stops_short_of_the_file_size_limit(tmp_path: Path) -> None:
    """Under ``ulimit -f`` (inherited by the host), room past the limit is never asked for:
    the writer keeps what its seal needs free below it, as it did without preallocating."""
    root = tmp_path / "runtime"
    proc = run_child(root, """
        import os, resource
        resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, resource.RLIM_INFINITY))
        store = open_store(root)
        for record in walk("RUN-A", 40, 5):
            store.append("RUN-A", record)
            store.sync_blocking()
        print(os.path.getsize(root / "wal" / "0000000001.seg"))
        store.close_blocking()
    """)
    assert proc.returncode == 0, proc.stderr
    # Preallocated up to the limit less a seal's room: not past it (refused EFBIG, it would
    # have grown batch by batch instead), and not short of it.
    assert int(proc.stdout) == 300_000 - 256, proc.stdout
    [journal] = read_runs(root)
    assert journal.state == fold(walk("RUN-A", 40, 5))
