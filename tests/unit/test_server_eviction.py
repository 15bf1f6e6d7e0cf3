"""A connection evicted before its hello (``Limits.max_unproven``) is served nothing, even
when its hello and a request were already buffered: they arrived after the eviction was
decided. The race is laid out step by step on one loop, with the real Server; its writes
are taken as sent (the failed drain of the hello's write to the aborted transport also
ends such a session, but only by the way)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest

from intloom.host.logfile import HostLog
from intloom.host.server import Limits, Server
from intloom.protocol.messages import PROTOCOL, HelloOk, Request, Response
from tests.integration.host_support import encode, hello_frame

pytestmark = pytest.mark.timeout(10)

TOKEN = "t" * 43


class _Handlers:
    """Records each request the Server dispatches."""

    def __init__(self) -> None:
        self.handled: list[Request] = []

    def next_start(self, run_id: str) -> None:
        return None

    async def handle(self, request: Request) -> Response:
        self.handled.append(request)
        raise AssertionError(f"an evicted connection's {type(request).__name__} was served")


async def _writer(sock: socket.socket) -> asyncio.StreamWriter:
    _, writer = await asyncio.open_connection(sock=sock)
    return writer


async def _race(tmp_path: Path) -> tuple[_Handlers, list[Any]]:
    handlers = _Handlers()
    hello = HelloOk(instance_id="i", pid=1, project_root=str(tmp_path), protocol=PROTOCOL)
    server = Server(handlers, HostLog.open(tmp_path), hello=hello, token=TOKEN,  # type: ignore[arg-type]
                    on_stop=lambda: None, limits=Limits(max_unproven=1))

    async def written(*_args: Any) -> None:
        """Every write taken: the aborted transport's failed drain, which would also end
        the session, is not what is tested."""

    server._write = written  # type: ignore[method-assign,assignment]
    pairs = [socket.socketpair() for _ in range(2)]
    try:
        first_reader, second_reader = asyncio.StreamReader(), asyncio.StreamReader()
        first = asyncio.create_task(server._accept(first_reader, await _writer(pairs[0][0])))
        await asyncio.sleep(0)  # the first waits for its hello: unproven
        second = asyncio.create_task(server._accept(second_reader, await _writer(pairs[1][0])))
        # Its hello and a request arrive while the second's accept evicts it.
        first_reader.feed_data(hello_frame(TOKEN) + encode({"op": "status"}))
        first_reader.feed_eof()
        outcomes = await asyncio.wait_for(asyncio.gather(first, return_exceptions=True), 5)
        second.cancel()
        await asyncio.gather(second, return_exceptions=True)
        return handlers, list(outcomes)
    finally:
        for a, b in pairs:
            a.close()
            b.close()


def test_an_evicted_connection_with_a_buffered_request_is_served_nothing(
    tmp_path: Path,
) -> None:
    handlers, outcomes = asyncio.run(_race(tmp_path))
    assert handlers.handled == [], handlers.handled
    assert outcomes == [None], outcomes
    log = next(tmp_path.glob("LOG-*.jsonl")).read_text()
    assert '"unproven_evicted"' in log, log
