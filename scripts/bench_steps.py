"""µs per durable Step against the disk's floor, and aggregate Steps/s with concurrent Runs.

Both drive the real ``Runtime`` over the real ``Store`` (a host without its socket): the
same code a host runs for every Step. A Step here is trivial -- it bumps a counter and
keeps a ~100-byte payload in its State, like the peers' Steps in ``bench_peers`` -- so the
figure is the engine's and the journal's own cost.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec

import intloom
from intloom.authoring.loader import LoadedWorkflow
from intloom.executor.runtime import Runtime
from intloom.store import Store
from scripts.bench_common import judged, median, rnd, scratch, shown, worst

PAYLOAD = "x" * 64


class Tick(msgspec.Struct):
    n: int = 0
    data: str = ""


def tick_workflow(steps: int, kind: str, name: str = "bench") -> LoadedWorkflow:
    """One Stage, one Step routed back to itself ``steps`` times; ``kind`` is sync or async."""
    wf = intloom.Workflow(name, version="1")
    stage = wf.stage("loop", state=Tick)
    routes: dict[str, Any] = {"again": "tick", "done": intloom.COMPLETE}

    if kind == "async":
        async def tick(ctx: intloom.StepContext[Tick]) -> str:
            ctx.state = Tick(n=ctx.state.n + 1, data=PAYLOAD)
            return "done" if ctx.state.n >= steps else "again"
    else:
        def tick(ctx: intloom.StepContext[Tick]) -> str:  # type: ignore[misc]
            ctx.state = Tick(n=ctx.state.n + 1, data=PAYLOAD)
            return "done" if ctx.state.n >= steps else "again"

    stage.step("tick", routes=routes)(tick)
    wf.validate()
    return LoadedWorkflow(wf, "bench", f"{name}-{kind}-{steps}", wf.schemas())


async def _runs(rt: Runtime, lw: LoadedWorkflow, runs: int, together: bool = True) -> None:
    """Create ``runs`` Runs and wait for all of them to complete.

    ``together``: created at once, as by that many clients, so all of them run for the
    whole measurement. Otherwise one after another, each creation awaited, as by one
    client: Run k starts about k flushes after the first and ends about k flushes after it,
    so the first and last ~``runs`` rounds have fewer Runs to group.
    """
    if together:
        views = list(await asyncio.gather(*(rt.create_run(lw.name, "bench")
                                            for _ in range(runs))))
    else:
        views = [await rt.create_run(lw.name, "bench") for _ in range(runs)]
    finals = await asyncio.gather(*(rt.wait_stable(v.run_id) for v in views))
    bad = [f for f in finals if f.status != "completed"]
    if bad:
        raise RuntimeError(f"a benchmark Run did not complete: {bad[0]}")


class Floor:
    """The disk's floor for a Step: ``write`` + ``fdatasync`` appended to one file, in the
    benchmark's own directory, warmed up once, then timed in chunks between the Runs.

    ``preallocated``: the same bytes written over zeros ``posix_fallocate`` gave the file
    beforehand (outside the timed region), as a format-2 segment is written
    (docs/format.md). Its ``fdatasync`` commits no metadata, so it is the lower floor; the
    issue's baseline is the appending one, and both are reported."""

    def __init__(self, directory: Path, warmup: int = 50, preallocated: bool = False) -> None:
        self.path = directory / f"floor-{uuid.uuid4().hex}.bin"
        append = 0 if preallocated else os.O_APPEND
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | append | os.O_CLOEXEC, 0o600)
        self.preallocated = preallocated
        self.offset = 0
        self.chunk(warmup, 512)
        os.fsync(self.fd)

    def chunk(self, writes: int, size: int) -> tuple[float, float]:
        """(wall s, CPU s) of ``writes`` writes of ``size`` bytes, each fdatasync'ed."""
        payload = os.urandom(max(1, size))
        if self.preallocated:
            os.posix_fallocate(self.fd, self.offset, writes * len(payload) + (1 << 20))
            os.fsync(self.fd)
        offset = self.offset
        started, cpu = time.perf_counter(), time.process_time()
        if self.preallocated:
            for _ in range(writes):
                os.pwrite(self.fd, payload, offset)
                os.fdatasync(self.fd)
                offset += len(payload)
        else:
            for _ in range(writes):
                os.write(self.fd, payload)
                os.fdatasync(self.fd)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        self.offset = offset
        return elapsed, cpu

    def close(self) -> None:
        os.close(self.fd)
        self.path.unlink()


async def _timed(store: Store, rt: Runtime, lw: LoadedWorkflow, runs: int,
                 steps: int, together: bool) -> dict[str, Any]:
    """Time ``runs`` concurrent Runs of ``steps`` Steps each, in an open, warmed store."""
    flushes, size = store.flushes, store.bytes_flushed
    splits = _splits(rt)
    gc.collect()
    started, cpu = time.perf_counter(), time.process_time()
    await _runs(rt, lw, runs, together)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    flushes, size = store.flushes - flushes, store.bytes_flushed - size
    total = runs * steps
    return {"elapsed_s": elapsed, "cpu_s": cpu, "steps": total, "flushes": flushes,
            "crew_splits": _splits(rt) - splits,
            "bytes": size, "us_per_step": elapsed / total * 1e6,
            "cpu_us_per_step": cpu / total * 1e6, "steps_per_s": total / elapsed}


