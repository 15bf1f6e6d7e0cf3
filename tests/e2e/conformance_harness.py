"""The restart-conformance harness: one crash point (or stop point) through the real host.

A *point* is one way the host can end while it runs the ``reference`` Workflow
(``fixtures/projects/conformance``): ``INTLOOM_FAULT`` (docs/format.md, "Testing hooks"),
passed in the environment of ``intloom start``, makes the host's store SIGKILL the host at
its N-th flush (``crash_after_sync``, ``crash_before_sync``, ``torn_write``) or send itself
SIGTERM right after it (``stop_after_sync``: the host's ordinary graceful stop begins there,
and the Run stops at the next boundary it reaches). A ``crash_before_sync`` point may also
cut the last records of the unsynced batch off the segment: every prefix of a batch that a
torn write can leave. A plan chains points:
the host that continues after a restart can be ended too. The Run is driven with the real
CLI (``flow``, ``answer``) and, for its client Agent task, the Python client
(``claim_agent_call``, ``call_tool``, ``complete_agent_call``).

After the host is gone: ``status``, ``recover``, ``doctor --json`` (the restart preview),
``start`` (the restore summary), ``runs``, then the Run is driven to its end where the table
allows. Every check that fails is a *violation* (a string), collected rather than raised, so
the sweep script can print totals; tests assert that there are none.

    python -m tests.e2e.conformance_harness [--stride K] [--modes a,b] [--jobs J] [--keep]

runs the exhaustive sweep (``scripts/crash-sweep``) and prints the totals as JSON.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import msgspec

from intloom.client.client import Client
from intloom.diagnostics import diagnose
from intloom.errors import IntloomError
from intloom.store import read_history, verify
from tests.helpers import FIXTURES, CliResult, Project, counters, eventually, pid_alive

FIXTURE: Final = FIXTURES / "projects" / "conformance"
WORKFLOW: Final = "reference"
CRASH_MODES: Final = ("crash_after_sync", "crash_before_sync", "torn_write")
STOP_MODE: Final = "stop_after_sync"
MODES: Final = (*CRASH_MODES, STOP_MODE)
# Flushes (durable batches) one uninterrupted Run of ``reference`` makes, and the Run's
# continuation after a restart restored its first wait. Guesses only: they follow the
# executor's batching, and every sweep measures them (``find_last``) before it relies on them.
FLUSHES_GUESS: Final = 28
CONTINUATION_GUESS: Final = 19
# Everything one Run of ``reference`` executes when nothing interrupts it; recover entries
# are extra and run at most once, only after a restart.
FULL_RUN: Final = frozenset({
    "init:prepare", "step:fetch", "effect:download", "step:summarize", "effect:model-call",
    "step:approve", "step:questions", "step:signoff", "step:clarify", "step:delegate",
    "tool:lookup", "step:post", "effect:post-message",
})
RECOVERS: Final = frozenset({"recover:approve", "recover:questions"})
# restart-table row (doctor's preview) -> the list of start's restore summary it lands in
SUMMARY_OF_ROW: Final = {
    "resume": "resumed", "route": "resumed", "recover": "resumed",
    "restore_wait": "waiting", "interrupted": "interrupted",
    "needs_attention": "needsAttention",
}
# Codes a CLI call may fail with when the host died or stopped under it.
HOST_GONE_CODES: Final = frozenset({
    "PROJECT_REQUEST_FAILED", "CLI_SERVICE_OFFLINE", "CLI_SERVICE_UNAVAILABLE",
    "CLI_SERVICE_CLOSING", "PROJECT_CONNECTION_FAILED", "EXECUTION_OWNERSHIP_LOST",
})


# ----- small helpers -------------------------------------------------------------------------


def new_project(parent: Path, name: str) -> Project:
    root = parent / name
    shutil.copytree(FIXTURE, root)
    return Project(root=root)


def doc(result: CliResult) -> Any:
    """The JSON document of a ``--json`` call, or None when stdout holds none."""
    try:
        return result.json
    except ValueError:
        return None


def error_code(result: CliResult) -> str | None:
    data = doc(result)
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        return str(data["error"].get("code"))
    return None




def wait_killed(project: Project, pid: int) -> None:
    """Until a SIGKILLed host has let go of its lock and port (recover needs both)."""
    project.wait_released(pid)
    assert diagnose(project.root, probe=False).status == "recovery_required"


def wait_stopped(project: Project, pid: int) -> None:
    """Until a gracefully stopping host has exited and removed its own files."""
    eventually(
        lambda: not pid_alive(pid) and not (project.state / "service.json").exists()
        and not (project.state / "service.lock").exists(),
        timeout=20, what=f"host {pid} to stop",
    )


def answer_for(action: dict[str, Any]) -> Any:
    """The answer the drive gives: confirm, or answer every question (skip the skippable)."""
    if action["kind"] == "user_ask_confirmation":
        return {"isConfirmed": True}
    out: list[dict[str, Any]] = []
    for question in action["request"]:
        if question.get("isSkippable"):
            out.append({"questionId": question["id"], "isSkipped": True})
        else:
            out.append({"questionId": question["id"], "isSkipped": False, "answer": "yes"})
    return out


# ----- acknowledgements ----------------------------------------------------------------------


@dataclass
class Acks:
    """What the CLI or the client was told, each of which must be on disk afterwards."""

    created: set[str] = field(default_factory=set)  # run ids a reply named
    waiting: list[tuple[str, str]] = field(default_factory=list)  # (run, action) shown
    answered: list[tuple[str, str]] = field(default_factory=list)  # (run, action) accepted
    claimed: list[tuple[str, str]] = field(default_factory=list)  # (run, call id)
    completed_calls: list[tuple[str, str]] = field(default_factory=list)  # (run, call id)
    ended: dict[str, str] = field(default_factory=dict)  # run -> completed, reported so
    views: dict[str, dict[str, Any]] = field(default_factory=dict)  # last waiting view per Run
    # Set at each restart: the counters before it, and the row each Run was restored by.
    before: dict[str, collections.Counter[str]] = field(default_factory=dict)
    rows: dict[str, str] = field(default_factory=dict)

    def saw(self, view: dict[str, Any]) -> None:
        run_id = view["runId"]
        self.created.add(run_id)
        action = view.get("pendingAction")
        if view["status"] == "waiting" and action is not None:
            self.waiting.append((run_id, action["id"]))
            self.views[run_id] = view
        if view["status"] == "completed":
            self.ended[run_id] = "completed"


def check_acks(runtime: Path, acks: Acks) -> list[str]:
    """Every acknowledged fact is a valid record on disk."""
    problems: list[str] = []
    for run_id in sorted(acks.created):
        records = [e for e in read_history(runtime, run_id) if e.verdict in ("ok", "snapshot")]
        if not records:
            problems.append(f"{run_id}: a reply named it but no valid record of it is on disk")
            continue
        phases = [(e.phase, e.record) for e in records if e.record is not None]

        def has(phase: str, pred: Any, phases: list[tuple[str | None, Any]] = phases) -> bool:
            return any(p == phase and pred(r) for p, r in phases)

        for rid, action_id in acks.waiting:
            if rid == run_id and not has(
                "waiting", lambda r, a=action_id: r.action is not None and r.action.id == a
            ) and not _summarised(records):
                problems.append(f"{run_id}: waiting on {action_id} was shown but is not on disk")
        for rid, action_id in acks.answered:
            if rid == run_id and not has("answered", lambda r, a=action_id: r.action_id == a) \
                    and not _summarised(records):
                problems.append(f"{run_id}: the answer to {action_id} was accepted but is not "
                                "on disk")
        for rid, call_id in acks.claimed:
            if rid == run_id and not has(
                "waiting", lambda r, c=call_id: r.agent_call is not None
                and r.agent_call.id == c and r.agent_call.phase == "claimed"
            ) and not _summarised(records):
                problems.append(f"{run_id}: the claim of {call_id} was acknowledged but is not "
                                "on disk")
        for rid, call_id in acks.completed_calls:
            if rid == run_id and not has(
                "step_result", lambda r: r.step == "delegate"
            ) and not _summarised(records):
                problems.append(f"{run_id}: Agent task {call_id} was completed but its outcome "
                                "is not on disk")
        if acks.ended.get(run_id) == "completed" and not has(
            "terminal", lambda r: r.status == "completed"
        ):
            problems.append(f"{run_id}: reported completed but no terminal record is on disk")
    return problems


def _summarised(records: list[Any]) -> bool:
    # Compacted history is only a snapshot; the sweep never compacts before it checks, so
    # this is a guard against false alarms, not a loophole.
    return any(e.verdict == "snapshot" for e in records)


# ----- driving a Run -------------------------------------------------------------------------


class HostGone(Exception):
    """A request failed because the host died or stopped under it."""


def _cli_view(project: Project, result: CliResult) -> dict[str, Any]:
    data = doc(result)
    if isinstance(data, dict) and isinstance(run := data.get("run"), dict):
        return run
    code = error_code(result)
    if code in HOST_GONE_CODES:
        raise HostGone(code)
    raise AssertionError(f"unexpected CLI result {result.code}: {result.stdout}{result.stderr}")


def drive(project: Project, view: dict[str, Any], acks: Acks) -> dict[str, Any]:
    """Answer every wait and do every Agent task until the Run is completed or failed.

    Raises HostGone when the host dies or stops under a request.
    """
    run_id = view["runId"]
    for _ in range(40):
        status = view["status"]
        if status in ("completed", "failed"):
            return view
        if status == "running":
            view = _client(project, lambda c: c.wait_run(run_id))
        elif view.get("pendingAction"):
            action = view["pendingAction"]
            result = project.cli("answer", run_id, action["id"], json.dumps(answer_for(action)),
                                 "--json")
            view = _cli_view(project, result)
            if view["status"] != "failed":  # a failed view (e.g. a stop under it) acks nothing
                acks.answered.append((run_id, action["id"]))
        elif view.get("pendingAgentCall"):
            view = agent(project, view, acks)
        else:
            raise AssertionError(f"a waiting Run with nothing to answer: {view}")
        acks.saw(view)
    raise AssertionError(f"Run {run_id} did not end after 40 steps: {view}")


def _client(project: Project, call: Any) -> dict[str, Any]:
    try:
        with Client.connect(project.root, timeout=5.0, request_timeout=30.0) as client:
            view = call(client)
    except IntloomError as exc:
        if exc.code in HOST_GONE_CODES:
            raise HostGone(exc.code) from None
        raise
    data: dict[str, Any] = msgspec.to_builtins(view)
    return data


def agent(project: Project, view: dict[str, Any], acks: Acks) -> dict[str, Any]:
    """Be the client Agent: claim, call the Tool twice with one id (a receipt), complete."""
    run_id = view["runId"]
    call_id = view["pendingAgentCall"]["id"]
    try:
        with Client.connect(project.root, timeout=5.0, request_timeout=30.0) as client:
            token, claimed = client.claim_agent_call(run_id, call_id, "claim-1")
            assert claimed.phase == "claimed"
            acks.claimed.append((run_id, call_id))
            tool_input = {"runId": run_id, "q": "x"}
            first = client.call_tool(run_id, call_id, token, "tool-1", "lookup", tool_input)
            again = client.call_tool(run_id, call_id, token, "tool-1", "lookup", tool_input)
            if first != ({"found": "x"}, False) or again != ({"found": "x"}, True):
                raise AssertionError(f"Tool receipt broken: {first} then {again}")
            done = client.complete_agent_call(run_id, call_id, token, "done", {"ok": True})
    except IntloomError as exc:
        if exc.code in HOST_GONE_CODES:
            raise HostGone(exc.code) from None
        raise
    out: dict[str, Any] = msgspec.to_builtins(done)
    if out["status"] != "failed":
        acks.completed_calls.append((run_id, call_id))
    return out


# ----- one point -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """How one host ends: ``mode`` at its ``n``-th flush.

    With ``cut`` (crash_before_sync only), the last ``cut`` records of the batch that was
    written but not synced are then cut off the segment, as a torn write that kept exactly a
    prefix of the batch would leave it. Any cut within that batch is a state a real crash can
    leave; ``cut=1`` is always within it.
    """

    mode: str
    n: int
    cut: int | None = None

    def __str__(self) -> str:
        return f"{self.mode}={self.n}" + ("" if self.cut is None else f"/cut{self.cut}")


@dataclass
class PointResult:
    plan: tuple[Fault, ...]
    fired: bool = True  # False: the Run ended before a fault's flush (beyond the last point)
    rows: list[str] = field(default_factory=list)  # the row doctor previewed at each restart
    reasons: list[str] = field(default_factory=list)  # and why, in doctor's words
    final: str | None = None  # the Run's end after the last restart
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0
    records: int = 0  # valid records of the Run on disk when the last faulted host ended
    compared: int = 0  # restored waits found equal to the view shown before the host ended

    @property
    def kind(self) -> str:
        last = self.plan[-1]
        if last.cut is not None:
            return "cut"
        return "stop" if last.mode == STOP_MODE else "crash"

    def __str__(self) -> str:
        return " then ".join(str(f) for f in self.plan)


def run_point(parent: Path, plan: tuple[Fault, ...]) -> PointResult:
    """Run ``reference`` under hosts that end as ``plan`` says; check every invariant."""
    began = time.monotonic()
    name = "_".join(str(f) for f in plan).replace("=", "-").replace("/", "-")
    project = new_project(parent, name)
    res = PointResult(plan)
    try:
        _point(project, res)
    except (AssertionError, IntloomError, OSError, ValueError, KeyError) as exc:
        res.violations.append(f"harness stopped: {type(exc).__name__}: {exc}")
    finally:
        project.track_host()
        project.reap()
    res.seconds = time.monotonic() - began
    if not res.violations:
        shutil.rmtree(project.root, ignore_errors=True)  # keep failing ones as evidence
    return res


def _start(project: Project, fault: Fault | None = None) -> dict[str, Any]:
    env = {"INTLOOM_FAULT": f"{fault.mode}={fault.n}"} if fault is not None else None
    started = project.cli("start", "--json", env=env)
    if started.code != 0:
        raise AssertionError(f"start failed: {started.stdout}{started.stderr}")
    service: dict[str, Any] = started.json["service"]
    return service


def _point(project: Project, res: PointResult) -> None:
    bad = res.violations
    acks = Acks()
    service = _start(project, res.plan[0])
    view: dict[str, Any] | None = None
    with contextlib.suppress(HostGone):
        flowed = project.cli("flow", WORKFLOW, "--intent", str(res), "--json")
        view = _cli_view(project, flowed)
        acks.saw(view)
        view = drive(project, view, acks)
    for index, fault in enumerate(res.plan):
        pid = int(service["pid"])
        if view is not None and view["status"] in ("completed", "failed") and pid_alive(pid) \
                and not (fault.mode == STOP_MODE and _stopping(project)):
            res.fired = False  # the Run ended before the fault's flush
            if view["status"] != "completed":
                bad.append(f"the Run failed with no fault fired: {view.get('lastError')}")
            project.cli("stop", "--json")
            return
        if fault.mode == STOP_MODE:
            wait_stopped(project, pid)
        else:
            wait_killed(project, pid)
        runtime = project.state / "runtime"
        res.records = valid_records(runtime, acks)
        if fault.cut is not None:
            _cut(runtime, fault, acks)
        bad.extend(check_acks(runtime, acks))
        bad.extend(check_history(runtime, acks, torn_ok=fault.mode == "torn_write"))
        nxt = res.plan[index + 1] if index + 1 < len(res.plan) else None
        service, view = _restart(project, res, fault, nxt, acks)
    if view is not None:
        res.final = _finish(project, view, res, acks)
    stopped = project.cli("stop", "--json")
    if stopped.code != 0:
        bad.append(f"stop after the drive failed: {stopped.stdout}")


def _restart(project: Project, res: PointResult, fault: Fault, nxt: Fault | None,
             acks: Acks) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """status, recover, doctor's preview, start (with the next fault), the restored views;
    then drive the restored Run until the next fault fires or, with none, not at all."""
    bad = res.violations
    status = project.cli("status", "--json").json
    expected_status = "offline" if fault.mode == STOP_MODE else "recovery_required"
    if status.get("status") != expected_status:
        bad.append(f"after {fault}: status is {status.get('status')}, not {expected_status}")
    recovered = project.cli("recover", "--json")
    if recovered.code != 0 or recovered.json["recovered"] != (fault.mode != STOP_MODE):
        bad.append(f"after {fault}: recover said {recovered.stdout}{recovered.stderr}")

    doctor = project.cli("doctor", "--json").json
    previews = {p["runId"]: p for p in doctor.get("runs", [])}
    run_ids = set(previews) | acks.created
    acks.created |= set(previews)  # a Run created before the reply was lost
    if not run_ids:
        res.rows.append("none")  # no Run was ever durable: nothing to restore
        res.reasons.append("")
    acks.before = counters(project.root)
    service = _start(project, nxt)
    restore = service.get("restore") or {}
    for run_id in sorted(run_ids):
        preview = previews.get(run_id)
        expected = SUMMARY_OF_ROW[preview["verdict"]["row"]] if preview else None
        res.rows.append(preview["verdict"]["row"] if preview else "none")
        res.reasons.append(preview["verdict"]["reason"] if preview else "")
        landed = [k for k in ("resumed", "waiting", "interrupted", "needsAttention")
                  if run_id in restore.get(k, [])]
        if landed != ([expected] if expected else []):
            bad.append(f"after {fault}: {run_id}: doctor previewed {expected or 'nothing'}, "
                       f"start did {landed}")
        if preview is not None and preview["journal"] != "verified":
            bad.append(f"after {fault}: {run_id}: journal {preview['journal']}: "
                       f"{preview.get('problem')}")
    listed = {r["runId"]: r for r in project.cli("runs", "--json").json["runs"]}
    view: dict[str, Any] | None = None
    for run_id in sorted(run_ids):
        preview = previews.get(run_id)
        found = listed.get(run_id)
        problems = _check_restored(run_id, preview, found, acks)
        bad.extend(f"after {fault}: {v}" for v in problems)
        shown = acks.views.get(run_id)
        if not problems and found is not None and shown is not None and \
                (found.get("pendingAction") or {}).get("id") == shown["pendingAction"]["id"]:
            res.compared += 1
        if preview is not None and found is not None:
            acks.rows[run_id] = preview["verdict"]["row"]
            view = found
    if nxt is not None and view is not None:
        with contextlib.suppress(HostGone):
            view = drive(project, view, acks)
    return service, view


def _cut(runtime: Path, fault: Fault, acks: Acks) -> None:
    """Cut the last ``fault.cut`` records of the crashed host's unsynced batch off its segment."""
    assert fault.mode == "crash_before_sync" and fault.cut is not None
    run_ids = acks.created or {j.run_id for j in verify(runtime)}
    if len(run_ids) != 1:
        raise AssertionError(f"{fault}: expected one Run to cut, found {sorted(run_ids)}")
    (run_id,) = run_ids
    entries = [e for e in read_history(runtime, run_id) if e.verdict == "ok"]
    drop = entries[-fault.cut]
    if any(e.file != drop.file for e in entries[-fault.cut:]):
        raise AssertionError(f"{fault}: the records to cut span segments")
    with open(runtime / drop.file, "r+b") as fh:
        fh.truncate(drop.offset)


