"""Mistakes a person makes answering a Run's question or confirmation with ``intloom
answer``: each is refused with what was wrong, and the Run still waits on the same action.
Real host, real CLI subprocesses; every host is reaped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import (
    Project,
    eventually,
    make_project,
    ok,
    one_source_project,
    reaped,
    started_waiting,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@pytest.fixture
def asks(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(make_project(tmp_path, "asks"))


def _still_waits(project: Project, run_id: str, action_id: str) -> None:
    run = ok(project.cli("attach", run_id, "--json"))["run"]
    assert run["status"] == "waiting" and run["pendingAction"]["id"] == action_id, run


def test_an_answer_naming_a_member_twice_is_refused_not_read_as_its_last(
        asks: Project) -> None:
    """JSON with a member named twice was read as its last one: '{"isConfirmed": true,
    "isConfirmed": false}' declined the confirmation, for good (other readers take the
    first). Which one the person meant is unclear, so nothing is sent."""
    run_id, action_id = started_waiting(asks, "triage")
    twice = json.dumps([{"questionId": "resolution", "isSkipped": False, "answer": "fix"},
                        {"questionId": "note", "isSkipped": True}])
    twice = twice.replace('"answer": "fix"', '"answer": "wontfix", "answer": "fix"')
    result = asks.cli("answer", run_id, action_id, twice, "--json")
    assert result.code == 1, result
    error = result.json["error"]
    assert error["code"] == "INVALID_REQUEST", error
    assert error["message"].startswith(
        'ANSWER[0] has the member "answer" twice, so which one counts is unclear'), error
    assert "nothing was sent" in error["message"]
    _still_waits(asks, run_id, action_id)
    # The questions answered (fix), the confirmation it routes to, given twice.
    ok(asks.cli("answer", run_id, action_id, twice.replace('"answer": "wontfix", ', ""),
                "--json"))
    run = ok(asks.cli("attach", run_id, "--json"))["run"]
    confirm = run["pendingAction"]["id"]
    assert run["pendingAction"]["kind"] == "user_ask_confirmation", run
    result = asks.cli("answer", run_id, confirm, '{"isConfirmed": true, "isConfirmed": false}')
    assert result.code == 1 and result.stdout == "", result
    assert ('Failure · INVALID_REQUEST: ANSWER has the member "isConfirmed" twice'
            in result.stderr), result
    _still_waits(asks, run_id, confirm)
    # A repeat inside a string is text, not a member.
    feedback = json.dumps({"isConfirmed": True, "feedback": '{"a": 1, "a": 2}'})
    assert ok(asks.cli("answer", run_id, confirm, feedback, "--json"))["run"]["status"] == \
        "completed"


@pytest.fixture
def basic(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(make_project(tmp_path, "basic"))


def test_an_answer_sent_again_after_a_crash_is_told_it_was_taken(basic: Project) -> None:
    """The reply to an answer can be lost with its host (kill -9): `answer` then says to
    check the Run before retrying. A retry after the next start was told its action "is not
    (or no longer)" the Run's, not that the answer had been accepted: memory held only
    this host's last answer, and the answer was the earlier host's. It reads it from the
    journal now. The same holds for an answer this host took before its last one."""
    run_id, first = started_waiting(basic)
    run = ok(basic.cli("answer", run_id, first, '{"isConfirmed": false}', "--json"))["run"]
    second = run["pendingAction"]["id"]  # declined: the draft is written again, then asked
    assert second != first, run
    basic.kill_host()
    ok(basic.cli("recover", "--json"))
    ok(basic.cli("start", "--json"))
    _still_waits(basic, run_id, second)  # the wait restored, the same action

    result = basic.cli("answer", run_id, first, '{"isConfirmed": false}', "--json")
    assert result.code == 1, result
    error = result.json["error"]
    assert error["code"] == "CONFLICT", error
    assert error["message"].startswith(
        f"Action {first} of Run {run_id} was already answered by an earlier request "
        f"(declined); it waits on {second} (confirmation)."), error
    # Read back from the journal, the recorded answer is compared with the retried one.
    same = "The recorded answer is the same as this one: if you sent it before"
    assert error["message"].endswith(f"{same} and its reply was lost, yours was recorded, "
                                      "and there is nothing more to do."), error
    _still_waits(basic, run_id, second)

    # Answered by this host, then again: a retry of the first is told so too.
    run = ok(basic.cli("answer", run_id, second, '{"isConfirmed": false}', "--json"))["run"]
    third = run["pendingAction"]["id"]
    run = ok(basic.cli("answer", run_id, third, '{"isConfirmed": false}', "--json"))["run"]
    fourth = run["pendingAction"]["id"]
    result = basic.cli("answer", run_id, second, '{"isConfirmed": true}', "--json")
    assert result.json["error"]["message"].startswith(
        f"Action {second} of Run {run_id} was already answered by an earlier request "
        f"(declined); it waits on {fourth} (confirmation)."), result
    assert result.json["error"]["message"].endswith(" The recorded answer is not this one.")
    # An id no answer ever had is still "not (or no longer)" the Run's.
    result = basic.cli("answer", run_id, "ASK-" + "x" * 21, '{"isConfirmed": true}', "--json")
    assert result.json["error"]["message"].startswith(
        f"Action ASK-{'x' * 21} is not (or no longer) Run {run_id}'s unanswered action"), result
    _still_waits(basic, run_id, fourth)


def test_an_answer_sent_again_to_a_run_that_ended_is_told_it_ended(basic: Project) -> None:
    """The retry of an answer whose reply a crash took, to a Run that then completed, was
    NOT_FOUND "not known to this host", once a later host had started: it said neither that
    the Run had ended nor that the answer had been taken. It now says both (CONFLICT, as for
    a Run the host holds), from the log right after a crash and from the Run's snapshot
    after a stop; a Run stopped by a cancel says so too."""
    run_id, action_id = started_waiting(basic)
    run = ok(basic.cli("answer", run_id, action_id, '{"isConfirmed": true}', "--json"))["run"]
    assert run["status"] == "completed", run
    basic.kill_host()
    ok(basic.cli("recover", "--json"))
    ok(basic.cli("start", "--json"))

    def retried() -> str:
        result = basic.cli("answer", run_id, action_id, '{"isConfirmed": true}', "--json")
        assert result.code == 1, result
        error = result.json["error"]
        assert error["code"] == "CONFLICT", error
        return str(error["message"])

    said = (f"Action {action_id} of Run {run_id} was already answered by an earlier request "
            "(confirmed); the Run has completed and takes no answer; nothing was recorded.")
    first = retried()
    assert first.startswith(said), first
    assert "The recorded answer is the same as this one" in first, first
    ok(basic.cli("stop", "--json"))  # the Run's journal is summarised in its snapshot
    ok(basic.cli("start", "--json"))
    message = retried()
    assert message.startswith(said), message
    assert f"intloom inspect {run_id} shows its journal" in message

    stopped, asked = started_waiting(basic)
    ok(basic.cli("cancel", stopped, "--json"))
    ok(basic.cli("stop", "--json"))
    ok(basic.cli("start", "--json"))
    result = basic.cli("answer", stopped, asked, '{"isConfirmed": true}', "--json")
    assert result.json["error"]["message"].startswith(
        f"Action {asked} is not (or no longer) Run {stopped}'s unanswered action; the Run was "
        "stopped (RUN_STOPPED, by a cancel) and takes no answer"), result
    # A Run no journal holds is still not known.
    unknown = run_id[:-1] + ("x" if run_id[-1] != "x" else "y")
    result = basic.cli("answer", unknown, action_id, '{"isConfirmed": true}', "--json")
    assert result.json["error"]["code"] == "NOT_FOUND", result


def test_a_huge_typed_id_is_quoted_by_its_start_and_length(basic: Project) -> None:
    """`intloom inspect <130,000-character id>` wrote the whole id back in its error (and
    `logs ID` in its note): the host cut what it quotes, the CLI's own errors did not. Every
    command that echoes a typed id now quotes its first 200 characters and its length."""
    run_id, action_id = started_waiting(basic)
    huge = "RUN-" + "a" * 130_000
    cut = "a" * 196 + "… (130,004 characters)"
    for args in (("inspect", huge), ("attach", huge), ("cancel", huge),
                 ("answer", huge, action_id, '{"isConfirmed": true}'),
                 ("answer", run_id, "ASK-" + "b" * 130_000, '{"isConfirmed": true}'),
                 ("logs", huge)):
        for json_mode in ((), ("--json",)):
            result = basic.cli(*args, *json_mode)
            shown = result.stdout + result.stderr
            assert len(shown) < 2_000, (args[0], json_mode, len(shown), shown[:300])
            assert "… (130,004 characters)" in shown or (json_mode and args[0] == "logs"), \
                (args[0], json_mode, shown[:600])
    said = basic.cli("inspect", huge, "--json").json["error"]["message"]
    assert said.startswith(f"No journal for Run 'RUN-{cut}' under "), said
    _still_waits(basic, run_id, action_id)


def test_an_empty_run_or_action_id_is_a_bad_argument_not_a_run_not_found(
        basic: Project) -> None:
    """An empty RUN was the host's NOT_FOUND ("Run '' is not known to this host"), an empty
    ACTION INVALID_REQUEST: the CLI now refuses either as the argument it is, before
    anything is sent, and the host refuses a Client's request naming no Run the same way."""
    from intloom.client import Client
    from intloom.errors import IntloomError

    run_id, action_id = started_waiting(basic)
    yes = '{"isConfirmed": true}'
    for args, said in (
        (("answer", "", action_id, yes), "RUN is empty; nothing was sent. Pass the Run's id "
                                         "(RUN-<UTC>-<random>; intloom runs lists"),
        (("answer", run_id, "", yes), "ACTION is empty; nothing was sent. Pass the action's "
                                      "id (ASK-<random>; intloom runs shows"),
        (("attach", ""), "RUN is empty; nothing was sent."),
        (("cancel", " "), "RUN ' ' is blank (only whitespace); nothing was sent."),
        (("inspect", ""), "RUN is empty; nothing was read."),
    ):
        result = basic.cli(*args, "--json")
        assert result.code == 1, (args, result)
        error = json.loads(result.stdout)["error"]
        assert error["code"] == "INVALID_REQUEST" and error["message"].startswith(said), \
            (args, error)
    with Client.connect(basic.root) as client:
        for call in (lambda: client.get_run(""), lambda: client.cancel(""),
                     lambda: client.answer(" ", action_id, {"isConfirmed": True})):
            with pytest.raises(IntloomError) as refused:
                call()
            assert refused.value.code == "INVALID_REQUEST", refused.value
            assert refused.value.message.startswith("run_id is "), refused.value
            assert "give the id of a Run (RUN-<UTC>-<random>" in refused.value.message
    _still_waits(basic, run_id, action_id)


