"""The worked example in docs/authoring.md runs as written, and every Python example in the
docs type-checks as a user's code would (``mypy --strict``)."""

from __future__ import annotations

import asyncio
import re
import sys
import textwrap
from pathlib import Path

from intloom import Workflow
from intloom.authoring.loader import LoadedWorkflow
from intloom.executor.runtime import Runtime
from tests.helpers import REPO, run_mypy
from tests.unit.memjournal import MemoryJournal


def _runtime(wf: Workflow) -> Runtime:
    """A Runtime of ``wf`` alone, over an in-memory journal, restored with nothing."""
    wf.validate()
    rt = Runtime({wf.name: LoadedWorkflow(wf, "x", "id", wf.schemas())}, MemoryJournal(),
                 package_version="0")
    rt.restore([])
    return rt


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
    assert isinstance(wf, Workflow)

    async def main() -> None:
        rt = _runtime(wf)
        view = await rt.wait_stable((await rt.create_run("release-notes", "v1.2")).run_id)
        assert view.pending_action is not None
        assert view.pending_action.request == {"context": {"draft": "Notes for v1.2 (round 1)"}}
        view = await rt.answer(view.run_id, view.pending_action.id, {"isConfirmed": False})
        assert view.pending_action is not None
        view = await rt.answer(view.run_id, view.pending_action.id, {"isConfirmed": True})
        assert view.status == "completed" and view.cursor.stage == "publish"

    asyncio.run(asyncio.wait_for(main(), 10))


# The documents a user copies Python from; a fragment (the body of a Step) is checked inside
# an async Step, and a name a fragment leaves to its reader is given a type here.
_DOCS = ("README.md", "docs/authoring.md", "docs/concepts.md", "docs/cli.md")
_FRAGMENT = "async def _fragment(ctx: intloom.StepContext[Any]) -> Any:\n"
_PRELUDE = "from typing import Any\n\nimport intloom\n\nproject_root = \".\"\n\n"


def test_every_python_example_in_the_docs_type_checks(tmp_path: Path) -> None:
    files = []
    for doc in _DOCS:
        blocks = re.findall(r"```python\n(.*?)```", (REPO / doc).read_text(), re.S)
        for i, code in enumerate(blocks):
            if re.search(r"^(await|return) ", code, re.M):
                code = _FRAGMENT + textwrap.indent(code, "    ")
            path = tmp_path / f"{Path(doc).stem}_{i}.py"
            path.write_text(_PRELUDE + code)
            files.append(str(path))
    assert len(files) >= 5  # the docs' examples were found
    # intloom from the repository: the test venv's editable install is an import hook, which
    # mypy does not follow.
    (tmp_path / "mypy.ini").write_text(f"[mypy]\nmypy_path = {REPO}\n")
    out, err, status = run_mypy(["--strict", "--config-file", str(tmp_path / "mypy.ini"),
                                "--cache-dir", str(tmp_path / "cache"), *files])
    assert status == 0, out + err


def test_the_ask_again_recipe_asks_again_with_why_then_completes() -> None:
    """docs/authoring.md's recipe for checking an answer and asking again runs as written."""
    text = (REPO / "docs" / "authoring.md").read_text()
    [code] = [block for block in re.findall(r"```python\n(.*?)```", text, re.S)
              if "class Count" in block]
    namespace: dict[str, object] = {"__name__": "count_recipe"}
    exec(compile(code, "count_recipe.py", "exec"), namespace)
    wf = namespace["wf"]
    assert isinstance(wf, Workflow)

    async def main() -> None:
        rt = _runtime(wf)
        view = await rt.wait_stable((await rt.create_run("count", "go")).run_id)
        assert view.pending_action is not None
        view = await rt.answer(view.run_id, view.pending_action.id,
                               [{"questionId": "n", "isSkipped": False, "answer": "abc"}])
        assert view.pending_action is not None
        assert view.pending_action.request[0]["description"] == (
            "'abc' is not a number from 1 to 10; try again."), view.pending_action.request
        view = await rt.answer(view.run_id, view.pending_action.id,
                               [{"questionId": "n", "isSkipped": False, "answer": "7"}])
        assert view.status == "completed", view

    asyncio.run(asyncio.wait_for(main(), 10))
