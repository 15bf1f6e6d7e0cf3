"""``intloom attach`` whose stdout is read slowly (``attach RUN | (sleep 6; cat)``): it goes on
to the Run's view after a moment without progress, and the events not printed by then never
are. That was silent (944 of 9,004 events shown, exit 0, nothing on stderr); it now says so.
A real host, a real pipe left unread until attach has said it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO, Project, eventually, ok, one_source_project, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

MANY = textwrap.dedent('''
    import msgspec

    import intloom


    class Count(msgspec.Struct):
        n: int = 0


    many = intloom.Workflow("many", version="1")
    main = many.stage("main", state=Count)


    @main.step("tick", routes={"again": "tick", "done": intloom.COMPLETE})
    async def tick(ctx):
        ctx.state = Count(n=ctx.state.n + 1)
        return "again" if ctx.state.n < 3000 else "done"
''')


@pytest.fixture
def many(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "many", MANY))


def test_attach_read_too_slowly_says_which_events_it_did_not_print(many: Project) -> None:
    ok(many.cli("start", "--json"))
    run_id = ok(many.cli("flow", "many", "--intent", "x", "--detach", "--json"))["run"]["runId"]
    err: list[str] = []
    with subprocess.Popen(
            [sys.executable, "-m", "intloom", "--project", str(many.root), "attach", run_id],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)}) as proc:
        reader = threading.Thread(target=lambda: err.extend(proc.stderr or []))
        reader.start()
        try:
            # stdout unread: its pipe fills with the first events, and attach goes ahead.
            eventually(lambda: "were not printed" in "".join(err), timeout=60,
                       what="attach to say it went ahead of the events")
            out = proc.stdout.read() if proc.stdout is not None else ""
            assert proc.wait(timeout=30) == 0, "".join(err)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            reader.join(timeout=10)
    said = " ".join("".join(err).split())
    assert (f"so the events after the last one shown were not printed. intloom inspect "
            f"{run_id} shows every record.") in said, said
    lines = out.splitlines()
    assert any(line.startswith("Completed") for line in lines), out[-500:]
    shown = sum(1 for line in lines if " step_result " in line)
    assert 0 < shown < 3000, shown  # some, not all: the test read nothing meanwhile
