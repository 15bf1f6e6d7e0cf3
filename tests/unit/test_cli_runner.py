"""The suite's way of running the command (tests/cli_runner.py: forked from a server that
imported it once) gives what a fresh ``python -m intloom`` gives: the same status, output,
files and modes, signal state and descriptors; a timeout, or a caller gone, kills the
command as ``subprocess.run`` does; a server gone leaks nothing and runs nothing twice."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from tests import cli_runner
from tests.cli_runner import FRESH_ENV, run_cli
from tests.helpers import eventually, pid_alive

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _served_even_when_the_suite_runs_fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests compare the served command with a fresh one: with INTLOOM_TEST_CLI_FRESH=1
    (the suite run the old way) they would compare two fresh ones."""
    monkeypatch.delenv(FRESH_ENV, raising=False)


def _fresh(args: list[str], env: dict[str, str], input: str | None = None,
           ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "intloom", *args], input=input,
                          capture_output=True, text=True, timeout=60, env=env)


def _served(args: list[str], env: dict[str, str], input: str | None = None,
            ) -> subprocess.CompletedProcess[str]:
    return run_cli(args, env=env, input=input)


@pytest.fixture
def env() -> Iterator[dict[str, str]]:
    yield {**os.environ, "NO_COLOR": "1"}


def _same(a: subprocess.CompletedProcess[str], b: subprocess.CompletedProcess[str],
          swap: tuple[str, str] = ("", "")) -> None:
    assert (a.returncode, a.stdout, a.stderr) == (
        b.returncode, b.stdout.replace(*swap), b.stderr.replace(*swap))


@pytest.mark.parametrize("args", [
    ["--help"],
    ["no-such-command"],
    ["runs", "--json", "--no-such-option"],
    ["answer", "--help"],
], ids=["help", "unknown-command", "unknown-option", "command-help"])
def test_usage_and_help_read_as_from_a_fresh_interpreter(args: list[str],
                                                         env: dict[str, str]) -> None:
    fresh, served = _fresh(args, env), _served(args, env)
    _same(fresh, served)
    assert "intloom" in fresh.stdout + fresh.stderr


