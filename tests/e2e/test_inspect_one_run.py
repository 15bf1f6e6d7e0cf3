"""``intloom inspect RUN`` judges one Run from what that Run needs (its own segments, its
snapshot, and for an unfinished Run every segment after its last record), not the whole
store: on 32,000 ended Runs it ran a whole verify and took seconds. These build a real
store with the real writer (one segment per host), damage it, and run the real CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from intloom.store import verify_report, verify_run
from tests.helpers import Project, make_project, ok, reaped, snapshot_files
from tests.unit.test_store_support import (
    abandon,
    frames_end,
    frames_of,
    open_store,
    walk,
    write_after_frames,
)


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(make_project(tmp_path))


def _runtime(project: Project) -> Path:
    project.state.mkdir(mode=0o700, exist_ok=True)
    return project.state / "runtime"


def _host(runtime: Path, runs: dict[str, int], *, ended: bool = True,
          crash: bool = False) -> None:
    """One host instance writing ``runs`` (id -> records) into a segment of its own (with
    an instance id of its own, as every host has)."""
    store = open_store(runtime, instance_id=f"INST-{uuid.uuid4()}")
    for n, (run_id, count) in enumerate(runs.items()):
        for record in walk(run_id, count, n, terminal=ended):
            store.append(run_id, record)
    store.sync_blocking()
    if crash:
        abandon(store)
    else:
        store.close_blocking()


def _flip(segment: Path, run_id: str, index: int) -> int:
    """Flip a byte inside the payload of ``run_id``'s ``index``-th frame: its offset."""
    frame = frames_of(segment, run_id)[index]
    data = bytearray(segment.read_bytes())
    data[frame.end - 3] ^= 0xFF
    segment.write_bytes(bytes(data))
    return frame.offset


def test_inspect_leaves_damage_in_another_runs_segment_to_verify(project: Project) -> None:
    runtime = _runtime(project)
    _host(runtime, {"RUN-X": 12})
    _host(runtime, {"RUN-A": 10})
    seg1 = runtime / "wal" / "0000000001.seg"
    offset = _flip(seg1, "RUN-X", 4)
    before = snapshot_files(project.state)

    # RUN-A has no record in segment 1: inspect neither scans it nor reports it.
    assert verify_run(runtime, "RUN-A").segments == [2]
    doc = ok(project.cli("inspect", "RUN-A", "--json"))
    assert doc["run"]["verdict"] == "ok" and doc["run"]["phase"] == "terminal", doc["run"]
    assert "files" not in doc, doc["files"]
    assert [r["seq"] for r in doc["records"]] == list(range(1, 11))

    # The whole verify still reports it, by path and offset.
    found = [f for f in verify_report(runtime).files if f.path == "wal/0000000001.seg"]
    assert [f.kind for f in found] == ["corrupt"], found
    assert re.search(rf"bytes {offset}\.\.\d+ are damaged", found[0].problem), found

    # RUN-X, whose frame it is: corrupt at that record, the finding given, the row marked.
    doc = ok(project.cli("inspect", "RUN-X", "--json"))
    assert doc["run"]["verdict"] == "corrupt", doc["run"]
    assert f"wal/0000000001.seg offset {offset}" in doc["run"]["problem"], doc["run"]
    assert {"path": "wal/0000000001.seg", "kind": "corrupt",
            "problem": found[0].problem} in doc["files"]
    [bad] = [r for r in doc["records"] if r["checksum"] == "bad"]
    assert (bad["seq"], bad["offset"], bad["verdict"]) == (5, offset, "damaged"), bad
    text = project.cli("inspect", "RUN-X")
    assert text.code == 0 and "journal corrupt" in text.stdout.splitlines()[0], text.stdout
    assert "File wal/0000000001.seg is corrupt" in text.stdout
    assert snapshot_files(project.state) == before


def test_inspect_of_an_unfinished_run_reads_the_log_after_it(project: Project) -> None:
    """A Run left waiting by a killed host, its last frame torn; an ended Run after it in a
    later host's segment. inspect reads on past the unfinished Run's own segment, and says
    the tail is torn (not corrupt) with its offset."""
    runtime = _runtime(project)
    _host(runtime, {"RUN-E": 6, "RUN-T": 9}, ended=False, crash=True)
    seg1 = runtime / "wal" / "0000000001.seg"
    last = frames_of(seg1, "RUN-T")[-1]
    assert last.end == frames_end(seg1)  # the zeros preallocated after it are unused room
    with seg1.open("r+b") as fh:
        fh.truncate(last.end - 5)
    _host(runtime, {"RUN-F": 5})
    before = snapshot_files(project.state)

    report = verify_run(runtime, "RUN-T")
    assert report.segments == [1, 2], report.segments  # 2: the next host's segment
    assert [(j.status, j.torn_tail) for j in report.runs] == [("ok", True)], report.runs
    doc = ok(project.cli("inspect", "RUN-T", "--json"))
    # (its verdict is the restart's: the walk's Workflow identity is not the project's)
    assert doc["run"]["tornTail"] is True and doc["run"]["phase"] != "terminal", doc["run"]
    [torn] = [f for f in doc["files"] if f["kind"] == "torn"]
    assert torn["path"] == "wal/0000000001.seg"
    assert f"at offset {last.offset}" in torn["problem"], torn
    [row] = [r for r in doc["records"] if r["verdict"] == "torn"]
    assert (row["seq"], row["offset"]) == (9, last.offset)
    assert snapshot_files(project.state) == before


