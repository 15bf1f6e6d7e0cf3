"""A Step that closed stdout and stderr (``os.close(1)``, a library that detaches itself) left
descriptors 1 and 2 free while the host ran, and the host's next descriptors took them: a
command's connection became descriptor 1, so the Step's next ``print`` went into that
command's socket (the client read a broken frame), and a file the host created next (a
segment, a snapshot, its log) would have taken the Step's output into the journal. The host
now never holds a connection or a file of its own on 0, 1 or 2."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Project, ok, one_source_project, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SOURCE = '''
import os
import sys

import intloom

closes = intloom.Workflow("closes", version="1")
cs = closes.stage("s")


@cs.step("close", routes={"ok": "talk"})
def close(ctx: intloom.StepContext[None]) -> str:
    os.close(1)
    os.close(2)
    return "ok"


@cs.step("talk", routes={"ok": intloom.COMPLETE})
async def talk(ctx: intloom.StepContext[None]) -> str:
    await ctx.confirm({"q": "go on?"})
    # Written while this answer's own connection is open: it took descriptor 1 or 2 when
    # nothing kept them.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.write("MARK-FROM-A-STEP " * 64 + "\\n")
            stream.flush()
        except OSError:
            pass
    return "ok"
'''


@pytest.fixture
def proj(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "closes", SOURCE))


def test_a_step_closing_stdio_writes_into_no_connection_and_no_file(proj: Project) -> None:
    ok(proj.cli("start", "--json"))
    for n in range(3):
        run = ok(proj.cli("flow", "closes", "--intent", f"n{n}", "--json"))["run"]
        assert run["status"] == "waiting", run
        # Two connections at once (the answer's, and status's before it), so that both
        # freed numbers would be taken while the Step writes.
        ok(proj.cli("status", "--json"))
        ended = ok(proj.cli("answer", run["runId"], run["pendingAction"]["id"],
                            '{"isConfirmed": true}', "--json"))["run"]
        assert ended["status"] == "completed", ended
    ok(proj.cli("stop", "--json"))
    for path in proj.state.rglob("*"):
        if path.is_file():
            assert b"MARK-FROM-A-STEP" not in path.read_bytes(), path
    assert proj.cli("verify", "--json").code == 0


def test_a_file_the_host_creates_never_takes_a_freed_standard_descriptor(
        tmp_path: Path) -> None:
    target = tmp_path / "segment"
    script = textwrap.dedent(f"""
        import json, os, sys
        from pathlib import Path
        from intloom.fsutil import open_exclusive
        os.close(1)
        os.close(2)
        fd = open_exclusive(Path({str(target)!r}),
                            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC)
        seen, inherit = {{}}, {{}}
        for low in (1, 2):
            try:
                os.write(low, b"MARK-FROM-A-STEP")
                seen[low] = os.readlink(f"/proc/self/fd/{{low}}")
                inherit[low] = os.get_inheritable(low)
            except OSError as exc:
                seen[low] = exc.strerror
        os.write(fd, b"ours")
        Path({str(tmp_path / "report.json")!r}).write_text(json.dumps(
            {{"fd": fd, "seen": seen, "inherit": inherit,
              "cloexec": not os.get_inheritable(fd)}}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["fd"] > 2, report
    assert report["cloexec"] is True, report
    assert report["seen"] == {"1": "/dev/null", "2": "/dev/null"}, report
    assert report["inherit"] == {"1": True, "2": True}, report
    assert target.read_bytes() == b"ours"