def valid_records(runtime: Path, acks: Acks) -> int:
    run_ids = acks.created or {j.run_id for j in verify(runtime)}
    return sum(1 for run_id in run_ids for e in read_history(runtime, run_id)
               if e.verdict == "ok")


def check_history(runtime: Path, acks: Acks, *, torn_ok: bool) -> list[str]:
    """What ``inspect`` shows is sound: no damaged, out-of-order or illegal record."""
    bad: list[str] = []
    allowed = {"ok", "snapshot", "void"} | ({"torn"} if torn_ok else set())
    for run_id in sorted(acks.created):
        for e in read_history(runtime, run_id):
            if e.verdict not in allowed:
                bad.append(f"{run_id}: inspect shows record {e.seq} at {e.file}:{e.offset} as "
                           f"{e.verdict} ({e.problem})")
    return bad


def _stopping(project: Project) -> bool:
    """After a stop point at the last flush the reply may beat the stop: is one under way?

    The store sends the SIGTERM right after the flush, but the host handles it on a later
    turn of its event loop, possibly after the reply went out: give it a moment to say so.
    """
    def logged() -> bool:
        logs = sorted((project.state / "logs").glob("LOG-*.jsonl"))
        return bool(logs) and '"event":"signal_received"' in logs[-1].read_text()

    try:
        eventually(logged, timeout=2.0, what="the host to log the signal")
    except AssertionError:
        return False
    return True


