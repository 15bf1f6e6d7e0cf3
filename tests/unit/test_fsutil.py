"""Atomic replacement of several private files at once (``replace_files``), on real files:
every target is replaced or none is, and nothing is left behind."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from intloom.errors import IntloomError
from intloom.fsutil import (
    WRITE_FAULT_ENV,
    PrivacyError,
    no_inode_left,
    replace_file,
    replace_files,
)

pytestmark = pytest.mark.timeout(30)


def _state(directory: Path) -> dict[str, tuple[bytes, int] | str]:
    """Every entry: a file's bytes and inode, or where a link points."""
    out: dict[str, tuple[bytes, int] | str] = {}
    for path in directory.iterdir():
        if path.is_symlink():
            out[path.name] = os.readlink(path)
        else:
            out[path.name] = (path.read_bytes(), path.stat().st_ino)
    return out


def _old_files(directory: Path, names: list[str]) -> None:
    for name in names:
        (directory / name).write_bytes(f"old {name}".encode())


def test_every_file_is_replaced_by_a_new_private_inode(tmp_path: Path) -> None:
    _old_files(tmp_path, ["a", "b"])
    before = _state(tmp_path)
    replace_files(tmp_path, [("a", b"new a"), ("b", b"new b"), ("c", b"new c")])
    after = _state(tmp_path)
    assert sorted(after) == ["a", "b", "c"]  # no temp file left
    assert {name: value[0] for name, value in after.items() if isinstance(value, tuple)} == {
        "a": b"new a", "b": b"new b", "c": b"new c"}
    for name in ("a", "b"):  # renamed over, not written in place
        assert isinstance(after[name], tuple) and isinstance(before[name], tuple)
        assert after[name][1] != before[name][1]
    assert all(stat.S_IMODE((tmp_path / n).stat().st_mode) == 0o600 for n in after)


def test_a_failed_write_replaces_nothing_and_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _old_files(tmp_path, ["a", "b", "c"])
    before = _state(tmp_path)
    monkeypatch.setenv(WRITE_FAULT_ENV, "b=ENOSPC")  # half of b's bytes, then the error
    with pytest.raises(OSError) as info:
        replace_files(tmp_path, [("a", b"new a"), ("b", b"new b"), ("c", b"new c")])
    assert info.value.errno == 28
    assert _state(tmp_path) == before  # a was written and fsynced, but never renamed


def test_a_link_at_any_target_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "theirs").write_bytes(b"not ours")
    work = tmp_path / "work"
    work.mkdir()
    _old_files(work, ["a"])
    (work / "b").symlink_to(outside / "theirs")
    before = _state(work)
    with pytest.raises(PrivacyError) as info:
        replace_files(work, [("a", b"new a"), ("b", b"new b")])
    assert info.value.path == work / "b" and "symbolic link" in info.value.fact
    assert _state(work) == before
    assert (outside / "theirs").read_bytes() == b"not ours"


def test_a_failed_rename_leaves_the_renamed_ones_and_no_temp_file(tmp_path: Path) -> None:
    _old_files(tmp_path, ["a"])
    (tmp_path / "b").mkdir()  # a directory: a file cannot be renamed over it
    with pytest.raises(IsADirectoryError):
        replace_files(tmp_path, [("a", b"new a"), ("b", b"new b"), ("c", b"new c")])
    assert (tmp_path / "a").read_bytes() == b"new a"  # renamed before b failed
    assert (tmp_path / "b").is_dir() and not (tmp_path / "c").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_replace_file_is_one_item_of_replace_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _old_files(tmp_path, ["a"])
    replace_file(tmp_path, "a", b"new a")
    assert (tmp_path / "a").read_bytes() == b"new a"
    monkeypatch.setenv(WRITE_FAULT_ENV, "a=EIO")
    with pytest.raises(OSError):
        replace_file(tmp_path, "a", b"newer a")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]
    assert (tmp_path / "a").read_bytes() == b"new a"


