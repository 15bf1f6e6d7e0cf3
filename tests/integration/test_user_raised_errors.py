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
from tests.helpers import Project, eventually
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


    class Custom(BaseException):
        pass


    async def araise(input: Any = None) -> Any:
        raise Custom("its own")


    bstep_wf = intloom.Workflow("based-step", version="1")
    bstep = bstep_wf.stage("main")
    binit_wf = intloom.Workflow("based-init", version="1")
    binit = binit_wf.stage("main")
    beffect_wf = intloom.Workflow("based-effect", version="1")
    beffect = beffect_wf.stage("main")
    bagent_wf = intloom.Workflow("based-agent", version="1")
    bagent = bagent_wf.stage("main")


    @bstep.step("a", routes={"ok": intloom.COMPLETE})
    async def a(ctx: intloom.StepContext[None]) -> str:
        raise Custom("its own")


    @binit.init
    async def init(ctx: intloom.StepContext[None]) -> None:
        raise Custom("its own")


    @binit.step("b", routes={"ok": intloom.COMPLETE})
    def b(ctx: intloom.StepContext[None]) -> str:
        return "ok"


    @beffect.step("c", routes={"ok": intloom.COMPLETE})
    async def c(ctx: intloom.StepContext[None]) -> str:
        await ctx.aeffect("e", araise)
        return "ok"


    @bagent.agent_step("d", routes={"ok": intloom.COMPLETE},
                       tools=[intloom.Tool("araise", araise)])
    async def d(ctx: intloom.StepContext[None]) -> Any:
        return {}


    @d.on_complete
    async def d_done(ctx: intloom.StepContext[None], result: intloom.AgentResult) -> None:
        raise Custom("its own")


    named_wf = intloom.Workflow("unnamable", version="1")
    named = named_wf.stage("main")


    @named.step("upload", routes={"ok": intloom.COMPLETE})
    def upload(ctx: intloom.StepContext[None]) -> str:
        import os

        if ctx.intent == "number":
            raise intloom.IntloomError("INVALID_REQUEST", 404)  # type: ignore[arg-type]
        name = os.fsdecode(b"report-caf\\xe9.pdf")
        raise intloom.IntloomError("INVALID_REQUEST", f"cannot upload {name}")


    def unnamed(input: Any) -> Any:
        import os

        name = os.fsdecode(b"report-caf\\xe9.pdf")
        raise intloom.IntloomError("INVALID_REQUEST", f"cannot upload {name}")


    named_agent_wf = intloom.Workflow("unnamable-agent", version="1")
    named_agent = named_agent_wf.stage("main")


    @named_agent.agent_step("ask", routes={"ok": intloom.COMPLETE},
                            tools=[intloom.Tool("unnamed", unnamed)])
    def ask(ctx: intloom.StepContext[None]) -> Any:
        return {}


    @ask.on_complete
    def ask_done(ctx: intloom.StepContext[None], result: intloom.AgentResult) -> None:
        unnamed(None)
