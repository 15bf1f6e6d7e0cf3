"""A start that fails leaves no journal segment: each one that failed after its store opened
(the port taken during the Workflows' import, too few file descriptors) left a new segment
of a header and a seal in ``.intloom/runtime/wal/``, so a supervisor retrying a broken start
every few seconds filled it without bound. Its log is kept (evidence), and ``doctor`` names
the last start's error from it; a start that then succeeds writes its segment as always.

Real CLI and host subprocesses, a real listener in the host (the Workflow module's).
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers import Project, ok, one_source_project, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

_WORKFLOW = '''
import intloom

wf = intloom.Workflow("hello", version="1.0.0")
main = wf.stage("main")


@main.step("say", routes={"said": intloom.COMPLETE})
def say(ctx):
    return "said"
'''

# In the host only (doctor imports the module too): takes the project's port while the host
# imports it, so the host's own listen fails (EADDRINUSE) after its store opened.
_TAKES_PORT = '''
import socket
import sys

if getattr(sys.modules["__main__"].__spec__, "name", "") == "intloom.host.__main__":
    _taken = socket.socket()
    _taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    _taken.bind(("127.0.0.1", {port}))
    _taken.listen(1)
'''

_RETRIES = 4


@pytest.fixture
def hello(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "hello", _WORKFLOW))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _segments(project: Project) -> list[str]:
    wal = project.state / "runtime" / "wal"
    return sorted(p.name for p in wal.iterdir()) if wal.is_dir() else []


def _logs(project: Project) -> list[str]:
    return sorted(p.name for p in (project.state / "logs").iterdir())


def _start_with_fd_limit(project: Project, limit: int) -> subprocess.CompletedProcess[str]:
    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    try:
        return subprocess.run(
            [sys.executable, "-m", "intloom", "--project", str(project.root), "start",
             "--json"], capture_output=True, text=True, timeout=90, preexec_fn=lower,
            env={**os.environ, "NO_COLOR": "1"})
    finally:
        project.track_host()


def _retried(project: Project,
             start: Callable[[], tuple[int, dict[str, str]]]) -> tuple[list[str], str]:
    """``_RETRIES`` failed starts (``start``: one, its exit code and error) of a project
    whose host started and stopped once: the segments before them (none added), and the
    last start's error message."""
    segments, logs = _segments(project), _logs(project)
    assert len(segments) == 1, segments
    message = ""
    for _ in range(_RETRIES):
        code, error = start()
        assert code == 1 and error["code"] == "CLI_SERVICE_UNAVAILABLE", (code, error)
        message = error["message"]
        assert not (project.state / "service.lock").exists()
        assert not (project.state / "service.json").exists()
    # No segment for any of them, and every log kept (what each start did, and why it failed).
    assert _segments(project) == segments
    assert len(_logs(project)) == len(logs) + _RETRIES, _logs(project)
    return segments, message


def _doctor_names(project: Project, message: str) -> None:
    doctor = ok(project.cli("doctor", "--json"))
    assert doctor["status"] == "offline", doctor
    [last] = [c for c in doctor["checks"] if c["id"] == "last_host"]
    newest = _logs(project)[-1]
    assert last["status"] == "ok" and last["message"].startswith("The last start failed at ")
    assert f"(.intloom/logs/{newest}): CLI_SERVICE_UNAVAILABLE: {message}" in last["message"], \
        last


def _starts_again(project: Project, segments: list[str]) -> None:
    ok(project.cli("start", "--json"))
    run = ok(project.cli("flow", "hello", "--intent", "x", "--json"))["run"]
    assert run["status"] == "completed", run
    ok(project.cli("stop", "--json"))
    after = _segments(project)
    assert len(after) == len(segments) + 1 and after[:-1] == segments, after
    # The new segment holds the Run's records: the store began as it always did.
    assert (project.state / "runtime" / "wal" / after[-1]).stat().st_size > 1000
    doctor = ok(project.cli("doctor", "--json"))
    assert "last_host" not in {c["id"] for c in doctor["checks"]}, doctor


def test_starts_that_fail_on_a_port_taken_in_the_import_leave_no_segment(
        hello: Project) -> None:
    source = hello.root / "workflows" / "hello.py"
    port = _free_port()
    config = hello.root / "intloom.toml"
    config.write_text(config.read_text() + f"port = {port}\n")
    ok(hello.cli("start", "--json"))
    ok(hello.cli("stop", "--json"))
    source.write_text(_WORKFLOW + _TAKES_PORT.format(port=port))

    def start() -> tuple[int, dict[str, str]]:
        result = hello.cli("start", "--json")
        return result.code, result.json["error"]

    segments, message = _retried(hello, start)
    assert "another program took the port while the Workflows were imported" in message
    _doctor_names(hello, message)
    source.write_text(_WORKFLOW)
    _starts_again(hello, segments)


def test_starts_refused_for_want_of_descriptors_leave_no_segment(hello: Project) -> None:
    ok(hello.cli("start", "--json"))  # a project with a journal, as a supervisor's has
    ok(hello.cli("stop", "--json"))

    def start() -> tuple[int, dict[str, str]]:
        result = _start_with_fd_limit(hello, 24)
        return result.returncode, json.loads(result.stdout)["error"]

    segments, message = _retried(hello, start)
    assert "file descriptors open once started" in message, message
    _doctor_names(hello, message)
    _starts_again(hello, segments)
