"""``intloom logs --tail N`` reads the logs' ends, not the logs: it read and decoded every
line of a host's log (which grows for the host's life, 35 ms a MB) to keep its last N.

What it shows is what reading them whole showed, for any contents (a property: torn and
blank lines, CRLF, NUL tails, bytes that are not UTF-8, characters split across the reads,
lines past the cap, fault dumps begun before the tail, several logs, RUN, --follow); and the
bytes it reads, counted through the module's ``os``, are a read's worth, not the log's, and
none is read twice.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import intloom.cli.logtail as logtail
from intloom.cli.app import main
from intloom.cli.commands import logs as logs_command
from intloom.cli.render import Renderer

pytestmark = pytest.mark.timeout(120)

RUN = "RUN-20260101T000000000Z-000000000000000000001"


class _CountingOs:
    """``logtail``'s ``os``: the bytes read from files (by ``read`` or ``pread``, whichever
    the reader uses) are counted, and opening a path of ``refused`` fails as mode 0000 does
    for a user (the tests run as root, whom modes do not bind)."""

    def __init__(self, refused: tuple[Path, ...] = ()) -> None:
        self.bytes_read = 0
        self.refused = {str(path) for path in refused}

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def read(self, fd: int, size: int) -> bytes:
        data = os.read(fd, size)
        self.bytes_read += len(data)
        return data

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        data = os.pread(fd, size, offset)
        self.bytes_read += len(data)
        return data

    def open(self, path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path) in self.refused:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return os.open(path, flags, *args, **kwargs)


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _record(n: int, run_id: str | None = None) -> bytes:
    record = {"time": "2026-01-01T00:00:00.000Z", "level": "info", "event": f"e{n}",
              **({"runId": run_id} if run_id else {})}
    return json.dumps(record).encode() + b"\n"


def _counting(monkeypatch: pytest.MonkeyPatch, *refused: Path) -> _CountingOs:
    counting = _CountingOs(refused)
    monkeypatch.setattr(logtail, "os", counting)
    return counting


@pytest.mark.parametrize("args", [("--tail", "3"), ("--all", "-n", "3"), (RUN, "--tail", "2"),
                                  ("--tail", "0")])
def test_tail_reads_a_blocks_worth_of_a_long_log_not_the_log(
    logs_project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    args: tuple[str, ...],
) -> None:
    logs = logs_project / ".intloom" / "logs"
    older = b"".join(_record(n) for n in range(20_000))
    (logs / "LOG-20260101T000000000Z.jsonl").write_bytes(older)
    newest = logs / "LOG-20260102T000000000Z.jsonl"
    newest.write_bytes(older + _record(1, RUN) + _record(2) + _record(3, RUN) + _record(4))
    assert newest.stat().st_size > 20 * logtail._CHUNK
    whole = _cli(capsys, "--json", "logs", *[a for a in args if a not in ("--tail", "-n")
                                             and not a.isdigit()])
    counting = _counting(monkeypatch)
    code, out, err = _cli(capsys, "--json", "logs", *args)
    # The backwards read of the end, a block: the lines shown are not read again.
    assert counting.bytes_read <= logtail._CHUNK, counting.bytes_read
    n = int(args[-1])
    assert (code, out.splitlines(), err) == (
        whole[0], whole[1].splitlines()[len(whole[1].splitlines()) - n:], whole[2])
    assert out.splitlines()[-1:] == ([] if n == 0 else [_record(4 if RUN not in args else 3,
                                                                None if RUN not in args
                                                                else RUN).decode().strip()])


def test_a_zero_filled_tail_is_shown_cut_without_being_held(
    logs_project: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """A power cut's tail of zeros, with no newline: its start is found by reading back
    through it (there is no other way to know where it starts), a block at a time, and
    what is held of it is its head, as when it is read forward."""
    logs = logs_project / ".intloom" / "logs"
    zeros = 16 * logtail._LINE_CAP
    (logs / "LOG-20260101T000000000Z.jsonl").write_bytes(_record(1) + b"\0" * zeros)
    code, out, _ = _cli(capsys, "--json", "logs", "--tail", "2")
    first, torn = map(json.loads, out.splitlines())
    assert code == 0 and first["event"] == "e1"
    assert (torn["event"], torn["offset"], len(torn["line"])) == (
        "unreadable_line", len(_record(1)), logtail._LINE_CAP)

    taken: list[tuple[int, int]] = []

    def take(lines: Iterator[logtail.Line]) -> None:
        for _ in range(2):
            _path, offset, line = next(lines)
            taken.append((len(line), offset))

    tail = logtail.LogTail(logs, lambda line: pytest.fail(f"emitted {line[:20]!r}"),
                           all_files=False)
    tracemalloc.start()
    try:
        tail.pump_last(take, finishing=True)
        tail.finish()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        tail.close()
    assert taken == [(logtail._LINE_CAP, len(_record(1))), (len(_record(1)) - 1, 0)]
    # Its head read back, and its text: not the 16 MiB.
    assert peak < 4 * logtail._LINE_CAP, peak


def test_an_older_log_that_cannot_be_read_still_fails_the_tail_of_every_log(
    logs_project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Wholly before the last N records, it is not read, but it is still opened: a log that
    may not be read fails the command (STORAGE_ERROR) as when every log was read whole."""
    logs = logs_project / ".intloom" / "logs"
    refused = logs / "LOG-20260101T000000000Z.jsonl"
    refused.write_bytes(_record(0))
    (logs / "LOG-20260102T000000000Z.jsonl").write_bytes(_record(1) * 1000)
    newest = _record(1) + _record(2)
    (logs / "LOG-20260103T000000000Z.jsonl").write_bytes(newest)
    counting = _counting(monkeypatch, refused)
    code, out, _ = _cli(capsys, "--json", "logs", "--all", "--tail", "1")
    assert (code, [json.loads(line).get("event") for line in out.splitlines()[:-1]]) == (
        1, ["e2"])
    assert json.loads(out.splitlines()[-1])["error"]["code"] == "STORAGE_ERROR"
    assert str(refused.name) in out.splitlines()[-1]
    # The newest log back to its last line, once: the log between is not read.
    assert counting.bytes_read == len(newest)


