"""A whole verify keeps where each record is, not its payload, until it judges its Run, and
gives the findings a verify holding every payload gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

import intloom.store.reader as reader
from intloom.runtime.machine import fold
from intloom.runtime.records import Executing, Record, StagePending, StepReady, StepResult
from intloom.store import verify_report
from intloom.store.reader import StoreReport, load
from tests.helpers import snapshot_files
from tests.unit.test_store_support import (
    STAGES,
    abandon,
    by_id,
    flip,
    frames_of,
    header,
    open_store,
    walk,
)

STAGE = STAGES[0]


def _big(run_id: str, steps: int, size: int) -> list[Record]:
    """A Run of ``steps`` Steps, each State ``size`` bytes (as ready and as its result)."""
    blob = b'"' + b"x" * size + b'"'
    records: list[Record] = [header(run_id), StagePending(at="t", stage=STAGE)]
    for i in range(steps):
        records += [StepReady(at="t", stage=STAGE, step=f"s{i}", state=blob),
                    Executing(at="t", stage=STAGE, step=f"s{i}", kind="step"),
                    StepResult(at="t", stage=STAGE, step=f"s{i}", outcome="ok", state=blob)]
    return records


def _held(root: Path) -> StoreReport:
    return reader._report(load(root, "verify", hold=True), include_terminal=True)


def _findings(report: StoreReport) -> Any:
    doc = msgspec.to_builtins(report)
    del doc["stats"]["payload_bytes_held"]  # the one thing the two reads differ in
    return doc


@pytest.mark.timeout(60)
def test_a_whole_verify_holds_no_record_payload_while_it_reads_the_log(tmp_path: Path) -> None:
    """It held every payload until it judged: 552 MB for 76k Runs, 1.27 GB for a 1.2 GB log."""
    root = tmp_path / "runtime"
    store = open_store(root, segment_bytes=256 << 10)
    records = {run: _big(run, 4, 20_000) for run in ("RUN-A", "RUN-B", "RUN-C")}
    for i in range(14):
        for run, recs in records.items():
            store.append(run, recs[i])
        store.sync_blocking()
    abandon(store)
    segments = sorted((root / "wal").glob("*.seg"))
    assert len(segments) > 1, segments
    payloads = sum(len(f.payload) for seg in segments for run in records
                   for f in frames_of(seg, run))
    assert payloads > 24 * 20_000, payloads  # eight States of each Run

    report = verify_report(root)
    runs = by_id(report.runs)
    assert {run: (j.status, j.state) for run, j in runs.items()} == {
        run: ("ok", fold(recs)) for run, recs in records.items()}
    assert report.stats.records_decoded == 42, report.stats
    # Seals only: every record's payload was read again as its Run was judged.
    assert report.stats.payload_bytes_held < 1024, report.stats
    assert _held(root).stats.payload_bytes_held >= payloads


def _crashed(root: Path) -> Path:
    store = open_store(root)
    records = {run: walk(run, 12, seed) for seed, run in enumerate(("RUN-A", "RUN-B", "RUN-C"))}
    for i in range(12):
        for run, recs in records.items():
            store.append(run, recs[i])
        store.sync_blocking()
    abandon(store)
    return root / "wal" / "0000000001.seg"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("damage", ["none", "payload", "magic", "length", "tail", "cut"])
def test_a_verify_by_place_finds_what_one_holding_every_payload_finds(
        tmp_path: Path, damage: str) -> None:
    root = tmp_path / "runtime"
    segment = _crashed(root)
    hit = frames_of(segment, "RUN-B")[5]
    last = frames_of(segment, "RUN-C")[-1]
    if damage == "cut":
        segment.write_bytes(segment.read_bytes()[: last.end - 3])
    elif damage != "none":
        offset = {"payload": hit.end - 3, "magic": hit.offset + 1, "length": hit.offset + 6,
                  "tail": last.end - 2}[damage]
        flip(segment, offset)
    before = snapshot_files(root)

    lean = verify_report(root)
    assert lean.stats.payload_bytes_held < 1024, lean.stats
    assert _findings(lean) == _findings(_held(root))
    if damage in ("payload", "magic", "length"):
        assert by_id(lean.runs)["RUN-B"].status == "corrupt", lean.runs
    assert snapshot_files(root) == before


@pytest.mark.timeout(60)
def test_a_segment_changed_between_the_two_reads_is_judged_from_one_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Damage that appears after the log was read and before a Run is judged (a payload read
    again from changed bytes) is not folded as a record: the verify reads it all again."""
    root = tmp_path / "runtime"
    segment = _crashed(root)
    hit = frames_of(segment, "RUN-B")[5]
    judge_all = reader._judge_all
    calls = 0

    def damaged_meanwhile(*args: Any, **kwargs: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            flip(segment, hit.end - 3)
        judge_all(*args, **kwargs)

    monkeypatch.setattr(reader, "_judge_all", damaged_meanwhile)
    report = verify_report(root)
    assert calls == 2, calls  # judged again, from a read of the damaged file
    b = by_id(report.runs)["RUN-B"]
    assert b.status == "corrupt" and b.problem is not None, b
    assert f"wal/0000000001.seg offset {hit.offset}" in b.problem, b.problem
    monkeypatch.setattr(reader, "_judge_all", judge_all)
    assert _findings(report) == _findings(verify_report(root))
