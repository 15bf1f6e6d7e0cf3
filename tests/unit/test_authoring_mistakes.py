"""Definition mistakes are refused when the Workflow is declared or loaded, with the fact
and the fix, never found by the first Run (or the first restart); and whatever a Workflow
source raises, the loader names that source and loads the others."""

from __future__ import annotations

import asyncio
import datetime
import decimal
import dis
import functools
import os
import pathlib
import posix
import signal
import subprocess
import sys
import textwrap
import uuid
import zoneinfo
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

import msgspec
import pytest

import intloom
from intloom.authoring.loader import load_workflows
from intloom.errors import IntloomError
from intloom.project import Config

pytestmark = pytest.mark.timeout(30)


def _refused(match: str) -> Any:
    return pytest.raises(IntloomError, match=match)


def _code(info: Any) -> str:
    code: str = info.value.code
    return code


# ----- Steps, initialisers, recover, on_complete, Tools -----------------------------------


def test_a_step_decorating_something_not_callable_is_refused_when_declared() -> None:
    st = intloom.Workflow("w", version="1").stage("d")
    with _refused(r"Stage 'd', Step 'write': @stage\.step\(\.\.\.\) must decorate a function, "
                  r"not 'not a function' \(a str\)") as info:
        st.step("write", routes={"ok": intloom.COMPLETE})("not a function")  # type: ignore[arg-type]
    assert _code(info) == "WORKFLOW_DEFINITION_INVALID"
    with _refused(r"@stage\.agent_step\(\.\.\.\) must decorate a function"):
        st.agent_step("ask", routes={"ok": intloom.COMPLETE})(None)  # type: ignore[arg-type]
    with _refused(r"@stage\.init must decorate a function"):
        st.init(42)  # type: ignore[arg-type]


def test_a_step_that_cannot_take_ctx_is_refused_when_declared() -> None:
    st = intloom.Workflow("w", version="1").stage("d")
    with _refused(r"Step 'a': @stage\.step\(\.\.\.\) decorates a\(\), which cannot be called "
                  r"with one argument \(ctx\)\. Declare it as `def name\(ctx\) -> str`"):
        @st.step("a", routes={"ok": intloom.COMPLETE})  # type: ignore[arg-type]  # mypy refuses it too
        def a() -> str:
            return "ok"


def test_a_generator_function_is_refused_when_declared_not_failed_by_every_run() -> None:
    """A Step with ``yield`` loaded, and every Run failed at it with STEP_RESULT_INVALID
    "returned <async_generator object g at 0x...>": the host calls it, and gets a generator."""
    st = intloom.Workflow("w", version="1").stage("d")
    with _refused(r"Workflow 'w', Stage 'd', Step 'a': @stage\.step\(\.\.\.\) decorates a, "
                  r"which is an async generator function \(it has `yield`\): calling it "
                  r"returns a generator, never its result\. Use `return` instead of `yield`"
                  ) as info:
        @st.step("a", routes={"ok": intloom.COMPLETE})
        async def a(ctx: Any) -> Any:
            yield "ok"
    assert _code(info) == "WORKFLOW_DEFINITION_INVALID"

    @st.step("b", routes={"ok": intloom.COMPLETE})
    def b(ctx: Any) -> str:
        return "ok"

    with _refused(r"Step 'b': @step\.recover decorates r, which is a generator function"):
        @b.recover
        def r(ctx: Any, saved: Any) -> Any:
            yield "ok"


def test_to_stage_given_no_string_names_the_call_not_a_python_error() -> None:
    """``ToStage(["publish"])`` failed its source at load with "checking its Workflows raised
    TypeError: unhashable type: 'list'", naming neither the route nor the fix."""
    with _refused(r"intloom\.ToStage\(\['publish'\]\): the Stage name \['publish'\] \(a list\) "
                  r"is not a string\. Pass the name of the Stage to enter") as info:
        intloom.ToStage(["publish"])  # type: ignore[arg-type]
    assert _code(info) == "WORKFLOW_DEFINITION_INVALID"


def test_to_stage_given_a_stage_or_a_step_names_it_and_the_call_to_write() -> None:
    """``ToStage(publish)``, the Stage object, was told only that
    "<intloom.authoring.workflow.Stage object at 0x...>" is not a string."""
    wf = intloom.Workflow("notes", version="1")
    publish = wf.stage("publish")
    post = publish.step("post", routes={"ok": intloom.COMPLETE})(lambda ctx: "ok")
    with _refused(r"^WORKFLOW_DEFINITION_INVALID: intloom\.ToStage\(\.\.\.\): the Stage name "
                  r"is Stage 'publish' itself \(what wf\.stage\(\.\.\.\) returned\), not a "
                  r'string\. Pass its name: intloom\.ToStage\("publish"\)\.$') as info:
        intloom.ToStage(publish)  # type: ignore[arg-type]
    assert _code(info) == "WORKFLOW_DEFINITION_INVALID"
    with _refused(r"intloom\.ToStage\(\.\.\.\): the Stage name is Step 'post' of Stage "
                  r"'publish' itself \(what its decorator returned\), not a string\. ToStage "
                  r'enters a Stage at its first Step: intloom\.ToStage\("publish"\); within '
                  r'Stage \'publish\', route to the Step by its name: "post"\.$') as info:
        intloom.ToStage(post)  # type: ignore[arg-type]
    assert "object at 0x" not in str(info.value)


def test_a_tool_needs_a_valid_name_and_a_function_of_the_agents_input() -> None:
    with _refused(r"intloom\.Tool\('bad name!', \.\.\.\): the Tool name 'bad name!' is not "
                  r"valid\. Use 1-64 ASCII letters") as info:
        intloom.Tool("bad name!", len)
    assert _code(info) == "WORKFLOW_DEFINITION_INVALID"
    with _refused(r"the Tool name 3 \(an int\) is not a string"):
        intloom.Tool(3, len)  # type: ignore[arg-type]
    with _refused(r"intloom\.Tool\('search', \.\.\.\): fn 'notcallable' \(a str\) is not "
                  r"callable"):
        intloom.Tool("search", "notcallable")  # type: ignore[arg-type]
    with _refused(r"cannot be called with one argument, the input the Agent sent"):
        intloom.Tool("search", lambda: [])  # type: ignore[arg-type, misc]  # mypy refuses it too
    intloom.Tool("web.search-2_x", lambda q: [q])  # what the name rule allows


def test_a_tool_given_a_generator_function_is_refused_when_built() -> None:
    """A Tool whose function yields was accepted: each call the Agent made got a generator,
    refused as "not plain JSON data", and the Tool's body never ran."""
    def pages(input: Any) -> Any:
        yield input

    async def stream(input: Any) -> Any:
        yield input

    with _refused(r"intloom\.Tool\('search', \.\.\.\): pages is a generator function \(it "
                  r"has `yield`\): calling it returns a generator object, never its result.*"
                  r"Return a list instead of yielding, or consume the generator inside a "
                  r"normal function \(`def tool\(input\): return list\(pages\(input\)\)`\)"
                  ) as info:
        intloom.Tool("search", pages)
    assert _code(info) == "WORKFLOW_DEFINITION_INVALID"
    with _refused(r"stream is an async generator function .*inside an async function "
                  r"\(`async def tool\(input\): return \[x async for x in stream\(input\)\]`\)"):
        intloom.Tool("search", stream)


class _Text(str):
    """A subclass of str, as a name's type: msgspec encodes none but enums."""


def test_names_of_a_str_subclass_are_kept_as_plain_text() -> None:
    """A str subclass passed every check as a name, version or agent id, and then failed
    every record and reply that carried it: each Run (RUN_STATE_INVALID, or CLI_INTERNAL_
    ERROR from `flow`) and `flows` for all of the host's Workflows."""
    wf = intloom.Workflow(_Text("w"), version=_Text("1"))
    first, second = wf.stage(_Text("s")), wf.stage(_Text("t"))
    tool = intloom.Tool(_Text("look"), len, description=_Text("d"))
    first.step(_Text("a"), routes={_Text("ok"): _Text("b")})(lambda ctx: "ok")
    first.step(_Text("b"), routes={_Text("ok"): intloom.ToStage(_Text("t"))})(lambda ctx: "ok")
    agent = second.agent_step(_Text("c"), routes={_Text("ok"): intloom.COMPLETE}, tools=[tool],
                              agent=_Text("rev"))(lambda ctx: {})
    wf.validate()
    texts: list[object] = [wf.name, wf.version, tool.name, tool.description, agent.agent]
    for stage_name, stage in wf.stages.items():
        texts += [stage_name, stage.name]
        for step_name, step in stage.steps.items():
            texts += [step_name, step.name, *step.routes]
            texts += [target.stage if isinstance(target, intloom.ToStage) else target
                      for target in step.routes.values() if target is not intloom.COMPLETE]
    texts += list(agent.tools)
    assert len(texts) == 21 and {type(text) for text in texts} == {str}, texts
    assert msgspec.json.decode(msgspec.json.encode(texts)) == texts


def test_a_name_with_a_letter_beyond_ascii_is_told_the_rule_is_ascii() -> None:
    """``@st.step("étape")`` was told to "Use 1-64 letters", and é is a letter."""
    st = intloom.Workflow("w", version="1").stage("s")
    with _refused(r"Workflow 'w', Stage 's': Step name 'étape' is not valid\. Use 1-64 ASCII "
                  r"letters \(A-Z, a-z\), digits, '_', '-' or '\.', starting with a letter or "
                  r"digit\.$") as info:
        st.step("étape", routes={"ok": intloom.COMPLETE})(lambda ctx: "ok")
    assert _code(info) == "WORKFLOW_DEFINITION_INVALID"


def _declare(kind: str, name: str) -> None:
    wf = intloom.Workflow(name if kind == "Workflow" else "w", version="1")
    st = wf.stage(name if kind == "Stage" else "s")
    if kind == "Tool":
        intloom.Tool(name, len)
    outcome = name if kind == "outcome" else "done"
    st.step(name if kind == "Step" else "write", routes={outcome: intloom.COMPLETE})(
        lambda ctx: "done")
    wf.validate()


