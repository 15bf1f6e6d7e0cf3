"""Frames on both sides: the blocking client reader and the host's asyncio reader agree on
lengths, refuse hostile prefixes before reading a body, and tell a clean close from a torn one."""

from __future__ import annotations

import asyncio
import socket

import pytest

from intloom.protocol.framing import (
    FrameClosed,
    FrameError,
    decode_first,
    decode_request,
    decode_response,
    encode_frame,
    read_frame,
    recv_frame,
)
from intloom.protocol.messages import MAX_FRAME, PROTOCOL, CreateRun, Hello, RunEvent, Status
from intloom.runtime.model import Cursor, RunView
from tests.integration.host_support import nested_body


def _read_async(data: bytes) -> bytes:
    async def go() -> bytes:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await read_frame(reader)

    return asyncio.run(go())


def test_round_trip_on_both_readers() -> None:
    message = CreateRun(workflow="example", intent="é" * 1000, wait=False)
    data = encode_frame(message)
    assert int.from_bytes(data[:4], "big") == len(data) - 4
    assert decode_request(_read_async(data)) == message
    left, right = socket.socketpair()
    with left, right:
        left.sendall(data)
        assert decode_request(recv_frame(right)) == message


def test_first_frame_tells_a_hello_from_an_early_request() -> None:
    hello = Hello(protocol=PROTOCOL, token="t" * 43)
    assert decode_first(encode_frame(hello)[4:]) == hello
    assert isinstance(decode_first(encode_frame(Status())[4:]), Status)


@pytest.mark.parametrize("length", [0, MAX_FRAME + 1, 0xFFFFFFFF])
def test_bad_length_prefix_is_fatal_before_any_body_is_read(length: int) -> None:
    with pytest.raises(FrameError) as bad:
        _read_async(length.to_bytes(4, "big"))
    assert bad.value.fatal
    left, right = socket.socketpair()
    with left, right:
        left.sendall(length.to_bytes(4, "big"))
        with pytest.raises(FrameError):
            recv_frame(right)


def test_undecodable_body_is_not_fatal() -> None:
    with pytest.raises(FrameError) as bad:
        decode_request(b"\xc1")
    assert not bad.value.fatal
    with pytest.raises(FrameError):
        decode_response(encode_frame(Status())[4:])  # a request is not a response


def test_a_body_nested_too_deeply_is_an_undecodable_body_not_a_crash() -> None:
    """msgspec raises RecursionError, not DecodeError, for a value nested past its depth
    limit: it escaped the decoders, and the host dropped the connection (after the hello as
    before it) with no reply and an error-level connection_failed line, as for a bug."""
    request = nested_body(100_000)
    response = nested_body(100_000, {"op": "tool_result"}, "output")
    for decode, body in ((decode_first, request), (decode_request, request),
                         (decode_response, response)):
        with pytest.raises(FrameError) as bad:
            decode(body)
        assert not bad.value.fatal  # the frame boundary is intact
        assert "nested too deeply" in str(bad.value)


def test_clean_and_torn_closes_are_told_apart() -> None:
    with pytest.raises(FrameClosed) as clean:
        _read_async(b"")
    assert clean.value.clean
    with pytest.raises(FrameClosed) as torn_header:
        _read_async(b"\x00\x00")
    assert not torn_header.value.clean
    with pytest.raises(FrameClosed) as torn_body:
        _read_async(b"\x00\x00\x00\x10abc")
    assert not torn_body.value.clean


def test_a_message_too_large_to_frame_is_refused_on_encode() -> None:
    view = RunView(run_id="R", flow_name="f", cursor=Cursor(stage="s"), status="running",
                   created_at="t", updated_at="t")
    with pytest.raises(FrameError):
        encode_frame(RunEvent(run=view, event="x", detail="x" * (MAX_FRAME + 1)))
