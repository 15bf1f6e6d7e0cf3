"""A Step, Stage initialiser or ``recover`` that raises fails its Run naming the file and line
of the Workflow source that raised (the innermost frame of the Workflow's source tree, relative
to the project), not only the Step: an author with many Steps and helpers had to guess. Real
host, real CLI subprocesses; every host is reaped."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Project, ok, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

HELPERS = textwrap.dedent('''\
    import json


    def parse(text: str) -> object:
        return json.loads(text)


    def shout(text: str) -> str:
        raise ValueError(text)
''')

SHOP = textwrap.dedent('''\
    import msgspec

    import intloom
    from workflows.shop import helpers


    class S(msgspec.Struct):
        n: int = 0


    wf = intloom.Workflow("shop", version="1.0.0")
    main = wf.stage("main", state=S)
    later = wf.stage("later", state=S)


    @main.step("pick", routes={"helper": "helper", "effect": "effect", "init": intloom.ToStage(
        "later"), "wait": "wait", "exits": "exits", "long": "long"})
    def pick(ctx: intloom.StepContext[S]) -> str:
        return ctx.intent


    @main.step("helper", routes={"done": intloom.COMPLETE})
    def helper(ctx: intloom.StepContext[S]) -> str:
        helpers.parse("{not json")
        return "done"


    def charge() -> None:
        raise ValueError("card declined")


    @main.step("effect", routes={"done": intloom.COMPLETE})
    def effect(ctx: intloom.StepContext[S]) -> str:
        ctx.effect("charge", charge, key="order-7")
        return "done"


    @later.init
    async def start_later(ctx: intloom.StepContext[S]) -> S:
        raise KeyError("no such order")


    @later.step("unreached", routes={"done": intloom.COMPLETE})
    def unreached(ctx: intloom.StepContext[S]) -> str:
        return "done"


    @main.step("wait", routes={"done": intloom.COMPLETE})
    async def wait(ctx: intloom.StepContext[S]) -> str:
        await ctx.confirm({"n": 1})
        return "done"


    @wait.recover
    def wait_recover(ctx: intloom.StepContext[S], saved: intloom.Recovery) -> str:
        return helpers.shout("gave up")


    @main.step("exits", routes={"done": intloom.COMPLETE})
    def exits(ctx: intloom.StepContext[S]) -> str:
        raise SystemExit(3)


    @main.step("long", routes={"done": intloom.COMPLETE})
    def long(ctx: intloom.StepContext[S]) -> str:
        raise RuntimeError("E" * 5000)
''')


def _line(text: str, needle: str) -> int:
    """The 1-based line of ``text`` holding ``needle`` (once)."""
    [number] = [n for n, line in enumerate(text.splitlines(), 1) if needle in line]
    return number


@pytest.fixture
def shop(tmp_path: Path) -> Iterator[Project]:
    root = tmp_path / "proj"
    (root / "workflows" / "shop").mkdir(parents=True)
    (root / "workflows" / "shop" / "helpers.py").write_text(HELPERS)
    (root / "workflows" / "shop" / "shop.py").write_text(SHOP)
    (root / "intloom.toml").write_text('workflows = ["workflows/shop/shop.py"]\n')
    yield from reaped(Project(root=root))


def _error(project: Project, intent: str) -> tuple[str, dict[str, Any]]:
    result = project.cli("flow", "shop", "--intent", intent, "--json")
    run = result.json["run"]
    assert (result.code, run["status"]) == (1, "failed"), (result.stdout, result.stderr)
    assert run["lastError"]["code"] == "STEP_EXECUTION_FAILED", run
    return run["runId"], run["lastError"]


def test_a_raising_step_names_the_helper_line_that_raised(shop: Project) -> None:
    ok(shop.cli("start", "--json"))
    run_id, error = _error(shop, "helper")
    # The innermost frame in the tree is the helper's (json's own frames are not the author's).
    line = _line(HELPERS, "return json.loads(text)")
    assert error["message"] == (
        f"Stage 'main', Step 'helper' raised JSONDecodeError at line {line} of "
        "workflows/shop/helpers.py: Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)"), error
    # The same words wherever the error is shown: runs (the host's view) and inspect (the
    # journal's terminal record).
    [listed] = [r for r in ok(shop.cli("runs", "--json"))["runs"] if r["runId"] == run_id]
    assert listed["lastError"] == error
    assert ok(shop.cli("inspect", run_id, "--json"))["run"]["lastError"] == error
    ok(shop.cli("stop", "--json"))


def test_an_effect_initialiser_and_exit_name_their_lines(shop: Project) -> None:
    ok(shop.cli("start", "--json"))
    _, error = _error(shop, "effect")
    assert error["message"] == (
        f"Stage 'main', Step 'effect' raised ValueError at line "
        f"{_line(SHOP, 'card declined')} of workflows/shop/shop.py: card declined, from "
        "effect 'charge' (key 'order-7'), journaled done with that error"), error
    _, error = _error(shop, "init")
    assert error["message"] == (
        f"Stage 'later' initialiser raised KeyError at line "
        f"{_line(SHOP, 'no such order')} of workflows/shop/shop.py: 'no such order'"), error
    _, error = _error(shop, "exits")
    assert error["message"].startswith(
        f"Stage 'main', Step 'exits' raised SystemExit(3) at line "
        f"{_line(SHOP, 'SystemExit(3)')} of workflows/shop/shop.py (Workflow code must not "
        "exit the process"), error
    ok(shop.cli("stop", "--json"))


def test_a_raising_recover_names_its_line(shop: Project) -> None:
    ok(shop.cli("start", "--json"))
    run = ok(shop.cli("flow", "shop", "--intent", "wait", "--json"))["run"]
    ok(shop.cli("stop", "--json"))
    ok(shop.cli("start", "--json"))  # the answer after a restart goes to recover
    result = shop.cli("answer", run["runId"], run["pendingAction"]["id"],
                      '{"isConfirmed": true}', "--json")
    error = result.json["run"]["lastError"]
    assert error == {"code": "STEP_EXECUTION_FAILED", "retryable": False, "message": (
        f"Stage 'main', Step 'wait' recover raised ValueError at line "
        f"{_line(HELPERS, 'raise ValueError')} of workflows/shop/helpers.py: gave up")}, error
    ok(shop.cli("stop", "--json"))


def test_the_line_survives_a_long_message_and_a_long_path(tmp_path: Path) -> None:
    """The message is cut at 4,096 characters (its record stays bounded): the file and line
    come before the exception's text, so the cut never takes them, even for a source whose
    path is thousands of characters long."""
    deep = "/".join(["d" * 200] * 18)  # ~3,600 characters: near PATH_MAX with the root
    root = tmp_path / "p"
    (root / "workflows" / "shop").mkdir(parents=True)
    tree = root / "workflows" / "shop"
    (tree / deep).mkdir(parents=True)
    (tree / deep / "helpers.py").write_text(HELPERS)
    # Regular packages: 18 nested namespace packages cost CPython's import system 2**18
    # recalculations of their paths (~6 s of the host's start), which nothing here is about.
    level = tree
    for part in deep.split("/"):
        level = level / part
        (level / "__init__.py").write_text("")
    module = "workflows.shop." + deep.replace("/", ".") + ".helpers"
    (tree / "shop.py").write_text(SHOP.replace(
        "from workflows.shop import helpers", f"import {module} as helpers"))
    (root / "intloom.toml").write_text('workflows = ["workflows/shop/shop.py"]\n')
    for project in reaped(Project(root=root)):
        ok(project.cli("start", "--json"))
        run_id, error = _error(project, "long")
        line = _line(SHOP, 'raise RuntimeError("E" * 5000)')
        message = error["message"]
        assert message.startswith(
            f"Stage 'main', Step 'long' raised RuntimeError at line {line} of "
            "workflows/shop/shop.py: EEEE"), message[:200]
        assert message.endswith(" more characters cut]"), message[-80:]
        _, error = _error(project, "helper")
        where = f"workflows/shop/{deep}/helpers.py"
        assert error["message"].startswith(
            f"Stage 'main', Step 'helper' raised JSONDecodeError at line "
            f"{_line(HELPERS, 'json.loads')} of {where}: Expecting"), error["message"][:200]
        assert ok(project.cli("inspect", run_id, "--json"))["run"]["lastError"]["message"] \
            == message
        ok(project.cli("stop", "--json"))


def test_the_host_log_says_why_a_run_failed(shop: Project) -> None:
    """The host log's ``run_terminal`` said only ``status=failed``: why (the exception, its
    file and line) was in the journal and the Run's view alone. It carries the error now."""
    ok(shop.cli("start", "--json"))
    run_id, error = _error(shop, "helper")
    logged = [json.loads(line) for line in shop.cli("logs", run_id, "--json").stdout.splitlines()]
    [terminal] = [e for e in logged if e["event"] == "run_terminal"]
    assert (terminal["status"], terminal["code"], terminal["message"]) == (
        "failed", "STEP_EXECUTION_FAILED", error["message"]), terminal
    assert "line 5 of workflows/shop/helpers.py" in terminal["message"]
    # At error level, as jq 'select(.level == "error")' picks failures (it found none).
    assert terminal["level"] == "error", terminal
    ok(shop.cli("stop", "--json"))
