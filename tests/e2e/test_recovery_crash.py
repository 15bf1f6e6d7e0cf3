"""The crash procedure a user follows, with the real CLI and a real SIGKILLed host.

start → flow (waiting) → SIGKILL → status → stop / start refused → doctor → recover --dry-run
→ recover → start with the same port and token → the waiting Run is back with the same action.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from typing import Any

import psutil
import pytest

from intloom.client.client import Client
from intloom.diagnostics import diagnose
from intloom.host.liveness import flock_holders
from intloom.protocol.messages import RunEvent
from tests.helpers import CliResult, Project, junk_listener, snapshot_files

pytestmark = pytest.mark.e2e

SERVICE_FILES = {"service.json", "service.lock"}


def _ok(result: CliResult) -> Any:
    assert result.code == 0, (result.code, result.stdout, result.stderr)
    return result.json


def _error(result: CliResult, *codes: str) -> dict[str, Any]:
    assert result.code != 0, (result.stdout, result.stderr)
    error: dict[str, Any] = result.json["error"]
    assert error["code"] in codes, error
    assert "Traceback" not in result.stderr
    return error


def _kill_host(project: Project) -> int:
    """SIGKILL the host; the diagnosis then sees only gone owners."""
    pid = project.kill_host()
    assert diagnose(project.root, probe=False).status == "recovery_required"
    return pid


def _crash(project: Project) -> int:
    _ok(project.cli("start", "--json"))
    return _kill_host(project)


def _owners(doc: dict[str, Any]) -> list[tuple[str, int, str]]:
    return [(o["resource"], o["pid"], o["status"]) for o in doc["owners"]]


def test_crash_status_doctor_recover_start(project: Project) -> None:
    started = _ok(project.cli("start", "--json"))["service"]

    # recover refuses a live host and leaves its lock alone.
    lock_before = (project.state / "service.lock").read_bytes()
    _error(project.cli("recover", "--json"), "CLI_RECOVERY_BLOCKED")
    assert (project.state / "service.lock").read_bytes() == lock_before

    pid = _kill_host(project)
    assert pid == started["pid"]
    files = snapshot_files(project.state)
    token = json.loads(files["connection.json"])["token"]

    status = _ok(project.cli("status", "--json"))
    assert status["status"] == "recovery_required"
    assert _owners(status) == [("service_info", pid, "absent"), ("service_lock", pid, "absent")]

    doctor = project.cli("doctor", "--json")
    assert doctor.code == 3, doctor.stderr  # attention: recover is needed
    assert token not in doctor.stdout
    report = doctor.json
    assert report["schemaVersion"] == 1 and report["health"] == "attention"
    for key in ("projectRoot", "status", "message"):
        assert report[key] == status[key]
    assert _owners(report) == _owners(status)
    checks = {c["id"]: c for c in report["checks"]}
    assert checks["owner.service_lock"]["status"] == "attention"
    assert checks["owner.service_lock"]["evidence"]
    assert checks["connection"]["status"] == "ok"
    assert set(checks) >= {"config", "runtime_dir", "owner.service_lock", "owner.service_json",
                           "connection", "workflows", "journals"}

    # Neither stop nor start cleans up after a crash; every file stays byte-identical.
    _error(project.cli("stop", "--json"), "CLI_SERVICE_BUSY")
    assert snapshot_files(project.state) == files
    _error(project.cli("start", "--json"), "CLI_SERVICE_BUSY")
    assert snapshot_files(project.state) == files

    plan = _ok(project.cli("recover", "--dry-run", "--json"))
    assert (plan["dryRun"], plan["recovered"]) == (True, False)
    assert plan["paths"] == [".intloom/service.json", ".intloom/service.lock"]
    assert all(item["evidence"] for item in plan["plan"])
    assert snapshot_files(project.state) == files

    done = _ok(project.cli("recover", "--json"))
    assert (done["dryRun"], done["recovered"]) == (False, True)
    assert done["paths"] == plan["paths"]
    after = snapshot_files(project.state)
    assert {k: v for k, v in files.items() if k not in SERVICE_FILES} == after

    assert _ok(project.cli("status", "--json"))["status"] == "offline"
    restarted = _ok(project.cli("start", "--json"))["service"]
    assert restarted["port"] == started["port"]
    assert restarted["instanceId"] != started["instanceId"]
    assert json.loads((project.state / "connection.json").read_text())["token"] == token



def test_waiting_run_is_restored_after_crash_and_recover(project: Project) -> None:
    _ok(project.cli("start", "--json"))
    waiting = _ok(project.cli("flow", "example", "--intent", "survive", "--json"))["run"]
    action_id = waiting["pendingAction"]["id"]
    _kill_host(project)

    # doctor previews the restart: the wait comes back, because the Step has recover.
    doctor = project.cli("doctor", "--json")
    assert doctor.code == 3, doctor.stderr
    [preview] = [p for p in doctor.json["runs"] if p["runId"] == waiting["runId"]]
    assert (preview["journal"], preview["verdict"]["row"]) == ("verified", "restore_wait")
    assert action_id in preview["verdict"]["reason"]

    assert _ok(project.cli("recover", "--json"))["recovered"] is True
    restore = _ok(project.cli("start", "--json"))["service"]["restore"]
    assert waiting["runId"] in restore.get("waiting", [])

    runs = _ok(project.cli("runs", "--json"))["runs"]
    [run] = [r for r in runs if r["runId"] == waiting["runId"]]
    assert run["status"] == "waiting"
    assert run["pendingAction"] == waiting["pendingAction"]
    # attach's history ends with `restored` (docs/cli.md), printed before the Run's view: the
    # earlier host's `waiting` shows the same view, and attach went on as soon as it saw
    # that one, so `restored` came after the view, or never (2 times in 3 by hand).
    for _ in range(4):
        attached = project.cli("attach", waiting["runId"])  # no terminal: no prompt
        assert attached.code == 0, attached.stderr
        lines = attached.stdout.splitlines()
        shown = [line.split()[1] for line in lines if line[:4].isdigit()]
        assert shown[-2:] == ["waiting", "restored"], attached.stdout
        assert lines.index(next(x for x in lines if "  restored  " in x)) < lines.index(
            next(x for x in lines if x.startswith("Waiting for an answer"))), attached.stdout
    # What attach waits for: the host marks the history's end, which is `restored`.
    events: list[RunEvent] = []
    with Client.connect(project.root) as client:
        for event in client.subscribe(waiting["runId"]):
            events.append(event)
            if event.caught_up:
                break
    assert [e.event for e in events][-2:] == ["waiting", "restored"], events
    assert all(e.history for e in events) and events[-1].run == events[-2].run
    answered = _ok(project.cli(
        "answer", waiting["runId"], action_id, '{"isConfirmed": true}', "--json"
    ))["run"]
    assert answered["status"] == "completed"


def test_foreign_listener_on_the_saved_port_blocks_recover(project: Project) -> None:
    _crash(project)
    files = snapshot_files(project.state)
    port = json.loads(files["connection.json"])["port"]
    with junk_listener(port, b"HTTP/1.1 503 Service Unavailable\r\n\r\n"):
        status = _ok(project.cli("status", "--json"))
        assert status["status"] == "blocked"
        error = _error(project.cli("recover", "--json"), "CLI_RECOVERY_BLOCKED")
        assert "hello" in error["message"] or "port" in error["message"]
        assert snapshot_files(project.state) == files
    # With the port free again the same leftovers recover normally.
    assert _ok(project.cli("recover", "--json"))["recovered"] is True
    _ok(project.cli("start", "--json"))



def test_a_lock_held_after_the_host_died_names_the_process_holding_it(
    project: Project,
) -> None:
    """The host is gone but another process holds the OS lock on service.lock (a Step's
    child that kept it, a tool of the user's): nothing may be cleaned up, and the evidence
    names that process (it said "a live process" only), so letting it exit does not start
    with a hunt for it."""
    _crash(project)
    files = snapshot_files(project.state)
    with subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
         "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
         str(project.state / "service.lock")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            named = f"held by a live process: pid {holder.pid} ("
            status = _ok(project.cli("status", "--json"))
            assert status["status"] == "blocked"
            found = [e["found"] for o in status["owners"] for e in o["evidence"]
                     if e["check"] == "os_lock"]
            assert len(found) == 2 and all(named in f for f in found), found
            error = _error(project.cli("recover", "--json"), "CLI_RECOVERY_BLOCKED")
            assert named in error["message"], error
            doctor = project.cli("doctor")
            assert doctor.code == 4 and named in doctor.stdout, (doctor.code, doctor.stdout)
            assert snapshot_files(project.state) == files
        finally:
            holder.kill()
    assert _ok(project.cli("recover", "--json"))["recovered"] is True


_HANDS_DOWN = """
import fcntl, os, subprocess, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], pass_fds=[fd])
print(child.pid, flush=True)
"""


def test_a_lock_inherited_from_an_exited_process_names_the_heir(project: Project) -> None:
    """The process that took the OS lock on service.lock exited, and a child it started
    holds the lock through the inherited descriptor. /proc/locks still names the exited
    pid, and the evidence said "held by a live process: pid N" of a pid no process has."""
    _crash(project)
    files = snapshot_files(project.state)
    heir = 0
    with subprocess.Popen([sys.executable, "-c", _HANDS_DOWN, str(project.state / "service.lock")],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as taker:
        try:
            assert taker.stdout is not None
            heir = int(taker.stdout.readline())
            assert taker.wait(timeout=30) == 0  # the taker has exited; its child holds on
            # In a pid namespace that does not see the taker, /proc/locks names no one.
            seen = taker.pid in (flock_holders(project.state / "service.lock") or [])
            took = (f", through a descriptor inherited from pid {taker.pid} (which took the "
                    "lock and has exited)") if seen else ""
            named = (f"held by a live process: pid {heir} ({psutil.Process(heir).name()})"
                     f"{took} (the kernel's /proc/locks and /proc/PID/fdinfo)")
            error = _error(project.cli("recover", "--json"), "CLI_RECOVERY_BLOCKED")
            assert named in error["message"], error
            assert snapshot_files(project.state) == files
        finally:
            assert taker.stdin is not None
            taker.stdin.close()  # the heir reads it to its end, then exits
            if heir:
                with contextlib.suppress(psutil.NoSuchProcess):
                    psutil.Process(heir).wait(timeout=30)
    assert _ok(project.cli("recover", "--json"))["recovered"] is True


def test_a_service_json_without_a_lock_naming_a_live_process_is_not_called_serving(
        project: Project) -> None:
    """A service.json with no service.lock beside it, naming a live process and its create
    time (anyone may read both; pid 1's, say): doctor called it "the host serving this
    project ... which is alive but does not answer" and advised kill -TERM, as a last resort
    kill -9, of that process. A serving host holds its lock; without one, no kill is
    advised."""
    _crash(project)
    (project.state / "service.lock").unlink()
    with subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                          stdin=subprocess.PIPE) as other:
        try:
            path = project.state / "service.json"
            data = json.loads(path.read_text())
            data.update(pid=other.pid, createTime=round(psutil.Process(other.pid)
                                                        .create_time(), 2))
            path.write_text(json.dumps(data, separators=(",", ":")))
            connection = project.state / "connection.json"
            for case in ("as it is", "connection.json readable by others",
                         "connection.json gone"):
                if case == "connection.json readable by others":
                    connection.chmod(0o644)
                if case == "connection.json gone":
                    connection.unlink()
                doctor = project.cli("doctor", "--json")
                checks = {c["id"]: c for c in doctor.json["checks"]}
                check = checks["owner.service_json"]
                assert f"pid {other.pid}" in check["message"], (case, check)
                assert "holds nothing of this project" in check["message"], (case, check)
                for each in doctor.json["checks"]:
                    assert "kill" not in (each.get("next") or ""), (case, each)
        finally:
            other.kill()


def test_no_kill_is_advised_of_a_pid_not_proved_to_hold_the_project(project: Project) -> None:
    """The "serving host" verdict, with its advice to kill the pid, needs proof that the pid
    holds a file of the project (service.lock, runtime/ or its log open): pid 1, whose
    descriptors may not be readable, named with its create time by a planted service.json,
    with or without a service.lock nobody holds; or a service.json whose logFile is no
    plain name (/dev/null, which any process may have open) naming a live process."""
    _crash(project)
    lock = project.state / "service.lock"
    path = project.state / "service.json"
    data = json.loads(path.read_text())
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                          stdin=subprocess.DEVNULL) as other:
        try:
            cases = [("pid 1, lock kept", 1, None, True), ("pid 1, no lock", 1, None, False),
                     ("logFile /dev/null", other.pid, "/dev/null", False)]
            for case, pid, log_file, keep_lock in cases:
                if not keep_lock and lock.exists():
                    lock.unlink()
                planted = {**data, "pid": pid,
                           "createTime": round(psutil.Process(pid).create_time(), 2)}
                if log_file is not None:
                    planted["logFile"] = log_file
                path.write_text(json.dumps(planted, separators=(",", ":")))
                doctor = project.cli("doctor", "--json")
                for each in doctor.json["checks"]:
                    assert "kill" not in (each.get("next") or ""), (case, each)
                    assert "the host serving this project" not in each["message"], (case, each)
        finally:
            other.kill()


def test_metadata_naming_a_live_process_that_is_no_host_says_so(project: Project) -> None:
    """service.json and service.lock name a live process, with its create time, that holds
    neither the project's lock nor any descriptor on service.lock: a host keeps both for
    its life, so it is not this project's host. Nothing may be cleaned up while it lives,
    and doctor said "it may be starting or stopping. Wait a moment", which never ends."""
    _crash(project)
    with subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                          stdin=subprocess.PIPE) as other:
        try:
            name = psutil.Process(other.pid).name()
            for file in ("service.json", "service.lock"):
                path = project.state / file
                data = json.loads(path.read_text())
                data.update(pid=other.pid, createTime=round(psutil.Process(other.pid)
                                                            .create_time(), 2))
                path.write_text(json.dumps(data, separators=(",", ":")))
            files = snapshot_files(project.state)
            assert _ok(project.cli("status", "--json"))["status"] == "blocked"
            _error(project.cli("recover", "--json"), "CLI_RECOVERY_BLOCKED")
            doctor = project.cli("doctor", "--json")
            assert doctor.code == 4, (doctor.code, doctor.stdout, doctor.stderr)
            checks = {c["id"]: c for c in doctor.json["checks"]}
            for check in (checks["owner.service_lock"], checks["owner.service_json"]):
                assert f"pid {other.pid} ({name})" in check["message"], check
                assert "does not hold this project's service.lock" in check["message"], check
                assert "Wait a moment" not in check["next"], check
                assert f"ps -p {other.pid}" in check["next"], check
                assert "lock_descriptor" in {e["check"] for e in check["evidence"]}, check
            assert snapshot_files(project.state) == files
        finally:
            other.kill()
    assert _ok(project.cli("recover", "--json"))["recovered"] is True
