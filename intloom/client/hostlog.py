"""Which log file the recorded host writes, read from ``service.json`` alone, and what its
last lines say of a stop.

Kept apart from the client (no socket, protocol or process stack): ``intloom logs`` reads
files and only needs this name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from intloom.errors import IntloomError
from intloom.host.metadata import ServiceInfo, read_service
from intloom.host.toolcalls import LOG_TAIL, last_line, read_log
from intloom.project import ProjectPaths

__all__ = ["LOG_TAIL", "STOPPING", "host_log_name", "last_line", "log_path", "log_says_stopping",
           "read_log"]

# The line a host logs as its stop begins (``service_stopping``).
STOPPING = b'"event":"service_stopping"'


def host_log_name(root: Path) -> str | None:
    """The log file name of the host ``service.json`` names (running, or killed), if any.

    Only a plain name is returned: the file is not trusted to name a path elsewhere.
    Invalid metadata gives ``None``; status and doctor are the commands that report it.
    """
    paths = ProjectPaths(root)
    try:
        info = read_service(paths.service_json, paths.root)
    except (IntloomError, OSError):
        return None
    name = info.log_file if info is not None else None
    return name if name and Path(name).name == name else None


def log_path(paths: ProjectPaths, name: str | None) -> Path | None:
    """The host log ``service.json`` names, in ``.intloom/logs``: a plain name only (the
    file is not trusted to name a path elsewhere), as ``host_log_name`` reads it."""
    if not name or Path(name).name != name or name in (".", ".."):
        return None
    return paths.logs / name


def loop_blocked(paths: ProjectPaths, info: ServiceInfo) -> dict[str, Any] | None:
    """The host's last ``loop_blocked`` line (host/loopwatch.py), when no
    ``loop_unblocked`` came after it: what holds its event loop now. None otherwise."""
    line = last_line(log_path(paths, info.log_file), _LOOP)
    if line is None:
        return None
    try:
        record = msgspec.json.decode(line)
    except (msgspec.DecodeError, RecursionError):
        return None
    if not isinstance(record, dict) or record.get("event") != "loop_blocked":
        return None
    return record


_LOOP = b'"event":"loop_'  # loop_blocked and loop_unblocked


def log_says_stopping(paths: ProjectPaths, info: ServiceInfo) -> bool:
    """The host's own log has its ``service_stopping`` line: it is on its way out."""
    # Searched back from the end, past the line per Run the stop logs after it.
    return last_line(log_path(paths, info.log_file), STOPPING) is not None
