"""doctor: stable check ids, exit classes, and a report that never holds the token."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from intloom.diagnostics import diagnose, run_doctor
from intloom.diagnostics.checks import KEEP_IT
from intloom.diagnostics.doctor import DoctorReport
from intloom.diagnostics.owners import NO_CONNECTION_FIX, STARTING
from intloom.project import ProjectPaths
from tests.helpers import FIXTURES
from tests.unit.diagnostics_support import (
    crash_leftovers,
    create_time,
    dead_pid,
    free_port,
    live_process,
    lock_holder,
    tree,
    write_connection_json,
    write_lock,
)

CHECK_IDS = [
    "config", "runtime_dir", "owner.service_lock", "owner.service_json", "connection",
    "temp_files", "workflows", "journals",
]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    target = (tmp_path / "proj").resolve()
    shutil.copytree(FIXTURES / "projects" / "basic", target)
    return target


def _checks(report: DoctorReport) -> dict[str, str]:
    return {check.id: check.status for check in report.checks}


def test_fresh_project_is_healthy_and_doctor_writes_nothing(root: Path) -> None:
    before = tree(root)
    report = run_doctor(root)
    assert tree(root) == before  # not even __pycache__ from importing the Workflows
    assert (report.status, report.health, report.exit_class) == ("offline", "healthy", "healthy")
    assert [c.id for c in report.checks] == CHECK_IDS
    assert set(_checks(report).values()) == {"ok"}
    assert report.runs == []
    doc = msgspec.to_builtins(report)
    assert doc["schemaVersion"] == 1
    assert all("next" in check for check in doc["checks"])


def test_crash_leftovers_need_attention_and_the_token_never_shows(root: Path) -> None:
    crash_leftovers(root, dead_pid(), 1_000_000.0)
    token = msgspec.json.decode(ProjectPaths(root).connection_json.read_bytes())["token"]
    before = tree(root)
    report = run_doctor(root)
    assert tree(root) == before
    assert (report.status, report.health) == ("recovery_required", "attention")
    checks = {c.id: c for c in report.checks}
    assert checks["owner.service_lock"].status == "attention"
    assert checks["owner.service_lock"].evidence
    assert "intloom recover" in (checks["owner.service_lock"].next or "")
    encoded = msgspec.json.encode(report)
    assert token.encode() not in encoded
    # Minus doctor's own fields, the report is exactly the status diagnosis.
    doc = msgspec.to_builtins(report)
    for key in ("schemaVersion", "health", "checks", "runs"):
        doc.pop(key)
    assert doc.pop("startProblem") is None  # status's too: a start is for offline only
    assert doc == msgspec.to_builtins(diagnose(root))


def test_live_owner_is_blocked(root: Path) -> None:
    with live_process() as proc:
        crash_leftovers(root, proc.pid, create_time(proc.pid))
        report = run_doctor(root)
    assert (report.status, report.health) == ("blocked", "blocked")
    assert _checks(report)["owner.service_lock"] == "attention"


def test_a_host_in_its_start_up_is_called_starting_as_status_does(root: Path) -> None:
    """A live owner holding service.lock's OS lock before service.json exists is a host
    starting: status says so, and doctor's owner check said "does not answer as this
    project's host (it may be starting or stopping)"."""
    with live_process() as proc:
        write_lock(root, proc.pid, create_time(proc.pid))
        write_connection_json(root, free_port())
        with lock_holder(ProjectPaths(root).service_lock):
            report = run_doctor(root)
    assert report.status == "blocked" and report.message.startswith(STARTING), report.message
    check = {c.id: c for c in report.checks}["owner.service_lock"]
    assert check.message.startswith(
        f"service.lock names pid {proc.pid}, which is alive and starting (since "
        "2026-11-30T00:00:00.000Z)"), check.message
    assert "stopping" not in check.message and "does not answer" not in check.message
    assert check.next is not None and "intloom start waits for it" in check.next


