"""Ctrl-C while a Client waits for its host's reply (``flow``, ``answer``, ``attach``'s
``wait_run``): the wait must end within a moment, however the SIGINT lands.

No host is needed: the Client talks to one end of a socket pair whose other end stays
silent, as a host does while a Run's Steps go on.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from intloom.client.client import Client
from intloom.errors import IntloomError
from intloom.host.metadata import ServiceInfo
from intloom.protocol.framing import encode_frame
from intloom.protocol.messages import PROTOCOL, HelloOk, RunReply
from intloom.runtime.model import Cursor, RunView
from tests.helpers import eventually

pytestmark = pytest.mark.timeout(30)


def _asleep_in_a_syscall(tid: int) -> bool:
    """The thread ``tid`` of this process sleeps in the kernel, and not on the GIL (a
    futex): in its read of the socket, here."""
    with open(f"/proc/self/task/{tid}/stat", encoding="ascii") as fh:
        state = fh.read().rpartition(") ")[2][:1]
    with open(f"/proc/self/task/{tid}/wchan", encoding="ascii") as fh:
        wchan = fh.read()
    return state == "S" and wchan not in ("", "0") and "futex" not in wchan


def _later_than(moment: float) -> Callable[[], bool]:
    return lambda: time.monotonic() > moment


def _client(sock: socket.socket, root: Path, request_timeout: float | None = None) -> Client:
    hello = HelloOk(instance_id="I-1", pid=1, project_root=str(root), protocol=PROTOCOL)
    info = ServiceInfo(version=1, project_root=str(root), pid=1, create_time=0.0,
                       instance_id="I-1", port=1, started_at="", package_version="",
                       protocol_version=PROTOCOL)
    return Client(sock, hello, info, root, request_timeout=request_timeout)


def test_a_ctrl_c_that_lands_before_the_read_ends_a_wait_within_a_moment(
    tmp_path: Path,
) -> None:
    """A SIGINT whose handler ran before the main thread's blocking read began -- here,
    deterministically, on another thread while the main thread sleeps in that read -- only
    flags the main thread; it was acted on when the host replied, which for a Run in a long
    Step is minutes or hours later. Reads sleep in slices now, and Ctrl-C ends the wait."""
    ours, host = socket.socketpair()
    assert threading.current_thread() is threading.main_thread()
    main = threading.get_native_id()
    flagged_at: list[float] = []
    ended = threading.Event()

    def ctrl_c() -> None:
        eventually(lambda: _asleep_in_a_syscall(main), timeout=10,
                   what="the main thread to sleep in its read of the reply")
        # Handled on this thread: the kernel does not interrupt the main thread's read.
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        flagged_at.append(time.monotonic())
        if not ended.wait(5):
            host.close()  # what a reply would do: the main thread returns to Python

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    sender = threading.Thread(target=ctrl_c, daemon=True)
    try:
        with _client(ours, tmp_path) as client, pytest.raises(KeyboardInterrupt):
            sender.start()
            client.wait_run("RUN-1")
        took = time.monotonic() - flagged_at[0]
    finally:
        ended.set()
        sender.join(timeout=10)
        signal.signal(signal.SIGINT, previous)
        host.close()
    assert took < 2, f"Ctrl-C was acted on {took:.2f} s after it came (at the reply)"


def test_a_wait_read_in_slices_keeps_its_bound_and_every_byte(tmp_path: Path) -> None:
    """The slices change neither what is read nor how long the host's silence may last:
    a reply that comes in pieces, each after a silence longer than a slice, arrives whole;
    a silence of ``request_timeout`` ends the wait at that bound, with its message."""
    ours, host = socket.socketpair()
    main = threading.get_native_id()  # the test's thread is the main thread
    view = RunView(run_id="RUN-1", flow_name="f", cursor=Cursor(stage="s"),
                   status="waiting", created_at="T0", updated_at="T1")
    frame = encode_frame(RunReply(run=view))

    def reply_in_pieces() -> None:
        for piece in (frame[:2], frame[2:]):  # the header cut in two
            # Each after the main thread has slept in its read for more than one slice.
            eventually(lambda: _asleep_in_a_syscall(main), timeout=10, what="a read")
            eventually(_later_than(time.monotonic() + 0.3), timeout=10,
                       what="a silence longer than a slice")
            host.sendall(piece)

    sender = threading.Thread(target=reply_in_pieces, daemon=True)
    try:
        with _client(ours, tmp_path, request_timeout=0.6) as client:
            sender.start()
            assert client.wait_run("RUN-1") == view
            sender.join(timeout=10)
            began = time.monotonic()
            with pytest.raises(IntloomError) as late:
                client.get_run("RUN-1")
            took = time.monotonic() - began
    finally:
        host.close()
    assert late.value.code == "PROJECT_REQUEST_FAILED"
    assert "no reply within 0.6 s" in late.value.message, late.value.message
    assert 0.6 <= took < 1.1, took  # the bound, not a slice more (a busy machine's slack)


def test_a_request_interrupted_before_its_reply_leaves_no_reply_for_the_next(
    tmp_path: Path,
) -> None:
    """Ctrl-C in wait_run left its reply on its way on the Client's connection: the next
    request read it as its own (the Run's view, for get_run of another Run, with no
    error). The interrupted request's connection is shut, as an interrupted stream's is."""
    ours, host = socket.socketpair()
    main = threading.get_native_id()  # the test's thread is the main thread
    main_ident = threading.get_ident()
    stale = RunView(run_id="RUN-1", flow_name="f", cursor=Cursor(stage="s"),
                    status="waiting", created_at="T0", updated_at="T1")

    def ctrl_c() -> None:
        eventually(lambda: _asleep_in_a_syscall(main), timeout=10, what="the wait's read")
        signal.pthread_kill(main_ident, signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    sender = threading.Thread(target=ctrl_c, daemon=True)
    try:
        with _client(ours, tmp_path) as client:
            with pytest.raises(KeyboardInterrupt):
                sender.start()
                client.wait_run("RUN-1")
            sender.join(timeout=10)
            with contextlib.suppress(BrokenPipeError):  # once the Client shut its end
                host.sendall(encode_frame(RunReply(run=stale)))  # the wait's reply, late
            # No project at tmp_path: connecting again fails, and says why it was needed.
            with pytest.raises(IntloomError) as gone:
                client.get_run("RUN-2")
    finally:
        signal.signal(signal.SIGINT, previous)
        host.close()
    assert gone.value.code == "PROJECT_CONNECTION_FAILED", gone.value
    assert "interrupted (KeyboardInterrupt)" in gone.value.message, gone.value.message
    assert "Nothing was sent" in gone.value.message, gone.value.message
