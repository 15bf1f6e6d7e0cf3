"""Journal bytes an earlier build wrote read the same way in this one (format 1, golden).

``fixtures/journals/v1/runtime`` was written once by the build that defined format 1 (see
``make.py`` there) and is never regenerated: if a change to the store or the machine makes
these tests fail, that change breaks format 1 -- bump the format instead (docs/format.md).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from intloom.runtime.machine import restart_verdict
from intloom.runtime.records import Answered
from intloom.store import Store, read_history, read_runs, verify_report
from intloom.store.snapshots import MANIFEST_FORMAT, decode_manifest

pytestmark = pytest.mark.timeout(60)

GOLDEN = Path(__file__).resolve().parents[2] / "fixtures" / "journals" / "v1" / "runtime"
PREFIX = "RUN-20261130T060000000Z-golden"

# Run -> (phase, seq, restart row with a recover entry, without one). All read back "ok".
EXPECTED = {
    "Done": ("terminal", 11, "terminal", "terminal"),
    "Dismis": ("terminal", 6, "terminal", "terminal"),
    "Route": ("step_ready", 9, "resume", "resume"),  # routed by the second host
    "Saved": ("step_result", 5, "route", "route"),
    "Waits": ("waiting", 5, "restore_wait", "interrupted"),
    "Effect": ("effect_started", 5, "interrupted", "interrupted"),
    "Answer": ("answered", 6, "recover", "interrupted"),
}


def _private_copy(tmp_path: Path) -> Path:
    """A copy with the modes the store insists on (git keeps neither 0700 nor 0600)."""
    runtime = tmp_path / "runtime"
    shutil.copytree(GOLDEN, runtime)
    for path in [runtime, *runtime.rglob("*")]:
        path.chmod(0o700 if path.is_dir() else 0o600)
    return runtime


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_every_golden_run_reads_back_as_it_was_written(tmp_path: Path) -> None:
    runtime = _private_copy(tmp_path)
    before = _digest(runtime)
    report = verify_report(runtime)
    assert report.files == []
    found = {j.run_id.removeprefix(PREFIX): j for j in report.runs}
    assert set(found) == set(EXPECTED)
    for name, (phase, seq, with_recover, without) in EXPECTED.items():
        journal = found[name]
        assert (journal.status, journal.problem, journal.torn_tail) == ("ok", None, False), name
        state = journal.state
        assert state is not None and (state.phase, state.seq) == (phase, seq), name
        assert restart_verdict(state, True).row == with_recover, name
        assert restart_verdict(state, False).row == without, name
    effect_state, dismissed = found["Effect"].state, found["Dismis"].state
    assert effect_state is not None and dismissed is not None and dismissed.dismissed
    effect = restart_verdict(effect_state, True)
    assert effect.effect is not None and effect.effect.name == "send"
    # What a start restores: the unfinished Runs only, the same states.
    restored = {j.run_id.removeprefix(PREFIX): j.state for j in read_runs(runtime)}
    assert set(restored) == {"Route", "Saved", "Waits", "Effect", "Answer"}
    assert all(restored[n] == found[n].state for n in restored)
    assert _digest(runtime) == before  # reading never writes


def test_golden_histories_read_record_by_record(tmp_path: Path) -> None:
    runtime = _private_copy(tmp_path)
    done = read_history(runtime, PREFIX + "Done")
    assert [e.phase for e in done] == [
        "header", "stage_pending", "step_ready", "executing", "effect_started", "effect_done",
        "step_result", "step_ready", "executing", "step_result", "terminal",
    ]
    route = read_history(runtime, PREFIX + "Route")
    assert [e.phase for e in route] == [
        "header", "stage_pending", "step_ready", "executing", "step_result", "step_ready",
        "executing", "step_result", "step_ready",
    ]
    assert {e.checksum for e in done + route} == {"ok"}
    assert [e.seq for e in route] == list(range(1, 10))
    # The last record is the second host's: a segment of its own, never sealed.
    assert route[-1].file == "wal/0000000002.seg" and route[-2].file == "wal/0000000001.seg"


def test_a_new_host_continues_a_golden_journal(tmp_path: Path) -> None:
    runtime = _private_copy(tmp_path)
    store = Store.open(runtime, instance_id="golden-test", package_version="0.1.0")
    try:
        restored = {j.run_id.removeprefix(PREFIX): j for j in store.restored.runs}
        assert set(restored) == {"Route", "Saved", "Waits", "Effect", "Answer"}
        waits = restored["Waits"].state
        assert waits is not None and waits.pending_action is not None
        store.append(PREFIX + "Waits", Answered(at="2026-11-30T07:00:00.000Z",
                                               action_id=waits.pending_action.id,
                                               answer={"isConfirmed": True}))
        store.sync_blocking(PREFIX + "Waits")
    finally:
        store.close_blocking()
    # The format-1 manifest is upgraded to the current format by the host's own write (the
    # documented upgrade path: formats 1 and 2 are read, the current one is written).
    manifest = decode_manifest(runtime / "manifest.json",
                               (runtime / "manifest.json").read_bytes())
    assert (manifest.format, manifest.open) == (MANIFEST_FORMAT, 0) and manifest.live is not None
    report = verify_report(runtime)
    assert report.files == []
    after = {j.run_id.removeprefix(PREFIX): j for j in report.runs}
    state = after["Waits"].state
    assert after["Waits"].status == "ok" and state is not None
    assert (state.phase, state.seq, state.answer) == ("answered", 6, {"isConfirmed": True})
    assert restart_verdict(state, True).row == "recover"
    assert all(after[n].state == restored[n].state
               for n in ("Route", "Saved", "Effect", "Answer"))
