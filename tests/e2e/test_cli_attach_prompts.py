"""``intloom attach`` answering on a real terminal (a pty), against a real host.

A picked option answers with the option's id (what a Step routes on), and a number that
is no option's is asked again rather than sent as text.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.terminal import Terminal
from tests.helpers import Project, ok

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


def answered(project: Project, run_id: str) -> Any:
    """The answer the Run's journal recorded."""
    records = ok(project.cli("inspect", run_id, "--json"))["records"]
    found = [r["record"]["answer"] for r in records if r["phase"] == "answered"]
    assert len(found) == 1, records
    return found[0]


def test_picking_an_option_answers_its_id_and_a_wrong_number_asks_again(
    asks_project: Project,
) -> None:
    project = asks_project
    ok(project.cli("start", "--json"))
    run_id = ok(project.cli("flow", "triage", "--intent", "ticket 7", "--json"))["run"]["runId"]
    with Terminal(["--project", str(project.root), "attach", run_id], project.root) as term:
        shown = term.expect("What should happen to this ticket?")
        assert "waiting" in shown  # the history came first
        options = term.expect("]: ")
        assert "2. won't fix [wontfix] (close it as is)" in options, options
        term.type("7")
        told = term.expect("]: ")
        assert "There is no option 7" in told and "1 to 3" in told, told
        term.type("2")
        term.expect("A note for the reporter?")
        term.expect("]: ")
        term.type("")  # skippable: Enter skips
        code = term.finish()
        assert code == 0, term.text()
        assert "Completed · triage" in term.rest(), term.text()
    assert answered(project, run_id) == [
        {"questionId": "resolution", "isSkipped": False, "answer": "wontfix"},
        {"questionId": "note", "isSkipped": True},
    ]


def test_free_text_is_still_an_answer_when_a_question_has_options(
    asks_project: Project,
) -> None:
    project = asks_project
    ok(project.cli("start", "--json"))
    run_id = ok(project.cli("flow", "triage", "--intent", "ticket 8", "--json"))["run"]["runId"]
    with Terminal(["--project", str(project.root), "attach", run_id], project.root) as term:
        term.expect("What should happen to this ticket?")
        options = term.expect("]: ")
        # Each option shows the id a typed answer would name (a label that is its id once).
        assert "1. fix it [fix]" in options and "3. duplicate\r\n" in options, options
        term.type("duplicate")  # typed, not picked: sent as it is
        term.expect("A note for the reporter?")
        term.expect("]: ")
        term.type("see ticket 3")
        assert term.finish() == 0, term.text()
        assert "Completed · triage" in term.rest(), term.text()
    assert answered(project, run_id) == [
        {"questionId": "resolution", "isSkipped": False, "answer": "duplicate"},
        {"questionId": "note", "isSkipped": False, "answer": "see ticket 3"},
    ]
