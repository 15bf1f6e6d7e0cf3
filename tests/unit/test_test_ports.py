"""The suite's port slices: each pytest-xdist worker's hosts bind ports from a slice that no
other live test process holds, so two suites running at once (two clones) never share one.
The slice was chosen by the worker's number alone, so both suites' gw0 had the same ports.
Real worker processes run the suite's own pytest_configure here, as xdist starts them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from intloom.host.server import TEST_PORTS_ENV
from tests.helpers import REPO

# A worker: configure as xdist's gw0 of 2 would, print the ports, hold them until stdin ends.
WORKER = f"""
import os, sys
from tests.conftest import pytest_configure
pytest_configure(None)
print(os.environ[{TEST_PORTS_ENV!r}], flush=True)
sys.stdin.read()
"""


def _worker(tmp: Path, **extra: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != TEST_PORTS_ENV}
    # TMPDIR: the lock files go under this test's directory, not the running suites'.
    env.update(PYTEST_XDIST_WORKER="gw0", PYTEST_XDIST_WORKER_COUNT="2", TMPDIR=str(tmp),
               **extra)
    return subprocess.Popen([sys.executable, "-c", WORKER], cwd=REPO, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def _ports(worker: subprocess.Popen[str]) -> range:
    assert worker.stdout is not None
    line = worker.stdout.readline()
    assert line, worker.communicate(timeout=20)[1][-2000:]
    low, high = map(int, line.split("-"))
    return range(low, high + 1)


def _end(worker: subprocess.Popen[str]) -> None:
    if worker.poll() is None:
        worker.communicate("", timeout=20)


@pytest.mark.timeout(60)
def test_two_suites_gw0_at_once_get_ports_of_their_own(tmp_path: Path) -> None:
    first, second = _worker(tmp_path), _worker(tmp_path)
    try:
        mine, theirs = _ports(first), _ports(second)
        assert set(mine).isdisjoint(theirs), (mine, theirs)
        for ports in (mine, theirs):
            assert ports.start >= 10000 and ports.stop <= 32768  # below the ephemeral range
            assert len(ports) >= 1000
    finally:
        _end(first)
        _end(second)
    # Both ended: their slices are free again, and the next worker gets the lower one back
    # (the two started together, so either may have taken it).
    third = _worker(tmp_path)
    try:
        assert _ports(third) == min(mine, theirs, key=lambda ports: ports.start)
    finally:
        _end(third)


@pytest.mark.timeout(60)
def test_a_worker_killed_holds_no_slice(tmp_path: Path) -> None:
    first = _worker(tmp_path)
    try:
        held = _ports(first)
        first.kill()
        first.communicate(timeout=20)
        second = _worker(tmp_path)
        try:
            assert _ports(second) == held
        finally:
            _end(second)
    finally:
        _end(first)


@pytest.mark.timeout(60)
def test_ports_given_in_the_environment_are_used_as_given(tmp_path: Path) -> None:
    worker = _worker(tmp_path, **{TEST_PORTS_ENV: "23000-23099"})
    try:
        assert _ports(worker) == range(23000, 23100)
    finally:
        _end(worker)
    assert not (tmp_path / "intloom-test-ports").exists()  # nothing claimed


# Every slice there is, claimed by one process (each claim opens its lock file again, a lock
# of its own), then one more.
EVERY = """
import pytest
from tests.conftest import claim_ports
taken = []
try:
    while True:
        taken.append(claim_ports())
except pytest.UsageError as exc:
    print(" ".join(taken))
    print(exc)
"""


@pytest.mark.timeout(60)
def test_every_slice_is_below_the_ephemeral_range_and_one_too_many_is_refused(
        tmp_path: Path) -> None:
    """However many workers run at once (xdist names a worker started after one crashed
    gw2, gw3, ...), none gets a port in the kernel's ephemeral range (32768 up), where
    connections take theirs; past the last slice the worker is refused, saying why."""
    env = {k: v for k, v in os.environ.items() if k != TEST_PORTS_ENV}
    done = subprocess.run([sys.executable, "-c", EVERY], cwd=REPO, text=True,
                          capture_output=True, timeout=50, env={**env, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    taken, refusal = done.stdout.splitlines()[0], "\n".join(done.stdout.splitlines()[1:])
    slices = [range(int(lo), int(hi) + 1)
              for lo, hi in (item.split("-") for item in taken.split())]
    assert len(slices) >= 2, slices
    ports = [port for ports in slices for port in ports]
    assert len(ports) == len(set(ports)), slices  # disjoint
    assert min(ports) >= 10000 and max(ports) < 32768, slices
    assert f"Every one of the {len(slices)} port slices" in refusal, refusal
    assert TEST_PORTS_ENV in refusal, refusal