''')

QUIET = ["EXECUTION_OWNERSHIP_LOST", "RUN_CHECKPOINT_FAILED"]


def _serving(project: Project, name: str, source: str) -> Iterator[Client]:
    """A host for the project with ``source`` added as workflows/``name``.py; a client."""
    (project.root / "workflows" / f"{name}.py").write_text(source)
    (project.root / "intloom.toml").write_text(
        f'workflows = ["workflows/example.py", "workflows/{name}.py"]\n')
    start(project)
    with Client.connect(project.root) as connected:
        yield connected


@pytest.fixture
def client(project: Project) -> Iterator[Client]:
    yield from _serving(project, "raising", RAISING)


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


KEPT = "raise Custom, a BaseException the host keeps for itself"


@pytest.mark.parametrize("workflow", ["based-step", "based-init", "based-effect"])
def test_async_code_raising_a_base_exception_of_its_own_fails_its_run(
        client: Client, workflow: str) -> None:
    """A BaseException class of the Workflow's own (neither an exit nor an interrupt) raised
    in async code passed every handler: the Run stayed "running" for ever."""
    run = client.create_run(workflow, "x")
    assert run.status == "failed", run
    assert run.last_error is not None
    assert run.last_error.code == "STEP_EXECUTION_FAILED", run.last_error
    assert "Custom('its own')" in run.last_error.message, run.last_error.message
    assert KEPT in run.last_error.message, run.last_error.message


def test_a_tool_or_on_complete_raising_a_base_exception_of_its_own_is_refused(
        client: Client) -> None:
    """The same from an async Tool or on_complete dropped the Agent's connection ("the host
    may have stopped or crashed") and logged a task_error."""
    run = client.create_run("based-agent", "x")
    call = run.pending_agent_call
    assert call is not None, run
    token, _ = client.claim_agent_call(run.run_id, call.id, "agent-1")
    with pytest.raises(IntloomError) as tool:
        client.call_tool(run.run_id, call.id, token, "tc-1", "araise", {})
    assert tool.value.code == "TOOL_EXECUTION_FAILED", tool.value
    assert KEPT in tool.value.message and "to fail the Tool call" in tool.value.message
    with pytest.raises(IntloomError) as done:
        client.complete_agent_call(run.run_id, call.id, token, "ok")
    assert done.value.code == "INVALID_REQUEST", done.value
    assert KEPT in done.value.message, done.value.message
    assert "to refuse the result" in done.value.message, done.value.message
    assert client.get_run(run.run_id).status == "waiting"  # still claimed, as documented


CANCELLING = textwrap.dedent('''
    import asyncio

    import intloom

    done_wf = intloom.Workflow("cancels-then-returns", version="1")
    done_st = done_wf.stage("main")
    sleep_wf = intloom.Workflow("cancels-then-awaits", version="1")
    sleep_st = sleep_wf.stage("main")
    wait_wf = intloom.Workflow("cancels-later", version="1")
    wait_st = wait_wf.stage("main")


    @done_st.step("a", routes={"ok": intloom.COMPLETE})
    async def a(ctx: intloom.StepContext[None]) -> str:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        return "ok"


    @sleep_st.step("b", routes={"ok": intloom.COMPLETE})
    async def b(ctx: intloom.StepContext[None]) -> str:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(0)
        return "ok"


    @wait_st.step("c", routes={"ok": intloom.COMPLETE})
    async def c(ctx: intloom.StepContext[None]) -> str:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().call_later(0.2, task.cancel)  # a stray watchdog
        await ctx.confirm({"go": True})
        return "ok"


    agent_wf = intloom.Workflow("cancels-on-complete", version="1")
    agent_st = agent_wf.stage("main")


    @agent_st.agent_step("d", routes={"ok": intloom.COMPLETE, "watchdog": intloom.COMPLETE,
                                      "now": intloom.COMPLETE})
    def d(ctx: intloom.StepContext[None]) -> dict[str, str]:
        return {"topic": "x"}


    @d.on_complete
    async def d_done(ctx: intloom.StepContext[None], result: intloom.AgentResult) -> None:
        task = asyncio.current_task()
        assert task is not None
        if result.outcome == "now":
            task.cancel()
            await asyncio.sleep(0)
        elif result.outcome == "watchdog":
            asyncio.get_running_loop().call_later(0.05, task.cancel)
            await asyncio.sleep(30)
