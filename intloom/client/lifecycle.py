"""``start`` and ``stop``: launch a project's host, or ask it to stop, and verify the result.

Neither ever deletes a file, kills a saved pid or signals a host it did not launch. ``start``
reuses a live verified host; a leftover ``service.lock`` with no live host behind it is
``CLI_SERVICE_BUSY`` (run ``intloom doctor``, then ``intloom recover``). ``stop`` sends the stop
request at most once, to the instance it observed, then waits until that instance has
released its files; a dead owner whose files remain is ``CLI_SERVICE_BUSY``, every file left
byte-identical.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, NamedTuple

import msgspec

from intloom.client.client import (
    MAX_SECONDS,
    Client,
    HelloFailed,
    ServiceStarting,
    ServiceUnlistened,
    not_a_project,
    resolved_root,
)
from intloom.client.hostlog import (
    LOG_TAIL,
    STOPPING,
    last_line,
    log_path,
    log_says_stopping,
    read_log,
)
from intloom.errors import NO_CONNECTION_FIX, ErrorView, IntloomError, starting_message
from intloom.fsutil import write_refusal
from intloom.host.metadata import (
    Connection,
    ServiceInfo,
    ServiceLock,
    read_connection,
    read_lock,
    read_service,
)
from intloom.host.signals import HANDLED
from intloom.project import CONFIG_NAME, ProjectPaths
from intloom.protocol.messages import ServiceView

if TYPE_CHECKING:
    from intloom.client.drift import SourceChange
    from intloom.host.daemon import Host

__all__ = [
    "CutRun",
    "Progress",
    "StartResult",
    "StopResult",
    "ctrl_c_stops",
    "start_service",
    "stop_service",
    "stop_service_report",
]

Progress = Callable[[str], None]  # receives a short human-readable line

_POLL: Final = 0.05
_TERMINATE_GRACE: Final = 3.0
_MAX_LAUNCHES: Final = 3
_LOCK_SETTLE: Final = 1.0
# How long a start waits for another start's host before it says so (``waiting``).
_WAITING_SAID_AFTER: Final = 1.0
# The least a hello or request gets when a deadline is all but spent: a socket timeout of 0
# would make it non-blocking (an instant failure, not a bounded wait).
_MIN_WAIT: Final = 0.05
# The host reports progress by step id (the readiness protocol); people read these.
_STEPS: Final = {
    "launched": "Launching the intloom service...",
    "locking": "Taking the project's service lock...",
    "log_opened": "Reading the configuration...",
    "loading_workflows": "Loading Workflows and restoring Runs...",
    "imported": "Loading Workflows and restoring Runs...",
    "listening": "Opening the local socket...",
}
_TIMEOUT: Final = (
    "The service did not finish initialization and Workflow restoration within --timeout"
)
_STOP_UNVERIFIED: Final = (
    "Cannot verify resource cleanup by the original instance. Run intloom doctor and "
    "explicitly recover if needed."
)


class StartResult(msgspec.Struct, frozen=True):
    service: ServiceView
    reused: bool
    # A reused host: how the project on disk differs from what it loaded when it started
    # (``intloom.client.drift``); always empty for a host this start launched.
    changed: list[SourceChange] = msgspec.field(default_factory=list)
    # A foreground host, once it has stopped: what its stop did to the Runs (the Runs it
    # cut mid-Step among them), as ``stop_service_report`` tells it; None otherwise.
    stop: StopResult | None = None


class CutRun(msgspec.Struct, frozen=True):
    """A Run whose Step was still running when the stop's grace ran out."""

    run_id: str
    evidence: str  # what was running, e.g. "Step main/pay was running effect 'charge' ..."


class StopResult(msgspec.Struct, frozen=True):
    stopped: bool
    # The next start reports these RUN_INTERRUPTED; every other unfinished Run was
    # suspended at a checkpoint. From the stopped host's log (empty when it cannot be read).
    cut: list[CutRun]
    cut_count: int = 0  # all of them; ``cut`` lists at most the first 50
    # Every Run the stop suspended (the cut ones included); None when the host did not say
    # (its log cannot be read, or it is older than this line).
    suspended: int | None = None
    # Of those, not cut, the ones the next start cannot restore either (a wait without
    # recover, a client Agent task): it reports them RUN_INTERRUPTED. At most 50 listed.
    lost: list[CutRun] = msgspec.field(default_factory=list)
    lost_count: int = 0
    # Unfinished Runs the stop did not suspend, as this host found or left them (restored
    # RUN_INTERRUPTED and not dismissed, held, failed by a checkpoint): the next start
    # reports them again.
    others: int = 0
    # A foreground host that a second signal stopped at once: it did not wait for Steps
    # still running (their Runs come back RUN_INTERRUPTED), and may not have listed them.
    forced: bool = False
    # The Workflow sources changed on disk since the host loaded them (client.drift,
    # since_log), for which the next start holds their unfinished Runs, not resumes them:
    # "Run intloom start to resume them" alone was not so. Only ``stop_service_report``.
    changed: list[SourceChange] = msgspec.field(default_factory=list)
    # False: the host exited before it ever served (its start was given up or failed), not
    # asked by this stop: it had taken on no Run, so it suspended none and its log says
    # nothing of them ("its log does not say ..., as on a full disk" blamed the disk).
    served: bool = True


# ----- shared --------------------------------------------------------------------------------


def _owner_gone(paths: ProjectPaths, pid: int, create_time: float, boot: str | None) -> bool:
    """True only on proof: the OS lock is free and the process is gone (pid, create time, boot)."""
    from intloom.host.liveness import judge, probe_lock, probe_process
    from intloom.host.metadata import boot_id

    process = probe_process(pid, create_time, boot, boot_id(), paths.service_lock)
    if process.state != "gone":
        return False
    return judge(probe_lock(paths.service_lock), process) == "gone"


def _os_lock(paths: ProjectPaths) -> str:
    from intloom.host.liveness import probe_lock

    return probe_lock(paths.service_lock).state


def _process(paths: ProjectPaths, pid: int, create_time: float, boot: str | None) -> str:
    """The process's state by its identity (pid, create time, boot), whoever holds the OS
    lock: "alive", "gone" (only on proof) or "unknown"."""
    from intloom.host.liveness import probe_process
    from intloom.host.metadata import boot_id

    return probe_process(pid, create_time, boot, boot_id(), paths.service_lock).state


def _owner_alive(paths: ProjectPaths, pid: int, create_time: float, boot: str | None) -> bool:
    return _process(paths, pid, create_time, boot) == "alive"


