"""One Run's journal, phase by phase, with where each record lives and whether it checks out.

This is what ``intloom inspect`` shows. It reads every segment (compacted ones too), or those
it is given (``segments``: the ones a verify of the Run read), so its time grows with the
log; its memory does not (one segment at a time, plus this Run's records). It is for one
Run on demand, never for startup. Read-only.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from datetime import datetime
from pathlib import Path
from typing import Final, Literal

import msgspec

from intloom.runtime.machine import IllegalTransition, RunState, apply
from intloom.runtime.records import Record, encode_record
from intloom.store.depth import decode_record
from intloom.store.files import Layout, check_dir, list_names, read_file, storage_error
from intloom.store.framing import (
    KIND_RECORD,
    KIND_VOID,
    Frame,
    SegmentScan,
    VoidNotice,
    rebuilt_payload,
    scan_segment,
    segment_header_end,
    segment_name,
    segment_number,
)
from intloom.store.reader import (
    VOID_FRAME,
    Changed,
    Payloads,
    read_head,
    unread_segment,
    void_cuts,
    went_on,
    written_this_boot,
)
from intloom.store.snapshots import (
    Manifest,
    Snapshot,
    SnapshotError,
    read_manifest,
    read_snapshot,
    snapshot_name,
)

__all__ = ["BULK", "History", "HistoryEntry", "first_segment", "histories", "read_histories",
           "read_history", "read_summary", "scanned_history"]

Verdict = Literal[
    "ok",  # checksum valid, decodes, and follows the previous record
    "void",  # written by a batch whose write or fsync failed: never part of the journal
    "torn",  # damaged bytes at the end of a segment: a crash mid-append (format.md)
    "damaged",  # damaged bytes with valid frames after them, or a frame after a seal: corruption
    "undecodable",  # checksum valid but not a record this intloom understands
    "out_of_order",  # a seq that is not the next one (a gap or a repeat)
    "illegal",  # a record the state machine refuses after the previous one
    "snapshot",  # records summarised by a snapshot whose log segments are gone
]


class HistoryEntry(msgspec.Struct, frozen=True, omit_defaults=True):
    """One record of a Run's journal as found on disk."""

    seq: int
    file: str  # relative to the runtime directory
    offset: int
    checksum: Literal["ok", "bad", "none"]
    verdict: Verdict
    phase: str | None = None
    at: str | None = None
    record: Record | None = None
    problem: str | None = None


def _phase(record: Record) -> str:
    return str(type(record).__struct_config__.tag)


def _unrelated(data: bytes, run_id: bytes) -> bool:
    """True when no valid frame in ``data`` is a record of ``run_id`` or a void notice: every
    valid record frame holds its Run's id verbatim, every void frame matches VOID_FRAME."""
    return run_id not in data and VOID_FRAME.search(data) is None


def read_history(runtime_dir: Path, run_id: str, *, damage_elsewhere: bool = True,
                 segments: Collection[int] | None = None,
                 without: tuple[str, ...] = ()) -> list[HistoryEntry]:
    """Every record of ``run_id`` in log order, judged one by one. Read-only.

    ``damage_elsewhere=False`` skips (does not scan) the segments whose bytes hold neither
    the Run's id nor a void notice: ~20x faster on a long log of other Runs, at the price
    of not listing a damaged record of this Run whose id bytes were hit, in such a segment.
    A reader that stops at the first record that is not ``ok`` loses nothing by it: the gap
    that record leaves ends the list at the same place (``Store.history``). ``inspect``
    reads what the verify of that Run read (``segments``: ``verify_run``'s).
    """
    return read_histories(runtime_dir, [run_id], damage_elsewhere=damage_elsewhere,
                          segments=segments, without=without)[run_id]


# The size of a record's payload from which ``read_histories(without=...)`` reads it lean.
_LEAN_FROM: Final = 1024
# A record's bulk: a Stage State, a Step's output, an effect's result.
BULK: Final = ("state", "output", "result")


def _lean(payload: bytes, without: tuple[str, ...]) -> bytes:
    """``payload`` encoded again without the fields ``without`` names (those of its record
    set to None): what a reader that never shows them need not hold. Held with them, a
    Run's records took the size of its journal in memory (twice at the peak: 1.2 GB at the
    first ``attach`` to a restored Run with 575 MB of them). One that does not decode is
    kept as it is (its verdict says why)."""
    try:
        record = decode_record(payload)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return payload
    dropped = {name: None for name in without
               if getattr(record, name, None) is not None}
    if not dropped:
        return payload
    return encode_record(msgspec.structs.replace(record, **dropped))


