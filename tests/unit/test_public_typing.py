"""The authoring API as a user's type checker sees it: ``mypy --strict`` on a Workflow written
against it, in one process (about 3 s cold). A correct use checks clean with what each call
gives typed; each misuse a checker can catch is reported at its line."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from tests.helpers import REPO, run_mypy

_GOOD = '''
from __future__ import annotations

import asyncio
from typing import Any

import msgspec

import intloom
from intloom import AgentResult, Recovery, StepContext
from intloom.client import Client, PendingAgentCall, RunView


class Draft(msgspec.Struct):
    text: str = ""
    rounds: int = 0


def fetch(url: str) -> dict[str, int]:
    return {"n": len(url)}


async def afetch(url: str) -> list[str]:
    return [url]


def search(query: Any) -> list[str]:
    return []


wf = intloom.Workflow("typed", version="1")
draft = wf.stage("draft", state=Draft)
publish = wf.stage("publish")


@draft.init
def start(ctx: StepContext[Draft]) -> Draft:
    return Draft(text=ctx.intent)


@draft.step("write", routes={"done": "review"})
def write(ctx: StepContext[Draft]) -> str:
    reveal_type(ctx.state)  # R1
    reveal_type(ctx.effect("fetch", fetch, "u"))  # R2
    ctx.state = Draft(text="x", rounds=ctx.state.rounds + 1)
    return "done"


@draft.step("review", routes={"ok": intloom.ToStage("publish"), "again": "write"})
async def review(ctx: StepContext[Draft]) -> str:
    answer = await ctx.confirm({"draft": ctx.state.text})
    reveal_type(answer)  # R3
    answers = await ctx.ask([intloom.Question(id="t", question="Topic?")])
    reveal_type(answers)  # R4
    reveal_type(await ctx.aeffect("afetch", afetch, "u"))  # R5
    reveal_type(await ctx.aeffect("fetch", fetch, "u", key="k"))  # R6
    reveal_type(await ctx.aeffect("thread", asyncio.to_thread, fetch, "u"))  # R7
    return "ok" if answer.confirmed else "again"


@review.recover
async def review_recover(ctx: StepContext[Draft], saved: Recovery) -> str:
    return "ok"


@publish.agent_step("agent", routes={"done": intloom.COMPLETE},
                    tools=[intloom.Tool("search", search)])
def agent(ctx: StepContext[None]) -> dict[str, Any]:
    return {"task": ctx.intent}


@agent.on_complete
async def agent_done(ctx: StepContext[None], result: AgentResult) -> None:
    print(result.outcome)


@publish.init
async def publish_init(ctx: StepContext[None]) -> None:
    return None


def agent_loop(root: str) -> RunView:
    with Client.connect(root) as client:
        run = client.create_run("typed", "notes")
        call: PendingAgentCall | None = run.pending_agent_call
        reveal_type(call)  # R8
        for event in client.subscribe(run.run_id):
            reveal_type(event)  # R9
            run = event.run
        return run
'''

# Each misuse is marked ``# E``: mypy must report an error on exactly those lines.
_BAD = '''
from __future__ import annotations

import msgspec

import intloom
from intloom import Recovery, StepContext


class Draft(msgspec.Struct):
    text: str = ""


class Other(msgspec.Struct):
    x: int = 0


wf = intloom.Workflow("bad", version="1")
draft = wf.stage("draft", state=Draft)


@draft.step("other_state", routes={"done": intloom.COMPLETE})  # E
def other_state(ctx: StepContext[Other]) -> str:
    return "done"


@draft.step("returns_int", routes={"done": intloom.COMPLETE})  # E
def returns_int(ctx: StepContext[Draft]) -> int:
    return 1


@draft.step("takes_two", routes={"done": intloom.COMPLETE})  # E
async def takes_two(ctx: StepContext[Draft], extra: int) -> str:
    return "done"


@draft.init  # E
def init_other(ctx: StepContext[Draft]) -> Other:
    return Other()


@draft.step("ok", routes={"done": intloom.COMPLETE})
async def ok(ctx: StepContext[Draft]) -> str:
    # Read-only: refused when the Step runs (STEP_INTERACTION_INVALID), and by mypy (its
    # setters, typed object, let every assignment check).
    ctx.run_id = "x"  # E
    ctx.step = None  # E
    return "done"


@ok.recover  # E
def ok_recover(ctx: StepContext[Draft], saved: Recovery) -> None:
    return None


@ok.on_complete  # E
def ok_done(ctx: StepContext[Draft], result: intloom.AgentResult) -> None:
    return None


@draft.agent_step("ag", routes={"done": intloom.COMPLETE})
def ag(ctx: StepContext[Draft]) -> dict[str, str]:
    return {}


@ag.on_complete  # E
def ag_done(ctx: StepContext[Draft], result: intloom.AgentResult) -> str:
    return "x"


def two_inputs(query: str, limit: int) -> list[str]:
    return []


TOOLS = [intloom.Tool("two", two_inputs)]  # E

# A misspelt public name: the packages' lazy __getattr__ typed it Any, and it checked.
from intloom.client import RunVeiw  # E
typo = intloom.Wrokflow("typo", version="1")  # E
'''


def _mypy(tmp_path: Path, source: str) -> tuple[str, int, str]:
    """mypy --strict on ``source``, intloom found in the repository (the test venv's editable
    install is an import hook, which mypy does not follow)."""
    (tmp_path / "user_wf.py").write_text(textwrap.dedent(source))
    (tmp_path / "mypy.ini").write_text(f"[mypy]\nmypy_path = {REPO}\n")
    out, err, status = run_mypy([
        "--strict", "--config-file", str(tmp_path / "mypy.ini"),
        "--cache-dir", str(tmp_path / "cache"), "--no-error-summary",
        str(tmp_path / "user_wf.py"),
    ])
    return out, status, err


def _revealed_at(source: str) -> dict[str, int]:
    return {m.group(1): n for n, line in enumerate(source.splitlines(), 1)
            if (m := re.search(r"# (R\d+)$", line))}


def test_a_correct_workflow_checks_clean_with_each_call_typed(tmp_path: Path) -> None:
    out, status, err = _mypy(tmp_path, _GOOD)
    assert "error:" not in out, out
    assert status == 0, (out, err)
    revealed = {int(m.group(1)): m.group(2)
                for m in re.finditer(r":(\d+): note: Revealed type is \"(.*)\"", out)}
    at = _revealed_at(_GOOD)
    assert revealed[at["R1"]] == "user_wf.Draft"
    assert revealed[at["R2"]] == "dict[str, int]"
    assert revealed[at["R3"]] == "intloom.authoring.interaction.Confirmation"
    assert revealed[at["R4"]] == "list[intloom.authoring.interaction.QuestionAnswer]"
    assert revealed[at["R5"]] == "list[str]"
    assert revealed[at["R6"]] == "dict[str, int]"
    assert revealed[at["R7"]] == "Any"  # asyncio.to_thread is generic: not solved, not refused
    # The views re-exported by intloom.client are the classes the Client's methods return.
    assert revealed[at["R8"]] == "intloom.runtime.model.PendingAgentCall | None"
    assert revealed[at["R9"]] == "intloom.protocol.messages.RunEvent"


def test_each_misuse_of_the_decorators_is_a_type_error_at_its_line(tmp_path: Path) -> None:
    out, status, _err = _mypy(tmp_path, _BAD)
    errors = sorted({int(m.group(1)) for m in re.finditer(r":(\d+): error:", out)})
    marked = [n for n, line in enumerate(_BAD.splitlines(), 1) if line.endswith("# E")]
    assert len(marked) == 12 and errors == marked, out
    assert status == 1
