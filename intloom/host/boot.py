"""The glue between the host's lifecycle and the engine: load Workflows, open the store, restore.

Kept in one small module on purpose: it is the only place that knows how the loader, the store
and the Runtime fit together, so a change in any of them touches the host here and nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import resource
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Final

import msgspec

from intloom.authoring.loader import LoadedWorkflow, load_workflows
from intloom.errors import ErrorView, IntloomError
from intloom.executor.runtime import RestoredRun, Runtime, incompatibility, strict_refusal
from intloom.fsutil import PrivacyError, limit_fix, no_inode_left, plug_standard
from intloom.host.logfile import HostLog, utc_now
from intloom.host.metadata import privacy_invalid
from intloom.host.toolcalls import evidence_log, tool_calls_cut
from intloom.project import Config, ProjectPaths
from intloom.protocol.messages import RestoreSummary, StoreProblem, WorkflowInfo, WorkflowProblem
from intloom.store import Store, StoreReport, read_runs_report
from intloom.store.compaction import NotSummarised
from intloom.store.files import Layout
from intloom.store.reader import FileProblem
from intloom.store.snapshots import snapshot_name

__all__ = ["Booted", "boot", "check_error"]


class Booted(msgspec.Struct):
    """What startup produced: the Runtime, the open store, and what restore did."""

    runtime: Runtime
    store: Store
    summary: RestoreSummary
    workflows: list[WorkflowInfo] = msgspec.field(default_factory=list)
    # The sources that failed to load: start and status name them (not only flows and the log).
    problems: list[WorkflowProblem] = msgspec.field(default_factory=list)
    store_problems: list[StoreProblem] = msgspec.field(default_factory=list)
    # The last compaction that wrote nothing past its failure (``store_compaction_failed``),
    # in words, for status: a full disk that refuses snapshots was only in the log.
    compactions: list[str] = msgspec.field(default_factory=list)

    async def close(self) -> None:
        """Close the store: flush what was accepted, snapshot, seal the segment."""
        await self.store.close()


def _workflow_infos(loaded: dict[str, Any], problems: list[tuple[str, ErrorView]]) -> list[
    WorkflowInfo
]:
    infos = [
        WorkflowInfo(
            name=lw.name,
            version=lw.version,
            identity=lw.identity,
            source=lw.source,
            stages=list(lw.workflow.stages),
        )
        for lw in loaded.values()
    ]
    # A broken entry is listed by its source path, so `intloom flows` shows why it is missing.
    infos.extend(
        WorkflowInfo(name=source, version="", identity="", source=source, stages=[], ready=False,
                     problem=f"{view.code}: {view.message}")
        for source, view in problems
    )
    return infos


def _damaged(paths: ProjectPaths, report: StoreReport) -> IntloomError | None:
    """``--strict``'s error for damaged files, if any."""
    # A torn tail is what any crash mid-append leaves (docs/format.md): not corruption.
    damaged = [f for f in report.files if f.kind != "torn"]
    if not damaged:
        return None
    first = damaged[0]
    # Files only of another format (a newer intloom's, after a downgrade) are no damage:
    # JOURNAL_CORRUPT told a script a damaged disk where upgrading intloom is the fix.
    incompatible = all(f.kind == "incompatible" for f in damaged)
    return IntloomError(
        "JOURNAL_INCOMPATIBLE" if incompatible else "JOURNAL_CORRUPT",
        f"--strict: {len(damaged)} file(s) under {paths.runtime} need attention; "
        f"first: {first.path} ({first.kind}: {first.problem}). Nothing was changed; run "
        "intloom doctor.",
    )


def _refuse_before_writing(
    paths: ProjectPaths, workflows: dict[str, LoadedWorkflow], package_version: str,
    withheld: dict[str, str], failed: list[str],
) -> None:
    """``--strict`` decides on a read-only read, before opening the store writes anything
    (its new segment, snapshots of a crashed host's leftovers)."""
    report = read_runs_report(paths.runtime)
    error = _damaged(paths, report)
    if error is not None:
        raise error
    attention = []
    for journal in report.runs:
        why = journal.problem or incompatibility(journal.state, workflows, package_version,
                                                 withheld, failed,
                                                 written_by=journal.written_by)
        if why is not None or journal.state is None:
            attention.append((journal.run_id, why or "nothing restorable was found in its journal"))
    if attention:
        raise strict_refusal(attention)


