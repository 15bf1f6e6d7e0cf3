"""Who holds the other end of a connection to the host's port, before the token is sent.

A host closes its listening socket as its stop begins and removes ``service.json`` only
at the end, alive all the while: another local user could bind the freed port in that gap,
and a client that checked the host's pid alive handed its hello, and the project's token
(which every later start reuses), to that program. On Linux the kernel's table of TCP
sockets (``/proc/net/tcp``) names the user owning each end of a loopback connection; the
hello is sent only when the end this client reached belongs to the host's user.
"""

from __future__ import annotations

import os
import socket

__all__ = ["peer_uid", "process_uid"]

_TABLE = "/proc/net/tcp"


def _hex(address: tuple[str, int]) -> str:
    """An IPv4 address and port as ``/proc/net/tcp`` writes them (``0100007F:1F90``)."""
    host, port = address
    packed = socket.inet_aton(host)
    return f"{int.from_bytes(packed, 'little'):08X}:{port:04X}"


def peer_uid(sock: socket.socket, table: str | None = None) -> int | None:
    """The uid owning the other end of ``sock``, an IPv4 connection (its listener's user,
    before that end is accepted); None when that cannot be read (no ``/proc``, another
    family, no such entry). ``table``: the text of ``/proc/net/tcp`` (tests)."""
    try:
        ours, theirs = _hex(sock.getsockname()), _hex(sock.getpeername())
        if table is None:
            with open(_TABLE, encoding="ascii") as fh:
                table = fh.read()
    except (OSError, ValueError, TypeError):
        return None
    for line in table.splitlines()[1:]:
        fields = line.split()
        # sl, local_address, rem_address, st, tx:rx, tr:when, retrnsmt, uid, ...
        if len(fields) > 7 and fields[1] == theirs and fields[2] == ours:
            try:
                return int(fields[7])
            except ValueError:
                return None
    return None


def process_uid(pid: int) -> int | None:
    """The uid process ``pid`` runs as (the owner of its ``/proc`` entry); None when that
    cannot be read."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
