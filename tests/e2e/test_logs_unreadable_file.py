"""``intloom logs`` with a log file it may not open (mode 0000, another user's): the file
was passed over in silence, exit 0, and the newest one was then said to have "no record yet:
its host wrote none (it ended, or was killed, as it started)" -- false, and the records of
the host it asked about were missing without a word. It now fails STORAGE_ERROR (exit 1)
naming the file, its mode and the chmod, after every log it could read; the file is kept
as it is. Real host and real CLI; as root, without the capabilities that let root read any
file (setpriv), so that the mode binds."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.helpers import Project, cli_as_a_user, ok, snapshot_files

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_a_log_that_cannot_be_read_fails_naming_it_not_called_empty(project: Project) -> None:
    first = ok(project.cli("start", "--json"))["service"]
    ok(project.cli("stop", "--json"))
    second = ok(project.cli("start", "--json"))["service"]
    run = ok(project.cli("flow", "example", "--intent", "notes", "--json"))["run"]
    ok(project.cli("stop", "--json"))
    newest = project.state / "logs" / second["logFile"]
    newest.chmod(0)
    before = snapshot_files(project.state)
    shown = str(newest)
    fix = f"Run chmod u+r {shown}"

    for args in ((), (run["runId"],)):
        text = cli_as_a_user(project, "logs", *args)
        assert (text.code, text.stdout) == (1, ""), (args, text)
        assert text.stderr.startswith(
            f"Failure · STORAGE_ERROR: {shown} is not readable by you (mode 0000): its records "
            "are not shown."), text.stderr
        assert fix in text.stderr and "no record yet" not in text.stderr, text.stderr
        assert "No log records about" not in text.stderr, text.stderr

    result = cli_as_a_user(project, "logs", "--all", "--json")
    assert result.code == 1, (result.stdout, result.stderr)
    lines: list[dict[str, Any]] = [json.loads(line) for line in result.stdout.splitlines()]
    error = lines[-1]["error"]
    assert (error["code"], error["retryable"]) == ("STORAGE_ERROR", False), error
    assert fix in error["message"] and "the other logs' records are" in error["message"]
    # The readable (first) log is shown in full before the error.
    assert lines[0]["event"] == "log_opened" and lines[0]["instanceId"] == first["instanceId"]
    assert lines[-2]["event"] == "log_closed", lines[-2]
    assert snapshot_files(project.state) == before  # the file is left as it is


@pytest.mark.parametrize("where", [".intloom/logs", ".intloom"])
def test_a_logs_directory_that_cannot_be_listed_is_storage_error_not_a_crash(
    project: Project, where: str,
) -> None:
    """A .intloom/logs/ its user may not read (or a .intloom/ it may not search) ended
    intloom logs with CLI_INTERNAL_ERROR, exit 70: os.listdir's PermissionError escaped."""
    ok(project.cli("start", "--json"))
    ok(project.cli("stop", "--json"))
    directory = project.root / where
    directory.chmod(0)
    try:
        for args in ((), ("--all",), ("--follow",)):
            text = cli_as_a_user(project, "logs", *args)
            assert (text.code, text.stdout) == (1, ""), (args, text)
            assert text.stderr.startswith(
                "Failure · STORAGE_ERROR: The host logs cannot be listed: "
                f"{directory}"), text.stderr
            assert f"chmod {'700' if where.endswith('logs') else 'u+x'} {directory}" in \
                text.stderr, text.stderr
        result = cli_as_a_user(project, "logs", "--json")
        assert result.code == 1, (result.stdout, result.stderr)
        assert result.json["error"]["code"] == "STORAGE_ERROR", result.stdout
    finally:
        directory.chmod(0o700)
