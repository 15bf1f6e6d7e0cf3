"""doctor's journals check and restart preview, over journals written by the real store."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

import tests.helpers
from intloom import __version__
from intloom.authoring.loader import load_workflows
from intloom.diagnostics import run_doctor
from intloom.diagnostics.doctor import DoctorReport
from intloom.project import ProjectPaths, load_config
from intloom.runtime.model import Cursor, WaitingAction
from intloom.runtime.records import (
    Answered,
    EffectStarted,
    Executing,
    Header,
    Record,
    StagePending,
    StepReady,
    Terminal,
    Waiting,
    encode_record,
)
from intloom.store.snapshots import snapshot_name
from intloom.store.writer import Store
from tests.helpers import FIXTURES
from tests.unit.diagnostics_support import tree, write_connection_json
from tests.unit.test_store_lost_segment import SEG2, _clean_then_crashed
from tests.unit.test_store_support import frames_end, open_store

AT = "2026-11-30T00:00:00.000Z"


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    target = (tmp_path / "proj").resolve()
    shutil.copytree(FIXTURES / "projects" / "basic", target)
    saved = sys.dont_write_bytecode
    sys.dont_write_bytecode = True  # the fixture's own import must not leave __pycache__
    try:
        yield target
    finally:
        sys.dont_write_bytecode = saved


def _header(root: Path, run_id: str, *, identity: str | None = None) -> Header:
    wf = load_workflows(root, load_config(root)).workflows["example"]
    return Header(at=AT, run_id=run_id, workflow="example", workflow_version=wf.version,
                  identity=identity or wf.identity, schemas=dict(wf.schemas), intent="x")


def _write(root: Path, runs: dict[str, list[Record]]) -> None:
    store = Store.open(ProjectPaths(root).runtime, instance_id="test", package_version="0.1.0")
    try:
        for run_id, records in runs.items():
            for record in records:
                store.append(run_id, record)
        store.sync_blocking()
    finally:
        store.close_blocking()


def _action() -> WaitingAction:
    return WaitingAction(id="ASK-1", kind="confirmation", request={"draft": "d"},
                         cursor=Cursor("draft", "review"), created_at=AT)


def _journals(root: Path) -> dict[str, list[Record]]:
    start: list[Record] = [StagePending(at=AT, stage="draft"),
                           StepReady(at=AT, stage="draft", step="write")]
    return {
        "RUN-ready": [_header(root, "RUN-ready"), *start],
        "RUN-effect": [
            _header(root, "RUN-effect"), *start,
            Executing(at=AT, stage="draft", step="write"),
            EffectStarted(at=AT, name="compose", key="compose-1"),
        ],
        "RUN-wait": [
            _header(root, "RUN-wait"), StagePending(at=AT, stage="draft"),
            StepReady(at=AT, stage="draft", step="review"),
            Executing(at=AT, stage="draft", step="review"),
            Waiting(at=AT, action=_action()),
        ],
        "RUN-changed": [_header(root, "RUN-changed", identity="f" * 64), *start],
        "RUN-done": [_header(root, "RUN-done"), StagePending(at=AT, stage="draft"),
                     Terminal(at=AT, status="completed")],
    }


def _previews(report: DoctorReport) -> dict[str, tuple[str, str]]:
    return {p.run_id: (p.journal, p.verdict.row) for p in report.runs}


def test_restart_preview_names_the_row_for_every_unfinished_run(root: Path) -> None:
    write_connection_json(root, 4242)
    _write(root, _journals(root))
    before = tree(root)
    report = run_doctor(root)
    assert tree(root) == before

    assert _previews(report) == {
        "RUN-ready": ("verified", "resume"),
        "RUN-effect": ("verified", "interrupted"),
        "RUN-wait": ("verified", "restore_wait"),
        "RUN-changed": ("incompatible", "needs_attention"),
    }
    by_id = {p.run_id: p for p in report.runs}
    effect = by_id["RUN-effect"].verdict.effect
    assert effect is not None and (effect.name, effect.key) == ("compose", "compose-1")
    assert "compose" in by_id["RUN-effect"].verdict.reason
    assert "changed" in (by_id["RUN-changed"].problem or "")

    journals = {c.id: c for c in report.checks}["journals"]
    assert journals.status == "attention"
    assert "1 incompatible" in journals.message
    assert "intloom cancel" in (journals.next or "")
    assert report.health == "attention"


def test_changed_stage_schema_is_incompatible(root: Path) -> None:
    header = _header(root, "RUN-schema")
    header = Header(at=AT, run_id="RUN-schema", workflow="example",
                    workflow_version=header.workflow_version, identity=header.identity,
                    schemas={stage: "0" * 16 for stage in header.schemas}, intent="x")
    _write(root, {"RUN-schema": [header, StagePending(at=AT, stage="draft")]})
    report = run_doctor(root)
    [preview] = report.runs
    assert preview.journal == "incompatible"
    assert "schema" in (preview.problem or "")
    assert "draft" in (preview.problem or "")


_CRASHING_WRITER = """
import os, signal, sys
import msgspec
from pathlib import Path
from intloom.runtime.records import decode_record
from intloom.store.writer import Store
items = msgspec.msgpack.decode(Path(sys.argv[2]).read_bytes())
store = Store.open(Path(sys.argv[1]), instance_id="crashing", package_version="0.1.0")
for run_id, data in items:
    store.append(run_id, decode_record(data))
