"""The host's worker threads for sync user code (executor/workers.py): a parked worker takes
the next job, a job that blocks never holds up another (each running job has its own
thread), and a worker parked for its idle time ends. A Relay runs one loop turn's calls on
one worker and hands their results back together, spills a batch held up by a call that
blocks or calls that each wait a little, starts a batch only once its gate has passed it,
and spreads a batch once, one helper per call left, however many find it due."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from intloom.executor.workers import Batch, Inbox, Relay, Workers
from tests.helpers import eventually


def _alive(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


def test_a_parked_worker_takes_the_next_job_and_a_blocked_one_never_holds_up_another() -> None:
    name = "intloom-step-test-reuse"
    workers = Workers(idle_s=2.0, name=name)  # parked long enough for the next job
    ran: list[int] = []
    done = threading.Event()

    def note() -> None:
        ran.append(threading.get_ident())
        done.set()

    workers.submit(note)
    assert done.wait(10)
    # Parked once its job is done: the next job is its own, no new thread.
    eventually(lambda: workers._unpromised, what="the worker to park")
    done.clear()
    workers.submit(note)
    assert done.wait(10)
    assert ran[0] == ran[1] and len(_alive(name)) == 1
    # A job that blocks until a later one ran: the later one must get a thread of its own.
    eventually(lambda: workers._unpromised, what="the worker to park")
    later, blocked_done = threading.Event(), threading.Event()

    def blocked() -> None:
        later.wait(10)
        blocked_done.set()

    workers.submit(blocked)
    workers.submit(later.set)
    assert blocked_done.wait(10) and later.is_set()
    assert len(_alive(name)) == 2


def test_a_worker_parked_for_its_idle_time_ends() -> None:
    name = "intloom-step-test-idle"
    workers = Workers(idle_s=0.05, name=name)
    done = threading.Event()
    workers.submit(done.set)
    assert done.wait(10)
    eventually(lambda: not _alive(name), what="the idle worker to end")
    # A job after that starts a new worker, which runs it.
    again = threading.Event()
    workers.submit(again.set)
    assert again.wait(10)


class _CountingInbox(Inbox):
    """Counts the drains that reached the loop (each is one wake-up of it)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.drains = 0

    def _drain(self) -> None:
        self.drains += 1
        super()._drain()


def _job(inbox: Inbox, future: asyncio.Future[Any], value: Any, ran: list[int],
         before: Callable[[], object] = lambda: None) -> Callable[[Any], None]:
    def job(batch: Any) -> None:
        ran.append(threading.get_ident())
        before()
        inbox.put(future, True, value, None, batch)
    return job


def _on_loop(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), timeout=20))


def test_a_relay_runs_one_turns_calls_on_one_worker_and_hands_them_back_together() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        inbox = _CountingInbox(loop)
        # No look at the batch within the test: it must end on its own.
        relay = Relay(inbox, Workers(idle_s=2.0, name="intloom-step-test-relay"), tick_s=60,
                      budget_s=60)
        futures = [loop.create_future() for _ in range(8)]
        ran: list[int] = []
        for i, future in enumerate(futures):
            relay.submit(_job(inbox, future, i, ran))
        assert await asyncio.gather(*futures) == list(range(8))
        assert len(ran) == 8 and len(set(ran)) == 1  # one worker ran them all, in turn
        assert inbox.drains == 1  # and their results woke the loop once

    _on_loop(main)


def test_a_relay_call_that_blocks_never_holds_up_the_others_of_its_batch() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        inbox = Inbox(loop)
        relay = Relay(inbox, Workers(idle_s=2.0, name="intloom-step-test-spill"), tick_s=0.01)
        futures = [loop.create_future() for _ in range(5)]
        release = threading.Event()
        ran: list[int] = []
        for i, future in enumerate(futures):
            # The middle call blocks until the test has seen every other result: those
            # before it were held for the batch, those after it had not started.
            wait = (lambda: release.wait(20)) if i == 2 else (lambda: None)
            relay.submit(_job(inbox, future, i, ran, wait))
        others = [f for i, f in enumerate(futures) if i != 2]
        assert await asyncio.gather(*others) == [0, 1, 3, 4]
        assert not futures[2].done()
        release.set()
        assert await futures[2] == 2

    _on_loop(main)


