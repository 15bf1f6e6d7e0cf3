"""The host's log removed while it serves (``rm -rf .intloom/logs``): the host wrote on into
the unlinked file, so what doctor, ``stop`` and the next start read from the log was lost
unsaid. It writes the file again at its path, from the open file, and goes on there; when
that cannot be done, it says so (in the file it still writes) and serves on.

Real host, real CLI."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.helpers import Project, eventually, ok

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def _said(path: Path, event: str) -> bool:
    try:
        return any(line["event"] == event for line in _lines(path))
    except (OSError, ValueError):
        return False


def test_a_log_removed_while_the_host_serves_is_written_again_whole(project: Project) -> None:
    service = ok(project.cli("start", "--json"))["service"]
    log = project.state / "logs" / service["logFile"]
    before = log.read_bytes()
    shutil.rmtree(project.state / "logs")
    eventually(lambda: _said(log, "log_restored"), timeout=10,
               what="the host to write its log again")
    assert log.read_bytes().startswith(before)
    run = ok(project.cli("flow", "example", "--intent", "after", "--json"))["run"]
    stop = project.cli("stop")
    assert stop.code == 0, stop.stderr
    assert "Its log does not say" not in stop.stdout + stop.stderr, stop.stdout
    assert "1 unfinished Run was suspended" in stop.stdout, stop.stdout
    events = _lines(log)
    names = [e["event"] for e in events]
    assert names[0] == "log_opened" and names[-1] == "log_closed", names
    assert "service_stopped" in names, names
    assert any(e["event"] == "run_created" and e.get("runId") == run["runId"]
               for e in events), names
    assert (log.stat().st_mode & 0o777) == 0o400  # sealed, as any log its host closed


def test_a_log_that_cannot_be_written_again_leaves_the_host_serving(project: Project) -> None:
    """.intloom/logs made readable by others, then the log removed: the restore refuses a
    directory that is not private. It raised PrivacyError out of the host's serve loop, and
    the host died (status: stale resources, run recover). It says so and serves on."""
    service = ok(project.cli("start", "--json"))["service"]
    logs = project.state / "logs"
    log = logs / service["logFile"]
    os.chmod(logs, 0o755)
    log.unlink()
    pid = service["pid"]

    def removed_log() -> Path | None:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with_name = os.readlink(fd)
            if with_name == f"{log} (deleted)":
                return fd
        return None

    held = eventually(removed_log, timeout=10, what="the host's descriptor on its log")
    eventually(lambda: _said(held, "log_not_restored"), timeout=10,
               what="the host to say it could not write its log again")
    assert not log.exists()  # no partial copy left at the path
    assert ok(project.cli("status", "--json"))["service"]["pid"] == pid
    ok(project.cli("flow", "example", "--intent", "still served", "--json"))
    os.chmod(logs, 0o700)
    assert project.cli("stop").code == 0