def read_histories(runtime_dir: Path, run_ids: Collection[str], *,
                   damage_elsewhere: bool = True, segments: Collection[int] | None = None,
                   since: int = 0, without: tuple[str, ...] = ()
                   ) -> dict[str, list[HistoryEntry]]:
    """``read_history`` of each of ``run_ids``, from one read of the log: the Runs of a
    busy log share its segments, and reading it once per Run multiplied the wait of the
    last one asked (many followers of restored Runs at once) by their number. A segment
    skipped only when it holds none of their ids (``damage_elsewhere=False``), or when it is
    not among ``segments`` (given: only those are read), or numbered below ``since``.
    ``without``: fields of the records read as None (``BULK``: their Stage States, Step
    outputs and effect results), so that memory holds one segment at a time and these
    Runs' records without them (``_lean``)."""
    layout, scans, voids = _read(runtime_dir, run_ids, damage_elsewhere, segments, since,
                                 without)
    return {run_id: list(_judged(layout, scans, voids, run_id, _held)) for run_id in run_ids}


def histories(runtime_dir: Path, run_id: str, *, segments: Collection[int] | None = None
              ) -> History:
    """``read_history``, each iteration judging the records again from the segments read
    once: memory holds the Run's records as they are in the log, not its entries."""
    return History(*_read(runtime_dir, [run_id], True, segments, 0, ()), run_id, placed=False)


def _read(runtime_dir: Path, run_ids: Collection[str], damage_elsewhere: bool,
          segments: Collection[int] | None, since: int, without: tuple[str, ...]
          ) -> tuple[Layout, list[SegmentScan], dict[int, int]]:
    """What ``read_histories`` judges from: the segments it reads, scanned and kept only
    for these Runs, and the void cuts."""
    layout = Layout(runtime_dir)
    if not check_dir(runtime_dir) or not check_dir(layout.wal):
        return layout, [], {}
    manifest, notices = _manifest(layout)
    scans = []
    ids = frozenset(run_ids)
    wanted = [run_id.encode() for run_id in ids]
    names = list_names(layout.wal)
    numbers = sorted(n for n in map(segment_number, names) if n is not None)
    for name in names:
        number = segment_number(name)
        if number is None or unread_segment(layout, manifest, number) is not None:
            continue  # no start reads it; verify's finding names it
        if (segments is not None and number not in segments) or number < since:
            continue
        data = read_file(layout.wal / name)
        if data is not None and (damage_elsewhere
                                 or not all(_unrelated(data, w) for w in wanted)):
            scan = scan_segment(name, number, data)
            scan.written_this_boot = written_this_boot(layout.wal / name)
            scan.went_on = went_on(layout, scan, numbers)
            # Keep only what these Runs' histories need (their records and the void
            # notices), so memory holds one segment at a time, not the whole log.
            scan.frames = [f for f in scan.frames if f.kind == KIND_VOID
                           or (f.kind == KIND_RECORD and f.run_id in ids)]
            if without:
                scan.frames = [
                    msgspec.structs.replace(f, payload=_lean(f.payload, without))
                    if f.kind == KIND_RECORD and len(f.payload) >= _LEAN_FROM else f
                    for f in scan.frames]
            scans.append(scan)
            del data, scan
    scans.sort(key=lambda s: s.number)
    return layout, scans, void_cuts(notices, scans)


def _manifest(layout: Layout) -> tuple[Manifest | None, list[VoidNotice]]:
    """The manifest as a history reads it (None when it does not read), and its void
    notices."""
    try:
        manifest = read_manifest(layout)
    except SnapshotError:
        return None, []  # a damaged manifest only loses void notices the segments repeat
    return manifest, list(manifest.voids) if manifest else []


class History:
    """One Run's ``read_history``, judged from segments scanned already, again at each
    iteration: its entries are made one at a time, never all held (a 360,000-record Run's
    took ~1 KB each, 380 MB, on top of the segments' bytes). ``placed``: the scans keep
    where some of the Run's records are, not their bytes, read again as each is judged."""

    def __init__(self, layout: Layout, scans: list[SegmentScan], voids: dict[int, int],
                 run_id: str, *, placed: bool) -> None:
        self._layout = layout
        self._scans = scans
        self._voids = voids
        self._run_id = run_id
        self._placed = placed

    def __iter__(self) -> Iterator[HistoryEntry]:
        payloads = Payloads(self._layout) if self._placed else None
        try:
            yield from _judged(self._layout, self._scans, self._voids, self._run_id,
                               _held if payloads is None else payloads)
        except Changed as exc:
            # A host appends to a segment and cuts off only a batch whose write failed:
            # such a cut, or another process, changed this one while it was read, and
            # what was judged of it may no longer be there.
            raise storage_error(
                exc.path, "changed while it was read: a record read from it again is not "
                "the one read there before (a host appends to a segment, and cuts off only a "
                "batch whose write failed)",
                "run the command again, and intloom verify to see what is there now") from None
        finally:
            if payloads is not None:
                payloads.close()


