"""Crews (executor/crew.py): one worker thread advances many Runs' Step loops a round at a
time with one flush per round, throws a failed flush into the Run it failed, splits off
Runs held up by one that blocks or by a round of calls that each wait a little (never
advancing a Run past a boundary no flush has covered), and leaves once it has nothing left
to drive."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Generator
from typing import Any

import pytest

from intloom.executor.crew import Crews
from intloom.executor.workers import NoThread, Workers
from tests.helpers import eventually


class Flushes:
    """A flush that records the tags of each call; ``fail`` names tags to fail once."""

    def __init__(self, fail: frozenset[str] = frozenset()) -> None:
        self.rounds: list[list[str]] = []
        self.fail = set(fail)
        self.threads: set[int] = set()

    def __call__(self, tags: list[Any]) -> list[BaseException | None]:
        self.rounds.append(list(tags))
        self.threads.add(threading.get_ident())
        told: list[BaseException | None] = []
        for tag in tags:
            if tag in self.fail:
                self.fail.discard(tag)
                told.append(OSError(f"{tag}: no space left on device"))
            else:
                told.append(None)
        return told


def _steps(name: str, count: int, each: Any = None) -> Generator[str, None, str]:
    for _ in range(count):
        if each is not None:
            each()
        yield name
    return f"{name} done"


async def _drive(crews: Crews, gens: dict[str, Generator[str, None, str]],
                 limit_s: float = 20.0) -> dict[str, tuple[bool, Any]]:
    loop = asyncio.get_running_loop()
    futures = {name: loop.create_future() for name in gens}

    def done_of(name: str) -> Any:
        def done(ok: bool, value: Any) -> None:
            loop.call_soon_threadsafe(futures[name].set_result, (ok, value))
        return done

    for name, gen in gens.items():
        crews.join(gen, done_of(name))
    results = await asyncio.wait_for(asyncio.gather(*futures.values()), limit_s)
    return dict(zip(gens, results, strict=True))


@pytest.mark.timeout(30)
def test_one_thread_advances_every_run_with_one_flush_per_round() -> None:
    flushes = Flushes()

    async def main() -> dict[str, tuple[bool, Any]]:
        crews = Crews(Workers(idle_s=2.0, name="intloom-step-test-crew"),
                      asyncio.get_running_loop(), flushes)
        return await _drive(crews, {n: _steps(n, 5) for n in ("a", "b", "c")})

    results = asyncio.run(main())
    assert results == {n: (True, f"{n} done") for n in ("a", "b", "c")}
    # Joined in one loop turn: every round holds all three, in the order they joined.
    assert flushes.rounds == [["a", "b", "c"]] * 5
    assert len(flushes.threads) == 1


@pytest.mark.timeout(30)
def test_a_failed_flush_is_raised_in_its_run_alone() -> None:
    flushes = Flushes(fail=frozenset({"b"}))

    async def main() -> dict[str, tuple[bool, Any]]:
        crews = Crews(Workers(idle_s=2.0, name="intloom-step-test-crew-fail"),
                      asyncio.get_running_loop(), flushes)
        return await _drive(crews, {n: _steps(n, 3) for n in ("a", "b")})

    results = asyncio.run(main())
    assert results["a"] == (True, "a done")
    ok, raised = results["b"]
    assert not ok and isinstance(raised, OSError) and "b: no space" in str(raised)
    assert flushes.rounds == [["a", "b"], ["a"], ["a"]]


@pytest.mark.timeout(30)
def test_runs_whose_calls_each_wait_a_little_run_side_by_side() -> None:
    """Each advance waits 5 ms (I/O): one thread would take 8 x 5 ms per round. An advance
    past its budget (the loop's look), or a round past its own, moves the Runs not yet
    advanced to a new crew, and a crew whose rounds stay that slow is not merged back: the
    calls overlap."""
    running = 0
    most = 0
    lock = threading.Lock()

    def wait_a_little() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.005)
        with lock:
            running -= 1

    flushes = Flushes()

    async def main() -> tuple[dict[str, tuple[bool, Any]], int]:
        crews = Crews(Workers(idle_s=2.0, name="intloom-step-test-crew-round"),
                      asyncio.get_running_loop(), flushes)
        names = [f"r{i}" for i in range(8)]
        results = await _drive(crews, {n: _steps(n, 4, wait_a_little) for n in names})
        return results, crews.splits

    results, splits = asyncio.run(main())
    assert all(ok for ok, _ in results.values())
    assert splits >= 1 and most >= 2
    assert sorted(tag for r in flushes.rounds for tag in r) == sorted(
        f"r{i}" for i in range(8) for _ in range(4))


@pytest.mark.timeout(30)
def test_a_crew_with_nothing_left_leaves_and_the_next_run_starts_one() -> None:
    flushes = Flushes()
    name = "intloom-step-test-crew-leave"

    async def main() -> None:
        crews = Crews(Workers(idle_s=2.0, name=name), asyncio.get_running_loop(), flushes)
        assert (await _drive(crews, {"a": _steps("a", 2)}))["a"] == (True, "a done")
        eventually(lambda: crews._open is None and not crews._live, what="the crew to leave")
        assert (await _drive(crews, {"b": _steps("b", 2)}))["b"] == (True, "b done")
        eventually(lambda: crews._open is None and not crews._live, what="the crew to leave")

    asyncio.run(main())
    assert flushes.rounds == [["a"], ["a"], ["b"], ["b"]]


@pytest.mark.timeout(30)
def test_no_run_is_advanced_past_a_boundary_its_flush_has_not_covered() -> None:
    """Each advance ends at a boundary that must be durable before the Run goes on: a Run
    moved to a new crew by the loop's look, after its advance and before its crew's flush,
    must be flushed by the new crew before it is advanced again."""
    flushed: dict[str, int] = {}
    lock = threading.Lock()
    release = threading.Event()

    def flush(tags: list[Any]) -> list[BaseException | None]:
        with lock:
            for tag in tags:
                flushed[tag] = flushed.get(tag, 0) + 1
        return [None] * len(tags)

    def steps(name: str, count: int, block_at: int | None = None) -> Generator[str, None, str]:
        for i in range(count):
            if i == block_at:
                assert release.wait(10)
            with lock:
                before = flushed.get(name, 0)
            yield name
            with lock:
                assert flushed.get(name, 0) == before + 1, f"{name} went on unflushed"
        return name

    async def main() -> dict[str, tuple[bool, Any]]:
        crews = Crews(Workers(idle_s=2.0, name="intloom-step-test-crew-due"),
                      asyncio.get_running_loop(), flush)
        # "b" is advanced before "a" in each round: when "a" blocks in its second advance,
        # "b" has just yielded and waits for the crew's flush.
        task = asyncio.ensure_future(_drive(crews, {"b": steps("b", 6), "a": steps("a", 6, 1),
                                                    "c": steps("c", 6)}))
        await asyncio.to_thread(eventually, lambda: crews.splits, what="the look's split")
        release.set()
        return await task

    results = asyncio.run(main())
    assert results == {n: (True, n) for n in ("b", "a", "c")}, results


@pytest.mark.timeout(30)
def test_a_crew_split_off_a_closed_crew_merges_back_once_cheap() -> None:
    """A slow round splits the open crew: the Runs not yet advanced become the open crew, and
    the crew they left is closed. A slow round of that closed crew splits it again; the crew
    split off it is not the open one either. Once the Steps are cheap again every split-off
    crew must go back into the open crew, not flush its Runs on a thread of its own for the
    rest of their lives."""
    split_twice = threading.Event()
    stop = threading.Event()

    def steps(name: str, waits: tuple[float, ...] = ()) -> Generator[str, None, str]:
        for wait_s in waits:
            time.sleep(wait_s)  # I/O: the advance itself takes this long
            yield name
        if name == "a":
            split_twice.set()  # its third advance: the closed crew's split is done
        while not stop.is_set():
            if name in "def":
                # The open crew waits too (I/O): busy in Python, it would keep the process
                # on its CPU, and a slow round is then one that waited for the GIL, which
                # splitting does not help (crew._busy).
                time.sleep(0.001)
            yield name
        return name

    flushes = Flushes()

    async def main() -> dict[str, tuple[bool, Any]]:
        loop = asyncio.get_running_loop()
        # The loop is held below while the splits happen: no look interferes, and only
        # rounds past round_s split.
        crews = Crews(Workers(idle_s=2.0, name="intloom-step-test-crew-remerge"), loop,
                      flushes, round_s=0.03)
        futures = {name: loop.create_future() for name in "abcdef"}

        def done_of(name: str) -> Any:
            return lambda ok, value: loop.call_soon_threadsafe(
                futures[name].set_result, (ok, value))

        # Round 1: a, b and c take 30 ms together, so d, e and f become the open crew;
        # round 2 of the closed crew: a alone takes 40 ms, so b and c are split off it.
        waits = {"a": (0.01, 0.04), "b": (0.01,), "c": (0.01,)}
        for name in "abcdef":
            crews.join(steps(name, waits.get(name, ())), done_of(name))
        try:
            assert split_twice.wait(10), "the closed crew's round never split it"
            assert crews.splits == 2, crews.splits
            await asyncio.to_thread(
                eventually, lambda: len(crews._live) == 1 and crews._open in crews._live,
                timeout=5.0, what="every split-off crew to merge back into the open crew")
        finally:
            stop.set()
        return dict(zip(futures, await asyncio.wait_for(asyncio.gather(*futures.values()), 10),
                        strict=True))

    results = asyncio.run(main())
    assert results == {n: (True, n) for n in "abcdef"}


class _OneThread(Workers):
    """Workers that start one thread and then none (a process limit): counts the tries."""

    def __init__(self) -> None:
        super().__init__(idle_s=2.0, name="intloom-step-test-crew-limit")
        self.tries = 0

    def submit(self, job: Any) -> None:
        self.tries += 1
        if self.tries > 1:
            raise NoThread("can't start new thread")
        super().submit(job)


@pytest.mark.timeout(30)
def test_a_split_with_no_thread_to_start_is_not_retried_every_tick() -> None:
    """Under a process limit a split finds no thread: the crew's thread goes on driving
    both Runs, and the loop's look must not try to start a thread every tick while the
    Step stays blocked."""
    release = threading.Event()
    workers = _OneThread()

    def steps(name: str, block: bool) -> Generator[str, None, str]:
        yield name
        if block:
            assert release.wait(10)
        yield name
        return name

    async def main() -> dict[str, tuple[bool, Any]]:
        crews = Crews(workers, asyncio.get_running_loop(), Flushes())
        looks: list[int] = []
        look = crews._look

        def counted() -> None:
            looks.append(workers.tries)
            look()

        crews._look = counted  # type: ignore[method-assign]
        task = asyncio.ensure_future(_drive(crews, {"a": steps("a", True),
                                                    "b": steps("b", False)}))
        # The split is tried (and refused) once the Step has run for the budget; then the
        # look comes every tick while the Step stays blocked.
        await asyncio.to_thread(
            eventually, lambda: sum(1 for t in looks if t >= 2) >= 20, what="20 looks")
        tries = workers.tries
        release.set()
        results = await task
        assert tries == 2, f"{tries - 1} threads were tried for one blocked Step"
        return results

    assert asyncio.run(main()) == {"a": (True, "a"), "b": (True, "b")}


class _BusyClock:
    """A stand-in for the ``time`` module crews read: every reading is 1 ms later, and the
    process's CPU time keeps pace with the wall clock -- a process whose threads were busy
    in Python all along (the loop with async Runs, another crew), so a crew's slow round
    waited for the GIL."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._now = 1000.0

    def _tick(self) -> float:
        with self._lock:
            self._now += 0.001
            return self._now

    def perf_counter(self) -> float:
        return self._tick()

    def process_time(self) -> float:
        return self._tick()


@pytest.mark.timeout(30)
def test_a_round_slow_for_want_of_the_gil_is_not_split(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A crew whose rounds are slow because its thread waits for the GIL is not split:
    another thread would only wait too, and flush on its own. A host with busy async and
    sync Runs split its crews over and over (141-166 splits in one of 300 Steps per Run, at
    half the Steps/s). Only rounds that waited outside the GIL (the process off its CPUs:
    I/O, a lock, a sleep) are split, as in the test above."""
    from intloom.executor import crew as crew_module

    monkeypatch.setattr(crew_module, "time", _BusyClock())
    flushes = Flushes()

    async def main() -> tuple[dict[str, tuple[bool, Any]], int]:
        # The look's budget out of the way: only the round's budget could split.
        crews = Crews(Workers(idle_s=2.0, name="intloom-step-test-crew-gil"),
                      asyncio.get_running_loop(), flushes, budget_s=60.0, round_s=0.002)
        results = await _drive(crews, {f"r{i}": _steps(f"r{i}", 5) for i in range(8)})
        return results, crews.splits

    results, splits = asyncio.run(main())
    assert all(ok for ok, _ in results.values())
    assert splits == 0, f"{splits} splits of crews that only waited for the GIL"
    assert len(flushes.threads) == 1
    assert flushes.rounds == [[f"r{i}" for i in range(8)]] * 5
