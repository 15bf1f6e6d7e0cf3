"""The Python client: one typed, blocking method per request of the socket protocol.

The CLI is a thin adapter over this module; users import it to drive Runs and client Agents.
It sits on the CLI's start-up path, so it imports no asyncio, rich or psutil.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import sys
import threading
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any, Final, TypeVar

from intloom.client.outgoing import frame_of
from intloom.errors import (
    IntloomError,
    a_an,
    error_view,
    quoted,
    starting_message,
    unlistened_message,
)
from intloom.fsutil import PrivacyError, check_private_dir, os_lock, search_refused
from intloom.host.metadata import (
    CREATE_TIME_TOLERANCE,
    ServiceInfo,
    privacy_invalid,
    read_connection,
    read_service,
)
from intloom.project import (
    CONFIG_NAME,
    ProjectPaths,
    config_not_a_file,
    enclosing,
    load_config,
    removed_working_directory,
)
from intloom.protocol.framing import (
    FrameClosed,
    FrameError,
    decode_response,
    from_socket,
    recv_frame,
    send_frame,
)
from intloom.protocol.messages import (
    ANSWER_WAIT,
    PROTOCOL,
    Answer,
    CallTool,
    Cancel,
    ClaimAgentCall,
    Claimed,
    CompleteAgentCall,
    CreateRun,
    ErrorReply,
    FailAgentCall,
    GetRun,
    Hello,
    HelloOk,
    ListRuns,
    ListWorkflows,
    Request,
    Response,
    RunEvent,
    RunReply,
    RunsReply,
    ServiceView,
    Status,
    StatusReply,
    Stop,
    Stopping,
    Subscribe,
    ToolResult,
    WaitRun,
    WorkflowInfo,
    WorkflowsReply,
)
from intloom.runtime.model import PendingAgentCall, RunView

__all__ = ["DEFAULT_REQUEST_TIMEOUT", "RUNS_PAGE_BYTES", "Client", "HelloFailed", "ServiceStarting",
           "ServiceUnlistened"]

# A request that waits for a Run (flow, answer, wait) may legitimately take a while.
DEFAULT_REQUEST_TIMEOUT: Final = 300.0
# The size of one page of `runs` (encoded views): small enough that the host builds it in a
# few milliseconds and holds little per request, large enough for ~1,000 ordinary Runs.
RUNS_PAGE_BYTES: Final = 1 << 20
# The longest one read of the socket sleeps before it returns to Python, where a pending
# Ctrl-C is raised: a SIGINT that lands just before the read's syscall begins (or is handled
# on another thread) does not interrupt it, and a wait on a Run in a long Step sat on until
# the host replied. Longer waits are read in slices of this (recv_frame's ``patience``).
_SIGNAL_SLICE: Final = 0.25

# How long a broken stream's check that its host still serves (``_cut_by_host``) may take:
# a host that is gone refuses at once; a hung one is not waited for.
_PROBE: Final = 2.0

_R = TypeVar("_R")
_T = TypeVar("_T")


# Why a Client has no connection once the program closed it.
_CLOSED_HERE: Final = "it was closed (Client.close, or the end of its with block)"


def _nothing_sent(failed: IntloomError) -> str:
    """" Nothing was sent." after a failed connect's own message, unless that says it
    already (a host's CLI_SERVICE_CLOSING does): the sentence came twice in a row."""
    return "" if "nothing was sent" in failed.message.lower() else " Nothing was sent."


def _metadata_invalid(fact: str) -> IntloomError:
    """CLI_SERVICE_METADATA_INVALID: ``fact`` (its sentences, each ending in a period), and
    to run intloom doctor (which says ``fact`` alone: ``IntloomError.here``)."""
    return IntloomError("CLI_SERVICE_METADATA_INVALID", f"{fact} Run intloom doctor.",
                        here=fact)


class NotThisProjectsHost(IntloomError):
    """CLI_SERVICE_METADATA_INVALID: service.json names a live pid that does not hold the
    project's OS lock. Nothing was sent to it; diagnosis judges the owners from the files."""


class ServiceStarting(IntloomError):
    """CLI_SERVICE_UNAVAILABLE, retryable: no host serves yet, as for CLI_SERVICE_OFFLINE,
    but one is in its start-up and will in a moment. Callers that launch or wait for a host
    (start, stop, status) treat it as offline; to a request it is a refusal to retry."""


class ServiceUnlistened(IntloomError):
    """CLI_SERVICE_CLOSING from the client itself: the host ``service.json`` names is alive,
    not paused, and its log says it is stopping, but its port refuses. Its stop closed the
    listener after suspending the Runs and now writes their snapshots, then removes its
    files. "Offline ... Connection refused. Run intloom status" was said of it. Callers
    that wait for a host to go (start, stop, status) tell it from the host's own refusal."""


def _unlistened(paths: ProjectPaths, info: ServiceInfo, port: int) -> ServiceUnlistened | None:
    """The error for a refused port whose host is on its way out; None for any other."""
    from intloom.client.hostlog import log_says_stopping  # a log search: this path only
    from intloom.host.liveness import paused

    if not log_says_stopping(paths, info) or paused(info.pid):
        return None
    return ServiceUnlistened(
        "CLI_SERVICE_CLOSING",
        unlistened_message(info.pid, port, "Nothing was sent. Run intloom start once it has "
                           "(intloom start waits for it), then this again."))


# How to connect again, in the words of both who meet a lost connection: a program (a new
# Client) and a person at the command line (each intloom command connects anew). "Connect
# again (Client.connect)" told a CLI user to write Python.
_AGAIN: Final = "Client.connect, or the intloom command again"


def _loop_blocked(paths: ProjectPaths, info: ServiceInfo) -> str | None:
    """Why the host gave no hello, when its log says its event loop is blocked now (an
    async Step that blocks, another thread holding the interpreter): "a hung, paused or
    busy host" sent the user looking."""
    from intloom.client.hostlog import loop_blocked  # a log search: this path only

    record = loop_blocked(paths, info)
    if record is None:
        return None
    # The host's own words (its cause and advice, host/loopwatch.py), not a copy of them.
    at, run, message = record.get("at"), record.get("runId"), record.get("message")
    held = (f"; its loop is held at {at}" + (f" (Run {run})" if isinstance(run, str) else "")
            if isinstance(at, str) else "")
    said = message if isinstance(message, str) else "Its event loop has run nothing."
    return (f"The host (pid {info.pid}) accepted the connection but answers no one. Its log "
            f"says at {record.get('time', '?')}{held} (loop_blocked): {said} Try again once "
            f"that returns; if it never does, intloom stop cannot reach the host either: "
            f"kill -9 {info.pid}, then intloom recover and intloom start (what was running "
            "is reported RUN_INTERRUPTED).")


class HelloFailed(IntloomError):
    """CLI_SERVICE_UNAVAILABLE: the listener on the port accepted the connection but the
    hello did not complete. ``cause`` is what happened (the listener closed, sent what is
    not a host's frame); None when no answer came in time. ``paused``: the pid of the host,
    when that is because a signal stopped it."""

    def __init__(self, message: str, cause: str | None, here: str | None = None,
                 paused: int | None = None) -> None:
        # No answer in time (a paused, blocked or busy host) may come later: retryable, as
        # the same host reached through a request's reconnect says (PROJECT_CONNECTION_FAILED,
        # retryable). A listener that answered as no host does (cause) will not.
        super().__init__("CLI_SERVICE_UNAVAILABLE", message, here=here,
                         retryable=cause is None)
        self.cause = cause
        self.paused = paused


# HelloFailed's cause when the port was another user's: no retry reaches the host there.
STRANGER: Final = "the listener is another user's"


def _stranger(sock: socket.socket, paths: ProjectPaths) -> str | None:
    """Why the other end of ``sock`` may not be sent the token, when it may not: a socket
    there (a listener on the port, the connection's end) belongs to another user than the
    project's (the owner of connection.json, where the token is), or neither could be found.
    None when they are the project user's, or when the kernel's tables cannot be read (no
    /proc: not checked, docs/security.md)."""
    from intloom.client.peer import owners

    try:
        owner = os.stat(paths.connection_json).st_uid
    except OSError:
        return "connection.json, where the token is, could not be examined"
    seen = owners(sock)
    if seen is None:
        return None
    others = sorted(uid for uid in seen.listeners if uid != owner)
    # Kernels before 6.17 show an end not yet accepted as root's: the listener then says.
    if seen.end is not None and seen.end != owner and (seen.end != 0 or not seen.listeners):
        others.append(seen.end)
    if others:
        return f"runs as another user (uid {others[0]}) than the project's (uid {owner})"
    if seen.end is None and not seen.listeners:
        return "is not in the kernel's tables of TCP sockets, so its user cannot be told"
    return None


_RECOVER_THEN_START: Final = ("Run intloom recover (intloom doctor says what it removes), "
                              "then intloom start.")


def _offline(paths: ProjectPaths, message: str | None, *,
             service_json_gone: bool = False) -> IntloomError:
    """CLI_SERVICE_OFFLINE with ``message``, unless a host holds the project in its start-up
    (``service.json`` is written last): "offline, run intloom start" was untrue there, and
    start would only wait for that host. ``service_json_gone``: the host service.json names
    is proven gone, so the file is a crashed host's, which a start replaces once it serves."""
    if not os.path.lexists(paths.service_lock):
        if service_json_gone and message is not None:
            message = f"{message} Run intloom status."
        return IntloomError("CLI_SERVICE_OFFLINE", _start_refused(paths, message))
    from intloom.host.liveness import starting_owner  # psutil: only on this failure path

    lock = starting_owner(paths, service_json_gone=service_json_gone)
    if lock is None:
        from intloom.host.liveness import gone_owner

        left = gone_owner(paths)
        if service_json_gone and message is not None:
            # The message names service.json's dead host. With the lock's owner proven gone
            # too (a kill -9), the way out is recover's, as status would say: "Run intloom
            # status" was one more command to reach it. Otherwise status says what holds it.
            then = (_RECOVER_THEN_START if left is not None else "Run intloom status.")
            return IntloomError("CLI_SERVICE_OFFLINE", _start_refused(paths, f"{message} {then}"))
        if left is None:  # an owner alive or unknown: start says what it is
            return IntloomError("CLI_SERVICE_OFFLINE", _start_refused(paths, message))
        # A host that died (in its start-up, say) left service.lock: the "Run intloom start"
        # of the other messages is refused with CLI_SERVICE_BUSY. Said as status says it.
        return IntloomError(
            "CLI_SERVICE_OFFLINE",
            _start_refused(paths, f"The project service is offline: its last host (pid "
                                  f"{left.pid}) has exited without removing "
                                  f"{paths.service_lock} (it was killed, or crashed), and "
                                  "intloom start refuses the project until that file is "
                                  f"removed (CLI_SERVICE_BUSY). {_RECOVER_THEN_START}"),
        )
    return ServiceStarting(
        "CLI_SERVICE_UNAVAILABLE",
        starting_message(lock.pid, lock.started_at, "Nothing was sent. Retry in a moment "
                         "(intloom start waits for it); if it stays starting, run intloom "
                         "doctor or intloom logs."),
        retryable=True,
    )


def _start_refused(paths: ProjectPaths, message: str | None) -> str | None:
    """``message`` (None: the catalogue's), followed, when the intloom start it suggests
    would refuse the project's intloom.toml, by why (the file, the line, the fix): "Run
    intloom start" alone sent people into that refusal. Only on the offline path."""
    try:
        load_config(paths.root)
    except IntloomError as invalid:
        said = message if message is not None else error_view("CLI_SERVICE_OFFLINE").message
        return f"{said} But intloom start refuses the project as it is: {invalid.message}"
    return message


def _token_refused(paths: ProjectPaths, port: int, info: ServiceInfo) -> IntloomError:
    """UNAUTHORIZED for a hello made with connection.json's token. The host listening on the
    port service.json names checked that pid alive, so it is the project's host; it compares
    with the token it read at its start. The token itself is never named."""
    return IntloomError(
        "UNAUTHORIZED",
        f"The host on port {port} (pid {info.pid}) refused the token in "
        f"{paths.connection_json}: the file no longer holds the token that host started "
        "with (it was edited or replaced while the host ran). Nothing was sent. Put back the "
        "connection.json that host wrote; or stop the host directly (kill -TERM "
        f"{info.pid}: a graceful stop) and run intloom start, which uses the file's token.",
    )


def _protocol_refused(info: ServiceInfo) -> IntloomError:
    """PROTOCOL_MISMATCH for a hello the host refused for this client's protocol: an
    intloom upgraded (or downgraded) while its host ran. The words of a host before 2026-12-02
    said to "restart the host with this version" without saying how, and this intloom's stop
    cannot do it: its hello is refused the same way. Said from the client's side, so the
    facts hold whatever the host's version."""
    from intloom import __version__

    theirs = (f"intloom {info.package_version}, " if info.package_version
              and info.package_version != __version__ else "")
    return IntloomError(
        "PROTOCOL_MISMATCH",
        f"The host running for this project (pid {info.pid}, {theirs}socket protocol "
        f"{info.protocol_version}) refused this intloom ({__version__}, socket protocol "
        f"{PROTOCOL}): it speaks another protocol. Nothing was sent, so this intloom cannot "
        "stop it either. Restart the host with this intloom: stop it with the intloom that "
        f"started it (intloom stop), or with kill -TERM {info.pid} (a graceful stop: its "
        "Runs are suspended at their last checkpoint), then run intloom start with this one.",
    )


def _unreachable_host(paths: ProjectPaths, root: Path) -> IntloomError | None:
    """connection.json missing while the host service.json names still runs and holds the
    project's OS lock: "offline, run intloom start" was a false fact, and that start only
    refused (CLI_SERVICE_BUSY). None in every other case (no host, one starting, one whose
    files only a copy of the project holds: its OS lock is on the original's file)."""
    try:
        info = read_service(paths.service_json, root)
    except IntloomError:
        return None  # an invalid service.json is doctor's to explain
    if info is None or _host_gone(info.pid, info.create_time, paths.service_lock) is not None:
        return None
    if os_lock(paths.service_lock)[0] != "held":
        return None  # never advise signalling a pid that does not hold this project
    # Its own way out, whoever reads it: not _metadata_invalid, whose "Run intloom doctor."
    # would follow the fix already given.
    return IntloomError(
        "CLI_SERVICE_METADATA_INVALID",
        f"{paths.connection_json} is missing, but the host {paths.service_json.name} names "
        f"(pid {info.pid}, port {info.port}) still runs and holds the project's lock: a "
        "client reads the host's port and token only from that file, so nothing can reach "
        "it. Nothing was sent. Put back the connection.json that host wrote; or stop the "
        f"host directly (kill -TERM {info.pid}: a graceful stop), then run intloom start, "
        "which writes a new one."
    )


def _not_this_projects(pid: int, lock: Path) -> bool:
    """Live ``pid`` provably does not hold this project: nobody holds the OS lock on
    ``lock`` (service.lock) and ``pid`` has no descriptor open on it (a host keeps both for
    its whole life), as doctor judges it. A free lock alone proves nothing (a file system
    whose locks other processes do not see, a lock file replaced under its host)."""
    if os_lock(lock)[0] != "free":
        return False
    from intloom.host.liveness import holds_open, unheld_lock  # psutil: only on this path

    identity = unheld_lock(lock)
    return identity is not None and holds_open(pid, identity) is False


def _host_gone(pid: int, create_time: float, lock: Path) -> str | None:
    """Why the host recorded as ``pid`` (created at ``create_time``) is provably gone, or
    None. Gone: no process has the pid, it is a zombie (an exited host its parent has not
    reaped yet), or it belongs to a process created at another time (the pid was reused)
    while nobody holds the OS lock on ``lock`` (``service.lock``). Anything unclear counts
    as alive: the hello's identity check then decides. Not ``intloom.host.liveness``: it
    imports psutil, which every client command would pay for at start-up. The create time
    is psutil's, derived the same way from ``/proc``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "which no longer exists (the host exited without cleaning up)"
    except PermissionError:
        # Another user's process: not a host of ours, but its create time, read below, is
        # what proves the pid reused. Taken for alive, it went unchecked, and the token was
        # kept from a squatter on the port only by the listener's owner check (/proc/net).
        pass
    except OSError:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rpartition(b") ")[2].split()
        if fields[:1] == [b"Z"]:
            # As doctor words it: the same process, seen a moment before or after its reaping.
            return ("which has exited (a zombie waiting to be reaped: the host exited without "
                    "cleaning up)")
        started = _boot_time() + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None
    # The boot time moves when the wall clock is stepped (NTP), and with it every create
    # time derived from it: a live host whose clock was stepped still holds its OS lock.
    if abs(started - create_time) > CREATE_TIME_TOLERANCE and os_lock(lock)[0] in (
            "absent", "free"):
        return ("which now belongs to another process (the host exited without cleaning up "
                "and its pid was reused)")
    return None


def _boot_time() -> float:
    """The boot time in /proc/stat, as psutil reads it for create times."""
    with open("/proc/stat", "rb") as fh:
        for line in fh:
            if line.startswith(b"btime "):
                return float(line.split()[1])
    raise ValueError("/proc/stat has no btime line")


def _examinable(root: Path) -> None:
    """CLI_PROJECT_INVALID for a ``root`` the OS refuses to look at (a name over 255 bytes,
    a path over 4,096, a loop of links), as the CLI says of it, rather than its
    ``connection.json`` being invalid: no file can be there to check."""
    try:
        os.stat(root)
    except FileNotFoundError:
        return
    except PermissionError as exc:
        # Not a question of what a project root is: the permissions on the way refuse it.
        refused = search_refused(root)
        if refused is None:
            raise IntloomError(
                "CLI_PROJECT_INVALID",
                f"{root} cannot be examined ({exc.strerror or exc}): a directory on the way "
                "to it refuses this user; check their permissions (ls -ld each). Nothing was "
                "sent.",
            ) from None
        raise IntloomError(
            "CLI_PROJECT_INVALID",
            f"{root} cannot be examined ({exc.strerror or exc}): {refused}. Nothing was sent.",
        ) from None
    except OSError as exc:
        raise IntloomError(
            "CLI_PROJECT_INVALID",
            f"{root} cannot be examined ({exc.strerror or exc}): Client.connect takes a "
            f"project's root, the directory that holds {CONFIG_NAME}. Nothing was sent.",
        ) from None


def resolved_root(root: object, caller: str) -> Path:
    """``root`` as an absolute path, or INVALID_REQUEST when it is no path at all: an unset
    variable (``os.environ.get``) raised a bare TypeError from Path()."""
    if not isinstance(os.fspath(root) if isinstance(root, os.PathLike) else root, str):
        raise IntloomError(
            "INVALID_REQUEST",
            f"{caller}({root!r}): the root is the path of a project's directory (the one "
            "holding intloom.toml), a str or a pathlib.Path, not "
            f"{type(root).__name__}. Nothing was sent.",
        )
    assert isinstance(root, str | os.PathLike)
    if (os.fspath(root) if isinstance(root, os.PathLike) else root) == "":
        # Path("") is ".": an unset variable (os.environ.get("ROOT", "")) reached the working
        # directory's project, where the CLI refuses an empty --project.
        raise IntloomError(
            "INVALID_REQUEST",
            f"{caller}(''): the root is an empty path (a variable that is unset or empty, "
            "say); pass the project's root directory, the one holding intloom.toml. Nothing "
            "was sent.",
        )
    if "\x00" in os.fspath(root):
        # No path holds one: the first system call raised a bare ValueError.
        raise IntloomError(
            "INVALID_REQUEST",
            f"{caller}({str(root)!r}): the root holds a NUL character, which no path can "
            "hold (a value read from a file or a C string, say); pass the project's root "
            "directory, the one holding intloom.toml. Nothing was sent.",
        )
    try:
        return Path(root).resolve()
    except OSError:
        # Only a relative root reaches the working directory, and only a removed one fails:
        # a bare FileNotFoundError named neither.
        gone = removed_working_directory(Path(root))
        raise IntloomError(
            "CLI_PROJECT_INVALID",
            f"{caller}({str(root)!r}): {gone or 'the root cannot be made absolute'}. Pass the "
            "project's root as an absolute path. Nothing was sent.",
        ) from None


def not_a_project(root: Path, caller: str = "Client.connect") -> IntloomError:
    """CLI_PROJECT_INVALID for a ``root`` without a config, with what the CLI says of it:
    that it does not exist, or the project it is inside (an Agent started in a Workflow's
    directory with ``Client.connect(".")``), whose root is the one to pass. A file (the
    config itself, most often) is named as one, with the directory it is in: reading
    ``.intloom/`` below it raised NotADirectoryError, or reported its metadata invalid."""
    if root.is_file():
        here = f" (here {root.parent})" if root.name == CONFIG_NAME else ""
        return IntloomError(
            "CLI_PROJECT_INVALID",
            f"{root} is a file, not a directory: {caller} takes the project's root, the "
            f"directory that holds {CONFIG_NAME}{here}. Nothing was sent.",
        )
    broken = config_not_a_file(root)
    if broken is not None:
        return IntloomError("CLI_PROJECT_INVALID", f"{broken} Nothing was sent.")
    exists = root.exists()
    around = enclosing(root) if exists else None
    fact = (f"has no {CONFIG_NAME}: it is inside the project {around}" if around is not None
            else f"has no {CONFIG_NAME}" if exists else "does not exist")
    fix = f": pass {around}" if around is not None else ""
    return IntloomError(
        "CLI_PROJECT_INVALID",
        f"{root} {fact}. {caller} takes a project's root, the directory that holds "
        f"{CONFIG_NAME}{fix}. Nothing was sent.",
    )


# The longest timeout a socket takes on every platform (a 32-bit time_t's, rounded down):
# 1e10 s passed the check and then raised a bare OverflowError from the first request.
MAX_SECONDS: Final = 1e9


def _check_seconds(name: str, value: object, what: str, other: str) -> None:
    """INVALID_REQUEST unless ``value`` is a finite number of seconds > 0: 0 made the socket
    non-blocking, so a reply not there at once read as a host that "may have stopped or
    crashed" (the request had been sent); a negative or NaN one raised ValueError."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            0 < value < float("inf")):
        raise IntloomError(
            "INVALID_REQUEST",
            f"Client.connect({name}={value!r}): {name} is {what}: a finite number > 0{other}. "
            "Nothing was sent.",
        )
    if value > MAX_SECONDS:
        raise IntloomError(
            "INVALID_REQUEST",
            f"Client.connect({name}={value!r}): {name} is {what}: at most {MAX_SECONDS:g} "
            f"(about 31 years; a socket takes no longer){other}. Nothing was sent.",
        )


