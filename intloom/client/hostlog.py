"""Which log file the recorded host writes, read from ``service.json`` alone.

Kept apart from the client (no socket, protocol or process stack): ``intloom logs`` reads
files and only needs this name.
"""

from __future__ import annotations

from pathlib import Path

from intloom.errors import IntloomError
from intloom.host.metadata import read_service
from intloom.host.toolcalls import read_log
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
