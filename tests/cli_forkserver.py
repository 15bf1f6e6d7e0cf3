"""A fork server for the ``intloom`` command in tests (started by ``tests/cli_runner.py``).

The suite runs the command a few thousand times, and a fresh ``python -m intloom`` spends
~0.15 s of CPU importing before it does anything. This process imports the command once;
each request forks a child that becomes the command: the caller's stdin, stdout and stderr
(passed over the socket) and no other descriptor, its working directory, environment and
umask, the signal state an exec leaves, stdio built as the interpreter builds it, and
``python -m intloom``'s ``sys.argv``, ``__main__`` and ``sys.path[0]``; at its end, what
the interpreter does at exit (non-daemon threads joined, atexit, the flush whose failure
is status 120, an uncaught Ctrl-C re-raised as SIGINT). The child is a real process talking
to a real host over real sockets; only the import is shared. The server is single-threaded,
so forking it is safe (a pytest worker is not).

What a served command cannot have of a fresh one: its own string hash seed (every command
forked from one server iterates a set of strings in the same order) and its own command
line (``/proc/PID/cmdline`` is the server's).

Protocol, one connection per command: the caller sends a length-prefixed JSON request with
three descriptors; the server answers ``<pid>\\n`` with a pidfd of the child once forked
(the caller signals that, never a pid that may be reused) and ``<wait status>\\n`` once the
child has been reaped. A caller that goes away first has its command killed, as
``subprocess.run`` kills its child on any error. The server exits when its stdin (the
worker's lifeline) closes.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import io
import json
import os
import pkgutil
import runpy
import selectors
import signal
import socket
import struct
import sys
import threading
import traceback
from typing import Any, NoReturn

HEADER = struct.Struct("!I")
# Signals the interpreter ignores as it starts (subprocess gave them back their default).
_PYTHON_IGNORES = (signal.SIGPIPE, signal.SIGXFSZ)
_STREAMS = ("stdin", "stdout", "stderr")


def _preload() -> None:
    import intloom.cli.app  # noqa: F401

    for package in ("intloom.cli", "intloom.cli.commands", "intloom.client",
                    "intloom.diagnostics", "intloom.protocol", "intloom.store"):
        module = importlib.import_module(package)
        for info in pkgutil.iter_modules(module.__path__, package + "."):
            importlib.import_module(info.name)
    gc.collect()
    gc.freeze()  # children share these pages instead of touching them in a collection


def _read_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
    try:
        while len(data) < HEADER.size or len(data) < HEADER.size + HEADER.unpack_from(data)[0]:
            more = conn.recv(1 << 16)
            if not more:
                raise ConnectionError("request cut short")
            data += more
        if len(fds) != 3:
            raise ConnectionError(f"{len(fds)} descriptors, not 3")
        (size,) = HEADER.unpack_from(data)
        return json.loads(data[HEADER.size:HEADER.size + size]), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _stdio(fd: int, template: Any) -> io.TextIOWrapper:
    """``sys.std*`` on ``fd`` as the interpreter builds it (create_stdio): the encoding and
    errors the environment chose (the server's own: the caller checked that the variables
    deciding them match), stderr replacing what it cannot encode, newline ``\\n``, unbuffered
    writes under -u/PYTHONUNBUFFERED, line-buffered stderr (and any tty)."""
    writing = fd != 0
    # -u or PYTHONUNBUFFERED, which sys.flags does not carry: the server's own stdout shows
    # it (the caller checked that its PYTHON* variables are the server's).
    unbuffered = bool(getattr(template if writing else sys.__stderr__, "write_through", False))
    buffer: Any = open(fd, "wb" if writing else "rb",  # noqa: SIM115 - kept for life
                       buffering=0 if unbuffered and writing else -1, closefd=False)
    raw = buffer if isinstance(buffer, io.FileIO) else buffer.raw
    raw.name = f"<{_STREAMS[fd]}>"
    stream = io.TextIOWrapper(
        buffer, encoding=getattr(template, "encoding", None) or "utf-8",
        errors="backslashreplace" if fd == 2 else getattr(template, "errors", None) or "strict",
        newline="\n", line_buffering=not unbuffered and (fd == 2 or raw.isatty()),
        write_through=unbuffered)
    stream.mode = "w" if writing else "r"  # type: ignore[misc]
    return stream


def _become_the_command(request: dict[str, Any], fds: list[int]) -> NoReturn:
    code = 1
    interrupted = False
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        # As close_fds gives a fresh child: the received copies, the listener, the selector,
        # other commands' connections and pidfds all go.
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        os.chdir(request["cwd"])
        sys.path[0] = request["cwd"]  # as ``python -m`` puts the working directory first
        os.umask(request["umask"])
        os.environ.clear()
        os.environ.update(request["env"])
        # What an exec leaves: the caller's ignored signals stay ignored, its handlers go
        # back to the default, its blocked signals stay blocked; then the interpreter's own.
        ignored = set(request["ignored"])
        for signum in signal.valid_signals():
            with contextlib.suppress(OSError, ValueError):
                signal.signal(signum, signal.SIG_IGN if signum in ignored else signal.SIG_DFL)
        if signal.SIGINT not in ignored:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        for signum in _PYTHON_IGNORES:
            signal.signal(signum, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, request["blocked"])
        for fd, name in enumerate(_STREAMS):
            stream = _stdio(fd, getattr(sys, f"__{name}__"))
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)  # the loader reads these too
        sys.argv = ["-m", *request["args"]]
        try:
            runpy.run_module("intloom", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc.code)
        except BaseException as exc:  # as the interpreter: sys.excepthook, then status 1
            interrupted = isinstance(exc, KeyboardInterrupt)
            tb = exc.__traceback__
            sys.excepthook(type(exc), exc, tb.tb_next if tb is not None else None)
            code = 1
        # Py_FinalizeEx's order: non-daemon threads joined, atexit, then the std flush.
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
        if not _flushed():
            code = 120  # the interpreter's status when flushing stdout or stderr fails
        if interrupted:  # an uncaught Ctrl-C ends the interpreter by SIGINT (status -2)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        os._exit(code)


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    with contextlib.suppress(Exception):
        print(value, file=sys.stderr)
    return 1


def _flushed() -> bool:
    ok = True
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception as exc:  # a reader gone: said as the interpreter says it
            ok = False
            with contextlib.suppress(Exception):
                sys.stderr.write(f"Exception ignored in: {stream!r}\n"
                                 + "".join(traceback.format_exception_only(exc)))
    return ok


class _Command:
    """A forked command: its pid, a pidfd for it, and its caller's connection."""

    __slots__ = ("conn", "pid", "pidfd")

    def __init__(self, pid: int, pidfd: int, conn: socket.socket) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.conn: socket.socket | None = conn

    def caller_gone(self, selector: selectors.BaseSelector) -> None:
        # subprocess.run kills its child on any error in its caller: a caller that left
        # (an exception, a test's timeout) before the status came would leave it running.
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        if self.conn is not None:
            selector.unregister(self.conn)
            self.conn.close()
            self.conn = None


