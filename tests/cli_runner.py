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
        self.proc = subprocess.Popen([sys.executable, str(_SERVER), self.path],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()  # the server imports, then says so (or dies)
        if ready != b"ready\n":
            self.close()
            raise RuntimeError(f"the CLI fork server did not start (said {ready!r})")
        atexit.register(self.close)

    def serves(self, env: dict[str, str]) -> bool:
        if self.proc.poll() is not None:
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
        if _server is None or _server.proc.poll() is not None:
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
    return _through(server, command, env, input, timeout)


def _through(server: _Server, command: list[str], env: dict[str, str], input: str | None,
             timeout: float) -> subprocess.CompletedProcess[str]:
    deadline = time.monotonic() + timeout
    encoding = locale.getpreferredencoding(False)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe() if input is not None else (0, -1)
    # What a fresh child inherits across its exec: ignored signals and this thread's mask
    # (subprocess gives SIGPIPE and SIGXFSZ back their default, which Python then ignores).
    ignored = [int(s) for s in signal.valid_signals()
               if s not in (signal.SIGKILL, signal.SIGSTOP)
               and signal.getsignal(s) == signal.SIG_IGN]
    blocked = [int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])]
    request = json.dumps({"args": command[3:], "env": env, "cwd": os.getcwd(),
                          "umask": _umask(), "ignored": ignored, "blocked": blocked}).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(server.path)
            message = HEADER.pack(len(request)) + request
            sent = socket.send_fds(conn, [message], [in_r, out_w, err_w])
            conn.sendall(message[sent:])
        finally:
            for fd in (out_w, err_w, in_r if in_w != -1 else -1):
                if fd != -1:
                    os.close(fd)
        replies = conn.makefile("rb")
        pid = int(replies.readline())
        pidfd = -1
        with contextlib.suppress(ProcessLookupError):
            pidfd = os.pidfd_open(pid)  # to signal this very process even once it is reaped
        try:
            out, err = _exchange(out_r, err_r, in_w, (input or "").encode(encoding), deadline)
            if out is None or err is None:
                raise subprocess.TimeoutExpired(command, timeout)
            conn.settimeout(max(0.0, deadline - time.monotonic()) + 5)
            status = replies.readline()
        except BaseException:
            if pidfd != -1:  # as subprocess.run kills its child on a timeout or any error
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            raise
        finally:
            if pidfd != -1:
                os.close(pidfd)
    return subprocess.CompletedProcess(
        command, os.waitstatus_to_exitcode(int(status)),
        _text(out, encoding), _text(err, encoding))


def _text(data: bytes, encoding: str) -> str:
    # as subprocess.run(text=True) decodes: universal newlines
    return data.decode(encoding).replace("\r\n", "\n").replace("\r", "\n")


def _exchange(out_r: int, err_r: int, in_w: int, data: bytes,
              deadline: float) -> tuple[bytes | None, bytes | None]:
    """Write ``data`` to the command's stdin and read both its outputs to their ends, as
    ``communicate`` does; ``(None, None)`` at the deadline."""
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    view = memoryview(data)
    unclosed = {out_r, err_r} | ({in_w} if in_w != -1 else set())
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
                    return None, None
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
    return b"".join(chunks[out_r]), b"".join(chunks[err_r])
