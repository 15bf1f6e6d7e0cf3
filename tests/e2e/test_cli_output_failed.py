"""stdout that refuses what is written to it (a full disk: /dev/full) while attach or logs
prints: a known error on stderr, not CLI_INTERNAL_ERROR "report it", nor a traceback in JSON
mode, whose error document was written to the same stdout and failed again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


@pytest.mark.parametrize("unbuffered", [False, True])
def test_a_non_blocking_stdout_read_slowly_gets_the_whole_output(
    project: Project, unbuffered: bool,
) -> None:
    """A stdout handed over non-blocking (O_NONBLOCK, left by a parent's event loop) whose
    reader was slower than the pipe's 64 KiB: the write failed with EAGAIN, the output cut
    there, CLI_OUTPUT_FAILED saying to free space; under PYTHONUNBUFFERED=1 Python dropped
    the rest of the partial write and the command exited 0 with half its JSON. It now
    waits for the pipe to take more: the whole document, and the parent's pipe end is left
    non-blocking as it was."""
    import fcntl
    import termios

    run_id, _ = started_waiting(project, intent="x" * 120_000)
    read_end, write_end = os.pipe()
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

        # The reader is slow: nothing is read until the pipe is full or the command ended.
        capacity = fcntl.fcntl(write_end, fcntl.F_GETPIPE_SZ)
        eventually(lambda: pending() >= capacity or proc.poll() is not None, timeout=30,
                   what="the pipe full or the command ended")
        data = bytearray()
        while True:
            eventually(lambda: pending() > 0 or proc.poll() is not None, timeout=30,
                       what="more output or the command's end")
            if pending():
                data += os.read(read_end, 1 << 16)
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
