"""Read-only judgement of the store: every Run's folded state, or where and why it is damaged.

Nothing here opens a file for writing or creates anything. A restore (``read_runs``) reads
the live snapshots plus only the segments the manifest says are still needed, so its cost
does not grow with a Run's age; ``verify`` reads every segment and cross-checks snapshots.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import os
import re
import stat
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final, Literal

import msgspec

from intloom.errors import IntloomError
from intloom.runtime.machine import (
    FOLD_FIELDS,
    FOLD_VERSION,
    IllegalTransition,
    RunState,
    apply,
    newest_version,
)
from intloom.runtime.records import FORMAT_VERSION, Header, Record
from intloom.store.depth import decode_record
from intloom.store.files import (
    Layout,
    check_dir,
    check_file,
    list_names,
    read_file,
    storage_error,
    unusable_file,
)
from intloom.store.framing import (
    FRAME_MAGIC,
    KIND_RECORD,
    KIND_VOID,
    MAX_SEGMENT,
    SEGMENT_FORMAT,
    SEGMENT_FORMATS,
    Damage,
    Frame,
    SegmentScan,
    VoidNotice,
    format_problem,
    frame_of,
    rebuilt_payload,
    scan_segment,
    segment_header_end,
    segment_name,
    segment_number,
)
from intloom.store.snapshots import (
    Manifest,
    Snapshot,
    SnapshotError,
    is_snapshot_name,
    live_set,
    manifest_ahead,
    read_manifest,
    read_snapshot,
    snapshot_name,
)

__all__ = [
    "Changed",
    "FileProblem",
    "Loaded",
    "Payloads",
    "RunJournal",
    "ScanStats",
    "SharedRead",
    "StoreReport",
    "load",
    "read_runs",
    "read_runs_report",
    "refused_file",
    "snapshot_finding",
    "unread_segment",
    "verify",
    "verify_report",
    "verify_run",
    "verify_run_scans",
]

Status = Literal["ok", "corrupt", "incompatible"]
# Bytes checksummed when telling whose frame damaged bytes were (one try per Run): bounds a
# restore over a large damaged region among many Runs to well under a second; beyond it the
# owner is left unknown, which is the cautious answer.
_MAX_CRC_TRIALS: Final = 256 << 20
# Any frame of kind KIND_VOID: the marker, the length and crc (8 bytes), then the kind byte
# (framing.py). Matching more than the valid void frames only costs a full scan.
VOID_FRAME: Final = re.compile(re.escape(FRAME_MAGIC) + b".{8}" + bytes([KIND_VOID]), re.DOTALL)
Mode = Literal["restore", "verify"]


class RunJournal(msgspec.Struct):
    """One Run as the store reads it back.

    ``state`` is the fold of every usable record. For a corrupt Run it is the fold up to the
    last good record (for display only: a corrupt Run is never resumed); for an incompatible
    Run it is None. ``problem`` says where (file, offset, seq) and what.
    """

    run_id: str
    state: RunState | None
    status: Status
    problem: str | None
    torn_tail: bool = False
    # For a corrupt Run: the furthest seq any trace of it showed (a valid record past the
    # damage, a damaged frame naming it, the record damaged bytes may have held). A later
    # read must reach it, clean, before the Run is trusted again (see ``_judge``).
    reached: int = 0
    # For a Run held only because a segment is gone that may have held its next record:
    # that segment (relative to the runtime directory), which the refusals name.
    lost: str | None = None
    # The newest intloom package that wrote a segment holding any of its records read (their
    # headers say; "" when none says): a Run a newer intloom continued is held by an older
    # one (machine.unreadable), whose header names only the intloom that began it.
    written_by: str = ""


class FileProblem(msgspec.Struct, frozen=True):
    """A whole-file finding: damage no Run can be blamed for, foreign or unexpected files."""

    path: str  # relative to the runtime directory
    kind: Literal["corrupt", "incompatible", "foreign", "unexpected", "torn", "missing"]
    problem: str


class ScanStats(msgspec.Struct):
    """What a read cost: lets tests assert that restores stay bounded without timing them."""

    segments_read: int = 0
    bytes_read: int = 0
    frames_read: int = 0
    records_decoded: int = 0
    snapshots_read: int = 0
    full: bool = False
    # Payload bytes of the frames the read holds until it judges: no record's for a whole
    # verify (each Run's are read again as it is judged, ``Payloads``), one Run's own small
    # ones for ``verify_run`` (``load(only=)``; all of them until 2026-12-06). Not counted
    # by a restore (a start's read), which would pay a pass over every frame for it.
    payload_bytes_held: int = 0


class StoreReport(msgspec.Struct):
    runs: list[RunJournal]
    files: list[FileProblem]
    stats: ScanStats
    # The segments this read scanned, in order (``verify_run`` scans only some).
    segments: list[int] = msgspec.field(default_factory=list)


class Loaded(msgspec.Struct):
    """Everything one read found; the writer builds on it at open."""

    layout: Layout
    exists: bool = False
    journals: dict[str, RunJournal] = msgspec.field(default_factory=dict)
    dirty: set[str] = msgspec.field(default_factory=set)  # Runs with frames in the segments read
    segment_numbers: list[int] = msgspec.field(default_factory=list)
    segments_read: list[int] = msgspec.field(default_factory=list)
    incompatible_segments: list[int] = msgspec.field(default_factory=list)
    # Segments with a finding that is not a torn tail (damage, a damaged header, a foreign
    # file under a segment's name): a host pins them, so every start reports them again.
    problem_segments: set[int] = msgspec.field(default_factory=set)
    # Segments holding each Run's records, or damage that may have been its records.
    evidence: dict[str, set[int]] = msgspec.field(default_factory=dict)
    # For a Run whose records are missing before a later one of its records: the segments
    # missing from wal/ that may have held them (``_gone``). They join its evidence, so a
    # copy put back is read again rather than passed over by a manifest moved past it.
    gone: dict[str, set[int]] = msgspec.field(default_factory=dict)
    # Segments a host created that are no longer in wal/ (``_lost``): whatever records they
    # held are lost with them. A host never numbers a segment of its own with them.
    lost: set[int] = msgspec.field(default_factory=set)
    # The ``start`` of a manifest refused as ahead of the log (0: none). A host numbers its
    # segments from there: one numbered below it would go unread by every restore that
    # trusts that manifest once the log has caught up with it.
    ahead_start: int = 0
    start: int = 0  # this read takes every segment from here on (0: all), earlier ones if pinned
    # A Run whose records begin in a pinned segment before ``start`` has no usable snapshot
    # (its done/ file damaged or moved out): only the whole log shows where it got to.
    partial: bool = False
    # Runs whose snapshot file is damaged: nothing may write over it.
    held: set[str] = msgspec.field(default_factory=set)
    manifest: Manifest | None = None
    manifest_error: SnapshotError | None = None
    # Every void notice this read found, the manifest's and the segments' own. A host keeps
    # them all in its manifest: the segment holding a notice may stop being read (the
    # manifest moves past it) while the segment it voids still is (pinned).
    voids: list[VoidNotice] = msgspec.field(default_factory=list)
    snapshot_errors: list[SnapshotError] = msgspec.field(default_factory=list)
    # Segments a whole-log read left unread (``unread_segment``): each has its finding.
    unread: list[int] = msgspec.field(default_factory=list)
    live_names: set[str] = msgspec.field(default_factory=set)  # snap/live/ files, damaged ones too
    # For a read of one Run (``only``): the segments whose bytes hold its id, in order.
    holding: list[int] = msgspec.field(default_factory=list)
    files: list[FileProblem] = msgspec.field(default_factory=list)
    stats: ScanStats = msgspec.field(default_factory=ScanStats)


class _Hit(msgspec.Struct):
    """Damaged bytes that claim to be record ``seq`` of a Run."""

    seq: int
    where: str
    at_tail: bool
    number: int


class _Gap(msgspec.Struct):
    """Damaged bytes between valid frames, or a lost segment (``missing``): they may have
    held some Run's next record."""

    number: int
    offset: int
    where: str  # file and offset, with the damaged byte range
    place: str  # file and offset, as a hit names it
    missing: bool = False
    gone: str = "is missing"  # how a lost segment is gone

    @property
    def said(self) -> str:
        """What may have held a Run's records, as a message names it."""
        return f"{self.where}, which {self.gone}," if self.missing else (
            f"the damaged bytes at {self.where}")


def _where(scan: SegmentScan, offset: int) -> str:
    return f"wal/{scan.name} offset {offset}"


def _at(scan: SegmentScan, frame: Frame) -> str:
    """Where a record is, as a finding names it (made only for a finding: a restore reads
    every record of the log since the last snapshots)."""
    return f"{_where(scan, frame.offset)} seq {frame.seq}"


def _rel(layout: Layout, path: Path) -> str:
    try:
        return str(path.relative_to(layout.root))
    except ValueError:
        return str(path)


def _snapshots(layout: Layout, directory: Path, loaded: Loaded) -> dict[str, Snapshot]:
    out: dict[str, Snapshot] = {}
    if not check_dir(directory):
        return out
    for name in list_names(directory):
        if name.startswith("."):
            continue  # an atomic write's leftover temp file (the next host removes it), not data
        path = directory / name
        if not is_snapshot_name(name):
            loaded.files.append(FileProblem(_rel(layout, path), "unexpected",
                                            "is not a file intloom writes; it was left alone"))
            continue
        if directory == layout.live:
            loaded.live_names.add(name)
        try:
            snap = read_snapshot(path)
        except SnapshotError as exc:
            loaded.snapshot_errors.append(exc)
            loaded.files.append(snapshot_finding(layout, exc))
            continue
        loaded.stats.snapshots_read += 1
        if snap is not None:
            out[snap.run_id] = snap
    return out


def _snapshot_of(layout: Layout, loaded: Loaded, run_id: str) -> dict[str, Snapshot]:
    """``run_id``'s ``done/`` snapshot, judged as ``_snapshots`` judges each file there: a
    verify of one Run reads no other Run's (a done/ file per Run that ever ended). A name
    there intloom never writes is still reported: listing costs little, reading a lot."""
    if not check_dir(layout.done):
        return {}
    for name in list_names(layout.done):
        if not name.startswith(".") and not is_snapshot_name(name):
            loaded.files.append(FileProblem(_rel(layout, layout.done / name), "unexpected",
                                            "is not a file intloom writes; it was left alone"))
    try:
        snap = read_snapshot(layout.done / snapshot_name(run_id))
    except SnapshotError as exc:
        loaded.snapshot_errors.append(exc)
        loaded.files.append(snapshot_finding(layout, exc))
        return {}
    if snap is None:
        return {}
    loaded.stats.snapshots_read += 1
    return {snap.run_id: snap}


