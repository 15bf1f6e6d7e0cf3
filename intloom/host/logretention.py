"""Old host logs removed at a start: sealed, closed logs older than 14 days, or the oldest of
them once ``.intloom/logs/`` holds over 1 GiB of host logs (the TypeScript IntLoom's rule).

Only a log provably written to its end by a host of this project that closed cleanly is
removed: a regular file of ours under a host log's name, with no other link, sealed read-only
(0400, as a clean close leaves it), whose first line is the ``log_opened`` of a host of this
project directory and whose last line is ``log_closed``. Another project's log copied in is
kept (so is one from before the project was moved: a start cannot tell it from a copy). A
crashed host's log (unsealed, no ``log_closed``) is the evidence ``doctor`` explains a crash
from, and is kept until its user removes it; so is anything else found there. The starting
host's own log and the newest one before it (what a start and ``doctor`` read of the host
before) are never removed.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

import msgspec

from intloom.fsutil import fsync_dir
from intloom.host.toolcalls import read_log
from intloom.project import scan_logs

__all__ = ["KEEP_FOR_S", "LOGS_CAP", "Pruned", "prune_logs"]

KEEP_FOR_S: Final = 14 * 24 * 3600
LOGS_CAP: Final = 1 << 30
_TAIL: Final = 4096  # a log_closed line is ~100 bytes
# log_opened's line: its project's root (at most PATH_MAX) and a few fields.
_HEAD: Final = 16384


class Pruned(msgspec.Struct, frozen=True):
    """What ``prune_logs`` removed (names, oldest first) and the bytes they held."""

    removed: list[str]
    freed: int
    total: int  # the host logs' bytes left


def _closed(path: Path, seen: os.stat_result, root: Path) -> bool:
    """Whether ``path`` is still the file ``seen``, its first line is the ``log_opened`` of
    a host of ``root`` and its last line is ``log_closed``."""
    # A regular file, never through a link.
    head, tail = read_log(path, _HEAD, tail=False), read_log(path, _TAIL, tail=True)
    try:
        now = os.lstat(path)
    except OSError:
        return False
    if head is None or tail is None or (now.st_dev, now.st_ino) != (seen.st_dev, seen.st_ino):
        return False
    first = _line(head.split(b"\n", 1)[0])
    last = _line(tail.rstrip(b"\n").rsplit(b"\n", 1)[-1])
    return (first.get("event") == "log_opened" and first.get("projectRoot") == str(root)
            and last.get("event") == "log_closed")


def _line(raw: bytes) -> dict[str, object]:
    try:
        line = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return {}
    return line if isinstance(line, dict) else {}


def _sealed(seen: os.stat_result) -> bool:
    return (stat.S_ISREG(seen.st_mode) and stat.S_IMODE(seen.st_mode) == 0o400
            and seen.st_uid == os.geteuid() and seen.st_nlink == 1)


def prune_logs(logs_dir: Path, own: str, *, now: float, root: Path,
               keep_for: float = KEEP_FOR_S, cap: int = LOGS_CAP) -> Pruned:
    """Remove the sealed, closed host logs of the project at ``root`` in ``logs_dir`` older
    than ``keep_for`` seconds (by their last write), then, oldest first, more of them while
    the host logs hold over ``cap`` bytes; never ``own`` (the starting host's log) or the
    newest log before it. Raises OSError when the directory cannot be listed."""
    # Oldest first: names sort in start order (after a clock step back a name carries a
    # later time than its start: logfile._after_the_newest), so age is the last write's.
    found, _, _ = scan_logs(logs_dir)
    seen: list[tuple[Path, os.stat_result]] = []
    for path in found:
        try:
            seen.append((path, os.lstat(path)))
        except FileNotFoundError:
            continue
    total = sum(st.st_size for _, st in seen)
    before = [name for name in (p.name for p, _ in seen) if name < own]
    keep = {own, max(before, default=own)}
    removed: list[str] = []
    freed = 0
    for path, st in seen:
        if path.name in keep or not (now - st.st_mtime > keep_for or total > cap):
            continue
        if not _sealed(st) or not _closed(path, st, root):
            continue
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass  # removed by hand since: nothing to free
        else:
            removed.append(path.name)
            freed += st.st_size
        total -= st.st_size
    if removed:
        fsync_dir(logs_dir)
    return Pruned(removed=removed, freed=freed, total=total)
