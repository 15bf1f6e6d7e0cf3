"""A start restores unfinished Runs only, so a Run that had ended was "not known to this
host" after a restart: `cancel RUN` repeated gave NOT_FOUND where DESIGN has it return the
same snapshot, and `attach RUN` or `Client.get_run` of a Run that had completed said it did
not exist. The host now answers them from the Run's journal (its done/ snapshot, or the log
a crash left), for a clean stop and for a kill -9 alike."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from intloom.client.client import Client
from intloom.errors import IntloomError
from tests.helpers import Project, ok, one_source_project, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SOURCE = '''
import intloom

ends = intloom.Workflow("ends", version="1")
es = ends.stage("s")


@es.step("a", routes={"done": intloom.COMPLETE, "wait": "b"})
async def a(ctx: intloom.StepContext[None]) -> str:
    if ctx.intent == "boom":
        raise RuntimeError("boom")
    return "wait" if ctx.intent == "wait" else "done"


@es.step("b", routes={"ok": intloom.COMPLETE})
async def b(ctx: intloom.StepContext[None]) -> str:
    await ctx.confirm({"q": "go on?"})
    return "ok"
'''


@pytest.fixture
def proj(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "ends", SOURCE))


def _ended(proj: Project) -> dict[str, dict[str, Any]]:
    """Three Runs that end here: completed, failed by its Step, and cancelled."""
    done = ok(proj.cli("flow", "ends", "--intent", "done", "--json"))["run"]
    failed = proj.cli("flow", "ends", "--intent", "boom", "--json")
    assert failed.code == 1, failed.stdout
    waiting = ok(proj.cli("flow", "ends", "--intent", "wait", "--json"))["run"]
    cancelled = ok(proj.cli("cancel", waiting["runId"], "--json"))["run"]
    return {"completed": done, "failed": failed.json["run"], "cancelled": cancelled}


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_runs_that_ended_before_a_restart_are_still_answered_for(proj: Project,
                                                                 how: str) -> None:
    ok(proj.cli("start", "--json"))
    ended = _ended(proj)
    assert [r["status"] for r in ended.values()] == ["completed", "failed", "failed"]
    if how == "stop":
        ok(proj.cli("stop", "--json"))
    else:
        proj.kill_host()
        ok(proj.cli("recover", "--json"))
    ok(proj.cli("start", "--json"))
    listed = {r["runId"] for r in ok(proj.cli("runs", "--json"))["runs"]}
    assert not listed & {r["runId"] for r in ended.values()}  # a start reads unfinished Runs

    for kind, before in ended.items():
        run_id = before["runId"]
        again = proj.cli("cancel", run_id, "--json")
        assert again.code == 0, (kind, again.stdout, again.stderr)
        assert again.json["run"] == before, (kind, again.json["run"], before)
        attached = proj.cli("attach", run_id, "--json")
        assert attached.code == (0 if kind == "completed" else 1), (kind, attached.stderr)
        assert attached.json["run"] == before, (kind, attached.json["run"], before)
    text = proj.cli("cancel", ended["completed"]["runId"])
    assert text.code == 0 and "The Run has ended; no stop is needed." in text.stdout

    with Client.connect(proj.root) as client:
        view = client.get_run(ended["completed"]["runId"])
        assert view.status == "completed" and view.run_id == ended["completed"]["runId"]
        nobody = "RUN-20260101T000000000Z-" + "a" * 21
        with pytest.raises(IntloomError) as missing:
            client.get_run(nobody)
        assert missing.value.code == "NOT_FOUND", missing.value
    ok(proj.cli("stop", "--json"))
