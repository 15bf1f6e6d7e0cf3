"""The objects every Step reads are ones CPython 3.11 specialises its reads and calls on.

Past 30 attributes an instance of an ordinary class keeps them in a dict of its own: its
attribute reads then go through a hint into that dict, and a call of one of its methods
(``LOAD_METHOD``) is never specialised, so each takes the generic lookup (the MRO, the
instance dict, the descriptor). A Run's slot and the store are read and called several times
per Step.
"""

from __future__ import annotations

import asyncio
import dis
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

import intloom
from intloom.authoring.loader import LoadedWorkflow
from intloom.executor.driver import RunSlot
from intloom.executor.runtime import Runtime
from tests.unit.memjournal import MemoryJournal
from tests.unit.test_store_support import open_store, walk

pytestmark = pytest.mark.skipif(sys.version_info[:2] != (3, 11),
                                reason="CPython 3.11's specialised instructions")


def _ops(thing: object, source: str, prefixes: tuple[str, ...]) -> list[str]:
    """The specialised forms of ``source``'s reads of ``o`` after it ran on ``thing``."""
    scope: dict[str, Any] = {}
    exec(f"def use(o):\n    {source}", scope)  # a code object of its own, cold
    for _ in range(200):
        scope["use"](thing)
    return [i.opname for i in dis.get_instructions(scope["use"], adaptive=True)
            if i.opname.startswith(prefixes)]


def _run_hot(wf: intloom.Workflow, watch: Callable[[Any], object] | None = None,
             watcher: Any = None, *, warm: bool = False) -> RunSlot:
    """Run one Run of ``wf`` to its end in a Runtime with an in-memory journal, after a
    first one to warm the code with ``warm``; ``watch(watcher)`` (``sys.settrace``,
    ``sys.setprofile``) is set around that Run alone. Returns its slot."""
    wf.validate()
    flows = {wf.name: LoadedWorkflow(wf, "test.py", "id-hot", wf.schemas())}

    async def main() -> RunSlot:
        rt = Runtime(flows, MemoryJournal(), package_version="0.1.0")
        rt.restore([])
        if warm:
            first = await rt.wait_stable((await rt.create_run(wf.name, "go")).run_id)
            assert first.status == "completed"
        run_id = (await rt.create_run(wf.name, "go")).run_id
        if watch is not None:
            watch(watcher)
        try:
            view = await rt.wait_stable(run_id)
        finally:
            if watch is not None:
                watch(None)
        assert view.status == "completed"
        return rt.runs[run_id]

    return asyncio.run(asyncio.wait_for(main(), timeout=20))


def _looping(steps: int = 40) -> tuple[intloom.Workflow, list[None]]:
    """A Workflow whose one Step routes to itself, ``steps`` times a Run (then again, for a
    second Run), and the list each of its Steps appends to."""
    ran: list[None] = []
    wf = intloom.Workflow("hot", version="1")

    @wf.stage("s").step("a", routes={"again": "a", "done": intloom.COMPLETE})
    async def a(ctx: Any) -> str:
        ran.append(None)
        return "done" if len(ran) % steps == 0 else "again"

    return wf, ran


class Count(msgspec.Struct):
    n: int = 0


def _counting(steps: int = 40) -> intloom.Workflow:
    """As ``_looping``, its Stage with a State that counts the Steps."""
    wf = intloom.Workflow("hot", version="1")

    @wf.stage("s", state=Count).step("a", routes={"again": "a", "done": intloom.COMPLETE})
    async def a(ctx: Any) -> str:
        ctx.state = Count(n=ctx.state.n + 1)
        return "done" if ctx.state.n >= steps else "again"

    return wf


def _calls(wf: intloom.Workflow, watched: Callable[[Any], bool],
           named: Callable[[Any], str] = lambda frame: frame.f_code.co_name, *,
           warm: bool = False) -> tuple[RunSlot, list[str]]:
    """Run ``wf`` (``_run_hot``) and name each Python call whose code ``watched`` picks."""
    seen: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and watched(frame.f_code):
            seen.append(named(frame))

    return _run_hot(wf, sys.setprofile, profile, warm=warm), seen


