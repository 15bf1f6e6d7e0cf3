"""A fork server for the ``intloom`` command in tests (started by ``tests/cli_runner.py``).

The suite runs the command a few thousand times, and a fresh ``python -m intloom`` spends
~0.15 s of CPU importing before it does anything. This process imports the command once;
each request forks a child that becomes the command: the caller's stdin, stdout and stderr
(passed over the socket), its working directory, environment and umask, the signal
dispositions a fresh interpreter starts with, and ``python -m intloom``'s ``sys.argv`` and
``__main__``. The child is a real process talking to a real host over real sockets; only the
import is shared. It is single-threaded, so forking it is safe (a pytest worker is not).

Protocol, one connection per command: the caller sends a length-prefixed JSON request with
three descriptors; the server answers ``<pid>\\n`` once forked and ``<wait status>\\n`` once
the child has been reaped. The server exits when its stdin (the worker's lifeline) closes.
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
import traceback
from typing import Any, NoReturn

HEADER = struct.Struct("!I")
# Signals the interpreter ignores as it starts (subprocess gave them back their default).
_PYTHON_IGNORES = (signal.SIGPIPE, signal.SIGXFSZ)


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
    while len(data) < HEADER.size or len(data) < HEADER.size + HEADER.unpack_from(data)[0]:
        more = conn.recv(1 << 16)
        if not more:
            raise ConnectionError("request cut short")
        data += more
    (size,) = HEADER.unpack_from(data)
    return json.loads(data[HEADER.size:HEADER.size + size]), fds


def _become_the_command(request: dict[str, Any], fds: list[int]) -> NoReturn:
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
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
        for fd, name in enumerate(("stdin", "stdout", "stderr")):
            stream = _text(fd, getattr(sys, f"__{name}__"))
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)  # the loader reads these too
        sys.argv = ["-m", *request["args"]]
        try:
            runpy.run_module("intloom", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc.code)
        except KeyboardInterrupt:
            _flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)  # as the interpreter ends on one it did not catch
        except BaseException:  # as the interpreter: printed, and the status is 1
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
        if not _flush() and code == 0:
            code = 120  # the interpreter's status when flushing stdout fails at exit
    finally:
        os._exit(code)


def _text(fd: int, template: Any) -> io.TextIOWrapper:
    """A stream on ``fd`` as the interpreter builds ``sys.std*``: the encoding and errors
    the environment chose (the server's own, whose environment the caller checked matches)
    and a line-buffered stderr that replaces what it cannot encode."""
    raw = io.FileIO(fd, "r" if fd == 0 else "w", closefd=False)
    buffered: io.BufferedReader | io.BufferedWriter = (
        io.BufferedReader(raw) if fd == 0 else io.BufferedWriter(raw))
    return io.TextIOWrapper(
        buffered, encoding=getattr(template, "encoding", None) or "utf-8",
        errors="backslashreplace" if fd == 2 else getattr(template, "errors", None) or "strict",
        line_buffering=fd == 2)


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    with contextlib.suppress(Exception):
        print(value, file=sys.stderr)
    return 1


def _flush() -> bool:
    ok = True
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a reader gone: the interpreter says so and goes on
            ok = ok and stream is not sys.stdout
    return ok


def serve(listener: socket.socket) -> None:
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin, selectors.EVENT_READ, "lifeline")
    waiting: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, connection)
    while True:
        for key, _events in selector.select():
            if key.data == "lifeline":
                return
            if key.data == "accept":
                conn, _ = listener.accept()
                try:
                    request, fds = _read_request(conn)
                except (OSError, ValueError):
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    conn.close()
                    for _pid, other in waiting.values():
                        other.close()
                    _become_the_command(request, fds)
                for fd in fds:
                    os.close(fd)
                conn.sendall(f"{pid}\n".encode())
                pidfd = os.pidfd_open(pid)
                waiting[pidfd] = (pid, conn)
                selector.register(pidfd, selectors.EVENT_READ, "child")
                continue
            pidfd = key.fd
            pid, conn = waiting.pop(pidfd)
            selector.unregister(pidfd)
            os.close(pidfd)
            _, status = os.waitpid(pid, 0)
            with contextlib.suppress(OSError):
                conn.sendall(f"{status}\n".encode())
            conn.close()


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of the suite ends it by its lifeline
    _preload()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(sys.argv[1])
        server.listen(64)
        print("ready", flush=True)
        serve(server)
