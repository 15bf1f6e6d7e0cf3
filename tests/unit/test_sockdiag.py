"""``intloom.client.sockdiag``'s reading of the kernel's answers. The real kernel is asked in
tests/e2e/test_port_taken_in_stop.py (against ``/proc/net/tcp``); here the netlink socket
gives canned answers, for the ones a healthy kernel does not give."""

from __future__ import annotations

import errno
import socket
import struct
from typing import Any

import pytest

from intloom.client import sockdiag


class _Kernel:
    """A netlink socket whose one answer is ``reply``."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.sent: list[bytes] = []

    def settimeout(self, seconds: float) -> None:
        pass

    def send(self, data: bytes) -> int:
        self.sent.append(data)
        return len(data)

    def recv(self, size: int) -> bytes:
        return self.reply

    def close(self) -> None:
        pass


def _answering(monkeypatch: pytest.MonkeyPatch, reply: bytes) -> _Kernel:
    kernel = _Kernel(reply)

    def make(*args: Any) -> _Kernel:
        assert args[0] == socket.AF_NETLINK
        return kernel

    monkeypatch.setattr(socket, "socket", make)  # sockdiag makes its own through the module
    return kernel


def _error(code: int) -> bytes:
    # nlmsghdr, then the error and the header of the request it answers
    return struct.pack("=IHHII", 36, 2, 0, 1, 0) + struct.pack("=i", -code) + bytes(16)


def test_a_dump_answered_enoent_is_a_kernel_that_cannot_be_asked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No TCP handler (tcp_diag not there) answers ENOENT: taken for "no listener", the
    client would have refused every host as "not in the kernel's tables"."""
    _answering(monkeypatch, _error(errno.ENOENT))
    with pytest.raises(sockdiag.Unavailable):
        sockdiag.listener_uids(4242)


def test_an_exact_lookup_answered_enoent_found_no_socket(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = _answering(monkeypatch, _error(errno.ENOENT))
    assert sockdiag.connection_uid(("127.0.0.1", 4242), ("127.0.0.1", 5000)) is None
    assert len(kernel.sent) == 2  # IPv4, then the same four values mapped into IPv6


@pytest.mark.parametrize("reply", [_error(errno.EPERM), b"", b"\x10\x00\x00",
                                   struct.pack("=IHHII", 200, 20, 0, 1, 0)])
def test_any_other_answer_is_a_kernel_that_cannot_be_asked(
        monkeypatch: pytest.MonkeyPatch, reply: bytes) -> None:
    _answering(monkeypatch, reply)
    with pytest.raises(sockdiag.Unavailable):
        sockdiag.connection_uid(("127.0.0.1", 4242), ("127.0.0.1", 5000))
