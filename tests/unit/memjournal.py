"""An in-memory JournalPort for unit tests of the executor (the real store is tested apart,
and every end-to-end test runs the real one)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from intloom.runtime.machine import RunState, apply
from intloom.runtime.ports import CheckpointFailed
from intloom.runtime.records import Record


class MemoryJournal:
    def __init__(self) -> None:
        self.records: list[tuple[str, Record]] = []
        self.pending: list[tuple[str, Record]] = []
        self.flushes = 0
        self.fail_at: set[int] = set()
        self.failed: dict[str, CheckpointFailed] = {}  # Run -> the failed flush that held it
        self._lock = threading.Lock()  # sync Steps append and flush from their threads
        self.durable_calls: list[Callable[[], None]] = []
        self.broken: str | None = None  # JournalPort.broken: set by a test

    def append(self, run_id: str, record: Record, state: object = None) -> None:
        with self._lock:
            self.pending.append((run_id, record))

    def append_many(self, run_id: str, records: tuple[Record, ...],
                    state: object = None) -> None:
        for record in records:
            self.append(run_id, record, state)

    async def sync(self, run_id: str | None = None) -> None:
        await asyncio.sleep(0)  # yield like a real flush would
        try:
            self._flush()
        finally:
            calls, self.durable_calls = self.durable_calls, []
            for fn in calls:
                asyncio.get_running_loop().call_soon(fn)

    def when_durable(self, fn: Callable[[], None]) -> None:
        self.durable_calls.append(fn)

    def failure(self, run_id: str) -> CheckpointFailed | None:
        return self.failed.get(run_id)

    def share(self) -> None:
        pass  # always locked

    def unshare(self) -> None:
        pass

    def sync_threadsafe(self, run_id: str | None) -> None:
        self._flush()

    def _flush(self) -> None:
        with self._lock:
            if not self.pending:
                return
            self.flushes += 1
            batch, self.pending = self.pending, []
            if self.flushes in self.fail_at:
                failed = CheckpointFailed(frozenset(r for r, _ in batch), "injected EIO")
                self.failed.update(dict.fromkeys(failed.run_ids, failed))
                raise failed
            self.records.extend(batch)

    def history(self, run_id: str, upto_seq: int) -> list[Record]:
        return self.of(run_id)[:upto_seq]

    def ended(self, run_id: str) -> RunState | None:
        state: RunState | None = None
        for record in self.of(run_id):
            state = apply(state, record)
        return state if state is not None and state.phase == "terminal" else None

    def of(self, run_id: str) -> list[Record]:
        return [r for rid, r in self.records if rid == run_id]
