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


@pytest.mark.timeout(30)
def test_every_name_a_host_gives_its_log_is_a_host_logs_name(tmp_path: Path) -> None:
    """Readers pick the last host's log by ``LOG_NAME`` (a stray ``LOG-copy.jsonl`` sorted
    after every host's): each name a host gives its log must match it, those of hosts
    started in the same millisecond too, and a name no host gives must not."""
    from intloom.project import LOG_NAME

    logs = tmp_path / "logs"
    opened = [HostLog.open(logs) for _ in range(3)]  # likely one millisecond: names bumped
    try:
        names = sorted(log.path.name for log in opened)
    finally:
        for log in opened:
            log.close()
    assert len(set(names)) == 3, names
    assert all(LOG_NAME.fullmatch(name) for name in names), names
    for stray in ("LOG-copy.jsonl", "LOG-link.jsonl", f"{names[0]}.bak",
                  names[0].replace(".jsonl", "-copy.jsonl"), "LOG-20261203T1411000Z.jsonl"):
        assert not LOG_NAME.fullmatch(stray), stray


def test_a_line_holding_a_lone_surrogate_is_written_with_it_escaped(tmp_path: Path) -> None:
    """A field with a lone surrogate (a Workflow's version, a message through os.fsdecode)
    raised UnicodeEncodeError out of the write: at start-up that failed the host's start."""
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    log = HostLog.open(logs)
    assert log.info("workflow_loaded", version="1\udcff",
                    nested={"k\udcfe": ["a\udcfd", 2]}, path=Path("p\udcfc"),
                    names={"s\udcfb"}) is True
    log.close()
    line = json.loads(log.path.read_bytes().splitlines()[1])
    assert (line["version"], line["nested"]) == ("1\\udcff", {"k\\udcfe": ["a\\udcfd", 2]})
    assert (line["path"], line["names"]) == ("p\\udcfc", ["s\\udcfb"])


@pytest.mark.timeout(30)
def test_a_log_opened_after_the_clock_went_back_sorts_after_the_newest(
        tmp_path: Path) -> None:
    """Readers take the newest name for the last host's log. A host started while the clock
    was ahead (then corrected) named its log in the future, every later host's name sorted
    before it, and the log of the next host that crashed was passed over: doctor explained
    no crash, and the Tool call it cut was left out of RUN_INTERRUPTED."""
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    ahead = logs / "LOG-20991231T235959999Z.jsonl"  # a host whose clock was ahead
    ahead.write_bytes(b"")
    first = HostLog.open(logs)
    second = HostLog.open(logs)
    try:
        names = [first.path.name, second.path.name]
    finally:
        first.close()
        second.close()
    assert names == ["LOG-21000101T000000000Z.jsonl", "LOG-21000101T000000001Z.jsonl"], names
    stray = logs / "LOG-99991231T235959999Z.jsonl"  # no later name exists: the clock's
    stray.write_bytes(b"")
    third = HostLog.open(logs)
    third.close()
    assert third.path.name.startswith("LOG-20"), third.path.name


@pytest.mark.timeout(30)
def test_a_name_taken_at_the_last_millisecond_of_a_second_moves_to_the_next_second(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two hosts that both took the newest name plus a millisecond collide, and the second
    moved on within the second: ``.999`` to ``.000`` of the same second, a name sorting
    before both."""
    from datetime import UTC, datetime

    from intloom.host import logfile

    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    (logs / "LOG-20991231T235958999Z.jsonl").write_bytes(b"")  # the other host's, just taken
    monkeypatch.setattr(logfile, "_after_the_newest",  # what both computed
                        lambda _d, _m: datetime(2099, 12, 31, 23, 59, 58, 999_000, tzinfo=UTC))
    opened = HostLog.open(logs)
    opened.close()
    assert opened.path.name == "LOG-20991231T235959000Z.jsonl", opened.path.name