class _Search(msgspec.Struct):
    """What the bytes of every segment say of one Run (``_search``): the segments holding its
    id, in order, and those scanned for a verify of it whatever it holds (a void frame; a
    file no start reads, whose finding the caller gives)."""

    holding: list[int]
    always: set[int]


def _search(layout: Layout, manifest: Manifest | None, numbers: list[int], run_id: str,
            judged: Callable[[Layout, Manifest | None, int], FileProblem | None] | None,
            seen: _Seen | None = None) -> _Search:
    """Every valid frame of a Run holds its id verbatim, so a segment without it holds none
    of its records; scanning frame by frame is the cost, reading the bytes is not. With
    ``seen``, a segment holding the id is scanned here, from the bytes in hand (a verify of
    the Run scans it whatever else it reads): read again to be scanned, each of the Run's
    segments was read twice, and once more by ``inspect``'s history of it."""
    key = run_id.encode()
    holding: list[int] = []
    always: set[int] = set()
    names: dict[str, str] = {}
    for number in numbers:
        if judged is not None and judged(layout, manifest, number) is not None:
            always.add(number)  # never read: the caller gives its finding
            continue
        data = read_file(layout.wal / segment_name(number))
        if data is None:
            continue
        if key in data:
            holding.append(number)
            if seen is not None:
                seen.scans[number] = _scanned(layout, number, data, numbers, run_id, names)
        elif VOID_FRAME.search(data) is not None:
            always.add(number)
        del data
    return _Search(holding, always)


# The payload size from which a verify of one Run keeps its record by place, not its bytes
# (``_scanned``): reading a record again costs ~8 us, a small one held costs little more
# memory than its place.
_PLACED_FROM: Final = 1024


def _scanned(layout: Layout, number: int, data: bytes, numbers: list[int], only: str,
             names: dict[str, str], hold: bool = False) -> tuple[SegmentScan, int, int]:
    """Segment ``number``'s bytes scanned for a verify of Run ``only`` (``load``): the scan,
    the bytes read and the payload bytes it holds."""
    name = segment_name(number)
    scan = scan_segment(name, number, data)
    scan.written_this_boot = written_this_boot(layout.wal / name)
    scan.went_on = went_on(layout, scan, numbers)
    # Another Run's frames count here only by their place (whose frame damaged bytes were:
    # ``_owner``); their payloads are never decoded. Dropped as each segment is read,
    # memory holds this Run's records, not every segment it spans (inspect of a 14-record
    # Run across 573 MB of another Run's 1 MB States held all of it: 618 MB). Its own
    # large ones are read again as it is judged (``Payloads``), as a whole verify reads
    # every record: held, they took the Run's size in memory until inspect was done.
    # ``hold``: all of its own kept, for a read again after a segment changed.
    scan.frames = [
        _placed(f, names) if f.kind == KIND_RECORD and (
            f.run_id != only or (not hold and len(f.payload) >= _PLACED_FROM)) else f
        for f in scan.frames]
    return scan, len(data), sum(len(f.payload) for f in scan.frames)


def _segments_of(numbers: list[int], found: _Search, through_end: bool) -> set[int]:
    """The segments a verify of one Run alone scans: every one from the first to the last
    whose bytes hold its id (a damaged record of it lost its id only where its seqs then
    jump, between two of them), through the end of the log with ``through_end`` (damage
    after its last record may have held its next one), and any holding a void frame."""
    holding = found.holding
    chosen = set(found.always)
    if holding or through_end:
        low = holding[0] if holding else min(numbers, default=0)
        high = max(numbers, default=0) if through_end else holding[-1]
        chosen.update(n for n in numbers if low <= n <= high)
    return chosen


def snapshot_finding(layout: Layout, exc: SnapshotError) -> FileProblem:
    """The finding for an unusable snapshot file: what a restore (start, doctor, inspect)
    reports, and what a compaction that leaves the file as it is logs."""
    kind: Literal["incompatible", "corrupt"] = "incompatible" if exc.incompatible else "corrupt"
    return FileProblem(
        _rel(layout, exc.path), kind,
        f"{exc.fact}; every segment was read instead and the file was left as it is "
        f"({_snapshot_fix(exc)})")


def _snapshot_fix(exc: SnapshotError) -> str:
    """What to do about an unusable snapshot file: moving it out always works (its Run is
    then judged from the whole log); a wrong mode or owner can also be put right."""
    out = "move it out of the runtime directory to let intloom write it again"
    return out if exc.fix is None else f"{exc.fix}, or {out}"


_EXPECTED: Final = {"": {"wal", "snap", "manifest.json"}, "snap": {"live", "done"}}


def _unexpected_names(layout: Layout, loaded: Loaded) -> None:
    """Report files intloom never writes where a restore does not otherwise look: the
    store's root and ``snap/``. ``wal/`` and ``snap/live`` are checked as they are read;
    ``snap/done`` only by a verify (``inspect``), which reads it: it holds one file per
    Run that ever ended, and listing it would make every start slower with age."""
    for rel, allowed in _EXPECTED.items():
        directory = layout.root / rel if rel else layout.root
        for name in list_names(directory):
            if name not in allowed and not name.startswith("."):
                loaded.files.append(FileProblem(
                    f"{rel}/{name}" if rel else name, "unexpected",
                    "is not a file intloom writes; it was left alone"))


def _list_wal(layout: Layout) -> tuple[list[int], list[FileProblem]]:
    """The segment numbers in ``wal/``, sorted, and a finding for each other name there."""
    numbers: list[int] = []
    strays: list[FileProblem] = []
    if check_dir(layout.wal):
        for name in list_names(layout.wal):
            number = segment_number(name)
            if number is None:
                strays.append(FileProblem(f"wal/{name}", "unexpected",
                                          "is not a file intloom writes; it was left alone"))
            else:
                numbers.append(number)
    return sorted(numbers), strays


class _Base(msgspec.Struct):
    """What every read of the store begins with, whatever it then reads of the log: the
    manifest, the listing of ``wal/``, the findings up to there, and every ``live/``
    snapshot (what a restore reads to know the Runs; a verify to judge them). ``template``
    holds what was found, for each read to start from a copy of it."""

    template: Loaded
    live: dict[str, Snapshot]


def _read_base(root: Path) -> _Base:
    layout = Layout(root)
    loaded = Loaded(layout=layout)
    if not check_dir(root):
        return _Base(loaded, {})
    loaded.exists = True
    for directory in (layout.wal, layout.snap):
        check_dir(directory)

    numbers, strays = _list_wal(layout)
    manifest_finding: FileProblem | None = None
    closing_finding: FileProblem | None = None
    try:
        manifest = loaded.manifest = read_manifest(layout)
        ahead = manifest and manifest_ahead(manifest, max(numbers, default=0))
        if manifest and ahead:
            # A host running beside this read (doctor, inspect) may have created segments,
            # and written a manifest naming them, since wal/ was listed: judged against
            # the log as it is now, that manifest is not ahead of it.
            numbers, strays = _list_wal(layout)
            ahead = manifest_ahead(manifest, max(numbers, default=0))
        if manifest and ahead and _closing_segment_lost(manifest, numbers):
            # Not a damaged manifest but a lost segment: the one a host sealed at a clean
            # close, and whose next number the manifest's start is. Every Run it held has
            # its snapshot. Judged damaged instead, a later host would number a segment of
            # its own below this start, once the log caught up with it no restore would
            # read that file, and the Runs it holds would be lost after a crash.
            closing = manifest.start - 1
            ahead = None
            loaded.lost.add(closing)
            closing_finding = FileProblem(
                f"wal/{segment_name(closing)}", "missing",
                f"is missing, and a host created it (manifest.json, written when that host "
                f"closed it cleanly, names segment {manifest.start} as the next): the Runs "
                "restore from their snapshots, but the history it held is gone (intloom "
                "inspect shows those records as missing); put it back from a copy if there "
                "is one (intloom never removes a segment)")
        if manifest and ahead:
            loaded.ahead_start = manifest.start
        if ahead:
            loaded.manifest = None  # provably damaged: trusted, it would hide Runs
            raise SnapshotError(layout.manifest, ahead)
    except SnapshotError as exc:
        loaded.manifest_error = exc
        kind: Literal["incompatible", "corrupt"] = (
            "incompatible" if exc.incompatible else "corrupt"
        )
        out = "move it out of the runtime directory to let intloom write a new one"
        manifest_finding = FileProblem(
            "manifest.json", kind,
            f"{exc.fact}; every segment was read instead and no new manifest is written over "
            f"it ({out if exc.fix is None else f'{exc.fix}, or {out}'})")
    loaded.segment_numbers = numbers
    loaded.files.extend(strays)
    if manifest_finding is not None:
        loaded.files.append(manifest_finding)
    if closing_finding is not None:
        loaded.files.append(closing_finding)

    _unexpected_names(layout, loaded)
    return _Base(loaded, _snapshots(layout, layout.live, loaded))


def _fresh(base: _Base) -> Loaded:
    """A read's own copy of what ``base`` found: each read adds findings of its own, so
    every container (and the read's costs) is copied; the files' contents are shared."""
    found = base.template
    return msgspec.structs.replace(found, **{
        name: copy.copy(value) for name in found.__struct_fields__
        for value in (getattr(found, name),) if isinstance(value, (list, set, dict, ScanStats))})


class SharedRead:
    """One read of the store that several judgements of it share (``inspect RUN`` judges one
    Run as a verify does, then as a start reads it): the manifest, ``wal/``'s listing and
    every ``live/`` snapshot are read once, not once per judgement. Each judgement is the
    one a read of its own gives of the same files. Read-only.

    For one command's judgements, made one after the other: a store that changes meanwhile
    (a host writing beside it) is judged as of that first read, as one read judges it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._base: _Base | None = None

    def base(self) -> _Base:
        if self._base is None:
            self._base = _read_base(self.root)
        return self._base


class _Seen:
    """What a verify of one Run read of the log (``verify_run``), for its read through the
    log's end: which segments hold the Run's id, and each segment it scanned (other Runs'
    frames without their payloads) with its size and the payload bytes it holds. Only that
    read's later segments are then read."""

    def __init__(self) -> None:
        self.search: _Search | None = None
        self.scans: dict[int, tuple[SegmentScan, int, int]] = {}