@pytest.mark.parametrize("kind", ["Workflow", "Stage", "Step", "outcome", "Tool"])
def test_a_name_ending_in_a_newline_is_refused_like_any_other_character(kind: str) -> None:
    """``$`` matches before a final newline: ``Workflow("notes\\n")`` loaded, its name broke
    every one-line view, and a Step returning "done" missed its route "done\\n"."""
    with _refused(rf"{kind} name 'done\\n' is not valid\. Use 1-64 ASCII letters") as info:
        _declare(kind, "done\n")
    assert _code(info) == "WORKFLOW_DEFINITION_INVALID"
    _declare(kind, "done")  # the same name without the newline is fine


def test_an_agent_steps_tools_that_are_not_a_list_of_tools_are_refused_with_the_fix() -> None:
    """``tools=[search]`` (the function itself), ``tools=intloom.Tool(...)`` or a dict of
    functions raised AttributeError or TypeError from the import, which named neither the
    Step nor the fix (WORKFLOW_LOAD_FAILED "'function' object has no attribute 'name'")."""
    def search(query: Any) -> list[str]:
        return []

    st = intloom.Workflow("w", version="1").stage("s")
    where = r"Workflow 'w', Stage 's', Step 'look': "
    for tools, said in [
        ([search], r"tools\[0\] is the function search, not an intloom\.Tool\. Wrap it: "
                   r'intloom\.Tool\("search", search\)\.'),
        (intloom.Tool("search", search), r"tools is the single Tool 'search', not a list of "
                                         r"them\. Pass a list: tools=\[intloom\.Tool"),
        ({"search": search}, r"tools is \{'search': .*\} \(a dict\), not a list of "
                             r"intloom\.Tool\. Wrap each function"),
    ]:
        with _refused(where + said) as info:
            st.agent_step("look", routes={"ok": intloom.COMPLETE},
                          tools=tools)(lambda ctx: {})  # type: ignore[arg-type]
        assert _code(info) == "WORKFLOW_DEFINITION_INVALID"
    made = st.agent_step("look", routes={"ok": intloom.COMPLETE},
                         tools=(intloom.Tool(n, search)  # type: ignore[arg-type]
                                for n in ("a", "b")))(lambda ctx: {})
    assert list(made.tools) == ["a", "b"]  # a generator is read once, not found empty


def test_two_tools_under_one_name_are_named_as_such() -> None:
    """Two Tools under one name said "tools ['t', 't'] are not distinct intloom.Tool
    objects", which they were: what clashes is the name, by which an Agent calls a Tool."""
    def search(query: Any) -> list[str]:
        return []

    st = intloom.Workflow("w", version="1").stage("s")
    one = intloom.Tool("t", search)
    for tools, why in [([one, intloom.Tool("t", search)], "an Agent calls a Tool by its name"),
                       ([one, one], "the same Tool listed twice")]:
        with _refused(r"Workflow 'w', Stage 's', Step 'look': tools \['t', 't'\] name 't' "
                      rf"more than once \({why}\)\. List each Tool once") as info:
            st.agent_step("look", routes={"ok": intloom.COMPLETE}, tools=tools)(lambda ctx: {})
        assert _code(info) == "WORKFLOW_DEFINITION_INVALID"


def test_an_agent_steps_agent_id_is_a_non_empty_string() -> None:
    """``agent=5`` was accepted: the Run's view then carried ``agentId`` 5, which no client
    decodes (PROJECT_RESPONSE_INVALID), so ``flow`` and ``runs`` -- for every Run -- failed.
    Any non-empty string stays accepted, as before (a Workflow that loaded must still)."""
    st = intloom.Workflow("w", version="1").stage("s")
    for agent, said in [(5, r"agent 5 \(an int\) is not a string"), ("", r"agent '' is blank"),
                        (" ", r"agent ' ' is blank")]:
        with _refused(r"Workflow 'w', Stage 's', Step 'look': " + said + r"\. Name the "
                      r"Agent") as info:
            st.agent_step("look", routes={"ok": intloom.COMPLETE},
                          agent=agent)(lambda ctx: {})  # type: ignore[arg-type]
        assert _code(info) == "WORKFLOW_DEFINITION_INVALID"
    for agent in ("reviewer-2", "claude code"):
        made = st.agent_step(f"look{len(agent)}", routes={"ok": intloom.COMPLETE},
                             agent=agent)(lambda ctx: {})
        assert made.agent == agent


def test_a_version_or_agent_id_no_view_can_carry_is_refused_when_declared() -> None:
    """A version holding a lone surrogate (read from a file with surrogateescape) stopped
    the host's start (its log line could not be written); an agent id holding one failed
    every Run (RUN_STATE_INVALID); a 5 MB version or agent id made every reply listing
    their Runs too large (runs failed for the whole host). Both are labels: refused when
    declared, naming the fact and the fix."""
    for version, said in [("1\udcff", r"version holds '\\udcff' at character 1, half of a "
                                      r"surrogate pair"),
                          ("v" * 257, r"version is 257 characters long, over the "
                                      r"256-character limit")]:
        with _refused(r"Workflow 'w', definition: " + said) as info:
            intloom.Workflow("w", version=version)
        assert _code(info) == "WORKFLOW_DEFINITION_INVALID"
        assert "Pass a short label in valid Unicode text" in info.value.message
    st = intloom.Workflow("w", version="v" * 256).stage("s")
    for agent, said in [("bot\udcff", r"agent holds '\\udcff' at character 3"),
                        ("b" * 300, r"agent is 300 characters long")]:
        with _refused(r"Workflow 'w', Stage 's', Step 'look': " + said) as info:
            st.agent_step("look", routes={"ok": intloom.COMPLETE},
                          agent=agent)(lambda ctx: {})
        assert _code(info) == "WORKFLOW_DEFINITION_INVALID"


def test_recover_taking_the_wrong_parameters_is_refused_when_declared() -> None:
    st = intloom.Workflow("w", version="1").stage("d")

    @st.step("ask", routes={"ok": intloom.COMPLETE})
    async def ask(ctx: Any) -> str:
        return "ok"

    with _refused(r"Workflow 'w', Stage 'd', Step 'ask': @step\.recover decorates "
                  r"only_ctx\(ctx: 'Any'\), which cannot be called with 2 arguments "
                  r"\(ctx, saved\)\. "
                  r"Declare it as `def name\(ctx, saved: intloom\.Recovery\) -> str`") as info:
        @ask.recover  # type: ignore[arg-type]  # mypy refuses it too
        def only_ctx(ctx: Any) -> str:
            return "ok"
    assert _code(info) == "WORKFLOW_DEFINITION_INVALID"
    with _refused("cannot be called with 2 arguments"):
        ask.recover(lambda ctx, saved, extra: "ok")  # type: ignore[arg-type, misc]
    assert ask.recover_fn is None  # nothing was declared by a refused one


class _Handlers:
    def recover(self, ctx: Any, saved: Any) -> str:
        return "ok"


def _three(prefix: str, ctx: Any, saved: Any) -> str:
    return prefix


@pytest.mark.parametrize("fn", [
    _Handlers().recover,                                  # a bound method
    functools.partial(_three, "ok"),                      # a partial
    lambda *args: "ok",                                   # *args
    lambda ctx, saved, extra="x": "ok",                   # an optional extra
    print,                                                # a builtin (it takes *args)
], ids=["method", "partial", "varargs", "default", "builtin"])
def test_recover_accepts_any_callable_that_takes_ctx_and_saved(fn: Any) -> None:
    st = intloom.Workflow("w", version="1").stage("d")

    @st.step("ask", routes={"ok": intloom.COMPLETE})
    async def ask(ctx: Any) -> str:
        return "ok"

    assert ask.recover(fn) is fn


def _injecting(fn: Any) -> Any:
    """A decorator that supplies a Step's second parameter itself: the host calls the
    wrapper with ctx alone, whatever ``__wrapped__`` says."""
    @functools.wraps(fn)
    def inner(ctx: Any) -> Any:
        return fn(ctx, "client")
    return inner


def test_a_decorated_step_is_judged_by_the_wrapper_the_host_calls() -> None:
    st = intloom.Workflow("w", version="1").stage("d")

    @st.step("a", routes={"done": intloom.COMPLETE})
    @_injecting
    def a(ctx: Any, client: str) -> str:
        return "done"

    assert a.fn.__wrapped__ is not None  # type: ignore[attr-defined]


def test_on_complete_must_take_ctx_and_result() -> None:
    st = intloom.Workflow("w", version="1").stage("d")

    @st.agent_step("look", routes={"ok": intloom.COMPLETE})
    def look(ctx: Any) -> dict[str, str]:
        return {}

    with _refused(r"@step\.on_complete decorates .*, which cannot be called with 2 arguments "
                  r"\(ctx, result\)"):
        look.on_complete(lambda result: None)  # type: ignore[arg-type, misc]


# ----- what a message says --------------------------------------------------------------


