"""Group commit shares one flush among every Run that appended meanwhile; a failed write or
fsync fails exactly its batch, and the failed bytes never read back as records."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from intloom.errors import IntloomError
from intloom.runtime.machine import fold, interrupted_message, restart_verdict
from intloom.runtime.ports import CheckpointFailed
from intloom.runtime.records import (
    EffectDone,
    EffectStarted,
    Executing,
    Record,
    StagePending,
    StepReady,
    StepResult,
    Terminal,
)
from intloom.store import FaultPlan, read_history, read_runs, verify
from intloom.store.faults import ENV
from tests.unit.test_store_support import (
    abandon,
    by_id,
    frames_end,
    frames_of,
    header,
    open_store,
    walk,
)


def test_concurrent_runs_share_flushes(tmp_path: Path) -> None:
    runs, per = 48, 15
    records = {f"RUN-{i:02d}": walk(f"RUN-{i:02d}", per, i) for i in range(runs)}

    async def main() -> tuple[int, int]:
        store = open_store(tmp_path / "runtime")

        async def one(run_id: str) -> None:
            for record in records[run_id]:
                store.append(run_id, record)
                await store.sync(run_id)

        await asyncio.gather(*(one(r) for r in records))
        flushes, flushed = store.flushes, store.records_flushed
        await store.close()
        return flushes, flushed

    flushes, flushed = asyncio.run(main())
    assert flushed == runs * per
    assert flushes <= runs * per // 8, f"{flushes} flushes for {flushed} records"
    journals = by_id(read_runs(tmp_path / "runtime"))
    assert all(journals[r].state == fold(rs) for r, rs in records.items())


def test_runs_woken_by_a_flush_on_the_loop_resume_in_the_iteration_that_flushed(
        tmp_path: Path) -> None:
    """A round of concurrent Runs costs one loop iteration: the flush queued in one runs
    first in the next, and the Runs waiting for it resume after it in that same iteration.
    Each used to wait on a future of its own, woken in the iteration after the flush: two
    iterations per round, and a future made, awaited and woken per Run per Step."""
    runs, per = 16, 20
    records = {f"RUN-{i:02d}": walk(f"RUN-{i:02d}", per, i) for i in range(runs)}

    async def main() -> tuple[int, int, int]:
        # Every flush on the loop, as while the disk is fast.
        store = open_store(tmp_path / "runtime", inline_max_sync_s=float("inf"))
        loop = asyncio.get_running_loop()
        turns = 0
        handle: list[asyncio.Handle] = []

        def turn() -> None:  # once per loop iteration
            nonlocal turns
            turns += 1
            handle[:] = [loop.call_soon(turn)]

        async def one(run_id: str) -> None:
            for record in records[run_id]:
                store.append(run_id, record)
                await store.sync(run_id)

        turn()
        await asyncio.gather(*(one(r) for r in records))
        handle[0].cancel()
        flushes, inline = store.flushes, store.inline_flushes
        await store.close()
        return turns, flushes, inline

    turns, flushes, inline = asyncio.run(main())
    assert inline == flushes
    turns -= 1  # the call that started the count
    assert flushes <= per + 2, f"{flushes} flushes for {per} rounds"
    assert turns <= flushes + 4, f"{turns} loop iterations for {flushes} flushes"
    journals = by_id(read_runs(tmp_path / "runtime"))
    assert all(journals[r].state == fold(rs) for r, rs in records.items())


def test_a_when_durable_call_that_raises_is_the_loops_to_report_not_the_flushs(
        tmp_path: Path) -> None:
    """The flush calls what waits ``when_durable`` itself (before the Runs it wakes resume):
    one that raises goes to the loop's exception handler, and the flush, the other calls
    and the waiting Runs carry on."""
    a, b = walk("RUN-A", 3, 1), walk("RUN-B", 3, 2)

    async def main() -> tuple[list[str], list[dict[str, object]]]:
        store = open_store(tmp_path / "runtime", inline_max_sync_s=float("inf"))
        loop = asyncio.get_running_loop()
        reported: list[dict[str, object]] = []
        loop.set_exception_handler(lambda _loop, context: reported.append(context))
        called: list[str] = []

        def boom() -> None:
            called.append("boom")
            raise ValueError("a follower's sink failed")

        store.append("RUN-A", a[0])
        store.append("RUN-B", b[0])
        store.when_durable(boom)
        store.when_durable(lambda: called.append("after"))
        await asyncio.gather(store.sync("RUN-A"), store.sync("RUN-B"))
        called.append("resumed")
        await store.close()
        return called, reported

    called, reported = asyncio.run(main())
    assert called == ["boom", "after", "resumed"]
    assert len(reported) == 1 and isinstance(reported[0]["exception"], ValueError)
    assert "when_durable" in str(reported[0]["message"])
    assert len(read_runs(tmp_path / "runtime")) == 2


def test_sync_returns_only_once_its_records_are_durable(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    records = walk("RUN-A", 6, 0)

    async def main() -> None:
        store = open_store(root)
        for i, record in enumerate(records, 1):
            store.append("RUN-A", record)
            await store.sync("RUN-A")
            # Another process's view (no store object) already has it.
            assert by_id(read_runs(root))["RUN-A"].state == fold(records[:i])
        await store.close()
        await store.close()  # idempotent

    asyncio.run(main())


def test_a_failed_fsync_fails_exactly_its_batch(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    a, b, c = walk("RUN-A", 6, 1), walk("RUN-B", 6, 2), walk("RUN-C", 6, 3)

    async def main() -> None:
        # keep_failed: the failed bytes stay (a disk that refuses the cut), for the notice.
        store = open_store(root, faults=FaultPlan(fail_sync=frozenset({3}),
                                                  keep_failed=frozenset({3})))
        for run, recs in (("RUN-A", a), ("RUN-B", b), ("RUN-C", c)):
            store.append(run, recs[0])
        await store.sync()  # flush 1
        store.append("RUN-A", a[1])
        store.append("RUN-B", b[1])
        await store.sync()  # flush 2
        store.append("RUN-A", a[2])
        store.append("RUN-C", c[1])
        with pytest.raises(CheckpointFailed) as info:
            await store.sync()  # flush 3: EIO instead of fdatasync
        assert info.value.run_ids == frozenset({"RUN-A", "RUN-C"})
        assert "fdatasync" in info.value.cause and "0000000001.seg" in info.value.cause
        # Later batches carry on, in a fresh segment; RUN-A and RUN-C are finished here.
        store.append("RUN-B", b[2])
        await store.sync("RUN-B")
        for run, rec in (("RUN-A", a[2]), ("RUN-C", c[1])):
            with pytest.raises(CheckpointFailed):
                store.append(run, rec)
            with pytest.raises(CheckpointFailed):
                await store.sync(run)
        await store.close()

    asyncio.run(main())
    # The failed batch's bytes did reach the file...
    seg1 = root / "wal" / "0000000001.seg"
    assert [f.seq for f in frames_of(seg1, "RUN-C")] == [1, 2]
    # ...but no reader treats them as records.
    for journals in (read_runs(root), verify(root)):
        got = by_id(journals)
        assert got["RUN-A"].state == fold(a[:2])
        assert got["RUN-B"].state == fold(b[:3])
        assert got["RUN-C"].state == fold(c[:1])
        assert all(j.status == "ok" for j in got.values())
    verdicts = [(h.seq, h.verdict, h.file) for h in read_history(root, "RUN-C")]
    assert verdicts == [(1, "ok", "wal/0000000001.seg"), (2, "void", "wal/0000000001.seg")]
    a_hist = [(h.seq, h.verdict) for h in read_history(root, "RUN-A")]
    assert a_hist == [(1, "ok"), (2, "ok"), (3, "void")]


def test_enospc_mid_write_voids_the_half_written_batch(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    a = walk("RUN-A", 5, 1)
    store = open_store(root, faults=FaultPlan(enospc_sync=frozenset({2})))
    store.append("RUN-A", a[0])
    store.sync_blocking()
    store.append("RUN-A", a[1])
    store.append("RUN-A", a[2])
    with pytest.raises(CheckpointFailed) as info:
        store.sync_blocking()
    assert info.value.run_ids == {"RUN-A"} and "write" in info.value.cause
    abandon(store)  # and then the host dies
    journal = by_id(read_runs(root))["RUN-A"]
    # Half a batch on disk is neither a torn tail nor corruption: it is void.
    assert journal.status == "ok" and journal.state == fold(a[:1]) and not journal.torn_tail


def test_sync_threadsafe_without_a_run_flushes_everything_and_failure_names_each_run(
        tmp_path: Path) -> None:
    """What a crew's thread does once per round (``Runtime.sync_crew``): one
    ``sync_threadsafe(None)`` for every Run it advanced, then ``failure`` per Run -- also
    for a failed write another caller's flush had settled before the crew asked."""
    root = tmp_path / "runtime"
    a, b = walk("RUN-A", 3, 1), walk("RUN-B", 3, 2)

    async def main() -> None:
        store = open_store(root, faults=FaultPlan(fail_sync=frozenset({2})),
                           inline_max_sync_s=float("inf"))
        store.share()  # as the loop does before a crew appends
        store.append("RUN-A", a[0])
        store.append("RUN-B", b[0])
        await asyncio.to_thread(store.sync_threadsafe, None)
        # Both Runs durable: what another process reads now.
        assert store.flushes == 1 and len(read_runs(root)) == 2
        assert store.failure("RUN-A") is None and store.failure("RUN-B") is None
        store.append("RUN-A", a[1])  # the next Steps' executing, say
        store.append("RUN-B", b[1])
        with pytest.raises(CheckpointFailed) as info:  # flush 2 fails: it names both
            await asyncio.to_thread(store.sync_threadsafe, None)
        assert info.value.run_ids == {"RUN-A", "RUN-B"}
        for run_id in ("RUN-A", "RUN-B"):
            failed = store.failure(run_id)
            assert failed is not None and failed.run_ids == {"RUN-A", "RUN-B"}
        # Settled before it was asked: nothing left to flush, and it returns at once.
        await asyncio.to_thread(store.sync_threadsafe, None)
        assert store.flushes == 2
        store.unshare()
        await store.close()

    asyncio.run(main())