def test_service_json_and_connection_json_naming_different_ports_is_named(
        root: Path) -> None:
    """service.json and connection.json naming different ports: status reports the
    mismatch, and doctor's owner checks said "may be starting or stopping"."""
    with live_process() as proc:
        port = crash_leftovers(root, proc.pid, create_time(proc.pid))
        other = write_connection_json(root, port + 1 if port < 65535 else port - 1).port
        with lock_holder(ProjectPaths(root).service_lock):
            report = run_doctor(root)
    assert report.status == "blocked"
    assert f"names port {port} but" in report.message, report.message
    checks = {c.id: c for c in report.checks}
    for owner in ("owner.service_lock", "owner.service_json"):
        check = checks[owner]
        assert check.status == "attention"
        assert (f"service.json names port {port} and connection.json port {other}"
                in check.message), check.message
        assert "starting" not in check.message, check.message
        assert check.next is not None and f"kill -TERM {proc.pid}" in check.next


def test_invalid_metadata_is_a_blocked_report_not_a_crash(root: Path) -> None:
    crash_leftovers(root, dead_pid(), 1_000_000.0)
    lock = ProjectPaths(root).service_lock
    lock.chmod(0o644)
    before = tree(root)
    report = run_doctor(root)
    assert tree(root) == before
    assert report.health == "blocked"
    assert "service.lock" in report.message
    checks = {c.id: c for c in report.checks}
    assert checks["owner.service_lock"].status == "attention"
    assert "0644" in checks["owner.service_lock"].message
    # service.json is valid and names a dead owner: it is judged, never reported absent, and
    # recover is not recommended while service.lock is invalid (recover would refuse).
    service = checks["owner.service_json"]
    assert service.status == "attention"
    assert "service.json is stale" in service.message
    assert service.next is not None and "service.lock is invalid" in service.next
    assert [(o.resource, o.status) for o in report.owners] == [("service_info", "absent")]


def test_missing_connection_json_is_one_story_with_its_way_out(root: Path) -> None:
    """After a crash, connection.json gone: the owner checks sent the user to the recover
    that refuses, while the connection check said only "Check the project metadata"."""
    crash_leftovers(root, dead_pid(), 1_000_000.0, connection=False)
    before = tree(root)
    report = run_doctor(root)
    assert tree(root) == before
    checks = {c.id: c for c in report.checks}
    for owner in ("owner.service_lock", "owner.service_json"):
        step = checks[owner].next or ""
        assert "recover refuses while connection.json is missing" in step, step
        assert "recover --dry-run" not in step, step
    connection = checks["connection"]
    assert connection.status == "attention"
    assert connection.next == NO_CONNECTION_FIX
    assert report.message.endswith(NO_CONNECTION_FIX)


def test_invalid_config_skips_the_workflows(root: Path) -> None:
    (root / "intloom.toml").write_text('workflows = ["workflows/example.py"]\nsecret = "x"\n')
    report = run_doctor(root)
    checks = _checks(report)
    assert (checks["config"], checks["workflows"]) == ("attention", "not_checked")
    assert report.health == "attention"
    # As status --json says it (the report is status's diagnosis plus doctor's own fields).
    assert report.start_problem == ("But intloom start refuses the project as it is: "
                                    f"{root / 'intloom.toml'}: unknown key 'secret'. Known "
                                    "keys: port, workflows. Remove or rename it."), report


def test_broken_workflow_is_attention(root: Path) -> None:
    (root / "workflows" / "example.py").write_text("raise RuntimeError('boom')\n")
    report = run_doctor(root)
    workflows = {c.id: c for c in report.checks}["workflows"]
    assert workflows.status == "attention"
    assert "boom" in workflows.message


