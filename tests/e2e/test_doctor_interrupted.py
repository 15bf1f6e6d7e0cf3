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