def _held(scan: SegmentScan, frame: Frame) -> bytes:
    """A record's payload, held since its segment was read."""
    return frame.payload


def scanned_history(runtime_dir: Path, run_id: str, scans: list[SegmentScan]) -> History:
    """``read_history(segments=...)`` of ``run_id`` from ``scans``, those segments as a read
    of them scanned (``reader.verify_run_scans``: the verify of the Run that picked them),
    without reading them again. It takes of them what ``read_histories`` would read: none
    where the runtime directory or ``wal/`` is not a directory of ours, none that no start
    reads (``unread_segment``), and the manifest's void notices."""
    layout = Layout(runtime_dir)
    if not check_dir(runtime_dir) or not check_dir(layout.wal):
        return History(layout, [], {}, run_id, placed=False)
    manifest, notices = _manifest(layout)
    taken = sorted((scan for scan in scans
                    if unread_segment(layout, manifest, scan.number) is None),
                   key=lambda scan: scan.number)
    return History(layout, taken, void_cuts(notices, taken), run_id, placed=True)


def first_segment(runtime_dir: Path, created_at: str) -> int:
    """The last segment created at or before ``created_at`` (a Run's header's ``at``): the
    segment a writer had open then, below which it wrote none of that Run's records, if its
    writers' clocks went forward. 0 (read them all) when that cannot be told: a segment's
    header that does not check out, a time that does not parse, no segment that old.

    A guess from clocks, so a caller checks what it read from there (``Store.history``:
    the Run's first record) and reads the whole log when it is not there. Found by
    bisection over the segments' headers (their first bytes), never by reading them."""
    try:
        created = datetime.fromisoformat(created_at)
    except ValueError:
        return 0
    if created.tzinfo is None:
        return 0
    layout = Layout(runtime_dir)
    numbers = sorted(n for n in map(segment_number, list_names(layout.wal)) if n is not None)
    found, lo, hi = 0, 0, len(numbers)
    while lo < hi:
        mid = (lo + hi) // 2
        at = _created(layout, numbers[mid])
        if at is None:
            return 0
        if at <= created:
            found, lo = numbers[mid], mid + 1
        else:
            hi = mid
    return found


def _created(layout: Layout, number: int) -> datetime | None:
    """When segment ``number``'s header says it was created; None when that cannot be read."""
    head = read_head(layout.wal / segment_name(number))
    found = None if head is None else segment_header_end(head[0])
    if found is None:
        return None
    try:
        at = datetime.fromisoformat(found[0].created_at)
    except ValueError:
        return None
    return at if at.tzinfo is not None else None


