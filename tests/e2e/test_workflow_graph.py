"""A Workflow whose routes never reach ``intloom.COMPLETE`` loaded, and its Runs could only
go round, wait or fail: a real host's ``start`` and ``doctor`` now report it as the
definition error it is (the host runs the others). A Step no route reaches still loads: it
is a note in ``doctor`` (healthy, exit 0) and a warning in the host log."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Project, ok, one_source_project, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

LOOPS = '''
import intloom

wf = intloom.Workflow("notes", version="1")
draft = wf.stage("draft")


@draft.step("write", routes={"written": "review"})
def write(ctx: intloom.StepContext[None]) -> str:
    return "written"


@draft.step("review", routes={"approved": "write", "rejected": "write"})
def review(ctx: intloom.StepContext[None]) -> str:
    return "approved"
'''

FACTS = ("workflows/notes.py, line 4: Workflow 'notes', definition: no Run of it could ever "
         "complete: from its entry (Stage 'draft', Step 'write') the routes reach only Stage "
         "'draft', Steps 'write' and 'review', and none of them routes an outcome to "
         "intloom.COMPLETE",
         'Route the outcome that ends the Run to intloom.COMPLETE (routes={"done": '
         "intloom.COMPLETE}) in one of those Steps.")

SPARE = LOOPS.replace('"approved": "write"', '"approved": intloom.COMPLETE') + '''

@draft.step("spare", routes={"ok": intloom.COMPLETE})
def spare(ctx: intloom.StepContext[None]) -> str:
    return "ok"
'''

NOTE = ("Workflow 'notes': no route from its entry (Stage 'draft', Step 'write') leads to "
        "Stage 'draft', Step 'spare', so no Run runs it.")


@pytest.fixture
def proj(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "notes", LOOPS))


def test_start_and_doctor_refuse_a_workflow_no_route_of_which_completes(proj: Project) -> None:
    doctor = proj.cli("doctor", "--json")
    [check] = [c for c in doctor.json["checks"] if c["id"] == "workflows"]
    assert check["status"] == "attention", check
    for fact in FACTS:
        assert fact in check["message"], (fact, check["message"])

    start = proj.cli("start")  # text, as a person sees it
    assert start.code == 0, start.stderr
    assert "1 failed to load" in start.stdout, start.stdout
    for fact in FACTS:
        assert fact in " ".join(start.stdout.split()), (fact, start.stdout)
    service = ok(proj.cli("status", "--json"))["service"]
    [problem] = service["workflowProblems"]
    assert problem["source"] == "workflows/notes.py", problem
    assert problem["code"] == "WORKFLOW_DEFINITION_INVALID", problem
    refused = proj.cli("flow", "notes", "--intent", "x", "--json")
    assert refused.code != 0 and refused.json["error"]["code"] == "NOT_FOUND", refused.stdout
    ok(proj.cli("stop", "--json"))


def test_a_step_no_route_reaches_loads_with_a_note_in_doctor_and_the_host_log(
    proj: Project,
) -> None:
    (proj.root / "workflows" / "notes.py").write_text(SPARE)
    doctor = proj.cli("doctor", "--json")
    [check] = [c for c in doctor.json["checks"] if c["id"] == "workflows"]
    assert check["status"] == "ok", check
    assert NOTE in check["message"], check
    assert doctor.json["health"] == "healthy" and doctor.code == 0, doctor.stdout

    assert ok(proj.cli("start", "--json"))["service"]["workflowCount"] == 1
    logs = proj.cli("logs", "--json")
    assert logs.code == 0, logs.stderr
    [warned] = [r for r in map(json.loads, logs.stdout.splitlines())
                if r.get("event") == "workflow_unreached"]
    assert warned["level"] == "warning" and warned["workflow"] == "notes", warned
    assert warned["message"].startswith(NOTE), warned
    ok(proj.cli("stop", "--json"))
