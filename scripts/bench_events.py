"""How long an event takes to reach an attached client while the host is busy.

A real host runs ``--runs`` Runs that do nothing but trivial Steps, as fast as the journal
allows; ``--followers`` clients each attach to one of them with ``Client.subscribe`` (what
``intloom attach`` uses) in their own thread. For every live event, latency = the client's
clock when the event arrived - the Run's ``updatedAt`` in it: the time of the newest record
the event carries, stamped *before* that record's fdatasync. So the figure covers the group
commit, the publish and the socket. ``updatedAt`` has millisecond resolution and is
truncated, which can only overstate a latency, by less than 1 ms.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any

from scripts.bench_common import (
    Host,
    median,
    note,
    percentile,
    project,
    rnd,
    scratch,
    shown,
    verdict,
)


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _follow(host: Host, run_id: str, sink: list[float], errors: list[str]) -> None:
    try:
        with host.client() as client:
            for event in client.subscribe(run_id):
                if event.history or event.final:
                    continue
                sink.append(time.time() - _stamp(event.run.updated_at))
    except Exception as exc:  # reported in the result, never hidden
        errors.append(f"{type(exc).__name__}: {exc}")


def incomplete(errors: list[str], running: int, runs: int) -> list[str]:
    """Why the sample is not the figure's, if it is not: a follower that failed (refused at
    the connection cap, dropped as too slow) took its events with it, the slow ones first,
    and a Run that stopped stepping made the load lighter. Either makes the p99 "not met"."""
    why = [f"a follower failed: {e}" for e in errors]
    if running < runs:
        why.append(f"{running} of the {runs} Runs were running at the end of the window")
    return why


def bench_events(args: Any) -> dict[str, Any]:
    if not 1 <= args.followers <= args.runs:  # each follower follows a Run of its own
        raise SystemExit(f"scripts/bench events: --followers {args.followers} must be between "
                         f"1 and --runs ({args.runs}): each follower follows one of the busy "
                         "Runs. Nothing was run.")
    out: dict[str, Any] = {"figure": "events", "runs": args.runs, "followers": args.followers,
                           "seconds": args.seconds, "target": "p99 <= 10 ms"}
    with scratch(args.dir, "bench-events-") as base, project(base) as host:
        host.start()
        with host.client() as client:
            run_ids = [client.create_run("busy", "{}", wait=False).run_id
                       for _ in range(args.runs)]
            sinks: list[list[float]] = [[] for _ in range(args.followers)]
            errors: list[str] = []
            threads = [threading.Thread(target=_follow, args=(host, run_ids[i], sinks[i], errors),
                                        daemon=True) for i in range(args.followers)]
            note(f"events: {args.runs} busy Runs, {args.followers} followers, {args.seconds} s")
            for t in threads:
                t.start()
            time.sleep(args.seconds)  # the measurement window itself, not a wait for an event
            status = client.status()
            for run_id in run_ids:
                client.cancel(run_id)
            for t in threads:
                t.join(timeout=30)
        host.stop()
    latencies = sorted(x * 1e3 for sink in sinks for x in sink)
    if not latencies:
        raise RuntimeError(f"no live event reached a follower: {errors}")
    p99 = percentile(latencies, 99)
    why = incomplete(errors, status.running_runs, args.runs)
    out.update(
        events=len(latencies), errors=errors,
        p50_ms=rnd(median(latencies), 2), p90_ms=rnd(percentile(latencies, 90), 2),
        p99_ms=shown(p99, 2, at_most=True), max_ms=rnd(latencies[-1], 2),
        running_when_measured=status.running_runs,
        ratio=shown(p99 / 10.0, 3, at_most=True), incomplete=why,
        verdict="not met" if why else verdict(p99, 10.0, at_most=True),
    )
    return out