def _checked_timeout(timeout: float) -> float:
    """``timeout`` if it is a number of seconds from 0 to ``MAX_SECONDS``; INVALID_REQUEST
    otherwise (a NaN compares false with every deadline, so it would fail deep in a socket
    call instead; so did 1e10, which the stop's Client.connect refused, read as the host's
    refusal)."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not (
            0 <= timeout <= MAX_SECONDS):
        raise IntloomError("INVALID_REQUEST",
                           f"The timeout {timeout!r} is not a finite number of seconds from 0 "
                           f"to {MAX_SECONDS:g} (about 31 years); nothing was done. Pass one "
                           "such as 30.")
    return float(timeout)


def _checked_port(port: int | None) -> int | None:
    """``port`` if it is None or a TCP port number; INVALID_REQUEST otherwise, before any
    host is launched. The host's own check (its argv) comes after a process was started:
    a bool or a float made it exit at once, said as "Run intloom start again", and a str
    of digits went through and was saved for every later start."""
    if port is None or (type(port) is int and 0 <= port <= 65535):
        return port
    raise IntloomError("INVALID_REQUEST",
                       f"start_service(port={port!r}): a port is an int from 0 to 65535 (0: "
                       "any free port; None: intloom.toml's, else the saved one), not "
                       f"{'a bool' if isinstance(port, bool) else repr(port)}; no host was "
                       "launched. Pass one such as 8765, or None.")


def _live_service(root: Path) -> ServiceView | None:
    """The verified live host's status, or None when it is offline. Other errors propagate,
    ``ServiceUnlistened`` included: start waits for that host, and its log was searched."""
    try:
        with Client.connect(root) as client:
            return client.status()
    except IntloomError as exc:
        if exc.code == "CLI_SERVICE_OFFLINE" or isinstance(exc, ServiceStarting):
            return None  # a starting host: _lock_owner waits for it
        raise


def _fresh_status(root: Path) -> ServiceView | None:
    """Counts as of now, when the host just launched still answers; its ready report else."""
    try:
        return _live_service(root)
    except IntloomError:
        return None


# ----- start ---------------------------------------------------------------------------------


# What a connection to a host that closes it under us (as a stopping host does) fails with.
_CUT_OFF: Final = frozenset(
    {"CLI_SERVICE_UNAVAILABLE", "PROJECT_CONNECTION_FAILED", "PROJECT_REQUEST_FAILED"})


def _paused_host(pid: int, *, stopping: bool = False, starting: bool = False,
                 stop: bool = False) -> IntloomError:
    """CLI_SERVICE_UNAVAILABLE for start against a host stopped by a signal, as for any
    host that does not answer the hello (docs/lifecycle.md, start step 1), not
    CLI_SERVICE_BUSY: its way out, "use intloom recover only after its owner has exited",
    is none for a process that is alive and holds the project. The client's "then try
    again" left open whether start would launch over it. ``stopping``: it was paused after
    its stop began (in its grace, or after it closed its listener); it was waited for until
    --timeout, or said to serve again once resumed. ``starting``:
    it was paused before it served; start and stop (``stop``) waited for it, silent, for
    300 s, and advised a kill -TERM that a stopped process does not take. ``stop`` alone:
    said by a stop at once (``stopping``: one it or another stop asked), where it waited
    out its whole --timeout (10 s, or the host's own bound)."""
    doing = ("Nothing was sent: a stop can be asked only of a host that serves." if stop
             else "intloom start did not start a second host beside it.")
    then = ", and intloom stop stops it" if stop else ", and intloom start reuses it"
    if starting:
        return IntloomError(
            "CLI_SERVICE_UNAVAILABLE",
            f"The project's host (pid {pid}) is still starting (it holds service.lock and has "
            "not served yet) and is stopped by a signal (SIGSTOP or Ctrl-Z): it "
            f"will not serve until it is resumed. {doing} Resume it with kill -CONT {pid}: it "
            f"then finishes its start and serves{then}. To end its start instead, "
            f"kill -TERM {pid}, then kill -CONT {pid} (a stopped process takes the signal "
            "only once resumed).",
        )
    if stop and stopping:
        return IntloomError(
            "CLI_SERVICE_UNAVAILABLE",
            f"The project's host (pid {pid}) was asked to stop, and is stopped by a signal "
            "(SIGSTOP or Ctrl-Z) before it finished: it finishes nothing until it is resumed. "
            f"Resume it with kill -CONT {pid}: it then finishes its stop and exits (intloom "
            "status says offline once it has).",
        )
    if stop:
        return IntloomError(
            "CLI_SERVICE_UNAVAILABLE",
            f"The project's host (pid {pid}) is alive but stopped by a signal (SIGSTOP, Ctrl-Z "
            "or a debugger): it answers nothing until it is resumed, so no stop was asked of "
            f"it: nothing was sent. Resume it with kill -CONT {pid}, then run intloom stop "
            f"again; or stop it as it is with kill -TERM {pid}, then kill -CONT {pid} (a "
            "graceful stop: a stopped process takes the signal only once resumed).",
        )
    if stopping:
        return IntloomError(
            "CLI_SERVICE_UNAVAILABLE",
            f"The project's host (pid {pid}) was shutting down (its log says its stop began) "
            "and is now stopped by a signal (SIGSTOP or Ctrl-Z): it "
            "holds the project until its stop ends. intloom start did not start "
            f"a second host beside it. Resume it with kill -CONT {pid}: it then finishes its "
            "stop and exits, and intloom start starts a new host.",
        )
    return IntloomError(
        "CLI_SERVICE_UNAVAILABLE",
        f"The project's host (pid {pid}) is alive but stopped by a signal (SIGSTOP, Ctrl-Z "
        "or a debugger): it holds the project and answers nothing until it is resumed. "
        "intloom start did not start a second host beside it. Resume it with kill -CONT "
        f"{pid}: it then serves again, and intloom start reuses it (or intloom stop stops "
        "it).",
    )


def _stopped_by_signal(pid: int) -> bool:
    """``pid`` is stopped by a signal (SIGSTOP, Ctrl-Z; not a tracer's stop), from
    /proc/PID/stat, without psutil (``liveness.paused``), which stop need not import."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rpartition(b") ")[2][:1] == b"T"
    except OSError:
        return False


def _lock_now(paths: ProjectPaths) -> ServiceLock | None:
    """``service.lock``'s record now; None when there is none or it cannot be read (being
    written or replaced: the next poll reads it)."""
    try:
        return read_lock(paths.service_lock)
    except IntloomError:
        return None


def _paused_starting(paths: ProjectPaths) -> int | None:
    """The pid of the host still starting (it holds the lock, no service.json yet) when it
    is stopped by a signal; None otherwise (a single sample, as for a stopping host: a
    start traced by strace is not paused)."""
    lock = _lock_now(paths)
    if lock is None:
        return None
    from intloom.host.liveness import paused  # psutil: only while a host starts

    return lock.pid if paused(lock.pid, traced=False) else None


def _saved_service(paths: ProjectPaths) -> ServiceInfo | None:
    try:
        return read_service(paths.service_json, paths.root)
    except IntloomError:
        return None  # _live_service reports it


def _log_tail(log: Path | None) -> bytes | None:
    """The last ``LOG_TAIL`` bytes of ``log``; None when it is not a regular file that can
    be read. Never through a link, never blocked by a FIFO put in its place."""
    return read_log(log, LOG_TAIL, tail=True)


def _released_by_stop(paths: ProjectPaths, info: ServiceInfo, deadline: float) -> bool:
    """True once the host ``info`` names has released ``service.json``, when it did so or
    its log says it is stopping within a moment; it is then waited for until ``deadline``.
    False for a host that is not stopping (hung, or not the host at all)."""
    from intloom.host.liveness import paused

    settle = time.monotonic() + _LOCK_SETTLE
    while True:
        now = _saved_service(paths)
        if now is None or now.instance_id != info.instance_id:
            return not paths.service_json.exists() or now is not None
        if time.monotonic() >= deadline:
            return False
        if time.monotonic() >= settle and (not log_says_stopping(paths, info)
                                           or not _owner_alive(paths, info.pid,
                                                               info.create_time, None)
                                           or paused(info.pid, traced=False)):
            return False  # not stopping; or it died, or was paused, on its way out
        time.sleep(_POLL)  # a poll while the stopping host finishes


def _stopping(paths: ProjectPaths, info: ServiceInfo) -> bool:
    """The host ``info`` names is alive and its log says it is stopping."""
    return (_owner_alive(paths, info.pid, info.create_time, None)
            and log_says_stopping(paths, info))


def _stop_outlasted(info: ServiceInfo, timeout: float, *, listening: bool = False
                    ) -> IntloomError:
    where = ("it is still in its stop's grace, letting its running Steps reach a boundary "
             "before it saves its Runs" if listening
             else "it has stopped listening but not exited")
    return IntloomError(
        "CLI_SERVICE_TIMEOUT",
        f"intloom start waited its --timeout ({timeout:g} s) for the host (pid {info.pid}) to "
        f"finish shutting down: {where}. This command launched nothing. Run intloom start "
        "again once intloom status says the service is offline (or with a longer --timeout); "
        "if the host stays, intloom logs says what its stop is doing.")


def _busy(paths: ProjectPaths) -> IntloomError:
    try:
        read_lock(paths.service_lock)
    except IntloomError as exc:
        # Not a lock at all (a directory, a link, bytes no host wrote): status, stop and
        # doctor say so and how to move it aside, and recover refuses it; "locked, use
        # recover once its owner has exited" sent the reader to a refusal, for no owner.
        return exc
    message = (f"The project service is locked ({paths.service_lock} exists, and no live host "
               "answers). Run intloom doctor; use intloom recover only after its owner has "
               "exited.")
    taken = _taken_after_exit(paths)
    if taken is None:
        gone = _gone_owners(paths)
        if gone is not None and _recoverable(paths):
            # Said as stop says it: the newcomer who ran start straight after a kill -9 was
            # told only "locked ... run doctor", as if something still held the project.
            pids = ", ".join(str(pid) for pid in gone)
            taken = (f"Its host (pid {pids}) has exited: it was killed or crashed, and left "
                     "its files behind. Run intloom recover, then intloom start.")
    return IntloomError("CLI_SERVICE_BUSY", message if taken is None else f"{message} {taken}")


def _recoverable(paths: ProjectPaths) -> bool:
    """Whether the recover a start refusal would send the reader to can clean up after a
    host that exited: it reads the saved port from a valid ``connection.json`` (it refuses
    without one), and a host that stopped as asked but kept its files, its log says why
    (``service_files_kept``: an immutable file, a read-only ``.intloom/``), which recover
    meets again. Otherwise doctor is the one to say what to do."""
    try:
        info = read_service(paths.service_json, paths.root)
        if read_connection(paths.connection_json, paths.root) is None:
            return False
    except IntloomError:
        return False
    log = log_path(paths, info.log_file) if info is not None else None
    return not _kept_by_log(log)


def _gone_owners(paths: ProjectPaths) -> list[int] | None:
    """The pids the project's metadata names when every one has provably exited (the
    recover a refusal sends the reader to then cleans up), else None: one alive, one that
    cannot be judged, or a file that does not read (doctor names it)."""
    try:
        lock = read_lock(paths.service_lock)
        info = read_service(paths.service_json, paths.root)
    except IntloomError:
        return None
    owners: list[tuple[int, float, str | None]] = []
    if lock is not None:
        owners.append((lock.pid, lock.create_time, lock.boot_id))
    if info is not None:
        owners.append((info.pid, info.create_time, None))
    if not owners or not all(_owner_gone(paths, *owner) for owner in owners):
        return None
    return sorted({pid for pid, _, _ in owners})


def _taken_after_exit(paths: ProjectPaths, *, lead: bool = True) -> str | None:
    """What stands in the way when every recorded owner has provably exited and another
    program holds the project's saved port, in status's and doctor's words (the port, its
    holder, the fix), or None. The refusal said only "locked ... run intloom doctor": the
    recover it led to refuses on that port, and only status and doctor named its holder.
    ``lead=False`` leaves out that the owner has exited, for a message that said so."""
    from intloom.host.portholder import bind_refusal, port_holder

    gone = _gone_owners(paths)
    if gone is None:
        return None
    try:
        info = read_service(paths.service_json, paths.root)
        conn = read_connection(paths.connection_json, paths.root)
    except IntloomError:
        return None  # doctor names the invalid file
    ports = [saved.port for saved in (conn, info) if saved is not None]
    port = next((p for p in dict.fromkeys(ports) if bind_refusal(p) is not None), None)
    if port is None:
        return None
    holder = port_holder(port) or f"not identified; find it with: ss -ltnp 'sport = :{port}'"
    pids = ", ".join(str(pid) for pid in gone)
    start = f"Its owner (pid {pids}) has exited, but port" if lead else "But port"
    return (f"{start} {port} on 127.0.0.1, this "
            f"project's saved port, is in use by another process ({holder}): intloom recover "
            "refuses while the port is taken, and a host cannot serve the project on it. Stop "
            "that process (or wait until it has exited), then run intloom recover, then "
            "intloom start.")


def _still_starting(paths: ProjectPaths) -> IntloomError:
    """CLI_SERVICE_TIMEOUT for a start whose --timeout ran out waiting for another start's
    host, live and still starting: "locked, no live host answers" sent the reader to
    recover, over a host that status calls starting."""
    lock = _lock_now(paths)
    if lock is None:  # gone or rewritten meanwhile: nothing certain to name
        return _busy(paths)
    return IntloomError(
        "CLI_SERVICE_TIMEOUT",
        f"{_TIMEOUT}, waiting for another start's host. " + starting_message(
            lock.pid, lock.started_at,
            "This command launched nothing. Wait for it (intloom status says when it "
            "serves; a longer --timeout waits for it), or stop its start with kill -TERM "
            f"{lock.pid} (it interrupts a Workflow's import at once)."),
    )


def _waiting_for(paths: ProjectPaths, timeout: float, foreground: bool) -> str | None:
    """What a start waiting for another start's host says of it, or None when its lock
    cannot be read now (rewritten meanwhile: said at the next poll)."""
    lock = _lock_now(paths)
    if lock is None:
        return None
    then = ("says CLI_SERVICE_CONFLICT once it serves (one host per project)" if foreground
            else "reuses it once it serves")
    return ("Waiting for another start's host. " + starting_message(
        lock.pid, lock.started_at,
        f"This start waits up to its --timeout ({timeout:g} s) and {then}. Ctrl-C stops "
        f"waiting (that start goes on); kill -TERM {lock.pid} stops that start."))


def _reuse(root: Path, service: ServiceView, port: int | None, strict: bool = False
           ) -> StartResult:
    if port is not None and port != service.port:
        raise IntloomError(
            "CLI_SERVICE_CONFLICT",
            f"The host already runs on port {service.port} (pid {service.pid}). Stop the "
            "running service before changing its port to "
            + (f"{port}." if port else "a free one (--port 0 picks it as the host starts)."),
        )
    if strict:
        # --strict judges the journals when a host starts; this one started without it.
        held = service.restore.needs_attention if service.restore is not None else []
        damaged = [p for p in service.store_problems if p.kind != "torn"]
        if held or damaged:
            count = service.restore.count("needs_attention") if service.restore else 0
            found = "; ".join(
                ([f"{count} Run(s) it did not restore (first: {held[0]})"] if held else [])
                + ([f"{len(damaged) + service.store_problems_omitted} damaged file(s) "
                    f"(first: {damaged[0].path})"]
                   if damaged else []))
            raise IntloomError(
                "CLI_SERVICE_CONFLICT",
                f"--strict: the host already running (pid {service.pid}) started without it "
                f"and, at its start, found {found}. --strict decides when a host starts: run "
                "intloom doctor, then intloom stop and intloom start --strict (which refuses "
                "while they remain). The running host was left as it is.",
            )
    from intloom.client.drift import against_host

    # Advice only: a host that stops answering meanwhile leaves it unsaid; the reuse stands.
    compared = against_host(root, service)
    return StartResult(service=service, reused=True, changed=compared[1] if compared else [])


def _lock_owner(paths: ProjectPaths) -> Literal["absent", "starting", "stale"]:
    """Who holds ``service.lock``: nobody, a live process holding its OS lock (a host still
    starting), or else (a dead owner, or a live process that is no starting host).

    A lock file is created empty and then written, so an unreadable one gets a moment to
    become readable before it is judged.
    """
    deadline = time.monotonic() + _LOCK_SETTLE
    while True:
        if not (paths.service_lock.exists() or paths.service_lock.is_symlink()):
            return "absent"
        try:
            lock = read_lock(paths.service_lock)
        except IntloomError:
            if time.monotonic() < deadline:
                time.sleep(_POLL)  # a poll while the file is being written
                continue
            return "stale"
        if lock is None:
            return "absent"
        if not _owner_alive(paths, lock.pid, lock.create_time, lock.boot_id):
            # A host finishing its stop removes its lock, then exits: between our read and
            # the probe it may have done both. Only a lock still naming that owner is stale.
            try:
                again = read_lock(paths.service_lock)
            except IntloomError:
                continue  # replaced by a lock being written: judge that one
            if again is None or again.instance_id != lock.instance_id:
                continue
            return "stale"
        # A starting host takes the OS lock right after the file appears. A live owner that
        # leaves it free for longer is not starting: waiting for it would only run out the
        # whole --timeout before the same refusal.
        if _os_lock(paths) != "free":
            return "starting"
        if time.monotonic() >= deadline:
            return "stale"
        time.sleep(_POLL)


def start_service(
    root: str | os.PathLike[str],
    *,
    port: int | None = None,
    strict: bool = False,
    timeout: float = 300.0,
    foreground: bool = False,
    progress: Progress | None = None,
    on_ready: Callable[[StartResult], None] | None = None,
    on_lost: Callable[[ErrorView], None] | None = None,
    on_stopped: Callable[[StopResult], None] | None = None,
    slow_import: Callable[[str], None] | None = None,
    on_stopping: Callable[[str], None] | None = None,
    waiting: Callable[[str], None] | None = None,
) -> StartResult:
    """Reuse the live host, or launch one and return once it has restored and listens.

    ``slow_import`` is told, once per source, when a launched host is still importing one
    Workflow source after a while (10 s): a source that loops or waits when imported.

    ``foreground`` runs the host in this process until it stops (Ctrl-C is a graceful stop);
    ``on_ready`` is then called once it serves, and the result is returned after it stopped.
    ``on_stopped`` is called once with what its stop did to the Runs (``StartResult.stop``),
    also when the process then ends without returning (a second Ctrl-C, or a thread stuck
    in user code: the host ends with ``os._exit``).
    ``on_lost`` is called with the error of a foreground host that stops serving on its own
    (its ``.intloom/`` moved away): the process then exits at once, as a crash would.
    ``on_stopping`` is told, once, as a foreground host's stop begins with Runs still
    running, what the stop waits for and how to stop at once.
    ``waiting`` is told, once, when this start has waited a while (1 s) for another start's
    host, still starting: whose, and how to stop waiting or stop that start.
    """
    deadline = time.monotonic() + _checked_timeout(timeout)
    port = _checked_port(port)
    root = resolved_root(root, "start_service")
    paths = ProjectPaths(root)
    if not (root / CONFIG_NAME).is_file():
        raise not_a_project(root, "start_service")  # not Client.connect's words: not called
    launches = 0
    lost: IntloomError | None = None  # a foreground host's lost race for the lock
    waited: float | None = None  # since when this start waits for another start's host
    while True:
        seen = _saved_service(paths)
        # The host refused us on its way out, as its log says: known without searching that
        # log again (_stopping), which may mean reading megabytes at every poll.
        closing = False
        try:
            service = _live_service(root)
        except ServiceUnlistened:
            service, closing = None, True
        except IntloomError as exc:
            # A host that is stopping (suspending its Runs) releases the project in a few
            # seconds: wait for it, then launch, as for a host still starting.
            if exc.code == "CLI_SERVICE_CLOSING":
                if time.monotonic() < deadline:
                    time.sleep(_POLL)
                    continue
                if seen is not None:
                    # Its refusal is worded for a request about a Run ("intloom start waits
                    # for that"): this start's own timeout is what ran out.
                    raise _stop_outlasted(seen, timeout, listening=True) from None
            # A stopping host also closes every connection, ours mid-hello or mid-request
            # included, before it removes its files: that is no broken host either.
            if (exc.code in _CUT_OFF and seen is not None
                    and _released_by_stop(paths, seen, deadline)):
                continue
            if isinstance(exc, HelloFailed) and exc.paused is not None:
                # Paused in its stop's grace (still listening): resumed, it finishes its stop
                # and exits. "It then serves again, and intloom start reuses it" was said.
                stopping = seen is not None and seen.pid == exc.paused and _stopping(paths,
                                                                                     seen)
                raise _paused_host(exc.paused, stopping=stopping) from None
            raise
        if service is not None:
            if foreground:
                # Not "in the background": it may be another terminal's start --foreground.
                raise IntloomError(
                    "CLI_SERVICE_CONFLICT",
                    f"A host already serves this project (pid {service.pid}, port "
                    f"{service.port}); nothing was started. Stop it first (intloom stop) to "
                    "run the host in this terminal.",
                )
            return _reuse(root, service, port, strict)
        if seen is not None and (closing or _stopping(paths, seen)):
            # A host that stopped listening on its way out (it saves its Runs, then removes
            # its files) still holds the lock, as a start does: waiting for it was said to
            # be waiting for "another start's host", and its timeout said so too.
            from intloom.host.liveness import paused  # psutil: only while a host stops

            # A single sample, and an immediate refusal: a stop traced by strace is not one.
            if paused(seen.pid, traced=False):
                raise _paused_host(seen.pid, stopping=True)  # else waited for until --timeout
            if time.monotonic() >= deadline:
                raise _stop_outlasted(seen, timeout)
            now = time.monotonic()
            waited = now if waited is None else waited
            if waiting is not None and now - waited >= _WAITING_SAID_AFTER:
                waiting(f"Waiting for the host (pid {seen.pid}) to finish shutting down: it "
                        "has stopped listening and is saving its Runs, then exits. This "
                        f"start then starts a new host (it waits up to its --timeout, "
                        f"{timeout:g} s).")
                waiting = None
            time.sleep(_POLL)  # a poll until the stopping host has exited
            continue
        owner = _lock_owner(paths)
        if owner != "absent":
            # A host that is starting right now (a concurrent start) will answer soon;
            # anything else behind a lock file is for doctor and recover, never for us.
            if owner == "starting":
                # A starting host has written no service.json yet (it is written last): one
                # this project cannot use (another project's: the project moved while its
                # host ran, and connection.json was set aside) is said as status says it,
                # not waited for until the --timeout as "another start's host".
                read_service(paths.service_json, paths.root)
            if owner == "starting" and time.monotonic() < deadline:
                paused_pid = _paused_starting(paths)
                if paused_pid is not None:
                    raise _paused_host(paused_pid, starting=True)
                # Another terminal's start may import for minutes: this one was silent
                # until its --timeout (300 s), with nothing to say whose start it waited for.
                now = time.monotonic()
                waited = now if waited is None else waited
                if waiting is not None and now - waited >= _WAITING_SAID_AFTER:
                    said = _waiting_for(paths, timeout, foreground)
                    if said is not None:
                        waiting(said)
                        waiting = None
                time.sleep(_POLL)  # a poll until the starting host answers
                continue
            raise _still_starting(paths) if owner == "starting" else _busy(paths)
        if foreground:
            if lost is not None:  # the winner has gone already: this process ran a host once
                raise lost
            try:
                return _run_foreground(root, port=port, strict=strict, progress=progress,
                                       on_ready=on_ready, on_lost=on_lost,
                                       on_stopped=on_stopped, on_stopping=on_stopping,
                                       deadline=deadline)
            except IntloomError as exc:
                # Lost the race for the lock to another terminal's start: said "locked, use
                # recover" of a live host. Its start is waited for, then named as it is.
                if exc.code != "CLI_SERVICE_BUSY":
                    raise
                lost = exc
                continue
        if launches >= _MAX_LAUNCHES:
            raise _busy(paths)
        launches += 1
        try:
            service = _launch(root, port=port, strict=strict, deadline=deadline,
                              progress=progress, slow_import=slow_import)
        except IntloomError as exc:
            if exc.code == "CLI_SERVICE_BUSY":
                continue  # lost the race for the lock: the winner may be the one to reuse
            raise
        return StartResult(service=_fresh_status(root) or service, reused=False)


def _host_command(root: Path, port: int | None, strict: bool, ready_fd: int) -> list[str]:
    cmd = [sys.executable, "-P", "-m", "intloom.host", "--project", str(root),
           "--ready-fd", str(ready_fd)]
    if port is not None:
        cmd += ["--port", str(port)]
    if strict:
        cmd.append("--strict")
    return cmd


def _host_env() -> dict[str, str]:
    """The host's environment: this one's, with the directory intloom was imported from
    added to PYTHONPATH (last) only when the host's interpreter would not find intloom
    without it. The host runs with -P in the project directory, so a checkout run from its
    own directory needs it; an installed intloom (a wheel, an editable install) does not,
    and its whole site-packages on PYTHONPATH went to every program a Step started (another
    venv's Python loaded this one's packages) and came before the standard library."""
    here = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    if not _importable_without(here, env.get("PYTHONPATH", "")):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), here) if p)
    return env


def _importable_without(here: str, pythonpath: str) -> bool:
    """Whether a fresh ``sys.executable -P`` finds the intloom imported from ``here``: an
    editable install's import hook serves it, or ``here`` is a site directory, a path a
    ``.pth`` file adds, or on ``pythonpath``."""
    return _editable_intloom() or _on_path(here, pythonpath)


def _editable_intloom() -> bool:
    return any(getattr(finder, "__module__", "").startswith("__editable___intloom")
               for finder in sys.meta_path)


def _on_path(here: str, pythonpath: str) -> bool:
    import site

    real = os.path.realpath(here)
    named = {os.path.realpath(p) for p in pythonpath.split(os.pathsep) if p}
    sites = {os.path.realpath(p) for p in [*site.getsitepackages(), site.getusersitepackages()]}
    if real in named or real in sites:
        return True
    # sys.path[0] is the script's directory (or the working directory): -P leaves it out.
    return any(os.path.realpath(p) == real for p in sys.path[1:] if p)


def _reap_later(proc: subprocess.Popen[bytes]) -> None:
    """Collect the detached host's exit status whenever it comes, so it never lingers."""
    try:
        threading.Thread(target=proc.wait, name=f"intloom-reap-{proc.pid}",
                         daemon=True).start()
    except RuntimeError:
        # No thread to be had (a process limit the host itself started under): the start
        # had succeeded, and failed CLI_INTERNAL_ERROR here. Unreaped, the host is handed
        # to init (or a subreaper) once this command exits, which reaps it.
        return