def _splits(rt: Runtime) -> int:
    """How many times sync Steps' crews split so far (executor/crew.py): a crew held up by a
    Step, or a slow round, moves Runs to another thread, whose flushes are its own."""
    crews = rt.driver._crews
    return 0 if crews is None else crews.splits


def _own(base: Path, kind: str) -> Path:
    """Each kind's own directory: the sync kind measured in the store the async kind had
    filled (its segments, snapshots and manifest) was not measured as the async one was."""
    path = base / kind
    path.mkdir()
    return path


# What one measurement runs: (Runs, Steps per Run, created together).
Size = tuple[int, int, bool]


async def _session(directory: Path, kind: str, sizes: dict[str, Size],
                   order: list[str], warmup: int) -> list[tuple[str, dict[str, Any]]]:
    """One store, warmed up, then the measurements named in ``order`` (``floor`` included),
    back to back: each pair of neighbours sees the same disk and the same neighbours."""
    store = Store.open(directory / "runtime", instance_id=str(uuid.uuid4()),
                       package_version="bench")
    floors = {"floor": Floor(directory), "prealloc_floor": Floor(directory, preallocated=True)}
    out: list[tuple[str, dict[str, Any]]] = []
    try:
        flows = {name: tick_workflow(steps, kind, name) for name, (_, steps, _) in sizes.items()}
        flows["warm"] = tick_workflow(warmup, kind, "warm")
        rt = Runtime(flows, store, package_version=intloom.__version__)
        rt.restore([])
        gc.freeze()  # as the host does once its imports are done (intloom/host/daemon.py)
        await _runs(rt, flows["warm"], 1)
        last: dict[str, Any] | None = None
        for name in order:
            # Outside every timed region: a compaction the last measurement's writes started
            # would otherwise run into this one (the 1-Run baseline follows the 64 Runs),
            # slowing it. What each measurement waited for is reported with it.
            waited = time.perf_counter()
            store.compaction_idle()
            waited = time.perf_counter() - waited
            if name in floors:
                # The flushes the last Run needed, each as large as they were on average.
                assert last is not None, "a floor chunk follows a measured Run"
                writes = last["flushes"]
                wall, cpu = floors[name].chunk(writes, round(last["bytes"] / writes))
                out.append((name, {"us_per_step": wall / last["steps"] * 1e6,
                                   "cpu_us_per_step": cpu / last["steps"] * 1e6,
                                   "compaction_wait_s": waited}))
                continue
            runs, steps, together = sizes[name]
            last = await _timed(store, rt, flows[name], runs, steps, together)
            out.append((name, {**last, "compaction_wait_s": waited}))
    finally:
        for floor in floors.values():
            floor.close()
        await store.close()
    return out


def _waits(items: list[tuple[str, dict[str, Any]]]) -> dict[str, float]:
    """The compaction waits before each kind of measurement, summed (``_session``)."""
    waits: dict[str, float] = {}
    for name, result in items:
        waits[name] = waits.get(name, 0.0) + result["compaction_wait_s"]
    return {name: rnd(wait, 3) for name, wait in waits.items()}


def bench_steps(args: Any) -> dict[str, Any]:
    """µs per durable Step, 1 Run, against write+fdatasync of the same bytes per flush.

    Repetitions alternate a Run and a floor chunk of the flushes that Run needed (Run, floor,
    floor, Run, Run, floor, ...): the ratio is the median of the neighbours' ratios.
    """
    kinds = ["async", "sync"] if args.kind == "both" else [args.kind]
    out: dict[str, Any] = {"figure": "steps", "steps": args.steps, "repeats": args.repeats,
                           "target": "ratio <= 1.5", "kinds": {}}
    order: list[str] = []
    for rep in range(args.repeats):
        order += (["main", "floor", "prealloc_floor"] if rep % 2 == 0
                  else ["prealloc_floor", "floor", "main"])
    with scratch(args.dir, "bench-steps-") as base:
        for kind in kinds:
            items = asyncio.run(_session(_own(base, kind), kind,
                                         {"main": (1, args.steps, True)}, order, args.warmup))
            ours = [r for n, r in items if n == "main"]
            floors = [r for n, r in items if n == "floor"]
            lower = [r for n, r in items if n == "prealloc_floor"]
            ratios = [o["us_per_step"] / f["us_per_step"] for o, f in zip(ours, floors,
                                                                            strict=True)]
            below = [o["us_per_step"] / f["us_per_step"] for o, f in zip(ours, lower,
                                                                           strict=True)]
            ratio, verdict = judged(median(ratios), 1.5, at_most=True, digits=3)
            out["kinds"][kind] = {
                "us_per_step": rnd(median([r["us_per_step"] for r in ours])),
                "cpu_us_per_step": rnd(median([r["cpu_us_per_step"] for r in ours])),
                "floor_us_per_step": rnd(median([f["us_per_step"] for f in floors])),
                "floor_cpu_us_per_step": rnd(median([f["cpu_us_per_step"] for f in floors])),
                # The same bytes over preallocated zeros, as a segment is written: not the
                # issue's baseline (that is the append), but the floor intloom writes on.
                "prealloc_floor_us_per_step": rnd(median([f["us_per_step"] for f in lower])),
                "prealloc_ratio": rnd(median(below), 3),
                "ratio": ratio,
                "pair_ratios": [shown(x, 2, at_most=True) for x in ratios],
                "verdict": verdict,
                "runs_us_per_step": [rnd(r["us_per_step"]) for r in ours],
                "floor_runs_us_per_step": [rnd(f["us_per_step"]) for f in floors],
                "flushes_per_step": rnd(ours[-1]["flushes"] / ours[-1]["steps"], 3),
                "bytes_per_flush": round(ours[-1]["bytes"] / ours[-1]["flushes"]),
                "compaction_wait_s": _waits(items),
            }
    # The headline is the kind that fares worst: with async first, a sync kind that missed
    # the target left the figure "met" at the top of the JSON and green in the chart.
    headline = worst(out["kinds"], at_most=True)
    head = out["kinds"][headline]
    out.update(us_per_step=head["us_per_step"], floor_us_per_step=head["floor_us_per_step"],
               ratio=head["ratio"], verdict=head["verdict"], headline_kind=headline)
    return out


