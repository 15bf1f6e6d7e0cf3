"""Cancelled and terminal Runs through restarts: never recovered, never listed again.

A cancelled Run is terminal (failed/RUN_STOPPED) and no crash brings it back; a completed one
neither. A Run restored as RUN_INTERRUPTED comes back at every start until it is cancelled,
which records that the user dismissed it; from then on it stays away, and its evidence
(including the effect that was in flight) stays readable with ``inspect``.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.conformance_harness import wait_killed
from tests.helpers import Project, eventually, ok

pytestmark = pytest.mark.e2e

YES = '{"isConfirmed": true}'


def listed(project: Project) -> dict[str, dict[str, Any]]:
    return {r["runId"]: r for r in ok(project.cli("runs", "--json"))["runs"]}


def crash_and_start(project: Project) -> dict[str, Any]:
    pid = project.host_pid()
    project.kill_host()
    wait_killed(project, pid)
    assert ok(project.cli("recover", "--json"))["recovered"] is True
    return dict(ok(project.cli("start", "--json"))["service"]["restore"])


def test_cancelled_and_terminal_runs_never_come_back(proj: Project) -> None:
    ok(proj.cli("start", "--json"))
    cancelled = ok(proj.cli("flow", "side", "--intent", "cancel me", "--json"))["run"]
    stopped = ok(proj.cli("cancel", cancelled["runId"], "--json"))["run"]
    assert (stopped["status"], stopped["lastError"]["code"]) == ("failed", "RUN_STOPPED")
    assert ok(proj.cli("cancel", cancelled["runId"], "--json"))["run"] == stopped  # idempotent
    finished = ok(proj.cli("flow", "side", "--intent", "finish me", "--json"))["run"]
    action = finished["pendingAction"]["id"]
    ok(proj.cli("answer", finished["runId"], action, YES, "--json"))
    waiting = ok(proj.cli("flow", "side", "--intent", "keep me", "--json"))["run"]

    gates = proj.root / "gates"
    gates.mkdir()
    (gates / "effect:download.hold").write_text("held")
    stuck = ok(proj.cli("flow", "reference", "--intent", "interrupt me", "--detach",
                        "--json"))["run"]
    eventually((gates / "effect:download.entered").exists, timeout=15,
               what="the download effect to start")

    restore = crash_and_start(proj)
    assert restore["waiting"] == [waiting["runId"]]
    assert restore["interrupted"] == [stuck["runId"]]
    named = {r for k in ("resumed", "waiting", "interrupted", "needsAttention")
             for r in restore.get(k, [])}
    assert not named & {cancelled["runId"], finished["runId"]}
    assert set(listed(proj)) == {waiting["runId"], stuck["runId"]}

    # Not dismissed: an interrupted Run comes back at every start.
    ok(proj.cli("stop", "--json"))
    restore = ok(proj.cli("start", "--json"))["service"]["restore"]
    assert restore["interrupted"] == [stuck["runId"]]

    dismissed = ok(proj.cli("cancel", stuck["runId"], "--json"))["run"]
    assert dismissed["lastError"]["code"] == "RUN_INTERRUPTED" and dismissed["dismissed"]
    again = ok(proj.cli("cancel", stuck["runId"], "--json"))["run"]
    assert again == dismissed
    told = proj.cli("cancel", stuck["runId"])  # what a person reads
    assert told.code == 0 and told.stdout.startswith("Dismissed"), told
    assert "does not come back" in told.stdout and "Execution failed" not in told.stdout
    restored = ok(proj.cli("cancel", waiting["runId"], "--json"))["run"]
    assert restored["lastError"]["code"] == "RUN_STOPPED"  # a restored wait cancels too

    # Neither a crash nor a clean restart brings any of them back.
    restore = crash_and_start(proj)
    assert not any(restore.get(k) for k in ("resumed", "waiting", "interrupted",
                                           "needsAttention")), restore
    assert listed(proj) == {}
    # Cancelled again after the restart, it reads as it did on the host that dismissed it
    # (it said the Run "has ended; no stop is needed" there, of the same dismissal).
    told = proj.cli("cancel", stuck["runId"])
    assert told.code == 0 and told.stdout.startswith("Dismissed"), told
    doctor = proj.cli("doctor", "--json").json
    assert doctor["runs"] == []
    ok(proj.cli("stop", "--json"))
    ok(proj.cli("start", "--json"))
    assert listed(proj) == {}

    # The evidence stays readable, offline or not.
    ok(proj.cli("stop", "--json"))
    evidence = ok(proj.cli("inspect", stuck["runId"], "--json"))
    phases = [r["phase"] for r in evidence["records"]]
    assert "effect_started" in phases and phases[-1] == "terminal"
    assert evidence["records"][-1]["record"]["dismissed"] is True
    assert evidence["run"]["effectInFlight"]["name"] == "download"
    for run in (cancelled, finished):
        records = ok(proj.cli("inspect", run["runId"], "--json"))["records"]
        assert records[-1]["phase"] == "terminal"


def test_a_cancel_that_cuts_an_effect_names_it_in_the_runs_error(proj: Project) -> None:
    """A stop or a restart names an effect cut in flight, its outcome unknown; a cancel said
    only "The Run was stopped." though the effect may have reached its target."""
    ok(proj.cli("start", "--json"))
    gates = proj.root / "gates"
    gates.mkdir()
    hold = gates / "effect:download.hold"
    hold.write_text("held")
    run = ok(proj.cli("flow", "reference", "--intent", "cancel mid-effect", "--detach",
                      "--json"))["run"]
    eventually((gates / "effect:download.entered").exists, timeout=15,
               what="the download effect to start")
    stopped = ok(proj.cli("cancel", run["runId"], "--json"))["run"]
    hold.unlink()  # the effect returns; nothing of it is recorded
    error = stopped["lastError"]
    assert error["code"] == "RUN_STOPPED", error
    key = f"download-{run['runId'][-6:]}"
    assert f"effect 'download' (key '{key}'" in error["message"], error
    assert "outcome is unknown" in error["message"], error
    assert ok(proj.cli("cancel", run["runId"], "--json"))["run"] == stopped  # idempotent
    told = proj.cli("cancel", run["runId"])  # what a person reads
    assert told.code == 0 and f"RUN_STOPPED: {error['message']}" in told.stdout, told