# Test-only: caps the hello's bound of every Client.connect (seconds), as the host's
# INTLOOM_TEST_HELLO_TIMEOUT lowers its own.
HELLO_CAP_ENV: Final = "INTLOOM_TEST_CLIENT_HELLO_TIMEOUT"


def _paused(pid: int) -> bool:
    from intloom.host.liveness import paused  # psutil: only on this failure path

    return paused(pid)


def _on_hosts_loop(pid: int, what: str = "Client.connect was called"
                   ) -> IntloomError | None:
    """INVALID_REQUEST when this thread runs the event loop of the host ``pid`` itself (an
    async Step, Tool or on_complete connecting to its own project): the client blocks until
    the reply, which that loop alone could send, so every Run and the CLI stalled for the
    hello's timeout, then "a hung, paused or busy host ... run intloom doctor", a false
    lead. The same for each request (``what``) of a Client connected off the loop (a worker
    thread, ``asyncio.to_thread``) and then used on it: it waited out request_timeout.
    asyncio is only looked at in the host's process, which has imported it."""
    if pid != os.getpid() or "asyncio" not in sys.modules:
        return None
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop runs in this thread: a worker thread's Step or Tool
        return None
    return IntloomError(
        "INVALID_REQUEST",
        f"{what} on the event loop of this project's host (pid {pid}), from an async "
        "Step, Tool or on_complete: the client blocks until the host replies, "
        "and the host cannot reply while its loop waits, so every Run would stall. Nothing "
        "was sent. Make that function a plain def (sync Steps, Tools and on_complete run on "
        "a worker thread), or call the client there with await asyncio.to_thread(...).",
    )


