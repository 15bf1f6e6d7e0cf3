"""``inspect RUN`` of a Run whose host was killed headed it with its journal's last word
(``waiting``, or ``running`` for a Step in flight) while ``runs`` listed it
``failed (RUN_INTERRUPTED)``. It now says both: what the journal says, and that the host
that ran it is gone and what a start does (or did). Real host, SIGKILL, real CLI; reaped."""

from __future__ import annotations

import pytest

from tests.helpers import Project, ok

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_inspect_of_a_run_whose_host_is_gone_agrees_with_runs(soak_project: Project) -> None:
    project = soak_project
    ok(project.cli("start", "--json"))
    run_id = ok(project.cli("flow", "soak-ask", "--intent", "cut", "--json"))["run"]["runId"]
    killed = project.state.joinpath("service.json").read_text()
    project.kill_host()
    instance = ok(project.cli("inspect", run_id, "--json"))["run"]
    assert instance["status"] == "waiting", instance  # the journal's last word, as before
    assert instance["hostGone"]["instanceId"] in killed, instance
    assert "runningHost" not in instance["hostGone"], instance

    offline = project.cli("inspect", run_id)
    assert offline.code == 0, offline.stderr
    head, *rest = offline.stdout.splitlines()
    assert head.startswith(f"Run {run_id} · interrupted (journal: waiting; host gone)"), head
    assert any("is gone: the next start fails the Run with RUN_INTERRUPTED" in line
               for line in rest), offline.stdout

    ok(project.cli("recover", "--json"))
    ok(project.cli("start", "--json"))
    [listed] = ok(project.cli("runs", "--json"))["runs"]
    assert (listed["status"], listed["lastError"]["code"]) == ("failed", "RUN_INTERRUPTED")
    now = project.cli("inspect", run_id)
    head, *rest = now.stdout.splitlines()
    assert head.startswith(f"Run {run_id} · interrupted (journal: waiting; host gone)"), head
    pid = project.host_pid()
    assert any(f"the host running now (pid {pid}) started after it and restored the Run as "
               "failed (RUN_INTERRUPTED)" in line for line in rest), now.stdout

    # A Run waiting in the host running now (it would be interrupted by a restart, but
    # its host is alive): its heading is its own status, as runs lists it.
    live = ok(project.cli("flow", "soak-ask", "--intent", "live", "--json"))["run"]
    shown = ok(project.cli("inspect", live["runId"], "--json"))["run"]
    assert shown["status"] == "waiting" and shown["restart"]["row"] == "interrupted", shown
    assert "hostGone" not in shown, shown
    text = project.cli("inspect", live["runId"]).stdout
    assert text.splitlines()[0].startswith(f"Run {live['runId']} · waiting · "), text
    ok(project.cli("stop", "--json"))


def test_attach_of_an_interrupted_run_never_goes_back_in_time(soak_project: Project) -> None:
    """attach of a Run restored as RUN_INTERRUPTED: its history ended with an ``end`` line
    at the Run's updatedAt (its last record's, from before the crash), earlier than the
    ``restored`` line above it. The end now carries the time of the event it follows."""
    project = soak_project
    ok(project.cli("start", "--json"))
    run_id = ok(project.cli("flow", "soak-ask", "--intent", "cut", "--json"))["run"]["runId"]
    project.kill_host()
    ok(project.cli("recover", "--json"))
    ok(project.cli("start", "--json"))

    shown = project.cli("attach", run_id)
    assert shown.code == 1, shown  # interrupted: failed
    events = [line.split()[:2] for line in shown.stdout.splitlines()
              if line[:4].isdigit() and "T" in line[:11]]
    names = [name for _, name in events]
    assert names[-2:] == ["restored", "end"], shown.stdout
    times = [at for at, _ in events]
    assert times == sorted(times), shown.stdout  # ISO-8601 UTC: text order is time order
    assert times[-1] == times[-2], shown.stdout  # the end is the restore's
