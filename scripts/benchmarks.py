"""Benchmark harness: one sub-command per figure, each printing one JSON object.

Every figure is a ratio against a baseline measured in the same run, on the same disk —
never a hard-coded number.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec

import intloom
from intloom.authoring.loader import LoadedWorkflow
from intloom.executor.runtime import Runtime
from intloom.store import Store


class Tick(msgspec.Struct):
    n: int = 0


def _tick_workflow(steps: int) -> LoadedWorkflow:
    wf = intloom.Workflow("bench-steps", version="1")
    stage = wf.stage("loop", state=Tick)

    @stage.step("tick", routes={"again": "tick", "done": intloom.COMPLETE})
    async def tick(ctx: intloom.StepContext[Tick]) -> str:
        ctx.state = Tick(n=ctx.state.n + 1)
        return "done" if ctx.state.n >= steps else "again"

    wf.validate()
    return LoadedWorkflow(wf, "bench", "bench-identity", wf.schemas())


def raw_floor(directory: Path, writes: int, size: int) -> float:
    """µs per append+fdatasync of ``size`` bytes to one file: the disk's floor for a Step."""
    path = directory / f"floor-{uuid.uuid4().hex}.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    payload = os.urandom(size)
    try:
        started = time.perf_counter()
        for _ in range(writes):
            os.write(fd, payload)
            os.fdatasync(fd)
        elapsed = time.perf_counter() - started
    finally:
        os.close(fd)
        path.unlink()
    return elapsed / writes * 1e6


async def _run_steps(runtime_dir: Path, steps: int) -> tuple[float, Store]:
    store = Store.open(runtime_dir, instance_id=str(uuid.uuid4()), package_version="bench")
    lw = _tick_workflow(steps)
    rt = Runtime({lw.name: lw}, store, package_version=intloom.__version__)
    rt.restore([])
    started = time.perf_counter()
    view = await rt.create_run(lw.name, "bench")
    final = await rt.wait_stable(view.run_id)
    elapsed = time.perf_counter() - started
    assert final.status == "completed", final
    await store.close()
    return elapsed, store


def bench_steps(args: argparse.Namespace) -> dict[str, Any]:
    base = Path(args.dir) if args.dir else None
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        runtime_dir = Path(tmp) / "runtime"
        elapsed, store = asyncio.run(_run_steps(runtime_dir, args.steps))
        flushes = store.flushes
        # The bytes the journal really wrote, so the floor writes the same amount per flush.
        written = sum(p.stat().st_size for p in (runtime_dir / "wal").glob("*.seg"))
        size = max(1, written // max(1, flushes))
        floor = raw_floor(Path(tmp), args.steps, size)
    us_per_step = elapsed / args.steps * 1e6
    return {
        "figure": "steps",
        "steps": args.steps,
        "us_per_step": round(us_per_step, 1),
        "floor_us_per_step": round(floor, 1),
        "ratio": round(us_per_step / floor, 3),
        "flushes": flushes,
        "bytes_per_flush": size,
        "target": "ratio <= 1.5",
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="scripts/bench")
    sub = parser.add_subparsers(dest="figure", required=True)
    steps = sub.add_parser("steps", help="µs per durable Step vs raw append+fdatasync")
    steps.add_argument("--steps", type=int, default=2000)
    steps.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    result = {"steps": bench_steps}[args.figure](args)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
