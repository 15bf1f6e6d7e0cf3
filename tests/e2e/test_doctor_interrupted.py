"""``doctor`` judges an interrupted Run the same whether or not a host has restored it:
attention (exit 3) until a person dismisses it. Real host, SIGKILL, real CLI; reaped."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import Project

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def _journals(project: Project) -> tuple[int, dict[str, Any]]:
    doctor = project.cli("doctor", "--json")
    assert doctor.code in (0, 3), (doctor.code, doctor.stdout, doctor.stderr)
    check = next(c for c in doctor.json["checks"] if c["id"] == "journals")
    return doctor.code, check


def test_an_interrupted_run_needs_attention_until_it_is_dismissed(
    soak_project: Project,
) -> None:
    project = soak_project
    assert project.cli("start").code == 0
    asked = project.cli("flow", "soak-ask", "--intent", "doctor", "--json").json["run"]
    assert asked["status"] == "waiting"  # no recover entry: a restart interrupts it
    project.kill_host()
    assert project.cli("recover", "--json").code == 0

    code, offline = _journals(project)
    assert code == 3 and offline["status"] == "attention"
    assert "After intloom start, check each interrupted Run" in offline["next"]

    assert project.cli("start").code == 0
    code, running = _journals(project)
    assert code == 3 and running["status"] == "attention", running  # it was exit 0
    assert running["next"].startswith("Check each interrupted Run")

    # A live Run a restart would interrupt (it waits, with no recover entry) is not one.
    live = project.cli("flow", "soak-ask", "--intent", "live", "--json").json["run"]
    assert live["status"] == "waiting" and live.get("lastError") is None
    code, still = _journals(project)
    assert code == 3 and still["status"] == "attention", still  # the first one only

    assert project.cli("cancel", asked["runId"], "--json").code == 0  # dismissed
    code, dismissed = _journals(project)
    assert code == 0 and dismissed["status"] == "ok", dismissed
    assert "2 unfinished" not in dismissed["message"] and "1 interrupted" in dismissed["message"]


def test_interrupted_runs_past_those_the_host_lists_still_need_attention(
    soak_project: Project,
) -> None:
    """A host names the first RESTORE_LISTED interrupted Runs only (a Status reply of
    100,000 ids was over the frame): doctor must not take an unlisted one for a live Run."""
    project = soak_project
    assert project.cli("start").code == 0
    for n in range(3):  # no recover entry: the next start interrupts each
        run = project.cli("flow", "soak-ask", "--intent", f"cut {n}", "--json").json["run"]
        assert run["status"] == "waiting", run
    assert project.cli("stop").code == 0
    started = project.cli("start", "--json", env={"INTLOOM_TEST_RESTORE_LISTED": "1"})
    restore = started.json["service"]["restore"]
    assert restore["counts"]["interrupted"] == 3 and len(restore["interrupted"]) == 1, restore

    assert project.cli("cancel", restore["interrupted"][0], "--json").code == 0  # dismissed
    code, check = _journals(project)
    assert code == 3 and check["status"] == "attention", check  # the two others
    assert check["next"].startswith("Check each interrupted Run"), check
    assert project.cli("stop").code == 0


def test_a_dismissed_run_leaves_what_status_and_a_reused_start_say_to_look_at(
    soak_project: Project,
) -> None:
    """The restore summary a running host gives (``status``, a reused ``start``) named a Run
    it had restored RUN_INTERRUPTED after a person dismissed it ("Run intloom inspect ... to
    see what was in flight"), as if it still needed them; a cancelled held Run already left it."""
    project = soak_project
    assert project.cli("start").code == 0
    cut = [project.cli("flow", "soak-ask", "--intent", f"cut {n}", "--json").json["run"]["runId"]
           for n in range(2)]  # no recover entry: the next start interrupts each
    assert project.cli("stop").code == 0
    restore = project.cli("start", "--json").json["service"]["restore"]
    assert sorted(restore["interrupted"]) == sorted(cut), restore

    dismissed, kept = cut
    assert project.cli("cancel", dismissed, "--json").json["run"]["dismissed"] is True
    for command in ("status", "start"):
        summary = project.cli(command, "--json").json["service"]["restore"]
        assert summary["interrupted"] == [kept], (command, summary)
        assert summary["counts"]["interrupted"] == 1, (command, summary)
        text = project.cli(command)
        assert text.code == 0, text
        assert "interrupted 1 ·" in text.stdout and dismissed not in text.stdout, text.stdout
        assert f"Interrupted (RUN_INTERRUPTED, nothing replayed): {kept}." in text.stdout

    assert project.cli("cancel", kept, "--json").code == 0
    text = project.cli("status")
    # Nothing of what the restore did needs anyone now (as when a held Run is cancelled).
    assert "Restore  no unfinished Runs to restore" in text.stdout, text.stdout
    assert "Interrupted (" not in text.stdout and kept not in text.stdout, text.stdout
    # Still what the start did with the Runs it restored: failed, as runs lists them.
    assert "failed or stopped 2" in text.stdout, text.stdout
    assert project.cli("stop").code == 0


def test_runs_says_which_interrupted_run_was_dismissed(soak_project: Project) -> None:
    """``runs --json`` marks a dismissed Run (``dismissed: true``); the text listed it as
    ``failed (RUN_INTERRUPTED)``, the same as one still to be checked and dismissed."""
    project = soak_project
    assert project.cli("start").code == 0
    cut = [project.cli("flow", "soak-ask", "--intent", f"cut {n}", "--json").json["run"]["runId"]
           for n in range(2)]  # no recover entry: the next start interrupts each
    assert project.cli("stop").code == 0
    assert project.cli("start").code == 0
    dismissed, kept = cut
    assert project.cli("cancel", dismissed, "--json").json["run"]["dismissed"] is True

    listed = {r["runId"]: r for r in project.cli("runs", "--json").json["runs"]}
    assert listed[dismissed].get("dismissed") is True and "dismissed" not in listed[kept]
    text = project.cli("runs")
    assert text.code == 0, text
    rows = {line.split()[0]: line for line in text.stdout.splitlines() if line.startswith("RUN-")}
    assert "failed (RUN_INTERRUPTED, dismissed)" in rows[dismissed], text.stdout
    assert "failed (RUN_INTERRUPTED)" in rows[kept] and "dismissed" not in rows[kept], text.stdout
    assert project.cli("stop").code == 0