def test_a_source_doctor_could_not_import_for_want_of_descriptors_judges_no_run(
    root: Path,
) -> None:
    """A doctor under a low ulimit -n failed to open one source: the Runs were compared with
    what did load and each called incompatible (held), and the fix said to mend the source.
    Such a source is named for the limit, and no Run is compared (as when nothing loads)."""
    from intloom.authoring.loader import load_workflows_offline
    from intloom.project import load_config

    (root / "workflows" / "example.py").write_text(
        "import errno\nraise OSError(errno.EMFILE, 'Too many open files')\n")
    assert load_workflows_offline(root, load_config(root)).starved == ["workflows/example.py"]
    workflows = {c.id: c for c in run_doctor(root).checks}["workflows"]
    assert workflows.status == "attention"
    assert "for want of file descriptors" in workflows.message, workflows.message
    assert workflows.next is not None and "Fix the Workflow sources" not in workflows.next
    (root / "workflows" / "example.py").write_text("raise RuntimeError('boom')\n")
    assert load_workflows_offline(root, load_config(root)).starved == []


def test_a_doctor_that_could_not_set_the_import_up_gives_the_limits_fix(root: Path) -> None:
    """``ulimit -n 10``: doctor named EMFILE (its spool and stdin for the import took the last
    descriptors), and its next step was "Fix the Workflow sources", which nothing had read.
    A real doctor process under the limit (set in it before it runs)."""
    reached: dict[int, dict[str, Any]] = {}
    for limit in range(8, 12):  # where this Python's imports leave none for the spool

        def lower(limit: int = limit) -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

        done = subprocess.run(
            [sys.executable, "-m", "intloom", "--project", str(root), "doctor", "--json"],
            capture_output=True, text=True, timeout=60, preexec_fn=lower,
            env={**os.environ, "NO_COLOR": "1"})
        with contextlib.suppress(ValueError):
            checks = {c["id"]: c for c in json.loads(done.stdout)["checks"]}
            if "were not imported" in checks["workflows"]["message"]:
                reached[limit] = checks["workflows"]
    assert reached, "no limit stopped doctor where the import is set up"
    for limit, workflows in reached.items():
        assert "Too many open files" in workflows["message"] or "EMFILE" in workflows[
            "message"], (limit, workflows)
        assert "ulimit -n" in workflows["next"], (limit, workflows)
        assert "Fix the Workflow sources" not in workflows["next"], (limit, workflows)


def test_public_runtime_dir_is_attention(root: Path) -> None:
    write_connection_json(root, 4242)
    runtime = ProjectPaths(root).runtime
    runtime.mkdir(mode=0o700)
    runtime.chmod(0o755)
    report = run_doctor(root)
    check = {c.id: c for c in report.checks}["runtime_dir"]
    assert check.status == "attention"
    assert "0755" in check.message
    assert runtime.stat().st_mode & 0o777 == 0o755  # reported, never "fixed"


def test_a_store_file_that_is_no_regular_file_is_named_with_its_fix(root: Path) -> None:
    """A segment a directory: a start refuses it, and the runtime_dir check names the file
    and what to do; the file is kept. manifest.json a directory, or a snapshot a link, is
    read past as a damaged file is (it refused the whole store): the journals check names
    it, as a start reports it, and runtime_dir has nothing to say."""
    runtime = ProjectPaths(root).runtime
    live = runtime / "snap" / "live"
    for directory in (runtime.parent, runtime, runtime / "wal", runtime / "snap", live):
        directory.mkdir(mode=0o700)
    segment = runtime / "wal" / "0000000001.seg"
    segment.mkdir(mode=0o700)
    check = {c.id: c for c in run_doctor(root).checks}["runtime_dir"]
    assert (check.status, check.message) == (
        "attention", f"{segment} is not a regular file."), check
    # Out of the store, into .intloom/: beside it, inspect would report the .bad file for ever.
    moved = runtime.parent / "runtime-wal-0000000001.seg.bad"
    assert check.next is not None and check.next.startswith(
        f"Move it aside (mv {segment} {moved})") and KEEP_IT in check.next, check.next
    assert os.path.isdir(segment)
    segment.rename(moved)  # as advised: nothing intloom did not write is left in the store
    checks = {c.id: c for c in run_doctor(root).checks}
    assert checks["runtime_dir"].status == "ok", checks["runtime_dir"]
    assert checks["journals"].status == "ok", checks["journals"]
    moved.rmdir()
    manifest = runtime / "manifest.json"
    manifest.mkdir(mode=0o700)
    snapshot = live / f"{'b' * 64}.snap"
    snapshot.symlink_to(root / "elsewhere.snap")
    checks = {c.id: c for c in run_doctor(root).checks}
    assert checks["runtime_dir"].status == "ok", checks["runtime_dir"]
    assert checks["journals"].status == "attention", checks["journals"]
    for said in ("manifest.json is corrupt: is not a regular file",
                 f"snap/live/{snapshot.name} is corrupt: is a symbolic link; intloom never "
                 "follows links"):
        assert said in checks["journals"].message, checks["journals"]
    assert snapshot.is_symlink() and manifest.is_dir()