def _judged(layout: Layout, scans: list[SegmentScan], voids: dict[int, int], run_id: str,
            payload: Callable[[SegmentScan, Frame], bytes]) -> Iterator[HistoryEntry]:
    """``run_id``'s records in ``scans``, judged one by one (``read_history``), each given
    as it is judged; ``payload`` gives a record's bytes."""
    any_entry = False  # one given already
    state: RunState | None = None
    expected = 1
    for scan in scans:
        file = f"wal/{scan.name}"
        cut = voids.get(scan.number)
        found: list[tuple[int, HistoryEntry | None, Frame | None, int]] = []
        for frame in scan.frames:
            if frame.kind != KIND_RECORD or frame.run_id != run_id:
                continue
            if scan.status == "incompatible":
                # Another format's frames: this intloom's record decoder says nothing about
                # them, even when it happens to accept their bytes.
                found.append((frame.offset, HistoryEntry(
                    seq=frame.seq, file=file, offset=frame.offset, checksum="ok",
                    verdict="undecodable", problem=f"{file} {scan.problem}"), None, frame.seq))
                continue
            if scan.sealed_end and frame.offset >= scan.sealed_end:
                # Its crc checks out, but a writer never appends after sealing: not part of
                # the journal as written (reader._after_seal).
                found.append((frame.offset, HistoryEntry(
                    seq=frame.seq, file=file, offset=frame.offset, checksum="ok",
                    verdict="damaged", problem=f"follows the segment's seal (which ends at "
                    f"offset {scan.sealed_end}): a writer never appends after sealing"),
                    None, frame.seq))
                continue
            found.append((frame.offset, None, frame, frame.seq))
        for damage in scan.damage:
            tail = scan.is_torn(damage)
            claims = [(c.offset, c.seq) for c in damage.candidates if c.run_id == run_id]
            if not claims and damage.raw:
                # Its run id may be what was damaged: the frame's crc says whose it is.
                before = [f.seq for f in scan.frames if f.kind == KIND_RECORD
                          and f.run_id == run_id and f.offset < damage.start]
                guess = max(before) + 1 if before else expected
                if rebuilt_payload(damage.raw, guess, run_id) is not None:
                    claims = [(damage.start, guess)]
            for offset, seq in claims:
                void = cut is not None and offset >= cut
                verdict: Verdict = "void" if void else ("torn" if tail else "damaged")
                found.append((offset, HistoryEntry(
                    seq=seq, file=file, offset=offset, checksum="bad",
                    verdict=verdict), None, seq))
        found.sort(key=lambda item: item[0])
        for offset, ready, held, seq in found:
            if ready is not None:
                any_entry = True
                yield ready
                if ready.verdict == "damaged" and ready.seq == expected:
                    # The record existed but cannot be read: later ones keep their places,
                    # and their transitions can no longer be checked. A torn or void one
                    # never happened: the next host writes that seq again.
                    expected, state = expected + 1, None
                continue
            assert held is not None
            try:
                record: Record | None = decode_record(payload(scan, held))
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                any_entry = True
                yield HistoryEntry(seq=seq, file=file, offset=offset, checksum="ok",
                                   verdict="undecodable", problem=str(exc))
                continue
            assert record is not None
            base = HistoryEntry(seq=seq, file=file, offset=offset, checksum="ok",
                                verdict="ok", phase=_phase(record), at=record.at, record=record)
            if cut is not None and offset >= cut:
                any_entry = True
                yield msgspec.structs.replace(
                    base, verdict="void", problem="its batch's write or fsync failed")
                continue
            if seq != expected:
                if not any_entry and seq > 1:
                    summary, state = _from_snapshot(layout, run_id, seq - 1)
                    any_entry = True
                    yield from summary
                    expected = seq
                else:
                    any_entry = True
                    yield msgspec.structs.replace(
                        base, verdict="out_of_order", problem=f"expected record {expected}")
                    continue
            if state is not None or seq == 1:
                try:
                    state = apply(state, record)
                except IllegalTransition as exc:
                    any_entry = True
                    yield msgspec.structs.replace(base, verdict="illegal", problem=exc.why)
                    continue
            else:
                base = msgspec.structs.replace(
                    base, problem="checksum valid; not checked against the state machine "
                    "because an earlier record is unreadable")
            any_entry = True
            yield base
            expected = seq + 1


def read_summary(runtime_dir: Path, run_id: str) -> list[HistoryEntry]:
    """For a Run with no record in the log: its snapshot as the one entry standing in for
    records 1..seq, which the log should hold and does not (empty without a snapshot)."""
    layout = Layout(runtime_dir)
    if not check_dir(runtime_dir):
        return []
    found = _snapshot_entry(layout, run_id, "are missing from the log; only this snapshot "
                            "summarises them")
    return [found[0]] if found is not None else []


def _snapshot_entry(layout: Layout, run_id: str,
                    said: str) -> tuple[HistoryEntry, Snapshot] | None:
    """The Run's readable snapshot (live, else done) as a history entry whose problem says
    records 1..seq ``said``, with the snapshot; None without one."""
    name = snapshot_name(run_id)
    for directory in (layout.live, layout.done):
        try:
            snap = read_snapshot(directory / name)
        except SnapshotError:
            continue
        if snap is not None and snap.run_id == run_id:
            return HistoryEntry(
                seq=snap.seq, file=f"{directory.relative_to(layout.root)}/{name}", offset=0,
                checksum="ok", verdict="snapshot",
                phase=snap.state.phase if snap.state else None,
                problem=f"records 1..{snap.seq} {said}"), snap
    return None


def _from_snapshot(layout: Layout, run_id: str,
                   seq: int) -> tuple[list[HistoryEntry], RunState | None]:
    """The snapshot standing in for records 1..seq whose segments are gone, and its state."""
    found = _snapshot_entry(layout, run_id, "are only summarised by this snapshot")
    if found is not None:
        entry, snap = found
        return [entry], (snap.state if snap.seq == seq else None)
    missing = HistoryEntry(seq=seq, file="", offset=0, checksum="none", verdict="out_of_order",
                           problem=f"records 1..{seq} are missing from the log")
    return [missing], None
