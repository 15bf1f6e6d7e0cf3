"""What the store does per record and per flush stays within what a Step needs: with 64 busy
Runs a flush holds ~190 records, and per-record work there is paid on every Step."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from intloom.runtime.machine import RunState, fold
from intloom.runtime.records import Record, encode_record
from intloom.store import Store, framing, writer
from tests.unit.test_store_support import abandon, frames_of, open_store, walk


def test_a_flush_tracks_each_run_from_its_last_record_and_keeps_no_record_with_a_fold(
        tmp_path: Path) -> None:
    """Each Run's last seq and fold are kept as it appends (its head), and nothing of a
    record but its frame: a tuple per record, in a list and a dict until its batch was
    written, cost ~0.8 % of a Step (64 async Runs, callgrind)."""
    store = open_store(tmp_path / "runtime")
    try:
        runs = {run_id: walk(run_id, 5, seed) for seed, run_id in enumerate(("RUN-A", "RUN-B"))}
        folds = {run_id: fold(records[:1]) for run_id, records in runs.items()}
        for i in range(5):  # interleaved, each with its fold, as the executor appends
            for run_id, records in runs.items():
                if i:
                    folds[run_id] = fold(records[i:i + 1], folds[run_id])
                store.append(run_id, records[i], folds[run_id])
        for records in runs.values():
            for record in records:
                assert gc.get_referrers(record) == [records]
        batch = store._take_batch()
        assert batch is not None
        store._track(batch)
        for run_id, records in runs.items():
            track = store._tracks[run_id]
            assert (track.base, track.seq, track.dirty) == (fold(records), 5, True)
    finally:
        abandon(store)


def test_records_appended_without_a_fold_are_folded_onto_the_last_given_or_the_tracks(
        tmp_path: Path) -> None:
    records = walk("RUN-A", 12, 3)
    given = {1, 2, 3, 7}  # appended with their fold; the others without
    batches = [(0, 2), (2, 5), (5, 9), (9, 12)]  # mixed, none, given last, none given
    store = open_store(tmp_path / "runtime")
    try:
        for start, end in batches:
            for i in range(start, end):
                store.append("RUN-A", records[i], fold(records[:i + 1]) if i in given else None)
            store.sync_blocking()
            track = store._tracks["RUN-A"]
            assert (track.base, track.seq, track.status) == (fold(records[:end]), end, "ok")
    finally:
        store.close_blocking()


def test_a_runs_frame_head_is_made_once_and_frames_its_records_as_encode_frame_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []

    class Counted(writer._RunHead):
        __slots__ = ()

        def __init__(self, run_id: str, seq: int = 0) -> None:
            made.append(run_id)
            super().__init__(run_id, seq)

    monkeypatch.setattr(writer, "_RunHead", Counted)
    root = tmp_path / "runtime"
    store = open_store(root)
    runs = {"RUN-A": walk("RUN-A", 6, 1, terminal=True), "RUN-É-ü": walk("RUN-É-ü", 6, 2)}
    try:
        for i in range(6):
            for run_id, records in runs.items():
                store.append(run_id, records[i])
        store.sync_blocking()
        assert sorted(made) == sorted(runs)  # once per Run, not per record
        assert list(store._heads) == ["RUN-É-ü"]  # an ended Run's is dropped
        # Its seq is kept with it: a dict of seqs was a second lookup and a store per record.
        assert store._heads["RUN-É-ü"].seq == 6
    finally:
        store.close_blocking()
    segment = min((root / "wal").glob("*.seg"))
    data = segment.read_bytes()
    for run_id, records in runs.items():
        frames = frames_of(segment, run_id)
        assert [frame.seq for frame in frames] == [1, 2, 3, 4, 5, 6]
        for frame, record in zip(frames, records, strict=True):
            assert data[frame.offset:frame.end] == framing.encode_frame(
                framing.KIND_RECORD, frame.seq, run_id.encode(), encode_record(record))


def _opcodes(code: Any) -> contextlib.AbstractContextManager[list[int]]:
    """Inside the block, one item per bytecode run in ``code``."""
    @contextlib.contextmanager
    def counting() -> Iterator[list[int]]:
        counted: list[int] = []

        def trace(frame: Any, event: str, arg: Any) -> Any:
            if frame.f_code is not code:
                return None
            frame.f_trace_opcodes = True
            if event == "opcode":
                counted.append(frame.f_lasti)
            return trace

        sys.settrace(trace)
        try:
            yield counted
        finally:
            sys.settrace(None)

    return counting()


def _behind_a_queued_flush(store: Store, step: Callable[[Any], None]) -> None:
    """Two Runs append and the first one's sync queues the round's flush; ``step(sync)``
    runs the second one's sync to its suspension, after which the flush ends it."""
    async def main() -> None:
        for run_id in ("RUN-A", "RUN-B"):
            store.append(run_id, walk(run_id, 1, 0)[0])
        first = asyncio.ensure_future(store.sync("RUN-A"))
        await asyncio.sleep(0)  # it queued the flush
        assert store._kick is not None
        second = store.sync("RUN-B")
        step(second)
        await first  # the flush ran meanwhile: the second's records are durable too
        with pytest.raises(StopIteration):
            second.send(None)

    try:
        asyncio.run(asyncio.wait_for(main(), timeout=20))
    finally:
        store.close_blocking()


