from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Project, make_project, reaped


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