def test_errors_stdin_and_working_directory_match(tmp_path: Path, env: dict[str, str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    results = []
    for name, run in (("a", _fresh), ("b", _served)):
        monkeypatch.chdir(tmp_path / name)
        results.append([
            run(["status", "--json"], env),  # no project here: found from the cwd
            run(["answer", "RUN-1", "ASK-1", "-", "--json"], env, input="{not json"),
            run(["answer", "RUN-1", "ASK-1", "-"], env, input=""),
        ])
    for fresh, served in zip(*results, strict=True):
        assert fresh.returncode != 0
        _same(fresh, served, (str(tmp_path / "b"), str(tmp_path / "a")))


def test_init_writes_the_same_files_with_the_callers_umask(tmp_path: Path,
                                                           env: dict[str, str]) -> None:
    old = os.umask(0o027)
    try:
        fresh = _fresh(["--project", str(tmp_path / "a"), "init", "--json"], env)
        served = _served(["--project", str(tmp_path / "b"), "init", "--json"], env)
    finally:
        os.umask(old)
    assert fresh.returncode == 0, fresh.stderr
    _same(fresh, served, (str(tmp_path / "b"), str(tmp_path / "a")))

    def tree(root: Path) -> dict[str, tuple[int, bytes]]:
        return {str(p.relative_to(root)): (p.stat().st_mode, p.read_bytes() if p.is_file()
                                           else b"") for p in sorted(root.rglob("*"))}

    made = tree(tmp_path / "a")
    assert made and all(mode & 0o027 == 0 for mode, _ in made.values())
    assert tree(tmp_path / "b") == made


def test_a_timeout_kills_the_command_and_says_so(tmp_path: Path, env: dict[str, str]) -> None:
    root = tmp_path / "proj"
    assert _fresh(["--project", str(root), "init", "--json"], env).returncode == 0
    server = psutil.Process(cli_runner._the_server().proc.pid)
    with pytest.raises(subprocess.TimeoutExpired):  # with no host, it follows the log file
        run_cli(["--project", str(root), "logs", "--follow"], env=env, timeout=1.5)
    # Dead by the time it is said, as subprocess.run waits for the child it killed: at most
    # a zombie the server has not reaped yet.
    assert all(status == psutil.STATUS_ZOMBIE for status in _statuses(server.children()))
    eventually(lambda: not server.children(), what="the command to be reaped")


def _statuses(processes: list[psutil.Process]) -> list[str]:
    found: list[str] = []
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):  # reaped meanwhile
            found.append(process.status())
    return found


def test_a_command_whose_caller_went_away_is_killed(tmp_path: Path, env: dict[str, str]) -> None:
    """A caller gone before the status (an exception, a test's timeout between the request
    and its reply) left the command running, and the server died on the pid it wrote."""
    root = tmp_path / "proj"
    assert _fresh(["--project", str(root), "init", "--json"], env).returncode == 0
    server = cli_runner._the_server()
    process = psutil.Process(server.proc.pid)
    command = [sys.executable, "-m", "intloom", "--project", str(root), "logs", "--follow"]
    read_end, write_end = os.pipe()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(server.path)
            socket.send_fds(conn, [cli_runner._request(command, env)], [0, write_end, write_end])
            eventually(lambda: process.children(), what="the command to be forked")
        eventually(lambda: not process.children(), what="the command to be killed")
    finally:
        os.close(read_end)
        os.close(write_end)
    assert server.proc.poll() is None  # still serving
    assert run_cli(["--help"], env=env).returncode == 0


def _descriptors(pid: int) -> list[str] | None:
    """What ``pid`` holds past fds 0-2, by kind (pipe, socket, eventpoll...), once it
    catches SIGTERM (``logs --follow`` following)."""
    if _signal_lines(pid) is None:
        return None
    kinds = []
    try:
        for fd in sorted(Path(f"/proc/{pid}/fd").iterdir(), key=lambda p: int(p.name)):
            if int(fd.name) > 2:
                kinds.append(re.sub(r"\[\d+\]$", "", os.readlink(fd)))
    except FileNotFoundError:
        # A descriptor closed between the listing and its readlink (the command is still
        # setting up its watch): not an answer yet, so the caller polls again.
        return None
    return kinds


def _both_read(look: Callable[[int], object], one: int, other: int) -> bool:
    """Whether ``look`` reads the same of both pids, with an answer from each (two "not
    yet" answers are not a match)."""
    mine = look(one)
    return mine is not None and mine == look(other)


def _signal_lines(pid: int) -> dict[str, str] | None:
    """The signals ``pid`` ignores, blocks and catches, once it catches SIGTERM (which
    ``logs --follow`` does while it follows)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    lines = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    found = {key: lines[key] for key in ("SigIgn", "SigBlk", "SigCgt")}
    return found if int(found["SigCgt"], 16) & (1 << (signal.SIGTERM - 1)) else None


def test_signals_ignored_blocked_and_caught_are_as_after_an_exec(tmp_path: Path,
                                                                  env: dict[str, str]) -> None:
    root = tmp_path / "proj"
    assert _fresh(["--project", str(root), "init", "--json"], env).returncode == 0
    args = [sys.executable, "-m", "intloom", "--project", str(root), "logs", "--follow"]
    server = psutil.Process(cli_runner._the_server().proc.pid)
    previous = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    # Pipes, as the served one has: a command watches a pipe for its reader going away.
    fresh = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    served = threading.Thread(target=lambda: _swallow(lambda: run_cli(args[3:], env=env,
                                                                      timeout=30)))
    try:
        served.start()
        child = eventually(lambda: server.children(), what="the served command").pop()
        want = eventually(lambda: _signal_lines(fresh.pid), what="the fresh command's")
        eventually(lambda: _signal_lines(child.pid), what="the served command's")
        # Polled as well: a command blocks SIGINT and SIGTERM for a moment as it starts a
        # thread (readerwatch: the thread takes that mask), which one look can catch.
        eventually(lambda: _both_read(_signal_lines, child.pid, fresh.pid),
                   what="the served command's signals to be the fresh one's")
        want = _signal_lines(fresh.pid) or want
        # And no descriptor of the server (its listener, selector, other commands' pidfds).
        # Polled: each opens its watch's descriptors a moment after its SIGTERM handler is
        # set (logs --follow sets it before printing the log's records), not at once.
        eventually(lambda: _both_read(_descriptors, child.pid, fresh.pid),
                   what="the served command's descriptors to be the fresh one's")
        assert int(want["SigIgn"], 16) & (1 << (signal.SIGUSR1 - 1))
        assert int(want["SigBlk"], 16) & (1 << (signal.SIGUSR2 - 1))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        signal.signal(signal.SIGUSR1, previous)
        fresh.kill()
        fresh.communicate()
        for process in server.children():
            process.kill()
        served.join(timeout=30)


def _swallow(call: Callable[[], object]) -> None:
    with contextlib.suppress(Exception):
        call()  # the test kills it


def test_the_server_is_shared_and_ends_when_its_worker_lets_go(env: dict[str, str]) -> None:
    first = cli_runner._the_server()
    assert run_cli(["--help"], env=env).returncode == 0
    assert cli_runner._the_server() is first and pid_alive(first.proc.pid)
    assert first.proc.stdin is not None
    first.proc.stdin.close()  # as when the worker ends, however it ends
    eventually(lambda: first.proc.poll() is not None, what="the server to end")
    assert first.proc.returncode == 0
    assert run_cli(["--help"], env=env).returncode == 0
    assert cli_runner._the_server() is not first


def test_a_server_gone_before_the_request_runs_the_command_fresh_and_leaks_nothing(
        env: dict[str, str]) -> None:
    """A request that failed on its socket leaked this process's three pipe ends, and the
    test failed instead of running its command."""
    server = cli_runner._the_server()
    os.unlink(server.path)  # it no longer answers there
    before = len(os.listdir("/proc/self/fd"))
    result = run_cli(["--help"], env=env)
    assert result.returncode == 0 and "intloom" in result.stdout, result
    assert len(os.listdir("/proc/self/fd")) == before
    assert cli_runner._the_server() is not server  # the next call starts another
    assert server.proc.poll() is not None  # and the old one was closed
