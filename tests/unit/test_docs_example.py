"""The worked example in docs/authoring.md runs as written."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

from intloom.authoring.loader import LoadedWorkflow
from intloom.executor.runtime import Runtime
from tests.helpers import REPO
from tests.unit.memjournal import MemoryJournal


def test_authoring_example_runs(tmp_path: Path) -> None:
    text = (REPO / "docs" / "authoring.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S)
    assert code is not None
    module = tmp_path / "release_notes.py"
    module.write_text(code.group(1))
    namespace: dict[str, object] = {"__name__": "release_notes"}
    sys.path.insert(0, str(tmp_path))
    try:
        exec(compile(code.group(1), str(module), "exec"), namespace)
    finally:
        sys.path.remove(str(tmp_path))
    wf = namespace["wf"]
    wf.validate()  # type: ignore[attr-defined]

    async def main() -> None:
        rt = Runtime({"release-notes": LoadedWorkflow(wf, "x", "id", wf.schemas())},  # type: ignore[arg-type, attr-defined]
                     MemoryJournal(), package_version="0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("release-notes", "v1.2")).run_id)
        assert view.pending_action is not None
        assert view.pending_action.request == {"context": {"draft": "Notes for v1.2 (round 1)"}}
        view = await rt.answer(view.run_id, view.pending_action.id, {"isConfirmed": False})
        assert view.pending_action is not None
        view = await rt.answer(view.run_id, view.pending_action.id, {"isConfirmed": True})
        assert view.status == "completed" and view.cursor.stage == "publish"

    asyncio.run(asyncio.wait_for(main(), 10))
