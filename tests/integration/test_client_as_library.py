"""intloom.Client as a program uses it, against a real host: where it may be called from and
what each failure says."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from intloom.client.client import Client
from tests.helpers import Project, one_source_project, reaped
from tests.integration.host_support import start

pytestmark = pytest.mark.timeout(60)

SELF_CALL = textwrap.dedent('''
    import asyncio
    from pathlib import Path

    import msgspec

    import intloom
    from intloom.client import Client

    ROOT = Path(__file__).resolve().parent.parent


    class Seen(msgspec.Struct):
        pid: int = 0


    wf = intloom.Workflow("selfcall", version="1")
    main = wf.stage("main", state=Seen)


    def host_pid() -> int:
        with Client.connect(ROOT) as client:
            return client.status().pid


    @main.step("on_loop", routes={"done": intloom.COMPLETE, "thread": "in_thread"})
    async def on_loop(ctx: intloom.StepContext[Seen]) -> str:
        if ctx.intent == "thread":
            return "thread"
        ctx.state = Seen(pid=host_pid())
        return "done"


    @main.step("in_thread", routes={"done": intloom.COMPLETE})
    async def in_thread(ctx: intloom.StepContext[Seen]) -> str:
        ctx.state = Seen(pid=await asyncio.to_thread(host_pid))
        return "done"
''')


@pytest.fixture
def self_calling(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "selfcall", SELF_CALL))


def test_a_client_on_the_hosts_own_loop_is_refused_at_once_naming_the_fix(
        self_calling: Project) -> None:
    """An async Step connecting to its own project's host blocked the host's event loop for
    the hello's whole timeout (every Run and the CLI stalled 5 s), then failed with "a hung,
    paused or busy host, or another program on the port ... run intloom doctor". It is now
    refused before anything is sent, saying why and how to call it; the way it names works."""
    service = start(self_calling).service
    with Client.connect(self_calling.root) as client:
        failed = client.create_run("selfcall", "loop")
        assert failed.status == "failed", failed
        assert failed.last_error is not None
        assert failed.last_error.code == "INVALID_REQUEST", failed.last_error
        message = failed.last_error.message
        assert f"event loop of this project's host (pid {service.pid})" in message, message
        assert "await asyncio.to_thread(...)" in message, message
        assert "hung, paused or busy" not in message, message
        # The advice holds: the same call on a worker thread reaches the host.
        done = client.create_run("selfcall", "thread")
        assert done.status == "completed", done
        assert client.status().pid == service.pid
