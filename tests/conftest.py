from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Project, make_project


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    """A copy of fixtures/projects/basic; every host started for it is killed at teardown."""
    proj = make_project(tmp_path)
    try:
        yield proj
    finally:
        proj.track_host()
        proj.reap()


@pytest.fixture
def soak_project(tmp_path: Path) -> Iterator[Project]:
    """A copy of fixtures/projects/soak (Workflows that count what they run); reaped likewise."""
    proj = make_project(tmp_path, "soak")
    try:
        yield proj
    finally:
        proj.track_host()
        proj.reap()
