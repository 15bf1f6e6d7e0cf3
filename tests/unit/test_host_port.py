"""The host's listening socket, bound before the Workflows are imported (``bind_port``)."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from pathlib import Path

import pytest

from intloom.host.server import TEST_PORTS_ENV, bind_port

pytestmark = pytest.mark.timeout(30)


def test_connections_accepted_on_the_early_bound_port_send_small_frames_at_once() -> None:
    """asyncio turns Nagle's algorithm off (TCP_NODELAY) on an accepted connection only when
    the listening socket says it is TCP (proto IPPROTO_TCP, as getaddrinfo gives it). A
    socket made with proto 0 held every small reply and event back for up to the client's
    40 ms delayed ACK: an attached client's p99 went from ~5 ms to ~30 ms."""
    async def main() -> tuple[int, int]:
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sock = writer.get_extra_info("socket")
            accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        listening = bind_port(0)
        port = listening.getsockname()[1]
        server = await asyncio.start_server(serve, sock=listening)
        try:
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            nodelay = await asyncio.wait_for(accepted, timeout=10)
            writer.close()
        finally:
            server.close()
            await server.wait_closed()
        return port, nodelay

    port, nodelay = asyncio.run(main())
    assert port > 0
    assert nodelay != 0


def test_a_taken_port_is_refused_when_bound() -> None:
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        with pytest.raises(OSError):
            bind_port(taken.getsockname()[1])
    finally:
        taken.close()


def test_the_test_ports_hook_confines_a_port_0_bind_and_leaves_a_named_port_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """INTLOOM_TEST_PORTS gives parallel test workers slices of their own: a port-0 bind
    takes a free port of the slice, fails (EADDRINUSE, naming the hook) when all are taken,
    and a port asked for by number is bound as asked."""
    taken, elsewhere = socket.socket(), socket.socket()
    try:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        elsewhere.bind(("127.0.0.1", 0))
        port, named = taken.getsockname()[1], elsewhere.getsockname()[1]
        elsewhere.close()
        monkeypatch.setenv(TEST_PORTS_ENV, f"{port}-{port}")
        with pytest.raises(OSError, match=TEST_PORTS_ENV) as refused:
            bind_port(0)
        assert refused.value.errno == errno.EADDRINUSE
        with bind_port(named) as asked:
            assert asked.getsockname()[1] == named
    finally:
        taken.close()
    with bind_port(0) as freed:  # the slice's one port, free again
        assert freed.getsockname()[1] == port


def test_the_test_ports_hook_never_picks_a_port_another_host_bound_and_is_not_yet_listening(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A host's socket is bound, not listening, while its Workflows import, and has
    SO_REUSEADDR: Linux lets a second such socket bind that very port by number, and the
    later listen fails (EADDRINUSE, CLI_SERVICE_UNAVAILABLE). The kernel's port-0 pick never
    hands that port out; the hook's must not either."""
    monkeypatch.delenv(TEST_PORTS_ENV, raising=False)
    with bind_port(0) as importing:
        port = importing.getsockname()[1]
        monkeypatch.setenv(TEST_PORTS_ENV, f"{port}-{port}")
        with pytest.raises(OSError, match=TEST_PORTS_ENV) as refused:
            bind_port(0).close()
        assert refused.value.errno == errno.EADDRINUSE
    with bind_port(0) as freed:  # once that host is gone, the port is the hook's again
        assert freed.getsockname()[1] == port
        freed.listen()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            accepted, _ = freed.accept()
            accepted.close()  # the host's side closes first: its end waits in TIME_WAIT
            assert client.recv(1) == b""
    # A restart on the saved port passes that TIME_WAIT, as it does for a kernel-picked port.
    bind_port(port).close()


def test_the_host_gets_no_pythonpath_where_it_finds_intloom_without_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher put the directory intloom came from on the host's PYTHONPATH, first,
    always: for an installed intloom, its whole site-packages, which every program a Step
    started inherited (another venv's Python loaded this one's packages). Only a checkout
    run from its own directory, which the host's -P leaves out, needs it, and gets it last."""
    from intloom.client import lifecycle

    monkeypatch.delenv("PYTHONPATH", raising=False)
    # This suite's intloom is installed (editable): found without a PYTHONPATH.
    assert "PYTHONPATH" not in lifecycle._host_env()
    elsewhere = str(tmp_path)
    assert not lifecycle._on_path(elsewhere, "")
    assert lifecycle._on_path(elsewhere, os.pathsep.join(["/x", elsewhere]))
    monkeypatch.setattr(lifecycle, "_importable_without", lambda here, pythonpath: False)
    monkeypatch.setenv("PYTHONPATH", "/mine")
    assert lifecycle._host_env()["PYTHONPATH"].split(os.pathsep)[0] == "/mine"
