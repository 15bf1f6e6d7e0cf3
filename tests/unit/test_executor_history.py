"""An ended Run's packed history (executor/history.py) unpacks to entries whose views and
details are exactly those of the entries packed."""

from __future__ import annotations

from typing import Any

import pytest

from intloom.errors import ErrorView
from intloom.executor.history import FACTS, Entry, Event, detail, pack, shown, unpack
from intloom.runtime.machine import RunState, apply, to_view
from intloom.runtime.records import EffectDone
from tests.unit.test_store_support import walk


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
