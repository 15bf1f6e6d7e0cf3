"""One Run's journal as ``intloom inspect`` shows it: its records and the store's verdict.

Read-only, and needs no host: the CLI reaches the store only through here.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import msgspec

from intloom.store import (
    FileProblem,
    HistoryEntry,
    RunJournal,
    SharedRead,
    StoreReport,
    histories,
    read_ended,
    read_history,
    read_runs_report,
    read_summary,
    scanned_history,
    verify_report,
    verify_run,
    verify_run_scans,
)
from intloom.store.files import Layout, read_file
from intloom.store.framing import segment_header

__all__ = ["RunRead", "read_journal", "read_run", "unreadable_snapshots", "verify_store",
           "written_by"]


def verify_store(runtime: Path) -> StoreReport:
    """Every journal and file of the store, judged (``intloom verify``)."""
    return verify_report(runtime)


def read_journal(runtime: Path, run_id: str, *, states: bool = True
                 ) -> tuple[list[HistoryEntry], RunJournal | None, list[FileProblem]]:
    """The Run's records in order (empty when it has none), its journal as the whole verify
    judges it, terminal Runs included (``read_runs`` judges only the ones a start
    restores), and the whole-file findings of what that read (``verify_run``: the Run's
    own segments and snapshot, the whole store when the Run is not sound). A Run whose
    records are all gone from the log but whose snapshot remains gets that snapshot as its
    one entry. ``states=False``: each record without its Stage State (None), which the
    text of ``inspect`` never shows: held, they made its memory ~2.4x the Run's records."""
    return _records(runtime, run_id, verify_run(runtime, run_id), states)


def _records(runtime: Path, run_id: str, report: StoreReport, states: bool
             ) -> tuple[list[HistoryEntry], RunJournal | None, list[FileProblem]]:
    """``read_journal`` from ``report``, the Run's ``verify_run``."""
    entries = read_history(runtime, run_id, segments=set(report.segments),
                           without=() if states else ("state",))
    if not entries:
        # No record in the log: a Run its snapshot still names lost its records (damage,
        # reported as such by verify); only a Run nothing names is unknown.
        entries = read_summary(runtime, run_id)
        if not entries:
            return [], None, []
    journal = next((j for j in report.runs if j.run_id == run_id), None)
    return entries, journal, list(report.files)


class RunRead(msgspec.Struct):
    """All ``inspect RUN`` reads of the store (``read_run``)."""

    # The Run's records as ``read_journal`` gives them, made again at each iteration from
    # the segments as they were read (never held: 380 MB for a 360,000-record Run); empty:
    # the Run has no journal.
    entries: Iterable[HistoryEntry]
    journal: RunJournal | None  # these two as ``read_journal`` gives them
    files: list[FileProblem]
    # The Run as the next start reads it (its snapshot and the log after it: what doctor
    # judges); for an ended Run, its ``done/`` snapshot (a start does not load it). None
    # when neither exists, or without entries. After a compaction this can differ from
    # ``journal``: damage in history that a snapshot covers stops nothing.
    restored: RunJournal | None
    missing: list[str]  # for a Run without entries, the segments gone (``_missing``)


def read_run(runtime: Path, run_id: str) -> RunRead:
    """``read_journal``, and the Run as a start reads it, from one read of the store
    (``SharedRead``): read apart, each judgement read every live/ snapshot again (inspect
    of one small Run among 5,000 waiting ones read them three times, 3.5 s). The Run's
    records are judged from the segments its verify scanned (``verify_run_scans``), not
    read again; only a Run the whole verify judged (not sound) has its segments read again
    for them."""
    shared = SharedRead(runtime)
    report, scans = verify_run_scans(runtime, run_id, shared=shared)
    restore = read_runs_report(runtime, shared=shared)
    del shared  # its snapshots are not held while the Run's records are read
    restored = next((j for j in restore.runs if j.run_id == run_id), None)
    missing = _missing(restore)
    del restore
    entries: Iterable[HistoryEntry] = (
        scanned_history(runtime, run_id, scans) if scans is not None
        else histories(runtime, run_id, segments=set(report.segments)))
    if next(iter(entries), None) is None:
        # No record in the log: a Run its snapshot still names lost its records (damage,
        # reported as such by verify); only a Run nothing names is unknown.
        entries = read_summary(runtime, run_id)
        if not entries:
            return RunRead([], None, [], None, missing)
    journal = next((j for j in report.runs if j.run_id == run_id), None)
    if restored is None:
        restored = read_ended(runtime, run_id)
    return RunRead(entries, journal, list(report.files), restored, [])


def _missing(restore: StoreReport) -> list[str]:
    """The segments the log names and that are gone (``missing`` findings), in order: a Run
    with no journal left may have had its records only there. What a start reads says it
    (the manifest, and the seals from its start on, as doctor reports them): a segment is
    named lost only from the manifest's start on, in a verify too, so the whole verify this
    was (every Run of the log judged: seconds on a large store, for an id that is nowhere)
    found no other."""
    return sorted(f.path for f in restore.files
                  if f.kind == "missing" and f.path.startswith("wal/"))


def unreadable_snapshots(runtime: Path, run_id: str) -> list[str]:
    """The snapshots named for ``run_id`` (live, then done) that are there and cannot be
    read, each as its path under the runtime directory and why: for a Run with no record
    in the log, the only trace left of it."""
    from intloom.store.snapshots import SnapshotError, read_snapshot, snapshot_name

    layout = Layout(runtime)
    found = []
    for directory in (layout.live, layout.done):
        try:
            read_snapshot(directory / snapshot_name(run_id))
        except SnapshotError as exc:
            found.append(f"{exc.path.relative_to(runtime)} {exc.fact}")
    return found


def written_by(runtime: Path, entries: Iterable[HistoryEntry]) -> str | None:
    """The host instance that wrote the Run's last readable record: the instance id in the
    header of the segment holding it. None when that record is not in a segment (only a
    snapshot summarises it) or the segment's header does not check out."""
    last = None
    for entry in entries:
        if entry.verdict == "ok" and entry.file.startswith("wal/"):
            last = entry
    if last is None:
        return None
    data = read_file(Layout(runtime).wal / last.file.removeprefix("wal/"))
    header = None if data is None else segment_header(data)
    return header.instance_id if header is not None else None
