"""Verification on restart, end to end: damage and change are reported, kept, and contained.

A changed Workflow file, a changed State schema, a newer journal format, a flipped byte, a
truncated middle and a torn tail are each reported by ``start`` (its restore summary),
``doctor --json`` and ``inspect``; the damaged file is byte-identical afterwards; every other
Run is restored; ``start --strict`` refuses instead.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conformance_harness import (
    Baseline,
    build_baseline,
    frames_of,
    new_project,
    project_with_runtime,
)
from tests.helpers import CliResult, Project, snapshot_files
from tests.unit.test_store_support import frames_end as store_frames_end

pytestmark = pytest.mark.e2e

SEG2 = "wal/0000000002.seg"


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Baseline:
    return build_baseline(tmp_path_factory.mktemp("baseline"))


@pytest.fixture
def reap() -> Iterator[list[Project]]:
    projects: list[Project] = []
    try:
        yield projects
    finally:
        for project in projects:
            project.track_host()
            project.reap()


def ok(result: CliResult) -> Any:
    assert result.code == 0, (result.code, result.stdout, result.stderr)
    return result.json


def refused(result: CliResult, *codes: str) -> dict[str, Any]:
    assert result.code == 1, (result.code, result.stdout, result.stderr)
    error: dict[str, Any] = result.json["error"]
    assert error["code"] in codes, error
    assert "Traceback" not in result.stdout + result.stderr
    return error


def previews(project: Project) -> dict[str, dict[str, Any]]:
    doctor = project.cli("doctor", "--json")
    assert doctor.code == 3, (doctor.code, doctor.stdout)  # attention, never a crash
    return {p["runId"]: p for p in doctor.json["runs"]}


# ----- a changed Workflow, a changed State schema --------------------------------------------


def test_a_changed_workflow_or_schema_strands_only_its_own_runs(
    tmp_path: Path, reap: list[Project]
) -> None:
    project = new_project(tmp_path, "changed")
    reap.append(project)
    ok(project.cli("start", "--json"))
    side = ok(project.cli("flow", "side", "--intent", "s", "--json"))["run"]
    probe = ok(project.cli("flow", "schema-probe", "--intent", "p", "--json"))["run"]
    ref = ok(project.cli("flow", "reference", "--intent", "r", "--json"))["run"]
    ok(project.cli("stop", "--json"))
    runtime = project.state / "runtime"
    journal = snapshot_files(runtime)

    side_py = project.root / "workflows" / "side" / "side.py"
    state_py = project.root / "probe_state.py"
    originals = {side_py: side_py.read_text(), state_py: state_py.read_text()}
    side_py.write_text(originals[side_py] + "# one byte of difference is enough\n")
    state_py.write_text(originals[state_py] + "    tag: str = ''\n")

    seen = previews(project)
    assert seen[side["runId"]]["journal"] == "incompatible"
    assert "Workflow 'side' changed" in seen[side["runId"]]["problem"]
    # probe_state.py is outside schema-probe's source tree: its identity did not change,
    # and the Stage schema check is what catches it.
    assert seen[probe["runId"]]["journal"] == "incompatible"
    assert ("the State schema of Stage 'draft' changed: the Workflow's source tree is as it "
            "was, so this changed outside it") in seen[probe["runId"]]["problem"]
    assert seen[ref["runId"]]["verdict"]["row"] == "restore_wait"
    for run, fact in ((side, "changed"), (probe, "schema")):
        inspected = ok(project.cli("inspect", run["runId"], "--json"))["run"]
        assert inspected["verdict"] == "incompatible" and fact in inspected["problem"]
        assert inspected["restart"]["row"] == "needs_attention"

    error = refused(project.cli("start", "--strict", "--json"), "JOURNAL_INCOMPATIBLE")
    assert "--strict" in error["message"]
    assert snapshot_files(runtime) == journal  # refused before writing anything at all
    assert ok(project.cli("status", "--json"))["status"] == "offline"

    restore = ok(project.cli("start", "--json"))["service"]["restore"]
    assert sorted(restore["needsAttention"]) == sorted([side["runId"], probe["runId"]])
    assert restore["waiting"] == [ref["runId"]]
    runs = ok(project.cli("runs", "--json"))["runs"]
    assert [r["runId"] for r in runs] == [ref["runId"]]
    assert runs[0]["pendingAction"] == ref["pendingAction"]
    ok(project.cli("stop", "--json"))
    after = snapshot_files(runtime)
    assert {k: after[k] for k in journal if k != "manifest.json"} == {
        k: v for k, v in journal.items() if k != "manifest.json"}  # kept byte-identical

    # With the code the Runs started with back in place, they continue where they were.
    for path, text in originals.items():
        path.write_text(text)
    restore = ok(project.cli("start", "--json"))["service"]["restore"]
    assert sorted(restore["waiting"]) == sorted(r["runId"] for r in (side, probe, ref))
    action = side["pendingAction"]["id"]
    done = ok(project.cli("answer", side["runId"], action, '{"isConfirmed": true}', "--json"))
    assert done["run"]["status"] == "completed"
    ok(project.cli("stop", "--json"))


# ----- damaged bytes -------------------------------------------------------------------------


def flip(baseline: Baseline) -> Callable[[Path], tuple[str, str]]:
    def damage(runtime: Path) -> tuple[str, str]:
        record = frames_of(runtime, baseline.ref, SEG2)[4]
        path = runtime / SEG2
        data = bytearray(path.read_bytes())
        # In the payload, past the frame's run id: the damaged record is still attributed.
        # (Damage inside a run id leaves its owner unknowable; the reader is then cautious.)
        data[record.offset + 80] ^= 0x01
        path.write_bytes(bytes(data))
        return SEG2, SEG2  # the problem names the file and the place
    return damage


def truncate_middle(baseline: Baseline, *, aligned: bool) -> Callable[[Path], tuple[str, str]]:
    def damage(runtime: Path) -> tuple[str, str]:
        records = frames_of(runtime, baseline.ref, SEG2)
        path = runtime / SEG2
        data = path.read_bytes()
        if aligned:  # whole records gone: no damaged bytes, a gap in the Run's seqs
            cut_from, cut_to = records[5].offset, records[8].offset
        else:  # from inside one record's payload to inside another's
            cut_from, cut_to = records[5].offset + 80, records[7].offset + 80
        path.write_bytes(data[:cut_from] + data[cut_to:])
        return SEG2, f"{SEG2} offset"
    return damage


def newer_format(baseline: Baseline) -> Callable[[Path], tuple[str, str]]:
    def damage(runtime: Path) -> tuple[str, str]:
        path = runtime / SEG2
        data = bytearray(path.read_bytes())
        struct.pack_into(">H", data, 8, 3)  # the format sits at a fixed offset (format.md)
        path.write_bytes(bytes(data))
        return SEG2, "format 3; this intloom reads 1 and 2"
    return damage


def header_byte(offset: int) -> Callable[[Path], tuple[str, str]]:
    """One flipped bit in the segment's fixed header (0: the marker, 11: the header length,
    which then points ~1 MiB past the end of the file)."""
    def damage(runtime: Path) -> tuple[str, str]:
        path = runtime / SEG2
        data = bytearray(path.read_bytes())
        data[offset] ^= 0x10
        path.write_bytes(bytes(data))
        return SEG2, f"{SEG2}, which has a damaged file header"
    return damage


def last_frame(baseline: Baseline) -> Callable[[Path], tuple[str, str]]:
    """One flipped byte in the payload of the segment's last frame: ``late``'s ``waiting``,
    whose confirmation ``flow`` had shown. Its length is whole and the segment was written
    since the OS started, so no crash can have torn it: it is damage, not a torn tail."""
    def damage(runtime: Path) -> tuple[str, str]:
        record = frames_of(runtime, baseline.late, SEG2)[-1]
        assert record.phase == "waiting"
        path = runtime / SEG2
        data = bytearray(path.read_bytes())
        end = store_frames_end(path)  # the zeros after it are the room preallocated
        assert data[end - 1] != 0  # else its last bytes would read as cut short (format.md)
        data[end - 5] ^= 0x01
        path.write_bytes(bytes(data))
        return SEG2, f"{SEG2} offset {record.offset} fails its checksum"
    return damage


CASES = ["flipped byte", "records cut out", "bytes cut out", "newer format",
         "header marker", "header length", "last frame"]


@pytest.mark.parametrize("case", CASES)
def test_a_damaged_journal_is_reported_kept_and_contained(
    case: str, baseline: Baseline, tmp_path: Path, reap: list[Project]
) -> None:
    damage = {
        "flipped byte": flip(baseline),
        "records cut out": truncate_middle(baseline, aligned=True),
        "bytes cut out": truncate_middle(baseline, aligned=False),
        "newer format": newer_format(baseline),
        "header marker": header_byte(0),
        "header length": header_byte(11),
        "last frame": last_frame(baseline),
    }[case]
    project = project_with_runtime(tmp_path, "damaged", baseline.runtime)
    reap.append(project)
    runtime = project.state / "runtime"
    path, fact = damage(runtime)
    damaged = (runtime / path).read_bytes()
    # Which Runs the damage touches: ref alone, or every Run of that segment for a format.
    hit = ({baseline.ref, baseline.late}
           if case in ("newer format", "header marker", "header length")
           else {baseline.late} if case == "last frame" else {baseline.ref})
    # Bytes cut out of a record leave unexplained bytes: a Run whose next record could have
    # been there (kept, waiting since host 1) may be held back too, never silently resumed.
    cautious = {baseline.kept} if case == "bytes cut out" else set()
    intact = baseline.waiting - hit - cautious
    kind = "incompatible" if case == "newer format" else "corrupt"

    seen = previews(project)
    for run_id in hit:
        assert seen[run_id]["journal"] == kind, seen[run_id]
        assert seen[run_id]["verdict"]["row"] == "needs_attention"
        assert fact in seen[run_id]["problem"], seen[run_id]["problem"]
    assert all(seen[r]["journal"] == "verified" for r in intact), seen
    for run_id in cautious:
        assert seen[run_id]["journal"] == "verified" or fact in seen[run_id]["problem"]
    held = hit | {r for r in cautious if seen[r]["journal"] != "verified"}
    for run_id in hit:
        inspected = ok(project.cli("inspect", run_id, "--json"))
        assert inspected["run"]["verdict"] == kind and fact in inspected["run"]["problem"]
        assert inspected["run"]["restart"]["row"] == "needs_attention"
    if case in ("flipped byte", "bytes cut out", "last frame"):
        assert any(r["verdict"] == "damaged" for r in inspected["records"])
    if case.startswith("header"):  # the records themselves check out, and inspect shows them
        assert all(r["verdict"] in ("ok", "snapshot") for r in inspected["records"])

    before = snapshot_files(runtime)
    refused(project.cli("start", "--strict", "--json"), "JOURNAL_CORRUPT",
            "JOURNAL_INCOMPATIBLE")
    assert (runtime / path).read_bytes() == damaged
    assert snapshot_files(runtime) == before  # no new segment, snapshot or manifest
    restore = ok(project.cli("start", "--json"))["service"]["restore"]
    assert sorted(restore["needsAttention"]) == sorted(held)
    assert sorted(restore["waiting"]) == sorted(baseline.waiting - held)
    runs = ok(project.cli("runs", "--json"))["runs"]
    assert sorted(r["runId"] for r in runs) == sorted(baseline.waiting - held)
    assert all(r["status"] == "waiting" for r in runs)
    ok(project.cli("stop", "--json"))
    assert (runtime / path).read_bytes() == damaged
    # The verdict outlives the segment the next restores no longer read.
    restore = ok(project.cli("start", "--json"))["service"]["restore"]
    assert sorted(restore["needsAttention"]) == sorted(held)
    ok(project.cli("stop", "--json"))
    assert (runtime / path).read_bytes() == damaged


def test_a_torn_tail_is_a_crash_not_corruption(
    baseline: Baseline, tmp_path: Path, reap: list[Project]
) -> None:
    project = project_with_runtime(tmp_path, "torn", baseline.runtime)
    reap.append(project)
    runtime = project.state / "runtime"
    last = frames_of(runtime, baseline.late, SEG2)[-1]
    assert last.phase == "waiting"
    path = runtime / SEG2
    path.write_bytes(path.read_bytes()[: last.offset + 80])  # mid-frame, as a crash leaves it
    torn = path.read_bytes()

    seen = previews(project)
    late = seen[baseline.late]
    assert (late["journal"], late["phase"]) == ("verified", "executing")
    assert late["verdict"]["row"] == "interrupted"  # the Step that was about to wait
    doctor = project.cli("doctor", "--json").json
    journals = {c["id"]: c for c in doctor["checks"]}["journals"]
    assert f"{SEG2} is torn" in journals["message"]  # reported as a crash, not corruption
    inspected = ok(project.cli("inspect", baseline.late, "--json"))
    assert inspected["run"]["verdict"] == "ok"
    assert inspected["records"][-1]["verdict"] == "torn"

    # A torn tail is what every crash may leave: not corruption, so --strict starts too.
    restore = ok(project.cli("start", "--strict", "--json"))["service"]["restore"]
    assert restore.get("needsAttention", []) == []
    assert restore["interrupted"] == [baseline.late]
    assert sorted(restore["waiting"]) == sorted([baseline.kept, baseline.ref])
    ok(project.cli("stop", "--json"))
    assert path.read_bytes() == torn


@pytest.mark.parametrize("case", ["flipped byte", "newer format"])
def test_a_damaged_snapshot_is_kept_and_its_run_rebuilt_from_the_log(
    case: str, baseline: Baseline, tmp_path: Path, reap: list[Project]
) -> None:
    """The store never guesses which copy is right and never writes over the damaged one:
    it reports the file, keeps it, and judges that Run from the log it summarised."""
    project = project_with_runtime(tmp_path, "snapshot", baseline.runtime)
    reap.append(project)
    runtime = project.state / "runtime"
    [snap] = list((runtime / "snap" / "live").iterdir())
    data = bytearray(snap.read_bytes())
    if case == "newer format":
        struct.pack_into(">H", data, 8, 2)
    else:
        data[-3] ^= 0x40
    snap.write_bytes(bytes(data))

    doctor = project.cli("doctor", "--json")
    assert doctor.code == 3
    journals = {c["id"]: c for c in doctor.json["checks"]}["journals"]
    assert snap.name in journals["message"] and snap.name in journals["next"]
    inspected = ok(project.cli("inspect", baseline.kept, "--json"))
    assert inspected["run"]["restart"]["row"] == "restore_wait"

    restore = ok(project.cli("start", "--json"))["service"]["restore"]
    assert sorted(restore["waiting"]) == sorted(baseline.waiting)  # kept, from the log
    ok(project.cli("stop", "--json"))
    assert snap.read_bytes() == bytes(data)
    restore = ok(project.cli("start", "--json"))["service"]["restore"]
    assert sorted(restore["waiting"]) == sorted(baseline.waiting)
    ok(project.cli("stop", "--json"))
    assert snap.read_bytes() == bytes(data)


def test_a_bit_flip_in_the_manifest_never_hides_a_run(baseline: Baseline, tmp_path: Path,
                                                       reap: list[Project]) -> None:
    project = project_with_runtime(tmp_path, "manifest", baseline.runtime)
    reap.append(project)
    manifest = project.state / "runtime" / "manifest.json"
    text = manifest.read_text()
    assert '"start":2' in text
    manifest.write_text(text.replace('"start":2', '"start":3'))  # 0x32 -> 0x33: one bit
    doctor = project.cli("doctor", "--json")
    seen = {p["runId"] for p in doctor.json["runs"]}
    journals = {c["id"]: c for c in doctor.json["checks"]}["journals"]
    # The manifest fails its checksum, so every segment is read: no Run disappears, and the
    # damaged manifest is reported.
    assert seen >= baseline.waiting
    assert "manifest.json" in journals["message"]


# ----- damage in history that a snapshot already covers ----------------------------------------


def _stop_and_damage_record_3(project: Project, run_id: str) -> tuple[list[Any], Any]:
    """A clean stop (every Run snapshotted), then one byte flipped inside the Run's record
    3. Returns the records ``inspect`` listed before, and record 3's entry."""
    ok(project.cli("stop", "--json"))
    records = ok(project.cli("inspect", run_id, "--json"))["records"]
    third = next(r for r in records if r["seq"] == 3)
    segment = project.state / "runtime" / third["file"]
    data = bytearray(segment.read_bytes())
    data[third["offset"] + 20] ^= 0xFF
    segment.write_bytes(bytes(data))
    return records, third


