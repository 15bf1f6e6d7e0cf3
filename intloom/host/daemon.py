"""The host process: ``startup()`` -> ``serve()`` -> ``shutdown()``, with signals as flags.

Startup order (each step can fail the start, and a failed start releases what it took):
take ``service.lock`` -> open the log -> read ``intloom.toml`` and the saved connection ->
load Workflows, open the store, restore every Run -> listen on 127.0.0.1 -> write
``connection.json`` (only when missing or its port changed) -> write ``service.json`` last ->
report ready to the launcher.

Shutdown order (a Stop request or SIGTERM/SIGINT/SIGHUP/SIGQUIT): refuse new work -> suspend
Runs at their boundaries (checkpoints kept) -> close connections and the listener -> close the
store -> ``log_closed`` and seal the log -> remove our ``service.json`` and ``service.lock``.
A second signal cuts the graceful waits short. An unexpected exception is fatal: it is logged
as ``process_failed`` and the files are left exactly as a crash would leave them.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

import msgspec

from intloom import __version__
from intloom.errors import ErrorView, IntloomError, LoadInterrupted
from intloom.executor.runtime import Runtime, held_reason
from intloom.fsutil import no_inode_left, shell_arg, storage_fix, write_refusal
from intloom.host.allocator import keep_large_buffers_mapped
from intloom.host.boot import Booted, boot, check_error, starved
from intloom.host.handlers import Handlers
from intloom.host.logfile import HostLog, utc_now
from intloom.host.logretention import LOGS_CAP, prune_logs
from intloom.host.loopwatch import LoopWatch
from intloom.host.metadata import METADATA_VERSION, ServiceInfo, current_identity
from intloom.host.ownership import Ownership, new_token
from intloom.host.portholder import describe, listeners
from intloom.host.readiness import ReadyChannel
from intloom.host.server import (
    FD_RESERVE,
    Limits,
    Server,
    bind_port,
    descriptors,
    descriptors_fix,
)
from intloom.host.signals import HANDLED, IGNORED, REPEATED, STOPS
from intloom.project import ProjectPaths, load_config, require_short_path
from intloom.protocol.messages import (
    FEATURES,
    PROTOCOL,
    RESTORE_LISTED,
    HelloOk,
    RestoreCounts,
    RestoreSummary,
    ServiceView,
    StoreProblem,
    WorkflowProblem,
)
from intloom.runtime.records import PROTOCOL_VERSION as WORKFLOW_PROTOCOL
from intloom.store.files import ensure_dir, lock_dir
from intloom.store.segmentfile import SEGMENT_DESCRIPTORS

__all__ = ["Host", "HostOptions"]

_SIGNALS: Final = STOPS
_IGNORED: Final = IGNORED

# The signal handlers a process forked by Workflow code gets back (``multiprocessing`` with
# its fork start method, ``os.fork()``), while a host serves; None when none serves.
_restore_in_child: dict[signal.Signals, Any] | None = None
_fork_hook_registered = False
# The host serving in this process, whose files and sockets a forked child lets go of.
_serving_host: Host | None = None
# The forking thread's signal mask from before ``_before_fork`` held the host's signals.
_forking = threading.local()


def _forked_children_keep(handlers: dict[signal.Signals, Any] | None,
                          host: Host | None = None) -> None:
    """From now on, a child forked in this process gets ``handlers`` back (None: nothing)
    and lets go of ``host``'s files and sockets."""
    global _restore_in_child, _fork_hook_registered, _serving_host
    _restore_in_child = handlers
    _serving_host = host
    if (handlers is not None or host is not None) and not _fork_hook_registered:
        os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                            after_in_child=_in_forked_child)
        _fork_hook_registered = True


def _before_fork() -> None:
    """Hold the host's signals in the forking thread (and so in the child) until the child
    has its own handlers back. A signal that reached the child before its at-fork hook ran
    (``Pool.terminate()`` of a worker not yet scheduled on a loaded machine; any earlier
    at-fork hook) ran the inherited handler, which wrote it to the host's wakeup fd: the
    host took it as its own and stopped. Held, it waits, then meets the default handler."""
    if _restore_in_child is not None:
        _forking.mask = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)


def _after_fork_in_parent() -> None:
    _restore_mask()


def _restore_mask() -> None:
    mask = getattr(_forking, "mask", None)
    if mask is not None:
        _forking.mask = None
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _in_forked_child() -> None:
    """A child forked by a Step inherits the loop's signal handlers and its wakeup fd (a
    socket shared with the host): a signal to the child was written to the host's loop,
    which took it as its own, so ``multiprocessing.Pool.terminate()`` (a ``with Pool()``
    block's end) SIGTERMed the host, and the child itself ignored it. The child gets the
    handlers the process had before the host installed its own, and no wakeup fd."""
    global _restore_in_child, _serving_host
    handlers, _restore_in_child = _restore_in_child, None
    host, _serving_host = _serving_host, None
    try:
        if host is not None:
            with contextlib.suppress(Exception):
                _let_go_of_host(host)
        if handlers is None:
            return
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)
        for sig, handler in handlers.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    finally:
        with contextlib.suppress(ValueError, OSError):
            _restore_mask()  # what the child was sent meanwhile now meets its own handlers
# How long a foreground host, once stopped, waits for the default executor's threads.
_EXECUTOR_WAIT_S: Final = 2.0
_CUT_LISTED: Final = 50  # Runs named in runs_cut_at_stop; count has them all
# Test hook: raise inside the host right after it reports ready, to exercise process_failed.
FATAL_HOOK: Final = "INTLOOM_TEST_FATAL"
# Test hook: ``WHERE:SIGNAL`` sends the host SIGNAL at that point of its start-up, which no
# outside timing reaches reliably: "listening" (it listens; service.json is not yet written)
# or "published" (service.json is written; the start-up has not yet returned).
START_SIGNAL_HOOK: Final = "INTLOOM_TEST_START_SIGNAL"
# Test hook: PATH. Right after writing service.json the start-up creates PATH.held and waits
# (up to 60 s) until PATH exists, its other threads free to run: what a start's deadline
# that passes in that moment does, without racing the start-up for it.
HOLD_PUBLISHED_HOOK: Final = "INTLOOM_TEST_HOLD_PUBLISHED"
# Test hook: PATH. A stop, once it has closed its listener (before it closes the store and
# removes its files), creates PATH.held and waits (up to 60 s) until PATH exists: the moment
# a status or a start meets a host that no longer listens but still holds the project.
HOLD_UNLISTENED_HOOK: Final = "INTLOOM_TEST_HOLD_UNLISTENED"
# How often a serving host looks whether .intloom/runtime/ is still the directory it locked
# (``Host._moved_away``): the longest a second host started after a move serves beside it.
_HOME_LOOK: Final = 0.2
_PRUNED_NAMED: Final = 50  # removed logs named in logs_pruned (the count has them all)
# A stop's bound on closing the store: the base, plus a share per snapshot the close writes
# (one per Run written since its last snapshot). Measured on a 2-vCPU VM (ext4, load 5-10
# from others' tests, 2026-12-02): 0.35 ms per snapshot (10,000 in 3.5 s, 20,000 in 7.2 s);
# 1 ms leaves room for a busier disk. A fixed 10 s cut a close with 10,000 such Runs short:
# its snapshots were lost, and the next start read the whole log and wrote them all again.
_CLOSE_BOUND_S: Final = 10.0
_CLOSE_S_PER_SNAPSHOT: Final = 0.001


def _let_go_of_host(host: Host) -> None:
    """In a child forked by Workflow code: the host's descriptors (its files under
    ``.intloom/``, with the OS locks of ``service.lock`` and the checkpoint store, and its
    sockets on the project's port) are pointed at /dev/null. Inherited, they kept the locks
    and the port for as long as the child lived (a Pool kept in a global, a worker that
    outlives its Step): after ``intloom stop`` the next ``start`` failed BUSY ("Another
    process holds the checkpoint store"). The numbers stay valid, so the child's copies of
    the host's objects close nothing of its own."""
    state = os.path.realpath(host.paths.state)
    port = host.port
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd <= 2 or fd == devnull:
                continue
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            ours = target == state or target.startswith(state + os.sep)
            if ours or (target.startswith("socket:") and port and _on_port(fd, port)):
                os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _on_port(fd: int, port: int) -> bool:
    """Whether ``fd`` is a TCP socket on 127.0.0.1:``port`` (the host's listener or one of
    its connections)."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False
    try:
        if sock.family != socket.AF_INET:
            return False
        address = sock.getsockname()
        return bool(address[0] == "127.0.0.1" and address[1] == port)
    except OSError:
        return False
    finally:
        sock.close()


def store_close_bound(snapshots: int) -> float:
    """Seconds a stop waits for the store's close, which writes ``snapshots`` files."""
    return _CLOSE_BOUND_S + snapshots * _CLOSE_S_PER_SNAPSHOT


