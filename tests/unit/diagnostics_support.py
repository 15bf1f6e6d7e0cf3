"""Real leftovers for the diagnostics tests: metadata files, live and dead processes, ports.

Nothing is faked: owners are real processes (or real exited ones), locks are real flocks held
by another process, ports are really bound.
"""

from __future__ import annotations

import base64
import fcntl
import os
import secrets
import socket
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from intloom.fsutil import ensure_private_dir
from intloom.host.metadata import (
    METADATA_VERSION,
    Connection,
    ServiceInfo,
    ServiceLock,
    boot_id,
    create_lock_file,
    write_connection,
    write_service,
)
from intloom.project import ProjectPaths


def make_root(tmp_path: Path) -> Path:
    root = (tmp_path / "proj").resolve()
    root.mkdir()
    (root / "intloom.toml").write_text('workflows = []\n')
    return root


def token() -> str:
    return base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    return proc.pid


@contextmanager
def live_process() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated live process, killed and reaped on exit."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    with proc:  # closes the pipe and reaps the child
        try:
            yield proc
        finally:
            proc.kill()


@contextmanager
def lock_held_here(path: Path) -> Iterator[None]:
    """This process holds the OS lock on ``path`` until the block ends, as a host holds its
    service.lock: a test that plays the host with its own pid (a client refuses a live pid
    whose lock is free: not the project's host)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


@contextmanager
def lock_holder(path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Another process that holds the OS lock on ``path`` until the block ends."""
    code = (
        "import fcntl, os, sys\n"
        f"fd = os.open({str(path)!r}, os.O_RDONLY)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "sys.stdout.write('locked\\n'); sys.stdout.flush()\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    with proc:  # closes the pipes and reaps the child
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == b"locked\n"
            yield proc
        finally:
            proc.kill()


def create_time(pid: int) -> float:
    return float(psutil.Process(pid).create_time())


def write_lock(root: Path, pid: int, created: float, *, boot: str | None = None,
               instance_id: str | None = None) -> ServiceLock:
    paths = ProjectPaths(root)
    ensure_private_dir(paths.state)
    lock = ServiceLock(
        version=METADATA_VERSION, pid=pid, create_time=created,
        boot_id=boot if boot is not None else boot_id(),
        instance_id=instance_id or str(uuid.uuid4()), started_at="2026-11-30T00:00:00.000Z",
    )
    os.close(create_lock_file(paths.service_lock, lock))
    return lock


def write_service_json(root: Path, pid: int, created: float, port: int,
                       instance_id: str, *, log_file: str | None = None) -> None:
    paths = ProjectPaths(root)
    ensure_private_dir(paths.state)
    write_service(paths.service_json, ServiceInfo(
        version=METADATA_VERSION, project_root=str(root), pid=pid, create_time=created,
        instance_id=instance_id, port=port, started_at="2026-11-30T00:00:00.000Z",
        package_version="0.1.0", protocol_version=1, log_file=log_file,
    ))


def write_connection_json(root: Path, port: int) -> Connection:
    paths = ProjectPaths(root)
    ensure_private_dir(paths.state)
    conn = Connection(version=METADATA_VERSION, project_root=str(root), port=port,
                      token=token())
    write_connection(paths.connection_json, conn)
    return conn


def crash_leftovers(root: Path, pid: int, created: float, *, port: int | None = None,
                    connection: bool = True) -> int:
    """What a SIGKILLed host leaves: service.lock, service.json and connection.json."""
    port = port or free_port()
    instance = str(uuid.uuid4())
    write_lock(root, pid, created, instance_id=instance)
    write_service_json(root, pid, created, port, instance)
    if connection:
        write_connection_json(root, port)
    return port


def tree(root: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every path under ``root`` (directories too) with its mode and, for files, its bytes."""
    out: dict[str, tuple[int, bytes | None]] = {}
    for path in sorted(root.rglob("*")):
        st = os.lstat(path)
        data = path.read_bytes() if stat.S_ISREG(st.st_mode) else None
        out[str(path.relative_to(root))] = (st.st_mode, data)
    return out