def test_a_sync_waiting_for_a_queued_flush_suspends_in_its_own_frame(tmp_path: Path) -> None:
    """All but the first of 64 Runs find the round's flush queued and wait one loop
    iteration for it. Before: sync awaited a generator made for that (a bare yield), one
    more frame per Step to make and to pass the Run's resumption through."""
    def step(second: Any) -> None:
        assert second.send(None) is None  # suspended: a bare yield, to the next iteration
        # Nothing awaited beneath it: a coroutine's cr_await, a generator's gi_yieldfrom.
        assert getattr(second, "cr_await", getattr(second, "gi_yieldfrom", None)) is None

    _behind_a_queued_flush(open_store(tmp_path / "runtime"), step)


def test_a_records_frame_is_kept_as_its_head_and_its_body_not_joined_per_record(
        tmp_path: Path) -> None:
    """The batch joins every frame at its flush: the frame's own concatenation (a copy of
    the record) and its length, three records per Step, were ~0.8 % of a Step."""
    store = open_store(tmp_path / "runtime")
    try:
        records = walk("RUN-A", 2, 0)
        for record in records:
            store.append("RUN-A", record)
        frames = [framing.encode_frame(framing.KIND_RECORD, seq, b"RUN-A", encode_record(record))
                  for seq, record in enumerate(records, 1)]
        pending = store._pending_frames
        assert len(pending) == 4  # before: 2, a frame each
        assert [pending[0] + pending[1], pending[2] + pending[3]] == frames
        assert pending[1].endswith(encode_record(records[0]))  # the body is one item
        batch = store._take_batch()
        assert batch is not None
        assert (batch.data, batch.records) == (b"".join(frames), 2)
    finally:
        abandon(store)


def _append_bytecodes(store: Store, run_id: str, record: Record, state: RunState | None) -> int:
    """How many bytecodes ``store.append`` runs for ``record``."""
    with _opcodes(Store.append.__code__) as counted:
        store.append(run_id, record, state)
    return len(counted)


def test_a_record_the_executor_appends_takes_few_bytecodes(tmp_path: Path) -> None:
    """Three records per Step, each of a Run that appended before, with its fold, in a
    store no thread shares. Before: 140 and 132 bytecodes (the first and a later one of
    a batch); now 132 and 124: the store's two facts (begun, not closed) read as one, the
    Run's head found by a subscript, and the check of a close racing a thread's append
    made only when a thread shares the store."""
    store = open_store(tmp_path / "runtime")
    try:
        records = walk("RUN-A", 4, 0)
        for record in records:  # frames of these sizes made before: their length's crc kept
            store.append("RUN-B", record)
        state = fold(records[:1])
        store.append("RUN-A", records[0], state)
        store.sync_blocking()
        counts = []
        for record in records[1:]:
            state = fold([record], state)
            counts.append(_append_bytecodes(store, "RUN-A", record, state))
        assert counts[0] <= 134 and counts[1] <= 126, counts
    finally:
        store.close_blocking()


def test_a_sync_finds_the_rounds_flush_queued_for_the_loop_in_one_read(
        tmp_path: Path) -> None:
    """All but the first of 64 Runs find the round's flush queued, to run on the loop: the
    Run that queued it found what that takes (no thread shares the store, no batch is in
    flight, the disk is fast). Before: each Run read those four facts again, 31 bytecodes to
    its suspension; now 19. (Before the first round of cuts: the whole general decision,
    the lock's, the batch's and the waiter's, 69.)"""
    counted: list[int] = []

    def step(second: Any) -> None:
        with _opcodes(Store.sync.__code__) as ran:
            second.send(None)  # to its suspension
        counted.extend(ran)

    _behind_a_queued_flush(open_store(tmp_path / "runtime"), step)
    assert 0 < len(counted) <= 20, len(counted)
