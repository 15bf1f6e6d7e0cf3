"""Mistakes in a Step's use of ``ctx`` fail the Run with an error that names the Step, the
fact and the fix, never an AttributeError from inside intloom. Real host, real CLI
subprocesses; every host is reaped."""

from __future__ import annotations

import functools
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Project, eventually, ok, one_source_project, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# One Workflow whose first Step routes to the mistake named by the Run's intent.
MISTAKES = textwrap.dedent('''
    """Each Step makes one mistake with ctx; the intent picks which Step runs."""

    from __future__ import annotations

    import asyncio
    from typing import Any

    import msgspec

    import intloom

    class Box(msgspec.Struct):
        extra: Any = None
        items: list[int] = []
        count: int = 0
        score: float = 0
        tags: set[str] = set()

    KINDS = ["ask_dicts", "ask_text", "confirm_sync", "confirm_unawaited", "duplicate_ids",
             "unencodable_state", "aeffect_sync", "wrong_field", "wrong_field_wait",
             "nested_effects", "duplicate_key", "exits", "float_wait", "set_wait",
             "confirm_dropped", "ask_dropped", "aeffect_dropped", "confirm_twice_at_once",
             "effect_while_waiting", "wait_while_effect", "confirm_timed_out",
             "ask_cancelled", "aeffect_other_loop", "unprintable",
             "unprintable_effect", "exits_unprintably", "interrupted_unprintably",
             "surrogate", "surrogate_effect", "effect_called", "aeffect_called", "effect_exits",
             "aeffect_exits", "task_group", "ask_generator", "retry_under_other_name"]
    wf = intloom.Workflow("mistakes", version="1.0.0")
    main = wf.stage("main", state=Box)


    @main.step("pick", routes={**{kind: kind for kind in KINDS},
                               "init_waits": intloom.ToStage("init_waits"),
                               "sync_init_waits": intloom.ToStage("sync_init_waits")})
    def pick(ctx: intloom.StepContext[Box]) -> str:
        return ctx.intent


    @main.step("ask_dicts", routes={"done": intloom.COMPLETE})
    async def ask_dicts(ctx: intloom.StepContext[Box]) -> str:
        await ctx.ask([{"id": "a", "question": "Which?"}])
        return "done"


    @main.step("ask_text", routes={"done": intloom.COMPLETE})
    async def ask_text(ctx: intloom.StepContext[Box]) -> str:
        await ctx.ask("what?")
        return "done"


    @main.step("ask_generator", routes={"done": intloom.COMPLETE})
    async def ask_generator(ctx: intloom.StepContext[Box]) -> str:
        await ctx.ask(intloom.Question(id=f"q{n}", question="Which?") for n in range(2))
        return "done"


    @main.step("confirm_sync", routes={"yes": intloom.COMPLETE, "no": intloom.COMPLETE})
    def confirm_sync(ctx: intloom.StepContext[Box]) -> str:
        answer = ctx.confirm({"n": 1})
        return "yes" if answer.confirmed else "no"


    @main.step("confirm_unawaited", routes={"yes": intloom.COMPLETE, "no": intloom.COMPLETE})
    async def confirm_unawaited(ctx: intloom.StepContext[Box]) -> str:
        answer = ctx.confirm({"n": 1})
        return "yes" if answer.confirmed else "no"


    @main.step("confirm_dropped", routes={"done": intloom.COMPLETE})
    async def confirm_dropped(ctx: intloom.StepContext[Box]) -> str:
        ctx.confirm({"a": 1})  # no await: nobody would be asked
        return "done"


    @main.step("ask_dropped", routes={"done": intloom.COMPLETE})
    async def ask_dropped(ctx: intloom.StepContext[Box]) -> str:
        ctx.ask([intloom.Question(id="topic", question="Topic?")])
        return "done"


    @main.step("aeffect_dropped", routes={"done": intloom.COMPLETE})
    async def aeffect_dropped(ctx: intloom.StepContext[Box]) -> str:
        ctx.aeffect("charge", print, "charged")  # no await: the effect would never run
        return "done"


    @main.step("confirm_twice_at_once", routes={"done": intloom.COMPLETE})
    async def confirm_twice_at_once(ctx: intloom.StepContext[Box]) -> str:
        await asyncio.gather(ctx.confirm({"n": 1}), ctx.confirm({"n": 2}))
        return "done"


    @main.step("confirm_timed_out", routes={"done": intloom.COMPLETE})
    async def confirm_timed_out(ctx: intloom.StepContext[Box]) -> str:
        try:
            await asyncio.wait_for(ctx.confirm({"n": 1}), 0.05)
        except TimeoutError:
            pass  # "nobody answered in time": the Run still waits in its journal
        return "done"


    @main.step("ask_cancelled", routes={"done": intloom.COMPLETE})
    async def ask_cancelled(ctx: intloom.StepContext[Box]) -> str:
        asked = asyncio.ensure_future(ctx.ask([intloom.Question(id="q", question="Go?")]))
        await asyncio.sleep(0.05)
        asked.cancel()
        await asyncio.gather(asked, return_exceptions=True)
        return "done"


    async def _charge(ctx: intloom.StepContext[Box]) -> None:
        await ctx.aeffect("charge", asyncio.sleep, 0)


    @main.step("aeffect_other_loop", routes={"done": intloom.COMPLETE})
    async def aeffect_other_loop(ctx: intloom.StepContext[Box]) -> str:
        await asyncio.to_thread(asyncio.run, _charge(ctx))
        return "done"


    @main.step("effect_while_waiting", routes={"done": intloom.COMPLETE})
    async def effect_while_waiting(ctx: intloom.StepContext[Box]) -> str:
        await asyncio.gather(ctx.confirm({"n": 1}), ctx.aeffect("charge", asyncio.sleep, 0))
        return "done"


    @main.step("wait_while_effect", routes={"done": intloom.COMPLETE})
    async def wait_while_effect(ctx: intloom.StepContext[Box]) -> str:
        await asyncio.gather(ctx.aeffect("charge", asyncio.sleep, 0.05), ctx.confirm({"n": 1}))
        return "done"


    init_waits = wf.stage("init_waits", state=Box)
    sync_init_waits = wf.stage("sync_init_waits", state=Box)


    @init_waits.init
    async def init_confirm(ctx: intloom.StepContext[Box]) -> Box:
        await ctx.confirm({"n": 1})
        return Box()


    @sync_init_waits.init
    def sync_init_confirm(ctx: intloom.StepContext[Box]) -> Box:
        ctx.confirm({"n": 1})
        return Box()


    @init_waits.step("first", routes={"done": intloom.COMPLETE})
    def first(ctx: intloom.StepContext[Box]) -> str:
        return "done"


    @sync_init_waits.step("sync_first", routes={"done": intloom.COMPLETE})
    def sync_first(ctx: intloom.StepContext[Box]) -> str:
        return "done"


    @main.step("aeffect_sync", routes={"done": intloom.COMPLETE})
    def aeffect_sync(ctx: intloom.StepContext[Box]) -> str:
        ctx.aeffect("charge", print, "charged")  # never awaited: the effect would never run
        return "done"


    @main.step("duplicate_ids", routes={"done": intloom.COMPLETE})
    async def duplicate_ids(ctx: intloom.StepContext[Box]) -> str:
        await ctx.ask([intloom.Question(id="a", question="One?"),
                       intloom.Question(id="a", question="Two?")])
        return "done"


    @main.step("unencodable_state", routes={"done": intloom.COMPLETE})
    def unencodable_state(ctx: intloom.StepContext[Box]) -> str:
        ctx.state = Box(extra=object())
        return "done"


    @main.step("wrong_field", routes={"done": "after"})
    def wrong_field(ctx: intloom.StepContext[Box]) -> str:
        ctx.state.items.append("not-an-int")
        return "done"


    @main.step("after", routes={"done": intloom.COMPLETE})
    async def after(ctx: intloom.StepContext[Box]) -> str:
        return "done"


    @main.step("wrong_field_wait", routes={"yes": intloom.COMPLETE, "no": intloom.COMPLETE})
    async def wrong_field_wait(ctx: intloom.StepContext[Box]) -> str:
        ctx.state = Box(count=1.5)
        answer = await ctx.confirm({"n": 1})
        return "yes" if answer.confirmed else "no"


    @wrong_field_wait.recover
    def wrong_field_wait_recover(ctx: intloom.StepContext[Box], saved: intloom.Recovery) -> str:
        return "yes" if saved.answer.confirmed else "no"


    @main.step("nested_effects", routes={"done": intloom.COMPLETE})
    def nested_effects(ctx: intloom.StepContext[Box]) -> str:
        ctx.effect("outer", lambda: ctx.effect("inner", lambda: 1))
        return "done"


    @main.step("duplicate_key", routes={"done": intloom.COMPLETE})
    def duplicate_key(ctx: intloom.StepContext[Box]) -> str:
        ctx.effect("one", print, "one", key="k")
        ctx.effect("two", print, "two", key="k")
        return "done"


    def declined() -> None:
        raise ValueError("card declined")


    @main.step("retry_under_other_name", routes={"done": intloom.COMPLETE})
    def retry_under_other_name(ctx: intloom.StepContext[Box]) -> str:
        try:
            ctx.effect("a", declined, key="k")
        except ValueError:
            pass
        ctx.effect("b", print, "b", key="k")
        return "done"


    class Unprintable(Exception):
        def __str__(self) -> str:  # a library's exception whose message cannot be built
            raise RuntimeError("no message")


    def refuse() -> None:
        raise Unprintable()


    @main.step("unprintable", routes={"done": intloom.COMPLETE})
    def unprintable(ctx: intloom.StepContext[Box]) -> str:
        refuse()
        return "done"


    @main.step("unprintable_effect", routes={"done": intloom.COMPLETE})
    def unprintable_effect(ctx: intloom.StepContext[Box]) -> str:
        ctx.effect("charge", refuse, key="order-7")
        return "done"


    def lone_surrogate() -> None:
        # A str a Python exception may hold (os.fsdecode of a name that is not UTF-8, say)
        # that UTF-8, and so the journal and the socket, cannot carry.
        raise ValueError("bad name \\udcff here")


    @main.step("surrogate", routes={"done": intloom.COMPLETE})
    def surrogate(ctx: intloom.StepContext[Box]) -> str:
        lone_surrogate()
        return "done"


    @main.step("surrogate_effect", routes={"done": intloom.COMPLETE})
    def surrogate_effect(ctx: intloom.StepContext[Box]) -> str:
        ctx.effect("charge", lone_surrogate, key="order-7")
        return "done"


    def charge(order: str) -> dict[str, str]:
        return {"charged": order}


    async def acharge(order: str) -> dict[str, str]:
        return {"charged": order}


    @main.step("effect_called", routes={"done": intloom.COMPLETE})
    def effect_called(ctx: intloom.StepContext[Box]) -> str:
        ctx.effect("charge", charge("order-7"))  # called, not passed
        return "done"


    @main.step("aeffect_called", routes={"done": intloom.COMPLETE})
    async def aeffect_called(ctx: intloom.StepContext[Box]) -> str:
        await ctx.aeffect("charge", acharge("order-7"))  # called, not passed
        return "done"


    @main.step("effect_exits", routes={"done": intloom.COMPLETE})
    def effect_exits(ctx: intloom.StepContext[Box]) -> str:
        ctx.effect("bye", exit_with, 4, key="k4")
        return "done"


    @main.step("aeffect_exits", routes={"done": intloom.COMPLETE})
    async def aeffect_exits(ctx: intloom.StepContext[Box]) -> str:
        await ctx.aeffect("bye", exit_with, 5, key="k5")
        return "done"


    async def decline(n: int) -> None:
        raise ValueError(f"card {n} declined")


    @main.step("task_group", routes={"done": intloom.COMPLETE})
    async def task_group(ctx: intloom.StepContext[Box]) -> str:
        async with asyncio.TaskGroup() as group:
            for n in range(5):
                group.create_task(decline(n))
        return "done"


    def exit_with(code: int) -> None:
        raise SystemExit(code)


    @main.step("exits", routes={"done": intloom.COMPLETE})
    def exits(ctx: intloom.StepContext[Box]) -> str:
        raise SystemExit(3)


    class NoRepr:
        def __repr__(self) -> str:  # an object whose repr cannot be built
            raise RuntimeError("no repr")


    @main.step("exits_unprintably", routes={"done": intloom.COMPLETE})
    def exits_unprintably(ctx: intloom.StepContext[Box]) -> str:
        raise SystemExit(NoRepr())


    @main.step("interrupted_unprintably", routes={"done": intloom.COMPLETE})
    async def interrupted_unprintably(ctx: intloom.StepContext[Box]) -> str:
        raise KeyboardInterrupt(NoRepr())


    @main.step("float_wait", routes={"yes": intloom.COMPLETE, "no": intloom.COMPLETE})
    async def float_wait(ctx: intloom.StepContext[Box]) -> str:
        ctx.state = Box(score=1)  # an int in a float field: the next decode makes it 1.0
        answer = await ctx.confirm({"score": ctx.state.score})
        return "yes" if answer.confirmed else "no"


    @float_wait.recover
    def float_wait_recover(ctx: intloom.StepContext[Box], saved: intloom.Recovery) -> str:
        return "yes" if saved.answer.confirmed else "no"


    @main.step("set_wait", routes={"yes": intloom.COMPLETE, "no": intloom.COMPLETE})
    async def set_wait(ctx: intloom.StepContext[Box]) -> str:
        # A set iterates in an order the process's hash seed decides.
        ctx.state = Box(tags={f"tag-{i}" for i in range(40)})
        answer = await ctx.confirm({"tags": len(ctx.state.tags)})
        return "yes" if answer.confirmed else "no"


    @set_wait.recover
    def set_wait_recover(ctx: intloom.StepContext[Box], saved: intloom.Recovery) -> str:
        assert ctx.state.tags == {f"tag-{i}" for i in range(40)}
        return "yes" if saved.answer.confirmed else "no"
''')

