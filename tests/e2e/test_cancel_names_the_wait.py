"""A cancel of a Run that waits on a person or a client Agent names the wait it ends: what
was asked, of whom, and that an answer (or the Agent's next request) is now refused. It said
only "The Run was stopped.", as for a Run cancelled between Steps.

Real host, real CLI, real socket.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Project, eventually, ok, one_source_project, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SOURCE = '''
import intloom

confirm = intloom.Workflow("confirm-it", version="1.0.0")
one = confirm.stage("one")


@one.step("review", routes={"yes": intloom.COMPLETE, "no": intloom.COMPLETE})
async def review(ctx: intloom.StepContext[None]) -> str:
    answer = await ctx.confirm({"draft": "notes for " + ctx.intent})
    return "yes" if answer.confirmed else "no"


ask = intloom.Workflow("ask-it", version="1.0.0")
two = ask.stage("two")


@two.step("gate", routes={"ok": intloom.COMPLETE})
async def gate(ctx: intloom.StepContext[None]) -> str:
    await ctx.ask([intloom.Question(id="why", question="Why ship it?")])
    return "ok"


delegate = intloom.Workflow("delegate-it", version="1.0.0")
three = delegate.stage("three")


@three.agent_step("look", routes={"done": intloom.COMPLETE}, agent="researcher")
def look(ctx: intloom.StepContext[None]) -> dict[str, str]:
    return {"topic": ctx.intent}


busy = intloom.Workflow("busy-it", version="1.0.0")
four = busy.stage("four")


@four.step("grind", routes={"done": intloom.COMPLETE})
async def grind(ctx: intloom.StepContext[None]) -> str:
    import asyncio
    from pathlib import Path

    Path("entered").touch()
    await asyncio.Event().wait()  # code outside any effect, until the cancel cuts it
    return "done"
'''


@pytest.fixture
def waits(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "waits", SOURCE))


def cancelled(project: Project, workflow: str) -> tuple[dict[str, Any], str]:
    run = ok(project.cli("flow", workflow, "--intent", "1.0", "--json"))["run"]
    assert run["status"] == "waiting", run
    stopped = ok(project.cli("cancel", run["runId"], "--json"))["run"]
    assert stopped["lastError"]["code"] == "RUN_STOPPED", stopped
    told = project.cli("cancel", run["runId"])  # what a person reads, the same snapshot
    assert told.code == 0 and f"RUN_STOPPED: {stopped['lastError']['message']}" in told.stdout
    return run, stopped["lastError"]["message"]


def test_a_cancel_names_the_wait_it_ends(waits: Project) -> None:
    ok(waits.cli("start", "--json"))

    run, message = cancelled(waits, "confirm-it")
    action = run["pendingAction"]["id"]
    assert message == (
        f"The Run was stopped while Step one/review waited on confirmation {action} for a "
        'person ({"draft":"notes for 1.0"}); that wait is ended, and an answer to it is '
        "refused."), message

    run, message = cancelled(waits, "ask-it")
    action = run["pendingAction"]["id"]
    assert message.startswith(
        f"The Run was stopped while Step two/gate waited on questions {action} for a person ("
    ), message
    assert "Why ship it?" in message, message

    run, message = cancelled(waits, "delegate-it")
    task = run["pendingAgentCall"]["id"]
    assert message == (
        f"The Run was stopped while Step three/look waited on client Agent task {task} "
        "(available, for Agent 'researcher': {\"topic\":\"1.0\"}); the task is withdrawn, "
        "and the Agent's further requests for it are refused."), message


def test_a_cancel_names_the_step_it_cuts_outside_any_effect(waits: Project) -> None:
    """A Run cancelled while its Step ran code outside any effect: the message was only "The
    Run was stopped.", where a stop (and a restart) names the Step."""
    ok(waits.cli("start", "--json"))
    run = ok(waits.cli("flow", "busy-it", "--intent", "x", "--detach", "--json"))["run"]
    eventually(lambda: (waits.root / "entered").exists(), timeout=10,
               what="the Step to start")
    stopped = ok(waits.cli("cancel", run["runId"], "--json"))["run"]
    assert stopped["lastError"]["message"] == (
        "The Run was stopped while Step four/grind was running; no effect was in flight."
    ), stopped
