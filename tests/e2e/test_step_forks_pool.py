"""A Step using ``multiprocessing.Pool`` (fork start method, Linux's default before Python
3.14) in a ``with`` block, whose end calls ``terminate()``, stopped the whole host: the
forked workers inherited the host's asyncio signal handlers and wakeup fd, so the SIGTERM
``terminate()`` sent each worker was written to the host's loop and taken as its own (a
graceful stop, then a forced one from the second worker). A forked child now gets the
process's earlier signal handlers and no wakeup fd."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Project, ok, one_source_project, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SOURCE = '''
import multiprocessing

import intloom

pooled = intloom.Workflow("pooled", version="1")
ps = pooled.stage("s")


@ps.step("a", routes={"ok": intloom.COMPLETE})
def a(ctx: intloom.StepContext[None]) -> str:
    with multiprocessing.get_context("fork").Pool(2) as pool:  # its end: terminate()
        assert pool.map(abs, [-1, -2, -3]) == [1, 2, 3]
    return "ok"


other = intloom.Workflow("other", version="1")
os_ = other.stage("s")


@os_.step("a", routes={"yes": intloom.COMPLETE, "no": intloom.COMPLETE})
async def b(ctx: intloom.StepContext[None]) -> str:
    answer = await ctx.confirm({"q": "go?"})
    return "yes" if answer.confirmed else "no"
'''


@pytest.fixture
def proj(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "pooled", SOURCE))


def test_a_step_terminating_its_process_pool_does_not_stop_the_host(proj: Project) -> None:
    started = ok(proj.cli("start", "--json"))["service"]
    other = ok(proj.cli("flow", "other", "--intent", "x", "--json"))["run"]
    assert other["status"] == "waiting"
    pooled = ok(proj.cli("flow", "pooled", "--intent", "x", "--json"))["run"]
    assert pooled["status"] == "completed", pooled

    # Served after the Step's workers were terminated: a SIGTERM relayed to the host's loop
    # has been handled by now.
    runs = {r["runId"]: r for r in ok(proj.cli("runs", "--json"))["runs"]}
    assert runs[other["runId"]]["status"] == "waiting"
    log = next((proj.state / "logs").glob("LOG-*.jsonl")).read_text()
    assert '"signal_received"' not in log
    assert '"service_stopping"' not in log
    status = ok(proj.cli("status", "--json"))
    assert status["service"]["instanceId"] == started["instanceId"]
    again = ok(proj.cli("flow", "pooled", "--intent", "y", "--json"))["run"]
    assert again["status"] == "completed", again
    ok(proj.cli("stop", "--json"))