# What a Step waiting for its own Run would have got, per call.
_SELF_WAIT: Final = {
    "wait_run": "the request would only have waited out the client's request_timeout and "
                "failed",
    "subscribe": "its stream, which has no timeout between events, would never have reached "
                 "its final event and the Run would have hung until the host stopped",
}


def _waits_for_itself(pid: int, run_id: str, call: str) -> IntloomError | None:
    """STEP_INTERACTION_INVALID when the code asking to wait for Run ``run_id`` (``call``:
    ``wait_run``, ``subscribe``) is that Run's own Step (initialiser, ``recover``), run by
    the host ``pid`` in this process: the Run neither waits nor ends before that code
    returns, so ``wait_run`` waited out ``request_timeout`` and then failed, naming a host
    that might be hung, and ``subscribe`` hung the Run until the host stopped. The host
    cannot tell (a request does not say what sent it), so the client looks, in the host's
    process only, and only at the code on this thread's stack (a thread the Step started is
    not)."""
    if pid != os.getpid():
        return None
    context = sys.modules.get("intloom.authoring.context")
    if context is None:  # not imported: no Step has run in this process
        return None
    ctx = context.running_here()
    if ctx is None or ctx.run_id != run_id:
        return None
    return IntloomError(
        "STEP_INTERACTION_INVALID",
        f"{ctx.where} called {call}({run_id!r}) on its own Run: a Step cannot wait for "
        f"its own Run, which neither waits nor ends until that code returns, so "
        f"{_SELF_WAIT[call]}. Nothing was sent. Return the Step's outcome and let the Run "
        f"go on; wait for the Run from outside it (intloom attach {run_id}, or a client in "
        "another program).",
    )


def _hello_cap() -> float | None:
    """``HELLO_CAP_ENV`` as seconds; a value that is no positive number is ignored (a
    timeout of 0 would make the socket non-blocking, and a test hook must not fail a CLI)."""
    try:
        cap = float(os.environ.get(HELLO_CAP_ENV) or "nan")
    except ValueError:
        return None
    return cap if cap > 0 else None  # NaN compares False