def _bytecodes(wf: intloom.Workflow, codes: tuple[Any, ...]) -> tuple[RunSlot, int, int]:
    """Run ``wf`` warm and count the bytecodes run in ``codes`` and the calls of the first."""
    counted: list[int] = []
    calls: list[int] = []

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code not in codes:
            return None
        if event == "call" and frame.f_code is codes[0]:
            calls.append(1)
        frame.f_trace_opcodes = True
        if event == "opcode":
            counted.append(frame.f_lasti)
        return trace

    slot = _run_hot(wf, sys.settrace, trace, warm=True)
    return slot, len(counted), len(calls)


def test_a_runs_slot_has_its_methods_called_and_attributes_read_specialised() -> None:
    wf = intloom.Workflow("hot", version="1")

    @wf.stage("s").step("a", routes={"ok": intloom.COMPLETE})
    async def a(ctx: Any) -> str:
        return "ok"

    slot = _run_hot(wf)
    # Before: LOAD_METHOD_ADAPTIVE (it never specialises) and LOAD_ATTR_WITH_HINT.
    assert _ops(slot, "return o.mark()", ("LOAD_METHOD",)) == ["LOAD_METHOD_NO_DICT"]
    assert _ops(slot, "return o.state", ("LOAD_ATTR",)) == ["LOAD_ATTR_SLOT"]


def test_the_store_has_its_methods_called_and_attributes_read_specialised(
        tmp_path: Path) -> None:
    store = open_store(tmp_path / "runtime")
    try:
        # The executor's ``journal.append`` (three per Step) and the store's reads of its own
        # attributes. Before: LOAD_METHOD_ADAPTIVE and LOAD_ATTR_WITH_HINT.
        assert _ops(store, "return o.snapshots_due()",
                    ("LOAD_METHOD",)) == ["LOAD_METHOD_NO_DICT"]
        assert _ops(store, "return o._pending_frames", ("LOAD_ATTR",)) == ["LOAD_ATTR_SLOT"]
    finally:
        store.close_blocking()


def test_a_runs_track_has_its_attributes_set_specialised(tmp_path: Path) -> None:
    # A flush sets three of them for each Run in it (``Store._track``). Before: a
    # msgspec.Struct, whose own __setattr__ kept every store at STORE_ATTR_ADAPTIVE.
    store = open_store(tmp_path / "runtime")
    try:
        store.append("RUN-A", walk("RUN-A", 1, 0)[0])
        store.sync_blocking()
        track = store._tracks["RUN-A"]
        assert _ops(track, "o.dirty = True", ("STORE_ATTR",)) == ["STORE_ATTR_SLOT"]
    finally:
        store.close_blocking()


def test_a_records_facts_are_looked_up_by_a_method_call_not_an_attribute_read() -> None:
    # ``name.method()`` on an imported name compiles to LOAD_ATTR (never specialised for a
    # dict's method, a new bound method per call); three records per Step are kept.
    gets = [i.opname for i in dis.get_instructions(RunSlot.apply) if i.argval == "get"]
    assert gets == ["LOAD_METHOD"], gets


