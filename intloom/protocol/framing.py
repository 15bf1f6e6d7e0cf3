"""Length-prefixed msgpack frames: a 4-byte big-endian length, then a msgspec-encoded body.

The host reads with asyncio streams, the client with a blocking socket; both share the codecs
below, which are built once. A length above ``MAX_FRAME`` (or zero) is refused before a single
body byte is read, so a hostile prefix cannot make either side allocate.

This module stays importable without asyncio: the CLI's start-up path imports it.
"""

from __future__ import annotations

import functools
import socket
import struct
import time
from typing import TYPE_CHECKING, Final, TypeVar

import msgspec

from intloom.errors import a_an
from intloom.protocol.messages import MAX_FRAME, Hello, Request, Response

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "HEADER_SIZE",
    "FrameClosed",
    "FrameError",
    "decode_first",
    "decode_request",
    "decode_response",
    "encode_frame",
    "read_frame",
    "recv_frame",
    "send_frame",
    "write_frame",
]

_T = TypeVar("_T")

_HEADER: Final = struct.Struct(">I")
HEADER_SIZE: Final = _HEADER.size

_encoder: Final = msgspec.msgpack.Encoder()
_response_decoder: Final = msgspec.msgpack.Decoder(Response)


@functools.cache
def _request_decoders() -> tuple[msgspec.msgpack.Decoder[Hello | Request],
                                 msgspec.msgpack.Decoder[Request]]:
    """(first frame, later frames): the host's side only, made at the first frame it reads
    (made at import, they were ~1 ms of every client command's start-up). The first frame
    is decoded against hello *and* requests so that a request sent before the hello earns
    "send the hello first" instead of a bare decode error."""
    return msgspec.msgpack.Decoder(Hello | Request), msgspec.msgpack.Decoder(Request)


class FrameError(Exception):
    """The peer sent something that is not a valid frame; ``fatal`` means the stream is lost.

    A bad length prefix is fatal (the next frame boundary is unknown); a well-framed body that
    does not decode is not.
    """

    def __init__(self, message: str, *, fatal: bool, size: int = 0) -> None:
        self.fatal = fatal
        self.size = size  # the encoded size of a message too large to frame (encode_frame)
        super().__init__(message)


class FrameClosed(Exception):
    """The peer closed the stream; ``clean`` when it did so between two frames."""

    def __init__(self, *, clean: bool) -> None:
        self.clean = clean
        super().__init__("the connection was closed" + ("" if clean else " inside a frame"))


def encode_frame(message: msgspec.Struct) -> bytes:
    body = _encoder.encode(message)
    if len(body) > MAX_FRAME:
        raise FrameError(
            f"{a_an(type(message).__name__)} of {len(body)} bytes exceeds the {MAX_FRAME}-byte "
            "frame limit",
            fatal=False,
            size=len(body),
        )
    return _HEADER.pack(len(body)) + body


def _check_length(length: int, limit: int) -> None:
    if length == 0:
        raise FrameError("a frame of length 0 is not allowed", fatal=True)
    if length > limit:
        raise FrameError(
            f"a frame of {length} bytes exceeds the {limit}-byte limit", fatal=True
        )


def _decode(decoder: msgspec.msgpack.Decoder[_T], body: bytes, what: str) -> _T:
    try:
        return decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise FrameError(f"the frame is not a valid {what} ({exc})", fatal=False) from None
    except RecursionError:
        # msgspec's depth limit, reached by a few bytes per level (a hostile or broken peer):
        # not a DecodeError, and the frame boundary is intact all the same.
        raise FrameError(f"the frame is not a valid {what} (a value in it is nested too "
                         "deeply)", fatal=False) from None


def decode_first(body: bytes) -> Hello | Request:
    return _decode(_request_decoders()[0], body, "hello")


def decode_request(body: bytes) -> Request:
    return _decode(_request_decoders()[1], body, "request")


def decode_response(body: bytes) -> Response:
    return _decode(_response_decoder, body, "response")


# ----- asyncio (host) ------------------------------------------------------------------------