def test_the_state_keeps_its_modes_under_a_umask_that_masks_the_owners_bits(
    tmp_path: Path,
) -> None:
    """mkdir and open take their mode through the umask: under 0777 the state's directories
    and files came out 0000 (under 0277, 0500 and 0400), so a host started but no command
    could read its connection.json or stop it; lifecycle.md says 0700 and 0600."""
    from intloom.fsutil import atomic_write, ensure_private_dir
    from intloom.host.logfile import HostLog
    from intloom.host.metadata import ServiceLock, create_lock_file
    from intloom.store.files import open_new

    state = tmp_path / ".intloom" / "runtime"
    lock = ServiceLock(version=1, pid=os.getpid(), create_time=1.0, boot_id="b",
                       instance_id="i", started_at="2026-01-01T00:00:00.000Z")
    previous = os.umask(0o777)
    try:
        ensure_private_dir(state)
        atomic_write(state / "manifest.json", b"{}")
        os.close(open_new(state / "0000000001.seg"))
        os.close(create_lock_file(tmp_path / ".intloom" / "service.lock", lock))
        log = HostLog.open(tmp_path / ".intloom" / "logs")
    finally:
        os.umask(previous)
    log.close()  # sealed: 0400
    modes = {str(p.relative_to(tmp_path)): stat.S_IMODE(p.lstat().st_mode)
             for p in (tmp_path / ".intloom").rglob("*")}
    modes[".intloom"] = stat.S_IMODE((tmp_path / ".intloom").lstat().st_mode)
    assert modes == {
        ".intloom": 0o700, ".intloom/runtime": 0o700, ".intloom/logs": 0o700,
        ".intloom/runtime/manifest.json": 0o600, ".intloom/runtime/0000000001.seg": 0o600,
        ".intloom/service.lock": 0o600, f".intloom/logs/{log.path.name}": 0o400,
    }, modes


def test_metadata_of_the_same_directory_under_another_path_names_the_path_to_use(
    tmp_path: Path,
) -> None:
    """A project reached through a bind mount (one directory, two paths that resolve()
    cannot join, here an unresolved link stands in for it) was told its connection.json
    "belongs to another project ... moved or copied" and to move the file aside, which is
    false of it and, under its live host, no fix. A truly other directory still is."""
    from intloom.host.metadata import read_connection, read_service

    root = tmp_path / "proj"
    (root / ".intloom").mkdir(parents=True)
    alias = tmp_path / "alias"
    alias.symlink_to(root)
    conn = {"version": 1, "projectRoot": str(root), "port": 40000, "token": "t" * 43}
    service = {"version": 1, "projectRoot": str(root), "pid": os.getpid(), "createTime": 1.0,
               "instanceId": "i", "port": 40000, "startedAt": "2026-01-01T00:00:00.000Z",
               "packageVersion": "0", "protocolVersion": 1, "logFile": "LOG-x.jsonl"}
    for name, data in (("connection.json", conn), ("service.json", service)):
        path = root / ".intloom" / name
        path.write_text(json.dumps(data))
        path.chmod(0o600)
    for read, name in ((read_connection, "connection.json"), (read_service, "service.json")):
        with pytest.raises(IntloomError) as info:
            read(alias / ".intloom" / name, alias)
        message = info.value.message
        assert info.value.code == "CLI_SERVICE_METADATA_INVALID"
        assert f"was written for {root}, which is this same directory" in message, message
        assert f"Pass --project {root}" in message, message
        assert "moved or copied" not in message and "mv " not in message, message
    other = tmp_path / "copy"
    other.mkdir()
    with pytest.raises(IntloomError) as info:
        read_connection(root / ".intloom" / "connection.json", other)
    assert "moved or copied" in info.value.message, info.value.message


def test_metadata_that_is_not_a_private_file_names_the_fix_its_fact_calls_for(
    tmp_path: Path,
) -> None:
    """Each way a metadata path can be wrong gets its own fix: chmod only fixes a mode."""
    from intloom.errors import IntloomError
    from intloom.host.metadata import read_connection

    root = tmp_path
    path = root / "connection.json"
    def empty() -> None:
        path.write_bytes(b"")

    def loose() -> None:
        path.chmod(0o644)

    def link() -> None:
        path.unlink()
        path.symlink_to(root / "elsewhere")

    def directory() -> None:
        path.unlink()
        path.mkdir()

    cases: list[tuple[Callable[[], None], str, str]] = [
        (empty, "is empty (a crash or a full disk", "left as it is"),
        # A token others could read is no secret: moved aside, not chmod'ed and kept.
        (loose, "has mode 0644", f"move it aside (mv {path} {path}.exposed) before the next"),
        (link, "is a symbolic link", f"Move it aside (mv {path} {path}.bad)"),
        (directory, "is not a regular file", f"Move it aside (mv {path} {path}.bad)"),
    ]
    path.write_bytes(b"x")
    path.chmod(0o600)
    for make, fact, fix in cases:
        make()
        with pytest.raises(IntloomError) as info:
            read_connection(path, root)
        message = info.value.message
        assert info.value.code == "CLI_SERVICE_METADATA_INVALID"
        assert fact in message and fix in message, message
        assert "Input data was truncated" not in message
        assert "chmod" not in message or fact == "has mode 0644", message


