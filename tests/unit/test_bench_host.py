"""The bench harness's ``Host`` reaps every host it started, also one whose ``intloom start``
timed out: that start was killed before it (or the host) named the host anywhere, and the
host, in a session of its own, outlived the run that started it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.bench_common import Host
from tests.helpers import eventually, pid_alive, processes_with

# A Workflow module whose import never ends: the host hangs while it loads Workflows.
HANG = "\nimport time as _time\n\n_time.sleep(300)\n"


def _hosts_of(root: Path) -> list[int]:
    """Host processes serving ``root``, found without the harness's help."""
    return processes_with(b"intloom.host", b"--project\0" + bytes(root) + b"\0")


@pytest.mark.timeout(90)
def test_close_kills_a_host_whose_start_timed_out(tmp_path: Path) -> None:
    host = Host.create(tmp_path)
    with (host.root / "workflows" / "bench.py").open("a") as fh:
        fh.write(HANG)
    host.timeout = 8.0  # the harness's limit on one command, far below start's own 300 s
    hung: list[int] = []
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            host.start()
        hung = eventually(lambda: _hosts_of(host.root), what="the hung host")
        assert not (host.root / ".intloom" / "service.json").exists()  # it never served
        host.close()
        assert [pid for pid in hung if pid_alive(pid)] == []
    finally:
        for pid in hung:  # the test's own reaping, should close have failed
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(90)
def test_close_leaves_alone_a_process_that_now_has_a_pid_the_files_name(tmp_path: Path) -> None:
    """A killed host's files keep naming its pid, and close killed every pid they named:
    once the pid is reused, an unrelated process. A named pid is killed only if it carries
    the Host's tag or is still the process its file recorded (its create time)."""
    import psutil

    host = Host.create(tmp_path)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        host.start()
        killed = host.pid()
        host.kill()  # its service.json and service.lock stay, as a crash leaves them
        # The pid reused: the files name a process created after the one they recorded.
        born = psutil.Process(other.pid).create_time()
        state = host.root / ".intloom"
        for name in ("service.json", "service.lock"):
            owner = json.loads((state / name).read_text())
            assert owner["pid"] == killed
            owner.update(pid=other.pid, createTime=born - 60.0)
            (state / name).write_text(json.dumps(owner))
        host.cli("status", check=False)  # the harness reads the files after each command
        assert other.pid in host.pids
        host.close()
        assert other.poll() is None, "close killed a process it never started"
        assert pid_alive(other.pid)
    finally:
        other.kill()
        other.wait(timeout=10)
