"""Values the real CLI cannot send (an integer beyond 64 bits, text that is not UTF-8, JSON
nested past the decoder's depth) are INVALID_REQUEST, exit 1 (a known error, docs/cli.md),
never CLI_INTERNAL_ERROR; the wait is unchanged."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import CliResult, Project, ok, started_waiting

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

HUGE = "123456789012345678901234567890"


def refused(result: CliResult) -> str:
    assert result.code == 1, (result.code, result.stdout, result.stderr)
    assert len(result.stdout.splitlines()) == 1, result.stdout
    error: dict[str, Any] = result.json["error"]
    assert (error["code"], error["retryable"]) == ("INVALID_REQUEST", False), error
    return str(error["message"])


def test_answer_with_an_integer_beyond_64_bits_leaves_the_wait(project: Project) -> None:
    ok(project.cli("start", "--json"))
    run = ok(project.cli("flow", "example", "--intent", "notes", "--json"))["run"]
    run_id, action = run["runId"], run["pendingAction"]["id"]
    for answer, where in (
        (f'{{"isConfirmed": true, "feedback": {HUGE}}}', "answer.feedback"),
        (f'{{"isConfirmed": true, "unknown": [{HUGE}]}}', "answer.unknown[0]"),
        (f'[{{"questionId": "q1", "isSkipped": false, "answer": -{HUGE}}}]', "answer[0].answer"),
    ):
        message = refused(project.cli("answer", run_id, action, answer, "--json"))
        assert f"{where} is an integer beyond 64 bits" in message, message
        assert "as a string" in message and "Nothing was sent" in message
    text = project.cli("answer", run_id, action, "-", input=f'{{"isConfirmed": {HUGE}}}')
    assert text.code == 1 and text.stdout == ""
    assert text.stderr.startswith("Failure · INVALID_REQUEST: Cannot send the Answer request: "
                                  "answer.isConfirmed is an integer beyond 64 bits")
    deep = "[" * 5000 + "]" * 5000
    assert "nested too deeply" in refused(project.cli("answer", run_id, action, deep, "--json"))
    assert ok(project.cli("runs", "--json"))["runs"] == [run]  # the wait is unchanged
    done = ok(project.cli("answer", run_id, action, '{"isConfirmed": true}', "--json"))["run"]
    assert done["status"] == "completed"


def test_an_intent_that_is_not_utf8_creates_no_run(project: Project) -> None:
    ok(project.cli("start", "--json"))
    # argv bytes that are not UTF-8 (here 0xff) reach Python as a lone surrogate.
    message = refused(project.cli("flow", "example", "--intent", "notes \udcff", "--json"))
    assert "intent holds text that is not valid Unicode" in message, message
    assert ok(project.cli("runs", "--json"))["runs"] == []


def test_answer_with_a_lone_surrogate_escape_names_it_and_leaves_the_wait(
    project: Project,
) -> None:
    # JSON may escape half a surrogate pair; no text can hold one, and msgspec's own reason
    # for refusing it ("Input data was truncated") names something else.
    ok(project.cli("start", "--json"))
    run = ok(project.cli("flow", "example", "--intent", "notes", "--json"))["run"]
    run_id, action = run["runId"], run["pendingAction"]["id"]
    for answer, where in (
        ('"\\ud800"', "ANSWER"),
        ('{"isConfirmed": true, "feedback": "ok \\udc00"}', "ANSWER.feedback"),
        ('[{"questionId": "q1", "answer": "\\ud83d then \\ud83d"}]', "ANSWER[0].answer"),
    ):
        message = refused(project.cli("answer", run_id, action, answer, "--json"))
        assert message.startswith(f"{where} holds a lone surrogate escape"), message
        assert "not valid Unicode text" in message and "nothing was sent" in message
        assert "both halves of its pair" in message and "truncated" not in message
    text = project.cli("answer", run_id, action, "-", input='{"feedback": "\\ud800"}')
    assert text.code == 1 and text.stdout == ""
    assert text.stderr.startswith(
        "Failure · INVALID_REQUEST: ANSWER.feedback holds a lone surrogate escape"), text.stderr
    assert ok(project.cli("runs", "--json"))["runs"] == [run]  # the wait is unchanged


def test_answer_with_bytes_that_are_not_utf8_is_refused_not_a_crash(project: Project) -> None:
    ok(project.cli("start", "--json"))
    run = ok(project.cli("flow", "example", "--intent", "notes", "--json"))["run"]
    run_id, action = run["runId"], run["pendingAction"]["id"]
    # argv bytes that are not UTF-8 (here 0xff) reach Python as a lone surrogate.
    answer = '{"isConfirmed": true, "feedback": "\udcff"}'
    message = refused(project.cli("answer", run_id, action, answer, "--json"))
    assert message.startswith("ANSWER holds bytes that are not UTF-8 text"), message
    assert "nothing was sent" in message and "Pass the answer as UTF-8" in message
    assert ok(project.cli("runs", "--json"))["runs"] == [run]  # the wait is unchanged


def test_inspect_of_a_run_id_that_is_not_utf8_is_refused_not_a_crash(project: Project) -> None:
    # inspect reads the store offline: with a runtime/ to read, such an id reached the
    # snapshot's file name and failed CLI_INTERNAL_ERROR (exit 70), where attach and cancel
    # refuse it as INVALID_REQUEST (exit 1).
    run_id, _ = started_waiting(project)
    for when in ("running", "stopped"):
        bad = run_id + "\udcff"  # argv bytes that are not UTF-8 (0xff): a lone surrogate
        message = refused(project.cli("inspect", bad, "--json"))
        assert message.startswith("RUN 'RUN-") and "holds bytes that are not UTF-8" in message
        assert "Check the Run id" in message, message
        text = project.cli("inspect", bad)
        assert (text.code, text.stdout) == (1, ""), (when, text)
        assert text.stderr.startswith("Failure · INVALID_REQUEST: RUN "), text.stderr
        assert "\\udcff" in text.stderr and "Traceback" not in text.stderr
        assert ok(project.cli("inspect", run_id, "--json"))["run"]["runId"] == run_id
        ok(project.cli("stop", "--json"))
