"""A test's teardown reaps what it started: the hosts it tracked, and every process still
running with ``--project ROOT`` (a Pool worker a Step forked has its host's command line;
one whose host died first was left running after a failed test)."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import Project, eventually, pid_alive, processes_with

pytestmark = pytest.mark.timeout(60)

_SLEEPER = "import time; time.sleep(120)"


def _running_for(pid: int, root: Path) -> bool:
    return pid in processes_with(b"--project\0" + bytes(root) + b"\0")


def test_reap_kills_a_process_left_with_the_projects_root_and_spares_another(
        tmp_path: Path) -> None:
    root, other = tmp_path / "proj", tmp_path / "proj2"
    stray = subprocess.Popen([sys.executable, "-c", _SLEEPER, "--project", str(root)])
    spared = subprocess.Popen([sys.executable, "-c", _SLEEPER, "--project", str(other)])
    try:
        for path, process in ((root, stray), (other, spared)):  # once each has its own line
            eventually(functools.partial(_running_for, process.pid, path),
                       what=f"{path}'s process")
        Project(root).reap()
        assert not pid_alive(stray.pid)  # reaped too (pid_alive collects a child's status)
        assert pid_alive(spared.pid)  # another project's (a prefix of its name is no match)
    finally:
        for process in (stray, spared):
            process.kill()
            process.wait()
