from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from intloom.host.server import TEST_PORTS_ENV
from tests.helpers import Project, make_project, reaped

# Below the kernel's ephemeral range (32768 up, by default): no port-0 bind or connect there.
_SLICED_PORTS = range(10000, 32768)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, each worker's hosts pick their ports from a slice of their own.
    A host restarted on its project's saved port must find it free; with every worker's
    hosts drawing on the kernel's one ephemeral range, another worker's host could be
    listening there by then (a stray CLI_SERVICE_UNAVAILABLE, now and then)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ...; unset when serial
    if worker is None or TEST_PORTS_ENV in os.environ:
        return
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    span = len(_SLICED_PORTS) // count
    # A worker started in place of one that crashed is named past the count (gw2, gw3, ...
    # for two): it takes the slice of the one it replaces, never one above 32767.
    first = _SLICED_PORTS.start + int(worker.removeprefix("gw")) % count * span
    os.environ[TEST_PORTS_ENV] = f"{first}-{first + span - 1}"


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
