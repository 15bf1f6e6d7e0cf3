"""What the host log says of Runs at a stop and at a cancel: a grep of it for failures
finds the Runs that failed, not every Run a stop suspended."""

from __future__ import annotations

import json

import pytest

from tests.helpers import Project, ok, started_waiting

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def _logged(project: Project, run_id: str) -> list[dict[str, object]]:
    out = project.cli("logs", run_id, "--json").stdout
    return [json.loads(line) for line in out.splitlines()]


def test_a_run_waiting_at_a_stop_is_logged_waiting_and_a_cancel_is_no_error(
        project: Project) -> None:
    """A stop logged each waiting Run's ``run_suspended`` with the status its clients see
    while the host goes (failed, RUN_INTERRUPTED), though the next start restores it waiting.
    A Run failed by a cancel is asked for: not an error, as a Step's failure is."""
    waiting, _action = started_waiting(project)
    cancelled, _ = started_waiting(project, intent="to cancel")
    ok(project.cli("cancel", cancelled, "--json"))
    ok(project.cli("stop", "--json"))
    [suspended] = [e for e in _logged(project, waiting) if e["event"] == "run_suspended"]
    assert (suspended["status"], suspended["level"]) == ("waiting", "info"), suspended
    [ended] = [e for e in _logged(project, cancelled) if e["event"] == "run_terminal"]
    assert (ended["status"], ended["code"], ended["level"]) == (
        "failed", "RUN_STOPPED", "info"), ended
    restarted = ok(project.cli("start", "--json"))["service"]["restore"]
    assert waiting in restarted["waiting"], restarted
    ok(project.cli("stop", "--json"))
