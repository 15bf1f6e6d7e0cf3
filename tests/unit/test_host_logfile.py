"""The host log's writes: a line a full disk cuts short is a lost write, not a success."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from intloom.host.logfile import HostLog


def test_a_line_cut_short_is_lost_and_the_next_starts_on_its_own_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A full disk takes what fits and returns the count without an error: the line was
    cut at a block boundary and the host went on as if the cause were in its log."""
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    log = HostLog.open(logs)
    real = os.write
    cuts = [40]
    refusals = [OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))]

    def short_once(fd: int, data: bytes) -> int:  # the disk, full for one line
        if cuts:
            return real(fd, data[:cuts.pop()])
        if refusals:  # the rest of that line: the kernel's reason
            raise refusals.pop()
        return real(fd, data)

    monkeypatch.setattr(os, "write", short_once)
    assert log.error("run_checkpoint_failed", runId="RUN-1", cause="x" * 200) is False
    assert log.failed and log.failure is not None
    assert log.failure.startswith("No space left on device after 40 of "), log.failure
    assert log.info("after", n=1) is True
    log.close()
    lines = log.path.read_bytes().splitlines()
    assert json.loads(lines[0])["event"] == "log_opened"
    assert len(lines[1]) == 40  # what the disk kept of the cut line, alone on its line
    after = json.loads(lines[2])
    assert (after["event"], after["n"]) == ("after", 1)