def test_on_complete_on_a_code_step_is_a_definition_mistake_naming_the_step(
        tmp_path: Path) -> None:
    """It was a bare AttributeError ("'Step' object has no attribute 'on_complete'") failing
    the import (WORKFLOW_LOAD_FAILED), with no Step named and no fix."""
    config = _project(tmp_path, {"oncomplete": textwrap.dedent('''
        import intloom

        wf = intloom.Workflow("c", version="1")
        s = wf.stage("s")


        @s.step("write", routes={"ok": intloom.COMPLETE})
        def write(ctx: intloom.StepContext[None]) -> str:
            return "ok"


        @write.on_complete
        def done(ctx, result):
            pass
    ''')})
    result = load_workflows(tmp_path, config)
    assert list(result.workflows) == ["good"]
    view = dict(result.problems)["workflows/oncomplete/wf.py"]
    assert view.code == "WORKFLOW_DEFINITION_INVALID", view
    assert view.message.startswith(
        "workflows/oncomplete/wf.py, line 13: Workflow 'c', Stage 's', Step 'write': "
        "on_complete belongs to Agent Steps, and this is a code Step (declared with "
        "`stage.step(...)`)"), view.message
    assert "Declare it with `stage.agent_step(...)`" in view.message, view.message
    assert "AttributeError" not in view.message, view.message
    # Any other missing attribute is still an AttributeError, as hasattr/getattr expect.
    step = intloom.Workflow("d", version="1").stage("s").step(
        "a", routes={"ok": intloom.COMPLETE})(lambda ctx: "ok")
    assert not hasattr(step, "tools") and getattr(step, "agent", "default") == "default"
    with pytest.raises(AttributeError, match="'Step' object has no attribute 'nope'"):
        step.nope  # type: ignore[attr-defined]  # noqa: B018
    # Said by a property, not a __getattr__: with one, every read of a Step's attributes
    # (~10 per Step run) went through the hook, never a specialised attribute read.
    assert not hasattr(type(step), "__getattr__")


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="CPython 3.11's attribute reads")
def test_a_workflows_stages_and_steps_attributes_are_read_specialised() -> None:
    # The executor reads a Step's and its Stage's attributes ~10 times per Step. An instance
    # whose ``__dict__`` was read (a cached_property's write, ``self.__dict__.get``) holds
    # its attributes in a dict that CPython 3.11 reads through its generic path, ~4x slower.
    wf = intloom.Workflow("d", version="1")
    stage = wf.stage("s")
    step = stage.step("a", routes={"ok": intloom.COMPLETE})(lambda ctx: "ok")
    assert step.where == "Stage 's', Step 'a'"
    object.__setattr__(wf, "_loaded", True)  # as the loader does: assignments now refused
    for thing in (step, stage, wf):
        with pytest.raises(IntloomError):
            thing.name = "x"
    for thing in (step, stage, wf):
        scope: dict[str, Any] = {}
        exec("def read(o):\n    return o.name", scope)  # a code object of its own
        for _ in range(200):
            scope["read"](thing)
        ops = [i.opname for i in dis.get_instructions(scope["read"], adaptive=True)
               if i.opname.startswith("LOAD_ATTR")]
        assert ops == ["LOAD_ATTR_INSTANCE_VALUE"], (type(thing).__name__, ops)


def test_a_version_that_is_not_a_string_says_so_not_that_it_is_empty() -> None:
    with _refused(r"Workflow 'x', definition: version 1 \(an int\) is not a string\. Pass it as "
                  r'text: version="1"') as info:
        intloom.Workflow("x", version=1)  # type: ignore[arg-type]
    assert "is empty" not in info.value.message
    with _refused("version '  ' is empty"):
        intloom.Workflow("x", version="  ")


def test_a_route_to_a_stage_name_says_it_is_a_stage_and_to_use_to_stage() -> None:
    wf = intloom.Workflow("notes", version="1")
    draft = wf.stage("draft")
    wf.stage("publish").step("post", routes={"ok": intloom.COMPLETE})(lambda ctx: "ok")
    draft.step("write", routes={"ok": "publish"})(lambda ctx: "ok")
    with _refused(r"Workflow 'notes', Stage 'draft', Step 'write': outcome 'ok' routes to "
                  r"'publish', which is a Stage, not a Step of Stage 'draft' .*Route to it with "
                  r'intloom\.ToStage\("publish"\)\.'):
        wf.validate()


def test_a_route_to_another_stages_step_names_its_stage_and_to_stage() -> None:
    """It said only "which Stage 'draft' does not have" and listed draft's Steps, though
    the Step was there, in another Stage, which a route enters at its first Step only."""
    wf = intloom.Workflow("notes", version="1")
    draft = wf.stage("draft")
    wf.stage("publish").step("post", routes={"ok": intloom.COMPLETE})(lambda ctx: "ok")
    draft.step("write", routes={"ok": "post"})(lambda ctx: "ok")
    with _refused(r"Workflow 'notes', Stage 'draft', Step 'write': outcome 'ok' routes to Step "
                  r"'post', which is a Step of Stage 'publish', not of Stage 'draft' .*Route "
                  r'to Stage \'publish\' with intloom\.ToStage\("publish"\), which enters it at '
                  r"its first Step"):
        wf.validate()


def _helper(ctx: Any) -> str:
    return "ok"


@pytest.mark.parametrize(("target", "said"), [
    ("same", "routes to Step 'review' itself, not its name. Route to it by name: 'review'."),
    ("other", "routes to Step 'post' of Stage 'publish' itself. A route leaves the Stage only "
              'through its first Step: intloom.ToStage("publish").'),
    ("stage", "routes to Stage 'publish' itself. Route to it with intloom.ToStage(\"publish\")."),
    ("class", 'routes to the class intloom.ToStage. Route to intloom.ToStage("name"), naming '
              "the Stage to enter."),
    ("function", "routes to the function '_helper'. Route to a Step name, "
                 'intloom.ToStage("name") or intloom.COMPLETE.'),
])
def test_a_route_to_a_step_or_stage_object_names_it_and_the_fix(target: str, said: str) -> None:
    """A decorated Step (or a Stage) given as a route target, rather than its name, was named
    ``<intloom.authoring.workflow.Step object at 0x7f...>``: intloom's class and an address,
    neither the Step nor what to write."""
    wf = intloom.Workflow("notes", version="1")
    draft = wf.stage("draft")
    publish = wf.stage("publish")
    post = publish.step("post", routes={"ok": intloom.COMPLETE})(lambda ctx: "ok")
    review = draft.step("review", routes={"ok": intloom.COMPLETE})(lambda ctx: "ok")
    given: Any = {"same": review, "other": post, "stage": publish, "class": intloom.ToStage,
                  "function": _helper}[target]
    with pytest.raises(IntloomError) as refused:
        draft.step("write", routes={"ok": given})(lambda ctx: "ok")
    assert refused.value.code == "WORKFLOW_DEFINITION_INVALID"
    assert refused.value.message == (
        f"Workflow 'notes', Stage 'draft', Step 'write': outcome 'ok' {said}"), refused.value
    assert "0x" not in refused.value.message and "intloom.authoring" not in refused.value.message


class _Pair(msgspec.Struct):
    by_pair: dict[tuple[int, int], str] = msgspec.field(default_factory=dict)


class _BoolKeyed(msgspec.Struct):
    flags: dict[bool, str] = msgspec.field(default_factory=dict)


class _NestedKeyed(msgspec.Struct):
    rows: list[_Pair] = msgspec.field(default_factory=list)


class _Flagged(NamedTuple):
    by_flag: dict[bool, int]


class _InTuples(msgspec.Struct):
    rows: list[_Flagged] = msgspec.field(default_factory=list)


class _LiteralKeyed(msgspec.Struct):
    only: dict[Literal[True], str] = msgspec.field(default_factory=dict)


class _FineKeys(msgspec.Struct):
    by_int: dict[int, str] = msgspec.field(default_factory=dict)
    by_maybe: dict[int | None, str] = msgspec.field(default_factory=dict)
    by_day: dict[datetime.date, list[dict[str, float]]] = msgspec.field(default_factory=dict)


@pytest.mark.parametrize(("state", "field", "key"), [
    (_BoolKeyed, "flags", "bool"),
    (_Pair, "by_pair", "tuple"),
    (_NestedKeyed, "rows[...].by_pair", "tuple"),
    (_InTuples, "rows[...].by_flag", "bool"),
    (_LiteralKeyed, "only", "Literal[True]"),
])
def test_a_state_dict_keyed_by_what_json_cannot_key_is_refused_when_declared(
    state: type[msgspec.Struct], field: str, key: str,
) -> None:
    """Loaded, since its empty default encodes: every Run that stored an entry then failed
    STAGE_STATE_INVALID, advising plain data (bools included) for the value."""
    wf = intloom.Workflow("keys", version="1")
    wf.stage("s", state=state).step("a", routes={"ok": intloom.COMPLETE})(lambda ctx: "ok")
    with pytest.raises(IntloomError) as info:
        wf.validate()
    assert _code(info) == "WORKFLOW_DEFINITION_INVALID"
    message = info.value.message
    assert message.startswith("Workflow 'keys', Stage 's': State "), message
    assert (f"{state.__qualname__} field {field!r} is a dict keyed by {key}, which JSON "
            "cannot key an object by") in message, message
    assert "Key it by str (or int)" in info.value.message
    fine = intloom.Workflow("fine", version="1")
    fine.stage("s", state=_FineKeys).step("a", routes={"ok": intloom.COMPLETE})(
        lambda ctx: "ok")
    fine.validate()


class _EitherKeyed(msgspec.Struct):
    by: dict[int | str, str] = msgspec.field(default_factory=dict)


class _LiteralEither(msgspec.Struct):
    rows: list[dict[Literal[1, "1"], str]] = msgspec.field(default_factory=list)


class _DecimalOrInt(msgspec.Struct):
    price: dict[decimal.Decimal | int, str] = msgspec.field(default_factory=dict)


class _KeysThatReadBack(msgspec.Struct):
    """Key unions whose JSON keys cannot collide, or read back as the type they were."""

    colour: dict[Literal["red"] | Literal["blue"], int] = msgspec.field(default_factory=dict)
    named: dict[Literal["a"] | str, int] = msgspec.field(default_factory=dict)
    number: dict[int | float, int] = msgspec.field(default_factory=dict)
    when: dict[datetime.datetime | int, int] = msgspec.field(default_factory=dict)
    ids: dict[uuid.UUID | int, int] = msgspec.field(default_factory=dict)
    maybe: dict[int | None, int] = msgspec.field(default_factory=dict)
    mixed_words: dict[Literal[1, "a"], int] = msgspec.field(default_factory=dict)


def test_a_state_dict_keyed_by_a_union_that_reads_back_loads() -> None:
    wf = intloom.Workflow("keys", version="1")
    wf.stage("s", state=_KeysThatReadBack).step("a", routes={"ok": intloom.COMPLETE})(
        lambda ctx: "ok")
    wf.validate()