# ----- the property: what --tail shows is what reading the logs whole showed ------------------

_PIECES = [
    b'{"event": "x"}', b'{"event": "r", "runId": "RUN-a"}', b'{"runs": [{"runId": "RUN-a"}]}',
    b"Fatal Python error: Aborted", b"Thread 0x1 (most recent call first):", b"RUN-a torn",
    b"[1]", b"\n", b"\n", b"\n", b"\r\n", b" ", b" \t \r   ", b"\0\0\0", "\u00e9".encode(), b"\xff",
    b"\xe2\x82", b"\xac",  # a euro sign, split: whole only where the pieces meet
]
_LOG = st.lists(st.sampled_from(_PIECES), max_size=40).map(b"".join)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.lists(_LOG, min_size=1, max_size=3), finishing=st.booleans(),
       chunk=st.sampled_from([1, 2, 3, 7, 64, 1 << 16]), cap=st.sampled_from([5, 17, 1 << 20]))
def test_the_lines_read_backwards_are_the_lines_read_forward(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
    files: list[bytes], finishing: bool, chunk: int, cap: int,
) -> None:
    """Each line ``pump`` (and ``finish``) emits, with its file and offset, and no other,
    last first: the backwards reader skips none (which would start the tail too late) and
    adds none (which would read more than the tail needs)."""
    monkeypatch.setattr(logtail, "_CHUNK", chunk)
    monkeypatch.setattr(logtail, "_LINE_CAP", cap)
    logs = tmp_path_factory.mktemp("logs")
    for n, data in enumerate(files):
        (logs / f"LOG-2026010{n + 1}T000000000Z.jsonl").write_bytes(data)
    forward: list[logtail.Line] = []

    def emit(line: str) -> None:
        assert tail.line_at is not None
        forward.append((*tail.line_at, line))

    tail = logtail.LogTail(logs, emit, all_files=True)
    with contextlib.closing(tail):
        tail.pump()
        if finishing:
            tail.finish()
    backwards: list[logtail.Line] = []
    with contextlib.closing(logtail.LogTail(logs, emit, all_files=True)) as back:
        back.pump_last(backwards.extend, finishing=finishing)
    assert backwards == forward[::-1]


def _shown(root: Path, files: list[bytes], more: bytes, *, tail: bool, keep: int,
           run_id: str | None, all_files: bool, json_mode: bool, follow: bool
           ) -> tuple[str, bool]:
    """What ``logs`` prints of ``files`` with ``--tail keep`` (``tail``: read from the
    ends; else whole, as before), then, following, of ``more`` appended to the newest and
    then written to a newer log; and whether it found any record (the command's notes when
    it found none)."""
    logs = root / ".intloom" / "logs"
    logs.mkdir(parents=True)
    for n, data in enumerate(files):
        (logs / f"LOG-2026010{n + 1}T000000000Z.jsonl").write_bytes(data)
    renderer = Renderer(json_mode=json_mode)
    renderer.stdout = io.StringIO()
    tails: list[logtail.LogTail] = []
    printer = logs_command._printer(renderer, run_id, root,
                                    lambda: tails[0].line_at if tails else None, keep)
    tails.append(logtail.LogTail(logs, printer.emit, all_files=all_files))
    if tail:
        logs_command._backlog(tails[0], printer, keep, follow=follow)
    else:
        # The reading whole of before: ``pump``, unchanged, and the printer keeping N.
        tails[0].pump()
    if follow:
        printer.release()
        with open(logs / f"LOG-2026010{len(files)}T000000000Z.jsonl", "ab") as fh:
            fh.write(more)
        tails[0].pump()
        # A new host's log: the newest one's torn end shown, and its fault dump ended.
        (logs / f"LOG-2026010{len(files) + 1}T000000000Z.jsonl").write_bytes(more)
        tails[0].pump()
    else:
        tails[0].finish()
        printer.release()
    tails[0].close()
    assert isinstance(renderer.stdout, io.StringIO)
    return renderer.stdout.getvalue(), printer.printed > 0


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
# Found none the less: a --tail 0 that looked at one line only, not for one about the Run.
@example(files=[b'{"event": "r", "runId": "RUN-a"}\n{"event": "x"}\n'], more=b"", keep=0,
         run_id="RUN-a", all_files=False, json_mode=True, follow=False, chunk=1 << 16,
         cap=1 << 20)
