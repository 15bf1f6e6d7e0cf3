"""``LogTail`` hands on each line with the byte offset it starts at, whatever the chunks
it reads them in, and keeps at most ``_LINE_CAP`` bytes of one: a line with no end (a zero
tail after a power cut) was joined and split again at every chunk -- a minute and 2 GB for
100 MB -- then shown whole."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import intloom.cli.logtail as logtail

pytestmark = pytest.mark.timeout(60)


def _tail(directory: Path, data: bytes) -> list[tuple[str, int]]:
    (directory / "LOG-20261204T000000000Z.jsonl").write_bytes(data)
    out: list[tuple[str, int]] = []
    tail: logtail.LogTail

    def emit(line: str) -> None:
        assert tail.line_at is not None
        out.append((line, tail.line_at[1]))

    tail = logtail.LogTail(directory, emit, all_files=True)
    tail.pump()
    tail.finish()
    tail.close()
    return out


def _expected(data: bytes, cap: int) -> list[tuple[str, int]]:
    out, at = [], 0
    for line in data.split(b"\n"):
        if line[:cap].strip() or len(line) > cap:  # a line past the cap is shown, cut
            out.append((line[:cap].decode("utf-8", "surrogateescape"), at))
        at += len(line) + 1
    return out


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300).map(lambda b: bytes(b"ab \n{}"[x % 6] for x in b)),
       chunk=st.sampled_from([1, 2, 3, 7, 64, 1 << 16]), cap=st.sampled_from([1, 5, 17, 1000]))
def test_lines_and_offsets_whatever_the_chunks(tmp_path_factory: pytest.TempPathFactory,
                                               monkeypatch: pytest.MonkeyPatch, data: bytes,
                                               chunk: int, cap: int) -> None:
    monkeypatch.setattr(logtail, "_CHUNK", chunk)
    monkeypatch.setattr(logtail, "_LINE_CAP", cap)
    assert _tail(tmp_path_factory.mktemp("logs"), data) == _expected(data, cap)


def test_a_line_without_an_end_is_kept_only_up_to_the_cap(tmp_path: Path) -> None:
    zeros = 8 * logtail._LINE_CAP
    out = _tail(tmp_path, b'{"a": 1}\n' + b"\0" * zeros + b"\n" + b'{"b": 2}\n' + b"\0" * zeros)
    assert [(len(line), at) for line, at in out] == [
        (8, 0), (logtail._LINE_CAP, 9), (8, 10 + zeros), (logtail._LINE_CAP, 19 + zeros)]