@pytest.mark.parametrize(("state", "field", "key"), [
    (_EitherKeyed, "by", "int | str"),
    (_LiteralEither, "rows[...]", "Literal[1, '1']"),
    (_DecimalOrInt, "price", "Decimal | int"),
])
def test_a_state_dict_keyed_by_two_types_is_refused_when_declared(
    state: type[msgspec.Struct], field: str, key: str,
) -> None:
    """``dict[int | str, str]`` loaded, and a State holding {1: "a", "1": "b", 2: "c"}
    came back after the next save as {"1": "b", "2": "c"}: an entry lost, an int key now
    text, nothing said (JSON keys are all text; a decode picks one type for each)."""
    wf = intloom.Workflow("keys", version="1")
    wf.stage("s", state=state).step("a", routes={"ok": intloom.COMPLETE})(lambda ctx: "ok")
    with pytest.raises(IntloomError) as info:
        wf.validate()
    assert _code(info) == "WORKFLOW_DEFINITION_INVALID"
    message = info.value.message
    assert (f"{state.__qualname__} field {field!r} is a dict keyed by {key}: a JSON "
            "object's keys are all text") in message, message
    assert "Key it by one type (str, or int)" in message, message


class _PathState(msgspec.Struct):
    out: pathlib.Path = pathlib.Path("notes.md")


class _ObjectState(msgspec.Struct):
    x: object = None


class _ComplexState(msgspec.Struct):
    z: complex = 0j


@pytest.mark.parametrize(("state", "field", "instead"), [
    (_PathState, "out", "str (store str(path)"),
    (_ObjectState, "x", "typing.Any"),
    (_ComplexState, "z", "two float fields, or a str"),
])
def test_a_state_without_a_json_schema_names_stage_field_and_what_to_use(
    state: type[msgspec.Struct], field: str, instead: str,
) -> None:
    wf = intloom.Workflow("pathstate", version="1")
    wf.stage("s", state=state).step("a", routes={"ok": intloom.COMPLETE})(lambda ctx: "ok")
    for check in (wf.validate, wf.schemas):
        with pytest.raises(IntloomError) as info:
            check()
        assert _code(info) == "WORKFLOW_DEFINITION_INVALID"
        message = info.value.message
        assert message.startswith("Workflow 'pathstate', Stage 's': State "), message
        assert f"{state.__qualname__} field {field!r} has type " in message, message
        assert "which has no JSON Schema" in message
        assert f"Declare {field!r} as {instead}" in message, message


class _Card(msgspec.Struct):
    last4: str = ""


class _Invoice(msgspec.Struct):
    number: int = 0


class _TaggedCard(msgspec.Struct, tag=True):
    last4: str = ""


class _TaggedInvoice(msgspec.Struct, tag=True):
    number: int = 0


class _UntaggedUnion(msgspec.Struct):
    u: _Card | _Invoice | None = None


class _UntaggedInList(msgspec.Struct):
    paid: list[_Card | _Invoice] = []


class _TaggedUnion(msgspec.Struct):
    u: _TaggedCard | _TaggedInvoice | None = None


@pytest.mark.parametrize(("state", "field"), [(_UntaggedUnion, "u"), (_UntaggedInList, "paid")])
def test_a_union_of_untagged_structs_is_told_to_tag_them(
    state: type[msgspec.Struct], field: str,
) -> None:
    """The advice was "Declare 'u' as a JSON type: str, int, ...", which would lose the
    Structs: msgspec needs them tagged to tell them apart."""
    wf = intloom.Workflow("union", version="1")
    wf.stage("s", state=state).step("a", routes={"ok": intloom.COMPLETE})(lambda ctx: "ok")
    with pytest.raises(IntloomError) as info:
        wf.validate()
    assert _code(info) == "WORKFLOW_DEFINITION_INVALID"
    message = info.value.message
    assert f"field {field!r} has type " in message and "which has no JSON Schema" in message
    module = "tests.unit.test_authoring_mistakes"  # a Workflow module's classes go unprefixed
    assert (f"Tag the Structs in {field!r}: msgspec tells {module}._Card and {module}._Invoice "
            "apart in JSON only by a tag, so declare each with one (`class _Card(msgspec."
            f"Struct, tag=True)`), or declare {field!r} as a single Struct type.") in message, \
        message
    assert "as a JSON type" not in message, message
    # Tagged as advised, the same union loads.
    tagged = intloom.Workflow("tagged", version="1")
    tagged.stage("s", state=_TaggedUnion).step("a", routes={"ok": intloom.COMPLETE})(
        lambda ctx: "ok")
    tagged.validate()


class _Refuses(msgspec.Struct):
    n: int = 0

    def __post_init__(self) -> None:
        raise ValueError("n must be positive")


def test_a_state_whose_default_raises_names_the_stage_and_the_fix() -> None:
    wf = intloom.Workflow("w", version="1")
    st = wf.stage("s", state=_Refuses)
    st.step("a", routes={"ok": intloom.COMPLETE})(lambda ctx: "ok")
    with _refused(r"Stage 's': State .*_Refuses\(\) raised ValueError: n must be positive, so the "
                  r"Stage has no default State\. .*or declare @stage\.init"):
        wf.validate()
    st.init(lambda ctx: _Refuses.__new__(_Refuses))  # an initialiser builds it instead
    wf.validate()


class _DefaultOfAnotherType(msgspec.Struct):
    n: int = "zero"  # type: ignore[assignment]


class _DefaultOutOfBounds(msgspec.Struct):
    tries: list[Annotated[int, msgspec.Meta(ge=0)]] = msgspec.field(
        default_factory=lambda: [1, -1])


class _DefaultNaN(msgspec.Struct):
    p: float = float("nan")


@pytest.mark.parametrize(("state", "fact"), [
    (_DefaultOfAnotherType, r"Expected `int`, got `str` - at `\$\.n`"),
    (_DefaultOutOfBounds, r"Expected `int` >= 0 - at `\$\.tries\[1\]`"),
    # "got null" of a float default alone read as if the default were None.
    (_DefaultNaN, r"Expected `float`, got `null` - at `\$\.p` \(JSON cannot hold NaN or "
                  r"infinity: a float field holding one is written as null\)"),
])
def test_a_default_state_that_does_not_fit_its_own_types_is_refused_at_load(
    state: type[msgspec.Struct], fact: str,
) -> None:
    """A default of the wrong type (``n: int = "zero"``) loaded, and every Run failed as it
    entered the Stage, STAGE_STATE_INVALID "Stage 's' default State: the Stage State it left
    is not a valid ...": found by each Run, not by the load, and worded as if a Step had
    left it."""
    wf = intloom.Workflow("w", version="1")
    st = wf.stage("s", state=state)
    st.step("a", routes={"ok": intloom.COMPLETE})(lambda ctx: "ok")
    with _refused(rf"Workflow 'w', Stage 's': the default State .*{state.__qualname__}\(\) does "
                  rf"not fit its declared types: {fact}, so every Run entering the Stage would "
                  r"fail there\. Give each field a default of its declared type, or declare "
                  r"@stage\.init to build the State\.") as info:
        wf.validate()
    assert _code(info) == "WORKFLOW_DEFINITION_INVALID"
    st.init(lambda ctx: state.__new__(state))  # an initialiser builds it instead
    wf.validate()


class _DefaultSetInAny(msgspec.Struct):
    seen: Any = msgspec.field(default_factory=set)


class _DefaultZonedTime(msgspec.Struct):
    at: datetime.datetime = msgspec.field(default_factory=lambda: datetime.datetime(
        2026, 3, 1, 9, tzinfo=zoneinfo.ZoneInfo("Europe/Paris")))


@pytest.mark.parametrize(("state", "fact"), [
    (_DefaultSetInAny, r"\$\.seen is a set, in a part of the State typed Any: it would be "
                       r"saved as a list"),
    (_DefaultZonedTime, r"\$\.at is a datetime in time zone 'Europe/Paris', of which JSON "
                        r"keeps only the UTC offset"),
])
def test_a_default_state_the_save_check_refuses_is_refused_at_load(
    state: type[msgspec.Struct], fact: str,
) -> None:
    """A default that decodes as its type but that the save check refuses (a set in a part
    typed Any, a datetime in a zone with rules) loaded, and every Run failed as it entered
    the Stage, STAGE_STATE_INVALID "Stage 's' default State: the Stage State it left cannot
    be saved as it is": found by each Run, not by the load or doctor."""
    wf = intloom.Workflow("w", version="1")
    st = wf.stage("s", state=state)
    st.step("a", routes={"ok": intloom.COMPLETE})(lambda ctx: "ok")
    with _refused(rf"Workflow 'w', Stage 's': the default State .*{state.__qualname__}\(\) "
                  rf"cannot be saved as it is: {fact}.*\. Every Run entering the Stage would "
                  r"fail there.*: change that default, or declare @stage\.init to build the "
                  r"State\.$") as info:
        wf.validate()
    assert _code(info) == "WORKFLOW_DEFINITION_INVALID"
    assert "This State was not saved" not in str(info.value)
    st.init(lambda ctx: state.__new__(state))  # an initialiser builds it instead
    wf.validate()


class _ExitsOnDefault(msgspec.Struct):
    n: int = 0

    def __post_init__(self) -> None:
        sys.exit("no defaults here")


def test_a_state_whose_default_exits_is_a_definition_mistake_not_an_exit() -> None:
    """sys.exit() in the __post_init__ of a Stage's State, run at load to build the default,
    left the check: the host's start failed CLI_INTERNAL_ERROR (no Workflow loaded), and
    doctor printed "no defaults here" and exited 1."""
    wf = intloom.Workflow("w", version="1")
    st = wf.stage("s", state=_ExitsOnDefault)
    st.step("a", routes={"ok": intloom.COMPLETE})(lambda ctx: "ok")
    with _refused(r"Stage 's': State .*_ExitsOnDefault\(\) raised SystemExit\('no defaults "
                  r"here'\), so the Stage has no default State\.") as info:
        wf.validate()
    assert _code(info) == "WORKFLOW_DEFINITION_INVALID"


class _Unprintable(Exception):
    def __str__(self) -> str:  # a library's exception whose message cannot be built
        raise RuntimeError("no message")


class _RefusesUnprintably(msgspec.Struct):
    n: int = 0

    def __post_init__(self) -> None:
        raise _Unprintable()


