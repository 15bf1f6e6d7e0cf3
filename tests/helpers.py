"""Shared test helpers: polling with a deadline, running the real CLI, reaping processes."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tests.cli_runner import run_cli

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"

T = TypeVar("T")


def eventually(fn: Callable[[], T | None], *, timeout: float = 10.0, what: str = "condition") -> T:
    """Poll ``fn`` until it returns something truthy; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(delay)  # a poll interval, not a wait for an event
        delay = min(delay * 2, 0.1)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); reap it if it is ours.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def processes_with(*words: bytes) -> list[int]:
    """This user's live processes whose command line holds each of ``words``, found from
    /proc alone (to check what a harness says it reaped without asking the harness)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if all(word in cmdline for word in words) and pid_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def lock_free(path: Path) -> bool:
    """True when no process holds the OS lock on ``path`` (or it does not exist)."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing releases a lock we took
    return True


def port_free(port: int) -> bool:
    """True when 127.0.0.1:``port`` can be bound right now."""
    import socket

    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    @property
    def json(self) -> Any:
        return json.loads(self.stdout)


@dataclass
class Project:
    """A throwaway project and every process started for it (reaped at teardown)."""

    root: Path
    pids: set[int] = field(default_factory=set)

    @property
    def state(self) -> Path:
        return self.root / ".intloom"

    def cli(self, *args: str, input: str | None = None, timeout: float = 60.0,
            env: dict[str, str] | None = None) -> CliResult:
        full_env = {**os.environ, "NO_COLOR": "1", **(env or {})}
        proc = run_cli(["--project", str(self.root), *args], env=full_env, input=input,
                       timeout=timeout)
        self.track_host()
        return CliResult(proc.returncode, proc.stdout, proc.stderr)

    def track_host(self) -> None:
        """Remember the host's pid (from service.json/service.lock) so teardown can reap it."""
        for name in ("service.json", "service.lock"):
            try:
                data = json.loads((self.state / name).read_text())
                self.pids.add(int(data["pid"]))
            except (OSError, ValueError, KeyError, TypeError):
                pass

    def host_pid(self) -> int:
        return int(json.loads((self.state / "service.json").read_text())["pid"])

    def kill_host(self) -> int:
        """SIGKILL the host and wait until it has let go of everything recover needs."""
        pid = self.host_pid()
        os.kill(pid, signal.SIGKILL)
        self.wait_released(pid)
        return pid

    def wait_released(self, pid: int, timeout: float = 15.0) -> None:
        """Until a killed host is gone *and* its OS lock and saved port are free: a zombie
        leader can outlive threads that still hold the lock and the port for a moment."""
        eventually(lambda: not pid_alive(pid), timeout=timeout, what=f"pid {pid} to exit")
        port = json.loads((self.state / "connection.json").read_text())["port"]
        eventually(
            lambda: lock_free(self.state / "service.lock") and port_free(port),
            timeout=timeout, what=f"pid {pid} to release its lock and port {port}",
        )

    def reap(self) -> None:
        """SIGKILL every host started for the project, and every process still running with
        ``--project ROOT`` in its command line: a process a Step forked (a Pool worker) has
        its host's, and one whose host died before the Step could end it was still running
        22 min after a failed test (its parent gone)."""
        strays = processes_with(b"--project\0" + bytes(self.root) + b"\0")
        for pid in [*self.pids, *(pid for pid in strays if pid not in self.pids)]:
            if pid == os.getpid() or not pid_alive(pid):
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 5
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.01)


def ok(result: CliResult) -> Any:
    """The JSON of a command that must have succeeded (the failure shows its output)."""
    assert result.code == 0, (result.code, result.stdout, result.stderr)
    return result.json


def cli_as_a_user(project: Project, *args: str) -> CliResult:
    """The CLI as a user whose file modes bind: as root (this sandbox), without the
    capabilities that let root read and search anything (setpriv, util-linux); skips the
    test where setpriv is missing."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            import pytest  # only a test that needs the modes to bind skips

            pytest.skip("root passes any mode, and setpriv (util-linux) is not here to drop that")
        drop = "-dac_override,-dac_read_search"
        prefix = [setpriv, f"--bounding-set={drop}", f"--inh-caps={drop}"]
    proc = subprocess.run(
        [*prefix, sys.executable, "-m", "intloom", "--project", str(project.root), *args],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)})
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def started_waiting(project: Project, workflow: str = "example",
                    intent: str = "notes") -> tuple[str, str]:
    """Start the project's host and a Run of ``workflow`` that waits for a person (the
    example's confirmation): the Run's id and its pending action's."""
    ok(project.cli("start", "--json"))
    run = ok(project.cli("flow", workflow, "--intent", intent, "--json"))["run"]
    return run["runId"], run["pendingAction"]["id"]