# A Stage State that is not a msgspec.Struct: refused when the module is loaded.
NOT_A_STRUCT = textwrap.dedent('''
    import intloom

    class St:
        n: int = 0

    wf = intloom.Workflow("not-a-struct", version="1.0.0")
    main = wf.stage("main", state=St)
''')


@pytest.fixture
def mistakes(tmp_path: Path) -> Iterator[Project]:
    root = tmp_path / "proj"
    for name, text in (("mistakes", MISTAKES), ("not_a_struct", NOT_A_STRUCT)):
        (root / "workflows" / name).mkdir(parents=True)
        (root / "workflows" / name / f"{name}.py").write_text(text)
    (root / "intloom.toml").write_text(
        'workflows = ["workflows/mistakes/mistakes.py", '
        '"workflows/not_a_struct/not_a_struct.py"]\n')
    yield from reaped(Project(root=root))


def _failure(project: Project, kind: str) -> dict[str, Any]:
    result = project.cli("flow", "mistakes", "--intent", kind, "--json")
    assert result.code == 1, (result.code, result.stdout, result.stderr)
    run = result.json["run"]
    assert run["status"] == "failed", run
    error: dict[str, Any] = run["lastError"]
    assert "AttributeError" not in error["message"], error
    return error


FIX = "Pass a list of intloom.Question"


