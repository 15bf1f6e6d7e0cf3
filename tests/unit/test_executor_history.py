"""An ended Run's packed history (executor/history.py) unpacks to entries whose views and
details are exactly those of the entries packed; a live Run's entries keep no Stage State."""

from __future__ import annotations

import asyncio
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import msgspec
import pytest

import intloom
from intloom.authoring.loader import LoadedWorkflow
from intloom.errors import ErrorView
from intloom.executor.history import FACTS, Entry, Event, detail, pack, shown, unpack
from intloom.executor.runtime import Runtime
from intloom.runtime.machine import RunState, apply, to_view
from intloom.runtime.records import EffectDone
from tests.unit.test_store_support import open_store, walk


def _entries(run_id: str, seed: int) -> list[Entry]:
    """One entry per record of a random legal walk (effects, waits, answers, Stages), as a
    Run's history holds them, with an overridden view now and then."""
    entries: list[Entry] = []
    state: RunState | None = None
    for i, record in enumerate(walk(run_id, 120, seed=seed, terminal=True)):
        state = apply(state, record)
        facts = FACTS.get(type(record))
        events: tuple[Event, ...] = (  # as RunSlot.apply keeps them: the record's facts
            Event(state.phase, None if facts is None else facts(record), state.cursor),)
        override = None
        if i % 17 == 5:  # a suspension or a failure outside the journal
            override = to_view(state, status="failed",
                               last_error=ErrorView(code="RUN_INTERRUPTED", message=f"cut {i}"))
            events += (Event("suspended", {"code": "RUN_INTERRUPTED"}, None),)
        entries.append(Entry(events, state, override))
    return entries


def _sent(entries: list[Entry]) -> list[tuple[str, Any, Any, Any]]:
    return [(ev.name, detail(ev.name, ev.info), ev.cursor, shown(entry))
            for entry in entries for ev in entry.events]


@pytest.mark.parametrize("seed", range(8))
def test_packed_entries_unpack_to_the_same_events_details_and_views(seed: int) -> None:
    entries = _entries(f"RUN-{seed}", seed)
    blob = pack(entries)
    assert blob is not None
    final = entries[-1].state
    assert _sent(unpack(blob, final)) == _sent(entries)
    assert len(blob) < len(entries) * 60  # packed: a few dozen bytes an entry


def test_details_are_made_of_a_record_or_the_facts_a_packed_history_keeps_of_it() -> None:
    done = EffectDone(at="t", name="charge", key="k-1", result={"big": "x" * 100})
    assert detail("effect_done", done) == {"name": "charge", "key": "k-1"}
    assert detail("step_result", "ok") == {"outcome": "ok"}
    assert detail("effect_done", ("charge", "k-1")) == {"name": "charge", "key": "k-1"}
    assert detail("effect_started", ["charge", "k-1"]) == {"name": "charge", "key": "k-1"}
    assert detail("answered", "ASK-1") == {"actionId": "ASK-1"}
    assert detail("claimed", {"callId": "CALL-1"}) == {"callId": "CALL-1"}
    assert detail("created", None) is None


def test_an_entry_whose_detail_does_not_encode_keeps_the_objects() -> None:
    entries = _entries("RUN-x", 1)
    entry = entries[3]
    entries[3] = Entry((*entry.events, Event("odd", object(), None)), entry.state, entry.view)
    assert pack(entries) is None


class Big(msgspec.Struct):
    n: int = 0
    blob: str = ""


_STEPS = 120
_STATE_BYTES = 32 * 1024


