"""The store writes, seals and closes only the segment it opened, by its descriptor: Workflow
code in the host can close that descriptor, and a file it opens then takes the number."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from intloom.runtime.ports import CheckpointFailed
from intloom.store.framing import KIND_SEAL, KIND_VOID, scan_segment
from tests.unit.test_store_support import open_store, walk


def _kinds(wal: Path) -> dict[str, list[int]]:
    out = {}
    for path in sorted(wal.glob("*.seg")):
        scanned = scan_segment(path.name, int(path.name[:10]), path.read_bytes())
        out[path.name] = [frame.kind for frame in scanned.frames]
    return out


def test_a_closed_segment_descriptor_is_found_before_a_rotation_seals_through_it(
        tmp_path: Path) -> None:
    """Closed, its number taken by the next segment a rotation (under a file size limit)
    created: that segment was sealed through it, as if it were the old one, and closed,
    and the failure then blamed on Workflow code."""
    records = walk("RUN-A", 400, 3)
    store = open_store(tmp_path)
    for record in records[:300]:
        store.append("RUN-A", record)
    store.sync_blocking()
    os.close(store._fd)  # as Workflow code in the host may
    store._file_limit = store._size + 100  # the next batch rotates first
    store._rotate_retry_at = 0
    for record in records[300:302]:
        store.append("RUN-A", record)
    with pytest.raises(CheckpointFailed) as failed:
        store.sync_blocking()
    assert "was closed by something else in the host" in str(failed.value), failed.value
    store.close_blocking()
    kinds = _kinds(tmp_path / "wal")
    first, *rest = kinds
    assert KIND_SEAL not in kinds[first]  # never sealed: its descriptor was not ours
    assert rest and all(frames[0] == KIND_VOID and KIND_SEAL not in frames[:-1]
                        for frames in (kinds[name] for name in rest)), kinds


def test_a_store_whose_begin_fails_after_making_its_segment_leaves_no_descriptor_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Store.open`` begins the store; when something fails after the segment was created
    (here the crash summary, with an error it does not expect), the open that raises must
    close the segment's descriptor as well: it was left open until garbage collection."""
    from intloom.store import Store, writer

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("summary broke")

    monkeypatch.setattr(writer, "compact", broken)
    runtime = tmp_path / "runtime"
    with pytest.raises(RuntimeError, match="summary broke"):
        Store.open(runtime, instance_id="i", package_version="0")
    assert list((runtime / "wal").glob("*.seg")), "the segment was made before the failure"
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed by now
            continue
        if target.startswith(str(runtime)):
            held.append(target)
    assert held == [], held
