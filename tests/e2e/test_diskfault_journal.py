"""Write failures at the journal (EIO, ENOSPC, no room for a new segment) in a live host.

The Run whose checkpoint could not be written fails with RUN_CHECKPOINT_FAILED, the host
keeps serving other Runs, and after a restart nothing of the failed batch is read as a
record: the journal verifies, the failed records are cut off the segment (or, where the
disk refuses the cut, ``void``), and the Run comes back from its last durable boundary as
the restart table says. Faults are injected only through
``INTLOOM_FAULT`` (docs/format.md, "Testing hooks"), read by the host at start.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from intloom.client.client import Client
from intloom.client.lifecycle import stop_service
from intloom.errors import IntloomError
from intloom.runtime.records import EffectDone, EffectStarted
from intloom.store import read_history, verify_report
from tests.helpers import Project
from tests.integration.host_support import start

pytestmark = pytest.mark.e2e


def _runtime(project: Project) -> Path:
    return project.state / "runtime"


def _counters(project: Project) -> Counter[str]:
    path = project.root / "counters.log"
    return Counter(path.read_text().splitlines() if path.exists() else [])


def _restart_clean(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    assert stop_service(project.root)
    monkeypatch.delenv("INTLOOM_FAULT")
    start(project)


def _judge_after_restart(project: Project, run_id: str, kept: bool) -> None:
    """Nothing half-written reads as valid; the effect ran at most once and only if announced.
    ``kept``: the cut of the failed batch was refused (``keep_failed``), so a notice voids it."""
    report = verify_report(_runtime(project))
    assert [r for r in report.runs if r.status != "ok"] == []
    assert [f for f in report.files if f.kind not in ("torn",)] == []
    history = read_history(_runtime(project), run_id)
    verdicts = Counter(e.verdict for e in history)
    if kept:
        assert verdicts["void"] >= 1, verdicts  # the failed batch is on disk, never a record
    else:
        assert verdicts["void"] == 0, verdicts  # it was cut off: nothing of it is left
    assert set(verdicts) <= {"ok", "void", "torn"}, verdicts
    durable = [e.record for e in history if e.verdict == "ok"]
    started = {r.key for r in durable if isinstance(r, EffectStarted)}
    done = {r.key for r in durable if isinstance(r, EffectDone)}
    ran = {line.split()[2] for line in _counters(project) if line.startswith(f"{run_id} effect ")}
    assert ran <= started, (ran, started)  # no effect ran before its durable effect_started
    assert done <= ran
    assert max(_counters(project).values(), default=1) == 1


@pytest.mark.parametrize("fault", ["fail_sync=3", "enospc_sync=3", "fail_sync=3,keep_failed=3",
                                   "enospc_sync=3,keep_failed=3"])
def test_a_failed_journal_write_fails_only_its_run_and_nothing_half_written_counts(
    soak_project: Project, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    project = soak_project
    monkeypatch.setenv("INTLOOM_FAULT", fault)
    service = start(project).service
    with Client.connect(project.root) as client:
        failed = client.create_run("soak-review", "disk delay=0")
        assert failed.status == "failed", failed
        assert failed.last_error is not None
        assert failed.last_error.code == "RUN_CHECKPOINT_FAILED"
        assert failed.pending_action is None  # a wait that is not durable is never shown
        # The host keeps serving: a fresh segment took over; other Runs go on.
        other = client.create_run("soak-ticker", "disk goal=3 delay=0")
        assert client.wait_run(other.run_id).status == "completed"
        assert client.status().instance_id == service.instance_id
    _restart_clean(project, monkeypatch)
    _judge_after_restart(project, failed.run_id, "keep_failed" in fault)
    with Client.connect(project.root) as client:
        again = client.get_run(failed.run_id)
        # Its journal ends at the last durable record: a Step that had started is not re-run.
        assert again.status == "failed" and again.last_error is not None
        assert again.last_error.code == "RUN_INTERRUPTED"
        assert other.run_id not in {r.run_id for r in client.runs()}  # it completed


def test_no_room_for_a_new_segment_fails_every_later_checkpoint_but_not_the_host(
    soak_project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = soak_project
    # Flush 3 fails, and so does creating the segment that would replace the abandoned one.
    monkeypatch.setenv("INTLOOM_FAULT", "fail_sync=3,fail_segment=2")
    service = start(project).service
    with Client.connect(project.root) as client:
        failed = client.create_run("soak-review", "disk delay=0")
        assert failed.last_error is not None
        assert failed.last_error.code == "RUN_CHECKPOINT_FAILED"
        with pytest.raises(IntloomError) as refused:
            client.create_run("soak-ticker", "disk goal=1 delay=0")
        assert refused.value.code == "RUN_CHECKPOINT_FAILED"
        assert "Traceback" not in refused.value.message
        # Running the command again cannot work before a restart, freed space or not: the
        # refusal and status say so, and what to do.
        assert "until the host restarts" in refused.value.message, refused.value.message
        assert "intloom stop" in refused.value.message
        now = client.status()
        assert now.instance_id == service.instance_id  # still answering
        assert now.journal_error is not None
        assert "no replacement segment could be created" in now.journal_error
        assert [r.run_id for r in client.runs()] == [failed.run_id]
    # doctor beside that host called the project healthy (exit 0): status alone said it.
    doctor = project.cli("doctor", "--json")
    assert doctor.code == 3, doctor.stdout
    [host] = [c for c in doctor.json["checks"] if c["id"] == "host"]
    assert host["status"] == "attention", host
    assert "journal takes no more checkpoints" in host["message"], host
    assert "no replacement segment could be created" in host["message"], host
    assert host["next"].startswith("Run intloom stop; "), host
    _restart_clean(project, monkeypatch)
    _judge_after_restart(project, failed.run_id, kept=False)
    with Client.connect(project.root) as client:
        assert client.status().journal_error is None
        fresh = client.create_run("soak-ticker", "disk goal=2 delay=0")
        assert client.wait_run(fresh.run_id).status == "completed"