def counters(root: Path) -> dict[str, collections.Counter[str]]:
    """Executions per Run and label, from a fixture's ``counters.log`` (outside the journal)."""
    out: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    log = root / "counters.log"
    if log.exists():
        for line in log.read_text().splitlines():
            run_id, label = line.split(" ", 1)
            out[run_id][label] += 1
    return out


def reaped(project: Project) -> Iterator[Project]:
    """For fixtures: yield ``project``, then kill every host started for it, even on failure."""
    try:
        yield project
    finally:
        project.track_host()
        project.reap()


def one_source_project(tmp_path: Path, name: str, source: str) -> Project:
    """A project whose one Workflow source is ``workflows/<name>.py`` holding ``source``."""
    root = tmp_path / "proj"
    (root / "workflows").mkdir(parents=True)
    (root / "workflows" / f"{name}.py").write_text(source)
    (root / "intloom.toml").write_text(f'workflows = ["workflows/{name}.py"]\n')
    return Project(root=root)


def make_project(tmp_path: Path, name: str = "basic") -> Project:
    root = tmp_path / "proj"
    shutil.copytree(FIXTURES / "projects" / name, root)
    return Project(root=root)


def snapshot_files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes, for byte-identical checks."""
    out: dict[str, bytes] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            out[str(path.relative_to(root))] = path.read_bytes()
    return out


def later_intloom(tmp_path: Path, edits: dict[str, tuple[str, str]]) -> dict[str, str]:
    """The environment that runs a copy of this intloom's package with lines edited as a
    later release would have them (another version, a bumped protocol): the other side of
    an upgrade, without installing one. ``edits`` maps a path inside the package to (old,
    new), each old line found exactly once. Hosts a start launches inherit it."""
    import intloom

    site = tmp_path / "later-intloom"
    package = site / "intloom"
    shutil.copytree(Path(intloom.__file__).parent, package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    for relative, (old, new) in edits.items():
        path = package / relative
        text = path.read_text()
        assert text.count(old) == 1, (path, old)
        path.write_text(text.replace(old, new))
    # PYTHONSAFEPATH: python -m and -c put the working directory first on sys.path, and the
    # repository's own intloom would be imported from there.
    return {"PYTHONPATH": str(site), "PYTHONSAFEPATH": "1"}


def spawn_foreground(project: Project, *options: str,
                     start_options: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    """``intloom [options] start --foreground [start_options]`` started in the project
    root, its output piped (text), its pid in ``project.pids`` for ``project.reap``; not
    waited for."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "intloom", *options, "start", "--foreground", *start_options],
        cwd=project.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)})
    project.pids.add(proc.pid)
    return proc


@contextlib.contextmanager
def foreground_host(project: Project, *options: str) -> Iterator[subprocess.Popen[str]]:
    """``intloom [options] start --foreground`` run in the project root, handed over once it
    serves (its ``service.json`` written); killed and reaped on the way out if it still runs.
    Its output is piped (text): ``proc.communicate`` reads it."""
    proc = spawn_foreground(project, *options)
    try:
        eventually(lambda: (project.state / "service.json").exists() or None, timeout=20,
                   what="the foreground host to serve")
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


@contextlib.contextmanager
def junk_listener(port: int, reply: bytes) -> Iterator[None]:
    """Another program on ``port`` of 127.0.0.1: it answers every connection with ``reply``
    (bytes that are no intloom frame), then closes it."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:  # the socket was shut down: the listener's life is over
                return
            with conn, contextlib.suppress(OSError):  # a client may reset first
                conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        thread.join(timeout=5)
        assert not thread.is_alive()


def run_mypy(args: list[str]) -> tuple[str, str, int]:
    """``mypy.api.run(args)`` in this process, which it leaves as it found it: mypy raises
    the recursion limit for itself (to 16,384), and a test run after it in the same worker
    then saw a value 5,000 levels deep encode where it raised RecursionError; it also sets
    the cyclic collector's thresholds for itself."""
    import gc

    from mypy import api

    limit, thresholds, collecting = sys.getrecursionlimit(), gc.get_threshold(), gc.isenabled()
    try:
        return api.run(args)
    finally:
        sys.setrecursionlimit(limit)
        gc.set_threshold(*thresholds)
        if collecting:
            gc.enable()
