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
    # Both ended: their slices are free again, and the next worker gets the first one back.
    third = _worker(tmp_path)
    try:
        assert _ports(third) == mine
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