SLOW_AFTER_ANSWER = '''
from __future__ import annotations

import asyncio

import intloom

wf = intloom.Workflow("gate", version="1.0.0")
main = wf.stage("main")


@main.step("approve", routes={"done": intloom.COMPLETE})
async def approve(ctx: intloom.StepContext[None]) -> str:
    await ctx.confirm({"deploy": ctx.intent})
    await asyncio.sleep(600)  # work that is no effect: the cancel comes meanwhile
    return "done"
'''


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "gate", SLOW_AFTER_ANSWER))


def test_a_cancel_after_an_accepted_answer_says_the_answer_was_taken(gate: Project) -> None:
    """A cancel while the Step went on from an accepted answer ended the Run with "The Run
    was stopped." alone, which is also what the answer's own command printed as its reply:
    the person could not tell that the answer had been accepted, nor whether the Step had
    acted on it. The Run's error now names the answer and what ran since."""
    run_id, action_id = started_waiting(gate, "gate", "v2")
    answering = subprocess.Popen(
        [sys.executable, "-m", "intloom", "--project", str(gate.root), "answer", run_id,
         action_id, '{"isConfirmed": true}'],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "NO_COLOR": "1"})
    try:
        eventually(lambda: any(r["phase"] == "answered" for r in ok(
            gate.cli("inspect", run_id, "--json"))["records"]) or None,
            timeout=30, what="the answer to be accepted")
        cancelled = ok(gate.cli("cancel", run_id, "--json"))["run"]
        out, err = answering.communicate(timeout=60)
    finally:
        if answering.poll() is None:
            answering.kill()
            answering.wait(timeout=10)
    said = (f"The Run was stopped while Step main/approve was going on from the accepted "
            f"answer to confirmation {action_id} (confirmed); no effect had run since.")
    assert cancelled["status"] == "failed", cancelled
    assert cancelled["lastError"] == {"code": "RUN_STOPPED", "message": said,
                                      "retryable": False}, cancelled
    assert answering.returncode == 1, (out, err)
    assert f"RUN_STOPPED: {said}" in out, out
