"""recover against real leftovers: what it removes, what it refuses, and what it never touches."""

from __future__ import annotations

import errno
import importlib
import os
import shutil
import socket
import subprocess
from pathlib import Path

import msgspec
import pytest

from intloom.diagnostics import recover
from intloom.diagnostics.portguard import PortGuard
from intloom.errors import IntloomError
from intloom.fsutil import unlink_refusal
from intloom.host.ownership import _kept, _not_removed
from intloom.project import ProjectPaths
from intloom.protocol.framing import decode_response, recv_frame
from intloom.protocol.messages import ErrorReply
from tests.unit.diagnostics_support import (
    crash_leftovers,
    create_time,
    dead_pid,
    free_port,
    live_process,
    lock_holder,
    make_root,
    tree,
    write_connection_json,
    write_lock,
    write_service_json,
)

recover_module = importlib.import_module("intloom.diagnostics.recover")


def _user_data(root: Path) -> None:
    """Files recover must never touch: journals, logs, user files."""
    paths = ProjectPaths(root)
    for directory in (paths.runtime, paths.logs):
        directory.mkdir(mode=0o700, exist_ok=True)
    (paths.runtime / "journal.log").write_bytes(b"\x00journal bytes")
    (paths.logs / "LOG-20261130T000000000Z.jsonl").write_text('{"event":"log_opened"}\n')
    (root / "notes.md").write_text("user data\n")


def _blocked(root: Path, *, dry_run: bool = False) -> IntloomError:
    before = tree(root)
    with pytest.raises(IntloomError) as caught:
        recover(root, dry_run=dry_run)
    assert caught.value.code == "CLI_RECOVERY_BLOCKED"
    assert tree(root) == before
    return caught.value


