"""``intloom logs`` over a long host log: a host writes one log for its whole life, so a
host that ran for months leaves hundreds of MB. The reader took the rest of the file in one
read, joined and split it, and held it several times over (a 13 MB log took ``intloom logs
RUN`` to 63 MB); it now reads and emits a chunk at a time. Real host, real files, real CLI."""

from __future__ import annotations

import json
import os
import tracemalloc

import pytest

from intloom.cli.logtail import LogTail
from tests.helpers import Project, ok, snapshot_files

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

LINES = 40_000


def _record(n: int) -> dict[str, object]:
    return {"time": "2000-01-01T00:00:00.000Z", "level": "info", "event": "run_terminal",
            "runId": f"RUN-20000101T000000000Z-{n:021d}", "status": "completed"}


def test_a_long_log_is_read_a_chunk_at_a_time(project: Project) -> None:
    ok(project.cli("start", "--json"))
    ok(project.cli("stop", "--json"))
    logs = project.state / "logs"
    # An earlier host's closed log (sorted first by its name), long: ~6 MB.
    old = logs / "LOG-20000101T000000000Z.jsonl"
    old.write_bytes(b"".join(json.dumps(_record(n)).encode() + b"\n" for n in range(LINES)))
    os.chmod(old, 0o400)
    size = old.stat().st_size
    assert size > 5_000_000
    before = snapshot_files(project.state)

    count, kept = [0], []

    def emit(line: str) -> None:  # holds one line, so that the peak is the reader's
        count[0] += 1
        if count[0] == LINES:
            kept.append(line)

    tail = LogTail(logs, emit, all_files=True)
    tracemalloc.start()
    try:
        tail.pump()
        tail.finish()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count[0] > LINES and [json.loads(line) for line in kept] == [_record(LINES - 1)]
    # What is held at once is a chunk and its lines, not the file.
    assert peak < size // 10, (peak, size)

    wanted = _record(LINES // 2)["runId"]
    text = project.cli("logs", "--all", str(wanted))
    assert text.code == 0, text.stderr
    assert text.stdout.count(str(wanted)) == 1, text.stdout[-2000:]
    streamed = project.cli("logs", "--all", "--json")
    assert streamed.code == 0, streamed.stderr
    events = [json.loads(line) for line in streamed.stdout.splitlines()]
    assert [e for e in events if e.get("runId") == wanted] == [_record(LINES // 2)]
    assert len([e for e in events if e.get("event") == "run_terminal"]) == LINES
    assert snapshot_files(project.state) == before
