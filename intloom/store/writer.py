"""The durability point: one host-wide append-only log, flushed by group commit.

``append`` only encodes and buffers. ``sync`` makes everything appended before it durable
with one ``write`` + one ``fdatasync`` shared by every Run that appended meanwhile; the
write runs on the store's own thread so the event loop keeps serving other Runs. A failed
write or fsync abandons the segment (its bytes' fate is unknown) for a fresh one whose
first frame voids the failed region; the failed batch's callers get ``CheckpointFailed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import queue
import resource
import signal
import struct
import sys
import threading
import time
import types
from collections import Counter, deque
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any, Final, NoReturn
from zlib import crc32

import msgspec

from intloom.errors import IntloomError
from intloom.fsutil import file_problem, fsync_dir, limit_fix, path_of, storage_fix
from intloom.runtime.machine import IllegalTransition, RunState, apply
from intloom.runtime.ports import CheckpointFailed, JournalPort, RecordTooLarge
from intloom.runtime.records import PROTOCOL_VERSION, Record, Terminal, encode_record
from intloom.store import framing
from intloom.store.compaction import FileId, NotSummarised, Track, compact, now
from intloom.store.faults import FaultPlan
from intloom.store.files import (
    Layout,
    WritesStopped,
    check_dir,
    create_failed,
    ensure_dir,
    lock_dir,
    open_new,
    remove_temps,
)
from intloom.store.framing import (
    FRAME_MAGIC,
    KIND_RECORD,
    KIND_SEAL,
    KIND_VOID,
    MAX_BODY,
    MAX_SEGMENT,
    SealNotice,
    SegmentHeader,
    VoidNotice,
    encode_frame,
    encode_segment_header,
    segment_name,
)
from intloom.store.history import BULK, HistoryEntry, first_segment, read_histories
from intloom.store.reader import FileProblem, StoreReport, load, numbering_refused, read_ended
from intloom.store.segmentfile import PREALLOCATE_BYTES, FdIdentity, preallocate, pwrite_all
from intloom.store.snapshots import snapshot_name

__all__ = ["DEFAULT_SEGMENT_BYTES", "Store"]

# Rotation bounds what a restore after a crash decodes, and costs one snapshot file per Run
# that wrote since the last one, written by the compactor thread. Those files' inodes,
# renames and fsyncs share the file system's journal with the log's fdatasync: measured on a
# 2-vCPU VM with 64 busy Runs (2026-12-02), a compaction running made the log's flushes
# ~60 % slower and cost the Runs ~20-25 % of their Steps/s (rounds with the compactor
# switched off, or writing to tmpfs, alternated in one process; docs/performance.md); with
# 64 KiB per Run a compaction was running most of the time. A restore decodes ~28 ms per
# MiB of log there (the fastest of three: 4 MiB of 64 Runs' records 0.13 s, 16 MiB 0.45 s,
# with a transient ~55 MiB). So a segment is rotated once it holds _ROTATE_PER_RUN bytes
# per Run that wrote to it (~430 trivial Steps of each), at least _ROTATE_MIN, at most
# ``segment_bytes``: a lone Run still rotates every MiB, 64 busy Runs every 16 MiB (+~20 %
# Steps/s against 4 MiB, scripts/bench concurrency, alternating), and a restore after a
# crash usually decodes one segment's worth. More when the crash lands while a compaction
# is still writing (``start`` moves once it is done: the segment before is read too), when
# a compaction failed (``start`` stays), or by the one batch a rotation's check follows.
DEFAULT_SEGMENT_BYTES: Final = 16 << 20
_ROTATE_MIN: Final = 1 << 20
_ROTATE_PER_RUN: Final = 256 << 10
# A flush runs on the loop thread (no hand-off) only when one Run has been the only writer
# for this many batches and the disk answers fast: measured on a 2-vCPU VM, the thread
# hand-off costs ~90 us against a ~160 us fdatasync, while a solo Run has nobody to wait for.
_SOLO_BATCHES: Final = 8
_INLINE_MAX_SYNC_S: Final = 0.002
# A Run flushing inline suspends nowhere in ``sync``: a lone busy Run of async Steps would
# hold the loop for as long as the disk stays fast (seconds were seen), and a client's hello,
# a stop or a timer waited all that time. It yields to the loop at least this often.
_INLINE_YIELD_S: Final = 0.002


# Under a file size limit, what a segment keeps free past its last batch for its seal frame
# (~90 bytes): a batch that left less made the seal fail EFBIG part-way, and verify then
# called the segment's end damaged. And what a new segment's header and seal take: a batch
# with less room than this below the limit fails in any segment, so none is made for it.
_SEAL_ROOM: Final = 256
_SEGMENT_ROOM: Final = 4096


def _file_limit() -> int | None:
    """The file size limit (``ulimit -f``, inherited from the shell that started the host)."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    except (OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return None
    return soft