def test_a_state_whose_default_raises_an_unprintable_exception_names_its_type() -> None:
    """str() of the State's exception raised inside the check that reported it: the load
    then said checking the Workflows "raised RuntimeError: no message", naming neither the
    State nor what it raised."""
    wf = intloom.Workflow("w", version="1")
    st = wf.stage("s", state=_RefusesUnprintably)
    st.step("a", routes={"ok": intloom.COMPLETE})(lambda ctx: "ok")
    with _refused(r"Stage 's': State .*_RefusesUnprintably\(\) raised _Unprintable: \(its "
                  r"message cannot be shown: its __str__ raised RuntimeError\), so the Stage "
                  r"has no default State\."):
        wf.validate()


class _ExitsOnSaved(msgspec.Struct):
    text: str = ""

    def __post_init__(self) -> None:
        if self.text:
            sys.exit(3)


def test_a_saved_state_whose_class_now_exits_holds_that_run_only() -> None:
    """A State class whose __post_init__ (edited outside the tree) calls sys.exit() on the
    State a Run saved failed the host's start (CLI_INTERNAL_ERROR: no Run restored), and
    ended doctor and inspect silently with exit 3, doctor's "attention"."""
    from intloom.authoring.compat import state_problem
    from intloom.authoring.loader import LoadedWorkflow
    from intloom.runtime.machine import RunState
    from intloom.runtime.model import Cursor

    wf = intloom.Workflow("w", version="1")
    st = wf.stage("s", state=_ExitsOnSaved)
    st.step("a", routes={"ok": intloom.COMPLETE})(lambda ctx: "ok")
    wf.validate()
    lw = LoadedWorkflow(workflow=wf, source="w.py", identity="0" * 64, schemas=wf.schemas())
    saved = RunState(
        run_id="RUN-1", workflow="w", workflow_version="1", identity="0" * 64,
        schemas=wf.schemas(), intent="i", format=1, package_version="0", protocol="1",
        created_at="t", updated_at="t", phase="waiting", seq=5,
        cursor=Cursor(stage="s", step="a"), status="waiting", stage_state=b'{"text":"x"}',
    )
    assert state_problem(lw, saved) == (
        "the State saved in Stage 's' no longer decodes: building _ExitsOnSaved raised "
        "SystemExit(3)")


# ----- the loader -------------------------------------------------------------------------


GOOD = textwrap.dedent('''
    import intloom

    wf = intloom.Workflow("good", version="1")
    s = wf.stage("s")


    @s.step("a", routes={"ok": intloom.COMPLETE})
    def a(ctx: intloom.StepContext[None]) -> str:
        return "ok"
''')
PATH_STATE = textwrap.dedent('''
    import pathlib

    import msgspec

    import intloom


    class Notes(msgspec.Struct):
        out: pathlib.Path = pathlib.Path("notes.md")


    wf = intloom.Workflow("pathstate", version="1")
    s = wf.stage("s", state=Notes)


    @s.step("a", routes={"ok": intloom.COMPLETE})
    def a(ctx: intloom.StepContext[Notes]) -> str:
        return "ok"
''')
SOURCES = {
    "pathstate": PATH_STATE,
    "exits": "import sys\n\nimport intloom\n\nsys.exit(0)\n",
    "argv": "import argparse\n\nimport intloom\n\nargparse.ArgumentParser().parse_args()\n",
    "interrupts": "import intloom\n\nraise KeyboardInterrupt\n",
    # No Python code runs after it: it ended the process (this test's too) with no word.
    "hardexit": "import os\n\nimport intloom\n\nos._exit(0)\n",
}


def _project(root: Path, sources: dict[str, str]) -> Config:
    """Each source in a directory of its own (their identities apart), plus ``good``."""
    for name, text in {**sources, "good": GOOD}.items():
        (root / "workflows" / name).mkdir(parents=True)
        (root / "workflows" / name / "wf.py").write_text(text)
    return Config(workflows=tuple(f"workflows/{name}/wf.py" for name in [*sources, "good"]),
                  port=None)


def test_whatever_a_source_raises_it_alone_fails_named_and_the_others_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # argparse reads sys.argv: the command line doctor imports under, not pytest's (which
    # is empty under a bare `scripts/test`, and argparse would then have nothing to refuse).
    monkeypatch.setattr(sys, "argv", ["intloom", "doctor"])
    result = load_workflows(tmp_path, _project(tmp_path, SOURCES))
    capsys.readouterr()  # argparse's usage line
    assert list(result.workflows) == ["good"]
    problems = dict(result.problems)
    assert list(problems) == [f"workflows/{name}/wf.py" for name in SOURCES]
    path_state = problems["workflows/pathstate/wf.py"]
    assert path_state.code == "WORKFLOW_DEFINITION_INVALID"
    assert "Stage 's': State Notes field 'out' has type pathlib.Path" in path_state.message
    for name, shown, line in (("exits", "SystemExit(0)", 5), ("argv", "SystemExit(2)", 5)):
        view = problems[f"workflows/{name}/wf.py"]
        assert view.code == "WORKFLOW_LOAD_FAILED"
        assert f"failed: {shown} (line {line} of workflows/{name}/wf.py)" in view.message
        assert 'if __name__ == "__main__":' in view.message, view.message
    interrupts = problems["workflows/interrupts/wf.py"]
    assert interrupts.code == "WORKFLOW_LOAD_FAILED"
    assert "KeyboardInterrupt (line 3 of workflows/interrupts/wf.py)" in interrupts.message
    hard = problems["workflows/hardexit/wf.py"]
    assert hard.code == "WORKFLOW_LOAD_FAILED"
    assert "failed: os._exit(0) (line 5 of workflows/hardexit/wf.py)" in hard.message, hard
    assert "must not end the process when it is imported" in hard.message, hard
    assert os._exit is posix._exit  # the real one again, once the imports are done


PLACED = {
    "twice": textwrap.dedent('''
        import intloom

        wf = intloom.Workflow("twice", version="1")
        s = wf.stage("s")


        @s.step("a", routes={"ok": intloom.COMPLETE})
        def a(ctx: intloom.StepContext[None]) -> str:
            return "ok"


        @s.step("a", routes={"ok": intloom.COMPLETE})
        def b(ctx: intloom.StepContext[None]) -> str:
            return "ok"
    '''),
    "route": textwrap.dedent('''
        import intloom

        wf = intloom.Workflow("route", version="1")
        s = wf.stage("s")


        @s.step("a", routes={"ok": "b"})
        def a(ctx: intloom.StepContext[None]) -> str:
            return "ok"
    '''),
    "empty": textwrap.dedent('''
        import intloom

        wf = intloom.Workflow("empty", version="1")
        s = wf.stage("s")
        t = wf.stage("t")


        @s.step("a", routes={"ok": intloom.ToStage("t")})
        def a(ctx: intloom.StepContext[None]) -> str:
            return "ok"
    '''),
}


def test_a_definition_mistake_names_the_file_and_line_that_made_it(tmp_path: Path) -> None:
    """A mistake found while the module imports (a Step defined twice) or when its Workflow
    is checked after it (a route to a Step that does not exist, a Stage without Steps) named
    the Workflow, the Stage and the Step, but not where in which file, as an exception
    raised there does: the second of two Steps with one name is found only by reading."""
    result = load_workflows(tmp_path, _project(tmp_path, PLACED))
    assert list(result.workflows) == ["good"]
    problems = {rel: view.message for rel, view in result.problems}
    for name, line, rest in (
        ("twice", 13, "Workflow 'twice', Stage 's': Step 'a' is defined twice."),
        ("route", 8, "Workflow 'route', Stage 's', Step 'a': outcome 'ok' routes to Step 'b', "
                     "which Stage 's' does not have."),
        ("empty", 6, "Workflow 'empty', Stage 't': the Stage has no Step."),
    ):
        message = problems[f"workflows/{name}/wf.py"]
        assert message.startswith(f"workflows/{name}/wf.py, line {line}: {rest}"), message


UNIONS = {
    "optional": textwrap.dedent('''
        from typing import Optional

        import msgspec
        import intloom


        class Notes(msgspec.Struct):
            n: int = 0


        wf = intloom.Workflow("optional", version="1")
        s = wf.stage("s", state=Optional[Notes])  # type: ignore[arg-type]


        @s.step("a", routes={"ok": intloom.COMPLETE})
        def a(ctx: intloom.StepContext[None]) -> str:
            return "ok"
    '''),
    "union": textwrap.dedent('''
        from typing import Union

        import msgspec
        import intloom


        class Draft(msgspec.Struct):
            n: int = 0


        class Final(msgspec.Struct):
            m: int = 0


        class Notes(msgspec.Struct):
            doc: Union[Draft, Final, None] = None


        wf = intloom.Workflow("union", version="1")
        s = wf.stage("s", state=Notes)


        @s.step("a", routes={"ok": intloom.COMPLETE})
        def a(ctx: intloom.StepContext[Notes]) -> str:
            return "ok"
    '''),
}


def test_a_definition_mistake_names_a_users_class_inside_a_type_as_the_author_wrote_it(
        tmp_path: Path) -> None:
    """A class is named without the internal module name its source is imported under, and
    so is one inside a type that is not a class (``Optional[Notes]``, a union of Structs):
    those were shown as ``typing.Optional[_intloom_wf_56f138bcc83a.Notes]``."""
    result = load_workflows(tmp_path, _project(tmp_path, UNIONS))
    problems = {rel: view.message for rel, view in result.problems}
    optional = problems["workflows/optional/wf.py"]
    assert "state typing.Optional[Notes] (a _UnionGenericAlias, not a class)" in optional
    union = problems["workflows/union/wf.py"]
    assert "field 'doc' has type typing.Union[Draft, Final, NoneType]" in union
    assert "type `typing.Union[Draft, Final, NoneType]` is not supported" in union
    for message in (optional, union):
        assert "_intloom_wf_" not in message, message


def test_a_route_to_complete_as_text_says_to_use_intloom_complete() -> None:
    """``routes={"done": "COMPLETE"}`` was refused as a route to a Step that does not exist,
    with the fix "Use one of ['a'], or intloom.ToStage(...)": how to end the Run was not
    said."""
    wf = intloom.Workflow("w", version="1")
    wf.stage("s").step("a", routes={"done": "COMPLETE"})(lambda ctx: "done")
    with _refused(r"Workflow 'w', Stage 's', Step 'a': outcome 'done' routes to Step "
                  r"'COMPLETE', which Stage 's' does not have\. Use one of \['a'\], "
                  r"intloom\.ToStage\(\.\.\.\), or intloom\.COMPLETE \(not the text\) to end "
                  r"the Run\.$"):
        wf.validate()


