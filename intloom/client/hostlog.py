"""Which log file the recorded host writes, read from ``service.json`` alone.

Kept apart from the client (no socket, protocol or process stack): ``intloom logs`` reads
files and only needs this name.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from intloom.errors import IntloomError
from intloom.host.metadata import read_service
from intloom.project import ProjectPaths

__all__ = ["host_log_name", "read_log"]


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


def read_log(path: Path | None, limit: int, *, tail: bool) -> bytes | None:
    """At most ``limit`` bytes of the log at ``path``, its last ones when ``tail``, else its
    first; None when it is not a regular file that can be read. Never through a link, never
    blocked by a FIFO put in its place (an ``open`` of one waits for a writer for ever)."""
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with open(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                return None
            if tail:
                fh.seek(max(0, st.st_size - limit))
            return fh.read(limit)
    except OSError:
        return None