@pytest.mark.parametrize(("kind", "facts"), [
    ("ask_dicts", ["Stage 'main', Step 'ask_dicts'", "question 0", "dict", FIX]),
    ("ask_text", ["Stage 'main', Step 'ask_text'", "str 'what?'", FIX]),
    ("ask_generator", ["Stage 'main', Step 'ask_generator': ctx.ask was given a generator, "
                       "not a list of questions; nothing was asked. Make it a list: "
                       "`[intloom.Question(...) for ...]` rather than `(... for ...)`"]),
    ("confirm_sync", ["Stage 'main', Step 'confirm_sync' is sync", "ctx.confirm",
                      "Make the Step `async def`", "await ctx.confirm("]),
    ("confirm_unawaited", ["Stage 'main', Step 'confirm_unawaited'", "without awaiting",
                           "await ctx.confirm("]),
    ("confirm_dropped", ["Stage 'main', Step 'confirm_dropped' called ctx.confirm({'a': 1}) "
                         "without awaiting it", "nobody was asked to confirm",
                         "`answer = await ctx.confirm(...)`"]),
    ("ask_dropped", ["Stage 'main', Step 'ask_dropped' called ctx.ask([...]) (questions "
                     "['topic']) without awaiting it", "`answers = await ctx.ask([...])`"]),
    ("aeffect_dropped", ["Stage 'main', Step 'aeffect_dropped' called ctx.aeffect('charge', "
                         "...) (key 'charge#1') without awaiting it", "the effect never ran",
                         "`result = await ctx.aeffect('charge', ...)`"]),
    ("duplicate_ids", ["Stage 'main', Step 'duplicate_ids'", "repeat ['a']", "its own id"]),
    ("init_waits", ["Stage 'init_waits' initialiser cannot wait for a confirmation answer",
                    "only a Step waits", "Ask in a Step of the Stage"]),
    ("sync_init_waits", ["Stage 'sync_init_waits' initialiser cannot wait for a confirmation "
                         "answer", "only a Step waits", "Ask in a Step of the Stage"]),
    ("aeffect_sync", ["Stage 'main', Step 'aeffect_sync' is sync", "ctx.aeffect",
                      "Use `ctx.effect(...)`", "await ctx.aeffect("]),
    ("nested_effects", ["Stage 'main', Step 'nested_effects' started effect 'inner'",
                        "while effect 'outer'", "cannot be nested", "one after another"]),
    ("duplicate_key", ["Stage 'main', Step 'duplicate_key' gave effect 'two' the key 'k'",
                       "already the key of effect 'one'", "its own key"]),
    # Effect 'a' raised, so "Only a call that raised may be retried under its key" read as
    # if 'b' should have been allowed: a retry is the same name under the same key.
    ("retry_under_other_name", [
        "Stage 'main', Step 'retry_under_other_name' gave effect 'b' the key 'k', already the "
        "key of effect 'a' in this Step", "'k' belongs to effect 'a': only a call of 'a' may "
        "reuse it, to retry it after it raised", "Give effect 'b' its own key",
        "or call 'a' under 'k' if this call is its retry"]),
    # An async Step's call awaited on an event loop of a thread's own was named as a sync
    # Step's ("is sync and called ctx.aeffect"), a fact its author could not find.
    ("aeffect_other_loop", ["Stage 'main', Step 'aeffect_other_loop' called "
                            "ctx.aeffect on an event loop other than the host's",
                            "await ctx.aeffect(...)` in the Step itself"]),
])
def test_a_misused_interaction_names_the_step_and_the_fix(
    mistakes: Project, kind: str, facts: list[str]
) -> None:
    ok(mistakes.cli("start", "--json"))
    error = _failure(mistakes, kind)
    assert error["code"] == "STEP_INTERACTION_INVALID", error
    for fact in facts:
        assert fact in error["message"], (fact, error["message"])
    ok(mistakes.cli("stop", "--json"))


@pytest.mark.parametrize(("kind", "facts"), [
    ("confirm_twice_at_once", [
        "Stage 'main', Step 'confirm_twice_at_once' asked for a confirmation while its "
        "wait on confirmation ASK-", "was still unanswered", "not together in asyncio.gather"]),
    ("effect_while_waiting", [
        "Stage 'main', Step 'effect_while_waiting' started effect 'charge' (key 'charge#1') "
        "while its wait on confirmation ASK-", "was still unanswered",
        "not together in asyncio.gather"]),
    ("wait_while_effect", [
        "Stage 'main', Step 'wait_while_effect' asked for a confirmation while effect "
        "'charge' (key 'charge#1') was still running", "not together in asyncio.gather"]),
])
def test_waiting_alongside_another_wait_or_an_effect_names_the_step_and_the_fix(
    mistakes: Project, kind: str, facts: list[str],
) -> None:
    """A Step waits for one answer at a time, and not while an effect runs: both are
    journaled one after another. asyncio.gather of two waits, or of a wait and an effect,
    failed the Run with "raised IllegalTransition: ... record 6 (waiting) cannot follow
    waiting", the journal's own rule quoted as the Step's exception, naming no fix. (The
    first wait may be shown for a moment: it was made durable before the second began.)"""
    error = _failed(mistakes, kind)
    assert error["code"] == "STEP_INTERACTION_INVALID", error
    for fact in facts:
        assert fact in error["message"], (fact, error["message"])
    ok(mistakes.cli("stop", "--json"))


