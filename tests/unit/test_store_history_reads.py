"""What the host's reads of one Run's journal (``Store.ended``, ``Store.history``) read of
the log: only what can hold that Run, not every segment."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from intloom.runtime.records import Record
from intloom.store import Store
from intloom.store.compaction import now
from intloom.store.files import read_file
from intloom.store.snapshots import snapshot_name
from tests.unit.test_store_support import frames_of, open_store, walk

UNKNOWN = "RUN-01KBZZZZZZZZZZZZZZZZZZZZZZ"


def _six_ended(store: Store) -> None:
    """Six ended Runs of 12 records, each made durable on its own (several segments at
    4 KiB)."""
    for i in range(6):
        run = f"RUN-{i:026d}"
        for record in walk(run, 12, i, terminal=True):
            store.append(run, record)
        store.sync_blocking()


def _segments_read(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The segment files the history reads open, in order (a spy on the real read)."""
    read: list[str] = []
    real: Callable[[Path], bytes | None] = read_file

    def counted(path: Path) -> bytes | None:
        read.append(path.name)
        return real(path)

    monkeypatch.setattr("intloom.store.history.read_file", counted)
    return read


@pytest.mark.timeout(60)
def test_an_id_no_file_names_is_not_looked_for_in_every_segment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mistyped Run id read every segment of the log (some GB) to answer NOT_FOUND."""
    root = tmp_path / "runtime"
    store = open_store(root, segment_bytes=4096)
    _six_ended(store)
    store.close_blocking()
    assert len(list((root / "wal").glob("*.seg"))) > 1
    ended = "RUN-" + "0" * 26
    store = open_store(root, instance_id="INST-2")
    try:
        read = _segments_read(monkeypatch)
        assert store.ended(UNKNOWN) is None
        assert read == [], read
        state = store.ended(ended)  # its done/ snapshot
        assert state is not None and state.phase == "terminal"
        assert read == [], read

        # A done/ file that does not decode is still stood in for by the log.
        done = root / "snap" / "done" / snapshot_name(ended)
        done.write_bytes(b"not a snapshot")
        state = store.ended(ended)
        assert state is not None and state.phase == "terminal"
        assert read, "the log was not read"
    finally:
        store.close_blocking()


@pytest.mark.timeout(60)
def test_a_run_ended_since_the_start_is_read_from_the_log_until_its_snapshot_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "runtime"
    store = open_store(root)
    try:
        run = "RUN-" + "1" * 26
        for record in walk(run, 12, 1, terminal=True):
            store.append(run, record)
        store.sync_blocking()
        assert not (root / "snap" / "done" / snapshot_name(run)).exists()
        read = _segments_read(monkeypatch)
        state = store.ended(run)
        assert state is not None and state.phase == "terminal"
        assert read, "the log was not read"
    finally:
        store.close_blocking()


def _log(root: Path, at: str | None) -> tuple[list[Record], list[Record], int]:
    """Six ended Runs over several segments, then RUN-X (unfinished) and RUN-Y (ended),
    whose headers say ``at`` (None: when they are written); closed cleanly. Returns their
    records and the first segment holding RUN-X's."""
    store = open_store(root, segment_bytes=4096)
    _six_ended(store)
    runs: list[list[Record]] = []
    for run, seed, ended in (("RUN-" + "X" * 26, 7, False), ("RUN-" + "Y" * 26, 8, True)):
        records = walk(run, 12, seed, terminal=ended)
        records[0] = msgspec.structs.replace(records[0], at=at or now())
        for record in records:
            store.append(run, record)
        store.sync_blocking()
        runs.append(records)
    store.close_blocking()
    segments = sorted((root / "wal").glob("*.seg"))
    first = next(int(seg.stem) for seg in segments if frames_of(seg, "RUN-" + "X" * 26))
    assert first > 2, first
    return runs[0], runs[1], first


