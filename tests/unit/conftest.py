"""Fixtures shared by unit-test modules."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def logs_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project with an empty ``.intloom/logs`` (as a host makes it), the current directory:
    the logs the tests write there are what ``intloom logs`` reads."""
    (tmp_path / "intloom.toml").write_text('workflows = ["workflows/example.py"]\n')
    (tmp_path / ".intloom" / "logs").mkdir(parents=True, mode=0o700)
    monkeypatch.chdir(tmp_path)
    return tmp_path
