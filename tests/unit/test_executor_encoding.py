"""Values the journal cannot encode (msgpack holds integers within 64 bits), over the real store:
an effect's result is kept as its repr; a client's value is refused and the Run loses nothing."""

from __future__ import annotations

import asyncio
import decimal
import enum
import gc
import warnings
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

import intloom
from intloom.errors import IntloomError
from intloom.runtime.records import EffectDone
from intloom.store import read_history, verify
from tests.unit.test_executor_ctx_mistakes import _runtime
from tests.unit.test_executor_ctx_mistakes import _settle as _settled
from tests.unit.test_store_support import open_store

HUGE = 2**70


def _workflow() -> intloom.Workflow:
    wf = intloom.Workflow("huge", version="1")
    st = wf.stage("s")

    @st.step("effect", routes={"ok": "research"})
    async def effect(ctx: Any) -> str:
        assert await ctx.aeffect("big", lambda: HUGE) == HUGE  # the Step sees the real value
        return "ok"

    @st.agent_step("research", routes={"done": intloom.COMPLETE})
    def research(ctx: Any) -> Any:
        return {"task": ctx.intent}

    wf.validate()
    return wf


def test_unencodable_values_are_kept_as_repr_or_refused_and_nothing_is_lost(
    tmp_path: Path,
) -> None:
    root = tmp_path / "runtime"
    wf = _workflow()

    async def main() -> str:
        store = open_store(root)
        rt = _runtime(store, wf)
        view = await rt.wait_stable((await rt.create_run("huge", "find x")).run_id)
        call = view.pending_agent_call
        assert view.status == "waiting" and call is not None
        token, _ = await rt.claim_agent_call(view.run_id, call.id, "c1")
        with pytest.raises(IntloomError) as refused:
            await rt.complete_agent_call(view.run_id, call.id, token, "done", {"n": HUGE})
        assert refused.value.code == "INVALID_REQUEST"
        assert "output" in refused.value.message and "64 bits" in refused.value.message
        still = rt.get(view.run_id)
        assert still.status == "waiting" and still.pending_agent_call is not None
        done = await rt.complete_agent_call(view.run_id, call.id, token, "done", {"n": 1})
        assert done.status == "completed"
        await store.close()
        return view.run_id

    run_id, journal = _verified_after(root, main)
    assert journal.state is not None
    assert journal.state.status == "completed" and journal.state.output == {"n": 1}
    results = [e.record.result for e in read_history(root, run_id)
               if isinstance(e.record, EffectDone)]
    assert results == [{"repr": str(HUGE)}]


def test_a_step_asking_with_a_value_the_journal_cannot_hold_fails_cleanly(tmp_path: Path) -> None:
    """The `waiting` record is refused before it changes the Run: the Run fails with the
    reason, and its journal reads back whole (no record the state counted but the log lacks)."""
    root = tmp_path / "runtime"
    wf = intloom.Workflow("ask", version="1")
    st = wf.stage("s")

    @st.step("ask", routes={"yes": intloom.COMPLETE, "no": intloom.COMPLETE})
    async def ask(ctx: Any) -> str:
        answer = await ctx.confirm({"n": HUGE})
        return "yes" if answer.confirmed else "no"

    wf.validate()

    async def main() -> str:
        store = open_store(root)
        rt = _runtime(store, wf)
        view = await rt.wait_stable((await rt.create_run("ask", "go")).run_id)
        assert view.status == "failed" and view.last_error is not None
        assert view.last_error.code == "RUN_STATE_INVALID"
        assert "its waiting record cannot be written" in view.last_error.message
        await store.close()
        return view.run_id

    _, journal = _verified_after(root, main)
    assert journal.state is not None
    assert journal.state.status == "failed" and journal.state.phase == "terminal"


def _holds_itself() -> list[Any]:
    value: list[Any] = []
    value.append(value)
    return value


def _deep(levels: int = 5000) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels):
        value = [value]
    return value


class _BadRepr:
    def __repr__(self) -> str:
        raise KeyError("no repr")


# what an effect returns -> how its effect_done keeps it (a prefix of the kept repr)
ODD_RESULTS: dict[str, tuple[Callable[[], Any], str]] = {
    "holds_itself": (_holds_itself, "[[...]]"),
    "too_deep": (_deep, "[[[[[["),  # repr itself fails: reprlib's few levels instead
    "lone_surrogate": (lambda: "a\udc80", "'a\\udc80'"),
    "bad_repr": (lambda: {"x": _BadRepr(), "big": HUGE}, "{'big': "),
}


@pytest.mark.parametrize("sync", [True, False])
@pytest.mark.parametrize("kind", sorted(ODD_RESULTS))
def test_an_effect_result_the_journal_cannot_hold_is_kept_described_and_the_step_gets_it(
        tmp_path: Path, kind: str, sync: bool) -> None:
    """The effect is over: its effect_done is written whatever it returned (a value that
    holds itself, one too deep for the encoder or for repr, a lone surrogate), or inspect
    would show it still in flight."""
    make, kept = ODD_RESULTS[kind]
    got: list[Any] = []
    wf = intloom.Workflow("odd", version="1")
    st = wf.stage("s")
    if sync:
        @st.step("a", routes={"ok": intloom.COMPLETE})
        def a(ctx: Any) -> str:
            got.append(ctx.effect("odd", make))
            return "ok"
    else:
        @st.step("a", routes={"ok": intloom.COMPLETE})
        async def a_async(ctx: Any) -> str:
            got.append(await ctx.aeffect("odd", make))
            return "ok"
    wf.validate()
    root = tmp_path / "runtime"
    view = _settled(root, wf)
    assert view.status == "completed", view.last_error
    assert len(got) == 1 and type(got[0]) in (list, str, dict)  # the value itself
    [done] = [e.record for e in read_history(root, view.run_id)
              if isinstance(e.record, EffectDone)]
    assert done.ok and done.name == "odd" and isinstance(done.result, dict), done
    assert done.result["repr"].startswith(kept), done.result
    assert len(done.result["repr"]) <= 1000


