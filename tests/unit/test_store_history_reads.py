"""What the host's reads of one Run's journal (``Store.ended``, ``Store.history``) read of
the log: only what can hold that Run, not every segment."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import intloom.store.history as history
from intloom.store.snapshots import snapshot_name
from tests.unit.test_store_support import open_store, walk

UNKNOWN = "RUN-01KBZZZZZZZZZZZZZZZZZZZZZZ"


def _segments_read(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The segment files the history reads open, in order (a spy on the real read)."""
    read: list[str] = []
    real: Callable[[Path], bytes | None] = history.read_file

    def counted(path: Path) -> bytes | None:
        read.append(path.name)
        return real(path)

    monkeypatch.setattr(history, "read_file", counted)
    return read


@pytest.mark.timeout(60)
def test_an_id_no_file_names_is_not_looked_for_in_every_segment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mistyped Run id read every segment of the log (some GB) to answer NOT_FOUND."""
    root = tmp_path / "runtime"
    store = open_store(root, segment_bytes=4096)
    for i in range(6):
        run = f"RUN-{i:026d}"
        for record in walk(run, 12, i, terminal=True):
            store.append(run, record)
        store.sync_blocking()
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
