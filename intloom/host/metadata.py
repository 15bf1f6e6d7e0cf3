"""The host's metadata files: ``service.lock``, ``service.json`` and ``connection.json``.

Readers are strict (DESIGN section 2): a link, a non-regular file, group/other bits, an
unknown key, a wrong type or another project's root is ``CLI_SERVICE_METADATA_INVALID``, and
the file is left exactly as it is.
"""

from __future__ import annotations

import contextlib
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, TypeVar

import msgspec

from intloom.errors import IntloomError
from intloom.fsutil import (
    PrivacyError,
    atomic_write,
    fsync_dir,
    hold_temp,
    injected_write_fault,
    open_exclusive,
    privacy_fix,
    read_private,
    shell_arg,
    storage_fix,
    write_all,
)

__all__ = [
    "CREATE_TIME_TOLERANCE",
    "METADATA_VERSION",
    "Connection",
    "MetadataDamaged",
    "OwnerIdentity",
    "ServiceInfo",
    "ServiceLock",
    "boot_id",
    "create_lock_file",
    "current_identity",
    "privacy_invalid",
    "read_connection",
    "read_lock",
    "read_service",
    "write_connection",
    "write_service",
]

METADATA_VERSION: Final = 1

# psutil derives create times from the boot time in /proc/stat, which is whole seconds and
# can be re-derived a second apart; a real pid reuse never lands this close to the original.
CREATE_TIME_TOLERANCE: Final = 1.0


class _Meta(msgspec.Struct, frozen=True, rename="camel", forbid_unknown_fields=True):
    pass


class ServiceLock(_Meta, frozen=True):
    version: int
    pid: int
    create_time: float
    boot_id: str
    instance_id: str
    started_at: str


class ServiceInfo(_Meta, frozen=True):
    version: int
    project_root: str
    pid: int
    create_time: float
    instance_id: str
    port: int
    started_at: str
    package_version: str
    protocol_version: int
    log_file: str | None = None


class Connection(_Meta, frozen=True):
    version: int
    project_root: str
    port: int
    token: str


class OwnerIdentity(msgspec.Struct, frozen=True):
    """Who a process is: pid alone is not enough once pids are reused."""

    pid: int
    create_time: float
    boot_id: str