def test_an_unfinished_run_in_the_logs_last_segment_is_scanned_once(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unfinished Run whose records reach the log's last segment: verify_run read its
    segments, then read them all again "through the end of the log", which they already
    were (inspect of a live 180,000-record Run: 10.2 s, 8.3 s without that second read).
    A Run with a later segment after its own still reads on into it (the test above)."""
    from intloom.store import reader

    runtime = _runtime(project)
    _host(runtime, {"RUN-E": 6})
    _host(runtime, {"RUN-W": 9}, ended=False, crash=True)
    scanned: list[str] = []
    real = reader.scan_segment  # type: ignore[attr-defined]

    def counted(name: str, *args: object, **kw: object) -> object:
        scanned.append(name)
        return real(name, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(reader, "scan_segment", counted)
    report = verify_run(runtime, "RUN-W")
    assert report.segments == [2], report.segments
    assert [(j.run_id, j.status) for j in report.runs] == [("RUN-W", "ok")], report.runs
    assert scanned == ["0000000002.seg"], scanned


def test_inspect_names_a_missing_segment_that_may_hold_the_runs_next_record(
        project: Project) -> None:
    """A host killed while writing RUN-M's records, and its segment deleted since: the
    manifest names it as the one that host had open. inspect of RUN-M (unfinished, its
    earlier records in segment 2) says it is held for it; RUN-E, ended in segment 1 before
    that, is sound (the loss is a fact of the store's manifest, and listed as such)."""
    runtime = _runtime(project)
    _host(runtime, {"RUN-E": 6})
    store = open_store(runtime)
    for record in walk("RUN-M", 5, 3):
        store.append("RUN-M", record)
    store.sync_blocking()
    store.close_blocking()  # RUN-M's snapshot covers 1..5 (segment 2)
    _host(runtime, {"RUN-Z": 4}, ended=False, crash=True)  # segment 3, then lost
    (runtime / "wal" / "0000000003.seg").unlink()
    before = snapshot_files(project.state)

    doc = ok(project.cli("inspect", "RUN-M", "--json"))
    assert doc["run"]["verdict"] == "corrupt", doc["run"]
    assert "wal/0000000003.seg, which is missing" in doc["run"]["problem"], doc["run"]
    assert any(f["path"] == "wal/0000000003.seg" and f["kind"] == "missing"
               for f in doc["files"]), doc["files"]
    doc = ok(project.cli("inspect", "RUN-E", "--json"))
    assert doc["run"]["verdict"] == "ok" and doc["run"]["status"] == "failed", doc["run"]
    assert snapshot_files(project.state) == before


def test_inspect_says_nothing_it_cannot_know_of_another_runs_damaged_snapshot(
        project: Project) -> None:
    """RUN-W's ``snap/live/`` snapshot is damaged; its records are in segment 1, which a
    read of RUN-A (segment 2) does not scan. Its finding there said that no record in the
    log names RUN-W, "this file is its only trace": false. inspect RUN-A leaves that file to
    RUN-W's inspect (and to doctor and start); the whole verify reports it as it is."""
    from intloom.store.snapshots import snapshot_name

    runtime = _runtime(project)
    _host(runtime, {"RUN-W": 6}, ended=False)
    _host(runtime, {"RUN-A": 6})
    snap = runtime / "snap" / "live" / snapshot_name("RUN-W")
    data = bytearray(snap.read_bytes())
    data[-3] ^= 0xFF
    snap.write_bytes(bytes(data))
    before = snapshot_files(project.state)

    doc = ok(project.cli("inspect", "RUN-A", "--json"))
    assert doc["run"]["verdict"] == "ok" and "files" not in doc, doc.get("files")
    path = f"snap/live/{snap.name}"
    [whole] = [f for f in verify_report(runtime).files if f.path == path]
    assert whole.kind == "corrupt" and "only trace" not in whole.problem, whole
    doc = ok(project.cli("inspect", "RUN-W", "--json"))
    [mine] = [f for f in doc["files"] if f["path"] == path]
    assert mine["problem"] == whole.problem, mine
    assert snapshot_files(project.state) == before


def test_verify_reads_the_whole_store_and_names_every_finding(project: Project) -> None:
    """``inspect RUN`` no longer reports other Runs' damage, and start and doctor read only
    what a restore reads: ``intloom verify`` is the command that reads everything (old
    segments, every snap/done/ file), names each finding and exits 3, changing nothing."""
    runtime = _runtime(project)
    _host(runtime, {"RUN-X": 12})
    _host(runtime, {"RUN-A": 10, "RUN-W": 4}, ended=False, crash=True)
    sound = ok(project.cli("verify", "--json"))
    assert sound["sound"] is True and sound["problems"] == [] and sound["files"] == []
    assert sound["runs"] == {"total": 3, "ok": 3, "corrupt": 0, "incompatible": 0,
                             "unfinished": 2}, sound["runs"]
    assert sound["segmentsRead"] == 2, sound
    text = project.cli("verify")
    assert text.code == 0 and text.stdout.startswith("Verified 3 Runs (2 unfinished) in 2 "
                                                     "segments, "), text.stdout
    assert text.stdout.rstrip().endswith("every journal and file checks out."), text.stdout

    seg1 = runtime / "wal" / "0000000001.seg"
    offset = _flip(seg1, "RUN-X", 4)
    before = snapshot_files(project.state)
    damaged = project.cli("verify", "--json")
    assert damaged.code == 3, (damaged.code, damaged.stdout, damaged.stderr)
    doc = damaged.json
    assert doc["sound"] is False and doc["runs"]["corrupt"] == 1, doc
    # RUN-X ended: its fold stops at the damage, but it is not counted unfinished for that.
    assert doc["runs"]["unfinished"] == 2, doc["runs"]
    [problem] = doc["problems"]
    assert problem["runId"] == "RUN-X" and problem["status"] == "corrupt", problem
    assert f"wal/0000000001.seg offset {offset}" in problem["problem"], problem
    assert [f["path"] for f in doc["files"]] == ["wal/0000000001.seg"], doc["files"]
    text = project.cli("verify")
    assert text.code == 3, text
    assert "1 corrupt, 0 incompatible, 1 file finding." in text.stdout.splitlines()[0]
    # Unfinished counts only what could be judged: a corrupt Run may or may not have ended.
    assert text.stdout.startswith("Verified 3 Runs (2 unfinished of the 2 sound) in "), text.stdout
    assert "  RUN-X is corrupt: " in text.stdout, text.stdout
    assert "  File wal/0000000001.seg is corrupt: " in text.stdout, text.stdout
    assert "Nothing was changed" in text.stdout, text.stdout
    assert snapshot_files(project.state) == before


@pytest.mark.timeout(60)
def test_verify_lists_what_a_crash_tears_and_exits_0(project: Project) -> None:
    """A torn tail and an empty segment are what a crash mid-write (or a full disk) leaves,
    with no acknowledged record in them: a start restores past them and ``start --strict``
    accepts them. verify lists them and exits 0; it exited 3 for good after any such crash,
    since it reads old segments as long as they exist."""
    runtime = _runtime(project)
    _host(runtime, {"RUN-A": 6}, ended=False, crash=True)
    seg1 = runtime / "wal" / "0000000001.seg"
    last = frames_of(seg1, "RUN-A")[-1]
    data = seg1.read_bytes()
    # The next write cut short: the first half of a frame, its length past the zeros' start.
    write_after_frames(seg1, data[last.offset:(last.offset + last.end) // 2])
    empty = runtime / "wal" / "0000000002.seg"
    empty.touch(mode=0o600)
    before = snapshot_files(project.state)
    doc = ok(project.cli("verify", "--json"))
    assert doc["sound"] is True and doc["problems"] == [], doc
    assert sorted((f["path"], f["kind"]) for f in doc["files"]) == [
        ("wal/0000000001.seg", "torn"), ("wal/0000000002.seg", "torn")], doc["files"]
    text = project.cli("verify")
    assert text.code == 0, (text.code, text.stdout, text.stderr)
    assert "every journal checks out; 2 files are torn, as a crash mid-write or a full " \
           "disk leaves it (no acknowledged record is lost" in text.stdout, text.stdout
    assert "  File wal/0000000002.seg is torn: has 0 bytes" in text.stdout, text.stdout
    assert snapshot_files(project.state) == before
    # A damaged byte besides still makes it exit 3, the torn files listed with it.
    _flip(seg1, "RUN-A", 2)
    damaged = project.cli("verify", "--json")
    assert damaged.code == 3 and damaged.json["sound"] is False, damaged.stdout
    assert [(f["path"], f["kind"]) for f in damaged.json["files"]] == [
        ("wal/0000000001.seg", "corrupt"), ("wal/0000000001.seg", "torn"),
        ("wal/0000000002.seg", "torn")], damaged.json["files"]


@pytest.mark.timeout(60)
def test_inspect_holds_its_own_records_not_the_other_runs_it_reads_past(
        project: Project) -> None:
    """A Run whose records sit before and after another Run's many: judging it alone reads
    the segments between (whose frame damage there was depends on them) but keeps only its
    own payloads. It held every payload it read: inspect of a 14-record Run spanning 573 MB
    of another Run's 1 MB States took 618 MB."""
    runtime = _runtime(project)
    store = open_store(runtime, instance_id=f"INST-{uuid.uuid4()}")
    mine, theirs = walk("RUN-A", 10, 0, terminal=True), walk("RUN-B", 3000, 1, terminal=True)
    for record in mine[:4]:
        store.append("RUN-A", record)
    for record in theirs:
        store.append("RUN-B", record)
    for record in mine[4:]:
        store.append("RUN-A", record)
    store.sync_blocking()
    store.close_blocking()
    segments = sorted((runtime / "wal").glob("*.seg"))
    own = sum(len(f.payload) for seg in segments for f in frames_of(seg, "RUN-A"))
    other = sum(len(f.payload) for seg in segments for f in frames_of(seg, "RUN-B"))
    assert other > 50 * own, (own, other)
    before = snapshot_files(project.state)

    report = verify_run(runtime, "RUN-A")
    assert [(j.run_id, j.status) for j in report.runs] == [("RUN-A", "ok")], report.runs
    assert report.stats.frames_read >= 3010, report.stats  # it read past RUN-B's frames
    # ...and held RUN-A's payloads (and a seal's few bytes), not RUN-B's.
    assert own <= report.stats.payload_bytes_held < own + 1024, (own, report.stats)
    # The whole verify, which judges every Run, reads each Run's payloads again as it
    # judges it: it holds neither Run's while it reads the log.
    assert verify_report(runtime).stats.payload_bytes_held < 1024

    doc = ok(project.cli("inspect", "RUN-A", "--json"))
    assert doc["run"]["verdict"] == "ok" and doc["run"]["phase"] == "terminal", doc["run"]
    assert [r["seq"] for r in doc["records"]] == list(range(1, 11))
    assert snapshot_files(project.state) == before


_READ_BYTES = """\
import atexit, os, sys
def said():
    with open("/proc/self/io") as fh:
        io = dict(line.split(": ") for line in fh.read().splitlines())
    os.write(2, ("READ " + io["rchar"] + "\\n").encode())
atexit.register(said)
sys.argv[0] = "intloom"
from intloom.cli.app import main
raise SystemExit(main())
"""


def _bytes_read(project: Project, *args: str) -> tuple[int, str]:
    """How many bytes it read (``/proc/self/io``'s rchar, said
    by the process itself as it exits), and what it printed."""
    proc = subprocess.run(
        [sys.executable, "-c", _READ_BYTES, "--project", str(project.root), *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, "NO_COLOR": "1"})
    *said, last = proc.stderr.splitlines()
    assert last.startswith("READ "), proc.stderr
    return int(last.removeprefix("READ ")), "\n".join([proc.stdout, *said])


@pytest.mark.timeout(120)
@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs /proc/self/io")
def test_inspect_of_an_id_that_is_nowhere_reads_no_more_than_a_real_runs(
        project: Project) -> None:
    """An id that no segment holds and no snapshot names: inspect knew that from its cheap
    look (the Run's id is in the bytes of every segment holding a record of it), then ran a
    whole verify of the store to learn which segments are missing, for its message: seconds
    on a large log (6.1 s on 11 MB of segments; 0.8 s now). What a start reads names them
    as well; the message is the same."""
    runtime = _runtime(project)
    for host in range(8):
        _host(runtime, {f"RUN-{host}-{n}": 12 for n in range(120)})
    wal = sum(p.stat().st_size for p in (runtime / "wal").glob("*.seg"))
    before = snapshot_files(project.state)

    real, said = _bytes_read(project, "inspect", "RUN-0-5", "--json")
    assert '"runId":"RUN-0-5"' in said, said
    nowhere, said = _bytes_read(project, "inspect", "RUN-NOPE", "--json")
    assert '"code":"NOT_FOUND"' in said and "Check the Run id" in said, said
    assert "is missing" not in said, said
    # No host runs here, where intloom runs fails: the advice names what lists ids offline.
    assert "intloom doctor, with or without a host, lists the unfinished ones" in said, said
    # A real Run's inspect looks for its id in every segment and reads its own; the one of
    # an id that is nowhere reads no more. The whole verify read every segment again.
    assert nowhere < real + wal // 2, (nowhere, real, wal)
    assert snapshot_files(project.state) == before
