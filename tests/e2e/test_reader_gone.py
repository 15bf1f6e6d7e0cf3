"""A pipe's reader that goes away while ``attach`` or ``logs --follow`` waits with nothing to
print ends the command then, quietly, as ``tail -f`` does (intloom/cli/readerwatch.py).

Before, ``intloom attach RUN | head -1`` and ``intloom logs --follow | grep -m1 ...`` learnt
of it only at their next write: the Run's next event, the host's next log line, here never
(the Step is held, the log idle), so each test below would wait out its deadline.
"""

from __future__ import annotations

import fcntl
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_cli_interrupts import (
    cli_child,
    connected,
    followed_first_line,
    host_port,
    one_line_log,
    running_run,
)
from tests.helpers import Project, eventually, ok, one_source_project, reaped

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
            # No arguments at all is bare `intloom` (its help): run in the project then.
            [sys.executable, "-m", "intloom",
             *(["--project", str(project.root)] if args else []), *args],
            stdout=gone.get("stdout", subprocess.PIPE),
            stderr=gone.get("stderr", subprocess.PIPE), cwd=project.root,
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


LOOPS_THEN_FAILS = '''
import msgspec

import intloom


class Count(msgspec.Struct):
    n: int = 0


wf = intloom.Workflow("loops", version="1.0.0")
main = wf.stage("main", state=Count)


# "done" is never returned: a Workflow none of whose routes completes is refused.
@main.step("again", routes={"again": "again", "done": intloom.COMPLETE})
def again(ctx: intloom.StepContext[Count]) -> str:
    if ctx.state.n >= 120:
        raise RuntimeError("gave up")
    ctx.state = Count(n=ctx.state.n + 1)
    return "again"
'''


@pytest.fixture
def looping(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "loops", LOOPS_THEN_FAILS))


def test_attach_of_a_failed_run_keeps_exit_1_when_its_reader_goes(looping: Project) -> None:
    # `intloom attach RUN | head -1` under `set -o pipefail` on a Run that has failed:
    # attach knows the Run failed before it prints its history, but a reader gone during
    # the history ended it as a detach, exit 0 -- the Run read as fine.
    ok(looping.cli("start", "--json"))
    run = looping.cli("flow", "loops", "--intent", "loop", "--json").json["run"]
    assert (run["status"], run["lastError"]["code"]) == ("failed", "STEP_EXECUTION_FAILED")
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)  # the history (200 events) overfills it
    with os.fdopen(read_end, "rb") as reader:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "intloom", "--project", str(looping.root),
                 "attach", run["runId"]],
                stdout=write_end, stderr=subprocess.PIPE, text=True,
                env={**os.environ, "NO_COLOR": "1"})
        finally:
            os.close(write_end)
        try:
            ready, _, _ = select.select([reader], [], [], 20)
            assert ready, "attach printed nothing"
            assert reader.read(1)  # `head -1` has its line and goes
        except BaseException:
            proc.kill()
            raise
    try:
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, (proc.returncode, err)
    assert "Traceback" not in err, err


def test_bare_intloom_to_a_reader_that_went_away_is_no_failure(project: Project) -> None:
    # `intloom | head -1`: bare intloom prints its help, written with no guard: a
    # BrokenPipeError traceback on stderr, exit 1.
    exit_code, err = _closed_pipe_run(project, [], "stdout")
    assert (exit_code, err) == (0, "")