def _launch(root: Path, *, port: int | None, strict: bool, deadline: float,
            progress: Progress | None,
            slow_import: Callable[[str], None] | None = None) -> ServiceView:
    children = _report_children()
    try:
        return _launch_reported(root, port=port, strict=strict, deadline=deadline,
                                progress=progress, slow_import=slow_import)
    finally:
        if children:
            signal.signal(signal.SIGCHLD, signal.SIG_IGN)


def _report_children() -> bool:
    """A program that ignores SIGCHLD (inherited across exec) has the kernel reap its
    children: the host's exit status was lost, and a host killed while it started was said
    to have "exited with status 0". SIGCHLD gets its default action while the start waits
    for the host (restored after, for a caller running start in its own process). True when
    it was changed."""
    if signal.getsignal(signal.SIGCHLD) != signal.SIG_IGN:
        return False
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    except ValueError:  # not the main thread: _died_starting says the status is unknown
        return False
    return True


def _not_launched(root: Path, exc: OSError) -> IntloomError:
    """The host process could not even be created: what was run, where, and what refused
    ("Could not launch the project host (Permission denied)" named neither the file nor
    the fix)."""
    from intloom.fsutil import search_refused

    why = exc.strerror or str(exc)
    refused = None
    if isinstance(exc, PermissionError):
        refused = search_refused(Path(sys.executable)) or search_refused(root)
    fix = refused or (
        f"The host runs with the Python that runs this command: check that this user may "
        f"run {sys.executable} and enter {root}, then run intloom start again.")
    return IntloomError(
        "CLI_SERVICE_UNAVAILABLE",
        f"Could not launch the project host: {sys.executable} -m intloom.host, in {root}, "
        f"failed ({why}). {fix}")


