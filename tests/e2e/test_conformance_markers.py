"""External kills and graceful stops at chosen markers, through the real host and CLI.

The conformance fixture's code can be held at a label (``gates/<label>.hold``; see
``fixtures/projects/conformance/probe.py``): the test waits until the code is inside an
effect, a Step or a recover entry, then SIGKILLs the host or runs ``intloom stop``. Counters
kept outside the journal prove what ran, and how often.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conformance_harness import (
    FULL_RUN,
    Acks,
    drive,
    wait_killed,
    wait_stopped,
)
from tests.helpers import Project, counters, eventually, ok

pytestmark = pytest.mark.e2e


def hold(project: Project, label: str) -> Path:
    gates = project.root / "gates"
    gates.mkdir(exist_ok=True)
    path = gates / f"{label}.hold"
    path.write_text("held by the test")
    return path


def entered(project: Project, label: str) -> None:
    marker = project.root / "gates" / f"{label}.entered"
    eventually(marker.exists, timeout=15, what=f"the code to reach {label}")


def preview(project: Project, run_id: str) -> dict[str, Any]:
    doctor = project.cli("doctor", "--json").json
    [found] = [p for p in doctor["runs"] if p["runId"] == run_id]
    return dict(found)


def restart_after_kill(project: Project, pid: int) -> dict[str, Any]:
    wait_killed(project, pid)
    assert ok(project.cli("recover", "--json"))["recovered"] is True
    return dict(ok(project.cli("start", "--json"))["service"])


def listed(project: Project, run_id: str) -> dict[str, Any]:
    [run] = [r for r in ok(project.cli("runs", "--json"))["runs"] if r["runId"] == run_id]
    return dict(run)


def killed_mid_effect(proj: Project, intent: str) -> tuple[str, int]:
    """A host started, a Run of ``reference`` whose ``download`` effect is held running,
    then the host SIGKILLed: the Run's id and the killed host's pid."""
    hold(proj, "effect:download")
    pid = ok(proj.cli("start", "--json"))["service"]["pid"]
    run_id = ok(proj.cli("flow", "reference", "--intent", intent, "--detach",
                         "--json"))["run"]["runId"]
    entered(proj, "effect:download")
    proj.kill_host()
    return run_id, pid


def test_sigkill_while_an_effect_runs_interrupts_the_run_and_names_the_effect(
    proj: Project,
) -> None:
    run_id, pid = killed_mid_effect(proj, "kill mid-effect")
    before = counters(proj.root)[run_id]
    assert before == {"init:prepare": 1, "step:fetch": 1, "effect:download": 1}

    wait_killed(proj, pid)
    assert ok(proj.cli("recover", "--json"))["recovered"] is True
    seen = preview(proj, run_id)
    assert (seen["journal"], seen["phase"], seen["verdict"]["row"]) == (
        "verified", "effect_started", "interrupted")
    effect = seen["verdict"]["effect"]
    assert effect["name"] == "download" and effect["key"] == f"download-{run_id[-6:]}"

    restore = ok(proj.cli("start", "--json"))["service"]["restore"]
    assert restore["interrupted"] == [run_id]
    run = listed(proj, run_id)
    assert run["status"] == "failed" and run["lastError"]["code"] == "RUN_INTERRUPTED"
    message = run["lastError"]["message"]
    assert "'download'" in message and effect["key"] in message and effect["startedAt"] in message

    # The evidence is on disk for inspect, offline too.
    inspected = ok(proj.cli("inspect", run_id, "--json"))["run"]
    assert inspected["effectInFlight"]["name"] == "download"
    assert inspected["restart"]["row"] == "interrupted"
    (proj.root / "gates" / "effect:download.hold").unlink()
    assert counters(proj.root)[run_id] == before  # the effect was not run again
    ok(proj.cli("stop", "--json"))


def test_stop_while_an_effect_runs_abandons_it_after_the_grace(proj: Project) -> None:
    hold(proj, "effect:download")
    ok(proj.cli("start", "--json", env={"INTLOOM_TEST_SUSPEND_GRACE": "0.3"}))
    run_id = ok(proj.cli("flow", "reference", "--intent", "stop mid-effect", "--detach",
                         "--json"))["run"]["runId"]
    entered(proj, "effect:download")
    assert ok(proj.cli("stop", "--json"))["stopped"] is True
    assert ok(proj.cli("status", "--json"))["status"] == "offline"

    seen = preview(proj, run_id)
    assert seen["verdict"]["row"] == "interrupted"
    assert seen["verdict"]["effect"]["name"] == "download"
    restore = ok(proj.cli("start", "--json"))["service"]["restore"]
    assert restore["interrupted"] == [run_id]
    assert "'download'" in listed(proj, run_id)["lastError"]["message"]
    assert counters(proj.root)[run_id]["effect:download"] == 1
    ok(proj.cli("stop", "--json"))


def test_stop_while_a_step_runs_lets_it_reach_its_boundary(proj: Project) -> None:
    gate = hold(proj, "step:fetch")
    pid = ok(proj.cli("start", "--json"))["service"]["pid"]
    run_id = ok(proj.cli("flow", "reference", "--intent", "stop mid-step", "--detach",
                         "--json"))["run"]["runId"]
    entered(proj, "step:fetch")
    stopper = subprocess.Popen(
        [sys.executable, "-m", "intloom", "--project", str(proj.root), "stop", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        log = next((proj.state / "logs").glob("LOG-*.jsonl"))
        eventually(lambda: '"event":"service_stopping"' in log.read_text(), timeout=10,
                   what="the host to begin its stop")
        gate.unlink()  # the Step finishes inside the grace and reaches its boundary
        out, err = stopper.communicate(timeout=30)
    finally:
        if stopper.poll() is None:
            stopper.kill()
            stopper.wait()
    assert stopper.returncode == 0, (out, err)
    assert json.loads(out)["stopped"] is True
    wait_stopped(proj, pid)

    # The Step's outcome was saved; the stop landed at the next safe boundary (normally the
    # next Step's, unless that one started before the host began to suspend its Runs).
    seen = preview(proj, run_id)
    assert seen["verdict"]["row"] in ("resume", "restore_wait"), seen
    assert seen["phase"] in ("step_ready", "waiting")
    service = ok(proj.cli("start", "--json"))["service"]
    restore = service["restore"]
    assert run_id in restore.get("resumed", []) + restore.get("waiting", [])
    final = drive(proj, listed(proj, run_id), Acks())
    assert final["status"] == "completed"
    counts = counters(proj.root)[run_id]
    assert set(counts) == FULL_RUN and set(counts.values()) == {1}, counts
    ok(proj.cli("stop", "--json"))


def test_sigkill_while_recover_runs_is_interrupted_not_replayed(proj: Project) -> None:
    pid = ok(proj.cli("start", "--json"))["service"]["pid"]
    waiting = ok(proj.cli("flow", "reference", "--intent", "kill in recover", "--json"))["run"]
    run_id, action = waiting["runId"], waiting["pendingAction"]["id"]
    proj.kill_host()
    pid = restart_after_kill(proj, pid)["pid"]
    assert listed(proj, run_id)["pendingAction"]["id"] == action

    hold(proj, "recover:approve")
    answer = subprocess.Popen(
        [sys.executable, "-m", "intloom", "--project", str(proj.root), "answer", run_id,
         action, '{"isConfirmed": true}', "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        entered(proj, "recover:approve")
        proj.kill_host()
        out, _ = answer.communicate(timeout=30)
    finally:
        if answer.poll() is None:
            answer.kill()
            answer.wait()
    assert json.loads(out)["error"]["code"] == "PROJECT_REQUEST_FAILED"  # no reply came back

    restart_after_kill(proj, pid)
    run = listed(proj, run_id)
    assert run["lastError"]["code"] == "RUN_INTERRUPTED"
    assert "recover entry of Step prepare/approve was running" in run["lastError"]["message"]
    (proj.root / "gates" / "recover:approve.hold").unlink()
    counts = counters(proj.root)[run_id]
    assert counts["recover:approve"] == 1 and counts["step:approve"] == 1
    ok(proj.cli("stop", "--json"))


def test_a_run_held_for_a_changed_workflow_still_names_the_effect_in_flight(
    proj: Project,
) -> None:
    """The way out for a Run held by a changed Workflow is ``cancel``, which ends it without a
    restart ever saying what it was doing: doctor is where a person learns of the effect."""
    run_id, pid = killed_mid_effect(proj, "kill, then change")
    wait_killed(proj, pid)
    assert ok(proj.cli("recover", "--json"))["recovered"] is True
    source = proj.root / "workflows" / "reference" / "reference.py"
    source.write_text(source.read_text() + "\n# changed after the crash\n")

    seen = preview(proj, run_id)
    assert (seen["journal"], seen["verdict"]["row"]) == ("incompatible", "needs_attention")
    key = f"download-{run_id[-6:]}"
    effect = seen["verdict"].get("effect")  # it was missing: only inspect said it
    assert effect is not None and (effect["name"], effect["key"]) == ("download", key), seen
    reason = seen["verdict"]["reason"]
    assert f"running effect 'download' (key '{key}'" in reason and effect["startedAt"] in reason

    text = proj.cli("doctor")
    assert text.code == 3, (text.code, text.stdout, text.stderr)
    [line] = [x for x in text.stdout.splitlines() if x.strip().startswith(run_id)]
    assert f"needs_attention: {reason}" in line
    assert ok(proj.cli("inspect", run_id, "--json"))["run"]["restart"] == seen["verdict"]
    (proj.root / "gates" / "effect:download.hold").unlink()


def test_cancelling_a_held_run_records_the_effect_it_cut(proj: Project) -> None:
    """A cancel of a live Run cut mid-effect says so in its error ("stopped while ... was
    running effect"); one of a Run held for a changed Workflow said only why it was held."""
    run_id, pid = killed_mid_effect(proj, "kill, change, cancel")
    source = proj.root / "workflows" / "reference" / "reference.py"
    source.write_text(source.read_text() + "\n# changed after the crash\n")
    restore = restart_after_kill(proj, pid)["restore"]
    assert restore["needsAttention"] == [run_id]

    ended = ok(proj.cli("cancel", run_id, "--json"))["run"]
    assert ended["status"] == "failed" and ended["lastError"]["code"] == "RUN_STOPPED"
    message = ended["lastError"]["message"]
    key = f"download-{run_id[-6:]}"
    assert "while it was held" in message, message
    assert f"running effect 'download' (key '{key}'" in message, message
    inspected = ok(proj.cli("inspect", run_id, "--json"))["run"]
    assert inspected["lastError"]["message"] == message  # as recorded in the journal
    (proj.root / "gates" / "effect:download.hold").unlink()
    ok(proj.cli("stop", "--json"))


def test_cancelling_a_held_run_records_the_step_it_cut(proj: Project) -> None:
    """As the effect above, for a Run killed in a Step with no effect in flight: its cancel
    said only why it was held, and that the Step had been running was lost with the Run."""
    hold(proj, "step:fetch")
    pid = ok(proj.cli("start", "--json"))["service"]["pid"]
    run_id = ok(proj.cli("flow", "reference", "--intent", "kill mid-step", "--detach",
                         "--json"))["run"]["runId"]
    entered(proj, "step:fetch")
    proj.kill_host()
    source = proj.root / "workflows" / "reference" / "reference.py"
    source.write_text(source.read_text() + "\n# changed after the crash\n")
    assert restart_after_kill(proj, pid)["restore"]["needsAttention"] == [run_id]

    ended = ok(proj.cli("cancel", run_id, "--json"))["run"]
    message = ended["lastError"]["message"]
    assert ended["lastError"]["code"] == "RUN_STOPPED", ended
    assert "while it was held" in message, message
    assert "fetch was running; no effect was in flight." in message, message
    (proj.root / "gates" / "step:fetch.hold").unlink()
    ok(proj.cli("stop", "--json"))