class Notes(msgspec.Struct):
    items: Any = None


# where an unencodable State is left -> how that code is named
STATE_LEFT_BY = {
    "step": "Stage 's', Step 'a': ",
    "wait": "Stage 's', Step 'a': ",
    "init": "Stage 's' initialiser: ",
}


@pytest.mark.parametrize("value", ["holds_itself", "too_deep"])
@pytest.mark.parametrize("left_by", sorted(STATE_LEFT_BY))
def test_a_state_too_deep_to_encode_fails_naming_the_step_and_the_fact(
        tmp_path: Path, left_by: str, value: str) -> None:
    make = _holds_itself if value == "holds_itself" else _deep
    wf = intloom.Workflow("deep", version="1")
    st = wf.stage("s", state=Notes)

    if left_by == "init":
        @st.init
        def init(ctx: Any) -> Notes:
            return Notes(items=make())

    @st.step("a", routes={"ok": intloom.COMPLETE})
    async def a(ctx: Any) -> str:
        if left_by != "init":
            ctx.state.items = make()
        if left_by == "wait":
            await ctx.confirm({"ok": True})
        return "ok"

    wf.validate()
    root = tmp_path / "runtime"
    view = _settled(root, wf)
    assert view.status == "failed" and view.last_error is not None, view
    assert view.last_error.code == "STAGE_STATE_INVALID", view.last_error
    message = view.last_error.message
    assert message.startswith(STATE_LEFT_BY[left_by]), message
    for fact in ("(Notes) holds itself, or is nested too deeply", "RecursionError",
                 "this State was not saved"):
        assert fact in message, (fact, message)
    phases = [type(e.record).__name__ for e in read_history(root, view.run_id)]
    assert "Waiting" not in phases and "StepResult" not in phases, phases


class Score(msgspec.Struct):
    value: float = 0.0


@pytest.mark.parametrize("number", [float("nan"), float("inf")])
def test_a_state_float_that_json_cannot_hold_is_named_as_such(
        tmp_path: Path, number: float) -> None:
    """JSON has no NaN or infinity: msgspec writes them as null, and the error said
    "Expected `float`, got `null`" of a field the Step never set to None."""
    wf = intloom.Workflow("scores", version="1")
    st = wf.stage("s", state=Score)

    @st.step("a", routes={"ok": intloom.COMPLETE})
    def a(ctx: Any) -> str:
        ctx.state = Score(value=number)
        return "ok"

    wf.validate()
    view = _settled(tmp_path / "runtime", wf)
    assert view.last_error is not None and view.last_error.code == "STAGE_STATE_INVALID"
    message = view.last_error.message
    assert "got `null`" in message and ("JSON cannot hold NaN or infinity: a float field "
                                        "holding one is written as null") in message, message


# what user code hands the host, too deep to encode -> (the code, facts of its message)
HANDED: dict[str, tuple[str, list[str]]] = {
    # Refused by their depth, at most 500: deeper, the journal could not read them back
    # (~975 levels failed to decode at the next start, and the host did not start).
    "confirm": ("STEP_INTERACTION_INVALID",
                ["Stage 's', Step 'a': the context given to ctx.confirm cannot be shown as it "
                 "is: $ is nested more than 500 levels deep, deeper than intloom reads back "
                 "from its journal; nothing was recorded and nobody was asked. Pass a tree of "
                 "plain data at most 500 levels deep."]),
    "confirm_holds_itself": ("STEP_INTERACTION_INVALID",
                             ["Stage 's', Step 'a': the context given to ctx.confirm holds "
                              "itself, or is nested too deeply"]),
    "ask": ("STEP_INTERACTION_INVALID",
            ["Stage 's', Step 'a': a question given to ctx.ask holds itself"]),
    "agent": ("STEP_INTERACTION_INVALID",
              ["Stage 's', Step 'a' returned an Agent task (list) that cannot be sent as it "
               "is: $ is nested more than 500 levels deep", "no task was published",
               "at most 500 levels deep"]),
    "agent_holds_itself": ("STEP_INTERACTION_INVALID",
                           ["Stage 's', Step 'a' returned an Agent task (list) that holds "
                            "itself, or is nested too deeply", "no task was published"]),
    "outcome": ("STEP_RESULT_INVALID",
                ["Stage 's', Step 'a' returned [[[[[[", "non-empty outcome string"]),
}


