"""stdout that refuses what is written to it (a full disk: /dev/full) while attach or logs
prints: a known error on stderr, not CLI_INTERNAL_ERROR "report it", nor a traceback in JSON
mode, whose error document was written to the same stdout and failed again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import Project, eventually, started_waiting

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90),
              pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")]


def _to_full(project: Project, *args: str) -> subprocess.CompletedProcess[str]:
    with open("/dev/full", "w") as full:
        return subprocess.run(
            [sys.executable, "-m", "intloom", "--project", str(project.root), *args],
            stdout=full, stderr=subprocess.PIPE, text=True, timeout=60,
            env={**os.environ, "NO_COLOR": "1"})


@pytest.mark.parametrize("args", [["attach"], ["logs"]])
def test_a_full_stdout_is_a_known_error_in_text(project: Project, args: list[str]) -> None:
    run_id, _ = started_waiting(project)
    result = _to_full(project, *args, run_id)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "CLI_INTERNAL_ERROR" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("Failure · CLI_OUTPUT_FAILED: ") and "stdout" in line
    assert "No space left on device (ENOSPC)" in line, line


@pytest.mark.parametrize("args", [["attach"], ["logs"]])
def test_a_full_stdout_is_one_error_document_on_stderr_in_json(
    project: Project, args: list[str]
) -> None:
    run_id, _ = started_waiting(project)
    result = _to_full(project, "--json", *args, *([run_id] if len(args) == 1 else []))
    assert result.returncode == 1, result.stderr
    (line,) = result.stderr.splitlines()
    error = json.loads(line)["error"]
    assert error["code"] == "CLI_OUTPUT_FAILED" and error["retryable"] is False
    assert "ENOSPC" in error["message"]


@pytest.mark.parametrize(("args", "code", "exit_code"), [
    (["attach", "RUN-nope"], "NOT_FOUND", 1),
    (["cancel", "RUN-nope"], "NOT_FOUND", 1),
    (["runs", "--bogus"], "INVALID_REQUEST", 2),
])
def test_a_json_error_a_full_stdout_refuses_is_that_error_on_stderr(
    project: Project, args: list[str], code: str, exit_code: int
) -> None:
    # The error's document was written to stdout, which refused it: only CLI_OUTPUT_FAILED
    # (exit 1) was said, so a script lost NOT_FOUND, and a usage error's 2.
    started_waiting(project)
    result = _to_full(project, "--json", *args)
    assert result.returncode == exit_code, result.stderr
    (line,) = result.stderr.splitlines()
    error = json.loads(line)["error"]
    assert error["code"] == code, error
    assert "RUN-nope" in error["message"] or "--bogus" in error["message"]


@pytest.mark.parametrize("args", [[], ["--help"], ["runs", "--help"], ["attach", "-h"]])
def test_help_to_a_full_stdout_is_a_known_error(tmp_path: Path, args: list[str]) -> None:
    # `intloom` alone (its help) and every --help wrote the help with no guard: a full
    # stdout was a traceback (bare `intloom`) or CLI_INTERNAL_ERROR, exit 70, "report it".
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "intloom", *args], cwd=tmp_path,
                                stdout=full, stderr=subprocess.PIPE, text=True, timeout=60,
                                env={**os.environ, "NO_COLOR": "1"})
    assert result.returncode == 1, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("Failure · CLI_OUTPUT_FAILED: "), line
    assert "No space left on device (ENOSPC)" in line, line


@pytest.mark.parametrize("kind", ["pipe", "socket"])
@pytest.mark.parametrize("unbuffered", [False, True])
def test_a_non_blocking_stdout_read_slowly_gets_the_whole_output(
    project: Project, unbuffered: bool, kind: str,
) -> None:
    """A stdout handed over non-blocking (O_NONBLOCK, left by a parent's event loop) whose
    reader was slower than the pipe's 64 KiB: the write failed with EAGAIN, the output cut
    there, CLI_OUTPUT_FAILED saying to free space; under PYTHONUNBUFFERED=1 Python dropped
    the rest of the partial write and the command exited 0 with half its JSON. A pipe is
    opened again as a blocking description of the command's own; a socket is written
    through a writer that waits. Either way the whole document arrives, and the parent's
    end is left non-blocking as it was."""
    import fcntl
    import socket
    import termios

    run_id, _ = started_waiting(project, intent="x" * 120_000)
    if kind == "pipe":
        read_end, write_end = os.pipe()
        full = fcntl.fcntl(write_end, fcntl.F_GETPIPE_SZ)
    else:
        ours, theirs = socket.socketpair()
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        read_end, write_end = os.dup(ours.fileno()), os.dup(theirs.fileno())
        ours.close()
        theirs.close()
        full = 4096
    os.set_blocking(write_end, False)
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "intloom", "--project", str(project.root), "inspect", run_id,
         "--json"], stdout=write_end, stderr=subprocess.PIPE, env=env)
    try:
        def pending() -> int:
            size = bytearray(4)
            fcntl.ioctl(read_end, termios.FIONREAD, size)
            return int.from_bytes(size, sys.byteorder)

        # The reader is slow: nothing is read until the buffer is full or the command ended,
        # then 4 KiB at a time (the pause between reads is the reader's speed under test).
        eventually(lambda: pending() >= full or proc.poll() is not None, timeout=30,
                   what="the buffer full or the command ended")
        data = bytearray()
        while True:
            eventually(lambda: pending() > 0 or proc.poll() is not None, timeout=30,
                       what="more output or the command's end")
            if pending():
                data += os.read(read_end, 4096)
                time.sleep(0.002)
            elif proc.poll() is not None:
                break
        stderr = proc.stderr.read().decode() if proc.stderr else ""
        assert proc.wait(timeout=30) == 0, stderr
        assert stderr == "", stderr
        assert json.loads(data)["run"]["runId"] == run_id, len(data)
        assert len(data) > 120_000, len(data)
        assert not os.get_blocking(write_end)  # the parent's description, as it was
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        if proc.stderr:
            proc.stderr.close()
        os.close(read_end)
        os.close(write_end)


def test_a_non_blocking_pipe_is_a_blocking_one_for_what_the_command_starts() -> None:
    """Written through a waiting writer, the command's own output was whole, but descriptor
    1 stayed on the parent's non-blocking description: a subprocess (a Step's, under start
    --foreground) writing there got EAGAIN. A pipe is opened again, blocking, as the
    command's own."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    probe = ("import os, sys\nfrom intloom.cli.blocking import blocking_output\n"
             "blocking_output()\nsys.stderr.write(str(os.get_blocking(1)))\n")
    try:
        done = subprocess.run([sys.executable, "-c", probe], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=60)
        assert done.returncode == 0 and done.stderr == "True", done.stderr
        assert not os.get_blocking(write_end)
    finally:
        os.close(read_end)
        os.close(write_end)
