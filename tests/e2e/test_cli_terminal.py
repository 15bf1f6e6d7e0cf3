"""The real CLI on a pseudo-terminal: ``NO_COLOR`` means no escapes and no boxes there too,
help included; without it, the help is Rich's, and the command works the same."""

from __future__ import annotations

import errno
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

ESC = b"\x1b"
BOX = "╭".encode()


def on_a_terminal(args: list[str], cwd: Path, *, no_color: bool) -> tuple[int, bytes]:
    """Run the CLI with stdin, stdout and stderr on a new pty; its exit code and output."""
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env.update({"TERM": "xterm-256color", "COLUMNS": "100", "PYTHONPATH": str(REPO)})
    if no_color:
        env["NO_COLOR"] = "1"
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "intloom", *args], cwd=cwd, env=env,
                                stdin=follower, stdout=follower, stderr=follower)
    finally:
        os.close(follower)  # the child holds it: EOF on the leader once the child is gone
    try:
        out = b""
        deadline = time.monotonic() + 30
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no end of output within 30 s (got {out!r})"
            ready, _, _ = select.select([leader], [], [], remaining)
            if not ready:
                continue
            try:
                chunk = os.read(leader, 65536)
            except OSError as exc:  # Linux reports the closed follower as EIO
                if exc.errno != errno.EIO:
                    raise
                break
            if not chunk:
                break
            out += chunk
        return proc.wait(timeout=10), out
    finally:
        os.close(leader)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


@pytest.mark.parametrize(
    "args", [["--help"], [], ["attach", "--help"], ["runs", "-h"], ["logs", "--help"]]
)
def test_no_color_help_on_a_terminal_is_plain(tmp_path: Path, args: list[str]) -> None:
    code, out = on_a_terminal(args, tmp_path, no_color=True)
    assert code == 0, out
    assert ESC not in out and BOX not in out, out
    assert b"Usage: intloom" in out


def test_no_color_errors_on_a_terminal_are_plain(tmp_path: Path) -> None:
    code, out = on_a_terminal(["runs", "--nope"], tmp_path, no_color=True)
    assert code == 2
    assert ESC not in out
    assert out.startswith(b"Failure \xc2\xb7 INVALID_REQUEST: No such option: --nope."), out


def test_without_no_color_the_terminal_help_is_richs(tmp_path: Path) -> None:
    code, out = on_a_terminal(["attach", "--help"], tmp_path, no_color=False)
    assert code == 0, out
    # The probe sees escapes when there are some, so their absence above means something.
    assert ESC in out and BOX in out
    assert b"Usage:" in out and b"RUN" in out
