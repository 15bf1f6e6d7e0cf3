"""What the executor needs from the outside world, as protocols (the store implements them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from intloom.runtime.machine import RunState
from intloom.runtime.records import Record

__all__ = ["CheckpointFailed", "JournalPort", "RecordTooLarge"]


class CheckpointFailed(Exception):
    """A durable write failed. ``run_ids`` are the Runs whose records were in the failed batch."""

    def __init__(self, run_ids: frozenset[str], cause: str, *, lasting: bool = False) -> None:
        self.run_ids = run_ids
        self.cause = cause
        # True when the journal takes no checkpoint at all any more in this process (no
        # replacement segment could be created): a retry fails too, until a restart.
        self.lasting = lasting
        super().__init__(f"checkpoint write failed for {len(run_ids)} Run(s): {cause}")


class RecordTooLarge(ValueError):
    """A record whose frame would exceed the journal's limit (``framing.MAX_BODY``): refused
    before anything is written, as a reader takes a longer frame for damage."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"the record is {size:,} bytes encoded; a journal record holds at "
                         f"most {limit:,}")


class JournalPort(Protocol):
    """The durability point. ``append`` buffers; ``sync`` makes every appended record durable.

    One ``sync`` serves every Run that appended since the last flush (group commit). With a
    ``run_id``, ``sync`` raises :class:`CheckpointFailed` only if that Run's records were in a
    failed batch (whoever flushed it); a record whose batch failed is never later read back as
    valid.
    """

    def append(self, run_id: str, record: Record, state: RunState | None = None) -> None:
        """Raises :class:`RecordTooLarge` (nothing buffered) for a record the journal
        cannot hold."""
        ...

    def append_many(self, run_id: str, records: tuple[Record, ...],
                    state: RunState | None = None) -> None:
        """``append`` each of ``records`` in turn, ``state`` the fold after the last: all of
        them, or (raising as ``append`` does) none."""
        ...

    async def sync(self, run_id: str | None = None) -> None: ...

    def failure(self, run_id: str) -> CheckpointFailed | None:
        """The failed write that finished ``run_id`` in this process, if any: what
        ``sync(run_id)`` would raise."""
        ...

    @property
    def broken(self) -> str | None:
        """Why no checkpoint can be written any more in this process (no replacement for a
        failed segment), or None: a request whose record must be saved is refused up front
        then, its Run left as it is."""
        ...

    def when_durable(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` on the event loop once every record appended so far is durable or
        failed (``failure`` tells which), before ``sync`` resumes the coroutines waiting for
        the same flush; from the loop."""
        ...

    def share(self) -> None:
        """Before a thread starts appending and syncing (``sync_threadsafe``): from the loop."""
        ...

    def unshare(self) -> None:
        """From that thread, once it is done."""
        ...

    def sync_threadsafe(self, run_id: str | None) -> None:
        """``sync``, blocking, from a thread other than the event loop's."""
        ...

    def history(self, run_id: str, upto_seq: int) -> list[Record]:
        """The Run's durable records 1..``upto_seq``, in order, up to the first one that
        does not read back whole (damage is ``inspect``'s to report). A record may come
        without its bulk (a Stage State, a Step's output, an effect's result: None), which
        its callers -- views, events, answers, task outcomes -- never read. Blocking file
        I/O: call it from a worker thread."""
        ...

    def ended(self, run_id: str) -> RunState | None:
        """The last state of a Run that ended before this process opened the journal (it is
        never restored), as its journal holds it; None when none did. Blocking file I/O:
        call it from a worker thread."""
        ...