def test_damaged_history_behind_a_snapshot_is_reported_but_stops_nothing(
    project: Project,
) -> None:
    """After a clean stop the Run's snapshot covers its records: a flipped byte in them is
    history damage. ``inspect`` reports it and, like ``doctor`` and ``start``, knows that
    the restore reads the snapshot (it used to predict needs_attention)."""
    ok(project.cli("start", "--json"))
    run = ok(project.cli("flow", "example", "--intent", "history", "--json"))["run"]
    assert run["status"] == "waiting"
    _records, third = _stop_and_damage_record_3(project, run["runId"])
    damaged = snapshot_files(project.state / "runtime")

    inspected = ok(project.cli("inspect", run["runId"], "--json"))["run"]
    assert inspected["verdict"] == "corrupt" and "records 3..3" in inspected["problem"]
    assert inspected["restoreVerdict"] == "ok" and inspected["restoreSeq"] >= 10
    assert inspected["status"] == "waiting"
    assert inspected["restart"]["row"] == "restore_wait"
    text = project.cli("inspect", run["runId"]).stdout
    assert "it restores the Run from its snapshot" in text
    assert "On restart: restore_wait" in text

    doctor = project.cli("doctor", "--json")
    assert doctor.code == 0, doctor.stdout
    assert {p["runId"]: p["verdict"]["row"] for p in doctor.json["runs"]} == {
        run["runId"]: "restore_wait"}
    restore = ok(project.cli("start", "--strict", "--json"))["service"]["restore"]
    assert restore["waiting"] == [run["runId"]]
    ok(project.cli("stop", "--json"))
    assert snapshot_files(project.state / "runtime")[third["file"]] == damaged[third["file"]]


