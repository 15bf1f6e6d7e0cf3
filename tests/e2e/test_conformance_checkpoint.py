"""RUN_CHECKPOINT_FAILED end to end: an injected write failure inside the real host.

``INTLOOM_FAULT=fail_sync=N`` (passed to ``intloom start``) makes the host's N-th flush fail
with EIO after its bytes were written. The Run whose records were in that batch fails with
RUN_CHECKPOINT_FAILED; an effect that already ran is not rolled back and never runs again;
the host keeps serving every other Run. The failed batch never happened: on the next start
the Run comes back from its last durable record, by the restart table (reference §6.7).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.conformance_harness import FULL_RUN, Acks, drive
from tests.helpers import Project, counters, ok

pytestmark = pytest.mark.e2e

# Flushes one Run of ``side`` makes up to its wait: created, its Step starts, it waits.
SIDE_FLUSHES = 3
# Flushes of ``reference``: 4 makes effect_started(download) durable, 5 its effect_done (on
# its own: the Step goes on only once the effect's result is durable); 11 makes the answer
# to approve durable.
DOWNLOAD_DONE = 5
APPROVE_ANSWERED = 11


def run_of(project: Project, run_id: str) -> dict[str, Any]:
    [run] = [r for r in ok(project.cli("runs", "--json"))["runs"] if r["runId"] == run_id]
    return dict(run)


def test_a_failed_write_after_an_effect_stops_that_run_only(proj: Project) -> None:
    fault = f"fail_sync={SIDE_FLUSHES + DOWNLOAD_DONE}"
    ok(proj.cli("start", "--json", env={"INTLOOM_FAULT": fault}))
    other = ok(proj.cli("flow", "side", "--intent", "bystander", "--json"))["run"]
    assert other["status"] == "waiting"

    flowed = proj.cli("flow", "reference", "--intent", "checkpoint fails", "--json")
    assert flowed.code == 1, flowed.stdout
    failed = flowed.json["run"]
    assert failed["status"] == "failed"
    assert failed["lastError"]["code"] == "RUN_CHECKPOINT_FAILED"
    assert "not rolled back" in failed["lastError"]["message"]
    run_id = failed["runId"]
    # The effect ran once and stays done; nothing after the failed write ran.
    assert counters(proj.root)[run_id] == {"init:prepare": 1, "step:fetch": 1,
                                           "effect:download": 1}

    # The host keeps serving: the Run created before completes, a new one is created.
    action = other["pendingAction"]["id"]
    done = ok(proj.cli("answer", other["runId"], action, '{"isConfirmed": true}', "--json"))
    assert done["run"]["status"] == "completed"
    fresh = ok(proj.cli("flow", "side", "--intent", "after the failure", "--json"))["run"]
    assert fresh["status"] == "waiting"
    assert run_of(proj, run_id)["lastError"]["code"] == "RUN_CHECKPOINT_FAILED"
    ok(proj.cli("stop", "--json"))

    # The failed batch never happened: the journal ends at effect_started(download), so the
    # next start reports the effect as in flight (its outcome was never recorded).
    doctor = {p["runId"]: p for p in proj.cli("doctor", "--json").json["runs"]}
    assert (doctor[run_id]["phase"], doctor[run_id]["verdict"]["row"]) == (
        "effect_started", "interrupted")
    assert doctor[run_id]["verdict"]["effect"]["name"] == "download"
    restore = ok(proj.cli("start", "--json"))["service"]["restore"]
    assert restore["interrupted"] == [run_id]
    assert restore["waiting"] == [fresh["runId"]]
    after = run_of(proj, run_id)
    assert after["lastError"]["code"] == "RUN_INTERRUPTED"
    assert "'download'" in after["lastError"]["message"]
    assert counters(proj.root)[run_id]["effect:download"] == 1  # never replayed
    inspected = ok(proj.cli("inspect", run_id, "--json"))["records"]
    # The failed batch was cut off the segment (docs/format.md): no record of it is left.
    assert [r["verdict"] for r in inspected if r["verdict"] != "ok"] == [], inspected
    assert inspected[-1]["phase"] == "effect_started", inspected[-1]
    ok(proj.cli("stop", "--json"))


def test_a_failed_answer_write_comes_back_as_the_same_wait(proj: Project) -> None:
    ok(proj.cli("start", "--json", env={"INTLOOM_FAULT": f"fail_sync={APPROVE_ANSWERED}"}))
    waiting = ok(proj.cli("flow", "reference", "--intent", "answer lost", "--json"))["run"]
    run_id, action = waiting["runId"], waiting["pendingAction"]["id"]
    answered = proj.cli("answer", run_id, action, '{"isConfirmed": true}', "--json")
    assert answered.code == 1
    assert answered.json["error"]["code"] == "RUN_CHECKPOINT_FAILED"
    failed = run_of(proj, run_id)
    assert failed["status"] == "failed" and "pendingAction" not in failed
    side = ok(proj.cli("flow", "side", "--intent", "still served", "--json"))["run"]
    assert side["status"] == "waiting"
    ok(proj.cli("stop", "--json"))

    # The answer was never durable: the Run comes back waiting on the very same action.
    restore = ok(proj.cli("start", "--json"))["service"]["restore"]
    assert sorted(restore["waiting"]) == sorted([run_id, side["runId"]])
    back = run_of(proj, run_id)
    assert back["pendingAction"] == waiting["pendingAction"]
    final = drive(proj, back, Acks())
    assert final["status"] == "completed"
    counts = counters(proj.root)[run_id]
    assert set(counts) - {"recover:approve", "recover:questions"} == FULL_RUN
    assert set(counts.values()) == {1} and counts["recover:approve"] == 1
    ok(proj.cli("stop", "--json"))