@pytest.mark.timeout(60)
def test_a_runs_history_is_read_from_the_segment_its_header_went_to(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first follower of a restored Run, and the answer recalled behind a CONFLICT for an
    ended one, read every segment of the log (some GB: seconds) to rebuild its history."""
    root = tmp_path / "runtime"
    x, y, first = _log(root, None)
    store = open_store(root, instance_id="INST-2")
    try:
        read = _segments_read(monkeypatch)
        assert store.history("RUN-" + "X" * 26, 12) == x  # restored: its track says when
        assert read and min(read) == f"{first:010d}.seg", (read, first)
        read.clear()
        assert store.history("RUN-" + "Y" * 26, 12) == y  # ended: its done/ snapshot does
        assert read and min(read) >= f"{first:010d}.seg", (read, first)
        read.clear()
        assert store.history("RUN-" + "X" * 26, 1 << 40) == x  # all there is (Store.ended)
        assert read and min(read) == f"{first:010d}.seg", (read, first)
    finally:
        store.close_blocking()


@pytest.mark.timeout(60)
def test_a_read_from_a_header_time_the_segments_contradict_is_done_over_the_whole_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A header stamped later than it was written (a clock that went back since) points
    past the Run's records: what that read gives falls short, and the whole log is read."""
    root = tmp_path / "runtime"
    x, _, _ = _log(root, "2999-01-01T00:00:00+00:00")
    store = open_store(root, instance_id="INST-2")
    try:
        read = _segments_read(monkeypatch)
        assert store.history("RUN-" + "X" * 26, 12) == x
        assert "0000000001.seg" in read, read
        assert store.history("RUN-" + "X" * 26, 5) == x[:5]
    finally:
        store.close_blocking()


@pytest.mark.timeout(60)
def test_a_runs_history_for_the_host_holds_its_records_without_their_states(
        tmp_path: Path) -> None:
    """The first follower of a restored Run read its records back with every Stage State:
    1.2 GB of host memory at the peak for a Run with 575 MB of them (200 KB States), for a
    history that shows none. The host's read keeps one segment and the records' lean form."""
    root = tmp_path / "runtime"
    run = "RUN-" + "B" * 26
    records = walk(run, 60, 3)
    big = 256 * 1024
    records = [msgspec.structs.replace(r, state=f"{i:08d}".encode() * (big // 8))
               if getattr(r, "state", None) is not None else r
               for i, r in enumerate(records)]
    with_state = sum(1 for r in records if getattr(r, "state", None) is not None)
    assert with_state >= 10, with_state  # the walk's seed gives States to enough of them
    store = open_store(root, segment_bytes=4 * big)
    for record in records:
        store.append(run, record)
        store.sync_blocking()
    store.close_blocking()
    store = open_store(root, instance_id="INST-2")
    try:
        tracemalloc.start()
        try:
            read = store.history(run, len(records))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    finally:
        store.close_blocking()
    assert [(type(r), r.at) for r in read] == [(type(r), r.at) for r in records]
    assert all(getattr(r, "state", None) is None for r in read)
    # What a history shows of each record is there: its phase, cursor, outcome, answer.
    assert [msgspec.structs.replace(r, state=None) if hasattr(r, "state") else r
            for r in read] == [
        msgspec.structs.replace(r, state=None, **({"output": None} if hasattr(r, "output")
                                                  else {}))
        if hasattr(r, "state") else r for r in records]
    # A segment (~4 States) read, and its frames, not the Run's States twice over (~14 MB
    # here before: the frames of every segment, then the records decoded from them).
    assert peak < 12 * big, (peak, with_state * big)


@pytest.mark.timeout(60)
def test_inspect_text_reads_the_runs_records_without_their_states_and_shows_the_same(
        tmp_path: Path) -> None:
    """``intloom inspect RUN`` (text) shows no Stage State, yet read each record with its
    State and held them all: 951 MB for a Run with ~400 MB of records."""
    from intloom.cli.render import history_rows, plain
    from intloom.diagnostics.journal import read_journal

    root = tmp_path / "runtime"
    run = "RUN-" + "C" * 26
    big = 256 * 1024
    records = [msgspec.structs.replace(r, state=f"{i:08d}".encode() * (big // 8))
               if getattr(r, "state", None) is not None else r
               for i, r in enumerate(walk(run, 60, 3, terminal=True))]
    store = open_store(root)
    for record in records:
        store.append(run, record)
        store.sync_blocking()
    store.close_blocking()
    whole, _, _ = read_journal(root, run)
    tracemalloc.start()
    try:
        lean, journal, _ = read_journal(root, run, states=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert journal is not None and journal.status == "ok", journal
    assert any(getattr(e.record, "state", None) for e in whole)
    assert not any(getattr(e.record, "state", None) for e in lean)
    assert history_rows([plain(e) for e in lean]) == history_rows([plain(e) for e in whole])
    # The verify of the Run it makes first holds the Run's payloads (~1.15x its States);
    # the read after it held them all again, ~2x at the peak (before plain() made text of
    # each State for a table that shows none).
    states = sum(len(getattr(r, "state", None) or b"") for r in records)
    assert peak < 1.4 * states, (peak, states)
