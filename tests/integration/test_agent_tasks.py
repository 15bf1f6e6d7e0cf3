"""A client Agent's task end to end, against a real host and a real client: the Agent's
output reaches the Workflow through ``on_complete``; a refused output leaves the task as it
was; a completion retried (its reply lost) gets the Run's view again, not CONFLICT."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator

import pytest

from intloom.client.client import Client
from intloom.errors import IntloomError
from intloom.runtime.model import RunView
from tests.helpers import Project
from tests.integration.host_support import start

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


def _claimed(client: Client) -> tuple[RunView, str, str]:
    run = client.create_run("research", "rust async runtimes")
    call = run.pending_agent_call
    assert run.status == "waiting" and call is not None, run
    token, _ = client.claim_agent_call(run.run_id, call.id, "agent-1")
    return run, call.id, token


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
    assert done.pending_action.kind == "confirmation"
    assert done.pending_action.request == {"context": {"findings": ["tokio", "smol"]}}


def test_a_refused_output_records_nothing_and_the_task_can_be_completed_again(
        client: Client) -> None:
    run, call_id, token = _claimed(client)
    before = client.get_run(run.run_id)
    message = _refused(lambda: client.complete_agent_call(run.run_id, call_id, token, "found",
                                                          {"wrong": 1}), "INVALID_REQUEST")
    assert "Stage 'main', Step 'look' on_complete refused the Agent's result" in message
    assert "ValueError: the output must be {'items': [...]}" in message
    assert "complete it again" in message
    assert client.get_run(run.run_id) == before  # still waiting, still claimed, same seq
    done = client.complete_agent_call(run.run_id, call_id, token, "found", {"items": ["x"]})
    assert done.pending_action is not None
    assert done.pending_action.request == {"context": {"findings": ["x"]}}


def test_a_retried_completion_gets_the_runs_view_and_a_different_one_conflicts(
        client: Client) -> None:
    run, call_id, token = _claimed(client)
    first = client.complete_agent_call(run.run_id, call_id, token, "found", {"items": ["a"]})
    again = client.complete_agent_call(run.run_id, call_id, token, "found", {"items": ["a"]})
    assert again == first
    message = _refused(lambda: client.complete_agent_call(run.run_id, call_id, token, "found",
                                                          {"items": ["b"]}), "CONFLICT")
    assert f"Agent task {call_id} was already completed with outcome 'found'" in message
    _refused(lambda: client.complete_agent_call(run.run_id, call_id, "not-the-token", "found",
                                                {"items": ["a"]}), "CONFLICT")
    # The person's confirmation, asked after the Agent's result, is unchanged by the retries.
    assert client.get_run(run.run_id) == first


def test_answering_an_agent_task_as_a_question_says_what_it_is(client: Client) -> None:
    run, call_id, _token = _claimed(client)
    message = _refused(lambda: client.answer(run.run_id, call_id, {"isConfirmed": True}),
                       "CONFLICT")
    assert message == (f"{call_id} is Run {run.run_id}'s Agent task, not a question or "
                       "confirmation: a client Agent claims and completes it through "
                       "intloom.client (Client.claim_agent_call, then "
                       "Client.complete_agent_call).")