# The suspension's bound past the grace: up to 1 s for the cancelled Steps to end
# (Driver.drain), and a margin (see ``Host._release``).
_SUSPEND_MARGIN_S: Final = 2.0
# The suspension also passes over every loaded Run (Runtime.suspend and outlook, yielding
# every few thousand): 95,000 waiting Runs took 14 s (0.15 ms each, on the 2-vCPU VM at
# load 8, 2026-12-02). Its bound, and what a stop tells a client, count 0.5 ms a Run.
_SUSPEND_S_PER_RUN: Final = 0.0005
# What a stop does unbounded after closing the store (writing and sealing the log, removing
# its files, exiting), given room in the bound it tells a client: seconds, generously.
_RELEASE_MARGIN_S: Final = 5.0
# A stop step's bound whose timer fired this many seconds late found a loop that did not
# run (a paused host): the step gets _LATE_GRACE_S more, once (Host._bounded).
_LATE_TIMER_S: Final = 1.0
_LATE_GRACE_S: Final = 3.0


def _identity(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


def _workers_ended(executor: ThreadPoolExecutor, limit: float) -> bool:
    """Shut ``executor`` down; True once its threads have all ended, False when one is still
    inside user code after ``limit`` s (left to the process's exit: a daemon thread waits)."""
    waiter = threading.Thread(target=executor.shutdown, kwargs={"wait": True},
                              name="intloom-executor-shutdown", daemon=True)
    waiter.start()
    waiter.join(limit)
    return not waiter.is_alive()


# asyncio's message for an accept() that failed for want of a resource (selector_events).
_ACCEPT_FAILED: Final = "socket.accept() out of system resource"
_ACCEPT_QUIET: Final = 60.0  # seconds between two connections_not_accepted lines
# The loop reporting this many MemoryErrors within these seconds is the host out of memory.
_STARVED_AFTER: Final = 50
_STARVED_WITHIN: Final = 10.0
_TASK_ERRORS_KEPT: Final = 1000  # distinct task_error keys remembered for the quiet period


class HostOptions(msgspec.Struct, frozen=True):
    root: Path
    port: int | None = None  # None: intloom.toml's port, else the saved one, else any
    strict: bool = False
    limits: Limits = msgspec.field(default_factory=Limits)
    suspend_grace: float = 5.0  # Steps in flight get this long to reach a boundary
    drain_grace: float = 1.0  # replies in flight get this long to be written
    restore_listed: int = RESTORE_LISTED  # a reply's ids per restore list, and store problems
    logs_cap: int = LOGS_CAP  # bytes of host logs past which the oldest closed ones go


# Test-only knobs (seconds, or counts), for a launched and a foreground host alike.
_TEST_LIMITS: Final[tuple[tuple[str, str, Callable[[str], Any]], ...]] = (
    ("INTLOOM_TEST_HELLO_TIMEOUT", "hello_timeout", float),
    ("INTLOOM_TEST_IDLE_TIMEOUT", "idle_timeout", float),
    ("INTLOOM_TEST_WRITE_TIMEOUT", "write_timeout", float),
    ("INTLOOM_TEST_FRAME_TIMEOUT", "frame_timeout", float),
    ("INTLOOM_TEST_REFUSED_QUIET", "refused_quiet", float),
    ("INTLOOM_TEST_FOLLOW_BACKLOG", "follow_backlog", int),
    ("INTLOOM_TEST_FOLLOW_SNDBUF", "follow_sndbuf", int),
    ("INTLOOM_TEST_FOLLOW_HELD", "follow_held", int),
    ("INTLOOM_TEST_MAX_CONNECTIONS", "max_connections", int),
    ("INTLOOM_TEST_MAX_UNPROVEN", "max_unproven", int),
)


def with_test_hooks(options: HostOptions) -> HostOptions:
    """``options`` with the test-only knobs set in the environment (``intloom.host``'s
    docstring lists them): shorter timeouts, a lower connection cap, a shorter grace. A
    value that is not a number is INVALID_REQUEST naming the variable (it failed the start
    CLI_INTERNAL_ERROR, exit 70, naming nothing)."""
    limits = options.limits
    knobs: tuple[tuple[str, str, Callable[[str], Any]], ...] = (
        *_TEST_LIMITS, ("INTLOOM_TEST_SUSPEND_GRACE", "suspend_grace", float),
        ("INTLOOM_TEST_RESTORE_LISTED", "restore_listed", int),
        ("INTLOOM_TEST_LOGS_CAP", "logs_cap", int))
    values: dict[str, Any] = {}
    for name, attribute, kind in knobs:
        text = os.environ.get(name)
        if not text:
            continue
        try:
            values[attribute] = kind(text)
        except ValueError:
            raise IntloomError(
                "INVALID_REQUEST",
                f"{name}={text!r} is not {'an integer' if kind is int else 'a number'}. It is "
                f"a test-only setting of the host: unset it (unset {name}) and start again.",
            ) from None
    for _name, attribute, _kind in _TEST_LIMITS:
        if attribute in values:
            limits = msgspec.structs.replace(limits, **{attribute: values.pop(attribute)})
    return msgspec.structs.replace(options, limits=limits, **values)


def armed_test_hooks() -> list[str]:
    """The test-only environment variables set for this host (``INTLOOM_TEST_*`` and
    ``INTLOOM_FAULT``), each ``NAME=VALUE``: logged at its start, since a stray export of one
    changes what the host does (a lower connection cap, an injected crash) and said so
    nowhere."""
    return sorted(f"{name}={value[:200]}" for name, value in os.environ.items()
                  if value and (name.startswith("INTLOOM_TEST_") or name == "INTLOOM_FAULT"))


def _start_hooks(where: str) -> None:
    hook = os.environ.get(START_SIGNAL_HOOK)
    if hook is not None and hook.partition(":")[0] == where:
        os.kill(os.getpid(), signal.Signals[hook.partition(":")[2]])
    if where == "published":
        _hold(HOLD_PUBLISHED_HOOK)


def _hold(hook: str) -> None:
    """A test hook's hold: PATH.held is created, then PATH waited for (up to 60 s)."""
    held = os.environ.get(hook)
    if held:
        Path(f"{held}.held").touch()
        until = time.monotonic() + 60
        while not os.path.exists(held) and time.monotonic() < until:
            time.sleep(0.01)


class _Abort(Exception):
    """Startup ended without a fault of its own (a signal arrived): report, then release."""

    def __init__(self, error: IntloomError) -> None:
        self.error = error


def _log_write_failed(path: Path, cause: str, errno: int | None) -> IntloomError:
    """The start fails when its log cannot be written (docs/lifecycle.md, "When a write
    fails"): ``path`` is the log file, or the logs directory when no file could be created.
    The advice is storage_fix's, from the errno and what the file system says refuses."""
    # A log file not yet created is judged by the directory that would hold it.
    written = path / "LOG.jsonl" if path.is_dir() else path
    return IntloomError(
        "LOG_WRITE_FAILED",
        f"The host log {path} could not be written ({cause}); the host did not start. "
        f"{storage_fix(OSError(errno, cause), written, replaced=False)}",
    )


def _listener(port: int, exc: OSError) -> str:
    """Who holds ``port``, as the rest of a sentence, when the bind failed for being taken:
    with two projects set to one port, "Address already in use" left the user to find which
    of their other projects holds it, and how to free it."""
    if exc.errno != errno.EADDRINUSE:
        return ""
    found = listeners(port)
    if not found:
        return f"; find its listener with: ss -ltnp 'sport = :{port}'"
    # Only an appositive ("pid N (name), the intloom host of the project X") is closed by a
    # comma: "pid N (name), listens there" read as a slip.
    closing = "," if found[-1].project is not None else ""
    verb = "listens" if len(found) == 1 else "listen"
    said = f"; {', '.join(map(describe, found))}{closing} {verb} there"
    projects = [one.project for one in found if one.project is not None]
    if projects:
        said += f" (intloom --project {shell_arg(str(projects[0]))} stop frees it)"
    return said


class _MovedAway(Exception):
    """The project's runtime directory is no longer the one this host locked: ``fact``.
    ``removed``: that directory was deleted (nothing is left to put back)."""

    def __init__(self, fact: str, removed: bool = False) -> None:
        super().__init__(fact)
        self.fact = fact
        self.removed = removed


class _ImportInterrupted(LoadInterrupted):
    """A stop signal arrived while Workflow modules were importing (see ``Host._importing``).

    A ``LoadInterrupted`` so that the loader, which turns whatever else a module raises into
    a WORKFLOW_LOAD_FAILED problem and goes on to the next entry, lets it through.
    """

    def __init__(self, sig: int, source: str | None, *, before: bool = False) -> None:
        super().__init__(sig)
        self.sig = sig
        self.source = source  # the Workflow source importing when the signal came
        self.before = before  # it came before the first import began


class Host:
    """One host instance for one project. ``run()`` returns the process exit code."""

    def __init__(self, options: HostOptions, ready: ReadyChannel) -> None:
        self.options = options
        self.ready = ready
        self.paths = ProjectPaths(options.root)
        self.instance_id = str(uuid.uuid4())
        self.identity = current_identity()
        self.started_at = utc_now()
        self.ownership = Ownership(self.paths, self.instance_id, self.identity, self.started_at)
        self.log: HostLog | None = None
        self.booted: Booted | None = None
        self.server: Server | None = None
        self.port = 0
        self.config_port: int | None = None  # intloom.toml's port at this start (ServiceView)
        self._store_lock = -1  # lock_dir on runtime/, from before the import to the end
        self._sock: socket.socket | None = None  # bound early, until the server listens on it
        self._stop: asyncio.Event | None = None
        self._forced: asyncio.Event | None = None
        self._stop_reason = ""
        self._importing_source: str | None = None  # the Workflow source importing now
        # The first stop signal that came while the start-up ran without awaiting (see
        # ``_noting``), whose loop handler runs only at the start-up's first await.
        self._noted: int | None = None
        # The signal that first asked this host to stop (SIGINT, ...), if one did: a
        # foreground start that Ctrl-C ended before it served exits as any command
        # interrupted does.
        self.stop_signal: str | None = None
        # Set (from another thread) by ``start --foreground --timeout`` once its deadline
        # passed before the host served: a start that got that far still does not serve.
        # A signal alone is handled on the loop, which a start busy in a long step without
        # an await (a large restore) reaches only after it has reported ready.
        self.too_late = False
        # The start's commit point (``_commit``): once service.json is about to be written,
        # the host serves, and a stop asked for after that stops a host that served. The lock
        # makes the deadline's ``expire`` (another thread) and the commit one decision.
        self._committing = threading.Lock()
        self._serving = False
        self.force_exit = False
        self.log_error: str | None = None  # the host log failed: no new work (LOG_WRITE_FAILED)
        # Why the stop kept service.json or service.lock (Ownership.release), for a
        # foreground host's command to say: the log is closed by then.
        self.release_problems: list[str] = []
        # What to do about them when the project directory was moved (Ownership.moved_fix).
        self.release_moved: str | None = None
        # A foreground host's command: called with the exit code right before ``os._exit``
        # ends the process (a forced stop, or a thread stuck in user code), so that it can
        # still say what the stop did.
        self.before_exit: Callable[[int], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._log_suspend: asyncio.Future[Any] | None = None
        self._signals: list[signal.Signals] = []  # the stop signals this host handles
        self._installed: list[signal.Signals] = []  # and those it ignores, as installed
        self._own_process = False  # run(own_process=...)
        # The project root's and the locked runtime directory's (st_dev, st_ino), once the
        # store is locked: what ``_moved_away`` compares the paths with while serving.
        self._home: tuple[tuple[int, int], tuple[int, int]] | None = None
        self._linked = False
        self._service_back_failed = False
        self._watch: LoopWatch | None = None  # serve starts it, a stop (or a failure) ends it
        # Set by ``start --foreground`` (the host runs in the command's process): how the
        # command says the error a host ends with when it stops serving on its own
        # (``_left_home``), before the process exits as a crash would.
        self.last_words: Callable[[ErrorView], None] | None = None
        # Set by ``start --foreground``: a stop signal its command was started with ignored
        # (nohup's SIGHUP; SIGINT and SIGQUIT of ``cmd &`` in a script) stays ignored, as in
        # any program; handling it stopped a nohup'd host when its terminal closed. SIGTERM
        # is handled even so: a supervisor's stop.
        self.keep_ignored = False
        # Set by ``start --foreground``: told, as a stop begins with Runs still running, how
        # many and the grace it waits for them; else the terminal said nothing for up to the
        # grace after a Ctrl-C, with no word that a second one stops at once.
        self.on_stopping: Callable[[int, float], None] | None = None
        # accept() failing for want of a resource (EMFILE): asyncio reports it once per
        # pending connection and retries every second, a thousand log lines a second that
        # would fill the disk under the log. Said once a minute, with how often it happened.
        self._accept_failures = 0
        self._accept_said_at: float | None = None
        # The same for an error the loop reports (task_error): by (message, error), when it
        # was last said and how often it came since.
        self._task_errors: dict[tuple[str, str | None, str | None], tuple[float, int]] = {}
        self._starving: list[float] = []  # when the loop last reported a MemoryError
        self._starved: MemoryError | None = None  # the host itself out of memory: fatal

    # ----- entry ---------------------------------------------------------------------------

    def run(self, *, own_process: bool = False) -> int:
        """Start, serve, stop; the exit code. ``own_process``: this process is the host's
        alone (``python -m intloom.host``), so it may end with ``os._exit``.

        Not ``asyncio.run``: its shutdown cancels every task left and waits for them, and a
        user Step that swallows CancelledError would keep a host alive -- for minutes, or
        forever -- after its stop had released everything. Once ``_main`` returns, the stop
        is complete: the store is closed (no Run's journal can change any more), the log
        sealed and the service files removed; a task still running then is user code that
        ignored its cancellation, and is never waited for.
        """
        self._own_process = own_process
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)  # as asyncio.run does, for user code that asks for it
        # The default executor holds user code too (asyncio.to_thread in a Step). Ours, so
        # that its end can be waited for with a bound: loop.shutdown_default_executor cannot
        # be (on Python 3.11, cancelled by a timeout, it still joins its thread, which waits
        # for every worker: a foreground host hung for as long as a Step's call took).
        executor = ThreadPoolExecutor(thread_name_prefix="asyncio")
        loop.set_default_executor(executor)
        abandoned: list[asyncio.Task[Any]] = []
        stuck = False
        try:
            try:
                code = loop.run_until_complete(self._main())
            except Exception as exc:
                # The loop itself failed (its selector's descriptor closed by Workflow code,
                # say), which no handler of _main sees: the host died with its traceback in
                # /dev/null and no process_failed in its log.
                with contextlib.suppress(Exception):
                    self._fatal(exc)
                raise
            abandoned = [t for t in asyncio.all_tasks(loop) if not t.done()]
            if not abandoned and not own_process:
                loop.run_until_complete(loop.shutdown_asyncgens())
                stuck = not _workers_ended(executor, _EXECUTOR_WAIT_S)
        finally:
            asyncio.set_event_loop(None)
            if not abandoned and not own_process:
                loop.close()
        # The host's own process exits here, whatever user code still holds (tasks that
        # ignored cancellation, threads inside asyncio.to_thread): waiting for it is what a
        # completed stop must never do. So does a foreground host whose executor threads are
        # stuck (the interpreter would join them at exit); one with abandoned tasks only
        # returns, and the CLI exits after its output.
        if self.force_exit or own_process or stuck:
            # Everything that matters is already durable (journal, log, metadata were
            # fsynced by the stop); stdio is flushed for a foreground host's last words.
            if self.before_exit is not None and not own_process:
                with contextlib.suppress(Exception):  # its words must not keep us alive
                    self.before_exit(code)
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(code)
        return code

    async def _main(self) -> int:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._stop = asyncio.Event()
        self._forced = asyncio.Event()
        # A program running a foreground host in its own process may handle these itself.
        theirs = {sig: signal.getsignal(sig) for sig in _IGNORED}
        before = {sig: signal.getsignal(sig) for sig in (*_SIGNALS, *_IGNORED)}
        installed = self._install_signals(loop)
        _forked_children_keep(before if installed else None, self)
        self._signals = [sig for sig in installed if sig in _SIGNALS]
        self._installed = installed
        # SIGCHLD ignored survives exec, and the kernel then reaps every child itself: a
        # Step's subprocess.run() read 0 of a program that failed. Default while it serves.
        children = signal.getsignal(signal.SIGCHLD) if installed else None
        if children == signal.SIG_IGN:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        loop.set_exception_handler(self._loop_error)
        try:
            try:
                with self._noting():
                    # A blocked signal mask survives fork and exec: a host launched by a
                    # program that blocks them (a supervisor, a thread that spawns) left every
                    # kill -TERM pending; __main__ blocks them until now itself. Unblocked
                    # only once _noting is in place: a stop that came while they were
                    # blocked is then noted, and stops the start instead of its first serve.
                    if installed:
                        signal.pthread_sigmask(signal.SIG_UNBLOCK, installed)
                    await self.startup()
            except BaseException as exc:
                log_name = self.log.name if self.log is not None else None
                error = exc.error if isinstance(exc, _Abort) else check_error(exc, log_name)
                if self.log is not None and not isinstance(exc, IntloomError | _Abort):
                    self.log.error("startup_error", error=type(exc).__name__,
                                   detail=str(exc)[:500])
                await self._release(failed=error.view())
                self.ready.failed(error.view())
                if not isinstance(exc, Exception):
                    raise
                return 1
            self.ready.ready(self.service_view())
            try:
                await self.serve()
            except _MovedAway as moved:
                self._unwatch()  # before the log ends: the watcher writes to it
                return self._left_home(moved.fact, moved.removed)
            except Exception as exc:
                self._unwatch()
                self._fatal(exc)
                return 1
            return await self.shutdown()
        finally:
            self._unwatch()  # whatever else ended the serving (a BaseException)
            for sig in installed:
                loop.remove_signal_handler(sig)
                handler = theirs.get(sig)
                if handler is not None:
                    signal.signal(sig, handler)
            if children == signal.SIG_IGN:
                signal.signal(signal.SIGCHLD, signal.SIG_IGN)
            _forked_children_keep(None)

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> list[signal.Signals]:
        installed: list[signal.Signals] = []
        for sig in (*_SIGNALS, *_IGNORED):
            if (self.keep_ignored and sig in _SIGNALS and sig != signal.SIGTERM
                    and signal.getsignal(sig) == signal.SIG_IGN):
                continue
            try:
                loop.add_signal_handler(
                    sig, self._on_signal if sig in _SIGNALS else self._on_ignored, sig)
            except (ValueError, RuntimeError):  # not the main thread: the caller owns signals
                continue
            installed.append(sig)
        return installed

    @contextlib.contextmanager
    def _noting(self) -> Iterator[None]:
        """While the start-up runs, a stop signal is noted as it arrives.

        The start-up awaits nothing until its Workflows are imported and its Runs restored,
        so the loop's handler for a signal that came before the imports began ran only once
        all of them had (30 s of a slow module's import later), after the host had reported
        ready. The loop still hears the signal (the wakeup fd); this only notes it now, for
        ``_importing`` and the commit (``_commit``) to act on."""
        if not self._signals:  # not the main thread: whoever owns the signals decides
            yield
            return

        def note(signum: int, _frame: object) -> None:
            if self._noted is None:
                self._noted = signum

        previous = {sig: signal.signal(sig, note) for sig in self._signals}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    @contextlib.contextmanager
    def _importing(self) -> Iterator[None]:
        """While Workflow modules import, a stop signal interrupts the import.

        The imports run user code synchronously on the loop's thread, so the loop's signal
        handlers cannot run until they return: a module that sleeps or computes at import
        time would hold off a stop (and the launcher's SIGTERM at ``start --timeout``, which
        then ends in a SIGKILL that leaves ``service.lock`` behind). Interrupting is safe
        here: nothing durable has happened since the log opened (the store opens after the
        imports), and the module's own partial import is discarded with the host. The
        signal still reaches the loop's handler too (the wakeup fd), which records the stop.
        """
        if not self._signals:  # not the main thread: whoever owns the signals decides
            yield
            return

        def interrupt(signum: int, _frame: object) -> None:
            if self._noted is None:  # for the start-up's end, should a module swallow this
                self._noted = signum
            raise _ImportInterrupted(signum, self._importing_source)

        previous = {sig: signal.signal(sig, interrupt) for sig in self._signals}
        try:
            if self.too_late:
                # The deadline's SIGTERM came before this handler was in place: the loop's
                # handler holds it, and would act only once the imports had all run.
                raise _ImportInterrupted(signal.SIGTERM, self._importing_source)
            if self._noted is not None:  # a signal that came before (``_noting``)
                raise _ImportInterrupted(self._noted, None, before=True)
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _import_progress(self, source: str | None) -> None:
        self._importing_source = source
        if source is not None and self.log is not None:
            # Said only to the launcher (its readiness pipe) before: a host killed in an
            # import left no word of which source, once that terminal's output was gone.
            self.log.info("source_importing", source=source)
        self.ready.importing(source)

    def _on_signal(self, sig: signal.Signals) -> None:
        assert self._stop is not None and self._forced is not None
        if self._stop.is_set():
            if sig in REPEATED:
                return  # the kernel's next SIGXCPU, not a person's second signal
            self.force_exit = True
            self._forced.set()
            if self.log is not None:
                self.log.warning("signal_received", signal=sig.name, action="force")
            return
        if self.log is not None:
            self.log.info("signal_received", signal=sig.name, action="stop")
        self.stop_signal = self.stop_signal or sig.name
        self.request_stop(f"signal {sig.name}")

    def _on_ignored(self, sig: signal.Signals) -> None:
        if self.log is not None:
            self.log.warning("signal_received", signal=sig.name, action="ignore")

    def request_stop(self, reason: str) -> None:
        assert self._stop is not None
        if not self._stop.is_set():
            self._stop_reason = reason
            self._stop.set()
            if self.server is not None:
                # Refuse new work at once; the replies already under way still go out.
                self.server.closing = True

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and context.get("message") == _ACCEPT_FAILED:
            self._accept_failed(exc)
            return
        now = time.monotonic()
        if isinstance(exc, MemoryError) and self._starved is None:
            # Out of memory at every turn of the loop (its self-pipe read, under ulimit -v,
            # once a Step held memory): 11 MiB of log a second, every client reset, and no
            # end. Fatal once they keep coming, as any exception the host itself raises:
            # serve() ends it, as a crash would (files kept). One alone (a callback a Step
            # scheduled asked for too much) is logged, as any other.
            recent = [t for t in self._starving if now - t < _STARVED_WITHIN] + [now]
            self._starving = recent[-_STARVED_AFTER:]
            if len(recent) >= _STARVED_AFTER:
                self._starved = exc.with_traceback(None)  # not the frames: their memory
        message = str(context.get("message", ""))[:500]
        error = type(exc).__name__ if exc is not None else None
        detail = str(exc)[:500] if exc is not None else None
        key = (message, error, detail)
        said = self._task_errors.get(key)
        if said is not None and now - said[0] < _ACCEPT_QUIET:
            self._task_errors[key] = (said[0], said[1] + 1)
            return  # the same again: said once a minute, with how often (``repeated``)
        if len(self._task_errors) >= _TASK_ERRORS_KEPT:
            self._task_errors.clear()  # messages naming callbacks by address: bounded
        self._task_errors[key] = (now, 0)
        if self.log is not None:
            self.log.error("task_error", message=message, error=error, detail=detail,
                           **({"repeated": said[1]} if said is not None and said[1] else {}))

    def _accept_failed(self, exc: OSError) -> None:
        """A connection the kernel holds could not be accepted (EMFILE, ENFILE, ENOBUFS,
        ENOMEM): its client waits, then times out. Logged at most once a minute."""
        self._accept_failures += 1
        now = time.monotonic()
        if self._accept_said_at is not None and now - self._accept_said_at < _ACCEPT_QUIET:
            return
        self._accept_said_at = now
        fds = descriptors()
        connections = self.server.connections if self.server is not None else 0
        fix = (descriptors_fix(*fds, connections) if fds is not None and exc.errno
               in (errno.EMFILE, errno.ENFILE) else "Free memory or close idle clients.")
        if self.log is not None:
            self.log.error("connections_not_accepted", errno=errno.errorcode.get(exc.errno or 0),
                           detail=str(exc)[:500], times=self._accept_failures,
                           fix=f"Clients cannot connect until then. {fix}")
        self._accept_failures = 0

    # ----- startup -------------------------------------------------------------------------

    async def startup(self) -> None:
        opts = self.options
        # Before anything is written: under a root this long a Run's snapshot could not be.
        require_short_path(self.paths.root)
        keep_large_buffers_mapped()  # before a restore reads the log (host/allocator.py)
        self.ready.progress("locking")
        self.ownership.take_lock()
        try:
            self.log = HostLog.open(
                self.paths.logs, instanceId=self.instance_id, packageVersion=__version__,
                projectRoot=str(self.paths.root),
            )
        except OSError as exc:
            raise _log_write_failed(self.paths.logs, exc.strerror or str(exc),
                                    exc.errno) from None
        self.log.on_failure = self._log_failed
        if self._own_process:
            self.log.catch_faults()
        log = self.log  # its first line is written: HostLog.open raises otherwise
        self.ready.progress("log_opened")
        log.info("service_starting", port=opts.port, strict=opts.strict)
        hooks = armed_test_hooks()
        if hooks:
            log.warning("test_hooks_armed", hooks=hooks)
        config = load_config(self.paths.root)
        self.config_port = config.port
        saved = self.ownership.saved_connection()
        self.ownership.check_service_file()
        # Before any user code runs: the store's own lock (one writer per runtime directory,
        # whatever became of service.lock), then the port, saved in connection.json. A start
        # that dies in a Workflow's import then leaves what recover needs to clean up after
        # it; without a connection.json, recover refuses (DESIGN section 3), and only a
        # start writes one.
        ensure_dir(self.paths.runtime)
        self._store_lock = lock_dir(self.paths.runtime)
        if self._store_lock < 0:
            log.warning("store_lock_unavailable", path=str(self.paths.runtime),
                        reason="the file system cannot lock a directory; service.lock "
                        "alone guards the store")
        self._home = (_identity(os.stat(self.paths.root)),
                      _identity(os.fstat(self._store_lock) if self._store_lock >= 0
                                else os.lstat(self.paths.runtime)))
        # Whether the runtime directory had a link then: some FUSE file systems show none
        # for a live one, which must not read as deleted (_removed).
        self._linked = (self._store_lock >= 0
                        and os.fstat(self._store_lock).st_nlink > 0)
        port = opts.port
        # port = 0 in intloom.toml fixes no port (the template: "0 or absent: pick a free
        # port once"): the saved port is reused, as DESIGN keeps connection.json's port
        # across starts. Only --port 0 asks for a fresh one.
        configured = config.port or None
        # Where the port came from decides the fix: --port 0 once does not help a port that
        # intloom.toml sets, which every later start takes again.
        fix = ("Free the port, or pass another --port (0 picks a free one)" if port is not None
               # 0 or no port reuses the saved one (maybe this very port): not a free one.
               else f"Free the port, or change port in {self.paths.config} to a free one "
               "(or remove it and run intloom start --port 0 once, which picks one and saves "
               "it)" if configured is not None
               else "Free the port, or run intloom start --port 0 to pick a new one "
               "(connection.json is updated)")
        if port is None:
            port = configured if configured is not None else (saved.port if saved else 0)
        token = saved.token if saved is not None else new_token()
        try:
            self._sock = bind_port(port)
        except OSError as exc:
            # No socket to be had is no port taken: "Free the port" sent the user after a
            # listener that does not exist.
            short = starved(exc)
            raise IntloomError(
                "CLI_SERVICE_UNAVAILABLE",
                f"The host could not listen on 127.0.0.1:{port} ({exc.strerror or exc})"
                + (f": {short}." if short else f"{_listener(port, exc)}. {fix}."),
            ) from None
        self.port = int(self._sock.getsockname()[1])
        self.ownership.publish_connection(saved, self.port, token)
        self.ready.progress("loading_workflows")
        # Everything imported so far lives as long as the host: out of the cyclic collector's
        # reach, a full collection walks only what Runs allocate (no Run exists yet, so no
        # Run's garbage can be pinned by this).
        gc.freeze()
        try:
            self.booted = boot(
                self.paths.root, config, log, instance_id=self.instance_id,
                package_version=__version__, strict=opts.strict, importing=self._importing,
                progress=self._import_progress, still_home=self._still_home,
            )
        except _ImportInterrupted as exc:
            name = signal.Signals(exc.sig).name
            self.stop_signal = self.stop_signal or name
            log.info("startup_interrupted", signal=name, step="loading_workflows",
                     source=exc.source)
            when = "before it imported" if exc.before else "while it imported"
            raise _Abort(IntloomError(
                "CLI_SERVICE_CLOSING",
                f"The host was asked to stop ({name}) {when} Workflows; it did not start "
                "and released its files.",
            )) from None
        # Came while the store opened and the Runs were restored (or a module swallowed the
        # interruption): said now, before the host listens and its Runs resume.
        self._abort_if_asked(log, "restoring_runs")
        fds = descriptors()
        # Counted with the readiness pipe, which closes once the start is reported, and with
        # the journal's segment (and its fdinfo entry), which the store opens only once the
        # host listens (begin).
        if fds is not None and fds[1] - (fds[0] + SEGMENT_DESCRIPTORS) < FD_RESERVE:
            # It would serve nobody: each connection is refused BUSY while fewer than the
            # reserve are free, and the start had said "Service started" of it.
            raise IntloomError(
                "CLI_SERVICE_UNAVAILABLE",
                f"The host has {fds[0]} of its {fds[1]} file descriptors open once started "
                f"(the ulimit -n of the shell that ran intloom start), needs "
                f"{SEGMENT_DESCRIPTORS} more for its journal and keeps {FD_RESERVE} free beside "
                "them for its log and the Steps, "
                "so it could serve no connection; it did not start. Raise the limit "
                "(ulimit -n 1024) in that shell, then run intloom start again.",
            )
        self.ready.progress("listening")
        hello = HelloOk(instance_id=self.instance_id, pid=self.identity.pid,
                        project_root=str(self.paths.root), protocol=PROTOCOL,
                        package_version=__version__, features=list(FEATURES))
        handlers = Handlers(self.booted.runtime, instance_id=self.instance_id,
                            service_view=self.service_view, workflows=self.booted.workflows,
                            stop_within=self.stop_within)
        self.server = Server(handlers, log, hello=hello, token=token,
                             on_stop=lambda: self.request_stop("stop request"),
                             limits=opts.limits)
        sock, self._sock = self._sock, None
        try:
            await self.server.listen(sock)
        except OSError as exc:
            sock.close()
            raise IntloomError(
                "CLI_SERVICE_UNAVAILABLE",
                f"The host could not listen on 127.0.0.1:{self.port} ({exc.strerror or exc}): "
                "another program took the port while the Workflows were imported"
                f"{_listener(self.port, exc)}. {fix}.",
            ) from None
        if log.failed:
            raise _log_write_failed(log.path, log.failure or "unknown error",
                                    log.failure_errno)
        # The store's first write, its segment (and the manifest naming it), only now that
        # nothing but a stop can end the start: each start that failed before (a port taken
        # in the import, too few descriptors) left a segment of a header and a seal, so a
        # supervisor retrying a broken start filled wal/ without bound. No append can come
        # first: restore appends nothing, and a request takes more loop iterations (its
        # hello, then itself) than the one listen yields.
        self.booted.store.begin()
        _start_hooks("listening")
        self._commit(log)
        self.ownership.publish_service(ServiceInfo(
            version=METADATA_VERSION,
            project_root=str(self.paths.root),
            pid=self.identity.pid,
            create_time=self.identity.create_time,
            instance_id=self.instance_id,
            port=self.port,
            started_at=self.started_at,
            package_version=__version__,
            protocol_version=PROTOCOL,
            log_file=self.log.name,
        ))
        _start_hooks("published")
        self.booted.runtime.start_restored()
        log.info("service_ready", port=self.port, workflows=len(self.booted.workflows))

    def _commit(self, log: HostLog) -> None:
        """The start's commit point, right before service.json says the host serves: a stop
        asked for until now ends the start (``_Abort``); one asked for after it stops a host
        that served, by the loop's handler at ``serve``'s first await (the wakeup fd hears
        every signal, ``_noting``'s or not). The start's end decided it instead, after
        service.json was written: ``start --foreground`` said a Ctrl-C that came then had
        interrupted it before it served (exit 130), of a host whose service.json a script
        waiting for it had already read."""
        with self._committing:
            self._abort_if_asked(log, "listening")
            self._serving = True

    def expire(self) -> bool:
        """``start --foreground --timeout``'s deadline, from its timer's thread: True when it
        ends the start (``too_late`` is set, for the start-up to act on), False when the host
        already serves, which a deadline that came a moment later must not stop."""
        with self._committing:
            if self._serving:
                return False
            self.too_late = True
            return True

    def _abort_if_asked(self, log: HostLog, step: str) -> None:
        """``_Abort`` when a stop was asked for since the start-up began: a signal (noted by
        ``_noting``, or handled on the loop at an await), a stop request, or the deadline
        (``expire``), whose SIGTERM may not have come yet."""
        assert self._stop is not None
        if self._noted is None and not self._stop.is_set() and not self.too_late:
            return
        name = (signal.Signals(self._noted).name if self._noted is not None
                else "SIGTERM" if self.too_late else self.stop_signal)
        if name is not None:
            self.stop_signal = self.stop_signal or name
        log.info("startup_interrupted", signal=name, step=step, source=None)
        asked = f"asked to stop ({name})" if name is not None else "asked to stop"
        raise _Abort(IntloomError(
            "CLI_SERVICE_CLOSING",
            f"The host was {asked} while it was starting; it did not start and released its "
            "files.",
        ))

    def service_view(self) -> ServiceView:
        counts: dict[str, int] = {}
        summary = None
        workflow_count = 0
        problems: list[WorkflowProblem] = []
        store_problems: list[StoreProblem] = []
        if self.booted is not None:
            counts = self.booted.runtime.counts()
            summary = self.booted.summary
            if summary is not None:
                summary = self._listed(summary)
            workflow_count = sum(1 for w in self.booted.workflows if w.ready)
            problems = self.booted.problems
            store_problems = self.booted.store_problems
        journal_error = self.booted.store.broken if self.booted is not None else None
        return ServiceView(
            project_root=str(self.paths.root),
            pid=self.identity.pid,
            instance_id=self.instance_id,
            port=self.port,
            started_at=self.started_at,
            package_version=__version__,
            protocol_version=PROTOCOL,
            log_file=self.log.name if self.log is not None else None,
            workflow_count=workflow_count,
            running_runs=counts.get("running", 0),
            waiting_runs=counts.get("waiting", 0),
            completed_runs=counts.get("completed", 0),
            failed_runs=counts.get("failed", 0),
            restore=summary,
            log_error=self.log_error,
            journal_error=journal_error,
            journal_fix=self._journal_fix() if journal_error is not None else None,
            compaction_error=(self.booted.compactions[-1] if self.booted is not None
                              and self.booted.compactions else None),
            workflow_problems=problems,
            store_problems=store_problems[:self.options.restore_listed],
            store_problems_omitted=max(0, len(store_problems) - self.options.restore_listed),
            config_port=self.config_port,
            workflow_protocol=WORKFLOW_PROTOCOL,
        )

    def _listed(self, summary: RestoreSummary) -> RestoreSummary:
        """``summary`` as a reply carries it: its lists cut to their first
        ``restore_listed`` ids (``counts`` has how many each has), less the held Runs that
        cancel has since ended and the interrupted Runs it has since dismissed, which need
        nothing any more (listed, a dismissed Run was still "to see what was in flight")."""
        still = summary.needs_attention
        interrupted = summary.interrupted
        if self.booted is not None:
            runtime = self.booted.runtime
            if still:
                held = runtime.held
                still = [r for r in still if r not in held or held[r].ended is None]
            if interrupted:
                # Only a dismissal ends an interrupted Run; an ended Run may have been dropped
                # from the host's list since (past its ended Runs' cap): gone means ended.
                interrupted = [r for r in interrupted if (slot := runtime.runs.get(r))
                               is not None and slot.shown.phase != "terminal"]
        most = self.options.restore_listed
        lists = (summary.resumed, summary.waiting, interrupted, still)
        listed = set(still[:most])
        reasons = ({} if self.booted is None else
                   {r: held_reason(why) for r, why in self.booted.runtime.attention
                    if r in listed})
        return msgspec.structs.replace(
            summary, resumed=summary.resumed[:most], waiting=summary.waiting[:most],
            interrupted=interrupted[:most], needs_attention=still[:most],
            counts=RestoreCounts(*(len(ids) for ids in lists)),
            omitted=sum(max(0, len(ids) - most) for ids in lists), reasons=reasons)

    # ----- serve ---------------------------------------------------------------------------

    async def serve(self) -> None:
        """Until a stop request or a signal. The fatal test hook raises here; so does
        ``_MovedAway``, once the project's runtime directory is another one."""
        assert self._stop is not None
        if os.environ.get(FATAL_HOOK) == "1":
            await asyncio.sleep(0)
            raise RuntimeError(f"{FATAL_HOOK} is set: simulated fatal error after ready")
        self._prune_logs()
        self._watch_loop()
        handlers = {sig: signal.getsignal(sig) for sig in self._installed}
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), _HOME_LOOK)
            self._keep_handlers(handlers)
            removed = self._removed()
            if removed is not None and not self._stop.is_set():
                raise _MovedAway(removed, removed=True)
            fact = self._moved_away()
            if fact is not None and not self._stop.is_set():
                raise _MovedAway(fact)
            if self._starved is not None:
                raise self._starved
            if not self._stop.is_set():
                self._keep_lock()
                self._service_back()
                if (self.log is not None and self.log.removed()
                        and self.ownership.moved_fix() is None):
                    # Not after a move: its path would be the old place (a copy put back).
                    self.log.restore_if_removed()

    def _keep_handlers(self, handlers: dict[signal.Signals, Any]) -> None:
        """Put back a signal handler of the host's that code running in it replaced (an
        async Step's ``signal.signal(SIGTERM, SIG_DFL)``): a later ``kill -TERM``, a
        supervisor's stop, then killed the host on the spot, unlogged, its files left as a
        crash leaves them. Seen within ``_HOME_LOOK``; said in the log."""
        for sig, installed in handlers.items():
            if signal.getsignal(sig) is installed:
                continue
            assert self._loop is not None
            try:
                self._loop.add_signal_handler(
                    sig, self._on_signal if sig in _SIGNALS else self._on_ignored, sig)
            except (ValueError, RuntimeError):
                continue
            handlers[sig] = signal.getsignal(sig)
            if self.log is not None:
                self.log.warning(
                    "signal_handler_replaced", signal=sig.name,
                    message=f"Code running in the host (a Workflow's Step, Tool or "
                    f"on_complete) replaced its {sig.name} handler; the host put its own "
                    "back. Signals belong to the host: use them in a subprocess of your own.")

    def _watch_loop(self) -> None:
        """The loop's watcher (``LoopWatch``), a help to the user: when its thread cannot
        start (a thread limit), the host says so and serves on without it."""
        if self.log is None or self._watch is not None:
            return
        watch = LoopWatch(self.log, self.paths.root)
        try:
            watch.start()
        except RuntimeError as exc:
            watch.close()
            self.log.warning("loop_watch_unavailable", message=str(exc),
                             effect="A blocked event loop is not logged (loop_blocked) by "
                             "this host.")
            return
        self._watch = watch

    def _unwatch(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def _prune_logs(self) -> None:
        """Old closed host logs removed (``intloom.host.logretention``), once the host is
        ready: a start's readiness never waits for it, and a failure only says so."""
        log = self.log
        if log is None:
            return
        try:
            pruned = prune_logs(self.paths.logs, log.name, now=time.time(),
                                root=self.paths.root, cap=self.options.logs_cap)
        except Exception as exc:  # a housekeeping aid: never the end of a serving host
            log.warning("logs_not_pruned", path=str(self.paths.logs),
                        message=getattr(exc, "strerror", None) or f"{type(exc).__name__}: "
                        f"{exc}")
            return
        if pruned.removed:
            log.info("logs_pruned", count=len(pruned.removed), freed=pruned.freed,
                     left=pruned.total, removed=pruned.removed[:_PRUNED_NAMED])

    def _keep_lock(self) -> None:
        """The OS lock on ``service.lock`` taken again when code running in the host closed
        its descriptor (``Ownership.keep_lock``); when it cannot be, the host stops: nothing
        would keep a second host off the project. Seen within ``_HOME_LOOK``; said in the
        log."""
        try:
            kept = self.ownership.keep_lock()
        except IntloomError as exc:
            if self.log is not None:
                self.log.error("service_lock_lost", path=str(self.paths.service_lock),
                               message=exc.message)
            self.request_stop("service.lock lost")
            return
        if kept == "retaken" and self.log is not None:
            self.log.warning(
                "service_lock_retaken", path=str(self.paths.service_lock),
                message="Code running in the host (a Workflow's Step, Tool or on_complete) "
                "closed the descriptor holding the OS lock on service.lock; the host took the "
                "lock again. Descriptors belong to the host: close only those you opened.")

    def _service_back(self) -> None:
        """``service.json`` removed by hand while this host serves is written again (see
        ``Ownership.restore_service``); a write refused is logged once, not retried in vain
        every look."""
        log = self.log
        if log is None:
            return
        try:
            restored = self.ownership.restore_service()
        except (OSError, IntloomError) as exc:
            if not self._service_back_failed:
                self._service_back_failed = True
                log.error("service_json_not_restored", path=str(self.paths.service_json),
                          message=getattr(exc, "message", None) or str(exc))
            return
        if restored:
            self._service_back_failed = False
            log.warning("service_json_restored", path=str(self.paths.service_json),
                        message="service.json was removed while this host served; it was "
                        "written again, so that commands find the host serving")

    def _still_home(self) -> None:
        """Raise when the project or its ``.intloom/`` moved (or was deleted) since this host
        locked its runtime directory, as it imported the Workflows: the store opens by path,
        so it made a new, empty journal at the old place and the start said it had restored
        no Run, while the Runs were in the moved one (and a project moved as a whole is no
        longer where this host was started to serve)."""
        if self._home is None:
            return
        fact = self._removed()
        if fact is not None:
            raise IntloomError(
                "STORAGE_ERROR",
                f"{fact}, as this host started (as it imported the Workflows), so it did not "
                "open a store there: the Runs went with the deleted journal. Put back a copy "
                "of the project's .intloom/ if you have one (a backup); otherwise run intloom "
                "recover where service files are left, then intloom start, which begins with "
                "no Run.",
            )
        try:
            here: tuple[tuple[int, int], tuple[int, int]] | None = (
                _identity(os.stat(self.paths.root)),
                _identity(os.lstat(self.paths.runtime)))
        except OSError:
            here = None
        if here == self._home:
            return
        raise IntloomError(
            "STORAGE_ERROR",
            f"{self.paths.root} or its .intloom/ was moved while this host started (as it "
            "imported the Workflows): the journal it locked is no longer at "
            f"{self.paths.runtime}, so it did not open its store there (it opens it by path, "
            "and would have made a new, empty one). Nothing was written there. Run intloom "
            "start again where the project is now (its connection.json names the old place: "
            "the command says how to go on).",
        )

    def _removed(self) -> str | None:
        """Why the runtime directory this host locked is known deleted, or None. Removed with
        the whole project (``rm -rf``), the root's path is gone too, which reads as a project
        moved as a whole: the host served on into unlinked files, its Steps and effects
        running with a journal no start could ever read, and took the disk's space unseen
        (``du`` shows nothing). A deleted directory has no link left."""
        if self._store_lock < 0 or not self._linked:
            return None  # a file system that shows a live directory with no link (FUSE)
        try:
            links = os.fstat(self._store_lock).st_nlink
        except OSError:
            return None
        if links != 0:
            return None
        try:  # and its path no longer leads to it
            if self._home is not None and _identity(os.lstat(self.paths.runtime)) == self._home[1]:
                return None
        except OSError:
            pass
        return (f"{self.paths.runtime} was deleted while this host ran (the directory "
                "itself, with .intloom/ or the whole project)")

    def _moved_away(self) -> str | None:
        """Why this host no longer owns the project's state, or None: ``.intloom/`` (or its
        ``runtime/``) was moved, removed or replaced while the project root stayed where it
        was. Both locks (``service.lock``, the store's) are on the files this host opened,
        wherever they went, so nothing stops a second ``intloom start`` from taking a new
        ``.intloom/`` beside it; and the store writes new segments, snapshots and its
        manifest by path, into a directory that is no longer its own. A project root that
        moved as a whole is not this: its host serves on until stopped (docs/recovery.md).
        A path that cannot be looked at for another reason (EACCES) tells nothing."""
        if self._home is None:
            return None
        root, runtime = self._home
        try:
            if _identity(os.stat(self.paths.root)) != root:
                return None
        except OSError:
            return None  # the root itself moved (or cannot be looked at)
        try:
            now = _identity(os.lstat(self.paths.runtime))
        except (FileNotFoundError, NotADirectoryError):
            return (f"{self.paths.runtime} is gone (.intloom/ or its runtime/ was moved or "
                    "removed while this host ran)")
        except OSError:
            return None
        if now != runtime:
            return (f"{self.paths.runtime} is another directory than the one this host "
                    "locked (.intloom/ or its runtime/ was moved or replaced while it ran)")
        return None

    def _left_home(self, fact: str, removed: bool = False) -> int:
        """Stop serving at once, as a crash would: nothing more is written by path (that
        would land in another host's .intloom/, or nowhere), so the store is not closed and
        no service file is removed; the kernel drops the locks and the port with the
        process. The Runs restore from the moved journal, as after a crash, wherever it is
        put back."""
        if removed:
            message = (f"{fact}. The host stopped serving at once, as a crash would: its "
                       "journal is deleted, so nothing it did from then on could be "
                       "restored, and its Runs went with it.")
            fix = ("Put back a copy of the project's .intloom/ if you have one (a backup); "
                   "otherwise its Runs are lost: run intloom recover where service files are "
                   "left (this host has exited), then intloom start, which begins with no Run.")
        else:
            message = (f"{fact}. The host stopped serving at once, as a crash would, so that "
                       f"it and a host started in {self.paths.root} since never both own the "
                       "project; its Runs stay in the journal it wrote, in the moved "
                       "directory.")
            fix = ("Stop any host started since (intloom stop), put the moved .intloom/ "
                   "back, then run intloom recover (this host has exited) and intloom start.")
        if self.log is not None:
            self.log.fatal("state_dir_moved", path=str(self.paths.runtime), message=message,
                           fix=fix)
        with contextlib.suppress(Exception):
            if self.last_words is not None:
                # A foreground host's command: its log is in the moved directory now, so
                # the person at the terminal reads the fix here, as any command's error.
                self.last_words(ErrorView("STORAGE_ERROR", f"{message} {fix}"))
            else:
                sys.stderr.write(f"intloom host: {message} {fix}\n")
        self.force_exit = True  # threads inside user code are not waited for
        return 1

    def _log_failed(self, cause: str) -> None:
        """The first lost log line (from any thread): act on it on the loop, not inside a write."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                self._loop.call_soon_threadsafe(self._on_log_failed, cause)

    def _on_log_failed(self, cause: str) -> None:
        """A host whose log cannot be written does no more work it could not account for.

        Unlike the TypeScript IntLoom, which cancels active Runs (RUN_STOPPED, terminal), the
        Runs are suspended at their last saved boundaries, as a stop would: the journal -- not
        the log -- is their record, so nothing unfinished is thrown away and the next start
        resumes them by the restart table. New work is refused with LOG_WRITE_FAILED; status
        and reads stay available; stop exits 1.
        """
        if self.log_error is not None or self.log is None:
            return
        self.log_error = (f"The host log .intloom/logs/{self.log.name} could not be written "
                          f"({cause}).")
        if self.server is None or self.booted is None or self._stop is None \
                or self._stop.is_set():
            return  # startup reports it before ready; a stop is already under way
        # What refused the write, as a failed start says it: "free disk space" was said of
        # a log that reached ulimit -f (EFBIG), which the next start would reach again.
        fix = storage_fix(OSError(self.log.failure_errno or 0, cause), self.log.path,
                          replaced=False, then=", then run intloom start")
        self.server.refusal = ErrorView(
            code="LOG_WRITE_FAILED",
            message=f"{self.log_error} The host refuses new work and suspended its running "
            f"Runs at their last saved boundaries{self._checkpoint_stopped()}. Run intloom "
            f"stop. {fix} Each unfinished Run comes back from its last durable checkpoint by "
            "the restart table (intloom doctor previews it).",
            retryable=False,
        )
        self._log_suspend = asyncio.ensure_future(self.booted.runtime.suspend(
            grace=self.options.suspend_grace,
            reason=f"{self.log_error} The host suspended the Run and refuses new work.",
        ))

    def _journal_fix(self) -> str | None:
        """What frees a broken journal when it is not space: ENOSPC says the same for no
        block and no inode, and status advised freeing space where df showed plenty; and a
        wal/ that refuses the replacement segment (the immutable flag, its mode, a read-only
        mount: EPERM, EACCES, EROFS), read from the file system as doctor reads it."""
        if self.booted is None:
            return None
        layout = self.booted.store.layout
        # Broken by a failed write: nearly no inode counts as none (its temp files removed).
        inodes = no_inode_left(layout.root, failed=True)
        if inodes is not None:
            return f"for .intloom/runtime, {inodes}"
        refused = write_refusal(layout.wal / "next.seg", replaced=False)
        if refused is None:
            return None
        fact, fix = refused
        return f"{fact}: {fix[:1].lower()}{fix[1:]}"

    def log_lost(self) -> IntloomError | None:
        """LOG_WRITE_FAILED for a host whose log failed after it served (it exits 1 when
        stopped), for a foreground host's command to end with: it said CLI_INTERNAL_ERROR
        (exit 70, a bug) and pointed at that very log. None while the log held."""
        log = self.log
        if log is None or not log.failed:
            return None
        cause = log.failure or "unknown error"
        fix = storage_fix(OSError(log.failure_errno or 0, cause), log.path, replaced=False)
        return IntloomError(
            "LOG_WRITE_FAILED",
            f"The host stopped, but its log {log.path} could not be written ({cause}), so "
            "what it did since is missing from it; it suspended its running Runs at their "
            f"last saved boundaries{self._checkpoint_stopped()}, and the next intloom start "
            "brings each unfinished Run back from its last durable checkpoint by the restart "
            f"table (intloom doctor previews it). {fix}",
        )

    def _checkpoint_stopped(self) -> str:
        """The Runs a failed checkpoint had stopped before the log failed: a suspension
        leaves them as they are, so "suspended its Runs" alone said what did not happen."""
        count = self.booted.runtime.stopped_by_checkpoint() if self.booted is not None else 0
        if count == 0:
            return ""
        runs = "1 Run" if count == 1 else f"{count} Runs"
        return (f"; {runs} that a failed checkpoint had already stopped "
                "(failed/RUN_CHECKPOINT_FAILED) it did not suspend")

    def _fatal(self, exc: BaseException) -> None:
        if self.log is None:
            return
        with contextlib.suppress(MemoryError):  # its last line, if memory allows it
            self._fatal_line(exc)

    def _fatal_line(self, exc: BaseException) -> None:
        assert self.log is not None
        if isinstance(exc, MemoryError):
            self.log.fatal("process_failed", origin="out_of_memory", error="MemoryError",
                           detail="the host itself ran out of memory (its event loop could "
                           "not go on): its address-space limit (ulimit -v) or the machine's "
                           "memory; a Step that keeps large data in memory (a global, its "
                           "State) uses the host's",
                           fix="Raise the limit or free memory, then run intloom recover "
                           "and intloom start (the Runs resume by the restart table).")
            return
        self.log.fatal("process_failed", origin="uncaught_exception",
                       error=type(exc).__name__, detail=str(exc)[:500])

    # ----- shutdown ------------------------------------------------------------------------

    async def _suspend(self, runtime: Runtime) -> None:
        # Off while it runs: each full collection walks every Run in memory, and waking each
        # waiting Run's task set off enough of them to take 5.5 s of the 14 s that 95,000
        # live Runs took (py-spy). Its garbage is freed by reference counts, the rest at exit.
        collecting = gc.isenabled()
        gc.disable()
        try:
            await self._suspended(runtime)
        finally:
            if collecting:
                gc.enable()

    async def _suspended(self, runtime: Runtime) -> None:
        cut = await runtime.suspend(grace=self.options.suspend_grace)
        if self.log is None:
            return
        if cut:
            # `intloom stop` reads this line back to say which Runs the next start reports
            # RUN_INTERRUPTED, instead of calling every Run suspended at a checkpoint.
            self.log.warning("runs_cut_at_stop", count=len(cut), grace=self.options.suspend_grace,
                             runs=[{"runId": run_id, "evidence": evidence}
                                   for run_id, evidence in cut[:_CUT_LISTED]])
        # And this one to say how many Runs the next start resumes, and which it cannot:
        # a wait without recover, a client Agent task (the cut Runs are named above).
        outlook, others = await runtime.outlook()
        named = {run_id for run_id, _ in cut}
        lost = [(run_id, v.reason) for run_id, v in outlook
                if v.row == "interrupted" and run_id not in named]
        self.log.info("runs_suspended_at_stop", count=len(outlook), interrupted=len(lost),
                      unfinished=others,
                      runs=[{"runId": run_id, "evidence": reason}
                            for run_id, reason in lost[:_CUT_LISTED]])

    async def _bounded(self, what: str, awaitable: Any, limit: float, **facts: Any) -> bool:
        """Await a graceful step for at most ``limit`` s, or until a second signal; False
        when it was cut short (``facts``: what the bound was computed from, logged then)."""
        assert self._forced is not None
        step = asyncio.ensure_future(awaitable)
        forced = asyncio.ensure_future(self._forced.wait())
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            await asyncio.wait({step, forced}, timeout=limit,
                               return_when=asyncio.FIRST_COMPLETED)
            late = loop.time() - began - limit
            if not step.done() and not forced.done() and late > _LATE_TIMER_S:
                # The loop did not run for a while (the host paused by SIGSTOP or a
                # debugger, a VM suspended): on its return every timer fired at once, the
                # step's own grace with this bound, which cut the step before it could act
                # on its grace (the stop's account of the Runs it cut was lost). Once more.
                await asyncio.wait({step, forced}, timeout=_LATE_GRACE_S,
                                   return_when=asyncio.FIRST_COMPLETED)
        finally:
            forced.cancel()
            # Until it has taken its cancellation it still counts among the running tasks,
            # and the stop would report it as user code that ignored cancellation.
            await asyncio.wait({forced})
        if not step.done():
            step.cancel()
            with contextlib.suppress(BaseException):
                await step
            if self.log is not None:
                self.log.warning("shutdown_step_cut_short", step=what, timeout=limit,
                                 forced=self._forced.is_set(), **facts)
            return False
        exc = step.exception()
        if exc is not None and self.log is not None:
            self.log.error("shutdown_step_failed", step=what, error=type(exc).__name__,
                           detail=str(exc)[:500])
        return True

    def stop_within(self) -> float:
        """Seconds a stop begun now may take until this host has released its files: the sum
        of its steps' bounds (``_release``), told to ``intloom stop`` so that it waits as
        long as that rather than a fixed time (a close with 30,000 new snapshots takes 30 s)."""
        snapshots = 0
        if self.booted is not None:
            # A Run whose Step is still running may checkpoint before it is suspended.
            snapshots = (self.booted.store.snapshots_due()
                         + self.booted.runtime.counts().get("running", 0))
        # Each bounded step may get _LATE_GRACE_S more when its timer fires late (_bounded).
        return round(self._suspend_bound() + Server.close_bound(self.options.drain_grace)
                     + store_close_bound(snapshots) + _RELEASE_MARGIN_S + 2 * _LATE_GRACE_S, 3)

    def _suspend_bound(self) -> float:
        """Seconds a stop waits for the suspension: the grace, up to 1 s for the cancelled
        Steps to end (Driver.drain), a margin, and a share per loaded Run it passes over."""
        runs = len(self.booted.runtime.runs) if self.booted is not None else 0
        return self.options.suspend_grace + _SUSPEND_MARGIN_S + runs * _SUSPEND_S_PER_RUN

    async def shutdown(self) -> int:
        # A stop's own work (thousands of snapshots written) may hold the loop for seconds,
        # which is no Step's doing; the stop names Steps it cuts itself.
        self._unwatch()
        if self.log is not None:
            # ``within``: how long this stop may take; a stop that finds the host already
            # stopping (refused at its hello) reads it here, as it gets no reply of its own.
            self.log.info("service_stopping", reason=self._stop_reason,
                          within=self.stop_within())
        running = self.booted.runtime.counts()["running"] if self.booted is not None else 0
        if running and self.on_stopping is not None:
            # A notice to the foreground command's own stderr, written on a thread of its
            # own: a supervisor's stalled reader (a full pipe) blocked that write on the
            # loop, and with it the grace, a second signal and the release of the files.
            with contextlib.suppress(RuntimeError):  # no thread (a limit): no notice
                threading.Thread(target=self.on_stopping,
                                 args=(running, self.options.suspend_grace),
                                 name="intloom-stopping-notice", daemon=True).start()
        return await self._release(failed=None)

    async def _release(self, failed: ErrorView | None) -> int:
        """Undo startup, in reverse; every step is attempted. 0 when all went well."""
        if self.server is not None:
            # Still listening while the Runs are suspended (up to the grace): a command run
            # meanwhile is told the host is stopping (CLI_SERVICE_CLOSING) rather than finding
            # the port closed and a lock whose owner is alive. server.close stops listening.
            self.server.closing = True
        if self.booted is not None:
            # The grace, then up to 1 s for the cancelled Steps to end (Driver.drain), and a
            # margin: cut at grace + 1 s, a Step that swallows its cancellation also cut the
            # suspension of every other Run, and with it runs_cut_at_stop.
            await self._bounded("suspend", self._suspend(self.booted.runtime),
                                self._suspend_bound())
        if self.server is not None:
            cancelled = await self.server.close(self.options.drain_grace)
            if cancelled and self.log is not None:
                self.log.warning("connections_cancelled", count=cancelled)
            if os.environ.get(HOLD_UNLISTENED_HOOK):
                await asyncio.to_thread(_hold, HOLD_UNLISTENED_HOOK)
        store_closed = True
        if self.booted is not None:
            due = self.booted.store.snapshots_due()
            store_closed = await self._bounded("store_close", self.booted.close(),
                                               store_close_bound(due), snapshots=due)
        if self._sock is not None:  # a start that failed before it listened
            self._sock.close()
            self._sock = None
        if store_closed and self._store_lock >= 0:
            # Else a close cut short may still be writing: the lock goes with the process.
            os.close(self._store_lock)
            self._store_lock = -1
        log = self.log
        left = [t.get_name() for t in asyncio.all_tasks()
                if t is not asyncio.current_task() and not t.done()]
        if left and log is not None:
            # User code that ignored its cancellation; the process will not wait for it.
            log.warning("tasks_abandoned", count=len(left), tasks=left[:20])
        if log is not None:
            # Said now: the files are removed only after the log is closed (DESIGN §3).
            # ``intloom stop`` reads this line back to say why they stay.
            kept = self.ownership.foreseen()
            if kept:
                fix = (self.ownership.moved_fix()
                       or "Fix that, then run intloom recover to remove them.")
                log.warning("service_files_kept", problems=kept, fix=fix)
            if failed is not None:
                log.error("service_start_failed", code=failed.code, message=failed.message)
            else:
                log.info("service_stopped")
            log.close()
        self.release_moved = self.ownership.moved_fix()  # before release closes the lock
        problems = self.release_problems = self.ownership.release()
        return 1 if problems or (log is not None and log.failed) else 0
