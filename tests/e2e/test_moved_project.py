"""A project directory moved while its host is stopped: the saved ``connection.json`` names
the old directory, so every command refuses it, and the error says how to go on (set the
file aside). The procedure docs/recovery.md gives is followed here with a real host: the
Run waiting before the move comes back, on a new port with a new token. And ``.intloom/``
moved away under a running host: that host stops serving, so a second one started in the
project never serves beside it."""

from __future__ import annotations

import json
import os
import shutil
import signal

import pytest

from tests.helpers import Project, eventually, foreground_host, ok, pid_alive, started_waiting

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_a_moved_project_says_how_to_go_on_and_restores_its_runs(project: Project) -> None:
    assert project.cli("start").code == 0
    run = ok(project.cli("flow", "example", "--intent", "move me", "--json"))["run"]
    assert run["status"] == "waiting"
    assert ok(project.cli("stop", "--json"))["stopped"] is True
    old_root = project.root
    old_connection = json.loads((project.state / "connection.json").read_text())

    new_root = old_root.parent / "moved"
    old_root.rename(new_root)
    moved = Project(root=new_root, pids=project.pids)  # the fixture reaps what it starts

    for command in ("status", "start"):
        refused = moved.cli(command, "--json")
        assert refused.code == 1, (command, refused.stdout)
        error = refused.json["error"]
        assert error["code"] == "CLI_SERVICE_METADATA_INVALID"
        connection = moved.state / "connection.json"
        assert f"belongs to another project ({old_root})" in error["message"]
        assert "moved or copied" in error["message"]
        assert f"mv {connection} {connection}.moved" in error["message"], error["message"]

    (moved.state / "connection.json").rename(moved.state / "connection.json.moved")
    started = ok(moved.cli("start", "--json"))
    assert started["service"]["projectRoot"] == str(new_root)
    new_connection = json.loads((moved.state / "connection.json").read_text())
    assert new_connection["projectRoot"] == str(new_root)
    assert new_connection["token"] != old_connection["token"]
    runs = ok(moved.cli("runs", "--json"))["runs"]
    assert [(r["runId"], r["status"]) for r in runs] == [(run["runId"], "waiting")]
    assert runs[0]["pendingAction"]["id"] == run["pendingAction"]["id"]
    assert ok(moved.cli("stop", "--json"))["stopped"] is True


def test_a_copied_project_is_told_its_runs_are_the_originals(project: Project) -> None:
    """``cp -r`` of a project with a waiting Run: the copy's commands said to move its
    connection.json aside, and that the next start "restores the Runs". Followed, the same
    Run (the same id) waited in two stores, and answered in both, its effects ran twice.
    The copy is told it is one, and how to start it as a new project without them."""
    import shutil

    ok(project.cli("start", "--json"))
    run = ok(project.cli("flow", "example", "--intent", "copy me", "--json"))["run"]
    ok(project.cli("stop", "--json"))
    copy_root = project.root.parent / "copy"
    shutil.copytree(project.root, copy_root, symlinks=True)
    copy = Project(root=copy_root, pids=project.pids)
    refused = copy.cli("status", "--json")
    message = refused.json["error"]["message"]
    runtime, connection = copy.state / "runtime", copy.state / "connection.json"
    assert message.startswith(
        f"{connection} belongs to another project ({project.root}), which still holds the "
        "same token: this directory is a copy of it."), message
    assert "restored here, each would run again, effects included" in message, message
    assert "restores the Runs" not in message, message  # the move's advice is not given
    assert (f"(mv {runtime} {runtime}.copied; mv {connection} {connection}.copied)"
            ) in message, message
    runtime.rename(runtime.with_name("runtime.copied"))  # as advised: nothing is deleted
    connection.rename(connection.with_name("connection.json.copied"))
    ok(copy.cli("start", "--json"))
    assert ok(copy.cli("runs", "--json"))["runs"] == []
    ok(copy.cli("stop", "--json"))
    # A move (nothing left where it was) is still told its Runs are restored, and so is
    # one whose old path holds a project made there since (a new token).
    shutil.rmtree(copy_root)
    moved_root = project.root.parent / "moved"
    project.root.rename(moved_root)
    moved = Project(root=moved_root, pids=project.pids)
    said = moved.cli("status", "--json").json["error"]["message"]
    assert "restores the Runs." in said and "is a copy" not in said, said
    project.root.mkdir()
    fresh = Project(root=project.root, pids=project.pids)
    assert ok(fresh.cli("init", "--json"))
    ok(fresh.cli("start", "--json"))
    ok(fresh.cli("stop", "--json"))
    said = moved.cli("status", "--json").json["error"]["message"]
    assert "restores the Runs." in said and "is a copy" not in said, said
    (moved.state / "connection.json").rename(moved.state / "connection.json.moved")
    ok(moved.cli("start", "--json"))
    assert [r["runId"] for r in ok(moved.cli("runs", "--json"))["runs"]] == [run["runId"]]
    ok(moved.cli("stop", "--json"))