def test_sync_with_run_id_reports_a_failure_whoever_flushed_it(tmp_path: Path) -> None:
    a, b = walk("RUN-A", 3, 1), walk("RUN-B", 3, 2)

    async def main() -> None:
        store = open_store(tmp_path / "runtime", faults=FaultPlan(fail_sync=frozenset({1})))
        store.append("RUN-A", a[0])
        store.append("RUN-B", b[0])
        with pytest.raises(CheckpointFailed):
            await store.sync("RUN-B")  # RUN-B's caller flushes RUN-A's record too
        with pytest.raises(CheckpointFailed) as info:
            await store.sync("RUN-A")  # nothing left to flush; RUN-A is still told
        assert "RUN-A" in info.value.run_ids
        with pytest.raises(CheckpointFailed):
            await store.sync("RUN-A")  # and again: the Run is finished in this process
        with pytest.raises(CheckpointFailed):
            store.append("RUN-A", a[0])
        await store.close()

    asyncio.run(main())
    assert read_runs(tmp_path / "runtime") == []  # neither Run ever had a durable record


def test_records_appended_while_a_failing_batch_is_on_disk_are_dropped(tmp_path: Path) -> None:
    """They presume the failed records exist: writing them (under the failed batch's seqs)
    would make the Run read back corrupt. Its Run is finished here and restores from its
    last durable record instead."""
    root = tmp_path / "runtime"
    a: list[Record] = [
        header("RUN-A"), StagePending(at="t", stage="draft"),
        StepReady(at="t", stage="draft", step="s1", state=b"{}"),
        Executing(at="t", stage="draft", step="s1"), EffectStarted(at="t", name="a", key="a#1"),
    ]
    b, c = walk("RUN-B", 2, 2), walk("RUN-C", 2, 3)

    async def main() -> None:
        # A slow disk's path (never inline): the batch is on the store's thread, and the
        # loop keeps appending meanwhile.
        store = open_store(root, faults=FaultPlan(fail_sync=frozenset({2}),
                                                  keep_failed=frozenset({2})),
                           inline_max_sync_s=0.0)
        for record in a:
            store.append("RUN-A", record)
        store.append("RUN-B", b[0])
        store.append("RUN-C", c[0])
        await store.sync()  # flush 1: RUN-A durable up to effect_started(a)
        store.append("RUN-A", EffectDone(at="t", name="a", key="a#1"))
        store.append("RUN-B", b[1])
        failing = asyncio.ensure_future(store.sync("RUN-B"))  # flush 2 will fail
        for _ in range(10_000):  # bounded: the batch leaves for the store's thread at once
            if store._inflight is not None:
                break
            await asyncio.sleep(0)
        assert store._inflight is not None
        # While flush 2 is on disk: RUN-A's next effect begins, RUN-C carries on.
        store.append("RUN-A", EffectStarted(at="t", name="b", key="b#1"))
        store.append("RUN-C", c[1])
        with pytest.raises(CheckpointFailed) as info:
            await store.sync("RUN-A")
        assert info.value.run_ids == frozenset({"RUN-A", "RUN-B"})
        with pytest.raises(CheckpointFailed):
            await failing
        await store.sync("RUN-C")  # the batch after the failure holds RUN-C's record only
        with pytest.raises(CheckpointFailed):
            store.append("RUN-A", EffectStarted(at="t", name="b", key="b#1"))
        await store.close()

    asyncio.run(main())
    assert [f.seq for f in frames_of(root / "wal" / "0000000002.seg", "RUN-A")] == []
    for journals in (read_runs(root), verify(root)):
        got = by_id(journals)
        assert got["RUN-A"].status == "ok" and got["RUN-A"].state == fold(a)
        assert got["RUN-B"].status == "ok" and got["RUN-B"].state == fold(b[:1])
        assert got["RUN-C"].status == "ok" and got["RUN-C"].state == fold(c)
    state = got["RUN-A"].state
    assert restart_verdict(state, False).row == "interrupted"
    assert "'a'" in interrupted_message(state)  # the effect that really started
    assert [(h.seq, h.verdict) for h in read_history(root, "RUN-A")][-1] == (6, "void")


