"""Real hosts: start to ready against history length and Run count, and resident memory.

Everything goes through the real CLI (``intloom start`` / ``stop``) and the real client;
journals are built by the real store, by a Run that loops through Steps. "Start to ready" is
the wall time of ``intloom start --json``, from spawn to exit: the CLI returns only once the
host has loaded Workflows, restored every Run and listens.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from scripts.bench_common import Host, judged, median, note, project, rnd, rss_mib, scratch


def _host_ms(host: Host) -> dict[str, float]:
    """Milliseconds inside the newest host log: log opened -> restore finished -> ready."""
    logs = sorted((host.root / ".intloom" / "logs").glob("LOG-*.jsonl"))
    stamps: dict[str, datetime] = {}
    for line in logs[-1].read_text().splitlines():
        event = json.loads(line)
        if event["event"] in ("log_opened", "restore_finished", "service_ready"):
            stamps[event["event"]] = datetime.fromisoformat(event["time"].replace("Z", "+00:00"))
    opened = stamps["log_opened"]
    return {
        "restore_ms": (stamps["restore_finished"] - opened).total_seconds() * 1e3,
        "ready_ms": (stamps["service_ready"] - opened).total_seconds() * 1e3,
    }


def _records_of(host: Host) -> int:
    """How many journal records the project's one unfinished Run has (offline read)."""
    from intloom.store import read_runs

    runs = read_runs(host.root / ".intloom" / "runtime")
    (run,) = [r for r in runs if r.state is not None]
    assert run.state is not None
    return run.state.seq


def _build_history(host: Host, records: int) -> int:
    """One Run of ~``records`` records, left waiting on its confirmation. Returns the count."""
    # header, stage_pending, step_ready; 3 per Step; then step_ready, executing, waiting.
    steps = max(1, (records - 6) // 3 + 1)
    host.start()
    with host.client() as client:
        view = client.create_run("loop", json.dumps({"target": steps}), wait=True)
    assert view.status == "waiting", view
    return steps


def _starts(hosts: list[tuple[str, Host, Path | None]], repeats: int,
            ready: Callable[[str, Host], None] | None = None) -> dict[str, Any]:
    """Interleaved ``intloom start`` / ``stop`` cycles; a saved runtime is put back first.
    ``ready(name, host)``, if given, looks at each started host (outside the timing)."""
    walls: dict[str, list[float]] = {name: [] for name, _, _ in hosts}
    inner: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in hosts}
    for _ in range(repeats):
        for name, host, saved in hosts:
            if saved is not None:
                runtime = host.root / ".intloom" / "runtime"
                shutil.rmtree(runtime)
                shutil.copytree(saved, runtime)
            walls[name].append(host.start())
            inner[name].append(_host_ms(host))
            if ready is not None:
                ready(name, host)
            host.stop()
    return {
        name: {
            "start_s": rnd(median(walls[name]), 3),
            "runs_start_s": [rnd(w, 3) for w in walls[name]],
            "host_restore_ms": rnd(median([i["restore_ms"] for i in inner[name]])),
            "host_ready_ms": rnd(median([i["ready_ms"] for i in inner[name]])),
        }
        for name in walls
    }


def bench_restart(args: Any) -> dict[str, Any]:
    """Start to ready with one Run of ``--records`` records vs ``--baseline-records``."""
    out: dict[str, Any] = {"figure": "restart", "target": "ratio <= 1.5"}
    with scratch(args.dir, "bench-restart-") as base, \
            project(base, "big") as big, project(base, "small") as small:
        saved: dict[str, Path] = {}
        for name, host, size in (("big", big, args.records),
                                 ("small", small, args.baseline_records)):
            note(f"restart: building a Run of ~{size} records, then SIGKILL")
            _build_history(host, size)
            # Killed right after the history was written: what the last rotation did not
            # snapshot is still only in the log, and the next start has to read it.
            host.kill()
            host.cli("recover")
            saved[name] = base / f"{name}-crashed-runtime"
            shutil.copytree(host.root / ".intloom" / "runtime", saved[name])
        counts = {"big": _records_of(big), "small": _records_of(small)}
        note(f"restart: records {counts}; timing starts after SIGKILL (the crashed store is "
             "put back before each start)")
        crashed = _starts([("big", big, saved["big"]), ("small", small, saved["small"])],
                          args.repeats)
        # Each of those starts ended with a clean stop: every Run is snapshotted now.
        note("restart: timing starts after a clean stop")
        clean = _starts([("big", big, None), ("small", small, None)], args.repeats)
    for mode, data in (("after_stop", clean), ("after_kill", crashed)):
        ratio, verdict = judged(data["big"]["start_s"] / data["small"]["start_s"], 1.5,
                                at_most=True, digits=3)
        out[mode] = {**data, "ratio": ratio, "verdict": verdict}
    out["records"] = counts["big"]
    out["baseline_records"] = counts["small"]
    worst = max(("after_stop", "after_kill"), key=lambda m: out[m]["ratio"])
    out.update(start_s=out[worst]["big"]["start_s"],
               baseline_start_s=out[worst]["small"]["start_s"],
               ratio=out[worst]["ratio"], verdict=out[worst]["verdict"], headline_mode=worst)
    return out


