"""Tampered or loose metadata is CLI_SERVICE_METADATA_INVALID: nothing is sent, nothing changes.

The port always comes from the private connection.json, so a rewritten service.json cannot
redirect the token; a file readable by others is refused rather than trusted.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from intloom.client.client import Client
from intloom.client.lifecycle import start_service, stop_service
from intloom.diagnostics.doctor import run_doctor
from intloom.diagnostics.owners import diagnose
from intloom.errors import IntloomError
from tests.helpers import Project, eventually, pid_alive, snapshot_files
from tests.integration.host_support import start


def _rewrite(path: Path, **changes: object) -> None:
    data = json.loads(path.read_bytes())
    data.update(changes)
    path.write_text(json.dumps(data))  # write_text keeps the file's 0600 mode


def _all_refuse(project: Project) -> None:
    calls: list[Callable[[], object]] = [
        lambda: Client.connect(project.root),
        lambda: start_service(project.root),
        lambda: stop_service(project.root),
    ]
    for call in calls:
        with pytest.raises(IntloomError) as invalid:
            call()
        assert invalid.value.code == "CLI_SERVICE_METADATA_INVALID"


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(lambda p: _rewrite(p / "service.json", port=1), id="service-other-port"),
        pytest.param(lambda p: _rewrite(p / "service.json", projectRoot="/elsewhere"),
                     id="service-other-root"),
        pytest.param(lambda p: _rewrite(p / "service.json", url="https://attacker.invalid/"),
                     id="service-unknown-key"),
        pytest.param(lambda p: (p / "service.json").chmod(0o644), id="service-0644"),
        pytest.param(lambda p: (p / "connection.json").chmod(0o644), id="connection-0644"),
        pytest.param(lambda p: (p / "connection.json").write_text("{not json"),
                     id="connection-garbage"),
    ],
)
def test_tampered_metadata_is_refused_and_left_untouched(
    project: Project, tamper: Callable[[Path], None]
) -> None:
    service = start(project).service
    tamper(project.state)
    before = snapshot_files(project.root)
    modes = {p.name: p.stat().st_mode for p in project.state.iterdir()}
    _all_refuse(project)
    assert snapshot_files(project.root) == before
    assert {p.name: p.stat().st_mode for p in project.state.iterdir()} == modes
    # Nothing was requested: the host still runs.
    assert pid_alive(service.pid)


def test_state_directory_that_is_a_link_is_refused(project: Project, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    project.state.symlink_to(elsewhere)
    before = snapshot_files(tmp_path)
    _all_refuse(project)
    assert snapshot_files(tmp_path) == before
    assert project.state.is_symlink()
    assert list(elsewhere.iterdir()) == []


def test_state_directory_open_to_others_is_refused(project: Project) -> None:
    project.state.mkdir(mode=0o755)
    project.state.chmod(0o755)
    with pytest.raises(IntloomError) as invalid:
        start_service(project.root)
    assert invalid.value.code == "CLI_SERVICE_METADATA_INVALID"
    assert "0755" in invalid.value.message
    assert list(project.state.iterdir()) == []


def test_a_token_the_host_rejects_is_named_with_its_fix(project: Project) -> None:
    """connection.json rewritten under a live host: every command says that the file's token
    is not the host's and how to get out (put it back, or stop the host by signal). doctor
    said "alive but does not answer (it may be starting or stopping)": wait, forever."""
    service = start(project).service
    connection = project.state / "connection.json"
    _rewrite(connection, token="B" * 43)
    before = _metadata_files(project)
    with pytest.raises(IntloomError) as refused:
        Client.connect(project.root)
    assert refused.value.code == "UNAUTHORIZED"
    fix = f"kill -TERM {service.pid}"
    for words in (str(connection), "no longer holds the token", fix):
        assert words in refused.value.message
    assert "B" * 43 not in refused.value.message
    with pytest.raises(IntloomError) as rejected:
        stop_service(project.root)
    assert (rejected.value.code, rejected.value.message) == ("UNAUTHORIZED",
                                                             refused.value.message)
    diagnosis = diagnose(project.root)
    assert (diagnosis.status, diagnosis.message) == ("blocked", refused.value.message)
    owners = [c for c in run_doctor(project.root).checks if c.id.startswith("owner.")]
    assert [c.status for c in owners] == ["attention", "attention"]
    for check in owners:
        assert "no longer holds the token" in check.message, check.message
        assert "starting or stopping" not in check.message
        assert check.next is not None and fix in check.next
    assert _metadata_files(project) == before  # the live host's log may grow; nothing else
    assert pid_alive(service.pid)


def test_a_connection_json_removed_under_a_live_host_is_named_with_its_fix(
    project: Project,
) -> None:
    """Every command said "Run intloom start in this project first" (offline), and that
    start refused with CLI_SERVICE_BUSY, "no live host answers": the host runs, and nothing
    can reach it. They say so, with the way out, which works."""
    service = start(project).service
    connection = project.state / "connection.json"
    saved = connection.read_bytes()
    connection.unlink()
    before = _metadata_files(project)
    for call in (lambda: Client.connect(project.root), lambda: start_service(project.root)):
        with pytest.raises(IntloomError) as unreachable:
            call()
        assert unreachable.value.code == "CLI_SERVICE_METADATA_INVALID"
        message = unreachable.value.message
        for words in (f"{connection} is missing", f"pid {service.pid}", "still runs",
                      f"kill -TERM {service.pid}"):
            assert words in message, message
    assert _metadata_files(project) == before and pid_alive(service.pid)
    os.kill(service.pid, signal.SIGTERM)  # the advice: a graceful stop, then a start
    eventually(lambda: not pid_alive(service.pid), what="the host to stop on SIGTERM")
    assert not (project.state / "service.lock").exists()
    again = start(project)
    assert not again.reused and connection.read_bytes() != saved  # a new port and token
    stop_service(project.root)


def test_a_service_lock_removed_under_a_live_host_is_not_called_fine(project: Project) -> None:
    """doctor said "owner.service_lock · ok: No service.lock: no host owns the project
    through it", healthy, exit 0, while the host that created it runs."""
    service = start(project).service
    (project.state / "service.lock").unlink()
    report = run_doctor(project.root)
    [check] = [c for c in report.checks if c.id == "owner.service_lock"]
    assert (report.status, report.health, check.status) == ("running", "attention", "attention")
    assert f"running host (pid {service.pid})" in check.message, check.message
    assert "removed by hand" in check.message and check.next is not None
    assert "intloom stop, then intloom start" in check.next, check.next
    assert not (project.state / "service.lock").exists()  # doctor writes nothing


