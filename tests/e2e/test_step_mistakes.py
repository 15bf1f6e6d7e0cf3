"""Mistakes in a Step's use of ``ctx`` fail the Run with an error that names the Step, the
fact and the fix, never an AttributeError from inside intloom. Real host, real CLI
subprocesses; every host is reaped."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Project, ok, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# One Workflow whose first Step routes to the mistake named by the Run's intent.
MISTAKES = textwrap.dedent('''
    """Each Step makes one mistake with ctx; the intent picks which Step runs."""

    from __future__ import annotations

    from typing import Any

    import msgspec

    import intloom

    class Box(msgspec.Struct):
        extra: Any = None

    KINDS = ["ask_dicts", "ask_text", "confirm_sync", "confirm_unawaited", "duplicate_ids",
             "unencodable_state", "aeffect_sync"]
    wf = intloom.Workflow("mistakes", version="1.0.0")
    main = wf.stage("main", state=Box)


    @main.step("pick", routes={kind: kind for kind in KINDS})
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


    @main.step("confirm_sync", routes={"yes": intloom.COMPLETE, "no": intloom.COMPLETE})
    def confirm_sync(ctx: intloom.StepContext[Box]) -> str:
        answer = ctx.confirm({"n": 1})
        return "yes" if answer.confirmed else "no"


    @main.step("confirm_unawaited", routes={"yes": intloom.COMPLETE, "no": intloom.COMPLETE})
    async def confirm_unawaited(ctx: intloom.StepContext[Box]) -> str:
        answer = ctx.confirm({"n": 1})
        return "yes" if answer.confirmed else "no"


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
    ("confirm_sync", ["Stage 'main', Step 'confirm_sync' is sync", "ctx.confirm",
                      "Make the Step `async def`", "await ctx.confirm("]),
    ("confirm_unawaited", ["Stage 'main', Step 'confirm_unawaited'", "without awaiting",
                           "await ctx.confirm("]),
    ("duplicate_ids", ["Stage 'main', Step 'duplicate_ids'", "repeat ['a']", "its own id"]),
    ("aeffect_sync", ["Stage 'main', Step 'aeffect_sync' is sync", "ctx.aeffect",
                      "Use `ctx.effect(...)`", "await ctx.aeffect("]),
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


def test_an_unencodable_state_names_the_step_and_the_fix(mistakes: Project) -> None:
    ok(mistakes.cli("start", "--json"))
    error = _failure(mistakes, "unencodable_state")
    assert error["code"] == "STAGE_STATE_INVALID", error
    message = error["message"]
    assert message.startswith("Stage 'main', Step 'unencodable_state': "), message
    assert "Box" in message and "cannot be encoded as JSON" in message
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
