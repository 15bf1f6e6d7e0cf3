"""An ``intloom.IntloomError`` raised by Workflow code itself (the class is public), against
a real host: it is that code's failure, not the host's error with its code.

A Step that raised one of the two codes the host uses for a Run it no longer drives
(EXECUTION_OWNERSHIP_LOST, RUN_CHECKPOINT_FAILED) was taken for the host's own: the Run was
left "running" for ever, and an Agent whose completion led to that Step got no reply. A
Tool's passed to the Agent as the host's (a retryable BUSY, whose retry ran the Tool again).
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

from intloom.client.client import Client
from intloom.errors import IntloomError
from tests.helpers import Project
from tests.integration.host_support import start

pytestmark = pytest.mark.timeout(60)

RAISING = textwrap.dedent('''
    from typing import Any

    import intloom

    wf = intloom.Workflow("raising", version="1")
    main = wf.stage("main")


    @main.step("sync_step", routes={"ok": intloom.COMPLETE})
    def sync_step(ctx: intloom.StepContext[None]) -> str:
        raise intloom.IntloomError(ctx.intent, "raised by the Step")


    aw = intloom.Workflow("araising", version="1")
    amain = aw.stage("main")


    @amain.step("async_step", routes={"ok": intloom.COMPLETE})
    async def async_step(ctx: intloom.StepContext[None]) -> str:
        raise intloom.IntloomError(ctx.intent, "raised by the Step")


    gw = intloom.Workflow("agented", version="1")
    gmain = gw.stage("main")


    def stool(input: Any) -> Any:
        raise intloom.IntloomError(input["code"], "raised by the Tool")


    async def atool(input: Any) -> Any:
        raise intloom.IntloomError(input["code"], "raised by the Tool")


    @gmain.agent_step("look", routes={"ok": "after"},
                      tools=[intloom.Tool("stool", stool), intloom.Tool("atool", atool)])
    def look(ctx: intloom.StepContext[None]) -> Any:
        return {"topic": ctx.intent}


    @gmain.step("after", routes={"ok": intloom.COMPLETE})
    def after(ctx: intloom.StepContext[None]) -> str:
        raise intloom.IntloomError(ctx.intent, "raised after the task")
''')

QUIET = ["EXECUTION_OWNERSHIP_LOST", "RUN_CHECKPOINT_FAILED"]


@pytest.fixture
def client(project: Project) -> Iterator[Client]:
    (project.root / "workflows" / "raising.py").write_text(RAISING)
    (project.root / "intloom.toml").write_text(
        'workflows = ["workflows/example.py", "workflows/raising.py"]\n')
    start(project)
    with Client.connect(project.root) as connected:
        yield connected


def _line(start: str) -> int:
    """The line of RAISING that starts with ``start``."""
    return next(n for n, line in enumerate(RAISING.splitlines(), 1) if line.startswith(start))


@pytest.mark.parametrize("code", [*QUIET, "NO_SUCH_CODE"])
@pytest.mark.parametrize(("workflow", "step"), [("raising", "sync_step"),
                                                ("araising", "async_step")])
def test_a_step_raising_a_host_code_fails_its_run(client: Client, code: str, workflow: str,
                                                  step: str) -> None:
    run = client.create_run(workflow, code)  # waits until it is stable: it never was
    assert run.status == "failed", run
    assert run.last_error is not None
    assert run.last_error.code == "STEP_EXECUTION_FAILED", run.last_error
    at = _line(f"async def {step}(" if workflow == "araising" else f"def {step}(")
    # Its line: the one after its def.
    assert run.last_error.message.startswith(
        f"Stage 'main', Step {step!r} raised IntloomError at line {at + 1} of "
        "workflows/raising.py"), run.last_error.message
    assert code in run.last_error.message, run.last_error.message


@pytest.mark.parametrize("code", QUIET)
def test_a_step_after_an_agent_task_raising_a_host_code_answers_the_completion(
        client: Client, code: str) -> None:
    run = client.create_run("agented", code)
    call = run.pending_agent_call
    assert call is not None, run
    token, _ = client.claim_agent_call(run.run_id, call.id, "agent-1")
    done = client.complete_agent_call(run.run_id, call.id, token, "ok")
    assert done.status == "failed", done
    assert done.last_error is not None and done.last_error.code == "STEP_EXECUTION_FAILED"
    assert "Step 'after' raised IntloomError" in done.last_error.message
    assert client.get_run(run.run_id).status == "failed"


@pytest.mark.parametrize("tool", ["stool", "atool"])
def test_a_tool_raising_an_intloom_error_fails_its_call(client: Client, tool: str) -> None:
    run = client.create_run("agented", "x")
    call = run.pending_agent_call
    assert call is not None, run
    token, _ = client.claim_agent_call(run.run_id, call.id, "agent-1")
    with pytest.raises(IntloomError) as raised:
        client.call_tool(run.run_id, call.id, token, "tc-1", tool, {"code": "BUSY"})
    assert raised.value.code == "TOOL_EXECUTION_FAILED", raised.value
    assert not raised.value.retryable
    message: Any = raised.value.message
    assert message.startswith(f"Tool {tool!r} raised IntloomError at line"), message
    assert "BUSY" in message and "_ToolRaised" not in message, message
    assert client.get_run(run.run_id).status == "waiting"  # the task goes on
