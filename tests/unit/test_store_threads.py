"""Threads that drive sync Steps append and flush on their own (``Store.sync_threadsafe``)
while the loop keeps appending and flushing for other Runs: one log, in order, group commit
across both sides, and a failed batch fails exactly its Runs whoever wrote it."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from intloom.runtime.machine import fold
from intloom.runtime.ports import CheckpointFailed
from intloom.runtime.records import Record
from intloom.store import FaultPlan, read_runs
from intloom.store.writer import Store
from tests.helpers import eventually
from tests.unit.test_store_support import by_id, open_store, walk


def _drive_on_thread(store: Store, run_id: str, records: list[Record],
                     errors: list[BaseException],
                     start: threading.Barrier) -> threading.Thread:
    """A thread walking one Run as Driver._steps_here does: append, then sync_threadsafe."""

    def work() -> None:
        try:
            start.wait(timeout=10)
            for record in records:
                store.append(run_id, record)
                store.sync_threadsafe(run_id)
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)
        finally:
            store.unshare()

    store.share()  # on the loop, before the thread exists (as Driver._on_thread does)
    thread = threading.Thread(target=work, name=f"drive-{run_id}", daemon=True)
    thread.start()
    return thread


@pytest.mark.timeout(60)
def test_threads_and_the_loop_write_one_log_and_share_flushes(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    per = 40
    on_loop = {f"RUN-L{i:02d}": walk(f"RUN-L{i:02d}", per, i) for i in range(16)}
    on_threads = {f"RUN-T{i}": walk(f"RUN-T{i}", per, 100 + i) for i in range(4)}
    errors: list[BaseException] = []

    async def main() -> tuple[int, int]:
        store = open_store(root)
        start = threading.Barrier(len(on_threads) + 1)
        threads = [_drive_on_thread(store, r, recs, errors, start)
                   for r, recs in on_threads.items()]

        async def one(run_id: str) -> None:
            for record in on_loop[run_id]:
                store.append(run_id, record)
                await store.sync(run_id)

        await asyncio.to_thread(start.wait, 10)
        await asyncio.gather(*(one(r) for r in on_loop))
        for thread in threads:
            # Joined off the loop: a thread may be waiting for a loop-side wake-up.
            await asyncio.to_thread(thread.join, 30)
            assert not thread.is_alive(), f"{thread.name} did not finish"
        flushes, flushed = store.flushes, store.records_flushed
        assert store._shared == 0, "every thread that shared the store gave it back"
        await store.close()
        return flushes, flushed

    flushes, flushed = asyncio.run(main())
    assert errors == []
    total = per * (len(on_loop) + len(on_threads))
    assert flushed == total
    # Group commit still holds: far fewer flushes than records (one each would be `total`).
    assert flushes <= total // 4, f"{flushes} flushes for {flushed} records"
    journals = by_id(read_runs(root))
    for run_id, records in {**on_loop, **on_threads}.items():
        assert journals[run_id].status == "ok"
        assert journals[run_id].state == fold(records), run_id


@pytest.mark.timeout(30)
def test_a_failed_flush_by_a_thread_fails_the_loop_runs_in_its_batch(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    loop_run, thread_run = walk("RUN-L", 3, 1), walk("RUN-T", 3, 2)

    async def main() -> None:
        store = open_store(root, faults=FaultPlan(fail_sync=frozenset({2})))
        store.append("RUN-L", loop_run[0])
        store.append("RUN-T", thread_run[0])
        await store.sync()  # flush 1
        store.append("RUN-L", loop_run[1])  # joins the thread's batch: flush 2 fails
        store.share()

        def on_thread() -> BaseException | None:
            try:
                store.append("RUN-T", thread_run[1])
                store.sync_threadsafe("RUN-T")
            except CheckpointFailed as exc:
                return exc
            finally:
                store.unshare()
            return None

        failed = await asyncio.to_thread(on_thread)
        assert isinstance(failed, CheckpointFailed)
        assert failed.run_ids == frozenset({"RUN-L", "RUN-T"})
        assert "fdatasync" in failed.cause
        with pytest.raises(CheckpointFailed) as info:
            await store.sync("RUN-L")  # the loop's Run learns it from its own sync
        assert info.value.run_ids == frozenset({"RUN-L", "RUN-T"})
        with pytest.raises(CheckpointFailed):
            store.append("RUN-T", thread_run[2])  # finished for this process
        await store.close()

    asyncio.run(main())
    journals = by_id(read_runs(root))
    # The failed bytes never read back: each Run ends at its last durable record.
    assert journals["RUN-L"].state == fold(loop_run[:1])
    assert journals["RUN-T"].state == fold(thread_run[:1])


@pytest.mark.timeout(30)
def test_a_loop_waiter_is_woken_by_a_thread_flush(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop's sync waits while a thread's batch is being written; that thread's flush
    (holding the loop's record or not) must wake it, or the Run would hang."""
    root = tmp_path / "runtime"
    loop_run, thread_run = walk("RUN-L", 2, 3), walk("RUN-T", 2, 4)
    writing, release = threading.Event(), threading.Event()

    async def main() -> None:
        store = open_store(root)
        real_write = Store._write_guarded

        def slow_write(self, batch):  # type: ignore[no-untyped-def]
            if threading.current_thread() is not threading.main_thread():
                writing.set()
                assert release.wait(10)
            return real_write(self, batch)

        # On the class: a Store has slots, no instance dict to shadow a method in.
        monkeypatch.setattr(Store, "_write_guarded", slow_write)
        store.share()

        def on_thread() -> None:
            try:
                for record in thread_run:
                    store.append("RUN-T", record)
                    store.sync_threadsafe("RUN-T")
            finally:
                store.unshare()

        done = asyncio.ensure_future(asyncio.to_thread(on_thread))
        assert await asyncio.to_thread(writing.wait, 10)  # the thread's batch is in flight
        store.append("RUN-L", loop_run[0])
        waiting = asyncio.ensure_future(store.sync("RUN-L"))
        await asyncio.sleep(0)  # let it register behind the batch in flight
        assert not waiting.done()
        release.set()
        await asyncio.wait_for(waiting, 10)
        await asyncio.wait_for(done, 10)
        store.append("RUN-L", loop_run[1])
        await store.sync("RUN-L")
        await store.close()

    asyncio.run(main())
    journals = by_id(read_runs(root))
    assert journals["RUN-L"].state == fold(loop_run)
    assert journals["RUN-T"].state == fold(thread_run)


