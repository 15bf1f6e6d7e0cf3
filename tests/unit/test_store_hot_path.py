"""What the store does per record and per flush stays within what a Step needs: with 64 busy
Runs a flush holds ~190 records, and per-record work there is paid on every Step."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

from intloom.runtime.machine import fold
from tests.unit.test_store_support import abandon, open_store, walk


class _Unwalked(list[Any]):
    """A batch's records, which a flush's tracking must not walk."""

    def __iter__(self) -> NoReturn:
        raise AssertionError("the flush walked every record of its batch")

    def __reversed__(self) -> NoReturn:
        raise AssertionError("the flush walked every record of its batch")


def test_a_flush_tracks_each_run_from_its_last_record_without_walking_the_batch(
        tmp_path: Path) -> None:
    store = open_store(tmp_path / "runtime")
    try:
        runs = {run_id: walk(run_id, 5, seed) for seed, run_id in enumerate(("RUN-A", "RUN-B"))}
        folds = {run_id: fold(records[:1]) for run_id, records in runs.items()}
        for i in range(5):  # interleaved, each with its fold, as the executor appends
            for run_id, records in runs.items():
                if i:
                    folds[run_id] = fold(records[i:i + 1], folds[run_id])
                store.append(run_id, records[i], folds[run_id])
        batch = store._take_batch()
        assert batch is not None
        batch.entries = _Unwalked(batch.entries)
        store._track(batch)
        for run_id, records in runs.items():
            track = store._tracks[run_id]
            assert (track.base, track.seq, track.dirty) == (fold(records), 5, True)
    finally:
        abandon(store)
