"""Child process for crash tests: runs Workflows in-process on the real store.

    python -m tests.crash_child ROOT run WORKFLOW     create one Run and drive it to its end
    python -m tests.crash_child ROOT resume          restore every Run and drive them to their end

"Drive" answers every confirmation with yes. INTLOOM_FAULT (see docs/format.md) makes the
store kill this process at a chosen flush. The last stdout line is a JSON report.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from pathlib import Path

import msgspec

from intloom.authoring.loader import load_workflows
from intloom.executor.runtime import RestoredRun, Runtime
from intloom.project import ProjectPaths, load_config
from intloom.store import Store


async def drive(rt: Runtime, run_id: str) -> None:
    while True:
        view = await rt.wait_stable(run_id)
        if view.status != "waiting" or view.pending_action is None:
            return
        await rt.answer(run_id, view.pending_action.id, {"isConfirmed": True})


async def main(root: Path, mode: str, workflow: str | None) -> dict[str, object]:
    paths = ProjectPaths(root)
    loaded = load_workflows(root, load_config(root))
    assert not loaded.problems, loaded.problems
    store = Store.open(paths.runtime, instance_id=str(uuid.uuid4()), package_version="0.1.0")
    restored = [RestoredRun(j.run_id, j.state, j.problem) for j in store.restored.runs]
    rt = Runtime(loaded.workflows, store, package_version="0.1.0")
    summary = rt.restore(restored)
    rt.start_restored()
    if mode == "run":
        assert workflow is not None
        view = await rt.create_run(workflow, "crash test")
        print(json.dumps({"created": view.run_id}), flush=True)
        await drive(rt, view.run_id)
    else:
        for run_id in list(rt.runs):
            await drive(rt, run_id)
    views = {rid: msgspec.to_builtins(slot.view()) for rid, slot in rt.runs.items()}
    await store.close()
    return {"summary": msgspec.to_builtins(summary), "runs": views}


if __name__ == "__main__":
    root_arg, mode_arg = Path(sys.argv[1]), sys.argv[2]
    wf_arg = sys.argv[3] if len(sys.argv) > 3 else None
    report = asyncio.run(asyncio.wait_for(main(root_arg, mode_arg, wf_arg), timeout=30))
    print(json.dumps(report), flush=True)
