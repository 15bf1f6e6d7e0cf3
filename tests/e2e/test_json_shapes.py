"""The JSON the CLI prints has every field the docs list, also when it holds its default
(a count of 0, ``retryable: false``, ``ready: true``, ``isSkippable: false``): scripts read
these keys without a fallback. Real host, real CLI subprocesses; the project is reaped."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import Project

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SERVICE_KEYS = {"projectRoot", "pid", "instanceId", "port", "startedAt", "packageVersion",
                "logFile", "workflowCount", "runningRuns", "waitingRuns", "completedRuns",
                "failedRuns", "restore", "logError", "journalError", "journalFix",
                "compactionError", "workflowProblems"}
RESTORE_KEYS = {"resumed", "waiting", "interrupted", "needsAttention", "terminalSkipped"}


def _json(project: Project, *args: str) -> Any:
    result = project.cli(*args, "--json")
    assert result.code in (0, 1), result.stderr
    return result.json


def test_defaults_are_printed_not_left_out(soak_project: Project) -> None:
    project = soak_project
    started = _json(project, "start")["service"]
    assert started.keys() >= SERVICE_KEYS, sorted(SERVICE_KEYS - started.keys())
    assert started["runningRuns"] == started["failedRuns"] == 0
    assert started["restore"].keys() >= RESTORE_KEYS and started["restore"]["resumed"] == []

    flows = _json(project, "flows")["workflows"]
    assert flows and all(w["ready"] is True for w in flows), flows

    asked = _json(project, "flow", "soak-ask", "--intent", "shapes")["run"]
    assert asked["status"] == "waiting", asked
    questions = asked["pendingAction"]["request"]
    assert [(q["id"], q["isSkippable"]) for q in questions] == [
        ("topic", False), ("note", True)]

    cancelled = _json(project, "cancel", asked["runId"])["run"]
    error = cancelled["lastError"]
    assert error.keys() == {"code", "message", "retryable"}, error
    assert (error["code"], error["retryable"]) == ("RUN_STOPPED", False), error
    # The message names the wait the cancel ended (test_cancel_names_the_wait).
    assert error["message"].startswith("The Run was stopped while Step "), error
    status = _json(project, "status")["service"]
    assert status.keys() >= SERVICE_KEYS and status["failedRuns"] == 1
    assert status["runningRuns"] == status["waitingRuns"] == status["completedRuns"] == 0
