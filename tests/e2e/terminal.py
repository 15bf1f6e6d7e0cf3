"""The real CLI on a pseudo-terminal, driven like a person: read until a prompt, type."""

from __future__ import annotations

import errno
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from tests.helpers import REPO

__all__ = ["Terminal"]

# Run by the child before intloom: a new session (``start_new_session``) whose controlling
# terminal is the pty on its stdin, with SIGINT at its default (a runner started in the
# background has it ignored, and exec keeps that), as a shell starts a foreground command.
_CONTROLLED = ("import fcntl, os, signal, sys, termios; "
               "fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
               "signal.signal(signal.SIGINT, signal.SIG_DFL); "
               "os.execv(sys.executable, [sys.executable, '-m', 'intloom', *sys.argv[1:]])")


class Terminal:
    """``intloom ARGS`` with stdin, stdout and stderr on one new pty (NO_COLOR set).

    ``controlling``: the pty is the CLI's controlling terminal, and the CLI its foreground
    job, as under a shell: Ctrl-C typed (``keys("\\x03")``) is echoed as ``^C`` by the
    terminal and sends SIGINT. Otherwise the pty only carries the CLI's streams, and a
    SIGINT must be sent to ``proc`` (no ``^C`` then)."""

    def __init__(self, args: list[str], cwd: Path, *, timeout: float = 30.0,
                 controlling: bool = False, piped_stdout: bool = False) -> None:
        env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
        env.update({"TERM": "xterm-256color", "COLUMNS": "100", "PYTHONPATH": str(REPO),
                    "NO_COLOR": "1"})
        self.timeout = timeout
        self.output = b""
        self._seen = 0  # how much of ``output`` an expect has consumed
        self._leader, follower = pty.openpty()
        try:
            command = ([sys.executable, "-c", _CONTROLLED, *args] if controlling else
                       [sys.executable, "-m", "intloom", *args])
            # ``piped_stdout``: stdout is a pipe (``proc.stdout``), as in ``intloom ... | grep``.
            self.proc = subprocess.Popen(command, cwd=cwd, env=env, stdin=follower,
                                         stdout=subprocess.PIPE if piped_stdout else follower,
                                         stderr=follower,
                                         start_new_session=controlling)
        finally:
            os.close(follower)  # the child holds it: EOF on the leader once it is gone

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        os.close(self._leader)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def _read(self, deadline: float) -> bool:
        """Read what is there (waiting until ``deadline``); False at EOF."""
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"timed out; the terminal shows:\n{self.text()}"
        ready, _, _ = select.select([self._leader], [], [], remaining)
        if not ready:
            return True
        try:
            chunk = os.read(self._leader, 65536)
        except OSError as exc:  # Linux reports the closed follower as EIO
            if exc.errno != errno.EIO:
                raise
            return False
        self.output += chunk
        return bool(chunk)

    def expect(self, text: str) -> str:
        """Wait until ``text`` appears after what earlier expects consumed; what came before
        it (and it)."""
        deadline = time.monotonic() + self.timeout
        needle = text.encode()
        while True:
            at = self.output.find(needle, self._seen)
            if at >= 0:
                end = at + len(needle)
                seen, self._seen = self.output[self._seen:end], end
                return seen.decode(errors="replace")
            if not self._read(deadline):
                raise AssertionError(f"the CLI exited before {text!r}:\n{self.text()}")

    def type(self, line: str) -> None:
        os.write(self._leader, line.encode() + b"\r")

    def keys(self, text: str) -> None:
        """Type ``text`` without Enter: it sits in the terminal's line, not yet read."""
        os.write(self._leader, text.encode())

    def finish(self) -> int:
        """Read to the end; the exit code."""
        deadline = time.monotonic() + self.timeout
        while self._read(deadline):
            pass
        return self.proc.wait(timeout=10)

    def text(self) -> str:
        return self.output.decode(errors="replace").replace("\r\n", "\n")

    def rest(self) -> str:
        """What came after the last expect."""
        return self.output[self._seen:].decode(errors="replace").replace("\r\n", "\n")