def _check_restored(run_id: str, preview: dict[str, Any] | None, view: dict[str, Any] | None,
                    acks: Acks) -> list[str]:
    bad: list[str] = []
    if preview is None:
        # Never durable (its first write was torn) or terminal: never loaded into runs.
        if view is not None:
            bad.append(f"{run_id}: not restorable, yet runs lists it: {view}")
        return bad
    if view is None:
        bad.append(f"{run_id}: doctor previewed {preview['verdict']['row']} but runs omits it")
        return bad
    row = preview["verdict"]["row"]
    if row == "interrupted":
        err = view.get("lastError") or {}
        if view["status"] != "failed" or err.get("code") != "RUN_INTERRUPTED":
            bad.append(f"{run_id}: row interrupted but the view is {view['status']}/{err}")
        effect = preview["verdict"].get("effect")
        if effect and effect["name"] not in err.get("message", ""):
            bad.append(f"{run_id}: the interruption does not name effect {effect['name']}: "
                       f"{err.get('message')}")
        if preview["phase"] == "effect_started" and not effect:
            bad.append(f"{run_id}: an effect was in flight but the preview names none")
    elif row == "restore_wait":
        action = view.get("pendingAction") or {}
        if view["status"] != "waiting" or action.get("id") not in preview["verdict"]["reason"]:
            bad.append(f"{run_id}: row restore_wait but the view is {view}")
        shown = acks.views.get(run_id)
        if shown is not None and shown["pendingAction"]["id"] == action.get("id") and \
                _comparable(shown) != _comparable(view):
            bad.append(f"{run_id}: the restored wait differs from the one shown before:\n"
                       f"  before {shown}\n  after  {view}")
    elif view["status"] == "failed":
        bad.append(f"{run_id}: row {row} but the Run failed: {view.get('lastError')}")
    return bad


