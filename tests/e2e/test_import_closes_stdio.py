"""A Workflow module that closed stdout and stderr when imported (``os.close(2)``, a library
that detaches itself) left descriptors 1 and 2 free, and the host's next files took them:
the checkpoint log became descriptor 2. A Step's ``logging.warning(...)`` was then written
into the journal between its records and ``intloom verify`` found the segment corrupt. The
host now puts /dev/null back on 0, 1 and 2 after the imports."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Project, ok, one_source_project, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SOURCE = '''
import logging
import os
import sys

import intloom

os.close(0)
os.close(1)
os.close(2)

noisy = intloom.Workflow("noisy", version="1")
ns = noisy.stage("s")


@ns.step("a", routes={"ok": "b"})
def a(ctx: intloom.StepContext[None]) -> str:
    logging.warning("MARK-FROM-A-STEP " * 8)
    return "ok"


@ns.step("b", routes={"ok": intloom.COMPLETE})
async def b(ctx: intloom.StepContext[None]) -> str:
    sys.stderr.write("MARK-FROM-A-STEP\\n")
    sys.stderr.flush()
    return "ok"
'''


@pytest.fixture
def proj(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "noisy", SOURCE))


def test_a_module_closing_stdio_does_not_let_steps_write_into_the_journal(
    proj: Project,
) -> None:
    ok(proj.cli("start", "--json"))
    for n in range(3):
        run = ok(proj.cli("flow", "noisy", "--intent", f"n{n}", "--json"))["run"]
        assert run["status"] == "completed", run
    ok(proj.cli("stop", "--json"))
    for path in proj.state.rglob("*"):
        if path.is_file():
            assert b"MARK-FROM-A-STEP" not in path.read_bytes(), path
    verified = proj.cli("verify", "--json")
    assert verified.code == 0, (verified.stdout, verified.stderr)
    restarted = ok(proj.cli("start", "--json"))
    assert restarted["reused"] is False
    ok(proj.cli("stop", "--json"))