store.sync_blocking()
os.kill(os.getpid(), signal.SIGKILL)  # a host killed right after its last checkpoint
"""


def _write_and_crash(root: Path, runs: dict[str, list[Record]], tmp_path: Path) -> None:
    items = [(run_id, encode_record(r)) for run_id, records in runs.items() for r in records]
    batch = tmp_path / "records.msgpack"
    batch.write_bytes(msgspec.msgpack.encode(items))
    proc = subprocess.run(
        [sys.executable, "-c", _CRASHING_WRITER, str(ProjectPaths(root).runtime), str(batch)],
        cwd=tests.helpers.REPO, timeout=30, capture_output=True,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def test_damaged_log_is_reported_and_kept(root: Path, tmp_path: Path) -> None:
    journals = _journals(root)
    _write_and_crash(root, {k: journals[k] for k in ("RUN-ready", "RUN-effect")}, tmp_path)
    [segment] = (ProjectPaths(root).runtime / "wal").iterdir()
    data = bytearray(segment.read_bytes())
    # Inside some record of the crashed host's log (not the zeros preallocated after it).
    data[frames_end(segment) // 2] ^= 0xFF
    segment.write_bytes(bytes(data))
    before = tree(root)
    report = run_doctor(root)
    assert tree(root) == before
    journals_check = {c.id: c for c in report.checks}["journals"]
    assert journals_check.status == "attention"
    assert "1 corrupt" in journals_check.message
    [corrupt] = [p for p in report.runs if p.journal == "corrupt"]
    assert corrupt.verdict.row == "needs_attention"
    assert corrupt.problem
    # What helps with a damaged journal, said once: no "inspect each unrestorable Run" loop
    # (the Run's held error used to send the user to doctor, and doctor back to inspect).
    advice = journals_check.next or ""
    assert "cannot be cancelled and stays held at every start" in advice, advice
    assert "a backup" in advice and "incompatible" not in advice, advice


def test_damaged_snapshot_says_start_reads_the_whole_log(root: Path) -> None:
    _write(root, {"RUN-ready": _journals(root)["RUN-ready"]})
    [snap] = (ProjectPaths(root).runtime / "snap" / "live").iterdir()
    data = bytearray(snap.read_bytes())
    data[len(data) // 2] ^= 0xFF
    snap.write_bytes(bytes(data))
    before = tree(root)
    report = run_doctor(root)
    assert tree(root) == before
    journals_check = {c.id: c for c in report.checks}["journals"]
    assert journals_check.status == "attention"
    assert "reads the whole log" in (journals_check.next or "")
    assert snap.name in (journals_check.next or "")


def test_a_lost_segments_advice_before_any_start_is_what_following_it_does(
    root: Path, tmp_path: Path,
) -> None:
    """doctor names a lost segment before any host has started since. Its advice without a
    copy (move the Run's snapshot out of snap/live/) accepts the loss only once a start has
    held the Run: moved out before, the manifest still names the segment as its host's open
    one, so the next start holds the Run again and writes its snapshot anew. The advice has
    to say so, or followed at once it seems not to work."""
    runtime = ProjectPaths(root).runtime
    _clean_then_crashed(runtime)
    (runtime / SEG2).unlink()
    journals_check = {c.id: c for c in run_doctor(root).checks}["journals"]
    advice = journals_check.next or ""
    assert "Without a copy" in advice, advice

    live = runtime / "snap" / "live" / snapshot_name("RUN-B")
    live.rename(tmp_path / live.name)  # the advice, followed before any start
    store = open_store(runtime, instance_id="INST-3")
    held = {r.run_id: r.status for r in store.restored.runs}
    store.close_blocking()
    assert held["RUN-B"] == "corrupt" and live.exists()
    assert "once a start has held it" in advice, advice


def test_a_run_another_intloom_wrote_is_previewed_as_held_for_that_not_for_its_workflow(
    root: Path,
) -> None:
    """A Run a newer intloom wrote (a downgrade), its Workflow unchanged: doctor and inspect
    said "the journal is incompatible with the loaded Workflow", which sent the user looking
    for an edit, when the problem line says to upgrade intloom. A Run held for its Workflow
    keeps those words."""
    header = _header(root, "RUN-newer")
    newer = msgspec.structs.replace(header, package_version="9.0.0")
    _write(root, {"RUN-newer": [newer, StagePending(at=AT, stage="draft")],
                  "RUN-changed": [_header(root, "RUN-changed", identity="f" * 64),
                                  StagePending(at=AT, stage="draft")]})
    previews = {p.run_id: p for p in run_doctor(root).runs}
    held = previews["RUN-newer"]
    assert (held.journal, held.verdict.row) == ("incompatible", "needs_attention")
    assert held.verdict.reason == ("the journal was written by an intloom this one does not "
                                   "continue; it is kept byte-identical and not restored")
    assert (held.problem or "").endswith(f"newer than this {__version__}; upgrade intloom"), (
        held.problem)
    assert previews["RUN-changed"].verdict.reason.startswith(
        "the journal is incompatible with the loaded Workflow"), previews["RUN-changed"]


def test_a_changed_runs_advice_to_put_its_code_back_is_what_a_start_then_does(
        root: Path) -> None:
    """A Run held for its changed code was told "restore the code the Run started with to
    resume it" also when it waited on an Agent task, which no start resumes (its claim is
    never restored): with the code put back, the start reported it RUN_INTERRUPTED."""
    from intloom.runtime.model import PendingAgentCall

    call = PendingAgentCall(id="CALL-1", agent_id="default", phase="available",
                            request={"topic": "t"}, tools=[], created_at=AT)
    changed = "f" * 64
    _write(root, {
        "RUN-task": [_header(root, "RUN-task", identity=changed),
                     StagePending(at=AT, stage="draft"),
                     StepReady(at=AT, stage="draft", step="write"),
                     Executing(at=AT, stage="draft", step="write"),
                     Waiting(at=AT, agent_call=call)],
        "RUN-ready": [_header(root, "RUN-ready", identity=changed),
                      StagePending(at=AT, stage="draft"),
                      StepReady(at=AT, stage="draft", step="write")],
        "RUN-asked": [_header(root, "RUN-asked", identity=changed),
                      StagePending(at=AT, stage="draft"),
                      StepReady(at=AT, stage="draft", step="review"),
                      Executing(at=AT, stage="draft", step="review"),
                      Waiting(at=AT, action=_action())],
        "RUN-answered": [_header(root, "RUN-answered", identity=changed),
                         StagePending(at=AT, stage="draft"),
                         StepReady(at=AT, stage="draft", step="review"),
                         Executing(at=AT, stage="draft", step="review"),
                         Waiting(at=AT, action=_action()),
                         Answered(at=AT, action_id="ASK-1", answer={"isConfirmed": True}),
                         Executing(at=AT, stage="draft", step="review")],
    })
    problems = {p.run_id: p.problem or "" for p in run_doctor(root).runs}
    assert "restore the code the Run started with to resume it" in problems["RUN-ready"]
    # A wait resumes only where the code it started with has a recover entry for its Step,
    # which the journal does not say: "restore it to resume it" was untrue without one.
    answered = problems["RUN-answered"]
    assert ("the next start continues it in recover with the accepted answer only if Step "
            "draft/review there has a recover entry") in answered, answered
    assert "resumes its wait" not in answered, answered
    asked = problems["RUN-asked"]
    assert "to resume it" not in asked, asked
    assert ("with the code the Run started with put back, the next start resumes its wait "
            "only if Step draft/review there has a recover entry; without one it reports the "
            "Run RUN_INTERRUPTED; or end it with intloom cancel RUN-asked") in asked, asked
    task = problems["RUN-task"]
    assert "to resume it" not in task, task
    assert ("with the code the Run started with put back, the next start would report it "
            "RUN_INTERRUPTED, not resume it: Step draft/write waits on client Agent task CALL-1 "
            "(available)") in task, task
    assert "end it with intloom cancel RUN-task" in task, task