def test_a_host_whose_state_directory_is_moved_away_stops_serving(project: Project) -> None:
    """``mv .intloom .intloom.moved`` under a running host: both its locks are on the moved
    files, so nothing kept a second ``intloom start`` from taking a new ``.intloom/`` and
    serving beside it (two hosts, each sure it owned the project, the first writing its
    segments and snapshots by path into the second's store). The host notices within a
    moment, logs ``state_dir_moved`` into its own (moved) log and exits as a crash would;
    put back, the project restores its waiting Run."""
    run_id, _action = started_waiting(project)
    pid = project.host_pid()
    moved = project.root / ".intloom.moved"
    project.state.rename(moved)
    eventually(lambda: not pid_alive(pid), timeout=5, what=f"host {pid} to stop serving")
    [log] = (moved / "logs").glob("LOG-*.jsonl")
    [line] = [json.loads(x) for x in log.read_text().splitlines() if "state_dir_moved" in x]
    assert line["level"] == "fatal" and f"{project.state}/runtime is gone" in line["message"]
    assert not project.state.exists()  # it wrote nothing by path once the path led elsewhere
    moved.rename(project.state)  # put back: as after a crash
    project.wait_released(pid)  # a zombie leader's other threads may still hold its lock
    # Its log came back with it, still ending in state_dir_moved: doctor said "put the moved
    # .intloom/ back" of a project where it was back.
    checks = [c["id"] for c in project.cli("doctor", "--json").json["checks"]]
    assert "state_dir" not in checks, checks
    ok(project.cli("recover", "--json"))
    restore = ok(project.cli("start", "--json"))["service"]["restore"]
    assert restore["waiting"] == [run_id], restore
    ok(project.cli("stop", "--json"))


def test_a_foreground_host_whose_state_directory_is_moved_says_so_as_an_error(
        project: Project) -> None:
    """The same move under ``start --foreground --json``: the command ended with exit 1 and
    a bare ``intloom host: ...`` line on stderr (no code, no fix: that was only in the log,
    now in the moved directory). Then its error came as a second document on stdout after
    the start result, which no JSON parser reads: stdout keeps the one document (the start
    result, printed once it served), and the error document goes to stderr."""
    with foreground_host(project, "--json") as proc:
        project.state.rename(project.root / ".intloom.moved")
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, (out, err)
    started = json.loads(out)  # one document
    assert started["service"]["pid"] == proc.pid, out
    [line] = [line for line in err.splitlines() if line.startswith('{"error":')]
    error = json.loads(line)["error"]
    assert error["code"] == "STORAGE_ERROR", error
    assert f"{project.state}/runtime is gone" in error["message"], error
    assert "put the moved .intloom/ back, then run intloom recover" in error["message"], error
    assert "intloom host:" not in err, err
    assert not project.state.exists()


def test_a_start_in_a_project_moved_under_its_host_says_whose_service_json_it_finds(
        project: Project) -> None:
    """The project moved while its host ran (it serves on), and its connection.json was set
    aside as the moved project's errors say: start took the host's held lock for a start in
    progress and waited its whole --timeout (300 s) for "another start's host", where status
    said at once that service.json is another project's."""
    started_waiting(project)
    pid = project.host_pid()
    new_root = project.root.parent / "moved"
    project.root.rename(new_root)
    moved = Project(root=new_root, pids=project.pids)
    try:
        (moved.state / "connection.json").rename(moved.state / "connection.json.moved")
        status = moved.cli("status", "--json")
        started = moved.cli("start", "--json", "--timeout", "20")
        assert started.code == 1, started.stdout
        error = started.json["error"]
        assert error["code"] == "CLI_SERVICE_METADATA_INVALID", error
        assert error["code"] == status.json["error"]["code"], status.stdout
        assert "belongs to another project" in error["message"], error
        # What happened, and whose host: it said only "run intloom doctor".
        stop = moved.cli("stop", "--json")
        assert stop.code == 1, stop.stdout
        said = stop.json["error"]["message"]
        assert said.startswith(
            f"{moved.state / 'service.json'} belongs to another project ({project.root}): the "
            f"project directory was moved or copied since its host (pid {pid}) wrote it"), said
        assert said.endswith("run intloom doctor, which says whether that host runs and how "
                             "to stop it."), said
        # Inside doctor's own report the finding does not send the reader to doctor.
        doctor = moved.cli("doctor")
        lines = [ln for ln in doctor.stdout.splitlines()
                 if "service.json belongs to another project" in ln]
        assert lines and not any("intloom doctor" in ln for ln in lines), doctor.stdout
    finally:
        os.kill(pid, signal.SIGTERM)  # a graceful stop: the Run stays waiting
        eventually(lambda: not pid_alive(pid), timeout=30, what=f"host {pid} to stop")


