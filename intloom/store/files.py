"""Private, no-follow file access for the store, with every refusal as STORAGE_ERROR.

The store's directory is private host state: directories 0700, files 0600, owned by the
user, never reached through a symbolic link. A path that breaks a rule is refused with a
message naming the path, the fact and the fix; nothing is ever "repaired" in place.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import queue
import re
import stat
import threading
from pathlib import Path
from typing import Final

from intloom.errors import IntloomError
from intloom.fsutil import (
    PrivacyError,
    check_private_dir,
    ensure_private_dir,
    fsync_dir,
    limit_fix,
    no_inode_left,
    open_exclusive,
    privacy_fix,
    private_file_problem,
    read_private,
    replace_files,
    shell_arg,
    write_all,
    write_refusal,
)

__all__ = [
    "Layout",
    "WritesStopped",
    "atomic_write_many",
    "check_dir",
    "check_file",
    "create_failed",
    "ensure_dir",
    "list_names",
    "lock_dir",
    "open_new",
    "present",
    "read_file",
    "remove_temps",
    "storage_error",
    "unusable_file",
    "write_all",
]

# Files written (and held open) together by atomic_write_many: a compaction writes one per
# busy Run, and a host may have a low open-file limit (1,024 by default on Linux).
_FILES_AT_ONCE: Final = 64
# Fsyncs in flight at once for ``atomic_write_many(..., at_once=True)``. ext4 (jbd2) commits
# the fsyncs waiting together in one journal transaction; one after another, each waits for
# a commit of its own. Measured on a 2-vCPU VM (ext4, load ~5 from others' tests,
# 2026-12-02): 3,000 4-KB files in groups of 64 took 12.6 s fsynced one by one, 2.5 s with
# 16 at once (4: 4.6 s, 64: 5.0 s).
_FSYNCS_AT_ONCE: Final = 16

# The temp names replace_files gives the files the store writes: ``.{target}.{16 hex}.tmp``,
# the target being a snapshot (snap/live, snap/done) or the manifest (the store's root).
_SNAPSHOT_TEMP: Final = re.compile(r"\.[0-9a-f]{64}\.snap\.[0-9a-f]{16}\.tmp")
_MANIFEST_TEMP: Final = re.compile(r"\.manifest\.json\.[0-9a-f]{16}\.tmp")

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
    # privacy_fix is a sentence of its own elsewhere; here it follows the fact after "; ".
    fix = privacy_fix(exc)
    return storage_error(exc.path, exc.fact, fix[:1].lower() + fix[1:])


def check_dir(path: Path) -> bool:
    """False when ``path`` does not exist; raise STORAGE_ERROR unless it is private and ours."""
    try:
        check_private_dir(path)
    except PrivacyError as exc:
        if exc.fact == "does not exist":
            return False
        raise _from_privacy(exc) from None
    return True


def present(path: Path) -> bool:
    """Whether ``path`` exists (a link counts), from an ``lstat``. A parent this user may not
    search raises the STORAGE_ERROR naming that directory and its fix: ``Path.exists`` let the
    PermissionError out, and doctor and inspect failed CLI_INTERNAL_ERROR (exit 70)."""
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except PermissionError:
        check_dir(path)  # raises, naming the directory that refuses the search
        raise
    return True


def check_file(path: Path) -> None:
    """Raise the STORAGE_ERROR a read of ``path`` raises when it is there but not a private
    regular file of ours (a link, a directory, another owner, group/other bits), from an
    ``lstat`` alone; nothing is read."""
    problem = private_file_problem(path)
    if problem is not None:
        raise _from_privacy(problem)


def unusable_file(path: Path) -> tuple[str, str | None] | None:
    """Why a snapshot or the manifest may not be read, from an ``lstat`` alone, and a fix
    other than moving it out, if one is safe: None when it is a private regular file of
    ours or absent. Nothing is opened, so a link is never followed. Such a file is read past
    as a damaged one is; only its Run (a snapshot), or how much of the log a restore reads
    (the manifest), depends on it."""
    problem = private_file_problem(path)
    if problem is None:
        return _unreadable_mode(path)
    fix = None
    if problem.fact.startswith("has mode"):
        fix = f"chmod 600 {shell_arg(path)} if its content is yours"
    elif problem.fact.startswith("is owned by uid"):
        fix = f"chown it to yourself (uid {os.getuid()}) if its content is yours"
    return problem.fact, fix


def _unreadable_mode(path: Path) -> tuple[str, str | None] | None:
    """A private regular file of ours whose mode does not let its owner read it (chmod 000):
    read, it refused the whole store (STORAGE_ERROR); renamed over, it was gone. Judged
    from the mode, so the same whoever reads it (root reads it anyway)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    if not stat.S_ISREG(mode) or mode & stat.S_IRUSR:
        return None
    return (f"is not readable by its owner (mode {stat.S_IMODE(mode):04o})",
            f"chmod 600 {shell_arg(path)} if its content is yours")


