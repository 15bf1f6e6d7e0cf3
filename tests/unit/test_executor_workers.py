"""The host's worker threads for sync user code (executor/workers.py): a parked worker takes
the next job, a job that blocks never holds up another (each running job has its own
thread), and a worker parked for its idle time ends."""

from __future__ import annotations

import threading

from intloom.executor.workers import Workers
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