''')


@pytest.fixture
def cancelling(project: Project) -> Iterator[Client]:
    yield from _serving(project, "cancelling", CANCELLING)


def test_a_step_that_cancels_its_own_task_then_returns_shows_the_end_it_recorded(
        cancelling: Client) -> None:
    """The journal ended "completed" while every view said "running", for ever."""
    run = cancelling.create_run("cancels-then-returns", "x")
    assert run.status == "completed", run


def test_a_step_whose_own_task_is_cancelled_fails_its_run_saying_so(
        cancelling: Client) -> None:
    run = cancelling.create_run("cancels-then-awaits", "x")
    assert run.status == "failed", run
    assert run.last_error is not None and run.last_error.code == "STEP_EXECUTION_FAILED"
    assert "the task that runs the Run was cancelled by Workflow code" in (
        run.last_error.message), run.last_error.message


def test_a_wait_whose_task_a_watchdog_cancels_fails_its_run(cancelling: Client) -> None:
    """It stayed "waiting" with nothing to take the answer: the answer was accepted, then
    hung, and the Run was "running" for ever."""
    run = cancelling.create_run("cancels-later", "x")
    assert run.status in ("waiting", "failed"), run
    eventually(lambda: cancelling.get_run(run.run_id).status == "failed", timeout=20,
               what="the cancelled wait to fail its Run")
    ended = cancelling.get_run(run.run_id)
    assert ended.last_error is not None and ended.last_error.code == "STEP_EXECUTION_FAILED"
    assert ended.pending_action is None, ended


@pytest.mark.parametrize("intent", ["surrogate", "number"])
def test_a_step_raising_an_intloom_error_with_unsendable_text_fails_its_run(
        client: Client, intent: str) -> None:
    """A Step's own IntloomError whose message holds a lone surrogate (a file name through
    os.fsdecode), or is no text at all: the Run's end failed to encode, and the Run stayed
    "running" for ever. It fails with that code, the text kept as its escape."""
    run = client.create_run("unnamable", intent)
    assert run.status == "failed", run
    assert run.last_error is not None and run.last_error.code == "INVALID_REQUEST", run
    said = "404" if intent == "number" else "cannot upload report-caf\\udce9.pdf"
    assert run.last_error.message == said, run.last_error.message
    assert client.get_run(run.run_id).last_error == run.last_error



@pytest.mark.parametrize("source", [
    'import intloom\nraise intloom.IntloomError("WORKFLOW_DEFINITION_INVALID", "bad \\udcff")\n',
    'import intloom\nwf = intloom.Workflow("surrver", version="1\\udcff")\n',
])
def test_a_source_raising_text_with_a_lone_surrogate_does_not_stop_the_host(
        project: Project, source: str) -> None:
    """The host's start failed (CLI_INTERNAL_ERROR, "startup_error UnicodeEncodeError" in
    its log), naming no source, for an IntloomError at import holding a lone surrogate, or
    a Workflow whose version held one (the log line naming it could not be written). The
    source is now the one that failed; the host serves the others."""
    for client in _serving(project, "surrogate", source):
        flows = {info.source: info for info in client.workflows()}
        failed = flows["workflows/surrogate.py"]
        assert failed.ready is False and failed.problem is not None, failed
        assert "\\udcff" in failed.problem, failed.problem
        assert flows["workflows/example.py"].ready is True
        assert client.create_run("example", "notes").status == "waiting"


@pytest.mark.parametrize("outcome", ["now", "watchdog"])
def test_an_on_complete_that_cancels_its_own_task_refuses_the_result(
        cancelling: Client, outcome: str) -> None:
    """The host hung up on the Agent (PROJECT_REQUEST_FAILED, "the host may have stopped or
    crashed"), a task_error in its log: the handler's own cancel was taken for the host's.
    It refuses the result as anything else the handler raises: the task stays claimed."""
    run = cancelling.create_run("cancels-on-complete", "x")
    call = run.pending_agent_call
    assert call is not None, run
    token, _ = cancelling.claim_agent_call(run.run_id, call.id, "agent-1")
    with pytest.raises(IntloomError) as refused:
        cancelling.complete_agent_call(run.run_id, call.id, token, outcome)
    assert refused.value.code == "INVALID_REQUEST", refused.value
    message = refused.value.message
    assert "on_complete refused the Agent's result" in message, message
    assert "CancelledError" in message, message
    after = cancelling.complete_agent_call(run.run_id, call.id, token, "ok")
    assert after.status == "completed", after




def test_a_tool_or_on_complete_raising_an_intloom_error_with_a_lone_surrogate_is_answered(
        client: Client) -> None:
    """As a Step's: the Agent is told, the text keeping the surrogate as its escape, and
    the task goes on."""
    run = client.create_run("unnamable-agent", "x")
    call = run.pending_agent_call
    assert call is not None, run
    token, _ = client.claim_agent_call(run.run_id, call.id, "agent-1")
    with pytest.raises(IntloomError) as tool:
        client.call_tool(run.run_id, call.id, token, "tc-1", "unnamed", {})
    assert tool.value.code == "TOOL_EXECUTION_FAILED", tool.value
    assert "cannot upload report-caf\\udce9.pdf" in tool.value.message, tool.value.message
    with pytest.raises(IntloomError) as completed:
        client.complete_agent_call(run.run_id, call.id, token, "ok")
    assert completed.value.code == "INVALID_REQUEST", completed.value
    assert "report-caf\\udce9.pdf" in completed.value.message, completed.value.message
    assert client.get_run(run.run_id).status == "waiting"
