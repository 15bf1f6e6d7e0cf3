"""``intloom inspect RUN`` reads the store once: the manifest and every ``live/`` snapshot one
time, each segment's bytes searched once and scanned at most once more by its judgements.

It judged the Run as a verify of it does, then through the log's end (an unfinished Run),
then as a start reads it, each a read of its own: inspect of one small Run among 5,000
waiting and 15,000 ended ones read every live/ snapshot three times (3.0-3.5 s, 99 MB).
These count the real reads of a real store, written by the real writer; the outputs the
reads feed are checked by the inspect tests (tests/e2e/test_inspect_one_run.py and others).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from intloom.cli.app import main
from intloom.diagnostics.journal import read_journal
from intloom.store import files, history, read_ended, read_runs, reader, verify_run
from intloom.store.snapshots import read_manifest, snapshot_name
from tests.unit.test_store_support import open_store, walk

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project whose log has two segments: the first holds RUN-W (left waiting), RUN-E
    (ended) and three more waiting Runs, the second one Run of a later host. Each host
    closed cleanly: the waiting Runs have live/ snapshots, RUN-E a done/ one."""
    (tmp_path / "intloom.toml").write_text('workflows = ["workflows/example.py"]\n')
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".intloom").mkdir(mode=0o700)
    root = tmp_path / ".intloom" / "runtime"
    first = {"RUN-W": 7, "RUN-E": 6, "RUN-O1": 5, "RUN-O2": 8, "RUN-O3": 4}
    for runs in (first, {"RUN-L": 5}):
        store = open_store(root, instance_id=f"INST-{uuid.uuid4()}")
        for n, (run_id, count) in enumerate(runs.items()):
            for record in walk(run_id, count, n, terminal=run_id == "RUN-E"):
                store.append(run_id, record)
        store.sync_blocking()
        store.close_blocking()
    assert len(list((root / "snap" / "live").iterdir())) == 5
    assert sorted(p.name for p in (root / "wal").iterdir()) == ["0000000001.seg",
                                                                "0000000002.seg"]
    return root