# ----- advice read from the file system: a failed start, its log and doctor say the same ----

_SAID = """
import errno, json, sys
from pathlib import Path
from intloom.diagnostics.doctor import unwritable_state_dir
from intloom.host.daemon import _log_write_failed
from intloom.fsutil import storage_fix
from intloom.errors import IntloomError
from intloom.project import ProjectPaths
from intloom.store.files import ensure_dir

def created(path):
    try:
        ensure_dir(path)
    except IntloomError as exc:
        return exc.message
    return None

def said(root):
    paths = ProjectPaths(Path(root))
    denied = PermissionError(errno.EACCES, "Permission denied")
    return [
        storage_fix(denied, paths.state / "connection.json"),  # a metadata write
        storage_fix(denied, paths.state),  # creating .intloom (Ownership.take_lock)
        _log_write_failed(paths.logs, "Permission denied", errno.EACCES).message,
        unwritable_state_dir(paths),
        created(paths.runtime),  # the checkpoint store's directory (Host.startup)
    ]
"""


def _says(*roots: Path, prefix: tuple[str, ...] = ()) -> list[list[Any]]:
    """What a start (its metadata, its lock directory, its log) and doctor say about each
    of ``roots`` as it is: here, or in one child run under ``prefix`` (as a user file
    modes bind)."""
    if not prefix:
        space: dict[str, Any] = {}
        exec(_SAID, space)  # the very code the child runs
        return [json.loads(json.dumps(space["said"](str(root)))) for root in roots]
    script = _SAID + "\nprint(json.dumps([said(root) for root in sys.argv[1:]]))"
    done = subprocess.run([*prefix, sys.executable, "-c", script, *map(str, roots)],
                          capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    result: list[list[Any]] = json.loads(done.stdout)
    return result


def _as_plain_user() -> tuple[str, ...]:
    """A command prefix under which file modes bind (root without the capabilities that
    override them), or skip."""
    if os.geteuid() != 0:
        pytest.skip("not root: another user's directory cannot be made here")
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("root without setpriv: file modes do not bind")
    caps = "-dac_override,-dac_read_search,-fowner"
    return (setpriv, "--bounding-set", caps, "--inh-caps", caps)


def test_a_directory_you_may_not_write_is_named_alike_with_its_mode_and_owner(
        tmp_path: Path) -> None:
    """The host said "make it writable (check its permissions, lsattr -d ...)" by its errno
    alone, its log the same, its checkpoint store "check that the project directory is
    writable", while doctor inferred "chmod 700" from the mode: each now names what the
    file system says -- the directory, its mode, whose it is -- and one fix."""
    prefix = _as_plain_user()
    mine = tmp_path / "mine"
    (mine / ".intloom").mkdir(parents=True, mode=0o500)
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    stranger = os.geteuid() + 4242
    os.chown(theirs, stranger, -1)
    try:
        said_mine, said_theirs = _says(mine, theirs, prefix=prefix)
    finally:
        os.chmod(mine / ".intloom", 0o700)
    state = mine / ".intloom"
    fact, fix = f"{state} is not writable by you (mode 0500)", f"Run chmod 700 {state}"
    advice = f"{fact[:1].upper()}{fact[1:]}. {fix}, then start again."
    metadata, _created, log, doctor, store = said_mine  # .intloom exists: not created
    # logs/ is not there yet: the log is judged by .intloom, which would hold it.
    assert metadata == advice and log.endswith(f"did not start. {advice}"), said_mine
    assert store == (f"Checkpoint store path {state / 'runtime'} cannot be created "
                     f"(Permission denied): {fact}; run chmod 700 {state}."), store
    assert doctor == [f"{fact}; intloom needs to create, replace and remove files there (its "
                      "lock, its log, the Runs' checkpoints).", fix], doctor
    their_fact = (f"{theirs} is owned by uid {stranger}, not by you (uid {os.geteuid()}), "
                  "and its mode 0755 does not let you write it")
    their_fix = f"have its owner (uid {stranger}) let you write it, or run as a user who may"
    who = f"{their_fact}. H{their_fix[1:]}, then start again."
    metadata, created, log, doctor, store = said_theirs
    assert metadata == created == who and log.endswith(f"did not start. {who}"), said_theirs
    assert store == (f"Checkpoint store path {theirs / '.intloom' / 'runtime'} cannot be "
                     f"created (Permission denied): {their_fact}; {their_fix}."), store
    # No state directory yet: the root, where the first start creates it, is judged.
    assert doctor == [f"{their_fact}; intloom needs to create .intloom/ there (its lock, its "
                      "log, the Runs' checkpoints).", f"H{their_fix[1:]}"], doctor


_KEPT = """
import importlib, json, os, sys
from pathlib import Path
from intloom.errors import IntloomError
from intloom.fsutil import write_refusal
from intloom.host.ownership import _not_removed

recover = importlib.import_module("intloom.diagnostics.recover")
out = []
for name in sys.argv[1:]:
    path = Path(name)
    try:
        os.unlink(path)
        raise SystemExit(f"{path} was removed")
    except PermissionError as exc:
        host = _not_removed(path, exc)  # the host's release, as its log says it
    try:
        recover._remove(path, None, [])
        raise SystemExit(f"{path} was removed")
    except IntloomError as exc:
        out.append([host, exc.message, write_refusal(path)])
print(json.dumps(out))
"""


def test_a_directory_you_may_not_write_is_named_alike_by_the_host_log_and_recover(
        tmp_path: Path) -> None:
    """A host that could not remove its service.json from such a .intloom logged "this
    user cannot write .intloom", and recover said it too, without the mode or the owner a
    failed start and doctor name (``write_refusal``): they now say the same fact."""
    prefix = _as_plain_user()
    mine, theirs = tmp_path / "mine" / ".intloom", tmp_path / "theirs" / ".intloom"
    for state in (mine, theirs):
        state.mkdir(parents=True, mode=0o700)
        (state / "service.json").write_text("{}")
    stranger = os.geteuid() + 4242
    os.chown(theirs, stranger, -1)
    os.chmod(theirs, 0o755)
    os.chmod(mine, 0o500)
    try:
        done = subprocess.run(
            [*prefix, sys.executable, "-c", _KEPT, str(mine / "service.json"),
             str(theirs / "service.json")], capture_output=True, text=True, timeout=20)
    finally:
        os.chmod(mine, 0o700)
    assert done.returncode == 0, done.stderr
    for (host, recovered, (fact, fix)), state in zip(json.loads(done.stdout), (mine, theirs),
                                                       strict=True):
        assert fact.startswith(f"{state} is "), fact  # the mode and whose it is
        assert host == f"service.json cannot be removed: {fact}", host
        assert recovered == (f".intloom/service.json could not be removed (Permission "
                             f"denied): {fact}. Nothing was removed. {fix}, then run intloom "
                             "recover again."), recovered
    assert json.loads(done.stdout)[0][2] == [f"{mine} is not writable by you (mode 0500)",
                                             f"Run chmod 700 {mine}"]


def _chattr(path: Path, flag: str) -> bool:
    return subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0


@pytest.mark.parametrize("flag", ["+i", "+a"])
def test_a_flagged_state_directory_is_named_alike_by_the_start_its_log_and_doctor(
        tmp_path: Path, flag: str) -> None:
    """An immutable (or append-only) .intloom: the start and its log said "make it
    writable ... lsattr -d" whichever it was; doctor saw an append-only one as fine (its
    write permission is intact, yet nothing in it can be replaced or removed)."""
    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed")
    state = tmp_path / ".intloom"
    state.mkdir(mode=0o700)
    if not _chattr(state, flag):
        pytest.skip(f"chattr {flag} is not supported here (CAP_LINUX_IMMUTABLE, filesystem)")
    try:
        [[metadata, _created, log, doctor, store]] = _says(tmp_path)
    finally:
        _chattr(state, flag.replace("+", "-"))
    fact = (f"{state} is immutable (chattr +i)" if flag == "+i" else
            f"{state} is append-only (chattr +a): nothing in it can be replaced or removed")
    fix = f"Clear the flag (lsattr -d {state} shows it) with chattr -{flag[1]} {state}"
    advice = f"{fact}. {fix}, then start again."
    assert metadata == advice, metadata
    # A log is only created (logs/ with it), which an append-only directory allows: that
    # flag is not why its write failed.
    assert (log.endswith(f"did not start. {advice}") if flag == "+i" else
            "append-only" not in log), log
    assert doctor == [f"{fact}; intloom needs to create, replace and remove files there (its "
                      "lock, its log, the Runs' checkpoints).", fix], doctor
    # An append-only directory takes a new entry: the store's directory is created in it.
    assert store == (None if flag == "+a" else f"Checkpoint store path {state / 'runtime'} "
                     f"cannot be created (Operation not permitted): {fact}; "
                     f"{fix[:1].lower()}{fix[1:]}."), store


def test_an_append_only_log_or_wal_directory_is_no_fault_of_the_project(
        tmp_path: Path) -> None:
    """logs/ and runtime/wal/ only ever get new files, appended to; an append-only flag on
    them (a way to keep logs) hinders no start, Run or stop. doctor called it attention
    ("nothing in it can be replaced or removed"), status said a start would fail, and a
    failed log write blamed the flag."""
    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed")
    state = tmp_path / ".intloom"
    logs, wal = state / "logs", state / "runtime" / "wal"
    for path in (logs, wal):
        path.mkdir(mode=0o700, parents=True)
    state.chmod(0o700)
    (state / "runtime").chmod(0o700)
    flagged = [path for path in (logs, wal) if _chattr(path, "+a")]
    if not flagged:
        pytest.skip("chattr +a is not supported here (CAP_LINUX_IMMUTABLE, filesystem)")
    try:
        [[_metadata, _created, log, doctor, _store]] = _says(tmp_path)
    finally:
        for path in flagged:
            _chattr(path, "-a")
    assert doctor is None, doctor
    assert "append-only" not in log, log


def test_an_append_only_directory_you_may_not_write_either_is_named_by_its_mode(
        tmp_path: Path) -> None:
    """A log is only created, which an append-only logs/ allows: the flag set aside, what
    refuses is then the mode, and the fact said nothing at all (": ; Run chmod 700 ...")."""
    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed")
    prefix = _as_plain_user()
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o500)
    if not _chattr(logs, "+a"):
        pytest.skip("chattr +a is not supported here (CAP_LINUX_IMMUTABLE, filesystem)")
    script = ("import json, sys; from pathlib import Path; from intloom.fsutil import "
              "write_refusal; print(json.dumps(write_refusal(Path(sys.argv[1]) / 'x.jsonl', "
              "replaced=False)))")
    try:
        done = subprocess.run([*prefix, sys.executable, "-c", script, str(logs)],
                              capture_output=True, text=True, timeout=20)
    finally:
        _chattr(logs, "-a")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [f"{logs} is not writable by you (mode 0500)",
                                       f"Run chmod 700 {logs}"], done.stdout


