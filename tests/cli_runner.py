"""Run ``python -m intloom ARGS`` for a test, as ``subprocess.run(capture_output=True,
text=True)`` would, through this worker's fork server (``tests/cli_forkserver.py``).

The command still runs in a process of its own, with this process's working directory,
umask, environment and a pipe for each stream; only the interpreter's start and the
command's imports are shared. ``INTLOOM_TEST_CLI_FRESH=1`` runs every command as a fresh
interpreter instead, and so does a command given different interpreter settings (a
``PYTHON*`` or locale variable) than the server started with, as those act at start-up,
and ``start --foreground``, whose process is the host and is known by its command line.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import locale
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.cli_forkserver import HEADER

FRESH_ENV = "INTLOOM_TEST_CLI_FRESH"
_SERVER = Path(__file__).with_name("cli_forkserver.py")


def _read_by_the_interpreter(key: str) -> bool:
    return key.startswith(("PYTHON", "LC_")) or key in ("LANG", "LANGUAGE")


class _Server:
    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="intloom-cli-")
        self.path = os.path.join(self.dir, "s")
        self.settings = {k: v for k, v in os.environ.items() if _read_by_the_interpreter(k)}
        self.broken = False  # a request failed on its socket: the next call starts another
        self.proc = subprocess.Popen([sys.executable, str(_SERVER), self.path],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()  # the server imports, then says so (or dies)
        if ready != b"ready\n":
            self.close()
            raise RuntimeError(f"the CLI fork server did not start (said {ready!r})")
        atexit.register(self.close)

    def serves(self, env: dict[str, str]) -> bool:
        if self.broken or self.proc.poll() is not None:
            return False
        return {k: v for k, v in env.items() if _read_by_the_interpreter(k)} == self.settings

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()  # its lifeline: it exits
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.rmdir(self.dir)


_server: _Server | None = None
_server_lock = threading.Lock()


def _the_server() -> _Server:
    global _server
    with _server_lock:
        if _server is None or _server.broken or _server.proc.poll() is not None:
            if _server is not None:
                _server.close()
            _server = _Server()
        return _server


def _umask() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    raise RuntimeError("no Umask line in /proc/self/status")


def run_cli(args: list[str], *, env: dict[str, str], input: str | None = None,
            timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "intloom", *args]
    if os.environ.get(FRESH_ENV) == "1":
        return subprocess.run(command, input=input, capture_output=True, text=True,
                              timeout=timeout, env=env)
    # A foreground host is the command's own process: doctor and a port's owner know a
    # host by its command line, which a forked command shares with the server.
    server = None if "--foreground" in args else _the_server()
    if server is None or not server.serves(env):
        return subprocess.run(command, input=input, capture_output=True, text=True,
                              timeout=timeout, env=env)
    try:
        return _through(server, command, env, input, timeout)
    except _NotForked:
        # The server was gone before it read the request (nothing ran): a fresh one runs.
        return subprocess.run(command, input=input, capture_output=True, text=True,
                              timeout=timeout, env=env)


class _NotForked(Exception):
    pass


def _request(command: list[str], env: dict[str, str]) -> bytes:
    # What a fresh child inherits across its exec: ignored signals and this thread's mask
    # (subprocess gives SIGPIPE and SIGXFSZ back their default, which Python then ignores).
    ignored = [int(s) for s in signal.valid_signals()
               if s not in (signal.SIGKILL, signal.SIGSTOP)
               and signal.getsignal(s) == signal.SIG_IGN]
    blocked = [int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])]
    body = json.dumps({"args": command[3:], "env": env, "cwd": os.getcwd(), "umask": _umask(),
                       "ignored": ignored, "blocked": blocked}).encode()
    return HEADER.pack(len(body)) + body


def _through(server: _Server, command: list[str], env: dict[str, str], input: str | None,
             timeout: float) -> subprocess.CompletedProcess[str]:
    deadline = time.monotonic() + timeout
    encoding = locale.getpreferredencoding(False)
    message = _request(command, env)
    owned: list[int] = []  # this side's descriptors not yet closed, each closed once
    pidfd = -1
    try:
        out_r, out_w = os.pipe()
        owned += (out_r, out_w)
        err_r, err_w = os.pipe()
        owned += (err_r, err_w)
        in_r, in_w = os.pipe() if input is not None else (0, -1)  # None: this fd 0
        owned += [fd for fd in (in_r, in_w) if fd > 0]
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            try:
                conn.connect(server.path)
                socket.send_fds(conn, [message[:1]], [in_r, out_w, err_w])
            except OSError as exc:
                server.broken = True
                raise _NotForked from exc  # it has not read a byte of the request
            conn.sendall(message[1:])
            for fd in (out_w, err_w, in_r):
                if fd in owned:
                    owned.remove(fd)
                    os.close(fd)  # the command's ends: its copies are its own now
            try:
                line, fds, _flags, _addr = socket.recv_fds(conn, 64, 1)
            except OSError:
                server.broken = True
                raise
            pidfd = fds[0] if fds else -1
            if not line.endswith(b"\n") or pidfd == -1:
                server.broken = True  # it died, or is not the server: never run it twice
                raise RuntimeError(f"the CLI fork server answered {line!r} to {command[3:]}")
            # Handed over: _exchange closes these, whatever happens.
            owned = [fd for fd in owned if fd not in (out_r, err_r, in_w)]
            out, err, timed_out = _exchange(out_r, err_r, in_w,
                                            (input or "").encode(encoding), deadline)
            if timed_out or not _exited(pidfd, deadline):
                raise subprocess.TimeoutExpired(command, timeout, out, err)
            conn.settimeout(10)  # the server reaps it and answers at once
            status = conn.makefile("rb").readline()
            if not status.endswith(b"\n"):
                raise RuntimeError(f"the CLI fork server gave no status for {command[3:]}")
    except BaseException:
        if pidfd != -1:  # as subprocess.run kills its child (and waits) on any error
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            _exited(pidfd, time.monotonic() + 10)
        raise
    finally:
        for fd in owned:
            os.close(fd)
        if pidfd != -1:
            os.close(pidfd)
    return subprocess.CompletedProcess(
        command, os.waitstatus_to_exitcode(int(status)),
        _text(out, encoding), _text(err, encoding))


def _exited(pidfd: int, deadline: float) -> bool:
    """Whether the process behind ``pidfd`` has ended by ``deadline`` (a pidfd reads as
    ready once it has: as ``Popen.wait``, a command that closed its outputs is waited for
    within the timeout too)."""
    with selectors.DefaultSelector() as selector:
        selector.register(pidfd, selectors.EVENT_READ)
        return bool(selector.select(max(0.0, deadline - time.monotonic())))


def _text(data: bytes, encoding: str) -> str:
    # as subprocess.run(text=True) decodes: universal newlines
    return data.decode(encoding).replace("\r\n", "\n").replace("\r", "\n")


def _exchange(out_r: int, err_r: int, in_w: int, data: bytes,
              deadline: float) -> tuple[bytes, bytes, bool]:
    """Write ``data`` to the command's stdin and read both its outputs to their ends, as
    ``communicate`` does: what each output gave, and whether the deadline came first.
    Closes the three descriptors, each once."""
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    view = memoryview(data)
    unclosed = {out_r, err_r} | ({in_w} if in_w != -1 else set())
    timed_out = False
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(out_r, selectors.EVENT_READ)
            selector.register(err_r, selectors.EVENT_READ)
            if in_w != -1 and view:
                os.set_blocking(in_w, False)
                selector.register(in_w, selectors.EVENT_WRITE)
            elif in_w != -1:
                unclosed.discard(in_w)
                os.close(in_w)  # no input: the command reads its end at once
            while selector.get_map():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    break
                for key, _events in selector.select(remaining):
                    if key.fd == in_w:
                        try:
                            view = view[os.write(in_w, view[:65536]):]
                        except BrokenPipeError:
                            view = view[:0]
                        if not view:
                            selector.unregister(in_w)
                            unclosed.discard(in_w)
                            os.close(in_w)
                    elif chunk := os.read(key.fd, 65536):
                        chunks[key.fd].append(chunk)
                    else:
                        selector.unregister(key.fd)
    finally:
        for fd in unclosed:  # each exactly once: another thread may reuse a closed number
            os.close(fd)
    return b"".join(chunks[out_r]), b"".join(chunks[err_r]), timed_out