@pytest.mark.parametrize("handed", sorted(HANDED))
def test_a_value_too_deep_to_encode_handed_to_the_host_names_the_step(
        tmp_path: Path, handed: str) -> None:
    code, facts = HANDED[handed]
    wf = intloom.Workflow("deep", version="1")
    st = wf.stage("s")
    if handed.startswith("agent"):
        @st.agent_step("a", routes={"ok": intloom.COMPLETE})
        def agent(ctx: Any) -> Any:
            return _holds_itself() if handed == "agent_holds_itself" else _deep(980)
    else:
        @st.step("a", routes={"ok": intloom.COMPLETE})
        async def a(ctx: Any) -> Any:
            if handed == "confirm":
                await ctx.confirm(_deep(980))
            if handed == "confirm_holds_itself":
                await ctx.confirm({"deep": _holds_itself()})
            if handed == "ask":
                # A Struct checks no field type: a str field may hold anything.
                await ctx.ask([intloom.Question(id="q", question="Q?",
                                                description=_holds_itself())])  # type: ignore[arg-type]
            return _deep()  # the "outcome" case: no Step gets past the others

    wf.validate()
    root = tmp_path / "runtime"
    view = _settled(root, wf)
    assert view.status == "failed" and view.last_error is not None, view
    assert view.last_error.code == code, view.last_error
    for fact in facts:
        assert fact in view.last_error.message, (fact, view.last_error.message)
    phases = [type(e.record).__name__ for e in read_history(root, view.run_id)]
    assert phases[-2:] == ["Executing", "Terminal"], phases


def _agent_returning(name: str, value: Any) -> intloom.Workflow:
    """A Workflow whose one Step, Stage 's' Step 'a', is an Agent Step handing ``value``."""
    wf = intloom.Workflow(name, version="1")
    st = wf.stage("s")

    @st.agent_step("a", routes={"ok": intloom.COMPLETE})
    def agent(ctx: Any) -> Any:
        return value

    wf.validate()
    return wf


# an Agent task the journal cannot hold -> what the refusal names
UNSENDABLE_TASKS: dict[str, tuple[Any, str]] = {
    "huge": ({"n": [1, HUGE]}, "$.n[1] is an integer beyond 64 bits"),
    "surrogate": ({"s": "a\udcffb"}, "$.s holds text that is not valid Unicode"),
    "object": ({"o": object()}, "$.o is object (TypeError)"),
}


@pytest.mark.parametrize("task", sorted(UNSENDABLE_TASKS))
def test_an_agent_task_the_journal_cannot_hold_is_refused_not_published_as_its_repr(
        tmp_path: Path, task: str) -> None:
    """The Agent works on the task itself: it was published as {"repr": "{'n': ...}"}, a task
    the Step never returned, while the same value given to ctx.confirm failed the Run."""
    value, fact = UNSENDABLE_TASKS[task]
    root = tmp_path / "runtime"
    view = _settled(root, _agent_returning("unsendable", value))
    assert view.pending_agent_call is None, view.pending_agent_call
    assert view.status == "failed" and view.last_error is not None, view
    assert view.last_error.code == "STEP_INTERACTION_INVALID", view.last_error
    message = view.last_error.message
    for part in ("Stage 's', Step 'a' returned an Agent task (dict) that cannot be encoded",
                 fact, "no task was published"):
        assert part in message, (part, message)
    # None is plain data inside a task, but a task of None alone is refused (a forgotten
    # return): the list of what to return said "None" as if it were a task like any other.
    assert message.endswith(
        "Return plain data: str (valid Unicode), integers within 64 bits, floats, booleans, "
        "lists and dicts with str keys, and None inside a list or dict (not as the whole "
        "task, which is refused as a forgotten return)."), message
    phases = [type(e.record).__name__ for e in read_history(root, view.run_id)]
    assert phases[-2:] == ["Executing", "Terminal"], phases


async def _task(ctx: Any) -> Any:
    return {"topic": ctx.intent}


