"""Snapshotting Runs and advancing the manifest: what keeps restores from growing with age.

The order is what makes a crash at any point safe: snapshots first (terminal ones into
``done/``, then their ``live/`` copy removed), the manifest last. A crash before the
manifest moves leaves a restore reading more of the log than needed, never less.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Collection
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from intloom.errors import IntloomError
from intloom.fsutil import fsync_dir
from intloom.runtime.machine import FOLD_VERSION, IllegalTransition, RunState, apply
from intloom.runtime.records import Record
from intloom.store.files import (
    Layout,
    atomic_write_many,
    check_dir,
    list_names,
    read_own_file,
    unusable_file,
)
from intloom.store.framing import VoidNotice, segment_number
from intloom.store.reader import FileProblem, Status, snapshot_finding
from intloom.store.snapshots import (
    MANIFEST_FORMAT,
    Manifest,
    Snapshot,
    SnapshotError,
    decode_snapshot,
    encode_manifest,
    encode_snapshot,
    is_snapshot_name,
    live_set,
    manifest_ahead,
    read_manifest,
    read_snapshot,
    snapshot_name,
)

__all__ = ["FileId", "Track", "compact", "now"]


def now() -> str:
    return datetime.now(UTC).isoformat()


class Track:
    """What the writer knows of one Run: its last snapshot-able state and durable records since.

    Slots, not a ``msgspec.Struct``: every flush sets three of these attributes for each Run
    in it (``Store._track``), and CPython 3.11 never specialises an attribute store on a
    Struct (it has a ``__setattr__`` of its own): ~0.5 % of a Step (callgrind, 64 async Runs).
    """

    __slots__ = ("base", "dirty", "problem", "reached", "seq", "status", "tail")

    def __init__(self, base: RunState | None, seq: int, status: Status = "ok",
                 problem: str | None = None, reached: int = 0,
                 tail: list[Record] | None = None, dirty: bool = False) -> None:
        self.base = base
        self.seq = seq  # last durable seq
        self.status = status
        self.problem = problem
        self.reached = reached  # corrupt: the furthest seq seen of it (RunJournal.reached)
        self.tail: list[Record] = [] if tail is None else tail
        self.dirty = dirty

    def folded(self) -> tuple[RunState | None, Status, str | None]:
        """Fold the durable tail onto the base; a refused record makes the Run corrupt."""
        if self.status != "ok":
            return self.base, self.status, self.problem
        state = self.base
        for record in self.tail:
            try:
                state = apply(state, record)
            except IllegalTransition as exc:
                return state, "corrupt", f"Run: {exc}"
        return state, "ok", None


class NotSummarised(Exception):
    """``compact`` could not write ``what`` (``snapshots`` or ``manifest.json``): ``cause``
    says why. Nothing is lost by it (the manifest did not move past what the snapshots
    hold, so restores read more of the log), but the host says so in its log."""

    def __init__(self, what: str, cause: str, fix: str | None = None,
                 effect: str | None = None, errno: int | None = None) -> None:
        super().__init__(f"{what}: {cause}")
        self.what = what
        self.cause = cause
        self.fix = fix  # what to do, when it is not the disk's fault
        # What it costs, when not only a slower restore (the next start refuses the store).
        self.effect = effect
        self.errno = errno  # the OSError's, when one was the cause (ENOSPC: space or inodes)


def _cause(exc: OSError | IntloomError) -> str:
    if isinstance(exc, IntloomError):
        return exc.message
    return exc.strerror or str(exc)


def compact(layout: Layout, tracks: dict[str, Track], *, start: int, pinned: list[int],
            voids: list[VoidNotice], segment: int, held: Collection[str] = (),
            open_segment: int = 0, write_manifest: bool = True, at_once: bool = False,
            stop: threading.Event | None = None,
            kept: dict[str, FileProblem] | None = None, writer: str = "",
            written: dict[str, FileId] | None = None) -> None:
    """Snapshot every dirty Run, then point the manifest at segment ``start``.
    ``writer``: the package version of the intloom writing them (``Snapshot.writer``).

    ``write_manifest`` False: snapshots only; the manifest stays as it is (a host that
    judged it damaged keeps it byte-identical for its whole life, also once its own
    segments make it look consistent again).

    ``open_segment``: the segment the writer has created and appends to (the manifest's
    ``open``), 0 once it closed.

    Tracks are updated only once everything is durable, so a failure part-way leaves them
    able to try again. Terminal Runs leave ``tracks``: nothing more is written for them.
    A manifest that cannot be read is evidence and stays as it is: the manifest does not
    move then, and every restore reads the whole log, which needs no snapshot to be fresh.
    ``held``: Runs whose snapshot file is damaged. The manifest's live set leaves their files
    out (it relies on their pinned segments instead), so a restore after such a file is moved
    out stays bounded.

    ``at_once``: fsync many snapshot files together (``atomic_write_many``), for a host's
    open and close, when no Run waits on the disk meanwhile.

    ``stop``: once set, no further group of snapshot files is begun, and ``WritesStopped``
    is raised with the manifest and ``tracks`` as they were (a restore reads more of the log).

    ``kept``: filled with the files found unusable (a link, a FIFO, another owner's, open to
    others: planted while the host ran) and left exactly as they are, by Run for a snapshot
    (``manifest.json`` for the manifest, which is then not written). Such
    a Run's track stays as it was (dirty: each compaction looks again), and its file stays in
    the manifest's live set, so every restore reads the whole log (as for a damaged snapshot)
    until the file is moved out; the other Runs' snapshots are written.

    ``written``: the identity of each ``live/`` file this host wrote (kept up to date here),
    so that one changed since (damaged while the host ran) is kept as one planted is, not
    renamed over or unlinked. One it has no identity for is read first, and kept if it is
    damaged. A kept changed file may still read as a whole snapshot, an older one (a backup
    put back): the manifest's live set then names it as it cannot be found
    (``NAME~changed``), so that every restore reads the whole log, also once it is moved
    out, until a compaction writes that Run's snapshot again. None: no such check (a caller
    that writes no snapshot).

    Raises ``NotSummarised`` when a file could not be written.
    """
    refused: dict[str, FileProblem] = {} if kept is None else kept
    try:
        # Replaced while the host ran (a link to a directory elsewhere, a loose mode): every
        # write below goes by path, and would go through it.
        for directory in (layout.snap, layout.live, layout.done):
            check_dir(directory)
    except IntloomError as exc:
        raise NotSummarised("snapshots", _cause(exc), effect=(
            "No snapshot is written while it is so, and the next intloom start refuses the "
            "store until it is put right as the cause says (nothing is lost).")) from None
    try:
        folded = _snapshot_all(layout, tracks, segment, at_once, refused, stop, writer,
                               written)
        changed = folded[2]
    except (OSError, IntloomError) as exc:
        raise NotSummarised("snapshots", _cause(exc), errno=getattr(exc, "errno", None)) \
            from None
    try:
        if write_manifest:
            _write_manifest(layout, start=start, pinned=pinned, voids=voids, held=held,
                            open_segment=open_segment, stamp=folded[1], kept=refused,
                            changed=changed)
    except (OSError, IntloomError) as exc:
        raise NotSummarised("manifest.json", _cause(exc),
                            errno=getattr(exc, "errno", None)) from None
    for run_id, (state, status, problem, reached) in folded[0].items():
        if status == "ok" and state is not None and state.phase == "terminal":
            del tracks[run_id]
            continue
        track = tracks[run_id]
        track.base, track.status, track.problem, track.reached = (
            state, status, problem, reached)
        track.tail = []
        track.dirty = False


_Folded = dict[str, tuple[RunState | None, Status, str | None, int]]


def _snapshot_all(layout: Layout, tracks: dict[str, Track], segment: int, at_once: bool,
                  kept: dict[str, FileProblem],
                  stop: threading.Event | None = None,
                  writer: str = "",
                  written: dict[str, FileId] | None = None,
                  ) -> tuple[_Folded, str, set[str]]:
    """Write every dirty Run's snapshot (``compact``): what each was folded to, and the
    time stamp they carry. A target (or an ended Run's live/ copy) that is not a private
    regular file of ours is left as it is and named in ``kept``: renamed over or unlinked,
    whatever was planted there would be gone, and a link refused the whole group."""
    stamp = now()
    live: list[tuple[str, bytes]] = []
    done: list[tuple[str, bytes]] = []
    unchanged: list[str] = []  # ended Runs whose done/ snapshot already says it all
    changed: set[str] = set()  # live/ files kept as changed since this host wrote them
    folded: _Folded = {}
    owners: dict[str, str] = {}  # snapshot name: its Run
    for run_id, track in tracks.items():
        if not track.dirty or track.status == "incompatible":
            continue  # incompatible data stays in a pinned segment, read as it is
        state, status, problem = track.folded()
        name = snapshot_name(run_id)
        planted = _unusable(layout.live / name)
        if planted is None:
            planted = _changed(layout.live / name, written)
            if planted is not None:
                changed.add(name)
        if planted is not None:
            kept[run_id] = snapshot_finding(layout, planted)
            continue
        owners[name] = run_id
        # A corrupt Run (read so, or made so by a record its fold refused here) reached at
        # least its last durable record.
        reached = max(track.reached, track.seq) if status == "corrupt" else 0
        folded[run_id] = (state, status, problem, reached)
        snap = Snapshot(run_id=run_id, seq=state.seq if state else 0, status=status,
                        state=state, problem=problem, segment=segment, written_at=stamp,
                        reached=reached, fold=FOLD_VERSION, writer=writer)
        item = (name, encode_snapshot(snap))
        terminal = status == "ok" and state is not None and state.phase == "terminal"
        if not terminal:
            live.append(item)
            continue
        there = _done_kept(layout, snap, kept)
        if there is None:
            done.append(item)
        elif not there:
            # A damaged file is evidence: never renamed over. The ended Run's snapshot goes
            # to live/ instead, so no restore takes it for unfinished; the next restore
            # reports the damaged file.
            live.append(item)
        else:
            unchanged.append(item[0])  # done/ already says this; only its live copy goes
    atomic_write_many(layout.done, done, at_once=at_once, stop=stop)
    removed = False
    for name in [name for name, _ in done] + unchanged:
        # Checked again just before: planted since the check above, it would be gone.
        planted = _unusable(layout.live / name)
        if planted is None:
            planted = _changed(layout.live / name, written)
            if planted is not None:
                changed.add(name)
        if planted is not None:
            kept[owners[name]] = snapshot_finding(layout, planted)
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(layout.live / name)
            removed = True
        if written is not None:
            written.pop(name, None)
    if removed:
        fsync_dir(layout.live)
    if written is not None:
        # Forgotten first: a write that fails part-way leaves files of unknown identity,
        # which the next compaction reads before it replaces them (_changed).
        for name, _ in live:
            written.pop(name, None)
    atomic_write_many(layout.live, live, at_once=at_once, stop=stop)
    if written is not None:
        for name, data in live:
            with contextlib.suppress(FileNotFoundError):
                written[name] = _identity(os.lstat(layout.live / name), data)
    return folded, stamp, changed


# What tells a file this host wrote from one written over it since: (inode, size, mtime,
# a digest of its bytes). The digest is read only when the others differ: the same bytes
# (a touch, a backup tool putting back what it copied) are no change.
FileId = tuple[int, int, int, bytes]


def _identity(st: os.stat_result, data: bytes) -> FileId:
    return st.st_ino, st.st_size, st.st_mtime_ns, _digest(data)


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def _changed(path: Path, written: dict[str, FileId] | None) -> SnapshotError | None:
    """Why the ``live/`` file at ``path`` may be neither renamed over nor unlinked although
    it is a private regular file of ours: it is not the one this host wrote (damaged, or
    replaced, while the host ran), or, written before this host wrote it, it reads back
    damaged. A restore reported such a file and said it was "left as it is"; the next
    compaction renamed over it, or unlinked it once its Run ended, and the evidence was
    gone. None when it is absent, this host's own, or reads back whole."""
    if written is None:
        return None
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    known = written.get(path.name)
    if known is not None and (st.st_ino, st.st_size, st.st_mtime_ns) == known[:3]:
        return None
    data = read_own_file(path)
    if isinstance(data, str):
        return SnapshotError(path, data)
    if data is None:
        return None  # gone since the lstat: nothing to keep
    if known is None:
        # Not written by this host yet (the one its restore read, written by an earlier
        # host) or of unknown identity after a failed write: read, once per Run.
        try:
            decode_snapshot(path, data)
        except SnapshotError as exc:
            return exc
    elif _digest(data) != known[3]:
        return SnapshotError(path, "was changed since this host wrote it (its bytes differ "
                                   "from the ones it wrote), while the host ran")
    written[path.name] = _identity(st, data)
    return None


def _write_manifest(layout: Layout, *, start: int, pinned: list[int], voids: list[VoidNotice],
                    held: Collection[str], open_segment: int, stamp: str,
                    kept: dict[str, FileProblem], changed: Collection[str] = ()) -> None:
    unusable = _manifest_problem(layout)
    if unusable is not None:
        # Found so since this host read it (replaced while it ran): said, not only skipped.
        kind: Literal["incompatible", "corrupt"] = (
            "incompatible" if unusable.incompatible else "corrupt")
        out = "move it out of the runtime directory to let intloom write a new one"
        kept["manifest.json"] = FileProblem("manifest.json", kind, (
            f"{unusable.fact}; no new manifest is written over it, so the next start reads "
            f"every segment ({out if unusable.fix is None else f'{unusable.fix}, or {out}'})"))
        return
    # The live/ files as they now are: a restore listing other names reads everything.
    unused = {snapshot_name(run_id) for run_id in held}
    names = [name for name in list_names(layout.live)
             if is_snapshot_name(name) and name not in unused and name not in changed]
    # Named as no file is: a changed file may read as an older snapshot of its Run, which a
    # restore from ``start`` would trust, losing the records before ``start``; a set that
    # does not match live/ makes it read every segment, whether the file is there or moved
    # out, until a compaction writes the Run's snapshot again.
    names += [f"{name}~changed" for name in changed]
    manifest = Manifest(format=MANIFEST_FORMAT, start=start, pinned=sorted(set(pinned)),
                        voids=list(voids), updated_at=stamp, live=live_set(names),
                        open=open_segment)
    atomic_write_many(layout.root, [("manifest.json", encode_manifest(manifest))])


def _unusable(path: Path) -> SnapshotError | None:
    """Why the file at ``path`` may be neither renamed over nor unlinked, from an ``lstat``:
    None when it is absent or a private regular file of ours."""
    unusable = unusable_file(path)
    return None if unusable is None else SnapshotError(path, unusable[0], fix=unusable[1])


def _done_kept(layout: Layout, snap: Snapshot, kept: dict[str, FileProblem]) -> bool | None:
    """Whether the file ``done/`` already holds for this ended Run stays as it is: None when
    there is none (write it), False when it is damaged (never written over; one that is not
    a private regular file of ours is named in ``kept``), True when it already holds this
    very snapshot (nothing to write)."""
    try:
        there = read_snapshot(layout.done / snapshot_name(snap.run_id))
    except SnapshotError as exc:
        if unusable_file(exc.path) is not None:
            kept[snap.run_id] = snapshot_finding(layout, exc)
        return False
    if there is None:
        return None
    same = (there.run_id, there.seq, there.status, there.state, there.problem) == (
        snap.run_id, snap.seq, snap.status, snap.state, snap.problem)
    return True if same else None


def _manifest_problem(layout: Layout) -> SnapshotError | None:
    """None unless a manifest exists that this intloom cannot read (damaged, newer, not a
    private regular file), or that is provably damaged (ahead of the log: see
    ``manifest_ahead``): then why."""
    try:
        manifest = read_manifest(layout)
    except SnapshotError as exc:
        return exc
    if manifest is None:
        return None
    numbers = [n for n in map(segment_number, list_names(layout.wal)) if n is not None]
    ahead = manifest_ahead(manifest, max(numbers, default=0))
    return None if ahead is None else SnapshotError(layout.manifest, ahead)
