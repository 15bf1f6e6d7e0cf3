"""``PYTHONDEVMODE=1 intloom start --foreground``: the event loop the host made for its
Workflow imports (host/boot.py ``_as_a_script_imports``) was never closed, so whenever the
cyclic collector reached it Python said "ResourceWarning: unclosed event loop". The CLI's
exit hides it (gc.freeze), so the wrapper here collects what remains after the command,
as any earlier full collection would. A real foreground CLI process stopped by SIGINT."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import Project, eventually

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

WRAPPER = textwrap.dedent('''
    import gc, sys
    sys.argv = ["intloom", "start", "--foreground"]
    from intloom.cli.entry import run
    try:
        run()
    finally:
        gc.unfreeze()
        gc.collect()
        print("collected", file=sys.stderr)
''')


def test_a_foreground_host_leaves_no_unclosed_event_loop(project: Project) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-X", "dev", "-c", WRAPPER], cwd=project.root, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "NO_COLOR": "1"})
    try:
        eventually(lambda: (project.state / "service.json").exists() or None, timeout=30,
                   what="the foreground host to serve")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 0, (out, err)
    assert "collected" in err, err
    assert "unclosed event loop" not in err, err


def test_a_loop_a_workflow_module_keeps_stays_open() -> None:
    """Closing the imports' loop must not close it under a module that kept it."""
    import asyncio

    from intloom.host.boot import _as_a_script_imports

    async def imports(code: str) -> dict[str, object]:
        namespace: dict[str, object] = {}
        with _as_a_script_imports():
            exec(code, namespace)
        return namespace

    kept = asyncio.run(imports("import asyncio\nLOOP = asyncio.get_event_loop()\n"))["LOOP"]
    assert isinstance(kept, asyncio.AbstractEventLoop)
    try:
        assert not kept.is_closed()
        assert kept.run_until_complete(asyncio.sleep(0, result=7)) == 7
    finally:
        kept.close()
