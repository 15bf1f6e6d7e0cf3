"""intloom runs on Linux only (POSIX file locks, /proc, fdatasync): on another OS every
command failed CLI_INTERNAL_ERROR, exit 70, "report it". It says what is supported."""

from __future__ import annotations

import os
import sys

import pytest

from intloom.cli import entry, exit_codes

pytestmark = pytest.mark.timeout(10)


def test_another_os_is_told_intloom_runs_on_linux(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(os, "name", "nt")
    monkeypatch.setattr(sys, "platform", "win32")
    with pytest.raises(SystemExit) as ended:
        entry.run()
    assert ended.value.code == exit_codes.FAILURE
    err = capsys.readouterr().err
    assert err.startswith("Failure · CLI_PLATFORM_UNSUPPORTED: intloom runs on Linux"), err
    assert "not on win32" in err and "WSL" in err, err