def test_damaged_history_of_an_ended_run_is_reported_as_history(project: Project) -> None:
    """An ended Run's end is in its done/ snapshot: damage in its records is history, and
    inspect shows it completed with no restart (it showed it running, needs_attention)."""
    ok(project.cli("start", "--json"))
    run = ok(project.cli("flow", "example", "--intent", "ended", "--json"))["run"]
    action = run["pendingAction"]["id"]
    done = ok(project.cli("answer", run["runId"], action, '{"isConfirmed": true}', "--json"))
    assert done["run"]["status"] == "completed"
    records, _third = _stop_and_damage_record_3(project, run["runId"])

    inspected = ok(project.cli("inspect", run["runId"], "--json"))["run"]
    assert inspected["verdict"] == "corrupt" and "records 3..3" in inspected["problem"]
    assert (inspected["status"], inspected["phase"]) == ("completed", "terminal")
    assert inspected["restoreVerdict"] == "ok" and "restart" not in inspected
    assert inspected["restoreSeq"] == records[-1]["seq"]
    text = project.cli("inspect", run["runId"]).stdout
    assert "a start does not load an ended Run" in text and "On restart" not in text


def test_a_stray_file_named_as_the_last_segment_is_refused_not_numbered_past(
    baseline: Baseline, tmp_path: Path, reap: list[Project]
) -> None:
    """A host never creates a segment name the reader would not read back (it used to go on
    with ``wal/10000000000.seg``, whose Runs no restore saw again): it refuses to start,
    naming the file and the fix, and writes nothing."""
    project = project_with_runtime(tmp_path, "stray", baseline.runtime)
    reap.append(project)
    runtime = project.state / "runtime"
    stray = runtime / "wal" / "9999999999.seg"
    stray.write_bytes(b"junk\n")
    stray.chmod(0o600)
    doctor = project.cli("doctor", "--json")
    journals = {c["id"]: c for c in doctor.json["checks"]}["journals"]
    assert "wal/9999999999.seg" in journals["message"]
    before = snapshot_files(runtime)

    error = refused(project.cli("start", "--json"), "STORAGE_ERROR")
    assert str(stray) in error["message"] and "move it out" in error["message"]
    assert snapshot_files(runtime) == before
    assert not list((runtime / "wal").glob("1*.seg"))

    stray.unlink()
    restore = ok(project.cli("start", "--json"))["service"]["restore"]
    assert sorted(restore["waiting"]) == sorted(baseline.waiting)
    ok(project.cli("stop", "--json"))
    assert sorted(p.name for p in (runtime / "wal").iterdir()) == [
        "0000000001.seg", "0000000002.seg", "0000000003.seg"]