def _dial(port: int, timeout: float) -> socket.socket:
    """A TCP connection to 127.0.0.1:``port``. A literal address needs no resolver, and
    ``create_connection`` would run it through ``getaddrinfo``, which imports the idna codec
    (~1 ms of every CLI command)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(("127.0.0.1", port))
    except BaseException:
        sock.close()
        raise
    return sock


def _raise_reply(reply: ErrorReply) -> IntloomError:
    view = reply.error
    return IntloomError(view.code, view.message, retryable=view.retryable)


# What a request is, in the words of the command that sent it (PROJECT_REQUEST_FAILED).
_REQUEST_WORDS: Final = {
    "Status": "the status request", "Stop": "the stop request",
    "ListWorkflows": "the list of Workflows", "CreateRun": "the new Run",
    "GetRun": "reading the Run", "WaitRun": "waiting on the Run", "ListRuns": "the list of Runs",
    "Answer": "the answer", "Cancel": "the cancel", "Subscribe": "following the Run",
    "ClaimAgentCall": "the Agent task's claim", "CallTool": "the Tool call",
    "CompleteAgentCall": "the Agent task's completion", "FailAgentCall": "the Agent task's failure",
}


# Requests that change nothing in the host: one whose reply was lost is safe to send again.
_READS: Final = frozenset({"Status", "ListWorkflows", "GetRun", "WaitRun", "ListRuns",
                           "Subscribe"})


class _Reset(Exception):
    """The host reset the connection before it read the request (``Client._call``)."""


def _waits_on_a_run(request: Request) -> bool:
    """Whether the host replies only once a Run waits or ends (as long as its Steps take)."""
    if isinstance(request, CreateRun):
        return request.wait
    return isinstance(request, (WaitRun, Answer, CompleteAgentCall))


def _peer_closed(sock: socket.socket) -> bool:
    """True when the host has closed ``sock`` (an end of file is waiting in it): checked
    before a request is sent, when sending nothing is still safe to repeat."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def _tool_cut(request: CallTool, why: str) -> IntloomError:
    """A Tool call whose reply will not come (its connection broke, or the program closed its
    Client): "check with get_run before retrying" pointed to a view that shows no Tool
    calls, when the receipt makes the same call safe to send again. ``why`` ends with what
    to do first."""
    return IntloomError(
        "PROJECT_REQUEST_FAILED",
        f"No reply came for Tool call {request.tool_call_id} (Tool {request.tool!r}) of Agent "
        f"task {request.call_id} (Run {request.run_id}): {why}. The Tool may have run, or "
        "still run. Sending the same call again (the same tool_call_id, Tool and input) is "
        "safe: while the host that took it serves, it is BUSY while the Tool runs, then "
        "returns its output without running it again; a host started since holds no "
        "receipts, and refuses it (the task came back RUN_INTERRUPTED).",
        retryable=True,  # the same call again is answered by its receipt, or refused
    )


def _agent_end_cut(request: CompleteAgentCall | FailAgentCall, why: str) -> IntloomError:
    """A completion or failure of an Agent task whose reply will not come: "It was not
    replayed, since the host may have acted on it ... check with intloom attach before
    retrying" left the Agent unsure whether sending it again could complete the task twice,
    when the host answers the same one again with the first one's outcome (as
    ``_completion_outwaited`` says). ``why`` ends with what to do first."""
    if isinstance(request, CompleteAgentCall):
        what = f"the completion of Agent task {request.call_id}"
        same = "the same completion again (the same outcome and output)"
        ran = ("Its on_complete, or the Steps its outcome leads to, may have run, or still "
               "run. ")
        answer = ("it waits for the first one, then returns the Run's view; the task is not "
                  "completed twice")
    else:
        what = f"giving up Agent task {request.call_id}"
        same = "the same failure again (the same message)"
        ran = ""
        answer = "it returns the Run's view; the task is not failed twice"
    return IntloomError(
        "PROJECT_REQUEST_FAILED",
        f"No reply came for {what} (Run {request.run_id}): {why}. {ran}Sending {same} is "
        f"safe: while the host that took it serves, {answer}; a host started since refuses "
        "it and says what became of the task.",
        retryable=True,  # the same end again is answered by the first one, or refused
    )


