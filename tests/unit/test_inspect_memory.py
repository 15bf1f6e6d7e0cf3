"""``intloom inspect RUN`` holds neither the Run's records nor its output while it writes it:
the Run's large records are kept by place and read again as each is judged, its entries are
made one at a time and written as they come (``--json``) or held as the table's rows only.

It held the Run three ways and more: every payload for its verify, then every entry, their
JSON-shaped copies and the whole document (a 9,000-record Run of 16 KB States, 93 MB of
segments: 517 MB with ``--json``, 128 MB as text; 36-38 MB for either after). Measured with
tracemalloc on a real store written by the real writer; what is written is checked against
what the reads give (the inspect tests check the output itself).
"""

from __future__ import annotations

import io
import json
import os
import sys
import tracemalloc
from pathlib import Path

import pytest

from intloom.cli.app import main
from intloom.runtime.records import Executing, Record, StagePending, StepReady, StepResult
from intloom.store import read_history
from tests.unit.test_store_support import STAGES, header, open_store

pytestmark = pytest.mark.timeout(120)

STATE = 32_000  # bytes of each Stage State
STEPS = 300  # two States a Step: ~19 MB of records


def _records(run_id: str) -> list[Record]:
    blob = b'"' + b"x" * STATE + b'"'
    records: list[Record] = [header(run_id), StagePending(at="t", stage=STAGES[0])]
    for i in range(STEPS):
        step = f"s{i}"
        records += [StepReady(at="t", stage=STAGES[0], step=step, state=blob),
                    Executing(at="t", stage=STAGES[0], step=step, kind="step"),
                    StepResult(at="t", stage=STAGES[0], step=step, outcome="ok", state=blob)]
    return records


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project whose one Run, left unfinished, has ~19 MB of records over segments of
    ~1 MB (a lone Run's host rotates at each flush past 1 MiB)."""
    (tmp_path / "intloom.toml").write_text('workflows = ["workflows/example.py"]\n')
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".intloom").mkdir(mode=0o700)
    root = tmp_path / ".intloom" / "runtime"
    store = open_store(root)
    for n, record in enumerate(_records("RUN-BIG")):
        store.append("RUN-BIG", record)
        if n % 30 == 0:
            store.sync_blocking()
    store.sync_blocking()
    store.close_blocking()
    assert len(list((root / "wal").iterdir())) > 5
    return root


class _Sink(io.TextIOBase):
    """stdout that keeps nothing of what is written but its size and its last bytes."""

    def __init__(self) -> None:
        self.size = 0
        self.kept = ""

    def write(self, text: str) -> int:
        self.size += len(text)
        self.kept = (self.kept + text)[-(1 << 17):]
        return len(text)

    def writable(self) -> bool:
        return True


def _peak(monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, _Sink]:
    """The peak of memory allocated while ``intloom inspect *args`` runs, and its stdout."""
    sink = _Sink()
    monkeypatch.setattr(sys, "stdout", sink)
    with open(os.devnull, "w") as null:
        monkeypatch.setattr(sys, "stderr", null)
        tracemalloc.start()
        try:
            code = main(["inspect", *args])
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert code == 0
    return peak, sink


@pytest.mark.parametrize("mode", [["--json"], []])
def test_inspect_of_a_large_run_holds_a_fraction_of_it(
        runtime: Path, monkeypatch: pytest.MonkeyPatch, mode: list[str]) -> None:
    entries = read_history(runtime, "RUN-BIG")
    journal = sum(p.stat().st_size for p in (runtime / "wal").iterdir())
    assert journal > 19_000_000, journal
    peak, sink = _peak(monkeypatch, "RUN-BIG", *mode)
    # Every record written, each State in full with --json (so the output is ~the Run's
    # size again): nothing was left out to save memory.
    if mode:
        assert sink.size > STATE * 2 * STEPS, sink.size
        assert sink.kept.endswith(']}\n') and f'"seq":{len(entries)}' in sink.kept
    else:
        assert sink.kept.rstrip().splitlines()[-1].startswith(f"{len(entries)} "), sink.kept
    # Held, the Run took 3-5x its size (--json) or ~1x (text, whose verify held every
    # payload): ~21 MB here; now a segment read at a time (~1 MB, and its frames while it
    # is scanned), a record's output and the rows: 2.9 MB (text), 4.3 MB (--json).
    assert peak < journal // 3, (peak, journal)


def test_what_inspect_writes_of_a_large_run_is_every_record_read(
        runtime: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The records written one by one, kept by place and read again, are those a read of the
    Run gives (its States too)."""
    from intloom.cli.render import plain

    sink = io.StringIO()
    monkeypatch.setattr(sys, "stdout", sink)
    assert main(["inspect", "RUN-BIG", "--json"]) == 0
    doc = json.loads(sink.getvalue())
    assert doc["records"] == [plain(e) for e in read_history(runtime, "RUN-BIG")]


def test_a_segment_rewritten_while_its_records_are_read_again_is_refused(
        runtime: Path) -> None:
    """A large record kept by place is read again as it is judged: bytes that are no longer
    the frame scanned there (only something other than a host rewrites a segment) end the
    read as STORAGE_ERROR naming the segment, not a record mixed from two versions."""
    from intloom.diagnostics.journal import read_run
    from intloom.errors import IntloomError
    from tests.unit.test_store_support import flip, frames_of

    read = read_run(runtime, "RUN-BIG")
    assert [e.verdict for e in read.entries][-1] == "ok"
    segment = sorted((runtime / "wal").iterdir())[1]
    state = next(f for f in frames_of(segment, "RUN-BIG") if len(f.payload) > STATE)
    flip(segment, (state.offset + state.end) // 2)
    with pytest.raises(IntloomError) as raised:
        list(read.entries)
    assert raised.value.code == "STORAGE_ERROR", raised.value
    assert segment.name in str(raised.value) and "changed while it was read" in str(
        raised.value), raised.value


def test_inspect_json_refused_before_it_wrote_puts_its_error_on_stdout(
        runtime: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A read that fails while ``inspect --json`` streams its records, before any byte of the
    document went out (a record re-read no longer there as scanned), is the one
    ``{"error": ...}`` document on stdout, as every --json refusal is. It went to stderr,
    as if stdout held a document already, and stdout was left empty."""
    from intloom.diagnostics import journal
    from tests.unit.test_store_support import flip, frames_of

    # The Run's first State: read again before the output's first MiB went out.
    segment = sorted((runtime / "wal").iterdir())[0]
    state = next(f for f in frames_of(segment, "RUN-BIG") if len(f.payload) > STATE)
    read_run = journal.read_run

    def read_then_rewritten(runtime_dir: Path, run_id: str) -> journal.RunRead:
        read = read_run(runtime_dir, run_id)
        flip(segment, (state.offset + state.end) // 2)  # after its scan, before its re-read
        return read

    monkeypatch.setattr(journal, "read_run", read_then_rewritten)
    assert main(["inspect", "RUN-BIG", "--json"]) == 1
    out, err = capsys.readouterr()
    assert err == "", err
    error = json.loads(out)["error"]
    assert error["code"] == "STORAGE_ERROR" and segment.name in error["message"], error
