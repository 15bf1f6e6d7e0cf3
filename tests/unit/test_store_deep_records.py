"""A record nested deeper than the reader can decode where it reads (msgspec's depth limit is
Python's recursion limit less the stack below it): the read names that Run's record and goes
on. It raised RecursionError out of the reader, and the host could not start at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from intloom.runtime.records import EffectDone, EffectStarted, Executing, StagePending, StepReady
from intloom.store import Store, read_history, read_runs, verify
from tests.unit.test_store_support import abandon, header, open_store


def _nested(depth: int) -> Any:
    value: Any = None
    for _ in range(depth):
        value = [value]
    return value


def _append_effect_result(store: Store, run_id: str, result: Any) -> None:
    """A Run's records up to an effect that returned ``result``."""
    store.append(run_id, header(run_id))
    store.append(run_id, StagePending(at="t", stage="draft"))
    store.append(run_id, StepReady(at="t", stage="draft", step="s1", state=b"{}"))
    store.append(run_id, Executing(at="t", stage="draft", step="s1"))
    store.append(run_id, EffectStarted(at="t", name="e", key="k"))
    store.append(run_id, EffectDone(at="t", name="e", key="k", result=result))


def _from_deep_in_the_stack(frames: int, fn: Any) -> Any:
    """``fn()`` called ``frames`` Python frames deeper than here (a host's restore runs deep
    inside its start; a test's call is shallow)."""
    if frames == 0:
        return fn()
    return _from_deep_in_the_stack(frames - 1, fn)


def test_a_record_too_deep_to_decode_holds_its_run_and_the_others_are_read(
    tmp_path: Path,
) -> None:
    root = tmp_path / "runtime"
    store = open_store(root)
    for run_id, depth in (("RUN-deep", 900), ("RUN-plain", 1)):
        _append_effect_result(store, run_id, _nested(depth))
    store.sync_blocking()
    abandon(store)  # a crash: the restore reads the log

    for read in (read_runs, verify):
        found = _from_deep_in_the_stack(300, lambda read=read: read(root))
        journals = {j.run_id: j for j in found}
        assert journals["RUN-plain"].status == "ok"
        deep = journals["RUN-deep"]
        assert deep.status == "corrupt" and "nested too deeply" in (deep.problem or ""), deep
    entries = _from_deep_in_the_stack(300, lambda: read_history(root, "RUN-deep"))
    assert entries[-1].verdict == "undecodable" and "nested too deeply" in (
        entries[-1].problem or ""), entries[-1]


def test_every_reader_draws_the_line_at_the_same_depth_wherever_it_reads_from(
    tmp_path: Path,
) -> None:
    """msgspec's limit is Python's recursion limit less the stack below the call, and doctor
    reads ~10 frames shallower than a start: a record ~950 levels deep was read by doctor
    (and inspect), previewed as a Run to resume, while the start held it as corrupt. Now one
    limit (``READ_DEPTH`` levels of the record's msgpack) decides for every reader."""
    from intloom.store.depth import READ_DEPTH

    root = tmp_path / "runtime"
    store = open_store(root)
    # The record's map is one level: a result nested READ_DEPTH - 1 deep is the deepest read.
    for run_id, depth in (("RUN-edge", READ_DEPTH - 1), ("RUN-past", READ_DEPTH + 40)):
        _append_effect_result(store, run_id, _nested(depth))
    store.sync_blocking()
    abandon(store)

    for frames in (0, 300):  # a shallow reader (doctor, inspect) and a deeper one (a start)
        journals = {j.run_id: j for j in _from_deep_in_the_stack(frames, lambda: read_runs(root))}
        assert journals["RUN-edge"].status == "ok", (frames, journals["RUN-edge"])
        past = journals["RUN-past"]
        assert past.status == "corrupt", (frames, past)
        assert f"more than {READ_DEPTH} levels, the most intloom reads" in (past.problem or "")


def test_a_large_state_costs_its_decode_alone_and_a_deep_record_past_it_is_still_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The depth check counted every byte that may start a container in records over
    ``READ_DEPTH`` bytes, a Stage State's bytes included (opaque to the record: nothing in
    them nests it): a restore of Runs with 20 KB States decoded ~9x slower than before the
    check. The bytes outside the State bound how deep a record can nest."""
    import msgspec

    from intloom.runtime.records import StepResult, Waiting, encode_record
    from intloom.store import depth
    from intloom.store.depth import READ_DEPTH, TooDeep, decode_record

    # Every byte of the State may start a container (0x91: a one-item array).
    state = b"\x91" * 200_000
    data = encode_record(StepResult(at="t", stage="s", step="a", outcome="next", state=state))

    # The usual record is decoded once and returned: the slow path (a second, untyped
    # decode and a walk of it) is not taken for a State's bytes. Asserted by the path, not
    # by a timing: the suite holds no timing assertion.
    def slow_path(*_args: object) -> None:
        raise AssertionError("a large State took the slow depth check")

    monkeypatch.setattr(depth, "decode_bounded", slow_path)
    assert decode_record(data).state == state  # type: ignore[union-attr]
    monkeypatch.undo()

    # Outside a State, nesting is still refused however large the State beside it.
    deep = msgspec.msgpack.encode(
        {**msgspec.msgpack.decode(encode_record(Waiting(at="t", state=state))),
         "extra": _nested(READ_DEPTH + 5)})
    with pytest.raises(TooDeep):
        decode_record(deep)


def test_a_wide_result_is_judged_by_its_record_and_agrees_with_the_slow_path_at_the_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An effect result of many small maps (more than READ_DEPTH bytes that may start a
    container) was decoded untyped, walked, then decoded again with room: ~8x a plain
    decode at every restore. It is judged by a walk of the record decoded once, and the line
    falls where the slow path (``nested_too_deep``) draws it, from any stack."""
    from intloom.runtime.records import EffectDone, encode_record
    from intloom.store import depth
    from intloom.store.depth import READ_DEPTH, TooDeep, decode_record, nested_too_deep

    rows = [{"id": i, "tags": [i, {"k": "v"}]} for i in range(1_000)]
    wide = encode_record(EffectDone(at="t", name="e", key="k", result=rows))

    def slow_path(*_args: object) -> None:
        raise AssertionError("a wide result took the slow depth check")

    monkeypatch.setattr(depth, "decode_bounded", slow_path)
    assert decode_record(wide).result == rows  # type: ignore[union-attr]
    monkeypatch.undo()

    # The record's map is level 1; its result adds the levels of its own nesting. Padded
    # with rows so that the walk, not the byte count, decides.
    for nesting, refused in ((READ_DEPTH - 1, False), (READ_DEPTH, True)):
        data = encode_record(EffectDone(at="t", name="e", key="k",
                                        result=[rows, _nested(nesting - 1)]))
        assert nested_too_deep(data) is refused, nesting
        for frames in (0, 300):
            if refused:
                with pytest.raises(TooDeep):
                    _from_deep_in_the_stack(frames, lambda data=data: decode_record(data))
            else:
                _from_deep_in_the_stack(frames, lambda data=data: decode_record(data))