# ----- The route graph: a Run must be able to complete --------------------------------------


def _ok(ctx: Any) -> str:
    return "ok"


def test_a_workflow_whose_routes_never_reach_complete_is_refused_naming_what_they_reach() -> None:
    """Routes that only go round (``write`` -> ``review`` -> ``write``) loaded, and each Run
    could only loop, wait or fail: no route from the entry ended it."""
    wf = intloom.Workflow("notes", version="1")
    draft = wf.stage("draft")
    draft.step("write", routes={"written": "review"})(_ok)
    draft.step("review", routes={"approved": "write", "rejected": "write"})(_ok)
    with _refused("no Run of it could ever complete") as info:
        wf.validate()
    assert _code(info) == "WORKFLOW_DEFINITION_INVALID"
    assert info.value.message == (
        "Workflow 'notes', definition: no Run of it could ever complete: from its entry "
        "(Stage 'draft', Step 'write') the routes reach only Stage 'draft', Steps 'write' and "
        "'review', and none of them routes an outcome to intloom.COMPLETE (a Run could only "
        "go round, wait or fail). Route the outcome that ends the Run to intloom.COMPLETE "
        '(routes={"done": intloom.COMPLETE}) in one of those Steps.'), info.value.message
    # The Workflow(...) call is what the loader names (file and line).
    assert getattr(info.value, "at", None) == wf.declared_at

    one = intloom.Workflow("spin", version="1")
    one.stage("s").step("tick", routes={"again": "tick"})(_ok)
    with _refused(r"from its entry \(Stage 's', Step 'tick'\) the routes reach only Stage "
                  r"'s', Step 'tick', and it routes no outcome to intloom\.COMPLETE .* in "
                  r"that Step\.$"):
        one.validate()


def test_a_complete_route_that_nothing_leads_to_is_named_with_the_route_to_add() -> None:
    """A Step (or a Stage) that does end the Run, but that no route from the entry reaches:
    the refusal names it and how to route there (by name within the Stage, ToStage to a
    Stage's first Step)."""
    wf = intloom.Workflow("w", version="1")
    s = wf.stage("s")
    s.step("a", routes={"again": "a"})(_ok)
    s.step("end", routes={"ok": intloom.COMPLETE})(_ok)
    with _refused(r"; Stage 's', Step 'end' routes to intloom\.COMPLETE, but no route from "
                  r"the entry leads to it\. .*in that Step, or route an outcome of a Step of "
                  r'Stage \'s\' to "end"\.$'):
        wf.validate()

    other = intloom.Workflow("w2", version="1")
    other.stage("s").step("a", routes={"again": "a"})(_ok)
    other.stage("publish").step("post", routes={"ok": intloom.COMPLETE})(_ok)
    with _refused(r"Stage 'publish', Step 'post' routes to intloom\.COMPLETE, but no route "
                  r"from the entry leads to it\. .*, or route an outcome to "
                  r'intloom\.ToStage\("publish"\)\.$'):
        other.validate()


def test_complete_reached_through_another_stage_or_an_agent_step_loads() -> None:
    """The walk follows ToStage into a Stage's first Step, and an Agent Step's routes as a
    code Step's (its Agent picks one of them); a recover has no routes of its own."""
    wf = intloom.Workflow("w", version="1")
    draft, publish = wf.stage("draft"), wf.stage("publish")
    write = draft.step("write", routes={"ok": "look", "no": "write"})(_ok)
    write.recover(lambda ctx, saved: "ok")
    draft.agent_step("look", routes={"found": intloom.ToStage("publish")})(_ok)
    publish.step("post", routes={"again": "check"})(_ok)
    publish.step("check", routes={"ok": intloom.COMPLETE, "no": "post"})(_ok)
    wf.validate()
    assert wf.unreached() == [] and wf.unreached_note() is None


def test_steps_and_stages_no_route_reaches_load_and_are_named_as_unreached() -> None:
    """Not refused: a Step may be kept for later, and the Runs run as declared. The host
    logs it and doctor says it (the note both show)."""
    wf = intloom.Workflow("w", version="1")
    main, later = wf.stage("main"), wf.stage("later")
    main.step("a", routes={"ok": intloom.COMPLETE})(_ok)
    main.step("spare", routes={"ok": "a"})(_ok)
    later.step("x", routes={"ok": intloom.COMPLETE})(_ok)
    later.step("y", routes={"ok": "x"})(_ok)
    wf.validate()
    assert wf.unreached() == ["Stage 'main', Step 'spare'", "Stage 'later' (no route enters it)"]
    assert wf.unreached_note() == (
        "Workflow 'w': no route from its entry (Stage 'main', Step 'a') leads to Stage 'main', "
        "Step 'spare'; Stage 'later' (no route enters it), so no Run runs them. Route an "
        "outcome there if it is meant to run (a Step by its name within its Stage, a Stage by "
        "intloom.ToStage), or leave it if it is kept for later.")


def test_a_source_whose_workflow_cannot_complete_fails_to_load_named_at_its_workflow_line(
    tmp_path: Path,
) -> None:
    source = ("import intloom\n\n"
              'wf = intloom.Workflow("loops", version="1")\n'
              'st = wf.stage("s")\n\n\n'
              '@st.step("a", routes={"again": "a"})\n'
              "def a(ctx):\n    return 'again'\n")
    result = load_workflows(tmp_path, _project(tmp_path, {"loops": source}))
    assert set(result.workflows) == {"good"}  # the others load
    view = dict(result.problems)["workflows/loops/wf.py"]
    assert view.code == "WORKFLOW_DEFINITION_INVALID", view
    assert view.message.startswith(
        "workflows/loops/wf.py, line 3: Workflow 'loops', definition: no Run of it could ever "
        "complete"), view.message


def test_a_real_ctrl_c_while_importing_still_interrupts(tmp_path: Path) -> None:
    # The module signals its own process, as a person's Ctrl-C would while doctor imports.
    config = _project(tmp_path, {"slow": (
        "import os\nimport signal\n\nimport intloom\n\nos.kill(os.getpid(), signal.SIGINT)\n"
        "raise AssertionError('the signal did not interrupt')\n")})
    # As in a person's terminal: Python's own SIGINT handler, SIGINT not held off on this
    # thread. In a test worker, an earlier test could have left either otherwise (this
    # failed twice, "DID NOT RAISE", in full runs and never alone); then the loader rightly
    # leaves SIGINT to whoever owns it, and the module's own KeyboardInterrupt is its error.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    held = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        with pytest.raises(KeyboardInterrupt):
            load_workflows(tmp_path, config)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        signal.signal(signal.SIGINT, previous)


def test_a_source_listed_twice_is_loaded_once_and_the_repeat_named(tmp_path: Path) -> None:
    counter = tmp_path / "imports.log"
    (tmp_path / "workflows").mkdir()
    (tmp_path / "workflows" / "good.py").write_text(
        f"with open({str(counter)!r}, 'a') as f:\n    f.write('x')\n{GOOD}")
    config = Config(workflows=("workflows/good.py", "workflows/good.py",
                               "./workflows/../workflows/good.py"), port=None)
    result = load_workflows(tmp_path, config)
    assert list(result.workflows) == ["good"] and counter.read_text() == "x"
    [(first, twice), (second, spelled)] = result.problems
    assert first == "workflows/good.py" and twice.code == "WORKFLOW_LOAD_FAILED"
    assert twice.message == (
        "workflows/good.py is listed in intloom.toml twice; it is loaded once, from the "
        "first. Remove the repeated entry from 'workflows'.")
    assert second == "./workflows/../workflows/good.py"
    assert "listed in intloom.toml twice (as 'workflows/good.py' and " in spelled.message
    assert "defined in both" not in twice.message + spelled.message


@pytest.mark.parametrize("copy_first", [True, False], ids=["copy-first", "original-first"])
def test_a_workflow_two_sources_define_is_loaded_from_neither_and_both_are_named(
    tmp_path: Path, copy_first: bool,
) -> None:
    """A copied source (``cp -r workflows/good workflows/copy``) defines the same Workflow:
    whichever file intloom.toml listed first was loaded, and the other failed, so a Run went
    on with (or was held as "changed" by) whichever copy happened to come first."""
    config = _project(tmp_path, {})
    (tmp_path / "workflows" / "copy").mkdir()
    # The copy also defines a Workflow of its own, which is withheld with it.
    (tmp_path / "workflows" / "copy" / "wf.py").write_text(GOOD + textwrap.dedent('''
        extra = intloom.Workflow("extra", version="1")
        extra.stage("t").step("b", routes={"ok": intloom.COMPLETE})(a)
    '''))
    (tmp_path / "workflows" / "other").mkdir()
    (tmp_path / "workflows" / "other" / "wf.py").write_text(GOOD.replace('"good"', '"other"'))
    listed = ["workflows/copy/wf.py", *config.workflows]
    if not copy_first:
        listed.reverse()
    listed.append("workflows/other/wf.py")
    result = load_workflows(tmp_path, Config(workflows=tuple(listed), port=None))

    assert list(result.workflows) == ["other"]
    problems = dict(result.problems)
    assert list(problems) == listed[:2]
    both = f"Workflow 'good' is defined in both {listed[0]} and {listed[1]}"
    for view in problems.values():
        assert view.code == "WORKFLOW_DEFINITION_INVALID", view
        assert view.message.startswith(f"{both}, so neither file is loaded, and the Runs of "
                                       "'good' are held"), view.message
        assert ("Keep one: take the other file out of 'workflows' in intloom.toml, or give "
                "each Workflow a name of its own; then restart the host") in view.message
        # Directories of their own: no word of a shared tree.
        assert "share a source tree" not in view.message, view.message
    assert result.withheld == {
        "good": f"{both}, so neither is loaded",
        "extra": "Workflow 'extra' is not loaded, since its source workflows/copy/wf.py is "
                 f"not: {both}",
    }


