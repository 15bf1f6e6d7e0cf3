"""A child process forked by a Step (``multiprocessing.Process`` with the fork start method,
Linux's default before Python 3.14) that outlives its Step kept the host's descriptors: the
OS locks of ``service.lock`` and the checkpoint store, and the listening socket. After
``intloom stop`` the next ``start`` failed ``BUSY`` ("Another process holds the checkpoint
store") for as long as the child lived. A forked child now lets go of them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Project, eventually, ok, one_source_project, pid_alive, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SOURCE = '''
import multiprocessing
import os
import time
from pathlib import Path

import intloom

HERE = Path(__file__).resolve().parent.parent


def linger() -> None:
    (HERE / "child.pid").write_text(str(os.getpid()))
    deadline = time.monotonic() + 60
    while not (HERE / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.01)


forks = intloom.Workflow("forks", version="1")
fs = forks.stage("s")


@fs.step("a", routes={"ok": intloom.COMPLETE})
def a(ctx: intloom.StepContext[None]) -> str:
    multiprocessing.get_context("fork").Process(target=linger).start()
    return "ok"
'''


@pytest.fixture
def proj(tmp_path: Path) -> Iterator[Project]:
    project = one_source_project(tmp_path, "forks", SOURCE)
    try:
        yield from reaped(project)
    finally:
        (project.root / "release").write_text("")


def test_a_child_a_step_forked_does_not_hold_the_project_after_stop(proj: Project) -> None:
    ok(proj.cli("start", "--json"))
    run = ok(proj.cli("flow", "forks", "--intent", "x", "--json"))["run"]
    assert run["status"] == "completed", run
    marker = proj.root / "child.pid"
    eventually(lambda: marker.exists() and marker.read_text() != "",
               timeout=20, what="the forked child to start")
    child = int(marker.read_text())
    proj.pids.add(child)
    stopped = ok(proj.cli("stop", "--json"))
    assert stopped["stopped"] is True
    assert pid_alive(child)

    restarted = proj.cli("start", "--json")
    assert restarted.code == 0, (restarted.stdout, restarted.stderr)
    assert restarted.json["reused"] is False
    assert pid_alive(child)  # it was the child's to hold nothing, not the start's to wait
    ok(proj.cli("stop", "--json"))
    (proj.root / "release").write_text("")
    eventually(lambda: not pid_alive(child), timeout=20, what="the forked child to exit")