def _big_state_workflow(kind: str) -> LoadedWorkflow:
    """``_STEPS`` Steps, each giving the Stage a new ~32 KiB State, then a confirmation."""
    wf = intloom.Workflow(f"big-{kind}", version="1")
    stage = wf.stage("s", state=Big)

    def advance(ctx: intloom.StepContext[Big]) -> str:
        n = ctx.state.n + 1
        ctx.state = Big(n=n, blob=f"{n:08d}" * (_STATE_BYTES // 8))
        return "again" if n < _STEPS else "ask"

    if kind == "sync":
        @stage.step("grow", routes={"again": "grow", "ask": "ask"})
        def grow(ctx: intloom.StepContext[Big]) -> str:
            return advance(ctx)
    else:
        @stage.step("grow", routes={"again": "grow", "ask": "ask"})
        async def grow(ctx: intloom.StepContext[Big]) -> str:
            return advance(ctx)

    @stage.step("ask", routes={"ok": intloom.COMPLETE})
    async def ask(ctx: intloom.StepContext[Big]) -> str:
        await ctx.confirm({"n": ctx.state.n})
        return "ok"

    wf.validate()
    return LoadedWorkflow(wf, "test.py", f"id-big-{kind}", wf.schemas())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_live_runs_history_does_not_keep_each_steps_state(tmp_path: Path, kind: str) -> None:
    # Each entry kept the state its publish showed, Stage State and all: a live Run keeps up
    # to 1,000 entries, so one with a 1 MB State held ~1 GB until it ended.
    lw = _big_state_workflow(kind)
    seen: list[Any] = []

    async def main() -> int:
        store = open_store(tmp_path / "runtime")
        try:
            rt = Runtime({lw.name: lw}, store, package_version="0.1.0")
            rt.restore([])
            tracemalloc.start()
            try:
                before = tracemalloc.get_traced_memory()[0]
                view = await rt.create_run(lw.name, "test")
                final = await asyncio.wait_for(rt.wait_stable(view.run_id), 40)
                grown = tracemalloc.get_traced_memory()[0] - before
            finally:
                tracemalloc.stop()
            assert final.status == "waiting", final
            # What a follower is shown is unchanged: every Step's events, with their views.
            slot, history = await rt.attach(view.run_id, seen.extend)
            slot.detach(seen.extend)
            results = [u for u in history if u.event == "step_result"]
            assert len(results) == _STEPS and all(u.run.status == "running"
                                                      for u in results)
            assert history[-1].run.status == "waiting"
            assert history[-1].run.pending_action is not None
            return grown
        finally:
            await store.close()

    grown = asyncio.run(main())
    # One State is the Run's own (and the store's for its next snapshot); 120 of them were
    # ~3.9 MB more.
    assert grown < 20 * _STATE_BYTES, f"{grown} bytes kept for one waiting Run"


_SHOWN_FIELDS = ("cursor", "status", "updated_at", "pending_action", "pending_agent_call",
                 "last_error", "phase", "dismissed")


def _kept_of(entry: Entry) -> tuple[Any, ...]:
    """All an entry keeps that anyone reads: each event (its name, detail and own cursor),
    the view it kept (or None), the view it showed, and, with no view kept, its state's
    fields that view is made of."""
    return (tuple((ev.name, detail(ev.name, ev.info), ev.cursor) for ev in entry.events),
            entry.view, shown(entry), entry.view is None and
            tuple(getattr(entry.state, name) for name in _SHOWN_FIELDS))


@pytest.mark.parametrize("seed", range(4))
def test_unpacked_entries_keep_every_event_detail_cursor_view_and_shown_state(seed: int) -> None:
    entries = _entries(f"RUN-{seed}", seed)
    # Besides every record's event: the events a publish adds itself (a dict detail with
    # numbers, bools and nesting, a claim's, after the end's), each with no cursor of its own.
    extra = (Event("restored", {"n": 1, "ok": True, "ratio": 1.0, "nested": {"l": [1, "a"]}},
                   None),
             Event("claimed", {"callId": "CALL-1"}, None), Event("cancelled", None, None))
    last = entries[-1]
    entries.append(Entry((*last.events, *extra), last.state, last.view))
    blob = pack(entries)
    assert blob is not None
    got = unpack(blob, entries[-1].state)
    assert [_kept_of(e) for e in got] == [_kept_of(e) for e in entries]
    # Exactly, not merely equal: 1, True and 1.0 compare equal but are sent differently.
    restored = got[-1].events[-3].info
    assert [type(restored[k]) for k in ("n", "ok", "ratio")] == [int, bool, float]


def test_a_packed_history_is_raw_deflate_without_a_checksum() -> None:
    # The blob never leaves memory: a zlib stream's Adler-32 (a pass over all ~36 KB of a
    # long Run's input) and its header protect nothing, and its default 2^15-entry hash
    # table, cleared for every pack, cost more than the matching (~7.1k -> ~6.1k
    # instructions per entry, callgrind over 200 entries of the bench's tick Run).
    blob = pack(_entries("RUN-raw", 3))
    assert blob is not None
    inflate = zlib.decompressobj(-15)
    assert inflate.decompress(blob) and inflate.eof and not inflate.unused_data
