"""A failed checkpoint write (``INTLOOM_FAULT=enospc_sync=N``, docs/format.md "Testing
hooks") in a real host: the Run's ``lastError`` is the catalogue text and carries no
OS-level cause (DESIGN §3: never a cause in an error view); the cause -- segment, offset,
the OS error and its errno -- is in the host log, and ``inspect`` shows where the failed
batch lies (its void record)."""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers import Project, ok

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

CATALOGUE = (
    "The Run recovery checkpoint could not be saved, so this host stopped the Run; earlier "
    "effects are not rolled back. What the next intloom start does with it depends on its "
    "last durable checkpoint (the restart table): intloom doctor previews it."
)


def test_checkpoint_failure_view_has_no_cause_and_the_log_has_it(project: Project) -> None:
    # Flush 1 makes the Run's creation durable; flush 2 (its Stage starting) hits ENOSPC, and
    # its bytes stay (keep_failed: a disk that refuses the cut), for inspect to show void.
    ok(project.cli("start", "--json", env={"INTLOOM_FAULT": "enospc_sync=2,keep_failed=2"}))
    flowed = project.cli("flow", "example", "--intent", "disk full", "--json")
    assert flowed.code == 1, flowed.stdout
    run = flowed.json["run"]
    run_id = run["runId"]
    error = run["lastError"]
    assert error["code"] == "RUN_CHECKPOINT_FAILED"
    assert error["message"] == (
        f"{CATALOGUE} The host log has the cause "
        f"(intloom logs {run_id})."
    )
    listed = [r for r in ok(project.cli("runs", "--json"))["runs"] if r["runId"] == run_id]
    assert listed[0]["lastError"] == error
    for leak in ("wal/", "offset", "No space left", "ENOSPC", "(injected"):
        assert leak not in error["message"]

    logged = [json.loads(line)
              for line in project.cli("logs", run_id, "--json").stdout.splitlines()]
    [failure] = [r for r in logged if r["event"] == "run_checkpoint_failed"]
    assert failure["level"] == "error" and failure["runId"] == run_id
    cause = failure["cause"]
    match = re.fullmatch(
        r"write of (wal/\d+\.seg) failed at offset (\d+): No space left on device.* \(ENOSPC\)",
        cause,
    )
    assert match is not None, cause

    records = ok(project.cli("inspect", run_id, "--json"))["records"]
    voids = [r for r in records if r["verdict"] == "void"]
    assert [(v["file"], v["offset"]) for v in voids] == [(match[1], int(match[2]))]
    ok(project.cli("stop", "--json"))


def test_a_cause_the_log_could_not_keep_is_not_promised_in_the_view(project: Project) -> None:
    """The disk that refused the checkpoint may refuse the log line too: the view said "The
    host log has the cause" where `intloom logs RUN` then showed none."""
    env = {"INTLOOM_FAULT": "enospc_sync=2", "INTLOOM_TEST_LOG_FAIL_AT": "run_checkpoint_failed"}
    ok(project.cli("start", "--json", env=env))
    flowed = project.cli("flow", "example", "--intent", "disk full", "--json")
    assert flowed.code == 1, flowed.stdout
    run = flowed.json["run"]
    error = run["lastError"]
    assert error["code"] == "RUN_CHECKPOINT_FAILED"
    assert error["message"] == (
        f"{CATALOGUE} The host could not write the cause "
        "to its log either (the disk is full or failing); intloom inspect shows where the "
        "journal stops."), error
    logged = project.cli("logs", run["runId"], "--json").stdout
    assert "run_checkpoint_failed" not in logged
    project.cli("stop", "--json")


def test_stop_counts_a_run_whose_terminal_record_was_not_saved(
    soak_project: Project,
) -> None:
    """The Run's last flush (its terminal record) fails: in memory it ended, on disk it did
    not, and the next start restores it. The stop said "No Run was unfinished"."""
    from intloom.store import read_runs

    project = soak_project
    env = {"INTLOOM_FAULT": "enospc_sync=9"}  # a one-Step Run's flush 9 is its terminal
    ok(project.cli("start", "--json", env=env))
    flowed = project.cli("flow", "soak-ticker", "--intent", "disk goal=1 delay=0", "--json")
    run = flowed.json["run"]
    assert run["lastError"]["code"] == "RUN_CHECKPOINT_FAILED", run
    stopped = project.cli("stop")
    assert stopped.code == 0, stopped.stderr
    on_disk = [(j.run_id, j.state.phase if j.state else None)
               for j in read_runs(project.state / "runtime")]
    assert [run_id for run_id, _ in on_disk] == [run["runId"]], on_disk
    assert on_disk[0][1] != "terminal", on_disk
    assert "1 Run stays unfinished as this host found or left it" in stopped.stdout, (
        stopped.stdout)
    assert "No Run was unfinished" not in stopped.stdout


def test_a_run_whose_creation_cannot_be_saved_is_named_and_its_cause_logged(
    project: Project,
) -> None:
    """Flush 1 is the Run's creation: it fails before the Run is visible. `flow` said only
    the catalogue line -- no Run, no cause, no fix -- and the host log had nothing."""
    ok(project.cli("start", "--json", env={"INTLOOM_FAULT": "enospc_sync=1"}))
    flowed = project.cli("flow", "example", "--intent", "disk full", "--json")
    assert flowed.code == 1, flowed.stdout
    error = flowed.json["error"]
    assert error["code"] == "RUN_CHECKPOINT_FAILED"
    match = re.search(r"intloom logs (RUN-\S+?)\)", error["message"])
    assert match is not None, error["message"]
    run_id = match[1]
    assert "No Run was created" in error["message"], error["message"]
    assert "No space left" not in error["message"]  # the cause is in the log, not the view
    logged = [json.loads(line)
              for line in project.cli("logs", run_id, "--json").stdout.splitlines()]
    [failure] = [r for r in logged if r["event"] == "run_checkpoint_failed"]
    assert "ENOSPC" in failure["cause"], failure
    assert run_id not in project.cli("runs").stdout
    # The log counted a failed Run that flow says was never created.
    assert [r["event"] for r in logged if r["event"].startswith("run_")] == [
        "run_checkpoint_failed"], logged
    # The writer moved to a fresh segment: the command run again works.
    again = ok(project.cli("flow", "example", "--intent", "disk full", "--json"))["run"]
    assert again["status"] == "waiting"
    ok(project.cli("stop", "--json"))