def bench_concurrency(args: Any) -> dict[str, Any]:
    """Aggregate durable Steps/s with N concurrent Runs against 1 Run (group commit).

    All run in one warmed store, alternating (N staggered, 1, N, N, 1, N staggered, ...), so
    that each 1-Run measurement neighbours one of each; a ratio is the median of those
    neighbouring pairs' ratios. The N Runs are created together, so N Runs run for the whole
    measurement. "Staggered" (created one after another, each creation awaited) is reported
    beside it: its first and last ~N rounds have fewer Runs.
    """
    kinds = ["async", "sync"] if args.kind == "both" else [args.kind]
    out: dict[str, Any] = {"figure": "concurrency", "runs": args.runs,
                           "steps_per_run": args.steps, "solo_steps": args.solo_steps,
                           "repeats": args.repeats, "target": "ratio >= 8", "kinds": {}}
    order: list[str] = []
    for rep in range(args.repeats):
        trio = ["staggered", "one", "many"]
        order += trio if rep % 2 == 0 else trio[::-1]
    sizes: dict[str, Size] = {"one": (1, args.solo_steps, True),
                              "many": (args.runs, args.steps, True),
                              "staggered": (args.runs, args.steps, False)}
    with scratch(args.dir, "bench-conc-") as base:
        for kind in kinds:
            items = asyncio.run(_session(_own(base, kind), kind, sizes, order, 20))
            one = [r for n, r in items if n == "one"]
            many = [r for n, r in items if n == "many"]
            staggered = [r for n, r in items if n == "staggered"]
            ratios = [m["steps_per_s"] / o["steps_per_s"] for o, m in zip(one, many,
                                                                           strict=True)]
            ratio, verdict = judged(median(ratios), 8, at_most=False, digits=2)
            staggered_ratios = [s["steps_per_s"] / o["steps_per_s"]
                                for o, s in zip(one, staggered, strict=True)]
            out["kinds"][kind] = {
                "steps_per_s": round(median([r["steps_per_s"] for r in many])),
                "solo_steps_per_s": round(median([r["steps_per_s"] for r in one])),
                "ratio": ratio, "pair_ratios": [shown(x, 2, at_most=False) for x in ratios],
                "verdict": verdict,
                "runs_steps_per_s": [round(r["steps_per_s"]) for r in many],
                "solo_runs_steps_per_s": [round(r["steps_per_s"]) for r in one],
                "cpu_us_per_step": rnd(median([r["cpu_us_per_step"] for r in many])),
                "solo_cpu_us_per_step": rnd(median([r["cpu_us_per_step"] for r in one])),
                "steps_per_flush": rnd(median([r["steps"] / r["flushes"] for r in many]), 1),
                "crew_splits": [r["crew_splits"] for r in many],
                # Seconds spent, outside the timings, waiting for a compaction the previous
                # measurement started, before each kind of measurement (all repetitions).
                "compaction_wait_s": _waits(items),
                "staggered": {
                    "steps_per_s": round(median([r["steps_per_s"] for r in staggered])),
                    "ratio": rnd(median(staggered_ratios), 2),
                    "pair_ratios": [rnd(x, 2) for x in staggered_ratios],
                    "runs_steps_per_s": [round(r["steps_per_s"]) for r in staggered],
                    "steps_per_flush": rnd(median([r["steps"] / r["flushes"]
                                                   for r in staggered]), 1),
                },
            }
    headline = worst(out["kinds"], at_most=False)  # as in bench_steps
    head = out["kinds"][headline]
    out.update(steps_per_s=head["steps_per_s"], solo_steps_per_s=head["solo_steps_per_s"],
               ratio=head["ratio"], verdict=head["verdict"], headline_kind=headline)
    return out
