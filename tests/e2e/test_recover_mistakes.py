"""Mistakes with ``ctx`` made in a Step's ``recover`` are named as recover's: they said only
"Stage 'main', Step 'x' ...", which sent the author to the Step's body, which had not run.
Real host, real CLI subprocesses, a real restart; every host is reaped."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Project, ok, one_source_project, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# Each kind's Step waits for a confirmation; its recover (run for the answer after a restart)
# makes one mistake with ctx.
RECOVERS = textwrap.dedent('''
    import msgspec

    import intloom


    class S(msgspec.Struct):
        n: int = 0


    wf = intloom.Workflow("recovers", version="1.0.0")
    main = wf.stage("main", state=S)
    KINDS = ["state_dict", "aeffect_sync", "effect_async_fn", "dup_key", "nested",
             "confirm_sync", "effect_awaitable", "confirm_unawaited", "ask_text", "long_key",
             "confirm_huge"]


    @main.step("pick", routes={kind: kind for kind in KINDS})
    def pick(ctx: intloom.StepContext[S]) -> str:
        return ctx.intent


    async def coro() -> int:
        return 1


    def rec_state_dict(ctx, saved):
        ctx.state = {"n": 1}
        return "done"


    def rec_aeffect_sync(ctx, saved):
        ctx.aeffect("x", print, 1)
        return "done"


    def rec_effect_async_fn(ctx, saved):
        ctx.effect("x", coro)
        return "done"


    def rec_dup_key(ctx, saved):
        ctx.effect("a", print, 1, key="k")
        ctx.effect("b", print, 1, key="k")
        return "done"


    def rec_nested(ctx, saved):
        ctx.effect("outer", lambda: ctx.effect("inner", lambda: 1))
        return "done"


    def rec_confirm_sync(ctx, saved):
        ctx.confirm({"n": 2})
        return "done"


    def rec_effect_awaitable(ctx, saved):
        ctx.effect("x", lambda: coro())
        return "done"


    async def rec_confirm_unawaited(ctx, saved):
        ctx.confirm({"n": 2})
        return "done"


    async def rec_ask_text(ctx, saved):
        await ctx.ask("what?")
        return "done"


    def rec_long_key(ctx, saved):
        ctx.effect("x", print, key="k" * 2000)
        return "done"


    async def rec_confirm_huge(ctx, saved):
        await ctx.confirm({"text": "x" * 300_000})
        return "done"


    def waits(kind):
        @main.step(kind, routes={"done": intloom.COMPLETE})
        async def step(ctx: intloom.StepContext[S]) -> str:
            await ctx.confirm({"n": 1})
            return "done"

        step.recover(globals()[f"rec_{kind}"])


    for kind in KINDS:
        waits(kind)
''')

# kind -> a fact of its error besides where it happened
FACTS = {
    "state_dict": "assigned ctx.state a dict",
    "aeffect_sync": "is sync and called ctx.aeffect, whose effect runs only when awaited in an "
                    "async Step. Use `ctx.effect(...)` in a sync Step, or make recover "
                    "`async def`",
    "effect_async_fn": "Make recover `async def` and write `await ctx.aeffect(...)`",
    "dup_key": "gave effect 'b' the key 'k', already the key of effect 'a'",
    "nested": "started effect 'inner' (key 'inner#1') while effect 'outer'",
    "confirm_sync": "is sync and called ctx.confirm, which waits for a person and works only "
                    "in an async Step. Make recover `async def`",
    "effect_awaitable": "records it failed. Make recover `async def`",
    "confirm_unawaited": "called ctx.confirm({'n': 2}) without awaiting it",
    "ask_text": ": ctx.ask was given str 'what?'",
    "long_key": ": the effect key given to ctx.effect is 2,000 characters",
    "confirm_huge": ": the context given to ctx.confirm is 300,023 bytes as JSON",
}


@pytest.fixture
def recovers(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "recovers", RECOVERS))


def test_a_ctx_mistake_in_recover_is_named_as_recovers(recovers: Project) -> None:
    ok(recovers.cli("start", "--json"))
    waiting = {}
    for kind in FACTS:
        run = ok(recovers.cli("flow", "recovers", "--intent", kind, "--json"))["run"]
        assert run["status"] == "waiting", run
        waiting[kind] = (run["runId"], run["pendingAction"]["id"])
    ok(recovers.cli("stop", "--json"))
    ok(recovers.cli("start", "--json"))  # each answer now goes to the Step's recover
    wrong = {}
    for kind, fact in FACTS.items():
        run_id, action_id = waiting[kind]
        result = recovers.cli("answer", run_id, action_id, '{"isConfirmed": true}', "--json")
        error = result.json["run"]["lastError"]
        assert error["code"] in ("STEP_INTERACTION_INVALID", "STAGE_STATE_INVALID"), error
        message = error["message"]
        if not message.startswith(f"Stage 'main', Step '{kind}' recover") or fact not in message:
            wrong[kind] = message
    assert wrong == {}
    ok(recovers.cli("stop", "--json"))