# What a compaction that wrote nothing past its failure costs, and what to do.
_NOT_SUMMARISED: Final = ("The next start reads more of the log instead (slower; nothing is "
                          "lost).")
_DISK_FIX: Final = "Free disk space, or fix the permissions of .intloom/runtime."


def _watch_compactions(store: Store, log: HostLog, last: list[str]) -> None:
    """Log each compaction that could not write its snapshots or ``manifest.json``
    (``store_compaction_failed``): the store carries on without them, correctly, and nothing
    else would say that the disk refuses them. Told on the store's threads; logged on the
    loop, which owns the log (the stop's is logged before the log closes: the store's close
    delivers its end after it)."""

    def said(exc: NotSummarised, when: str) -> None:
        # No inode left is ENOSPC too, and "free disk space" misleads where df shows plenty;
        # no descriptor left (a low ulimit -n) is no matter of the disk or its permissions.
        limited = None if exc.fix else limit_fix(exc.errno)
        inodes = None if exc.fix or limited else no_inode_left(
            store.layout.root, failed=exc.errno == errno.ENOSPC)
        told = inodes or limited
        fix = f"{told[:1].upper()}{told[1:]}." if told else exc.fix or _DISK_FIX
        effect = exc.effect or f"{_NOT_SUMMARISED} {fix}"
        log.warning("store_compaction_failed", what=exc.what, when=when, cause=exc.cause,
                    effect=effect)
        last[:] = [f"{exc.what} could not be written at {when} ({utc_now()}): {exc.cause}. "
                   f"{effect}"]

    def kept(problem: FileProblem) -> None:
        # What the next start (and doctor, now) reports of that file, in the same words.
        log.warning("store_file_problem", path=problem.path, kind=problem.kind,
                    problem=problem.problem)

    for exc, when in store.unsummarised:  # the one at open, before anyone listened
        said(exc, when)
    store.unsummarised.clear()
    for problem in store.kept_files:
        kept(problem)
    store.kept_files.clear()
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    here = threading.current_thread()

    def told(exc: NotSummarised, when: str) -> None:
        if loop is None or threading.current_thread() is here:
            said(exc, when)
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is left to tell
            loop.call_soon_threadsafe(said, exc, when)

    def told_kept(problem: FileProblem) -> None:
        if loop is None or threading.current_thread() is here:
            kept(problem)
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(kept, problem)

    store.on_unsummarised = told
    store.on_kept_file = told_kept


def _open_store(
    paths: ProjectPaths, log: HostLog, *, instance_id: str, package_version: str, strict: bool,
    compactions: list[str],
) -> tuple[Store, list[RestoredRun]]:
    """Open the journal store (it reads itself back once) and hand its Runs to restore."""
    # The host holds the store's directory lock (lock_dir) from before the import on.
    # Not begun: the host starts its segment once only a stop can end its start (daemon).
    store = Store.open(paths.runtime, instance_id=instance_id, package_version=package_version,
                       locked=True, begin=False)
    _watch_compactions(store, log, compactions)
    report = store.restored
    if store.removed_temps:
        log.info("store_temp_files_removed", paths=store.removed_temps)
    for problem in report.files:
        log.warning("store_file_problem", path=problem.path, kind=problem.kind,
                    problem=problem.problem)
    error = _damaged(paths, report) if strict else None
    if error is not None:  # damaged between the read-only check and this read
        store.close_blocking()
        raise error
    live = Layout(paths.runtime).live
    runs = [RestoredRun(run_id=j.run_id, state=j.state, problem=j.problem, status=j.status,
                        lost=j.lost,
                        snapshot=None if j.lost is None else str(live / snapshot_name(j.run_id)),
                        written_by=j.written_by)
            for j in report.runs]
    return store, runs