def test_a_workflow_imported_by_another_source_is_not_called_a_copy(tmp_path: Path) -> None:
    """``from flows.b import wf as b_wf`` in a.py binds b.py's Workflow at a.py's top level:
    both sources were said to define 'b' ("Keep one ... give each Workflow a name of its
    own ... a copy left there holds the Runs as changed, so delete it"), when deleting b.py
    breaks a.py's import. The message says a.py imports it, and how to import the module."""
    package = f"p{abs(hash(tmp_path)) % 10**9}"  # a name no other test has imported
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "b.py").write_text(GOOD.replace('"good"', '"b"'))
    (tmp_path / package / "a.py").write_text(
        f"from {package}.b import wf as b_wf\n" + GOOD.replace('"good"', '"a"'))
    listed = (f"{package}/a.py", f"{package}/b.py")
    try:
        result = load_workflows(tmp_path, Config(workflows=listed, port=None))
    finally:
        for name in [m for m in sys.modules if m == package or m.startswith(f"{package}.")]:
            del sys.modules[name]
    assert result.workflows == {}
    problems = dict(result.problems)
    assert list(problems) == list(listed)
    for view in problems.values():
        assert view.code == "WORKFLOW_DEFINITION_INVALID", view
        assert view.message.startswith(
            f"Workflow 'b' of {listed[1]} is also bound at the top level of {listed[0]}, "
            "which imports it"), view.message
        assert (f"In {listed[0]}, import the module (import {package}.b) and use its "
                "Workflow through it") in view.message, view.message
        assert "delete it" not in view.message and "copy" not in view.message, view.message
    # The Runs' held reason says the same: one Workflow imported, not two definitions.
    bound = (f"Workflow 'b' of {listed[1]} is also bound at the top level of {listed[0]}, "
             "which imports it")
    assert result.withheld == {
        "b": f"{bound}, so neither is loaded",
        "a": f"Workflow 'a' is not loaded, since its source {listed[0]} is not: {bound}",
    }


def test_a_copy_beside_the_original_is_named_as_part_of_its_identity(tmp_path: Path) -> None:
    (tmp_path / "workflows").mkdir()
    for name in ("good", "good_copy"):
        (tmp_path / "workflows" / f"{name}.py").write_text(GOOD)
    config = Config(workflows=("workflows/good_copy.py", "workflows/good.py"), port=None)
    result = load_workflows(tmp_path, config)
    assert result.workflows == {}
    [(_, copy), (_, original)] = result.problems
    assert original.message.endswith(
        "workflows/good.py and workflows/good_copy.py share a source tree, which a Workflow's "
        "identity covers: a copy left there holds the Runs as changed, so delete it or move it "
        "to a directory of its own."), original.message
    assert "workflows/good_copy.py and workflows/good.py share a source tree" in copy.message


def test_a_fault_no_check_foresaw_fails_only_its_own_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = _project(tmp_path, {"odd": GOOD.replace('"good"', '"odd"')})
    real = intloom.Workflow.schemas

    def schemas(self: intloom.Workflow) -> dict[str, str]:
        if self.name == "odd":
            raise RuntimeError("an unforeseen fault")
        return real(self)

    monkeypatch.setattr(intloom.Workflow, "schemas", schemas)
    result = load_workflows(tmp_path, config)
    assert list(result.workflows) == ["good"]
    [(source, view)] = result.problems
    assert (source, view.code) == ("workflows/odd/wf.py", "WORKFLOW_DEFINITION_INVALID")
    assert view.message == ("workflows/odd/wf.py: checking its Workflows raised RuntimeError: "
                            "an unforeseen fault. Fix the definition and restart the host.")


def test_a_fault_inside_intloom_while_checking_is_not_blamed_on_the_workflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fault raised in intloom's own code as it checked a loaded Workflow (a dependency
    of the wrong version: with a msgspec older than intloom needs, pip check passed and the
    example failed "AttributeError: module 'msgspec.inspect' has no attribute ...") was
    called the Workflow's: WORKFLOW_DEFINITION_INVALID, "Fix the definition", of code that
    was fine. Here a call of intloom's gets a function of another signature (a builtin, so
    that the innermost frame is intloom's, as with a C extension of the wrong version)."""
    from intloom.authoring import loader

    config = _project(tmp_path, {})
    monkeypatch.setattr(loader, "workflow_identity", len)
    result = load_workflows(tmp_path, config)
    [(source, view)] = result.problems
    assert source == "workflows/good/wf.py"
    assert view.code == "CLI_INTERNAL_ERROR", view
    assert view.message.startswith(f"{source}: checking its Workflows failed inside intloom, "
                                   "at intloom/authoring/loader.py line "), view.message
    assert "not of the Workflow" in view.message and "pip check" in view.message, view.message
    assert "Fix the definition" not in view.message, view.message


# A Workflow whose own check reads settings that were never configured: user code that
# raises while the loader checks its Workflows. (A module-level lazy proxy whose __class__
# raised was the case once; the loader no longer asks a global for its __class__.)
LAZY = textwrap.dedent('''
    import intloom


    class Unconfigured(Exception):
        def __str__(self) -> str:
            raise RuntimeError("settings were never read")


    class Checked(intloom.Workflow):
        """Validated against settings that were never configured."""
        def validate(self) -> None:
            raise RAISED


    wf = Checked("lazy", version="1")
    s = wf.stage("s")


    @s.step("a", routes={"ok": intloom.COMPLETE})
    def a(ctx: intloom.StepContext[None]) -> str:
        return "ok"
''')


@pytest.mark.parametrize(("raised", "shown"), [
    # Before: "...checking its Workflows raised LookupError: . Fix the definition..."
    ("LookupError()", "LookupError"),
    # Python's own rendering of a KeyError, as a Step's is shown (unchanged).
    ("KeyError('DATABASE_URL')", "KeyError: 'DATABASE_URL'"),
    # Before: str() of it raised RuntimeError out of load_workflows, and no source loaded.
    ("Unconfigured()",
     "Unconfigured: (its message cannot be shown: its __str__ raised RuntimeError)"),
])
def test_a_fault_no_check_foresaw_is_named_even_without_a_printable_message(
    tmp_path: Path, raised: str, shown: str,
) -> None:
    config = _project(tmp_path, {"lazy": LAZY.replace("raise RAISED", f"raise {raised}")})
    result = load_workflows(tmp_path, config)
    assert list(result.workflows) == ["good"]
    [(source, view)] = result.problems
    assert (source, view.code) == ("workflows/lazy/wf.py", "WORKFLOW_DEFINITION_INVALID")
    assert view.message == (f"workflows/lazy/wf.py: checking its Workflows raised {shown} "
                            "(line 13 of workflows/lazy/wf.py). Fix the definition and "
                            "restart the host."), view.message


def test_a_module_raising_an_exception_without_a_message_is_named_by_its_type(
    tmp_path: Path,
) -> None:
    config = _project(tmp_path, {"bare": "import intloom\n\nraise LookupError\n"})
    [(_, view)] = load_workflows(tmp_path, config).problems
    # Before: "Importing .../wf.py failed: LookupError:  (line 3 of ...)".
    assert "wf.py failed: LookupError (line 3 of workflows/bare/wf.py). Fix the module" in (
        view.message), view.message


def test_an_entry_under_a_symlink_loop_is_named_as_a_loop_not_as_missing(
    tmp_path: Path,
) -> None:
    """An entry under a link that leads back to itself was reported "does not exist under
    ROOT. Fix the path", though the path is there: pathlib's exists() hides ELOOP."""
    (tmp_path / "workflows").symlink_to("flows")
    (tmp_path / "flows").symlink_to("workflows")
    (tmp_path / "self.py").symlink_to("self.py")
    config = Config(workflows=("workflows/wf.py", "self.py"), port=None)
    problems = dict(load_workflows(tmp_path, config).problems)
    under, itself = problems["workflows/wf.py"], problems["self.py"]
    assert under.code == itself.code == "WORKFLOW_LOAD_FAILED"
    assert under.message == (
        f"workflows/wf.py (from intloom.toml) cannot be reached under {tmp_path}: workflows "
        "is a symbolic link that leads into a loop of links (Too many levels of symbolic "
        "links). Make workflows lead to a real directory (ls -l shows where each link "
        "leads), or name the real path in 'workflows' in intloom.toml."), under.message
    assert itself.message.startswith(
        f"self.py (from intloom.toml) cannot be reached under {tmp_path}: self.py is a "
        "symbolic link that leads into a loop of links"), itself.message


