"""intloom start / stop through the real CLI: JSON shapes, reuse, offline stop, concurrent
stops, crash leftovers, a waiting Run across a restart, and --foreground with Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from intloom.client.client import Client
from tests.helpers import REPO, CliResult, Project, eventually, snapshot_files

pytestmark = pytest.mark.e2e


def _ok(result: CliResult) -> Any:
    assert result.code == 0, (result.code, result.stdout, result.stderr)
    return result.json


def _error(result: CliResult, code: str) -> dict[str, Any]:
    assert result.code == 1, (result.code, result.stdout, result.stderr)
    error: dict[str, Any] = result.json["error"]
    assert error["code"] == code, error
    assert set(error) == {"code", "message", "retryable"}
    assert "Traceback" not in result.stderr
    return error


def test_stop_before_any_start_is_offline_and_creates_nothing(project: Project) -> None:
    before = snapshot_files(project.root)
    assert _ok(project.cli("--json", "stop")) == {
        "projectRoot": str(project.root.resolve()), "stopped": False,
    }
    text = project.cli("stop")
    assert text.code == 0
    assert "not running" in text.stdout
    assert snapshot_files(project.root) == before
    assert not project.state.exists()


def test_start_reuse_stop_and_restart_with_a_waiting_run(project: Project) -> None:
    first = _ok(project.cli("--json", "start"))
    assert first["reused"] is False
    service = first["service"]
    assert {"projectRoot", "pid", "instanceId", "port", "startedAt"} <= set(service)
    again = _ok(project.cli("--json", "start"))
    assert again["reused"] is True
    assert again["service"]["instanceId"] == service["instanceId"]
    other_port = service["port"] + 1 if service["port"] < 65535 else 1024
    _error(project.cli("--json", "start", "--port", str(other_port)), "CLI_SERVICE_CONFLICT")
    anywhere = _error(project.cli("--json", "start", "--port", "0"), "CLI_SERVICE_CONFLICT")
    assert "changing its port to a free one (--port 0 picks it" in anywhere["message"], anywhere

    run = _ok(project.cli("--json", "flow", "example", "--intent", "notes"))["run"]
    assert run["status"] == "waiting"
    token = json.loads((project.state / "connection.json").read_text())["token"]

    assert _ok(project.cli("--json", "stop"))["stopped"] is True
    assert _ok(project.cli("--json", "stop"))["stopped"] is False

    restarted = _ok(project.cli("--json", "start"))
    assert restarted["reused"] is False
    assert restarted["service"]["instanceId"] != service["instanceId"]
    assert restarted["service"]["port"] == service["port"]
    assert json.loads((project.state / "connection.json").read_text())["token"] == token
    assert restarted["service"]["restore"]["waiting"] == [run["runId"]]
    runs = _ok(project.cli("--json", "runs"))["runs"]
    assert runs == [run]
    assert _ok(project.cli("--json", "stop"))["stopped"] is True


def test_concurrent_cli_stops_both_succeed(project: Project) -> None:
    _ok(project.cli("--json", "start"))
    results: list[CliResult] = []
    lock = threading.Lock()

    def stop() -> None:
        result = project.cli("--json", "stop")
        with lock:
            results.append(result)

    threads = [threading.Thread(target=stop) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=50)
    assert [r.code for r in results] == [0, 0], [(r.stdout, r.stderr) for r in results]
    assert any(r.json["stopped"] for r in results)
    assert not (project.state / "service.json").exists()
    assert not (project.state / "service.lock").exists()


def test_sigkilled_host_makes_stop_busy_with_every_file_byte_identical(project: Project) -> None:
    _ok(project.cli("--json", "start"))
    _ok(project.cli("--json", "flow", "example", "--intent", "notes"))
    project.kill_host()
    before = snapshot_files(project.root)
    error = _error(project.cli("--json", "stop"), "CLI_SERVICE_BUSY")
    assert "intloom doctor" in error["message"]
    _error(project.cli("--json", "start"), "CLI_SERVICE_BUSY")
    assert snapshot_files(project.root) == before


def test_a_foreground_host_works_in_the_project_root_as_a_launched_one_does(
    project: Project,
) -> None:
    """A launched host works in the project root (docs/lifecycle.md); start --foreground run
    from a subdirectory worked there instead, so a Workflow reading data/prompt.txt when
    imported failed to load in it only, and a Step's relative paths wrote into that
    subdirectory."""
    where = project.root / "workflows"
    proc = subprocess.Popen(
        [sys.executable, "-m", "intloom", "start", "--foreground"],
        cwd=where, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)},
    )
    _serves_in_the_root_until_sigterm(project, proc)
    # The launched host, for comparison.
    _ok(project.cli("--json", "start"))
    assert os.readlink(f"/proc/{project.host_pid()}/cwd") == str(project.root)
    _ok(project.cli("--json", "stop"))


def test_start_foreground_from_a_removed_directory_serves(
    project: Project, tmp_path: Path,
) -> None:
    """start --foreground --project P run from a directory removed since (a shell left in a
    deleted build directory) failed CLI_INTERNAL_ERROR, exit 70, before the host started:
    the command asked for its working directory to go back to after the host. A launched
    host starts from there; so does this one, and works in the project root."""
    gone = tmp_path / "gone"
    gone.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "intloom", "--project", str(project.root), "start",
         "--foreground"],
        cwd=gone, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)},
        preexec_fn=lambda: os.rmdir(gone),  # in the child, once it is in that directory
    )
    _serves_in_the_root_until_sigterm(project, proc)


def _serves_in_the_root_until_sigterm(project: Project, proc: subprocess.Popen[str]) -> None:
    """The foreground host ``proc`` serves, working in the project root, and stops
    gracefully on SIGTERM (as on Ctrl-C); reaped whatever happens."""
    project.pids.add(proc.pid)
    try:
        eventually(lambda: (project.state / "service.json").exists() or proc.poll() is not None,
                   timeout=20, what="the foreground host to serve")
        assert proc.poll() is None, proc.communicate(timeout=20)
        assert os.readlink(f"/proc/{proc.pid}/cwd") == str(project.root)
        proc.send_signal(signal.SIGTERM)  # a graceful stop, as Ctrl-C is
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, (out, err)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_start_foreground_serves_until_ctrl_c(project: Project) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "intloom", "--project", str(project.root), "start",
         "--foreground"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "NO_COLOR": "1"},
    )
    project.pids.add(proc.pid)
    try:
        eventually(lambda: (project.state / "service.json").exists(), timeout=20,
                   what="the foreground host to serve")
        status = _ok(project.cli("--json", "status"))
        assert status["service"]["pid"] == proc.pid
        # A second one is refused; the host it names runs in the foreground, not "in the
        # background", as the refusal said.
        second = project.cli("--json", "start", "--foreground")
        assert second.code == 1 and second.json["error"]["code"] == "CLI_SERVICE_CONFLICT"
        refusal = second.json["error"]["message"]
        assert f"pid {proc.pid}" in refusal and "background" not in refusal, refusal
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, (out, err)
        assert "Traceback" not in err
        assert not (project.state / "service.json").exists()
        assert not (project.state / "service.lock").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_status_names_a_bounded_number_of_interrupted_runs_and_counts_the_rest(
    asks_project: Project,
) -> None:
    """A restore that interrupts thousands of Runs (waits without recover, a kill -9 while
    they ran) made start and status name every one on one line (1.4 MB for 30,000). The
    text names the first 20 and counts the rest, saying where they are all listed; the JSON
    keeps every id."""
    project = asks_project
    _ok(project.cli("start", "--json"))
    with Client.connect(project.root) as client:
        runs = [client.create_run("triage", f"ticket {i}").run_id for i in range(23)]
    _ok(project.cli("stop", "--json"))
    started = _ok(project.cli("start", "--json"))
    assert sorted(started["service"]["restore"]["interrupted"]) == sorted(runs)
    status = project.cli("status")
    assert status.code == 0, status.stderr
    line = next(x for x in status.stdout.splitlines() if x.startswith("Interrupted ("))
    named = [run for run in runs if run in line]
    assert len(named) == 20, line
    assert line.endswith("and 3 more (intloom runs lists them all). Run intloom inspect RUN "
                         "to see what was in flight."), line
    assert sorted(_ok(project.cli("status", "--json"))["service"]["restore"]["interrupted"]
                  ) == sorted(runs)
    # Where the line points: every interrupted Run is listed there.
    listed = {run["runId"] for run in _ok(project.cli("runs", "--json"))["runs"]}
    assert listed == set(runs)
    _ok(project.cli("stop", "--json"))
