"""One variant of the peer comparison, in a fresh process: ``python bench_peer_child.py
VARIANT STEPS DIR``. Prints one line ``RESULT {json}``.

Run by ``bench_peers`` with the project's interpreter for the intloom variants and the raw
floor, and with ``.bench-venv``'s (where DBOS and LangGraph live) for the peers. It imports
nothing from intloom at module level so that the peers' interpreter can load it.

Every variant runs the same workload: a warm-up of ``WARMUP`` Steps, then ``STEPS``
sequential trivial Steps in one workflow, each producing a ~100-byte result that the
framework makes durable before the next Step starts. Import, launch and compile are outside
the timed region; CPU time is the whole process's (all threads) over the timed region.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any, TypedDict

WARMUP = 10
# LangGraph's durability mode: "sync" writes each checkpoint before the next super-step (its
# default, "async", writes it in the background). Reported back, for bench_peers to check.
DURABILITY = "sync"


class S(TypedDict):
    """LangGraph's State. At module level: LangGraph resolves the nodes' annotations."""

    last: dict[str, Any]
    i: int
    target: int

_CPU = [0.0, 0.0]


def payload(k: int) -> dict[str, Any]:
    return {"step": k, "ok": True, "data": "x" * 64}


def _start() -> float:
    _CPU[0] = time.process_time()
    return time.perf_counter()


def _stop(started: float) -> float:
    _CPU[1] = time.process_time()
    return time.perf_counter() - started


def raw_fdatasync(n: int, d: Path) -> tuple[float, dict[str, Any]]:
    """A 150-byte JSON record appended and fdatasync'ed per Step: the disk's floor."""
    fd = os.open(d / "journal.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def run(name: str, m: int) -> None:
        for k in range(m):
            rec = json.dumps({"run": name, "k": k, "result": payload(k)}).ljust(149)[:149]
            os.write(fd, rec.encode() + b"\n")
            os.fdatasync(fd)

    run("warm", WARMUP)
    os.fsync(fd)
    started = _start()
    run("main", n)
    return _stop(started), {"bytes_per_step": 150}


def _intloom(n: int, d: Path, kind: str) -> tuple[float, dict[str, Any]]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import asyncio
    import gc
    import uuid

    import intloom
    from intloom.executor.runtime import Runtime
    from intloom.store import Store
    from scripts.bench_steps import tick_workflow

    async def main() -> float:
        store = Store.open(d / "runtime", instance_id=str(uuid.uuid4()), package_version="b")
        try:
            warm, real = tick_workflow(WARMUP, kind, "warm"), tick_workflow(n, kind, "main")
            rt = Runtime({"warm": warm, "main": real}, store, package_version=intloom.__version__)
            rt.restore([])
            gc.freeze()  # as the host does once its imports are done (intloom/host/daemon.py)
            view = await rt.create_run("warm", "warm-up")
            await rt.wait_stable(view.run_id)
            started = _start()
            view = await rt.create_run("main", "bench")
            final = await rt.wait_stable(view.run_id)
            elapsed = _stop(started)
            assert final.status == "completed", final
            return elapsed
        finally:
            await store.close()

    return asyncio.run(main()), {"intloom": intloom.__version__}


def intloom_async(n: int, d: Path) -> tuple[float, dict[str, Any]]:
    return _intloom(n, d, "async")


def intloom_sync(n: int, d: Path) -> tuple[float, dict[str, Any]]:
    return _intloom(n, d, "sync")


def dbos_sqlite(n: int, d: Path) -> tuple[float, dict[str, Any]]:
    """DBOS with its SQLite system database, the default; one ``@DBOS.step`` per Step."""
    import sqlite3
    from importlib.metadata import version

    from dbos import DBOS, SetWorkflowID

    db = d / "dbos_sys.sqlite"
    DBOS(config={"name": "intloom-bench", "system_database_url": f"sqlite:///{db}",
                 "run_admin_server": False, "log_level": "WARNING"})

    @DBOS.step()
    def step(k: int) -> dict[str, Any]:
        return payload(k)

    @DBOS.workflow()
    def workflow(m: int) -> int:
        for k in range(m):
            step(k)
        return m

    DBOS.launch()
    with SetWorkflowID("warm"):
        workflow(WARMUP)
    started = _start()
    with SetWorkflowID("main"):
        workflow(n)
    elapsed = _stop(started)
    conn = sqlite3.connect(db)
    extra = {
        "dbos": version("dbos"),
        "journal_mode": conn.execute("PRAGMA journal_mode").fetchone()[0],
        "synchronous": conn.execute("PRAGMA synchronous").fetchone()[0],
        "recorded_steps": conn.execute(
            "SELECT count(*) FROM operation_outputs WHERE workflow_uuid='main'").fetchone()[0],
    }
    conn.close()
    DBOS.destroy()
    return elapsed, extra


def _langgraph(n: int, d: Path, shape: str) -> tuple[float, dict[str, Any]]:
    """LangGraph with SqliteSaver and durability="sync": a chain of nodes or one node looped."""
    import sqlite3
    from importlib.metadata import version

    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    def build(m: int) -> Any:
        g = StateGraph(S)
        if shape == "chain":
            def make(k: int) -> Any:
                def node(state: S) -> dict[str, Any]:
                    return {"last": payload(k), "i": k}
                return node
            for k in range(m):
                g.add_node(f"n{k}", make(k))
            g.add_edge(START, "n0")
            for k in range(m - 1):
                g.add_edge(f"n{k}", f"n{k + 1}")
            g.add_edge(f"n{m - 1}", END)
        else:
            def work(state: S) -> dict[str, Any]:
                k = state["i"] + 1
                return {"last": payload(k), "i": k}

            def route(state: S) -> str:
                return "work" if state["i"] + 1 < state["target"] else END

            g.add_node("work", work)
            g.add_edge(START, "work")
            g.add_conditional_edges("work", route, ["work", END])
        return g

    conn = sqlite3.connect(d / "lg.sqlite", check_same_thread=False)
    saver = SqliteSaver(conn)
    warm, app = build(WARMUP).compile(checkpointer=saver), build(n).compile(checkpointer=saver)
    warm.invoke({"last": {}, "i": -1, "target": WARMUP},
                {"configurable": {"thread_id": "warm"}, "recursion_limit": WARMUP + 10},
                durability=DURABILITY)
    config = {"configurable": {"thread_id": "main"}, "recursion_limit": n + 10}
    started = _start()
    out = app.invoke({"last": {}, "i": -1, "target": n}, config, durability=DURABILITY)
    elapsed = _stop(started)
    assert out["i"] == n - 1, out["i"]
    extra = {
        "langgraph": version("langgraph"),
        "langgraph-checkpoint-sqlite": version("langgraph-checkpoint-sqlite"),
        "durability": DURABILITY,
        "journal_mode": conn.execute("PRAGMA journal_mode").fetchone()[0],
        "synchronous": conn.execute("PRAGMA synchronous").fetchone()[0],
        "checkpoints": conn.execute(
            "SELECT count(*) FROM checkpoints WHERE thread_id='main'").fetchone()[0],
    }
    conn.close()
    return elapsed, extra


def langgraph_loop(n: int, d: Path) -> tuple[float, dict[str, Any]]:
    return _langgraph(n, d, "loop")


def langgraph_chain(n: int, d: Path) -> tuple[float, dict[str, Any]]:
    return _langgraph(n, d, "chain")


def _peak_rss_mib() -> float:
    """VmHWM: this program's peak RSS. ``ru_maxrss`` would carry the forking parent's peak
    over ``exec``; the memory map ``exec`` creates starts its own high-water mark."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


VARIANTS = {
    "raw_fdatasync": raw_fdatasync,
    "intloom_async": intloom_async,
    "intloom_sync": intloom_sync,
    "dbos_sqlite": dbos_sqlite,
    "langgraph_loop": langgraph_loop,
    "langgraph_chain": langgraph_chain,
}


def main() -> None:
    variant, n, directory = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    elapsed, extra = VARIANTS[variant](n, directory)
    print("RESULT " + json.dumps({
        "variant": variant, "steps": n, "elapsed_s": elapsed, "cpu_s": _CPU[1] - _CPU[0],
        "peak_rss_mib": _peak_rss_mib(),
        "extra": extra,
    }), flush=True)


if __name__ == "__main__":
    main()