def load(root: Path, mode: Mode = "restore", *, whole: bool = False,
         only: str | None = None, through_end: bool = False, hold: bool = False,
         shared: SharedRead | None = None, seen: _Seen | None = None) -> Loaded:
    """Read the store at ``root`` (restore: bounded; verify: everything). Read-only.

    A bounded read that finds a Run it cannot judge from what it read (``Loaded.partial``)
    is done again over the whole log (``whole``). ``only`` (a verify of one Run,
    ``verify_run``): judge that Run alone, from its own ``done/`` snapshot and the segments
    ``_segments_of`` picks, not every Run of the log. A verify keeps where each record is,
    not its payload (a verify of one Run: its large ones), and reads it again as its Run is
    judged (``Payloads``);
    ``hold``: keep every payload instead, as a verify does again when a segment changed
    between the two reads (a host writing beside it). ``shared``: what an earlier read of
    the same command read is not read again; ``seen``: nor what an earlier verify of
    ``only`` scanned (``verify_run``)."""
    base = shared.base() if shared is not None else _read_base(root)
    loaded = _fresh(base)
    if not loaded.exists:
        return loaded
    layout = loaded.layout
    live = base.live
    numbers = loaded.segment_numbers
    full = mode == "verify" or whole or loaded.manifest_error is not None
    done = ({} if mode != "verify" else _snapshots(layout, layout.done, loaded)
            if only is None else _snapshot_of(layout, loaded, only))
    if loaded.snapshot_errors:
        full = True  # without a trusted snapshot, only the whole log can rebuild that Run
    if any(_unfinished_fold(snap) < FOLD_VERSION for snap in live.values()):
        # Written by an older fold: its Run is folded again from its first record (_judge),
        # once; the host writes it a snapshot of this fold.
        full = True
    manifest = loaded.manifest
    if (manifest is not None and manifest.live is not None
            and live_set(loaded.live_names) != manifest.live):
        # Not the live/ files the manifest relies on: a compaction cut short (harmless), or a
        # snapshot gone, whose Run only the segments before ``start`` still hold.
        full = True
    # What a start reads every segment for; else it reads from the manifest's start on.
    bounded = not whole and manifest is not None and not (
        loaded.manifest_error or loaded.snapshot_errors
        or (manifest.live is not None and live_set(loaded.live_names) != manifest.live))
    loaded.stats.full = full
    start = loaded.start = 0 if full or manifest is None else manifest.start
    pinned = set() if manifest is None else set(manifest.pinned)
    # What a bounded restore reads: only records there can be newer than the snapshots.
    unsummarised = {n for n in numbers if manifest is None or n >= manifest.start
                    or n in pinned}

    judged = unread_segment if mode == "verify" and bounded else None
    # A whole verify that held every payload until it judged took 552 MB for 76k Runs and
    # 1.27 GB for a 1.2 GB log; by place only, memory holds the frames' places and one
    # Run's payloads at a time. A verify of one Run (``only``) keeps its large records by
    # place too (``_scanned``).
    lean = mode == "verify" and only is None and not hold
    names: dict[str, str] = {}  # one copy of each run id, not one per frame
    chosen: set[int] | None = None
    if only is not None:
        found = seen.search if seen is not None else None
        if found is None:
            found = _search(layout, manifest, numbers, only, judged, seen)
        if seen is not None:
            seen.search = found
        loaded.holding = found.holding
        chosen = _segments_of(numbers, found, through_end)
    scans: list[SegmentScan] = []
    for number in numbers:
        if number < start and number not in pinned:
            continue
        if chosen is not None and number not in chosen:
            continue
        name = f"{number:010d}.seg"
        unread = judged(layout, manifest, number) if judged is not None else None
        if unread is not None:
            loaded.files.append(unread)
            loaded.unread.append(number)
            continue
        kept = seen.scans.get(number) if seen is not None else None
        if kept is not None:
            # Scanned by this Run's verify already (its search, or a read that stopped
            # short of the log's end): the same bytes, counted as this read's too.
            scan, size, held = kept
            loaded.stats.segments_read += 1
            loaded.stats.bytes_read += size
            loaded.stats.payload_bytes_held += held
            scans.append(scan)
            continue
        data = read_file(layout.wal / name)
        if data is None:
            continue
        if only is not None:
            scan, size, held = _scanned(layout, number, data, numbers, only, names, hold)
            del data
            loaded.stats.segments_read += 1
            loaded.stats.bytes_read += size
            loaded.stats.payload_bytes_held += held
            if seen is not None:
                seen.scans[number] = (scan, size, held)
            scans.append(scan)
            continue
        loaded.stats.segments_read += 1
        loaded.stats.bytes_read += len(data)
        scan = scan_segment(name, number, data)
        del data
        scan.written_this_boot = written_this_boot(layout.wal / name)
        scan.went_on = went_on(layout, scan, numbers)
        if lean:
            scan.frames = [_placed(f, names) if f.kind == KIND_RECORD else f
                           for f in scan.frames]
        if mode != "restore":  # a start's read pays no pass over every frame for it
            loaded.stats.payload_bytes_held += sum(len(f.payload) for f in scan.frames)
        scans.append(scan)
    loaded.segments_read = [s.number for s in scans]

    payloads = Payloads(layout) if lean or (only is not None and not hold) else None
    try:
        _judge_all(loaded, scans, live, done, mode, unsummarised, only, payloads)
    except Changed:
        # Judged from what each read saw, a verdict could mix two versions of a file: judged
        # again from one read that keeps it all, as a verify did before reading twice.
        return load(root, mode, whole=whole, only=only, through_end=through_end, hold=True)
    finally:
        if payloads is not None:
            payloads.close()
    if loaded.partial and not full:
        return load(root, mode, whole=True, shared=shared)
    return loaded


def _placed(frame: Frame, names: dict[str, str]) -> Frame:
    """``frame`` without its payload: where it is and whose record it is, all that a read
    judging another Run needs of it, and all a whole verify keeps until it judges its Run.
    ``names`` holds one copy of each run id, shared by that Run's frames."""
    run_id = names.setdefault(frame.run_id, frame.run_id)
    return Frame(frame.kind, frame.seq, run_id, b"", frame.offset, frame.end)


