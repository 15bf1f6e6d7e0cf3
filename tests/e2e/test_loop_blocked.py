"""An async Step that blocks (``time.sleep``) holds the host's event loop, and with it every
client: ``runs`` and ``stop`` timed out in their hello, "a hung, paused or busy host", and
nothing said why. The host now logs ``loop_blocked`` with the code and the Run that hold the
loop, and ``loop_unblocked`` once it runs again; a client whose hello times out quotes it.
Real host, real CLI, a real blocking call in the Step."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from intloom.client.client import HELLO_CAP_ENV
from tests.helpers import Project, eventually, make_project, ok, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

BLOCKER = '''\
import time

import intloom

wf = intloom.Workflow("blocker", version="1.0.0")
s = wf.stage("s")


@s.step("a", routes={"ok": intloom.COMPLETE})
async def a(ctx: intloom.StepContext[None]) -> str:
    time.sleep(float(ctx.intent))  # the mistake: a blocking call in an async Step
    return "ok"
'''


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    made = make_project(tmp_path)
    (made.root / "blocker").mkdir()
    (made.root / "blocker" / "__init__.py").write_text(BLOCKER)
    (made.root / "intloom.toml").write_text('workflows = ["workflows/example.py", "blocker"]\n')
    yield from reaped(made)


def _events(project: Project, log: Path, name: str) -> list[dict[str, Any]]:
    return [record for line in log.read_text().splitlines()
            if (record := json.loads(line))["event"] == name]


def test_a_blocked_loop_is_logged_with_its_code_and_run_and_quoted_to_clients(
        project: Project) -> None:
    service = ok(project.cli("start", "--json"))["service"]
    log = project.state / "logs" / service["logFile"]
    run = ok(project.cli("flow", "blocker", "--intent", "5", "--detach", "--json"))["run"]
    [blocked] = eventually(lambda: _events(project, log, "loop_blocked") or None,
                           what="loop_blocked in the host's log")
    assert (blocked["cause"], blocked["at"]) == ("step", "blocker/__init__.py:11 in a"), blocked
    assert blocked["runId"] == run["runId"], blocked
    assert blocked["seconds"] >= 2 and "asyncio.to_thread" in blocked["message"], blocked
    # A command meanwhile is told what holds the host, not "hung, paused or busy".
    refused = project.cli("runs", env={HELLO_CAP_ENV: "1"})
    assert refused.code == 1, (refused.code, refused.stdout, refused.stderr)
    assert "CLI_SERVICE_UNAVAILABLE" in refused.stderr, refused.stderr
    assert "The host's event loop has run nothing for " in refused.stderr, refused.stderr
    assert (f"its loop is held at blocker/__init__.py:11 in a (Run {run['runId']}) "
            "(loop_blocked)") in refused.stderr, refused.stderr
    assert "An async Step (or Tool, or on_complete) that blocks holds it: make it a plain " \
           "def" in refused.stderr, refused.stderr
    assert f"kill -9 {service['pid']}" in refused.stderr, refused.stderr
    # It may answer later: retryable, as the same host reached by a request's reconnect.
    doc = project.cli("--json", "runs", env={HELLO_CAP_ENV: "1"}).json["error"]
    assert (doc["code"], doc["retryable"]) == ("CLI_SERVICE_UNAVAILABLE", True), doc
    [unblocked] = eventually(lambda: _events(project, log, "loop_unblocked") or None,
                             timeout=15, what="loop_unblocked in the host's log")
    assert unblocked["seconds"] >= 4.5, unblocked
    # Once it runs again, the host answers, and the Run completed.
    done = ok(project.cli("runs", "--json"))["runs"]
    assert [(r["runId"], r["status"]) for r in done] == [(run["runId"], "completed")], done
    ok(project.cli("stop", "--json"))
    assert len(_events(project, log, "loop_blocked")) == 1
