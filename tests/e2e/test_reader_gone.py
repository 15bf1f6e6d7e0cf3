"""A pipe's reader that goes away while ``attach`` or ``logs --follow`` waits with nothing to
print ends the command then, quietly, as ``tail -f`` does (intloom/cli/readerwatch.py).

Before, ``intloom attach RUN | head -1`` and ``intloom logs --follow | grep -m1 ...`` learnt
of it only at their next write: the Run's next event, the host's next log line, here never
(the Step is held, the log idle), so each test below would wait out its deadline.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys

import pytest

from tests.e2e.test_cli_interrupts import (
    cli_child,
    connected,
    followed_first_line,
    host_port,
    one_line_log,
    running_run,
)
from tests.helpers import Project, eventually, ok

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


def _reader_leaves(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """Close the only read end of ``proc``'s stdout; its exit code and stderr."""
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    code = proc.wait(timeout=20)  # TimeoutExpired: it waits on, as it did before
    return code, proc.stderr.read()


@pytest.mark.parametrize(("json_mode", "background"),
                         [(False, False), (True, False), (False, True)])
def test_attach_ends_when_its_reader_goes_and_leaves_the_run(
        proj: Project, json_mode: bool, background: bool) -> None:
    run_id, hold = running_run(proj)
    port = host_port(proj)
    args = ["attach", run_id, *(["--json"] if json_mode else [])]
    with cli_child(proj, *args, background=background) as proc:
        assert proc.stdout is not None
        eventually(lambda: connected(proc, port), timeout=20, what="attach to connect")
        if not json_mode:  # text: the history comes first, as `| head -1` reads it
            ready, _, _ = select.select([proc.stdout], [], [], 20)
            assert ready, "attach printed nothing"
            assert proc.stdout.readline().strip()
        code, err = _reader_leaves(proc)
    assert code == 0, (code, err)
    assert err == "", err  # no "Detached ..." for a reader that has gone, no traceback
    [run] = ok(proj.cli("runs", "--json"))["runs"]
    assert (run["runId"], run["status"]) == (run_id, "running")  # left as it was
    hold.unlink()
    eventually(lambda: ok(proj.cli("runs", "--json"))["runs"][0]["status"] == "waiting",
               timeout=20, what="the Run to go on to its first wait")


def test_logs_follow_ends_when_its_reader_goes(project: Project) -> None:
    one_line_log(project)
    with cli_child(project, "logs", "--follow") as proc:
        assert "first" in followed_first_line(proc)  # what `grep -m1 first` waited for
        code, err = _reader_leaves(proc)
    assert code == 0, (code, err)
    assert err == "", err


def _closed_pipe_run(project: Project, args: list[str], stream: str) -> tuple[int, str]:
    """Run the CLI with ``stream`` (stdout or stderr) writing into a pipe whose reader is
    already gone (``| head -1`` that has read its line); the exit code and the other
    stream's text."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write into the pipe now fails with EPIPE
    try:
        gone = {stream: write_end}
        proc = subprocess.run(
            [sys.executable, "-m", "intloom", "--project", str(project.root), *args],
            stdout=gone.get("stdout", subprocess.PIPE),
            stderr=gone.get("stderr", subprocess.PIPE),
            env={**os.environ, "NO_COLOR": "1"}, timeout=60, check=False)
    finally:
        os.close(write_end)
    other = proc.stderr if stream == "stdout" else proc.stdout
    return proc.returncode, other.decode()


@pytest.mark.parametrize(("args", "stream", "code"), [
    (["--json", "runs"], "stdout", 1),             # CLI_SERVICE_OFFLINE, a JSON document
    (["--json", "runs", "--bogus"], "stdout", 2),  # a usage error, a JSON document
    (["runs"], "stderr", 1),                       # Failure · CLI_SERVICE_OFFLINE on stderr
    (["runs", "--bogus"], "stderr", 2),
])
def test_an_error_to_a_reader_that_went_away_keeps_its_exit_code_and_no_traceback(
        project: Project, args: list[str], stream: str, code: int) -> None:
    # `intloom --json runs | head -1` with no host: the error is the one document, and a
    # reader gone before it was written raised BrokenPipeError out of the error report
    # itself (a traceback on stderr, exit 1 whatever the error's code was).
    exit_code, other = _closed_pipe_run(project, args, stream)
    assert exit_code == code, (exit_code, other)
    assert "Traceback" not in other and "BrokenPipeError" not in other, other
    if stream == "stdout":
        assert other == "", other  # nothing said: there is no one to tell
    assert not project.state.exists()  # outside the error, nothing was created