def _metadata_files(project: Project) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in project.state.iterdir() if p.is_file()}


HOG = '''
import ctypes

import intloom

wf = intloom.Workflow("hog", version="1")
main = wf.stage("main")


@main.step("compute", routes={"ok": intloom.COMPLETE})
def compute(ctx: intloom.StepContext[None]) -> str:
    # A C call that keeps the interpreter lock (PyDLL), as a long pure-Python or C
    # computation does: the host answers nothing meanwhile.
    open("computing", "w").close()
    ctypes.PyDLL(None).sleep(120)
    return "ok"
'''


def test_doctor_tells_a_serving_host_held_by_a_step_from_one_starting_or_stopping(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Step holding the interpreter: doctor said the host "may be starting or stopping"
    and to wait a moment, which never came true. It says the host served and what holds
    it, and names kill -TERM, then kill -9 and recover."""
    from intloom.client.client import HELLO_CAP_ENV

    (project.root / "workflows" / "hog.py").write_text(HOG)
    (project.root / "intloom.toml").write_text(
        'workflows = ["workflows/example.py", "workflows/hog.py"]\n')
    pid = start(project).service.pid
    with Client.connect(project.root) as client:
        client.create_run("hog", "x", wait=False)
    eventually((project.root / "computing").exists, timeout=30, what="the Step to hold it")
    monkeypatch.setenv(HELLO_CAP_ENV, "0.3")
    try:
        checks = {c.id: c for c in run_doctor(project.root).checks}
        # Its service.lock removed by hand too: still the host serving (it has its log
        # open), not "wait a moment", which never comes true.
        (project.state / "service.lock").unlink()
        unlocked = {c.id: c for c in run_doctor(project.root).checks}
    finally:
        project.kill_host()
    for check in (checks["owner.service_json"], unlocked["owner.service_json"]):
        assert check.status == "attention", check
        assert f"pid {pid}, the host serving this project" in check.message, check.message
        assert "starting or stopping" not in check.message, check.message
        assert check.next is not None and f"kill -9 {pid}" in check.next, check.next
