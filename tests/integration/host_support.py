"""Helpers for the host tests: start a real host for a Project, and speak raw frames to it."""

from __future__ import annotations

import json
import socket
import struct
import threading
from pathlib import Path
from typing import Any

import msgspec

from intloom.client.client import Client
from intloom.client.lifecycle import StartResult, start_service
from intloom.errors import IntloomError
from intloom.protocol.framing import FrameClosed, decode_response, recv_frame
from intloom.protocol.messages import PROTOCOL, ErrorReply, Response
from tests.helpers import Project


def start(project: Project, **kwargs: Any) -> StartResult:
    """start_service, remembering the host's pid so the fixture reaps it."""
    result = start_service(project.root, **kwargs)
    project.pids.add(result.service.pid)
    return result


def metadata(project: Project, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((project.state / name).read_bytes())
    return data


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def encode(obj: Any) -> bytes:
    return frame(msgspec.msgpack.encode(obj))


def nested_body(depth: int, head: dict[str, Any] | None = None, field: str = "answer") -> bytes:
    """``head`` (an answer request by default) with ``field`` set to ``depth`` one-element
    arrays nested in each other, in msgpack: a few bytes per level."""
    fields = msgspec.msgpack.encode(head or {"op": "answer", "runId": "r", "actionId": "a"})
    assert 0x80 <= fields[0] < 0x8F  # a fixmap, which one more field keeps one
    return bytes([fields[0] + 1]) + fields[1:] + msgspec.msgpack.encode(field) + (
        b"\x91" * depth + b"\xc0")


def raw(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    return sock


def hello_frame(token: str, protocol: int = PROTOCOL) -> bytes:
    return encode({"op": "hello", "protocol": protocol, "token": token})


def token_of(project: Project) -> str:
    return str(metadata(project, "connection.json")["token"])


def reply(sock: socket.socket) -> Response | None:
    """The next response frame, or None when the host closed the connection."""
    try:
        return decode_response(recv_frame(sock))
    except (FrameClosed, ConnectionResetError):
        return None


def error_code(response: Response | None) -> str:
    assert isinstance(response, ErrorReply), response
    return response.error.code


def closed(sock: socket.socket) -> bool:
    """True when the host closed its side (EOF or reset) within the socket timeout."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def connection_closed(client: Client) -> bool:
    """True when the host has closed ``client``'s connection (an end of file waits in it),
    without reading anything or waiting."""
    sock = client._sock
    assert sock is not None
    return socket_closed(sock)


def socket_closed(sock: socket.socket) -> bool:
    """True when the host has closed ``sock`` (an end of file or a reset waits in it),
    without reading anything or waiting."""
    try:
        sock.setblocking(False)
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)


def serves(root: Path, instance_id: str) -> bool:
    """The same host instance still answers a verified status."""
    with Client.connect(root) as client:
        return client.status().instance_id == instance_id


def start_on_a_thread(project: Project, timeout: float) -> tuple[threading.Thread, list[Any]]:
    """``start_service`` on a thread of its own, for a start the test interrupts or waits
    out: its StartResult, or the IntloomError it raised, lands in the list."""
    outcome: list[Any] = []

    def launch() -> None:
        try:
            outcome.append(start_service(project.root, timeout=timeout))
        except IntloomError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=launch)
    thread.start()
    return thread, outcome