def ensure_dir(path: Path) -> None:
    """Create ``path`` 0700 if missing; raise STORAGE_ERROR unless it is private and ours."""
    try:
        ensure_private_dir(path)
    except PrivacyError as exc:
        raise _from_privacy(exc) from None
    except OSError as exc:
        raise create_failed(path, path, f"cannot be created ({exc.strerror})", exc) from None


def create_failed(path: Path, created: Path, fact: str, exc: OSError) -> IntloomError:
    """STORAGE_ERROR for ``path``, which ``exc`` kept from creating ``created`` in it (or
    being created: ``created`` is ``path``): a full disk by its errno, a refusal by what
    refuses, read from the file system (``write_refusal``: what a failed start and doctor
    say). Only created, never replaced: an append-only directory is not what refuses."""
    fix = "check the disk and its directory"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        # Only a start creates these: it failed, so the user's next step is another one.
        inodes = no_inode_left(path, failed=True) if exc.errno == errno.ENOSPC else None
        fix = f"{inodes or 'free disk space (or quota) for it'}, then start again"
    elif exc.errno in (errno.EMFILE, errno.ENFILE):
        fix = limit_fix(exc.errno) or fix  # no descriptor left: not the disk's
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        refused = write_refusal(created, replaced=False)
        if refused is not None:
            fact, fix = f"{fact}: {refused[0]}", refused[1][:1].lower() + refused[1][1:]
    return storage_error(path, fact, fix)


def lock_dir(path: Path) -> int:
    """An exclusive OS lock on the directory ``path``, held until the returned fd is closed;
    -1 where the file system cannot lock a directory (NFS emulates flock with fcntl locks,
    which need a file open for writing): ``service.lock`` still guards the project there.

    The checkpoint store's own guard, under ``service.lock``: one writer per runtime
    directory even when the host's metadata files were removed by hand while it ran (a second
    host would otherwise append to the same log). Released by the kernel when its process
    dies, so a crash never leaves it stale. BUSY while another process holds it.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise storage_error(path, f"cannot be opened ({exc.strerror})",
                            "check the directory's permissions") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise IntloomError(
                "BUSY",
                f"Another process holds the checkpoint store {path}: a host of this project "
                "is still running or still exiting (or its service.lock and service.json "
                "were removed by hand). Nothing was written. Wait for it to exit, or stop it "
                "(ps -ef | grep intloom), then start again.",
                retryable=False,
            ) from None
        if exc.errno in (errno.EBADF, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
            return -1
        raise storage_error(path, f"cannot be locked ({exc.strerror})",
                            "check that the file system supports flock") from None
    return fd


def list_names(path: Path) -> list[str]:
    """Entry names of a directory that exists and was checked; [] when it vanished."""
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []
    except OSError as exc:
        # No descriptor left (verify under a low ulimit -n) is the process's limit: "move
        # the offending path aside" would have moved the journal away.
        limited = limit_fix(exc.errno, command=True)
        raise storage_error(path, f"cannot be listed ({exc.strerror})",
                            limited or _FIX) from None


def read_file(path: Path) -> bytes | None:
    """Read a private regular file without following links; None when it does not exist."""
    try:
        return read_private(path, max_bytes=None)
    except PrivacyError as exc:
        raise _from_privacy(exc) from None


def read_own_file(path: Path) -> bytes | str | None:
    """``read_file`` for a file only one Run, or only how much of the log a restore reads,
    depends on (a snapshot, the manifest): why it could not be read, as text, when the file
    itself refused (its mode binds: ``chmod 000``), instead of STORAGE_ERROR for the store.
    A directory on the way that refused the look-up is still the store's (``unseen``)."""
    try:
        return read_private(path, max_bytes=None)
    except PrivacyError as exc:
        if exc.unseen:
            raise _from_privacy(exc) from None
        fix = privacy_fix(exc)
        return f"{exc.fact} ({fix[:1].lower() + fix[1:].rstrip('.')})"


def open_new(path: Path) -> int:
    """Create ``path`` exclusively (0600, no follow) for writing at offsets (a segment is
    preallocated ahead of its writes) and reading back; FileExistsError if taken."""
    return open_exclusive(
        path,
        os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
    )


