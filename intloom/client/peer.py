"""Who holds the other end of a connection to the host's port, before the token is sent.

A host closes its listening socket as its stop begins and removes ``service.json`` only at
the end, alive all the while: another local user could bind the freed port in that gap
(``127.0.0.1``, or ``[::]`` reaching it through a v4-mapped address), and a client that
checked the host's pid alive handed its hello, and the project's token (which every later
start reuses), to that program. On Linux the kernel's tables of TCP sockets
(``/proc/net/tcp`` and ``tcp6``) name the user owning each socket: the listeners on the port
and, once the host has accepted it, the connection's other end (before that, kernels before
6.17 show it as root's).
"""

from __future__ import annotations

import socket
from typing import NamedTuple

__all__ = ["Owners", "owners"]

_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_LISTEN = "0A"
_V4_LOOPBACK = "0100007F"  # 127.0.0.1, as the tables write it (little-endian words)
# The listening addresses a connection to 127.0.0.1 reaches: 127.0.0.1, 0.0.0.0, and in
# tcp6 ``::``, ``::ffff:127.0.0.1`` and ``::ffff:0.0.0.0`` (a dual-stack socket).
_REACHING = {"0100007F", "00000000", "0" * 32, "0000000000000000FFFF0000" + _V4_LOOPBACK,
             "0000000000000000FFFF0000" + "00000000"}


# The same, as sock_diag gives them: an IPv4 address's 4 bytes, an IPv6 address's 16.
_REACHING_RAW = {b"\x7f\0\0\x01", b"\0" * 4, b"\0" * 16,
                 b"\0" * 10 + b"\xff\xff\x7f\0\0\x01", b"\0" * 10 + b"\xff\xff" + b"\0" * 4}


class Owners(NamedTuple):
    """The uids of the sockets listening where a connection to the port lands, and the uid
    of this connection's other end (None when its entry was not found)."""

    listeners: frozenset[int]
    end: int | None


def _hex4(address: tuple[str, int]) -> tuple[str, str]:
    host, port = address[0], address[1]
    return f"{int.from_bytes(socket.inet_aton(host), 'little'):08X}", f"{port:04X}"


def owners(sock: socket.socket, tables: dict[str, str] | None = None) -> Owners | None:
    """Who owns the sockets ``sock`` (an IPv4 loopback connection) may reach; None when the
    kernel's tables cannot be read (no ``/proc``). Asked of ``sock_diag`` first, which
    answers in ~0.2 ms where reading the tables took ~10 ms (``intloom.client.sockdiag``);
    the tables are read when it cannot answer. ``tables``: path -> text (tests; no
    ``sock_diag`` then)."""
    try:
        ours, theirs = sock.getsockname(), sock.getpeername()
        our_addr, our_port = _hex4(ours)
        their_addr, their_port = _hex4(theirs)
    except (OSError, ValueError, TypeError):
        return None
    if tables is None:
        from intloom.client import sockdiag

        try:
            listening = sockdiag.listener_uids(theirs[1])  # first: see sockdiag._ask
            other_end = sockdiag.connection_uid(theirs, ours)
        except sockdiag.Unavailable:
            pass
        else:
            return Owners(frozenset(uid for _, addr, uid in listening if addr in _REACHING_RAW),
                          other_end)
    mapped = "0000000000000000FFFF0000"
    ends = {(f"{their_addr}:{their_port}", f"{our_addr}:{our_port}"),
            (f"{mapped}{their_addr}:{their_port}", f"{mapped}{our_addr}:{our_port}")}
    listeners: set[int] = set()
    end: int | None = None
    read = False
    for path in _TABLES:
        if tables is not None:
            text = tables.get(path)
        else:
            try:
                with open(path, encoding="ascii") as fh:
                    text = fh.read()
            except OSError:
                text = None
        if text is None:
            continue
        read = True
        port_at = f":{their_port} "
        for line in text.splitlines()[1:]:
            # Every socket of interest has the port in its local address: a busy machine's
            # table holds thousands of others (TIME_WAIT), each split for nothing per command.
            if port_at not in line:
                continue
            # sl, local_address, rem_address, st, tx:rx, tr:when, retrnsmt, uid, ...
            fields = line.split()
            if len(fields) < 8 or not fields[7].isdigit():
                continue
            local, remote, state, uid = fields[1], fields[2], fields[3], int(fields[7])
            addr, _, port = local.rpartition(":")
            if state == _LISTEN and port == their_port and addr in _REACHING:
                listeners.add(uid)
            elif (local, remote) in ends:
                end = uid
    return Owners(frozenset(listeners), end) if read else None