@pytest.mark.parametrize(("kind", "facts"), [
    ("confirm_timed_out", [
        "Stage 'main', Step 'confirm_timed_out' stopped waiting for its confirmation ASK-",
        "before it was answered (its await was cancelled", "asyncio.wait_for",
        # Not "the Run still waits for that answer": it fails here, with no wait left.
        "so no outcome could follow it and the Run fails here, its wait closed with it",
        "Await ctx.confirm(...) until it is answered"]),
    ("ask_cancelled", [
        "Stage 'main', Step 'ask_cancelled' stopped waiting for its questions ASK-",
        "Await ctx.ask(...) until it is answered"]),
])
def test_a_step_that_stops_waiting_before_the_answer_names_the_wait_and_the_fix(
    mistakes: Project, kind: str, facts: list[str],
) -> None:
    """A Step whose wait was cancelled under it (``asyncio.wait_for`` around
    ``ctx.confirm``, or a cancelled task that awaited ``ctx.ask``) and that then returned
    its outcome failed the Run with CLI_INTERNAL_ERROR "The host failed while driving the Run
    (IllegalTransition)": its journal still waited for the answer. Nothing is recorded of
    the outcome, and the error names the wait and the fix."""
    error = _failed(mistakes, kind)
    assert error["code"] == "STEP_INTERACTION_INVALID", error
    for fact in facts:
        assert fact in error["message"], (fact, error["message"])
    run_id = ok(mistakes.cli("runs", "--json"))["runs"][-1]["runId"]
    phases = [r["phase"] for r in ok(mistakes.cli("inspect", run_id, "--json"))["records"]]
    assert phases[-2:] == ["waiting", "terminal"], phases
    ok(mistakes.cli("stop", "--json"))


def test_an_unencodable_state_names_the_step_and_the_fix(mistakes: Project) -> None:
    ok(mistakes.cli("start", "--json"))
    error = _failure(mistakes, "unencodable_state")
    assert error["code"] == "STAGE_STATE_INVALID", error
    message = error["message"]
    assert message.startswith("Stage 'main', Step 'unencodable_state': "), message
    assert "Box" in message and "cannot be encoded as JSON ($.extra is object: " in message
    assert "plain data" in message
    ok(mistakes.cli("stop", "--json"))


def test_a_state_that_is_not_a_struct_is_named_as_written(mistakes: Project) -> None:
    ok(mistakes.cli("start", "--json"))
    flows = ok(mistakes.cli("flows", "--json"))["workflows"]
    [problem] = [w["problem"] for w in flows if not w["ready"]]
    assert "WORKFLOW_DEFINITION_INVALID" in problem
    assert "state St is not a msgspec.Struct type" in problem, problem
    assert "_intloom_wf_" not in problem and "<class" not in problem
    ok(mistakes.cli("stop", "--json"))


def _phases(project: Project, run_id: str) -> list[tuple[str, Any]]:
    records = ok(project.cli("inspect", run_id, "--json"))["records"]
    return [(r["phase"], r["record"].get("step", r["record"].get("name"))) for r in records]


@pytest.mark.parametrize(("kind", "path"), [("wrong_field", "$.items[0]"),
                                            ("wrong_field_wait", "$.count")])
def test_a_state_field_of_the_wrong_type_fails_the_step_that_left_it(
    mistakes: Project, kind: str, path: str
) -> None:
    """Saved unchecked, such a State failed the next Step as CLI_INTERNAL_ERROR, or, saved with
    a wait, held the Run after a restart ("saved State no longer decodes")."""
    ok(mistakes.cli("start", "--json"))
    error = _failure(mistakes, kind)
    assert error["code"] == "STAGE_STATE_INVALID", error
    message = error["message"]
    assert message.startswith(f"Stage 'main', Step '{kind}': "), message
    for fact in ("not a valid Box", path, "value of its declared type"):
        assert fact in message, (fact, message)
    run_id = ok(mistakes.cli("runs", "--json"))["runs"][-1]["runId"]
    phases = _phases(mistakes, run_id)
    assert phases[-2:] == [("executing", kind), ("terminal", None)], phases
    ok(mistakes.cli("stop", "--json"))


def test_a_step_that_exits_fails_its_run_and_says_so(mistakes: Project) -> None:
    ok(mistakes.cli("start", "--json"))
    error = _failure(mistakes, "exits")
    assert error["code"] == "STEP_EXECUTION_FAILED", error
    message = error["message"]
    line = MISTAKES.splitlines().index("    raise SystemExit(3)") + 1
    assert message.startswith(f"Stage 'main', Step 'exits' raised SystemExit(3) at line {line} "
                              "of workflows/mistakes/mistakes.py ("), message
    assert "must not exit the process" in message and "raise an exception instead" in message
    assert ok(mistakes.cli("status", "--json"))["service"]  # the host is still serving
    ok(mistakes.cli("stop", "--json"))


@pytest.mark.parametrize(("kind", "raised"), [("exits_unprintably", "SystemExit"),
                                               ("interrupted_unprintably", "KeyboardInterrupt")])
def test_an_exit_whose_argument_cannot_be_shown_fails_its_run(
    mistakes: Project, kind: str, raised: str,
) -> None:
    """A Step raising SystemExit (or KeyboardInterrupt) with an argument whose __repr__
    raises left its Run running for ever, with nothing logged: naming the exit as a call
    (``SystemExit(...)``) raised inside the error handling. A stop then cut the Run, and
    the next start reported it RUN_INTERRUPTED. The Run fails, naming the argument's type."""
    error = _failed(mistakes, kind)
    assert error["code"] == "STEP_EXECUTION_FAILED", error
    assert error["message"].startswith(
        f"Stage 'main', Step '{kind}' raised {raised}(<NoRepr object: its __repr__ raised "
        "RuntimeError>)"), error
    ok(mistakes.cli("stop", "--json"))


@pytest.mark.parametrize("kind", ["unprintable", "unprintable_effect"])
def test_an_exception_whose_message_cannot_be_built_is_named_by_its_type(
    mistakes: Project, kind: str,
) -> None:
    """An exception whose __str__ raises (a library's, say) failed the Run with
    CLI_INTERNAL_ERROR "The host failed while driving the Run (RuntimeError)", and from an
    effect it left no effect_done: the journal showed the effect in flight, its outcome
    unknown, though it had raised. The Step's error names the type instead."""
    ok(mistakes.cli("start", "--json"))
    error = _failure(mistakes, kind)
    assert error["code"] == "STEP_EXECUTION_FAILED", error
    from_effect = (", from effect 'charge' (key 'order-7'), journaled done with that error"
                   if kind == "unprintable_effect" else "")
    line = MISTAKES.splitlines().index("    raise Unprintable()") + 1
    assert error["message"] == (
        f"Stage 'main', Step '{kind}' raised Unprintable at line {line} of "
        "workflows/mistakes/mistakes.py: (its message cannot be shown: its __str__ raised "
        f"RuntimeError){from_effect}"), error
    if kind == "unprintable_effect":
        run_id = ok(mistakes.cli("runs", "--json"))["runs"][-1]["runId"]
        [done] = [r["record"] for r in ok(mistakes.cli("inspect", run_id, "--json"))[
            "records"] if r["phase"] == "effect_done"]
        assert (done["ok"], done["error"]) == (False, (
            "Unprintable: (its message cannot be shown: its __str__ raised RuntimeError)"))
    ok(mistakes.cli("stop", "--json"))


