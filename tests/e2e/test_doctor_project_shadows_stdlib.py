"""A project whose root holds a module named as one of the standard library's (a
``logging.py``, an ``asyncio.py``): loading its Workflows puts the root first on
``sys.path``, and doctor, which reads the store after that load, imported the project's
module in the standard library's place and failed CLI_INTERNAL_ERROR, exit 70, reporting
nothing. Real CLI, real project."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_runner import FRESH_ENV
from tests.helpers import Project, make_project, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(make_project(tmp_path))


@pytest.mark.parametrize("name", ["logging", "asyncio", "ssl", "concurrent"])
def test_doctor_reports_on_a_project_with_a_module_named_as_the_stdlib(
        project: Project, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    (project.root / f"{name}.py").write_text("VALUE = 1  # a module of the project\n")
    # A fresh interpreter: the test's fork server has the standard library imported already.
    monkeypatch.setenv(FRESH_ENV, "1")
    doctor = project.cli("doctor", "--json")
    assert doctor.code == 0, (doctor.code, doctor.stdout, doctor.stderr)
    report = doctor.json
    assert report["health"] == "healthy", report
    assert {c["id"]: c["status"] for c in report["checks"]}["workflows"] == "ok", report
