"""One invalid metadata file does not hide the other: with a live host holding
``service.lock`` and ``service.json`` truncated (or the other way round), doctor still shows
the valid file's owner as alive, with its evidence, and reports only the broken file as
invalid. Real host; it is stopped through its own signal handler and reaped."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Project, eventually, pid_alive, snapshot_files, started_waiting

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@pytest.mark.parametrize(("broken", "valid"), [
    ("service.json", "service.lock"), ("service.lock", "service.json"),
])
def test_a_valid_file_beside_an_invalid_one_is_judged_not_reported_absent(
    project: Project, broken: str, valid: str,
) -> None:
    assert project.cli("start").code == 0
    pid = project.host_pid()
    path = project.state / broken
    original = path.read_bytes()
    os.truncate(path, 20)
    try:
        doctor = project.cli("doctor", "--json")
        text = project.cli("doctor")
    finally:
        path.write_bytes(original)
    assert doctor.code == 4, doctor.stdout
    report = doctor.json
    assert report["health"] == "blocked"
    resource = "service_lock" if valid == "service.lock" else "service_info"
    assert [(o["resource"], o["pid"], o["status"]) for o in report["owners"]] == [
        (resource, pid, "alive")
    ], report["owners"]
    checks = {c["id"]: c for c in report["checks"]}
    valid_check = checks[f"owner.{valid.replace('.', '_')}"]
    broken_check = checks[f"owner.{broken.replace('.', '_')}"]
    assert valid_check["status"] == "attention", valid_check
    assert f"No {valid}" not in valid_check["message"]
    assert f"pid {pid}, which is alive" in valid_check["message"]
    assert f"because {broken} is invalid" in valid_check["message"]
    assert f"kill -TERM {pid}" in valid_check["next"]
    assert {e["check"] for e in valid_check["evidence"]} >= {"process", "os_lock"}
    assert broken_check["status"] == "attention"
    assert "is not valid metadata" in broken_check["message"]
    assert f"No {valid}" not in text.stdout

    # The file restored, the host is whole again; let it stop on its own.
    os.kill(pid, signal.SIGTERM)
    eventually(lambda: not pid_alive(pid), timeout=15, what=f"host {pid} to stop")


def test_doctor_does_not_recommend_a_recover_that_an_invalid_connection_json_blocks(
    project: Project,
) -> None:
    assert project.cli("start").code == 0
    project.kill_host()
    connection = project.state / "connection.json"
    connection.write_bytes(b"")  # a crash or a full disk while it was written
    doctor = project.cli("doctor", "--json")
    recover = project.cli("recover", "--json")
    # Blocked by invalid metadata (DESIGN), naming what is wrong with the file.
    assert recover.code != 0 and recover.json["error"]["code"] == "CLI_RECOVERY_BLOCKED"
    assert "is empty" in recover.json["error"]["message"], recover.json
    assert recover.json["error"]["message"].endswith("No cleanup performed."), recover.json
    checks = {c["id"]: c for c in doctor.json["checks"]}
    for owner in ("owner.service_lock", "owner.service_json"):
        assert "has exited" in checks[owner]["message"], checks[owner]
        assert "Run intloom recover" not in checks[owner]["next"], checks[owner]
        assert "intloom recover refuses while connection.json is invalid" in (
            checks[owner]["next"])
    message = checks["connection"]["message"]
    assert "is empty" in message and "run intloom doctor" not in message, message
    assert connection.read_bytes() == b""


def test_a_lost_connection_json_after_a_crash_has_a_way_out_that_works(
    project: Project,
) -> None:
    """recover needs the saved port (DESIGN), so it refuses; what doctor says to do instead
    is followed here, and the project starts again."""
    assert project.cli("start").code == 0
    pid = project.kill_host()
    (project.state / "connection.json").unlink()
    refused = project.cli("recover", "--json")
    assert refused.json["error"]["code"] == "CLI_RECOVERY_BLOCKED", refused.stdout
    doctor = project.cli("doctor", "--json")
    [connection] = [c for c in doctor.json["checks"] if c["id"] == "connection"]
    assert "remove .intloom/service.lock and .intloom/service.json yourself" in (
        connection["next"]), connection
    owners = {o["resource"]: o["status"] for o in doctor.json["owners"]}
    assert owners == {"service_info": "absent", "service_lock": "absent"}, doctor.stdout
    assert not pid_alive(pid)
    for name in ("service.lock", "service.json"):
        (project.state / name).unlink()
    started = project.cli("start", "--json")
    assert started.code == 0, started.stdout
    assert (project.state / "connection.json").exists()
    assert project.cli("stop", "--json").code == 0


def test_a_damaged_connection_json_with_no_host_has_a_way_out_that_works(
    project: Project,
) -> None:
    """After a clean stop, a damaged connection.json blocked start, status and recover, and
    doctor said only "fix or move it by hand". Its next step is now concrete; followed to
    the letter, the project starts with a new token and the waiting Run is restored."""
    assert project.cli("start").code == 0
    run_id = project.cli("flow", "example", "--intent", "kept", "--json").json["run"]["runId"]
    assert project.cli("stop").code == 0
    connection = project.state / "connection.json"
    token = json.loads(connection.read_bytes())["token"]
    connection.write_bytes(b'{"version": 1,')  # a hand edit cut short
    assert project.cli("start", "--json").json["error"]["code"] == (
        "CLI_SERVICE_METADATA_INVALID")
    doctor = project.cli("doctor", "--json")
    [check] = [c for c in doctor.json["checks"] if c["id"] == "connection"]
    assert "is not valid metadata" in check["message"], check
    step = check["next"]
    assert "No host owns this project" in step and "restores the Runs" in step, step
    command = step[step.index("(mv ") + 1:step.index(")", step.index("(mv "))]
    subprocess.run(command, shell=True, check=True, cwd=project.root, timeout=10)
    assert (project.state / "connection.json.damaged").read_bytes() == b'{"version": 1,'
    assert project.cli("start").code == 0
    assert json.loads(connection.read_bytes())["token"] != token
    runs = project.cli("runs", "--json").json["runs"]
    assert [(r["runId"], r["status"]) for r in runs] == [(run_id, "waiting")], runs
    assert project.cli("stop").code == 0


def test_a_copy_put_back_where_a_running_project_was_moved_from_reaches_no_host(
    project: Project,
) -> None:
    """The project moved while its host ran, and a copy put back at the old path: the
    copy's files name the live host, its port, token and root, all copied. The hello
    matched, so every command in the copy acted on the moved directory's Runs (a Run
    "created" there was journaled in the other). The host does not hold the copy's lock:
    no command reaches it, nothing is sent, and doctor says not to signal it."""
    started_waiting(project)
    pid = project.host_pid()
    moved = project.root.with_name("moved")
    project.root.rename(moved)
    shutil.copytree(moved, project.root, symlinks=True)
    before = snapshot_files(moved / ".intloom")
    flowed = project.cli("flow", "example", "--intent", "in the copy", "--json")
    assert flowed.code == 1, flowed.stdout
    error = flowed.json["error"]
    assert error["code"] == "CLI_SERVICE_METADATA_INVALID", error
    assert f"names the live pid {pid}" in error["message"], error
    assert "is not this project's host" in error["message"], error
    assert "Nothing was sent, the token included" in error["message"], error
    stop = project.cli("stop", "--json")
    assert stop.json["error"]["code"] == "CLI_SERVICE_METADATA_INVALID", stop.stdout
    doctor = project.cli("doctor", "--json")
    checks = {c["id"]: c for c in doctor.json["checks"]}
    for owner in ("owner.service_lock", "owner.service_json"):
        assert "it is not this project's host" in checks[owner]["message"], checks[owner]
        assert f"do not signal pid {pid}" in checks[owner]["next"], checks[owner]
    assert pid_alive(pid)
    # Nothing reached the moved host's files (its log is the one file a request may touch).
    after = snapshot_files(moved / ".intloom")
    assert {k: v for k, v in after.items() if "/logs/" not in k} == {
        k: v for k, v in before.items() if "/logs/" not in k}


def test_a_copied_project_does_not_advise_signalling_the_original_host(
    project: Project, tmp_path: Path,
) -> None:
    """A project directory copied with its .intloom/ while its host runs: the copy's
    service.lock names the original's live host. doctor in the copy advised "kill -TERM PID"
    to stop it, which stops the other project's host. That pid does not hold the copy's
    service.lock (its OS lock is free), so doctor now says it is not this project's host and
    not to signal it."""
    assert project.cli("start").code == 0
    pid = project.host_pid()
    copy = Project(root=tmp_path / "copy")
    shutil.copytree(project.root, copy.root, symlinks=True)
    before = snapshot_files(copy.root)
    doctor = copy.cli("doctor", "--json")
    assert doctor.code == 4, doctor.stdout
    checks = {c["id"]: c for c in doctor.json["checks"]}
    lock_check = checks["owner.service_lock"]
    assert lock_check["status"] == "attention"
    assert "not this project's host" in lock_check["message"], lock_check
    # The proof: that pid has no descriptor open on the copy's service.lock.
    assert "lock_descriptor" in {e["check"] for e in lock_check["evidence"]}, lock_check
    assert "kill" not in lock_check["next"], lock_check
    assert f"Do not signal pid {pid}" in lock_check["next"], lock_check
    assert snapshot_files(copy.root) == before
    assert pid_alive(pid)
    assert project.cli("status", "--json").json["service"]["pid"] == pid


# A first start stopped where the host has linked service.lock into place (complete, naming
# it) and has not yet taken its OS lock: Ownership.take_lock is create_lock_file, then
# _flock, which here first waits until the test closes stdin. create_lock_file locks the
# file from its creation (hold_temp) unless flock fails there, as it does on a file system
# without it (then _flock is the first to try), or the host predates it: hold_temp is made
# a no-op, else the lock is held and the state this test is about never arises.
LINKED_NOT_LOCKED = textwrap.dedent('''
    import sys
    import uuid
    from pathlib import Path

    from intloom.host import metadata, ownership
    from intloom.host.logfile import utc_now
    from intloom.host.metadata import current_identity
    from intloom.project import ProjectPaths

    flock = ownership._flock


    def linked(fd: int, path: Path) -> bool:
        print("linked", flush=True)
        sys.stdin.read()  # until the test lets it go; then it takes the lock, and exits
        return flock(fd, path)


    ownership._flock = linked
    metadata.hold_temp = lambda fd: None
    host = ownership.Ownership(ProjectPaths(Path(sys.argv[1])), str(uuid.uuid4()),
                               current_identity(), utc_now())
    host.take_lock()
''')


def test_a_first_start_before_it_holds_its_lock_is_not_called_another_projects_host(
    project: Project,
) -> None:
    """Between a first start linking service.lock into place and taking its OS lock, doctor
    found the lock free, the pid it names alive and connection.json missing, and called
    that starting host "not this project's host", advising to move its service.lock aside
    by hand (what doctor forbids for every other live owner). A free lock is proof only
    when the pid has no descriptor open on that very file: this one has, so doctor says it
    holds the project and to leave its files as they are."""
    with subprocess.Popen([sys.executable, "-c", LINKED_NOT_LOCKED, str(project.root)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as starting:
        project.pids.add(starting.pid)
        assert starting.stdin is not None and starting.stdout is not None
        try:
            assert starting.stdout.readline() == "linked\n"
            before = snapshot_files(project.root)
            doctor = project.cli("doctor", "--json")
            assert snapshot_files(project.root) == before
        finally:
            starting.stdin.close()  # it takes its lock and exits
            starting.wait(timeout=30)
    assert starting.returncode == 0
    assert doctor.code == 4, doctor.stdout
    [owner] = doctor.json["owners"]
    assert (owner["resource"], owner["pid"], owner["status"]) == (
        "service_lock", starting.pid, "alive"), owner
    lock_check = {c["id"]: c for c in doctor.json["checks"]}["owner.service_lock"]
    assert lock_check["status"] == "attention", lock_check
    assert "not this project's host" not in lock_check["message"], lock_check
    assert f"pid {starting.pid}, which is alive: it still holds the project" in (
        lock_check["message"]), lock_check
    assert "aside" not in lock_check["next"], lock_check
    assert "Leave both files as they are" in lock_check["next"], lock_check


@pytest.mark.parametrize("name", ["service.lock", "service.json"])
def test_a_create_time_no_date_can_show_is_invalid_metadata_not_an_internal_error(
    project: Project, name: str,
) -> None:
    """A crash's service.lock (or service.json) whose createTime was hand-edited or damaged
    into a number no date can show (year 33658), beside a pid that is alive: status,
    doctor, recover and start all failed CLI_INTERNAL_ERROR, exit 70, formatting the saved
    time for the "pid was reused" evidence. It is invalid metadata, kept as it is."""
    # A live pid (this test's own; teardown never signals it) whose create time is compared.
    before = _edited_after_a_kill(project, name, pid=os.getpid(), createTime=1e12)
    for error in _refused_as_invalid(project):
        assert name in error["message"] and "createTime" in error["message"], error
    # start refuses as before any invalid lock (busy) or service.json (invalid).
    started = project.cli("start", "--json")
    assert started.code == 1, (started.code, started.stdout, started.stderr)
    assert started.json["error"]["code"] in (
        "CLI_SERVICE_BUSY", "CLI_SERVICE_METADATA_INVALID"), started.stdout
    doctor = project.cli("doctor", "--json")
    assert doctor.code == 4, (doctor.stdout, doctor.stderr)
    [check] = [c for c in doctor.json["checks"] if c["id"] == f"owner.{name.replace('.', '_')}"]
    assert check["status"] == "attention" and "createTime" in check["message"], check
    assert snapshot_files(project.state) == before


def test_a_connection_token_of_other_characters_is_invalid_metadata_not_an_internal_error(
    project: Project,
) -> None:
    """A hand-edited connection.json whose token has the right length (43) but characters a
    token never has (here non-ASCII): status said offline, doctor called the file valid
    (healthy, exit 0), and start failed CLI_INTERNAL_ERROR, exit 70, 'The host failed while
    starting': the host encodes the token as ASCII. Only base64url is a token; the file is
    invalid metadata, named, and kept as it is."""
    assert project.cli("start").code == 0
    assert project.cli("stop").code == 0
    connection = project.state / "connection.json"
    data = json.loads(connection.read_text())
    data["token"] = "é" * 43
    connection.write_text(json.dumps(data))
    before = snapshot_files(project.state)
    for args in (("status",), ("start",)):
        result = project.cli(*args, "--json")
        assert result.code == 1, (args, result.code, result.stdout, result.stderr)
        error = result.json["error"]
        assert error["code"] == "CLI_SERVICE_METADATA_INVALID", (args, error)
        assert "connection.json" in error["message"] and "token" in error["message"], error
        assert "é" not in error["message"], error  # the token is never shown
    doctor = project.cli("doctor", "--json")
    assert doctor.code == 4, (doctor.stdout, doctor.stderr)
    [check] = [c for c in doctor.json["checks"] if c["id"] == "connection"]
    assert check["status"] == "attention" and "token" in check["message"], check
    assert {k: v for k, v in snapshot_files(project.state).items()
            if not k.startswith("logs/")} == {
        k: v for k, v in before.items() if not k.startswith("logs/")}


@pytest.mark.parametrize("port", [65536, -1])
def test_a_service_json_port_no_socket_can_have_is_invalid_metadata_not_an_internal_error(
    project: Project, port: int,
) -> None:
    """After a crash, a service.json whose port was damaged or hand-edited out of 1..65535:
    status, doctor and recover failed CLI_INTERNAL_ERROR, exit 70, checking whether that port
    is taken (bind() refuses such a number). It is invalid metadata, as the same port in
    connection.json is, and kept as it is."""
    before = _edited_after_a_kill(project, "service.json", port=port)
    for error in _refused_as_invalid(project):
        assert f"names port {port}, outside 1..65535" in error["message"], error
    doctor = project.cli("doctor", "--json")
    assert doctor.code == 4, (doctor.stdout, doctor.stderr)
    [check] = [c for c in doctor.json["checks"] if c["id"] == "owner.service_json"]
    assert check["status"] == "attention" and "outside 1..65535" in check["message"], check
    assert snapshot_files(project.state) == before


@pytest.mark.parametrize(("name", "pid"), [
    ("service.lock", -1), ("service.json", 2**31), ("service.lock", 2**63),
])
def test_a_pid_no_process_can_have_fails_every_command_as_invalid_metadata(
    project: Project, name: str, pid: int,
) -> None:
    """After a crash, a service.lock or service.json naming a pid that no process can have
    (damaged or hand-edited): status and doctor said so, but start (and runs, for
    service.json) failed CLI_INTERNAL_ERROR, exit 70: psutil refuses a pid below 1, and
    os.kill one beyond a C int. Every reader now refuses the file the same way."""
    assert project.cli("start").code == 0
    project.kill_host()
    path = project.state / name
    data = json.loads(path.read_text())
    data["pid"] = pid
    path.write_text(json.dumps(data))
    before = snapshot_files(project.state)
    try:
        for args in (("status",), ("recover",), ("runs",), ("start",)):
            result = project.cli(*args, "--json")
            assert result.code == 1, (args, result.code, result.stdout, result.stderr)
            error = result.json["error"]
            if args == ("start",) and name == "service.lock":
                # Refused as status refuses it, naming the fact (it said "locked, use
                # intloom recover once its owner has exited" until 2026-12-05: recover
                # refuses it too, and nothing says who that owner is).
                assert error["code"] == "CLI_SERVICE_METADATA_INVALID", error
                assert f"names pid {pid}, which no process can have" in error["message"]
                continue
            if args == ("runs",) and name == "service.lock":
                continue  # runs reads service.json and connection.json only
            assert error["code"] == _invalid_code(args), (args, error)
            assert f"names pid {pid}, which no process can have" in error["message"], error
        assert project.cli("doctor", "--json").code == 4
        assert snapshot_files(project.state) == before
    finally:
        project.pids.discard(pid)  # no process to reap; os.kill refuses such a number
        path.unlink()


def _edited_after_a_kill(project: Project, name: str, **fields: Any) -> dict[str, bytes]:
    """Start a host, SIGKILL it, and set ``fields`` in the metadata file ``name`` it left
    (as damage or a hand edit would). Returns the files as they then are."""
    assert project.cli("start").code == 0
    project.kill_host()
    path = project.state / name
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
    return snapshot_files(project.state)


def _invalid_code(args: tuple[str, ...]) -> str:
    """A command's code for invalid metadata: recover is blocked by it (DESIGN), with the
    reader's finding; every other command reports the finding itself."""
    return "CLI_RECOVERY_BLOCKED" if args[0] == "recover" else "CLI_SERVICE_METADATA_INVALID"


def _refused_as_invalid(project: Project) -> list[dict[str, Any]]:
    """``status``, ``recover --dry-run`` and ``recover`` each refuse invalid metadata (exit
    1; CLI_SERVICE_METADATA_INVALID, recover's CLI_RECOVERY_BLOCKED); their errors."""
    errors = []
    for args in (("status",), ("recover", "--dry-run"), ("recover",)):
        result = project.cli(*args, "--json")
        assert result.code == 1, (args, result.code, result.stdout, result.stderr)
        error = result.json["error"]
        assert error["code"] == _invalid_code(args), (args, error)
        errors.append(error)
    return errors