@pytest.mark.parametrize("kind", ["surrogate", "surrogate_effect"])
def test_an_exception_message_utf8_cannot_carry_fails_the_run_naming_it(
    mistakes: Project, kind: str,
) -> None:
    """A message holding a lone surrogate could not be journaled: the failure's own record
    raised UnicodeEncodeError, the Run stayed "running" for ever with nothing driving it,
    and nothing was logged. The message now keeps the character as its escape."""
    ok(mistakes.cli("start", "--json"))
    run_id = ok(mistakes.cli("flow", "mistakes", "--intent", kind, "--detach", "--json"))[
        "run"]["runId"]
    run = eventually(lambda: next(
        (r for r in ok(mistakes.cli("runs", "--json"))["runs"]
         if r["runId"] == run_id and r["status"] != "running"), None),
        timeout=20, what=f"{run_id} to end")
    from_effect = (", from effect 'charge' (key 'order-7'), journaled done with that error"
                   if kind == "surrogate_effect" else "")
    assert run["status"] == "failed", run
    assert re.fullmatch(
        rf"Stage 'main', Step '{kind}' raised ValueError at line \d+ of "
        rf"workflows/mistakes/mistakes\.py: bad name \\udcff here{re.escape(from_effect)}",
        run["lastError"]["message"]), run
    if kind == "surrogate_effect":
        [done] = [r["record"] for r in ok(mistakes.cli("inspect", run_id, "--json"))[
            "records"] if r["phase"] == "effect_done"]
        assert (done["ok"], done["error"]) == (False, "ValueError: bad name \\udcff here")
    ok(mistakes.cli("stop", "--json"))


def test_an_int_in_a_float_field_survives_a_restart(mistakes: Project) -> None:
    """Saved as 1, it decoded to 1.0 and re-encoded as 1.0: a restart held the Run
    (JOURNAL_INCOMPATIBLE, "no longer matches its schema output") though nothing changed."""
    ok(mistakes.cli("start", "--json"))
    run = ok(mistakes.cli("flow", "mistakes", "--intent", "float_wait", "--json"))["run"]
    assert run["status"] == "waiting", run
    ok(mistakes.cli("stop", "--json"))
    restore = ok(mistakes.cli("start", "--json"))["service"]["restore"]
    assert restore["needsAttention"] == [] and restore["waiting"] == [run["runId"]], restore
    done = ok(mistakes.cli("answer", run["runId"], run["pendingAction"]["id"],
                           '{"isConfirmed": true}', "--json"))["run"]
    assert done["status"] == "completed", done
    ok(mistakes.cli("stop", "--json"))


def test_a_set_in_the_state_survives_a_restart_under_another_hash_seed(
    mistakes: Project,
) -> None:
    """A set was saved in its iteration order, which the host's hash seed decides: a host
    with another seed re-encoded it in another order and held the Run ("no longer matches
    its schema output"). It is saved sorted now."""
    ok(mistakes.cli("start", "--json", env={"PYTHONHASHSEED": "1"}))
    run = ok(mistakes.cli("flow", "mistakes", "--intent", "set_wait", "--json"))["run"]
    assert run["status"] == "waiting", run
    ok(mistakes.cli("stop", "--json"))
    restore = ok(mistakes.cli("start", "--json", env={"PYTHONHASHSEED": "2"}))["service"][
        "restore"]
    assert restore["needsAttention"] == [] and restore["waiting"] == [run["runId"]], restore
    done = ok(mistakes.cli("answer", run["runId"], run["pendingAction"]["id"],
                           '{"isConfirmed": true}', "--json"))["run"]
    assert done["status"] == "completed", done
    ok(mistakes.cli("stop", "--json"))


STR_OUTCOMES = textwrap.dedent('''
    """Steps returning their outcome as a str subclass (numpy.str_, a library's text type)."""

    import intloom


    class Label(str):
        """A str subclass, as numpy.str_ and many libraries' text types are."""


    wf = intloom.Workflow("labels", version="1.0.0")
    main = wf.stage("main")


    @main.step("classify", routes={"spam": "recheck"})
    def classify(ctx: intloom.StepContext[None]) -> str:
        return Label("spam")


    @main.step("recheck", routes={"spam": intloom.COMPLETE})
    async def recheck(ctx: intloom.StepContext[None]) -> str:
        return Label("spam")
''')


def test_an_outcome_returned_as_a_str_subclass_routes_as_its_text(tmp_path: Path) -> None:
    """An outcome is a str: one of a str subclass (numpy.str_, say, picked from an array of
    labels) passed the route check, then failed the Run with RUN_STATE_INVALID "its
    StepResult record cannot be written to the journal (TypeError: Encoding objects of type
    Label is unsupported)". It is recorded and routed as its text."""
    for project in reaped(one_source_project(tmp_path, "labels", STR_OUTCOMES)):
        ok(project.cli("start", "--json"))
        run = project.cli("flow", "labels", "--intent", "i", "--json").json["run"]
        assert (run["status"], run.get("lastError")) == ("completed", None), run
        outcomes = [r["record"]["outcome"] for r in ok(project.cli(
            "inspect", run["runId"], "--json"))["records"] if r["phase"] == "step_result"]
        assert outcomes == ["spam", "spam"]
        ok(project.cli("stop", "--json"))


def _failed(mistakes: Project, kind: str) -> dict[str, Any]:
    """Start the host, run the ``kind`` Step's Run detached, and return its error once it
    has failed (from ``inspect``, which reads the journal)."""
    ok(mistakes.cli("start", "--json"))
    run_id = ok(mistakes.cli("flow", "mistakes", "--intent", kind, "--detach", "--json"))[
        "run"]["runId"]

    def ended() -> dict[str, Any] | None:
        run: dict[str, Any] = ok(mistakes.cli("inspect", run_id, "--json"))["run"]
        return run if run["status"] == "failed" else None

    error: dict[str, Any] = eventually(ended, timeout=30, what=f"{kind} to fail")["lastError"]
    return error


CHANGES_ITSELF = textwrap.dedent('''
    """A State whose __post_init__ changes what it is given: every decode changes it."""

    import msgspec

    import intloom


    class Counted(msgspec.Struct):
        n: int = 0

        def __post_init__(self) -> None:
            self.n += 1


    wf = intloom.Workflow("counted", version="1.0.0")
    main = wf.stage("main", state=Counted)


    @main.step("wait", routes={"done": intloom.COMPLETE})
    async def wait(ctx: intloom.StepContext[Counted]) -> str:
        await ctx.confirm({"n": ctx.state.n})
        return "done"


    @wait.recover
    def wait_recover(ctx: intloom.StepContext[Counted], saved: intloom.Recovery) -> str:
        return "done"
''')


def test_a_state_that_changes_as_it_is_built_is_refused_when_the_workflow_loads(
        tmp_path: Path) -> None:
    """Such a Run was held at the restart (first said to be "incompatible schema ... no
    longer matches its schema output", then named with its values), though nothing had
    changed, after each Step had got a State unlike the one the Step before it left. Its
    default State does not read back as itself either: refused as the Workflow loads."""
    for project in reaped(one_source_project(tmp_path, "counted", CHANGES_ITSELF)):
        problems = ok(project.cli("start", "--json"))["service"]["workflowProblems"]
        [problem] = problems
        assert problem["code"] == "WORKFLOW_DEFINITION_INVALID", problem
        assert ("Stage 'main': the default State Counted() does not read back as itself: "
                'saved as {"n":2}, it decodes as Counted to {"n":3}') in problem["message"], (
            problem)
        assert "__post_init__" in problem["message"], problem
        ok(project.cli("stop", "--json"))