def _launch_reported(root: Path, *, port: int | None, strict: bool, deadline: float,
                     progress: Progress | None,
                     slow_import: Callable[[str], None] | None) -> ServiceView:
    read_fd, write_fd = os.pipe()
    # The host inherits the blocked mask across fork and exec and unblocks these once it
    # handles them: a kill -TERM in its first moments (before its interpreter had even
    # loaded) ended it by the default action. Here they wait only for the fork.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
    try:
        proc = subprocess.Popen(
            _host_command(root, port, strict, write_fd),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, pass_fds=(write_fd,), cwd=str(root), env=_host_env(),
        )
    except OSError as exc:
        os.close(read_fd)
        raise _not_launched(root, exc) from None
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        os.close(write_fd)  # only the child holds the write end now: EOF means it is gone
    importing = _Importing()
    caught = _catch_stop_signals()
    try:
        if progress is not None:
            progress(_STEPS["launched"])
        service = _await_ready(proc, read_fd, deadline, progress, importing, slow_import,
                               paths=ProjectPaths(root))
    except _Terminated as terminated:
        # A second signal while the host stops may end this command as it would have: the
        # host was already told to stop.
        _uncatch(caught)
        caught = []
        _stop_child(proc)
        raise IntloomError(
            "CLI_SERVICE_CLOSING",
            f"This start was asked to stop ({terminated.name}) before the host it launched "
            f"(pid {proc.pid}) served, so it stopped that host: the start did not happen. Run "
            "intloom start again and let it finish (its --timeout bounds it by itself).",
        ) from None
    except IntloomError as exc:
        killed = _stop_child(proc)
        if exc.code == "CLI_SERVICE_TIMEOUT":
            raise _start_timeout(ProjectPaths(root), proc.pid, killed,
                                 importing.fact()) from None
        raise
    except KeyboardInterrupt:
        killed = _stop_child(proc)
        left = killed and _lock_left_by(ProjectPaths(root), proc.pid)
        raise LaunchInterrupted(proc.pid, killed, left) from None
    except BaseException:
        _stop_child(proc)
        raise
    finally:
        _uncatch(caught)
        os.close(read_fd)
    _reap_later(proc)
    return service


class LaunchInterrupted(KeyboardInterrupt):
    """Ctrl-C reached a start waiting for the host it launched, which it then stopped;
    ``note`` says so (the command said only "Interrupted.")."""

    def __init__(self, pid: int, killed: bool, left: bool = False) -> None:
        super().__init__(pid)
        said = f"Interrupted: the host this start launched (pid {pid}) had not served yet, so "
        if not killed:
            self.note = said + "it was stopped: the start did not happen. Run intloom start again."
        elif left:  # its service.lock, which only recover removes (DESIGN section 3)
            self.note = said + ("it was killed, not stopping in time; its service.lock "
                                "remains: run intloom doctor, then intloom recover and intloom "
                                "start.")
        else:
            self.note = said + ("it was killed, not stopping in time, before it held the "
                                "project: the start did not happen. Run intloom start again.")


def stop_interrupted_note(root: Path) -> str:
    """What a stop cut by Ctrl-C leaves: its request may have gone out, and the host goes on
    with it; said from the files, read-only (the command said only "Interrupted.")."""
    paths = ProjectPaths(root)
    try:
        info = read_service(paths.service_json, root)
    except IntloomError:
        return (f"Stopped waiting (Ctrl-C). {paths.service_json} cannot be read now, so "
                "whether the host is stopping is not known: run intloom doctor.")
    if info is None:
        from intloom.host.liveness import starting_owner  # psutil: only on this path

        starting = starting_owner(paths)
        if starting is not None:
            # "No host serves ... offline" of a host that served moments later: this stop
            # waits for a starting host to serve before it asks, so it never asked.
            return (f"Stopped waiting (Ctrl-C). The host (pid {starting.pid}) is still "
                    "starting and was not asked to stop: it serves once it has loaded its "
                    "Workflows and restored its Runs. intloom stop asks it again (once it "
                    f"serves); kill -TERM {starting.pid} ends its start.")
        return ("Stopped waiting (Ctrl-C). No host serves the project now: intloom status "
                "says whether it is offline.")
    log = log_path(paths, info.log_file)
    if last_line(log, STOPPING) is not None:
        return (f"Stopped waiting (Ctrl-C). The host (pid {info.pid}) is stopping and goes "
                "on (it suspends its Runs, then exits): intloom status says offline once it "
                "has.")
    return (f"Stopped waiting (Ctrl-C). The host (pid {info.pid}) had not begun to stop; "
            "if the request had gone out, it still stops. intloom status says whether it "
            "runs; intloom stop asks again.")


