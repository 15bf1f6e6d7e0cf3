from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from intloom.host.server import TEST_PORTS_ENV
from tests.helpers import Project, make_project, reaped

# Below the kernel's ephemeral range (32768 up, by default): no port-0 bind or connect there.
_SLICED_PORTS = range(10000, 32768)
# Ports per worker: 22 slices, for the workers of every suite running on this machine at once.
_SLICE = 1024
# The lock file of each slice a worker holds, open for the worker's life: the kernel lets the
# lock go when the worker ends, however it ends.
_HELD: list[int] = []


def claim_ports() -> str:
    """``LO-HI``, a slice of ``_SLICED_PORTS`` no other live test process holds.

    A slice used to be chosen by the worker's number alone, so two suites running at once
    (two clones, two users) gave their gw0s the same ports, and a host restarted on its saved
    port could find the other suite's host there. Each slice now has a lock file under
    ``$TMPDIR/intloom-test-ports/``; the first one free is taken (``flock``, released by the
    kernel when this process ends, so a crashed worker holds nothing).
    """
    locks = Path(tempfile.gettempdir()) / "intloom-test-ports"
    locks.mkdir(mode=0o1777, exist_ok=True)
    with contextlib.suppress(OSError):  # shared by every user's suites; not ours to change
        locks.chmod(0o1777)
    for index in range(len(_SLICED_PORTS) // _SLICE):
        path = locks / f"slice-{index}.lock"
        # Read-only: a lock file another user created is locked all the same.
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o444)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        _HELD.append(fd)
        first = _SLICED_PORTS.start + index * _SLICE
        return f"{first}-{first + _SLICE - 1}"
    raise pytest.UsageError(
        f"Every one of the {len(_SLICED_PORTS) // _SLICE} port slices under {locks} is held "
        "by another running test process (its lock file is locked), so this worker has no "
        f"ports of its own. Let those suites finish, run fewer workers, or set "
        f"{TEST_PORTS_ENV}=LO-HI to choose the ports yourself.")


def _ctrl_c_as_a_terminal_gives_it() -> None:
    """SIGINT back to Python's default when the suite was started with it ignored (``cmd &``
    in a script, ``nohup``-like runners): every host and CLI a test launches inherits an
    ignored SIGINT, a foreground host rightly keeps it so (Host.keep_ignored), and each
    Ctrl-C test waited out its timeout and failed (15 of them, ~5 min). They are written for
    a terminal's Ctrl-C, which is what this gives them; pytest's own Ctrl-C works again too."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C as a terminal gives it (above). Under pytest-xdist, each worker's hosts pick
    their ports from a slice of their own, which no other running suite's worker holds
    (``claim_ports``); ``INTLOOM_TEST_PORTS``, when set, is used instead.
    A host restarted on its project's saved port must find it free; with every worker's
    hosts drawing on the kernel's one ephemeral range, another worker's host could be
    listening there by then (a stray CLI_SERVICE_UNAVAILABLE, now and then)."""
    _ctrl_c_as_a_terminal_gives_it()
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ...; unset when serial
    if worker is None or TEST_PORTS_ENV in os.environ:
        return
    os.environ[TEST_PORTS_ENV] = claim_ports()


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker more than the CPUs this process may run on (pyproject.toml
    caps it): a worker mostly waits on a host, a subprocess or an fdatasync.
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still decides when set, as in xdist's own hook."""
    chosen = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if chosen:
        return int(chosen)
    return len(os.sched_getaffinity(0)) + 1


# The signals whose handling the code under test changes (Ctrl-C, a stop, a hang-up, Ctrl-\\).
_WATCHED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


_Handler = Callable[[int, FrameType | None], Any] | int | None


def _signal_state() -> tuple[list[_Handler], frozenset[int]]:
    handlers: list[_Handler] = [signal.getsignal(s) for s in _WATCHED]
    return handlers, frozenset(signal.pthread_sigmask(signal.SIG_BLOCK, []))


@pytest.fixture(autouse=True)
def _signals_left_as_found() -> Iterator[None]:
    """Fail a test that leaves a signal handler or the main thread's signal mask changed.

    A later test in the same worker inherits them: one left SIGINT handled or blocked, and
    the Ctrl-C test that ran after it in that worker failed ("DID NOT RAISE"), while the
    test that changed them passed. Restored either way, so only the culprit fails."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handlers, mask = _signal_state()
    yield
    now_handlers, now_mask = _signal_state()
    changed = [f"{signal.Signals(s).name}: {before!r} -> {after!r}"
               for s, before, after in zip(_WATCHED, handlers, now_handlers, strict=True)
               if after is not before and after != before]
    for s, before in zip(_WATCHED, handlers, strict=True):
        if before is not None:
            signal.signal(s, before)
    if now_mask != mask:
        changed.append(f"blocked signals: {sorted(mask)} -> {sorted(now_mask)}")
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    if changed:
        pytest.fail("the test left signal handling changed for the tests after it: "
                    + "; ".join(changed), pytrace=False)


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    """A copy of fixtures/projects/basic; every host started for it is killed at teardown."""
    yield from reaped(make_project(tmp_path))


@pytest.fixture
def soak_project(tmp_path: Path) -> Iterator[Project]:
    """A copy of fixtures/projects/soak (Workflows that count what they run); reaped likewise."""
    yield from reaped(make_project(tmp_path, "soak"))


@pytest.fixture
def threads_project(tmp_path: Path) -> Iterator[Project]:
    """A copy of fixtures/projects/threads (a sync ticker that notes which way each Step
    was driven); reaped likewise."""
    yield from reaped(make_project(tmp_path, "threads"))


@pytest.fixture
def asks_project(tmp_path: Path) -> Iterator[Project]:
    """A copy of fixtures/projects/asks (questions with options routed on their ids, then a
    confirmation; neither wait has recover); reaped likewise."""
    yield from reaped(make_project(tmp_path, "asks"))