async def read_frame(reader: asyncio.StreamReader, *, limit: int = MAX_FRAME,
                     body_timeout: float | None = None) -> bytes:
    """One frame body. Raises FrameClosed at EOF and FrameError for a bad length prefix, or
    for a body that does not follow its length prefix within ``body_timeout`` seconds."""
    try:
        header = await reader.readexactly(HEADER_SIZE)
    except EOFError as exc:  # asyncio.IncompleteReadError is an EOFError
        raise FrameClosed(clean=not getattr(exc, "partial", b"")) from None
    (length,) = _HEADER.unpack(header)
    _check_length(length, limit)
    import asyncio  # loaded already by whoever awaits this; not on the CLI's start-up path

    try:
        async with asyncio.timeout(body_timeout):
            return await reader.readexactly(length)
    except EOFError:
        raise FrameClosed(clean=False) from None
    except TimeoutError:
        raise FrameError(
            f"the rest of a frame of {length} bytes did not arrive within {body_timeout:g} s "
            "of its length prefix", fatal=True,
        ) from None


async def write_frame(writer: asyncio.StreamWriter, message: msgspec.Struct) -> None:
    writer.write(encode_frame(message))
    await writer.drain()


# ----- blocking (client) ---------------------------------------------------------------------


def send_frame(sock: socket.socket, message: msgspec.Struct) -> None:
    sock.sendall(encode_frame(message))


def from_socket(exc: OSError) -> bool:
    """Whether ``exc`` came from the socket call it interrupted: a system call's error (it
    has an errno) or the socket's own timeout (``TimeoutError('timed out')``, no errno).

    A signal handler's exception raised inside a blocking read or write has neither: a
    deadline put on a call with ``signal.alarm`` and a handler raising TimeoutError (or
    OSError, as Python's signal docs show) is the program's, and must reach it, not be read
    as a slice's timeout or a broken connection."""
    if exc.errno is not None:
        return True
    return type(exc) is TimeoutError and exc.args == ("timed out",)


def _recv_exactly(sock: socket.socket, size: int, *, at_boundary: bool,
                  patience: float | None) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        want = min(size - len(buf), 1 << 20)
        try:
            chunk = sock.recv(want)
        except TimeoutError as exc:
            if not from_socket(exc):
                raise
            if patience is not None and patience <= (sock.gettimeout() or 0.0):
                raise
            chunk = _recv_late(sock, want, patience)
        if not chunk:
            raise FrameClosed(clean=at_boundary and not buf)
        buf += chunk
    return bytes(buf)


def _recv_late(sock: socket.socket, want: int, patience: float | None) -> bytes:
    """One read whose first slice (the socket's timeout) passed with nothing to read: read
    on, a slice at a time, until ``patience`` in all (None: for ever). Between two slices
    the interpreter raises a pending KeyboardInterrupt: a SIGINT that came just before a
    read began (or was handled on another thread) does not interrupt the read itself."""
    slice_ = sock.gettimeout() or 0.0
    if patience is None:
        while True:
            try:
                return sock.recv(want)
            except TimeoutError as exc:
                if not from_socket(exc):
                    raise
    deadline = time.monotonic() + patience - slice_
    try:
        while True:
            # The last slice is cut to the deadline: the bound stays ``patience``, not up
            # to a slice more.
            sock.settimeout(max(min(slice_, deadline - time.monotonic()), 1e-3))
            try:
                return sock.recv(want)
            except TimeoutError as exc:
                if not from_socket(exc) or time.monotonic() >= deadline:
                    raise
    finally:
        sock.settimeout(slice_)


def recv_frame(sock: socket.socket, *, limit: int = MAX_FRAME,
               patience: float | None = 0.0) -> bytes:
    """One frame body from a blocking socket. Each read waits up to ``patience`` seconds
    (None: for ever) in reads of the socket's timeout, so that a wait longer than that
    timeout still sees Ctrl-C within one; a ``patience`` no longer than the socket's
    timeout (the default) is one read of it. A read that gets some bytes starts the next
    read's wait afresh (the bound is for the peer's silence, not for the whole frame)."""
    header = _recv_exactly(sock, HEADER_SIZE, at_boundary=True, patience=patience)
    (length,) = _HEADER.unpack(header)
    _check_length(length, limit)
    return _recv_exactly(sock, length, at_boundary=False, patience=patience)
