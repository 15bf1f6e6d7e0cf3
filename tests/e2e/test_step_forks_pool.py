"""A Step using ``multiprocessing.Pool`` (fork start method, Linux's default before Python
3.14) in a ``with`` block, whose end calls ``terminate()``, stopped the whole host: the
forked workers inherited the host's asyncio signal handlers and wakeup fd, so the SIGTERM
``terminate()`` sent each worker was written to the host's loop and taken as its own (a
graceful stop, then a forced one from the second worker). A forked child now gets the
process's earlier signal handlers and no wakeup fd. A signal that reaches the child before
that hook runs (a worker not yet scheduled when ``terminate()`` signals it, on a loaded
machine; an earlier at-fork hook) waits until it has them: the host holds its signals in
the forking thread across the fork."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Project, ok, one_source_project, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SOURCE = '''
import multiprocessing
import os
import signal
import time

import intloom

pooled = intloom.Workflow("pooled", version="1")
ps = pooled.stage("s")


@ps.step("a", routes={"ok": intloom.COMPLETE})
def a(ctx: intloom.StepContext[None]) -> str:
    with multiprocessing.get_context("fork").Pool(2) as pool:  # its end: terminate()
        assert pool.map(abs, [-1, -2, -3]) == [1, 2, 3]
    return "ok"


early = intloom.Workflow("early", version="1")
es = early.stage("s")


@es.step("a", routes={"died-of-it": intloom.COMPLETE})
def c(ctx: intloom.StepContext[None]) -> str:
    # One CPU for this thread and the child: the child runs only once this thread yields,
    # so the SIGTERM is sent before the child has run anything, its at-fork hooks included.
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    try:
        pid = os.fork()
        if pid == 0:
            time.sleep(10)  # killed by the SIGTERM, or it would exit 0
            os._exit(0)
        os.kill(pid, signal.SIGTERM)
    finally:
        os.sched_setaffinity(0, cpus)
    _, status = os.waitpid(pid, 0)
    return "died-of-it" if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM \\
        else f"exited {status}"


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


def test_a_signal_a_forked_child_gets_before_its_hook_ran_is_its_own(proj: Project) -> None:
    """The SIGTERM reached the child while it still had the host's handlers, which wrote it
    to the host's wakeup fd: the host stopped (RUN_INTERRUPTED) and the child lived on."""
    started = ok(proj.cli("start", "--json"))["service"]
    other = ok(proj.cli("flow", "other", "--intent", "x", "--json"))["run"]
    run = ok(proj.cli("flow", "early", "--intent", "x", "--json"))["run"]
    assert run["status"] == "completed", run  # the child died of its SIGTERM
    runs = {r["runId"]: r for r in ok(proj.cli("runs", "--json"))["runs"]}
    assert runs[other["runId"]]["status"] == "waiting"
    log = next((proj.state / "logs").glob("LOG-*.jsonl")).read_text()
    assert '"signal_received"' not in log
    status = ok(proj.cli("status", "--json"))
    assert status["service"]["instanceId"] == started["instanceId"]
    ok(proj.cli("stop", "--json"))