@pytest.mark.parametrize("deleted", ["project", "runtime"])
def test_a_host_whose_project_is_deleted_stops_serving_and_says_its_runs_are_lost(
        project: Project, deleted: str) -> None:
    """``rm -rf`` of the whole project under a running host: the root's path was gone too,
    which read as a project moved as a whole, so the host served on, its Steps and effects
    running into unlinked files no start could read, the disk's space taken unseen. A
    deleted runtime directory (no link left) now stops it as a move does, and its error
    says the Runs went with it rather than "put the moved .intloom/ back"."""
    with foreground_host(project, "--json") as proc:
        shutil.rmtree(project.root if deleted == "project" else project.state / "runtime")
        out, err = proc.communicate(timeout=15)
    assert proc.returncode == 1, (out, err)
    [line] = [line for line in err.splitlines() if line.startswith('{"error":')]
    error = json.loads(line)["error"]
    assert error["code"] == "STORAGE_ERROR", error
    assert f"{project.state}/runtime was deleted while this host ran" in error["message"], error
    assert "otherwise its Runs are lost" in error["message"], error
    assert "put the moved .intloom/ back" not in error["message"], error


def test_doctor_names_why_the_last_host_stopped_when_its_runtime_was_deleted(
        project: Project) -> None:
    """``rm -rf .intloom/runtime`` under a running host: it stops serving (state_dir_moved,
    in its log, which stayed in .intloom/logs/), and doctor said "No .intloom/runtime/ yet",
    "No Run journals yet" and "Run intloom recover, then intloom start": a start that
    begins with no Run, the deletion said nowhere. It now shows the host's own words."""
    started_waiting(project)
    pid = project.host_pid()
    shutil.rmtree(project.state / "runtime")
    eventually(lambda: not pid_alive(pid), timeout=10, what=f"host {pid} to stop serving")
    project.wait_released(pid)
    doctor = project.cli("doctor", "--json")
    assert doctor.code == 3, doctor.stdout  # attention
    checks = {c["id"]: c for c in doctor.json["checks"]}
    left = checks["state_dir"]
    assert left["status"] == "attention", left
    assert f"{project.state}/runtime was deleted while this host ran" in left["message"], left
    assert "otherwise its Runs are lost" in left["next"], left
    shown = project.cli("doctor").stdout
    assert "state_dir · attention: The last host stopped serving" in shown, shown


def test_a_foreground_host_whose_project_moved_says_which_files_it_kept(
        project: Project) -> None:
    """The project directory renamed under a running host, then Ctrl-C: the stop removed its
    files by the old path, where there were none, and said nothing -- exit 0, no log line,
    its service.json and service.lock left in the moved directory without a word. Then its
    error came as a second document on stdout (the command's error, said once the host had
    returned, by a renderer that did not know stdout had its document already)."""
    with foreground_host(project, "--json") as proc:
        moved = project.root.parent / "moved"
        project.root.rename(moved)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    state = moved / ".intloom"
    assert proc.returncode == 1, (out, err)
    started = json.loads(out)  # one document: the start result
    assert started["service"]["pid"] == proc.pid, out
    [line] = [x for x in err.splitlines() if x.startswith('{"error":')]
    error = json.loads(line)["error"]
    fact = (f"the project directory was moved while this host ran: its .intloom/ is now "
            f"{state} and {project.state} does not exist, so no service file was removed by "
            "the old path")
    assert error["code"] == "STORAGE_ERROR" and fact in error["message"], error
    assert f"set its files aside in {state}" in error["message"], error
    [log] = (state / "logs").glob("LOG-*.jsonl")
    [kept] = [json.loads(x) for x in log.read_text().splitlines() if "service_files_kept" in x]
    assert fact in kept["problems"][0] and f"intloom start in {moved}" in kept["fix"], kept
    assert (state / "service.json").is_file() and (state / "service.lock").is_file()


def test_status_and_recover_say_the_runtime_was_moved_under_the_last_host(
        project: Project) -> None:
    """``mv .intloom/runtime .intloom/runtime.old`` under a running host: status said only
    "stale resources ... Run intloom recover, then intloom start", recover "Run intloom
    start; committed data is retained", and that start began an empty journal, the waiting
    Run left in the moved directory. Both now say what the last host's log says, and to
    put the directory back first."""
    run_id, _action = started_waiting(project)
    pid = project.host_pid()
    (project.state / "runtime").rename(project.state / "runtime.old")
    eventually(lambda: not pid_alive(pid), timeout=10, what=f"host {pid} to stop serving")
    project.wait_released(pid)
    status = project.cli("status", "--json").json
    assert status["status"] == "recovery_required", status
    said = status["startProblem"]
    assert said is not None and said.startswith("But the last host stopped serving ("), said
    assert "was moved or removed while this host ran" in said, said
    assert said.endswith("an intloom start here begins with the Runs of whatever is at "
                         ".intloom/runtime/ now (none, if it is missing)."), said
    assert said in project.cli("status").stdout
    assert project.cli("doctor", "--json").json["startProblem"] == said  # the same words
    recovered = project.cli("recover")
    assert recovered.code == 0 and said in recovered.stdout, recovered
    # Put back, the next start restores the Run, and nothing is said any more.
    (project.state / "runtime.old").rename(project.state / "runtime")
    restore = ok(project.cli("start", "--json"))["service"]["restore"]
    assert restore["waiting"] == [run_id], restore