def _hold_runs(host: Host, runs: int) -> None:
    """``runs`` Runs, each waiting on its confirmation, created through one client."""
    with host.client() as client:
        for _ in range(runs):
            view = client.create_run("loop", '{"target": 1}', wait=True)
            assert view.status == "waiting", view


def _restored(host: Host) -> dict[str, int]:
    """What a started host says it restored: its count of waiting Runs (``status``), and
    the Runs it lists (``runs``), all of them and the waiting ones."""
    with host.client() as client:
        waiting = client.status().waiting_runs
        listed = client.runs()
    return {"status_waiting": waiting, "listed": len(listed),
            "listed_waiting": sum(1 for run in listed if run.status == "waiting")}


def restore_incomplete(runs: int, seen: list[dict[str, int]]) -> list[str]:
    """Why the starts timed did not each restore all ``runs`` Runs, waiting (empty: they
    did). A start that restored fewer is faster, so its ratio would flatter the host."""
    why = []
    for i, got in enumerate(seen):
        if got != {"status_waiting": runs, "listed": runs, "listed_waiting": runs}:
            why.append(f"start {i + 1} of {len(seen)}: the host had {got['listed']} Runs, "
                       f"{got['listed_waiting']} of them waiting (status: "
                       f"{got['status_waiting']} waiting), not {runs} waiting")
    if not seen:
        why.append("no start was checked")
    return why


def bench_restore(args: Any) -> dict[str, Any]:
    """Start to ready with ``--runs`` unfinished (waiting) Runs vs none; "not met" unless
    every start timed restored every Run, waiting, by the host's own answer."""
    out: dict[str, Any] = {"figure": "restore", "runs": args.runs, "target": "ratio <= 2"}
    seen: list[dict[str, int]] = []

    def ready(name: str, host: Host) -> None:
        if name == "many":
            seen.append(_restored(host))

    with scratch(args.dir, "bench-restore-") as base, \
            project(base, "many") as many, project(base, "none") as none:
        note(f"restore: creating {args.runs} waiting Runs")
        many.start()
        _hold_runs(many, args.runs)
        many.stop()
        none.start()
        none.stop()
        data = _starts([("many", many, None), ("none", none, None)], args.repeats, ready)
    why = restore_incomplete(args.runs, seen)
    ratio, verdict = judged(data["many"]["start_s"] / data["none"]["start_s"], 2,
                            at_most=True, digits=3)
    out.update(data, restored_waiting=min((s["listed_waiting"] for s in seen), default=0),
               restored=seen, incomplete=why, start_s=data["many"]["start_s"],
               baseline_start_s=data["none"]["start_s"], ratio=ratio,
               verdict="not met" if why else verdict)
    return out


def bench_memory(args: Any) -> dict[str, Any]:
    """Host RSS with ``--runs`` waiting Runs (created live, then restored) vs an idle host."""
    out: dict[str, Any] = {"figure": "memory", "runs": args.runs, "target": "ratio <= 2"}
    with scratch(args.dir, "bench-memory-") as base, \
            project(base, "many") as many, project(base, "idle") as idle:
        idle.start()
        with idle.client() as client:
            client.runs()
        idle_rss, idle_hwm = rss_mib(idle.pid())
        many.start()
        _hold_runs(many, args.runs)
        with many.client() as client:
            assert len(client.runs()) == args.runs
        live_rss, live_hwm = rss_mib(many.pid())
        many.stop()
        many.start()
        with many.client() as client:
            assert len(client.runs()) == args.runs
        restored_rss, restored_hwm = rss_mib(many.pid())
    ratio_live, ratio_restored = live_rss / idle_rss, restored_rss / idle_rss
    ratio, verdict = judged(max(ratio_live, ratio_restored), 2, at_most=True, digits=3)
    out.update(
        idle_rss_mib=rnd(idle_rss), idle_hwm_mib=rnd(idle_hwm),
        live_rss_mib=rnd(live_rss), live_hwm_mib=rnd(live_hwm),
        restored_rss_mib=rnd(restored_rss), restored_hwm_mib=rnd(restored_hwm),
        kib_per_run=rnd((live_rss - idle_rss) * 1024 / args.runs),
        ratio_live=rnd(ratio_live, 3), ratio_restored=rnd(ratio_restored, 3),
        rss_mib=rnd(max(live_rss, restored_rss)), baseline_rss_mib=rnd(idle_rss),
        ratio=ratio, verdict=verdict,
    )
    return out
