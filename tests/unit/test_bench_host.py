"""The bench harness's ``Host`` reaps every host it started, also one whose ``intloom start``
timed out: that start was killed before it (or the host) named the host anywhere, and the
host, in a session of its own, outlived the run that started it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
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