def test_a_history_read_begun_before_a_call_never_serves_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Followers waiting together share one read of the log (``Store.history``), but a read
    that began before a call may lack records the call asks for: a second follower of the
    same Run, arriving while the first still held a read's result, was served those records
    and got a history cut short of its ``upto_seq``."""
    import intloom.store.writer as writer_module
    from intloom.store.history import read_histories as real

    records = walk("RUN-A", 5, 1)
    store = open_store(tmp_path / "runtime")
    try:
        for record in records[:3]:
            store.append("RUN-A", record)
        store.sync_blocking()
        read_done, go_on = threading.Event(), threading.Event()
        reads: list[set[str]] = []

        def paused(*args: object, **kwargs: object) -> object:
            found = real(*args, **kwargs)  # type: ignore[arg-type]
            reads.append(set(found))
            if len(reads) == 1:  # the first read: held until the second caller has asked
                read_done.set()
                go_on.wait(timeout=10)
            return found

        monkeypatch.setattr(writer_module, "read_histories", paused)
        got: dict[str, list[Record]] = {}
        first = threading.Thread(target=lambda: got.update(first=store.history("RUN-A", 3)))
        first.start()
        assert read_done.wait(timeout=10)
        for record in records[3:]:
            store.append("RUN-A", record)
        store.sync_blocking()  # records 4 and 5 are in the log after that read
        second = threading.Thread(target=lambda: got.update(second=store.history("RUN-A", 5)))
        second.start()
        eventually(lambda: store._history_waiting["RUN-A"] >= 2, timeout=10,
                   what="the second history call to ask")
        go_on.set()
        first.join(timeout=10)
        second.join(timeout=10)
        assert got["first"] == records[:3]
        assert got["second"] == records, len(got["second"])
        assert len(reads) == 2  # the second call read the log again
    finally:
        store.close_blocking()