def test_doctor_does_not_advise_running_doctor(root: Path, tmp_path: Path) -> None:
    """A copied project (its connection.json names the original) made doctor's first line
    and its connection check say "If no intloom host runs for this directory (intloom
    doctor), move the file aside", and a host that is not the instance service.json names
    ended it with "Run intloom doctor.": advice to run the command being run. The facts and
    the fix stay."""
    from intloom.client.client import _metadata_invalid
    from intloom.host.metadata import Connection, write_connection

    paths = ProjectPaths(root)
    paths.state.mkdir(mode=0o700)
    write_connection(paths.connection_json, Connection(
        version=1, project_root=str(tmp_path / "original"), port=free_port(), token="t" * 43))
    report = run_doctor(root)
    connection = {c.id: c for c in report.checks}["connection"]
    for said in (report.message, connection.message):
        assert "belongs to another project" in said and "move the file aside" in said, said
        assert "If no intloom host runs for this directory, move" in said, said
        assert "intloom doctor" not in said, said
    fact = ("The listening service does not match the saved project identity (it is "
            "instance a, pid 1; service.json names b, pid 1).")
    mismatch = _metadata_invalid(fact)  # as another command says it, and as doctor does
    assert (mismatch.message, mismatch.here) == (f"{fact} Run intloom doctor.", fact)


def test_doctor_says_a_path_as_it_is_whatever_it_contains(tmp_path: Path) -> None:
    """doctor took the advice to run intloom doctor out of other commands' messages by
    replacing text: a project under ``notes (intloom doctor)`` had that part of its own path
    cut out of every message naming one of its files. Its words are now built from the
    facts, so a path stays as it is."""
    root = (tmp_path / "notes (intloom doctor)").resolve()
    shutil.copytree(FIXTURES / "projects" / "basic", root)
    paths = ProjectPaths(root)
    paths.state.mkdir(mode=0o700)
    paths.service_json.write_text("")
    paths.service_json.chmod(0o600)
    report = run_doctor(root)
    empty = f"{paths.service_json} is empty (a crash or a full disk while it was written)."
    assert report.message.startswith(empty), report.message
    said = [c.message for c in report.checks if str(paths.service_json) in c.message]
    assert said and all(empty in message for message in said), said
    for message in [report.message, *said]:
        assert "run intloom doctor" not in message, message


