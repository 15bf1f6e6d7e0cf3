"""What one host instance owns on disk: ``service.lock``, ``service.json`` and its connection.

The lock is created exclusively and held under an OS lock (``flock``) for the host's life. A
lock file that already exists -- live or stale -- fails the start with ``CLI_SERVICE_BUSY``
and is never removed or touched here. On release, a file is removed only while it still
names this instance: a replacement's files are never ours to delete.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import os
import secrets
import time
from pathlib import Path
from typing import Final, Literal

import msgspec

from intloom.errors import IntloomError
from intloom.fsutil import (
    PrivacyError,
    UnlinkRefusal,
    ensure_private_dir,
    path_of,
    storage_fix,
    unlink_refusal,
)
from intloom.host.metadata import (
    METADATA_VERSION,
    Connection,
    OwnerIdentity,
    ServiceInfo,
    ServiceLock,
    create_lock_file,
    privacy_invalid,
    read_connection,
    read_lock,
    read_service,
    write_connection,
    write_service,
)
from intloom.project import ProjectPaths

__all__ = ["BUSY_MESSAGE", "Ownership", "new_token"]

BUSY_MESSAGE: Final = (
    "The project service is locked ({path} exists). Run intloom doctor; use intloom recover "
    "only after its owner has exited."
)
# create_lock_file has normally taken the OS lock already (on this same descriptor, so
# taking it again succeeds at once); where it could not, a read-only probe (doctor, status)
# may hold it for an instant right after the file appears; the file itself is ours by
# O_EXCL, so waiting briefly is safe.
_FLOCK_PATIENCE: Final = 2.0


def new_token() -> str:
    """32 random bytes, base64url without padding: 43 characters."""
    return base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode("ascii")


# What flock says on a file system that has no such locks (some network and FUSE ones).
NO_FLOCK: Final = (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)


def _flock(fd: int, path: Path) -> bool:
    deadline = time.monotonic() + _FLOCK_PATIENCE
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno in NO_FLOCK:
                # service.lock's OS lock is what keeps a second host out and tells a live
                # owner from a dead one: without it, a start failed CLI_INTERNAL_ERROR,
                # "report it", naming nothing.
                raise IntloomError(
                    "STORAGE_ERROR",
                    f"{path} cannot be locked: its file system does not support file locks "
                    f"(flock: {exc.strerror or exc}), which intloom needs to keep a second "
                    "host out of the project and to tell a live host from a dead one. Put "
                    "the project on a local file system (ext4, xfs, btrfs, tmpfs), or mount "
                    "this one with lock support, then start again.",
                ) from None
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)  # a short poll of the OS lock, bounded by the patience above


def _unreadable(path: Path, exc: IntloomError) -> str:
    return f"{path.name} is kept: it cannot be read as this host's ({exc.message})"


def _not_removed(path: Path, exc: OSError) -> str:
    refused = unlink_refusal(path)
    if refused is not None:
        return _kept(path, refused)
    return f"{path.name} could not be removed ({exc.strerror or exc})"


def _kept(path: Path, refused: UnlinkRefusal) -> str:
    return f"{path.name} cannot be removed: {refused.fact}"


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _lock_lost(path: Path, why: str) -> IntloomError:
    return IntloomError(
        "CLI_SERVICE_METADATA_INVALID",
        f"Code running in the host closed the descriptor holding the OS lock on {path}, {why}: "
        "nothing keeps a second host off this project, so this host stops.")


def _fd_identity(fd: int | None) -> tuple[int, int] | None:
    try:
        return None if fd is None else _identity(os.fstat(fd))
    except OSError:
        return None


class Ownership:
    """The service files of one host instance, from taking the lock to releasing it."""

    def __init__(self, paths: ProjectPaths, instance_id: str, identity: OwnerIdentity,
                 started_at: str) -> None:
        self.paths = paths
        self.instance_id = instance_id
        self.identity = identity
        self.started_at = started_at
        self._lock_fd: int | None = None
        # The (device, inode) of the service.lock this host created: its descriptor must go
        # on naming it (``keep_lock``).
        self._lock_id: tuple[int, int] | None = None
        self._relock_since: float | None = None  # monotonic: the first look that found it busy
        # .intloom/ itself, open: where it is now when the project directory was moved
        # (``elsewhere``); the lock's own descriptor cannot tell (it was made under a temp
        # name and linked into place, so /proc names that removed name).
        self._state_fd: int | None = None
        self._wrote_service = False
        # The (device, inode) of the service.json this host wrote: at release, a file at
        # that path is removed only if it is that very file (see ``elsewhere``).
        self._service_id: tuple[int, int] | None = None
        self._service: ServiceInfo | None = None  # what publish_service wrote

    # ----- startup ------------------------------------------------------------------------

    def take_lock(self) -> None:
        """Create ``service.lock`` exclusively and hold its OS lock. BUSY if it exists."""
        try:
            ensure_private_dir(self.paths.state)
        except PrivacyError as exc:
            raise privacy_invalid(exc) from None
        except OSError as exc:  # the project directory refuses .intloom/ (EPERM, EROFS, ...)
            raise IntloomError(
                "STORAGE_ERROR",
                f"{self.paths.state} could not be created ({exc.strerror or exc}); nothing was "
                f"written. {storage_fix(exc, self.paths.state)}",
            ) from None
        with contextlib.suppress(OSError):  # only ever used to say where the files went
            self._state_fd = os.open(self.paths.state, os.O_RDONLY | os.O_DIRECTORY)
        record = ServiceLock(
            version=METADATA_VERSION,
            pid=self.identity.pid,
            create_time=self.identity.create_time,
            boot_id=self.identity.boot_id,
            instance_id=self.instance_id,
            started_at=self.started_at,
        )
        try:
            fd = create_lock_file(self.paths.service_lock, record)
        except FileExistsError:
            raise IntloomError(
                "CLI_SERVICE_BUSY", BUSY_MESSAGE.format(path=self.paths.service_lock)
            ) from None
        self._lock_fd = fd
        self._lock_id = _fd_identity(fd)
        if not _flock(fd, self.paths.service_lock):
            raise IntloomError(
                "CLI_SERVICE_BUSY",
                f"Another process holds the OS lock on {self.paths.service_lock}. Run intloom "
                "doctor to see who, then retry.",
            )

    def keep_lock(self) -> Literal["held", "retaken", "waiting"]:
        """Take the OS lock on ``service.lock`` again when code running in the host closed
        the descriptor that held it (a Step's ``os.closerange``, a library that daemonises):
        the host served on, every command then found the lock file's owner alive and its
        OS lock free, refused it, and doctor called it another copy's host. ``held``: as
        taken; ``retaken``: taken again now, on a new descriptor (the old number, closed or
        another file's now, is not ours to close); ``waiting``: a probe holds it this instant.
        Raises IntloomError when the lock file is no longer the one this host created (removed
        or replaced meanwhile; a new file may get the freed inode number, so it must also
        name this instance), or its lock stays held by another for ``_FLOCK_PATIENCE``:
        nothing then keeps a second host off the project."""
        fd, ours = self._lock_fd, self._lock_id
        if ours is None:
            return "held"  # never taken, or released
        if fd is not None and _fd_identity(fd) == ours:
            return "held"
        # Lost (a number of ours closed or reused), or lost at an earlier look: taken
        # through a new descriptor, the old number forgotten.
        self._lock_fd = None
        path = self.paths.service_lock
        try:
            # Read-write, as the lock was made: NFS emulates flock with a write lock.
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise _lock_lost(path, f"which cannot be opened again ({exc.strerror or exc})"
                             ) from None
        try:
            if _identity(os.fstat(fd)) != ours or not self._names_us(os.pread(fd, 65536, 0)):
                raise _lock_lost(path, "and that file is another one now (removed or replaced)")
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            now = time.monotonic()
            if self._relock_since is None:
                self._relock_since = now
            elif now - self._relock_since > _FLOCK_PATIENCE:
                raise _lock_lost(path, "and another process has held that lock since, for "
                                 f"more than {_FLOCK_PATIENCE:g} s") from None
            return "waiting"  # a probe's instant; a later look takes it
        except OSError as exc:
            os.close(fd)
            raise _lock_lost(path, f"which cannot be locked again ({exc.strerror or exc})"
                             ) from None
        except BaseException:
            os.close(fd)
            raise
        self._lock_fd, self._relock_since = fd, None
        return "retaken"

    def _names_us(self, data: bytes) -> bool:
        try:
            return self._ours(msgspec.json.decode(data, type=ServiceLock))
        except (msgspec.DecodeError, RecursionError):
            return False

    def saved_connection(self) -> Connection | None:
        """The previous ``connection.json`` (its port and token are reused). Strict."""
        return read_connection(self.paths.connection_json, self.paths.root)

    def check_service_file(self) -> None:
        """A leftover ``service.json`` must at least be valid; an invalid one is kept as is."""
        read_service(self.paths.service_json, self.paths.root)

    def publish_connection(self, saved: Connection | None, port: int, token: str) -> Connection:
        """Write ``connection.json`` when missing or when the port changed; keep the token."""
        if saved is not None and saved.port == port and saved.token == token:
            return saved
        conn = Connection(
            version=METADATA_VERSION, project_root=str(self.paths.root), port=port, token=token
        )
        write_connection(self.paths.connection_json, conn)
        return conn

    def publish_service(self, info: ServiceInfo) -> None:
        """Write ``service.json`` -- the last step before the host reports ready."""
        # Set first: a write that failed after its rename still left our file, and release
        # removes it only while it names this instance.
        self._wrote_service = True
        self._service = info
        try:
            write_service(self.paths.service_json, info)
        finally:
            with contextlib.suppress(OSError):  # unknown: release then keeps the file
                self._service_id = _identity(os.lstat(self.paths.service_json))

    def restore_service(self) -> bool:
        """Write ``service.json`` again when it is gone while the host serves (removed by
        hand); True when it was. Without it every command took the serving host for one
        still starting: status and doctor said to wait, and start and stop each waited
        their 300 s for a start that had ended long before. Only a file that is gone is
        written: one put in its place is another's (release keeps it, foreseen says so)."""
        if self._service is None:
            return False
        try:
            os.lstat(self.paths.service_json)
            return False
        except FileNotFoundError:
            pass
        if self._moved_to() is not None:
            return False  # the project moved as a whole: its file is where it went
        self.publish_service(self._service)
        return True

    # ----- release ------------------------------------------------------------------------

    def _ours(self, value: ServiceLock | ServiceInfo | None) -> bool:
        return (
            value is not None
            and value.instance_id == self.instance_id
            and value.pid == self.identity.pid
        )

    def _mine(self, path: Path, ours: tuple[int, int] | None) -> bool:
        """Whether ``path`` is still the very file this host created (device and inode): a
        copy of the project put where it was moved from, or a file put back by hand, may
        name this instance and still not be its own."""
        try:
            return ours is not None and _identity(os.lstat(path)) == ours
        except OSError:
            return False

    def _moved_to(self) -> Path | None:
        """Where this host's .intloom/ is now, when the path no longer leads to it: the
        project directory was moved or renamed while the host ran (a ``.intloom/`` moved
        alone stops the host at once: ``Host._moved_away``). None when it is where it was,
        or when that cannot be told; then each file is judged on its own (``release``)."""
        fd = self._state_fd
        if fd is None:
            return None
        try:
            ours = _identity(os.fstat(fd))
            if _identity(os.lstat(self.paths.state)) == ours:
                return None
        except FileNotFoundError:
            pass
        except OSError:
            return None
        now = path_of(fd)
        return None if now is None or Path(now) == self.paths.state else Path(now)

    def elsewhere(self) -> str | None:
        """Why no service file is removed by its path, when the project directory was moved
        while the host ran (``_moved_to``), with where the files are now; else None.
        ``moved_fix`` says what to do."""
        state = self._moved_to()
        if state is None:
            return None
        old = self.paths.state
        at = "does not exist" if not os.path.lexists(old) else "is another directory"
        return (f"the project directory was moved while this host ran: its .intloom/ is now "
                f"{state} and {old} {at}, so no service file was removed by the old path; "
                f"this host's service.json and service.lock stay in {state}")

    def moved_fix(self) -> str | None:
        """What to do about the files kept when the project directory was moved while the
        host ran (``elsewhere``); None when it was not (intloom recover then applies)."""
        state = self._moved_to()
        if state is None:
            return None
        return (f"Once this host has exited, set its files aside in {state} (mv service.json "
                "service.json.moved, the same for service.lock and connection.json), then run "
                f"intloom start in {state.parent} (docs/recovery.md, After moving a project "
                "directory).")

    def foreseen(self) -> list[str]:
        """Why ``release`` will keep a file of ours, as far as can be told before trying it:
        unreadable, or refused an unlink (``fsutil.unlink_refusal``: a read-only
        filesystem, the file or .intloom immutable or append-only, a .intloom this user
        cannot write or may not remove another's file from). Asked while the host's log is
        still open, so the log says why those files stay: release runs after the log is
        closed (DESIGN §3), and a launched host's stderr goes nowhere."""
        moved = self.elsewhere()
        if moved is not None:
            return [moved]
        problems: list[str] = []
        checks = ((self.paths.service_json, self._wrote_service,
                   lambda: read_service(self.paths.service_json, self.paths.root)),
                  (self.paths.service_lock, self._lock_id is not None,
                   lambda: read_lock(self.paths.service_lock)))
        for path, wrote, read in checks:
            if not wrote:
                continue
            try:
                value: ServiceInfo | ServiceLock | None = read()
            except IntloomError as exc:
                problems.append(_unreadable(path, exc))
                continue
            if not self._ours(value):
                continue  # gone, or another instance's: not ours to remove anyway
            ours = (self._service_id if path == self.paths.service_json
                    else self._lock_id)
            if not self._mine(path, ours):
                # release keeps it, and stop guessed a crash or an immutable file.
                problems.append(
                    f"{path} names this host but is another file than the one it wrote (put "
                    "back or copied in by hand while it ran), so it is kept: intloom recover "
                    "removes it once this host has exited")
                continue
            refused = unlink_refusal(path)
            if refused is not None:
                problems.append(_kept(path, refused))
        return problems

    def release(self) -> list[str]:
        """Remove our ``service.json`` then our ``service.lock``; drop the OS lock last.

        Every step is attempted; the problems are returned, never raised: the log is closed
        by now (``foreseen`` told it what could be told before), so the caller says them.
        """
        moved = self.elsewhere()
        problems: list[str] = [] if moved is None else [moved]
        if self._wrote_service and moved is None:
            try:
                if (self._ours(read_service(self.paths.service_json, self.paths.root))
                        and self._mine(self.paths.service_json, self._service_id)):
                    os.unlink(self.paths.service_json)
            except FileNotFoundError:
                pass
            except IntloomError as exc:
                problems.append(_unreadable(self.paths.service_json, exc))
            except OSError as exc:
                problems.append(_not_removed(self.paths.service_json, exc))
        if self._lock_id is not None:
            try:
                if (moved is None and self._ours(read_lock(self.paths.service_lock))
                        and self._mine(self.paths.service_lock, self._lock_id)):
                    os.unlink(self.paths.service_lock)
            except FileNotFoundError:
                pass
            except IntloomError as exc:
                problems.append(_unreadable(self.paths.service_lock, exc))
            except OSError as exc:
                problems.append(_not_removed(self.paths.service_lock, exc))
        fd, ours, self._lock_fd, self._lock_id = self._lock_fd, self._lock_id, None, None
        if fd is not None and (ours is None or _fd_identity(fd) == ours):
            # Closing drops the OS lock; only now may a probe see the lock free. A number
            # that names another file now (code in the host closed ours, and keep_lock has
            # not looked since) is not ours to close.
            with contextlib.suppress(OSError):
                os.close(fd)
        if self._state_fd is not None:
            fd, self._state_fd = self._state_fd, None
            os.close(fd)
        return problems
