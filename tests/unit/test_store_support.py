"""Shared helpers for the store tests: legal record sequences built from the real record types,
and a child-process runner for crash faults. The tests at the bottom check the helpers."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from intloom.errors import ErrorView
from intloom.runtime.machine import RunState, fold
from intloom.runtime.model import Cursor, WaitingAction
from intloom.runtime.ports import CheckpointFailed
from intloom.runtime.records import (
    Answered,
    EffectDone,
    EffectStarted,
    Executing,
    Header,
    Record,
    StagePending,
    StepReady,
    StepResult,
    Terminal,
    Waiting,
)
from intloom.store import FaultPlan, Store
from intloom.store.framing import KIND_RECORD, Frame, scan_segment

REPO = Path(__file__).resolve().parents[2]
STAGES = ("draft", "review")


def header(run_id: str) -> Header:
    return Header(at="2026-01-01T00:00:00Z", run_id=run_id, workflow="example",
                  workflow_version="1.0.0", identity="0" * 64,
                  schemas={s: "f" * 64 for s in STAGES}, intent=f"intent of {run_id}")


def _next(state: RunState | None, rng: random.Random, i: int, allow_terminal: bool) -> Record:
    """One record the machine accepts after ``state`` (a random legal walk)."""
    at = f"t{i}"
    if state is None:
        raise AssertionError("the walk starts with a header")
    stage = state.cursor.stage or STAGES[0]
    phase = state.phase
    blob = f'{{"n": {i}}}'.encode()
    if allow_terminal and rng.random() < 0.02 and phase not in ("header",):
        return Terminal(at=at, status="completed")
    if phase == "header":
        return StagePending(at=at, stage=STAGES[0])
    if phase == "stage_pending":
        if rng.random() < 0.3:
            return Executing(at=at, stage=stage, step=None, kind="init")
        return StepReady(at=at, stage=stage, step="s1", state=blob)
    if phase == "step_ready":
        return Executing(at=at, stage=stage, step=state.cursor.step, kind="step")
    if phase == "executing" and state.executing_kind == "init":
        return StepReady(at=at, stage=stage, step="s1", state=blob)
    if phase in ("executing", "effect_done"):
        roll = rng.random()
        if roll < 0.35:
            return EffectStarted(at=at, name="call", key=f"k{i}")
        if roll < 0.5:
            action = WaitingAction(id=f"ASK-{i}", kind="confirmation", request={"n": i},
                                   cursor=state.cursor, created_at=at)
            return Waiting(at=at, action=action)
        return StepResult(at=at, stage=stage, step=state.cursor.step or "s1", outcome="ok",
                          state=blob, output={"i": i})
    if phase == "effect_started":
        eff = state.effect_in_flight
        assert eff is not None
        return EffectDone(at=at, name=eff.name, key=eff.key, result=i)
    if phase == "waiting":
        assert state.pending_action is not None
        return Answered(at=at, action_id=state.pending_action.id, answer={"isConfirmed": True})
    if phase == "answered":
        return Executing(at=at, stage=stage, step=state.cursor.step, kind="recover")
    if phase == "step_result":
        if rng.random() < 0.2:
            return StagePending(at=at, stage=STAGES[1] if stage == STAGES[0] else STAGES[0])
        return StepReady(at=at, stage=stage, step="s2" if state.cursor.step == "s1" else "s1",
                         state=blob)
    raise AssertionError(f"no walk from {phase}")


def walk(run_id: str, n: int, seed: int = 0, *, terminal: bool = False) -> list[Record]:
    """``n`` records of one Run in an order the machine accepts; the last is terminal if asked."""
    rng = random.Random(seed)
    records: list[Record] = [header(run_id)]
    state = fold(records)
    while len(records) < n - (1 if terminal else 0):
        record = _next(state, rng, len(records), allow_terminal=False)
        records.append(record)
        state = fold([record], state)
    if terminal and n > 1:
        stopped = ErrorView(code="RUN_STOPPED", message="The Run was stopped.")
        records.append(Terminal(at="tend", status="failed", error=stopped))
    return records[:n]


def open_store(root: Path, **kw: object) -> Store:
    return Store.open(root, instance_id=kw.pop("instance_id", "INST-test"),  # type: ignore[arg-type]
                      package_version="0.1.0", **kw)  # type: ignore[arg-type]


def abandon(store: Store) -> None:
    """What a crash leaves: the segment unsealed, no close-time snapshots, the fd released."""
    store._stop_worker()
    if store._fd >= 0:
        os.close(store._fd)
    store._forget_fd()
    store._unlock()  # the kernel drops a dead process's flock
    store._closed = True
    store._appending = False


def left_behind(store: Store, *, close: bool = False) -> Path:
    """``store`` crashed (its segment unsealed; or, with ``close``, closed cleanly: sealed):
    its first segment, for a test to alter."""
    if close:
        store.close_blocking()
    else:
        abandon(store)
    return store.layout.root / "wal" / "0000000001.seg"


def crashed_with_run_a(root: Path, records: int, *, close: bool = False) -> Path:
    """A store that wrote ``records`` of RUN-A into segment 1 and crashed (or closed):
    ``left_behind``."""
    store = open_store(root)
    for record in walk("RUN-A", records, 1):
        store.append("RUN-A", record)
    store.sync_blocking()
    return left_behind(store, close=close)


def frames_end(segment: Path) -> int:
    """Where a segment's frames end: its size, less the zeros a format-2 writer
    preallocated after them (a crashed host's segment ends in up to a MiB of those)."""
    scan = scan_segment(segment.name, 0, segment.read_bytes())
    return scan.size - scan.unused


def write_after_frames(segment: Path, data: bytes, *, end: bool = False) -> int:
    """Put ``data`` where a segment's frames end (over the zeros preallocated there, as a
    writer or a write cut short would): the offset it starts at. ``end``: the file ends
    with ``data``, as a writer leaves a segment it seals (it cuts its zeros off first)."""
    at = frames_end(segment)
    with open(segment, "r+b") as fh:
        fh.seek(at)
        fh.write(data)
        if end:
            fh.truncate(at + len(data))
    return at


def flip(path: Path, offset: int) -> None:
    """Damage ``path``: the byte at ``offset`` XORed with 0x5A."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


def frames_of(segment: Path, run_id: str) -> list[Frame]:
    """The valid record frames of ``run_id`` in one segment file, in order."""
    scan = scan_segment(segment.name, 0, segment.read_bytes())
    return [f for f in scan.frames if f.kind == KIND_RECORD and f.run_id == run_id]


def run_child(root: Path, script: str, fault: str | None = None,
              timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (with ``root`` bound) in a fresh interpreter, optionally under a fault."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("INTLOOM_FAULT", None)
    if fault:
        env["INTLOOM_FAULT"] = fault
    prelude = textwrap.dedent(f"""
        from pathlib import Path
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from tests.unit.test_store_support import walk, open_store, header
        root = Path({str(root)!r})
    """)
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(script)],
                          env=env, capture_output=True, text=True, timeout=timeout)


def by_id(journals: list) -> dict:  # type: ignore[type-arg]
    return {j.run_id: j for j in journals}


def went_on_after_a_failed_write(root: Path, first: list[Record], rest: list[Record]) -> int:
    """A host (INST-2) flushes RUN-A's ``first`` records, then RUN-X's header in a flush
    that fails (so it goes on in a replacement segment, whose first frame voids that
    batch), then RUN-A's ``rest``; then it is killed. Returns the replacement's number."""
    store = open_store(root, instance_id="INST-2", faults=FaultPlan(fail_sync=frozenset({2})))
    for record in first:
        store.append("RUN-A", record)
    store.sync_blocking()  # flush 1
    store.append("RUN-X", header("RUN-X"))
    with pytest.raises(CheckpointFailed):
        store.sync_blocking("RUN-X")  # flush 2 fails
    for record in rest:
        store.append("RUN-A", record)
    store.sync_blocking()
    replacement = store._number
    abandon(store)
    return replacement


# --------------------------------------------------------------------------- helper checks


def test_walk_is_legal_and_exact_length() -> None:
    for seed in range(20):
        records = walk("RUN-x", 200, seed)
        assert len(records) == 200
        state = fold(records)
        assert state is not None and state.seq == 200


def test_walk_can_end_terminal() -> None:
    records = walk("RUN-x", 30, 1, terminal=True)
    state = fold(records)
    assert state is not None and state.phase == "terminal" and state.cursor != Cursor("")