# Followed from the end of a fault dump: what is appended to it is still the dump's.
@example(files=[b'{"event": "x"}\nFatal Python error: Aborted\n'], more=b"junk\n", keep=1,
         run_id=None, all_files=False, json_mode=True, follow=True, chunk=1 << 16,
         cap=1 << 20)
@given(files=st.lists(_LOG, min_size=1, max_size=3), more=_LOG,
       keep=st.integers(min_value=0, max_value=6), run_id=st.sampled_from([None, "RUN-a"]),
       all_files=st.booleans(), json_mode=st.booleans(), follow=st.booleans(),
       chunk=st.sampled_from([1, 2, 3, 7, 64, 1 << 16]), cap=st.sampled_from([5, 17, 1 << 20]))
def test_the_tail_read_from_the_end_is_the_tail_read_whole(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
    files: list[bytes], more: bytes, keep: int, run_id: str | None, all_files: bool,
    json_mode: bool, follow: bool, chunk: int, cap: int,
) -> None:
    monkeypatch.setattr(logtail, "_CHUNK", chunk)
    monkeypatch.setattr(logtail, "_LINE_CAP", cap)
    how: dict[str, Any] = {"keep": keep, "run_id": run_id, "all_files": all_files,
                           "json_mode": json_mode, "follow": follow}
    whole, any_whole = _shown(tmp_path_factory.mktemp("whole"), files, more, tail=False, **how)
    end, any_end = _shown(tmp_path_factory.mktemp("end"), files, more, tail=True, **how)
    assert end == whole
    if not follow:  # followed, nothing is said of an empty log
        assert any_end == any_whole


def test_the_property_reaches_what_it_is_about(tmp_path: Path) -> None:
    """The property's pieces make what it is about: a fault dump begun before the tail (its
    lines after are fault_dump records only if that is known), a character split by a read."""
    dump = b'{"event": "x"}\nFatal Python error: Aborted\n\nThread 0x1\n\xe2\x82\xac\n'
    how: dict[str, Any] = {"run_id": None, "all_files": False, "json_mode": True,
                           "follow": False}
    one, _ = _shown(tmp_path / "one", [dump], b"", tail=True, keep=1, **how)
    assert [(r["event"], r["line"]) for r in map(json.loads, one.splitlines())] == [
        ("fault_dump", "\u20ac")]
    every, _ = _shown(tmp_path / "every", [dump], b"", tail=True, keep=5, **how)
    assert every.splitlines()[-1:] == one.splitlines()