class _CountingWorkers(Workers):
    """Counts the jobs handed to workers."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.submitted = 0

    def submit(self, job: Callable[[], None]) -> None:
        self.submitted += 1
        super().submit(job)


def test_a_relay_starts_its_batch_only_once_the_gate_has_passed_it() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        inbox = Inbox(loop)
        workers = _CountingWorkers(idle_s=2.0, name="intloom-step-test-gate")
        seen: list[Any] = []
        called, passed = asyncio.Event(), asyncio.Event()
        gates: set[asyncio.Task[None]] = set()

        def gate(tags: list[Any], go: Callable[[], None]) -> None:
            seen.extend(tags)
            seen.append(workers.submitted)  # nothing handed to a worker yet
            called.set()

            async def later() -> None:  # what the store's flush is to the real gate
                await passed.wait()
                go()
                go()  # a second go must not hand the batch over again

            gates.add(loop.create_task(later()))

        relay = Relay(inbox, workers, gate=gate, tick_s=60, budget_s=60)  # never spread
        futures = [loop.create_future() for _ in range(3)]
        ran: list[int] = []
        for i, future in enumerate(futures):
            relay.submit(_job(inbox, future, i, ran), tag=f"call-{i}")
        await called.wait()  # once this turn of the loop is over
        assert seen == ["call-0", "call-1", "call-2", 0]
        assert workers.submitted == 0 and ran == []
        passed.set()
        assert await asyncio.gather(*futures) == [0, 1, 2]
        assert len(ran) == 3 and workers.submitted == 1

    _on_loop(main)


def _meeting(relay: Relay, inbox: Inbox, loop: asyncio.AbstractEventLoop, n: int,
             first: int = 0) -> tuple[list[asyncio.Future[Any]], list[int]]:
    """``first`` calls that return at once, then ``n`` calls that each wait until all ``n``
    run at once: one worker running them in turn would wait for ever (here, until the
    barrier's timeout breaks it). Also returns the threads the calls ran on, in order."""
    barrier = threading.Barrier(n, timeout=15)
    futures = [loop.create_future() for _ in range(first + n)]
    ran: list[int] = []
    for i, future in enumerate(futures):
        relay.submit(_job(inbox, future, i, ran, (lambda: None) if i < first else barrier.wait))
    return futures, ran


def test_a_relay_batch_that_has_run_its_budget_gives_the_calls_left_workers_of_their_own(
        ) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        inbox = Inbox(loop)
        # No look; a budget of zero: once its first call has run, the worker spreads the
        # batch before it takes the next.
        workers = _CountingWorkers(idle_s=2.0, name="intloom-step-test-budget")
        relay = Relay(inbox, workers, tick_s=60, budget_s=0.0)
        futures, ran = _meeting(relay, inbox, loop, 3, first=1)
        assert await asyncio.gather(*futures) == [0, 1, 2, 3]
        assert len(set(ran[1:])) == 3  # the three waiting calls ran at once, one per thread
        assert workers.submitted == 1 + 3  # the batch's worker, then one per call left

    _on_loop(main)


def test_the_loop_spreads_a_relay_batch_whose_running_call_has_run_its_budget() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        inbox = Inbox(loop)
        # A budget the worker never reaches between calls (its first call blocks): only
        # the loop's look can see the call running and spread the others.
        workers = _CountingWorkers(idle_s=2.0, name="intloom-step-test-look")
        relay = Relay(inbox, workers, tick_s=0.001, budget_s=0.005)
        futures, _ran = _meeting(relay, inbox, loop, 4)
        assert await asyncio.gather(*futures) == [0, 1, 2, 3]
        assert workers.submitted == 1 + 3  # the batch's worker (blocked), then the rest

    _on_loop(main)



_SPREAD_SLOT: Any = Batch.__dict__["spread"]  # the slot's descriptor, under the property


class _SlowToSee(Batch):
    """A batch whose ``spread`` flag, read while still False, lets other threads run before
    the reader goes on: it widens the window between a check and a set to one they all
    fall in, as a thread switch at the wrong bytecode would."""

    @property
    def spread(self) -> bool:
        value: bool = _SPREAD_SLOT.__get__(self)
        if not value:
            time.sleep(0.005)
        return value

    @spread.setter
    def spread(self, value: bool) -> None:
        _SPREAD_SLOT.__set__(self, value)


def test_a_relay_batch_found_due_by_several_threads_at_once_gets_one_helper_per_call_left(
        ) -> None:
    """The batch's worker and the loop's look can find a batch due at the same moment;
    only one of them may spread it, or each call left gets a helper per spreader."""
    async def main() -> None:
        loop = asyncio.get_running_loop()
        inbox = Inbox(loop)
        workers = _CountingWorkers(idle_s=2.0, name="intloom-step-test-race")
        relay = Relay(inbox, workers, tick_s=60, budget_s=60)
        left, racers = 3, 4
        batch = _SlowToSee()
        futures = [loop.create_future() for _ in range(left)]
        ran: list[int] = []
        for i, future in enumerate(futures):
            batch.jobs.append(_job(inbox, future, i, ran))
        start = threading.Barrier(racers, timeout=10)
        spread: list[bool] = []

        def race() -> None:
            start.wait()
            spread.append(relay._spread(batch, on_loop=False))

        threads = [threading.Thread(target=race) for _ in range(racers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert await asyncio.gather(*futures) == list(range(left))
        assert spread == [True] * racers
        assert workers.submitted == left

    _on_loop(main)