@pytest.mark.parametrize(("kind", "call", "what"), [
    ("effect_called", "ctx.effect", "a dict, which cannot be called (if a call returned it, "
                                    "that call ran outside the journal)"),
    ("aeffect_called", "await ctx.aeffect", "a coroutine (acharge(...) was called, not passed; "
                                            "it never ran)"),
])
def test_an_effect_given_its_functions_result_is_refused_before_it_is_journaled(
    mistakes: Project, kind: str, call: str, what: str,
) -> None:
    """``ctx.effect("charge", charge(order))`` calls charge outside the journal, then hands
    its result over: that was journaled as the effect, started and done with "TypeError:
    'dict' object is not callable" (a coroutine: the same, and Python's "never awaited"
    warning), which named neither the mistake nor the fix."""
    ok(mistakes.cli("start", "--json"))
    error = _failure(mistakes, kind)
    assert error == {"code": "STEP_INTERACTION_INVALID", "retryable": False, "message": (
        f"Stage 'main', Step '{kind}' passed {what} to {call}('charge', ...) as the effect's "
        "function. The effect was not called and nothing was recorded. Pass the function and "
        f"its arguments, uncalled: `{call}('charge', fn, *args)`.")}, error
    run_id = ok(mistakes.cli("runs", "--json"))["runs"][-1]["runId"]
    assert [p for p, _ in _phases(mistakes, run_id) if p.startswith("effect")] == []
    ok(mistakes.cli("stop", "--json"))


@pytest.mark.parametrize(("kind", "code"), [("effect_exits", 4), ("aeffect_exits", 5)])
def test_an_effect_that_exits_is_named_by_the_runs_error(
    mistakes: Project, kind: str, code: int,
) -> None:
    """An effect's function raising SystemExit failed the Run naming only the Step: the
    effect, journaled done with that exit, was not named, as it is for an exception."""
    ok(mistakes.cli("start", "--json"))
    error = _failure(mistakes, kind)
    line = MISTAKES.splitlines().index("    raise SystemExit(code)") + 1
    assert error == {"code": "STEP_EXECUTION_FAILED", "retryable": False, "message": (
        f"Stage 'main', Step '{kind}' raised SystemExit({code}) at line {line} of "
        "workflows/mistakes/mistakes.py (Workflow code must not exit the process, which is the "
        "host of every Run; raise an exception instead to fail the Run), from effect 'bye' "
        f"(key 'k{code}'), journaled done with that error")}, error
    ok(mistakes.cli("stop", "--json"))


def test_an_exception_group_names_what_it_holds_and_where(mistakes: Project) -> None:
    """A Step whose asyncio.TaskGroup failed was said to raise "ExceptionGroup: unhandled
    errors in a TaskGroup (5 sub-exceptions)": neither what its tasks raised nor where."""
    ok(mistakes.cli("start", "--json"))
    error = _failure(mistakes, "task_group")
    lines = MISTAKES.splitlines()
    group = lines.index("    async with asyncio.TaskGroup() as group:") + 1
    decline = lines.index('    raise ValueError(f"card {n} declined")') + 1
    where = "workflows/mistakes/mistakes.py"
    assert error == {"code": "STEP_EXECUTION_FAILED", "retryable": False, "message": (
        f"Stage 'main', Step 'task_group' raised ExceptionGroup at line {group} of {where}: "
        "unhandled errors in a TaskGroup (5 sub-exceptions): "
        f"ValueError at line {decline} of {where}: card 0 declined; "
        f"ValueError at line {decline} of {where}: card 1 declined; "
        f"ValueError at line {decline} of {where}: card 2 declined; and 2 more")}, error
    ok(mistakes.cli("stop", "--json"))


SURROGATE_TEXT = textwrap.dedent('''
    """Steps handing the journal text with a lone surrogate; the intent picks where."""

    import intloom

    wf = intloom.Workflow("surrogates", version="1.0.0")
    main = wf.stage("main")


    @main.step("pick", routes={"question": "question", "effect": "effect", "done": "done"})
    def pick(ctx: intloom.StepContext[None]) -> str:
        return ctx.intent if ctx.intent in ("question", "effect") else "done"


    @main.step("question", routes={"done": intloom.COMPLETE})
    async def question(ctx: intloom.StepContext[None]) -> str:
        await ctx.ask([intloom.Question(id="q", question="Q \\udcff")])
        return "done"


    @main.step("effect", routes={"done": intloom.COMPLETE})
    def effect(ctx: intloom.StepContext[None]) -> str:
        ctx.effect("charge", lambda: 1, key="order-\\udcff")
        return "done"


    @main.step("done", routes={"done": intloom.COMPLETE})
    def done(ctx: intloom.StepContext[None]) -> str:
        return "done\\udcff"
''')


def test_text_with_a_lone_surrogate_is_refused_naming_it(tmp_path: Path) -> None:
    """A question, an effect's key or an outcome holding a lone surrogate was refused with
    "Values kept in the journal must be msgpack-encodable (integers within 64 bits)", which
    named neither the text nor the fix. The error names where the text is, the character
    and its index, and how to decode such bytes; and the Stage and Step (it named the Run
    alone)."""
    fix = ("nothing was recorded. Text kept in the journal (a question, an outcome, an "
           "effect's name or key) must be valid Unicode: a lone surrogate comes from bytes "
           "decoded with errors='surrogateescape' (os.fsdecode, a file name); decode them "
           "with errors='replace', or keep their hex, instead.")
    expected = {
        "question": ("question", "waiting", "action.request[0].question ('Q \\udcff')", 2),
        "effect": ("effect", "effect_started", "key ('order-\\udcff')", 6),
        "outcome": ("done", "step_result", "outcome ('done\\udcff')", 4),
    }
    for project in reaped(one_source_project(tmp_path, "surrogates", SURROGATE_TEXT)):
        ok(project.cli("start", "--json"))
        for intent, (step, record, named, index) in expected.items():
            flowed = project.cli("flow", "surrogates", "--intent", intent, "--json")
            assert flowed.code == 1, flowed.stdout
            run = flowed.json["run"]
            assert run["status"] == "failed", run
            assert run["lastError"]["code"] == "RUN_STATE_INVALID", run
            assert run["lastError"]["message"] == (
                f"Run {run['runId']}, Stage 'main', Step '{step}': its {record} record "
                f"cannot be written to the journal: {named} is not valid Unicode: it holds a "
                f"lone surrogate, '\\udcff' at index {index}; {fix}"), run
        ok(project.cli("stop", "--json"))


def _text_of(path: Path) -> str | None:
    return path.read_text() if path.exists() else None


LEFT_RUNNING = textwrap.dedent('''
    """A sync Step that hands an effect to a thread of its own and returns without it."""

    import threading
    import time
    from pathlib import Path

    import intloom

    HERE = Path(__file__).resolve().parent.parent
    SEEN = HERE / "thread.log"
    wf = intloom.Workflow("stray", version="1.0.0")
    main = wf.stage("main")


    BEGUN = threading.Event()


    def slow() -> str:
        BEGUN.set()  # called once its effect_started is journaled
        # A payment API taking its time: until the test has seen the Run end (a deadline
        # keeps a failed test short).
        deadline = time.monotonic() + 30
        while not (HERE / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return "charged"


    @main.step("charge", routes={"done": intloom.COMPLETE})
    def charge(ctx: intloom.StepContext[None]) -> str:
        def run() -> None:
            try:
                SEEN.write_text(f"returned {ctx.effect('pay', slow)}")
            except Exception as exc:
                SEEN.write_text(f"{type(exc).__name__} {getattr(exc, 'code', '')}: {exc}")

        threading.Thread(target=run).start()
        BEGUN.wait(10)  # the Step ends while the effect runs
        if ctx.intent == "raise":
            raise ValueError("card declined")
        return "done"
''')