def _reads(fn: Any, cold: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """The forms ``fn``'s attribute reads and method loads have taken (it ran warm), but
    for those of the names in ``cold`` (an error path's, never run)."""
    return [(i.argval, i.opname) for i in dis.get_instructions(fn, adaptive=True)
            if i.opname.startswith(("LOAD_ATTR", "LOAD_METHOD")) and i.argval not in cold]


def test_a_records_fold_is_found_without_an_attribute_read_of_a_named_tuple() -> None:
    # Three records per Step are folded. A NamedTuple's fields are read through a
    # descriptor CPython 3.11 never specialises (LOAD_ATTR_ADAPTIVE, the generic lookup).
    from intloom.runtime.machine import apply
    from intloom.runtime.records import Executing, Header, StagePending, StepReady, StepResult

    state = apply(None, Header(at="t", run_id="r", workflow="w", workflow_version="1",
                               identity="i", schemas={}, intent="go"))
    state = apply(state, StagePending(at="t", stage="s"))
    state = apply(state, StepReady(at="t", stage="s", step="a"))
    for _ in range(200):
        state = apply(state, Executing(at="t", stage="s", step="a"))
        state = apply(state, StepResult(at="t", stage="s", step="a", outcome="ok"))
        state = apply(state, StepReady(at="t", stage="s", step="a"))
    # Before: ("phase", "LOAD_ATTR_ADAPTIVE") and ("apply", "LOAD_METHOD_ADAPTIVE"); then
    # ("phase", "LOAD_ATTR_SLOT") and ("seq", "LOAD_ATTR_SLOT"), before each fold checked
    # the phase itself.
    assert _reads(apply, cold=("__name__",)) == []


def test_a_steps_records_are_folded_without_the_machines_apply_frame() -> None:
    # Three records per Step: the executor calls each one's fold (which checks what apply
    # checks), not apply. Before: three apply frames per Step.
    from intloom.runtime import machine

    wf, ran = _looping()
    _, seen = _calls(wf, lambda code: code is machine.apply.__code__,
                     lambda frame: type(frame.f_locals["record"]).__name__)
    assert len(ran) == 40
    # The header, the Stage's start and the end go through apply (~3 for the Run).
    assert len(seen) <= 5, seen


def test_a_steps_folds_call_no_other_function_of_the_machine() -> None:
    # Per Step, the machine runs its three folds and nothing else. Before: two _cursor frames
    # too (executing's and step_result's).
    from intloom.runtime import machine

    wf, ran = _looping()
    _, seen = _calls(wf, lambda code: code.co_filename == machine.__file__)
    assert len(ran) == 40
    # The header, the Stage's start and the end: a few more for the Run.
    assert len(seen) <= 3 * 40 + 8, sorted(set(seen))


def test_a_step_reads_its_state_without_a_python_frame() -> None:
    # A Step reads ctx.state at least once; a property's Python getter is a frame of its own.
    from intloom.authoring.context import StepContext

    ctx: StepContext[Any] = StepContext(run_id="r", intent="go", stage="s", step="a",
                                        state=7, state_type=None, hooks=None)  # type: ignore[arg-type]
    calls: list[str] = []

    def seen(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls.append(frame.f_code.co_name)

    sys.setprofile(seen)
    try:
        value = ctx.state
    finally:
        sys.setprofile(None)
    assert value == 7
    assert calls == [], calls  # before: ["state"]


def test_a_step_routed_to_the_next_one_makes_no_isinstance_test_and_no_async_check_call() -> None:
    # Per Step: isinstance against a class not the value's own looks up and calls the
    # class's __instancecheck__; the Step's function was asked about through a frame.
    wf = intloom.Workflow("hot", version="1")
    stage = wf.stage("s")

    @stage.step("a", routes={"again": "b"})
    async def a(ctx: Any) -> str:
        return "again"

    @stage.step("b", routes={"done": intloom.COMPLETE})
    async def b(ctx: Any) -> str:
        return "done"

    seen: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        name = frame.f_code.co_name
        if (event == "c_call" and name == "_route" and getattr(arg, "__name__", "") ==
                "isinstance") or (event == "call" and name == "_is_async"):
            seen.append(name)

    _run_hot(wf, sys.setprofile, profile, warm=True)
    # Before: ["_is_async", "_route", "_route", "_is_async", "_route"]: a's route to b made
    # two isinstance tests; b's to the end, not the common case, still makes one.
    assert seen.count("_is_async") == 0, seen
    assert seen.count("_route") == 1, seen


def test_a_step_routed_to_the_next_one_records_and_routes_without_two_frames() -> None:
    # The common case, once per Step. Before: a _record_outcome and a _route frame per Step.
    from intloom.executor.driver import Driver

    wf, ran = _looping()
    codes = {Driver._record_outcome.__code__, Driver._route.__code__}
    _, seen = _calls(wf, codes.__contains__)
    assert len(ran) == 40
    # The last Step's outcome, to the end, takes the general path.
    assert sorted(seen) == ["_record_outcome", "_route"], seen


def test_a_steps_context_is_finished_and_its_history_entry_kept_without_frames() -> None:
    # Once per Step each. Before: a frame of context.finish and one of history.kept per Step.
    from intloom.authoring import context
    from intloom.executor import history

    wf, ran = _looping()
    codes = {context.finish.__code__, history.kept.__code__}
    _, seen = _calls(wf, codes.__contains__)
    assert len(ran) == 40
    assert len(seen) <= 4, seen


def test_a_steps_context_is_built_without_the_ctx_frame() -> None:
    # Once per Step, in a Stage with a State: the Run's hooks are the loop's and the State is
    # the one the last Step left, kept decoded. Before: a Driver._ctx frame per Step.
    from intloom.executor.driver import Driver

    wf = _counting()
    slot, seen = _calls(wf, lambda code: code is Driver._ctx.__code__)
    assert msgspec.json.decode(slot.state.stage_state or b"") == {"n": 40}
    assert len(seen) <= 2, seen  # the Run's first Step
    # And by a call CPython 3.11 specialises, as _ctx's (the next test): run again, unwatched
    # (a profile function keeps the code from specialising).
    _run_hot(wf)
    assert _init_call(Driver._run_step) == "CALL_PY_EXACT_ARGS"


def test_a_steps_state_is_saved_by_encode_state_alone() -> None:
    # Once per Step, for a State that re-encodes as is. Before: a frame of _builds too (whether
    # its type's decode runs code of its own, asked per save).
    from intloom.authoring import savecheck

    slot, seen = _calls(_counting(), lambda code: code.co_filename == savecheck.__file__,
                        warm=True)
    assert msgspec.json.decode(slot.state.stage_state or b"") == {"n": 40}
    assert seen.count("encode_state") >= 40, seen
    assert len(seen) - seen.count("encode_state") <= 2, sorted(set(seen))


def test_a_steps_publish_nobody_follows_takes_few_bytecodes() -> None:
    # One publish per Step (its flush); a busy Run nobody follows, neither failed nor
    # suspended, has no lock, event, view or follower to handle. Before: the general path
    # and _advance's frame, ~146 bytecodes per Step; now ~95.
    wf, _ = _looping()
    slot, counted, published = _bytecodes(
        wf, (RunSlot.publish.__code__, RunSlot._advance.__code__))
    assert slot.shown is slot.state  # everything shown, as before
    assert slot._events == []
    assert published >= 40, published
    assert counted / published <= 110, (counted, published)


def test_an_async_steps_appends_take_few_bytecodes() -> None:
    # Three records per Step: a routed Step's step_result, the next Step's step_ready and
    # its executing, appended in one call (Runtime.append_routed) with one fold. Before: one
    # append_boundary each, 34 bytecodes apiece (46 with the locked path's tests, locals and
    # finally, before that); now 54 for the three.
    wf, _ = _looping()
    _, counted, calls = _bytecodes(wf, (Runtime.append_routed.__code__,))
    assert calls >= 39, calls  # each Step's route but the last (the Run's end)
    assert counted / calls <= 60, (counted, calls)


def test_a_steps_kind_and_its_contexts_calls_are_read_specialised() -> None:
    # The driver reads ``step.kind`` and ``ctx._calls`` once per Step. Before: class
    # attributes, read through the instance by LOAD_ATTR_ADAPTIVE (3.11 never specialises
    # that) each time.
    from intloom.authoring.context import StepContext

    wf = intloom.Workflow("hot", version="1")

    @wf.stage("s").step("a", routes={"ok": intloom.COMPLETE})
    async def a(ctx: Any) -> str:
        return "ok"

    step = wf.stages["s"].steps["a"]
    assert _ops(step, "return o.kind", ("LOAD_ATTR",)) == ["LOAD_ATTR_INSTANCE_VALUE"]
    ctx: StepContext[Any] = StepContext(run_id="r", intent="go", stage="s", step="a",
                                        state=None, state_type=None,
                                        hooks=None)  # type: ignore[arg-type]
    assert _ops(ctx, "return o._calls", ("LOAD_ATTR",)) == ["LOAD_ATTR_INSTANCE_VALUE"]


def test_a_steps_context_is_built_by_a_specialised_call() -> None:
    # Driver._ctx calls StepContext.__init__ once per Step. Before: with seven keywords, a
    # call CPython 3.11 never specialises (CALL_ADAPTIVE, the generic path, every time).
    from intloom.executor.driver import Driver

    wf, ran = _looping(300)
    _run_hot(wf)
    assert len(ran) == 300
    assert _init_call(Driver._ctx) == "CALL_PY_EXACT_ARGS"


def _init_call(fn: Any) -> str:
    """The call of ``__init__`` itself in ``fn``, as specialised: the first call after its
    method is loaded (another call of ``fn`` may specialise so too, depending on what ran
    before)."""
    ops = [(i.opname, i.argval) for i in dis.get_instructions(fn, adaptive=True)]
    loaded = next(n for n, (op, arg) in enumerate(ops)
                  if op.startswith("LOAD_METHOD") and arg == "__init__")
    return next(op for op, _ in ops[loaded:] if op.startswith("CALL"))


def test_an_async_steps_flush_is_marked_and_shown_without_two_frames() -> None:
    # Each async Step's ``executing`` flush: before, RunSlot.mark and Runtime.show_durable
    # were a frame each per Step; now only a Run's first and last flushes (through
    # Runtime.sync) make them.
    wf, ran = _looping()
    codes = {RunSlot.mark.__code__, Runtime.show_durable.__code__}
    slot, seen = _calls(wf, codes.__contains__)
    assert slot.shown.phase == "terminal"
    assert slot.state is slot.shown  # retired: ended, everything shown
    assert len(ran) == 40
    assert seen.count("mark") <= 4 and seen.count("show_durable") <= 4, seen


def test_a_crews_sync_step_records_routes_and_flushes_without_five_frames() -> None:
    # A sync Step driven by a crew (Driver._steps_here, on a worker thread). Before, per
    # Step: a frame each of _record_outcome, _route, context.finish, _is_async and
    # RunSlot._overridden, and contextlib.suppress's three around the crew's flush.
    import contextlib
    import threading

    from intloom.authoring import context
    from intloom.executor import driver
    from intloom.executor.driver import Driver

    ran: list[None] = []
    wf = intloom.Workflow("hot", version="1")

    @wf.stage("s").step("a", routes={"again": "a", "done": intloom.COMPLETE})
    def a(ctx: Any) -> str:
        ran.append(None)
        return "done" if len(ran) == 40 else "again"

    codes = {Driver._record_outcome.__code__, Driver._route.__code__,
             context.finish.__code__, driver._is_async.__code__,
             RunSlot._overridden.__code__, contextlib.suppress.__enter__.__code__}
    seen: list[str] = []
    on_thread: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            if frame.f_code is Driver._steps_here.__code__:
                on_thread.append(threading.current_thread().name)
            if frame.f_code in codes:
                seen.append(frame.f_code.co_qualname)

    def watch(fn: Any) -> None:  # the crew's thread starts after this: it is watched too
        sys.setprofile(fn)
        threading.setprofile(fn)

    slot = _run_hot(wf, watch, profile)
    assert slot.shown.status == "completed"
    assert len(ran) == 40
    assert on_thread and "MainThread" not in on_thread, on_thread  # a crew drove it
    # The last Step's outcome, to the end, takes the general path; the first asks about
    # the Step's function once.
    for name in ("Driver._record_outcome", "Driver._route", "finish", "_is_async",
                 "RunSlot._overridden", "suppress.__enter__"):
        assert seen.count(name) <= 3, (name, seen)


@pytest.mark.parametrize("then_executing", [True, False])
@pytest.mark.parametrize("same_step", [True, False])
def test_a_routed_steps_records_leave_the_events_and_state_that_apply_one_by_one_leaves(
        then_executing: bool, same_step: bool) -> None:
    # RunSlot.apply_routed with fold_routed (one call, one state built) against apply and
    # the machine's apply for each record: the same events, cursors and state.
    from intloom.runtime.machine import apply, fold_routed
    from intloom.runtime.records import (
        Executing,
        Header,
        StagePending,
        StepReady,
        StepResult,
    )

    wf, _ = _looping()
    wf.validate()
    lw = LoadedWorkflow(wf, "test.py", "id-hot", wf.schemas())
    header = Header(at="t0", run_id="RUN-1", workflow="hot", workflow_version="1",
                    identity="id-hot", schemas={}, intent="go")
    one, each = RunSlot.new(header, lw, None), RunSlot.new(header, lw, None)
    for record in (StagePending(at="t1", stage="s"),
                   StepReady(at="t2", stage="s", step="a", state=None),
                   Executing(at="t3", stage="s", step="a")):
        for slot in (one, each):
            slot.apply(record, apply(slot.state, record))
    target = "a" if same_step else "b"
    result = StepResult(at="t4", stage="s", step="a", outcome="again", state=b'{"n":1}')
    ready = StepReady(at="t4", stage="s", step=target, state=b'{"n":1}')
    executing = Executing(at="t4", stage="s", step=target) if then_executing else None
    one.apply_routed(result, ready, executing, fold_routed(one.state, result, ready,
                                                           executing))
    for routed in (result, ready, executing):
        if routed is not None:
            each.apply(routed, apply(each.state, routed))
    assert one.state == each.state
    assert one._events == each._events
    assert [event.cursor for event in one._events[-3:]] == [
        event.cursor for event in each._events[-3:]]