def test_a_failed_batch_stays_void_once_the_segment_naming_it_is_no_longer_read(
    tmp_path: Path,
) -> None:
    """A host whose write failed crashed before its close could put the void in the manifest:
    only the replacement segment's first frame says the failed bytes are void. The next host
    moves restores past that segment, while the failed one stays read (pinned: it holds
    damage too). Its void bytes must not read back as records: RUN-X's creation failed, and
    its caller was told so; it must never be restored and run."""
    root = tmp_path / "runtime"
    store = open_store(root, faults=FaultPlan(fail_sync=frozenset({2}),
                                              keep_failed=frozenset({2})))
    for record in walk("RUN-D", 3, 1):
        store.append("RUN-D", record)
    store.sync_blocking()
    for record in walk("RUN-X", 2, 2):
        store.append("RUN-X", record)
    with pytest.raises(CheckpointFailed):
        store.sync_blocking("RUN-X")  # flush 2 fails: wal/0000000002.seg voids its bytes
    for record in walk("RUN-A", 3, 3):
        store.append("RUN-A", record)
    store.sync_blocking()
    abandon(store)
    failed = root / "wal" / "0000000001.seg"
    assert [f.seq for f in frames_of(failed, "RUN-X")] == [1, 2]  # valid frames, yet void
    hit = frames_of(failed, "RUN-D")[1]
    data = bytearray(failed.read_bytes())
    data[hit.end - 2] ^= 0x5A  # damage pins wal/0000000001.seg for every later restore
    failed.write_bytes(bytes(data))
    kept = failed.read_bytes()

    assert "RUN-X" not in by_id(read_runs(root))  # both segments read: the void is seen
    store = open_store(root, instance_id="INST-2")
    assert set(by_id(store.restored.runs)) == {"RUN-A", "RUN-D"}
    store.close_blocking()
    for n in range(3, 5):  # every later restore reads wal/0000000001.seg, not the notice
        runs = by_id(read_runs(root))
        assert set(runs) == {"RUN-A", "RUN-D"}, runs.get("RUN-X")
        assert runs["RUN-D"].status == "corrupt"
        assert runs["RUN-A"].state == fold(walk("RUN-A", 3, 3))
        store = open_store(root, instance_id=f"INST-{n}")
        assert "RUN-X" not in by_id(store.restored.runs)
        store.close_blocking()
    assert failed.read_bytes() == kept
    assert "RUN-X" not in by_id(verify(root))


