"""Errors the host's event loop reports (its exception handler): MemoryErrors that keep
coming are the host out of memory, fatal as any exception of its own (one alone is logged);
the same error again and again is logged once a minute. The callbacks are scheduled by a
Workflow Step, which reaches the loop as the host's own machinery does (a starved self-pipe
read raised MemoryError at every turn of the loop under ``ulimit -v``: 11 MiB of log a
second)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Project, eventually, ok, one_source_project, pid_alive, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SOURCE = '''
import asyncio

import intloom

wf = intloom.Workflow("loopy", version="1")
st = wf.stage("s")


def starved() -> None:
    raise MemoryError


def broken() -> None:
    raise RuntimeError("the same again")


@st.step("go", routes={"ok": intloom.COMPLETE})
async def go(ctx: intloom.StepContext[None]) -> str:
    loop = asyncio.get_running_loop()
    what = broken if ctx.intent == "again" else starved
    for _ in range(1 if ctx.intent == "once" else 500):
        loop.call_soon(what)
    await asyncio.sleep(0)  # they run in the loop's next turn, before this Step goes on
    return "ok"
'''


@pytest.fixture
def loopy(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "loopy", SOURCE))


def _log(project: Project) -> list[dict[str, object]]:
    [log] = sorted((project.state / "logs").glob("LOG-*.jsonl"))
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def test_the_same_loop_error_is_logged_once_a_minute(loopy: Project) -> None:
    ok(loopy.cli("start", "--json"))
    done = ok(loopy.cli("flow", "loopy", "--intent", "again", "--json"))["run"]
    assert done["status"] == "completed", done
    errors = [e for e in _log(loopy) if e["event"] == "task_error"]
    assert len(errors) == 1, errors  # 500 alike: one line (was one line each)
    assert errors[0]["error"] == "RuntimeError", errors
    ok(loopy.cli("stop", "--json"))


def test_one_memory_error_a_step_caused_is_logged_not_fatal(loopy: Project) -> None:
    """A callback a Step scheduled that asked for too much (bytearray(1 << 50)) with plenty
    of memory free: logged, the host goes on."""
    service = ok(loopy.cli("start", "--json"))["service"]
    done = ok(loopy.cli("flow", "loopy", "--intent", "once", "--json"))["run"]
    assert done["status"] == "completed", done
    assert [e["error"] for e in _log(loopy) if e["event"] == "task_error"] == ["MemoryError"]
    assert pid_alive(service["pid"])
    assert ok(loopy.cli("status", "--json"))["service"]["pid"] == service["pid"]
    ok(loopy.cli("stop", "--json"))


def test_the_host_out_of_memory_in_its_loop_ends_as_a_crash_would(loopy: Project) -> None:
    """MemoryErrors at every turn of the loop (a starved host's self-pipe read)."""
    service = ok(loopy.cli("start", "--json"))["service"]
    loopy.cli("flow", "loopy", "--intent", "starve", "--detach", "--json")
    eventually(lambda: not pid_alive(service["pid"]), timeout=30,
               what="the starved host to end")
    failed = [e for e in _log(loopy) if e["event"] == "process_failed"]
    assert len(failed) == 1 and failed[0]["origin"] == "out_of_memory", failed
    assert "ulimit -v" in str(failed[0]["detail"]), failed
    assert (loopy.state / "service.lock").exists()  # left, as a crash leaves it
    ok(loopy.cli("recover", "--json"))
    ok(loopy.cli("start", "--json"))
    ok(loopy.cli("stop", "--json"))