def test_a_step_that_returns_while_its_threads_effect_runs_names_the_effect_and_the_fix(
        tmp_path: Path) -> None:
    """A sync Step whose own thread was still running an effect when the Step returned
    failed its Run with CLI_INTERNAL_ERROR "The host failed while driving the Run
    (IllegalTransition)", and the thread's effect then raised IllegalTransition ("record 7
    (effect_done) cannot follow terminal"). The Run fails naming the Step, the effect in
    flight and the fix; the effect's end, after the Run's, is refused as any work of an
    ended Run is."""
    for project in reaped(one_source_project(tmp_path, "stray", LEFT_RUNNING)):
        ok(project.cli("start", "--json"))
        run = project.cli("flow", "stray", "--intent", "i", "--json").json["run"]
        error = run["lastError"]
        assert error["code"] == "STEP_INTERACTION_INVALID", run
        for fact in ("Stage 'main', Step 'charge' returned while effect 'pay' (key 'pay#1') "
                     "was still running", "its outcome was not recorded",
                     "Wait for (join) each thread that uses ctx before the Step returns"):
            assert fact in error["message"], (fact, error["message"])
        (project.root / "release").write_text("")  # the Run has ended: the effect may end
        log = project.root / "thread.log"
        seen = eventually(functools.partial(_text_of, log), timeout=10,
                          what="the thread's effect to end")
        assert seen.startswith("IntloomError EXECUTION_OWNERSHIP_LOST: "), seen
        report = ok(project.cli("inspect", run["runId"], "--json"))
        assert [r["phase"] for r in report["records"]][-2:] == ["effect_started", "terminal"]
        assert report["run"]["effectInFlight"]["key"] == "pay#1", report["run"]
        ok(project.cli("stop", "--json"))


# The thread's effect returns while the host's loop is held (by another Run's async Step,
# which blocks it on purpose), so its end reaches the loop before the Step's refused
# outcome does: the effect has ended by the time the host handles that refusal.
ENDS_FIRST = textwrap.dedent('''
    """A sync Step returns while its thread's effect runs; the effect ends just after."""

    import os
    import sys
    import threading
    import time
    from collections.abc import Callable
    from pathlib import Path

    import intloom

    HERE = Path(os.environ["ENDS_FIRST_DIR"])
    STEPPED: list[threading.Thread] = []  # the thread that ran charge (a crew's)


    def until(done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 30
        while not done():
            assert time.monotonic() < deadline, what
            time.sleep(0.005)


    def wait_for(name: str) -> None:
        until((HERE / name).exists, name)


    def stack(thread: threading.Thread) -> list[str]:
        """Where ``thread`` is now, innermost last: each frame's file and function."""
        frame, out = sys._current_frames().get(thread.ident or 0), []
        while frame is not None:
            out.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")
            frame = frame.f_back
        return out[::-1]


    wf = intloom.Workflow("ends_first", version="1.0.0")
    main = wf.stage("main")


    @main.step("pick", routes={"charge": "charge", "block": "block"})
    def pick(ctx: intloom.StepContext[None]) -> str:
        return ctx.intent


    @main.step("charge", routes={"done": intloom.COMPLETE})
    def charge(ctx: intloom.StepContext[None]) -> str:
        def pay() -> str:
            (HERE / "paying").touch()
            wait_for("held")
            return "ch_1"

        def run() -> None:
            try:
                ctx.effect("pay", pay)
            except Exception:
                pass

        STEPPED.append(threading.current_thread())
        payer = threading.Thread(target=run)
        payer.start()
        wait_for("held")
        # Until the thread has handed the effect's end to the held loop and waits for it
        # (in a concurrent.futures result): that end then reaches the loop first.
        until(lambda: any(f.endswith("concurrent/futures/_base.py:result")
                          for f in stack(payer)), "the effect's end handed to the loop")
        (HERE / "returning").touch()
        return "done"


    @main.step("block", routes={"done": intloom.COMPLETE})
    async def block(ctx: intloom.StepContext[None]) -> str:
        (HERE / "held").touch()
        wait_for("returning")
        # The loop is held until the crew's thread is done with charge's refused outcome
        # (handed to the loop too, after the effect's end) and has left the crew.
        until(lambda: not any("executor/crew.py" in f for f in stack(STEPPED[0])),
              "charge's outcome handed to the loop")
        return "done"
''')


def test_a_step_that_returns_while_its_threads_effect_ends_names_the_effect_not_a_fault(
        tmp_path: Path) -> None:
    """When the thread's effect ended between the refusal of the Step's outcome and the host
    handling it, the Run failed CLI_INTERNAL_ERROR "The host failed while driving the Run
    (IllegalTransition)" (one Run in ten of a Step that returns while its thread runs
    effects). It fails as when the effect is still running, naming it, and says that its
    end was recorded."""
    signals = tmp_path / "signals"
    signals.mkdir()
    env = {"ENDS_FIRST_DIR": str(signals)}
    for project in reaped(one_source_project(tmp_path, "ends_first", ENDS_FIRST)):
        ok(project.cli("start", "--json", env=env))
        run = ok(project.cli("flow", "ends_first", "--intent", "charge", "--detach", "--json"))
        eventually(lambda: (signals / "paying").exists(), what="the thread's effect to start")
        ok(project.cli("flow", "ends_first", "--intent", "block", "--detach", "--json"))
        run = project.cli("attach", run["run"]["runId"], "--json").json["run"]
        error = run["lastError"]
        assert error["code"] == "STEP_INTERACTION_INVALID", run
        for fact in ("Stage 'main', Step 'charge' returned while effect 'pay' (key 'pay#1') "
                     "was still running", "its outcome was not recorded",
                     "the effect ended just after, its end recorded",
                     "Wait for (join) each thread that uses ctx before the Step returns"):
            assert fact in error["message"], (fact, error["message"])
        report = ok(project.cli("inspect", run["runId"], "--json"))
        assert [r["phase"] for r in report["records"]][-3:] == [
            "effect_started", "effect_done", "terminal"]
        ok(project.cli("stop", "--json"))


TOO_LARGE = textwrap.dedent('''
    """A Step that leaves a State beyond a journal record's 64 MiB."""

    import msgspec

    import intloom

    class Notes(msgspec.Struct):
        blob: str = ""

    wf = intloom.Workflow("too_large", version="1.0.0")
    main = wf.stage("main", state=Notes)


    @main.step("fill", routes={"done": intloom.COMPLETE})
    def fill(ctx: intloom.StepContext[Notes]) -> str:
        ctx.state = Notes(blob="x" * (65 << 20))
        return "done"
''')