class Changed(Exception):
    """A segment's bytes at a frame's place are no longer that frame (``path``: the
    segment)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.path = path


# Segment files ``Payloads`` keeps open at once: Runs are judged in id order, each reading
# from anywhere in the log, and a log of thousands of segments would pass the fd limit.
_OPEN_SEGMENTS: Final = 32


class Payloads:
    """A record's payload read again from its segment, for a read that kept only where each
    frame is (``_placed``). Each frame is checked again as the scan checked it (its crc,
    and the same kind, seq and Run at the same place); anything else raises ``Changed``.
    A frame that kept its payload (a verify of one Run keeps its small ones) gives it as
    it is. ``close`` when done (it keeps segments open)."""

    def __init__(self, layout: Layout) -> None:
        self._wal = layout.wal
        self._fds: dict[int, int] = {}

    def __call__(self, scan: SegmentScan, frame: Frame) -> bytes:
        if frame.payload:  # a record's payload is never empty: this one was kept
            return frame.payload
        fd = self._fds.get(scan.number)
        if fd is None:
            if len(self._fds) >= _OPEN_SEGMENTS:
                os.close(self._fds.pop(next(iter(self._fds))))
            fd = self._fds[scan.number] = self._open(scan.name)
        try:
            data = os.pread(fd, frame.end - frame.offset, frame.offset)
        except OSError:
            raise Changed(self._wal / scan.name) from None
        again = frame_of(data)
        if again is None or (again.kind, again.seq, again.run_id) != (
                frame.kind, frame.seq, frame.run_id):
            raise Changed(self._wal / scan.name)
        return again.payload

    def _open(self, name: str) -> int:
        try:
            fd = os.open(self._wal / name,
                         os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            raise Changed(self._wal / name) from None
        try:
            regular = stat.S_ISREG(os.fstat(fd).st_mode)
        except OSError:
            regular = False
        if not regular:
            os.close(fd)
            raise Changed(self._wal / name)
        return fd

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


# A file last written this long after the OS started is taken as written since it started
# (the boot time is computed from two clocks read one after the other).
_BOOT_MARGIN_NS: Final = 2_000_000_000


def unread_segment(layout: Layout, manifest: Manifest | None, number: int
                   ) -> FileProblem | None:
    """For a read of the whole log (inspect, verify): the finding for segment ``number`` when
    no start reads it (below a usable manifest's ``start``, not pinned) and it is not a
    private regular file of ours (judged from an ``lstat``). Such a segment is not read:
    nothing in it can be trusted, yet a start does without it, so it is one file's finding,
    not a refusal of every inspect. None otherwise: read it, and a refusal stands, as it
    does for a start."""
    if manifest is None or number >= manifest.start or number in manifest.pinned:
        return None
    path = layout.wal / segment_name(number)
    unusable = unusable_file(path)
    if unusable is None:
        return None
    fact, fix = unusable
    out = "move it out of the runtime directory if it is not one intloom wrote"
    return FileProblem(
        _rel(layout, path), "corrupt",
        f"{fact}; it was not read (no start reads it: it is below the manifest's start), so "
        f"the records it holds are not shown and were not checked "
        f"({out if fix is None else f'{fix}, or {out}'})")


def _older_fold(snap: Snapshot, folded: RunState) -> bool:
    """Whether ``snap``'s state differs from ``folded`` only by fields a fold after the
    snapshot's added (``FOLD_FIELDS``: ``last_effect_unknown`` reads as False from a
    snapshot written before it existed). Such a snapshot is no disagreement with the log
    (verify called it one after an upgrade); nothing else the snapshot says is excused."""
    snapped = snap.state
    added = [name for version, names in FOLD_FIELDS.items() if version > snap.fold
             for name in names]
    if snapped is None or not added:
        return False
    return msgspec.structs.replace(
        folded, **{name: getattr(snapped, name) for name in added}) == snapped


def _unfinished_fold(snap: Snapshot | None) -> int:
    """The fold of ``snap``'s state when it is an unfinished Run's snapshot that a read goes
    on from (an ok one, or a corrupt one judged again: ``_judge``), whose fold a restart
    decides by; else ``FOLD_VERSION``: nothing to fold again or hold."""
    if (snap is None or snap.state is None or snap.state.phase == "terminal"
            or not (snap.status == "ok" or (snap.status == "corrupt" and snap.reached > 0))):
        return FOLD_VERSION
    return snap.fold


def numbering_refused(layout: Layout, numbers: Iterable[int]) -> IntloomError | None:
    """The STORAGE_ERROR a start raises when the highest segment of ``numbers`` leaves no
    number after it: a new segment would need an eleven-digit name, which no reader takes
    for a segment, its records lost to every restore. None otherwise."""
    highest = max(numbers, default=0)
    if highest < MAX_SEGMENT:
        return None
    return storage_error(
        layout.wal / segment_name(highest),
        f"has the highest segment number a name can hold ({MAX_SEGMENT}), so no new "
        "segment can be numbered after it",
        "if intloom did not write it (intloom doctor lists it as foreign, or as corrupt "
        "when it copies a real segment), move it out of the wal directory and start "
        "again; a segment intloom wrote is never renamed")


def refused_file(root: Path) -> IntloomError | None:
    """The STORAGE_ERROR a start's restore raises on the first store file it reads and
    refuses (a link, a directory, another owner, group/other bits): each segment from the
    manifest's start (every one without a usable manifest) and each pinned one; None when
    none is refused. Neither a snapshot nor the manifest is among them: such a file is read
    past as a damaged one is (reported, the log read instead). From an
    ``lstat`` of each and the manifest's few bytes, without reading the log: ``status``
    names it before it says to run intloom start. Directories are judged by the caller
    (doctor's runtime_dir check), and what only a whole read finds is not judged here."""
    layout = Layout(root)
    try:
        if not check_dir(root):
            return None
        try:
            manifest = read_manifest(layout)
        except SnapshotError:
            manifest = None  # damaged: kept as it is, and every segment is read instead
        if check_dir(layout.snap):
            check_dir(layout.live)
        numbers, _ = _list_wal(layout)
        # A start refuses it too, once it has read the log: said before any file is read.
        refused = numbering_refused(layout, numbers)
        if refused is not None:
            return refused
        start = manifest.start if manifest is not None else 0
        pinned = set(manifest.pinned) if manifest is not None else set()
        for number in numbers:
            if number >= start or number in pinned:
                check_file(layout.wal / segment_name(number))
    except IntloomError as exc:
        return exc
    return None


def written_this_boot(path: Path) -> bool | None:
    """Whether ``path`` was last modified after the OS last started: then no crash since can
    have left unflushed pages in it. None when that cannot be told (no boot clock, no file).

    Wrong answers only go one way: a file whose mtime was set later than its last write
    (copied without its times, touched) reads as written this boot, and a torn frame in it
    is then reported as damage -- never the other way round. An mtime in the future (a
    clock that was ahead, since corrected) tells nothing: None.
    """
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    if clock is None:
        return None
    with contextlib.suppress(OSError):
        mtime = os.stat(path, follow_symlinks=False).st_mtime_ns
        now = time.time_ns()
        if mtime > now + _BOOT_MARGIN_NS:
            # Written "in the future": the wall clock was ahead then (and corrected since,
            # e.g. by NTP after a restart), so the mtime says nothing about the boot.
            return None
        booted = now - time.clock_gettime_ns(clock)
        return mtime > booted + _BOOT_MARGIN_NS
    return None


def went_on(layout: Layout, scan: SegmentScan, numbers: list[int]) -> int:
    """The first segment after ``scan`` in ``numbers`` (wal/) that ``scan``'s writer -- the
    same instance id in its header -- wrote past its header, 0 if none (``SegmentScan.went_on``).

    Looked for only when ``scan`` ends in damage, so a read of a sound log opens nothing
    more. A header-only segment (with or without the zeros a format-2 writer preallocates)
    does not count: a rotation whose directory fsync failed leaves one, and its writer goes
    on appending to the segment before it. Only a file's
    first bytes are read, never through a link.
    """
    if scan.header is None or not scan.damage or not scan.damage[-1].at_tail:
        return 0
    writer = scan.header.instance_id
    for number in numbers:
        if number <= scan.number:
            continue
        head = read_head(layout.wal / segment_name(number))
        if head is None:
            continue
        data, size = head
        found = segment_header_end(data)
        if found is None or found[0].instance_id != writer:
            continue
        header, end = found
        # A format-2 segment is preallocated from its creation: it holds more than its
        # header once a byte after it is not one of those zeros.
        if size > end and (header.format < SEGMENT_FORMAT or data[end:].strip(b"\0")):
            return number
    return 0


def read_head(path: Path, limit: int = 8192) -> tuple[bytes, int] | None:
    """A regular file's first ``limit`` bytes and its size (never through a link); None when
    it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        return os.read(fd, limit), st.st_size
    except OSError:
        return None
    finally:
        os.close(fd)


def tail_finding(scan: SegmentScan, damage: Damage) -> str:
    """What a segment's damaged last bytes are, in words (for a torn or a damaged tail)."""
    size = damage.end - damage.start
    if scan.went_on:
        return (f"bytes {damage.start}..{damage.end} at its end are damaged (its last frame is "
                f"{'cut short' if damage.cut_short else 'whole but fails its checksum'}, yet "
                f"the host that wrote it went on to write wal/{segment_name(scan.went_on)}, "
                "so no crash ended it mid-append: it was cut short or damaged since)")
    if damage.cut_short:
        return (f"ends with {size} bytes of an incomplete frame at offset {damage.start} "
                "(a crash mid-append; not corruption)")
    # Bytes that do not begin with a frame's marker are no frame at all (zeros an OS crash
    # left in unwritten pages, or bytes appended by something else): "its last frame has
    # its whole length" said of them stated a fact that was not found.
    marker = damage.marked
    if scan.is_torn(damage):
        what = (f"a complete-length last frame at offset {damage.start} ({size} bytes) that "
                "fails its checksum" if marker else
                f"{size} bytes at offset {damage.start} that do not begin with a frame's marker")
        return (f"ends with {what}: a crash mid-write or damage. The OS may have restarted "
                "since the segment was last written, and a crash of the OS can leave a "
                "frame's pages unwritten, so it is read as a torn tail")
    what = ("its last frame has its whole length but fails its checksum" if marker
            else "its last bytes do not begin with a frame's marker")
    return (f"bytes {damage.start}..{damage.end} are damaged ({what}, and the segment was "
            "last written after the OS last started, so no crash can have torn it)")


def void_notices(notices: list[VoidNotice], scans: list[SegmentScan],
                 bad: Callable[[SegmentScan, Frame], None] | None = None,
                 odd: Callable[[SegmentScan, Frame, VoidNotice], None] | None = None,
                 ) -> list[VoidNotice]:
    """The manifest's ``notices`` and the void notices the segments repeat, each once.
    ``bad`` is told of a notice that does not decode, ``odd`` of one a writer does not
    write (_writers_notice); neither is obeyed."""
    notices = list(notices)
    for scan in scans:
        for frame in scan.frames:
            # A writer puts a notice first in a fresh segment, never after a seal: one there
            # is corruption (reported as such, _after_seal), and read, it would void records
            # the Run's host wrote and take the Run back to before them.
            if frame.kind == KIND_VOID and not (scan.sealed_end
                                                and frame.offset >= scan.sealed_end):
                try:
                    notice = msgspec.msgpack.decode(frame.payload, type=VoidNotice)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    if bad is not None:
                        bad(scan, frame)
                    continue
                if _writers_notice(scan, frame, notice):
                    notices.append(notice)
                elif odd is not None:
                    odd(scan, frame, notice)
    return list(dict.fromkeys(notices))


def _writers_notice(scan: SegmentScan, frame: Frame, notice: VoidNotice) -> bool:
    """Whether ``notice`` is one a writer writes: the first frame of the fresh segment that
    replaces a failed one, voiding the failed one's bytes (an earlier segment). Obeyed, a
    notice elsewhere (later in a segment, or voiding its own segment's bytes or a later
    one's) made the Runs it named vanish, every command saying all was well."""
    return frame.offset == scan.frames_from and notice.segment < scan.number


def void_cuts(notices: list[VoidNotice], scans: list[SegmentScan],
              bad: Callable[[SegmentScan, Frame], None] | None = None) -> dict[int, int]:
    """Segment number -> the offset from which its bytes are void: the earliest of the
    ``void_notices``."""
    voids: dict[int, int] = {}
    for notice in void_notices(notices, scans, bad):
        voids[notice.segment] = min(voids.get(notice.segment, notice.offset), notice.offset)
    return voids


def _voids(loaded: Loaded, scans: list[SegmentScan]
           ) -> tuple[dict[int, int], list[tuple[SegmentScan, Frame, VoidNotice]]]:
    """The void cuts, and the notices a writer does not write (not obeyed, reported)."""
    odd_ones: list[tuple[SegmentScan, Frame, VoidNotice]] = []

    def bad(scan: SegmentScan, frame: Frame) -> None:
        loaded.files.append(FileProblem(f"wal/{scan.name}", "corrupt",
                                        f"void notice at offset {frame.offset} does not decode"))

    def odd(scan: SegmentScan, frame: Frame, notice: VoidNotice) -> None:
        loaded.problem_segments.add(scan.number)
        odd_ones.append((scan, frame, notice))
        loaded.files.append(FileProblem(
            f"wal/{scan.name}", "corrupt",
            f"its void notice at offset {frame.offset} voids "
            f"wal/{segment_name(notice.segment)} from offset {notice.offset}, which a writer "
            "never writes (its notice is the first frame of a fresh segment and voids an "
            "earlier one): it is not obeyed, the Runs with records there are not resumed, "
            "and the file was left as it is"))

    loaded.voids = void_notices(list(loaded.manifest.voids) if loaded.manifest else [], scans,
                                bad, odd)
    return void_cuts(loaded.voids, []), odd_ones


def _judge_all(loaded: Loaded, scans: list[SegmentScan], live: dict[str, Snapshot],
               done: dict[str, Snapshot], mode: Mode, unsummarised: set[int],
               only: str | None = None, payloads: Payloads | None = None) -> None:
    voids, odd_voids = _voids(loaded, scans)
    frames: dict[str, list[tuple[SegmentScan, Frame]]] = defaultdict(list)
    hits: dict[str, list[_Hit]] = defaultdict(list)
    gaps: list[tuple[_Gap, Damage]] = []  # in log order
    incompatible: dict[str, str] = {}
    incompatible_in: dict[str, set[int]] = defaultdict(set)
    bad_headers: dict[int, str] = {}  # segment number -> its damaged header, in words
    # Each Run's valid record frames that follow a seal: never written by a writer there.
    after_seal: dict[str, list[tuple[SegmentScan, Frame]]] = defaultdict(list)

    for scan in scans:
        cut = voids.get(scan.number)
        path = f"wal/{scan.name}"
        if scan.status == "empty":
            # Torn as a cut-short header is (what a crash while creating the segment
            # leaves), but there is no header to end inside of: said as it is.
            # A full disk leaves it too: the file is made, its header is refused (ENOSPC).
            loaded.files.append(FileProblem(path, "torn", "has 0 bytes (an empty file, no "
                                            "header): what a crash right after the segment "
                                            "was created leaves, or a full disk that refused "
                                            "its header; it holds no record"))
            continue
        if scan.status == "torn_header":
            loaded.files.append(FileProblem(path, "torn", "ends inside its file header "
                                            "(a crash while the segment was being created)"))
            continue
        if scan.status == "foreign":
            loaded.files.append(FileProblem(path, "foreign", scan.problem or "is not a segment"))
            loaded.problem_segments.add(scan.number)
            continue
        if scan.status == "incompatible":
            loaded.incompatible_segments.append(scan.number)
            names = {f.run_id for f in scan.frames if f.kind == KIND_RECORD}
            names |= {c.run_id for d in scan.damage for c in d.candidates}
            for run_id in names:
                problem = format_problem(scan.format_found or 0, SEGMENT_FORMATS)
                incompatible[run_id] = f"its records in {path}, which {problem}"
                incompatible_in[run_id].add(scan.number)
            if not names:
                incompatible[f"({path})"] = f"{path} {scan.problem}; its Runs cannot be listed"
            loaded.files.append(FileProblem(path, "incompatible", scan.problem or ""))
            continue
        if scan.problem:
            loaded.files.append(FileProblem(path, "corrupt", scan.problem))
            loaded.problem_segments.add(scan.number)
        if scan.status == "damaged_header":
            bad_headers[scan.number] = f"{path}, which {scan.problem}"
        if scan.seal_problem:
            loaded.files.append(FileProblem(path, "corrupt", scan.seal_problem))
            loaded.problem_segments.add(scan.number)
        _after_seal(loaded, scan, cut, after_seal)
        for frame in scan.frames:
            if frame.kind != KIND_RECORD or (cut is not None and frame.offset >= cut):
                continue
            if scan.sealed_end and frame.offset >= scan.sealed_end:
                continue  # not part of the segment as written (_after_seal)
            loaded.stats.frames_read += 1
            frames[frame.run_id].append((scan, frame))
        for damage in scan.damage:
            if cut is not None and damage.start >= cut:
                continue
            tail = scan.is_torn(damage)
            if tail:
                loaded.files.append(FileProblem(path, "torn", tail_finding(scan, damage)))
            else:
                loaded.problem_segments.add(scan.number)
                if damage.at_tail and not damage.after_seal:
                    fact = tail_finding(scan, damage)
                else:
                    what = ("after the segment's seal" if damage.after_seal
                            else "between valid frames")
                    fact = f"bytes {damage.start}..{damage.end} are damaged ({what})"
                loaded.files.append(FileProblem(path, "corrupt", fact))
                if not damage.after_seal:  # nothing is ever written after a seal
                    place = _where(scan, damage.start)
                    gaps.append((_Gap(scan.number, damage.start,
                                      f"{place} ({damage.end - damage.start} bytes)", place),
                                 damage))
            for cand in damage.candidates:
                if cut is not None and cand.offset >= cut:
                    continue
                hits[cand.run_id].append(
                    _Hit(cand.seq, _where(scan, cand.offset), tail, scan.number))

    _lost(loaded, scans, gaps)
    # The run id a damaged frame claims is unverified (the damage may be in it): only Runs
    # known from valid frames or snapshots are judged; the damage itself is a file finding.
    run_ids = set(frames) | set(live) | set(incompatible) | set(after_seal)
    if mode == "verify":
        run_ids |= set(done)
    damaged_snaps = {exc.path.name: exc for exc in loaded.snapshot_errors}
    unexplained: list[_Gap] = []
    for gap, damage in gaps:
        if gap.missing:  # nothing of it is left to tell whose records it held
            unexplained.append(gap)
            continue
        owner = _owner(gap, damage, frames, live | done, run_ids - set(incompatible))
        if owner is None:
            unexplained.append(gap)
            continue
        run_id, seq = owner
        if not any(h.seq == seq and not h.at_tail for h in hits.get(run_id, [])):
            hits[run_id].append(_Hit(seq, gap.place, False, gap.number))  # its id was hit
    layout = loaded.layout
    # Segments the manifest pins that are no longer in wal/ (below its highest segment: the
    # next host numbers its own after that one): nothing read says whose records they held,
    # so every held Run keeps them pinned, and a copy put back is read again.
    present, highest = set(loaded.segment_numbers), max(loaded.segment_numbers, default=0)
    # Not a foreign one: a stray file under a segment's name is pinned too (and said as
    # what it is); an empty or cut-short one is pinned only once a start held Runs for it.
    wiped = {scan.number: scan for scan in scans if scan.status in ("empty", "torn_header")}
    gone_pinned = set() if loaded.manifest is None else {
        n for n in loaded.manifest.pinned if (n not in present or n in wiped) and n < highest}
    # Every Run read still takes part in telling whose frame damaged bytes were (_owner).
    for run_id in sorted(run_ids) if only is None else [only] if only in run_ids else []:
        if run_id in incompatible:
            loaded.journals[run_id] = RunJournal(run_id, None, "incompatible",
                                                 incompatible[run_id])
            loaded.dirty.add(run_id)
            loaded.evidence[run_id] = (incompatible_in[run_id]
                                       | {scan.number for scan, _ in frames.get(run_id, [])})
            continue
        run_frames = frames.get(run_id, [])
        snap = live.get(run_id) or done.get(run_id)
        snap_damage: str | None = None
        bad = damaged_snaps.get(snapshot_name(run_id))
        if bad is not None:
            loaded.held.add(run_id)
            snap_damage = f"{_rel(layout, bad.path)} {bad.fact}"
        # Its records start after seq 1, or in a pinned segment before ``start``: the Run
        # may have ended in segments this read passes over, its done/ snapshot the only
        # record of that (read from the pinned segment alone, it would look unfinished).
        if snap is None and mode == "restore" and run_frames and (
                run_frames[0][1].seq > 1 or run_frames[0][0].number < loaded.start):
            snap, done_damage = _read_done(loaded, run_id)
            snap_damage = done_damage or snap_damage
            if snap is None and run_frames[0][0].number < loaded.start:
                # Its done/ file damaged or moved out: the records after the pinned segment
                # are in segments this read passes over, so it cannot tell whether, or
                # where, the Run ended. The whole log can.
                loaded.partial = True
        run_hits = hits.get(run_id, [])
        suspect = _gap_before(run_frames, snap, unexplained, loaded.manifest)
        journal = _judge(loaded, run_id, run_frames, snap, run_hits, mode, suspect, snap_damage,
                         unexplained, _held if payloads is None else payloads)
        if journal is None:
            continue
        behind = sorted({scan.number for scan, _ in run_frames if scan.number in bad_headers})
        if journal.status == "ok" and behind:
            seqs = [frame.seq for scan, frame in run_frames if scan.number == behind[0]]
            journal = RunJournal(
                run_id, journal.state, "corrupt",
                f"Run {run_id}: its records {seqs[0]}..{seqs[-1]} are in {bad_headers[behind[0]]}: "
                "a segment whose header does not check out is never resumed from, though "
                "those records' own checksums are valid (intloom inspect shows them)",
                reached=max(frame.seq for _, frame in run_frames))
        sealed_off = after_seal.get(run_id)
        if sealed_off and (journal.status == "ok" or not run_frames):
            scan, frame = sealed_off[0]
            journal = RunJournal(
                run_id, journal.state, "corrupt",
                f"Run {run_id}: its record at {_at(scan, frame)} follows that segment's seal "
                f"(which ends at offset {scan.sealed_end}): a writer never appends after "
                "sealing, so the segment was altered after it was closed and where the Run "
                "got to cannot be known (intloom inspect shows the records)",
                reached=max(_seq(journal), *(f.seq for _, f in sealed_off)))
        if sealed_off:
            run_hits = [*run_hits, *(_Hit(f.seq, _where(s, f.offset), False, s.number)
                                     for s, f in sealed_off)]
        named = _named_by_odd_void(run_frames, odd_voids)
        if named is not None and journal.status == "ok":
            (scan, frame), (by, notice_frame) = named
            journal = RunJournal(
                run_id, journal.state, "corrupt",
                f"Run {run_id}: its record at {_at(scan, frame)} is in bytes that the void "
                f"notice at wal/{by.name} offset {notice_frame.offset} voids, a notice no writer "
                "writes there: "
                "whether those records or the notice are the damage cannot be known, so the "
                "Run is not resumed (intloom inspect shows the records)",
                reached=max(f.seq for _, f in run_frames))
            run_hits = [*run_hits, _Hit(frame.seq, _where(scan, frame.offset), False,
                                        by.number)]
        # Segments a start no longer reads (below the manifest's start) may hold records a
        # newer intloom wrote: the snapshot it then wrote of the Run says so.
        writers = {scan.header.package_version for scan, _ in run_frames
                   if scan.header is not None and scan.header.package_version}
        if snap is not None and snap.writer:
            writers.add(snap.writer)
        if writers:
            journal.written_by = newest_version(writers)
        loaded.journals[run_id] = journal
        covered = snap.seq if snap is not None else 0
        if (mode == "restore" and _ended(journal) and run_id not in loaded.held
                and (snap is None or run_id in live)):
            # An ended Run a start would snapshot into done/ (read from the log, or a live
            # snapshot that could not move): a file already there is never written over
            # when it is damaged, nor rewritten when it already says the same.
            ended, _ = _read_done(loaded, run_id)
            if ended is not None and ended.status == "ok" and ended.seq >= _seq(journal):
                covered = max(covered, ended.seq)
            if run_id in live and run_id not in loaded.held:
                loaded.dirty.add(run_id)  # an ended Run's live copy has to go
        if _lost_snapshot(loaded, run_id, journal, run_frames):
            loaded.dirty.add(run_id)  # found in the log: a new snapshot is written for it
        if _unfinished_fold(snap) < FOLD_VERSION:
            loaded.dirty.add(run_id)  # a snapshot of this fold replaces it
        own_verdict = journal.status != "ok" and (snap is None or snap.status == "ok")
        if own_verdict or any(scan.number in unsummarised and frame.seq > covered
                              for scan, frame in run_frames):
            loaded.dirty.add(run_id)
        evidence = {scan.number for scan, _ in run_frames} | {h.number for h in run_hits}
        if suspect is not None and journal.status != "ok":
            evidence.add(suspect.number)
        if journal.status != "ok":
            evidence |= loaded.gone.get(run_id, set()) | gone_pinned
        loaded.evidence[run_id] = evidence
    _gone_pinned(loaded, gone_pinned, wiped)
    if only is None:
        _unnamed_snapshots(loaded, run_ids)
        _live_snapshots_gone(loaded, run_ids)
    else:
        # Another Run's damaged snapshot is that Run's finding (start and doctor give it):
        # this read left that Run's segments unread, so anything it said of it would guess
        # (that no record names the Run, say).
        mine = snapshot_name(only)
        theirs = {_rel(loaded.layout, exc.path) for exc in loaded.snapshot_errors
                  if exc.path.name != mine}
        loaded.files = [f for f in loaded.files if f.path not in theirs]


def _live_snapshots_gone(loaded: Loaded, run_ids: set[str]) -> None:
    """Report ``live/`` snapshots the manifest relied on that are gone with every other
    trace of their Runs. A snapshot gone whose Run the log still holds is that Run's own
    finding (``_lost_snapshot``); one whose Run's records were in a segment damaged since
    left nothing that names the Run, and the Run vanished without a word.

    Every name the manifest counted is, unless a file was lost, still in ``live/``, or in
    ``done/`` (its Run ended and a compaction moved it), or a Run the log names (segments
    are never removed): more names counted than all of those together is proof of a loss.
    A compaction cut short leaves fewer ``live/`` files only for Runs ``done/`` holds."""
    manifest = loaded.manifest
    if manifest is None or manifest.live is None:
        return
    live = loaded.live_names
    if live_set(live) == manifest.live:
        return
    known = live | {snapshot_name(run_id) for run_id in run_ids}
    if manifest.live.count <= len(known):
        return
    try:
        done = list_names(loaded.layout.done)
    except IntloomError:  # reported where done/ is read; unread, it proves no loss
        return
    known |= {name for name in done if is_snapshot_name(name)}
    gone = manifest.live.count - len(known)
    if gone <= 0:
        return
    them, runs, it, its = (("1 snapshot is", "its Run", "it", "its") if gone == 1 else
                           (f"{gone} snapshots are", "their Runs", "them", "their"))
    loaded.files.append(FileProblem(
        "snap/live", "missing",
        f"holds {len(live)} snapshot{'' if len(live) == 1 else 's'}, where the manifest "
        f"(written {manifest.updated_at or 'at an unknown time'}) relied on "
        f"{manifest.live.count}: at least {them} gone with every trace of {runs} (no record "
        f"in the log and no file in snap/done/ names {it}: the segments that held {its} "
        f"records are damaged or missing), so {runs} {'is' if gone == 1 else 'are'} neither "
        "restored nor held; copy back only the files missing from snap/live/ (cp -n from a "
        "copy made before the damage: an older copy of a file still there would roll its "
        f"Run back), or the segments that held {its} records"))


def _named_by_odd_void(run_frames: list[tuple[SegmentScan, Frame]],
                       odd_voids: list[tuple[SegmentScan, Frame, VoidNotice]],
                       ) -> tuple[tuple[SegmentScan, Frame], tuple[SegmentScan, Frame]] | None:
    """The Run's first record in bytes a notice a writer does not write would void, and
    that notice's segment and frame; None when there is none."""
    if not odd_voids:
        return None
    for scan, frame in run_frames:
        for by, notice_frame, notice in odd_voids:
            if scan.number == notice.segment and frame.offset >= notice.offset:
                return (scan, frame), (by, notice_frame)
    return None


def _after_seal(loaded: Loaded, scan: SegmentScan, cut: int | None,
                after_seal: dict[str, list[tuple[SegmentScan, Frame]]]) -> None:
    """Report the valid frames that follow a segment's seal, and collect its records by Run.

    A writer seals a segment last (at a close, or once a rotation's next segment exists)
    and never writes to it again: frames there, their crcs valid or not, are corruption
    ("anything after a seal"). Read as records, they moved a Run on past what its host
    wrote, and only reads of that segment saw them."""
    if not scan.sealed_end:
        return
    late = [f for f in scan.frames if f.offset >= scan.sealed_end]
    if not late:
        return
    loaded.problem_segments.add(scan.number)
    loaded.files.append(FileProblem(
        f"wal/{scan.name}", "corrupt",
        f"{len(late)} valid frame(s) follow its seal (the first at offset {late[0].offset}, "
        f"the seal ending at offset {scan.sealed_end}): a writer never appends after sealing; "
        "they are not read as records and the file was left as it is"))
    for frame in late:
        if frame.kind == KIND_RECORD and (cut is None or frame.offset < cut):
            after_seal[frame.run_id].append((scan, frame))


def _unnamed_snapshots(loaded: Loaded, run_ids: set[str]) -> None:
    """Restate the finding of a damaged snapshot that no Run of the log is named by: its
    name is a digest of a run id, so with the Run's records gone from the log (segments
    deleted below the manifest's start) nothing read names that Run. "Every segment was read
    instead" would then claim a fallback that found nothing: the Run is neither restored nor
    held, and this file is the only trace of it."""
    known = {snapshot_name(run_id) for run_id in run_ids}
    orphans = {_rel(loaded.layout, exc.path): exc for exc in loaded.snapshot_errors
               if exc.path.name not in known}
    if not orphans:
        return
    loaded.files = [
        FileProblem(
            f.path, f.kind,
            f"{orphans[f.path].fact}; no record in the log names the Run it summarised (the "
            "segments that held its records are gone), so that Run is neither restored nor "
            "held, and this file, left as it is, is its only trace: put back a copy of it "
            "from before the damage, or the segments that held the Run's records")
        if f.path in orphans and f.kind in ("corrupt", "incompatible") else f
        for f in loaded.files
    ]


def _closing_segment_lost(manifest: Manifest, numbers: list[int]) -> bool:
    """Whether ``manifest``, ahead of the log whose segments are ``numbers``, is what a clean
    close wrote before the segment it closed was lost: ``open`` 0 (a close), and only that
    segment, ``start - 1``, missing past the log's last one. A start further ahead is damage
    (no host skips numbers that way), as is any manifest a host wrote while writing."""
    return (manifest.open == 0 and manifest.start >= 2
            and manifest.start == max(numbers, default=0) + 2)


# A segment file with nothing of a segment left to read, as each is said.
_WIPED: Final = {
    "empty": "has 0 bytes",
    "torn_header": "ends inside its file header",
    "foreign": "does not start with the intloom segment marker (overwritten: zeros, or "
               "another file)",
}


def _lost(loaded: Loaded, scans: list[SegmentScan],
          gaps: list[tuple[_Gap, Damage]]) -> None:
    """Segments a host created that are gone: named by the manifest as the one its writer
    had open, or by a seal as the one its rotation created first (each was durable before
    the file naming it was written). Each is a file finding, stays pinned, and stands as a
    gap where any Run's next record may be (``_gap_before``), in log order with the others.

    A gone segment nothing names (the manifest damaged, a seal that failed) is not seen.

    So is one that is there with none of its bytes left to read (empty, its header cut
    short, or overwritten: zeros, another file): a crash leaves such a file only while
    creating a segment, before anything names it; named, it had been written, and read as
    a harmless torn file it rolled its Runs back to their records before it."""
    present = set(loaded.segment_numbers)
    wiped = {scan.number: scan for scan in scans if scan.status in _WIPED}
    named: dict[int, str] = {}
    manifest = loaded.manifest
    if manifest is not None and manifest.open and (manifest.open not in present
                                                   or manifest.open in wiped):
        named[manifest.open] = "manifest.json names it as the segment its host was writing"
    # Below the manifest's start, as a bounded read sees it even when this read takes the
    # whole log (a live/ snapshot moved aside, a verify): every Run's records there are in
    # its snapshot, or its loss was accepted by moving that snapshot aside. The seal before
    # a lost segment stays readable (pinned), and would hold that Run again at every start.
    floor = manifest.start if manifest is not None else loaded.start
    for scan in scans:
        number = scan.next_segment
        if number and (number not in present or number in wiped) and number >= floor:
            named.setdefault(number, f"wal/{scan.name} was sealed once it had been created")
    for number, why in sorted(named.items()):
        path = f"wal/{segment_name(number)}"
        found = wiped.get(number)
        if found is not None:
            # Said once, as what it is: read alone it was called torn ("not corruption").
            loaded.files = [f for f in loaded.files if f.path != path]
            loaded.lost.add(number)
            loaded.problem_segments.add(number)
            loaded.files.append(FileProblem(
                path, "missing",
                f"holds none of its records: it {_WIPED[found.status]}, yet a host had "
                f"written it ({why}, after its header was durable). The records it held are "
                "lost, so every unfinished Run whose next record it may hold is held; put it "
                "back from a copy if there is one (the file is kept as it is)"))
            gaps.append((_Gap(number, 0, path, path, missing=True,
                              gone="holds none of its records"),
                         Damage(0, 0, False, False)))
            continue
        if os.path.lexists(loaded.layout.wal / segment_name(number)):
            # Created after this read listed wal/: a host running beside a read-only one
            # (doctor, inspect) rotated meanwhile. Not lost; newer than this read, as any
            # segment created since.
            continue
        loaded.lost.add(number)
        loaded.problem_segments.add(number)
        loaded.files.append(FileProblem(
            path, "missing",
            f"is missing, and a host created it ({why}): the records it held are lost with "
            "it, so every unfinished Run whose next record it may hold is held; put it back "
            "from a copy if there is one (intloom never removes a segment)"))
        gaps.append((_Gap(number, 0, path, path, missing=True), Damage(0, 0, False, False)))
    gaps.sort(key=lambda entry: (entry[0].number, entry[0].offset))


def _gone_pinned(loaded: Loaded, gone_pinned: set[int], wiped: dict[int, SegmentScan]) -> None:
    """Name the segments an earlier start pinned that are still gone (a lost segment, or one
    that may have held a held Run's records), while a Run is held for them: that Run's
    snapshot holds it, and its evidence keeps them pinned. One finding per run of
    consecutive numbers (a jump in a Run's seqs pins up to 256, some never files).

    With no Run held, nothing is lost: the number was pinned for a file with nothing of a
    Run's in it (a foreign file under a segment's name, moved out as advised), and the next
    host's manifest no longer pins it.

    One there with none of its bytes left to read (``wiped``: the start that pinned it held
    its Runs for it, ``_lost``) is named as the start that pinned it named it, not as a
    harmless torn file."""
    if not any(j.status == "corrupt" for j in loaded.journals.values()):
        return
    for number in sorted((gone_pinned & wiped.keys()) - loaded.lost):
        path = f"wal/{segment_name(number)}"
        loaded.files = [f for f in loaded.files if f.path != path]
        loaded.files.append(FileProblem(
            path, "missing",
            f"holds none of its records: it {_WIPED[wiped[number].status]}, and a restore "
            "must read it (an earlier start pinned it: it held, or may have held, records of "
            "Runs held for it); put it back from a copy if there is one (the file is kept as "
            "it is)"))
    gone = sorted(gone_pinned - loaded.lost - wiped.keys())
    for _, numbers in itertools.groupby(enumerate(gone), lambda e: e[1] - e[0]):
        run = [n for _, n in numbers]
        more = (f", as are the {len(run) - 1} numbers after it up to "
                f"wal/{segment_name(run[-1])}" if len(run) > 1 else "")
        loaded.files.append(FileProblem(
            f"wal/{segment_name(run[0])}", "missing",
            f"is missing{more}, and a restore must read it (an earlier start pinned it: it "
            "held, or may have held, records of Runs held for it); put it back from a copy "
            "if there is one (intloom never removes a segment)"))


def _lost_snapshot(loaded: Loaded, run_id: str, journal: RunJournal,
                   frames: list[tuple[SegmentScan, Frame]]) -> bool:
    """Report an unfinished Run whose ``live/`` snapshot is gone, if this one is: it has
    records in a segment the manifest no longer names (before ``start``, not pinned), so
    that manifest was written after a snapshot of it, and no file of it is in ``live/``.
    Without a full read a restore would not have seen the Run at all.

    A Run with a file in ``done/`` ended, and its snapshot is there, even when the log's
    copy of it does not verify (damage in history that snapshot covers, itself reported)."""
    manifest = loaded.manifest
    name = snapshot_name(run_id)
    if manifest is None or name in loaded.live_names or _ended(journal):
        return False
    if os.path.lexists(loaded.layout.done / name):
        return False
    pinned = set(manifest.pinned)
    below = sorted({scan.number for scan, _ in frames
                    if scan.number < manifest.start and scan.number not in pinned})
    if not below:
        return False
    loaded.files.append(FileProblem(
        f"snap/live/{name}", "missing",
        f"Run {run_id} has records in wal/{below[-1]:010d}.seg, which the manifest "
        f"(start {manifest.start}) leaves to its snapshot; the Run was read from the whole "
        "log instead, and a start writes its snapshot again (find out what removed the file: "
        "intloom never does)"))
    return True


def _seq(journal: RunJournal) -> int:
    return journal.state.seq if journal.state is not None else 0


def _ended(journal: RunJournal) -> bool:
    return (journal.status == "ok" and journal.state is not None
            and journal.state.phase == "terminal")


def _read_done(loaded: Loaded, run_id: str) -> tuple[Snapshot | None, str | None]:
    """A restore's look at one Run's ``done/`` snapshot: the snapshot (None when absent or
    unusable) and, when the file is damaged, what is wrong with it. A damaged file is
    reported, and its Run is held: nothing may write over the file, and its segments stay
    read (pinned) so the log keeps standing in for it."""
    layout = loaded.layout
    try:
        snap = read_snapshot(layout.done / snapshot_name(run_id))
    except SnapshotError as exc:
        rel = _rel(layout, exc.path)
        loaded.snapshot_errors.append(exc)
        loaded.files.append(FileProblem(
            rel, "incompatible" if exc.incompatible else "corrupt",
            f"{exc.fact}; the Run's records are read from the log instead and the file was "
            f"left as it is ({_snapshot_fix(exc)})"))
        loaded.held.add(run_id)
        return None, f"{rel} {exc.fact}"
    loaded.stats.snapshots_read += snap is not None
    return snap, None


# Missing segment numbers one gap in a Run's seqs pins, at most (half at each end of it). A
# stray file named with a high number makes the next host number its segments after it, so
# the numbers below it were never files: pinned, they would swell every manifest.
_MAX_GONE: Final = 256


def _gone(loaded: Loaded, after: int, before: int) -> set[int]:
    """Numbers of the segments missing from wal/ that may have held a Run's records lost
    between its record in segment ``after`` (-1: none was read, and its snapshot covers
    what came before the segments this read takes whole) and its next one, in ``before``.
    A host numbers a new segment after the highest in wal/, so a number missing below one
    was a file: a segment (or a stray file under its name; pinning its number costs nothing).
    At most ``_MAX_GONE``: those nearest each end of the gap."""
    present = set(loaded.segment_numbers)
    lowest = max(after if after >= 0 else loaded.start, 1)
    up = (n for n in range(lowest, before) if n not in present)
    down = (n for n in range(before - 1, lowest - 1, -1) if n not in present)
    half = _MAX_GONE // 2
    return set(itertools.islice(up, half)) | set(itertools.islice(down, half))


def _owner(gap: _Gap, damage: Damage, frames: dict[str, list[tuple[SegmentScan, Frame]]],
           snaps: dict[str, Snapshot], run_ids: set[str]) -> tuple[str, int] | None:
    """The Run and seq whose one frame the damaged bytes provably are, if any.

    Either the frame's own crc checks out once its header is rebuilt for a Run's next
    record (the damage is in the header: run id, seq, length...), or the header read there
    is consistent: it claims Run R's next record, R has no valid copy of it, and its length
    ends exactly where the damage does (the damage is in the payload). Anything less leaves
    the owner unknown, and every Run that may have had a record there is suspect.
    """
    pos = (gap.number, gap.offset)

    def next_seq(run_id: str) -> int:
        snap = snaps.get(run_id)
        seq = snap.seq if snap is not None else 0
        for scan, frame in frames.get(run_id, []):
            if (scan.number, frame.offset) < pos:
                seq = max(seq, frame.seq)
        return seq + 1

    if damage.raw and len(damage.raw) * len(run_ids) <= _MAX_CRC_TRIALS:
        for run_id in sorted(run_ids):
            seq = next_seq(run_id)
            if rebuilt_payload(damage.raw, seq, run_id) is not None:
                return run_id, seq
    if len(damage.candidates) == 1:
        (cand,) = damage.candidates
        if (cand.offset == damage.start and cand.claimed_end == damage.end
                and cand.run_id in run_ids and cand.seq == next_seq(cand.run_id)
                and all(f.seq != cand.seq for _, f in frames.get(cand.run_id, []))):
            return cand.run_id, cand.seq
    return None


def _gap_before(frames: list[tuple[SegmentScan, Frame]], snap: Snapshot | None,
                gaps: list[_Gap], manifest: Manifest | None) -> _Gap | None:
    """The first damage that may hold this Run's next record, if any.

    A Run with a valid frame after the damage would show a lost record as a seq gap. An ok
    snapshot taken after the damaged segment was complete covers every record the Run had
    in it (the damage may only hide a copy of one).
    """
    last = (frames[-1][0].number, frames[-1][1].offset) if frames else None
    for gap in gaps:
        if last is not None and (gap.number, gap.offset) < last:
            continue
        if snap is not None and snap.status == "ok" and (
            snap.segment > gap.number or (manifest is not None and gap.number < manifest.start)
        ):
            continue
        return gap
    return None


def _held(scan: SegmentScan, frame: Frame) -> bytes:
    """A record's payload, held since its segment was read."""
    return frame.payload


def _judge(loaded: Loaded, run_id: str, frames: list[tuple[SegmentScan, Frame]],
           snap: Snapshot | None, hits: list[_Hit], mode: Mode, gap: _Gap | None,
           snap_damage: str | None, gaps: list[_Gap],
           payload: Callable[[SegmentScan, Frame], bytes]) -> RunJournal | None:
    # A corrupt snapshot without ``reached`` was written before it existed: how far its Run
    # got is not known, so its verdict stands, as an incompatible one's does.
    rejudged = snap is not None and snap.status == "corrupt" and snap.reached > 0
    if (snap is not None and snap.status != "ok" and not rejudged
            and not (mode == "verify" and frames and frames[0][1].seq == 1)):
        return RunJournal(run_id, snap.state, snap.status, snap.problem, reached=snap.reached)
    # A corrupt Run's snapshot holds its fold up to its last good record, and the segments
    # after that stay pinned: the log past it is judged again at every read rather than the
    # old verdict trusted, so a damaged file put back from a copy restores the Run (the
    # error's own advice), and damage still there is found again. It is trusted only once
    # the read reaches ``reached``: a copy that ends earlier proves nothing past its end.
    fold = _unfinished_fold(snap)
    if fold > FOLD_VERSION and snap is not None:
        # Folded by a newer intloom: what it derived, this one may not know how to act on.
        return RunJournal(
            run_id, snap.state, "incompatible",
            f"its snapshot (snap/live/{snapshot_name(run_id)}) was written by a newer intloom "
            f"(fold {fold}; this intloom's is {FOLD_VERSION}); continue or end the Run with "
            "the intloom that wrote it, or upgrade intloom")
    # Folded by an older intloom, which did not derive every field a restart decides by
    # (FOLD_FIELDS): folded again from the log, which holds every record (intloom never
    # removes a segment), when the read gives it from its first record.
    from_scratch = snap is None or (
        (mode == "verify" or fold < FOLD_VERSION) and bool(frames) and frames[0][1].seq == 1)
    if fold < FOLD_VERSION and not from_scratch and mode == "restore" and snap is not None:
        # Its first records are gone or damaged: going on from the snapshot would trust
        # the defaults it says for what a restart decides by (a recover's effect: called
        # again), and a snapshot written now would stamp them this fold's.
        if snap.status == "corrupt":  # held already: its own verdict says why
            return RunJournal(run_id, snap.state, "corrupt", snap.problem,
                              reached=snap.reached)
        first = frames[0][1].seq if frames else snap.seq + 1
        return RunJournal(
            run_id, snap.state, "incompatible",
            f"its snapshot (snap/live/{snapshot_name(run_id)}) was written by an older "
            f"intloom (fold {fold}; this intloom's is {FOLD_VERSION}), which did not record "
            "all that a restart decides by, and the log cannot fold it again: its records "
            f"1..{first - 1} are missing or damaged there (intloom verify says where); put "
            "back the segments that held them, or continue or end the Run with the intloom "
            "that wrote the snapshot")
    state: RunState | None = None if from_scratch or snap is None else snap.state
    covered = 0 if snap is None else snap.seq
    expected = 1 if from_scratch else covered + 1
    problem: str | None = None
    by_seq = {h.seq: h for h in hits if not h.at_tail}
    previous = (-1, -1)
    # The covered records read: each is in the log once, in a segment no later than the one
    # open when the snapshot was written. Any other copy (a segment copied in, or from
    # another project) was skipped as summarised, and the Run restored from the snapshot
    # over two histories; a corrupt Run's snapshot, judged again, forgave its own duplicate.
    summarised: set[int] = set()
    last_covered = snap.segment if snap is not None and snap.segment else None

    for scan, frame in frames:
        seq = frame.seq
        if seq < expected:
            if not from_scratch and seq <= covered:
                if last_covered is not None and scan.number > last_covered:
                    problem = (f"record {seq}, which its snapshot covers (written while "
                               f"wal/{segment_name(last_covered)} was open), appears again "
                               f"in a later segment, at {_at(scan, frame)}")
                    break
                if seq not in summarised:
                    summarised.add(seq)
                    continue  # already summarised by the snapshot
            problem = f"record {seq} appears twice (again at {_at(scan, frame)})"
            break
        if seq > expected:
            hit = by_seq.get(expected)
            if hit is not None:
                problem = (f"record {expected} at {hit.where} fails its checksum; "
                           f"the Run continues at {_at(scan, frame)}")
            else:
                pos = (scan.number, frame.offset)
                between = [g.said for g in gaps if previous < (g.number, g.offset) < pos]
                lost = (f"{between[0]} may have held them" if between
                        else "they were lost in damaged bytes or in a segment that is gone")
                loaded.gone.setdefault(run_id, set()).update(
                    _gone(loaded, previous[0], scan.number))
                problem = (f"records {expected}..{seq - 1} are missing before "
                           f"{_at(scan, frame)}: {lost}")
            break
        loaded.stats.records_decoded += 1
        try:
            record: Record = decode_record(payload(scan, frame))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            problem = f"record at {_at(scan, frame)} does not decode ({exc})"
            break
        if type(record) is Header:
            if record.run_id != run_id:
                problem = f"record at {_at(scan, frame)} is the header of Run {record.run_id}"
                break
            if record.format != FORMAT_VERSION:
                return RunJournal(run_id, None, "incompatible",
                                  f"its header at {_at(scan, frame)} "
                                  f"{format_problem(record.format)}")
        try:
            state = apply(state, record)
        except IllegalTransition as exc:
            problem = (f"record at {_at(scan, frame)} ({exc.got}) cannot follow "
                       f"{exc.previous or 'the start of the journal'}: {exc.why}")
            break
        expected += 1
        previous = (scan.number, frame.offset)
        if (from_scratch and snap is not None and seq == snap.seq and snap.state != state
                and not _older_fold(snap, state)):
            problem = (f"its snapshot ({snapshot_name(run_id)}) disagrees with the log at "
                       f"{_at(scan, frame)}")
            break

    torn = False
    if problem is None:
        for hit in hits:
            if hit.seq < expected:
                continue  # a stale copy of a record already read (or summarised)
            if hit.at_tail:
                torn = True
            else:
                problem = (f"record {hit.seq} at {hit.where} fails its checksum; "
                           "it is the last trace of this Run in the log")
                break
    if (problem is None and mode == "verify" and not from_scratch and snap is not None
            and snap.status == "ok" and snap.seq > 0):
        # Old segments are never deleted: a snapshot is a summary of records the log holds.
        first = frames[0][1].seq if frames else snap.seq + 1
        missing = min(first - 1, snap.seq)
        where = ("are gone or cut short; intloom never removes them" if not loaded.unread
                 else "are gone, cut short, or among those not read: " + ", ".join(
                     f"wal/{segment_name(n)}" for n in loaded.unread) + " (see its finding)")
        problem = (f"records 1..{missing} are missing from the log: only its snapshot "
                   f"({snapshot_name(run_id)}) summarises them (the segments that held them "
                   f"{where})")
        # One of them is there, damaged: "missing ... gone or cut short" sent the user
        # looking for a segment that is in its place.
        damaged = next((h for h in hits if h.seq <= missing and not h.at_tail), None)
        if damaged is not None:
            problem = (f"record {damaged.seq} at {damaged.where} fails its checksum (its "
                       f"snapshot, {snapshot_name(run_id)}, summarises records 1..{missing})")
    if (problem is None and from_scratch and snap is not None and snap.status == "ok"
            and expected - 1 < snap.seq):
        problem = (f"the log ends at record {expected - 1} but its snapshot "
                   f"({snapshot_name(run_id)}) covers record {snap.seq}")
    maybe = 0  # a record the damaged bytes may have held
    gone: str | None = None  # the segment a Run is held for alone (RunJournal.lost)
    if (problem is None and gap is not None and state is not None
            and state.phase != "terminal"):
        maybe = state.seq + 1
        gone = gap.place if gap.missing else None
        after = "no later record of it is left" if gap.missing else (
            "no record of it follows them")
        problem = (f"{gap.said} may have held its record {state.seq + 1}: {after} (its last "
                   f"readable record is seq {state.seq}), so where it stopped cannot be known")
    if (problem is None and snap is not None and snap.status == "corrupt"
            and expected - 1 < snap.reached):
        # The read stops short of where the Run was seen to get: the damaged bytes, or what
        # followed them, are not there to judge (a segment removed, or put back from a copy
        # older than they are). Absence proves nothing, so the Run stays held.
        return RunJournal(run_id, snap.state, "corrupt", snap.problem, reached=snap.reached,
                          lost=gap.place if gap is not None and gap.missing else None)
    if problem is None and state is None:
        if torn and not frames:
            return None  # its first records were torn by a crash: it never became visible
        problem = "no usable record: the Run's first record is missing"
    if problem is not None:
        if snap_damage is not None:
            problem = f"its snapshot {snap_damage}, and the log cannot stand in for it: {problem}"
            gone = None  # a damaged snapshot is a loss of its own, which moving it hides
        # A damaged frame's seq is what its bytes claim, and the damage may be in the seq
        # itself: only a claim up to one past the furthest valid record counts (the damaged
        # record between two good ones, or after the last one), or a read could never
        # reach it.
        furthest = max([expected - 1, *(f.seq for _, f in frames)])
        reached = max([maybe, furthest, snap.reached if snap is not None else 0,
                       *(h.seq for h in hits if not h.at_tail and h.seq <= furthest + 1)])
        return RunJournal(run_id, state, "corrupt", f"Run {run_id}: {problem}", reached=reached,
                          lost=gone)
    return RunJournal(run_id, state, "ok", None, torn_tail=torn)


def _report(loaded: Loaded, *, include_terminal: bool) -> StoreReport:
    runs = [
        j for j in loaded.journals.values()
        if include_terminal or j.status != "ok" or j.state is None
        or j.state.phase != "terminal"
    ]
    return StoreReport(runs=runs, files=list(loaded.files), stats=loaded.stats)


def read_runs_report(runtime_dir: Path, *, shared: SharedRead | None = None) -> StoreReport:
    """``read_runs`` with file findings and read costs (``shared``: see ``load``)."""
    return _report(load(runtime_dir, "restore", shared=shared), include_terminal=False)


def read_runs(runtime_dir: Path) -> list[RunJournal]:
    """Every unfinished Run, and every corrupt or incompatible one. Read-only.

    Terminal Runs are not returned (they are kept for ``inspect``, never restored); use
    ``verify`` to see them.
    """
    return read_runs_report(runtime_dir).runs


def read_ended(runtime_dir: Path, run_id: str) -> RunJournal | None:
    """An ended Run as its ``done/`` snapshot holds it: all a start knows of it (that it
    ended; it is never loaded). None without a usable snapshot there. Read-only."""
    try:
        snap = read_snapshot(Layout(runtime_dir).done / snapshot_name(run_id))
    except SnapshotError:
        return None  # reported by verify; a start does not read it either
    if snap is None or snap.run_id != run_id:
        return None
    return RunJournal(run_id=run_id, state=snap.state, status=snap.status, problem=snap.problem)


def verify_report(runtime_dir: Path) -> StoreReport:
    """Every Run judged from the whole log, snapshots cross-checked, whole-file findings."""
    return _report(load(runtime_dir, "verify"), include_terminal=True)


def verify_run(runtime_dir: Path, run_id: str, *,
               shared: SharedRead | None = None) -> StoreReport:
    """``verify_report`` for one Run (``inspect RUN``): its verdict as the whole verify gives
    it, with the findings of what it read, at the cost of that Run's segments, not the log's.

    An ended Run is judged from the segments holding its id and its ``done/`` snapshot;
    an unfinished one also from every segment after them (its next record may be in damage
    there). A Run that is not then found sound is judged by the whole verify instead, whose
    findings it returns: whose frame damaged bytes were can depend on other Runs' records
    anywhere in the log, and a verdict against this Run must be the one ``verify`` gives.
    Each of those reads shares what the one before it read (``shared``, ``_Seen``): the
    store's snapshots were read once per read (three times for inspect of a waiting Run)."""
    return verify_run_scans(runtime_dir, run_id, shared=shared)[0]


def verify_run_scans(runtime_dir: Path, run_id: str, *, shared: SharedRead | None = None
                     ) -> tuple[StoreReport, list[SegmentScan] | None]:
    """``verify_run``, and the segments its report names (``segments``) as it scanned them,
    in order, each with only the Run's record frames and the void notices: what the Run's
    history is judged from (``history.scanned_history``) without reading them again. None
    when the whole verify judged the Run: it keeps no segment's payloads."""
    shared = shared if shared is not None else SharedRead(runtime_dir)
    seen = _Seen()
    for through_end in (False, True):
        loaded = load(runtime_dir, "verify", only=run_id, through_end=through_end,
                      shared=shared, seen=seen)
        journal = loaded.journals.get(run_id)
        if journal is None and not loaded.holding:
            # No segment holds its id and no snapshot names it: no Run of that id.
            return (StoreReport([], list(loaded.files), loaded.stats, loaded.segments_read),
                    _kept(seen, loaded, run_id))
        # Its last segment the log's last: this read went through the end already, and a
        # second one would read the same segments again (inspect of a live 180,000-record
        # Run read its segments three times, twice here).
        to_end = through_end or (bool(loaded.holding) and loaded.holding[-1]
                                 >= max(loaded.segment_numbers, default=0))
        if journal is not None and journal.status == "ok" and (to_end or _ended(journal)):
            return (StoreReport([journal], list(loaded.files), loaded.stats,
                                loaded.segments_read), _kept(seen, loaded, run_id))
        if journal is not None and journal.status != "ok":
            break  # found unsound already: reading on to the log's end would not settle it
    del seen, loaded  # the whole verify holds one Run's payloads at a time, not these
    whole = load(runtime_dir, "verify", shared=shared)
    return StoreReport([j for j in whole.journals.values() if j.run_id == run_id],
                       list(whole.files), whole.stats, whole.segments_read), None


def _kept(seen: _Seen, loaded: Loaded, run_id: str) -> list[SegmentScan] | None:
    """The scans ``loaded`` judged from (``verify_run_scans``), without other Runs' frames;
    None when one was not kept (a read again after a segment changed keeps none)."""
    scans = []
    for number in loaded.segments_read:
        kept = seen.scans.get(number)
        if kept is None:
            return None
        scan = kept[0]
        scan.frames = [f for f in scan.frames if f.kind == KIND_VOID
                       or (f.kind == KIND_RECORD and f.run_id == run_id)]
        scans.append(scan)
    return scans


def verify(runtime_dir: Path) -> list[RunJournal]:
    """Every Run (terminal ones too) judged from the whole log. Read-only."""
    return verify_report(runtime_dir).runs
