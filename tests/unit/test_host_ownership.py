"""What a host removes at its stop: only the very files it created, and it says when the
project directory moved under it. Real files, the host's own ``Ownership``, no host."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import uuid
from pathlib import Path

import pytest

from intloom.errors import IntloomError
from intloom.host.logfile import utc_now
from intloom.host.metadata import METADATA_VERSION, ServiceInfo, current_identity
from intloom.host.ownership import Ownership
from intloom.project import ProjectPaths


def _owning(root: Path) -> Ownership:
    root.mkdir()
    identity = current_identity()
    owner = Ownership(ProjectPaths(root), str(uuid.uuid4()), identity, utc_now())
    owner.take_lock()
    owner.publish_service(ServiceInfo(
        version=METADATA_VERSION, project_root=str(root), pid=identity.pid,
        create_time=identity.create_time, instance_id=owner.instance_id, port=1,
        started_at=owner.started_at, package_version="0", protocol_version=1))
    return owner


def test_a_host_whose_project_moved_removes_nothing_by_the_old_path_and_says_so(
        tmp_path: Path) -> None:
    """``mv proj proj.moved`` under a running host, then a copy put back at ``proj`` (``cp -a``:
    its service files name this very host). The stop read the copies by the old path, found
    its instance id in them and removed them -- files not its own -- and said nothing of the
    move: its own files, in the moved directory, stayed behind without a word."""
    root, moved = tmp_path / "proj", tmp_path / "proj.moved"
    owner = _owning(root)
    assert owner.elsewhere() is None and owner.foreseen() == []
    root.rename(moved)
    shutil.copytree(moved, root)
    copies = {name: (root / ".intloom" / name).read_bytes()
              for name in ("service.json", "service.lock")}

    [fact] = owner.foreseen()  # said while the log is open
    assert fact == (f"the project directory was moved while this host ran: its .intloom/ is "
                    f"now {moved}/.intloom and {root}/.intloom is another directory, so no "
                    "service file was removed by the old path; this host's service.json and "
                    f"service.lock stay in {moved}/.intloom")
    fix = owner.moved_fix()
    assert fix is not None and f"set its files aside in {moved}/.intloom" in fix, fix
    assert f"intloom start in {moved}" in fix, fix

    assert owner.release() == [fact]
    for name, data in copies.items():  # the copies are not its files: kept as they are
        assert (root / ".intloom" / name).read_bytes() == data
        assert (moved / ".intloom" / name).is_file()  # its own: kept, and named above


def test_a_host_removes_only_the_very_files_it_created(tmp_path: Path) -> None:
    """Not moved, it removes its own files; a service.json put back by hand in place of its
    own (naming this very host) is not its own, and stays."""
    root = tmp_path / "proj"
    owner = _owning(root)
    assert owner.moved_fix() is None and owner.elsewhere() is None
    service = root / ".intloom" / "service.json"
    shutil.copy2(service, tmp_path / "copy.json")
    (tmp_path / "copy.json").replace(service)
    assert owner.release() == []
    assert service.is_file()
    assert not (root / ".intloom" / "service.lock").exists()


def test_a_file_system_without_file_locks_is_named_not_an_internal_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """flock failing ENOLCK (a file system without locks: some network and FUSE ones) was
    re-raised, and the start failed CLI_INTERNAL_ERROR, "report it", naming nothing."""
    root = tmp_path / "proj"
    root.mkdir()
    owner = Ownership(ProjectPaths(root), str(uuid.uuid4()), current_identity(), utc_now())

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)  # what such a file system answers
    with pytest.raises(IntloomError) as refused:
        owner.take_lock()
    assert refused.value.code == "STORAGE_ERROR", refused.value
    assert refused.value.message.startswith(
        f"{ProjectPaths(root).service_lock} cannot be locked: its file system does not "
        "support file locks (flock: No locks available)"), refused.value.message
    assert "Put the project on a local file system" in refused.value.message


def test_a_lock_whose_descriptor_was_closed_is_taken_again_only_if_it_is_still_ours(
        tmp_path: Path) -> None:
    """``keep_lock`` after code in the host closed the lock's descriptor: the same file is
    locked again; a lock file removed meanwhile and created by a second host -- which on
    ext4 often gets the freed inode number -- is not taken for ours (it answered "waiting"
    for ever while both hosts served), nor is a lock another process keeps."""
    owner = _owning(tmp_path / "a")
    assert owner.keep_lock() == "held"
    assert owner._lock_fd is not None
    os.close(owner._lock_fd)
    assert owner.keep_lock() == "retaken"
    assert owner.keep_lock() == "held"
    probe = os.open(owner.paths.service_lock, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
    finally:
        os.close(probe)
    assert owner.release() == []
    assert not owner.paths.service_lock.exists()

    for n in range(20):  # enough for the freed inode number to come back at least once
        first = _owning(tmp_path / f"r{n}")
        assert first._lock_fd is not None
        os.close(first._lock_fd)
        first.paths.service_lock.unlink()
        second = Ownership(first.paths, str(uuid.uuid4()), current_identity(), utc_now())
        second.take_lock()
        with pytest.raises(IntloomError) as lost:
            first.keep_lock()
        assert lost.value.code == "CLI_SERVICE_METADATA_INVALID"
        assert "that file is another one now" in lost.value.message, lost.value.message
        assert first.release() == [] and second.paths.service_lock.exists()  # not ours
        assert second.release() == []

    held = _owning(tmp_path / "held")
    assert held._lock_fd is not None
    other = os.open(held.paths.service_lock, os.O_RDONLY)  # before: not the freed number
    os.close(held._lock_fd)
    try:
        fcntl.flock(other, fcntl.LOCK_EX)  # another process's, as far as the host can tell
        assert held.keep_lock() == "waiting"
        held._relock_since = (held._relock_since or 0) - 10  # its patience spent
        with pytest.raises(IntloomError) as busy:
            held.keep_lock()
        assert "another process has held that lock since" in busy.value.message
    finally:
        os.close(other)
    held.release()