class _Fsyncs:
    """Threads that fsync a group of files at once (``atomic_write_many``'s ``at_once``).

    Each file is still fsynced, and every fsync's outcome waited for, before ``__call__``
    returns or raises: the caller closes these descriptors next. Where no thread can be
    started, the files are fsynced one after another, as without ``at_once``."""

    def __init__(self, threads: int) -> None:
        self._jobs: queue.SimpleQueue[tuple[int, queue.SimpleQueue[BaseException | None]]
                                      | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        for _ in range(threads):
            thread = threading.Thread(target=self._work, name="intloom-fsync", daemon=True)
            try:
                thread.start()
            except RuntimeError:
                break  # as many as could be started; fewer than 2: one after another
            self._threads.append(thread)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            fd, told = job
            try:
                os.fsync(fd)
            except BaseException as exc:  # told to the caller, who raises it
                told.put(exc)
            else:
                told.put(None)

    def __call__(self, fds: list[int]) -> None:
        if len(self._threads) < 2 or len(fds) < 2:
            for fd in fds:
                os.fsync(fd)
            return
        told: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
        for fd in fds:
            self._jobs.put((fd, told))
        failures = [exc for exc in [told.get() for _ in fds] if exc is not None]
        if failures:
            raise failures[0]

    def close(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)


class WritesStopped(Exception):
    """``atomic_write_many`` stopped before its last file, as its ``stop`` asked: each file
    it wrote is whole and durable, the others untouched."""


def atomic_write_many(directory: Path, items: list[tuple[str, bytes]], *,
                      at_once: bool = False, stop: threading.Event | None = None) -> None:
    """Replace each ``directory/name`` atomically; one directory fsync covers the batch.

    Each file goes to an exclusive temp file beside its target, is fsynced, then renamed
    over the target -- up to ``_FILES_AT_ONCE`` files at a time, written and fsynced
    together (``replace_files``); fewer, down to one, while the process or the system has
    no descriptor left for that many (EMFILE, ENFILE). A symlinked target is refused
    (rename would replace the link itself, silently hiding what it pointed at).

    ``at_once``: up to ``_FSYNCS_AT_ONCE`` of a group's fsyncs in flight together, for a
    caller for whom nothing else waits on the disk meanwhile (a host's open and close).
    Faster by far for many files, but they crowd the disk: a rotation's compaction, whose
    disk busy Runs' log flushes share, fsyncs one file after another.

    ``stop``: once set, no further group is begun (``WritesStopped``).
    """
    if not items:
        return
    wrote = False
    fsyncs = _Fsyncs(_FSYNCS_AT_ONCE) if at_once and len(items) > 1 else None
    at, size = 0, _FILES_AT_ONCE
    try:
        while at < len(items):
            if stop is not None and stop.is_set():
                raise WritesStopped(directory)
            group = items[at:at + size]
            try:
                if fsyncs is None:
                    replace_files(directory, group)
                else:
                    replace_files(directory, group, fsync_all=fsyncs)
            except PrivacyError as exc:
                raise _from_privacy(exc) from None
            except OSError as exc:
                # Under a low ulimit -n (a start accepts ~30) a group of 64 never fit: every
                # compaction failed EMFILE and each restart replayed more of the log. A
                # failed group left every target as it was, so fewer at a time is safe.
                if exc.errno not in (errno.EMFILE, errno.ENFILE) or len(group) == 1:
                    raise
                size = len(group) // 2
                continue
            wrote = True
            at += len(group)
    finally:
        if fsyncs is not None:
            fsyncs.close()
        if wrote:
            fsync_dir(directory)


def remove_temps(layout: Layout) -> list[str]:
    """Remove the temp files a killed atomic write left; their paths under the runtime
    directory (the host logs them: a file removed is never removed without a word).

    Only the host that holds the project's lock calls this, so no write of ours is in
    progress. A temp file never holds state of its own: it was not yet renamed over its
    target, and what it summarised is still in the log the manifest points at. Only names
    of exactly the form we create, and only regular files, are removed; anything else is
    left as it is for the reader to report.
    """
    removed: list[str] = []
    for directory, pattern in ((layout.live, _SNAPSHOT_TEMP), (layout.done, _SNAPSHOT_TEMP),
                               (layout.root, _MANIFEST_TEMP)):
        here: list[str] = []
        for name in list_names(directory):
            if not pattern.fullmatch(name):
                continue
            try:
                if stat.S_ISREG(os.lstat(directory / name).st_mode):
                    os.unlink(directory / name)
                    here.append(str((directory / name).relative_to(layout.root)))
            except OSError:
                continue  # left in place: readers skip dot files, the next start retries
        if here:
            with contextlib.suppress(OSError):  # not durable yet: the next start retries
                fsync_dir(directory)
            removed += here
    return removed
