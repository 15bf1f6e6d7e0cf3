"""A host with more restored Runs than a reply can name: ``status``, ``start`` and ``runs``
still answer, naming the first Runs of each restore list and counting them all.

The host names at most ``RESTORE_LISTED`` (1,000) ids per list; these tests lower that with
``INTLOOM_TEST_RESTORE_LISTED`` rather than restore 100,000 Runs (a reply then over 4 MiB).
"""

from __future__ import annotations

import pytest

from intloom.client import Client
from tests.helpers import Project, ok

pytestmark = pytest.mark.e2e

LISTED = {"INTLOOM_TEST_RESTORE_LISTED": "2"}


def waiting_runs(project: Project, count: int) -> list[str]:
    """``count`` Runs of the example, each waiting on its confirmation, in creation order."""
    ok(project.cli("start", "--json"))
    with Client.connect(project.root) as client:
        views = [client.create_run("example", f"run {n}", wait=True) for n in range(count)]
    assert [v.status for v in views] == ["waiting"] * count
    return [v.run_id for v in views]


def test_held_runs_past_the_listed_ones_are_counted_by_start_status_and_runs(
    project: Project,
) -> None:
    run_ids = waiting_runs(project, 5)
    ok(project.cli("stop", "--json"))
    source = project.root / "workflows" / "example.py"
    source.write_text(source.read_text() + "# changed while the Runs waited\n")

    restore = ok(project.cli("start", "--json", env=LISTED))["service"]["restore"]
    listed = restore["needsAttention"]
    assert len(listed) == 2 and set(listed) <= set(run_ids), restore
    assert restore["counts"] == {"resumed": 0, "waiting": 0, "interrupted": 0,
                                 "needsAttention": 5}, restore
    assert restore["omitted"] == 3
    # Why each listed one is held: the first clause of what doctor says of it.
    why = "incompatible identity: Workflow 'example' changed since the Run started"
    assert restore["reasons"] == {run_id: why for run_id in listed}, restore
    assert ok(project.cli("status", "--json"))["service"]["restore"] == restore

    status = project.cli("status")
    assert status.code == 0, status
    assert "Restore  resumed 0 · waiting 0 · interrupted 0 · needs attention 5" in status.stdout
    named = f"{listed[0]}, {listed[1]} and 3 more (intloom doctor lists them all)"
    assert f"Needs attention (journal kept as is, not loaded): {named}." in status.stdout
    assert f"\n  Why: {why}.\n" in status.stdout, status.stdout
    runs = project.cli("runs")
    assert runs.code == 0, runs
    assert f"Not listed, needs attention (journal kept as is, not loaded): {named}." \
        in runs.stdout, runs.stdout
    document = ok(project.cli("runs", "--json"))
    assert (document["needsAttention"], document["needsAttentionCount"]) == (listed, 5), document

    # A held Run that cancel ended leaves the list and its count.
    ok(project.cli("cancel", listed[0], "--json"))
    after = ok(project.cli("status", "--json"))["service"]["restore"]
    assert after["counts"]["needsAttention"] == 4 and listed[0] not in after["needsAttention"]
    assert len(after["needsAttention"]) == 2 and after["omitted"] == 2
    ok(project.cli("stop", "--json"))


def test_waiting_runs_past_the_listed_ones_are_counted(project: Project) -> None:
    run_ids = waiting_runs(project, 3)
    ok(project.cli("stop", "--json"))

    service = ok(project.cli("start", "--json", env=LISTED))["service"]
    restore = service["restore"]
    assert len(restore["waiting"]) == 2 and set(restore["waiting"]) <= set(run_ids), restore
    assert restore["counts"]["waiting"] == 3 and restore["omitted"] == 1, restore
    assert service["waitingRuns"] == 3
    status = project.cli("status")
    assert "Restore  resumed 0 · waiting 3 · interrupted 0 · needs attention 0" \
        in status.stdout, status.stdout
    ok(project.cli("stop", "--json"))


def test_store_problems_past_the_listed_ones_are_counted_and_the_files_kept(
    project: Project,
) -> None:
    """100,000 snapshots moved out of snap/live/ made a StatusReply of 38 MB: status said
    blocked, and start --json printed each of them."""
    waiting_runs(project, 1)
    ok(project.cli("stop", "--json"))
    live = project.state / "runtime" / "snap" / "live"
    strays = {live / f"stray-{n}.txt": f"not intloom's {n}\n".encode() for n in range(5)}
    for path, data in strays.items():
        path.write_bytes(data)

    service = ok(project.cli("start", "--json", env=LISTED))["service"]
    assert [p["kind"] for p in service["storeProblems"]] == ["unexpected"] * 2, service
    assert service["storeProblemsOmitted"] == 3
    assert ok(project.cli("status", "--json"))["service"]["storeProblems"] \
        == service["storeProblems"]
    status = project.cli("status")
    assert status.stdout.count("Store file .intloom/runtime/snap/live/stray-") == 2, status
    assert "Store files  and 3 more (intloom doctor lists them all)" in status.stdout
    ok(project.cli("stop", "--json"))
    assert {path: path.read_bytes() for path in strays} == strays
