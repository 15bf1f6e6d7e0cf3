"""The examples of docs/authoring.md, copied out of the page and run through a real host:
what a user who copies them gets is what the page says (the in-memory run of the worked
example is tests/unit/test_docs_example.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from intloom.scaffold import scaffold
from tests.helpers import REPO, Project, ok, reaped

pytestmark = pytest.mark.e2e

AUTHORING = (REPO / "docs" / "authoring.md").read_text()


def _block(lang: str, index: int = 0) -> str:
    """The ``index``-th fenced block of ``lang`` in docs/authoring.md (``""``: unlabelled)."""
    blocks: list[tuple[str, str]] = re.findall(r"^```(\w*)\n(.*?)^```", AUTHORING, re.S | re.M)
    return [text for kind, text in blocks if kind == lang][index]


def _worked_example(tmp_path: Path, edit: tuple[str, str] | None = None) -> Project:
    """A project made of the page's intloom.toml and worked example, as a user pastes them."""
    toml, source = _block("toml"), _block("python")
    if edit is not None:
        assert source.count(edit[0]) == 1, edit
        source = source.replace(*edit)
    root = scaffold(tmp_path / "proj")  # intloom init: its workflows/example.py
    (root / "intloom.toml").write_text(toml)
    entry = re.search(r'workflows = \["workflows/example.py", "(\w+)"\]', toml)
    assert entry is not None, toml
    (root / entry.group(1)).mkdir()  # the package the page puts the example in
    (root / entry.group(1) / "__init__.py").write_text(source)
    return Project(root=root)


@pytest.fixture
def example(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(_worked_example(tmp_path))


def test_worked_example_runs_through_a_host_a_kill_and_a_restart(example: Project) -> None:
    ok(example.cli("start", "--json"))
    run = ok(example.cli("flow", "release-notes", "--intent", "v1.2", "--json"))["run"]
    assert run["status"] == "waiting", run
    assert run["pendingAction"]["request"] == {"context": {"draft": "Notes for v1.2 (round 1)"}}
    # Declined: "rejected" routes back to write, whose next round asks again.
    run = ok(example.cli("answer", run["runId"], run["pendingAction"]["id"],
                         '{"isConfirmed": false}', "--json"))["run"]
    assert run["pendingAction"]["request"] == {"context": {"draft": "Notes for v1.2 (round 2)"}}
    action = run["pendingAction"]["id"]
    example.kill_host()
    assert ok(example.cli("recover", "--json"))["recovered"] is True
    restore = ok(example.cli("start", "--json"))["service"]["restore"]
    assert restore["waiting"] == [run["runId"]], restore
    # review's recover is what the page says continues the wait: the same action answers it.
    done = ok(example.cli("answer", run["runId"], action, '{"isConfirmed": true}', "--json"))
    assert done["run"]["status"] == "completed", done
    assert done["run"]["cursor"] == {"stage": "publish", "step": "post"}, done
    records = ok(example.cli("inspect", run["runId"], "--json"))["records"]
    assert [r["record"]["name"] for r in records if r["phase"] == "effect_done"] == [
        "call-model", "call-model", "post"]
    ok(example.cli("stop", "--json"))


def test_route_mistake_sample_is_what_the_worked_example_with_the_typo_gives(
        tmp_path: Path) -> None:
    sample = " ".join(_block("").split())
    typo = re.search(r"routes to Step '(\w+)'", sample)
    assert typo is not None, sample
    project = _worked_example(
        tmp_path, ('routes={"written": "review"}', f'routes={{"written": "{typo.group(1)}"}}'))
    checks = project.cli("doctor", "--json").json["checks"]
    workflows = next(check for check in checks if check["id"] == "workflows")
    assert workflows["status"] == "attention", workflows
    assert f"WORKFLOW_DEFINITION_INVALID: {sample}" in workflows["message"], workflows


def test_no_complete_sample_is_what_the_worked_example_routed_round_gives(
        tmp_path: Path) -> None:
    """The page's sample of a Workflow no route of which completes, as doctor says it."""
    sample = " ".join(_block("", 1).split())
    assert "no Run of it could ever complete" in sample, sample
    project = _worked_example(
        tmp_path, ('"approved": intloom.ToStage("publish")', '"approved": "write"'))
    checks = project.cli("doctor", "--json").json["checks"]
    workflows = next(check for check in checks if check["id"] == "workflows")
    assert workflows["status"] == "attention", workflows
    assert f"WORKFLOW_DEFINITION_INVALID: {sample}" in workflows["message"], workflows