def test_a_runs_tail_decodes_no_line_twice_that_cannot_be_about_it(
    logs_project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``logs RUN --tail N`` for a Run with fewer than N records (a short or ended Run among
    busy ones) reads the logs backwards to their start, then whole, forward: deciding
    backwards which lines were the Run's decoded every line, so the log was decoded twice
    (2.3x the time a whole read took). A line without the id (nor any escape) is no record
    of the Run: it need not be decoded to be counted out."""
    logs = logs_project / ".intloom" / "logs"
    others = 5_000
    body = b"".join(_record(n) for n in range(others))
    (logs / "LOG-20260101T000000000Z.jsonl").write_bytes(_record(0, RUN) + body)
    decoded: list[str] = []
    real = logs_command._decoded

    def counting(line: str) -> tuple[bytes | None, str, Any]:
        decoded.append(line)
        return real(line)

    monkeypatch.setattr(logs_command, "_decoded", counting)
    code, out, _ = _cli(capsys, "--json", "logs", RUN, "--tail", "5")
    assert code == 0 and [json.loads(line)["runId"] for line in out.splitlines()] == [RUN]
    # Only the one that may be the Run's (then once more to print it: it is held as its
    # text), and the last (whether the logs end in a fault dump): none is read again.
    assert len(decoded) == 3, decoded


@pytest.mark.parametrize("kept", [1, 7])
def test_a_runs_tail_reads_each_byte_of_the_logs_once(
    logs_project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    kept: int,
) -> None:
    """``logs RUN --tail 5`` for a Run with fewer than 5 records (``kept`` 1: a short or
    ended Run among busy ones) read the logs backwards to their start, then read them whole
    again, forward: twice the bytes a whole read takes. With 5 or more, far apart (``kept``
    7), it read back to the fifth last, then everything after it again. What the backwards
    read found is what is shown: each byte is read once."""
    logs = logs_project / ".intloom" / "logs"
    lines = [_record(n, RUN if n % (10_000 // kept) == 7 else None) for n in range(10_000)]
    older, newer = b"".join(lines[:5_000]), b"".join(lines[5_000:])
    (logs / "LOG-20260101T000000000Z.jsonl").write_bytes(older)
    (logs / "LOG-20260102T000000000Z.jsonl").write_bytes(newer)
    mine = [n for n, line in enumerate(lines) if RUN.encode() in line]
    assert len(mine) == kept
    # The bytes from the fifth last of the Run's records on (all, with fewer).
    after = len(b"".join(lines[mine[-5] if kept >= 5 else 0:]))
    assert after > 4 * logtail._CHUNK
    whole = _cli(capsys, "--json", "logs", "--all", RUN)
    counting = _counting(monkeypatch)
    code, out, err = _cli(capsys, "--json", "logs", "--all", RUN, "--tail", "5")
    assert (code, out.splitlines(), err) == (
        0, whole[1].splitlines()[-5:], whole[2]), (out, err)
    assert len(out.splitlines()) == min(kept, 5)
    # Back to where the last 5 start: the block that line is in, and nothing twice.
    assert counting.bytes_read <= after + (logtail._CHUNK if kept >= 5 else 0), (
        counting.bytes_read, after)


def _model(files: list[bytes]) -> list[tuple[str, str | None, int | None]]:
    """What ``logs --all --json`` shows of ``files``, each line as (its event, and for a
    line that is no record its file and offset): each log read from its start outside a
    fault dump, a dump running from a ``Fatal Python error`` line to the next record or its
    log's end; a blank line, or a torn end of blanks, skipped."""
    shown: list[tuple[str, str | None, int | None]] = []
    for n, data in enumerate(files):
        name, at, dumping = f".intloom/logs/LOG-2026010{n + 1}T000000000Z.jsonl", 0, False
        for line in data.split(b"\n"):
            if line.strip():
                try:
                    record = msgspec.json.decode(line.decode("utf-8", errors="replace"))
                except msgspec.DecodeError:
                    record = None
                if isinstance(record, dict):
                    dumping = False
                    shown.append(("record", None, None))
                else:
                    dumping = dumping or line.startswith(b"Fatal Python error: ")
                    shown.append(("fault_dump" if dumping else "unreadable_line", name, at))
            at += len(line) + 1
    return shown


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.lists(_LOG, min_size=2, max_size=3), keep=st.integers(min_value=0, max_value=8),
       tail=st.booleans(), chunk=st.sampled_from([1, 7, 1 << 16]))
def test_each_log_is_read_from_its_start_outside_a_fault_dump(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
    files: list[bytes], keep: int, tail: bool, chunk: int,
) -> None:
    """Several logs, fault dumps among them, read whole and from the end: a dump ended with
    its log (it carried into the next one's first lines that were no record), and an older
    log's torn end of only blanks was shown as an unreadable line."""
    monkeypatch.setattr(logtail, "_CHUNK", chunk)
    out, _ = _shown(tmp_path_factory.mktemp("logs"), files, b"", tail=tail, keep=keep,
                    run_id=None, all_files=True, json_mode=True, follow=False)
    records = [json.loads(line) for line in out.split("\n")[:-1]]  # a record keeps its CR
    shown = [(r["event"], r["file"], r["offset"]) if r.get("time", "") is None
             else ("record", None, None) for r in records]
    every = _model(files)
    assert shown == every[max(0, len(every) - keep):]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="lists descriptors by /proc")
def test_logs_leaves_no_log_open(logs_project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The newest log, kept open to be read on, was never closed: in a process that goes on
    after ``logs`` (a program calling ``main``; this suite, whose property tests left over
    1,000 open, and a worker's next tests failed in ``select()``), one more each time."""
    logs = logs_project / ".intloom" / "logs"
    (logs / "LOG-20260101T000000000Z.jsonl").write_bytes(_record(1))
    (logs / "LOG-20260102T000000000Z.jsonl").write_bytes(_record(2) + b'{"torn')
    before = set(os.listdir("/proc/self/fd"))
    for args in ((), ("--all",), ("--tail", "1"), ("--all", RUN, "-n", "5")):
        assert main(["logs", *args]) == 0, capsys.readouterr()
    assert set(os.listdir("/proc/self/fd")) <= before