@contextlib.contextmanager
def _as_a_script_imports() -> Iterator[None]:
    """Hide the host's running event loop while the Workflow modules import.

    They import on the loop's thread, inside a coroutine: a module that sets itself up with
    ``asyncio.run(...)`` (an async client) or a loop of its own failed to load in the host,
    "cannot be called from a running event loop", while doctor and inspect, which import it
    as a script does, said it loads. ``asyncio.run`` also clears the thread's event loop when
    it is done: both are put back afterwards.

    The host's loop is not the thread's event loop meanwhile either: a module that sets
    itself up on ``asyncio.get_event_loop()`` (``run_until_complete``, the older idiom) got
    the running host loop, "This event loop is already running", and a task it created there
    would have run inside the host. It gets a loop of its own, as a script's first
    ``get_event_loop()`` makes; that loop is left open when a module kept it (or something on
    it), and closed otherwise: unclosed, its collection said "ResourceWarning: unclosed event
    loop" under python -X dev (PYTHONDEVMODE=1).
    """
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:  # not on a loop (a test calling boot directly): as a script already
        yield
        return
    # Made before the host's loop is hidden: one that cannot be made (no descriptor left,
    # ``ulimit -n``) left it hidden, and the failed start could then release nothing.
    fresh = asyncio.new_event_loop()
    asyncio._set_running_loop(None)
    asyncio.set_event_loop(fresh)
    # The references to it now: the thread's (set_event_loop), its own (its self-pipe's
    # reader) and ours. Any more after the imports are a module's (a global, a task or a
    # callback scheduled on it), and then it stays open.
    own = sys.getrefcount(fresh)
    try:
        yield
    finally:
        asyncio._set_running_loop(running)
        asyncio.set_event_loop(running)
        if sys.getrefcount(fresh) < own and not fresh.is_running():
            fresh.close()


@contextlib.contextmanager
def _standard_descriptors_kept() -> Iterator[None]:
    """Descriptors 0, 1 and 2 a Workflow module closed when imported (``os.close(2)``,
    ``sys.stderr.close()``, a library that detaches itself) are put back on /dev/null
    afterwards. Left closed, the next files the host opened took their numbers: the
    checkpoint log became descriptor 2, so a Step's ``logging.warning(...)`` (or any write to
    stderr) was appended to the journal between its records, and ``intloom verify`` found
    the segment corrupt."""
    try:
        yield
    finally:
        for fd in (0, 1, 2):
            try:
                os.fstat(fd)
            except OSError:
                with contextlib.suppress(OSError):
                    plug_standard(fd)


