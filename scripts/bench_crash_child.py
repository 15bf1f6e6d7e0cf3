"""A peer's side of the crash comparison, in ``.bench-venv``:
``python bench_crash_child.py dbos|langgraph run|recover STEPS SLOW SLEEP DIR``.

``run`` starts the workflow (the parent SIGKILLs it during Step SLOW); ``recover`` recovers
it with the framework's own mechanism and writes ``recover.json``. Step k appends
``step-k pid=... t=...`` to DIR/side.txt when it starts; Step SLOW then sleeps SLEEP s.
"""

from __future__ import annotations

import json
import os
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any, TypedDict


class S(TypedDict):
    """LangGraph's State. At module level: LangGraph resolves the nodes' annotations."""

    last: dict[str, Any]
    i: int


def side_effect(d: Path, k: int, slow: int, sleep_s: float) -> dict[str, Any]:
    with open(d / "side.txt", "a") as fh:
        fh.write(f"step-{k} pid={os.getpid()} t={time.time():.6f}\n")
        fh.flush()
    if k == slow:
        time.sleep(sleep_s)
    return {"step": k, "ok": True, "data": "x" * 64}


def dbos(mode: str, steps: int, slow: int, sleep_s: float, d: Path) -> None:
    import sqlite3

    from dbos import DBOS, SetWorkflowID

    db = d / "dbos_sys.sqlite"
    DBOS(config={"name": "intloom-crash", "system_database_url": f"sqlite:///{db}",
                 "run_admin_server": False, "log_level": "WARNING"})

    @DBOS.step()
    def step(k: int) -> dict[str, Any]:
        return side_effect(d, k, slow, sleep_s)

    @DBOS.workflow()
    def workflow(m: int) -> int:
        for k in range(1, m + 1):
            step(k)
        return m

    if mode == "run":
        DBOS.launch()
        with SetWorkflowID("wf"):
            workflow(steps)
        DBOS.destroy()
        return
    conn = sqlite3.connect(db)
    before = conn.execute("SELECT status FROM workflow_status WHERE workflow_uuid='wf'").fetchone()
    conn.close()
    DBOS.launch()  # recovers PENDING workflows of this executor and application version
    handle = DBOS.retrieve_workflow("wf")
    handle.get_result(polling_interval_sec=0.005)
    status = handle.get_status()
    (d / "recover.json").write_text(json.dumps({
        "status": f"{status.status} (was {before[0] if before else '?'}; "
                  f"recovery attempts {status.recovery_attempts})",
        "mechanism": "DBOS.launch() recovers the PENDING workflow and re-runs it from the top; "
                     "recorded Steps are answered from the database",
        "versions": {"dbos": version("dbos")},
    }))
    DBOS.destroy()


def langgraph(mode: str, steps: int, slow: int, sleep_s: float, d: Path) -> None:
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    g = StateGraph(S)

    def make(k: int) -> Any:
        def node(state: S) -> dict[str, Any]:
            return {"last": side_effect(d, k, slow, sleep_s), "i": k}
        return node

    for k in range(1, steps + 1):
        g.add_node(f"n{k}", make(k))
    g.add_edge(START, "n1")
    for k in range(1, steps):
        g.add_edge(f"n{k}", f"n{k + 1}")
    g.add_edge(f"n{steps}", END)
    conn = sqlite3.connect(d / "lg.sqlite", check_same_thread=False)
    app = g.compile(checkpointer=SqliteSaver(conn))
    config = {"configurable": {"thread_id": "t"}, "recursion_limit": steps + 10}
    if mode == "run":
        app.invoke({"last": {}, "i": 0}, config, durability="sync")
        return
    before = app.get_state(config)
    app.invoke(None, config, durability="sync")  # the application re-invokes the thread
    after = app.get_state(config)
    (d / "recover.json").write_text(json.dumps({
        "status": f"next={list(after.next)} (was next={list(before.next)})",
        "mechanism": "the application re-invokes the thread (invoke(None, thread_id)); "
                     "it resumes from the last checkpoint, before the interrupted node",
        "versions": {"langgraph": version("langgraph"),
                     "langgraph-checkpoint-sqlite": version("langgraph-checkpoint-sqlite")},
    }))
    conn.close()


def main() -> None:
    framework, mode = sys.argv[1], sys.argv[2]
    steps, slow, sleep_s, d = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), Path(
        sys.argv[6])
    {"dbos": dbos, "langgraph": langgraph}[framework](mode, steps, slow, sleep_s, d)


if __name__ == "__main__":
    main()