def _acl_denies_write(path: Path, uid: int) -> None:
    """Give ``path`` a POSIX ACL whose entry for ``uid`` grants read and search only (the
    mode's bits unchanged: the mask grants all); skip where ACLs cannot be set."""
    unset = 0xFFFFFFFF
    entries = [(0x01, 7, unset), (0x02, 5, uid), (0x04, 7, unset), (0x10, 7, unset),
               (0x20, 7, unset)]  # user::rwx user:uid:r-x group::rwx mask::rwx other::rwx
    acl = (2).to_bytes(4, "little") + b"".join(
        tag.to_bytes(2, "little") + perm.to_bytes(2, "little") + who.to_bytes(4, "little")
        for tag, perm, who in entries)
    try:
        os.setxattr(path, "system.posix_acl_access", acl)
    except OSError as exc:
        pytest.skip(f"no POSIX ACL here ({exc.strerror})")


def test_another_users_directory_whose_mode_lets_you_write_names_what_else_refuses(
        tmp_path: Path) -> None:
    """Another user's directory of mode 0777 that an ACL closes to you was said to be one
    whose "mode 0777 does not let you write it", and its owner sent to change that mode:
    the mode lets you; an ACL (or a security module) refuses, as said of your own."""
    prefix = _as_plain_user()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    theirs.chmod(0o777)
    os.chown(theirs, os.geteuid() + 4242, -1)
    _acl_denies_write(theirs, os.geteuid())
    [[_metadata, created, _log, _doctor, _store]] = _says(theirs, prefix=prefix)
    assert created == (f"{theirs} is not writable by you, though its mode (0777) lets you "
                       "write it: an ACL or a security module (SELinux, AppArmor) refuses. "
                       f"Check getfacl {theirs} and the security module's log, then start "
                       "again."), created


