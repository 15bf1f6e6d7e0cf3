"""One consistent reading of the host's metadata: parsed values and the exact bytes behind them.

Diagnosis judges the parsed values; ``recover`` later compares the bytes, so that it removes
only the very files it judged. Reading never creates, changes or removes anything.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Final, Generic, TypeVar

import msgspec

from intloom.errors import IntloomError
from intloom.fsutil import PrivacyError, dir_problem, read_private
from intloom.host.metadata import (
    Connection,
    ServiceInfo,
    ServiceLock,
    privacy_invalid,
    read_connection,
    read_lock,
    read_service,
)
from intloom.project import ProjectPaths

__all__ = ["Observed", "Snapshot", "check_state_dir", "observe", "observe_file"]

_M = TypeVar("_M", ServiceLock, ServiceInfo, Connection)
_ATTEMPTS: Final = 3


class Observed(msgspec.Struct, Generic[_M], frozen=True):
    """A metadata file as read: ``value`` is None when the file does not exist."""

    value: _M | None
    raw: bytes | None


class Snapshot(msgspec.Struct, frozen=True):
    paths: ProjectPaths
    lock: Observed[ServiceLock]
    service: Observed[ServiceInfo]
    connection: Observed[Connection]


def _invalid(path: Path, fact: str) -> IntloomError:
    # doctor reads these files through observe_file too: it says the finding without the
    # advice to run it (IntloomError.here), as metadata's own findings do.
    kept = f"{path} {fact}. It was left as it is"
    return IntloomError("CLI_SERVICE_METADATA_INVALID", f"{kept}; run intloom doctor.",
                        here=f"{kept}.")


def observe_file(path: Path, kind: type[_M], read: Callable[[Path], _M | None]) -> Observed[_M]:
    """Read ``path`` strictly, then its bytes, and make sure both saw the same file.

    A file being replaced while it is read is read again; one that keeps changing is reported
    rather than judged from a mixture of two versions.
    """
    for _ in range(_ATTEMPTS):
        value = read(path)
        try:
            raw = read_private(path, max_bytes=64 * 1024)
        except PrivacyError as exc:
            raise privacy_invalid(exc) from None
        if value is None and raw is None:
            return Observed(None, None)
        if value is None or raw is None:
            continue
        try:
            again = msgspec.json.decode(raw, type=kind)
        except (msgspec.DecodeError, RecursionError):
            continue
        if again == value:
            pid = getattr(value, "pid", 1)
            if pid <= 0:
                raise _invalid(path, f"names pid {pid}, which no process can have")
            return Observed(value, raw)
    raise _invalid(path, "changed every time it was read; no judgement was made from it")


def check_state_dir(path: Path) -> bool:
    """True when ``.intloom/`` exists; a link or a non-directory there is invalid metadata."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    # Its mode is not judged here: doctor's runtime_dir check reports group/other bits.
    problem = dir_problem(st, private=False)
    if problem is not None:
        raise privacy_invalid(PrivacyError(path, problem))
    return True


def observe(root: Path) -> Snapshot:
    """Read ``service.lock``, ``service.json`` and ``connection.json``; raise on invalid ones."""
    paths = ProjectPaths(root)
    if not check_state_dir(paths.state):
        empty: Observed[ServiceLock] = Observed(None, None)
        return Snapshot(paths, empty, Observed(None, None), Observed(None, None))
    return Snapshot(
        paths=paths,
        lock=observe_file(paths.service_lock, ServiceLock, read_lock),
        service=observe_file(
            paths.service_json, ServiceInfo, lambda p: read_service(p, root)
        ),
        connection=observe_file(
            paths.connection_json, Connection, lambda p: read_connection(p, root)
        ),
    )
