"""Private, no-follow file access for the store, with every refusal as STORAGE_ERROR.

The store's directory is private host state: directories 0700, files 0600, owned by the
user, never reached through a symbolic link. A path that breaks a rule is refused with a
message naming the path, the fact and the fix; nothing is ever "repaired" in place.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

from intloom.errors import IntloomError
from intloom.fsutil import PrivacyError, check_private_dir, ensure_private_dir, fsync_dir

__all__ = [
    "Layout",
    "atomic_write_many",
    "check_dir",
    "ensure_dir",
    "list_names",
    "open_new",
    "read_file",
    "storage_error",
    "write_all",
]

_FIX = (
    "intloom keeps its checkpoints in a private directory it owns and never follows links; "
    "move the offending path aside (or chmod it to 0700 for a directory, 0600 for a file) "
    "and try again"
)


class Layout:
    """Every path of the store, computed in one place."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.wal = root / "wal"
        self.snap = root / "snap"
        self.live = root / "snap" / "live"
        self.done = root / "snap" / "done"
        self.manifest = root / "manifest.json"

    def dirs(self) -> tuple[Path, ...]:
        return (self.root, self.wal, self.snap, self.live, self.done)


def storage_error(path: Path, fact: str, fix: str = _FIX) -> IntloomError:
    """A STORAGE_ERROR naming the path, what is wrong with it, and what to do."""
    return IntloomError("STORAGE_ERROR", f"Checkpoint store path {path} {fact}; {fix}.")


def _from_privacy(exc: PrivacyError) -> IntloomError:
    return storage_error(exc.path, exc.fact)


def check_dir(path: Path) -> bool:
    """False when ``path`` does not exist; raise STORAGE_ERROR unless it is private and ours."""
    try:
        check_private_dir(path)
    except PrivacyError as exc:
        if exc.fact == "does not exist":
            return False
        raise _from_privacy(exc) from None
    return True


def ensure_dir(path: Path) -> None:
    """Create ``path`` 0700 if missing; raise STORAGE_ERROR unless it is private and ours."""
    try:
        ensure_private_dir(path)
    except PrivacyError as exc:
        raise _from_privacy(exc) from None
    except OSError as exc:
        raise storage_error(path, f"cannot be created ({exc.strerror})",
                            "check that the project directory is writable") from None


def list_names(path: Path) -> list[str]:
    """Entry names of a directory that exists and was checked; [] when it vanished."""
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise storage_error(path, f"cannot be listed ({exc.strerror})") from None


def read_file(path: Path) -> bytes | None:
    """Read a private regular file without following links; None when it does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):
            raise storage_error(path, "is a symbolic link") from None
        raise storage_error(path, f"cannot be opened ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise storage_error(path, "is not a regular file")
        if st.st_uid != os.getuid():
            raise storage_error(path, f"is owned by uid {st.st_uid}, not by you")
        if st.st_mode & 0o077:
            raise storage_error(
                path, f"has mode {stat.S_IMODE(st.st_mode):04o}; store files must be 0600"
            )
        chunks: list[bytes] = []
        want = st.st_size + 1
        while True:
            chunk = os.read(fd, max(want, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def open_new(path: Path) -> int:
    """Create ``path`` exclusively (0600, no follow) for appending; FileExistsError if taken."""
    return os.open(
        path,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_APPEND | os.O_CLOEXEC,
        0o600,
    )


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write every byte (os.write may write fewer than asked)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def atomic_write_many(directory: Path, items: list[tuple[str, bytes]]) -> None:
    """Replace each ``directory/name`` atomically; one directory fsync covers the batch.

    Each file goes to an exclusive temp file beside its target, is fsynced, then renamed
    over the target. A symlinked target is refused (rename would replace the link itself,
    silently hiding what it pointed at).
    """
    if not items:
        return
    done: list[Path] = []
    try:
        for name, data in items:
            target = directory / name
            if os.path.islink(target):
                raise storage_error(target, "is a symbolic link")
            tmp = directory / f".{name}.{secrets.token_hex(6)}.tmp"
            fd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
            try:
                try:
                    write_all(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.rename(tmp, target)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)  # our own temp file; the target is untouched
                raise
            done.append(target)
    finally:
        if done:
            fsync_dir(directory)
