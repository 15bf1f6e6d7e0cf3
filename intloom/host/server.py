"""The socket server: accept, authenticate, frame, decode, dispatch, encode. No business logic.

Per connection: the first frame must be a :class:`Hello` with our protocol and token (compared
in constant time) within ``hello_timeout``; anything else earns one ``ErrorReply`` and the
connection is closed. Then each frame is one request answered by one response, except
``Subscribe``, which streams ``RunEvent`` frames. Garbage, an oversized length, a slow or idle
peer only ever cost that peer its connection: nothing here can disturb the host or a Run.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import os
import random
import resource
import socket
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import msgspec

from intloom.errors import (
    MAX_MESSAGE,
    ErrorView,
    IntloomError,
    a_an,
    clip,
    error_view,
    quoting_bounded,
)
from intloom.fsutil import above_standard
from intloom.host.handlers import Handlers
from intloom.host.logfile import HostLog
from intloom.protocol.framing import (
    FrameClosed,
    FrameError,
    decode_first,
    decode_request,
    encode_frame,
    read_frame,
)
from intloom.protocol.messages import (
    MAX_FRAME,
    PROTOCOL,
    Answer,
    CallTool,
    Cancel,
    ClaimAgentCall,
    CompleteAgentCall,
    CreateRun,
    ErrorReply,
    FailAgentCall,
    Hello,
    HelloOk,
    Request,
    Response,
    RunEvent,
    RunReply,
    RunsReply,
    Status,
    Stop,
    Stopping,
    Subscribe,
    ToolResult,
)

if TYPE_CHECKING:
    from intloom.runtime.machine import Verdict

__all__ = ["Limits", "Server"]

LOCALHOST: Final = "127.0.0.1"
# At close, how long cancelled sessions, then the listener, get to end (each).
_CLOSE_WAIT: Final = 2.0


# Test-only: "LO-HI", the ports a port-0 bind picks from instead of the kernel's ephemeral
# range. Parallel test workers each get a slice of their own: a host restarted on the port its
# project saved then never finds it taken by another worker's host, which the kernel could
# have handed that port to while the first was stopped.
TEST_PORTS_ENV: Final = "INTLOOM_TEST_PORTS"


# File descriptors a host keeps free for its own work when it accepts a connection: a new
# WAL segment and the snapshots and manifest of a rotation, its log, the threads' and a
# Step's own files. A connection that would leave fewer is refused (BUSY, saying why) rather
# than accepted until accept() itself fails with EMFILE: asyncio then stops accepting for a
# second at a time and a client waits out its hello timeout, told only "no answer".
FD_RESERVE: Final = 16


def descriptors() -> tuple[int, int] | None:
    """(open, soft limit) of this process's file descriptors; None where not known (no
    /proc, or no limit)."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        count = len(os.listdir("/proc/self/fd")) - 1  # less listdir's own descriptor
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            return soft, soft  # not even one more to look with
        return None
    return count, soft


def descriptors_fix(count: int, soft: int, connections: int) -> str:
    """What to do about a host short of file descriptors."""
    return (f"The host has {count} of its {soft} file descriptors open (the ulimit -n of the "
            f"shell that started it) and serves {connections} connections. Close idle "
            "clients, or run intloom stop (refused too while no descriptor is free: kill "
            f"-TERM {os.getpid()}, a graceful stop), raise the limit (ulimit -n 1024) in the "
            "shell and run intloom start.")


def bind_port(port: int) -> socket.socket:
    """A socket bound to 127.0.0.1:``port`` (0 = any free port), not yet listening.

    Bound before the Workflows are imported, so that the project's port is known (and saved
    in ``connection.json``) before any user code runs; until ``Server.listen``, a client's
    connection is refused rather than left waiting for a hello. OSError when it is taken.
    Bound is not held: with SO_REUSEADDR another program may still bind it and listen
    first, and ``listen`` then fails (EADDRINUSE), naming the port.
    """
    ports = os.environ.get(TEST_PORTS_ENV) if port == 0 else None
    if ports:
        return _bind_any_of(ports)
    return _bind(port, reuse_first=True)


