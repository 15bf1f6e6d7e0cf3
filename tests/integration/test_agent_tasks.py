"""A client Agent's task end to end, against a real host and a real client: the Agent's
output reaches the Workflow through ``on_complete``; a refused output leaves the task as it
was; a completion retried (its reply lost) gets the Run's view again, not CONFLICT."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import stat
import textwrap
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from intloom.client.client import Client
from intloom.errors import IntloomError
from intloom.runtime.model import RunView
from tests.helpers import CliResult, Project, eventually, ok
from tests.integration.host_support import hello_frame, reply, start

pytestmark = pytest.mark.timeout(60)

RESEARCH = textwrap.dedent('''
    from typing import Any

    import msgspec

    import intloom


    class Notes(msgspec.Struct):
        findings: list[str] = []


    wf = intloom.Workflow("research", version="1")
    main = wf.stage("main", state=Notes)


    @main.agent_step("look", routes={"found": "use", "nothing": intloom.COMPLETE})
    def look(ctx: intloom.StepContext[Notes]) -> Any:
        return {"topic": ctx.intent}


    @look.on_complete
    def absorb(ctx: intloom.StepContext[Notes], result: intloom.AgentResult) -> None:
        if result.outcome == "found":
            if not isinstance(result.output, dict) or "items" not in result.output:
                raise ValueError("the output must be {'items': [...]}")
            ctx.state = Notes(findings=[str(item) for item in result.output["items"]])


    @main.step("use", routes={"ok": intloom.COMPLETE})
    async def use(ctx: intloom.StepContext[Notes]) -> str:
        await ctx.confirm({"findings": ctx.state.findings})
        return "ok"
''')


@pytest.fixture
def client(project: Project) -> Iterator[Client]:
    (project.root / "workflows" / "research.py").write_text(RESEARCH)
    (project.root / "intloom.toml").write_text(
        'workflows = ["workflows/example.py", "workflows/research.py"]\n')
    start(project)
    with Client.connect(project.root) as connected:
        yield connected


def _task(client: Client, workflow: str = "research",
          intent: str = "rust async runtimes") -> tuple[RunView, str]:
    """A new Run waiting on its Agent task: (the Run, the task's id)."""
    run = client.create_run(workflow, intent)
    call = run.pending_agent_call
    assert run.status == "waiting" and call is not None, run
    return run, call.id


def _claimed(client: Client, workflow: str = "research") -> tuple[RunView, str, str]:
    run, call = _task(client, workflow)
    token, _ = client.claim_agent_call(run.run_id, call, "agent-1")
    return run, call, token


def _refused(call: object, code: str) -> str:
    assert callable(call)
    with pytest.raises(IntloomError) as refused:
        call()
    assert refused.value.code == code, refused.value.message
    return refused.value.message


def test_the_agents_output_reaches_the_next_step_through_on_complete(client: Client) -> None:
    run, call_id, token = _claimed(client)
    done = client.complete_agent_call(run.run_id, call_id, token, "found",
                                      {"items": ["tokio", "smol"]})
    assert done.status == "waiting" and done.pending_action is not None, done
    assert done.pending_action.kind == "user_ask_confirmation"
    assert done.pending_action.request == {"context": {"findings": ["tokio", "smol"]}}


def test_a_refused_output_records_nothing_and_the_task_can_be_completed_again(
        client: Client) -> None:
    run, call_id, token = _claimed(client)
    before = client.get_run(run.run_id)
    message = _refused(lambda: client.complete_agent_call(run.run_id, call_id, token, "found",
                                                          {"wrong": 1}), "INVALID_REQUEST")
    assert "Stage 'main', Step 'look' on_complete refused the Agent's result" in message
    # Where in the source, as a Step's and a Tool's failure say (before 2026-12-04: not).
    assert re.search(r"ValueError at line \d+ of workflows/\w+\.py: the output must be "
                     r"\{'items': \[\.\.\.\]\}", message), message
    assert "complete it again" in message
    assert client.get_run(run.run_id) == before  # still waiting, still claimed, same seq
    done = client.complete_agent_call(run.run_id, call_id, token, "found", {"items": ["x"]})
    assert done.pending_action is not None
    assert done.pending_action.request == {"context": {"findings": ["x"]}}


def test_a_retried_completion_gets_the_runs_view_and_a_different_one_conflicts(
        client: Client) -> None:
    run, call_id, token = _claimed(client)
    first = client.complete_agent_call(run.run_id, call_id, token, "found",
                                       {"items": ["a"], "n": 1})
    # The same output re-serialised by the Agent (its keys in another order) is the same.
    again = client.complete_agent_call(run.run_id, call_id, token, "found",
                                       {"n": 1, "items": ["a"]})
    assert again == first
    # So is 1 sent again as 1.0 (JSON has one type of number; a Tool call's retry was
    # compared so, a completion's refused CONFLICT "another output").
    assert client.complete_agent_call(run.run_id, call_id, token, "found",
                                      {"items": ["a"], "n": 1.0}) == first
    message = _refused(lambda: client.complete_agent_call(run.run_id, call_id, token, "found",
                                                          {"items": ["b"]}), "CONFLICT")
    assert f"Agent task {call_id} was already completed with outcome 'found'" in message
    message = _refused(lambda: client.complete_agent_call(
        run.run_id, call_id, "not-the-token", "found", {"items": ["a"], "n": 1}), "CONFLICT")
    # The task, the fact and the fix. It advised claim_agent_call again for the token, which
    # on an ended task is refused CONFLICT ("not Run ...'s current task"): a dead end.
    assert message.startswith(
        f"Agent task {call_id} has ended (completed with outcome 'found'), and the owner token "
        "does not match the claim that ended it, so this is not that claim's retry; nothing "
        f"was done. Agent task {call_id} is not Run {run.run_id}'s current task: the Run now "
        f"waits on confirmation {first.pending_action.id if first.pending_action else '?'} "
        "for a person"), message
    assert "claim_agent_call again" not in message
    failed = _refused(lambda: client.fail_agent_call(run.run_id, call_id, "not-the-token",
                                                     "gave up"), "CONFLICT")
    assert failed.startswith(f"Agent task {call_id} has ended (completed with outcome "
                             "'found'), and the owner token does not match"), failed
    # The person's confirmation, asked after the Agent's result, is unchanged by the retries.
    assert client.get_run(run.run_id) == first


def test_a_failure_retried_with_another_message_quotes_the_first_one_bounded(
        client: Client) -> None:
    run, call_id, token = _claimed(client)
    first = "the search gave up: " + "timeout; " * 500  # an Agent's whole log, say
    client.fail_agent_call(run.run_id, call_id, token, first)
    message = _refused(lambda: client.fail_agent_call(run.run_id, call_id, token, "other"),
                       "CONFLICT")
    # The refusal names the task, the fact and the fix; the first message only begins it.
    assert message.startswith(f"Agent task {call_id} was already failed: "
                              "'the search gave up: timeout; "), message
    assert "more characters cut]" in message and "a retry must repeat the same" in message
    assert len(message) < 600, len(message)
    assert client.fail_agent_call(run.run_id, call_id, token, first).status == "failed"


HANDOFF = textwrap.dedent('''
    import time
    from pathlib import Path
    from typing import Any

    import intloom

    wf = intloom.Workflow("handoff", version="1")
    main = wf.stage("main")
    HERE = Path(__file__).resolve().parent.parent


    @main.agent_step("look", routes={"found": "pay"})
    def look(ctx: intloom.StepContext[None]) -> Any:
        return {"topic": ctx.intent}


    def charge(order: str) -> None:
        (HERE / "charging").touch()
        deadline = time.monotonic() + 30  # the host is killed meanwhile; a deadline all the same
        while time.monotonic() < deadline:
            time.sleep(0.01)  # an external call that takes a while


    @main.step("pay", routes={"paid": intloom.COMPLETE})
    def pay(ctx: intloom.StepContext[None]) -> str:
        ctx.effect("charge", charge, ctx.intent, key=f"order:{ctx.intent}")
        return "paid"
''')


def _reply_lost_then_interrupted(project: Project, send: Callable[[Client], object]) -> None:
    """``send`` (its reply waits for the Run to settle) on a connection of its own, while the
    Step it lets go on runs its effect; the host is killed meanwhile, so the reply is lost,
    and started again (the Run restored RUN_INTERRUPTED)."""
    lost: list[str] = []

    def sending() -> None:
        with Client.connect(project.root) as client:
            try:
                send(client)
            except IntloomError as exc:
                lost.append(exc.code)

    thread = threading.Thread(target=sending)
    thread.start()
    try:
        eventually(lambda: (project.root / "charging").exists(), timeout=10,
                   what="the effect to start")
        project.kill_host()
    finally:
        thread.join(timeout=20)
    assert lost == ["PROJECT_REQUEST_FAILED"], lost
    assert project.cli("recover", "--json").code == 0  # the killed host's leftovers
    start(project)


def test_a_task_retried_after_its_run_was_interrupted_quotes_the_runs_error_bounded(
        project: Project) -> None:
    """An Agent's completion whose reply was lost (the host died while the next Step's effect
    ran), retried after a start restored the Run RUN_INTERRUPTED, was refused quoting the
    Run's error in full: up to 4,096 characters (the effect's key, here 1,000), burying the
    refusal's fact and fix. It quotes at most 200 characters of it, marked as cut."""
    (project.root / "workflows" / "handoff.py").write_text(HANDOFF)
    (project.root / "intloom.toml").write_text('workflows = ["workflows/handoff.py"]\n')
    start(project)
    order = "o" * 1000  # an idempotency key: a long id, say
    with Client.connect(project.root) as agent:
        run, call = _task(agent, "handoff", order)
        token, _ = agent.claim_agent_call(run.run_id, call, "agent-1")
    _reply_lost_then_interrupted(
        project, lambda agent: agent.complete_agent_call(run.run_id, call, token, "found", {}))
    with Client.connect(project.root) as agent:
        error = agent.get_run(run.run_id).last_error
        assert error is not None and error.code == "RUN_INTERRUPTED", error
        assert order in error.message  # the Run keeps its evidence whole
        message = _refused(lambda: agent.complete_agent_call(run.run_id, call, token, "found",
                                                             {}), "CONFLICT")
    # Its completion was recorded before the host died (the Run went on to pay): it said
    # only "the Run was interrupted ... Start a new Run for this work", as if it were lost.
    assert message.startswith(f"Agent task {call} is not Run {run.run_id}'s current task: its "
                              "completion (outcome 'found') was recorded and the Run went on, "
                              "then was interrupted (RUN_INTERRUPTED: Execution was "), message
    assert "more characters cut]" in message, message
    assert message.endswith("Nothing was done. Start a new Run for what it had left to do; "
                            f"intloom cancel {run.run_id} dismisses it."), message
    assert len(message) < 1000, len(message)


# The same Workflow with a person's confirmation where the Agent's task is.
CONFIRMED = HANDOFF.replace('''@main.agent_step("look", routes={"found": "pay"})
def look(ctx: intloom.StepContext[None]) -> Any:
    return {"topic": ctx.intent}
''', '''@main.step("look", routes={"found": "pay"})
async def look(ctx: intloom.StepContext[None]) -> str:
    await ctx.confirm({"topic": ctx.intent})
    return "found"
''')


@pytest.mark.parametrize("key_length", [1000, 8])
def test_an_answer_resent_after_its_run_was_interrupted_quotes_the_runs_error_bounded(
        project: Project, key_length: int) -> None:
    """A person's answer resent once its Run was restored RUN_INTERRUPTED (the host died
    while the Step after the answer ran its effect) was refused quoting the Run's error in
    full, as an Agent's retried completion was: up to 4,096 characters. The usual reason
    (a short key) is quoted whole: cut at 200 characters, it lost what was in flight."""
    assert CONFIRMED != HANDOFF
    (project.root / "workflows" / "handoff.py").write_text(CONFIRMED)
    (project.root / "intloom.toml").write_text('workflows = ["workflows/handoff.py"]\n')
    start(project)
    order = "o" * key_length
    with Client.connect(project.root) as person:
        run = person.create_run("handoff", order)
    assert run.pending_action is not None, run
    action = run.pending_action.id
    _reply_lost_then_interrupted(
        project, lambda person: person.answer(run.run_id, action, {"isConfirmed": True}))
    with Client.connect(project.root) as person:
        error = person.get_run(run.run_id).last_error
        assert error is not None and error.code == "RUN_INTERRUPTED", error
        assert order in error.message  # the Run keeps its evidence whole
        message = _refused(lambda: person.answer(run.run_id, action, {"isConfirmed": True}),
                           "CONFLICT")
    # The answer was accepted before the host died: the retry is told so (from the journal).
    assert message.startswith(f"Action {action} of Run {run.run_id} was already answered by "
                              "an earlier request (confirmed); it was interrupted "
                              "(RUN_INTERRUPTED: Execution was "), message
    if key_length > 500:
        assert "more characters cut]" in message, message
    else:
        assert f"(RUN_INTERRUPTED: {error.message})" in message, message
    # The same answer as the one recorded: this retry's own, its reply lost with the host.
    assert message.endswith(f"takes no answer. Start a new Run for this work; intloom cancel "
                            f"{run.run_id} dismisses it. The recorded answer is the same as "
                            "this one: if you sent it before and its reply was lost, yours "
                            "was recorded, and there is nothing more to do."), message
    assert len(message) < 1200, len(message)


def test_answering_an_agent_task_as_a_question_says_what_it_is(client: Client) -> None:
    run, call_id, _token = _claimed(client)
    message = _refused(lambda: client.answer(run.run_id, call_id, {"isConfirmed": True}),
                       "CONFLICT")
    assert message == (f"{call_id} is Run {run.run_id}'s Agent task, not a question or "
                       "confirmation: a client Agent claims and completes it through "
                       "intloom.client (Client.claim_agent_call, then "
                       "Client.complete_agent_call).")


def test_answering_another_id_on_a_run_waiting_for_its_agent_names_the_task(
        client: Client, project: Project) -> None:
    """An answer naming another id (a stale one, a typo) on a Run waiting for its client
    Agent was told the Run "is waiting with no question or confirmation pending" and that
    attach "follows it to its next question", as if nothing were pending: the task is."""
    run, call_id = _task(client)
    answered = project.cli("answer", run.run_id, "ASK-gone", '{"isConfirmed": true}')
    assert answered.code == 1, answered
    assert "Failure · CONFLICT: Action ASK-gone is not (or no longer)" in answered.stderr
    assert (f"it waits on client Agent task {call_id} (available), which a client Agent "
            "claims and completes through intloom.client, not intloom answer; nothing was "
            "recorded.") in answered.stderr, answered.stderr
    assert "no question or confirmation pending" not in answered.stderr
    assert client.get_run(run.run_id).pending_agent_call == run.pending_agent_call


def test_runs_text_says_what_a_run_waiting_for_its_agent_waits_on(
        client: Client, project: Project) -> None:
    """runs printed a Run waiting for a client Agent as a bare "waiting" row, while status
    points there for "what each waiting Run asks": the task's id, phase, Agent and Tools were
    in --json only. Each such Run gets a block, as a Run waiting for a person does."""
    available, first = _task(client)
    claimed, second, _token = _claimed(client)
    listed = project.cli("runs")
    assert listed.code == 0, listed
    for run, call, phase in ((available, first, "available"), (claimed, second, "claimed")):
        block = (f"{run.run_id} waits on client Agent task {call} ({phase}, for Agent "
                 "'default'):\n"
                 '  task: {"topic":"rust async runtimes"}\n'
                 "  a client Agent claims and completes it through intloom.client.Client; "
                 f"intloom --project {project.root} attach {run.run_id} follows it")
        assert block in listed.stdout, listed.stdout
    assert "answer:" not in listed.stdout  # no intloom answer command for an Agent's task
    status = project.cli("status")
    assert "Waiting  intloom runs shows what each waiting Run" in status.stdout, status


LOOPING = textwrap.dedent('''
    import asyncio
    import os
    import time
    from typing import Any

    import intloom

    wf = intloom.Workflow("looping", version="1")
    main = wf.stage("main")


    def held(until: str) -> None:
        # Until the test creates the file named (a deadline keeps a failed test short).
        open(until + ".started", "w").close()
        deadline = time.monotonic() + 20
        while not os.path.exists(until) and time.monotonic() < deadline:
            time.sleep(0.01)


    def slow(input: Any) -> Any:
        held(input["until"])
        time.sleep(input.get("then", 0))  # work that goes on after the test let it go
        return {"slow": input["until"]}


    def search(input: Any) -> Any:
        return {"found": input}


    def setty(input: Any) -> Any:
        return {"tags": {"a", "b"}}  # a set: no JSON value


    def boom(input: Any) -> Any:
        raise RuntimeError("no")  # never reached in these tests: refused BUSY first


    def flaky(input: Any) -> Any:
        with open(input["log"], "a") as log:  # it acts, then raises
            log.write("ran\\n")
        raise RuntimeError("quota exceeded")


    def exits(input: Any) -> Any:
        if input.get("bare"):
            raise RuntimeError()  # no message
        raise SystemExit(3)


    async def acancel(input: Any) -> Any:
        raise asyncio.CancelledError()  # the Tool's own: nothing cancelled the request


    def scancel(input: Any) -> Any:
        raise asyncio.CancelledError()


    def wide(input: Any) -> Any:
        # JSON, but more than msgpack carries: an integer beyond 64 bits, a lone surrogate.
        return {"n": [1, 2**70]} if input.get("int") else {"s": "a\\udcffb"}


    @main.agent_step("look", routes={"again": "look", "done": intloom.COMPLETE},
                     tools=[intloom.Tool("slow", slow),
                            intloom.Tool("search", search, description="Finds a topic's notes."),
                            intloom.Tool("boom", boom), intloom.Tool("flaky", flaky),
                            intloom.Tool("setty", setty), intloom.Tool("wide", wide),
                            intloom.Tool("exits", exits),
                            intloom.Tool("acancel", acancel), intloom.Tool("scancel", scancel)])
    def look(ctx: intloom.StepContext[None]) -> Any:
        return {"topic": ctx.intent}


    @look.on_complete
    def absorb(ctx: intloom.StepContext[None], result: intloom.AgentResult) -> None:
        if isinstance(result.output, dict) and "until" in result.output:
            held(result.output["until"])
            if result.output.get("refuse"):
                raise ValueError("not this one")
        if result.output == "cancel":
            raise asyncio.CancelledError()  # its own, as a Tool's above
''')


@pytest.fixture
def looping(project: Project) -> Iterator[tuple[Client, Project]]:
    (project.root / "workflows" / "looping.py").write_text(LOOPING)
    (project.root / "intloom.toml").write_text(
        'workflows = ["workflows/example.py", "workflows/looping.py"]\n')
    start(project)
    with Client.connect(project.root) as connected:
        yield connected, project


def test_a_task_does_not_end_under_a_running_tool_and_its_receipts_stay_its_own(
        looping: tuple[Client, Project]) -> None:
    """A task could be completed while one of its Tool calls ran; the late Tool then wrote its
    receipt into the next task's receipts (that task replayed an output it never made) and
    cleared the next task's BUSY flag. Completing or failing under a running Tool is BUSY."""

    client, project = looping
    release = project.root / "release-tool"
    running = _running_tool(client, project, "slow", {"until": str(release)})
    run, first, token, results, caller = running
    try:
        busy = _refused(lambda: client.call_tool(run.run_id, first, token, "tc-2", "boom", {}),
                        "BUSY")
        assert "Tool call tc-1 of this task is running" in busy
        for end in (lambda: client.complete_agent_call(run.run_id, first, token, "again", {}),
                    lambda: client.fail_agent_call(run.run_id, first, token, "gave up")):
            refused = _refused(end, "BUSY")
            assert "Tool call tc-1" in refused and "still running" in refused
    finally:
        release.write_text("go")
        caller.join(timeout=20)
    assert results == [({"slow": str(release)}, False)]
    view = client.complete_agent_call(run.run_id, first, token, "again", {})
    assert view.pending_agent_call is not None and view.pending_agent_call.id != first
    second = view.pending_agent_call.id
    token2, _ = client.claim_agent_call(run.run_id, second, "agent-2")
    # The new task has no receipts: tc-1 runs its Tool, and the old one's id is free.
    assert client.call_tool(run.run_id, second, token2, "tc-1", "search", {"q": 1}) == (
        {"found": {"q": 1}}, False)
    stale = _refused(lambda: client.call_tool(run.run_id, first, token, "tc-9", "search", {}),
                     "CONFLICT")
    assert f"now waits on Agent task {second} (claimed); use that one" in stale


def test_the_task_tells_the_agent_what_each_described_tool_is_for(
        looping: tuple[Client, Project]) -> None:
    """``intloom.Tool(..., description=...)`` was checked and then kept from the Agent: the
    task named its Tools only. The task now carries each description, in the view a client
    gets and in ``runs --json``; Tools without one are named as before."""
    client, project = looping
    run = client.create_run("looping", "topic")
    call = run.pending_agent_call
    assert call is not None
    assert call.tool_descriptions == {"search": "Finds a topic's notes."}
    assert "slow" in call.tools and "search" in call.tools
    token, claimed = client.claim_agent_call(run.run_id, call.id, "agent-1")
    assert claimed.tool_descriptions == call.tool_descriptions
    listed = project.cli("runs", "--json")
    assert listed.code == 0, listed
    [shown] = [r for r in listed.json["runs"] if r["runId"] == run.run_id]
    assert shown["pendingAgentCall"]["toolDescriptions"] == {
        "search": "Finds a topic's notes."}
    client.fail_agent_call(run.run_id, call.id, token, "done looking")


def test_a_tool_the_step_does_not_declare_names_the_ones_it_does_and_the_fix(
        client: Client) -> None:
    """call_tool with a Tool the Step does not declare said only "declared: []" (a Python
    list's repr, for a Step with no Tools): no fix, and not that nothing was run. It now says
    which Tools the task may call, that nothing ran, and where the names are listed."""
    run, call, token = _claimed(client)
    refused = _refused(lambda: client.call_tool(run.run_id, call, token, "tc-1", "search", {}),
                       "INVALID_REQUEST")
    assert refused == (
        "Tool 'search' is not declared on Stage 'main', Step 'look', which declares no "
        "Tools; nothing was run. An Agent calls only the Tools its task lists "
        "(pending_agent_call.tools); to give it this one, declare it on the Step "
        "(tools=[intloom.Tool(name, fn)]).")
    task = client.get_run(run.run_id).pending_agent_call  # as it was: still claimed
    assert task is not None and (task.id, task.phase) == (call, "claimed"), task


def test_a_tool_misspelt_by_the_agent_names_the_tools_it_may_call(
        looping: tuple[Client, Project]) -> None:
    client, _ = looping
    run, call, token = _claimed(client, "looping")
    refused = _refused(lambda: client.call_tool(run.run_id, call, token, "tc-1", "serch", {}),
                       "INVALID_REQUEST")
    assert refused.startswith(
        "Tool 'serch' is not declared on Stage 'main', Step 'look', which declares 'acancel', "
        "'boom', 'exits', 'flaky', 'scancel', 'search', 'setty', 'slow', 'wide'; nothing was "
        "run. An Agent calls only the Tools its task lists"), refused


def test_a_task_id_given_as_the_run_names_the_run_and_the_order_of_ids(
        client: Client) -> None:
    """claim_agent_call(call_id, run_id, ...) (ids the wrong way round) was NOT_FOUND saying
    "an action's or an Agent task's id ... intloom answer takes the Run's id, then the
    action's": not which Run's task it is, nor what an Agent passes. As for an action's id,
    it now names the Run whose task it is and the order the Agent calls take."""
    run, call = _task(client)
    for swapped in (lambda: client.claim_agent_call(call, run.run_id, "agent-1"),
                    lambda: client.fail_agent_call(call, run.run_id, "token", "gave up")):
        refused = _refused(swapped, "NOT_FOUND")
        assert refused.startswith(
            f"Run {call!r} is not known to this host. {call} is the id of Run {run.run_id}'s "
            f"Agent task, not of a Run: give {run.run_id} as the Run (claim_agent_call, "
            "call_tool, complete_agent_call and fail_agent_call take the Run's id, then the "
            "task's)."), refused
    task = client.get_run(run.run_id).pending_agent_call  # untouched: still available
    assert task is not None and (task.id, task.phase) == (call, "available"), task


def test_tool_receipts_compare_values_and_name_what_differs(
        looping: tuple[Client, Project]) -> None:
    client, _ = looping
    run, call, token = _claimed(client, "looping")
    first = client.call_tool(run.run_id, call, token, "tc-5", "search", {"q": "x", "a": 1})
    # The same JSON object with its keys in another order is the same input.
    again = client.call_tool(run.run_id, call, token, "tc-5", "search", {"a": 1, "q": "x"})
    assert again == (first[0], True)
    # So is one whose numbers are spelled otherwise (JavaScript re-serialises 1.0 as 1).
    assert client.call_tool(run.run_id, call, token, "tc-5", "search",
                            {"q": "x", "a": 1.0}) == (first[0], True)
    assert "other input" in _refused(lambda: client.call_tool(
        run.run_id, call, token, "tc-5", "search", {"a": 1.5, "q": "x"}), "CONFLICT")
    other = _refused(lambda: client.call_tool(run.run_id, call, token, "tc-5", "slow",
                                              {"a": 1, "q": "x"}), "CONFLICT")
    assert "to Tool 'search', not 'slow'" in other
    assert "other input" in _refused(lambda: client.call_tool(
        run.run_id, call, token, "tc-5", "search", {"a": 2, "q": "x"}), "CONFLICT")


def test_agent_requests_refuse_what_is_not_json_or_empty_and_stale_tasks_say_why(
        looping: tuple[Client, Project]) -> None:
    client, _ = looping
    run, call = _task(client, "looping")
    assert "claim_id is empty" in _refused(
        lambda: client.claim_agent_call(run.run_id, call, ""), "INVALID_REQUEST")
    # Blank is empty too: a claim of spaces, once taken, refused the Agent's real id.
    assert "claim_id is blank ('  ')" in _refused(
        lambda: client.claim_agent_call(run.run_id, call, "  "), "INVALID_REQUEST")
    assert "claim_id is 2,000 characters long" in _refused(
        lambda: client.claim_agent_call(run.run_id, call, "c" * 2000), "INVALID_REQUEST")
    token, _ = client.claim_agent_call(run.run_id, call, "agent-1")
    assert "tool_call_id is empty" in _refused(
        lambda: client.call_tool(run.run_id, call, token, "", "search", {}), "INVALID_REQUEST")
    assert "tool_call_id is blank" in _refused(
        lambda: client.call_tool(run.run_id, call, token, "\t", "search", {}),
        "INVALID_REQUEST")
    # Each is logged with its call and named in a stop's report: a 1 MiB id made lines a
    # stop's report could not read back.
    assert "tool_call_id is 1,025 characters long, over the 1,024-character limit" in _refused(
        lambda: client.call_tool(run.run_id, call, token, "t" * 1025, "search", {}),
        "INVALID_REQUEST")
    assert "$.q is bytes" in _refused(lambda: client.call_tool(
        run.run_id, call, token, "tc-1", "search", {"q": b"\x00"}), "INVALID_REQUEST")
    returned = _refused(lambda: client.call_tool(run.run_id, call, token, "tc-s", "setty", {}),
                        "TOOL_EXECUTION_FAILED")
    assert "Tool 'setty' returned what is not plain JSON data: $.tags is set" in returned
    # It ran: sending the call again runs it again ("the call may be made again" invited a
    # retry that did, a second charge, refused the same way).
    assert "The Tool ran to its end (it may have acted), but no receipt was kept: the same " \
        "call sent again runs it again" in returned, returned
    # What the Tool returned, not something it raised: named by its path, and no receipt kept.
    for tool_input, fact in (({"int": True}, "$.n[1] is an integer beyond 64 bits"),
                             ({}, "$.s holds text that is not valid Unicode")):
        for _ in range(2):
            returned = _refused(lambda tool_input=tool_input: client.call_tool(
                run.run_id, call, token, "tc-w", "wide", tool_input), "TOOL_EXECUTION_FAILED")
            assert f"Tool 'wide' returned what cannot be sent: {fact}" in returned, returned
            assert "raised" not in returned and "sent again runs it again" in returned
    for bad, where in (({"a": b"x"}, "$.a is bytes"), ({"n": float("nan")}, "$.n is nan")):
        message = _refused(lambda bad=bad: client.complete_agent_call(
            run.run_id, call, token, "done", bad), "INVALID_REQUEST")
        assert where in message and "nothing was recorded" in message
    assert "message is empty" in _refused(
        lambda: client.fail_agent_call(run.run_id, call, token, ""), "INVALID_REQUEST")
    long = "x" * 5000
    client.fail_agent_call(run.run_id, call, token, long)
    # A retry must repeat the whole message, not only the part the view keeps.
    _refused(lambda: client.fail_agent_call(run.run_id, call, token, long[:4096] + "other"),
             "CONFLICT")
    assert client.fail_agent_call(run.run_id, call, token, long).status == "failed"
    stale = _refused(lambda: client.call_tool(run.run_id, call, token, "tc-2", "search", {}),
                     "CONFLICT")
    assert "the Run has ended failed (AGENT_TASK_FAILED)" in stale


def test_a_tool_that_raised_says_the_same_call_runs_it_again(
        looping: tuple[Client, Project]) -> None:
    """A Tool that raised was answered "Tool 'flaky' raised RuntimeError: ..." and nothing
    more: an Agent that resends a call as receipts invite (same tool_call_id) could not tell
    it runs the Tool again, after it may already have acted. The refusal says so."""
    client, project = looping
    run, call, token = _claimed(client, "looping")
    log = project.root / "flaky.log"
    for n in (1, 2):
        message = _refused(lambda: client.call_tool(run.run_id, call, token, "tc-f", "flaky",
                                                    {"log": str(log)}),
                           "TOOL_EXECUTION_FAILED")
        line = LOOPING.splitlines().index('    raise RuntimeError("quota exceeded")') + 1
        assert message == (
            f"Tool 'flaky' raised RuntimeError at line {line} of workflows/looping.py: quota "
            "exceeded. No receipt was kept, so the "
            "same call sent again runs the Tool again (it may have acted before it raised); "
            "to run it once only, do not send this call again."), message
        assert log.read_text() == "ran\n" * n  # it did run again


def test_a_tool_that_exits_or_raises_no_message_is_named_as_it_raised(
        looping: tuple[Client, Project]) -> None:
    """A Tool that raised SystemExit was named by the host's internal stand-in ("raised
    _Escaped: SystemExit(3) ..."), and one that raised an exception without a message as
    "raised RuntimeError: ." -- named as the Step's and on_complete's exceptions are."""
    client, _ = looping
    run, call, token = _claimed(client, "looping")
    exited = _refused(lambda: client.call_tool(run.run_id, call, token, "tc-x", "exits", {}),
                      "TOOL_EXECUTION_FAILED")
    # Where it raised, as for a Step; and a Tool's exception fails the call, not the Run.
    assert re.match(r"Tool 'exits' raised SystemExit\(3\) at line \d+ of workflows/looping\.py "
                    r"\(Workflow code must not exit the process, which is the host of every "
                    r"Run; raise an exception instead to fail the Tool call\)\. ", exited), exited
    assert "_Escaped" not in exited
    bare = _refused(lambda: client.call_tool(run.run_id, call, token, "tc-b", "exits",
                                             {"bare": True}), "TOOL_EXECUTION_FAILED")
    assert re.match(r"Tool 'exits' raised RuntimeError at line \d+ of workflows/looping\.py\. "
                    "No receipt was kept", bare), bare
    assert client.get_run(run.run_id).status == "waiting"  # the host and the task go on


def test_a_tool_or_on_complete_raising_cancelled_error_is_refused_not_cut_off(
        looping: tuple[Client, Project]) -> None:
    """A Tool (async or sync) or an on_complete that raised CancelledError itself took the
    host's request handler down with it: no reply, the connection closed, the Agent told "the
    host may have stopped or crashed", a task_error in the host log. It is what it raised."""
    client, _ = looping
    run, call, token = _claimed(client, "looping")
    for tool in ("acancel", "scancel"):
        message = _refused(lambda tool=tool: client.call_tool(
            run.run_id, call, token, f"tc-{tool}", tool, {}), "TOOL_EXECUTION_FAILED")
        assert re.match(rf"Tool {tool!r} raised CancelledError at line \d+ of "
                        r"workflows/looping\.py\. No receipt was kept", message), message
    refused = _refused(lambda: client.complete_agent_call(run.run_id, call, token, "done",
                                                          "cancel"), "INVALID_REQUEST")
    assert refused == (
        "Stage 'main', Step 'look' on_complete refused the Agent's result (outcome 'done'): "
        "CancelledError. Nothing was recorded and the task stays claimed: complete it again "
        "with a corrected output, or fail it."), refused
    # The same connection goes on, and the task is as it was: claimed, and completes.
    assert client.call_tool(run.run_id, call, token, "tc-1", "search", {}) == (
        {"found": {}}, False)
    assert client.complete_agent_call(run.run_id, call, token, "done", {}).status == "completed"


class _Running(NamedTuple):
    run: RunView
    call: str  # the Agent task's id
    token: str  # its claim's owner token
    results: list[object]  # what the Tool call returned (or its error's code and message)
    caller: threading.Thread  # the thread making the Tool call


def _running_tool(client: Client, project: Project, tool: str,
                  input: dict[str, Any]) -> _Running:
    """A looping Run whose task's Tool call ``tc-1`` (``tool``) runs in the host: it writes a
    ``.started`` file beside the file named by ``input["until"]``, which lets it go."""
    run, call, token = _claimed(client, "looping")
    results: list[object] = []

    def call_tool() -> None:
        with Client.connect(project.root) as other:
            try:
                results.append(other.call_tool(run.run_id, call, token, "tc-1", tool, input))
            except IntloomError as exc:
                results.extend([exc.code, exc.message])

    caller = threading.Thread(target=call_tool)
    caller.start()
    started = Path(input["until"] + ".started")
    eventually(started.exists, timeout=10, what="the Tool call to run in the host")
    return _Running(run, call, token, results, caller)


def _stopping(project: Project) -> bool:
    try:
        with Client.connect(project.root) as probe:
            probe.runs()
    except IntloomError as exc:
        return exc.code == "CLI_SERVICE_CLOSING"
    return False


def _stop_then_release(project: Project, release: Path) -> CliResult:
    """``intloom stop``; once the host is stopping (in its grace), let the held work go."""
    stops: list[CliResult] = []
    stopper = threading.Thread(target=lambda: stops.append(project.cli("stop", "--timeout",
                                                                       "30")))
    stopper.start()
    try:
        eventually(lambda: _stopping(project), timeout=10, what="the stop to begin")
    finally:
        release.write_text("go")
        stopper.join(timeout=40)
    [stopped] = stops
    assert stopped.code == 0, stopped.stderr
    return stopped


def _completing(project: Project, run: RunView, call: str, token: str,
                output: dict[str, Any]) -> tuple[list[object], threading.Thread]:
    """``complete_agent_call`` (outcome "done") on a connection of its own, its on_complete
    held until the file ``output["until"]`` names exists: what it got (the view, or the
    error's code and message) and its thread (join it), once on_complete runs."""
    results: list[object] = []

    def complete() -> None:
        with Client.connect(project.root) as other:
            try:
                results.append(other.complete_agent_call(run.run_id, call, token, "done",
                                                         output))
            except IntloomError as exc:
                results.extend([exc.code, exc.message])

    completer = threading.Thread(target=complete)
    completer.start()
    try:
        eventually(Path(f"{output['until']}.started").exists, timeout=10,
                   what="on_complete to run")
    except BaseException:
        Path(output["until"]).write_text("go")  # let it end, so that the thread does
        completer.join(timeout=30)
        raise
    return results, completer


def test_a_tool_call_during_a_completion_is_told_it_may_come_again_if_that_is_refused(
        looping: tuple[Client, Project]) -> None:
    """A Tool call while the task's on_complete ran was told the task "takes no more Tool
    calls", and the same call then ran once on_complete refused the completion."""
    client, project = looping
    run, call, token = _claimed(client, "looping")
    release = project.root / "release-complete"
    results, completer = _completing(project, run, call, token,
                                     {"until": str(release), "refuse": True})
    try:
        busy = _refused(lambda: client.call_tool(run.run_id, call, token, "tc-9", "search",
                                                 {"q": 9}), "BUSY")
    finally:
        release.write_text("go")
        completer.join(timeout=30)
    assert busy == (f"Agent task {call} is being completed (its on_complete runs); Tool call "
                    "tc-9 was not run. Once that completion is recorded the task has ended; if "
                    "on_complete refuses it, the task stays claimed and this call can be sent "
                    "again."), busy
    assert results[0] == "INVALID_REQUEST" and "on_complete refused" in str(results[1]), results
    assert client.call_tool(run.run_id, call, token, "tc-9", "search", {"q": 9}) == (
        {"found": {"q": 9}}, False)
    unrouted = _refused(lambda: client.complete_agent_call(run.run_id, call, token, "nope",
                                                           {}), "INVALID_REQUEST")
    assert unrouted.endswith("Nothing was recorded: the task stays claimed; complete it with "
                             "one of those outcomes."), unrouted


def _looping_host(project: Project, grace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTLOOM_TEST_SUSPEND_GRACE", grace)
    (project.root / "workflows" / "looping.py").write_text(LOOPING)
    (project.root / "intloom.toml").write_text('workflows = ["workflows/looping.py"]\n')
    start(project)


def test_a_stop_gives_a_running_tool_its_grace(project: Project,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A stop ended the process under a running Tool after ~1 s (the Tool half done, no word
    of it); Tools get the Steps' grace, and one that returns in time answers its Agent. The
    Tool goes on for 1.5 s after the stop has begun."""
    _looping_host(project, "10", monkeypatch)
    release = project.root / "release-tool"
    with Client.connect(project.root) as client:
        running = _running_tool(client, project, "slow", {"until": str(release), "then": 1.5})
    try:
        stopped = _stop_then_release(project, release)
    finally:
        running.caller.join(timeout=30)
    assert running.results == [({"slow": str(release)}, False)]
    # The Run waits on its claimed task, which the next start cannot restore: the stop says
    # so (it said "Unfinished Runs were suspended ... Run intloom start to resume them").
    lines = stopped.stdout.splitlines()
    assert lines[0] == (
        "The original service instance stopped. 1 Run waits on what the next start cannot "
        "restore (a question or confirmation whose Step has no recover, or that recover "
        "asked after running an effect, or a task for a client Agent); it reports it "
        "RUN_INTERRUPTED:"), lines
    assert "(claimed); claims, owner tokens and Tool receipts are not restored" in lines[1]
    assert len(lines) == 2, lines


def test_an_on_complete_that_ends_during_a_stop_is_named_not_dropped_silently(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """on_complete finishing in the stop's grace ran, but a stopping host records nothing:
    the completion was refused and the stop said nothing. It names it now."""
    _looping_host(project, "10", monkeypatch)
    release = project.root / "release-complete"
    with Client.connect(project.root) as client:
        run, call, token = _claimed(client, "looping")
    results, completer = _completing(project, run, call, token, {"until": str(release)})
    try:
        stopped = _stop_then_release(project, release)
    finally:
        completer.join(timeout=30)
    # The Agent is told its completion was not recorded (it got "The host is stopping; no
    # new work.", as if nothing had begun) and what becomes of the Run.
    assert results == ["CLI_SERVICE_CLOSING", (
        f"The host stopped while Agent task {call}'s on_complete ran (outcome 'done'): the "
        "completion was not recorded, since nothing is written while the host stops. The next "
        f"start reports Run {run.run_id} RUN_INTERRUPTED (claims are not restored); once it "
        "has started, start a new Run for this work.")], results
    lines = stopped.stdout.splitlines()
    assert "1 Run still had a Step, Tool or on_complete running" in lines[0], lines
    assert lines[1] == (f"  {run.run_id}: client Agent task {call}'s on_complete ran (outcome "
                        "'done') while the host stopped; the completion was not recorded")
    # The next start said only that the task had been claimed: that the Agent had finished
    # and its result was dropped by the stop was lost at the restart.
    start(project)
    with Client.connect(project.root) as client:
        view = client.get_run(run.run_id)
    assert view.last_error is not None and view.last_error.code == "RUN_INTERRUPTED", view
    assert (f"says the Agent completed task {call} (outcome 'done') at ") in (
        view.last_error.message), view.last_error.message
    assert "while the host stopped: the completion was not recorded" in (
        view.last_error.message), view.last_error.message


def test_an_on_complete_that_refuses_during_a_stop_does_not_say_the_task_stays_claimed(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """An on_complete refusing the result in the stop's grace said "the task stays claimed:
    complete it again", but the stop drops the claim (the next start reports the Run
    RUN_INTERRUPTED): the Agent is told that, and what on_complete said."""
    _looping_host(project, "10", monkeypatch)
    release = project.root / "release-refusal"
    with Client.connect(project.root) as client:
        run, call, token = _claimed(client, "looping")
    results, completer = _completing(project, run, call, token,
                                     {"until": str(release), "refuse": True})
    try:
        _stop_then_release(project, release)
    finally:
        completer.join(timeout=30)
    assert results[0] == "CLI_SERVICE_CLOSING", results
    message = str(results[1])
    assert "stays claimed" not in message, message
    assert (f"The host stopped while Agent task {call}'s on_complete ran (outcome 'done'): it "
            "refused the result (INVALID_REQUEST: ") in message, message
    assert "not this one" in message, message
    assert (f"The next start reports Run {run.run_id} RUN_INTERRUPTED (claims are not "
            "restored)") in message, message


@pytest.mark.parametrize("refuse", [False, True])
def test_an_on_complete_whose_run_is_cancelled_then_stopped_is_not_called_interrupted(
        project: Project, monkeypatch: pytest.MonkeyPatch, refuse: bool) -> None:
    """A Run cancelled while its on_complete ran, then the host stopped before it returned
    (or refused the result): the Agent was told "the next start reports Run ...
    RUN_INTERRUPTED", and intloom stop listed the Run as one the next start reports so, but
    the Run had ended (RUN_STOPPED) and the next start does not load it. The Agent is told
    the Run ended, as without a stop, and the stop does not list it."""
    _looping_host(project, "10", monkeypatch)
    release = project.root / "release-cancelled"
    with Client.connect(project.root) as client:
        run, call, token = _claimed(client, "looping")
    results, completer = _completing(project, run, call, token,
                                     {"until": str(release), "refuse": refuse})
    try:
        with Client.connect(project.root) as other:
            cancelled, _ = other.cancel(run.run_id)
        assert cancelled.last_error is not None, cancelled
        assert cancelled.last_error.code == "RUN_STOPPED", cancelled
        stopped = _stop_then_release(project, release)
    finally:
        completer.join(timeout=30)
    assert results[0] == "CONFLICT", results
    message = str(results[1])
    assert "RUN_INTERRUPTED" not in message, message
    assert "the Run has ended failed (RUN_STOPPED) and takes no more work" in message, message
    assert run.run_id not in stopped.stdout, stopped.stdout


def _log_records(project: Project, event: str) -> list[dict[str, Any]]:
    records = []
    for log in sorted((project.state / "logs").glob("LOG-*.jsonl")):
        for line in log.read_text().splitlines():
            record = json.loads(line)
            if record["event"] == event:
                records.append(record)
    return records


def test_tool_calls_are_logged_and_doctor_names_the_one_a_kill_cut(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tool calls are not journaled (their receipts are not restored): after a kill -9
    during one, the restart table named only the Agent task ("CALL-... (claimed)"), and
    nothing said which Tool had been running. The host log has each call's start and end,
    and doctor names the call the crash left unfinished."""
    _looping_host(project, "10", monkeypatch)
    with Client.connect(project.root) as client:
        run, call, token = _claimed(client, "looping")
        assert client.call_tool(run.run_id, call, token, "tc-0", "search", {"q": 1}) == (
            {"found": {"q": 1}}, False)
        with pytest.raises(IntloomError):
            client.call_tool(run.run_id, call, token, "tc-f", "flaky",
                             {"log": str(project.root / "flaky.log")})
        running = _running_tool(client, project, "slow",
                                {"until": str(project.root / "release-tool")})
    ended = {r["toolCallId"]: r for r in _log_records(project, "run_tool_ended")}
    assert ended["tc-0"]["outcome"] == "returned" and ended["tc-0"]["runId"] == run.run_id
    assert ended["tc-f"]["outcome"] == "raised" and ended["tc-f"]["tool"] == "flaky"
    started = [(r["runId"], r["toolCallId"], r["tool"])
               for r in _log_records(project, "run_tool_started")]
    assert started == [(run.run_id, "tc-0", "search"), (run.run_id, "tc-f", "flaky"),
                       (running.run.run_id, "tc-1", "slow")], started
    try:
        project.kill_host()
    finally:
        (project.root / "release-tool").write_text("go")
        running.caller.join(timeout=30)
    assert "tc-1" not in {r["toolCallId"] for r in _log_records(project, "run_tool_ended")}
    doctor = project.cli("--json", "doctor")
    previews = {p["runId"]: p for p in json.loads(doctor.stdout)["runs"]}
    reason = previews[running.run.run_id]["verdict"]["reason"]
    assert f"waits on client Agent task {running.call} (claimed)" in reason, reason
    assert "says Tool call tc-1 (Tool 'slow') started " in reason, reason
    assert "and never returned: it was running when the host went" in reason, reason
    # The first Run's task was claimed too, and no Tool call of it was running, but two had
    # run: their effects stand, and only the host's log says so (a new Run's Agent would
    # make them again). They were named nowhere.
    made = (f"task {call} had made Tool calls tc-0 (Tool 'search', returned), tc-f (Tool "
            "'flaky', raised) before the host went: each ran, and what "
            "they did stands, so check it before starting new work")
    first = previews[run.run_id]
    assert first["agentTask"] == call, first
    assert made in first["verdict"]["reason"], first
    assert "never returned" not in first["verdict"]["reason"], first
    # The Run's own RUN_INTERRUPTED names the call too, not doctor alone, and still does
    # after the next restart, whose host's log no longer holds the call's start.
    killed_log = sorted((project.state / "logs").glob("LOG-*.jsonl"))[-1].name
    ok(project.cli("recover", "--json"))
    for restart in range(2):
        start(project)
        with Client.connect(project.root) as client:
            cut_run = client.get_run(running.run.run_id)
            other = client.get_run(run.run_id)
        assert cut_run.last_error is not None and other.last_error is not None
        message = cut_run.last_error.message
        assert cut_run.last_error.code == "RUN_INTERRUPTED", (restart, message)
        assert f"waits on client Agent task {running.call} (claimed)" in message, message
        assert (f"the log of the host it ran on (.intloom/logs/{killed_log}) says Tool call "
                "tc-1 (Tool 'slow') started ") in message, (restart, message)
        assert made in other.last_error.message, (restart, other.last_error.message)
        assert "never returned" not in other.last_error.message, other.last_error.message
        # doctor beside that host names the call as the host did: it said only that the
        # Run waits on its task.
        previews = {p["runId"]: p for p in json.loads(
            project.cli("--json", "doctor").stdout)["runs"]}
        reason = previews[running.run.run_id]["verdict"]["reason"]
        assert "says Tool call tc-1 (Tool 'slow') started " in reason, (restart, reason)
        assert made in previews[run.run_id]["verdict"]["reason"], previews
        ok(project.cli("stop", "--json"))
    doctor = project.cli("--json", "doctor")
    previews = {p["runId"]: p for p in json.loads(doctor.stdout)["runs"]}
    assert "says Tool call tc-1 (Tool 'slow') started " in (
        previews[running.run.run_id]["verdict"]["reason"]), previews[running.run.run_id]


def _killed_in_slow_tool(project: Project, monkeypatch: pytest.MonkeyPatch) -> _Running:
    """A looping Run's Tool call ``tc-1`` (Tool ``slow``) running when the host is killed."""
    _looping_host(project, "10", monkeypatch)
    with Client.connect(project.root) as client:
        running = _running_tool(client, project, "slow",
                                {"until": str(project.root / "release-tool")})
    try:
        project.kill_host()
    finally:
        (project.root / "release-tool").write_text("go")
        running.caller.join(timeout=30)
    return running


def _killed_in_a_tool_call(project: Project, monkeypatch: pytest.MonkeyPatch
                           ) -> tuple[_Running, str, Path, bytes]:
    """A looping Run's Tool call cut by a kill -9, recovered, its Workflow's source then
    edited so that the next start holds the Run: (the call, the killed host's log, the
    source, its bytes as the Run began)."""
    running = _killed_in_slow_tool(project, monkeypatch)
    killed_log = sorted((project.state / "logs").glob("LOG-*.jsonl"))[-1].name
    ok(project.cli("recover", "--json"))
    source = project.root / "workflows" / "looping.py"
    original = source.read_bytes()
    source.write_bytes(original + b"\n# edited: the Run is held\n")
    return running, killed_log, source, original


def test_a_tool_call_a_kill_cut_is_still_named_after_starts_that_held_its_run(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Tool call is known from the last host's log only, and a host passed it on only
    for a Run it restored: held for one start (its Workflow edited, or failing to load),
    the Run came back with no word of the call that never returned. A held Run's
    run_needs_attention carries it, for the host after."""
    running, killed_log, source, original = _killed_in_a_tool_call(project, monkeypatch)
    said = (f"the log of the host it ran on (.intloom/logs/{killed_log}) says Tool call "
            "tc-1 (Tool 'slow') started ")
    for _ in range(2):
        start(project)
        # doctor names it too, for the held Run a user is about to cancel.
        previews = {p["runId"]: p for p in json.loads(
            project.cli("--json", "doctor").stdout)["runs"]}
        preview = previews[running.run.run_id]
        assert preview["verdict"]["row"] == "needs_attention", preview
        assert f"Also, {said}" in preview["problem"], preview
        ok(project.cli("stop", "--json"))
        held = [r for r in _log_records(project, "run_needs_attention")
                if r["runId"] == running.run.run_id]
        assert said in held[-1].get("toolCall", ""), held[-1]
    source.write_bytes(original)
    start(project)
    with Client.connect(project.root) as client:
        cut_run = client.get_run(running.run.run_id)
    assert cut_run.last_error is not None and cut_run.last_error.code == "RUN_INTERRUPTED"
    assert said in cut_run.last_error.message, cut_run.last_error.message
    ok(project.cli("stop", "--json"))


def test_a_held_run_cancelled_records_the_tool_call_a_kill_cut(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    running, killed_log, _, _ = _killed_in_a_tool_call(project, monkeypatch)
    start(project)
    with Client.connect(project.root) as client:
        cancelled, _ = client.cancel(running.run.run_id)
    assert cancelled.last_error is not None and cancelled.last_error.code == "RUN_STOPPED"
    message = cancelled.last_error.message
    assert message.startswith("The Run was stopped while it was held, not restored: "), message
    assert (f"Also, the log of the host it ran on (.intloom/logs/{killed_log}) says Tool "
            "call tc-1 (Tool 'slow') started ") in message, message
    ok(project.cli("stop", "--json"))


def _doctor_and_restart_name(project: Project, run_id: str, said: str, *,
                             recover: bool) -> None:
    """doctor's verdict for the Run, and the Run's error after the next start (after
    ``recover`` when a killed host's files are left), both say ``said``; the host is
    stopped again."""
    doctor = project.cli("--json", "doctor", timeout=30)  # a FIFO opened would block it
    reason = {p["runId"]: p for p in json.loads(doctor.stdout)["runs"]}[run_id]["verdict"][
        "reason"]
    assert said in reason, reason
    if recover:
        ok(project.cli("recover", "--json"))
    start(project)
    with Client.connect(project.root) as client:
        error = client.get_run(run_id).last_error
    assert error is not None and error.code == "RUN_INTERRUPTED", error
    assert said in error.message, error.message
    ok(project.cli("stop", "--json"))


def test_the_last_hosts_log_is_found_past_entries_no_host_wrote(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """doctor and the next host took the newest entry named ``LOG-*.jsonl`` as the last
    host's log: a copy (``LOG-copy.jsonl`` sorts after every stamp), a link or a FIFO there
    made them name no Tool call, or name one from the wrong file. They read the newest
    regular file under a name a host gives its log; the others are never opened (a FIFO
    would block) or followed, and are kept as they are."""
    running = _killed_in_slow_tool(project, monkeypatch)
    logs = project.state / "logs"
    (killed_log,) = (p.name for p in logs.glob("LOG-*.jsonl"))
    copy = logs / "LOG-copy.jsonl"
    copy.write_bytes(b'{"event":"log_opened","note":"a copy, no host wrote it"}\n')
    link = logs / "LOG-link.jsonl"
    link.symlink_to(killed_log)
    # Named as hosts name their logs, a moment after the killed host's and before the next
    # one's: the next host too would take them as its predecessor's log.
    moment = datetime.strptime(killed_log, "LOG-%Y%m%dT%H%M%S%fZ.jsonl")
    stamped = [logs / f"LOG-{m:%Y%m%dT%H%M%S}{m.microsecond // 1000:03d}Z.jsonl"
               for m in (moment + timedelta(milliseconds=1), moment + timedelta(milliseconds=2))]
    stamped[0].symlink_to(copy.name)
    os.mkfifo(stamped[1], 0o600)
    said = f"the log of the host it ran on (.intloom/logs/{killed_log}) says Tool call tc-1"

    _doctor_and_restart_name(project, running.run.run_id, said, recover=True)
    assert copy.read_bytes().endswith(b"no host wrote it\"}\n")
    assert os.readlink(link) == killed_log and os.readlink(stamped[0]) == copy.name
    assert stat.S_ISFIFO(os.lstat(stamped[1]).st_mode)


def test_a_tool_still_running_at_the_end_of_the_grace_is_named(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    _looping_host(project, "0.5", monkeypatch)
    with Client.connect(project.root) as client:
        running = _running_tool(client, project, "slow",
                                {"until": str(project.root / "release-tool")})
    run, caller = running.run, running.caller
    try:
        stopped = project.cli("stop", "--timeout", "30")
    finally:
        (project.root / "release-tool").write_text("go")
        caller.join(timeout=30)
    assert stopped.code == 0, stopped.stderr
    lines = stopped.stdout.splitlines()
    assert "1 Run still had a Step, Tool or on_complete running" in lines[0], lines
    assert lines[1].startswith(f"  {run.run_id}: client Agent task "), lines
    assert "was running Tool call tc-1 (Tool 'slow') and its outcome is unknown" in lines[1]
    # doctor, after the stop, still names it (from the log): the next start names the task.
    doctor = json.loads(project.cli("--json", "doctor").stdout)
    reason = {p["runId"]: p for p in doctor["runs"]}[run.run_id]["verdict"]["reason"]
    assert "says Tool call tc-1 (Tool 'slow', started " in reason, reason
    assert "was still running when the stop's grace ran out" in reason, reason
    # The Agent was cut off with PROJECT_REQUEST_FAILED ("No reply came for the Tool call
    # ... the host may have stopped or crashed"), not the code a stop gives elsewhere.
    assert running.results == ["CLI_SERVICE_CLOSING", (
        f"The host stopped while Tool call tc-1 (Tool 'slow') of Agent task {running.call} "
        "ran: the Tool was still running when the stop's grace ran out, so its outcome is "
        "unknown and no output is returned. The next start reports Run "
        f"{run.run_id} RUN_INTERRUPTED (claims, owner tokens and Tool receipts are not "
        "restored); once it has started, start a new Run for this work.")], running.results
    # And the next start does as that reply says, naming the Tool call as well.
    start(project)
    with Client.connect(project.root) as client:
        error = client.get_run(run.run_id).last_error
    assert error is not None and error.code == "RUN_INTERRUPTED", error
    assert "says Tool call tc-1 (Tool 'slow', started " in error.message, error.message
    assert "was still running when the stop's grace ran out, so check what that Tool did" \
        in error.message, error.message


def test_an_on_complete_still_running_at_the_end_of_the_grace_is_told_closing(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """An on_complete still running when the stop's grace ran out: its Agent's completion
    was cut off with PROJECT_REQUEST_FAILED ("No reply came ... the host may have stopped
    or crashed") as the host exited; it is told CLI_SERVICE_CLOSING, as a Tool call is."""
    _looping_host(project, "0.5", monkeypatch)
    release = project.root / "release-complete"
    with Client.connect(project.root) as client:
        run, call, token = _claimed(client, "looping")
    results, completer = _completing(project, run, call, token, {"until": str(release)})
    try:
        stopped = project.cli("stop", "--timeout", "30")
    finally:
        release.write_text("go")
        completer.join(timeout=30)
    assert stopped.code == 0, stopped.stderr
    lines = stopped.stdout.splitlines()
    assert "1 Run still had a Step, Tool or on_complete running" in lines[0], lines
    assert lines[1] == (f"  {run.run_id}: client Agent task {call}'s on_complete was running "
                        "(outcome 'done'); the completion was not recorded"), lines
    assert results == ["CLI_SERVICE_CLOSING", (
        f"The host stopped while Agent task {call}'s on_complete ran (outcome 'done'): it "
        "was still running when the stop's grace ran out, and the completion was not "
        "recorded, since nothing is written while the host stops. The next start reports "
        f"Run {run.run_id} RUN_INTERRUPTED (claims are not restored); once it has started, "
        "start a new Run for this work.")], results


def test_a_tool_cut_by_a_failed_log_is_told_the_host_suspended_its_runs_not_stopped(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host whose log cannot be written suspends its Runs and stays up, refusing new work
    (LOG_WRITE_FAILED). A Tool call still running at the end of that grace was told "The
    host stopped while ...", though the host goes on answering: it is told the Runs were
    suspended, and why."""
    # The first refused connection is the moment the log starts failing.
    monkeypatch.setenv("INTLOOM_TEST_LOG_FAIL_AT", "connection_refused")
    _looping_host(project, "0.5", monkeypatch)
    release = project.root / "release-tool"
    with Client.connect(project.root) as client:
        running = _running_tool(client, project, "slow", {"until": str(release)})
    try:
        service = json.loads((project.state / "service.json").read_text())
        with socket.create_connection(("127.0.0.1", service["port"]), timeout=10) as sock:
            sock.sendall(hello_frame("x" * 43))
            reply(sock)  # UNAUTHORIZED, and the log line about it cannot be written
        eventually(lambda: running.results, timeout=20, what="the Tool call to be cut")
    finally:
        release.write_text("go")
        running.caller.join(timeout=30)
    code, message = running.results
    assert code == "CLI_SERVICE_CLOSING" and isinstance(message, str), running.results
    assert message.startswith(
        f"The host suspended its Runs while Tool call tc-1 (Tool 'slow') of Agent task "
        f"{running.call} ran: the Tool was still running when the grace ran out"), message
    assert "could not be written" in message and "refuses new work" in message, message
    assert "The host stopped" not in message, message
    with Client.connect(project.root) as client:  # the host is still up, refusing work
        with pytest.raises(IntloomError) as refused:
            client.create_run("looping", "more")
        assert refused.value.code == "LOG_WRITE_FAILED", refused.value


def test_a_cancel_during_a_tool_call_names_the_tool_call_it_cut(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancel during a Tool call said only "The Run was stopped.", though the Tool goes on
    and may act after it; a cancel cutting an effect names it. It names the Tool call now."""
    _looping_host(project, "10", monkeypatch)
    release = project.root / "release-tool"
    with Client.connect(project.root) as client:
        running = _running_tool(client, project, "slow", {"until": str(release)})
        try:
            cancelled, _ = client.cancel(running.run.run_id)
        finally:
            release.write_text("go")
            running.caller.join(timeout=30)
        assert cancelled.last_error is not None, cancelled
        assert cancelled.last_error.code == "RUN_STOPPED", cancelled.last_error
        assert cancelled.last_error.message == (
            f"The Run was stopped while client Agent task {running.call} was running Tool "
            "call tc-1 (Tool 'slow') and its outcome is unknown."), cancelled.last_error
    told = project.cli("cancel", running.run.run_id)  # what a person reads
    assert told.code == 0 and f"RUN_STOPPED: {cancelled.last_error.message}" in told.stdout, (
        told)


@pytest.mark.parametrize("work", ["tool", "on_complete"])
def test_a_run_cancelled_while_its_agent_work_outlasts_the_grace_is_not_called_cut(
        project: Project, monkeypatch: pytest.MonkeyPatch, work: str) -> None:
    """A Run cancelled while its task's Tool call or on_complete ran, then a stop whose
    grace that work outlasted: intloom stop listed the Run as one the next start reports
    RUN_INTERRUPTED (and counted it among the suspended ones), but it had ended
    (RUN_STOPPED) and the next start does not load it."""
    _looping_host(project, "0.5", monkeypatch)
    release = project.root / "release-work"
    with Client.connect(project.root) as client:
        if work == "tool":
            running = _running_tool(client, project, "slow", {"until": str(release)})
            run_id, caller = running.run.run_id, running.caller
        else:
            run, call, token = _claimed(client, "looping")
            run_id = run.run_id

            def complete() -> None:
                with Client.connect(project.root) as other, \
                        contextlib.suppress(IntloomError):
                    other.complete_agent_call(run_id, call, token, "done",
                                              {"until": str(release), "refuse": False})

            caller = threading.Thread(target=complete)
            caller.start()
            eventually(Path(f"{release}.started").exists, timeout=10,
                       what="on_complete to run")
        cancelled, _ = client.cancel(run_id)
        assert cancelled.last_error is not None, cancelled
        assert cancelled.last_error.code == "RUN_STOPPED", cancelled
        waiting = client.create_run("looping", "another")
    try:
        stopped = project.cli("stop", "--timeout", "30")
    finally:
        release.write_text("go")
        caller.join(timeout=30)
    assert stopped.code == 0, stopped.stderr
    assert run_id not in stopped.stdout, stopped.stdout
    assert "still had a Step, Tool or on_complete running" not in stopped.stdout, stopped.stdout
    assert waiting.run_id in stopped.stdout, stopped.stdout  # its task is not restored


def test_a_task_past_its_tool_call_limit_is_told_so_not_to_retry(
        looping: tuple[Client, Project]) -> None:
    """The 257th Tool call of a task was BUSY, retryable: an Agent that retries what is
    retryable looped for ever on a limit that never lifts. It is CONFLICT, saying what to do."""
    client, _ = looping
    run, call, token = _claimed(client, "looping")
    for n in range(256):
        client.call_tool(run.run_id, call, token, f"tc-{n}", "search", {"n": n})
    with pytest.raises(IntloomError) as refused:
        client.call_tool(run.run_id, call, token, "tc-new", "search", {"n": 0})
    assert refused.value.code == "CONFLICT" and refused.value.retryable is False
    message = refused.value.message
    assert f"Agent task {call} has made 256 Tool calls" in message, message
    assert "tc-new was not run" in message and "complete or fail the task" in message
    # An earlier call still replays, and the task can still be completed.
    assert client.call_tool(run.run_id, call, token, "tc-7", "search", {"n": 7}) == (
        {"found": {"n": 7}}, True)
    assert client.complete_agent_call(run.run_id, call, token, "done", {}).status == "completed"


def test_a_task_past_its_receipt_bytes_is_told_so_not_to_retry(
        looping: tuple[Client, Project]) -> None:
    """Receipts were bounded in number only: 256 calls of inputs and outputs near the frame's
    4 MiB each kept ~2 GiB of one task's receipts in the host until the task ended. Past
    32 MiB a new call is CONFLICT before it runs; the call that crossed the line kept its
    receipt and still replays."""
    client, _ = looping
    run, call, token = _claimed(client, "looping")
    blob = "x" * (1 << 20)  # echoed: each call keeps ~2 MiB (its input and its output)
    made = 0
    with pytest.raises(IntloomError) as refused:
        while made < 64:  # 32 MiB is reached after 16; the bound keeps a broken limit finite
            client.call_tool(run.run_id, call, token, f"tc-{made}", "search", {"b": blob})
            made += 1
    assert made == 16, made
    assert refused.value.code == "CONFLICT" and refused.value.retryable is False
    message = refused.value.message
    assert f"Agent task {call} keeps 32.0 MiB of Tool call receipts" in message, message
    assert f"tc-{made} was not run" in message and "complete or fail the task" in message
    last = client.call_tool(run.run_id, call, token, f"tc-{made - 1}", "search", {"b": blob})
    assert last == ({"found": {"b": blob}}, True)
    assert client.complete_agent_call(run.run_id, call, token, "done", {}).status == "completed"



def test_a_tasks_receipt_bytes_count_its_tool_call_ids(
        looping: tuple[Client, Project]) -> None:
    """The receipts' bound counted inputs and outputs only: an Agent sending tool call ids
    near the frame's 4 MiB (a document as the id) with small inputs kept up to 256 of them,
    ~1 GiB of one task's ids in the host, while the task counted a few bytes. The ids count;
    and since 2026-12-04 an id is at most 1,024 characters, so a document as the id is
    refused before the Tool runs, and nothing of it is kept."""
    client, _ = looping
    run, call, token = _claimed(client, "looping")
    with pytest.raises(IntloomError) as refused:
        client.call_tool(run.run_id, call, token, "00" + "i" * (2 << 20), "search", {"n": 0})
    assert refused.value.code == "INVALID_REQUEST", refused.value
    assert "tool_call_id is 2,097,154 characters long" in refused.value.message
    assert client.call_tool(run.run_id, call, token, "00", "search", {"n": 0}) == (
        {"found": {"n": 0}}, False)
    assert client.complete_agent_call(run.run_id, call, token, "done", {}).status == "completed"


MISUSED = textwrap.dedent('''
    from typing import Any

    import msgspec

    import intloom


    class Notes(msgspec.Struct):
        items: list[int] = []


    wf = intloom.Workflow("misused", version="1")
    main = wf.stage("main", state=Notes)


    @main.agent_step("look", routes={"found": intloom.COMPLETE})
    def look(ctx: intloom.StepContext[Notes]) -> Any:
        return {"topic": ctx.intent}


    @look.on_complete
    def absorb(ctx: intloom.StepContext[Notes], result: intloom.AgentResult) -> None:
        if result.output == "dict":
            ctx.state = {"items": [1]}  # not a Notes
        elif result.output == "field":
            ctx.state.items.append("x")  # not an int: refused when the State is saved
        else:
            ctx.state = Notes(items=[1])
''')


def test_an_on_complete_that_misuses_its_state_says_the_task_stays_claimed(
        project: Project) -> None:
    """on_complete setting a State of the wrong type was refused with the bare State error
    ("Stage 'main', Step 'look' assigned ctx.state a dict ..."): the Agent was not told the
    completion recorded nothing, nor that it may complete the task again."""
    (project.root / "workflows" / "misused.py").write_text(MISUSED)
    (project.root / "intloom.toml").write_text('workflows = ["workflows/misused.py"]\n')
    start(project)
    with Client.connect(project.root) as client:
        run, call, token = _claimed(client, "misused")
        for output in ("dict", "field"):
            message = _refused(lambda output=output: client.complete_agent_call(
                run.run_id, call, token, "found", output), "STAGE_STATE_INVALID")
            assert message.startswith("Stage 'main', Step 'look' on_complete"), message
            assert message.endswith(
                "Nothing was recorded and the task stays claimed: complete it again with a "
                "corrected output, or fail it."), message
            assert client.get_run(run.run_id).pending_agent_call is not None
        assert client.complete_agent_call(run.run_id, call, token, "found", "ok").status == (
            "completed")


def test_an_agent_request_refused_during_a_stop_is_not_told_to_run_it_again(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """An Agent's completion on a connection opened before the stop was told "Run it again
    once intloom status says the service is offline": but the next start reports its Run
    RUN_INTERRUPTED (claims are not restored), so run again it can never succeed."""
    _looping_host(project, "10", monkeypatch)
    with Client.connect(project.root) as agent:
        run, call, token = _claimed(agent, "looping")
        with _stopping_while_a_tool_runs(project, agent):
            message = _refused(lambda: agent.complete_agent_call(
                run.run_id, call, token, "done", {}), "CLI_SERVICE_CLOSING")
    assert "Run it again" not in message, message
    assert f"The next start reports Run {run.run_id} RUN_INTERRUPTED" in message, message
    assert f"Agent task {call} of Run {run.run_id} was refused; nothing was done" in message
    start(project)
    with Client.connect(project.root) as again:
        view = again.get_run(run.run_id)
        assert view.last_error is not None and view.last_error.code == "RUN_INTERRUPTED", view


def test_an_agent_connecting_during_a_stop_is_not_told_its_request_works_after_it(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection opened during a stop was refused at its hello with "Run the command again
    once intloom status says the service is offline", to every client: the hello names no
    request and no kind of client (the CLI and an Agent both say "intloom-python"), and for
    a client Agent's task that is false, since the next start reports its Run
    RUN_INTERRUPTED. The refusal says what holds for every client."""
    _looping_host(project, "10", monkeypatch)
    with Client.connect(project.root) as agent, \
            _stopping_while_a_tool_runs(project, agent) as (running, stops):
        message = _refused(lambda: Client.connect(project.root), "CLI_SERVICE_CLOSING")
    assert [stop.code for stop in stops] == [0], stops
    assert "Run the command again" not in message, message
    assert message.startswith("The service is shutting down: it is suspending its Runs, then "
                              "exits. No request was sent, so nothing was done."), message
    assert ("a client Agent's task comes back RUN_INTERRUPTED (claims, owner tokens and Tool "
            "receipts are not restored)") in message, message
    start(project)
    with Client.connect(project.root) as again:
        view = again.get_run(running.run.run_id)
    assert view.last_error is not None and view.last_error.code == "RUN_INTERRUPTED", view


@contextlib.contextmanager
def _stopping_while_a_tool_runs(project: Project, agent: Client
                                ) -> Iterator[tuple[_Running, list[CliResult]]]:
    """A CLI stop under way (its result in the list yielded, once it is done) while one of
    ``agent``'s Tool calls holds its Run in a Step; the Tool is released on the way out."""
    release = project.root / "release-tool"
    running = _running_tool(agent, project, "slow", {"until": str(release)})
    stops: list[CliResult] = []
    stopper = threading.Thread(
        target=lambda: stops.append(project.cli("stop", "--timeout", "30")))
    stopper.start()
    try:
        eventually(lambda: _stopping(project), timeout=10, what="the stop to begin")
        yield running, stops
    finally:
        release.write_text("go")
        running.caller.join(timeout=30)
        stopper.join(timeout=40)


def test_a_claim_is_one_claimed_event_not_a_second_waiting_before_it(
        client: Client, project: Project) -> None:
    """The claim's Waiting record (the task re-published as claimed) was published as a
    ``waiting`` event, then the claim as ``claimed``: attach showed the Run waiting twice in
    a row, and the host log said ``run_waiting`` twice for one task."""
    run, call_id, _token = _claimed(client)
    attached = project.cli("attach", run.run_id)
    assert attached.code == 0, attached.stderr
    events = [line.split()[1] for line in attached.stdout.splitlines()
              if line[:4].isdigit()]  # the event lines, each opening with its time
    assert events[-2:] == ["waiting", "claimed"], attached.stdout
    assert events.count("waiting") == 1, attached.stdout

    def logged() -> list[dict[str, Any]] | None:
        result = project.cli("logs", run.run_id, "--json")
        lines = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
        return lines if any(e.get("event") == "run_claimed" for e in lines) else None

    lines = eventually(logged, what="run_claimed in the host log")
    names = [e["event"] for e in lines]
    assert names.count("run_waiting") == 1 and names.count("run_claimed") == 1, names
    [claimed] = [e for e in lines if e["event"] == "run_claimed"]
    assert claimed.get("callId") == call_id, claimed


def test_a_kill_during_on_complete_names_the_lost_completion(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kill -9 while a completion's on_complete ran: the restart named only the claimed
    task, as if the Agent were still at work; that it had finished, and its result was lost
    with the host, was said nowhere. The host log has the completion's start, and the
    restart and doctor name it."""
    _looping_host(project, "10", monkeypatch)
    release = project.root / "release-complete"
    with Client.connect(project.root) as client:
        run, call, token = _claimed(client, "looping")
    _results, completer = _completing(project, run, call, token, {"until": str(release)})
    try:
        project.kill_host()
    finally:
        release.write_text("go")
        completer.join(timeout=30)
    lost = f"says the Agent completed task {call} (outcome 'done') at "
    doctor = project.cli("--json", "doctor")
    previews = {p["runId"]: p for p in json.loads(doctor.stdout)["runs"]}
    reason = previews[run.run_id]["verdict"]["reason"]
    assert lost in reason and "the host went before that completion was recorded" in reason, \
        reason
    assert "check what that Tool did" not in reason, reason
    ok(project.cli("recover", "--json"))
    start(project)
    with Client.connect(project.root) as client:
        view = client.get_run(run.run_id)
    assert view.last_error is not None and view.last_error.code == "RUN_INTERRUPTED", view
    assert lost in view.last_error.message, view.last_error.message
    assert "the Agent's work is lost" in view.last_error.message, view.last_error.message
    ended = _log_records(project, "run_completion_ended")
    assert ended == [], ended  # the killed host never logged its end


def test_a_tool_call_a_kill_cut_is_named_past_a_busy_hosts_log_tail(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the last 256 KiB of the killed host's log were read for the Tool call it cut:
    ~1,500 later lines of a busy host (other Runs' Tool calls) pushed the call's start out,
    and the restart named the Agent task alone. The log is searched back 64 MiB for them."""
    _looping_host(project, "10", monkeypatch)
    with Client.connect(project.root) as client:
        running = _running_tool(client, project, "slow",
                                {"until": str(project.root / "release-tool")})
        for _ in range(6):  # what other Runs' Agents do meanwhile (256 calls a task at most)
            run, call, token = _claimed(client, "looping")
            for n in range(250):
                client.call_tool(run.run_id, call, token, f"tc-busy-{n}", "search", {"q": n})
    log = sorted((project.state / "logs").glob("LOG-*.jsonl"))[-1]
    assert log.stat().st_size > 300 * 1024, log.stat().st_size  # past the old tail
    try:
        project.kill_host()
    finally:
        (project.root / "release-tool").write_text("go")
        running.caller.join(timeout=30)
    said = "says Tool call tc-1 (Tool 'slow') started "
    previews = {p["runId"]: p for p in json.loads(project.cli("--json", "doctor").stdout)["runs"]}
    assert said in previews[running.run.run_id]["verdict"]["reason"], previews
    ok(project.cli("recover", "--json"))
    start(project)
    with Client.connect(project.root) as client:
        view = client.get_run(running.run.run_id)
    assert view.last_error is not None and said in view.last_error.message, view.last_error


def test_agent_requests_on_a_run_that_ended_before_this_host_are_conflict_not_not_found(
        project: Project, client: Client) -> None:
    """A completion whose reply a stop (or a crash) took, retried at the next host: the Run
    had completed with it, and the host holds no ended Run of an earlier one, so every
    Agent request about its task said NOT_FOUND, "not known to this host" -- telling an
    Agent whose work had been recorded that its id was wrong."""
    run, call, token = _claimed(client)
    done = client.complete_agent_call(run.run_id, call, token, "nothing", {})
    assert done.status == "completed", done
    failed_run, failed_call, failed_token = _claimed(client)
    ended = client.fail_agent_call(failed_run.run_id, failed_call, failed_token, "no source")
    assert ended.status == "failed", ended
    client.close()
    ok(project.cli("stop", "--json"))
    start(project)
    with Client.connect(project.root) as agent:
        assert agent.get_run(run.run_id).status == "completed"  # the journal's last view
        for retry in (
            lambda: agent.complete_agent_call(run.run_id, call, token, "nothing", {}),
            lambda: agent.claim_agent_call(run.run_id, call, "agent-1"),
            lambda: agent.call_tool(run.run_id, call, token, "t-1", "search", {}),
        ):
            message = _refused(retry, "CONFLICT")
            assert message.startswith(
                f"Agent task {call} is not Run {run.run_id}'s current task: its completion "
                "(outcome 'nothing') was recorded and the Run went on; the Run has completed "
                "and takes no more work; nothing was done. It ended before this host "
                "started"), message
            assert f"intloom inspect {run.run_id}" in message, message
        message = _refused(lambda: agent.fail_agent_call(
            failed_run.run_id, failed_call, failed_token, "no source"), "CONFLICT")
        assert message.startswith(
            f"Agent task {failed_call} is not Run {failed_run.run_id}'s current task; the "
            "Run has failed ("), message
        # An id no Run has is still NOT_FOUND.
        unknown = run.run_id[:-4] + "zzzz"
        _refused(lambda: agent.complete_agent_call(unknown, call, token, "nothing", {}),
                 "NOT_FOUND")


def test_a_tool_call_cut_by_close_says_the_same_call_is_safe_to_send_again(
        looping: tuple[Client, Project]) -> None:
    """A Tool call whose Client another thread closed said "It was not replayed, since the
    host may have acted on it ... check with get_run before retrying": a view that shows no
    Tool calls, when the receipt makes the same call safe to send again."""
    client, project = looping
    run, call, token = _claimed(client, "looping")
    release = project.root / "release-tool"
    agent = Client.connect(project.root)
    failed: list[IntloomError] = []

    def call_tool() -> None:
        try:
            agent.call_tool(run.run_id, call, token, "tc-1", "slow", {"until": str(release)})
        except IntloomError as exc:
            failed.append(exc)

    caller = threading.Thread(target=call_tool)
    caller.start()
    try:
        eventually(Path(str(release) + ".started").exists, timeout=10,
                   what="the Tool call to run in the host")
        agent.close()
        caller.join(timeout=20)
    finally:
        release.write_text("go")
        caller.join(timeout=20)
    [cut] = failed
    assert cut.code == "PROJECT_REQUEST_FAILED" and cut.retryable is True, cut
    assert cut.message.startswith(
        f"No reply came for Tool call tc-1 (Tool 'slow') of Agent task {call} (Run "
        f"{run.run_id}): this Client was closed"), cut.message
    assert "Sending the same call again (the same tool_call_id, Tool and input) is safe" in (
        cut.message)
    # As it says: the same call again, on a new connection, returns the first output.
    output = eventually(lambda: _receipt(client, run.run_id, call, token, release),
                        timeout=20, what="the Tool call's receipt")
    assert output == ({"slow": str(release)}, True)


def _receipt(client: Client, run_id: str, call: str, token: str,
             release: Path) -> tuple[Any, bool] | None:
    try:
        return client.call_tool(run_id, call, token, "tc-1", "slow", {"until": str(release)})
    except IntloomError as exc:
        assert exc.code == "BUSY", exc.message  # while the first call still runs
        return None


def test_a_start_that_failed_before_it_restored_does_not_hide_the_crashed_hosts_log(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next host reads the last host's log for the Tool call a crash cut. A start that
    failed before it restored anything (the saved port taken) wrote a newer log, with none
    of that: read instead, the Run came back RUN_INTERRUPTED without the Tool call named."""
    running = _killed_in_slow_tool(project, monkeypatch)
    logs = project.state / "logs"
    (killed_log,) = (p.name for p in logs.glob("LOG-*.jsonl"))
    ok(project.cli("recover", "--json"))
    port = json.loads((project.state / "connection.json").read_text())["port"]
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the kill's TIME_WAIT
        taken.bind(("127.0.0.1", port))
        taken.listen(1)
        refused = project.cli("start", "--json")
    assert refused.code == 1 and refused.json["error"]["code"] == "CLI_SERVICE_UNAVAILABLE"
    assert len(list(logs.glob("LOG-*.jsonl"))) == 2  # the failed start's log is kept
    said = f"the log of the host it ran on (.intloom/logs/{killed_log}) says Tool call tc-1"
    _doctor_and_restart_name(project, running.run.run_id, said, recover=False)