def test_when_no_replacement_segment_can_be_made_every_later_sync_fails(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    a, b = walk("RUN-A", 4, 1), walk("RUN-B", 4, 2)
    # Segment 1 is made by open; segment 2 (the replacement after flush 2 fails) cannot be.
    store = open_store(root, faults=FaultPlan(fail_sync=frozenset({2}),
                                              fail_segment=frozenset({2})))
    store.append("RUN-A", a[0])
    store.sync_blocking()
    store.append("RUN-A", a[1])
    with pytest.raises(CheckpointFailed):
        store.sync_blocking()
    store.append("RUN-B", b[0])
    with pytest.raises(CheckpointFailed) as info:
        store.sync_blocking()
    assert info.value.run_ids == {"RUN-B"} and "no later checkpoint" in info.value.cause
    store.close_blocking()  # close still snapshots what was durable and voids the rest
    journals = by_id(read_runs(root))
    assert journals["RUN-A"].state == fold(a[:1]) and "RUN-B" not in journals
    assert by_id(verify(root))["RUN-A"].state == fold(a[:1])


@pytest.mark.parametrize("fault", ["fail_sync", "enospc_sync"])
def test_a_failed_batch_no_void_notice_could_name_is_cut_off_its_segment(
    tmp_path: Path, fault: str,
) -> None:
    """A full disk: the batch fails, and neither the replacement segment that would void it
    nor a manifest can be written; then the host stops or dies. The records of the failed
    batch that reached the file (all of them after a failed fdatasync, the whole frames of a
    write ENOSPC cut short) read back as records at the next start: RUN-X's second record
    (an answer, say) was reported failed to its client, and came back applied. They are now
    cut off the segment, which needs no free space; the bytes before them stay as they were."""
    root = tmp_path / "runtime"
    x = walk("RUN-X", 6, 1)
    store = open_store(root, faults=FaultPlan(**{fault: frozenset({2})},
                                              fail_segment=frozenset({2})))
    store.append("RUN-X", x[0])
    store.sync_blocking()
    segment = root / "wal" / "0000000001.seg"
    durable = segment.read_bytes()[:frames_end(segment)]  # the zeros after it go too
    for record in x[1:5]:
        store.append("RUN-X", record)
    with pytest.raises(CheckpointFailed):
        store.sync_blocking("RUN-X")
    store.append("RUN-Y", walk("RUN-Y", 1, 2)[0])
    with pytest.raises(CheckpointFailed) as info:
        store.sync_blocking("RUN-Y")
    assert "no replacement segment could be created" in info.value.cause, info.value.cause
    abandon(store)  # the host dies: no manifest names the void
    assert segment.read_bytes() == durable
    for journals in (read_runs(root), verify(root)):
        journal = by_id(journals)["RUN-X"]
        assert journal.status == "ok" and journal.state == fold(x[:1]), journal


def test_a_failed_batch_is_not_cut_off_a_segment_another_program_wrote_to(
    tmp_path: Path,
) -> None:
    """Bytes another program added to the open segment make it another size than this host
    made it. When segments were appended to (O_APPEND, format 1) they put this host's
    batches after them, and a cut at its own count took the end of an acknowledged batch
    with it (the Run read back corrupt). Such a segment is not cut: the void notice alone
    says the failed batch never happened."""
    root = tmp_path / "runtime"
    x = walk("RUN-X", 8, 1)
    store = open_store(root, faults=FaultPlan(fail_sync=frozenset({3})))
    store.append("RUN-X", x[0])
    store.sync_blocking()
    segment = root / "wal" / "0000000001.seg"
    with open(segment, "ab") as fh:
        fh.write(b"\0" * 40)
    store.append("RUN-X", x[1])
    store.append("RUN-X", x[2])
    store.sync_blocking()  # acknowledged
    acknowledged = segment.read_bytes()[:frames_end(segment)]
    store.append("RUN-X", x[3])
    with pytest.raises(CheckpointFailed):
        store.sync_blocking("RUN-X")
    abandon(store)
    assert segment.read_bytes()[: len(acknowledged)] == acknowledged
    for journals in (read_runs(root), verify(root)):
        journal = by_id(journals)["RUN-X"]
        assert journal.status == "ok" and journal.state == fold(x[:3]), journal


def test_append_after_close_is_refused(tmp_path: Path) -> None:
    store = open_store(tmp_path / "runtime")
    store.close_blocking()
    with pytest.raises(IntloomError) as info:
        store.append("RUN-A", walk("RUN-A", 1)[0])
    assert info.value.code == "STORAGE_ERROR"


def test_fault_plan_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = FaultPlan.parse("fail_sync=2, torn_write=5,fail_sync=7")
    assert plan.fail_sync == {2, 7} and plan.torn_write == {5} and plan
    assert not FaultPlan.parse("")
    for bad in ("explode=1", "fail_sync=0", "fail_sync=x", "fail_sync"):
        with pytest.raises(IntloomError) as info:
            FaultPlan.parse(bad)
        assert ENV in info.value.message
    monkeypatch.setenv(ENV, "crash_after_sync=3")
    assert FaultPlan.from_env().merged(FaultPlan(fail_sync=frozenset({1}))) == FaultPlan(
        crash_after_sync=frozenset({3}), fail_sync=frozenset({1}))


def test_a_flush_that_would_wait_for_a_running_compaction_leaves_the_loop(
    tmp_path: Path,
) -> None:
    """Flushes normally run on the event loop (fast disk); one that rotates the segment
    while the previous compaction still runs would wait for it there, so it goes to the
    store's thread and the loop keeps turning."""
    records = walk("RUN-R", 60, 5)

    async def main() -> None:
        store = open_store(tmp_path / "runtime", segment_bytes=2048)
        gate = threading.Event()
        store._compactor = threading.Thread(target=gate.wait, daemon=True)
        store._compactor.start()  # stands for a compaction that takes long
        try:
            inline = store.inline_flushes
            for record in records:
                store.append("RUN-R", record)
            flushing = asyncio.ensure_future(store.sync("RUN-R"))
            for _ in range(10_000):  # bounded; the loop must keep turning meanwhile
                if store._inflight is not None:
                    break
                await asyncio.sleep(0)
            assert store._inflight is not None and store.inline_flushes == inline
            assert not flushing.done()  # the rotation waits for the compaction, off the loop
            gate.set()
            await asyncio.wait_for(flushing, timeout=30)
        finally:
            gate.set()
            await store.close()

    asyncio.run(main())
    assert [j.state.seq for j in read_runs(tmp_path / "runtime") if j.state] == [60]


def test_a_record_that_cannot_be_encoded_changes_nothing(tmp_path: Path) -> None:
    """msgpack refuses integers beyond 64 bits: the append raises, and neither that Run's
    seqs nor the next batch's Runs remember it (no gap, no Run blamed for a later failure)."""
    root = tmp_path / "runtime"
    a: list[Record] = [
        header("RUN-A"), StagePending(at="t", stage="draft"),
        StepReady(at="t", stage="draft", step="s1", state=b"{}"),
        Executing(at="t", stage="draft", step="s1"), EffectStarted(at="t", name="a", key="a#1"),
    ]
    b = walk("RUN-B", 2, 2)

    async def main() -> None:
        store = open_store(root, faults=FaultPlan(fail_sync=frozenset({2})))
        for record in a:
            store.append("RUN-A", record)
        store.append("RUN-B", b[0])
        await store.sync()
        with pytest.raises(OverflowError):
            store.append("RUN-A", EffectDone(at="t", name="a", key="a#1", result=2**70))
        store.append("RUN-B", b[1])
        with pytest.raises(CheckpointFailed) as info:  # flush 2 fails: only RUN-B was in it
            await store.sync("RUN-B")
        assert info.value.run_ids == frozenset({"RUN-B"})
        store.append("RUN-A", EffectDone(at="t", name="a", key="a#1", result="fits"))
        await store.sync("RUN-A")
        await store.close()

    asyncio.run(main())
    runs = by_id(verify(root))
    assert runs["RUN-A"].status == "ok"
    assert runs["RUN-A"].state is not None and runs["RUN-A"].state.seq == len(a) + 1
    assert runs["RUN-A"].state.phase == "effect_done"


def test_records_appended_together_are_kept_all_or_none(tmp_path: Path) -> None:
    """``append_many``: when one of its records cannot be encoded, none of them is kept, the
    Run's seqs included; then three together land as three appends one by one would."""
    root = tmp_path / "runtime"
    a: list[Record] = [
        header("RUN-A"), StagePending(at="t", stage="draft"),
        StepReady(at="t", stage="draft", step="s1", state=b"{}"),
        Executing(at="t", stage="draft", step="s1"), EffectStarted(at="t", name="a", key="a#1"),
    ]

    async def main() -> None:
        store = open_store(root)
        for record in a:
            store.append("RUN-A", record)
        await store.sync()
        appended = store._appended
        with pytest.raises(OverflowError):
            store.append_many("RUN-A", (
                EffectDone(at="t", name="a", key="a#1", result="fits"),
                StepResult(at="t", stage="draft", step="s1", outcome="ok", output=2**70),
                Terminal(at="t", status="completed"),
            ))
        assert store._appended == appended and not store._pending_frames
        store.append_many("RUN-A", (
            EffectDone(at="t", name="a", key="a#1", result="fits"),
            StepResult(at="t", stage="draft", step="s1", outcome="ok", output="done"),
            Terminal(at="t", status="completed"),
        ))
        await store.sync("RUN-A")
        await store.close()

    asyncio.run(main())
    runs = by_id(verify(root))
    assert runs["RUN-A"].status == "ok"
    assert runs["RUN-A"].state is not None and runs["RUN-A"].state.seq == len(a) + 3
    assert runs["RUN-A"].state.phase == "terminal"
    assert runs["RUN-A"].state.output == "done"
