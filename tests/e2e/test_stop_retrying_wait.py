"""A Step that retries ``ctx.confirm`` in a loop catching everything (``except
BaseException: pass``), as real code around a flaky call does by mistake, hung the host's
stop: the stop's cancel of the wait was caught, and each new ``ctx.confirm`` was refused at
once (its earlier wait "still unanswered") without the Step ever yielding to the event loop.
The loop spun on the host's thread: the stop never got past its grace, nothing else was
served, and each refusal was kept until the OOM killer ended the host (24 GB here), its
service files left stale. A wait asked again while the host stops now waits for the stop's
cut instead of being refused at once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Project, eventually, ok, one_source_project, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SOURCE = '''
from pathlib import Path

import intloom

SEEN = Path(__file__).resolve().parent.parent / "seen.txt"

retry = intloom.Workflow("retry", version="1")
rs = retry.stage("s")


@rs.step("a", routes={"ok": intloom.COMPLETE})
async def a(ctx: intloom.StepContext[None]) -> str:
    # Bounded, so that the host this test starts without the fix spins through these
    # refusals and ends instead of growing until the OOM killer ends it.
    for _ in range(2000):
        try:
            await ctx.confirm({"q": "again?"})
            return "ok"
        except BaseException as exc:  # the mistake under test
            with SEEN.open("a") as f:
                f.write(type(exc).__name__ + "\\n")
    return "ok"


other = intloom.Workflow("other", version="1")
os_ = other.stage("s")


@os_.step("a", routes={"yes": intloom.COMPLETE, "no": intloom.COMPLETE})
async def b(ctx: intloom.StepContext[None]) -> str:
    answer = await ctx.confirm({"q": "go?"})
    return "yes" if answer.confirmed else "no"


@b.recover
def b_recover(ctx: intloom.StepContext[None], saved: intloom.Recovery) -> str:
    return "yes" if saved.answer.confirmed else "no"
'''


@pytest.fixture
def proj(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "retry", SOURCE))


def test_a_step_retrying_its_wait_through_a_stop_does_not_hang_it(proj: Project) -> None:
    env = {"INTLOOM_TEST_SUSPEND_GRACE": "1"}
    ok(proj.cli("start", "--json", env=env))
    other = ok(proj.cli("flow", "other", "--intent", "x", "--json"))["run"]
    retry = ok(proj.cli("flow", "retry", "--intent", "x", "--json"))["run"]
    assert other["status"] == retry["status"] == "waiting"

    began = time.monotonic()
    stopped = ok(proj.cli("stop", "--json", "--timeout", "60"))
    assert stopped["stopped"] is True
    assert time.monotonic() - began < 20

    # The Step heard the stop's cancellation (and the cut's), never a refusal it could spin on.
    seen = (proj.root / "seen.txt").read_text().split()
    assert seen and set(seen) == {"CancelledError"}, seen[:5]

    restarted = ok(proj.cli("start", "--json"))
    assert restarted["reused"] is False
    runs = {r["runId"]: r for r in ok(proj.cli("runs", "--json"))["runs"]}
    assert runs[other["runId"]]["status"] == "waiting"
    assert runs[retry["runId"]]["status"] == "failed"
    assert runs[retry["runId"]]["lastError"]["code"] == "RUN_INTERRUPTED"
    verified = proj.cli("verify", "--json")
    assert verified.code == 0, (verified.stdout, verified.stderr)
    ok(proj.cli("stop", "--json"))


EFFECT_SOURCE = '''
import asyncio
from pathlib import Path

import intloom

SEEN = Path(__file__).resolve().parent.parent / "seen.txt"

retry = intloom.Workflow("retry-effect", version="1")
rs = retry.stage("s")


@rs.step("a", routes={"ok": intloom.COMPLETE})
async def a(ctx: intloom.StepContext[None]) -> str:
    for n in range(2000):  # bounded, as above
        try:
            await ctx.aeffect("nap", asyncio.sleep, 100, key=f"k{n}")
        except BaseException as exc:  # the mistake under test
            with SEEN.open("a") as f:
                f.write(type(exc).__name__ + "\\n")
    return "ok"
'''


@pytest.fixture
def effect_proj(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "retry", EFFECT_SOURCE))


def test_a_step_retrying_its_effect_through_a_stop_is_interrupted(
    effect_proj: Project,
) -> None:
    """The same loop around ``ctx.aeffect``: the stop's cut left effect k0 in flight, the
    Step spun through refusals on the host's loop and returned, and its Run was recorded
    failed STEP_INTERACTION_INVALID instead of RUN_INTERRUPTED naming the effect."""
    proj = effect_proj
    env = {"INTLOOM_TEST_SUSPEND_GRACE": "1"}
    ok(proj.cli("start", "--json", env=env))
    run = ok(proj.cli("flow", "retry-effect", "--intent", "x", "--detach", "--json"))["run"]
    run_id = run["runId"]
    eventually(lambda: "effect_started" in proj.cli("inspect", run_id).stdout,
               timeout=20, what="the effect to be in flight")
    stopped = ok(proj.cli("stop", "--json", "--timeout", "60"))
    assert stopped["stopped"] is True
    seen = proj.root / "seen.txt"
    kinds = seen.read_text().split() if seen.exists() else []
    assert set(kinds) <= {"CancelledError"}, kinds[:5]
    ok(proj.cli("start", "--json"))
    [view] = [r for r in ok(proj.cli("runs", "--json"))["runs"] if r["runId"] == run_id]
    assert view["status"] == "failed"
    assert view["lastError"]["code"] == "RUN_INTERRUPTED", view["lastError"]
    assert "'nap'" in view["lastError"]["message"], view["lastError"]
    ok(proj.cli("stop", "--json"))