def test_a_wal_directory_that_refuses_a_new_segment_is_named_as_doctor_names_it(
        tmp_path: Path) -> None:
    """An immutable runtime/wal/ failed the start with "cannot hold a new segment (Operation
    not permitted); free disk space or fix the directory's permissions" -- neither is why --
    while doctor named the flag and its fix."""
    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed")
    from intloom.diagnostics.doctor import unwritable_state_dir
    from intloom.project import ProjectPaths
    from tests.unit.test_store_support import abandon, open_store

    paths = ProjectPaths(tmp_path)
    open_store(paths.runtime).close_blocking()
    wal = paths.runtime / "wal"
    if not _chattr(wal, "+i"):
        pytest.skip("chattr +i is not supported here (CAP_LINUX_IMMUTABLE, filesystem)")
    try:
        with pytest.raises(IntloomError) as info:
            abandon(open_store(paths.runtime))
        doctor = unwritable_state_dir(paths)
    finally:
        _chattr(wal, "-i")
    fact, fix = f"{wal} is immutable (chattr +i)", f"clear the flag (lsattr -d {wal} shows it)"
    assert info.value.message == (
        f"Checkpoint store path {wal} cannot hold a new segment (Operation not permitted): "
        f"{fact}; {fix} with chattr -i {wal}."), info.value
    assert doctor is not None and doctor[0].startswith(f"{fact};"), doctor


