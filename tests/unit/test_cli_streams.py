"""``start --foreground``'s standard streams (``intloom.cli.streams``): a reader that goes
away while the host serves is no failure of the Steps that print."""

from __future__ import annotations

import os
from typing import TextIO

from intloom.cli.streams import _ReaderMayGo


def _written_after_the_reader_went(stream: TextIO) -> None:
    wrapped = _ReaderMayGo(stream)
    print("after", file=wrapped, flush=True)
    print("and again", file=wrapped, flush=True)
    stream.close()  # its last flush goes to /dev/null: no error at exit either


def test_a_closed_terminal_or_a_gone_pipe_drops_what_a_step_prints_after() -> None:
    """A terminal closed under ``start --foreground`` (its hangup, SIGHUP): a Step's print
    raised OSError EIO and failed its Run, where a pipe's reader gone was already dropped."""
    master, slave = os.openpty()
    os.close(master)
    _written_after_the_reader_went(open(slave, "w", encoding="utf-8"))  # noqa: SIM115
    read, write = os.pipe()
    os.close(read)
    _written_after_the_reader_went(open(write, "w", encoding="utf-8"))  # noqa: SIM115
