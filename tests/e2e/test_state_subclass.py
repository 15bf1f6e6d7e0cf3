"""A Stage State (or a Struct inside it) of a subclass of its declared type is saved as that
type decodes it: a subclass with fields of its own is refused naming them, rather than
handed to the next Step without them. Real host, real CLI subprocesses."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.helpers import ok, one_source_project, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SOURCE = textwrap.dedent('''
    import msgspec

    import intloom


    class Author(msgspec.Struct):
        name: str = ""


    class Editor(Author):
        desk: str = ""


    class Notes(msgspec.Struct):
        draft: str = ""
        authors: list[Author] = []


    class Reviewed(Notes):
        reviewer: str = ""


    class Shown(Notes):
        def title(self) -> str:
            return self.draft.title()


    wf = intloom.Workflow("notes", version="1")
    main = wf.stage("main", state=Notes)


    @main.step("write", routes={"written": "read"})
    async def write(ctx: intloom.StepContext[Notes]) -> str:
        if ctx.intent == "fields":
            ctx.state = Reviewed(draft="v1", reviewer="ana")
        elif ctx.intent == "nested":
            ctx.state = Notes(draft="v1", authors=[Author(name="bo"), Editor(name="ana",
                                                                          desk="news")])
        elif ctx.intent == "wait":
            ctx.state = Reviewed(draft="v1", reviewer="ana")
            await ctx.confirm({"draft": "v1"})
        else:
            ctx.state = Shown(draft="v1")
        return "written"


    @main.step("read", routes={"v1": intloom.COMPLETE})
    def read(ctx: intloom.StepContext[Notes]) -> str:
        return ctx.state.draft
''')


def test_a_subclass_state_with_fields_of_its_own_is_refused(tmp_path: Path) -> None:
    """``ctx.state = Reviewed(draft="v1", reviewer="ana")`` in a Stage of State ``Notes`` was
    saved as Notes: the next Step got ``Notes(draft="v1")``, the reviewer gone, no word said."""
    message = ("Stage 'main', Step 'write': the Stage State it left is a Reviewed, a subclass "
               "of the Stage's State type Notes, with fields Notes does not have (reviewer): "
               "it is saved as Notes, so the next Step would get it without them. Declare "
               "them in Notes, or assign a Notes; this State was not saved.")
    for project in reaped(one_source_project(tmp_path, "notes", SOURCE)):
        ok(project.cli("start", "--json"))
        for intent in ("fields", "wait"):
            flowed = project.cli("flow", "notes", "--intent", intent, "--json")
            assert flowed.code == 1, (intent, flowed.stdout, flowed.stderr)
            error = flowed.json["run"]["lastError"]
            assert error["code"] == "STAGE_STATE_INVALID", error
            assert error["message"] == message, error
        flowed = project.cli("flow", "notes", "--intent", "nested", "--json")
        assert flowed.code == 1, (flowed.stdout, flowed.stderr)
        error = flowed.json["run"]["lastError"]
        assert error == {"code": "STAGE_STATE_INVALID", "retryable": False, "message": (
            "Stage 'main', Step 'write': the Stage State it left cannot be saved as it is: "
            "$.authors[1] is an Editor, a subclass of its declared type Author, with fields "
            "Author does not have (desk): it would be saved as Author, and the next Step "
            "would get it without them. Declare them in Author, or store an Author. This "
            "State was not saved.")}, error
        # A subclass adding no field loses nothing of the State: it is saved as before.
        run = ok(project.cli("flow", "notes", "--intent", "methods", "--json"))["run"]
        assert run["status"] == "completed", run
        ok(project.cli("stop", "--json"))


GENERIC = textwrap.dedent('''
    from typing import Any, Generic, TypeVar

    import msgspec

    import intloom

    T = TypeVar("T")


    class Box(msgspec.Struct, Generic[T]):
        value: T | None = None


    class Labelled(Box[int]):
        label: str = ""


    class Notes(msgspec.Struct):
        box: Box[int] = msgspec.field(default_factory=Box)
        loose: Box[Any] = msgspec.field(default_factory=Box)


    wf = intloom.Workflow("boxes", version="1")
    main = wf.stage("main", state=Notes)


    @main.step("fill", routes={"filled": "read"})
    def fill(ctx: intloom.StepContext[Notes]) -> str:
        if ctx.intent == "subclass":
            ctx.state = Notes(box=Labelled(value=3, label="x"))
        elif ctx.intent == "tuple":
            ctx.state = Notes(loose=Box(value=(1, 2)))
        else:
            ctx.state = Notes(box=Box(value=3), loose=Box(value={"a": [1]}))
        return "filled"


    @main.step("read", routes={"3": intloom.COMPLETE})
    def read(ctx: intloom.StepContext[Notes]) -> str:
        assert ctx.state.loose.value == {"a": [1]}, ctx.state
        return str(ctx.state.box.value)
''')


def test_a_generic_struct_field_loads_and_is_checked_as_its_class(tmp_path: Path) -> None:
    """A State field typed ``Box[int]`` (a generic msgspec Struct) has a JSON Schema and
    round-trips, yet its source failed to load: "checking its Workflows raised
    AttributeError: __subclasses__" (its ``msgspec.inspect`` class is the alias
    ``Box[int]``, which has no subclasses and refuses ``isinstance``). It loads; the save
    check walks it as ``Box``: a subclass with fields of its own, and a tuple in a part typed
    Any, are refused as in a plain Struct."""
    for project in reaped(one_source_project(tmp_path, "boxes", GENERIC)):
        ok(project.cli("start", "--json"))
        flows = ok(project.cli("flows", "--json"))["workflows"]
        assert [(f["name"], f["ready"]) for f in flows] == [("boxes", True)], flows
        run = ok(project.cli("flow", "boxes", "--intent", "plain", "--json"))["run"]
        assert run["status"] == "completed", run
        for intent, said in (("subclass", "$.box is a Labelled, a subclass of its declared "
                              "type Box, with fields Box does not have (label)"),
                             ("tuple", "$.loose.value is a tuple, in a part of the State "
                              "typed Any")):
            flowed = project.cli("flow", "boxes", "--intent", intent, "--json")
            assert flowed.code == 1, (intent, flowed.stdout, flowed.stderr)
            error = flowed.json["run"]["lastError"]
            assert error["code"] == "STAGE_STATE_INVALID" and said in error["message"], error
        ok(project.cli("stop", "--json"))