@pytest.mark.parametrize("flag", ["+i", "+a"])
def test_status_says_a_flagged_snapshot_directory_lets_runs_go_on_and_fails_compaction(
        tmp_path: Path, flag: str) -> None:
    """An immutable or append-only runtime/snap/live/: status said "intloom start fails on
    the project as it is", yet the host starts and runs its Runs; only snapshot compaction
    fails there, with a warning in the host log. doctor still calls it a fault."""
    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed")
    from intloom.diagnostics.doctor import start_problem, unwritable_state_dir
    from intloom.project import ProjectPaths
    from tests.unit.test_store_support import open_store

    paths = ProjectPaths(tmp_path)
    # A project (status diagnoses only one), whose intloom.toml a start would take.
    (tmp_path / "intloom.toml").write_text('workflows = ["workflows/example.py"]\n')
    open_store(paths.runtime).close_blocking()
    live = paths.runtime / "snap" / "live"
    if not _chattr(live, flag):
        pytest.skip(f"chattr {flag} is not supported here (CAP_LINUX_IMMUTABLE, filesystem)")
    try:
        open_store(paths.runtime).close_blocking()  # what a start does with it: it opens
        said = start_problem(tmp_path)
        doctor = unwritable_state_dir(paths)
    finally:
        _chattr(live, "-" + flag[1])
    what = "immutable (chattr +i)" if flag == "+i" else (
        "append-only (chattr +a): nothing in it can be replaced or removed")
    assert said == (
        f"intloom start works and the Runs go on, but {live} is {what}: snapshot compaction "
        "fails when it writes there (a warning in the host log each time), and the log a "
        f"start reads grows until the flag is cleared. Clear the flag (lsattr -d {live} "
        f"shows it) with chattr -{flag[1]} {live}."), said
    assert doctor is not None and doctor[0].startswith(f"{live} is "), doctor


