"""What a Step gets from an effect and what the journal keeps of it (docs/authoring.md, "What
an effect returns"): the Step gets the value itself, on its only run; ``effect_done`` keeps a
converted copy as evidence; after a SIGKILL and a restart the Step's wait continues in its
``recover``, which never gets that copy, so no code of the Run sees a converted value."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Project, ok, one_source_project, reaped

pytestmark = pytest.mark.e2e

SOURCE = '''
import datetime
from pathlib import Path

import intloom

SEEN = Path(__file__).resolve().parent.parent / "seen.log"
VALUES = {
    "set": lambda: {2, 1},
    "tuple": lambda: (1, 2),
    "datetime": lambda: datetime.datetime(2026, 1, 2, 3, 4, 5),
    "bytes": lambda: b"\\x00\\xff",
    "bigint": lambda: 2**70,
    "keys": lambda: {None: 1, (1, 2): "a", True: "b", 3: "c"},
}
wf = intloom.Workflow("eff", version="1")
st = wf.stage("s")


def _seen(line: str) -> None:
    with SEEN.open("a") as f:
        f.write(line + "\\n")


@st.step("a", routes={"ok": intloom.COMPLETE})
async def a(ctx: intloom.StepContext[None]) -> str:
    value = await ctx.aeffect("n", VALUES[ctx.intent])
    _seen(f"step {ctx.intent} {value!r}")
    await ctx.confirm({"q": "go on?"})
    return "ok"


@a.recover
def a_recover(ctx: intloom.StepContext[None], saved: intloom.Recovery) -> str:
    _seen(f"recover {ctx.intent} {type(saved.answer).__name__} {saved.action.kind} "
          f"{saved.action.flow_name}")
    return "ok"
'''

# intent -> (what the Step got, as repr, what inspect shows effect_done holds)
CASES: dict[str, tuple[str, Any]] = {
    "set": ("{1, 2}", [1, 2]),
    "tuple": ("(1, 2)", [1, 2]),
    "datetime": ("datetime.datetime(2026, 1, 2, 3, 4, 5)", "2026-01-02T03:04:05"),
    "bytes": (r"b'\x00\xff'", "AP8="),
    "bigint": ("1180591620717411303424", {"repr": "1180591620717411303424"}),
    # msgpack keeps these keys as they are; a JSON document shows each as its JSON text
    "keys": ("{None: 1, (1, 2): 'a', True: 'b', 3: 'c'}",
             {"null": 1, "[1,2]": "a", "true": "b", "3": "c"}),
}


@pytest.fixture
def eff(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "eff", SOURCE))


@pytest.mark.timeout(120)
def test_a_step_gets_its_effects_value_and_a_restart_never_hands_it_the_recorded_copy(
        eff: Project) -> None:
    ok(eff.cli("start", "--json"))
    waiting = {intent: ok(eff.cli("flow", "eff", "--intent", intent, "--json"))["run"]
               for intent in CASES}
    for intent, (_got, recorded) in CASES.items():
        records = ok(eff.cli("inspect", waiting[intent]["runId"], "--json"))["records"]
        done = [r["record"] for r in records if r["phase"] == "effect_done"]
        assert [d["result"] for d in done] == [recorded], (intent, done)
    eff.kill_host()
    ok(eff.cli("recover", "--json"))  # the killed host's service files
    ok(eff.cli("start", "--json"))
    for intent in CASES:
        run = waiting[intent]
        ended = ok(eff.cli("answer", run["runId"], run["pendingAction"]["id"],
                           '{"isConfirmed": true}', "--json"))
        assert ended["run"]["status"] == "completed", ended
    seen = (eff.root / "seen.log").read_text().splitlines()
    expected = [f"step {intent} {got}" for intent, (got, _r) in CASES.items()]
    expected += [f"recover {intent} Confirmation user_ask_confirmation eff" for intent in CASES]
    assert seen == expected
    ok(eff.cli("stop", "--json"))