def _comparable(view: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in view.items() if k != "phase"}


def _finish(project: Project, view: dict[str, Any], res: PointResult, acks: Acks) -> str:
    """Drive the restored Run to its end and check the counters kept outside the journal."""
    bad = res.violations
    run_id = view["runId"]
    row = acks.rows.get(run_id, "")
    try:
        final = drive(project, view, acks)
    except HostGone as exc:
        bad.append(f"{run_id}: the host went away while the restored Run was driven ({exc})")
        return "lost"
    bad.extend(check_acks(project.state / "runtime", acks))
    bad.extend(check_history(project.state / "runtime", acks, torn_ok=True))
    after = counters(project.root)[run_id]
    twice = {label: c for label, c in after.items() if c > 1}
    if twice:
        bad.append(f"{run_id}: ran twice: {twice}")
    before = acks.before.get(run_id, collections.Counter())
    if row == "interrupted":
        if final["status"] != "failed":
            bad.append(f"{run_id}: interrupted Run ended {final['status']}")
        if after != before:
            bad.append(f"{run_id}: an interrupted Run ran code after the restart: "
                       f"{dict(before)} -> {dict(after)}")
    else:
        if final["status"] != "completed":
            bad.append(f"{run_id}: row {row} but the Run ended {final['status']}: "
                       f"{final.get('lastError')}")
        missing = FULL_RUN - set(after)
        extra = set(after) - FULL_RUN - RECOVERS
        if missing or extra:
            bad.append(f"{run_id}: completed with missing {sorted(missing)} / unexpected "
                       f"{sorted(extra)}")
    return str(final["status"])