def test_a_lock_file_a_failed_start_removes_stays_locked_until_it_is_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When .intloom's fsync failed after service.lock was linked, create_lock_file closed
    the file -- letting its lock go -- before removing it: for that moment the lock of a
    live, starting host was free and the host had no descriptor open on it, which doctor
    takes as proof that the pid is not this project's host ("move service.lock aside by
    hand"). It is removed while still held, as it was held from its creation."""
    from intloom.errors import IntloomError
    from intloom.fsutil import os_lock
    from intloom.host import metadata

    path, record = _lock_to_create(tmp_path)
    seen: list[str] = []
    unlink = os.unlink

    def probed(target: Any, *args: Any, **kwargs: Any) -> None:
        if Path(target) == path:
            seen.append(os_lock(path)[0])
        unlink(target, *args, **kwargs)

    def refused(_directory: Path) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(metadata, "fsync_dir", refused)
    monkeypatch.setattr(os, "unlink", probed)
    with pytest.raises(IntloomError, match="Input/output error"):
        metadata.create_lock_file(path, record)
    monkeypatch.undo()
    assert seen == ["held"]
    assert sorted(os.listdir(path.parent)) == []


def test_a_lock_file_interrupted_while_its_temp_file_is_locked_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyboardInterrupt while create_lock_file waited for its temp file's lock (a probe
    holding it) escaped before the try that cleans up: the temp file stayed in .intloom and
    its descriptor stayed open."""
    from intloom.host import metadata

    path, record = _lock_to_create(tmp_path)

    def interrupted(_fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(metadata, "hold_temp", interrupted)
    before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(KeyboardInterrupt):
        metadata.create_lock_file(path, record)
    assert sorted(os.listdir("/proc/self/fd")) == before
    assert sorted(os.listdir(path.parent)) == []


def _lock_to_create(tmp_path: Path) -> tuple[Path, Any]:
    """Where a start would create its service.lock (its .intloom made), and its record."""
    from intloom.host import metadata
    from tests.unit.diagnostics_support import make_root

    path = make_root(tmp_path) / ".intloom" / "service.lock"
    path.parent.mkdir(mode=0o700)
    record = metadata.ServiceLock(version=metadata.METADATA_VERSION, pid=os.getpid(),
                                  create_time=1_000_000.0, boot_id="b",
                                  instance_id="0f0e0d0c-0b0a-4908-8706-050403020100",
                                  started_at="2026-01-01T00:00:00Z")
    return path, record


def test_a_file_system_the_kernel_made_read_only_after_an_error_is_named_as_such(
        tmp_path: Path) -> None:
    """ext4 with errors=remount-ro after an error: its mount still says "rw" (statvfs has no
    ST_RDONLY), only its superblock's ``emergency_ro`` tells, and every write fails with
    EROFS. status said "free space on the disk", stop guessed "an immutable file, or a
    read-only .intloom": the fact is now read, with the disk check it calls for."""
    from intloom.fsutil import write_refusal

    image, mount = tmp_path / "img", tmp_path / "fs"
    mount.mkdir()
    with open(image, "wb") as fh:
        fh.truncate(16 << 20)
    if shutil.which("mkfs.ext4") is None or subprocess.run(
            ["mkfs.ext4", "-q", "-F", str(image)], capture_output=True).returncode != 0:
        pytest.skip("mkfs.ext4 is not available")
    if subprocess.run(["mount", "-o", "loop,errors=remount-ro", str(image), str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("a loop mount needs root (and a loop device)")
    try:
        (mount / ".intloom").mkdir()
        assert write_refusal(mount / ".intloom" / "service.lock") is None
        device = Path(subprocess.run(["findmnt", "-n", "-o", "SOURCE", str(mount)],
                                     capture_output=True, text=True).stdout.strip()).name
        trigger = Path("/sys/fs/ext4") / device / "trigger_fs_error"
        try:
            trigger.write_text("1")
        except OSError:
            pytest.skip(f"{trigger} cannot be written here")
        with pytest.raises(OSError) as refused:
            (mount / ".intloom" / "x").write_text("")
        assert refused.value.errno == errno.EROFS
        assert not os.statvfs(mount).f_flag & os.ST_RDONLY  # the mount never says it
        said = write_refusal(mount / ".intloom" / "service.lock")
        assert said == (f"the file system holding {mount / '.intloom'} was made read-only by "
                        "the kernel after an error",
                        "Check the disk first (dmesg says which error; fsck the file system "
                        "once it is unmounted), then mount it read-write again"), said
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)


def _statvfs(files: int, favail: int, bavail: int) -> os.statvfs_result:
    # (bsize, frsize, blocks, bfree, bavail, files, ffree, favail, flag, namemax)
    return os.statvfs_result((4096, 4096, 1 << 20, bavail, bavail, files, favail, favail,
                              0, 255))


@pytest.mark.parametrize(("files", "favail", "said"), [
    (1_000_000, 0, True),
    # What a compaction out of inodes leaves once it removed its temp snapshots: a few free
    # again. It said "Free disk space" with gigabytes free.
    (1_000_000, 9, True),
    (1_000_000, 1023, True),
    (1_000_000, 1024, False),
    (1500, 9, True),  # a small file system: under 1 % of its inodes
    (1500, 16, False),
    (40, 1, False),
    (0, 0, False),  # no inode count (btrfs): never said
])
def test_no_inode_left_counts_nearly_none_as_none_after_a_failed_write(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, files: int, favail: int,
        said: bool) -> None:
    monkeypatch.setattr(os, "statvfs", lambda _path: _statvfs(files, favail, 1 << 18))
    fix = no_inode_left(tmp_path, failed=True)
    assert (fix is not None) == said, fix
    # Asked ahead of any write (status, doctor): only none left is none. A start that
    # needs a dozen inodes was said likely to fail with 899 free.
    ahead = no_inode_left(tmp_path)
    assert (ahead is not None) == (said and favail == 0), ahead
    if fix is not None:
        assert f"shows {favail:,} free" in fix and "whatever free space df shows" in fix, fix
        # Never "remove files there" of the journal's own directory: it holds the Runs.
        assert "not intloom's journal under .intloom/runtime/" in fix, fix


def test_a_directory_whose_file_system_ignores_chmod_is_said_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a file system that ignores chmod (vfat, SMB, WSL's drvfs, bindfs --chmod-ignore),
    the .intloom/ just made stayed 0777, and the check after refused it: "has mode 0777; it
    must be 0700 ... Run chmod 700", which changed nothing, at every start."""
    from intloom.fsutil import ensure_private_dir

    real_mkdir = os.mkdir

    def loose_mkdir(path: Any, mode: int = 0o777, **kw: Any) -> None:
        mask = os.umask(0o022)
        try:
            real_mkdir(path, 0o777, **kw)  # 0755, whatever was asked
        finally:
            os.umask(mask)

    monkeypatch.setattr(os, "mkdir", loose_mkdir)
    target = tmp_path / "proj" / ".intloom"
    (tmp_path / "proj").mkdir()
    real_chmod = os.chmod
    monkeypatch.setattr(os, "chmod", lambda path, mode, **kw: None)  # ignored
    try:
        with pytest.raises(PrivacyError) as refused:
            ensure_private_dir(target)
    finally:
        monkeypatch.setattr(os, "chmod", real_chmod)
    said = refused.value
    shown = stat.S_IMODE(target.stat().st_mode)
    assert shown == 0o755
    assert said.fact.startswith("was just created by intloom, but its file system keeps mode "
                                f"{shown:04o} after chmod 700"), said.fact
    assert said.fix is not None and "file system that keeps modes and owners" in said.fix


def test_a_link_to_a_state_directory_is_put_back_in_its_place_not_moved_aside(
        tmp_path: Path) -> None:
    """.intloom/runtime moved to a bigger disk and linked back: "move it aside" was the fix,
    and the next start began afresh in a new, empty directory, every Run left behind in the
    one the link leads to, without a word (doctor: all well)."""
    from intloom.fsutil import PrivacyError, privacy_fix

    big = tmp_path / "big disk" / "rt"
    big.mkdir(parents=True)
    link = tmp_path / "runtime"
    link.symlink_to(big)
    fix = privacy_fix(PrivacyError(link, "is a symbolic link; intloom never follows links"))
    assert fix == (
        f"It leads to the directory '{big}': to use that directory, put it in the link's "
        f"place (rm {link}; mv '{big}' {link}) or "
        f"bind-mount it at {link}; then try again. Moved aside instead, the link is replaced "
        f"by a new, empty directory, without what '{big}' holds")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    assert privacy_fix(PrivacyError(dangling, "is a symbolic link")).startswith(
        f"Move it aside (mv {dangling} {dangling}.bad)")