class Client:
    """A verified, authenticated connection to a project's host.

    ``Client.connect(root)`` reads ``connection.json`` and ``service.json`` strictly, connects
    to 127.0.0.1 at the saved port, sends the hello with the token and checks the reply's
    instanceId, pid and projectRoot against ``service.json``. Errors are ``IntloomError``s:
    CLI_SERVICE_OFFLINE, CLI_SERVICE_METADATA_INVALID, CLI_SERVICE_CLOSING, ... A host in its
    start-up is ``ServiceStarting`` (CLI_SERVICE_UNAVAILABLE, retryable): retry in a moment.

    A request whose connection breaks before its reply is ``PROJECT_REQUEST_FAILED`` and is
    never sent again: the host may have acted on it, so query the Run before retrying. A
    request it cannot encode (an integer beyond 64 bits, text that is not UTF-8, a value that
    is not plain data, over 4 MiB), or an argument of the wrong type (``wait="no"``,
    ``runs(3)``), is ``INVALID_REQUEST`` naming the value; nothing is sent.

    Every method blocks until its reply: from asyncio code, call it with
    ``await asyncio.to_thread(...)`` (on the host's own loop, ``connect`` is refused).

    One connection, one request at a time: threads sharing a Client take turns; a process
    forked after ``connect`` connects again at its first request. A request
    interrupted before its reply (Ctrl-C), or given none within ``request_timeout``, closes
    the connection, as its reply may still come; the next request connects again and the
    interrupted one is never resent. While
    ``subscribe`` streams, the connection is the stream's, and any other request on it is
    refused (``INVALID_REQUEST``): use a second Client for requests meanwhile.
    """

    hello: HelloOk
    info: ServiceInfo

    def __init__(self, sock: socket.socket, hello: HelloOk, info: ServiceInfo, root: Path,
                 *, request_timeout: float | None, connect_timeout: float = 5.0) -> None:
        self._sock: socket.socket | None = sock
        # A reply is only ever matched to its request by order: two threads sending at once
        # took each other's replies (another Run's view, with no error).
        self._turn = threading.Lock()
        # The process whose connection ``_sock`` is (``_adopted``).
        self._pid = os.getpid()
        self._streaming: str | None = None  # the Run whose events hold the connection
        # Why the connection is gone (said by the next request), and whether the next
        # request may connect again: after a stream closed early, or a request given up on
        # (interrupted, timed out) and never resent -- never after a broken request, whose
        # host may be gone.
        self._closed_why = "it was closed (Client.close, or the end of its with block)"
        self._reopen = False
        # close() was called: final, whatever a request in another thread then finds (a
        # reconnect that failed or a stream cut must not make the Client usable again).
        self._closed_by_program = False
        self.hello = hello
        self.info = info
        self.root = root
        self.request_timeout = request_timeout
        # The hello's bound (``connect(timeout=...)``), kept for connecting again: a caller
        # with a deadline (stop --timeout) lowers it with request_timeout.
        self.connect_timeout = connect_timeout

    @classmethod
    def connect(
        cls,
        root: str | os.PathLike[str],
        *,
        timeout: float = 5.0,
        request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT,
    ) -> Client:
        """The verified connection to the host of the project at ``root`` (see the class).
        ``timeout``: seconds for the connection and hello; ``request_timeout``: seconds each
        request waits for its reply (None: as long as its Run takes)."""
        _check_seconds("timeout", timeout, "the seconds the hello may take", "")
        if request_timeout is not None:
            _check_seconds("request_timeout", request_timeout,
                           "the seconds a request waits for its reply",
                           ", or None to wait as long as its Run takes")
        root = resolved_root(root, "Client.connect")
        _examinable(root)  # a root the OS will not look at is no project: say that
        if root.is_file():
            # intloom.toml itself, most often: reading .intloom/ below a file would report
            # its metadata as invalid, a false fact.
            raise not_a_project(root)
        paths = ProjectPaths(root)
        if os.path.lexists(paths.state):
            try:
                check_private_dir(paths.state)  # never read metadata through a link
            except PrivacyError as exc:
                raise privacy_invalid(exc) from None
        conn = read_connection(paths.connection_json, root)
        if conn is None:
            if not (root / CONFIG_NAME).is_file():
                # Not a project (a subdirectory, a typo): "offline" would be a false fact.
                raise not_a_project(root)
            unreachable = _unreachable_host(paths, root)
            if unreachable is not None:
                raise unreachable
            raise _offline(paths, "Run intloom start in this project first.")
        info = read_service(paths.service_json, root)
        if info is None:
            raise _offline(paths, None)
        if info.port != conn.port:
            fact = (f"{paths.service_json} names port {info.port} but {paths.connection_json} "
                    f"names {conn.port}. Nothing was sent")
            raise IntloomError("CLI_SERVICE_METADATA_INVALID", f"{fact}; run intloom doctor.",
                               here=f"{fact}.")
        blocked = _on_hosts_loop(info.pid)
        if blocked is not None:
            raise blocked
        gone = _host_gone(info.pid, info.create_time, paths.service_lock)
        if gone is not None:
            # The host died without cleaning up (a crash): whatever listens on its port now
            # is not it, and must not be handed the token. A start may be under way over its
            # file: "offline ... Run intloom status" for the whole start-up was untrue.
            raise _offline(
                paths,
                f"The local service is unavailable: {paths.service_json.name} names pid "
                f"{info.pid}, {gone}. Nothing was sent.",
                service_json_gone=True,
            )
        if _not_this_projects(info.pid, paths.service_lock):
            # A live host holds its project's OS lock from before it writes service.json to
            # after it removes it. Free here, the pid is another directory's host: this
            # .intloom/ was copied from it, or the project moved while it ran and a copy was
            # put back in its place. Its hello named the same root, so every command here
            # acted on that other directory's Runs (a Run "created" here was journaled there).
            fact = (f"{paths.service_json} names the live pid {info.pid} (port {info.port}), "
                    f"but the OS lock on {paths.service_lock} is free, so that process is not "
                    "this project's host: most often it is the host of another copy of this "
                    "project (this .intloom/ was copied, or the project moved, while it ran). "
                    "Nothing was sent, the token included.")
            raise NotThisProjectsHost("CLI_SERVICE_METADATA_INVALID",
                                      f"{fact} Run intloom doctor.", here=fact)
        cap = _hello_cap()
        if cap is not None:
            # Tests against a paused host would otherwise wait out the whole bound per client.
            timeout = min(timeout, cap)
        try:
            sock = _dial(conn.port, timeout)
        except OSError as exc:
            if not from_socket(exc):
                raise  # a signal handler's (from_socket): the program's own
            unlistened = (_unlistened(paths, info, conn.port)
                          if isinstance(exc, ConnectionRefusedError) else None)
            if unlistened is not None:
                raise unlistened from None
            raise IntloomError(
                "CLI_SERVICE_OFFLINE",
                f"The local service at 127.0.0.1:{conn.port} is unavailable "
                f"({exc.strerror or type(exc).__name__}). Run intloom status.",
            ) from None
        stranger = _stranger(sock, paths)
        if stranger is not None:
            sock.close()
            fact = (f"Whatever listens on 127.0.0.1:{conn.port} {stranger}, so it may not be "
                    f"the host {paths.service_json.name} names (pid {info.pid}): a host "
                    "closes its port as its stop begins, and another program may take it. "
                    "Nothing was sent, the token included.")
            raise HelloFailed(f"{fact} Run intloom status: once the host has exited, intloom "
                              "start starts a new one on the port, or, if it is taken, "
                              "says so.", STRANGER, here=fact)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            send_frame(sock, Hello(protocol=PROTOCOL, token=conn.token, client="intloom-python"))
            sock.settimeout(min(_SIGNAL_SLICE, timeout))
            reply = decode_response(recv_frame(sock, patience=timeout))
        except (OSError, FrameClosed, FrameError) as exc:
            sock.close()
            if isinstance(exc, OSError) and not from_socket(exc):
                raise
            if isinstance(exc, TimeoutError) and _paused(info.pid):
                # Which of "hung, paused or busy" it is can be read: say it, and the fix.
                fact = (f"The host (pid {info.pid}) is stopped by a signal (SIGSTOP, Ctrl-Z or "
                        f"a debugger): it accepted the connection on 127.0.0.1:{conn.port} "
                        "but cannot answer until it is resumed.")
                raise HelloFailed(f"{fact} Resume it with kill -CONT {info.pid}, then try "
                                  "again.", None, here=fact, paused=info.pid) from None
            held = _loop_blocked(paths, info) if isinstance(exc, TimeoutError) else None
            if held is not None:
                raise HelloFailed(held, None, here=held) from None
            # Closed unanswered by a host whose stop began meanwhile (it reads no hello once
            # its listener is closed): "a hung, paused or busy host, or another program on
            # the port", and doctor, were the advice, as a refused port's once was. Closed
            # with the hello unread, the connection is reset rather than ended.
            closing = (_unlistened(paths, info, conn.port)
                       if isinstance(exc, FrameClosed | ConnectionResetError) else None)
            if closing is not None:
                raise closing from None
            fact = (f"The service at 127.0.0.1:{conn.port} did not complete the hello "
                    f"({exc}): whatever listens there accepted the connection but did not "
                    "answer as this project's host (a hung, paused or busy host, or another "
                    "program on the port).")
            raise HelloFailed(
                f"{fact} Run intloom doctor to see which process owns the project.",
                None if isinstance(exc, TimeoutError) else str(exc),
                here=f"{fact} The checks below say which process owns the project.",
            ) from None
        except BaseException:
            sock.close()
            raise
        if isinstance(reply, ErrorReply):
            sock.close()
            if reply.error.code == "UNAUTHORIZED":
                # The host's own words tell a client to read the token from connection.json,
                # which is what this one did: the fact is that the file changed under the host.
                raise _token_refused(paths, conn.port, info)
            if (reply.error.code == "PROTOCOL_MISMATCH"
                    and info.protocol_version != PROTOCOL):
                # Else the files do not say which protocol the host speaks: its words do.
                raise _protocol_refused(info)
            raise _raise_reply(reply)
        if not isinstance(reply, HelloOk):
            sock.close()
            raise IntloomError("PROJECT_RESPONSE_INVALID",
                               f"The service answered the hello with {type(reply).__name__}.")
        if (reply.instance_id, reply.pid, reply.project_root) != (
            info.instance_id, info.pid, info.project_root
        ):
            sock.close()
            raise _metadata_invalid(
                "The listening service does not match the saved project identity "
                f"(it is instance {reply.instance_id}, pid {reply.pid}; service.json names "
                f"{info.instance_id}, pid {info.pid})."
            )
        return cls(sock, reply, info, root, request_timeout=request_timeout,
                   connect_timeout=timeout)

    def close(self) -> None:
        """Close the connection; a later request on this Client is refused."""
        self._closed_by_program = True
        self._shut(_CLOSED_HERE)

    def _shut(self, why: str, *, reopen: bool = False) -> None:
        sock, self._sock = self._sock, None
        if self._closed_by_program:
            why, reopen = _CLOSED_HERE, False
        self._closed_why, self._reopen = why, reopen
        if sock is not None and self._pid != os.getpid():
            sock.close()  # a forked child's copy: a shutdown would cut the parent's too
        elif sock is not None:
            # A request another thread waits on would not notice a bare close (the kernel
            # keeps the socket open under a blocked recv) and waited for its reply anyway,
            # to blame the host: the shutdown ends that wait at once.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- transport -----------------------------------------------------------------------

    def _broken(self, request: Request, fact: str, *, timed_out: bool = False,
                stream: bool = False) -> IntloomError:
        error = self._broken_error(request, fact, timed_out=timed_out, stream=stream)
        if timed_out and type(error) is IntloomError and _paused(self.info.pid):
            # Which of "paused or hung" it is can be read, as the hello's timeout reads it.
            pid = self.info.pid
            note = (f"The host (pid {pid}) is stopped by a signal (SIGSTOP, Ctrl-Z or a "
                    f"debugger) and cannot reply until it is resumed: kill -CONT {pid}.")
            return IntloomError(error.code, f"{error.message} {note}",
                                retryable=error.retryable, here=f"{error.here} {note}")
        return error

    def _broken_error(self, request: Request, fact: str, *, timed_out: bool,
                      stream: bool) -> IntloomError:
        what = _REQUEST_WORDS.get(type(request).__name__, f"the {type(request).__name__} request")
        if self._sock is None and self._closed_by_program:
            return self._closed_meanwhile(request, what)
        if timed_out:
            # As after Ctrl-C (_interrupted): its reply may still come on this connection, so
            # it is closed, and the next request connects again, to the same host instance;
            # the one timed out is never resent. Shut for good, the Client refused the very
            # get_run, wait_run or runs() the timeout's message tells the program to send.
            limit = f"{self.request_timeout:g} s"
            self._shut(f"{what} got no reply within {limit} and was not sent again",
                       reopen=True)
        else:
            self._shut(f"its connection broke during an earlier request ({what})")
        if stream and isinstance(request, Subscribe):  # its events were being read
            cut = self._cut_by_host(request)
            if cut is not None:
                # The same host instance closed a read on purpose and nothing is in flight:
                # this Client connects again to it at its next request, as after a timeout
                # (it refused the very "subscribe again" its message advised).
                self._reopen = not self._closed_by_program
                return cut
        if timed_out and isinstance(request, CompleteAgentCall):
            return self._completion_outwaited(request)
        if timed_out and _waits_on_a_run(request):
            return self._outwaited(request, what)
        if timed_out and isinstance(request, CallTool):
            return self._tool_outwaited(request)
        cause = ("the host did not reply in time" if timed_out else
                 "the connection closed: the host may have stopped or crashed")
        # A FrameClosed's own words repeat the cause; only where it closed adds a fact.
        fact = fact.removeprefix(str(FrameClosed(clean=True))).strip()
        detail = f" ({fact})" if fact else ""
        if isinstance(request, CallTool):
            return _tool_cut(request, f"{cause}{detail}. Run intloom status")
        if isinstance(request, (CompleteAgentCall, FailAgentCall)):
            return _agent_end_cut(request, f"{cause}{detail}. Run intloom status")
        run_id = getattr(request, "run_id", None)
        if type(request).__name__ in _READS:
            # "The host may have acted on it" would send a person looking for an effect a
            # read cannot have had; it is still not resent here (the host may be gone).
            lead = f"No reply came for {what}"
            if stream and isinstance(request, Subscribe):
                # Its events came until the cut: "no reply came" was untrue.
                lead = f"The event stream of Run {run_id} ended before its final event"
                again = f"then subscribe again (intloom attach {run_id}) once a host runs"
            elif run_id:
                lead = f"{lead} (Run {run_id})"
                again = f"then intloom attach {run_id} once a host runs"
            else:
                again = "then run the command again once a host runs"
            return IntloomError(
                "PROJECT_REQUEST_FAILED",
                f"{lead}: {cause}{detail}. It only reads, so it is safe to send again: run "
                f"intloom status, {again}.",
                retryable=True,  # as it says: the catalogue's False is for a change's loss
            )
        if run_id:
            what = f"{what} (Run {run_id})"
            then = f"; once a host runs, check with intloom attach {run_id} before retrying"
        elif type(request).__name__ == "CreateRun":
            then = "; once a host runs, check with intloom runs before retrying"
        else:
            then = " before retrying"
        return IntloomError(
            "PROJECT_REQUEST_FAILED",
            f"No reply came for {what}: {cause}{detail}. It was not replayed, since the host "
            f"may have acted on it. Run intloom status{then}.",
        )

    def _cut_by_host(self, request: Subscribe) -> IntloomError | None:
        """A stream broken while its host instance still serves: that host closed it, which
        it does to a follower that left too many of its events unread (follower_too_slow),
        and the Run went on. "The host may have stopped or crashed" sent the program to wait
        for a host that ran all along. None when the host does not answer as the same
        instance (gone, stopping, another one): then the usual words hold."""
        try:
            probe = Client.connect(self.root, timeout=min(self.connect_timeout, _PROBE),
                                   request_timeout=_PROBE)
        except IntloomError:
            return None
        with probe:
            if probe.hello.instance_id != self.hello.instance_id:
                return None
        run_id = request.run_id
        return IntloomError(
            "PROJECT_REQUEST_FAILED",
            f"The event stream of Run {run_id} ended before its final event, and its host "
            f"(pid {self.hello.pid}) still serves: a host closes the stream of a follower "
            "that leaves too many of its events unread (its log then says "
            "follower_too_slow) and goes on with the Run. The events after the last one "
            f"received are missing here. Subscribe again (this Client connects again to that "
            f"host; or intloom attach {run_id}) to see its recent history, or intloom "
            f"inspect {run_id} for every record; read the events as they come to keep up.",
            retryable=True,  # a read, and the host that cut it still serves
        )

    def _closed_meanwhile(self, request: Request, what: str) -> IntloomError:
        """A request whose Client the program closed (from another thread) before its reply
        came: the host is not to blame, as "the host may have stopped or crashed" said."""
        run_id = getattr(request, "run_id", None)
        closed = ("this Client was closed (Client.close, or the end of its with block, in "
                  "another thread) while the request waited for its reply")
        if type(request).__name__ in _READS:
            # A watcher thread's wait_run or stream, ended by the program: "the host may have
            # acted on it ... before retrying" sent it looking for an effect a read never has.
            lead = (f"The event stream of Run {run_id} ended before its final event"
                    if isinstance(request, Subscribe) else
                    f"No reply came for {what}{f' (Run {run_id})' if run_id else ''}")
            return IntloomError(
                "PROJECT_REQUEST_FAILED",
                f"{lead}: {closed}. It only reads, so nothing changed: to go on, connect "
                "again (Client.connect) and send it again.",
                retryable=True,
            )
        if isinstance(request, CallTool):
            return _tool_cut(request, f"{closed}. Connect again (Client.connect)")
        if isinstance(request, (CompleteAgentCall, FailAgentCall)):
            return _agent_end_cut(request, f"{closed}. Connect again (Client.connect)")
        if run_id:
            what = f"{what} (Run {run_id})"
            check = f"check with get_run({run_id!r}) or intloom attach {run_id}"
        else:
            check = "check with intloom status and intloom runs"
        return IntloomError(
            "PROJECT_REQUEST_FAILED",
            f"No reply came for {what}: {closed}. It was not replayed, since the host may "
            "have acted on it; connect again "
            f"(Client.connect) and {check} before retrying.",
        )

    def _tool_outwaited(self, request: CallTool) -> IntloomError:
        """A Tool call past ``request_timeout``: the Tool may simply still run (a Run's view,
        which "check with intloom attach" pointed to, shows no Tool calls), and its receipt
        makes the same call safe to send again."""
        return IntloomError(
            "PROJECT_REQUEST_FAILED",
            f"No reply came for Tool call {request.tool_call_id} (Tool {request.tool!r}) of "
            f"Agent task {request.call_id} (Run {request.run_id}) within "
            f"{self.request_timeout:g} s. The Tool may still be running in the host (the "
            "request was not replayed); a host that is paused or hung gives no reply either "
            "(check with intloom status). Sending the same call again (the same "
            "tool_call_id, Tool and input) on a new connection (Client.connect) is safe: it is "
            "BUSY while the Tool runs, then returns its output without running it again. To "
            "wait as long as a Tool takes, connect with Client.connect(root, "
            "request_timeout=None).",
            retryable=True,  # the same call again is answered by its receipt
        )

    def _completion_outwaited(self, request: CompleteAgentCall) -> IntloomError:
        """A completion past ``request_timeout``: as for a Tool call, what helps the Agent is
        that the same completion is safe to send again (the generic advice, create_run with
        wait=False, is no request an Agent makes)."""
        return IntloomError(
            "PROJECT_REQUEST_FAILED",
            f"No reply came for the completion of Agent task {request.call_id} (Run "
            f"{request.run_id}) within {self.request_timeout:g} s. Its on_complete, or the "
            "Steps its outcome leads to, may still be running in the host (the request was "
            "not replayed); a host that is paused or hung gives no reply either (check with "
            "intloom status). Sending the same completion again (the same outcome and output) "
            "on a new connection (Client.connect) is safe: it waits for the first one, then "
            "returns the Run's view; the task is not completed twice. To wait as long as "
            "that takes, connect with Client.connect(root, request_timeout=None).",
            retryable=True,  # the same completion again waits for the first one
        )

    def _outwaited(self, request: Request, what: str) -> IntloomError:
        """A request that waits until its Run waits or ends, past ``request_timeout``. All
        the client knows is that no reply came: long Steps and a host that is paused, hung
        or gone look the same from here, so the message says both and how to tell."""
        limit = f"{self.request_timeout:g} s"
        # answer(wait=False) only where the host honours it: an older host waits anyway.
        if not isinstance(request, Answer):
            instead = ", or create Runs with create_run(..., wait=False) and then call wait_run"
        elif ANSWER_WAIT in self.hello.features:
            instead = ", or answer with answer(..., wait=False) and then call wait_run"
        else:
            instead = ""
        run_id = getattr(request, "run_id", None)
        if run_id:
            what = f"{what} (Run {run_id})"
            find = (f"Check with intloom status, then follow the Run with get_run or "
                    f"wait_run({run_id!r}), or intloom attach {run_id}")
        else:
            find = ("If it was created, its id never arrived: check with intloom status, "
                    "then find it with runs() or intloom runs before creating another, and "
                    "follow it with wait_run")
        return IntloomError(
            "PROJECT_REQUEST_FAILED",
            f"No reply came for {what} within {limit}. The request waits until the Run "
            "waits or ends, so if the host is running, the Run's Steps may still be going "
            "on there (the request was not replayed); a host that is paused or hung "
            f"gives no reply either. {find}. To wait as long as its Steps take, connect "
            f"with Client.connect(root, request_timeout=None){instead}.",
            # A wait_run only reads: sent again, it waits again (a broken connection's says
            # so). A create or an answer changed something, whose outcome is unknown.
            retryable=isinstance(request, WaitRun),
        )

    def _adopted(self) -> None:
        """In a process forked from the one that connected (a ``multiprocessing`` pool made
        after ``connect``): let go of the parent's connection and connect again, once.
        Parent and child read replies off the one socket, each taking the other's: another
        Run's view, with no error, until a frame read from the middle failed. Nothing of
        the child's is in flight on it; the parent's requests go on undisturbed."""
        if self._pid == os.getpid():
            return
        # The parent's threads may have held these at the fork: the child's copies would
        # stay held (a request in flight, a stream) with nobody to release them.
        self._turn = threading.Lock()
        self._streaming = None
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()  # this process's descriptor only; no shutdown, the parent's stays
            self._closed_why = (f"it was made in process {self._pid}, which this one "
                                f"(pid {os.getpid()}) was forked from")
            self._reopen = not self._closed_by_program
        self._pid = os.getpid()

    def _send(self, request: Request) -> socket.socket:
        sock = self._sock
        if sock is None and self._reopen:
            # Its stream was closed early (subscribe): nothing is in flight, so connecting
            # again is safe -- to the same host instance only.
            sock = self._reconnect(self._closed_why)
        elif sock is None:
            raise self._no_connection()
        frame = frame_of(request)
        if _peer_closed(sock):
            if self._sock is not sock:
                # Closed meanwhile (Client.close from another thread; _shut lets go of it
                # before closing it): the request connected again and was sent, and the
                # Client the program had closed served on.
                raise self._no_connection()
            # The host closed this connection while it sat idle (lifecycle.md: idle
            # connections close after 600 s) or as it stopped. Nothing is sent yet, so
            # connecting again is safe -- to the same host instance only.
            sock = self._reconnect("the host closed it")
        try:
            sock.settimeout(self.request_timeout)
            sock.sendall(frame)
        except (ConnectionResetError, BrokenPipeError):
            raise self._reset(request) from None
        except OSError as exc:
            if not from_socket(exc):
                raise  # a signal handler's (from_socket): the program's, as Ctrl-C is
            raise self._broken(request, str(exc)) from None
        return sock

    def _reset(self, request: Request) -> _Reset:
        """A host resets a connection only as it closes it with bytes of it unread (a
        request that came as it stopped, or as it exited): one that had read the request
        whole has nothing unread, and its close is an end of file. So nothing was done,
        and, as for a connection it closed while idle, connecting again is safe -- to the
        same host instance only."""
        what = _REQUEST_WORDS.get(type(request).__name__, f"the {type(request).__name__} request")
        # "the request for": a request's words may be a verb's ("reading the Run"), and
        # "without reading reading the Run" was said.
        self._shut(f"the host reset it without reading the request for {what}: nothing was "
                   "done", reopen=True)
        return _Reset()

    def _reset_again(self, request: Request) -> IntloomError:
        what = _REQUEST_WORDS.get(type(request).__name__, f"the {type(request).__name__} request")
        return IntloomError(
            "PROJECT_CONNECTION_FAILED",
            f"The host reset the connection without reading the request for {what}, then "
            "did so again on a new connection: nothing was done. Run intloom status, then "
            "send it again once the host serves.", retryable=False)

    def _no_connection(self) -> IntloomError:
        return IntloomError(
            "PROJECT_CONNECTION_FAILED",
            f"This Client has no connection: {self._closed_why}. Nothing was sent. "
            f"Connect again ({_AGAIN}).", retryable=False)

    def _reconnect_failed(self, why: str, exc: IntloomError) -> IntloomError:
        self._shut(f"{why}, and connecting again failed")
        # The connection is lost either way: say so, with why connecting again failed.
        # That error stays its cause, for a caller to tell a host shutting down
        # (CLI_SERVICE_CLOSING) from one gone without parsing the words. Its fix alone
        # (intloom start) left a program retrying on this Client, refused again.
        return IntloomError(
            "PROJECT_CONNECTION_FAILED",
            f"This client's connection is gone ({why}), and connecting again failed "
            f"({exc.code}: {exc.message}){_nothing_sent(exc)} This Client stays closed: "
            f"once a host serves, connect again ({_AGAIN}) and send it there.",
            retryable=False,
        )

    def _reconnect(self, why: str) -> socket.socket:
        # Still safe to connect again until it fails: a Ctrl-C during this connect (a busy
        # host slow to answer the hello) left the Client shut for good, "connecting again
        # failed", though nothing was in flight.
        self._shut(why, reopen=True)
        try:
            fresh = Client.connect(self.root, timeout=self.connect_timeout,
                                   request_timeout=self.request_timeout)
        except HelloFailed as exc:
            if exc.cause == STRANGER:  # not a host that may answer later: as any failure
                raise self._reconnect_failed(why, exc) from exc
            # A listener that took the connection and did not answer the hello (a host paused
            # by a signal, or too busy): that same host may serve again, and nothing is in
            # flight, so this Client stays free to connect again; "stays closed" lost it for
            # good, after a kill -CONT its own message advised.
            self._shut(why, reopen=True)
            if self._closed_by_program:  # close() from another thread meanwhile
                raise self._no_connection() from None
            raise IntloomError(
                "PROJECT_CONNECTION_FAILED",
                f"This client's connection is gone ({why}), and connecting again failed "
                f"({exc.code}: {exc.message}){_nothing_sent(exc)} This Client connects again "
                "at its next request, to the same host instance only: send it again once "
                "that host answers.",
                retryable=True,
            ) from exc
        except IntloomError as exc:
            raise self._reconnect_failed(why, exc) from exc
        if fresh.hello.instance_id != self.hello.instance_id:
            fresh.close()
            # Said by every later request too: "connecting again failed" sent a program
            # looking for a host that was not there, when another one serves.
            self._shut(f"{why}; the host this client was connected to (instance "
                       f"{self.hello.instance_id}) has stopped, and another one (instance "
                       f"{fresh.hello.instance_id}) runs the project now")
            raise IntloomError(
                "PROJECT_CONNECTION_FAILED",
                f"The host this client was connected to (instance {self.hello.instance_id}) "
                f"has stopped, and another one (instance {fresh.hello.instance_id}) runs the "
                f"project now. Nothing was sent. Connect again ({_AGAIN}); a Run's claims and "
                "waits from the old host may be interrupted (check with get_run, or intloom "
                "attach RUN).",
                retryable=False,
            )
        sock = self._sock = fresh._sock
        fresh._sock = None
        assert sock is not None
        if self._closed_by_program:
            # close() from another thread while the hello waited: the Client took the new
            # socket anyway, sent the request and served on, and the socket was never
            # closed. Checked after taking it, so a close() at any point is honoured.
            self._shut(_CLOSED_HERE)
            raise self._no_connection()
        return sock

    def _receive(self, sock: socket.socket, request: Request, *,
                 stream: bool = False) -> Response:
        """The reply to ``request`` within ``request_timeout`` of the host's silence; a
        ``stream``'s next event with no bound (a Run may wait for a person for hours)."""
        patience = None if stream else self.request_timeout
        try:
            # Inside the try: another thread's close() may have closed the socket already
            # (EBADF here is that close, said as such by _broken).
            sock.settimeout(_SIGNAL_SLICE if patience is None
                            else min(_SIGNAL_SLICE, patience))
            reply = decode_response(recv_frame(sock, patience=patience))
        except ConnectionResetError:
            if stream or self._sock is not sock:
                raise self._broken(request, "the host reset the connection",
                                   stream=stream) from None
            raise self._reset(request) from None
        except TimeoutError as exc:
            if not from_socket(exc):
                raise  # a signal handler's: the program's own deadline (_interrupted)
            raise self._broken(request, f"no reply within {self.request_timeout} s",
                               timed_out=True) from None
        except (OSError, FrameClosed) as exc:
            if isinstance(exc, OSError) and not from_socket(exc):
                raise
            raise self._broken(request, str(exc), stream=stream) from None
        except FrameError as exc:
            self._shut("the host's reply to an earlier request was not a valid frame")
            raise IntloomError("PROJECT_RESPONSE_INVALID", f"{exc}.") from None
        if isinstance(reply, ErrorReply):
            raise _raise_reply(reply)
        return reply

    def _interrupted(self, request: Request, exc: BaseException) -> None:
        """A request interrupted before its reply came (Ctrl-C, in a terminal or a notebook):
        its reply, or the rest of its frame, may still come on this connection, and the next
        request would have read it as its own (get_run of one Run answered with another's
        view). The connection is closed; the next request connects again, to the same host
        instance only, and the interrupted one is never sent again."""
        if self._sock is None:
            return
        what = _REQUEST_WORDS.get(type(request).__name__, f"the {type(request).__name__} request")
        run_id = getattr(request, "run_id", None)
        if run_id:
            what = f"{what} (Run {run_id})"
        self._shut(f"{what} was interrupted ({type(exc).__name__}) before its reply came, and "
                   "was not sent again", reopen=True)

    def _streaming_error(self) -> IntloomError:
        return IntloomError(
            "INVALID_REQUEST",
            f"This Client is streaming Run {self._streaming}'s events (subscribe) on its "
            "connection; a request sent on it now would be mixed with them. Nothing was "
            "sent. Use a second Client (Client.connect) for requests while a stream runs; "
            "or, done with the stream, close its generator (events.close()): a break out of a "
            "loop over a generator kept in a variable leaves it open.",
        )

    def _once(self, request: Request, act: Callable[[], _T]) -> _T:
        """``act`` (``request`` sent, and its reply read where it has one). A reset means
        not read, so not acted on: it is tried again once, on a new connection to the same
        host instance (a stopping host refuses its hello: the error is CLI_SERVICE_CLOSING's,
        "Nothing was sent"). An interruption (Ctrl-C) closes the connection, whose reply may
        still come (``_interrupted``)."""
        try:
            try:
                return act()
            except _Reset:
                try:
                    return act()
                except _Reset:
                    raise self._reset_again(request) from None
        except IntloomError:
            raise
        except BaseException as exc:
            self._interrupted(request, exc)
            raise

    def _call(self, request: Request, expect: type[_R]) -> _R:
        blocked = _on_hosts_loop(self.info.pid,
                                 f"A {type(request).__name__} request was made through a Client")
        if blocked is not None:
            raise blocked
        self._adopted()
        with self._turn:
            if self._streaming is not None:
                raise self._streaming_error()
            reply = self._once(request, lambda: self._receive(self._send(request), request))
        if not isinstance(reply, expect):
            self._shut(f"the host answered an earlier request ({type(request).__name__}) "
                       f"with {a_an(type(reply).__name__)}")
            raise IntloomError(
                "PROJECT_RESPONSE_INVALID",
                f"The service answered {type(request).__name__} with {type(reply).__name__}.",
            )
        return reply

    # ----- requests ------------------------------------------------------------------------

    def status(self) -> ServiceView:
        """The host's ``ServiceView`` (``intloom status``)."""
        return self._call(Status(), StatusReply).service

    def stop(self, instance_id: str) -> bool:
        """Ask the host ``instance_id`` (``client.hello.instance_id``) to stop; True once it
        is stopping. It may still be releasing its files: ``intloom stop`` waits for that."""
        return self.stop_reply(instance_id).stopping

    def stop_reply(self, instance_id: str) -> Stopping:
        """``stop``'s whole reply: ``within`` says how many seconds the host's stop may take
        (None from a host older than it)."""
        return self._call(Stop(instance_id=instance_id), Stopping)

    def workflows(self) -> list[WorkflowInfo]:
        """The Workflow sources the host loaded, and those that failed (``intloom flows``)."""
        return self._call(ListWorkflows(), WorkflowsReply).workflows

    def create_run(self, workflow: str, intent: str, *, wait: bool = True) -> RunView:
        """Start a Run of ``workflow``; its view once it is not running (``wait``), else at
        once."""
        return self._call(CreateRun(workflow=workflow, intent=intent, wait=wait), RunReply).run

    def get_run(self, run_id: str) -> RunView:
        """The Run's view now."""
        return self._call(GetRun(run_id=run_id), RunReply).run

    def wait_run(self, run_id: str) -> RunView:
        """The Run's view once it is not running (waiting, completed or failed)."""
        itself = _waits_for_itself(self.info.pid, run_id, "wait_run")
        if itself is not None:
            raise itself
        return self._call(WaitRun(run_id=run_id), RunReply).run

    def runs(self, flow: str | None = None) -> list[RunView]:
        """Every Run of the host (of ``flow``), fetched in pages of about ``RUNS_PAGE_BYTES``
        so that no number of Runs makes a reply too large for a frame. Each view is as of
        the moment its page was read; a Run created meanwhile comes last.

        ``flow`` naming a Workflow the host did not load (a typo, or one whose source failed
        to load), with no Runs, is ``NOT_FOUND``: an empty list would say it is loaded and
        idle (a typo would look like no work)."""
        found: list[RunView] = []
        after = 0
        while True:
            reply = self._call(
                ListRuns(flow=flow, page_bytes=RUNS_PAGE_BYTES, after=after), RunsReply)
            found.extend(reply.runs)
            if reply.next_after <= after:  # 0: the last page (and never go backwards)
                break
            after = reply.next_after
        # The host filters by name only and answers [] for any name it does not know: the
        # check is the client's, so the protocol is unchanged and every caller gets it.
        if flow is None or found:
            return found
        infos = self.workflows()
        # A source that failed to load is listed under its path, which for a package is
        # often the very name of the Workflow it defines ("triage"): it is not loaded.
        if flow in {w.name for w in infos if w.ready}:
            return found
        failed = [w.source for w in infos if not w.ready]
        hint = (f" {len(failed)} Workflow source(s) failed to load and may define it: "
                f"{', '.join(failed)} (intloom flows says why; fix the source, then intloom "
                "stop and intloom start)." if failed else "")
        raise IntloomError(
            "NOT_FOUND",
            f"Workflow {quoted(flow)!r} is not loaded by this host, so it has no Runs here. "
            f"intloom flows lists the loaded Workflows.{hint}",
        )

    def answer(self, run_id: str, action_id: str, answer: Any, *,
               wait: bool = True) -> RunView:
        """Answer the Run's pending action ``action_id`` (a confirmation's
        ``{"isConfirmed": bool}``, or one entry per question); the view once the Run is not
        running (``wait``), else once the answer is durable (then ``wait_run``: Steps that
        follow an answer may take longer than ``request_timeout``)."""
        return self._call(Answer(run_id=run_id, action_id=action_id, answer=answer, wait=wait),
                          RunReply).run

    def cancel(self, run_id: str) -> tuple[RunView, bool]:
        """Cancel the Run: its view, and whether it had already ended, so that the cancel
        changed nothing. A Run restored as failed/RUN_INTERRUPTED has not: its cancel records
        that it was dismissed (False), and a repeat returns the same view and False."""
        reply = self._call(Cancel(run_id=run_id), RunReply)
        return reply.run, reply.already_ended

    def subscribe(self, run_id: str) -> Generator[RunEvent, None, None]:
        """History, then live events, until one has ``final=True``. No timeout between events.

        Closing the iterator early closes the connection: a stream cannot be abandoned half
        way and the connection reused.
        """
        itself = _waits_for_itself(self.info.pid, run_id, "subscribe")
        if itself is not None:
            raise itself
        request = Subscribe(run_id=run_id)
        self._adopted()
        sock: socket.socket | None = None
        mine = False  # this stream holds ``_streaming``: cleared however it ends
        try:
            with self._turn:
                if self._streaming is not None:
                    raise self._streaming_error()
                mine = True
                # Ctrl-C once the request may have gone: its events may come on this
                # connection, and the next request would have read them as its reply.
                sock = self._once(request, lambda: self._send(request))
                self._streaming = run_id
            while True:
                event = self._receive(sock, request, stream=True)
                if not isinstance(event, RunEvent):
                    raise IntloomError("PROJECT_RESPONSE_INVALID",
                                       f"The service streamed {a_an(type(event).__name__)}.")
                yield event
                if event.final:
                    return
        except BaseException as exc:
            # A stream cannot be abandoned half way and its connection reused (events may be
            # on their way): this one is closed, and the next request connects again. Not
            # only a closed generator: Ctrl-C in the wait for the next event leaves a
            # half-read frame too. Only while the stream still owns the Client's socket: a
            # Client the program closed (or one whose request broke) stays as it is.
            if sock is not None and self._sock is sock:
                how = ("closed" if isinstance(exc, GeneratorExit)
                       else f"interrupted ({type(exc).__name__})")
                self._shut(f"its subscribe stream was {how} before its final event",
                           reopen=True)
            raise
        finally:
            if mine:
                self._streaming = None

    def claim_agent_call(
        self, run_id: str, call_id: str, claim_id: str
    ) -> tuple[str, PendingAgentCall]:
        """Claim the Agent task ``call_id`` as ``claim_id``: the owner token every later call
        on it needs, and the task. The same ``claim_id`` gets the same token."""
        reply = self._call(ClaimAgentCall(run_id=run_id, call_id=call_id, claim_id=claim_id),
                           Claimed)
        return reply.owner_token, reply.call

    def call_tool(
        self, run_id: str, call_id: str, owner_token: str, tool_call_id: str, tool: str,
        input: Any = None,
    ) -> tuple[Any, bool]:
        """Run the task's Tool ``tool`` in the host once per ``tool_call_id``: its output, and
        whether it was replayed from an earlier call with that id."""
        reply = self._call(
            CallTool(run_id=run_id, call_id=call_id, owner_token=owner_token,
                     tool_call_id=tool_call_id, tool=tool, input=input),
            ToolResult,
        )
        return reply.output, reply.replayed

    def complete_agent_call(
        self, run_id: str, call_id: str, owner_token: str, outcome: str, output: Any = None
    ) -> RunView:
        """Complete the Agent task with ``outcome`` (one of the Step's routes) and
        ``output``; the Run's next stable view."""
        return self._call(
            CompleteAgentCall(run_id=run_id, call_id=call_id, owner_token=owner_token,
                              outcome=outcome, output=output),
            RunReply,
        ).run

    def fail_agent_call(
        self, run_id: str, call_id: str, owner_token: str, message: str
    ) -> RunView:
        """Fail the Agent task: the Run fails with AGENT_TASK_FAILED and ``message``."""
        return self._call(
            FailAgentCall(run_id=run_id, call_id=call_id, owner_token=owner_token,
                          message=message),
            RunReply,
        ).run
