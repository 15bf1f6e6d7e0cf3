"""The host's log removed while it serves (``rm -rf .intloom/logs``): the host wrote on into
the unlinked file, so what doctor, ``stop`` and the next start read from the log was lost
unsaid. It writes the file again at its path, from the open file, and goes on there.

Real host, real CLI."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.helpers import Project, eventually, ok

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


def test_a_log_removed_while_the_host_serves_is_written_again_whole(project: Project) -> None:
    service = ok(project.cli("start", "--json"))["service"]
    log = project.state / "logs" / service["logFile"]
    before = log.read_bytes()
    shutil.rmtree(project.state / "logs")
    eventually(log.exists, timeout=10, what="the host to write its log again")
    assert log.read_bytes().startswith(before)
    run = ok(project.cli("flow", "example", "--intent", "after", "--json"))["run"]
    stop = project.cli("stop")
    assert stop.code == 0, stop.stderr
    assert "Its log does not say" not in stop.stdout + stop.stderr, stop.stdout
    assert "1 unfinished Run was suspended" in stop.stdout, stop.stdout
    events = [json.loads(line) for line in log.read_text().splitlines()]
    names = [e["event"] for e in events]
    assert names[0] == "log_opened" and names[-1] == "log_closed", names
    assert "log_restored" in names and "service_stopped" in names, names
    assert any(e["event"] == "run_created" and e.get("runId") == run["runId"]
               for e in events), names
    assert (log.stat().st_mode & 0o777) == 0o400  # sealed, as any log its host closed