class Reads:
    """Every file the store's reader and its history of a Run open, by path under the
    runtime directory."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        self.files: Counter[str] = Counter()
        for name in ("read_snapshot", "read_file"):
            monkeypatch.setattr(reader, name, self._counted(getattr(reader, name)))
        monkeypatch.setattr(history, "read_file", self._counted(files.read_file))
        def manifest(layout: Any) -> Any:
            self.files["manifest.json"] += 1
            return read_manifest(layout)

        monkeypatch.setattr("intloom.store.reader.read_manifest", manifest)

    def _counted(self, real: Callable[[Path], Any]) -> Callable[[Path], Any]:
        def counted(path: Path) -> Any:
            self.files[str(path.relative_to(self.root))] += 1
            return real(path)
        return counted

    def take(self) -> Counter[str]:
        taken, self.files = self.files, Counter()
        return taken

    def of(self, taken: Counter[str], prefix: str) -> dict[str, int]:
        return {path: n for path, n in taken.items() if path.startswith(prefix)}


@pytest.fixture
def reads(runtime: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Reads]:
    yield Reads(runtime, monkeypatch)


def _inspect(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["inspect", *args])
    out, err = capsys.readouterr()
    return code, out + err


@pytest.mark.parametrize("run_id", ["RUN-W", "RUN-E", "RUN-L", "RUN-NOBODY"])
@pytest.mark.parametrize("mode", [[], ["--json"]])
def test_inspect_reads_each_snapshot_and_the_manifest_once(
        capsys: pytest.CaptureFixture[str], runtime: Path, reads: Reads, run_id: str,
        mode: list[str]) -> None:
    """RUN-W: a verify of it, again through the log's end (its segment is not the last),
    then a start's read: every live/ snapshot was read three times, and its segment's bytes
    four. RUN-E (ended) and RUN-L (in the last segment): twice. RUN-NOBODY: twice."""
    code, out = _inspect(capsys, run_id, *mode)
    if run_id == "RUN-NOBODY":
        assert code != 0 and "NOT_FOUND" in out, out
    else:
        assert code == 0 and run_id in out, out
    taken = reads.take()
    live = reads.of(taken, "snap/live/")
    assert len(live) == 5 and set(live.values()) == {1}, taken
    assert taken["manifest.json"] == 1, taken
    # Each segment's bytes: searched for the Run's id once, and scanned once when the Run's
    # verify needs it (a start reads neither: both hosts closed cleanly).
    segments = reads.of(taken, "wal/")
    assert set(segments) == {"wal/0000000001.seg", "wal/0000000002.seg"}, taken
    assert max(segments.values()) <= 2, taken


@pytest.mark.parametrize("run_id", ["RUN-W", "RUN-E", "RUN-L"])
@pytest.mark.parametrize("mode", [[], ["--json"]])
def test_inspect_reads_the_runs_own_segments_once(
        capsys: pytest.CaptureFixture[str], runtime: Path, reads: Reads, run_id: str,
        mode: list[str]) -> None:
    """The segment holding the Run's records is read once: searched for its id and scanned
    from the same bytes, and its records judged for the output from that scan. It was read
    three times: searched, read again to be scanned, and read again by ``read_history``. A
    later segment the verify reads on into (RUN-W's, unfinished) is read twice: searched,
    then scanned."""
    code, out = _inspect(capsys, run_id, *mode)
    assert code == 0 and run_id in out, out
    own = "wal/0000000002.seg" if run_id == "RUN-L" else "wal/0000000001.seg"
    segments = reads.of(reads.take(), "wal/")
    assert segments[own] == 1, segments
    assert segments == {"wal/0000000001.seg": 1,
                        "wal/0000000002.seg": 2 if run_id == "RUN-W" else 1}, segments


def test_one_read_judges_as_the_reads_apart_do(runtime: Path, reads: Reads) -> None:
    """What the shared read gives is what each judgement read alone gives: the verify of the
    Run, the Run as a start reads it (``read_runs``, or an ended Run's done/ snapshot)."""
    from intloom.diagnostics.journal import read_run

    for run_id in ("RUN-W", "RUN-E", "RUN-L", "RUN-O2"):
        read = read_run(runtime, run_id)
        entries, journal, files = read_journal(runtime, run_id)
        assert (list(read.entries), read.journal, read.files) == (entries, journal, files)
        alone = next((j for j in read_runs(runtime) if j.run_id == run_id), None)
        assert read.restored == (alone if alone is not None else read_ended(runtime, run_id))
        assert read.restored is not None and read.missing == []
    nobody = read_run(runtime, "RUN-NOBODY")
    assert (nobody.entries, nobody.journal, nobody.restored) == ([], None, None)


def _damaged(root: Path, damage: str) -> None:
    if damage == "flipped":  # a byte in the middle of the first segment
        seg = root / "wal" / "0000000001.seg"
        data = bytearray(seg.read_bytes())
        data[len(data) // 2] ^= 0xFF
        seg.write_bytes(bytes(data))
    elif damage == "missing":  # the later host's segment gone
        (root / "wal" / "0000000002.seg").unlink()
    elif damage == "manifest":
        (root / "manifest.json").write_bytes(b"{not json")
    elif damage == "snapshot":  # one waiting Run's live/ snapshot
        (root / "snap" / "live" / snapshot_name("RUN-O1")).write_bytes(b"\x00" * 16)


@pytest.mark.parametrize("damage", ["flipped", "missing", "manifest", "snapshot"])
def test_one_read_of_a_damaged_store_judges_as_the_reads_apart_do(
        runtime: Path, damage: str) -> None:
    """As above, where the reads find damage: what one read judges, the findings included,
    is what each judgement read alone judges."""
    from intloom.diagnostics.journal import read_run

    _damaged(runtime, damage)
    found = [f for run_id in ("RUN-W", "RUN-L", "RUN-O1")
             for f in (*read_run(runtime, run_id).files, *read_run(runtime, run_id).missing)]
    assert found, f"the {damage} store reads as undamaged"
    for run_id in ("RUN-W", "RUN-E", "RUN-L", "RUN-O1", "RUN-O2"):
        read = read_run(runtime, run_id)
        entries, journal, files = read_journal(runtime, run_id)
        assert (list(read.entries), read.journal, read.files) == (entries, journal, files), \
            run_id
        if not entries:
            continue
        alone = next((j for j in read_runs(runtime) if j.run_id == run_id), None)
        assert read.restored == (alone if alone is not None else read_ended(runtime, run_id))


def test_a_verify_of_one_run_reads_on_to_the_logs_end_without_reading_again(
        runtime: Path, reads: Reads) -> None:
    """``verify_run`` of an unfinished Run before the log's last segment: its second read,
    through the end of the log, read the snapshots, searched every segment and scanned the
    Run's own again; it now reads only the segment after it. The Run's own is scanned as it
    is searched, from the bytes read for that: read once."""
    report = verify_run(runtime, "RUN-W")
    assert report.segments == [1, 2], report.segments
    assert [(j.run_id, j.status) for j in report.runs] == [("RUN-W", "ok")], report.runs
    taken = reads.take()
    assert set(reads.of(taken, "snap/live/").values()) == {1}, taken
    assert reads.of(taken, "wal/") == {"wal/0000000001.seg": 1, "wal/0000000002.seg": 2}
    # What it says it read is what a read through the end alone reads.
    alone = reader.load(runtime, "verify", only="RUN-W", through_end=True)
    assert (report.stats, report.files) == (alone.stats, alone.files)