class _Terminated(Exception):
    """SIGTERM or SIGQUIT reached a start waiting for the host it launched."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _on_stop_signal(signum: int, _frame: object) -> None:
    raise _Terminated(signal.Signals(signum).name)


# SIGTERM (``timeout``, a supervisor) and SIGQUIT (Ctrl-\ in the terminal): their default
# actions ended the command and left the half-started host (in a session of its own, so the
# terminal's Ctrl-\ never reaches it) to serve, unknown to whoever gave up on the start.
_STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGQUIT)


def _catch_stop_signals() -> list[signal.Signals]:
    """While a start waits for its host, SIGTERM and SIGQUIT are what Ctrl-C is. Only their
    default is replaced (a program that handles or ignores one itself keeps its way).
    Returns the signals whose handler was replaced."""
    caught: list[signal.Signals] = []
    for signum in _STOP_SIGNALS:
        if signal.getsignal(signum) != signal.SIG_DFL:
            continue
        try:
            signal.signal(signum, _on_stop_signal)
        except ValueError:  # not the main thread: its signals are the caller's
            break
        caught.append(signum)
    return caught


def _uncatch(caught: list[signal.Signals]) -> None:
    for signum in caught:
        signal.signal(signum, signal.SIG_DFL)


class _Importing(msgspec.Struct):
    """The Workflow source the starting host is importing (readiness step ``importing``),
    since when, and whether its slowness was said: an import that loops or waits kept
    ``start`` silent until its --timeout (300 s by default), which then named no source."""

    source: str | None = None
    since: float = 0.0
    told: bool = False
    locking: bool = False  # the host said it takes service.lock: before, it wrote nothing

    def seen(self, message: dict[str, Any]) -> None:
        step = message.get("step")
        source = message.get("source")
        self.locking = self.locking or step == "locking"
        if step == "importing" and isinstance(source, str):
            self.source, self.since, self.told = _printable(source), time.monotonic(), False
        elif step is not None:
            self.source = None

    def fact(self) -> str:
        """What a timeout adds: the source it was still importing, if any."""
        if self.source is None:
            return ""
        return (f" It was still importing {self.source} (for {time.monotonic() - self.since:.0f} "
                "s): a Workflow source that waits or loops while it is imported keeps the host "
                f"from starting. Check what {self.source} does when it is imported (intloom "
                "doctor imports it too, and names it).")

    def died(self, signum: int | None = None) -> str:
        """What a host that died while starting adds: the source it was importing, if any.
        ``signum``: the signal that killed it."""
        if self.source is None:
            return ""
        if signum == signal.SIGKILL:
            # Neither caught nor sent by a crash: blaming the source sent people to read an
            # import that a kill -9, or the kernel short of memory, had cut.
            return (f" It was importing {self.source}. SIGKILL comes from outside the "
                    "process: another process (kill -9), or the kernel's out-of-memory "
                    "killer (dmesg names the pid it killed; a source that allocates a great "
                    f"deal when it is imported causes it). If neither, check what "
                    f"{self.source} does when it is imported.")
        return (f" It was importing {self.source}: a Workflow source that ends the process "
                "when it is imported (os._exit(), a signal, a crashing extension) ends the "
                f"host with it. Check what {self.source} does when it is imported.")

    def check(self, slow_import: Callable[[str], None] | None) -> None:
        if slow_import is None or self.source is None or self.told:
            return
        from intloom.authoring.loader import slow_import_after  # only once a source imports

        after = slow_import_after()
        if time.monotonic() - self.since >= after:
            self.told = True
            slow_import(f"Still importing {self.source} after {after:g} s: a Workflow source "
                        "that waits or loops while it is imported keeps the host from "
                        f"starting, and this start waits until its --timeout. Ctrl-C stops "
                        f"it; check what {self.source} does when it is imported.")


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def _await_ready(proc: subprocess.Popen[bytes], fd: int, deadline: float,
                 progress: Progress | None, importing: _Importing,
                 slow_import: Callable[[str], None] | None = None,
                 paths: ProjectPaths | None = None) -> ServiceView:
    buf = b""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise IntloomError("CLI_SERVICE_TIMEOUT", _TIMEOUT)  # _launch completes the message
        readable, _, _ = select.select([fd], [], [], min(remaining, 0.5))
        importing.check(slow_import)
        if not readable:
            if proc.poll() is None:
                continue
            # Exited without closing the pipe: a process a Workflow source forked while it
            # was imported holds its write end, and this start waited until its --timeout
            # (300 s), then said the host had stopped and left nothing. What it wrote just
            # before it exited (its own error) is read first.
            readable, _, _ = select.select([fd], [], [], 0)
            if not readable:
                raise _died_starting(proc, importing, paths)
        chunk = os.read(fd, 65536)
        if not chunk:
            raise _died_starting(proc, importing, paths)
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            outcome = _ready_line(line, progress, importing)
            if outcome is not None:
                return outcome


def _died_starting(proc: subprocess.Popen[bytes], importing: _Importing | None = None,
                   paths: ProjectPaths | None = None) -> IntloomError:
    """The host closed its readiness pipe without a word: it died (killed, out of memory, a
    crashing extension) or exited from user code imported while it started."""
    signum: int | None = None
    try:
        code = proc.wait(timeout=_TERMINATE_GRACE)
    except subprocess.TimeoutExpired:
        # _launch stops it next (_stop_child): say what it did, not that it still runs.
        how = "closed its readiness pipe without a word (it is being stopped)"
    else:
        if signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN:
            # The kernel reaped it (_report_children could not reset SIGCHLD off the main
            # thread): wait() says 0 whatever ended it.
            how = "exited (how is unknown: this process ignores SIGCHLD)"
        elif code >= 0:
            how = f"exited with status {code}"
        else:
            signum = -code
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:  # a real-time signal has no name of its own
                how = f"was killed by signal {-code}"
    if importing is not None and not importing.locking:
        # Killed before its handlers were in place (a kill -TERM in its first moments):
        # neither a log nor a lock to send the user to.
        return IntloomError(
            "CLI_SERVICE_UNAVAILABLE",
            f"The service exited during initialization: the host (pid {proc.pid}) {how} "
            "before it took service.lock or opened a log, so it left nothing behind. Run "
            "intloom start again.",
        )
    # Which files it left, when they can be told: killed right after writing service.json,
    # it left both, and "the service.lock it may have left" named one.
    left = _left_by(proc, paths)
    unsaved = paths is not None and not os.path.lexists(paths.connection_json)
    if left and unsaved:
        # Killed before it saved connection.json (a project's first start): recover checks
        # the saved port with it and never runs without it, so "intloom recover removes it"
        # sent the user to a refusal, and start's CLI_SERVICE_BUSY back to recover.
        files = " and ".join(left)
        it = "it" if len(left) == 1 else "them"
        then = (f"The {files} it left {'is' if len(left) == 1 else 'are'} stale, but it had "
                "not saved .intloom/connection.json yet, which intloom recover needs (it "
                "checks the project's saved port with it): once intloom doctor shows the "
                f"host exited (the OS lock on service.lock free), remove {it} yourself, then "
                "run intloom start.")
    elif left:
        files = " and ".join(left)
        then = (f"Run intloom doctor: the {files} it left {'is' if len(left) == 1 else 'are'} "
                f"stale, and intloom recover removes {'it' if len(left) == 1 else 'them'} "
                "before the next intloom start.")
    elif left is None:
        then = ("Run intloom doctor: the service.lock it may have left is stale, and intloom "
                "recover removes it before the next intloom start.")
    else:
        then = ("It left no service.json or service.lock: run intloom start again (intloom "
                "doctor says if anything else is wrong).")
    return IntloomError(
        "CLI_SERVICE_UNAVAILABLE",
        f"The service exited during initialization: the host (pid {proc.pid}) {how} before "
        f"it reported ready.{importing.died(signum) if importing else ''} Its log in "
        f".intloom/logs/ says how far it got. {then}",
    )


def _left_by(proc: subprocess.Popen[bytes], paths: ProjectPaths | None) -> list[str] | None:
    """The names of the files the exited host ``proc`` left (those naming its pid, or that
    cannot be read); None when that cannot be told: no paths, or the host has not exited
    (it is being stopped, and its stop removes its own files)."""
    if paths is None or proc.returncode is None:
        return None
    left: list[str] = []
    readers: tuple[tuple[Path, Callable[[Path], Any]], ...] = (
        (paths.service_json, lambda p: read_service(p, paths.root)),
        (paths.service_lock, read_lock))
    for path, read in readers:
        if not os.path.lexists(path):
            continue
        try:
            record = read(path)
        except IntloomError:
            left.append(path.name)  # half written, most likely by it
            continue
        if record is None or record.pid == proc.pid:
            left.append(path.name)
    return left


def _ready_line(line: bytes, progress: Progress | None,
                importing: _Importing) -> ServiceView | None:
    try:
        message = json.loads(line)
        event = message["event"]
        if event == "progress":
            importing.seen(message)
        if event == "ready":
            return msgspec.convert(message["service"], ServiceView)
        if event == "error":
            err = message["error"]
            raise IntloomError(str(err["code"]), str(err["message"]),
                               retryable=bool(err.get("retryable", False)))
        if event == "progress" and progress is not None:
            step = str(message["step"])
            progress(f"Importing {importing.source}..." if step == "importing"
                     and importing.source is not None else _STEPS.get(step, step))
        return None
    except IntloomError:
        raise
    except (ValueError, KeyError, TypeError, msgspec.ValidationError):
        raise IntloomError(
            "CLI_SERVICE_UNAVAILABLE", "The service sent an invalid readiness report."
        ) from None


def _stop_child(proc: subprocess.Popen[bytes]) -> bool:
    """Terminate the host *we* launched (never a saved pid), then make sure it is reaped.

    True when it had to be killed: it could not release its files, so they remain.
    """
    if proc.poll() is not None:
        return False
    try:
        proc.terminate()
        proc.wait(timeout=_TERMINATE_GRACE)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=_TERMINATE_GRACE)
        return True
    except ProcessLookupError:
        pass
    return False


def _lock_left_by(paths: ProjectPaths, pid: int) -> bool:
    """Whether ``service.lock`` names ``pid``, the host this start launched and had to kill:
    it remains, and only recover removes it (DESIGN section 3)."""
    try:
        lock = read_lock(paths.service_lock)
    except IntloomError:
        return False
    return lock is not None and lock.pid == pid


def _start_timeout(paths: ProjectPaths, pid: int, killed: bool,
                   stuck: str = "") -> IntloomError:
    """The start deadline passed: say what became of the host we launched, truthfully, and
    the source it was stuck importing (``stuck``, _Importing.fact), if any."""
    if not killed:
        return IntloomError(
            "CLI_SERVICE_TIMEOUT",
            f"{_TIMEOUT}.{stuck} The host that was launched (pid {pid}) stopped and released its "
            "files. Start again with a longer --timeout, or see .intloom/logs/ for the slow "
            "step.",
        )
    if not _lock_left_by(paths, pid):
        return IntloomError(
            "CLI_SERVICE_TIMEOUT",
            f"{_TIMEOUT}.{stuck} The host that was launched (pid {pid}) did not stop within "
            f"{_TERMINATE_GRACE:g} s of SIGTERM and was killed. Start again with a longer "
            "--timeout, or see .intloom/logs/ for the slow step.",
        )
    # Startup never removes a lock (DESIGN section 3), not even our own child's: recover
    # is the one command that does, after proving its owner gone.
    if paths.connection_json.exists():
        cleanup = "Run intloom doctor, then intloom recover to remove it"
    else:
        cleanup = (
            "intloom recover cannot remove it, because this first start was killed before it "
            "wrote connection.json: confirm with intloom doctor that pid "
            f"{pid} has exited, then delete {paths.service_lock}"
        )
    return IntloomError(
        "CLI_SERVICE_TIMEOUT",
        f"{_TIMEOUT}.{stuck} The host that was launched (pid {pid}) did not stop within "
        f"{_TERMINATE_GRACE:g} s of SIGTERM and was killed, so its {paths.service_lock} "
        f"remains and blocks the next start. {cleanup}; then start again with a longer "
        "--timeout.",
    )


def ctrl_c_stops() -> bool:
    """Whether Ctrl-C reaches a foreground host started now: SIGINT inherited ignored
    (``cmd &`` in a script) stays ignored (Host.keep_ignored), and a Ctrl-C then stops
    nothing, so what the terminal is told must not say it does."""
    return signal.getsignal(signal.SIGINT) != signal.SIG_IGN


def _run_foreground(root: Path, *, port: int | None, strict: bool, progress: Progress | None,
                    on_ready: Callable[[StartResult], None] | None,
                    on_lost: Callable[[ErrorView], None] | None = None,
                    on_stopped: Callable[[StopResult], None] | None = None,
                    on_stopping: Callable[[str], None] | None = None,
                    deadline: float | None = None) -> StartResult:
    from intloom.authoring.loader import slow_import_notice
    from intloom.host.daemon import Host, HostOptions, with_test_hooks
    from intloom.host.readiness import ReadyChannel

    ready: list[ServiceView] = []
    failure: list[ErrorView] = []
    # A source that loops or waits when imported held this terminal silent: named on
    # stderr after a while, as doctor does. Its watcher ends once the host serves.
    watching = contextlib.ExitStack()
    importing = watching.enter_context(slow_import_notice())
    # --timeout bounds the start here too, as the launcher bounds a host it launched: at
    # the deadline the host is sent SIGTERM, which interrupts a slow Workflow import, and
    # it releases its files. It was not bounded at all: --timeout 60 waited for ever.
    starting = threading.Lock()
    # Once the deadline passed: the import it was stuck in then (_Importing.fact), or "".
    timed_out: list[str] = []

    def too_late() -> None:
        with starting:
            if not ready and not failure:
                # Taken before expire(): once the host sees too_late it may abort and return
                # at once, and its failure must then read as this timeout.
                timed_out.append(where.fact())
                # False once the host committed to serve (service.json is written): a
                # deadline that came a moment after must not stop a host that serves.
                if not host.expire():
                    timed_out.clear()
                    return
                # And a signal: it interrupts a Workflow import, which checks no flag.
                os.kill(os.getpid(), signal.SIGTERM)

    timer = None if deadline is None else threading.Timer(
        max(0.0, deadline - time.monotonic()), too_late)

    def seen(service: ServiceView) -> None:
        watching.close()
        with starting:
            ready.append(service)
        if timer is not None:
            timer.cancel()
        if on_ready is not None:
            on_ready(StartResult(service=service, reused=False))

    armed: list[bool] = []

    # Where the start was when its deadline came: a timeout named the import as the slow
    # part even when the host was taking its lock or restoring Runs.
    where = _Importing()

    def step(name: str) -> None:
        # The first step is taken once the host handles SIGTERM (before, it would kill
        # the process): only now may the deadline's SIGTERM come.
        if timer is not None and not armed:
            armed.append(True)
            timer.start()
        if name != "importing":  # told with its source, by import_began
            where.seen({"step": name})
        if progress is not None:
            progress(name)

    def import_began(source: str | None) -> None:
        if source is not None:
            where.seen({"step": "importing", "source": source})
        importing(source)

    channel = ReadyChannel(on_progress=step, on_ready=seen, on_failed=failure.append,
                           on_importing=import_began)
    # A launched host works in the project root (_launch): so does this one, or a Workflow
    # reading a project file by a relative path loaded, and a Step wrote, only in one of them.
    # The directory to go back to is held open, not named: one removed since (a shell left in
    # a deleted build directory) has no name, and os.getcwd() raised before the host started.
    try:
        previous: int | None = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:  # unreadable: there is nothing to go back to
        previous = None
    host = Host(with_test_hooks(HostOptions(root=root, port=port, strict=strict)), channel)
    lost: list[ErrorView] = []

    def last_words(view: ErrorView) -> None:
        lost.append(view)
        if on_lost is not None:
            on_lost(view)

    host.last_words = last_words
    host.keep_ignored = True
    ctrl_c = ctrl_c_stops()

    def stopping(running: int, grace: float) -> None:
        runs = "1 running Run" if running == 1 else f"{running} running Runs"
        again = ("a second Ctrl-C (or any stop signal)" if ctrl_c
                 else f"a second stop signal (kill -TERM {os.getpid()})")
        if on_stopping is not None:
            on_stopping(
                f"Stopping: waiting up to {grace:g} s for the Steps of {runs} to reach their "
                "checkpoint (the next start reports what is still running then "
                f"RUN_INTERRUPTED); {again} stops at once, without waiting.")

    host.on_stopping = stopping
    said: list[StopResult] = []

    def stopped(code: int) -> None:
        """What the stop did to the Runs, once; from ``before_exit`` when the host ends the
        process itself, else after it returned. Ctrl-C is the stop ``intloom stop`` sends:
        its log says the same, and a Run cut mid-Step must be named here too."""
        if said or not ready or failure or host.release_problems or code != 0:
            return  # it failed: its error, raised below, is what is said
        log = log_path(ProjectPaths(root), ready[0].log_file)
        result = _stopped(log)
        said.append(msgspec.structs.replace(result, forced=result.forced or host.force_exit))
        if on_stopped is not None:
            on_stopped(said[0])

    def ending(code: int) -> None:
        """``before_exit``: the host ends the process itself (a second signal, a thread
        stuck in user code), so what its stop ended with is said now or never: a stop that
        kept its files exited 1 without a word."""
        error = None if not ready or failure or lost else _stop_error(host, ready[0], code)
        if error is None:
            stopped(code)
        elif on_lost is not None:
            on_lost(error.view())

    host.before_exit = ending
    try:
        os.chdir(root)
        if timer is not None:
            timer.daemon = True
        code = host.run()
    finally:
        watching.close()
        if timer is not None:
            timer.cancel()
        if previous is not None:
            with contextlib.suppress(OSError):
                os.fchdir(previous)
            os.close(previous)
    if failure:
        if timed_out and failure[0].code == "CLI_SERVICE_CLOSING":
            raise IntloomError(
                "CLI_SERVICE_TIMEOUT",
                f"{_TIMEOUT}; the host was stopped at the deadline (SIGTERM) and released its "
                f"files.{timed_out[0]} Start again with a longer --timeout"
                + ("." if timed_out[0] else ", or see .intloom/logs/ for the slow step."),
            )
        if failure[0].code == "CLI_SERVICE_CLOSING" and host.stop_signal == "SIGINT":
            # Ctrl-C before it served: the command was interrupted (exit 130, nothing on
            # stdout, docs/cli.md), not a start that failed. SIGTERM and SIGHUP come from a
            # supervisor or a closed terminal: the start did not happen, CLI_SERVICE_CLOSING.
            raise KeyboardInterrupt
        raise IntloomError(failure[0].code, failure[0].message, retryable=failure[0].retryable)
    if not ready:
        raise IntloomError("CLI_SERVICE_UNAVAILABLE", "The service exited during initialization.")
    error = _stop_error(host, ready[0], code)
    if error is not None:
        raise error
    stopped(code)
    return StartResult(service=ready[0], reused=False, stop=said[0] if said else None)


def _stop_error(host: Host, service: ServiceView, code: int) -> IntloomError | None:
    """What a foreground host that served ended with, or None when it stopped as asked."""
    if host.release_problems:
        # Its log was closed before it tried (DESIGN §3): this command is what says it.
        fix = host.release_moved or ("It stays until removed: fix that, then run intloom "
                                     "recover (intloom doctor shows it).")
        return IntloomError(
            "STORAGE_ERROR", f"The host stopped, but {'; '.join(host.release_problems)}. {fix}",
        )
    if code != 0:
        return host.log_lost() or IntloomError(
            "CLI_INTERNAL_ERROR",
            f"The host stopped after an error; see .intloom/logs/{service.log_file}.",
        )
    return None


# ----- stop ----------------------------------------------------------------------------------


class _Target(msgspec.Struct, frozen=True):
    instance_id: str
    pid: int
    create_time: float
    boot_id: str | None


def _unverified(paths: ProjectPaths, target: _Target, asked: _Asked,
                log: Path | None = None) -> str:
    """CLI_SERVICE_BUSY for a target that exited without releasing its files: which files
    it left, and why that can be (the catalogue sentence first, for scripts that grep it)."""
    left: list[Path] = []
    for path, read in ((paths.service_json, lambda: read_service(paths.service_json,
                                                                  paths.root)),
                       (paths.service_lock, lambda: read_lock(paths.service_lock))):
        try:
            value = read()
        except IntloomError:
            left.append(path)  # unreadable: still there
            continue
        if value is not None and value.instance_id == target.instance_id:
            left.append(path)
    if not left:
        return _STOP_UNVERIFIED
    them = "it" if len(left) == 1 else "them"
    kept = _kept_by_log(log)
    if kept:
        why = (f"it stopped as asked, and its log says: {'; '.join(kept)}. Fix that, then run "
               "intloom recover")
    elif asked.stopping:
        why = _unremovable(left, them)
    else:
        why = "it was killed or crashed"
    names = " and ".join(f"{paths.state.name}/{path.name}" for path in left)
    # Another program on the saved port makes the recover this sends the reader to refuse:
    # named, as start, status and doctor name it.
    taken = None if kept or asked.stopping else _taken_after_exit(paths, lead=False)
    return (f"{_STOP_UNVERIFIED} Its host (pid {target.pid}) has exited and left "
            f"{names} behind: {why}. Every file was left as it is."
            + ("" if taken is None else f" {taken}"))


def _unremovable(left: list[Path], them: str) -> str:
    """Why a host asked to stop exited without removing ``left``, its log silent (killed
    before it wrote why, or its log unreadable): what refuses their removal, read from the
    file system as recover and a failed start read it; a guess only when nothing does."""
    facts: dict[str, None] = {}  # ordered and without repeats: one .intloom bars both files
    fixes: dict[str, None] = {}
    for path in left:
        refused = write_refusal(path)
        if refused is not None:
            facts[refused[0]] = None
            fixes[refused[1]] = None
    if facts:
        return (f"it exited after it was asked to stop, without removing {them}: "
                f"{'; '.join(facts)}. {'; '.join(fixes)}, then run intloom recover")
    # Nothing refuses their removal (an immutable file or a read-only file system would
    # have been read above), and its log gave no reason: it was ended during its stop.
    return (f"it exited after it was asked to stop, without removing {them}, and nothing "
            f"seen here refuses their removal: most likely it was killed or crashed during "
            f"its stop (a SIGKILL: a "
            "supervisor's stop timeout shorter than the host's stop, or the kernel's "
            "out-of-memory killer). intloom doctor's last_host check says what it did last; "
            f"then run intloom recover")


def _released(paths: ProjectPaths, target: _Target) -> bool:
    """Neither ``service.json`` nor ``service.lock`` still names the target instance."""
    try:
        info = read_service(paths.service_json, paths.root)
        lock = read_lock(paths.service_lock)
    except IntloomError:
        return False  # unreadable is not proof of anything
    return all(v is None or v.instance_id != target.instance_id for v in (info, lock))


def _unmatched_connection(paths: ProjectPaths, info: ServiceInfo, conn: Connection | None,
                         target: _Target) -> IntloomError:
    """No stop can be sent: connection.json is missing or names another port than the host.
    The reference's sentence, then the facts and the way out that Client.connect, status and
    doctor give for the same files: the bare sentence left the user at "run intloom doctor"
    with nothing said about which file was wrong."""
    if conn is None:
        fact = (f"{paths.connection_json} is missing, so nothing can reach the host "
                f"{paths.service_json.name} names (pid {info.pid}, port {info.port}): a "
                "client reads the host's port and token only from that file.")
    else:
        fact = (f"{paths.service_json} names port {info.port} but {paths.connection_json} "
                f"names {conn.port}, so no client reaches the host it names (pid "
                f"{info.pid}).")
    if _owner_gone(paths, target.pid, target.create_time, target.boot_id):
        # recover checks the saved port with connection.json and never runs without it.
        way = (f"That host (pid {target.pid}) has exited: it was killed or crashed. " + (
            NO_CONNECTION_FIX if conn is None
            else "Run intloom doctor: it says what to do with its files."))
    elif (_owner_alive(paths, target.pid, target.create_time, target.boot_id)
          and _os_lock(paths) == "held"):
        way = ("Put back the connection.json that host wrote; or stop the host directly "
               f"(kill -TERM {target.pid}: a graceful stop), then run intloom start"
               + (", which writes a new one." if conn is None else "."))
    else:
        way = "Run intloom doctor: it says whether that host still runs, and what to do."
    return IntloomError(
        "CLI_SERVICE_METADATA_INVALID",
        "Service identity does not match connection configuration. Shutdown was not "
        f"requested. {fact} {way}",
    )


def _target(info: ServiceInfo | None, lock: ServiceLock | None) -> _Target:
    if info is not None and lock is not None and (
        info.instance_id != lock.instance_id or info.pid != lock.pid
    ):
        # "name different instances" was said of two files naming one instance and two
        # pids: the facts are each file's instance and pid.
        raise IntloomError(
            "CLI_SERVICE_CONFLICT",
            "Service identity changed during inspection: service.json names instance "
            f"{info.instance_id} (pid {info.pid}) and service.lock instance "
            f"{lock.instance_id} (pid {lock.pid}), where one host writes both. Nothing was "
            "sent. Run intloom status again: a host starting meanwhile is seen whole in a "
            "moment; if the two still differ, intloom doctor says which owner is alive and "
            "what to do with the files.",
        )
    if lock is not None:
        return _Target(lock.instance_id, lock.pid, lock.create_time, lock.boot_id)
    assert info is not None
    return _Target(info.instance_id, info.pid, info.create_time, None)


_NOT_REACHED: Final = "the time ran out before the host could be reached"


class _Asked(NamedTuple):
    """What sending the stop request came to, for a truthful timeout message."""

    unsent: str | None  # why it was not sent, in words; None: sent (its reply may be lost)
    stopping: bool = False  # the host said it is stopping (its reply, or a refusal)
    # When (monotonic) the host said its stop would be over (its reply's ``within``); None
    # when it did not say (an older host, a lost reply, a refusal).
    until: float | None = None


# ``stop``'s deadline without --timeout, unless the host says its stop may take longer.
_STOP_TIMEOUT: Final = 10.0
# Test-only: that deadline in seconds instead, so a test of a stop that outlasts it need not
# hold a host's stop past 10 s (the host's INTLOOM_TEST_SUSPEND_GRACE shortens the other side).
STOP_TIMEOUT_ENV: Final = "INTLOOM_TEST_STOP_TIMEOUT"
# ... and for a host still starting (importing its Workflows, restoring its Runs), which can
# be asked to stop only once it serves: as long as ``start`` gives a host by default. With
# 10 s, a stop during a slow import timed out, unsent, and the host then served on.
_STARTING_TIMEOUT: Final = 300.0
_STARTING: Final = "the host was still starting and never served requests"
# A host on its way out also has only its lock, for a moment: one still seen so after this
# long is starting, and the stop says what it waits for.
_STARTING_SAID: Final = 0.5


def _default_stop_timeout() -> float:
    """``_STOP_TIMEOUT``, or ``STOP_TIMEOUT_ENV`` when that is a positive number of seconds (any
    other value is ignored: a test hook must not fail a CLI)."""
    try:
        value = float(os.environ.get(STOP_TIMEOUT_ENV) or "nan")
    except ValueError:
        return _STOP_TIMEOUT
    return value if 0 < value <= MAX_SECONDS else _STOP_TIMEOUT  # NaN compares False


def _within(seconds: float | None) -> float | None:
    """A host's ``within`` as a wait: None unless a finite number, kept to 0..MAX_SECONDS."""
    if seconds is None or not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_SECONDS)