def _bind(port: int, *, reuse_first: bool) -> socket.socket:
    """``bind_port``'s socket. ``reuse_first=False`` sets SO_REUSEADDR only once bound: a
    port some socket holds (bound but not listening, or in TIME_WAIT) is then refused, as
    the kernel's own port-0 pick never hands it out."""
    # IPPROTO_TCP spelled out, as getaddrinfo gives it to asyncio's own start_server: asyncio
    # sets TCP_NODELAY on accepted connections only when the listening socket's proto is
    # IPPROTO_TCP. With proto 0, Nagle's algorithm held small replies and events back for up
    # to the peer's 40 ms delayed ACK (an event's p99 went from ~5 ms to ~30 ms).
    sock = _Listener(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        # As asyncio's start_server does: a port a stopped host left in TIME_WAIT is free.
        if reuse_first:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((LOCALHOST, port))
        # Set once bound all the same: the connections this socket accepts inherit it, and
        # the next host's bind on the saved port passes their TIME_WAIT only if they have it.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    except BaseException:
        sock.close()
        raise
    return sock


class _Listener(socket.socket):
    """The host's listening socket: a connection it accepts is never descriptor 0, 1 or 2.

    A Step that closed stdout or stderr (``os.close(1)``) left the number free, the next
    connection took it, and the Step's next ``print`` went into a command's socket: the
    client read a broken frame (PROJECT_RESPONSE_INVALID). asyncio's accept loop calls this
    ``accept``; per connection it also counts the open descriptors (``refuse``: a listing of
    /proc/self/fd), none of it per Step."""

    # Set by Server.listen: answers (BUSY) and closes a connection accepted while fewer than
    # FD_RESERVE descriptors are free.
    refuse: Callable[[socket.socket, int, int], None] | None = None

    def accept(self) -> tuple[socket.socket, Any]:
        conn, address = super().accept()
        if self.refuse is not None:
            # Checked here, not only in Server._accept: asyncio accepts up to 100 connections
            # each time this socket is readable, and each waits a few loop passes for its
            # session, so a burst of plain connects held every free descriptor before one was
            # checked, and a Step's open() failed EMFILE (its Run failed).
            fds = descriptors()
            if fds is not None and fds[1] - fds[0] < FD_RESERVE:
                self.refuse(conn, *fds)
                # Ends this batch of accepts quietly; the rest wait for the next loop pass.
                raise BlockingIOError(errno.EAGAIN, "refused: too few descriptors")
        low = conn.fileno()
        if low > 2:
            return conn, address
        try:
            high = above_standard(low)  # /dev/null now holds ``low``, in one dup2
        except OSError:
            conn.close()
            raise
        conn.detach()  # its number is /dev/null's now: not to be closed as the connection
        return socket.socket(conn.family, conn.type, conn.proto, fileno=high), address


def _bind_any_of(ports: str) -> socket.socket:
    """``bind_port`` on the first free port of ``ports`` ("LO-HI"), from a random one on."""
    lo, _, hi = ports.partition("-")
    first, last = int(lo), int(hi)
    count = last - first + 1
    start = random.randrange(count)
    for step in range(count):
        try:
            # Bound by number, with SO_REUSEADDR set first, a port another host holds while
            # it imports its Workflows (bound, not yet listening, SO_REUSEADDR) would be
            # bound a second time on Linux, and one of the two listens then fail.
            return _bind(first + (start + step) % count, reuse_first=False)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    raise OSError(errno.EADDRINUSE, f"no free port in {ports} ({TEST_PORTS_ENV})")




# Connections past ``Limits.max_connections`` that may still ask who the host is or stop it,
# one request each: a client that leaks its connections fills the cap for the idle timeout,
# and intloom stop and intloom status must not wait that out (nor need a signal).
CONTROL_SLOTS: Final = 4
# From accept to a control slot's one request (its hello included): the CLI sends both at
# once. With the hello timeout, four peers that said hello and then nothing held every slot
# for 30 s, and intloom stop was refused that long.
CONTROL_TIMEOUT: Final = 3.0


# Requests that start or change work; the others only read (or stop the host).
_WORK: Final = (CreateRun, Answer, Cancel, ClaimAgentCall, CallTool, CompleteAgentCall,
                FailAgentCall)
# The requests of a client Agent working on its task.
_AGENT: Final = (ClaimAgentCall, CallTool, CompleteAgentCall, FailAgentCall)


class Limits(msgspec.Struct, frozen=True):
    """Bounds on what one peer can cost the host."""

    max_connections: int = 256
    # Connections that have not shown the token yet, at most, counted in ``max_connections``:
    # past it, the oldest of them is closed for the new one. Peers without the token (any
    # local user) held every slot, control slots too, by connecting again as each hello
    # timed out, and the user's own status and stop were refused BUSY for as long; a client
    # of the project says its hello at once, so it is never the oldest for long.
    max_unproven: int = 64
    hello_timeout: float = 30.0  # from accept to a complete hello frame
    # A hello is ~100 bytes. Capping it far below MAX_FRAME keeps a peer that has not shown
    # the token from making the host hold MAX_FRAME bytes per connection (256 x 4 MiB).
    hello_frame: int = 16 * 1024
    idle_timeout: float = 600.0  # between two requests of an authenticated connection
    # From a frame's length prefix to its last byte: a frame begun and left unfinished would
    # hold up to MAX_FRAME bytes for the idle timeout (256 such peers: 1 GiB).
    frame_timeout: float = 30.0
    # Seconds between two connection_refused lines of one reason (a wrong token, the cap):
    # a client retrying a BUSY in a loop wrote ~1,100 lines (140 KB) a second, without end.
    refused_quiet: float = 60.0
    write_timeout: float = 30.0  # a peer that stops reading loses its connection
    # Bytes a follower's connection may hold unsent, beyond its history, before the next batch
    # of its Run's events (``FollowBacklog``): over it, the follower is disconnected (its
    # events are written from the publish, which cannot wait for a slow reader). A few MiB:
    # seconds of the busiest Run's events.
    follow_backlog: int = 8 * 1024 * 1024
    # The kernel's send buffer of a follower's connection, in bytes; 0: the kernel's own,
    # autotuned to 4 MiB here. Tests lower it (INTLOOM_TEST_FOLLOW_SNDBUF) so that a reader
    # that stops is found past the backlog in moments instead of after MiBs of events.
    follow_sndbuf: int = 0
    # Bytes all followers' connections may hold unsent together before a new follower is
    # refused (BUSY): each follower's history is built whole and written at once, so twenty
    # followers that stopped reading a Run with 84 MB of history held 1.67 GB, for as long as
    # the Run did not publish. A follower that reads none of its history for
    # ``write_timeout`` is closed too (``follower_too_slow``), which lets that memory go.
    follow_held: int = 256 * 1024 * 1024


class FollowBacklog(msgspec.Struct):
    """What a follower may leave unread when the next batch of its Run's events is written:
    ``Limits.follow_backlog`` beyond its history. The history goes out in one write when it
    attaches and is read at the peer's pace, which for a long-lived Run takes a while: a
    history still on its way is no slow reader, and the host holds it all the same."""

    limit: int
    history: int = 0

    def sent(self, size: int, *, history: bool) -> None:
        if history:
            self.history += size

    def too_slow(self, buffered: int) -> bool:
        return buffered > self.limit + self.history


def _quoting_bounded(view: ErrorView, request: Request) -> ErrorView:
    """``view`` with each long string of ``request`` it quotes cut to its start and length
    (ids, names and outcomes are short, and one of megabytes, quoted whole, made the reply as
    long: past the frame, RESPONSE_TOO_LARGE, "please report it", logged as the host's
    fault), then the message cut to MAX_MESSAGE (the fix comes last: cut only when still
    over)."""
    message = quoting_bounded(
        view.message, (getattr(request, name, None) for name in request.__struct_fields__))
    return ErrorView(code=view.code, message=clip(message), retryable=view.retryable)


class _Refused(Exception):
    """End this connection after sending ``reply`` (when there is one)."""

    def __init__(self, reply: ErrorReply | None) -> None:
        self.reply = reply


def _error(code: str, message: str | None = None) -> ErrorReply:
    return ErrorReply(error=error_view(code, message))


def _closing(request: Request, then: Verdict | None) -> ErrorReply:
    """CLI_SERVICE_CLOSING for a request on a connection opened before the stop: what was
    refused, that nothing was done, and what to do -- send it again after the next start
    (the hello's refusal says the same), unless it cannot succeed then.

    ``then`` is the Run's restart-table row when already settled (RunSlot.next_start): an
    ended Run takes no answer nor Agent request (a read or a cancel of it is answered from
    its journal after the next start), an answer to a wait the next start reports
    RUN_INTERRUPTED cannot be taken, and a client Agent's request never can (its claim and
    owner token are not restored). A read or a cancel of a Run reported RUN_INTERRUPTED
    works (a cancel dismisses it), and a Run still running is not judged yet: its Step has
    the stop's grace to reach a boundary."""
    run_id = getattr(request, "run_id", None)
    what = f"The {type(request).__name__} request"
    if isinstance(request, _AGENT):
        what += f" for Agent task {request.call_id} of Run {run_id}"
    elif run_id:
        what += f" about Run {run_id}"
    lost: str | None = None  # why the next start cannot take this Run's work
    if then is not None and then.row == "interrupted" and isinstance(request,
                                                                    (Answer, *_AGENT)):
        lost = f"The next start reports Run {run_id} RUN_INTERRUPTED ({then.reason})"
    elif isinstance(request, _AGENT):
        lost = "The next start does not restore claims, owner tokens or Tool receipts"
    if then is not None and then.row == "terminal" and isinstance(request, (Answer, *_AGENT)):
        # A read or a cancel of it is answered from its journal after the next start.
        then_do = (f"Run {run_id} has ended, so sending it again then cannot succeed; intloom "
                   f"inspect {run_id} reads its journal, with or without a host.")
    elif lost is not None:
        then_do = (f"{lost}, so sending it again then cannot succeed; once that start has "
                   "run, start a new Run for this work.")
    else:
        then_do = ("Run it again once intloom status says the service is offline (intloom "
                   "start waits for that, then starts a new host).")
    return _error(
        "CLI_SERVICE_CLOSING",
        f"The service is shutting down: it is suspending its Runs, then exits. {what} was "
        f"refused; nothing was done. {then_do}",
    )


def _too_large(request: Request | None, reply: msgspec.Struct, size: int) -> ErrorReply:
    """RESPONSE_TOO_LARGE for ``reply``, which cannot be framed: what was asked, what it
    did, and what to do instead (never a bare CLI_INTERNAL_ERROR)."""
    asked = f"the {type(request).__name__} request" if request is not None else "a request"
    fact = (f"The host's reply to {asked} ({type(reply).__name__}, {size:,} bytes) is over "
            f"the {MAX_FRAME:,}-byte frame limit, so it was not sent.")
    if isinstance(reply, (RunReply, RunEvent)):
        run = reply.run
        fix = (f" Run {run.run_id} exists ({run.status}), but its view is too large to send "
               "(its request was recorded by an intloom without size limits). intloom inspect "
               f"{run.run_id} reads its journal; intloom cancel {run.run_id} ends it.")
    elif isinstance(reply, RunsReply):
        fix = (" List the Runs in pages, as the intloom runs of this version does (an older "
               "client cannot: upgrade it), or narrow the list with --flow.")
    elif isinstance(reply, ToolResult):
        # "a retry replays this output" read as a way to get it: the replay is as large.
        fix = (" The Tool ran, and its output is kept: the same call sent again (its tool "
               "call id) is not run again and gets this same refusal. Make the Tool return "
               "less (write large data to a file and return its path); until then, complete "
               "or fail the task without this output.")
    else:
        fix = " intloom logs has the details (reply_too_large); please report it."
    return _error("RESPONSE_TOO_LARGE", fact + fix)


class Server:
    """Serves one host's socket. ``closing`` refuses new work while Runs are suspended."""

    def __init__(
        self,
        handlers: Handlers,
        log: HostLog,
        *,
        hello: HelloOk,
        token: str,
        on_stop: Callable[[], None],
        limits: Limits | None = None,
    ) -> None:
        self.handlers = handlers
        self.log = log
        self.hello = hello
        self._token = token.encode("ascii")
        self.on_stop = on_stop
        self.limits = limits or Limits()
        self.closing = False
        self.refusal: ErrorView | None = None  # set: new work gets this error, reads go on
        self._server: asyncio.Server | None = None
        self._sessions: set[asyncio.Task[None]] = set()
        self._busy: set[asyncio.Task[None]] = set()  # sessions inside a request
        self._control: set[asyncio.Task[None]] = set()  # sessions past the cap (CONTROL_SLOTS)
        # Sessions that have not said a valid hello yet, oldest first (Limits.max_unproven).
        self._unproven: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        # The transports of the Subscribe streams now served (Limits.follow_held).
        self._followers: set[asyncio.WriteTransport] = set()
        # Each session's streams, for close() to end its input.
        self._streams: dict[asyncio.Task[None],
                            tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
        self._refusals: Counter[str] = Counter()  # refused since the last line, by reason
        self._refused_at: dict[str, float] = {}  # monotonic time of that line
        self._idle = asyncio.Event()  # set whenever no session is inside a request
        self._idle.set()

    async def listen(self, sock: socket.socket) -> int:
        """Accept connections on ``sock`` (from ``bind_port``: a ``_Listener``, which keeps
        the descriptor reserve as it accepts) and return its port."""
        if not isinstance(sock, _Listener):
            raise TypeError(f"Server.listen takes bind_port's socket, not {sock!r}")
        sock.refuse = self._refuse_short
        self._server = await asyncio.start_server(self._accept, sock=sock, limit=64 * 1024)
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def connections(self) -> int:
        return len(self._sessions)

    def _refuse_short(self, conn: socket.socket, count: int, soft: int) -> None:
        """Close ``conn``, just accepted with fewer than FD_RESERVE descriptors free, after
        a BUSY saying why: sent without waiting (it fits a fresh socket's buffer), so that
        the descriptor is free again before the next accept."""
        self._refused("too_few_descriptors", open=count, limit=soft,
                      connections=len(self._sessions))
        try:
            conn.setblocking(False)
            conn.send(encode_frame(_error(
                "BUSY",
                "The host cannot serve another connection without running out of file "
                f"descriptors. {descriptors_fix(count, soft, len(self._sessions))}",
            )))
        except OSError:
            pass  # the peer is gone already: nothing to tell
        finally:
            conn.close()

    # ----- per connection ------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if self._unproven and len(self._unproven) >= max(1, self.limits.max_unproven):
            oldest, its_writer = next(iter(self._unproven.items()))
            del self._unproven[oldest]
            # Counted out now, not when its session ends: this connection takes its place.
            self._sessions.discard(oldest)
            self._control.discard(oldest)
            self._refused("unproven_evicted", limit=self.limits.max_unproven)
            its_writer.transport.abort()  # its session ends at its next read
        control = len(self._sessions) - len(self._control) >= self.limits.max_connections
        if control and len(self._control) >= CONTROL_SLOTS:
            self._refused("too_many_connections", limit=self.limits.max_connections)
            await self._send_quietly(writer, _error(
                "BUSY",
                f"The host already serves {self.limits.max_connections} connections. Close "
                "idle clients and retry.",
            ))
            await self._close(writer)
            return
        # The descriptor reserve was checked as the connection was accepted (_Listener).
        self._sessions.add(task)
        self._streams[task] = (reader, writer)
        self._unproven[task] = writer
        if control:
            self._control.add(task)
        try:
            await self._session(reader, writer, task, control=control)
        except _Refused as refused:
            if refused.reply is not None:
                await self._send_quietly(writer, refused.reply)
        except (FrameClosed, ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            if not self.closing:
                raise
            # close() cancelled this session: end it quietly. Raised out of this task, the
            # cancellation reaches asyncio's stream callback, which (on Python 3.11) calls
            # task.exception() on it and logs a CancelledError "task_error" on every stop.
        except Exception as exc:  # a bug here must cost one connection, never the host
            self.log.error("connection_failed", error=type(exc).__name__, detail=str(exc)[:500])
        finally:
            self._sessions.discard(task)
            self._streams.pop(task, None)
            self._control.discard(task)
            self._unproven.pop(task, None)
            self._leave(task)
            await self._close(writer)

    def _refused(self, reason: str, **context: Any) -> None:
        """Log a connection refused (for want of room, or a wrong token): the first at
        once, then at most one line a ``Limits.refused_quiet`` per reason, with ``times``,
        the refusals since the last line (this one included)."""
        self._refusals[reason] += 1
        now = time.monotonic()
        said = self._refused_at.get(reason)
        if said is not None and now - said < self.limits.refused_quiet:
            return
        self._refused_at[reason] = now
        self.log.warning("connection_refused", reason=reason,
                         times=self._refusals.pop(reason), **context)

    async def _read(self, reader: asyncio.StreamReader, limit: float,
                    size: int = MAX_FRAME) -> bytes:
        try:
            async with asyncio.timeout(limit):
                return await read_frame(reader, limit=size,
                                        body_timeout=self.limits.frame_timeout)
        except TimeoutError:
            raise _Refused(None) from None  # slow or idle: just close
        except FrameError as exc:
            raise _Refused(
                _error("INVALID_REQUEST", f"{exc}. The connection was closed.")
            ) from None

    async def _handshake(self, reader: asyncio.StreamReader, limit: float | None = None) -> None:
        body = await self._read(reader, self.limits.hello_timeout if limit is None else limit,
                                self.limits.hello_frame)
        try:
            first = decode_first(body)
        except FrameError:
            raise _Refused(_error(
                "INVALID_REQUEST",
                "The first frame must be a hello {op: hello, protocol, token}. The connection "
                "was closed.",
            )) from None
        if not isinstance(first, Hello):
            raise _Refused(_error(
                "INVALID_REQUEST",
                f"A{a_an(type(first).__name__)[1:]} request arrived before the hello. Send the "
                "hello first; the connection was closed.",
            ))
        # The token first: a peer without it learns nothing of this host (its pid and
        # version are in the protocol refusal).
        if not hmac.compare_digest(first.token.encode("utf-8", "replace"), self._token):
            # Rate-limited as the capacity refusals are: a peer retrying a wrong token (or
            # a flood of them) wrote one line per connection, without end.
            self._refused("unauthorized", client=first.client[:80])
            raise _Refused(_error(
                "UNAUTHORIZED",
                "The connection token was not accepted. Read it from this project's "
                ".intloom/connection.json.",
            ))
        if first.protocol != PROTOCOL:
            raise _Refused(_error(
                "PROTOCOL_MISMATCH",
                f"The client speaks socket protocol {first.protocol}; this host (pid "
                f"{self.hello.pid}, intloom {self.hello.package_version}) speaks {PROTOCOL}, "
                "so nothing was done. Use an intloom that speaks protocol "
                f"{PROTOCOL}, or restart this host with the client's intloom: stop it with "
                f"the intloom that started it (intloom stop) or kill -TERM {self.hello.pid} "
                "(a graceful stop), then run intloom start with the client's.",
            ))
        if self.closing:
            # The hello names no request, and no kind of client (the CLI and an Agent use the
            # same Client): the advice must hold for all, unlike _closing's, which knows the
            # request. Sending it again after the next start does not always work.
            raise _Refused(_error(
                "CLI_SERVICE_CLOSING",
                "The service is shutting down: it is suspending its Runs, then exits. No "
                "request was sent, so nothing was done. Once intloom status says the service "
                "is offline (intloom start waits for that, then starts a new host), a command "
                "can be run again, but a request about a Run may no longer apply: a client "
                "Agent's task comes back RUN_INTERRUPTED (claims, owner tokens and Tool "
                "receipts are not restored), as does a question or confirmation whose Step "
                "has no recover, and an ended Run is not loaded again. Check the Run after "
                "that start (intloom runs, or Client.get_run) before sending it again.",
            ))

    async def _session(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, task: asyncio.Task[None],
        *, control: bool = False,
    ) -> None:
        """``control``: a connection past the cap (CONTROL_SLOTS), served one status or stop
        request, sent within CONTROL_TIMEOUT of its accept."""
        # Past the cap, the hello and the one request share one short deadline.
        deadline = (asyncio.get_running_loop().time() + CONTROL_TIMEOUT) if control else None
        await self._handshake(reader, None if deadline is None else CONTROL_TIMEOUT)
        if self._unproven.pop(task, None) is None:
            # Evicted (_accept) while its hello was on its way: its transport is aborted, but
            # what it had sent is still buffered. Only the drain of the hello's write stood
            # between that request and a dispatch outside the bookkeeping close() waits on.
            raise _Refused(None)
        await self._write(writer, self.hello)
        while True:
            try:
                body = await self._read(
                    reader, self.limits.idle_timeout if deadline is None
                    else max(0.0, deadline - asyncio.get_running_loop().time()))
            except FrameClosed as closed:
                if closed.clean:
                    return
                raise
            try:
                request = decode_request(body)
            except FrameError as exc:
                # The frame boundary is intact, so the connection can go on.
                await self._write(writer, _error("INVALID_REQUEST", f"{exc}."))
                continue
            if control and not isinstance(request, (Status, Stop)):
                raise _Refused(_error(
                    "BUSY",
                    f"The host already serves {self.limits.max_connections} connections, the "
                    f"most it serves; past them it takes only a status or a stop. The "
                    f"{type(request).__name__} request was refused; nothing was done. Close "
                    "idle clients (the host closes a connection idle for "
                    f"{self.limits.idle_timeout:g} s) and retry.",
                ))
            self._busy.add(task)
            self._idle.clear()
            try:
                if isinstance(request, Subscribe):
                    await self._stream(reader, writer, request)
                    continue
                reply = await self._dispatch(request)
                await self._write(writer, reply, request)
            finally:
                self._leave(task)
            if isinstance(request, Stop) and isinstance(reply, Stopping):
                self.on_stop()
            if control:
                return

    def _leave(self, task: asyncio.Task[None]) -> None:
        self._busy.discard(task)
        if not self._busy:
            self._idle.set()

    def _next_start(self, request: Request) -> Verdict | None:
        run_id = getattr(request, "run_id", None)
        return self.handlers.next_start(run_id) if run_id else None

    async def _dispatch(self, request: Request) -> Response:
        if self.closing and not isinstance(request, Status):
            return _closing(request, self._next_start(request))
        if self.refusal is not None and isinstance(request, _WORK):
            return ErrorReply(error=self.refusal)
        try:
            return await self.handlers.handle(request)
        except IntloomError as exc:
            # recordable: an on_complete's own IntloomError naming a file through os.fsdecode
            # (a lone surrogate) failed to encode, and the Agent's connection was dropped.
            return ErrorReply(error=exc.recordable())
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.log.error("request_failed", request=type(request).__name__,
                           error=type(exc).__name__, detail=str(exc)[:500])
            return _error("CLI_INTERNAL_ERROR")

    async def _stream(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: Subscribe
    ) -> None:
        if self.closing:
            await self._write(writer, _closing(request, self._next_start(request)), request)
            return

        transport = writer.transport
        if self.limits.follow_sndbuf:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.limits.follow_sndbuf)
        held = sum(t.get_write_buffer_size() for t in self._followers)
        if held > self.limits.follow_held:
            await self._write(writer, _error(
                "BUSY",
                f"The host already holds {held / (1 << 20):,.1f} MiB of Run events its "
                f"followers have not read (at most {self.limits.follow_held / (1 << 20):,.0f} "
                "MiB together), so this stream was not begun. A follower that has read none "
                f"of its history for {self.limits.write_timeout:g} s is closed, which frees "
                "it: retry then, or close the followers (attach, subscribe) that stopped "
                "reading."), request)
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        backlog = FollowBacklog(self.limits.follow_backlog)

        def send(events: list[RunEvent]) -> None:
            # On the loop, inside the publish that made these events durable: written at
            # once, with no task wake-up (and no busy loop iteration) in between.
            if done.done():
                return
            buffered = transport.get_write_buffer_size()
            if backlog.too_slow(buffered):
                # The peer reads slower than its Run publishes: end it rather than buffer
                # without bound (a drain would block the publish, and every other Run).
                # runId as every record about a Run has it; run_id kept for its readers.
                self.log.warning("follower_too_slow", runId=request.run_id,
                                 run_id=request.run_id, buffered=buffered,
                                 limit=backlog.limit, history=backlog.history)
                done.set_exception(_Refused(None))
                transport.abort()
                return
            data = self._frames(events, request)
            backlog.sent(len(data), history=bool(events) and events[0].history)
            writer.write(data)
            if events and events[-1].final:
                done.set_result(None)

        def fail(exc: Exception) -> None:
            if not done.done():
                done.set_exception(exc)

        # Counted from its first byte to its last (an ended Run's stream is written whole
        # inside follow, and its last drain may take the write timeout): follow_held.
        self._followers.add(transport)
        try:
            try:
                stop = await self.handlers.follow(request.run_id, send, fail)
            except IntloomError as exc:
                await self._write(writer, ErrorReply(error=exc.recordable()), request)
                return
            # A follower that hangs up while the Run sits waiting must not pin the stream: any
            # byte or end-of-file from the peer ends it.
            hangup: asyncio.Future[bytes] = asyncio.ensure_future(reader.read(1))
            # Its history, written whole, is read at the peer's pace; one that stops reading
            # it held it for as long as its Run did not publish (a waiting Run: for good).
            drained = asyncio.ensure_future(
                self._history_drained(writer, backlog, request, done))
            try:
                await asyncio.wait((done, hangup), return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop()
                hangup.cancel()
                drained.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await hangup
            # Read either way: an exception never retrieved is logged when the future is freed.
            broke = done.exception() if done.done() else None
            if hangup.done() and not hangup.cancelled():
                raise _Refused(None)
            if broke is not None:
                raise broke  # _Refused for a follower closed as too slow; else a bug, logged
            # The final event is buffered: the stream ends once the peer has it (or gives up).
            async with asyncio.timeout(self.limits.write_timeout):
                await writer.drain()
        finally:
            self._followers.discard(transport)

    async def _history_drained(self, writer: asyncio.StreamWriter, backlog: FollowBacklog,
                               request: Subscribe, done: asyncio.Future[None]) -> None:
        """Close the stream (``follower_too_slow``) when none of what it was sent when it
        began has been read for ``write_timeout``: its peer stopped reading (one that reads
        a long history slowly goes on)."""
        transport = writer.transport
        left = transport.get_write_buffer_size()
        while not done.done():
            try:
                async with asyncio.timeout(self.limits.write_timeout):
                    await writer.drain()
                return  # drained: what follows is the backlog's to judge
            except TimeoutError:
                now = transport.get_write_buffer_size()
                if now < left:
                    left = now  # read from meanwhile: a long history on its way, no stall
                    continue
                if done.done():
                    return
                self.log.warning("follower_too_slow", runId=request.run_id,
                                 run_id=request.run_id, buffered=now, limit=backlog.limit,
                                 history=backlog.history)
                done.set_exception(_Refused(None))
                transport.abort()
            except (ConnectionError, OSError):
                return  # gone: the stream ends by its hang-up

    async def _write(self, writer: asyncio.StreamWriter, message: msgspec.Struct,
                     request: Request | None = None) -> None:
        if (isinstance(message, ErrorReply) and request is not None
                and len(message.error.message) > MAX_MESSAGE):
            message = ErrorReply(error=_quoting_bounded(message.error, request))
        try:
            frame = encode_frame(message)
        except FrameError as exc:
            # The reply itself is too large to frame; say so instead of dropping it.
            frame = encode_frame(self._too_large(request, message, exc))
        async with asyncio.timeout(self.limits.write_timeout):
            writer.write(frame)
            await writer.drain()

    def _too_large(self, request: Request | None, message: msgspec.Struct,
                   exc: FrameError) -> ErrorReply:
        self.log.error("reply_too_large", request=type(request).__name__,
                       reply=type(message).__name__, bytes=exc.size, detail=str(exc))
        return _too_large(request, message, exc.size)

    def _frames(self, events: list[RunEvent], request: Subscribe) -> bytes:
        """A batch of a follower's events as one write: one send per publish, not per event."""
        frames: list[bytes] = []
        for event in events:
            try:
                frames.append(encode_frame(event))
            except FrameError as exc:
                frames.append(encode_frame(self._too_large(request, event, exc)))
        return b"".join(frames)

    async def _send_quietly(self, writer: asyncio.StreamWriter, message: msgspec.Struct) -> None:
        with contextlib.suppress(Exception):
            await self._write(writer, message)

    @staticmethod
    async def _close(writer: asyncio.StreamWriter) -> None:
        writer.close()
        try:
            async with asyncio.timeout(1.0):
                await writer.wait_closed()
        except TimeoutError:
            # close() waits for buffered bytes to be sent: a peer that stopped reading would
            # keep the socket (and those bytes) forever. Drop them.
            writer.transport.abort()
        except Exception:
            pass

    # ----- shutdown ------------------------------------------------------------------------

    def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()

    @staticmethod
    def close_bound(grace: float) -> float:
        """The longest ``close(grace)`` takes: the grace, then each wait after it."""
        return grace + 2 * _CLOSE_WAIT

    async def close(self, grace: float) -> int:
        """Close the listener, let requests in flight answer for ``grace`` s, then cancel.

        Returns how many connections had to be cancelled.
        """
        self.closing = True
        self.stop_accepting()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await self._idle.wait()  # replies of requests in flight are being written
        remaining = list(self._sessions)
        busy = [t for t in remaining if t in self._busy]
        for t in busy:
            t.cancel()
        # A session waiting for its next request is not cancelled: a request sent as the
        # stop began (or while the loop was busy suspending Runs) may be in its socket,
        # unread, and cancelling dropped it unanswered -- PROJECT_REQUEST_FAILED, "the host
        # may have acted on it". One pass of the loop reads what the sockets hold; then each
        # such session reads no more, answers what it has (CLI_SERVICE_CLOSING, nothing
        # done) and ends at the end of its input. A request that arrives later is never
        # read, and the kernel resets its connection (the client can tell: no reply).
        await asyncio.sleep(0)
        idle = [self._streams[t] for t in remaining if t not in busy and t in self._streams]
        for _, writer in idle:
            transport = writer.transport
            if isinstance(transport, asyncio.ReadTransport):
                transport.pause_reading()
        # Reads the loop polled before the pause still deliver their bytes: let them.
        await asyncio.sleep(0)
        for reader, _ in idle:
            reader.feed_eof()
        if remaining:
            # Half the wait for those answers, half for what a cancel leaves to do.
            _, late = await asyncio.wait(remaining, timeout=_CLOSE_WAIT / 2)
            for t in late:
                if t not in busy:
                    t.cancel()  # a peer that does not read its last reply
            if late:
                await asyncio.wait(late, timeout=_CLOSE_WAIT / 2)
        if self._server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_CLOSE_WAIT):
                    await self._server.wait_closed()
        return len(busy)
