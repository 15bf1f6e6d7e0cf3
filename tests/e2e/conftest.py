from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conformance_harness import new_project
from tests.helpers import Project, reaped


@pytest.fixture
def proj(tmp_path: Path) -> Iterator[Project]:
    """A copy of the conformance fixture project; its hosts are reaped at teardown."""
    yield from reaped(new_project(tmp_path, "proj"))