def _logged_until(log: Path | None) -> float | None:
    """When (monotonic) the stop the host's log says it began should be over: its
    ``service_stopping`` line's ``within`` from that line's time. For a stop that found the
    host already stopping, which gets no reply of its own to say it."""
    line = last_line(log, STOPPING)  # before a line per Run the stop suspended
    if line is None:
        return None
    try:
        event = json.loads(line)
        began = datetime.fromisoformat(event["time"]).timestamp()
        within = _within(event.get("within"))
    except (ValueError, KeyError, TypeError):
        return None
    if within is None:
        return None  # an older host's line
    # Never longer than ``within`` from now, should the clock have been set back.
    return time.monotonic() + max(0.0, min(within, began + within - time.time()))


def _stop_deadline(deadline: float, asked: _Asked, log: Path | None) -> float:
    """The deadline of a stop given no --timeout: its own, or the host's when later (what it
    said its stop may take, in its reply or its log): a host closing 30,000 new snapshots
    takes longer than 10 s, and a stop that gave up on it then reported a timeout for a host
    that went on to stop cleanly."""
    until = asked.until
    if until is None and asked.stopping:
        until = _logged_until(log)
    return deadline if until is None else max(deadline, until)


def _request_stop(root: Path, paths: ProjectPaths, target: _Target,
                  deadline: float, log: Path | None) -> _Asked:
    """Send Stop to the target, at most once, within ``deadline``. Returns when the wait
    should begin (the request is never resent). ``log``: the target's own log, which says
    whether a host that no longer listens is stopping."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return _Asked(_NOT_REACHED)
    try:
        # The hello and the request are bounded by what is left of the deadline: a paused
        # host must not stretch --timeout by the client's own 5 s hello timeout.
        client = Client.connect(root, timeout=remaining, request_timeout=remaining)
    except IntloomError as exc:
        if exc.code == "CLI_SERVICE_OFFLINE" or isinstance(exc, ServiceStarting):
            # Starting, to the client: service.json gone and the lock still held, as a host
            # leaves them for a moment on its way out.
            if last_line(log, STOPPING) is not None:
                # Its listener closed by a stop begun before this one, it writes its Runs'
                # snapshots: waited for as long as its log says that stop may take, not
                # 10 s ("Cannot verify resource cleanup" of a host that went on to stop).
                return _Asked("the host was already stopping (it had stopped listening)",
                              stopping=True)
            return _Asked("the host no longer listened on its port")
        if exc.code == "CLI_SERVICE_CLOSING":
            return _Asked("the host was already stopping", stopping=True)
        if isinstance(exc, HelloFailed) and exc.cause is not None:
            # It did answer, or hung up: say what, not that it stayed silent.
            return _Asked(f"the host (pid {target.pid}) accepted the connection but did not "
                          f"answer the hello as this project's host ({exc.cause})")
        if exc.code == "CLI_SERVICE_UNAVAILABLE":
            # Accepted but no hello within the deadline: paused, hung or busy. Paused can be
            # read, and has its own fix.
            from intloom.host.liveness import paused

            why = (f"it is stopped by a signal (SIGSTOP, Ctrl-Z or a debugger): kill -CONT "
                   f"{target.pid} resumes it" if paused(target.pid) else "paused, hung or busy")
            return _Asked(f"the host (pid {target.pid}) accepted the connection but did not "
                          f"answer the hello within {remaining:.1f} s ({why})")
        if exc.code == "CLI_SERVICE_METADATA_INVALID":
            if _released(paths, target):
                return _Asked("the host had already released its files")
            raise
        if exc.code == "BUSY":
            # Its connections (or descriptors) are all taken: "close idle clients" alone
            # leaves a user whose leaked clients hold them with no way to stop it.
            raise IntloomError(
                "CLI_SERVICE_UNAVAILABLE",
                f"The host (pid {target.pid}) refused the connection, so the stop request was "
                f"not sent and it runs on: {exc.message} Retry intloom stop in a moment, or "
                f"stop it with kill -TERM {target.pid} (a graceful stop: it suspends its Runs "
                "at their boundaries, then exits).",
                retryable=True,
            ) from None
        if exc.code in ("PROTOCOL_MISMATCH", "UNAUTHORIZED"):
            # The host refused the hello (another socket protocol, a token not its own): no
            # stop was sent, so "the service rejected shutdown" blamed a request it never got,
            # under another code than every other command gives. Its own words say how to
            # stop it.
            raise
        raise IntloomError(
            "CLI_SERVICE_UNAVAILABLE",
            f"The service rejected shutdown ({exc.code}: {exc.message})",
        ) from None
    with client:
        if client.hello.instance_id != target.instance_id:
            # A replacement answers: the target is already gone, never stop the new one.
            return _Asked("a replacement host answered instead")
        # What the hello left of the deadline, not what there was before it; for connecting
        # again too, should the host close this connection before the request goes out
        # (the client's own 5 s would stretch a stop --timeout 1 to 5 s).
        left = max(_MIN_WAIT, deadline - time.monotonic())
        client.request_timeout = client.connect_timeout = left
        try:
            reply = client.stop_reply(target.instance_id)
        except IntloomError as exc:
            if exc.code == "CLI_SERVICE_CLOSING":
                return _Asked(None, stopping=True)
            if exc.code == "PROJECT_REQUEST_FAILED":
                return _Asked(None)  # the reply was lost: never resent
            if exc.code == "PROJECT_CONNECTION_FAILED":
                # The host closed this connection before the request went out, and would
                # not take another: what a host stopping for another stop does (it closes
                # every connection). Nothing was sent; the wait says whether it goes.
                cause = exc.__cause__
                if isinstance(cause, IntloomError) and cause.code == "CLI_SERVICE_CLOSING":
                    # It refused the new hello as shutting down: it said it is stopping.
                    return _Asked("the host closed the connection first and refused another, "
                                  "as it was already stopping", stopping=True)
                return _Asked("the host closed the connection first (a stopping host closes "
                              "them all)")
            if exc.code == "CONFLICT":
                if _released(paths, target):
                    return _Asked(None)
                raise IntloomError(
                    "CLI_SERVICE_CONFLICT", f"The service rejected shutdown ({exc.message})"
                ) from None
            raise IntloomError(
                "CLI_SERVICE_UNAVAILABLE", f"The service rejected shutdown ({exc.code})."
            ) from None
    within = _within(reply.within)
    return _Asked(None, stopping=True,
                  until=None if within is None else time.monotonic() + within)


def _stop_timed_out(target: _Target, timeout: float, asked: _Asked) -> str:
    """CLI_SERVICE_TIMEOUT's message: what is known of the host, and what to do."""
    timeout = round(timeout, 1)  # the seconds waited, the host's own bound among them
    if asked.unsent == _NOT_REACHED:
        # Nothing was asked of the host (--timeout 0, or one the reading of its files used
        # up): doctor would find nothing wrong; a longer --timeout is what helps.
        return (f"The stop request was not sent: the time ran out ({timeout:g} s) before the "
                f"host (pid {target.pid}) could be reached, so it runs on as it was. Run "
                "intloom stop again with a longer --timeout (the default is 10 s).")
    said = ("The stop request was sent once and not resent." if asked.unsent is None
            else f"The stop request was not sent: {asked.unsent}.")
    if asked.unsent == _STARTING:
        # doctor would find a live owner and nothing wrong: what helps is the host's pid.
        return (f"The host (pid {target.pid}) was still starting after {timeout:g} s "
                "(importing its Workflows or restoring its Runs) and never served requests, "
                "so the stop request was not sent and it goes on starting. Run intloom stop "
                "again once it has started (intloom status says when; a longer --timeout "
                f"waits for it), or stop its start now with kill -TERM {target.pid} (a "
                "graceful stop: it interrupts a Workflow's import at once).")
    if not asked.stopping:
        return ("Cannot verify resource cleanup by the original instance (pid "
                f"{target.pid}) within {timeout:g} s. Run intloom doctor. {said}")
    # It said it is stopping: a Step still running holds the stop for up to the host's
    # grace, and doctor would only report an owner that is alive. Waiting is what helps.
    bound = (" (past the longest it said its stop may take)"
             if asked.until is not None and time.monotonic() >= asked.until else "")
    if _stopped_by_signal(target.pid):
        # Every other command names the pause and kill -CONT; "run intloom stop again to
        # wait for it" waited for a process that does nothing until resumed.
        return (f"The host (pid {target.pid}) began its stop and is stopped by a signal "
                "(SIGSTOP or Ctrl-Z): it suspends nothing and releases nothing "
                f"until it is resumed, and had not released its files within {timeout:g} s. "
                f"{said} Resume it with kill -CONT {target.pid}: it then finishes its stop "
                "and exits (intloom stop again waits for that).")
    return (f"The host (pid {target.pid}) is still stopping: it suspends its Runs at their "
            "boundaries (a Step still running gets the host's grace to reach one) and then "
            f"releases its files, which it had not done within {timeout:g} s{bound}. {said} "
            "Run intloom stop again to wait for it (a longer --timeout waits longer); if it "
            "never finishes, run intloom doctor.")