def test_a_definition_mistake_made_through_a_package_of_the_projects_virtualenv_names_the_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A virtualenv inside the project (``python -m venv .venv`` before ``intloom init``, as
    docs/authoring.md suggests) is under the project root, and so are intloom's own files
    installed in it: a Step defined twice was placed at the innermost frame under the root,
    ``.venv/lib/.../intloom/authoring/workflow.py, line 332``, not the author's source. A
    package installed there (here: one that adds the Steps) is no project source either."""
    site = tmp_path / ".venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (tmp_path / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (site / "intloom_test_venv_steps.py").write_text(textwrap.dedent('''
        import intloom


        def add_twice(stage):
            for _ in range(2):
                stage.step("a", routes={"ok": intloom.COMPLETE})(lambda ctx: "ok")
    '''))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "intloom_test_venv_steps", raising=False)
    source = textwrap.dedent('''
        import intloom
        import intloom_test_venv_steps

        wf = intloom.Workflow("lib", version="1")
        s = wf.stage("s")
        intloom_test_venv_steps.add_twice(s)
    ''')
    result = load_workflows(tmp_path, _project(tmp_path, {"lib": source}))
    monkeypatch.delitem(sys.modules, "intloom_test_venv_steps", raising=False)
    [(rel, view)] = result.problems
    assert rel == "workflows/lib/wf.py"
    assert view.message.startswith(
        "workflows/lib/wf.py, line 7: Workflow 'lib', Stage 's': Step 'a' is defined twice."
    ), view.message


def test_tool_descriptions_too_large_for_a_view_are_refused_when_declared() -> None:
    """Every view of an Agent task shows its Tools' names and descriptions: one Step's 5 MB
    description made ``runs`` fail for every Run of the host, and each claim of its task
    (the claim recorded, its reply too large to send)."""
    from intloom.runtime.limits import MAX_TOOLS_BYTES

    def fn(value: Any) -> Any:
        return value

    wf = intloom.Workflow("tooled", version="1")
    stage = wf.stage("s")
    half = "é" * (MAX_TOOLS_BYTES // 4)  # two bytes each: half the limit per Tool
    fits = [intloom.Tool("a", fn, description=half[:-1]), intloom.Tool("b", fn)]
    stage.agent_step("fine", routes={"ok": intloom.COMPLETE}, tools=fits)(lambda ctx: {})
    over = [intloom.Tool("a", fn, description=half), intloom.Tool("bb", fn, description=half)]
    with _refused(r"Step 'big': its Tools' names and descriptions are 65,539 bytes as UTF-8 "
                  r"\(Tool 'bb': 32,770\), over the 65,536-byte limit") as info:
        stage.agent_step("big", routes={"ok": intloom.COMPLETE}, tools=over)
    assert _code(info) == "WORKFLOW_DEFINITION_INVALID"
    with _refused(r"description holds '\\udcff' at character 1, half of a surrogate pair"):
        intloom.Tool("c", fn, description="a\udcffb")


def test_an_initialiser_stacked_on_a_step_is_refused_when_declared() -> None:
    """``@stage.init`` over ``@stage.step(...)`` took the Step object for the initialiser: it
    loaded, and every Run failed entering the Stage (STAGE_STATE_INVALID)."""
    wf = intloom.Workflow("stacked", version="1")
    stage = wf.stage("s")
    step = stage.step("a", routes={"ok": intloom.COMPLETE})(lambda ctx: "ok")
    with _refused(r"Stage 's': @stage.init decorates Step 'a' \(what the Step's decorator "
                  r"returned\), not a function") as info:
        stage.init(step)
    assert _code(info) == "WORKFLOW_DEFINITION_INVALID"


def test_a_step_stacked_on_the_initialiser_is_refused_when_declared() -> None:
    """The other way round: the initialiser became the Step too, and every Run failed at it
    (its State taken for an outcome)."""

    class St(msgspec.Struct):
        n: int = 0

    wf = intloom.Workflow("stacked2", version="1")
    stage = wf.stage("s", state=St)

    def both(ctx: Any) -> Any:
        return St()

    stage.init(both)
    with _refused(r"Step 'a': @stage.step\(...\) decorates both, the Stage's initialiser"):
        stage.step("a", routes={"ok": intloom.COMPLETE})(both)


CONTAINED_EXITS = r'''
import os, sys
from pathlib import Path
from intloom.authoring.loader import load_workflows
from intloom.project import Config

root = Path(sys.argv[1])
result = load_workflows(root, Config(workflows=("keeps.py", "daemon.py"), port=None))
failed = dict(result.problems)
print("loaded", sorted(result.workflows), "os._exit(0)" in failed["daemon.py"].message,
      flush=True)
import keeps  # the module that kept a reference to os._exit while it was imported
keeps.hard_exit(7)  # after the imports: the real one
print("not reached", flush=True)
'''


def test_os_exit_is_contained_only_while_the_sources_import(tmp_path: Path) -> None:
    """``from os import _exit`` in a module kept the stand-in after the imports: a later call
    raised instead of ending the process. And a module that daemonizes as it is imported
    (``if os.fork(): os._exit(0)``) had its child go on out of the import as a second
    importer (a second host): it ends there."""
    (tmp_path / "keeps.py").write_text("from os import _exit as hard_exit\n")
    (tmp_path / "daemon.py").write_text(
        "import os\nimport intloom\n\nif os.fork():\n    os._exit(0)\n\n"
        "wf = intloom.Workflow('daemon', version='1')\n")
    (tmp_path / "run.py").write_text(CONTAINED_EXITS)
    done = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 7, (done.stdout, done.stderr)
    [loaded] = done.stdout.splitlines()  # once: the forked child did not go on
    assert loaded == "loaded [] True", loaded  # the parent's os._exit: a load failure
    assert "went on out of its import; it ends here" in done.stderr, done.stderr


CHANGES_ITSELF = textwrap.dedent('''
    import intloom

    wf = intloom.Workflow("changes", version="1")
    s = wf.stage("s")


    @s.step("a", routes={"go": "b"})
    async def a(ctx):
        if ctx.intent == "reroute":
            wf.stages["s"].steps["a"].routes["go"] = "nowhere"
        if ctx.intent == "add":
            s.step("late", routes={"ok": intloom.COMPLETE})(lambda ctx: "ok")
        if ctx.intent == "stage":
            wf.stage("later")
        if ctx.intent == "rebind":
            wf.stages["s"].steps["a"].routes = {"go": "nowhere"}
        if ctx.intent == "steps":
            s.steps = {}
        return "go"


    @s.step("b", routes={"ok": intloom.COMPLETE})
    async def b(ctx):
        return "ok"
''')


def test_a_loaded_workflow_cannot_be_changed_by_the_code_its_runs_run(tmp_path: Path) -> None:
    # A Step that rerouted an outcome wrote a cursor at a Step that does not exist and
    # failed with CLI_INTERNAL_ERROR (KeyError); one that added a Step or a Stage changed the
    # graph every later Run took, and that the next restart forgot.
    from intloom.executor.runtime import Runtime
    from tests.unit.test_store_support import open_store

    result = load_workflows(tmp_path, _project(tmp_path, {"changes": CHANGES_ITSELF}))
    assert dict(result.problems) == {}
    loaded = result.workflows["changes"]

    async def main() -> list[Any]:
        store = open_store(tmp_path / "runtime")
        rt = Runtime({"changes": loaded}, store, package_version="0.1.0")
        rt.restore([])
        views = []
        for intent in ("reroute", "add", "stage", "rebind", "steps", "plain"):
            views.append(await rt.wait_stable((await rt.create_run("changes", intent)).run_id))
        await store.close()
        return views

    reroute, add, stage, rebind, steps, plain = asyncio.run(
        asyncio.wait_for(main(), timeout=20))
    assert reroute.status == "failed" and reroute.last_error is not None
    assert reroute.last_error.code == "STEP_EXECUTION_FAILED", reroute.last_error
    assert ("Stage 's', Step 'a' raised TypeError at line 11 of workflows/changes/wf.py"
            in reroute.last_error.message), reroute.last_error.message
    # Rebinding an attribute, not only an entry: it rewired every later Run the same way.
    for view, what, where in ((add, "@stage.step(...) was called", "Stage 's', Step 'late'"),
                              (stage, "wf.stage(...) was called", "Stage 'later'"),
                              (rebind, "routes was assigned", "Stage 's', Step 'a'"),
                              (steps, "steps was assigned", "Stage 's'")):
        assert view.status == "failed" and view.last_error is not None
        assert view.last_error.code == "WORKFLOW_DEFINITION_INVALID", view.last_error
        assert view.last_error.message.startswith(
            f"Workflow 'changes', {where}: {what} after the host loaded the "
            "Workflow"), view.last_error.message
        assert "at the top level of the source" in view.last_error.message
    # Nothing changed: a later Run routes as declared.
    assert plain.status == "completed", plain
    wf = loaded.workflow
    assert list(wf.stages) == ["s"] and list(wf.stages["s"].steps) == ["a", "b"]
    assert dict(wf.stages["s"].steps["a"].routes) == {"go": "b"}
    # Before loading, declaring goes on as ever.
    fresh = intloom.Workflow("fresh", version="1")
    fresh.stage("s").step("a", routes={"ok": intloom.COMPLETE})(lambda ctx: "ok")
    fresh.validate()
    fresh.stage("t")


def test_one_workflow_bound_by_two_sources_loads_from_neither(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both listed sources import the Workflow of a module neither lists: the loader meets
    one object twice. Marking it loaded the second time was refused as a change after the
    load, so the first source loaded it and the second failed with that refusal, by the
    order of intloom.toml; neither is loaded, each named, as for any two definitions."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "shared_wf", raising=False)
    (tmp_path / "shared_wf.py").write_text(GOOD.replace('"good"', '"shared"'))
    config = _project(tmp_path, {"a": "from shared_wf import wf\n",
                                 "b": "from shared_wf import wf\n"})
    try:
        result = load_workflows(tmp_path, config)
    finally:
        sys.modules.pop("shared_wf", None)
    assert "shared" not in result.workflows and "good" in result.workflows, result.workflows
    problems = dict(result.problems)
    for name in ("a", "b"):
        view = problems[f"workflows/{name}/wf.py"]
        assert view.code == "WORKFLOW_DEFINITION_INVALID", view
        assert "Workflow 'shared' is defined in both" in view.message, view.message
        assert "_loaded" not in view.message, view.message


_TYPE_CHECKING_ONLY = '''
from __future__ import annotations
from typing import TYPE_CHECKING
import msgspec, intloom
if TYPE_CHECKING:
    from datetime import datetime
class S(msgspec.Struct):
    when: datetime | None = None
wf = intloom.Workflow("w", version="1")
st = wf.stage("s", state=S)
@st.step("a", routes={"ok": intloom.COMPLETE})
def a(ctx):
    return "ok"
'''


def test_a_state_annotation_imported_only_for_type_checkers_is_named_with_its_fix() -> None:
    """``datetime`` imported under ``if TYPE_CHECKING:`` (annotations as strings): the load
    said "State S has no JSON Schema (NameError ...). Declare its fields with a JSON type:
    ... datetime ...", advice to declare the very type the field had."""
    namespace: dict[str, object] = {"__name__": "flows_tc"}
    exec(compile(_TYPE_CHECKING_ONLY, "flows_tc.py", "exec"), namespace)
    wf = namespace["wf"]
    assert isinstance(wf, intloom.Workflow)
    with pytest.raises(IntloomError) as info:
        wf.validate()
    assert info.value.code == "WORKFLOW_DEFINITION_INVALID"
    message = info.value.message
    assert "State flows_tc.S's field annotations name 'datetime', which its module does not " \
        "define when it runs (name 'datetime' is not defined)" in message, message
    assert "not under `if TYPE_CHECKING:`" in message, message
    assert "Declare its fields" not in message, message