def test_a_port_the_next_start_may_not_bind_is_not_called_in_use(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """port = 80 in intloom.toml, doctor run by a user who may not bind ports below 1024:
    doctor said port 80 "is in use by another process (find it with: ss ...)" while nothing
    listened there; start then fails with Permission denied. It says what the start meets."""
    import errno
    import socket

    (root / "intloom.toml").write_text(
        (root / "intloom.toml").read_text() + "port = 80\n")
    real_bind = socket.socket.bind

    def bind(sock: socket.socket, address: object) -> None:
        if isinstance(address, tuple) and address[1] == 80:
            raise PermissionError(errno.EACCES, "Permission denied")
        real_bind(sock, address)  # type: ignore[arg-type]

    monkeypatch.setattr(socket.socket, "bind", bind)
    report = run_doctor(root)
    [check] = [c for c in report.checks if c.id == "connection"]
    assert check.status == "attention", check
    assert "in use by another process" not in check.message, check.message
    assert "Permission denied" in check.message, check.message
    assert check.next is not None and "port in intloom.toml" in check.next, check


def test_temp_files_of_an_interrupted_metadata_write_are_reported_and_kept(root: Path) -> None:
    """A host killed while it wrote service.lock (or service.json, connection.json) leaves
    the temp file of that write in .intloom/: doctor said nothing of it, and nothing ever
    removes it. It is reported, by name, and kept byte-identical."""
    paths = ProjectPaths(root)
    paths.state.mkdir(mode=0o700)
    lock_tmp = paths.state / ".service.lock.0123456789abcdef.tmp"
    lock_tmp.write_bytes(b'{"version":1,"pid":12')  # cut mid-write
    conn_tmp = paths.state / ".connection.json.fedcba9876543210.tmp"
    conn_tmp.write_bytes(b"")
    for tmp in (lock_tmp, conn_tmp):
        tmp.chmod(0o600)
        os.utime(tmp, (1_000_000.0, 1_000_000.0))  # as old as the crash that left it
    (paths.state / ".service.lock.nothex.tmp").write_bytes(b"not ours")  # not a form we write
    os.mkfifo(paths.state / ".service.json.00000000000000ff.tmp", 0o600)  # not a regular file
    before = tree(root)
    report = run_doctor(root)
    assert tree(root) == before
    check = {c.id: c for c in report.checks}["temp_files"]
    assert check.status == "attention" and report.health == "attention"
    assert check.message.startswith("2 temp files in .intloom/ left by a write that was "
                                    "interrupted (a crash):"), check.message
    assert ".connection.json.fedcba9876543210.tmp (for connection.json, 0 bytes)" in check.message
    assert ".service.lock.0123456789abcdef.tmp (for service.lock, 21 bytes)" in check.message
    assert "nothex" not in check.message and "00ff" not in check.message
    assert check.next is not None
    assert ("rm -- .intloom/.connection.json.fedcba9876543210.tmp "
            ".intloom/.service.lock.0123456789abcdef.tmp") in check.next
    for tmp in (lock_tmp, conn_tmp):
        tmp.unlink()
    assert {c.id: c for c in run_doctor(root).checks}["temp_files"].status == "ok"


def test_a_log_or_segment_removed_while_doctor_lists_it_is_skipped(
    root: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A host log or a WAL segment removed between doctor's listing of its directory and
    its stat of the file (a host pruning its old logs, recover moving a segment aside) made
    doctor exit 70 (FileNotFoundError). A file that is gone is skipped; the next one, a log
    others may read, is still reported with its mode."""
    paths = ProjectPaths(root)
    for directory in (paths.state, paths.runtime, paths.logs, paths.runtime / "wal",
                      paths.runtime / "snap", paths.runtime / "snap" / "live",
                      paths.runtime / "snap" / "done"):
        directory.mkdir(mode=0o700)
    gone = [paths.logs / "LOG-20260101T000000001Z.jsonl", paths.runtime / "wal" / "0.seg"]
    for path in gone:
        path.write_bytes(b"")
    readable = paths.logs / "LOG-20260101T000000002Z.jsonl"
    readable.write_bytes(b"")
    readable.chmod(0o644)
    real = os.scandir

    class Listed(list[os.DirEntry[str]]):
        def __enter__(self) -> Listed:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    def scandir(path: Any = ".") -> Listed:
        with real(path) as it:
            listed = Listed(it)
        for entry in listed:  # removed after the listing, before the stat
            if Path(entry.path) in gone:
                os.unlink(entry.path)
        return listed

    real_listdir = os.listdir

    def listdir(path: Any = ".") -> list[str]:
        listed = real_listdir(path)
        if isinstance(path, int):  # a listing of a descriptor: nothing of ours
            return listed
        for name in listed:  # likewise for a listing by name (the logs' scan_logs)
            if Path(path, name) in gone:
                os.unlink(Path(path, name))
        return listed

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(os, "listdir", listdir)
    check = {c.id: c for c in run_doctor(root).checks}["runtime_dir"]
    assert check.status == "attention", check
    assert check.message == (f"{readable} has mode 0644: others may read what the Runs did "
                             "(a host log is 0600, 0400 once sealed)."), check.message
    assert check.next is not None and "chmod go=" in check.next, check.next


@pytest.mark.parametrize("target", ["service.lock", "connection.json"])
def test_a_temp_file_a_live_host_is_writing_is_not_called_left_by_a_crash(
        root: Path, monkeypatch: pytest.MonkeyPatch, target: str) -> None:
    """doctor and recover named the temp file of a write in progress -- a starting host's
    lock, before its service.lock exists, or its connection.json -- as "left by a write that
    was interrupted (a crash)", with the rm command for it. Its writer holds it locked
    while it writes (a crash lets the lock go): doctor and recover leave it out."""
    from intloom.diagnostics.doctor import _temp_files_check
    from intloom.diagnostics.recover import recover

    paths = ProjectPaths(root)
    seen: list[tuple[Any, Any]] = []
    fsync = os.fsync

    def looked_at_mid_write(fd: int) -> None:
        if not seen and stat.S_ISREG(os.fstat(fd).st_mode):  # the temp file, written
            seen.append((_temp_files_check(paths), recover(root, dry_run=True).leftovers))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", looked_at_mid_write)
    if target == "service.lock":
        write_lock(root, os.getpid(), create_time(os.getpid()))
    else:
        write_connection_json(root, free_port())
    monkeypatch.undo()
    [(check, leftovers)] = seen
    assert (check.status, check.next) == ("ok", None), check
    assert leftovers == []


def _temp_files_of(root: Path, name: str, data: bytes) -> Any:
    """doctor's temp_files check of a project whose .intloom/ holds one temp file, ``name``
    (private, holding ``data``): attention, whatever it then says."""
    paths = ProjectPaths(root)
    paths.state.mkdir(mode=0o700)
    tmp = paths.state / name
    tmp.write_bytes(data)
    tmp.chmod(0o600)
    check = {c.id: c for c in run_doctor(root).checks}["temp_files"]
    assert check.status == "attention", check
    return check


def test_a_temp_file_just_created_and_not_locked_yet_is_named_as_maybe_in_progress(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unlocked, but changed a moment ago: its writer may be between creating and locking
    it (ownership checks fail closed). Named as undecided, without an rm for it."""
    from intloom.diagnostics import temps

    # "A moment" made an hour: a loaded machine may take seconds to reach the check.
    monkeypatch.setattr(temps, "_SETTLED", 3600.0)
    check = _temp_files_of(root, ".service.lock.0123456789abcdef.tmp", b"")
    assert check.message.startswith(
        "1 temp file in .intloom/ may belong to a write in progress (a starting host's), so "
        "it is not called left behind: .service.lock.0123456789abcdef.tmp (for service.lock, "
        "0 bytes): changed "), check.message
    assert check.next is not None and "rm" not in check.next, check
    assert "again in a moment" in check.next, check


def test_a_temp_file_whose_lock_cannot_be_probed_is_named_with_how_to_tell(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a file system whose flock fails (ENOLCK on some NFS), a temp file's writer cannot
    be told from its lock: named as undecided, without an rm, with fuser as what tells."""
    from intloom.diagnostics import temps

    monkeypatch.setattr(temps, "os_lock", lambda _path: ("unprobeable", "No locks available"))
    check = _temp_files_of(root, ".service.json.0123456789abcdef.tmp", b"{}")
    assert check.message.endswith(
        ".service.json.0123456789abcdef.tmp (for service.json, 2 bytes): its lock cannot be "
        "probed (No locks available)."), check.message
    assert check.next == (
        "To tell whether a process still writes .intloom/.service.json.0123456789abcdef.tmp, "
        "run fuser -v .intloom/.service.json.0123456789abcdef.tmp from the project's root; if "
        "none has it open, it was left by an interrupted write and holds nothing intloom "
        "needs"), check.next
    assert not temps.metadata_temps(ProjectPaths(root)).left  # nor does recover list it


def test_a_temp_file_renamed_after_a_slow_fsync_is_not_called_left_by_a_crash(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """replace_files closed its temp files -- letting their lock go -- before renaming
    them, so between the two a temp file whose fsync took over 2 s (its mtime is its
    write's) was free and settled: doctor called connection.json's temp file of a live
    host "left by a write that was interrupted (a crash)", with the rm command for it. Its
    writer holds the lock until the rename."""
    from intloom.diagnostics.doctor import _temp_files_check

    paths = ProjectPaths(root)
    seen: list[Any] = []
    rename = os.rename

    def looked_at_before_the_rename(src: Any, dst: Any) -> None:
        if not seen and Path(src).parent == paths.state:
            os.utime(src, (1_000_000.0, 1_000_000.0))  # written long ago: a slow fsync
            seen.append(_temp_files_check(paths))
        rename(src, dst)

    monkeypatch.setattr(os, "rename", looked_at_before_the_rename)
    write_connection_json(root, free_port())
    monkeypatch.undo()
    [check] = seen
    assert (check.status, check.next) == ("ok", None), check


def test_port_0_in_intloom_toml_checks_the_saved_port_the_next_start_takes(root: Path) -> None:
    """port = 0 in intloom.toml fixes no port: the next start listens on connection.json's
    saved port. doctor read the 0 as "any port" and never said that the saved one was taken,
    so the start it called fine failed."""
    import socket

    (root / "intloom.toml").write_text(
        (root / "intloom.toml").read_text() + "port = 0\n")
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        write_connection_json(root, port)
        report = run_doctor(root)
    [check] = [c for c in report.checks if c.id == "connection"]
    assert check.status == "attention", check
    assert f"Port {port} on 127.0.0.1 (the port saved in connection.json)" in check.message, (
        check.message)


def test_doctor_names_a_service_file_that_keeps_changing_without_sending_its_reader_back(
    root: Path,
) -> None:
    """A service.lock or service.json rewritten every time doctor read it is reported as
    such; the report said "run intloom doctor." in doctor's own output once doctor stopped
    editing other commands' messages (IntloomError.here), as observe's finding had none."""
    from intloom.diagnostics.doctor import _file_problem
    from intloom.host.metadata import ServiceLock, read_lock
    from intloom.host.observe import observe_file

    paths = ProjectPaths(root)
    paths.state.mkdir(mode=0o700, exist_ok=True)
    lock = ServiceLock(version=1, pid=os.getpid(), create_time=1.0, boot_id="b",
                       instance_id="i", started_at="2026-12-02T10:00:00Z")
    paths.service_lock.write_bytes(msgspec.json.encode(lock))
    paths.service_lock.chmod(0o600)
    reads = iter(range(2, 1000))

    def rewritten(path: Path) -> ServiceLock | None:
        """What a read saw: the file as a writer left it just before the bytes were read."""
        value = read_lock(path)
        assert value is not None
        return msgspec.structs.replace(value, pid=next(reads))

    said = _file_problem(lambda: observe_file(paths.service_lock, ServiceLock, rewritten))
    assert said is not None and "changed every time it was read" in said, said
    assert str(paths.service_lock) in said and "intloom doctor" not in said, said


def test_a_fault_dump_is_a_line_of_its_own_not_text_inside_a_logged_message(
        tmp_path: Path) -> None:
    """A Step's error quoting a child's "Fatal Python error: Aborted", logged, then a kill
    -9: doctor said the host had crashed in native code, with a stray '"}' in its words."""
    from intloom.diagnostics.doctor import _fault_dump, _last_host_check

    logged = (b'{"time":"T1","level":"info","event":"run_created","runId":"RUN-1"}\n'
              b'{"time":"T2","level":"error","event":"run_failed","runId":"RUN-1",'
              b'"message":"child said: Fatal Python error: Aborted"}\n')
    assert _fault_dump(logged, tmp_path) is None
    check = _last_host_check(("LOG-1.jsonl", logged), tmp_path, current=True)
    assert check is not None and "ended without a word" in check.message, check
    own = tmp_path / "workflows" / "w.py"
    dump = logged + (
        b"Fatal Python error: Aborted\n\nThread 0x1 (most recent call first):\n"
        b'  File "/usr/lib/python3.11/threading.py", line 1 in wait\n\n'
        b"Current thread 0x2 (most recent call first):\n"
        b'  File "/usr/lib/python3.11/ctypes/__init__.py", line 519 in string_at\n'
        + f'  File "{own}", line 7 in crash\n'.encode()
        + b'  File "/x/intloom/host/daemon.py", line 5 in run\n')
    assert _fault_dump(dump, tmp_path) == (
        "Aborted", 'File "/usr/lib/python3.11/ctypes/__init__.py", line 519 in string_at, '
        f'called from File "{own}", line 7 in crash')


def test_a_host_killed_in_its_stop_is_said_to_have_been_killed_there(tmp_path: Path) -> None:
    """Its log shows service_stopping: doctor said "no stop or fatal error after it: the
    host ended without a word ... its stop's lines are then missing"."""
    from intloom.diagnostics.doctor import _last_host_check

    logged = (b'{"time":"T1","level":"info","event":"run_created","runId":"RUN-1"}\n'
              b'{"time":"T2","level":"info","event":"service_stopping","reason":"SIGTERM",'
              b'"within":12.5}\n'
              b'{"time":"T3","level":"info","event":"run_suspended","runId":"RUN-1"}\n')
    check = _last_host_check(("LOG-1.jsonl", logged), tmp_path, current=True)
    assert check is not None and check.status == "attention", check
    assert check.message.startswith(
        "The last host began to stop at T2 (SIGTERM) and its log (.intloom/logs/LOG-1.jsonl) "
        "ends at T3 with run_suspended of Run RUN-1, before that stop ended: the host was "
        "killed during its stop"), check.message
    assert "without a word" not in check.message and check.next is not None


def _start_cut(tmp_path: Path, lines: list[dict[str, Any]]) -> tuple[bytes, Any]:
    """The log of a host that ended during its start, made of ``lines``, and doctor's
    ``last_host`` check of it (status ``attention``)."""
    from intloom.diagnostics.doctor import _last_host_check

    tail = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    check = _last_host_check(("LOG-x.jsonl", tail), tmp_path, current=True)
    assert check is not None and check.status == "attention", check
    return tail, check


def test_last_host_names_the_part_of_its_start_a_host_ended_in(tmp_path: Path) -> None:
    """A host killed while it restored its Runs: doctor said its log "ends ... with
    run_restored of Run X", not that it never served, nor how far the restore got."""
    from intloom.diagnostics.doctor import _last_host_check

    tail, check = _start_cut(tmp_path, [
        {"time": "T0", "level": "info", "event": "service_starting"},
        {"time": "T1", "level": "info", "event": "source_importing", "source": "a.py"},
        {"time": "T2", "level": "info", "event": "run_restored", "runId": "RUN-1"},
        {"time": "T3", "level": "info", "event": "run_restored", "runId": "RUN-2"}])
    assert check.message.startswith(
        "The last host ended during its start, while it restored its Runs (2 restored): its "
        "log (.intloom/logs/LOG-x.jsonl) ends at T3 with run_restored of Run RUN-2"), check
    served = tail + b'{"time": "T4", "level": "info", "event": "service_ready"}\n'
    later = _last_host_check(("LOG-x.jsonl", served), tmp_path, current=True)
    assert later is not None and "during its start" not in later.message, later


def test_last_host_killed_past_its_restore_is_not_said_to_have_been_restoring(
        tmp_path: Path) -> None:
    """A host killed once its restore had finished (listening, starting its journal segment,
    writing service.json) was said to have ended "while it restored its Runs", of a log
    ending with restore_finished."""
    _, check = _start_cut(tmp_path, [
        {"time": "T0", "level": "info", "event": "service_starting"},
        {"time": "T1", "level": "info", "event": "run_restored", "runId": "RUN-1"},
        {"time": "T2", "level": "info", "event": "restore_finished", "resumed": 1}])
    assert check.message.startswith(
        "The last host ended during its start, after it had restored its Runs (1 restored), "
        "before it served: its log (.intloom/logs/LOG-x.jsonl) ends at T2 with "
        "restore_finished"), check.message
