"""Finding a host's ``service_stopping`` line from the end of its log (``last_line``).

A stop logs one ``run_suspended`` line per loaded Run after it: with ~1,450 Runs the line
left the 256 KiB tail that used to be searched, and status, doctor and start took a host
that was shutting down for a hung one.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from intloom.client import lifecycle
from intloom.client.hostlog import STOPPING, log_says_stopping
from intloom.host.metadata import METADATA_VERSION, ServiceInfo
from intloom.host.toolcalls import LOG_TAIL, last_line
from intloom.project import ProjectPaths

pytestmark = pytest.mark.timeout(60)

NEEDLE = b"NEEDLE"


def naive(data: bytes, needle: bytes, limit: int) -> bytes | None:
    """The last line holding ``needle`` of those that begin in the last ``limit`` bytes."""
    floor, begins, found = len(data) - limit, 0, None
    for line in data.split(b"\n"):
        if begins >= floor and needle in line:
            found = line
        begins += len(line) + 1
    return found


@settings(max_examples=500, deadline=None)
@given(lines=st.lists(st.sampled_from([b"", b"a", b"xNEEDLEy", b"NEEDLE", b"b" * 40,
                                       b"NEED", b"LE", b"c" * 9 + b"NEEDLE"]),
                      max_size=30),
       end=st.sampled_from([b"", b"\n"]), chunk=st.integers(1, 64),
       limit=st.integers(1, 1200))
def test_the_last_line_holding_the_needle_is_found_across_any_chunk_size(
    tmp_path_factory: pytest.TempPathFactory, lines: list[bytes], end: bytes, chunk: int,
    limit: int,
) -> None:
    path = tmp_path_factory.mktemp("log") / "log.jsonl"
    data = b"\n".join(lines) + end
    path.write_bytes(data)
    assert last_line(path, NEEDLE, chunk=chunk, limit=limit) == naive(data, NEEDLE, limit)


def test_a_line_beginning_exactly_at_the_limit_is_read(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"xx\nNEEDLE\n")
    assert last_line(path, NEEDLE, chunk=4, limit=7) == b"NEEDLE"  # it said None
    assert last_line(path, NEEDLE, chunk=4, limit=6) is None


def test_a_line_longer_than_many_chunks_is_read_once(tmp_path: Path) -> None:
    """Each read used to copy the whole line read so far: 64 MiB without a line break took
    6.7 s."""
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"NEEDLE" + b"x" * (8 * 1024 * 1024) + b"\nshort\n")
    line = last_line(path, NEEDLE, chunk=4096)
    assert line is not None and len(line) == 6 + 8 * 1024 * 1024
    with pytest.raises(ValueError, match="chunk must be positive"):
        last_line(path, NEEDLE, chunk=0)


def test_a_line_past_the_limit_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"NEEDLE one\n" + b"x" * 99 + b"\n")
    assert last_line(path, NEEDLE, chunk=7, limit=100) is None
    assert last_line(path, NEEDLE, chunk=7, limit=111) == b"NEEDLE one"


def test_no_link_fifo_or_missing_file_is_read(tmp_path: Path) -> None:
    target = tmp_path / "real.jsonl"
    target.write_bytes(b"NEEDLE\n")
    (tmp_path / "link.jsonl").symlink_to(target)
    os.mkfifo(tmp_path / "fifo.jsonl")  # an open of it would wait for a writer for ever
    for name in ("link.jsonl", "fifo.jsonl", "missing.jsonl"):
        assert last_line(tmp_path / name, NEEDLE) is None
    assert last_line(None, NEEDLE) is None
    assert last_line(target, NEEDLE) == b"NEEDLE"


def stop_of_many_runs(log: Path, runs: int) -> None:
    """A host log as a stop of ``runs`` loaded Runs leaves it midway: its
    ``service_stopping`` line, then a ``run_suspended`` line per Run."""
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000+00:00", time.gmtime())
    lines = [b'{"time":"%s","level":"info","event":"service_ready","port":1}' % now.encode(),
             b'{"time":"%s","level":"info","event":"service_stopping","reason":"signal",'
             b'"within":120.0}' % now.encode()]
    lines += [b'{"time":"%s","level":"info","event":"run_suspended","runId":"RUN-%032d",'
              b'"status":"waiting","at":"%s"}' % (now.encode(), n, now.encode())
              for n in range(runs)]
    log.write_bytes(b"\n".join(lines) + b"\n")


def test_a_stop_of_thousands_of_runs_is_still_a_stop(tmp_path: Path) -> None:
    paths = ProjectPaths(tmp_path)
    paths.logs.mkdir(parents=True)
    log = paths.logs / "LOG-2026-12-04T00-00-00-000Z.jsonl"
    stop_of_many_runs(log, 3_000)
    assert log.stat().st_size > 2 * LOG_TAIL  # the line is well out of the old tail
    info = ServiceInfo(version=METADATA_VERSION, project_root=str(tmp_path), pid=1,
                       create_time=1.0, instance_id="i", port=1,
                       started_at="2026-12-04T00:00:00.000Z", package_version="0.1.0",
                       protocol_version=2, log_file=log.name)
    assert log_says_stopping(paths, info)
    # A second stop reads how long the first may take from the same line.
    until = lifecycle._logged_until(log)
    assert until is not None and 110 < until - time.monotonic() <= 120

    log.write_bytes(log.read_bytes().replace(STOPPING, b'"event":"service_ready"'))
    assert not log_says_stopping(paths, info)
    assert lifecycle._logged_until(log) is None


def test_the_evidence_log_passes_over_starts_that_ended_before_they_restored(
        tmp_path: Path) -> None:
    """The Tool call a crash cut is named from the last host's log. Starts that failed (or
    were killed) before they restored wrote newer logs with none of it: each is passed over,
    up to 256 of them (a supervisor's retries), but never a log that restored, nor one too
    long to be a bare start's."""
    from intloom.host.toolcalls import _PASSED_MAX, evidence_log

    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    tool = b'{"event":"run_tool_started","runId":"RUN-1","toolCallId":"tc-1"}\n'

    def log(n: int, body: bytes) -> str:
        name = f"LOG-20261206T{n // 60000:02d}{n // 1000 % 60:02d}00{n % 1000:03d}Z.jsonl"
        (logs / name).write_bytes(b'{"event":"log_opened"}\n' + body)
        return name

    crashed = log(1, b'{"event":"restore_finished"}\n' + tool)
    failed = b'{"event":"service_start_failed"}\n{"event":"log_closed"}\n'
    for n in range(2, 2 + _PASSED_MAX - 1):
        log(n, failed)
    log(2 + _PASSED_MAX, b"")  # killed as it began: nothing after log_opened
    found = evidence_log(logs)
    assert found is not None and found[0] == crashed and b"tc-1" in found[1], found
    newest = log(3 + _PASSED_MAX, failed)  # one more than it passes over: the newest
    assert evidence_log(logs) == (newest, b"")
    assert evidence_log(logs, before=newest)[0] == crashed  # type: ignore[index]
    # Too long for a start that never restored (its imports logged much): taken.
    long = log(4 + _PASSED_MAX, b'{"event":"workflow_load_failed"}\n' * 3000)
    assert evidence_log(logs)[0] == long  # type: ignore[index]