# how an Agent Step hands the host no task -> the facts its refusal names
NO_TASK: dict[str, list[str]] = {
    "sync": ["returned None, not an Agent task", "Return the task for the Agent"],
    "async": ["returned None, not an Agent task", "Return the task for the Agent"],
    "unawaited": ["returned <coroutine object _task at 0x", "without awaiting it, so it never "
                  "ran", "`return await ...`"],
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", sorted(NO_TASK))
def test_an_agent_step_returning_no_task_is_refused_not_published(
        tmp_path: Path, how: str) -> None:
    """A forgotten ``return`` published a task of null, while a code Step returning None is
    refused; ``return _task(ctx)`` in an ``async def`` one was "$ is coroutine (TypeError)",
    with Python's "never awaited" warning sent nowhere."""
    wf = intloom.Workflow("taskless", version="1")
    st = wf.stage("s")
    if how == "sync":
        @st.agent_step("a", routes={"ok": intloom.COMPLETE})
        def forgot(ctx: Any) -> Any:
            task = {"topic": ctx.intent}  # noqa: F841 -- built, and no return
    elif how == "async":
        @st.agent_step("a", routes={"ok": intloom.COMPLETE})
        async def forgot_async(ctx: Any) -> Any:
            task = {"topic": ctx.intent}  # noqa: F841
    else:
        @st.agent_step("a", routes={"ok": intloom.COMPLETE})
        async def unawaited(ctx: Any) -> Any:
            return _task(ctx)

    wf.validate()
    root = tmp_path / "runtime"
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        view = _settled(root, wf)
        gc.collect()  # a coroutine left unawaited warns once it is collected
    assert not [w for w in said if "never awaited" in str(w.message)], said
    assert view.pending_agent_call is None, view.pending_agent_call
    assert view.status == "failed" and view.last_error is not None, view
    assert view.last_error.code == "STEP_INTERACTION_INVALID", view.last_error
    message = view.last_error.message
    assert message.startswith("Stage 's', Step 'a' returned "), message
    for fact in [*NO_TASK[how], "nothing was recorded and no task was published"]:
        assert fact in message, (fact, message)
    phases = [type(e.record).__name__ for e in read_history(root, view.run_id)]
    assert phases[-2:] == ["Executing", "Terminal"], phases


@pytest.mark.timeout(30)
@pytest.mark.parametrize("empty", ["", [], {}], ids=["str", "list", "dict"])
def test_an_agent_task_that_is_empty_is_still_a_task(tmp_path: Path, empty: Any) -> None:
    """Only None is refused: an empty string, list or dict is data the Agent can be given."""
    view = _settled(tmp_path / "runtime", _agent_returning("empty", empty))
    call = view.pending_agent_call
    assert view.status == "waiting" and call is not None, view
    assert call.request == empty, call


class _Found(msgspec.Struct):
    tags: set[str]


# a value JSON cannot carry as itself -> (where it is, what it is, the fix the refusal gives).
# Both went out converted, silently: a set as a list in no set order, bytes as base64 text,
# NaN as a float the client's JSON has no token for (null, or the non-JSON NaN).
NOT_JSON: dict[str, tuple[Any, str, str]] = {
    "set": ({"tags": {"b", "a"}}, "$.tags is a set", "a sorted list"),
    "set_in_struct": ([1, _Found(tags={"x"})], "$[1].tags is a set", "a sorted list"),
    "bytes": ({"blob": b"\x00hi"}, "$.blob is bytes", "decode it to str"),
    "bytearray": ({"a": [bytearray(b"x")]}, "$.a[0] is bytes", "decode it to str"),
    "nan": ({"score": float("nan")}, "$.score is nan", "None or a string"),
    "infinity": ((1.0, float("-inf")), "$[1] is -inf", "None or a string"),
    "int_key": ({"by_id": {7: "x"}}, "$.by_id has the key 7 (int)", "string keys"),
}


def _handing(value: Any, handed: str) -> intloom.Workflow:
    """A Workflow whose one Step hands ``value`` on: as its Agent task (``task``) or as the
    context of a confirmation (``confirm``)."""
    wf = intloom.Workflow("handing", version="1")
    st = wf.stage("s")
    if handed == "task":
        @st.agent_step("a", routes={"ok": intloom.COMPLETE})
        def agent(ctx: Any) -> Any:
            return value
    else:
        @st.step("a", routes={"ok": intloom.COMPLETE})
        async def confirm(ctx: Any) -> str:
            await ctx.confirm(value)
            return "ok"

    wf.validate()
    return wf


@pytest.mark.parametrize("case", sorted(NOT_JSON))
@pytest.mark.parametrize("handed", ["task", "confirm"])
def test_what_json_cannot_carry_in_a_task_or_a_confirmation_is_refused_at_the_call(
        tmp_path: Path, case: str, handed: str) -> None:
    value, fact, fix = NOT_JSON[case]
    root = tmp_path / "runtime"
    view = _settled(root, _handing(value, handed))
    assert view.pending_agent_call is None and view.pending_action is None, view
    assert view.status == "failed" and view.last_error is not None, view
    assert view.last_error.code == "STEP_INTERACTION_INVALID", view.last_error
    message = view.last_error.message
    said = ("Stage 's', Step 'a' returned an Agent task" if handed == "task"
            else "Stage 's', Step 'a': the context given to ctx.confirm")
    for part in (said, f"{fact}, which JSON cannot carry", fix, "nothing was recorded"):
        assert part in message, (part, message)
    phases = [type(e.record).__name__ for e in read_history(root, view.run_id)]
    assert phases[-2:] == ["Executing", "Terminal"], phases


def _holding_themselves() -> dict[str, Any]:
    twice: dict[str, Any] = {}
    twice["a"] = twice
    twice["b"] = twice
    pair: list[Any] = []
    pair.extend([pair, pair])
    left: list[Any] = []
    right: list[Any] = [left, left]
    left.extend([right, right])
    return {"dict_twice": twice, "list_twice": pair, "two_lists": left}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", sorted(_holding_themselves()))
@pytest.mark.parametrize("handed", ["task", "confirm"])
def test_a_task_or_context_holding_itself_more_than_once_is_refused_not_walked_for_ever(
        tmp_path: Path, case: str, handed: str) -> None:
    """The check for what JSON cannot carry walked every path through a value that holds
    itself twice (2**1000 of them, on the event loop: the host stopped answering), where the
    encoder names it at once as holding itself."""
    view = _settled(tmp_path / "runtime", _handing(_holding_themselves()[case], handed))
    assert view.status == "failed" and view.last_error is not None, view
    assert view.last_error.code == "STEP_INTERACTION_INVALID", view.last_error
    assert "holds itself" in view.last_error.message, view.last_error.message


def test_a_value_shared_by_two_places_is_checked_once_and_named_where_first_met(
        tmp_path: Path) -> None:
    """A sub-value two places share is the same value: a set in it is named at the first
    place it is met, and a shared value JSON can carry is sent."""
    shared = {"tags": {"x"}}
    wf = intloom.Workflow("shared", version="1")
    st = wf.stage("s")

    @st.agent_step("a", routes={"ok": intloom.COMPLETE})
    def agent(ctx: Any) -> Any:
        return {"first": [shared], "second": shared}

    wf.validate()
    view = _settled(tmp_path / "bad", wf)
    assert view.last_error is not None and "is a set" in view.last_error.message, view
    assert ("$.first[0].tags" in view.last_error.message
            or "$.second.tags" in view.last_error.message), view.last_error.message

    fine = {"n": [1, 2]}
    ok_wf = intloom.Workflow("shared_ok", version="1")
    ok_st = ok_wf.stage("s")

    @ok_st.agent_step("a", routes={"ok": intloom.COMPLETE})
    def ok_agent(ctx: Any) -> Any:
        return {"first": fine, "second": [fine, fine]}

    ok_wf.validate()
    waiting = _settled(tmp_path / "ok", ok_wf)
    assert waiting.pending_agent_call is not None, waiting
    assert waiting.pending_agent_call.request == {"first": fine, "second": [fine, fine]}


class _Level(enum.IntEnum):
    HIGH = 2


class Bag(msgspec.Struct):
    tags: set[str] = msgspec.field(default_factory=set)  # typed: saved and restored a set
    extra: dict[str, Any] = msgspec.field(default_factory=dict)
    note: Any = None


# what a Step stores in a part of its State typed Any -> (the path and fact named, the fix)
IN_ANY: dict[str, tuple[Callable[[Bag], None], str, str]] = {
    "set": (lambda bag: bag.extra.update(seen={"b", "a"}),
            "$.extra.seen is a set, in a part of the State typed Any", "set[str]"),
    "nested set": (lambda bag: setattr(bag, "note", [{"ok": 1}, {"ids": frozenset({1})}]),
                   "$.note[1].ids is a set", "sorted list"),
    "bytes": (lambda bag: bag.extra.update(blob=b"\x00"), "$.extra.blob is bytes", "bytes"),
    "nan": (lambda bag: setattr(bag, "note", float("nan")), "$.note is nan", "None"),
    "key": (lambda bag: bag.extra.update(by_id={7: "x"}), "$.extra.by_id has the key 7 (int)",
            "dict[int, str]"),
    # Saved as JSON writes them, these came back as text, a list or a dict.
    "decimal": (lambda bag: bag.extra.update(price=decimal.Decimal("1.50")),
                "$.extra.price is Decimal, in a part of the State typed Any", "amount: Decimal"),
    "datetime": (lambda bag: setattr(bag, "note", {"at": datetime(2024, 1, 2)}),
                 "$.note.at is datetime", "when: datetime"),
    "struct": (lambda bag: setattr(bag, "note", [Bag()]), "$.note[0] is Bag",
               "msgspec.to_builtins"),
    "enum": (lambda bag: bag.extra.update(level=_Level.HIGH), "$.extra.level is _Level",
             "Type the field"),
    "deep": (lambda bag: setattr(bag, "note", _deep(600)),
             "$.note is nested more than 500 levels deep", "at most 500 levels deep"),
    "tuple": (lambda bag: bag.extra.update(pair=(1, "a")),
              "$.extra.pair is a tuple, in a part of the State typed Any: it would be saved as "
              "a list", "tuple[int, str]"),
}


def _bag_run(tmp_path: Path, store: Callable[[Bag], None]) -> tuple[Any, list[Bag]]:
    """A Run whose Step a sets a typed set and plain JSON in its State, then ``store``s into
    it; Step b keeps the State it is given. The Run's last view, and what b saw."""
    wf = intloom.Workflow("bags", version="1")
    st = wf.stage("s", state=Bag)
    seen: list[Bag] = []

    @st.step("a", routes={"ok": "b"})
    def a(ctx: Any) -> str:
        ctx.state.tags.add("typed")
        ctx.state.extra["plain"] = ["json", 1]
        store(ctx.state)
        return "ok"

    @st.step("b", routes={"ok": intloom.COMPLETE})
    def b(ctx: Any) -> str:
        seen.append(ctx.state)
        return "ok"

    wf.validate()
    return _settled(tmp_path / "runtime", wf), seen


@pytest.mark.parametrize("stored", sorted(IN_ANY))
def test_what_json_cannot_carry_in_a_state_part_typed_any_is_refused_at_the_step(
        tmp_path: Path, stored: str) -> None:
    """Saved as JSON, a set there came back to the next Step as a list (in no set order),
    bytes as base64 text, NaN as None, an int key as a str: the State changed silently."""
    store, fact, fix = IN_ANY[stored]
    view, seen = _bag_run(tmp_path, store)
    assert view.status == "failed" and view.last_error is not None, view
    assert view.last_error.code == "STAGE_STATE_INVALID", view.last_error
    message = view.last_error.message
    for part in ("Stage 's', Step 'a': the Stage State it left cannot be saved as it is: ",
                 fact, fix, "This State was not saved."):
        assert part in message, (part, message)
    assert seen == []


def test_a_typed_set_and_plain_data_in_a_part_typed_any_reach_the_next_step(
        tmp_path: Path) -> None:
    view, seen = _bag_run(tmp_path, lambda bag: bag.extra["plain"].append({"k": None}))
    assert view.status == "completed", view
    assert seen == [Bag(tags={"typed"}, extra={"plain": ["json", 1, {"k": None}]})]


class Tree(msgspec.Struct):
    children: list[Tree] = msgspec.field(default_factory=list)
    weight: float = 0.0
    tags: set[str] = msgspec.field(default_factory=set)


class Loose(msgspec.Struct):
    children: list[Loose] = msgspec.field(default_factory=list)
    counts: dict[str, int] = msgspec.field(default_factory=dict)
    extra: dict[Any, Any] | None = None


def test_only_state_types_typed_any_somewhere_are_walked_and_only_along_those_parts() -> None:
    """A State type with no part typed Any pays no check (typed sets round-trip as sets);
    one that refers to itself is walked down to its parts typed Any, however deep."""
    from intloom.authoring.savecheck import any_gap as _any_gap
    from intloom.authoring.savecheck import state_codec as _state_codec

    for typed in (Tree, Score):
        assert isinstance(_state_codec(typed)[2], bool), typed
    assert not isinstance(_state_codec(Notes)[2], bool)  # items: Any
    parts = _state_codec(Loose)[2]
    assert not isinstance(parts, bool)
    deep = Loose(children=[Loose(), Loose(children=[Loose(extra={"ok": [1]})])])
    assert _any_gap(deep, parts) is None
    deep.children[1].children[0].extra = {"ids": [{"x": {3}}]}
    gap = _any_gap(deep, parts)
    at = "$.children[1].children[0].extra"
    assert gap is not None and gap[0].startswith(f"{at}.ids[0].x is a set"), gap
    deep.children[1].children[0].extra = {3: "x"}
    gap = _any_gap(deep, parts)
    assert gap is not None and gap[0].startswith(f"{at} has the key 3 (int)"), gap


def test_a_question_with_a_number_for_its_id_fails_the_step_instead_of_waiting_for_ever(
        tmp_path: Path) -> None:
    """``Question(id=i)`` was asked as it was (a Struct checks no field type when built): an
    answer names its question by text, so even the answer command the CLI printed was
    refused ("Question id '0' is not asked here; answer only 0, 1") and the Run waited for
    ever."""
    wf = intloom.Workflow("numbered", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": intloom.COMPLETE})
    async def a(ctx: Any) -> str:
        await ctx.ask([intloom.Question(id=i, question=f"Item {i}?") for i in range(2)])  # type: ignore[arg-type]
        return "ok"

    wf.validate()
    view = _settled(tmp_path / "runtime", wf)
    assert view.status == "failed" and view.pending_action is None
    assert view.last_error is not None and view.last_error.code == "STEP_INTERACTION_INVALID"
    assert ("Stage 's', Step 'a': question 0 given to ctx.ask has a field of the wrong type "
            "(Expected `str`, got `int` - at `question 0.id`); nothing was asked. Give each "
            "field of intloom.Question its declared type") in view.last_error.message


@pytest.mark.parametrize(("options", "at"), [
    (["yes", "no"], "Expected `object`, got `str` - at `question 0.options[0]`"),
    ("ab", "Expected `array | null`, got `str` - at `question 0.options`"),
    ([intloom.Option(id=["a"], label="A")],  # type: ignore[arg-type]
     "Expected `str`, got `array` - at `question 0.options[0].id`"),
    ([intloom.Option(id="a", label=object())],  # type: ignore[arg-type]
     "Encoding objects of type object is unsupported"),
])
def test_options_of_the_wrong_type_are_named_not_a_python_error(
        tmp_path: Path, options: Any, at: str) -> None:
    """``options=["yes", "no"]`` (strings, not intloom.Option) and an unhashable id reached
    the repeated-ids check before the field types were: the Step failed with
    STEP_EXECUTION_FAILED "raised AttributeError: 'str' object has no attribute 'id'"
    (or TypeError: unhashable type), naming neither the field nor the fix."""
    wf = intloom.Workflow("opts", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": intloom.COMPLETE})
    async def a(ctx: Any) -> str:
        await ctx.ask([intloom.Question(id="q", question="Pick?", options=options)])
        return "ok"

    wf.validate()
    view = _settled(tmp_path / "runtime", wf)
    assert view.status == "failed" and view.pending_action is None
    assert view.last_error is not None and view.last_error.code == "STEP_INTERACTION_INVALID", \
        view.last_error
    assert f"question 0 given to ctx.ask has a field of the wrong type ({at})" in \
        view.last_error.message, view.last_error.message


@pytest.mark.parametrize(("question", "said"), [
    (intloom.Question(id="r", question="Resolution?", options=[
        intloom.Option(id="fix", label="fix it"), intloom.Option(id=" ", label="none")]),
     "question 0 given to ctx.ask ('r') has an option with the blank id ' ' (label 'none'), "
     "which a person could pick but never send"),
    (intloom.Question(id="", question="Resolution?"),
     "question 0 given to ctx.ask has the blank id ''; nothing was asked."),
    (intloom.Question(id="r", question="  "),
     "question 0 given to ctx.ask ('r') has the blank text '  '; nothing was asked."),
])
def test_a_blank_question_or_option_id_fails_the_step_instead_of_waiting_unanswerable(
        tmp_path: Path, question: intloom.Question, said: str) -> None:
    """``Option(id="")`` was asked as it was: picking it in ``intloom attach`` sends its id,
    the blank answer was refused ("needs a non-blank answer"), so the option could never be
    chosen; a blank question showed a person nothing and was named by "" in every answer."""
    wf = intloom.Workflow("blank", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": intloom.COMPLETE})
    async def a(ctx: Any) -> str:
        await ctx.ask([question])
        return "ok"

    wf.validate()
    view = _settled(tmp_path / "runtime", wf)
    assert view.status == "failed" and view.pending_action is None, view
    assert view.last_error is not None and view.last_error.code == "STEP_INTERACTION_INVALID", \
        view.last_error
    assert f"Stage 's', Step 'a': {said}" in view.last_error.message, view.last_error.message


class _Blob(msgspec.Struct):
    text: str = ""


def test_a_state_too_large_for_a_journal_record_fails_the_run_and_the_journal_reads_back(
    tmp_path: Path,
) -> None:
    """A journal frame holds at most 64 MiB (docs/format.md), and a reader takes a longer one
    for damage. A Step that left a State beyond it had its step_result written all the same:
    the Run went on to wait, and after a crash it came back corrupt (needs attention). The
    record is refused instead, before anything is written: the Run fails naming the size and
    the limit, and its journal verifies."""
    root = tmp_path / "runtime"
    wf = intloom.Workflow("big", version="1")
    st = wf.stage("s", state=_Blob)

    @st.step("grow", routes={"ok": "wait"})
    def grow(ctx: Any) -> str:
        ctx.state = _Blob("x" * (64 << 20))
        return "ok"

    @st.step("wait", routes={"yes": intloom.COMPLETE, "no": intloom.COMPLETE})
    async def wait(ctx: Any) -> str:
        answer = await ctx.confirm({"n": 1})
        return "yes" if answer.confirmed else "no"

    view = _settled(root, wf)
    assert view.status == "failed" and view.last_error is not None
    assert view.last_error.code == "RUN_STATE_INVALID"
    message = view.last_error.message
    # It named the record's class ("its StepResult record is ...") and no Step.
    assert message.startswith("Stage 's', Step 'grow' left a State of 67,108,8"), message
    assert "its result (the outcome with the State it left) is " in message, message
    assert "beyond the journal's 67,108,864 bytes per record" in message, message
    assert "nothing was recorded" in message and "file" in message, message
    assert "StepResult" not in message, message
    [journal] = [j for j in verify(root) if j.run_id == view.run_id]
    assert journal.status == "ok" and journal.state is not None, journal
    assert journal.state.status == "failed"


def test_an_initialisers_state_too_large_for_a_journal_record_names_the_initialiser(
    tmp_path: Path,
) -> None:
    """Named "its StepReady record", a class no initialiser's author has met."""
    root = tmp_path / "runtime"
    wf = intloom.Workflow("big", version="1")
    st = wf.stage("s", state=_Blob)

    @st.init
    def start(ctx: Any) -> _Blob:
        return _Blob("x" * (64 << 20))

    @st.step("a", routes={"ok": intloom.COMPLETE})
    def a(ctx: Any) -> str:
        return "ok"

    view = _settled(root, wf)
    assert view.status == "failed" and view.last_error is not None
    assert view.last_error.code == "RUN_STATE_INVALID"
    message = view.last_error.message
    assert message.startswith("Stage 's' initialiser left a State of 67,108,8"), message
    assert "the State it returned is " in message, message
    assert "StepReady" not in message, message


def _nested_list(depth: int) -> Any:
    value: Any = None
    for _ in range(depth):
        value = [value]
    return value


def test_an_agent_output_nested_near_the_encoders_limit_is_refused_before_anything_is_recorded(
    tmp_path: Path,
) -> None:
    """The output was checked alone (plain JSON within 1,000 levels, and encodable), then
    recorded inside an Executing and a StepResult a few stack frames deeper: a depth between
    the two passed the checks, the Executing was appended, and the StepResult raised
    RecursionError. The Run then waited on a task that every request called "not the current
    task" -- naming that same task -- and a restart reported it interrupted. Every depth is
    now either refused with nothing recorded, the task still claimed, or completes."""
    root = tmp_path / "runtime"
    wf = intloom.Workflow("deep", version="1")
    st = wf.stage("s")

    @st.agent_step("research", routes={"done": intloom.COMPLETE})
    def research(ctx: Any) -> Any:
        return {"task": ctx.intent}

    async def main() -> tuple[str, int]:
        store = open_store(root)
        rt = _runtime(store, wf)
        view = await rt.wait_stable((await rt.create_run("deep", "find x")).run_id)
        call = view.pending_agent_call
        assert call is not None
        token, _ = await rt.claim_agent_call(view.run_id, call.id, "c1")
        for depth in range(1000, 0, -1):
            try:
                done = await rt.complete_agent_call(view.run_id, call.id, token, "done",
                                                    _nested_list(depth))
            except IntloomError as exc:
                assert exc.code == "INVALID_REQUEST", (depth, exc)
                still = rt.get(view.run_id)
                assert still.phase == "waiting" and still.pending_agent_call is not None
                assert still.pending_agent_call.phase == "claimed", depth
                continue
            assert done.status == "completed", (depth, done)
            break
        await store.close()
        return view.run_id, depth

    run_id, depth = asyncio.run(asyncio.wait_for(main(), timeout=20))
    assert depth >= 256  # far deeper than any JSON an Agent means to send
    phases = [type(e.record).__name__ for e in read_history(root, run_id)]
    # One completion recorded, after the claim: none of the refused ones left a trace.
    assert phases[phases.index("Waiting"):] == ["Waiting", "Waiting", "Executing", "StepResult",
                                                "Terminal"], phases


def test_an_on_complete_state_too_large_for_a_record_is_refused_and_the_task_stays_claimed(
    tmp_path: Path,
) -> None:
    """The completion's StepResult (the State on_complete left, with the Agent's output) was
    first measured by the journal, after its Executing was appended: refused there, the Run
    waited on a task no request could complete any more. It is refused before, as any other
    refusal of on_complete: nothing recorded, the task still claimed."""
    root = tmp_path / "runtime"
    wf = intloom.Workflow("agentbig", version="1")
    st = wf.stage("s", state=_Blob)

    @st.agent_step("research", routes={"big": intloom.COMPLETE, "small": intloom.COMPLETE})
    def research(ctx: Any) -> Any:
        return {"task": ctx.intent}

    @research.on_complete
    def absorb(ctx: Any, result: Any) -> None:
        ctx.state = _Blob("x" * (64 << 20) if result.outcome == "big" else "ok")

    async def main() -> str:
        store = open_store(root)
        rt = _runtime(store, wf)
        view = await rt.wait_stable((await rt.create_run("agentbig", "find x")).run_id)
        call = view.pending_agent_call
        assert call is not None
        token, _ = await rt.claim_agent_call(view.run_id, call.id, "c1")
        with pytest.raises(IntloomError) as refused:
            await rt.complete_agent_call(view.run_id, call.id, token, "big", None)
        assert refused.value.code == "STAGE_STATE_INVALID", refused.value
        message = refused.value.message
        assert "on_complete" in message and "67,108,864" in message, message
        assert "the task stays claimed" in message, message
        done = await rt.complete_agent_call(view.run_id, call.id, token, "small", None)
        assert done.status == "completed"
        await store.close()
        return view.run_id

    _, journal = _verified_after(root, main)
    assert journal.state is not None and journal.state.status == "completed"


@pytest.mark.parametrize("handed", ["effect", "confirm", "agent"])
def test_a_value_deeper_than_a_restart_can_read_is_never_recorded_as_it_is(
    tmp_path: Path, handed: str
) -> None:
    """600 levels encode from a Step (a worker thread's shallow stack) but may not decode at
    a restart, deep inside the start (a journal with such a record failed the whole start).
    Past 500 levels an effect's result is kept as its repr, and a confirmation's context or
    an Agent task is refused before anything is recorded."""
    wf = intloom.Workflow("deep6", version="1")
    st = wf.stage("s")
    if handed == "agent":
        @st.agent_step("a", routes={"ok": intloom.COMPLETE})
        def agent(ctx: Any) -> Any:
            return _nested_list(600)
    elif handed == "confirm":
        @st.step("a", routes={"ok": intloom.COMPLETE})
        async def a(ctx: Any) -> str:
            await ctx.confirm({"deep": _nested_list(600)})
            return "ok"
    else:
        @st.step("a", routes={"ok": intloom.COMPLETE})
        def effect(ctx: Any) -> str:
            assert ctx.effect("deep", _nested_list, 600) == _nested_list(600)  # the real value
            return "ok"

    root = tmp_path / "runtime"
    view = _settled(root, wf)
    if handed == "effect":
        assert view.status == "completed", view
        [result] = [e.record.result for e in read_history(root, view.run_id)
                    if isinstance(e.record, EffectDone)]
        assert set(result) == {"repr"}, result
        return
    assert view.status == "failed" and view.last_error is not None, view
    assert view.last_error.code == "STEP_INTERACTION_INVALID", view.last_error
    assert "more than 500 levels" in view.last_error.message, view.last_error.message


def _verified_after(root: Path, main: Callable[[], Awaitable[str]]) -> tuple[str, Any]:
    """Run ``main`` (it returns a Run id), then that Run's journal as verify reads it: ok."""
    run_id = asyncio.run(asyncio.wait_for(main(), timeout=20))
    [journal] = [j for j in verify(root) if j.run_id == run_id]
    assert journal.status == "ok", journal.problem
    return run_id, journal


@pytest.mark.parametrize("step_kind", ["sync-catches", "async"])
def test_an_effect_result_too_large_for_the_journal_fails_the_run_saying_the_effect_ran(
    tmp_path: Path, step_kind: str,
) -> None:
    """An effect whose result passes a journal record's 64 MiB has run, but its end cannot be
    recorded. The Run failed with "its EffectDone record ... nothing was recorded" (as if the
    effect had not run), and a Step that caught the error and went on was failed as the
    host's CLI_INTERNAL_ERROR (IllegalTransition), or its next effect was refused as nested
    in one "still running". The Run now fails saying the effect ran, whatever the Step does."""
    root = tmp_path / "runtime"
    wf = intloom.Workflow("big", version="1")
    st = wf.stage("s")
    ran: list[str] = []
    refused: list[IntloomError] = []

    def fetch() -> str:
        ran.append("fetch")
        return "x" * (64 << 20)

    if step_kind == "async":
        @st.step("a", routes={"ok": intloom.COMPLETE})
        async def a(ctx: Any) -> str:
            await ctx.aeffect("fetch", fetch, key="order-9")
            return "ok"
    else:
        @st.step("a", routes={"ok": intloom.COMPLETE})
        def b(ctx: Any) -> str:
            with pytest.raises(IntloomError):
                ctx.effect("fetch", fetch, key="order-9")
            with pytest.raises(IntloomError) as after:  # the Run has ended: nothing more
                ctx.effect("after", ran.append, "after")
            refused.append(after.value)
            return "ok"

    view = _settled(root, wf)
    assert ran == ["fetch"]
    if step_kind != "async":  # told that the Run ended, not that 'fetch' was still running
        # Which words depends on a race the thread runs against the loop: before the loop
        # lets go of the Step, its effect finds the Run ended; after, its ctx over (the
        # words of a cancel's, tests/unit/test_executor.py). Either refuses, calling nothing.
        [told] = refused
        assert (told.code, "has ended" in told.message) == (
            "EXECUTION_OWNERSHIP_LOST", True) or (
            told.code, "which was over" in told.message) == (
            "STEP_INTERACTION_INVALID", True), told
        assert "still running" not in told.message and ran == ["fetch"], told
    assert view.status == "failed" and view.last_error is not None, view
    assert view.last_error.code == "RUN_STATE_INVALID", view.last_error
    message = view.last_error.message
    for fact in ("Stage 's', Step 'a': effect 'fetch' (key 'order-9') ran and returned",
                 "67,108,864", "its end was not recorded", "The effect did run",
                 "check its target", "return its path or id"):
        assert fact in message, message
    assert "nothing was recorded" not in message, message
    phases = [type(e.record).__name__ for e in read_history(root, view.run_id)]
    assert phases[-2:] == ["EffectStarted", "Terminal"], phases
    [journal] = [j for j in verify(root) if j.run_id == view.run_id]
    assert journal.status == "ok", journal
