"""An effect's result is durable before its Step goes on (DESIGN §5: a record goes down with
the next one only when nothing observable happens between them, and a Step's code after an
effect can do anything). A SIGKILL after the effect returned, while the Step still runs, finds
the effect done with its result in the journal -- not an effect in flight whose outcome is
unknown -- and the next start reports the Run RUN_INTERRUPTED naming that effect as done."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Project, eventually, ok, one_source_project, reaped

pytestmark = pytest.mark.e2e

SOURCE = '''
import asyncio
import time
from pathlib import Path

import intloom

HERE = Path(__file__).resolve().parent.parent
wf = intloom.Workflow("pay", version="1")
st = wf.stage("charge")


def _hold() -> None:
    (HERE / "after-effect").write_text("the effect returned")
    deadline = time.monotonic() + 30
    while not (HERE / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.01)


@st.step("sync_charge", routes={"ok": intloom.COMPLETE})
def sync_charge(ctx: intloom.StepContext[None]) -> str:
    ctx.effect("charge", lambda: "txn-123", key="order-42")
    _hold()  # on the Step's worker thread
    return "ok"


wf2 = intloom.Workflow("apay", version="1")
ast = wf2.stage("charge")


@ast.step("async_charge", routes={"ok": intloom.COMPLETE})
async def async_charge(ctx: intloom.StepContext[None]) -> str:
    await ctx.aeffect("charge", lambda: "txn-456", key="order-43")
    await asyncio.to_thread(_hold)
    return "ok"
'''


@pytest.fixture
def pay(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "pay", SOURCE))


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("workflow", "txn", "key"), [("pay", "txn-123", "order-42"),
                                                      ("apay", "txn-456", "order-43")])
def test_sigkill_after_an_effect_returned_finds_its_result_in_the_journal(
    pay: Project, workflow: str, txn: str, key: str
) -> None:
    ok(pay.cli("start", "--json"))
    run_id = ok(pay.cli("flow", workflow, "--intent", "charge", "--detach",
                        "--json"))["run"]["runId"]
    eventually((pay.root / "after-effect").exists, timeout=15, what="the effect to return")
    pay.kill_host()

    inspected = ok(pay.cli("inspect", run_id, "--json"))
    records: list[dict[str, Any]] = inspected["records"]
    last = records[-1]
    assert last["phase"] == "effect_done" and last["verdict"] == "ok", records
    assert last["record"]["name"] == "charge" and last["record"]["key"] == key
    assert last["record"]["result"] == txn
    assert "effectInFlight" not in inspected["run"], inspected["run"]
    assert inspected["run"]["restart"]["row"] == "interrupted"

    assert ok(pay.cli("recover", "--json"))["recovered"] is True
    restore = ok(pay.cli("start", "--json"))["service"]["restore"]
    assert restore["interrupted"] == [run_id]
    [run] = [r for r in ok(pay.cli("runs", "--json"))["runs"] if r["runId"] == run_id]
    assert run["lastError"]["code"] == "RUN_INTERRUPTED"
    message = run["lastError"]["message"]
    assert "'charge'" in message and key in message, message
    (pay.root / "release").write_text("")
    ok(pay.cli("stop", "--json"))


INIT_SOURCE = '''
import msgspec

import intloom


class Loaded(msgspec.Struct):
    data: str = ""


wf = intloom.Workflow("load", version="1")
sync_stage = wf.stage("sync_stage", state=Loaded)
async_stage = wf.stage("async_stage", state=Loaded)


@sync_stage.init
def fetch(ctx: intloom.StepContext[Loaded]) -> Loaded:
    return Loaded(data=ctx.effect("fetch", lambda: "fetched"))


@sync_stage.step("check", routes={"fetched": intloom.ToStage("async_stage")})
def check(ctx: intloom.StepContext[Loaded]) -> str:
    return ctx.state.data


@async_stage.init
async def afetch(ctx: intloom.StepContext[Loaded]) -> Loaded:
    return Loaded(data=await ctx.aeffect("afetch", lambda: "afetched"))


@async_stage.step("acheck", routes={"afetched": intloom.COMPLETE})
def acheck(ctx: intloom.StepContext[Loaded]) -> str:
    return ctx.state.data
'''


@pytest.mark.timeout(120)
def test_an_initialiser_that_runs_an_effect_goes_on_to_its_stage(tmp_path: Path) -> None:
    """An initialiser may run effects (the journal takes effect_started after its executing;
    docs/recovery.md names an initialiser's effect in flight), but its State could not
    follow the effect_done: the Run failed CLI_INTERNAL_ERROR "The host failed while driving
    the Run (IllegalTransition)". It goes on to its Stage's first Step with that State."""
    for project in reaped(one_source_project(tmp_path, "load", INIT_SOURCE)):
        ok(project.cli("start", "--json"))
        run = ok(project.cli("flow", "load", "--intent", "i", "--json"))["run"]
        assert (run["status"], run.get("lastError")) == ("completed", None), run
        records = ok(project.cli("inspect", run["runId"], "--json"))["records"]
        assert [r["phase"] for r in records if r["record"].get("name") in (
            "fetch", "afetch")] == ["effect_started", "effect_done"] * 2
        ok(project.cli("stop", "--json"))
