"""The host's structured log: one ``LOG-<UTC>.jsonl`` per host instance.

Each line is a JSON object with ``time`` (ISO 8601 UTC, milliseconds), ``level`` (``debug``,
``info``, ``warning``, ``error``, ``fatal``), ``event`` and context keys. ``log_opened`` is the
first line; a clean stop writes ``log_closed`` last and seals the file read-only (0400); a
fatal error writes ``process_failed`` and leaves the file unsealed, which is how a reader
tells a crash from a stop. Logs are diagnostics, never recovery state: a failed write is
remembered (``failed``, ``failure``) and never raised into the host; the first one is reported
to ``on_failure``, and the host stops taking work (docs/lifecycle.md, "When a write
fails").

Test hook: ``INTLOOM_TEST_LOG_FAIL_AT=EVENT`` makes the first line whose event is EVENT, and
every line after it, fail with ENOSPC.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, Literal

import msgspec

from intloom.errors import carried
from intloom.fsutil import ensure_private_dir, fsync_dir, open_exclusive
from intloom.project import no_line_breaks, scan_logs

__all__ = ["LOG_SCHEMA_VERSION", "HostLog", "Level", "utc_now"]

LOG_SCHEMA_VERSION: Final = 1
FAIL_HOOK: Final = "INTLOOM_TEST_LOG_FAIL_AT"

Level = Literal["debug", "info", "warning", "error", "fatal"]

_encoder: Final = msgspec.json.Encoder(enc_hook=str)


def _escaped(value: Any, depth: int = 0) -> Any:
    """``value`` as plain data with every text UTF-8 cannot carry (a lone surrogate) kept as
    its escape (``\\udcff``), as errors.message_of keeps such a message; anything else as
    its escaped ``str`` (what ``enc_hook`` gives it), and past 50 levels as its repr."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4096:
        return f"(an integer of {value.bit_length():,} bits)"  # past JSON text's limit
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return carried(value)
    if depth > 50:
        return _escaped(repr(value)[:500])
    if isinstance(value, dict):
        return {_escaped(str(k), depth + 1): _escaped(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_escaped(v, depth + 1) for v in value]
    try:
        return _escaped(str(value))
    except Exception:
        return f"({type(value).__name__})"
def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _log_name(moment: datetime) -> str:
    """A name ``LOG_NAME`` (intloom/project.py) matches, as every reader expects."""
    return f"LOG-{moment.strftime('%Y%m%dT%H%M%S')}{moment.microsecond // 1000:03d}Z.jsonl"


def _after_the_newest(logs_dir: Path, moment: datetime) -> datetime:
    """``moment``, or a millisecond after the newest host log's name when that name sorts
    after ``moment``'s (the clock went back since: corrected from a time ahead, a VM
    restored). Readers take the newest name for the last host's log (doctor's ``last_host``,
    a start's evidence of a crash): a name by the clock alone sorted before its
    predecessor's, and the log of the host that crashed next was passed over for an older
    one, its crash unexplained and the Tool call it cut left out of RUN_INTERRUPTED."""
    try:
        found, _, _ = scan_logs(logs_dir)
    except OSError:
        return moment
    if not found or _log_name(moment) > found[-1].name:
        return moment
    newest = found[-1].name  # LOG_NAME: LOG-%Y%m%dT%H%M%S, milliseconds, Z.jsonl
    try:
        at = datetime.strptime(newest[4:19], "%Y%m%dT%H%M%S").replace(
            microsecond=int(newest[19:22]) * 1000, tzinfo=UTC)
        return at + timedelta(milliseconds=1)
    except (ValueError, OverflowError):  # a name no clock gives (year 9999): the clock's
        return moment


def _discard(fd: int, path: Path) -> None:
    """Close and remove a log file that never became a log of anything (its directory's
    fsync or its first line failed), so that a failed start leaves no file behind."""
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(path)
        fsync_dir(path.parent)


class HostLog:
    """An open log file. ``write`` never raises; ``failed`` says whether a write was lost."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd
        self.failed = False
        self._cut = False  # the last line was cut short (a full disk)
        self.failure: str | None = None  # why the first lost write failed
        self.failure_errno: int | None = None  # its errno, for the advice (storage_fix)
        self.on_failure: Callable[[str], None] | None = None
        self._fail_at = os.environ.get(FAIL_HOOK) or None
        self._failing = False
        self._restore_tried = False  # restore_if_removed: once
        self._faults = False  # faulthandler writes into this file (catch_faults)

    @classmethod
    def open(cls, logs_dir: Path, **context: Any) -> HostLog:
        """Create a fresh log file (0600, exclusive) and write ``log_opened``.

        Raises OSError when the directory or the file cannot be created, or its first line
        cannot be written (the caller reports it as LOG_WRITE_FAILED; the file is removed),
        PrivacyError when ``logs_dir`` is not ours.
        """
        ensure_private_dir(logs_dir)
        moment = _after_the_newest(logs_dir, datetime.now(UTC))
        for _ in range(1000):
            path = logs_dir / _log_name(moment)
            try:
                fd = open_exclusive(
                    path,
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW
                    | os.O_CLOEXEC,
                    0o600,
                )
            except FileExistsError:
                # Another instance opened its log in the same millisecond; never share a file.
                # A millisecond on, carried into the second: wrapped within it, the name
                # could sort before the one taken, or before the newest (_after_the_newest).
                moment += timedelta(milliseconds=1)
                continue
            try:
                fsync_dir(logs_dir)
            except BaseException:
                _discard(fd, path)
                raise
            log = cls(path, fd)
            log.write("info", "log_opened", schemaVersion=LOG_SCHEMA_VERSION, pid=os.getpid(),
                      **context)
            if log.failed:
                # A full disk creates the empty file and refuses its first line.
                log._fd = None
                _discard(fd, path)
                raise OSError(log.failure_errno or 0, f"{path.name}: its first line cannot "
                              f"be written ({log.failure})")
            return log
        raise FileExistsError(f"no free log file name under {logs_dir}")

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def closed(self) -> bool:
        return self._fd is None

    def write(self, level: Level, event: str, **context: Any) -> bool:
        """Append one line; True when all of it was written."""
        if self._fd is None:
            return False
        record = {"time": utc_now(), "level": level, "event": event, **context}
        try:
            line = _encoder.encode(record)
        except (UnicodeEncodeError, ValueError):  # ValueError: an int past 4,300 digits
            # Text holding a lone surrogate (a Workflow's version or error message built
            # from os.fsdecode): the line failed, and with it the host's start.
            line = _encoder.encode(_escaped(record))
        line = no_line_breaks(line)
        # After a line cut short, the next one starts on a line of its own.
        data = (b"\n" if self._cut else b"") + line + b"\n"
        try:
            if self._fail_at is not None and (self._failing or event == self._fail_at):
                self._failing = True
                raise OSError(errno.ENOSPC, f"No space left on device (injected by {FAIL_HOOK})")
            # One write per line on an O_APPEND descriptor: a line is never interleaved.
            written = os.write(self._fd, data)
        except OSError as exc:
            self._lost(exc)
            return False
        if written < len(data):
            # A full disk takes what fits and returns the count, without an error: writing
            # the rest gets the kernel's reason (ENOSPC), which a count alone only guesses.
            try:
                written += os.write(self._fd, data[written:])
            except OSError as exc:
                self._cut = True
                at = f"{exc.strerror} after {written} of {len(data)} bytes of a line"
                limit = _size_limit() if exc.errno == errno.EFBIG else None
                if limit is not None:  # "File too large": the limit, not the disk
                    at += f": the log reached the file size limit (ulimit -f is {limit} bytes)"
                self._lost(OSError(exc.errno, at))
                return False
        self._cut = written < len(data)
        if self._cut:
            # Still short (the rest was taken in part too): the count is all there is. A full
            # disk does this; so does the file size limit (ulimit -f), which "disk full?"
            # sent the user to look past.
            cut = f"only {written} of {len(data)} bytes of a line were written"
            limit = _size_limit()
            if limit is not None and _size(self._fd) >= limit:
                self._lost(OSError(errno.EFBIG, f"{cut}: the log reached the file size limit "
                                                f"(ulimit -f is {limit} bytes)"))
            else:
                self._lost(OSError(errno.ENOSPC, f"{cut} (disk full?)"))
            return False
        return True

    def removed(self) -> bool:
        """The open file has no link left (removed while this host writes it), and no
        restore was tried yet (``restore_if_removed``)."""
        fd = self._fd
        if fd is None or self.failed or self._restore_tried:
            return False
        try:
            return os.fstat(fd).st_nlink == 0
        except OSError:
            return False

    def restore_if_removed(self) -> bool:
        """Write the file again at its path when it was removed while this host writes it
        (``rm -rf .intloom/logs``), from what the open file holds, and go on there; True
        when it did. The host wrote on into the unlinked file, and what doctor and the next
        start read from the log (Tool calls in flight, how the stop went) was lost with it,
        unsaid. Tried once: a restore that cannot be made (a full disk, which the removal
        did not relieve while the file is open; another file at the path; a directory that
        is not private) is logged, its partial copy removed, and the host writes on into
        the open file -- every write still succeeds, so it is no lost write."""
        fd = self._fd
        if fd is None or not self.removed():
            return False
        self._restore_tried = True
        try:
            self._restore(fd)
        except Exception as exc:  # PrivacyError too: a failed restore must not end the host
            self.write("error", "log_not_restored", path=str(self.path),
                       message=f"this log file was removed while the host served, and could "
                       f"not be written again ({getattr(exc, 'strerror', None) or exc}); the "
                       "host writes on into the removed file, which its next start cannot read")
            return False
        self.write("warning", "log_restored", path=str(self.path),
                   message="this log file was removed while the host served; it was written "
                   "again from the open file, and the host goes on writing it")
        return True

    def _restore(self, fd: int) -> None:
        ensure_private_dir(self.path.parent)
        old = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)  # the unlinked file
        try:
            new = open_exclusive(
                self.path,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
            )
            try:
                _copy(old, new)
                os.fsync(new)
            except BaseException:
                os.close(new)
                with contextlib.suppress(OSError):
                    os.unlink(self.path)  # ours (O_EXCL), and partial: never left as a log
                raise
            # The same descriptor number now writes the new file. A line another thread
            # writes meanwhile is whole in one file or the other; those that reached the old
            # file after the copy are appended below, after any written to the new one since
            # (their order may differ by those few lines).
            os.dup2(new, fd, inheritable=False)
            os.close(new)
            _copy(old, fd)
            os.fsync(fd)
            fsync_dir(self.path.parent)
        finally:
            os.close(old)

    def catch_faults(self) -> None:
        """Have Python's fault handler write its traceback of a fatal signal (a segmentation
        fault, an abort: native code in a Workflow) into this file, the host's last words:
        the host's stderr is /dev/null, so a native crash left no trace, and doctor could
        say only that the host ended without a word. Plain text lines among the JSON ones
        (``intloom logs`` shows them as such); turned off before the file is closed, so
        its descriptor number, reused, never receives one. For the host's own process only:
        it takes over the handler of the whole process."""
        import faulthandler

        if self._fd is None:
            return
        faulthandler.enable(file=self._fd, all_threads=True)
        self._faults = True

    def _lost(self, exc: OSError) -> None:
        first = not self.failed
        self.failed = True
        if first:
            self.failure = exc.strerror or str(exc)
            self.failure_errno = exc.errno
            if self.on_failure is not None:
                self.on_failure(self.failure)

    def info(self, event: str, **context: Any) -> bool:
        return self.write("info", event, **context)

    def warning(self, event: str, **context: Any) -> bool:
        return self.write("warning", event, **context)

    def error(self, event: str, **context: Any) -> bool:
        return self.write("error", event, **context)

    def _finish(self, *, seal: bool) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if self._faults:
            import faulthandler

            faulthandler.disable()
            self._faults = False
        try:
            os.fsync(fd)
            if seal:
                # Through the descriptor, so a link swapped in at the path is never followed.
                os.fchmod(fd, 0o400)
        except OSError as exc:
            self._lost(exc)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Clean close: ``log_closed``, flush, then seal the file read-only."""
        if self._fd is None:
            return
        self.write("info", "log_closed")
        self._finish(seal=True)

    def fatal(self, event: str, **context: Any) -> None:
        """A fatal error: record it durably and leave the file unsealed (no ``log_closed``)."""
        if self._fd is None:
            return
        self.write("fatal", event, **context)
        self._finish(seal=False)


def _copy(source: int, target: int) -> None:
    """The rest of ``source`` (from its offset) appended to ``target``."""
    while chunk := os.read(source, 1 << 20):
        view = memoryview(chunk)
        while view:
            view = view[os.write(target, view):]


def _size_limit() -> int | None:
    """The file size limit (RLIMIT_FSIZE) in bytes, None when there is none."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    except (OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else soft


def _size(fd: int) -> int:
    try:
        return os.fstat(fd).st_size
    except OSError:
        return -1