def boot(
    root: Path,
    config: Config,
    log: HostLog,
    *,
    instance_id: str,
    package_version: str,
    strict: bool,
    importing: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
    progress: Callable[[str | None], None] | None = None,
    still_home: Callable[[], None] | None = None,
) -> Booted:
    """Load Workflows, open the store, restore every Run. Raises IntloomError on failure.

    ``importing`` wraps the import of the Workflow modules only (user code, before anything
    is written): the host makes a stop signal interrupt it there. ``progress`` is told each
    Workflow source as its import begins, and None once it ended. ``still_home`` raises when
    the project's state moved meanwhile (the store opens by path).
    """
    paths = ProjectPaths(root)
    with importing(), _as_a_script_imports(), _standard_descriptors_kept():
        result = load_workflows(root, config, progress=progress)
    for source, view in result.problems:
        log.error("workflow_load_failed", source=source, code=view.code, message=view.message)
    for lw in result.workflows.values():
        log.info("workflow_loaded", workflow=lw.name, version=lw.version, identity=lw.identity,
                 source=lw.source)
        # Loaded all the same (a Step may be kept for later): a note, as doctor's.
        unreached = lw.workflow.unreached_note()
        if unreached is not None:
            log.warning("workflow_unreached", workflow=lw.name, source=lw.source,
                        message=unreached)
    failed = result.failed
    if strict:
        _refuse_before_writing(paths, result.workflows, package_version, result.withheld,
                               failed)
    if still_home is not None:
        still_home()
    compactions: list[str] = []
    store, restored = _open_store(paths, log, instance_id=instance_id,
                                  package_version=package_version, strict=strict,
                                  compactions=compactions)
    try:
        def on_event(event: str, run_id: str, detail: Any, status: str) -> bool:
            fields = detail if isinstance(detail, dict) else {}
            # A failed checkpoint reports a fault of the machine, an internal error one of ours,
            # a Run that failed (not by a cancel) its code's: `jq 'select(.level == "error")'`
            # found none of a project's failed Runs, each logged at info.
            failed_run = (event == "terminal" and status == "failed"
                          and fields.get("code") != "RUN_STOPPED")
            emit = (log.error if failed_run or event in ("checkpoint_failed", "internal_error")
                    else log.info)
            return emit(f"run_{event}", runId=run_id, status=status, **fields)

        runtime = Runtime(result.workflows, store, package_version=package_version,
                          on_event=on_event, withheld=result.withheld, failed=failed)
        summary = runtime.restore(restored, strict=strict,
                                  tool_calls=lambda tasks: _tool_calls_cut(paths, log, tasks))
    except BaseException:
        store.close_blocking()
        raise
    for run_id, problem in runtime.attention:
        held = runtime.held.get(run_id)
        carried = {} if held is None or held.tool_call is None else {"toolCall": held.tool_call}
        log.warning("run_needs_attention", runId=run_id, problem=problem, **carried)
    log.info(
        "restore_finished",
        resumed=len(summary.resumed),
        waiting=len(summary.waiting),
        interrupted=len(summary.interrupted),
        needsAttention=len(summary.needs_attention),
        terminalSkipped=summary.terminal_skipped,
    )
    return Booted(
        runtime=runtime,
        store=store,
        summary=summary,
        compactions=compactions,
        workflows=_workflow_infos(result.workflows, result.problems),
        problems=[WorkflowProblem(source=source, code=view.code, message=view.message)
                  for source, view in result.problems],
        # A torn tail is what any crash leaves, not something to deal with: the log has it.
        store_problems=[StoreProblem(path=f.path, kind=f.kind, problem=f.problem)
                        for f in store.restored.files if f.kind != "torn"],
    )


def _tool_calls_cut(paths: ProjectPaths, log: HostLog,
                    tasks: Mapping[str, str]) -> dict[str, str]:
    """What the log of the host before this one says of the Tool calls it left running, and
    of those the Agent tasks in ``tasks`` had made."""
    found = evidence_log(paths.logs, before=log.path.name)
    return {} if found is None else tool_calls_cut(found, tasks)


def starved(exc: BaseException) -> str | None:
    """What the host ran short of, and the fix, when ``exc`` is the want of a resource the
    limits of the shell that ran ``intloom start`` set (it inherits them); else None."""
    if isinstance(exc, OSError) and exc.errno == errno.EMFILE:
        try:
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        except (OSError, ValueError):
            soft = resource.RLIM_INFINITY
        limit = "" if soft == resource.RLIM_INFINITY else f" (ulimit -n is {soft})"
        return (f"it ran out of file descriptors{limit}. Raise the limit (ulimit -n 1024) in "
                "the shell, then run intloom start again")
    if isinstance(exc, OSError) and exc.errno == errno.ENFILE:
        return ("the system's table of open files is full. Close programs that hold many "
                "files, then run intloom start again")
    thread = isinstance(exc, RuntimeError) and "can't start new thread" in str(exc)
    if isinstance(exc, MemoryError) or thread or (
            isinstance(exc, OSError) and exc.errno == errno.ENOMEM):
        return ("it ran out of memory or threads (ulimit -v, ulimit -u). Raise the limit in "
                "the shell or free memory, then run intloom start again")
    return None


def check_error(exc: BaseException, log_name: str | None) -> IntloomError:
    """The IntloomError to report for a startup failure; the details of others go to the log."""
    if isinstance(exc, IntloomError):
        return exc
    if isinstance(exc, PrivacyError):
        return privacy_invalid(exc)
    short = starved(exc)
    if short is not None:
        return IntloomError("CLI_SERVICE_UNAVAILABLE",
                            f"The host could not start: {short}.")
    where = f" The log .intloom/logs/{log_name} has the details." if log_name else ""
    return IntloomError("CLI_INTERNAL_ERROR", f"The host failed while starting.{where}")