def serve(listener: socket.socket) -> None:
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin, selectors.EVENT_READ, "lifeline")
    while True:
        for key, _events in selector.select():
            if key.data == "lifeline":
                return
            if key.data == "accept":
                _accept(listener, selector)
                continue
            kind, command = key.data
            if kind == "caller":  # a caller writes nothing after its request: it left
                command.caller_gone(selector)
                continue
            selector.unregister(command.pidfd)
            _, status = os.waitpid(command.pid, 0)
            os.close(command.pidfd)
            if command.conn is not None:
                selector.unregister(command.conn)
                with contextlib.suppress(OSError):
                    command.conn.sendall(f"{status}\n".encode())
                command.conn.close()


def _accept(listener: socket.socket, selector: selectors.BaseSelector) -> None:
    conn, _ = listener.accept()
    try:
        request, fds = _read_request(conn)
    except (OSError, ValueError):
        conn.close()
        return
    pid = os.fork()
    if pid == 0:
        _become_the_command(request, fds)
    for fd in fds:
        os.close(fd)
    # Opened before this loop can reap it: the pid it names is this child's for as long as
    # the pidfd is open.
    command = _Command(pid, os.pidfd_open(pid), conn)
    selector.register(command.pidfd, selectors.EVENT_READ, ("child", command))
    try:
        socket.send_fds(conn, [f"{pid}\n".encode()], [command.pidfd])
    except OSError:
        command.conn = None
        conn.close()
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(command.pidfd, signal.SIGKILL)
        return
    selector.register(conn, selectors.EVENT_READ, ("caller", command))


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of the suite ends it by its lifeline
    _preload()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(sys.argv[1])
        server.listen(64)
        print("ready", flush=True)
        serve(server)