# ----- sweeps --------------------------------------------------------------------------------

Plan = tuple[Fault, ...]
# The first host stops (crash_after_sync) with the Run waiting on approve's confirmation; a
# second host is then swept while it continues through recover to the end.
RESTORED_WAIT: Final = Fault("crash_after_sync", 10)


def run_all(parent: Path, plans: list[Plan], jobs: int = 1,
            echo: bool = False) -> list[PointResult]:
    results: list[PointResult] = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for result in pool.map(lambda plan: run_point(parent, plan), plans):
            results.append(result)
            if echo:
                print_point(result)
    return results


def print_point(result: PointResult) -> None:
    mark = "ok" if not result.violations else f"{len(result.violations)} VIOLATION(S)"
    if not result.fired:
        mark = "nothing fired: past the last flush"
    print(f"{result}: rows {result.rows} -> {result.final} ({result.seconds:.1f}s) {mark}",
          file=sys.stderr, flush=True)
    for v in result.violations:
        print(f"    {v}", file=sys.stderr, flush=True)


def find_last(parent: Path, head: Plan, guess: int, jobs: int = 2,
              echo: bool = False) -> tuple[int, list[PointResult]]:
    """How many flushes the host after ``head`` makes for the Run: crash_after_sync at
    ``guess`` must fire and at ``guess + 1`` must not; otherwise search. Probes are points."""
    done: list[PointResult] = []
    fired: dict[int, bool] = {}

    def probe(ns: list[int]) -> None:
        todo = [n for n in ns if n not in fired]
        for r in run_all(parent, [(*head, Fault("crash_after_sync", n)) for n in todo], jobs,
                         echo):
            fired[r.plan[-1].n] = r.fired
            done.append(r)

    probe([guess, guess + 1])
    while True:
        lo = max((n for n, f in fired.items() if f), default=0)
        hi = min((n for n, f in fired.items() if not f), default=None)
        if hi is not None and hi <= lo:
            raise AssertionError(f"flush counts are not deterministic: {sorted(fired.items())}")
        if hi == lo + 1:
            return lo, done
        if hi is None and lo >= 400:
            raise AssertionError("the Run never stops flushing")
        probe([lo * 2 if hi is None else (lo + hi) // 2])


def with_modes(head: Plan, last: int, modes: tuple[str, ...]) -> list[Plan]:
    """Every flush 1..last in every mode, then one past the last."""
    return [(*head, Fault(m, n)) for n in range(1, last + 2) for m in modes]


def cut_plans(head: Plan, results: list[PointResult], last: int) -> list[Plan]:
    """Every record boundary inside every batch, from the record counts crash_after_sync
    found on disk after each flush (a batch is what flush n added to flush n-1)."""
    after = {r.plan[-1].n: r.records for r in results
             if len(r.plan) == len(head) + 1 and r.plan[-1].mode == "crash_after_sync"
             and r.plan[-1].cut is None and r.fired}
    base = next((r.records for r in results if r.plan == head), None) if head else 0
    out: list[Plan] = []
    for n in range(1, last + 1):
        previous = after.get(n - 1, base) if n > 1 else base
        if previous is None or n not in after:
            continue
        out += [(*head, Fault("crash_before_sync", n, cut=d))
                for d in range(1, after[n] - previous)]
    return out


def sample(plans: list[Plan], stride: int, offset: int = 0) -> list[Plan]:
    """One flush in ``stride``, the modes rotating, so that ``stride`` offsets cover all."""
    by_n: dict[int, list[Plan]] = collections.defaultdict(list)
    for plan in plans:
        by_n[plan[-1].n].append(plan)
    chosen: list[Plan] = []
    for i, n in enumerate(sorted(by_n)[offset % stride::stride]):
        options = by_n[n]
        chosen.append(options[(i + offset) % len(options)])
    return chosen


@dataclass
class Totals:
    crash_points: int = 0
    stop_points: int = 0
    cut_points: int = 0
    beyond: int = 0
    compared: int = 0
    rows: collections.Counter[str] = field(default_factory=collections.Counter)
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @classmethod
    def of(cls, results: list[PointResult]) -> Totals:
        totals = cls()
        for result in results:
            totals.add(result)
        return totals

    def add(self, result: PointResult) -> None:
        self.seconds += result.seconds
        self.compared += result.compared
        self.violations.extend(f"{result}: {v}" for v in result.violations)
        if not result.fired:
            self.beyond += 1
            return
        kind = result.kind
        if kind == "stop":
            self.stop_points += 1
        elif kind == "cut":
            self.cut_points += 1
        else:
            self.crash_points += 1
        for row in result.rows[-1:]:
            self.rows[row] += 1

    def summary(self) -> dict[str, Any]:
        return {
            "crashPointsTried": self.crash_points,
            "tornPrefixPointsTried": self.cut_points,
            "stopsTried": self.stop_points,
            "pastTheLastFlush": self.beyond,
            "violations": len(self.violations),
            "restoredWaitsEqualToTheShownOne": self.compared,
            "rowsReached": dict(sorted(self.rows.items())),
            "pointSeconds": round(self.seconds, 1),
        }


def full_sweep(parent: Path, modes: tuple[str, ...], *, second: bool, jobs: int,
               stride: int = 1, offset: int = 0, echo: bool = True) -> dict[str, Any]:
    """Every point (or one in ``stride``): both hosts, every mode, every torn prefix."""
    results: list[PointResult] = []
    flushes: dict[str, int] = {}
    for head, guess in [((), FLUSHES_GUESS)] + ([((RESTORED_WAIT,), CONTINUATION_GUESS)]
                                                if second else []):
        if head and head not in {r.plan for r in results}:
            results += run_all(parent, [head], jobs, echo)  # its record count anchors cuts
        last, probes = find_last(parent, head, guess, jobs, echo)
        flushes["continuation" if head else "firstHost"] = last
        results += probes
        seen = {r.plan for r in results}
        plans = [p for p in with_modes(head, last, modes) if p not in seen]
        plans = sample(plans, stride, offset) if stride > 1 else plans
        results += run_all(parent, plans, jobs, echo)
        if "crash_before_sync" in modes:
            cuts = cut_plans(head, results, last)
            results += run_all(parent, sample(cuts, stride, offset) if stride > 1 else cuts,
                               jobs, echo)
    totals = Totals.of(results)
    for r in results:  # every point up to the last flush must have ended its host
        last = flushes["continuation" if len(r.plan) > 1 else "firstHost"]
        if not r.fired and r.plan[-1].n <= last:
            totals.violations.append(f"{r}: nothing fired although the Run makes {last} "
                                     "flushes")
    report = totals.summary()
    report["violations"] = len(totals.violations)
    report["flushes"] = flushes
    report["violationList"] = totals.violations
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/crash-sweep",
                                     description="The exhaustive restart-conformance sweep.")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma list of {', '.join(MODES)}")
    parser.add_argument("--stride", type=int, default=1,
                        help="run one flush in K (the modes rotate); 1 runs every point")
    parser.add_argument("--offset", type=int, default=0, help="which one of the K")
    parser.add_argument("--jobs", type=int, default=2, help="points run at the same time")
    parser.add_argument("--no-second-host", action="store_true",
                        help="skip the sweep of the host that continues a restored wait")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = parser.parse_args(argv)
    modes = tuple(m for m in args.modes.split(",") if m)
    unknown = set(modes) - set(MODES)
    if unknown or not modes:
        parser.error(f"unknown mode(s) {sorted(unknown)}")
    scratch = Path(tempfile.mkdtemp(prefix="intloom-crash-sweep-"))
    began = time.monotonic()
    try:
        report = full_sweep(scratch, modes, second=not args.no_second_host, jobs=args.jobs,
                            stride=args.stride, offset=args.offset)
        report["wallSeconds"] = round(time.monotonic() - began, 1)
        violations = report.pop("violationList")
        print(json.dumps(report, indent=2))
        for v in violations:
            print(f"VIOLATION {v}", file=sys.stderr)
        args.keep = args.keep or bool(violations)  # the failing points' projects are evidence
        return 0 if not violations else 1
    finally:
        if args.keep:
            print(f"scratch kept in {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())


# ----- damaged journals (verification tests and the mutation fuzz) ----------------------------


@dataclass(frozen=True)
class Baseline:
    """A crashed project's runtime directory with every kind of file a store holds.

    Host 1 completed ``done`` (a ``snap/done`` snapshot) and left ``kept`` waiting (a
    ``snap/live`` snapshot, its records in the sealed segment 1), then stopped cleanly. Host 2
    left ``ref`` (reference, waiting on approve) and ``late`` (side, waiting) in segment 2 and
    was SIGKILLed, so a restore reads segment 2 itself.
    """

    runtime: Path
    done: str
    kept: str
    ref: str
    late: str

    @property
    def waiting(self) -> set[str]:
        return {self.kept, self.ref, self.late}


def build_baseline(parent: Path) -> Baseline:
    project = new_project(parent, "baseline")
    try:
        def ok(result: CliResult) -> Any:
            assert result.code == 0, (result.stdout, result.stderr)
            return result.json

        ok(project.cli("start", "--json"))
        done = ok(project.cli("flow", "side", "--intent", "finished", "--json"))["run"]
        action = done["pendingAction"]["id"]
        ok(project.cli("answer", done["runId"], action, '{"isConfirmed": true}', "--json"))
        kept = ok(project.cli("flow", "side", "--intent", "kept", "--json"))["run"]["runId"]
        ok(project.cli("stop", "--json"))
        pid = ok(project.cli("start", "--json"))["service"]["pid"]
        ref = ok(project.cli("flow", "reference", "--intent", "ref", "--json"))["run"]["runId"]
        late = ok(project.cli("flow", "side", "--intent", "late", "--json"))["run"]["runId"]
        project.kill_host()
        wait_killed(project, pid)
    finally:
        project.track_host()
        project.reap()
    return Baseline(project.state / "runtime", done["runId"], kept, ref, late)


def project_with_runtime(parent: Path, name: str, runtime: Path) -> Project:
    """A fresh copy of the fixture whose ``.intloom/runtime`` is a copy of ``runtime``."""
    project = new_project(parent, name)
    project.state.mkdir(mode=0o700)
    shutil.copytree(runtime, project.state / "runtime")
    return project


def frames_of(runtime: Path, run_id: str, segment: str) -> list[Any]:
    """The valid records of ``run_id`` in ``segment`` (``wal/NNNNNNNNNN.seg``), in order."""
    return [e for e in read_history(runtime, run_id) if e.file == segment and e.verdict == "ok"]
