"""The same kill under intloom, DBOS and LangGraph: how often did the in-flight effect run?

Each framework runs a workflow of ``STEPS`` sequential Steps; Step k appends
``step-k pid=... t=...`` to ``side.txt`` when it starts (through ``ctx.effect`` in intloom),
and Step ``SLOW`` then sleeps. The parent polls ``side.txt`` and SIGKILLs the process as soon
as ``step-SLOW`` appears, then recovers with the framework's own mechanism, then recovers a
second time to check that nothing more runs:

* intloom: ``intloom recover`` (removes the dead host's service files), ``intloom start``;
  the Run is reported by ``intloom runs --json``. Second time: ``stop`` then ``start``.
* DBOS: a new process with the same config and code calls ``DBOS.launch()``, which recovers
  PENDING workflows, then waits on ``DBOS.retrieve_workflow(id)``. Second time: the same.
* LangGraph: a new process compiles the same graph on the same SqliteSaver file and calls
  ``app.invoke(None, thread)``. Second time: the same.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Final

from scripts.bench_common import bench_env, note, project, rnd, scratch, wait_gone

STEPS: Final = 10
SLOW: Final = 6
PEER_SLEEP: Final = 2.0  # how long the peers' Step 6 sleeps, in the killed run and after
CHILD: Final = Path(__file__).resolve().parent / "bench_crash_child.py"


def read_side(path: Path) -> list[tuple[int, int]]:
    """(step, pid) per line of the side-effect file."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        step, pid, _ = line.split()
        out.append((int(step.split("-")[1]), int(pid.split("=")[1])))
    return out


def _await_step(side: Path, pid_alive: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not any(k == SLOW for k, _ in read_side(side)):
        if time.monotonic() > deadline or not pid_alive():
            raise RuntimeError(f"step-{SLOW} never started (see {side})")
        time.sleep(0.002)  # a poll interval: the parent watches the file like a person would


def _tally(side: Path) -> dict[str, Any]:
    lines = read_side(side)
    counts = {str(k): sum(1 for s, _ in lines if s == k) for k in range(1, STEPS + 1)}
    pids: list[int] = []
    for _, pid in lines:
        if pid not in pids:
            pids.append(pid)
    return {
        "executions": counts,
        "in_flight_step_ran": counts[str(SLOW)],
        "by_process": {f"process {i + 1}": [s for s, p in lines if p == pid]
                       for i, pid in enumerate(pids)},
    }


def crash_intloom(base: Path) -> dict[str, Any]:
    side = base / "intloom-side.txt"
    with project(base, "intloom") as host:
        host.start()
        intent = json.dumps({"path": str(side), "steps": STEPS, "slow": SLOW})
        _, created = host.cli("flow", "side", "--intent", intent, "--detach")
        run_id = created["run"]["runId"]
        pid = host.pid()
        _await_step(side, lambda: os.path.exists(f"/proc/{pid}"))
        os.kill(pid, signal.SIGKILL)
        wait_gone(pid)
        started = time.perf_counter()
        host.cli("recover")
        host.start()
        recovered_s = time.perf_counter() - started
        _, runs = host.cli("runs")
        (run,) = [r for r in runs["runs"] if r["runId"] == run_id]
        lines_after_first = len(read_side(side))
        host.stop()
        host.start()  # a second restart: is anything run again?
        _, again = host.cli("runs")
        host.stop()
    (second,) = [r for r in again["runs"] if r["runId"] == run_id]
    error = run.get("lastError") or {}
    return {
        **_tally(side),
        "status_after_recovery": f"{run['status']}/{error.get('code', '-')}",
        "message": error.get("message", ""),
        "second_restart": f"{second['status']}/{(second.get('lastError') or {}).get('code')}",
        "lines_after_first_recovery": lines_after_first,
        "lines_after_second_restart": len(read_side(side)),
        "recovery_s": rnd(recovered_s, 2),
        "recovery_is": "intloom recover + intloom start (restore by the restart table)",
    }


def _peer(framework: str, base: Path) -> dict[str, Any]:
    from scripts.bench_peers import ensure_peer_venv

    python = ensure_peer_venv()
    where = base / framework
    where.mkdir()
    side = where / "side.txt"

    def spawn(mode: str) -> subprocess.Popen[bytes]:
        with open(where / f"{mode}.err", "ab") as err:  # the child has its own copy
            return subprocess.Popen(
                [str(python), str(CHILD), framework, mode, str(STEPS), str(SLOW),
                 str(PEER_SLEEP), str(where)],
                stdout=subprocess.DEVNULL, stderr=err, env=bench_env(), cwd=where)

    def finish(child: subprocess.Popen[bytes]) -> None:
        try:
            child.wait(timeout=300)
        except subprocess.TimeoutExpired:
            child.kill()  # never left running behind the benchmark
            child.wait()
            raise

    proc = spawn("run")
    try:
        _await_step(side, lambda: proc.poll() is None)
    finally:
        proc.kill()
        proc.wait()
    started = time.perf_counter()
    first = spawn("recover")
    finish(first)
    recovered_s = time.perf_counter() - started
    lines_after_first = len(read_side(side))
    report = json.loads((where / "recover.json").read_text())
    second = spawn("recover")
    finish(second)
    return {
        **_tally(side),
        "status_after_recovery": report["status"],
        "second_restart": "ran nothing more" if len(read_side(side)) == lines_after_first
        else "ran again",
        "lines_after_first_recovery": lines_after_first,
        "lines_after_second_restart": len(read_side(side)),
        "recovery_s": rnd(recovered_s, 2),
        "step_sleep_s": PEER_SLEEP,
        "recovery_is": report["mechanism"],
        "versions": report["versions"],
        "exit_codes": {"killed": proc.returncode, "recover": first.returncode,
                       "second": second.returncode},
    }


def bench_crash(args: Any) -> dict[str, Any]:
    chosen = args.only.split(",") if args.only else ["intloom", "dbos", "langgraph"]
    out: dict[str, Any] = {"figure": "crash", "steps": STEPS, "killed_during_step": SLOW,
                           "target": "intloom runs the in-flight effect once (RUN_INTERRUPTED)",
                           "frameworks": {}}
    with scratch(args.dir, "bench-crash-") as base:
        for framework in chosen:
            note(f"crash: {framework}")
            if framework == "intloom":
                out["frameworks"][framework] = crash_intloom(base)
            else:
                out["frameworks"][framework] = _peer(framework, base)
    ours = out["frameworks"].get("intloom")
    if ours is not None:
        ok = ours["in_flight_step_ran"] == 1 and ours["status_after_recovery"].endswith(
            "RUN_INTERRUPTED") and ours["lines_after_second_restart"] == ours[
            "lines_after_first_recovery"]
        out["times_in_flight_effect_ran"] = {k: v["in_flight_step_ran"]
                                             for k, v in out["frameworks"].items()}
        out["verdict"] = "met" if ok else "not met"
    return out