def stop_service(root: str | os.PathLike[str], *, timeout: float | None = None) -> bool:
    """Stop the observed host instance. ``False`` when offline (nothing is created)."""
    return stop_service_report(root, timeout=timeout).stopped


def stop_service_report(root: str | os.PathLike[str], *, timeout: float | None = None,
                        starting: Callable[[str], None] | None = None) -> StopResult:
    """Stop the observed host instance, and say which Runs it cut mid-Step.

    Never signals and never cleans up: crash leftovers are CLI_SERVICE_BUSY with every file
    byte-identical; a host that does not release its files in time is CLI_SERVICE_TIMEOUT.
    ``timeout`` None: 10 s, or as long as the host says its stop may take, when longer; a
    host still starting is waited for up to 300 s (as ``start`` waits), then asked.
    ``starting`` is told, once, when the host is still starting, what the stop waits for.
    """
    from intloom.host.observe import observe

    # The whole stop, the hello and the request included, keeps to ``timeout``.
    began = time.monotonic()
    deadline = began + _checked_timeout(_default_stop_timeout() if timeout is None else timeout)
    root = resolved_root(root, "stop_service")
    paths = ProjectPaths(root)
    if root.is_file():  # intloom.toml itself: observing .intloom/ below it raised OSError
        raise not_a_project(root, "stop_service")
    snap = observe(root)  # strict, consistent, read-only; invalid metadata raises here
    info, lock, conn = snap.service.value, snap.lock.value, snap.connection.value
    if info is None and lock is None:
        if not (root / CONFIG_NAME).is_file() and not paths.state.is_dir():
            # A typo, or a subdirectory of the project: "nothing was running" (False) would
            # hide a host that runs, as the CLI's --project refuses such a path.
            raise not_a_project(root, "stop_service")
        return StopResult(stopped=False, cut=[])
    target = _target(info, lock)
    if info is not None and (conn is None or conn.port != info.port):
        raise _unmatched_connection(paths, info, conn, target)
    tried = False  # the request is tried at most once, whether or not it could be sent
    asked = _Asked(_STARTING)
    # A host already dead cannot be stopped: files of it that vanish during this stop were
    # removed by another command (intloom recover, which holds the OS lock meanwhile, so
    # _owner_gone cannot tell), and "The original service instance stopped" was claimed.
    dead = _process(paths, target.pid, target.create_time, target.boot_id) == "gone"
    log = log_path(paths, info.log_file) if info is not None else None
    if info is not None and not dead and _stopped_by_signal(target.pid):
        # Its hello would wait out the whole --timeout (10 s), then a timeout said it.
        raise _paused_host(target.pid, stopping=last_line(log, STOPPING) is not None,
                           stop=True)
    if info is not None:
        asked = _request_stop(root, paths, target, deadline, log)
        tried = True
        if timeout is None:
            deadline = _stop_deadline(deadline, asked, log)
    elif timeout is None:
        deadline = began + _STARTING_TIMEOUT
    told = starting is None
    lock_free_since: float | None = None  # the OS lock seen free since, with tried False

    def released() -> StopResult:
        # Dead by the process's identity alone is not enough: a host in another pid
        # namespace, or one a concurrent stop ended between the observe and the probe, reads
        # as gone too. One that never took the request and whose log says no stop crashed.
        if dead and asked.unsent is not None and not asked.stopping and (
                log is None or last_line(log, STOPPING) is None):
            return StopResult(stopped=False, cut=[])  # as once its files are gone
        if not tried:
            # Seen only by its lock: it may have served and been stopped by a concurrent
            # stop between two of our polls. "It exited before it ever served ... suspended
            # 0" was then said of a host that had served and suspended Runs.
            served_log = _served_log(paths, target.instance_id)
            if served_log is not None:
                return _with_changes(root, _stopped(served_log), served_log)
            return StopResult(stopped=True, cut=[], suspended=0, served=False)
        return _with_changes(root, _stopped(log), log)

    while True:
        if _released(paths, target):
            return released()
        if _owner_gone(paths, target.pid, target.create_time, target.boot_id):
            if _released(paths, target):
                return released()
            raise IntloomError("CLI_SERVICE_BUSY", _unverified(paths, target, asked, log))
        if not tried:
            # Observed only by its lock (still starting): ask once it serves.
            if _stopped_by_signal(target.pid):
                raise _paused_host(target.pid, starting=True, stop=True)
            try:
                now_info = read_service(paths.service_json, root)
            except IntloomError:
                now_info = None
            now = time.monotonic()
            if now_info is None and _os_lock(paths) == "free":
                # A starting host holds the OS lock from right after its lock file appears:
                # a live owner that leaves it free is no host (a forged or copied lock), which
                # start refuses at once (_lock_owner). Waited for, it ran out the 300 s.
                if lock_free_since is None:
                    lock_free_since = now
                elif now - lock_free_since >= _LOCK_SETTLE:
                    raise _busy(paths)
            else:
                lock_free_since = None
            if now_info is not None and now_info.instance_id == target.instance_id:
                if timeout is None:  # from now on, as for a host found serving
                    deadline = time.monotonic() + _default_stop_timeout()
                # Its log says what the stop did to the Runs; unknown until it served.
                log = log_path(paths, now_info.log_file)
                asked = _request_stop(root, paths, target, deadline, log)
                tried = True
                if timeout is None:
                    deadline = _stop_deadline(deadline, asked, log)
            elif not told and time.monotonic() - began >= _STARTING_SAID:
                told = True
                assert starting is not None
                starting(f"The service (pid {target.pid}) is still starting: it is asked to "
                         "stop once it serves.")
        elif _stopped_by_signal(target.pid):
            # Paused on its way out: it finishes nothing until resumed, and the stop waited
            # out its whole bound (27 s) to say so.
            raise _paused_host(target.pid, stop=True, stopping=asked.unsent is None
                               or asked.stopping or last_line(log, STOPPING) is not None)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise IntloomError("CLI_SERVICE_TIMEOUT",
                               _stop_timed_out(target, deadline - began, asked))
        time.sleep(min(_POLL, remaining))  # a poll between two reads of the metadata