def _within_file_limit(segment_bytes: int, limit: int | None) -> int:
    """``segment_bytes``, or less under a file size limit: half of it. A segment that reached
    the limit failed the batch that crossed it (EFBIG), and with it a Run, at every segment's
    end."""
    if limit is None:
        return segment_bytes
    return max(1, min(segment_bytes, limit // 2))


# framing.encode_frame's parts, for Store.append, which frames a record inline (three
# records per Step: the call was ~1k instructions per Step, callgrind, 64 Runs). Assigned,
# not imported: Python 3.11 compiles ``name.method()`` on an imported name as an attribute
# load, which binds a new method object on every call.
_BODY_HEAD: Final = framing._BODY_HEAD
_FRAME_HEAD: Final = framing._FRAME_HEAD
_LEN_CRC: Final = framing._LEN_CRC
# A frame's body's room for a run id and a record (the Struct's ``size`` is a descriptor
# 3.11 reads unspecialised).
_BODY_ROOM: Final = MAX_BODY - _BODY_HEAD.size


class _RunHead:
    """What ``Store.append`` keeps per Run it writes: a packer of a record's body up to the
    payload (kind, seq, then ``tail``: the run id's length and the run id), ``tail``, the
    size of what it packs (``fixed``), the room left for a payload, and the seq of the
    Run's last record (0: none yet).

    Made once per Run: the run id encoded, then packed and joined to the body for each
    record, was ~1.6 % of a Step (callgrind, 64 async Runs). The seq is kept here rather
    than in a dict of its own: a second lookup and a store per record, ~1 % of a Step."""

    __slots__ = ("fixed", "packer", "pending", "room", "seq", "state", "tail", "unfolded")

    def __init__(self, run_id: str, seq: int = 0) -> None:
        rid = run_id.encode()
        self.tail = len(rid).to_bytes(2, "big") + rid
        self.packer = struct.Struct(f">BQ{len(self.tail)}s")
        self.fixed = self.packer.size
        self.room = _BODY_ROOM - len(rid)
        self.seq = seq
        # Since the last batch was taken: whether the Run appended (it is in
        # ``Store._pending_runs``), the fold its caller gave with its last record with one,
        # and the records appended after that one without (what ``_track`` folds).
        self.pending = False
        self.state: RunState | None = None
        self.unfolded: list[Record] | None = None


# loop.create_future() without its Python frame (once per Step): the host runs asyncio's
# own event loop, whose create_future returns exactly this.
_Future: Final = asyncio.Future


# What a batch tracks of a Run (``_track``): the run id, its last seq, the fold its caller
# gave with its last record with one (None: none in the batch), and the Run's records in the
# batch after that one (None: none; folded onto that fold, or onto the track's).
_Last = tuple[str, int, RunState | None, list[Record] | None]


class _Batch(msgspec.Struct):
    data: bytes
    records: int  # how many frames ``data`` holds
    start: int  # index of its first record among everything ever appended
    end: int
    runs: dict[str, _RunHead]  # the Runs in it (the keys), in the order they first came
    last: list[_Last]  # of each of them, in that order


class _Failure(msgspec.Struct):
    start: int
    end: int
    run_ids: frozenset[str]
    cause: str


def _die() -> NoReturn:
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: SIGKILL did not stop the process")


class Store:
    """The checkpoint store of one host instance, used from one event loop and, through
    ``sync_threadsafe``, from the threads that drive sync Steps (see that method).

    Counters for tests and benchmarks: ``flushes`` (batches written), ``records_flushed``,
    ``bytes_flushed`` (a segment file's size also counts the zeros preallocated ahead).
    ``restored`` is what the store read at open (the same as ``read_runs_report``).
    """

    # Slots, not an instance dict: past 30 attributes, CPython 3.11 keeps an instance's in a
    # dict of its own, and then never specialises a call of its methods (the executor's
    # ``journal.append``, three per Step) and reads each attribute through a hint into it.
    __slots__ = (
        "_allocated", "_appended", "_appending", "_armed", "_begun", "_closed", "_closing",
        "_compactor",
        "_dir_lock", "_durable_calls", "_failed_runs", "_failures", "_faults",
        "_fd", "_fd_check", "_file_limit", "_flush_no", "_flush_waits", "_flushed", "_frames",
        "_heads", "_held", "_history_lock", "_history_mutex", "_history_read",
        "_history_reads",
        "_history_waiting", "_home_fd", "_inflight", "_inline_max_sync_s", "_jobs",
        "_kept_lock", "_kept_told", "_kick", "_kick_inline", "_last_sync_s", "_live_written",
        "_lock",
        "_loop", "_manifest_kept", "_next_number", "_number", "_opened",
        "_pending_frames", "_pending_runs", "_pinned", "_poisoned",
        "_resolved", "_rotate_failing", "_rotate_retry_at", "_sealed", "_segment_bytes",
        "_segments_made", "_shared", "_size", "_solo_count", "_solo_run", "_start",
        "_taken", "_thread", "_tracks", "_tracks_lock", "_voids", "_waiters",
        "_writers", "_yielded", "bytes_flushed", "flushes", "inline_flushes", "instance_id",
        "kept_files", "layout", "on_kept_file", "on_unsummarised", "package_version",
        "records_flushed", "removed_temps", "restored", "unsummarised",
    )

    def __init__(self, layout: Layout, *, instance_id: str, package_version: str,
                 faults: FaultPlan, segment_bytes: int, restored: StoreReport,
                 inline_max_sync_s: float = _INLINE_MAX_SYNC_S) -> None:
        self.layout = layout
        self.instance_id = instance_id
        self.package_version = package_version
        self.restored = restored
        # The temp files of killed atomic writes this open removed (remove_temps).
        self.removed_temps: list[str] = []
        self.flushes = 0
        self.records_flushed = 0
        self.bytes_flushed = 0
        self._faults = faults
        self._loop: asyncio.AbstractEventLoop | None = None
        # Guards what appends and flushes share (the pending records, the counters, the
        # batch being written) while a thread drives a Run (``share``): ``_shared`` counts
        # those threads. Taken only then -- 0 means nobody but the loop is here, and only
        # the loop raises it -- because a dozen lock round trips per Step cost 64 busy
        # Runs ~10 % of their Steps/s. Held for bookkeeping only, never across a write.
        # ``_flushed`` tells threads that a batch was written.
        self._lock = threading.Lock()
        self._flushed = threading.Condition(self._lock)
        # Threads waiting on ``_flushed``: a notify_all with nobody waiting still costs ~2k
        # instructions (Condition checks its lock is held by a trial acquire), once per flush.
        self._flush_waits = 0
        self._shared = 0
        # Flushes run on the loop thread (inline) or the store's thread, and a compaction is
        # settled on the store's thread: whoever changes the tracks holds this.
        self._tracks_lock = threading.Lock()
        self._armed = faults.armed()  # a fault is injected at some flush
        self._file_limit = _file_limit()
        self._segment_bytes = _within_file_limit(segment_bytes, self._file_limit)
        # Flush on the loop thread only while an fdatasync takes at most this long
        # (0: never, every flush goes through the store's thread).
        self._inline_max_sync_s = inline_max_sync_s
        self._writers: set[str] = set()  # Runs with records in the current segment
        # Loop-thread state.
        # Appended, not yet taken into a batch: their frames (encoded as records are
        # appended; two items each, its head then its body: ``append``) and the Runs that
        # appended them, whose heads keep what ``_track`` needs.
        # A tuple per record kept in a list and a dict, and that dict copied per flush, were
        # ~0.8 % of a Step (callgrind, 64 async Runs).
        self._pending_frames: list[bytes] = []
        self._pending_runs: dict[str, _RunHead] = {}
        # By Run: each unfinished Run's (restored or appended to since), none once it ended.
        self._heads: dict[str, _RunHead] = {}
        self._appended = 0
        self._taken = 0
        self._resolved = 0
        self._failures: deque[_Failure] = deque(maxlen=256)
        # Runs with a record in a failed batch: finished for this process (see _finish_batch).
        self._failed_runs: dict[str, _Failure] = {}
        # The batch being written (by the store's thread, the loop or a Step's thread):
        # batches are written one at a time, in the order they were taken.
        self._inflight: _Batch | None = None
        self._kick: asyncio.Handle | None = None  # a flush scheduled for this loop iteration
        self._kick_inline = False  # and it was to run on the loop (see sync)
        # (appended, the future of the sync() that waits for it).
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        # ``when_durable``'s callbacks, each with the count of records it waits for.
        self._durable_calls: list[tuple[int, Callable[[], None]]] = []
        self._closed = False
        # Begun and not closed: what ``append`` checks first, in one read. With its head found
        # by a subscript and the check of a close racing a thread's append made only while a
        # thread shares the store, 8 bytecodes fewer per record: callgrind, 64 async Runs,
        # 112.3-112.7k -> 111.6k instructions per Step.
        self._appending = False
        # The Run that alone wrote the last ``_solo_count`` batches (None: several did).
        self._solo_run: str | None = None
        self._solo_count = 0
        self._last_sync_s = 0.0
        self.inline_flushes = 0
        self._yielded = 0.0  # perf_counter() when an inline flush last yielded to the loop
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Callable[[Any], None]] | None]
        self._jobs = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._worker, name="intloom-store", daemon=True)
        self._thread.start()
        # Writer-thread state (touched by one flush job at a time).
        self._history_lock = threading.Lock()  # one whole-log read at a time (history)
        # The callers waiting for a read (by Run), what a read found for them and the number
        # of that read (reads are numbered as they begin: ``_history_reads``).
        self._history_mutex = threading.Lock()
        self._history_waiting: Counter[str] = Counter()
        # Run -> (the read's number, its entries, the segment it began at: 0 for all).
        self._history_read: dict[str, tuple[int, list[HistoryEntry], int]] = {}
        self._history_reads = 0
        self._tracks: dict[str, Track] = {}
        self._fd = -1
        # The open segment's file, as opened: Workflow code that closed its descriptor,
        # then opened a file that took its number, had every later record written into
        # that file (a user's), and the Runs the host called saved were lost. Kept with the
        # segment, not the number: a new segment may get the same number.
        self._fd_check: FdIdentity | None = None
        self._number = 0
        self._next_number = 1
        self._size = 0  # where the segment's frames end: the next batch's offset
        # The segment file's size as this host made it: ``_size`` plus the zeros
        # preallocated past it (segmentfile.py), or ``_size`` when none could be.
        self._allocated = 0
        self._frames = 0
        self._flush_no = 0
        self._segments_made = 0
        # After a rotation that failed: the segment size at which the next is tried, and
        # whether the failure was told (once per run of failures).
        self._rotate_retry_at = 0
        self._rotate_failing = False
        self._pinned: list[int] = []
        self._held: frozenset[str] = frozenset()  # Runs whose snapshot file is damaged
        # The live/ snapshot files this host wrote, by name (compaction.FileId): one changed
        # since is evidence, never renamed over nor unlinked.
        self._live_written: dict[str, FileId] = {}
        # The manifest this host read was refused (damaged, another format, ahead of the log):
        # evidence, never written over while this host lives (compaction writes snapshots only).
        self._manifest_kept = False
        self._voids: list[VoidNotice] = []
        # At most the manifest's ``start`` (lower is safe: a restore only reads more): what a
        # manifest that names a replacement segment keeps (``_name_replacement``).
        self._start = 0
        self._poisoned: str | None = None
        self._compactor: threading.Thread | None = None  # snapshots behind the writer
        # Set by a close: a rotation's compaction still running begins no further group of
        # snapshots. The close snapshots every dirty Run anyway, fsyncs together; waited for,
        # that compaction (one fsync after another) took 15 s for 10,700 Runs at load 6,
        # which the stop's bound on the close (1 ms a snapshot) did not count.
        self._closing = threading.Event()
        # Told (from whichever thread compacted) of each compaction that failed; until the
        # host sets it (the one at open), they wait in ``unsummarised``.
        self.on_unsummarised: Callable[[NotSummarised, str], None] | None = None
        self.unsummarised: list[tuple[NotSummarised, str]] = []
        # Likewise for each snapshot file a compaction found planted (not a private regular
        # file of ours) and left as it is: told once per path while this host lives.
        self.on_kept_file: Callable[[FileProblem], None] | None = None
        self.kept_files: list[FileProblem] = []
        self._kept_told: set[str] = set()
        self._kept_lock = threading.Lock()  # told from the writer's and the compactor's threads
        self._sealed = False
        # What ``begin`` needs of the read at open (the segments it read, whether to
        # summarise them), until it is called; ``_begun`` once this host's segment exists.
        self._opened: tuple[list[int], bool] | None = None
        self._begun = False
        self._dir_lock = -1  # lock_dir's fd on the runtime directory, closed last
        # The runtime directory this store opened, held open: every write by path (a new
        # segment, snapshots, the manifest) first checks that the path still leads to it
        # (``_elsewhere``). A project directory moved while its host ran leaves the path
        # to nothing, or to a copy put back there, whose journal is another host's.
        self._home_fd = -1

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(cls, runtime_dir: Path, *, instance_id: str, package_version: str,
             faults: FaultPlan | None = None,
             segment_bytes: int = DEFAULT_SEGMENT_BYTES,
             inline_max_sync_s: float = _INLINE_MAX_SYNC_S, locked: bool = False,
             begin: bool = True) -> Store:
        """Open the store for one host instance: read it, then (``begin``) start a new
        segment.

        Leftovers of a crashed host (segments the manifest does not cover yet) are folded
        into snapshots as the segment is started, so repeated crashes never make a restore
        read more. ``begin=False`` leaves that, and every other write, to ``begin()``: the
        host calls it only once nothing but a stop can end its start, so a start that fails
        (a port taken, a full log) creates no file under ``runtime_dir`` (the read
        removes the temp files of killed atomic writes, and makes missing directories).

        The store holds ``lock_dir`` on ``runtime_dir`` until it is closed; ``locked``: the
        caller already holds it for the store's whole life (the host takes it before it
        imports any Workflow) and releases it itself.
        """
        plan = FaultPlan.from_env().merged(faults)
        layout = Layout(runtime_dir)
        for directory in layout.dirs():
            ensure_dir(directory)
        # Before anything is read: nobody else may move the log under this read.
        held = -1 if locked else lock_dir(layout.root)
        try:
            store = cls._open_locked(layout, held, instance_id=instance_id,
                                     package_version=package_version, plan=plan,
                                     segment_bytes=segment_bytes,
                                     inline_max_sync_s=inline_max_sync_s)
            if begin:
                try:
                    store.begin()
                except BaseException:
                    store._stop_worker()
                    if store._fd >= 0:  # made before the failure: nobody else closes it
                        with contextlib.suppress(OSError):
                            os.close(store._fd)
                    store._forget_fd()
                    store._unhome()
                    raise
            return store
        except BaseException:
            if held >= 0:
                os.close(held)
            raise

    @classmethod
    def _open_locked(cls, layout: Layout, held: int, *, instance_id: str,
                     package_version: str, plan: FaultPlan, segment_bytes: int,
                     inline_max_sync_s: float) -> Store:
        runtime_dir = layout.root
        # A damaged manifest or snapshot is reported (restored.files) and kept as it is; the
        # reader has read the whole log instead, so every other Run restores as usual.
        loaded = load(runtime_dir, "restore")
        highest = max(loaded.segment_numbers, default=0)
        refused = numbering_refused(layout, loaded.segment_numbers)
        if refused is not None:
            raise refused
        removed = remove_temps(layout)
        # While the manifest is unreadable every restore reads the whole log: snapshotting
        # what that read found would rewrite every Run's snapshot at each start for nothing.
        # A manifest ahead of the log is the exception: this host numbers its segment at
        # that manifest's start (below), after which the manifest reads as consistent, so
        # every Run this read found must be in a snapshot before anything trusts it again.
        summarise = loaded.manifest_error is None or loaded.ahead_start > 0
        # Ended Runs (a readable journal ending at terminal) are neither reported nor given
        # a next seq: nothing is appended after a Run's end.
        unfinished = {run_id: j for run_id, j in loaded.journals.items()
                      if j.status != "ok" or j.state is None or j.state.phase != "terminal"}
        restored = StoreReport(
            runs=list(unfinished.values()),
            files=list(loaded.files), stats=loaded.stats,
        )
        store = cls(layout, instance_id=instance_id, package_version=package_version,
                    faults=plan, segment_bytes=segment_bytes, restored=restored,
                    inline_max_sync_s=inline_max_sync_s)
        store._dir_lock = held
        store.removed_temps = removed
        with contextlib.suppress(OSError):  # then nothing can be told: writes go by path
            store._home_fd = os.open(runtime_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        for run_id, journal in loaded.journals.items():
            seq = journal.state.seq if journal.state else 0
            # A held Run (its snapshot file is damaged) is never dirty: never snapshotted.
            store._tracks[run_id] = Track(base=journal.state, seq=seq, status=journal.status,
                                          problem=journal.problem, reached=journal.reached,
                                          dirty=summarise and run_id in loaded.dirty
                                          and run_id not in loaded.held)
            if run_id in unfinished:
                store._heads[run_id] = _RunHead(run_id, seq)
        # Pinned: segments a restore must keep reading whatever the manifest's start, so that
        # what they hold keeps being reported (incompatible or corrupt Runs, and any finding
        # that is not a torn tail: damaged or foreign files) or stays readable (held Runs:
        # no snapshot of theirs can be written until theirs is moved out).
        pinned = set(loaded.incompatible_segments) | loaded.problem_segments
        for run_id, journal in loaded.journals.items():
            if journal.status != "ok" or run_id in loaded.held:
                pinned |= loaded.evidence.get(run_id, set())
        store._pinned = sorted(pinned)
        store._held = frozenset(loaded.held)
        store._kept_told = {problem.path for problem in loaded.files}  # the restore's report
        # Every notice read, not only the manifest's: after a crash, the replacement
        # segment's first frame was the only record that a failed batch's bytes are void.
        store._voids = list(loaded.voids)
        store._start = loaded.manifest.start if loaded.manifest is not None else 0
        # A lost segment's number is never taken again: a copy put back must not clash
        # with a new file (and it stays pinned, so the next restore reads it).
        store._next_number = max([highest, *loaded.lost, loaded.ahead_start - 1]) + 1
        store._manifest_kept = loaded.manifest_error is not None
        store._opened = (list(loaded.segments_read), summarise)
        return store

    def begin(self) -> None:
        """Start this host's segment, summarise a crashed host's leftovers and write the
        manifest naming the segment: the store's first writes, before any ``append``.

        STORAGE_ERROR when the segment cannot be created; the store is then of no further
        use (close it). Until this is called, a close writes nothing: the log stays exactly
        as the host before this one left it, which the next start reads again.
        """
        if self._closed:
            raise self._closed_error()
        if self._opened is None:
            raise RuntimeError("Store.begin: the store's segment was begun already")
        segments_read, summarise = self._opened
        self._opened = None
        layout = self.layout
        try:
            self._new_segment(b"")
        except OSError as exc:
            raise create_failed(layout.wal, layout.wal / segment_name(self._next_number),
                                f"cannot hold a new segment ({exc.strerror})", exc) from None
        self._begun = True
        self._appending = not self._closed
        # A crashed host's unsynced bytes were read from the page cache: make them as
        # durable as the snapshots about to summarise them.
        for number in segments_read:
            with contextlib.suppress(OSError):
                fd = os.open(layout.wal / segment_name(number),
                             os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        # Always, even with nothing to summarise: the manifest names the segment just
        # created (``open``), so that a start finding it gone knows it existed. When the
        # snapshots fail, ``start`` does not move (the next restore reads more, correctly)
        # but the manifest still names the new segment, as after a failed write's
        # replacement segment: without it, that segment lost later went unnoticed and its
        # Runs resumed from an older point. Only a failed manifest write leaves it unnamed.
        if summarise:
            kept: dict[str, FileProblem] = {}
            try:
                compact(layout, self._tracks, start=self._number,
                        pinned=self._pinned, voids=self._voids, segment=self._number,
                        held=self._held, open_segment=self._number,
                        write_manifest=not self._manifest_kept, at_once=True, kept=kept,
                        writer=self.package_version, written=self._live_written)
                self._start = self._number
            except NotSummarised as exc:
                self._not_summarised(exc, "open")
                if exc.what == "snapshots" and not self._manifest_kept:
                    with contextlib.suppress(NotSummarised):
                        compact(layout, {}, start=self._start, pinned=self._pinned,
                                voids=self._voids, segment=self._number,
                                held=self._held, open_segment=self._number, kept=kept,
                                writer=self.package_version)
            self._tell_kept(kept)

    def _tell_kept(self, kept: dict[str, FileProblem]) -> None:
        """Tell of the snapshot files a compaction left as they are (``compact``'s ``kept``)
        that were not told of yet."""
        for problem in kept.values():
            with self._kept_lock:
                if problem.path in self._kept_told:
                    continue
                self._kept_told.add(problem.path)
            hook = self.on_kept_file
            if hook is None:
                self.kept_files.append(problem)
            else:
                hook(problem)

    def _not_summarised(self, exc: NotSummarised, when: str) -> None:
        """A compaction (at ``when``: open, rotation, replacement, stop) wrote nothing past
        ``exc.what``. Harmless (restores read more of the log) but never silent: a disk
        that refuses snapshots goes unnoticed until restarts grow slow."""
        hook = self.on_unsummarised
        if hook is None:
            self.unsummarised.append((exc, when))
        else:
            hook(exc, when)

    def _new_segment(self, first: bytes) -> None:
        """Create the next segment (header, then ``first`` frames), durable before use."""
        self._segments_made += 1
        if self._segments_made in self._faults.fail_segment:
            raise OSError(errno.ENOSPC, "No space left on device (injected fail_segment)")
        number = self._next_number
        while True:
            if number > MAX_SEGMENT:  # its name would be one no reader takes for a segment
                self._next_number = number
                raise OSError(errno.EOVERFLOW, f"no segment number is left after {MAX_SEGMENT}")
            try:
                fd = open_new(self.layout.wal / segment_name(number))
                break
            except FileExistsError:
                number += 1
        header = encode_segment_header(SegmentHeader(
            number=number, instance_id=self.instance_id,
            package_version=self.package_version, protocol=PROTOCOL_VERSION, created_at=now(),
        ))
        size = len(header) + len(first)
        try:
            pwrite_all(fd, header + first, 0)
            allocated = self._preallocate(fd, size, size)
            os.fdatasync(fd)
            fsync_dir(self.layout.wal)
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)  # the partial file stays: a torn header is evidence, not garbage
            self._next_number = number + 1
            raise
        self._fd_check = FdIdentity(fd, (st.st_dev, st.st_ino))
        self._fd, self._number, self._size, self._allocated = fd, number, size, allocated
        self._writers = set()
        # A failed rotation's retry point counts the bytes of the segment it failed in; a new
        # segment rotates by its own size (kept, it grew as large as the failed one first).
        self._rotate_retry_at = 0
        self._frames = 1 if first else 0
        self._next_number = number + 1

    def _preallocate(self, fd: int, allocated: int, end: int) -> int:
        """Preallocate the segment of ``fd`` (``allocated`` bytes so far) well past ``end``,
        within the file size limit; the size it then has. Refused (a full disk, no
        ``fallocate``), the batch is written as format 1 wrote all of them: by growing the
        file (the one that grows it failing on a full disk as it always did)."""
        want = end + PREALLOCATE_BYTES
        limit = self._file_limit
        if limit is not None:
            want = min(want, limit - _SEAL_ROOM)
        if want <= allocated:
            return allocated
        try:
            plan = self._faults
            if self._armed and plan.no_preallocate and self._segments_made >= min(
                    plan.no_preallocate):
                raise OSError(errno.EOPNOTSUPP, "Operation not supported (injected)")
            preallocate(fd, allocated, want)
        except OSError:
            # A refusal may still have allocated (and sized) part of it.
            with contextlib.suppress(OSError):
                return max(allocated, os.fstat(fd).st_size)
            return allocated
        return want

    # ------------------------------------------------------------------ appending

    def append(self, run_id: str, record: Record, state: RunState | None = None) -> None:
        """Buffer one record of ``run_id``; durable once a later ``sync`` returns.

        ``state`` is the Run's fold after ``record`` when the caller already has it (the
        executor does): the store then keeps it for the next snapshot instead of folding the
        record a second time.
        """
        self.append_many(run_id, (record,), state)

    def append_many(self, run_id: str, records: tuple[Record, ...],
                    state: RunState | None = None) -> None:
        """``append`` each of ``records`` of ``run_id`` in turn, in one call: all of them
        or, when one cannot be encoded (or is too large), none. ``state``: the Run's fold
        after the last of them, as ``append``'s. A routed Step appends three (its
        step_result, the next Step's step_ready and executing): one call each was ~3k
        instructions more per Step (callgrind, 64 async Runs)."""
        if not self._appending:
            if self._closed:
                raise self._closed_error()
            raise RuntimeError("Store.append before Store.begin: the store has no segment")
        try:  # a subscript, not ``get`` and a test: fewer bytecodes but for a Run's first
            head = self._heads[run_id]
        except KeyError:
            head = self._heads[run_id] = _RunHead(run_id)
        # Framed first, outside the lock: a record that cannot be encoded raises and changes
        # nothing. Only the thread driving the Run appends for it, so its seqs are its own
        # until they are taken below.
        seq = head.seq
        framed: list[bytes] = []
        for record in records:
            payload = encode_record(record)
            if len(payload) > head.room:
                # Written, it would be read back as damage (the reader's bound on a frame's
                # length): the Run would be lost at the next restore from the log.
                raise RecordTooLarge(MAX_BODY - head.room + len(payload), MAX_BODY)
            seq += 1
            # framing.encode_frame(KIND_RECORD, seq, run_id.encode(), payload), inlined, and
            # its head and body kept apart: the batch joins every frame anyway, and the
            # frame's own concatenation (a copy of the record) and its length were ~0.8 % of
            # a Step (callgrind, 64 async Runs: 113.6-113.8k -> 112.2-112.3k).
            body = head.packer.pack(KIND_RECORD, seq, head.tail) + payload
            size = len(body)
            crc = _LEN_CRC.get(size)
            if crc is None:
                crc = framing._len_crc(size)
            framed.append(_FRAME_HEAD.pack(FRAME_MAGIC, size, crc32(body, crc)))
            framed.append(body)
        lock = self._lock if self._shared else None
        if lock is not None:
            lock.acquire()
            if self._closed:  # again: a thread's append may race the loop's close
                lock.release()
                raise self._closed_error()
        try:
            if self._failed_runs:
                failed = self._failed_runs.get(run_id)
                if failed is not None:
                    raise CheckpointFailed(failed.run_ids, failed.cause)
            # The seqs are taken now: if an earlier batch of this Run fails before these
            # records are written, they are dropped and the Run never writes again in this
            # process.
            head.seq = seq
            self._pending_frames += framed
            if type(records[-1]) is Terminal:
                # Nothing follows a Run's end (the machine refuses it), and a head kept for
                # each Run ever ended would grow, and pin memory, for the host's life.
                self._heads.pop(run_id, None)
            if state is not None:
                head.state = state
                head.unfolded = None
            elif not head.pending:  # its first in this batch: folded onto the track's fold
                head.state, head.unfolded = None, list(records)
            elif head.unfolded is None:
                head.unfolded = list(records)
            else:
                head.unfolded += records
            if not head.pending:
                head.pending = True
                self._pending_runs[run_id] = head
            self._appended += len(records)
        finally:
            if lock is not None:
                lock.release()

    def _closed_error(self) -> IntloomError:
        return IntloomError("STORAGE_ERROR", f"Checkpoint store {self.layout.root} is closed; "
                            "no record can be appended after the host stopped.")

    def _take_batch(self) -> _Batch | None:
        """Everything pending, as the next batch to write (with the lock held)."""
        frames = self._pending_frames
        if not frames:
            return None
        runs = self._pending_runs
        end = self._taken + (len(frames) >> 1)  # dropped records are resolved with the batch
        self._pending_frames, self._pending_runs = [], {}
        # A list, not a dict by Run: built once per flush for every Run in it, a dict grew
        # (and was rehashed) several times.
        last: list[_Last] = []
        for run_id, head in runs.items():
            last.append((run_id, head.seq, head.state, head.unfolded))
            head.pending = False
        dropped = self._failed_runs
        if dropped and not dropped.keys().isdisjoint(runs):
            # Appended before their Run's batch failed: they presume that batch.
            frames = [part for frame in zip(frames[::2], frames[1::2], strict=True)
                      if _run_of(frame[0] + frame[1]) not in dropped for part in frame]
            runs = {run_id: head for run_id, head in runs.items() if run_id not in dropped}
            last = [entry for entry in last if entry[0] not in dropped]
        batch = _Batch(b"".join(frames), len(frames) >> 1, self._taken, end, runs, last)
        self._taken = end
        return batch

    def _finish_batch(self, batch: _Batch, cause: str | None) -> None:
        self._resolved = batch.end
        self.flushes += 1
        only = next(iter(batch.runs)) if len(batch.runs) == 1 else None
        if only is not None and only == self._solo_run:
            self._solo_count += 1
        else:
            self._solo_run, self._solo_count = only, int(only is not None)
        if cause is None:
            self.records_flushed += batch.records
            self.bytes_flushed += len(batch.data)
            return
        # The failed records never happened, but records of the same Runs appended while
        # this batch was on disk presume they did (and would take seqs after them): those
        # Runs are finished for this process. Their pending records are dropped (the failure
        # covers them) and every later append or sync of theirs raises; on restart each is
        # restored from its last durable record.
        failure = _Failure(batch.start, self._appended, frozenset(batch.runs), cause)
        self._failures.append(failure)
        for run_id in batch.runs:
            self._failed_runs[run_id] = failure

    def _check(self, low: int, high: int, run_id: str | None) -> None:
        if run_id is not None:
            mine = self.failure(run_id)
            if mine is not None:
                raise mine
            return
        failed = [f for f in self._failures if f.start < high and f.end > low]
        if failed:
            run_ids = frozenset().union(*(f.run_ids for f in failed))
            raise CheckpointFailed(run_ids, failed[0].cause)

    # A generator the event loop runs as a coroutine (``await store.sync()``), not an
    # ``async def``: a bare ``yield`` suspends it to the next loop iteration in its own frame.
    # Each Step's sync suspends once (for the round's flush); awaiting a generator made for
    # it (``asyncio.sleep(0)``'s bare yield, without its coroutine) was one more frame to
    # make and to pass every resumption through: callgrind, 64 async Runs, 114.8-115.6k ->
    # 113.4-114.0k instructions per Step (three pairs).
    @types.coroutine
    def sync(self, run_id: str | None = None) -> Generator[Any, None, None]:
        """Return once every record appended before the call is durable (group commit).

        With ``run_id`` (recommended): raises ``CheckpointFailed`` iff a record of that Run
        was in a failed batch, whichever caller flushed it; from then on every ``append`` and
        ``sync`` of that Run raises too. Without: raises naming the Runs of every failed batch
        holding records that were not yet durable when the call was made; a caller whose Run
        is not in ``run_ids`` may treat its own records as durable.

        Await it, or wrap it with ``asyncio.ensure_future``: ``asyncio.create_task`` takes
        only an ``async def``'s coroutine from Python 3.12 on.
        """
        # Every failed batch finished its Runs (``_finish_batch``): with none of those, nothing
        # has failed, and there is nothing to check (twice per Step).
        if self._failed_runs and run_id in self._failed_runs:
            with self._lock:
                self._check(0, 0, run_id)
        # Two ints, each read atomically: a thread appending meanwhile only adds records
        # this call need not wait for.
        high = self._appended
        low = self._resolved
        while self._resolved < high:
            if self._kick_inline:
                # What the rest of this loop decides for all but the first Run of a round
                # (it queued the flush): the flush runs on the loop ahead of this task's next
                # turn (see below). Decided without the lock in ~30 fewer bytecodes per Step
                # (~0.5 % of a Step, callgrind, 64 async Runs), and in one read of what the
                # Run that queued the flush found (no thread appends or flushes: none is
                # shared, no batch is in flight, the disk is fast), not four: 112.0-112.6k
                # -> 111.3-111.7k instructions per Step. Should that change before the flush
                # (a thread came), this task's next turn finds its records not yet resolved,
                # and waits for them as the rest of this loop decides.
                yield
                continue
            inline: _Batch | None = None
            waiter: asyncio.Future[None] | None = None
            lock = self._lock if self._shared else None
            if lock is not None:
                lock.acquire()
            try:
                if self._resolved >= high:
                    break
                if self._inflight is None and self._kick is None:
                    if not self._pending_frames:
                        break  # nothing left to make durable (taken by sync_blocking)
                    if self._solo():
                        inline = self._inflight = self._take_batch()
                        if inline is not None and self._may_wait_for_compaction(inline):
                            # It rotates while the last compaction runs (or rotates twice
                            # under a file size limit), and the rotation waits for that
                            # compaction: on the store's thread, not the loop.
                            self._submit(inline)
                            inline = None
                    else:
                        # Flush once every Run woken in this loop iteration has appended:
                        # the callback runs after the handles already queued, so one
                        # fdatasync serves them all instead of one for the first caller and
                        # one for the rest.
                        self._kick = self._running_loop().call_soon(self._flush_next)
                        self._kick_inline = (not self._shared
                                             and self._last_sync_s < self._inline_max_sync_s)
                if inline is None and (self._kick is None or self._inflight is not None
                                       or self._last_sync_s >= self._inline_max_sync_s):
                    waiter = _Future(loop=self._running_loop())
                    self._waiters.append((high, waiter))
            finally:
                if lock is not None:
                    lock.release()
            if inline is None and waiter is None:
                # The flush is queued for the next loop iteration, on the loop, ahead of this
                # task's next turn: that turn finds its records durable, with no future to
                # make, wait on and wake (one per Run per Step), and one loop iteration per
                # round instead of two (the woken Runs ran in the iteration after the flush).
                # What waits ``when_durable`` is called by the flush itself, before these
                # turns (``_wake``). A flush that did not resolve these records (it went to
                # the store's thread) is waited for with a future at the next turn.
                yield
                continue
            if inline is not None:
                self.inline_flushes += 1
                self._write_out(inline)
                if self._waiters or self._durable_calls:
                    self._wake()
                now = time.perf_counter()
                if now - self._yielded >= _INLINE_YIELD_S:
                    self._yielded = now
                    yield
                continue
            assert waiter is not None
            yield from waiter
        if self._failed_runs:  # nothing has ever failed: nothing to check
            with self._lock:
                self._check(low, high, run_id)

    def failure(self, run_id: str) -> CheckpointFailed | None:
        """The failed write that finished ``run_id`` in this process, if one did: what
        ``sync(run_id)`` raises. A Run's records before it are durable; the rest never
        happened."""
        failed = self._failed_runs.get(run_id)
        return None if failed is None else CheckpointFailed(
            failed.run_ids, failed.cause, lasting=self._poisoned is not None)

    @property
    def broken(self) -> str | None:
        """Why no checkpoint can be written any more in this process (a failed write with no
        replacement segment, or an internal error of the writer); None while it can."""
        return self._poisoned

    def sync_threadsafe(self, run_id: str | None) -> None:
        """``sync`` from a thread other than the loop's (a crew's, driving sync Steps): block
        until every record appended before the call is durable. Raises as ``sync`` does.

        The thread writes the batch itself when no other flush is under way -- no hand-off
        to the loop or the store's thread, which would cost two thread wake-ups per flush --
        and otherwise waits for the flush in progress, which may already hold its records.
        Either way one write + fdatasync still serves every Run that appended meanwhile.
        """
        lock = self._lock
        # acquire/release, not ``with``: a with-statement on a lock costs ~1.5k instructions
        # more (callgrind), and this runs once per sync Step.
        lock.acquire()
        try:
            if run_id in self._failed_runs:
                self._check(0, 0, run_id)
            high = self._appended
            low = self._resolved
            while self._resolved < high:
                if self._inflight is not None:
                    self._flush_waits += 1
                    try:
                        self._flushed.wait()
                    finally:
                        self._flush_waits -= 1
                    continue
                batch = self._inflight = self._take_batch()
                if batch is None:
                    break
                lock.release()
                try:
                    cause = self._write_guarded(batch)
                finally:
                    lock.acquire()
                self._finish_batch(batch, cause)
                self._inflight = None
                if self._flush_waits:
                    self._flushed.notify_all()
                # Coroutines (or when_durable's callbacks) on the loop wait for this batch,
                # or one after it.
                if self._waiters or self._durable_calls:
                    with contextlib.suppress(RuntimeError):  # closed loop: nobody waits
                        self._running_loop_from_thread().call_soon_threadsafe(self._wake)
            if self._failures or self._failed_runs:
                self._check(low, high, run_id)
        finally:
            lock.release()

    def history(self, run_id: str, upto_seq: int) -> list[Record]:
        """The Run's records 1..``upto_seq`` read back from the log (``JournalPort.history``).

        Reads every segment, one read at a time, and decodes those that hold the Run's
        records or a void notice: each read holds one segment and these Runs' records in
        memory while it runs. One read serves every Run whose caller waits for it when it
        begins: the log is the same for all, and one read per Run made the last of many
        followers of restored Runs wait for all the reads before its own. A torn or void
        record never happened (the next host wrote that seq again); a record being appended
        meanwhile is past ``upto_seq``. Any other damage ends the list there (or the gap it
        leaves does: ``read_history``).

        The read begins at the segment each Run's header went to, as the segments' creation
        times and the Run's own tell it (``first_segment``; the earliest of the Runs it
        serves): reading every segment of an old log, some GB, for a Run begun in its last
        ones made the first follower of a restored Run, and the answer recalled behind a
        ``CONFLICT``, wait seconds. A read from there that does not give the Run's first
        record (clocks that went back, damage) is done again over the whole log for that
        Run. One that does gives what the whole log gives: every later record of the Run
        was written after that one, so in a segment from there on (a torn or void copy of
        a record is written again later, never earlier).
        """
        with self._history_mutex:
            self._history_waiting[run_id] += 1
            asked = self._history_reads  # only a read begun after this may serve it
        try:
            with self._history_lock:
                with self._history_mutex:
                    hit = self._history_read.get(run_id)
                    # A read begun before this call could miss records up to ``upto_seq``
                    # (another follower of the same Run, served by it, still holds it here).
                    found = hit[1] if hit is not None and hit[0] > asked else None
                    since = hit[2] if hit is not None else 0
                    if found is None:
                        self._history_reads += 1
                        began = self._history_reads
                        wanted = set(self._history_waiting)
                if found is None:
                    since = min(self._first_segment(rid) for rid in wanted)
                    read = read_histories(self.layout.root, wanted, damage_elsewhere=False,
                                          since=since, without=BULK)
                    found = read[run_id]
                    with self._history_mutex:
                        for rid, entries in read.items():
                            if rid in self._history_waiting:
                                self._history_read[rid] = (began, entries, since)
        finally:
            with self._history_mutex:
                self._history_waiting[run_id] -= 1
                if self._history_waiting[run_id] <= 0:
                    del self._history_waiting[run_id]
                    self._history_read.pop(run_id, None)
        records = _records(found, upto_seq)
        if since and not records and upto_seq > 0:
            whole = read_histories(self.layout.root, [run_id], damage_elsewhere=False,
                                   without=BULK)
            records = _records(whole[run_id], upto_seq)
        return records

    def _first_segment(self, run_id: str) -> int:
        """The segment a read of ``run_id``'s records begins at (``first_segment``), from
        the Run's creation time as its track or its ``done/`` snapshot holds it; 0 (every
        segment) when neither does."""
        with self._tracks_lock:
            track = self._tracks.get(run_id)
            state = track.base if track is not None else None
        if state is None and track is None:
            ended = read_ended(self.layout.root, run_id)
            state = ended.state if ended is not None else None
        return 0 if state is None else first_segment(self.layout.root, state.created_at)

    def ended(self, run_id: str) -> RunState | None:
        """The last state of a Run that has ended, not held by this process (``JournalPort.
        ended``): its ``done/`` snapshot, else the fold of its records in the log (a Run
        that ended just before a crash has no snapshot yet). None for a Run that has not
        ended, or whose journal does not read back whole to its end."""
        found = read_ended(self.layout.root, run_id)
        if found is not None and found.state is not None and found.state.phase == "terminal":
            return found.state
        if not self._tracked(run_id):
            # Nothing a start reads holds it: any Run with records there (since the
            # manifest's start, or pinned) is tracked until its done/ snapshot is written.
            # Its track goes only after that write, so the file is looked at again. Without
            # a file there (a mistyped id) the log was read whole for nothing: every segment
            # of a log of some GB. A damaged file is still stood in for by the log.
            found = read_ended(self.layout.root, run_id)
            if found is not None and found.state is not None and found.state.phase == "terminal":
                return found.state
            if not os.path.lexists(self.layout.done / snapshot_name(run_id)):
                return None
        state: RunState | None = None
        try:
            for record in self.history(run_id, sys.maxsize):
                state = apply(state, record)
        except IllegalTransition:
            return None
        return state if state is not None and state.phase == "terminal" else None

    def _tracked(self, run_id: str) -> bool:
        """Whether this store keeps a track of ``run_id``: restored from the segments a
        start reads, or appended to since, and not yet in a ``done/`` snapshot."""
        with self._tracks_lock:
            return run_id in self._tracks

    def _running_loop_from_thread(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            raise RuntimeError("no event loop has used this store")
        return loop

    def _settle_batch(self, batch: _Batch, cause: str | None) -> None:
        """A batch was written (or failed): count it and let the next flush start."""
        if not self._shared:
            self._finish_batch(batch, cause)
            self._inflight = None
            return
        with self._lock:
            self._finish_batch(batch, cause)
            self._inflight = None
            if self._flush_waits:
                self._flushed.notify_all()

    def _write_out(self, batch: _Batch) -> None:
        """Write the batch just taken (``_inflight``) on this thread."""
        self._settle_batch(batch, self._write_guarded(batch))

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The loop the store is used from. ``asyncio.get_running_loop`` makes a getpid()
        syscall on every call (its fork check); this is asked on every sync."""
        loop = self._loop
        if loop is None or not loop.is_running():
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def share(self) -> None:
        """From the loop, before a thread starts appending and flushing (``sync_threadsafe``)
        for a Run: from now on the loop locks what it shares with that thread."""
        with self._lock:
            self._shared += 1

    def unshare(self) -> None:
        """From that thread, once it will not touch the store again."""
        with self._lock:
            self._shared -= 1

    def _solo(self) -> bool:
        """True when no other Run could join the next flush: flush without a hand-off."""
        last = self._pending_runs
        if len(last) != 1 or self._last_sync_s >= self._inline_max_sync_s:
            return False
        return self._solo_count >= _SOLO_BATCHES and next(iter(last)) == self._solo_run

    def _flush_next(self) -> None:
        """Flush everything pending as one batch (loop thread).

        This runs once every Run woken in this loop iteration has appended and is waiting
        for it. While the disk answers fast, the loop writes and fdatasyncs the batch itself:
        handing it to the store's thread would leave the loop idle all the same, plus two
        thread wake-ups (measured with 64 Runs on a 2-vCPU VM: the loop's wait per Step fell
        from ~7 us to ~4 us blocked in the fdatasync, and Steps/s rose ~10 %). A slow disk
        (``_INLINE_MAX_SYNC_S``) goes back to the thread, so the loop never stalls for long.
        """
        self._kick = None
        self._kick_inline = False
        lock = self._lock if self._shared else None
        if lock is not None:
            lock.acquire()
        try:
            if self._inflight is not None:
                return  # its completion starts the next batch
            batch = self._inflight = self._take_batch()
            if batch is None:
                return
            inline = (self._last_sync_s < self._inline_max_sync_s
                      and not self._may_wait_for_compaction(batch))
        finally:
            if lock is not None:
                lock.release()
        if inline:
            self.inline_flushes += 1
            self._write_out(batch)
            self._wake()
            return
        self._submit(batch)

    def _may_wait_for_compaction(self, batch: _Batch) -> bool:
        """True when this batch rotates the segment while the last compaction still runs:
        the rotation would wait for it, and that wait belongs on the store's thread."""
        if self._file_limit is not None and self._beyond_limit(len(batch.data)):
            # It rotates first, then again after it (it fills half the limit at least),
            # and that rotation waits for the compaction the first began.
            return True
        compactor = self._compactor
        if compactor is None or not compactor.is_alive():
            return False
        return self._rotation_due(self._size + len(batch.data),
                                  len(self._writers | batch.runs.keys()))

    def _beyond_limit(self, size: int) -> bool:
        """``size`` more bytes would leave the segment no room below the file size limit
        for its seal, and a new segment would hold them (this one has frames; a batch too
        big for any segment fails where it is, EFBIG, rather than after a rotation)."""
        limit = self._file_limit
        return (limit is not None and self._frames > 0
                and self._size + size + _SEAL_ROOM > limit
                and size + _SEGMENT_ROOM <= limit)

    def _rotation_due(self, size: int, writers: int) -> bool:
        """A segment of ``size`` bytes written by ``writers`` Runs is full (see _ROTATE_MIN)."""
        return size >= min(self._segment_bytes, max(_ROTATE_MIN, _ROTATE_PER_RUN * writers))

    def when_durable(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` on the loop once every record appended so far is resolved, ahead of
        the coroutines that ``sync`` then resumes (loop thread). Resolved is durable or
        failed: ``failure`` tells which for a Run. Nothing is called for records a closing
        store never flushed.

        For what must not wait for its coroutine's turn: the Runs woken by one flush resume
        one after another, each running its next Step first, so what the last of 64 showed
        its followers waited for the other 63 Steps (a whole round) after the flush."""
        # Locked while a crew's thread may flush (``sync_threadsafe``): it reads the calls
        # to decide whether to wake the loop, and must not miss one added after its batch
        # resolved these records (the call would wait for some later flush).
        lock = self._lock if self._shared else None
        if lock is not None:
            lock.acquire()
        try:
            high = self._appended
            resolved = high <= self._resolved
            if not resolved:
                self._durable_calls.append((high, fn))
        finally:
            if lock is not None:
                lock.release()
        if resolved:  # nothing to wait for: no flush would come to call it
            self._running_loop().call_soon(fn)

    def _wake(self) -> None:
        """Resume every waiter whose records are resolved; start the flush the others need."""
        ready: list[asyncio.Future[None]] = []
        later: list[tuple[int, asyncio.Future[None]]] = []
        due: list[Callable[[], None]] = []
        lock = self._lock if self._shared else None
        if lock is not None:
            lock.acquire()
        try:
            resolved = self._resolved
            for entry in self._waiters:
                if entry[0] > resolved:
                    later.append(entry)
                else:
                    ready.append(entry[1])
            self._waiters = later
            if self._durable_calls:
                waiting: list[tuple[int, Callable[[], None]]] = []
                for high, fn in self._durable_calls:
                    if high > resolved:
                        waiting.append((high, fn))
                    else:
                        due.append(fn)
                self._durable_calls = waiting
            start = bool(later) and self._kick is None and self._inflight is None
        finally:
            if lock is not None:
                lock.release()
        if due:
            # Called here, not queued: the Runs that wait for this flush resume after it in
            # this very loop iteration when it runs on the loop (``sync``'s turn), so a
            # callback queued now would run after all their next Steps. One that raises is
            # the loop's to report, as from a callback it ran, not this flush's.
            loop = self._running_loop()
            for fn in due:
                try:
                    fn()
                except Exception as exc:
                    loop.call_exception_handler({
                        "message": f"Exception in a when_durable callback {fn!r}",
                        "exception": exc,
                    })
        if start:
            # Records appended while the last batch was on disk: start their flush now.
            self._flush_next()
        for waiter in ready:
            if not waiter.done():
                waiter.set_result(None)

    def _submit(self, batch: _Batch) -> None:
        loop = self._running_loop()

        def done(result: Any) -> None:
            cause = result if result is None or isinstance(result, str) else (
                f"the checkpoint writer failed ({type(result).__name__})")
            self._settle_batch(batch, cause)
            self._wake()

        def deliver(cause: Any) -> None:
            loop.call_soon_threadsafe(done, cause)

        self._jobs.put((lambda: self._write_guarded(batch), deliver))

    def _worker(self) -> None:
        """The store's own thread: runs flush and close jobs one at a time, in order."""
        while True:
            job = self._jobs.get()
            if job is None:
                return
            work, deliver = job
            try:
                result: Any = work()
            except BaseException as exc:  # delivered to the waiting coroutine, not lost
                result = exc
            try:
                deliver(result)
            except RuntimeError:
                continue  # the event loop is closed: nobody is waiting any more

    def _stop_worker(self) -> None:
        self._jobs.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join()
            self._join_compaction()  # no snapshot may land after the store stopped

    def sync_blocking(self, run_id: str | None = None) -> None:
        """``sync`` for callers without an event loop (benchmarks, tests)."""
        with self._lock:
            if self._inflight is not None:
                raise RuntimeError("sync_blocking() while an asynchronous flush is in flight")
            low = self._resolved
            batch = self._inflight = self._take_batch()
        if batch is not None:
            self._write_out(batch)
        with self._lock:
            self._check(low, self._resolved, run_id)

    # ------------------------------------------------------------------ writer thread

    def _write_guarded(self, batch: _Batch) -> str | None:
        try:
            return self._write(batch)
        except Exception as exc:  # a bug must fail the batch, never hang its waiters
            self._poisoned = f"internal error in the checkpoint writer ({type(exc).__name__})"
            return self._poisoned

    def _write(self, batch: _Batch) -> str | None:
        if not batch.records:
            return None  # every record in it was dropped (its Run's earlier batch failed)
        if self._poisoned is not None:
            return self._poisoned
        self._flush_no += 1
        n = self._flush_no
        plan = self._faults
        data = batch.data
        if not self._owned(self._fd):
            # Before anything else: a rotation would seal through it.
            cause = (f"the descriptor of wal/{segment_name(self._number)} was closed by "
                     "something else in the host (Workflow code that closed a descriptor it "
                     "did not open?) and no longer opens that segment: nothing more is "
                     "written through it")
            self._forget_fd()  # not ours to close: it may be another file's now
            self._abandon(self._size, cause)
            return cause
        if self._file_limit is not None and self._beyond_limit(len(data)):
            # Rotating at half the limit leaves room for ordinary batches, not for one that
            # carries a State of megabytes: it would fail (EFBIG) where a new segment holds it.
            self._rotate()
        offset = self._size
        fd = self._fd
        if offset + len(data) > self._allocated:
            self._allocated = self._preallocate(fd, self._allocated, offset + len(data))
        armed = self._armed
        step = "write"
        done = 0  # of ``data``, written: where the segment should end if the batch fails
        try:
            if armed and n in plan.torn_write:
                pwrite_all(fd, data[: len(data) // 2], offset)
                _die()
            if armed and n in plan.enospc_sync:
                pwrite_all(fd, data[: len(data) // 2], offset)
                done = len(data) // 2
                raise OSError(errno.ENOSPC, "No space left on device (injected)")
            done = os.pwrite(fd, data, offset)
            while done < len(data):  # os.pwrite may write fewer bytes than asked
                done += os.pwrite(fd, memoryview(data)[done:], offset + done)
            if armed and n in plan.crash_before_sync:
                _die()
            step = "fdatasync"
            if armed and n in plan.fail_sync:
                raise OSError(errno.EIO, "Input/output error (injected)")
            began = time.perf_counter()
            os.fdatasync(self._fd)
            self._last_sync_s = time.perf_counter() - began
            if armed and n in plan.crash_after_sync:
                _die()
            if armed and n in plan.stop_after_sync:
                # The host's signal handler turns this into its ordinary graceful stop.
                os.kill(os.getpid(), signal.SIGTERM)
        except OSError as exc:
            where = f"wal/{segment_name(self._number)}"
            code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            cause = (f"{step} of {where} failed at offset {offset}: "
                     f"{exc.strerror or exc} ({code})")
            self._cut_off(offset, done, armed and n in plan.keep_failed)
            self._abandon(offset, cause)  # the journal's void notice: the fact alone
            # A batch bigger than ulimit -f allows fails EFBIG even in a fresh segment: "File
            # too large" alone named neither the limit nor that the host inherits it.
            limited = limit_fix(exc.errno)
            return f"{cause}; {limited}" if limited is not None else cause
        self._size = end = offset + len(data)
        if end > self._allocated:  # preallocation was refused: the write grew the file
            self._allocated = end
        self._frames += batch.records
        tracks_lock = self._tracks_lock
        tracks_lock.acquire()  # not ``with``: see sync_threadsafe
        try:
            self._track(batch)
        finally:
            tracks_lock.release()
        # Outside the tracks' lock: a rotation may wait for the last compaction, and the
        # loop takes that lock (snapshots_due, at a stop) -- it waited as long, frozen.
        if self._rotation_due(self._size, len(self._writers)):
            self._rotate()
        return None

    def _track(self, batch: _Batch) -> None:
        """Fold a durable batch into the Runs' tracks (what the next snapshot summarises).

        Folded now rather than at the next snapshot: the same work, spread over every flush
        instead of a pause of tens of ms at each rotation. Where the caller passed its fold
        (the executor does), a Run's last record in the batch is all that is needed, and
        ``append`` keeps it (its ``_RunHead``): walking the batch for it cost ~1 % of a Step
        with 64 Runs.
        """
        tracks, held = self._tracks, self._held
        for run_id, seq, state, unfolded in batch.last:
            if held and run_id in held:
                # Never snapshotted while its snapshot file is damaged: a restore after that
                # file is moved out must still find all of its records.
                if self._number not in self._pinned:
                    self._pinned.append(self._number)
                continue
            track = tracks.get(run_id)
            if track is None:
                track = tracks[run_id] = Track(base=None, seq=0)
            if track.status == "ok":
                if unfolded is None:
                    track.base = state
                else:  # records without a fold given: fold them in order
                    state, problem = _fold(track.base if state is None else state, unfolded)
                    if problem is not None:
                        track.status, track.problem = "corrupt", f"Run: {problem}"
                    else:
                        track.base = state
            track.seq = seq
            track.dirty = True
        self._writers.update(batch.runs)

    def _cut_off(self, offset: int, done: int, refused: bool) -> None:
        """Cut the failed batch's bytes (``done`` of them, from ``offset``) off the segment,
        durably, where the disk lets us.

        The void notice alone needs a new segment and a manifest: on a full disk neither can
        be made, and a write that ENOSPC cut short (or an fdatasync that failed) leaves whole
        frames behind it, which the next start read as records. An ``answered`` the client
        was told had failed then came back, applied. Cutting needs no free space on most
        file systems. Only a segment that ends where this batch's bytes do is cut: another
        program that wrote to it (appends land at its real end) put bytes this host's
        count does not know of, and a cut at that count would take acknowledged records with
        them. Best effort: what is not cut (a read-only or failing disk, a full copy-on-write
        one) still gets the notice, below. ``refused``: the ``keep_failed`` fault (a test of
        the notice without the cut)."""
        try:
            if refused:
                raise OSError(errno.EROFS, "Read-only file system (injected)")
            if os.fstat(self._fd).st_size != max(self._allocated, offset + done):
                return
            os.ftruncate(self._fd, offset)
            os.fdatasync(self._fd)
        except OSError:
            return

    def _owned(self, fd: int) -> bool:
        """Whether ``fd`` (the open segment's) still opens that segment."""
        check = self._fd_check
        return check is not None and check.holds(fd)

    def _forget_fd(self) -> None:
        """The segment's descriptor is closed (or was never ours to close): drop its check."""
        self._fd = -1
        check, self._fd_check = self._fd_check, None
        if check is not None:
            check.close()

    def _abandon(self, offset: int, cause: str) -> None:
        """Never write to this segment again; void its failed region in a fresh one."""
        old = self._number
        if self._fd >= 0:
            # Closing may report the same failure again; the segment is abandoned anyway.
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._forget_fd()
        notice = VoidNotice(segment=old, offset=offset, cause=cause)
        self._voids.append(notice)
        frame = encode_frame(KIND_VOID, 0, b"", msgspec.msgpack.encode(notice))
        moved = self._elsewhere()
        if moved is not None:
            self._poisoned = (f"{cause}; no replacement segment was created ({moved}), so no "
                              "later checkpoint can be trusted")
            return
        try:
            self._new_segment(frame)
        except OSError as exc:
            self._poisoned = (f"{cause}; no replacement segment could be created "
                              f"({exc.strerror}), so no later checkpoint can be trusted")
            return
        self._name_replacement()

    def _name_replacement(self) -> None:
        """Write the manifest naming the replacement segment just created as ``open``, its
        ``start`` and the live snapshots as they are. Nothing else names that segment (the
        failed one is never sealed): lost before the next rotation, the records in it, and
        its void notice, would go unnoticed, the Runs resumed from before it. No snapshot is
        written, so a restore still reads the failed segment and notices its loss too."""
        self._join_compaction()  # the manifest never moves back
        if self._moved("replacement"):
            return
        try:
            compact(self.layout, {}, start=self._start, pinned=self._pinned,
                    voids=self._voids, segment=self._number, held=self._held,
                    open_segment=self._number, write_manifest=not self._manifest_kept,
                    writer=self.package_version)
        except NotSummarised as exc:
            self._not_summarised(exc, "replacement")

    def _seal(self, next_segment: int = 0) -> None:
        """Seal the current segment; ``next_segment``: the one a rotation created first."""
        if self._fd < 0:
            return
        if not self._owned(self._fd):  # closed by another, its number another file's now
            self._forget_fd()
            return
        intact = self._check_sealing()
        try:
            if not intact:
                # Bytes another program changed stay as they are: a seal written at the
                # frames' end would overwrite (or leave a hole before) what it said it kept.
                # Unsealed, the segment only lacks its clean-close mark.
                return
            payload = msgspec.msgpack.encode(SealNotice(at=now(), frames=self._frames,
                                                        next=next_segment))
            seal = encode_frame(KIND_SEAL, 0, b"", payload)
            if self._allocated > self._size:
                # The zeros preallocated past the last frame go first, durably: ext4 and
                # XFS write a file's data before they commit its new size, so one
                # fdatasync for both could leave, after a power loss, the seal followed by
                # the old zeros, which a reader takes for bytes after a seal (corruption).
                os.ftruncate(self._fd, self._size)
                self._allocated = self._size
                os.fdatasync(self._fd)
            limit = self._file_limit
            if limit is None or self._size + len(seal) <= limit:
                # Past the file size limit it would be cut short (EFBIG part-way): a
                # damaged end, where no seal is only no clean-close mark.
                pwrite_all(self._fd, seal, self._size)
            os.fdatasync(self._fd)
        except OSError:
            pass  # an unsealed segment only lacks the clean-close mark; its frames stand
        finally:
            os.close(self._fd)
            self._forget_fd()

    def _check_sealing(self) -> bool:
        """Tell (as ``store_file_problem``) of the segment about to be sealed when another
        program changed it while this host wrote it: cut short or written to, removed, or
        opened to others. Judged once, from an ``fstat`` at its seal (a rotation, a close),
        never per flush: appending goes on by descriptor either way, and nothing else would
        say that the log lost records that the Runs' snapshots still hold. Whether its bytes
        are as this host left them (its mode aside): only then is it sealed, its preallocated
        zeros cut off first."""
        try:
            st = os.fstat(self._fd)
        except OSError:
            return False
        name = f"wal/{segment_name(self._number)}"
        facts = []
        written: int | None = None
        unread = False
        if st.st_nlink == 0:
            facts.append("was removed from wal/ while this host wrote it: the records it held "
                         "are gone from the log")
        elif st.st_size != self._allocated:
            facts.append(
                f"is {st.st_size} bytes, but this host made it {self._allocated} (its frames "
                f"end at {self._size}): another program cut it short or wrote to it while "
                "the host ran, so records in it may be lost from the log (the Runs' snapshots "
                "still hold their state; intloom inspect shows which records are missing)")
        else:
            try:
                written = self._written_past_end()
            except OSError:
                unread = True  # not verified: its zeros stay, and nothing is claimed
            if written is not None:
                facts.append(
                    f"has bytes at offset {written} that this host never wrote (its frames end "
                    f"at {self._size}, and it preallocated zeros after them): another program "
                    "wrote to it while the host ran; they are kept as they are")
        intact = not facts and not unread
        loose = file_problem(st)
        if loose is not None and st.st_nlink:
            facts.append(f"{loose} (changed while this host wrote it)")
        if facts:
            self._tell_kept({name: FileProblem(name, "corrupt", "; ".join(facts))})
        return intact

    def _written_past_end(self) -> int | None:
        """The first byte after the segment's frames that is not one of the zeros this host
        preallocated (None: all are), read once per segment, at its seal."""
        offset = self._size
        while offset < self._allocated:
            chunk = os.pread(self._fd, min(1 << 16, self._allocated - offset), offset)
            if not chunk:
                return offset
            zeros = len(chunk) - len(chunk.lstrip(b"\0"))
            if zeros < len(chunk):
                return offset + zeros
            offset += len(chunk)
        return None

    def _rotate(self) -> None:
        if self._size < self._rotate_retry_at:
            return
        old_fd, old_number, old_frames, old_size = self._fd, self._number, self._frames, self._size
        old_check, old_allocated = self._fd_check, self._allocated
        moved = self._elsewhere()
        if moved is not None:
            # Appending goes on in the open segment (by its descriptor: it went along).
            self._rotate_retry_at = self._size + min(self._segment_bytes, _ROTATE_MIN)
            if not self._rotate_failing:
                self._rotate_failing = True
                self._not_summarised(NotSummarised("segment", moved, _MOVED_FIX), "rotation")
            return
        try:
            # Replaced while the host ran (by a link to a directory elsewhere): the new
            # segment would be created there, and the next start, refusing the link, would
            # never read it.
            check_dir(self.layout.wal)
        except IntloomError as exc:
            self._rotate_retry_at = self._size + min(self._segment_bytes, _ROTATE_MIN)
            if not self._rotate_failing:
                self._rotate_failing = True
                self._not_summarised(NotSummarised(
                    "segment", exc.message,
                    effect="The current segment grows on (written by its descriptor); the "
                    "rotation is tried again after each further MiB. The next intloom start "
                    "refuses the store until wal/ is put right as the cause says."), "rotation")
            return
        try:
            self._new_segment(b"")
        except OSError as exc:
            # Appending goes on in the current segment; the rotation is tried again once
            # another segment's worth is written. Tried at every flush, an attempt that got
            # as far as creating its file (then refused a descriptor to fsync the directory,
            # EMFILE) left one more header-only segment each time: thousands a second.
            self._rotate_retry_at = self._size + min(self._segment_bytes, _ROTATE_MIN)
            if not self._rotate_failing:
                self._rotate_failing = True
                self._not_summarised(NotSummarised(
                    "segment", f"no new segment could be created ({exc.strerror or exc})",
                    "The current segment grows on; the rotation is tried again after each "
                    # What refused it, as a failed start says it (the flag, the inodes).
                    "further MiB. " + storage_fix(exc, self.layout.wal / "next.seg",
                                                  replaced=False, then="")),
                    "rotation")
            return
        self._rotate_failing = False
        new_fd, new_number, new_size, new_frames = self._fd, self._number, self._size, 0
        new_check, new_allocated = self._fd_check, self._allocated
        self._fd, self._number, self._frames, self._size = old_fd, old_number, old_frames, old_size
        self._fd_check, self._allocated = old_check, old_allocated
        # The new segment is durable: the seal names it, for a restore to notice if it is
        # lost before the compaction below moves the manifest to it.
        self._seal(new_number)
        self._fd, self._number, self._size, self._frames = new_fd, new_number, new_size, new_frames
        self._fd_check, self._allocated = new_check, new_allocated
        self._compact_behind(self._number)

    def _compact_behind(self, start: int) -> None:
        """Snapshot on a thread of its own, so that flushes never wait for it.

        Snapshots fsync one file per Run (tens of ms for dozens of Runs): done inline, every
        rotation would hold up every Run's next flush that long. The compactor works on
        copies of the tracks; the writer thread settles the originals afterwards, and only
        where nothing was written since. Compactions run one at a time, in order, so a
        snapshot is never overwritten by an older one and the manifest never moves back.
        The flush that rotates may run on the event loop (an inline flush): it waits for the
        previous compaction only when that one took longer than filling a whole segment,
        and inline flushes stop as soon as the disk is slow (``_INLINE_MAX_SYNC_S``).
        """
        self._join_compaction()
        if self._moved("rotation"):
            return
        with self._tracks_lock:  # the last compaction's settle may be dropping tracks
            copies = {run_id: Track(base=t.base, seq=t.seq, status=t.status,
                                    problem=t.problem, reached=t.reached, dirty=True)
                      for run_id, t in self._tracks.items() if t.dirty}
            pinned, voids = list(self._pinned), list(self._voids)
        seqs = {run_id: t.seq for run_id, t in copies.items()}
        segment = self._number

        def work() -> None:
            planted: dict[str, FileProblem] = {}
            try:
                compact(self.layout, copies, start=start, pinned=pinned, voids=voids,
                        segment=segment, held=self._held, open_segment=start,
                        write_manifest=not self._manifest_kept, stop=self._closing,
                        kept=planted, writer=self.package_version,
                        written=self._live_written)
            except NotSummarised as exc:
                # The manifest did not move: restores read more of the log, correctly.
                self._not_summarised(exc, "rotation")
                return
            except WritesStopped:
                return  # the close writes them: their tracks stay dirty
            finally:
                self._tell_kept(planted)
            self._start = start
            for run_id in planted:
                if run_id in copies and copies[run_id].dirty:
                    del seqs[run_id]  # not snapshotted: stays dirty, looked at again next time
            kept = set(copies)  # compact() drops the terminal Runs it moved to done/
            self._jobs.put((lambda: self._settle(seqs, kept), lambda _: None))

        compactor = threading.Thread(target=work, name="intloom-compact", daemon=True)
        try:
            compactor.start()
        except RuntimeError as exc:
            # "can't start new thread" (a process or thread limit, for a moment perhaps): a
            # compaction skipped, as one that fails is. Raised, it failed a batch already
            # durable and poisoned the writer: every later checkpoint of the host failed.
            self._not_summarised(NotSummarised(
                "snapshots", f"no thread could be started for the compaction ({exc})",
                "Raise the host's process or thread limit (ulimit -u, a cgroup's pids.max), "
                "or run fewer sync Steps at once."), "rotation")
            return
        self._compactor = compactor

    def snapshots_due(self) -> int:
        """How many Runs have written since their last snapshot: the files a close writes
        (what a stop's bound on the close scales with)."""
        with self._tracks_lock:
            return sum(1 for track in self._tracks.values()
                       if track.dirty and track.status != "incompatible")

    def compaction_idle(self, timeout: float | None = None) -> bool:
        """Wait until no snapshot compaction runs (at most ``timeout`` s); whether none does.

        For measurements (``scripts/bench``): a compaction that one measurement's writes
        started must not slow the next one, its baseline. Nothing waits on it otherwise.
        """
        compactor = self._compactor
        if compactor is None:
            return True
        compactor.join(timeout)
        return not compactor.is_alive()

    def _join_compaction(self) -> None:
        if self._compactor is not None:
            self._compactor.join()
            self._compactor = None

    def _settle(self, seqs: dict[str, int], kept: set[str]) -> None:
        """After a compaction: Runs with nothing new since their snapshot are clean again."""
        with self._tracks_lock:
            self._settle_locked(seqs, kept)

    def _settle_locked(self, seqs: dict[str, int], kept: set[str]) -> None:
        for run_id, seq in seqs.items():
            track = self._tracks.get(run_id)
            if track is None or track.seq != seq:
                continue
            if run_id in kept:
                track.dirty = False
            else:
                del self._tracks[run_id]  # terminal: its snapshot is in done/

    def _compact(self, start: int) -> None:
        # On failure the manifest does not move: restores read more of the log, correctly.
        self._join_compaction()
        if self._moved("stop"):
            return
        kept: dict[str, FileProblem] = {}
        try:
            compact(self.layout, self._tracks, start=start, pinned=self._pinned,
                    voids=self._voids, segment=self._number, held=self._held,
                    write_manifest=not self._manifest_kept, at_once=True, kept=kept,
                    writer=self.package_version, written=self._live_written)
        except NotSummarised as exc:
            self._not_summarised(exc, "stop")
        self._tell_kept(kept)

    def _close_job(self) -> None:
        if not self._begun:
            return  # nothing was written (``begin``): nothing to seal or summarise
        if self._poisoned is None:
            self._seal()
        elif self._fd >= 0:
            if self._owned(self._fd):
                os.close(self._fd)
            self._forget_fd()
        self._compact(self._next_number)

    # ------------------------------------------------------------------ closing

    async def close(self) -> None:
        """Flush, snapshot unfinished Runs, seal the segment. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._appending = False
        self._closing.set()
        # The failed batch's callers were told; closing still seals what is durable.
        with contextlib.suppress(CheckpointFailed):
            await self.sync()
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()

        def deliver(result: Any) -> None:
            loop.call_soon_threadsafe(finished.set_result, None)

        self._jobs.put((self._close_job, deliver))
        await finished
        self._stop_worker()
        self._unlock()

    def close_blocking(self) -> None:
        """``close`` for callers without an event loop."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._appending = False
        self._closing.set()
        try:
            with contextlib.suppress(CheckpointFailed):
                self.sync_blocking()
            self._stop_worker()
            self._close_job()
        finally:
            self._unlock()  # a close that failed must not leave the directory locked

    def _unlock(self) -> None:
        """Let the next host open the runtime directory (after the last write and snapshot)."""
        self._unhome()
        if self._dir_lock >= 0:
            os.close(self._dir_lock)
            self._dir_lock = -1

    def _unhome(self) -> None:
        if self._home_fd >= 0:
            fd, self._home_fd = self._home_fd, -1
            os.close(fd)

    # ------------------------------------------------------------------ moved away

    def _elsewhere(self) -> str | None:
        """Why nothing may be written by the store's path any more: it no longer leads to
        the directory this store opened (the project directory was moved or renamed while
        the host ran). None while it does, or when that cannot be told."""
        fd = self._home_fd
        if fd < 0:
            return None
        try:
            ours = os.fstat(fd)
            there = os.lstat(self.layout.root)
            if (there.st_dev, there.st_ino) == (ours.st_dev, ours.st_ino):
                return None
            at = "is another directory"
        except (FileNotFoundError, NotADirectoryError):
            at = "does not exist"
        except OSError:
            return None
        now = path_of(fd)
        where = f"; it is now {now}" if now is not None else ""
        return (f"the runtime directory this host opened was moved while it ran{where}, and "
                f"{self.layout.root} {at}, so nothing was written by that path")

    def _moved(self, when: str) -> bool:
        """Skip a compaction (at ``when``) whose snapshots and manifest would be written by
        a path that leads elsewhere now: into a copy of the project put back there, they
        would mix two hosts' journals. Said in the log, as a compaction that failed is."""
        moved = self._elsewhere()
        if moved is None:
            return False
        self._not_summarised(NotSummarised("snapshots", moved, _MOVED_FIX), when)
        return True


_MOVED_FIX: Final = (
    "Stop this host, set its service files aside where the project is now and start it "
    "there (docs/recovery.md, After moving a project directory): its Runs restore from the "
    "log it kept writing in the moved directory.")


def _fold(base: RunState | None,
          records: list[Record]) -> tuple[RunState | None, str | None]:
    """``base`` with ``records`` folded in, or why they do not fold."""
    state = base
    for record in records:
        try:
            state = apply(state, record)
        except IllegalTransition as exc:
            return None, str(exc)
    return state, None


def _run_of(frame: bytes) -> str | None:
    """The run id of a frame ``append`` made."""
    read = framing.frame_of(frame)
    return read.run_id if read is not None else None


def _conforms(store: Store) -> JournalPort:
    return store  # mypy checks here that Store implements the port


def _records(entries: list[HistoryEntry], upto_seq: int) -> list[Record]:
    """A Run's records 1..``upto_seq`` from its history entries, up to the first that is
    not ``ok`` or not the next seq (a torn or void record never happened)."""
    records: list[Record] = []
    for entry in entries:
        if entry.seq > upto_seq:
            break
        if entry.verdict in ("torn", "void"):
            continue
        if entry.verdict != "ok" or entry.record is None or entry.seq != len(records) + 1:
            break
        records.append(entry.record)
    return records
