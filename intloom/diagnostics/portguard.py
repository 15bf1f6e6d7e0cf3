"""Hold the project's saved port while ``recover`` works.

A host can only serve the project on its saved port, so while ``recover`` listens there no
host can come up, and a second ``recover`` cannot bind either: the port is the
serialisation point, with no extra lock file left behind if ``recover`` is killed (the
kernel frees the port with the process). Connections that arrive meanwhile are answered
with a clear error and closed at once, so a client never waits for a hello reply.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from types import TracebackType

from intloom.errors import IntloomError

__all__ = ["PortGuard", "port_in_use"]


def port_in_use(port: int, holder: str | None = None) -> IntloomError:
    """CLI_RECOVERY_BLOCKED for a taken port (the documented text), naming the port and,
    when the OS says, the process that listens there."""
    who = f"in use by {holder}; " if holder is not None else ""
    return IntloomError(
        "CLI_RECOVERY_BLOCKED",
        "The project port is in use or unavailable. No recovery performed. "
        f"(port {port} on 127.0.0.1; {who}find its listener with: ss -ltnp 'sport = :{port}')",
    )


class PortGuard:
    """A listener on ``127.0.0.1:port`` that turns every connection away until closed."""

    def __init__(self, port: int, reply: bytes = b"") -> None:
        """``reply`` is sent to each connection before it is closed (an error frame)."""
        self.port = port
        self._reply = reply
        self._sock: socket.socket | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None
        self._thread: threading.Thread | None = None

    def open(self) -> None:
        """Bind and listen, or raise CLI_RECOVERY_BLOCKED naming the port."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # SO_REUSEADDR only lets us past TIME_WAIT leftovers of the dead host's connections;
        # on Linux it never lets two listeners share the port.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", self.port))
            sock.listen(16)
        except OSError:
            sock.close()
            raise port_in_use(self.port) from None
        sock.setblocking(False)
        self._sock = sock
        self._wake = socket.socketpair()
        self._thread = threading.Thread(
            target=self._serve, name=f"intloom-port-guard-{self.port}", daemon=True
        )
        self._thread.start()

    def _serve(self) -> None:
        assert self._sock is not None and self._wake is not None
        listener = self._sock
        wake = self._wake[0]
        open_conns: list[socket.socket] = []
        with selectors.DefaultSelector() as sel:
            sel.register(listener, selectors.EVENT_READ)
            sel.register(wake, selectors.EVENT_READ)
            try:
                while True:
                    for key, _ in sel.select():
                        if key.fileobj is wake:
                            return
                        if key.fileobj is listener:
                            self._turn_away(listener, sel, open_conns)
                            continue
                        conn = key.fileobj
                        assert isinstance(conn, socket.socket)
                        # Drain the client's hello and wait for its close: closing with
                        # unread data would reset the connection and lose our reply.
                        try:
                            data = conn.recv(65536)
                        except BlockingIOError:
                            continue
                        except OSError:
                            data = b""
                        if not data:
                            sel.unregister(conn)
                            open_conns.remove(conn)
                            conn.close()
            finally:
                for conn in open_conns:
                    conn.close()

    def _turn_away(
        self, listener: socket.socket, sel: selectors.BaseSelector,
        open_conns: list[socket.socket],
    ) -> None:
        try:
            conn, _addr = listener.accept()
        except OSError:
            return
        conn.setblocking(False)
        with contextlib.suppress(OSError):
            if self._reply:
                conn.send(self._reply)
            conn.shutdown(socket.SHUT_WR)
        sel.register(conn, selectors.EVENT_READ)
        open_conns.append(conn)

    def close(self) -> None:
        """Stop turning connections away and free the port."""
        if self._wake is not None:
            with contextlib.suppress(OSError):
                self._wake[1].send(b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._wake is not None:
            for end in self._wake:
                end.close()
            self._wake = None

    def __enter__(self) -> PortGuard:
        self.open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
