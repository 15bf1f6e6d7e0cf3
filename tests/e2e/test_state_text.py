"""A Stage State holding text UTF-8 cannot carry (a lone surrogate, as ``os.fsdecode`` makes
of a file name that is not UTF-8) is refused naming the field that holds it and the fix,
whoever left it (a Step, an initialiser). Real host, real CLI subprocesses."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.helpers import ok, one_source_project, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SOURCE = textwrap.dedent('''
    import msgspec

    import intloom


    class Files(msgspec.Struct, rename="camel"):
        file_names: list[str] = []
        sizes: dict[str, int] = {}


    wf = intloom.Workflow("files", version="1")
    listed = wf.stage("listed", state=Files)
    made = wf.stage("made", state=Files)


    @listed.step("scan", routes={"made": intloom.ToStage("made")})
    def scan(ctx: intloom.StepContext[Files]) -> str:
        if ctx.intent == "field":
            ctx.state = Files(file_names=["ok.txt", "b\\udcffd.txt"])
        if ctx.intent == "key":
            ctx.state = Files(sizes={"ok.txt": 1, "b\\udcffd.txt": 2})
        return "made"


    @made.init
    def made_init(ctx: intloom.StepContext[Files]) -> Files:
        return Files(file_names=["\\udcff"])


    @made.step("never", routes={"done": intloom.COMPLETE})
    def never(ctx: intloom.StepContext[Files]) -> str:
        return "done"
''')

FIX = ("A lone surrogate comes from bytes decoded with errors='surrogateescape' (os.fsdecode, "
       "a file name); decode them with errors='replace', keep their hex, or keep the bytes "
       "in a `bytes` field; this State was not saved.")


def test_a_state_with_a_lone_surrogate_names_the_field_and_the_fix(tmp_path: Path) -> None:
    """It said "cannot be encoded as JSON ('utf-8' codec can't encode character '\\udcff' in
    position 1: surrogates not allowed). Keep its fields to plain data (str, ...)": no field,
    and a fix the str field already followed."""
    expected = {
        "field": ("Stage 'listed', Step 'scan'",
                  "$.fileNames[1] ('b\\udcffd.txt') holds a lone surrogate, '\\udcff' at "
                  "index 1"),
        "key": ("Stage 'listed', Step 'scan'",
                "a key of $.sizes ('b\\udcffd.txt') holds a lone surrogate, '\\udcff' at "
                "index 1"),
        "init": ("Stage 'made' initialiser",
                 "$.fileNames[0] ('\\udcff') holds a lone surrogate, '\\udcff' at index 0"),
    }
    for project in reaped(one_source_project(tmp_path, "files", SOURCE)):
        ok(project.cli("start", "--json"))
        for intent, (who, named) in expected.items():
            flowed = project.cli("flow", "files", "--intent", intent, "--json")
            assert flowed.code == 1, (flowed.stdout, flowed.stderr)
            run = flowed.json["run"]
            assert run["status"] == "failed", run
            error = run["lastError"]
            assert error["code"] == "STAGE_STATE_INVALID", error
            assert error["message"] == (
                f"{who}: the Stage State it left (Files) holds text that is not valid "
                f"Unicode: {named}. {FIX}"), error
        ok(project.cli("stop", "--json"))
