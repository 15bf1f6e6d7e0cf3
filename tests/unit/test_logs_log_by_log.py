"""``intloom logs --all`` reads each log as the log it is: what one log's end left (a fault
dump begun, a torn end of blanks) says nothing of the next log, which a new host began.

A fault dump at the end of one log (its host killed by a fatal signal in native code)
carried into the next: that log's first plain lines (a torn or damaged line) were shown as
``fault_dump``, not ``unreadable_line``, read whole, from the end (``--tail``) or followed.
And an older log's torn end of only blanks (a host killed mid-write) was shown as an
unreadable line, where the same end of the newest log, or a blank line, is skipped.
Real files, the real CLI.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

import intloom.cli.logtail as logtail
from intloom.cli.app import main
from intloom.cli.commands import logs as logs_command
from intloom.cli.render import Renderer

pytestmark = pytest.mark.timeout(60)

OLDER = "LOG-20260101T000000000Z.jsonl"
NEWER = "LOG-20260102T000000000Z.jsonl"
DUMP = (b'{"time": "T0", "level": "info", "event": "run_started"}\n'
        b"Fatal Python error: Segmentation fault\n\n"
        b"Current thread 0x00007f (most recent call first):\n"
        b'  File "/p/workflows/segv.py", line 11 in crash\n')
# A new host's log whose first write was torn (a host killed as it wrote it), then a record.
TORN_FIRST = b'{"time": "T1", "lev\n{"time": "T2", "level": "info", "event": "host_ready"}\n'


def _records(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    code = main(["--json", "logs", *args])
    out, err = capsys.readouterr()
    assert code == 0, (out, err)
    return [json.loads(line) for line in out.splitlines()]


def _events(records: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [(r["event"], r.get("line")) for r in records]


@pytest.mark.parametrize("args", [(), ("--tail", "2"), ("--tail", "6")])
def test_a_fault_dump_ending_one_log_is_not_carried_into_the_next(
    logs_project: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...],
) -> None:
    logs = logs_project / ".intloom" / "logs"
    (logs / OLDER).write_bytes(DUMP)
    (logs / NEWER).write_bytes(TORN_FIRST)
    shown = _events(_records(capsys, "--all", *args))
    assert shown[-2:] == [("unreadable_line", '{"time": "T1", "lev'), ("host_ready", None)]
    if args != ("--tail", "2"):  # the dump itself is still one
        assert shown[-5:-2] == [
            ("fault_dump", "Fatal Python error: Segmentation fault"),
            ("fault_dump", "Current thread 0x00007f (most recent call first):"),
            ("fault_dump", '  File "/p/workflows/segv.py", line 11 in crash')]
    # In text, as in --json.
    assert main(["logs", "--all", *args]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[-2].startswith("- ????? unreadable log line (.intloom/logs/"), text


def test_a_newest_log_torn_as_it_began_is_no_fault_dump_of_the_log_before(
    logs_project: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """The newest log's only line a torn first write, shown as the torn end it is."""
    logs = logs_project / ".intloom" / "logs"
    (logs / OLDER).write_bytes(DUMP)
    (logs / NEWER).write_bytes(b'{"time": "T1", "le')
    for args in ((), ("--tail", "1"), ("--tail", "3")):
        assert _events(_records(capsys, "--all", *args))[-1] == (
            "unreadable_line", '{"time": "T1", "le'), args


@pytest.mark.parametrize("keep", [None, 0, 2])
def test_a_log_followed_into_after_a_fault_dump_starts_outside_one(
    tmp_path: Path, keep: int | None,
) -> None:
    """``--follow`` (``--tail N``: ``keep``) moves on to the log of the host started after
    the crash: its first lines are that log's, not the dump's."""
    logs = tmp_path / ".intloom" / "logs"
    logs.mkdir(parents=True)
    (logs / OLDER).write_bytes(DUMP)
    renderer = Renderer(json_mode=True)
    renderer.stdout = io.StringIO()
    tails: list[logtail.LogTail] = []
    printer = logs_command._printer(renderer, None, tmp_path,
                                    lambda: tails[0].line_at if tails else None, keep)
    tails.append(logtail.LogTail(logs, printer.emit, all_files=False))
    logs_command._backlog(tails[0], printer, keep, follow=True)
    printer.release()
    (logs / NEWER).write_bytes(TORN_FIRST)
    tails[0].pump()
    tails[0].close()
    assert isinstance(renderer.stdout, io.StringIO)
    shown = [json.loads(line) for line in renderer.stdout.getvalue().splitlines()]
    assert _events(shown)[-2:] == [
        ("unreadable_line", '{"time": "T1", "lev'), ("host_ready", None)]


@pytest.mark.parametrize("end", [b"\n  ", b"   ", b" \t ", b"\n\n \r"])
@pytest.mark.parametrize("args", [(), ("--tail", "5"), ("--tail", "1")])
def test_an_older_logs_torn_end_of_blanks_is_skipped_as_a_blank_line_is(
    logs_project: Path, capsys: pytest.CaptureFixture[str], end: bytes, args: tuple[str, ...],
) -> None:
    logs = logs_project / ".intloom" / "logs"
    older = b'{"time": "T0", "level": "info", "event": "a"}\n' + end
    (logs / OLDER).write_bytes(older)
    (logs / NEWER).write_bytes(b'{"time": "T1", "level": "info", "event": "b"}\n')
    shown = _events(_records(capsys, "--all", *args))
    assert shown == [("a", None), ("b", None)][-int(args[-1]) if args else 0:], shown
    # As the newest log's own such end is.
    (logs / NEWER).write_bytes(b'{"time": "T1", "level": "info", "event": "b"}\n' + end)
    assert _events(_records(capsys, "--all", *args)) == shown
    # A torn end with anything else in it is still shown, where it is.
    (logs / OLDER).write_bytes(older + b"x")
    assert ("unreadable_line", end.rsplit(b"\n", 1)[-1].decode() + "x") in _events(
        _records(capsys, "--all", "--tail", "5"))
