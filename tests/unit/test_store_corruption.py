"""Damage is located precisely, blamed on the Run it hit, reported, and never repaired:
every damaged file stays byte-identical through reads and through a new host's open."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from intloom.errors import IntloomError
from intloom.runtime.machine import fold
from intloom.runtime.records import StepReady
from intloom.store import read_history, read_runs, read_runs_report, verify, verify_report
from tests.unit.test_store_support import abandon, by_id, frames_of, open_store, walk

RUNS = {"RUN-A": 1, "RUN-B": 2, "RUN-C": 3}
N = 12


def _crashed_host(root: Path, *, close: bool = False) -> Path:
    """Three Runs interleaved in one segment, left as a crash leaves it (or closed cleanly)."""
    store = open_store(root)
    records = {run: walk(run, N, seed) for run, seed in RUNS.items()}
    for i in range(N):
        for run in RUNS:
            store.append(run, records[run][i])
        store.sync_blocking()
    if close:
        store.close_blocking()
    else:
        abandon(store)
    return root / "wal" / "0000000001.seg"


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


def _expected(run: str, n: int = N):  # type: ignore[no-untyped-def]
    return fold(walk(run, N, RUNS[run])[:n])


@pytest.mark.parametrize("where", ["payload", "magic", "length"])
def test_a_flipped_byte_blames_one_run_with_its_location(tmp_path: Path, where: str) -> None:
    root = tmp_path / "runtime"
    segment = _crashed_host(root)
    hit = frames_of(segment, "RUN-B")[5]  # record 6 of RUN-B, mid-segment
    offset = {"payload": hit.end - 3, "magic": hit.offset + 1, "length": hit.offset + 6}[where]
    _flip(segment, offset)
    damaged = segment.read_bytes()

    runs = by_id(read_runs(root))
    assert runs["RUN-A"].status == "ok" and runs["RUN-A"].state == _expected("RUN-A")
    assert runs["RUN-C"].status == "ok" and runs["RUN-C"].state == _expected("RUN-C")
    b = runs["RUN-B"]
    assert b.status == "corrupt" and b.problem is not None
    assert "wal/0000000001.seg" in b.problem and f"offset {hit.offset}" in b.problem
    assert "record 6" in b.problem
    assert b.state == _expected("RUN-B", 5)  # the last good record, for display only
    assert segment.read_bytes() == damaged

    report = read_runs_report(root)
    assert [(f.path, f.kind) for f in report.files] == [("wal/0000000001.seg", "corrupt")]
    verdicts = [h.verdict for h in read_history(root, "RUN-B")]
    assert verdicts[5] == "damaged" and verdicts.count("ok") == N - 1

    # A new host opens the same directory: the damage is retired into a verdict, not fixed.
    store = open_store(root, instance_id="INST-2")
    assert by_id(store.restored.runs)["RUN-B"].status == "corrupt"
    store.close_blocking()
    assert segment.read_bytes() == damaged
    again = by_id(read_runs(root))
    assert again["RUN-B"].status == "corrupt" and again["RUN-B"].problem == b.problem
    assert again["RUN-A"].state == _expected("RUN-A")
    assert by_id(verify(root))["RUN-B"].status == "corrupt"
    assert segment.read_bytes() == damaged


def test_damage_to_a_runs_last_record_is_still_reported(tmp_path: Path) -> None:
    """No later record shows a gap, so the damaged frame itself must be blamed."""
    root = tmp_path / "runtime"
    segment = _crashed_host(root)
    last_a = frames_of(segment, "RUN-A")[-1]
    _flip(segment, last_a.end - 2)
    runs = by_id(read_runs(root))
    assert runs["RUN-A"].status == "corrupt"
    assert f"offset {last_a.offset}" in (runs["RUN-A"].problem or "")
    assert runs["RUN-B"].status == runs["RUN-C"].status == "ok"


def test_damage_in_a_compacted_segment_is_found_by_verify_only(tmp_path: Path) -> None:
    """Startup does not read retired segments (that is the point); verify reads them all."""
    root = tmp_path / "runtime"
    segment = _crashed_host(root, close=True)
    hit = frames_of(segment, "RUN-C")[3]
    _flip(segment, hit.end - 1)
    damaged = segment.read_bytes()
    runs = by_id(read_runs(root))
    assert all(j.status == "ok" for j in runs.values())
    full = by_id(verify(root))
    assert full["RUN-C"].status == "corrupt"
    assert f"offset {hit.offset}" in (full["RUN-C"].problem or "")
    assert full["RUN-A"].status == "ok" and full["RUN-A"].state == _expected("RUN-A")
    assert segment.read_bytes() == damaged


def test_an_incompatible_segment_is_reported_and_untouched(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    segment = _crashed_host(root)
    data = bytearray(segment.read_bytes())
    struct.pack_into(">H", data, 8, 2)  # the format field of the file header
    segment.write_bytes(bytes(data))
    frozen = segment.read_bytes()

    runs = by_id(read_runs(root))
    assert set(runs) == set(RUNS)
    for journal in runs.values():
        assert journal.status == "incompatible" and journal.state is None
        assert "format 2; this intloom reads 1" in (journal.problem or "")

    store = open_store(root, instance_id="INST-2")  # other Runs still work beside it
    for record in walk("RUN-D", 4, 9):
        store.append("RUN-D", record)
    store.sync_blocking()
    store.close_blocking()
    store = open_store(root, instance_id="INST-3")
    store.close_blocking()
    runs = by_id(read_runs(root))
    assert runs["RUN-D"].status == "ok" and runs["RUN-D"].state == fold(walk("RUN-D", 4, 9))
    assert all(runs[r].status == "incompatible" for r in RUNS)  # still reported: pinned
    assert segment.read_bytes() == frozen
    kinds = {(f.path, f.kind) for f in verify_report(root).files}
    assert ("wal/0000000001.seg", "incompatible") in kinds


def test_an_unreadable_newer_segment_is_still_reported(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    (root / "wal").mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    segment = root / "wal" / "0000000001.seg"
    segment.write_bytes(b"ILOOMWAL" + struct.pack(">HII", 7, 0, 0) + b"\x00" * 64)
    segment.chmod(0o600)
    [journal] = read_runs(root)
    assert journal.status == "incompatible" and "format 7" in (journal.problem or "")
    assert "wal/0000000001.seg" in journal.run_id


def test_a_sequence_the_machine_refuses_is_corrupt_with_its_seq(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    store = open_store(root)
    records = walk("RUN-A", 4, 0)
    for record in records:
        store.append("RUN-A", record)
    store.append("RUN-A", StepReady(at="t", stage="elsewhere", step="x"))  # not its Stage
    store.sync_blocking()
    abandon(store)
    journal = by_id(read_runs(root))["RUN-A"]
    assert journal.status == "corrupt" and "seq 5" in (journal.problem or "")
    assert journal.state == fold(records)


def test_a_damaged_manifest_is_read_around_but_never_overwritten(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    _crashed_host(root, close=True)
    manifest = root / "manifest.json"
    manifest.write_bytes(b'{"format": 1, "start": "two"}')
    runs = read_runs_report(root)
    assert runs.stats.full and all(j.status == "ok" for j in runs.runs)
    assert by_id(runs.runs)["RUN-B"].state == _expected("RUN-B")
    with pytest.raises(IntloomError) as info:
        open_store(root, instance_id="INST-2")
    assert info.value.code == "STORAGE_ERROR" and "manifest.json" in info.value.message
    assert manifest.read_bytes() == b'{"format": 1, "start": "two"}'


def test_a_damaged_snapshot_falls_back_to_the_whole_log(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    _crashed_host(root, close=True)
    victim = sorted((root / "snap" / "live").iterdir())[0]
    _flip(victim, 30)
    kept = victim.read_bytes()
    report = read_runs_report(root)
    assert report.stats.full and {f.kind for f in report.files} == {"corrupt"}
    assert all(j.status == "ok" and j.state == _expected(j.run_id) for j in report.runs)
    with pytest.raises(IntloomError) as info:
        open_store(root, instance_id="INST-2")
    assert victim.name in info.value.message
    assert victim.read_bytes() == kept
