"""A sync Step that waits for its own Run through the Python client (``wait_run``) waited
out the client's ``request_timeout`` (300 s by default) and then failed with
PROJECT_REQUEST_FAILED, which says the host may be hung: the Run neither waits nor ends
until that Step returns. One that followed its own Run (``subscribe``, no timeout between
events) hung it until the host stopped. The client now refuses both at once, naming the
Run and the Step; waiting for another Run from a Step still works."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Project, ok, one_source_project, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SOURCE = '''
from pathlib import Path

import intloom
from intloom.client import Client

ROOT = Path(__file__).resolve().parent.parent

waits = intloom.Workflow("waits", version="1")
ws = waits.stage("s")


def _wait(ctx: intloom.StepContext[None], call: str, run_id: str) -> str:
    # Long enough that the refusal, not the timeout, is what the test sees.
    with Client.connect(ROOT, request_timeout=60) as client:
        if call == "subscribe":  # up to the history's end, then closed
            return next(e for e in client.subscribe(run_id) if e.caught_up).run.status
        return client.wait_run(run_id).status


@ws.step("a", routes={"waiting": intloom.COMPLETE})
def a(ctx: intloom.StepContext[None]) -> str:
    # The intent is "CALL RUN": RUN "self" is its own Run. From a helper, as real code.
    call, target = ctx.intent.split()
    return _wait(ctx, call, ctx.run_id if target == "self" else target)


gate = intloom.Workflow("gate", version="1")
gs = gate.stage("s")


@gs.step("a", routes={"yes": intloom.COMPLETE, "no": intloom.COMPLETE})
async def ask(ctx: intloom.StepContext[None]) -> str:
    return "yes" if (await ctx.confirm({"q": "go?"})).confirmed else "no"
'''


@pytest.fixture
def proj(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "waits", SOURCE))


@pytest.mark.parametrize("call", ["wait_run", "subscribe"])
def test_a_step_waiting_for_its_own_run_is_refused_at_once(proj: Project, call: str) -> None:
    ok(proj.cli("start", "--json"))
    began = time.monotonic()
    result = proj.cli("flow", "waits", "--intent", f"{call} self", "--json")
    took = time.monotonic() - began
    assert result.code == 1, (result.stdout, result.stderr)
    run = result.json["run"]
    assert run["status"] == "failed"
    error = run["lastError"]
    assert error["code"] == "STEP_INTERACTION_INVALID", error
    run_id = run["runId"]
    for fact in (f"Stage 's', Step 'a' called {call}({run_id!r}) on its own Run",
                 "a Step cannot wait for its own Run", "Nothing was sent",
                 f"intloom attach {run_id}"):
        assert fact in error["message"], (fact, error["message"])
    assert error["retryable"] is False
    assert took < 30, took  # well under the Step's request_timeout of 60 s

    # Another Run, waited for from a Step, is waited for as before.
    gate = ok(proj.cli("flow", "gate", "--intent", "x", "--json"))["run"]
    assert gate["status"] == "waiting"
    other = ok(proj.cli("flow", "waits", "--intent", f"{call} {gate['runId']}",
                        "--json"))["run"]
    assert other["status"] == "completed", other
    ok(proj.cli("stop", "--json"))
