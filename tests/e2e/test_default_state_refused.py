"""A Stage's default State that decodes as its type but that the save check refuses (here a
set in a field typed Any) passed the load: ``doctor`` said the Workflow loaded, ``start``
ran it, and every Run failed entering the Stage (STAGE_STATE_INVALID). Doctor and start now
report it as the definition error it is, naming the Stage, the State class and the fact."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Project, ok, one_source_project, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SOURCE = '''
from typing import Any

import msgspec

import intloom


class Bag(msgspec.Struct):
    seen: Any = msgspec.field(default_factory=set)


bag = intloom.Workflow("bag", version="1")
s = bag.stage("s", state=Bag)


@s.step("a", routes={"ok": intloom.COMPLETE})
def a(ctx: intloom.StepContext[Bag]) -> str:
    return "ok"
'''

FACTS = ("workflows/bag.py, line ", "Workflow 'bag', Stage 's': the default State Bag() cannot "
         "be saved as it is: $.seen is a set, in a part of the State typed Any",
         "declare @stage.init to build the State")


@pytest.fixture
def proj(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "bag", SOURCE))


def test_doctor_and_start_report_a_default_state_the_save_check_refuses(proj: Project) -> None:
    doctor = proj.cli("doctor", "--json")
    [check] = [c for c in doctor.json["checks"] if c["id"] == "workflows"]
    assert check["status"] == "attention", check
    assert "WORKFLOW_DEFINITION_INVALID" in check["message"], check
    for fact in FACTS:
        assert fact in check["message"], (fact, check["message"])

    service = ok(proj.cli("start", "--json"))["service"]
    assert service["workflowCount"] == 0
    [problem] = service["workflowProblems"]
    assert problem["source"] == "workflows/bag.py"
    assert problem["code"] == "WORKFLOW_DEFINITION_INVALID"
    for fact in FACTS:
        assert fact in problem["message"], (fact, problem["message"])
    refused = proj.cli("flow", "bag", "--intent", "x", "--json")
    assert refused.code != 0 and refused.json["error"]["code"] == "NOT_FOUND", refused.stdout
    ok(proj.cli("stop", "--json"))
