"""The host's worker threads for sync user code (executor/workers.py): a parked worker takes
the next job, a job that blocks never holds up another (each running job has its own
thread), and a worker parked for its idle time ends. An Inbox hands results put from
threads to the loop with one wake-up for all that came before the loop drained it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from intloom.executor.workers import Inbox, Workers
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


def test_an_inbox_wakes_the_loop_once_for_results_put_before_it_drains() -> None:
    """Results put from a thread before the loop gets to them are settled by one drain (one
    wake-up of the loop); a result put after that drain wakes it again."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        inbox = _CountingInbox(loop)
        futures = [loop.create_future() for _ in range(5)]
        done = threading.Event()

        def put_all() -> None:
            for i, future in enumerate(futures):
                inbox.put(future, True, i)
            done.set()

        threading.Thread(target=put_all).start()
        assert done.wait(10)  # the loop held here on purpose: it cannot drain meanwhile
        assert await asyncio.gather(*futures) == list(range(5))
        assert inbox.drains == 1
        late = loop.create_future()
        threading.Thread(target=inbox.put, args=(late, False, ValueError("late"))).start()
        with pytest.raises(ValueError, match="late"):
            await late
        assert inbox.drains == 2

    asyncio.run(asyncio.wait_for(main(), timeout=20))