def boot_id() -> str:
    """This boot's id; a changed boot id proves every saved pid is gone."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def current_identity() -> OwnerIdentity:
    # Imported here: clients read this module on every CLI command and never need psutil.
    import psutil

    proc = psutil.Process(os.getpid())
    return OwnerIdentity(pid=proc.pid, create_time=proc.create_time(), boot_id=boot_id())


_T = TypeVar("_T", bound=_Meta)
_encoder = msgspec.json.Encoder()


def privacy_invalid(exc: PrivacyError) -> IntloomError:
    """Invalid metadata for a path that is not the private file or directory it must be,
    with the fix its fact calls for."""
    return IntloomError(
        "CLI_SERVICE_METADATA_INVALID",
        f"{exc.path} {exc.fact}. "
        f"{'Nothing was changed' if exc.unseen else 'It was left as it is'}. {privacy_fix(exc)}.",
    )


# pid_t is a C int: no process has a pid beyond it (Linux allots at most 2**22).
_PID_MAX: Final = 2**31 - 1


class MetadataDamaged(IntloomError):
    """A metadata file whose content cannot be read as its kind (not a privacy problem, not
    another version's file): doctor can name the concrete fix once no host owns the
    project."""


def _invalid(path: Path, fact: str) -> IntloomError:
    kept = f"{path} {fact}. It was left as it is"
    return MetadataDamaged("CLI_SERVICE_METADATA_INVALID", f"{kept}; run intloom doctor.",
                           here=f"{kept}.")


def _exited(state: Path, doc: dict[str, object]) -> str | None:
    """How the host another metadata version's file names (``pid``, ``createTime``) is
    proven gone, or None: as an owner is judged gone (DESIGN section 3), its OS lock on
    service.lock free and its pid no process's, a zombie's, or another process's now."""
    from intloom.fsutil import os_lock

    pid, created = doc.get("pid"), doc.get("createTime")
    if (type(pid) is not int or not 1 <= pid <= _PID_MAX
            or not isinstance(created, int | float) or isinstance(created, bool)
            or os_lock(state / "service.lock")[0] not in ("free", "absent")):
        return None
    import psutil  # as current_identity: not on every command's path

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return "a zombie: it exited and waits to be reaped"
        if abs(proc.create_time() - created) > CREATE_TIME_TOLERANCE:
            return f"pid {pid} is another process now, started after it"
    except psutil.NoSuchProcess:
        return "no process has that pid"
    except psutil.Error:
        return None  # access denied: not proven
    return None


def _version_skew(path: Path, data: bytes, kind: type[_Meta]) -> IntloomError | None:
    """The refusal of a file another metadata version wrote (None: not one), asked when the
    strict decode refused it or read another version: another version's file may hold keys
    this one does not know, which read as damage ("unknown field") and led to fixing by
    hand the file of a host that runs."""
    try:
        doc = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return None  # not JSON: the strict decode says so
    if not isinstance(doc, dict):
        return None
    version = doc.get("version")
    if type(version) is not int or version == METADATA_VERSION:
        return None  # no version, or a wrong type: the strict decode names the field
    from intloom import __version__

    package = doc.get("packageVersion")
    writer = "a newer intloom" if version > METADATA_VERSION else "an older intloom"
    if isinstance(package, str) and package and len(package) <= 40 and package != __version__:
        writer += f" ({package})"
    fact = (f"{path} has metadata version {version}; this intloom ({__version__}) reads "
            f"version {METADATA_VERSION}: {writer} wrote it. It was left as it is")
    if kind is Connection:
        fix = (f"Once no host of that intloom runs for this project (stop it with the intloom "
               f"that started it), move the file aside (mv {shell_arg(path)} "
               f"{shell_arg(f'{path}.moved')}); the next intloom start saves a new port and "
               "token and restores the Runs.")
    else:
        pid = doc.get("pid")
        exited = _exited(path.parent, doc)
        if exited is not None:
            # A newer intloom's host that died, read after a downgrade: "kill -TERM PID"
            # named a pid no process had (or another program, once reused), and "the
            # intloom that wrote it removes it" one that may be uninstalled.
            moves = "; ".join(
                f"mv {shell_arg(path.parent / name)} {shell_arg(path.parent / f'{name}.moved')}"
                for name in ("service.json", "service.lock"))
            fix = (f"pid {pid}, the host it names, has exited ({exited}), and nothing holds "
                   "the project's lock: no host of that intloom runs. The intloom that wrote "
                   "the file removes it (intloom recover); with this one, move service.json "
                   f"and service.lock out of .intloom/ ({moves}), then run intloom start.")
        else:
            term = (f", or kill -TERM {pid} (a graceful stop)"
                    if type(pid) is int and 1 <= pid <= _PID_MAX else "")
            fix = ("Stop the host of that intloom with the intloom that started it (intloom "
                   f"stop){term}, then run intloom start with this one. If that host has "
                   "exited, the intloom that wrote the file removes it (intloom recover).")
    return IntloomError("CLI_SERVICE_METADATA_INVALID", f"{fact}. {fix}",
                        here=f"{fact}. {fix}")


def _read(path: Path, kind: type[_T], root: Path | None) -> _T | None:
    try:
        data = read_private(path, max_bytes=64 * 1024)
    except PrivacyError as exc:
        raise privacy_invalid(exc) from None
    if data is None:
        return None
    if not data.strip():
        raise _invalid(path, "is empty (a crash or a full disk while it was written)")
    try:
        value = msgspec.json.decode(data, type=kind)
    except msgspec.DecodeError as exc:
        # Judged by its version first: another version's keys read as damage here.
        skew = _version_skew(path, data, kind)
        raise (skew or _invalid(path, f"is not valid metadata ({exc})")) from None
    except RecursionError:
        # Not a DecodeError: a file nested past the decoder's stack (damage, a hand edit)
        # failed every command that reads it with CLI_INTERNAL_ERROR.
        raise _invalid(path, "is not valid metadata (a value in it is nested too deeply "
                       "to read)") from None
    if value.version != METADATA_VERSION:  # type: ignore[attr-defined]
        raise (_version_skew(path, data, kind) or _invalid(
            path, f"has version {value.version}; this intloom reads "  # type: ignore[attr-defined]
            f"{METADATA_VERSION}"))
    pid = getattr(value, "pid", None)
    if pid is not None and not 1 <= pid <= _PID_MAX:
        # Every reader, not only diagnosis: probing such a number raised (psutil refuses a
        # pid below 1, os.kill one beyond a C int) in the commands that judge it themselves.
        raise _invalid(path, f"names pid {pid}, which no process can have")
    create_time = getattr(value, "create_time", None)
    if create_time is not None and not _is_date(create_time):
        # The owner's evidence shows it as a date; a number beyond any (a damaged or
        # hand-edited file) is no process's start time, so no owner is judged from it.
        raise _invalid(path, f"names createTime {create_time!r}, which is no date a process "
                       "can have started at")
    saved_root = getattr(value, "project_root", None)
    if root is not None and saved_root is not None and saved_root != str(root):
        if _same_directory(saved_root, root):
            # A bind mount (or another mount of the same file system) shows one directory
            # under two paths that resolve() cannot join: "moved or copied", and its fix of
            # moving connection.json aside, were false of it, and wrong under a live host.
            raise IntloomError(
                "CLI_SERVICE_METADATA_INVALID",
                f"{path} was written for {saved_root}, which is this same directory reached "
                "by another path (a bind mount, say); intloom knows a project by the one "
                "path its host was started with. It was left as it is. Pass --project "
                f"{shell_arg(saved_root)}, or change to that directory, then try again.",
            )
        if kind is Connection:
            token = getattr(value, "token", "")
            if _copied_from(saved_root, token, path):
                raise _a_copy(path, saved_root)
            # The usual cause is a project directory moved (or copied) while its host was
            # stopped; the file is only a port and a token, so the fix is to set it aside.
            fact = (f"{path} belongs to another project ({saved_root}): the project "
                    "directory was moved or copied since it was written. It was left as it "
                    "is. If no intloom host runs for this directory")
            fix = (f", move the file aside (mv {shell_arg(path)} "
                   f"{shell_arg(f'{path}.moved')}); the next intloom start saves a new port "
                   "and token and restores the Runs.")
            raise IntloomError("CLI_SERVICE_METADATA_INVALID",
                               f"{fact} (intloom doctor){fix}", here=f"{fact}{fix}")
        pid = getattr(value, "pid", None)
        if pid is not None:
            # service.json or service.lock: "belongs to another project ... run intloom
            # doctor" did not say what happened (connection.json's says), nor whose host.
            # What doctor says, not inside doctor's own report of the file (``here``).
            kept = (f"{path} belongs to another project ({saved_root}): the project "
                    f"directory was moved or copied since its host (pid {pid}) wrote it, "
                    "and that host may still serve the old path. It was left as it is")
            raise MetadataDamaged("CLI_SERVICE_METADATA_INVALID",
                                  f"{kept}; run intloom doctor, which says whether that host "
                                  "runs and how to stop it.", here=f"{kept}.")
        raise _invalid(path, f"belongs to another project ({saved_root})")
    return value


def _copied_from(saved: str, token: str, path: Path) -> bool:
    """Whether the project a ``connection.json`` (at ``path``) was written for is still
    where it names, holding the same token in another file: this directory is then a copy
    of it (a move leaves nothing there; a project made there since, or one whose state was
    reset, has a new token; the same file reached by another path is no copy)."""
    try:
        if not os.path.isabs(saved):
            return False
        there = Path(saved) / ".intloom" / "connection.json"
        original = read_connection(there, Path(saved))
        if original is None or os.path.samefile(there, path):
            return False
    except (IntloomError, OSError, ValueError):  # unreadable there: no verdict of a copy
        return False
    import hmac  # only on this refusal's path: not on every command's start-up

    return bool(token) and hmac.compare_digest(original.token, token)


def _a_copy(path: Path, saved_root: str) -> IntloomError:
    """CLI_SERVICE_METADATA_INVALID for a copied project's ``connection.json``: its
    ``runtime/`` holds the original's unfinished Runs under the same ids. The advice for a
    move (set the file aside, and the next start "restores the Runs") ran each of them on
    in both directories, effects twice."""
    runtime = path.parent / "runtime"
    fact = (f"{path} belongs to another project ({saved_root}), which still holds the same "
            "token: this directory is a copy of it. It was left as it is. Its "
            ".intloom/runtime/ holds that project's unfinished Runs under the same ids: "
            "restored here, each would run again, effects included. If no intloom host runs "
            "for this directory")
    fix = (", set the copy's journal and token aside, inside .intloom/ (mv "
           f"{shell_arg(runtime)} {shell_arg(_free(runtime, '.copied'))}; mv {shell_arg(path)} "
           f"{shell_arg(_free(path, '.copied'))}): the next intloom start begins this copy "
           f"as a new project, and that project's Runs go on in {saved_root}. To move the "
           f"Runs here instead, first set {saved_root}/.intloom aside, then run intloom "
           "doctor here again.")
    return IntloomError("CLI_SERVICE_METADATA_INVALID", f"{fact} (intloom doctor){fix}",
                        here=f"{fact}{fix}")


def _free(path: Path, suffix: str) -> Path:
    """``path`` + ``suffix``, or + ``suffix.N``, whichever is not there: ``mv`` onto an
    existing directory moves into it."""
    candidate, n = Path(f"{path}{suffix}"), 1
    while os.path.lexists(candidate):
        n += 1
        candidate = Path(f"{path}{suffix}.{n}")
    return candidate


def _same_directory(saved: str, root: Path) -> bool:
    """Whether the path a metadata file records is ``root`` itself under another name."""
    try:
        return os.path.isabs(saved) and os.path.samefile(saved, root)
    except (OSError, ValueError):  # gone, unreadable, or a NUL in a hand-edited file
        return False


def _is_date(ts: float) -> bool:
    try:
        datetime.fromtimestamp(ts, UTC)
    except (OverflowError, ValueError, OSError):
        return False
    return True


def read_lock(path: Path) -> ServiceLock | None:
    return _read(path, ServiceLock, None)


def read_service(path: Path, root: Path) -> ServiceInfo | None:
    value = _read(path, ServiceInfo, root)
    # As in connection.json: no socket has such a port, and the checks of who holds it
    # (bind, connect) refuse the number itself.
    if value is not None and not 1 <= value.port <= 65535:
        raise _invalid(path, f"names port {value.port}, outside 1..65535")
    return value


_TOKEN: Final = re.compile(r"[A-Za-z0-9_-]{43}")


def read_connection(path: Path, root: Path) -> Connection | None:
    value = _read(path, Connection, root)
    if value is not None and not 1 <= value.port <= 65535:
        raise _invalid(path, f"names port {value.port}, outside 1..65535")
    if value is not None and len(value.token) != 43:
        raise _invalid(path, "holds a token of the wrong length")
    if value is not None and not _TOKEN.fullmatch(value.token):
        # The host writes base64url and speaks it in ASCII; other characters (a hand edit)
        # made its start fail unexplained. The token itself is never shown.
        raise _invalid(path, "holds a token with characters other than base64url (A-Z, a-z, "
                       "0-9, - and _)")
    return value


_KEPT = "it holds its previous content or the complete new one, never part of a write"


def _write_failed(path: Path, exc: OSError, left: str = _KEPT) -> IntloomError:
    return IntloomError(
        "STORAGE_ERROR",
        f"{path} could not be written ({exc.strerror or exc}); {left}. "
        f"{storage_fix(exc, path)}",
    )


def _write(path: Path, data: bytes) -> None:
    try:
        atomic_write(path, data)
    except PrivacyError:
        raise
    except OSError as exc:
        raise _write_failed(path, exc) from None


def write_service(path: Path, info: ServiceInfo) -> None:
    _write(path, _encoder.encode(info))


def write_connection(path: Path, conn: Connection) -> None:
    _write(path, _encoder.encode(conn))


def create_lock_file(path: Path, lock: ServiceLock) -> int:
    """Create ``service.lock`` exclusively and return its open descriptor, flocked from the
    temp file's creation where the file system allows (``hold_temp``; the caller flocks it
    again, which is a no-op on the same descriptor, and the first try where that failed).

    The record is written to a private temp file and hard-linked into place, so the lock file
    appears complete or not at all: a kill mid-write cannot leave an empty or partial
    ``service.lock`` that no later command could judge. Raises FileExistsError when any lock
    file exists -- live or stale, it is never removed here.
    """
    data = _encoder.encode(lock)
    tmp = path.parent / f".{path.name}.{os.urandom(8).hex()}.tmp"
    try:
        # Inside the try: a directory that refuses new files (EPERM, EROFS, ENOSPC) is a
        # storage fault of this file like any failed write, not a bug of the host.
        fd = open_exclusive(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                            | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise _write_failed(path, exc, "no lock file was created") from None
    linked = False
    try:
        try:
            # Held from here, through the link, for the host's life: the lock file is this
            # inode. Inside both trys: it blocks while a probe holds the lock, and an
            # interrupt then must still close the descriptor and remove the temp file.
            hold_temp(fd)
            fault = injected_write_fault(path.name)
            if fault is not None:
                write_all(fd, data[: len(data) // 2])
                raise fault
            write_all(fd, data)
            os.fsync(fd)
            os.link(tmp, path)  # exclusive: EEXIST for any lock file, or a link, at ``path``
            linked = True
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        fsync_dir(path.parent)
    except BaseException as exc:
        if linked:
            # The file is ours (we just linked it): left behind, it would block every later
            # start as a stale lock. Removed before the close lets its lock go: a lock file
            # that is free while its pid lives and holds no descriptor on it is, to doctor,
            # another project's host.
            with contextlib.suppress(OSError):
                os.unlink(path)
        os.close(fd)
        if isinstance(exc, OSError) and not isinstance(exc, FileExistsError):
            raise _write_failed(path, exc, "no lock file was created") from None
        raise
    return fd
