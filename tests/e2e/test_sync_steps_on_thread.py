"""A Run's sync Steps are driven by a crew on a worker thread, which flushes the journal
itself (intloom/executor/crew.py, ``Driver._steps_here``). The real host dies or fails at a
flush well inside such a stretch -- the crew's own flushes alternate with the loop's (each
tick's effect is journaled through the loop) -- and the restart keeps every promise it
keeps for the loop: the journal verifies, nothing ran twice, and the Run completes or is
reported RUN_INTERRUPTED.

Faults come only through ``INTLOOM_FAULT`` (docs/format.md, "Testing hooks"). A lone
ticker (fixtures/projects/threads) is driven by a crew from its first tick: each tick's
flushes are the crew's (executing, with the last tick's result) and then two of the loop's
(the tick's effect_started and effect_done), so of 40, 41 and 42 one is the crew's. Each
tick notes which way it was driven, so the tests also prove that the crew was the one.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from intloom.client.client import Client
from intloom.client.lifecycle import stop_service
from intloom.protocol.messages import ServiceView
from intloom.runtime.records import Executing
from intloom.store import read_history, verify_report
from tests.helpers import Project, ok
from tests.integration.host_support import start

pytestmark = pytest.mark.e2e

GOAL = 60


def _counters(project: Project) -> Counter[str]:
    path = project.root / "counters.log"
    return Counter(path.read_text().splitlines() if path.exists() else [])


def _driven(project: Project, run_id: str) -> dict[int, str]:
    """Which way each tick ran (``thread`` or ``loop``), by tick number; the last wins."""
    out: dict[int, str] = {}
    for line in _counters(project):
        who, kind, *rest = line.split()
        if who == run_id and kind == "driven":
            out[int(rest[0].rsplit("-", 1)[1])] = rest[1]
    return out


def _judge(project: Project, run_id: str, status: str, code: str | None) -> None:
    runtime: Path = project.state / "runtime"
    report = verify_report(runtime)
    assert [r for r in report.runs if r.status != "ok"] == []
    counts = _counters(project)
    assert max(counts.values(), default=1) == 1, counts.most_common(3)  # nothing ran twice
    ran = sorted(int(line.rsplit("-", 1)[1]) for line in counts
                 if line.startswith(f"{run_id} step tick-"))
    assert ran == list(range(1, len(ran) + 1)), ran  # in order, none skipped
    history = read_history(runtime, run_id)
    verdicts = Counter(e.verdict for e in history)
    assert set(verdicts) <= {"ok", "void", "torn", "snapshot"}, verdicts
    # A tick is counted by its Step, which runs only once its executing is durable.
    started = sum(1 for e in history if e.verdict == "ok" and isinstance(e.record, Executing)
                  and e.record.step == "tick")
    if status == "completed":
        assert len(ran) == GOAL == started  # every tick exactly once, across the crash
    else:
        assert code in ("RUN_INTERRUPTED", "RUN_CHECKPOINT_FAILED"), code
        assert 1 <= len(ran) < GOAL  # stopped where the fault hit, nothing re-run
        assert started - 1 <= len(ran) <= started, (started, len(ran))


def _ticker_under(project: Project, monkeypatch: pytest.MonkeyPatch, fault: str,
                  intent: str) -> tuple[ServiceView, str]:
    """A host started with ``fault`` armed, and a lone ticker of GOAL ticks created."""
    monkeypatch.setenv("INTLOOM_FAULT", fault)
    service = start(project).service
    with Client.connect(project.root) as client:
        run = client.create_run("thread-ticker", f"{intent} goal={GOAL}", wait=False)
    return service, run.run_id


# Every flush of the first ten ticks, then each kind of crash on three flushes in a row: one
# of them the crew's, two the loop's.
_CRASHES = [f"crash_after_sync={n}" for n in range(5, 31)] + [
    f"{kind}={n}" for kind in ("crash_after_sync", "crash_before_sync", "torn_write")
    for n in (40, 41, 42)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", _CRASHES)
def test_a_crash_while_a_thread_drives_sync_steps(
    threads_project: Project, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    project = threads_project
    service, run_id = _ticker_under(project, monkeypatch, fault, "crash")
    project.wait_released(service.pid, timeout=60)  # the host SIGKILLed itself at that flush
    if int(fault.split("=")[1]) >= 12:  # a few ticks in: the crew drove them
        assert "thread" in _driven(project, run_id).values()
    monkeypatch.delenv("INTLOOM_FAULT")
    ok(project.cli("--json", "recover"))
    start(project)
    with Client.connect(project.root) as client:
        final = client.wait_run(run_id)
    code = final.last_error.code if final.last_error else None
    assert final.status == "completed" or code == "RUN_INTERRUPTED", (final.status, code)
    _judge(project, run_id, final.status, code)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", ["fail_sync=40", "fail_sync=41,keep_failed=41",
                                   "fail_sync=42"])
def test_a_failed_flush_while_a_thread_drives_sync_steps(
    threads_project: Project, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    project = threads_project
    service, run_id = _ticker_under(project, monkeypatch, fault, "disk")
    with Client.connect(project.root) as client:
        failed = client.wait_run(run_id)
        assert failed.status == "failed" and failed.last_error is not None
        assert failed.last_error.code == "RUN_CHECKPOINT_FAILED"
        # The host keeps serving, and a new lone Run is driven the same way to its end.
        other = client.create_run("thread-ticker", f"disk goal={GOAL}")
        assert client.wait_run(other.run_id).status == "completed"
        # Both were driven by a crew: the failed one until its flush failed.
        assert "thread" in _driven(project, run_id).values()
        driven = _driven(project, other.run_id)
        assert [driven[n] for n in range(1, GOAL + 1)] == ["thread"] * GOAL, driven
        assert client.status().instance_id == service.instance_id
    assert stop_service(project.root)
    monkeypatch.delenv("INTLOOM_FAULT")
    start(project)
    with Client.connect(project.root) as client:
        again = client.get_run(run_id)
    # Its journal ends at its last durable record; the Step in flight is not re-run.
    assert again.status == "failed" and again.last_error is not None
    assert again.last_error.code == "RUN_INTERRUPTED"
    _judge(project, run_id, "failed", "RUN_INTERRUPTED")
    verdicts = Counter(e.verdict for e in read_history(project.state / "runtime", run_id))
    if "keep_failed" in fault:
        assert verdicts["void"] >= 1, verdicts  # the failed batch is on disk, never a record
    else:
        assert verdicts["void"] == 0, verdicts  # cut off its segment: nothing of it is left