def test_a_state_too_large_for_the_journal_names_the_step_that_left_it(tmp_path: Path) -> None:
    """The Run failed "Run RUN-...: its StepResult record is 68,157,601 bytes encoded", naming
    an internal record class and no Step."""
    for project in reaped(one_source_project(tmp_path, "too_large", TOO_LARGE)):
        ok(project.cli("start", "--json"))
        run = project.cli("flow", "too_large", "--intent", "i", "--json").json["run"]
        error = run["lastError"]
        assert error["code"] == "RUN_STATE_INVALID", run
        message = error["message"]
        assert re.match(
            r"Stage 'main', Step 'fill' left a State of 68,157,4\d\d bytes as JSON: its result "
            r"\(the outcome with the State it left\) is 68,157,\d{3} bytes encoded, beyond the "
            r"journal's 67,108,864 bytes per record, so nothing was recorded\. Keep the Stage's "
            r"State to what a restart needs: write large data to a file", message), message
        assert "StepResult" not in message and run["runId"] not in message, message
        ok(project.cli("stop", "--json"))


INIT_LEFT_RUNNING = textwrap.dedent('''
    """A sync Stage initialiser that hands an effect to a thread of its own and returns."""

    import threading
    import time
    from pathlib import Path

    import msgspec

    import intloom

    class Order(msgspec.Struct):
        paid: bool = False

    wf = intloom.Workflow("stray_init", version="1.0.0")
    main = wf.stage("main", state=Order)
    BEGUN = threading.Event()
    RELEASE = Path(__file__).resolve().parent.parent / "release"


    def slow() -> str:
        BEGUN.set()
        # Until the test has seen the Run end (a deadline keeps a failed test short).
        deadline = time.monotonic() + 30
        while not RELEASE.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return "charged"


    @main.init
    def start(ctx: intloom.StepContext[Order]) -> Order:
        threading.Thread(target=lambda: ctx.effect("pay", slow)).start()
        BEGUN.wait(10)  # the initialiser ends while the effect runs
        return Order()


    @main.step("s", routes={"done": intloom.COMPLETE})
    def s(ctx: intloom.StepContext[Order]) -> str:
        return "done"
''')


def test_an_initialiser_that_returns_while_its_threads_effect_runs_names_its_state(
        tmp_path: Path) -> None:
    """The message said "its outcome was not recorded" of an initialiser, which returns a
    State, not an outcome."""
    for project in reaped(one_source_project(tmp_path, "stray_init", INIT_LEFT_RUNNING)):
        ok(project.cli("start", "--json"))
        run = project.cli("flow", "stray_init", "--intent", "i", "--json").json["run"]
        error = run["lastError"]
        assert error["code"] == "STEP_INTERACTION_INVALID", run
        assert error["message"].startswith(
            "Stage 'main' initialiser returned while effect 'pay' (key 'pay#1') was still "
            "running, in a thread of its own: an effect's end is journaled before what "
            "follows it, so the State it returned was not recorded"), error["message"]
        assert "outcome was not recorded" not in error["message"], error["message"]
        assert "before the initialiser returns." in error["message"], error["message"]
        (project.root / "release").write_text("")  # the Run has ended: the effect may end
        ok(project.cli("stop", "--json"))


def test_an_effect_a_thread_still_ran_when_its_step_raised_ends_as_the_runs_lost_work(
        tmp_path: Path) -> None:
    """When the Step raised (its error failing the Run) while its thread's effect ran, that
    effect's end raised the machine's IllegalTransition in the thread ("record 7
    (effect_done) cannot follow terminal"), as no Workflow code can act on; it raises
    EXECUTION_OWNERSHIP_LOST naming the effect, and the Run keeps the Step's own error."""
    for project in reaped(one_source_project(tmp_path, "stray", LEFT_RUNNING)):
        ok(project.cli("start", "--json"))
        run = project.cli("flow", "stray", "--intent", "raise", "--json").json["run"]
        assert run["lastError"]["code"] == "STEP_EXECUTION_FAILED", run
        assert "card declined" in run["lastError"]["message"], run
        (project.root / "release").write_text("")  # the Run has ended: the effect may end
        seen = eventually(functools.partial(_text_of, project.root / "thread.log"),
                          timeout=10, what="the thread's effect to end")
        assert seen.startswith("IntloomError EXECUTION_OWNERSHIP_LOST: "), seen
        assert "effect 'pay' (key 'pay#1')" in seen, seen
        report = ok(project.cli("inspect", run["runId"], "--json"))
        assert [r["phase"] for r in report["records"]][-2:] == ["effect_started", "terminal"]
        ok(project.cli("stop", "--json"))


TASKLESS = textwrap.dedent('''
    """Agent Steps that hand the host no task; the intent picks which one runs."""

    from typing import Any

    import intloom

    wf = intloom.Workflow("taskless", version="1.0.0")
    main = wf.stage("main")


    @main.step("pick", routes={k: k for k in ("forgot", "forgot_async", "unawaited")})
    def pick(ctx: intloom.StepContext[None]) -> str:
        return ctx.intent


    @main.agent_step("forgot", routes={"found": intloom.COMPLETE})
    def forgot(ctx: intloom.StepContext[None]) -> Any:
        {"topic": ctx.intent}  # the task built, and no return


    @main.agent_step("forgot_async", routes={"found": intloom.COMPLETE})
    async def forgot_async(ctx: intloom.StepContext[None]) -> Any:
        {"topic": ctx.intent}


    async def build(ctx: intloom.StepContext[None]) -> Any:
        return {"topic": ctx.intent}


    @main.agent_step("unawaited", routes={"found": intloom.COMPLETE})
    async def unawaited(ctx: intloom.StepContext[None]) -> Any:
        return build(ctx)  # for: return await build(ctx)
''')


@pytest.mark.parametrize(("kind", "facts"), [
    ("forgot", ["returned None, not an Agent task", "Return the task for the Agent"]),
    ("forgot_async", ["returned None, not an Agent task", "Return the task for the Agent"]),
    ("unawaited", ["returned <coroutine object build at 0x",
                   "without awaiting it, so it never ran", "`return await ...`"]),
])
def test_an_agent_step_returning_no_task_fails_its_run_naming_the_step_and_the_fix(
        tmp_path: Path, kind: str, facts: list[str]) -> None:
    """A forgotten ``return`` published a task of null to the Agent (a code Step returning
    None is refused); an un-awaited coroutine was refused as "$ is coroutine (TypeError)"."""
    for project in reaped(one_source_project(tmp_path, "taskless", TASKLESS)):
        ok(project.cli("start", "--json"))
        result = project.cli("flow", "taskless", "--intent", kind, "--json")
        assert result.code == 1, (result.code, result.stdout, result.stderr)
        run = result.json["run"]
        assert run["status"] == "failed" and "pendingAgentCall" not in run, run
        error = run["lastError"]
        assert error["code"] == "STEP_INTERACTION_INVALID", error
        message = error["message"]
        assert message.startswith(f"Stage 'main', Step '{kind}' returned "), message
        for fact in [*facts, "nothing was recorded and no task was published"]:
            assert fact in message, (fact, message)
        phases = [r["phase"] for r in ok(project.cli("inspect", run["runId"], "--json"))[
            "records"]]
        assert "waiting" not in phases and phases[-2:] == ["executing", "terminal"], phases
        ok(project.cli("stop", "--json"))
