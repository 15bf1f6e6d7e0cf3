"""Who listens on a port of 127.0.0.1, in words: for the errors of a port that is taken.

Only ever asked once a bind has failed, so the scan of every socket (psutil reads /proc)
costs nothing on a healthy start.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from intloom.project import CONFIG_NAME

if TYPE_CHECKING:
    import psutil

__all__ = ["Listener", "bind_refusal", "describe", "listeners", "port_holder"]


class Listener(NamedTuple):
    """A process listening on the port: its pid, its name ("" when the OS does not say) and,
    when it is an intloom host, the project it serves."""

    pid: int
    name: str
    project: Path | None


def listeners(port: int) -> list[Listener] | None:
    """The processes listening on ``port`` of 127.0.0.1 (or any address), or None when the
    OS does not say (another user's process needs privileges to be named)."""
    import psutil

    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    pids = sorted({c.pid for c in conns
                   if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
                   and c.pid is not None})
    if not pids:
        return None
    found: list[Listener] = []
    for pid in pids:
        # Its name only: another program's command line may hold secrets, and spans lines.
        try:
            proc = psutil.Process(pid)
            name = proc.name()
        except psutil.Error:
            proc, name = None, ""
        found.append(Listener(pid, _printable(name),
                              _served_project(proc) if proc is not None else None))
    return found


def bind_refusal(port: int) -> OSError | None:
    """Why ``recover`` (or a start) could not bind 127.0.0.1:``port`` now, or None (bound,
    never listened on): EADDRINUSE when another socket has it, else the bind's own refusal
    (EACCES for a privileged port)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As PortGuard binds: past TIME_WAIT leftovers, never beside a listener.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            return exc
    return None


def port_holder(port: int) -> str | None:
    """The process listening on ``port``, in words ("pid 123 (python3)"; an intloom host
    adds the project it serves), or None when the OS does not say."""
    found = listeners(port)
    if found is None:
        return None
    return ", ".join(describe(one) for one in found)


def describe(one: Listener) -> str:
    text = f"pid {one.pid} ({one.name})" if one.name else f"pid {one.pid}"
    if one.project is not None:
        # Two projects set to one port: "in use" alone left the user to find which of
        # their other projects holds it.
        text += f", the intloom host of the project {_printable(str(one.project))}"
    return text


def _printable(text: str) -> str:
    return "".join(ch if ch.isprintable() else "?" for ch in text)


def _served_project(proc: psutil.Process) -> Path | None:
    """The project whose intloom host ``proc`` is, proven by that project's own metadata
    (its ``service.lock`` or ``service.json`` names this pid), or None. The command line
    only says where to look: a background host is started with ``--project ROOT``, a
    foreground one runs in (or under) its root."""
    import psutil

    try:
        args = proc.cmdline()
        cwd = proc.cwd()
    except (psutil.Error, OSError):
        return None
    if not any("intloom" in arg for arg in args[:4]):
        return None
    looks: list[Path] = []
    if "--project" in args[:-1]:
        looks.append(Path(cwd, args[args.index("--project") + 1]))
    looks.extend([Path(cwd), *Path(cwd).parents])
    for root in looks:
        if not (root / CONFIG_NAME).is_file():
            continue
        for name in ("service.lock", "service.json"):
            if _names_pid(root / ".intloom" / name, proc.pid):
                return root
    return None


def _names_pid(path: Path, pid: int) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        data = json.loads(os.read(fd, 64 * 1024))
    except (OSError, ValueError):
        return False
    finally:
        os.close(fd)
    return isinstance(data, dict) and data.get("pid") == pid