def test_recover_removes_only_the_stale_service_files(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    crash_leftovers(root, dead_pid(), 1_000_000.0)
    _user_data(root)
    before = tree(root)

    plan = recover(root, dry_run=True)
    assert (plan.dry_run, plan.recovered) == (True, False)
    assert plan.paths == [".intloom/service.json", ".intloom/service.lock"]
    assert all(item.evidence for item in plan.plan)
    assert tree(root) == before

    result = recover(root, dry_run=False)
    assert (result.dry_run, result.recovered) == (False, True)
    assert result.paths == [".intloom/service.json", ".intloom/service.lock"]
    after = tree(root)
    removed = set(before) - set(after)
    assert removed == {".intloom/service.json", ".intloom/service.lock"}
    assert {k: v for k, v in before.items() if k not in removed} == after

    again = recover(root, dry_run=False)
    assert (again.recovered, again.paths) == (False, [])


def test_recover_reports_temp_files_of_an_interrupted_write_and_keeps_them(
        tmp_path: Path) -> None:
    """A host killed mid-write of service.lock leaves ``.service.lock.<hex>.tmp``: recover
    removes only service.json and service.lock (DESIGN), and names the temp file, kept."""
    root = make_root(tmp_path)
    crash_leftovers(root, dead_pid(), 1_000_000.0)
    tmp = ProjectPaths(root).state / ".service.lock.0123456789abcdef.tmp"
    tmp.write_bytes(b'{"version":1,"pid":12')
    tmp.chmod(0o600)
    os.utime(tmp, (1_000_000.0, 1_000_000.0))  # as old as the crash that left it
    kept = tmp.read_bytes()
    plan = recover(root, dry_run=True)
    assert plan.paths == [".intloom/service.json", ".intloom/service.lock"]
    doc = msgspec.to_builtins(plan)
    assert doc["leftovers"] == [{"path": ".intloom/.service.lock.0123456789abcdef.tmp",
                                 "target": "service.lock", "size": 21}]
    result = recover(root, dry_run=False)
    assert result.recovered and msgspec.to_builtins(result)["leftovers"] == doc["leftovers"]
    assert tmp.read_bytes() == kept


def test_recover_run_with_the_pid_the_crashed_host_recorded_recovers(tmp_path: Path) -> None:
    """A container's host is PID 1, and so is the recover run in the next container: the
    recorded pid is recover's own, with another create time (reused). Looking again under
    the lock it had taken, recover took its own hold on service.lock for the owner's (the
    kernel's /proc/locks names pid 1) and refused for good: CLI_RECOVERY_CONFLICT, "no
    longer provably gone"."""
    root = make_root(tmp_path)
    me = os.getpid()
    crash_leftovers(root, me, create_time(me) - 3600)  # the pid before, reused by us
    result = recover(root, dry_run=False)
    assert (result.recovered, result.paths) == (
        True, [".intloom/service.json", ".intloom/service.lock"]), result


def test_recover_on_nfs_like_locks_proves_a_dead_owner_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NFS emulates flock with POSIX locks, whose exclusive kind needs a descriptor open for
    writing: through a read-only one (every probe's) flock fails EBADF. A crashed host's
    lock could never be proved free, so status, doctor and recover called its owner
    unknown for good and nothing but deleting files by hand got the project back."""
    import fcntl as real

    flock = real.flock

    def nfs_flock(fd: int, operation: int) -> None:
        if (operation & real.LOCK_EX
                and real.fcntl(fd, real.F_GETFL) & os.O_ACCMODE == os.O_RDONLY):
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        flock(fd, operation)

    monkeypatch.setattr(real, "flock", nfs_flock)
    root = make_root(tmp_path)
    crash_leftovers(root, dead_pid(), 1_000_000.0)
    before = tree(root)
    plan = recover(root, dry_run=True)
    assert plan.paths == [".intloom/service.json", ".intloom/service.lock"], plan
    assert tree(root) == before  # the probe opened it for writing, and changed nothing
    result = recover(root, dry_run=False)
    assert result.recovered, result


def test_json_shape_matches_intloom(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    crash_leftovers(root, dead_pid(), 1_000_000.0)
    doc = msgspec.to_builtins(recover(root, dry_run=True))
    assert {"projectRoot", "dryRun", "recovered", "paths", "plan"} == set(doc)
    assert set(doc["plan"][0]) == {"path", "evidence"}
    assert set(doc["plan"][0]["evidence"][0]) == {"check", "found"}


def test_live_owner_blocks_and_nothing_is_touched(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    with live_process() as proc:
        crash_leftovers(root, proc.pid, create_time(proc.pid))
        _user_data(root)
        error = _blocked(root)
        _blocked(root, dry_run=True)
    # The refusal names the files, the owner and what was found, and the way on: the
    # documented sentence alone named none of them.
    assert error.message.startswith(
        "A resource owner still exists or its exit cannot be verified. No cleanup performed.")
    assert (f".intloom/service.lock names pid {proc.pid}, which is alive: process {proc.pid} "
            "exists with the owner's create time") in error.message, error.message
    assert f".intloom/service.json names pid {proc.pid}, which is alive" in error.message
    assert "Run intloom doctor" in error.message and "by hand" in error.message


def test_held_lock_blocks(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    pid = dead_pid()
    crash_leftovers(root, pid, 1_000_000.0)
    with lock_holder(ProjectPaths(root).service_lock):
        error = _blocked(root)
    assert (f".intloom/service.lock names pid {pid}, whose exit cannot be verified: no "
            f"process has pid {pid}; the OS lock on service.lock is held by a live "
            "process") in error.message, error.message
    assert "fuser -v .intloom/service.lock" in error.message


def test_missing_connection_blocks(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    crash_leftovers(root, dead_pid(), 1_000_000.0, connection=False)
    error = _blocked(root)
    assert "Valid connection configuration is missing" in error.message
    assert "remove .intloom/service.lock and .intloom/service.json yourself" in error.message


def test_occupied_port_blocks(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    port = free_port()
    # Only the lock is left (no service.json), so no probe runs: the port guard decides.
    write_lock(root, dead_pid(), 1_000_000.0)
    write_connection_json(root, port)
    with socket.socket() as foreign:
        foreign.bind(("127.0.0.1", port))
        foreign.listen()
        error = _blocked(root)
    assert error.message.startswith(
        "The project port is in use or unavailable. No recovery performed."
    )
    assert str(port) in error.message


def test_foreign_listener_on_the_saved_port_blocks(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    port = free_port()
    crash_leftovers(root, dead_pid(), 1_000_000.0, port=port)
    # Something else answers on the port: it closes every connection without a hello. The
    # owner is provably gone, so it is another program, and recover says so as documented.
    with PortGuard(port):
        error = _blocked(root)
    assert error.message.startswith(
        "The project port is in use or unavailable. No recovery performed."
    )
    assert f"ss -ltnp 'sport = :{port}'" in error.message
    assert "did not complete the hello" not in error.message


def test_recover_finishes_an_interrupted_recover(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    write_lock(root, dead_pid(), 1_000_000.0)  # a killed recover removed service.json only
    write_connection_json(root, free_port())
    result = recover(root, dry_run=False)
    assert (result.recovered, result.paths) == (True, [".intloom/service.lock"])
    assert not ProjectPaths(root).service_lock.exists()
    assert ProjectPaths(root).connection_json.exists()


def test_offline_project_has_nothing_to_recover(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    write_connection_json(root, free_port())
    before = tree(root)
    for dry_run in (True, False):
        result = recover(root, dry_run=dry_run)
        assert (result.recovered, result.paths) == (False, [])
    assert tree(root) == before


def test_change_during_recovery_is_a_conflict_and_removes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_root(tmp_path)
    crash_leftovers(root, dead_pid(), 1_000_000.0)
    paths = ProjectPaths(root)
    real_take_lock = recover_module._take_lock

    def take_lock_after_a_change(path: Path) -> int | None:
        # Someone rewrites service.json between the diagnosis and the re-check.
        data = paths.service_json.read_bytes().replace(b'"startedAt"', b'"startedAt" ')
        fd = os.open(paths.service_json, os.O_WRONLY | os.O_TRUNC)
        os.write(fd, data)
        os.close(fd)
        return real_take_lock(path)  # type: ignore[no-any-return]

    monkeypatch.setattr(recover_module, "_take_lock", take_lock_after_a_change)
    before = tree(root)
    with pytest.raises(IntloomError) as caught:
        recover(root, dry_run=False)
    assert caught.value.code == "CLI_RECOVERY_CONFLICT"
    assert "service.json" in caught.value.message
    assert "Nothing was removed" in caught.value.message
    assert set(tree(root)) == set(before)


def test_lock_taken_during_recovery_is_a_conflict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_root(tmp_path)
    crash_leftovers(root, dead_pid(), 1_000_000.0)
    paths = ProjectPaths(root)
    real_take_lock = recover_module._take_lock
    holders = []

    def take_lock_while_held(path: Path) -> int | None:
        holder = lock_holder(paths.service_lock)
        holder.__enter__()
        holders.append(holder)
        return real_take_lock(path)  # type: ignore[no-any-return]

    monkeypatch.setattr(recover_module, "_take_lock", take_lock_while_held)
    before = tree(root)
    try:
        with pytest.raises(IntloomError) as caught:
            recover(root, dry_run=False)
    finally:
        for holder in holders:
            holder.__exit__(None, None, None)
    assert caught.value.code == "CLI_RECOVERY_CONFLICT"
    assert tree(root) == before


def test_an_owner_no_longer_provably_gone_under_the_lock_is_a_conflict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The re-check under the port and the lock judges the owners again, not only the files:
    an owner proved gone by the diagnosis that can no longer be inspected once recover holds
    the lock (/proc remounted with hidepid meanwhile) is unknown, and nothing is removed."""
    import psutil

    root = make_root(tmp_path)
    pid = dead_pid()
    crash_leftovers(root, pid, 1_000_000.0)
    _user_data(root)
    real_process, real_take_lock = psutil.Process, recover_module._take_lock

    def denied(target: int | None = None) -> psutil.Process:
        if target == pid:
            raise psutil.AccessDenied(pid)
        return real_process(target)

    def take_lock_then_hide_the_owner(path: Path) -> int | None:
        fd = real_take_lock(path)
        monkeypatch.setattr(psutil, "Process", denied)
        return fd  # type: ignore[no-any-return]

    monkeypatch.setattr(recover_module, "_take_lock", take_lock_then_hide_the_owner)
    before = tree(root)
    with pytest.raises(IntloomError) as caught:
        recover(root, dry_run=False)
    assert caught.value.code == "CLI_RECOVERY_CONFLICT", caught.value
    assert f"(pid {pid}) is no longer provably gone" in caught.value.message, caught.value
    assert "Nothing was removed" in caught.value.message, caught.value
    assert tree(root) == before


def test_port_guard_turns_clients_away_with_an_error_frame() -> None:
    port = free_port()
    with PortGuard(port, reply=recover_module._guard_reply(port)):
        with pytest.raises(IntloomError) as caught:
            PortGuard(port).open()
        assert caught.value.code == "CLI_RECOVERY_BLOCKED"
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            client.sendall(b"\x00\x00\x00\x05hello")
            reply = decode_response(recv_frame(client))
        assert isinstance(reply, ErrorReply)
        assert reply.error.code == "CLI_SERVICE_UNAVAILABLE"
    # Closed: the port is free again.
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a process as another user")
def test_owner_running_as_another_user_blocks_and_nothing_is_touched(tmp_path: Path) -> None:
    """An owner we could not signal (another user's live process, pid and create time
    matching) is alive: recover refuses and every file stays byte-identical."""
    import subprocess

    root = make_root(tmp_path)

    proc = subprocess.Popen(["sleep", "60"], user=65534, group=65534, extra_groups=[])
    try:
        crash_leftovers(root, proc.pid, create_time(proc.pid))
        _user_data(root)
        error = _blocked(root)
        assert "still exists" in error.message or "cannot be verified" in error.message
        _blocked(root, dry_run=True)
    finally:
        proc.kill()
        proc.wait()


def test_an_owner_whose_process_cannot_be_inspected_is_unknown_and_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Permission denied while inspecting the owner (e.g. /proc mounted with hidepid) proves
    nothing: the owner is unknown, and unknown blocks every cleanup."""
    import psutil

    root = make_root(tmp_path)
    pid = dead_pid()
    crash_leftovers(root, pid, 1_000_000.0)
    _user_data(root)
    real = psutil.Process

    def denied(target: int | None = None) -> psutil.Process:
        if target == pid:
            raise psutil.AccessDenied(pid)
        return real(target)

    monkeypatch.setattr(psutil, "Process", denied)
    _blocked(root)
    _blocked(root, dry_run=True)


# ----- a file unlink refuses: the host and recover name the same fact ----------------------


def _chattr(path: Path, flag: str) -> bool:
    return subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0


def _both_say(path: Path) -> tuple[str, str]:
    """What the host's release says about ``path`` and what recover says, unlink refused."""
    with pytest.raises(OSError) as refused:
        os.unlink(path)
    host = _not_removed(path, refused.value)
    with pytest.raises(IntloomError) as caught:
        recover_module._remove(path, None, [])
    assert caught.value.code == "STORAGE_ERROR", caught.value
    return host, caught.value.message


@pytest.mark.parametrize(("target", "flag", "fact", "fix"), [
    ("file", "+i", "it is immutable (chattr +i)", "chattr -i {file}"),
    ("file", "+a", "it is append-only (chattr +a)", "chattr -a {file}"),
    ("dir", "+i", ".intloom is immutable (chattr +i)", "chattr -i {dir}"),
    # Its write permission is intact, yet no entry may go: recover said "the file itself
    # refuses" (it judged by write access), while the host named .intloom's flag.
    ("dir", "+a", ".intloom is append-only (chattr +a)", "chattr -a {dir}"),
])
def test_the_host_and_recover_say_the_same_reason_a_file_cannot_be_removed(
        tmp_path: Path, target: str, flag: str, fact: str, fix: str) -> None:
    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed")
    state = tmp_path / ".intloom"
    state.mkdir(mode=0o700)
    path = state / "service.json"
    path.write_text("{}")
    marked = path if target == "file" else state
    if not _chattr(marked, flag):
        pytest.skip(f"chattr {flag} is not supported here (CAP_LINUX_IMMUTABLE, filesystem)")
    try:
        host, said = _both_say(path)
    finally:
        _chattr(marked, flag.replace("+", "-"))
    assert host == f"service.json cannot be removed: {fact}"
    assert (f".intloom/service.json could not be removed (Operation not permitted): {fact}. "
            "Nothing was removed.") in said, said
    assert fix.format(file=path, dir=state) in said, said


def test_a_sticky_directory_of_another_user_is_named_alike(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the owner of the file or of a sticky directory may remove the file (root
    passes): seen as another user, where neither is theirs."""
    state = tmp_path / ".intloom"
    state.mkdir()
    os.chmod(state, 0o1777)
    path = state / "service.json"
    path.write_text("{}")
    stranger = max(os.stat(state).st_uid, os.stat(path).st_uid) + 4242
    monkeypatch.setattr(os, "geteuid", lambda: stranger)
    refused = unlink_refusal(path)
    assert refused is not None and refused.bar == "sticky" and refused.where == state
    host = _kept(path, refused)
    assert host == ("service.json cannot be removed: .intloom is sticky (chmod +t) and this "
                    "user owns neither it nor the file, which only their owners may remove")
    fact, fix = recover_module._unremovable(path, PermissionError(1, "Operation not permitted"))
    assert fact == f": {refused.fact}" and fix.startswith(f"Remove {path} as its owner"), fix
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(path).st_uid)
    assert unlink_refusal(path) is None  # the file's owner may remove it


def test_a_stop_whose_host_log_is_silent_names_what_kept_its_files(tmp_path: Path) -> None:
    """Its host exited after it was asked to stop, its files still there and its log silent
    about why (killed before it wrote it, or unreadable): stop guessed "an immutable file,
    or a read-only .intloom or filesystem: check `lsattr` and the permissions" where the
    file system says which, as recover and a failed start say it."""
    from intloom.client.lifecycle import _Asked, _Target, _unverified

    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed")
    root = make_root(tmp_path)
    instance, pid = "0f0e0d0c-0b0a-4908-8706-050403020100", dead_pid()
    write_lock(root, pid, 1_000_000.0, instance_id=instance)
    write_service_json(root, pid, 1_000_000.0, free_port(), instance)
    paths = ProjectPaths(root)
    target, asked = _Target(instance, pid, 1_000_000.0, None), _Asked(None, stopping=True)
    guess = _unverified(paths, target, asked)
    # Nothing refuses their removal: no immutable file to guess at, but a host killed in its
    # stop (stop had guessed "check `lsattr` and the permissions", ruled out already).
    assert ("nothing seen here refuses their removal: most likely it was killed or crashed "
            "during its stop") in guess, guess
    assert "lsattr" not in guess, guess
    if not _chattr(paths.state, "+i"):
        pytest.skip("chattr +i is not supported here (CAP_LINUX_IMMUTABLE, filesystem)")
    try:
        said = _unverified(paths, target, asked)
    finally:
        _chattr(paths.state, "-i")
    # One .intloom bars both files: its fact and its fix, once.
    assert said == (
        "Cannot verify resource cleanup by the original instance. Run intloom doctor and "
        f"explicitly recover if needed. Its host (pid {pid}) has exited and left "
        ".intloom/service.json and .intloom/service.lock behind: it exited after it was "
        f"asked to stop, without removing them: {paths.state} is immutable (chattr +i). "
        f"Clear the flag (lsattr -d {paths.state} shows it) with chattr -i {paths.state}, "
        "then run intloom recover. Every file was left as it is."), said