_SERVED: Final = b'"event":"service_ready"'
_SERVED_SEARCHED: Final = 64  # the newest host logs searched for a host's own


def _served_log(paths: ProjectPaths, instance_id: str) -> Path | None:
    """The log of host ``instance_id`` when it says that host served (``service_ready``);
    None otherwise. Its log is among the newest few: it opened one as it started."""
    from intloom.project import scan_logs

    try:
        found, _, _ = scan_logs(paths.logs)
    except OSError:
        return None
    mark = f'"instanceId":"{instance_id}"'.encode()
    # Newest first: concurrent starts that failed open logs of their own after it.
    for path in reversed(found[-_SERVED_SEARCHED:]):
        head = read_log(path, 4096, tail=False)
        if head is not None and mark in head.split(b"\n", 1)[0]:
            return path if last_line(path, _SERVED) is not None else None
    return None


def _stop_lines(log: Path | None) -> list[dict[str, Any]]:
    """The log's lines from its last ``service_stopping`` on (newest first); none when it
    cannot be read."""
    tail = _log_tail(log)
    if tail is None:
        return []
    lines = tail.splitlines()
    found: list[dict[str, Any]] = []
    for line in reversed(lines):
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # the first line of a tail may be cut
        if not isinstance(entry, dict):
            continue
        if entry.get("event") == "service_stopping":
            break
        found.append(entry)
    return found


def _kept_by_log(log: Path | None) -> list[str]:
    """Why a stopped host kept its service files, as its log says (``service_files_kept``,
    written before the log closed: the files go after it)."""
    for entry in _stop_lines(log):
        problems = entry.get("problems")
        if entry.get("event") == "service_files_kept" and isinstance(problems, list):
            return [str(p) for p in problems]
    return []


def _with_changes(root: Path, result: StopResult, log: Path | None) -> StopResult:
    """``result`` with the sources that changed since the host loaded them, when it left
    unfinished Runs (or may have: a host that did not say) that the next start would hold."""
    if result.suspended == 0 and not result.others:
        return result
    from intloom.client.drift import since_log  # hashes source trees: only when it matters

    try:
        changed = since_log(root, log)
    except (IntloomError, OSError, ValueError):  # advice: the stop itself is done
        return result
    return msgspec.structs.replace(result, changed=changed)


def _stopped(log: Path | None) -> StopResult:
    """A stopped host's result, with the Runs it cut: the ``runs_cut_at_stop`` line written
    after its last ``service_stopping``. A log that cannot be read names none."""
    cut: list[CutRun] = []
    cut_count = 0
    suspended: int | None = None
    lost: list[CutRun] = []
    lost_count = 0
    others = 0
    forced = False
    for entry in _stop_lines(log):
        event = entry.get("event")
        if event == "signal_received" and entry.get("action") == "force":
            # A second stop signal during the grace: the host stopped at once, before it
            # counted what it suspended ("its log does not say" read as a lost log).
            forced = True
        if event not in ("runs_cut_at_stop", "runs_suspended_at_stop"):
            continue
        runs = [CutRun(str(r.get("runId")), str(r.get("evidence")))
                for r in entry.get("runs", []) if isinstance(r, dict)]
        count = entry.get("count")
        if event == "runs_cut_at_stop":
            cut, cut_count = runs, count if isinstance(count, int) else len(runs)
        else:
            suspended = count if isinstance(count, int) else None
            interrupted = entry.get("interrupted")
            lost, lost_count = runs, interrupted if isinstance(interrupted, int) else len(runs)
            unfinished = entry.get("unfinished")
            others = unfinished if isinstance(unfinished, int) else 0
    return StopResult(stopped=True, cut=cut, cut_count=cut_count, suspended=suspended,
                      lost=lost, lost_count=lost_count, others=others, forced=forced)
