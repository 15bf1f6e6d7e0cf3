"""close() from another thread is final. A request in flight that then failed to connect
again (a paused host's hello), or whose stream its host cut, set the Client to connect again
at its next request, over the close: the closed Client served on."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from intloom.client.client import Client, HelloFailed
from intloom.errors import IntloomError
from intloom.protocol.messages import GetRun

pytestmark = pytest.mark.timeout(30)


class _Hello:
    instance_id = "instance-1"
    pid = 1


def _client(sock: socket.socket) -> Client:
    return Client(sock, hello=_Hello(), info=None,  # type: ignore[arg-type]
                  root=Path("/nonexistent"), request_timeout=1)


def test_a_close_during_a_failed_reconnect_stays_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    ours, theirs = socket.socketpair()
    fresh_ours, fresh_theirs = socket.socketpair()
    try:
        _closed_during_a_failed_reconnect(monkeypatch, _client(ours), fresh_ours, fresh_theirs)
    finally:
        for sock in (ours, theirs, fresh_ours, fresh_theirs):
            sock.close()


def _closed_during_a_failed_reconnect(monkeypatch: pytest.MonkeyPatch, client: Client,
                                      fresh_ours: socket.socket,
                                      fresh_theirs: socket.socket) -> None:
    client._shut("a read timed out", reopen=True)  # as after a timeout: may connect again
    hello_began, closed = threading.Event(), threading.Event()

    def paused_host(root: Any, **kw: Any) -> Client:
        hello_began.set()
        closed.wait(10)  # the hello waits on a paused host; close() comes meanwhile
        raise HelloFailed("no answer to the hello", None)

    monkeypatch.setattr(Client, "connect", staticmethod(paused_host))
    def close_meanwhile() -> None:
        hello_began.wait(10)
        client.close()
        closed.set()

    closer = threading.Thread(target=close_meanwhile)
    closer.start()
    with pytest.raises(IntloomError) as first:
        client._send(GetRun(run_id="RUN-1"))
    closer.join(timeout=10)
    assert first.value.code == "PROJECT_CONNECTION_FAILED"
    assert "was closed" in first.value.message and not first.value.retryable, first.value

    connects: list[int] = []

    def serving_host(root: Any, **kw: Any) -> Client:
        connects.append(1)
        return _client(fresh_ours)

    monkeypatch.setattr(Client, "connect", staticmethod(serving_host))
    with pytest.raises(IntloomError) as later:
        client._send(GetRun(run_id="RUN-1"))
    assert later.value.code == "PROJECT_CONNECTION_FAILED", later.value
    assert connects == []  # not connected again, nothing sent
    fresh_theirs.setblocking(False)
    with pytest.raises(BlockingIOError):
        fresh_theirs.recv(1)
