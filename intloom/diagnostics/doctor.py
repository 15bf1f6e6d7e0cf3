"""``doctor``: the diagnosis, checks with stable ids, and a restart preview for every Run.

Read-only: it reads the configuration, the metadata and the journals, and imports the
Workflows to check their identity (without writing bytecode); it starts, changes and
removes nothing. Invalid metadata does not abort the report: it becomes a ``blocked``
diagnosis and an ``attention`` check naming the file. The token is never part of it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal, NamedTuple

import msgspec
import psutil

from intloom.diagnostics.checks import KEEP_IT, Check
from intloom.diagnostics.owners import (
    NO_CONNECTION_FIX,
    STARTING,
    Diagnosis,
    DiagnosisStatus,
    Inspection,
    Owner,
    bind_refusal,
    inspect,
    judge_readable_owners,
)
from intloom.diagnostics.owners import port_holder as _holder_of  # a context field's name
from intloom.diagnostics.previews import RunPreview, preview_runs
from intloom.diagnostics.temps import TempFile, metadata_temps
from intloom.errors import SHUTTING_DOWN, IntloomError
from intloom.fsutil import (
    PrivacyError,
    check_private_dir,
    file_problem,
    no_inode_left,
    privacy_fix,
    private_file_problem,
    read_refusal,
    search_refusal,
    shell_arg,
    unlink_refusal,
    write_refusal,
)
from intloom.host.liveness import Evidence, holds_open, paused, unheld_lock
from intloom.host.metadata import (
    Connection,
    MetadataDamaged,
    ServiceInfo,
    ServiceLock,
    read_connection,
    read_lock,
    read_service,
)
from intloom.host.observe import observe_file
from intloom.host.toolcalls import evidence_log, last_log, log_records, tool_calls_cut
from intloom.project import Config, ProjectPaths, load_config, require_short_path, scan_logs
from intloom.protocol.messages import ServiceView

if TYPE_CHECKING:
    from intloom.authoring.loader import LoadResult

__all__ = ["SCHEMA_VERSION", "DoctorReport", "Health", "run_doctor", "start_problem"]

SCHEMA_VERSION: Final = 1

Health = Literal["healthy", "attention", "blocked"]


class DoctorReport(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    """``doctor --json``. Minus ``checks``, ``runs``, ``health`` and ``schemaVersion`` it is
    exactly the ``status --json`` diagnosis of a project whose host is not running."""

    schema_version: int
    project_root: str
    status: DiagnosisStatus
    message: str
    owners: list[Owner]
    # What a start would run into (status's last line when offline); null otherwise.
    start_problem: str | None
    health: Health
    checks: list[Check]
    runs: list[RunPreview]
    service: ServiceView | None = None

    @property
    def exit_class(self) -> Health:
        """healthy / attention / blocked; ``intloom.cli.exit_codes`` maps it to a number."""
        return self.health


def _config_check(root: Path) -> tuple[Check, Config | None]:
    try:
        config = load_config(root)
    except IntloomError as exc:
        return Check("config", "attention", exc.message,
                     "Correct intloom.toml, then restart any running host."), None
    count = len(config.workflows)
    return Check(
        "config", "ok",
        f"intloom.toml is valid ({count} Workflow source{'s' if count != 1 else ''}). A "
        "running host keeps the configuration it started with.",
        None,
    ), config


def _store_dirs(paths: ProjectPaths) -> tuple[Path, ...]:
    return (paths.runtime / "wal", paths.runtime / "snap",
            paths.runtime / "snap" / "live", paths.runtime / "snap" / "done")


def refused_state_dir(paths: ProjectPaths) -> PrivacyError | None:
    """The first state directory that exists but is not private and ours, which intloom
    start refuses (its group/other bits, its owner, a link), or None. logs/ too: a start
    that cannot open its log refuses to run; and the store's own directories, which the
    runtime_dir check's "ok" speaks for. status names it before it says "Run intloom
    start"."""
    for path in (paths.state, paths.runtime, paths.logs, *_store_dirs(paths)):
        try:
            check_private_dir(path)
        except PrivacyError as exc:
            if exc.fact != "does not exist":
                return exc
    return None



def start_problem(root: Path) -> str | None:
    """What the ``intloom start`` an offline diagnosis suggests would run into on the
    project as it is: a refusal or failure on its state directories (group/other bits, or
    private but not writable by us), with the fix, on its intloom.toml (invalid: its
    error names the key), or on a store file its restore refuses (a segment it reads that
    is a link or a directory: the file, the fact and the fix), or on the port it binds
    (another process listens there); or, for a flag
    that only snapshot compaction runs into, what happens instead; None when nothing stands
    in its way. The diagnosis leaves modes to
    doctor's runtime_dir check and the configuration to its config check, but "Run intloom
    start" alone sent people straight into those refusals. ``status`` prints it as its last
    line, and both ``status --json`` and ``doctor --json`` carry it (``startProblem``)."""
    paths = ProjectPaths(root)
    exc = refused_state_dir(paths)  # the directories doctor's runtime_dir checks
    if exc is not None:
        return (f"But intloom start refuses the project as it is: {exc.path} {exc.fact}. "
                f"{privacy_fix(exc)}.")
    found = unwritable_state_dirs(paths)
    failing = [dir_ for dir_ in found if not dir_.compaction_only]
    if failing:
        return (f"But intloom start fails on the project as it is: {failing[0].fact} "
                f"{failing[0].fix}.")
    full = _no_room(paths)
    if full is not None:
        return f"But intloom start is likely to fail on the project as it is: {full}."
    # A start reads intloom.toml next, and refuses one it cannot use (INVALID_REQUEST).
    try:
        config = load_config(root)
    except IntloomError as invalid:
        return f"But intloom start refuses the project as it is: {invalid.message}"
    # Then it binds its port (intloom.toml's, else the saved one), before it restores: a
    # port another process holds fails it, which "Run intloom start" alone did not say.
    try:
        conn = read_connection(paths.connection_json, root)
    except IntloomError as invalid:  # a start reads it strictly, for the port and token
        return f"But intloom start refuses the project as it is: {invalid.message}"
    taken = _next_port_check(conn, config)
    if taken is not None:
        return f"But {taken.message[:1].lower()}{taken.message[1:]} {taken.next}"
    from intloom.store.reader import refused_file

    # Then it restores: a store file it may not read (a directory, a link) fails it.
    unreadable = refused_file(paths.runtime)
    if unreadable is not None:
        return f"But intloom start refuses the project as it is: {unreadable.message}"
    if found:
        # The host starts and runs; saying it would fail sent people to fix the wrong thing.
        fix = found[0].fix
        return (f"intloom start works and the Runs go on, but {found[0].refused}: snapshot "
                "compaction fails when it writes there (a warning in the host log each "
                "time), and the log a start reads grows until the flag is cleared. "
                f"{fix[:1].upper()}{fix[1:]}.")
    return None


# Less than a journal segment's header, a log's first lines and a manifest: a start fails.
_ROOM: Final = 64 << 10


def _no_room(paths: ProjectPaths) -> str | None:
    """The file system that holds the project's state when a start cannot write there: out
    of space (under ``_ROOM`` free to this user) or of inodes, with the fix. status said
    "Run intloom start" on a full disk, and that start failed STORAGE_ERROR."""
    where = next((p for p in (paths.runtime, paths.state, paths.root) if os.path.isdir(p)),
                 None)
    if where is None:
        return None
    inodes = no_inode_left(where)
    if inodes is not None:
        return f"the file system holding {where} is full: {inodes}"
    try:
        fs = os.statvfs(where)
    except OSError:
        return None
    free = (fs.f_bfree if os.geteuid() == 0 else fs.f_bavail) * fs.f_frsize
    if fs.f_blocks == 0 or free >= _ROOM:
        return None
    return (f"the file system holding {where} has {free:,} bytes free (df "
            f"{shell_arg(where)}), too little for the host's log, a journal segment and "
            "the Runs' snapshots: free disk space (or quota) there, then start")


class Unwritable(NamedTuple):
    """A state directory in which we may not create, replace or remove files."""

    refused: str  # what refuses, naming the directory (write_refusal's fact)
    needs: str  # what intloom does there that it refuses
    fix: str  # without a full stop
    # Only snapshot compaction writes there (runtime/'s manifest, snap/, its live/ and done/),
    # and the flag on it (immutable, append-only) refuses nothing a start needs: the host
    # starts and runs the Runs; each compaction fails, a warning in the host log, and the
    # log a start reads grows until the flag is cleared.
    compaction_only: bool

    @property
    def fact(self) -> str:
        return (f"{self.refused}; intloom needs to {self.needs} there (its lock, its log, "
                "the Runs' checkpoints).")


def unwritable_state_dir(paths: ProjectPaths) -> tuple[str, str] | None:
    """The first state directory that is there but in which we may not create, replace or
    remove files, as (the fact, the fix without a full stop), or None. Private is not
    enough: a start writes its lock, log and checkpoints into these, and a directory it
    cannot write (0500, the immutable or append-only flag, a read-only mount) fails it or
    its compactions. The fact and fix are read from the file system
    (``fsutil.write_refusal``), as a failed start and recover give them; doctor's
    runtime_dir check and status's hint say the same."""
    found = unwritable_state_dirs(paths)
    return (found[0].fact, found[0].fix) if found else None


def unwritable_state_dirs(paths: ProjectPaths) -> list[Unwritable]:
    """Every state directory ``unwritable_state_dir`` would name, in its order. logs/ and
    wal/ only ever get new files, appended to: an append-only flag there (a sensible way to
    keep logs) hinders nothing, so it is not called a fault."""
    created_only = (paths.logs, paths.runtime / "wal")
    snap = paths.runtime / "snap"
    # What a start creates in each directory only compaction otherwise writes: one that is
    # not there yet cannot be created under an immutable parent.
    compacted = {paths.runtime: ("wal", "snap"), snap: ("live", "done"),
                 snap / "live": (), snap / "done": ()}
    found: list[Unwritable] = []
    if not os.path.lexists(paths.state):
        # No .intloom/ yet: the first start creates it in the project root, which must let
        # it. A root it may not write was "ok: intloom start creates it", and that start
        # failed STORAGE_ERROR.
        refused = write_refusal(paths.state, replaced=False)
        if refused is not None:
            found.append(Unwritable(refused[0], "create .intloom/", refused[1], False))
    for path in (paths.state, paths.runtime, paths.logs, *_store_dirs(paths)):
        if not os.path.isdir(path):
            continue
        # A name that is not there: the directory itself is judged, not a file in it.
        replaced = path not in created_only
        probe = path / ".intloom-doctor"
        refused = write_refusal(probe, replaced=replaced)
        if refused is None:
            continue
        fact, fix = refused
        needs = "create, replace and remove files" if replaced else "create files"
        bar = unlink_refusal(probe)
        compaction_only = (
            path in compacted and bar is not None and bar.where == path
            and (bar.bar == "append_only" or (bar.bar == "immutable" and all(
                os.path.isdir(path / name) for name in compacted[path]))))
        found.append(Unwritable(fact, needs, fix, compaction_only))
    return found


class _Unsearchable(NamedTuple):
    """``.intloom/`` that this user may not search: nothing under it can be looked at."""

    fact: str  # naming the directory, its mode and owner, and this user
    fix: str  # without a full stop


def _unsearchable_state(paths: ProjectPaths) -> _Unsearchable | None:
    """``.intloom/`` itself refusing search (mode 0000, 0600): then every check of a file
    under it (the owners, connection.json, temp files, the journals) would repeat the same
    refusal, each in its own words, as five findings where there is one."""
    try:
        os.lstat(paths.state)
    except OSError:
        return None  # not there, or its parent refuses: those checks say it themselves
    try:
        os.lstat(paths.state / "service.lock")
    except PermissionError:
        pass
    except OSError:
        return None
    else:
        return None
    refused = search_refusal(paths.state / "service.lock")
    if refused is None:
        return None
    fact, fix = refused
    with contextlib.suppress(OSError):
        if os.stat(paths.state).st_uid == os.geteuid():
            # Search alone (u+x) would leave it unlistable: the temp_files check would then
            # be the next refusal. 0700 is the mode intloom gives it.
            fix = f"Run chmod 700 {shell_arg(paths.state)}"
    return _Unsearchable(fact, fix)


def _skipped(check_id: str, what: str) -> Check:
    """A check not made because ``.intloom/`` cannot be searched (runtime_dir says so)."""
    return Check(check_id, "not_checked",
                 f"Not checked: {what} cannot be looked at while .intloom/ cannot be searched "
                 "(runtime_dir above).", None)


def _runtime_dir_check(paths: ProjectPaths) -> Check:
    try:
        check_private_dir(paths.state)
    except PrivacyError as exc:
        if exc.fact == "does not exist":
            unwritable = unwritable_state_dir(paths)
            if unwritable is not None:
                fact, fix = unwritable
                return Check("runtime_dir", "attention",
                             f"No .intloom/ yet, and intloom start cannot create it: {fact}",
                             f"{fix}, then run intloom doctor again.")
            try:
                require_short_path(paths.root)
            except IntloomError as too_long:
                return Check("runtime_dir", "attention",
                             "No .intloom/ yet, and intloom start cannot create its files: "
                             f"{too_long.message}", "Move the project to a shorter path, "
                             "then run intloom doctor again.")
            return Check("runtime_dir", "ok",
                         "No .intloom/ yet; intloom start creates it (mode 0700).", None)
        return Check("runtime_dir", "attention", f"{exc.path} {exc.fact}.",
                     f"{privacy_fix(exc)}. {KEEP_IT}")
    loose_dir = refused_state_dir(paths)
    if loose_dir is not None:
        return Check("runtime_dir", "attention", f"{loose_dir.path} {loose_dir.fact}.",
                     f"{privacy_fix(loose_dir)}. {KEEP_IT}")
    absent = [f".intloom/{path.name}/" for path in (paths.runtime, paths.logs)
              if not os.path.lexists(path)]
    unwritable = unwritable_state_dir(paths)
    if unwritable is not None:
        fact, fix = unwritable
        return Check("runtime_dir", "attention", fact[:1].upper() + fact[1:],
                     f"{fix}, then run intloom doctor again.")
    # Before "no logs/ yet": a runtime/ without logs/ (a project copied without its logs)
    # still holds files a start refuses.
    # manifest.json and the snapshots are not looked at here: such a file is read past as a
    # damaged one is, and the journals check reports it, as a start does.
    loose = _loose_segment(paths.runtime / "wal")
    if loose is not None:
        # A start reads only the segments it needs, and inspect leaves an old one like
        # this unread (a finding): what it holds is out of sight until it is put right.
        return Check("runtime_dir", "attention", f"{loose.path} {loose.fact}.",
                     f"{privacy_fix(loose)}. {KEEP_IT}")
    if absent:
        return Check("runtime_dir", "ok", f"No {' or '.join(absent)} yet: intloom start "
                     "creates what it needs (mode 0700).", None)
    log = _loose_log(paths.logs)
    if log is not None:
        # No start reads an old log again: only doctor can say that others may read it.
        if log.readable_mode is not None:
            fact = (f"has mode {log.readable_mode:04o}: others may read what the Runs did "
                    "(a host log is 0600, 0400 once sealed)")
            fix = f"Run chmod go= {shell_arg(log.error.path)} (it keeps your own bits)"
        else:
            fact, fix = log.error.fact, privacy_fix(log.error)
        return Check("runtime_dir", "attention", f"{log.error.path} {fact}.",
                     f"{fix}. {KEEP_IT}")
    # Private is what is checked (no access for group or others), not 0700: run by root, a
    # directory chmod 000 was said to be 0700.
    return Check("runtime_dir", "ok", ".intloom/, .intloom/runtime/ (with its wal/ and snap/) "
                 "and .intloom/logs/ are private directories of yours (closed to others).",
                 None)


class _LooseLog(NamedTuple):
    error: PrivacyError
    # The log's permission bits when they are what is wrong (others may read it): doctor
    # says so with its own words and fix, not file_problem's "private files must be 0600".
    readable_mode: int | None


def _loose_log(logs: Path) -> _LooseLog | None:
    """The first host log (``scan_logs``: a regular file under a host's log name) others may
    read, or that is not ours, if any. An entry of another kind is ``log_files``'s."""
    try:
        found, _, _ = scan_logs(logs)
    except OSError:
        return None  # none to read: nothing others can read either
    for path in found:
        try:
            st = os.lstat(path)
        except OSError:
            continue  # gone since the listing (a host pruning its old logs): none to read
        problem = file_problem(st) if stat.S_ISREG(st.st_mode) else None
        if problem is not None:
            ours = st.st_uid == os.getuid()
            mode = stat.S_IMODE(st.st_mode) if ours and st.st_mode & 0o077 else None
            return _LooseLog(PrivacyError(path, problem), mode)
    return None


_NAMED: Final = 20  # stray entries of logs/ named one by one; the rest are counted


def _stray_logs_check(logs: Path) -> Check | None:
    """``log_files``, only when ``.intloom/logs/`` holds an entry no host writes: a name
    other than a host's (``LOG_NAME``: notes, a renamed copy), or one of that name that is no
    regular file (a link, a FIFO). ``intloom logs`` names them as it passes over them (the
    same ``scan_logs``); doctor was silent about them. Never read or touched."""
    try:
        _, skipped, foreign = scan_logs(logs)
    except OSError:
        return None  # one runtime_dir names as unlistable
    found = [f".intloom/logs/{name} ({why})" for name, why in sorted(
        [(path.name, "not a log intloom writes") for path in foreign]
        + [(path.name, f"{what}, not a regular file") for path, what in skipped])]
    if not found:
        return None
    named = ", ".join(found[:_NAMED])
    more = f", and {len(found) - _NAMED} more" if len(found) > _NAMED else ""
    return Check(
        "log_files", "attention",
        f"{len(found)} entr{'y' if len(found) == 1 else 'ies'} in .intloom/logs/ no host "
        f"wrote (a host writes only regular files named LOG-<UTC>.jsonl there): {named}"
        f"{more}. intloom logs passes over them and names them; they are kept as they are.",
        "Find out what put them there, then move them out of .intloom/logs/ unless you need "
        "them there (intloom never reads, moves or removes them).")


def _loose_segment(wal: Path) -> PrivacyError | None:
    """The first WAL segment that is not a private regular file of ours, if any."""
    try:
        entries = sorted(os.scandir(wal), key=lambda e: e.name)
    except OSError:
        return None  # the journals check reports an unreadable wal/
    for entry in entries:
        if not entry.name.endswith(".seg"):
            continue  # unexpected files are the journals check's
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue  # gone since the listing (recover moved it aside): none to read
        problem = file_problem(st)
        if problem is not None:
            return PrivacyError(Path(entry.path), problem)
    return None


def _file_problem(read: Callable[[], object]) -> str | None:
    try:
        read()
    except IntloomError as exc:
        return exc.here
    return None


class _Context(msgspec.Struct, frozen=True):
    """What the owner checks need to know beyond their own file."""

    running: bool
    invalid: str | None = None  # what is wrong with another metadata file ("X is invalid")
    port_taken: int | None = None
    port_holder: str | None = None
    # service.lock's identity (device, inode) when it exists and nobody holds its OS lock:
    # a live pid it names that has no descriptor open on that file is not this project's
    # host (a host creates it through a descriptor it keeps for its whole life, and holds
    # the OS lock on it from a moment after it appears); typically the original host of a
    # project directory copied with its .intloom/.
    lock_unheld: tuple[int, int] | None = None
    # The diagnosis is a host in its start-up (owners.STARTING): its lock record, taken
    # before service.json is written.
    starting_since: str | None = None
    # service.json is a crashed host's, which the host in its start-up replaces once it
    # serves (owners._left_by_a_crash).
    crashed_service_json: bool = False
    # service.json and connection.json, each valid, name different ports: no client
    # reaches the host (it refuses the mismatch), in words.
    ports_differ: str | None = None
    # What asking the live host who it is came to, when it answered on the project's port
    # but the hello failed (a token it refuses, another instance than service.json names):
    # the owner is not "starting or stopping", and waiting changes nothing.
    refused: str | None = None
    refused_code: str | None = None  # that refusal's code
    host_pid: int | None = None  # the running host's, when it answered
    # service.json names a live host whose log says no stop, and the diagnosis is no
    # start-up: it served, and does not answer now (a Step holding the interpreter), where
    # "it may be starting or stopping; wait a moment" never came true.
    serving_silent: bool = False
    # No service.lock, and the live pid service.json names has none of runtime/ and the
    # host log it names open (/proc/PID/fd): a host keeps them for its life, so such a pid
    # (pid 1, say, named with its create time, which anyone may read) must not be
    # signalled on the word of a service.json alone.
    holds_nothing: bool = False
    # The diagnosis is a host on its way out (its log, or its reply, says its stop began):
    # the owner checks said it "does not answer ... (it may be starting or stopping)" under
    # a first line that says it is shutting down.
    stopping: bool = False


def _service_info(paths: ProjectPaths, root: Path) -> ServiceInfo | None:
    """``service.json``, or None when there is none or it cannot be read (its own check
    says why)."""
    try:
        return read_service(paths.service_json, root)
    except IntloomError:
        return None


def _holding(paths: ProjectPaths, info: ServiceInfo | None) -> list[bool | None]:
    """For the pid ``service.json`` (``info``) names, whether it has each file a host keeps
    open for its whole life open (``holds_open``: None when that cannot be told):
    ``service.lock``, ``runtime/`` (the store's lock, held from before the import to the
    end) and the host log ``service.json`` names (a plain name in ``logs/`` only). Empty
    when there is no valid ``service.json``."""
    if info is None:
        return []
    from intloom.client.hostlog import log_path

    found: list[bool | None] = []
    log = log_path(paths, info.log_file)
    for path in (paths.service_lock, paths.runtime, log):
        if path is None:
            continue
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            continue
        found.append(holds_open(info.pid, (st.st_dev, st.st_ino)))
    return found


def _serving_silent(paths: ProjectPaths, info: ServiceInfo | None) -> bool:
    """service.json (``info``) is there and its host's log has no ``service_stopping``: a
    host that served, not one starting or stopping (whether it lives is the owner check's
    to judge)."""
    from intloom.client.hostlog import log_says_stopping

    return info is not None and not log_says_stopping(paths, info)


def _keep_it(path: Path) -> str:
    """The next step for a metadata file that is a problem: KEEP_IT, or, when a directory on
    the way may not be searched (so the file may not even exist), that directory's fix:
    "intloom keeps it exactly as it is" was said of a file none could see."""
    refused = search_refusal(path)
    if refused is None:
        return KEEP_IT
    return f"{refused[1]}, then run intloom doctor again; nothing was changed."


def _owner_check(
    check_id: str, name: str, path: Path, owner: Owner | None, problem: str | None,
    ctx: _Context,
) -> Check:
    if problem is not None:
        return Check(check_id, "attention", problem, _keep_it(path))
    if owner is None:
        if path.exists() or path.is_symlink():
            # Fail closed: a file that is there is never reported absent.
            return Check(check_id, "attention", f"{path} exists, but its owner could not be "
                         "judged.", KEEP_IT)
        if ctx.running and ctx.host_pid is not None and name == "service.lock":
            # Every host creates it first and keeps it: one that is gone while the host runs
            # was removed by hand, and "no host owns the project through it" read as fine.
            return Check(
                check_id, "attention",
                f"No service.lock, yet the running host (pid {ctx.host_pid}) created one at "
                "its start and keeps it until it stops: it was removed by hand. The host "
                "serves as before; until it restarts, only the checkpoint store's own lock "
                "keeps a second host out.",
                "Restart the host (intloom stop, then intloom start), which writes it again; "
                "never copy another service.lock there.",
            )
        return Check(check_id, "ok", f"No {name}: no host owns the project through it.", None)
    pid = owner.pid
    running = ctx.running
    # Looked at once (it reads the pid's open files), for the two checks below.
    not_its_host = (owner.status == "alive" and ctx.lock_unheld is not None
                    and holds_open(pid, ctx.lock_unheld) is False)
    if not_its_host and ctx.invalid is not None:
        # Fail closed: a free lock alone is also what a first start looks like between
        # creating service.lock and locking it. Only a pid proved not to have the file open
        # is another project's host; one that may have it is judged as holding the project.
        return Check(
            check_id, "attention",
            f"{name} names pid {pid}, which is alive but does not hold this project's "
            "service.lock (its OS lock is free and the pid has no descriptor open on it; a "
            "host keeps both for its whole life), so "
            f"it is not this project's host; and {ctx.invalid} (its check says why). A "
            "project directory copied or moved with its .intloom/ keeps the files of the "
            "host that ran there, which may be that host.",
            f"Do not signal pid {pid}: it may serve another project. Confirm with ps -p {pid} "
            "-o args, then move this project's service.json and service.lock aside by hand "
            "(intloom keeps them as they are) and run intloom doctor again.",
            _without_descriptor(owner),
        )
    if owner.status == "alive" and ctx.holds_nothing and not running:
        return Check(
            check_id, "attention",
            f"{name} names pid {pid} ({_process_name(pid)}), which is alive but holds "
            "nothing of this project: there is no service.lock, and the pid has neither "
            ".intloom/runtime/ nor the host log service.json names open (a host keeps them "
            "for its whole life), so it is not this project's host.",
            f"Do not signal pid {pid} on the word of {name}: confirm what it is with ps -p "
            f"{pid} -o args, then move this project's service.json aside by hand (intloom "
            "keeps it as it is) and run intloom doctor again.",
            owner.evidence,
        )
    if owner.status == "alive" and ctx.invalid is not None and not paused(pid):
        return Check(
            check_id, "attention",
            f"{name} names pid {pid}, which is alive: it still holds the project. It was not "
            f"asked whether it serves the project, because {ctx.invalid} (its check says "
            "why); intloom stop cannot reach it either.",
            f"Leave both files as they are while pid {pid} runs. To stop it, ask it directly "
            f"(kill -TERM {pid}: a graceful stop), then run intloom doctor again.",
            owner.evidence,
        )
    if owner.status == "alive" and running:
        return Check(check_id, "ok", f"{name} belongs to the running host (pid {pid}).", None,
                     owner.evidence)
    if owner.status == "alive" and paused(pid):
        return Check(
            check_id, "attention",
            f"{name} names pid {pid}, which is alive but paused (stopped by a signal: "
            "SIGSTOP, Ctrl-Z or a debugger), so it holds the project and answers nobody.",
            f"Resume it (kill -CONT {pid}, or fg in its terminal), then run intloom doctor "
            "again. Do not delete locks whose owners are still active.",
            owner.evidence,
        )
    if owner.status == "alive" and ctx.ports_differ is not None:
        return Check(
            check_id, "attention",
            f"{name} names pid {pid}, which is alive: it still holds the project. It was not "
            f"asked whether it serves the project, because {ctx.ports_differ} (a client "
            "connects to connection.json's port and refuses a service.json naming another); "
            "intloom stop cannot reach it either.",
            f"Leave the files as they are while pid {pid} runs. To stop it, ask it directly "
            f"(kill -TERM {pid}: a graceful stop, which removes service.json and "
            "service.lock), then run intloom doctor again.",
            owner.evidence,
        )
    if owner.status == "alive" and ctx.starting_since is not None:
        return Check(
            check_id, "attention",
            f"{name} names pid {pid}, which is alive and starting (since "
            f"{ctx.starting_since}): it holds the project's lock and has not written "
            "service.json yet, which a start does last, once it has loaded its Workflows, "
            "restored its Runs and listens.",
            "Wait a moment and run intloom doctor again (intloom start waits for it); if it "
            "stays starting, run intloom logs. Do not delete locks whose owners are still "
            "active.",
            owner.evidence,
        )
    if not_its_host:
        # As for invalid metadata above: only a pid proved not to have the file open is
        # named as no host of the project. "Wait a moment" never ended for such a pid.
        # Before a refused hello: a client refuses the host of a directory this one was
        # copied from (its lock is free here), and "stop pid N directly" stopped that
        # directory's host.
        return Check(
            check_id, "attention",
            f"{name} names pid {pid} ({_process_name(pid)}), which is alive but does not hold "
            "this project's service.lock (its OS lock is free and the pid has no descriptor "
            "open on it; a host keeps both for its whole life, and lets go of them only as "
            "its stop ends), so it is not this project's host.",
            f"Run intloom doctor again in a moment. If it still says this, do not signal pid "
            f"{pid}: confirm what it is with ps -p {pid} -o args, then move this project's "
            "service.json and service.lock aside by hand (intloom keeps them as they are) "
            "and run intloom doctor again.",
            _without_descriptor(owner),
        )
    if owner.status == "alive" and ctx.refused is not None:
        return Check(
            check_id, "attention",
            f"{name} names pid {pid}, which is alive and answers on the project's port, but "
            f"the hello failed, so no client reaches it: {ctx.refused}",
            # A host of another socket protocol was started by another intloom (an upgrade
            # while it ran): nothing was changed by hand, and that intloom's stop suspends
            # its Runs as this one's cannot.
            f"Leave {name} as it is while pid {pid} runs. Restart the host with this intloom: "
            "stop it with the intloom that started it (intloom stop), or with kill -TERM "
            f"{pid} (a graceful stop: its Runs are suspended at their last checkpoint); then "
            "run intloom start with this one. Do not delete locks whose owners are still "
            "active." if ctx.refused_code == "PROTOCOL_MISMATCH" else
            f"Leave {name} as it is while pid {pid} runs. Put back what was changed by hand, "
            f"or stop pid {pid} directly (kill -TERM {pid}: a graceful stop); then run "
            "intloom doctor again. Do not delete locks whose owners are still active.",
            owner.evidence,
        )
    if owner.status == "alive" and ctx.serving_silent:
        return Check(
            check_id, "attention",
            f"{name} names pid {pid}, the host serving this project (it wrote service.json "
            "once it served, and its log says no stop), which is alive but does not answer: "
            "something holds it, most often Workflow code (a Step, a Tool, an effect) "
            "computing in pure Python for long in one call, which holds the interpreter, or "
            "a machine out of CPU or memory.",
            "Run intloom doctor again in a moment: it answers once that code returns. If it "
            f"never does, kill -TERM {pid} stops it as soon as it can run; as a last resort "
            f"kill -9 {pid}, then intloom recover and intloom start (what was running comes "
            "back RUN_INTERRUPTED). Do not delete locks whose owners are still active.",
            owner.evidence,
        )
    if owner.status == "alive" and ctx.stopping:
        return Check(
            check_id, "attention",
            f"{name} names pid {pid}, which is alive and shutting down (its stop has "
            "begun): it suspends its Runs, then exits and removes its service.json and "
            "service.lock itself.",
            "Wait for it to exit: intloom status says offline once it has (intloom start "
            "waits for that). Do not delete locks whose owners are still active.",
            owner.evidence,
        )
    if owner.status == "alive":
        return Check(
            check_id, "attention",
            f"{name} names pid {pid}, which is alive but does not answer as this project's "
            "host (it may be starting or stopping).",
            "Wait a moment and run intloom doctor again. Do not delete locks whose owners are "
            "still active.",
            owner.evidence,
        )
    if (owner.status == "unknown" and name == "service.json" and ctx.crashed_service_json
            and ctx.starting_since is not None):
        # Its exit is proven; only the OS lock, which the starting host holds, keeps it
        # "unknown". "Find the process that holds the project's lock and let it exit" told
        # the user to stop the start that is about to replace the file.
        return Check(
            check_id, "attention",
            f"{name} names pid {pid}, a host that has exited without removing it (a crash). "
            f"The host starting since {ctx.starting_since} holds the project's lock (see "
            f"service.lock) and replaces {name} once it serves.",
            "Wait a moment and run intloom doctor again (intloom start waits for it). Leave "
            f"{name} as it is: the starting host replaces it.",
            owner.evidence,
        )
    if owner.status == "unknown":
        return Check(
            check_id, "attention",
            f"{name} names pid {pid}, and its exit cannot be verified.",
            "Do not delete it. Find the process that holds the project's lock (fuser -v "
            ".intloom/service.lock) and let it exit, then run intloom doctor again.",
            owner.evidence,
        )
    stale = f"{name} is stale: its owner, pid {pid}, has exited."
    if ctx.port_taken is not None:
        port = ctx.port_taken
        who = ctx.port_holder or f"find it with: ss -ltnp 'sport = :{port}'"
        return Check(
            check_id, "attention",
            f"{stale} But port {port}, the project's saved port, is in use by another process "
            f"({who}), so intloom recover refuses.",
            f"Stop the process on port {port} (or wait until it has exited), then run intloom "
            "recover --dry-run, intloom recover and intloom start.",
            owner.evidence,
        )
    if ctx.invalid is not None:
        return Check(
            check_id, "attention", stale,
            f"intloom recover refuses while {ctx.invalid}: deal with it first (its check), "
            "then run intloom doctor again.",
            owner.evidence,
        )
    return Check(
        check_id, "attention", stale,
        "Run intloom recover --dry-run to see the plan, then intloom recover, then intloom "
        "start.",
        owner.evidence,
    )


def _without_descriptor(owner: Owner) -> list[Evidence]:
    """The owner's evidence, and that its pid has no descriptor open on service.lock: what
    proves a live pid is no host of this project."""
    return [*owner.evidence, Evidence("lock_descriptor",
                                      f"pid {owner.pid} has no descriptor open on service.lock")]


def _process_name(pid: int) -> str:
    """A process's name for a message (never its command line, which may hold secrets)."""
    try:
        return str(psutil.Process(pid).name())
    except psutil.Error:
        return "its name cannot be read"


def _next_port_check(conn: Connection | None, config: Config | None) -> Check | None:
    """With no host and no owner, whether the port the next start binds (intloom.toml's
    ``port``, else the saved one; as the host picks it) is taken: that start would fail."""
    if config is not None and config.port:  # 0 fixes no port: the start takes the saved one
        port, source = config.port, "port in intloom.toml"
        # 0 or no port reuses the saved one (maybe this very port): not a free one.
        way_out = ("change port in intloom.toml to a free one (or remove it and run intloom "
                   "start --port 0 once, which picks one and saves it), then run intloom "
                   "start.")
    elif conn is not None:
        port, source = conn.port, "the port saved in connection.json"
        way_out = ("run intloom start --port 0 to pick a new port (saved in connection.json; "
                   "clients using the old one must be told), then run intloom doctor again.")
    else:
        return None
    refusal = None if port == 0 else bind_refusal(port)
    if refusal is None:
        return None
    if refusal.errno != errno.EADDRINUSE:
        refused = refusal.strerror or str(refusal)
        # Nobody holds it: the start may not bind it (a port below 1024 without the
        # privilege), and says so ("Permission denied").
        return Check(
            "connection", "attention",
            f"Port {port} on 127.0.0.1 ({source}), where the next intloom start would "
            f"listen, cannot be bound by you ({refused}): that start fails.",
            way_out[0].upper() + way_out[1:],
        )
    who = _holder_of(port) or f"find it with: ss -ltnp 'sport = :{port}'"
    return Check(
        "connection", "attention",
        f"Port {port} on 127.0.0.1 ({source}), where the next intloom start would listen, is "
        f"in use by another process ({who}): that start fails.",
        f"Stop that process, or {way_out}",
    )


def _connection_check(root: Path, has_owners: bool, running: bool = False,
                      config: Config | None = None, live_pid: int | None = None) -> Check:
    """``live_pid``: an owner of the host's files that is alive (one whose exit cannot be
    verified is not advised a kill: its pid may be another process's by now)."""
    paths = ProjectPaths(root)
    try:
        conn: Connection | None = read_connection(paths.connection_json, root)
    except MetadataDamaged as exc:
        if has_owners or running:
            return Check("connection", "attention", exc.here, _keep_it(paths.connection_json))
        # No host owns the project: the file holds only a port and a token, which a start
        # makes anew. "Fix or move it by hand" left the user to guess what it costs.
        # A name no file has: an earlier .damaged one is kept as it is, never overwritten.
        moved = next((name for n in range(1000)
                      if not os.path.lexists(name := f"{paths.connection_json}.damaged"
                                             + (f".{n}" if n else ""))),
                     f"{paths.connection_json}.damaged.{os.getpid()}")
        return Check(
            "connection", "attention", exc.here,
            "No host owns this project, and the file holds only the port and token clients "
            f"read: move it aside (mv {shell_arg(str(paths.connection_json))} "
            f"{shell_arg(moved)}), then run intloom start, which saves a new token and "
            + (f"port {config.port} from intloom.toml" if config is not None and config.port
               else "a free port")
            + " and restores the Runs. Nothing of any Run is in it.",
        )
    except IntloomError as exc:
        loose = private_file_problem(paths.connection_json)
        if loose is not None and loose.fact.startswith("has mode"):
            # Its own steps, in order (privacy_fix): "only once you are sure no host runs"
            # left a user with a running host no way to stop it.
            return Check("connection", "attention", exc.here, f"{privacy_fix(loose)}.")
        return Check("connection", "attention", exc.here, _keep_it(paths.connection_json))
    if conn is None and live_pid is not None:
        # "Then run intloom recover" of a live host: recover refuses it (the service is
        # running), as the owner checks beside this one say.
        return Check(
            "connection", "attention",
            f"connection.json is missing while the host's files name a live owner (pid "
            f"{live_pid}): a client reads the host's port and token only from that file, so "
            "no command can reach it.",
            "Put .intloom/connection.json back if you moved it. If it is lost: stop the "
            f"host directly (kill -TERM {live_pid}: a graceful stop, which suspends its Runs "
            "at their checkpoints), then run intloom start, which writes a new one.",
        )
    if conn is None and has_owners:
        return Check(
            "connection", "attention",
            "connection.json is missing while host resources remain; recovery is unsafe: "
            "intloom recover checks the project's saved port with it and does not run "
            "without it.",
            NO_CONNECTION_FIX,
        )
    if not has_owners and not running:
        taken = _next_port_check(conn, config)
        if taken is not None:
            return taken
    if conn is None:
        return Check("connection", "ok",
                     "No connection.json yet; the first intloom start creates it.", None)
    return Check("connection", "ok",
                 f"connection.json is valid: port {conn.port}; the token is not shown.", None)


def _load(root: Path, config: Config) -> LoadResult:
    # What doctor imports after the load (the store's reader, the host's observation of the
    # state directory) is imported first: the load puts the project's root first on
    # sys.path, and a logging.py or asyncio.py of the project there became the standard
    # library's module for their imports (doctor failed CLI_INTERNAL_ERROR, exit 70).
    import intloom.host.observe
    import intloom.store.files
    import intloom.store.reader  # noqa: F401
    from intloom.authoring.loader import load_workflows_offline

    return load_workflows_offline(root, config)  # doctor is read-only: no __pycache__


def _workflows_check(root: Path, config: Config | None) -> tuple[Check, LoadResult | None]:
    if config is None:
        return Check("workflows", "not_checked", "Not loaded: the configuration is invalid.",
                     "Correct intloom.toml first."), None
    from intloom.project import CONFIG_NAME, foreign_owner

    owner = foreign_owner(root)
    if owner is not None:
        # Named with --project (the upward search takes no such project): doctor, read-only,
        # imported that user's code as this one -- as root, for an administrator looking
        # at a user's project.
        from intloom.fsutil import shell_arg

        return Check(
            "workflows", "not_checked",
            f"Not loaded: {root / CONFIG_NAME} or its directory belongs to another user (uid "
            f"{owner}, not {os.geteuid()}), and importing its Workflow code would run that "
            "code as you.",
            f"Run doctor as that user to check the Workflows: sudo -u '#{owner}' intloom "
            f"--project {shell_arg(str(root))} doctor."), None
    from intloom.authoring.loader import SourceStarved

    try:
        result = _load(root, config)
    except SourceStarved as exc:
        # Under a low ulimit -n the import could not be set up: "Fix the Workflow sources"
        # sent the reader to sources nothing had looked at.
        return Check("workflows", "attention", exc.message,
                     "Give this process more file descriptors as said above (ulimit -n; "
                     "for a full system table, fs.file-max), then run intloom doctor again; "
                     "the sources themselves were not judged."), None
    except IntloomError as exc:
        return Check("workflows", "attention", exc.message,
                     "Fix the Workflow sources, then run intloom doctor again."), None
    if result.starved:
        # This process's limit, not the project: the Runs are compared with no partial load
        # (they read as held for a Workflow that only failed to load here).
        problems = "; ".join(f"{source}: {view.message}" for source, view in result.problems
                             if source in result.starved)
        return Check(
            "workflows", "attention",
            f"{len(result.starved)} Workflow source(s) could not be imported for want of file "
            f"descriptors in this doctor process: {problems}",
            "Give this process more file descriptors, as said above, then run intloom "
            "doctor again; the sources themselves were not judged, nor the Runs against "
            "them.",
        ), None
    loaded = ", ".join(
        f"{wf.name} {wf.version} (identity {wf.identity[:12]})"
        for wf in result.workflows.values()
    )
    # Said, not attention: a Step kept for later is no fault, and doctor would never be
    # healthy (exit 0) while it is kept.
    notes = [note for wf in result.workflows.values()
             if (note := wf.workflow.unreached_note()) is not None]
    if notes:
        loaded += ". Note: " + " ".join(notes).removesuffix(".")
    if result.problems:
        problems = "; ".join(f"{source}: {view.code}: {view.message}"
                             for source, view in result.problems)
        return Check(
            "workflows", "attention",
            f"{len(result.problems)} Workflow source(s) failed to load: {problems}"
            + (f" Loaded: {loaded}." if loaded else ""),
            # A broken source does not stop the host (docs/lifecycle.md): say what it does.
            "Fix the Workflow sources named above, then restart the host (intloom stop, "
            "intloom start). The host runs the Workflows that load; the Runs of one that does "
            "not are held (needs attention, journal kept) until it loads.",
        ), result
    if not result.workflows:
        return Check("workflows", "attention", "No Workflow is declared in intloom.toml.",
                     'Add a source to intloom.toml, e.g. workflows = ["workflows/example.py"].'
                     ), result
    return Check("workflows", "ok", f"Loaded: {loaded}.", None), result


def _with_host(root: Path, service: ServiceView, check: Check,
               loaded: LoadResult | None) -> Check:
    """``check``, and what the running host loaded when that differs from the project on
    disk (``intloom.client.drift``): the host loaded it once, at its start. ``loaded``:
    what doctor itself loaded from disk, which also tells a source the host failed to load
    that loads now (drift imports nothing, so it cannot)."""
    from intloom.client.drift import against_host

    compared = against_host(root, service)
    if compared is None:
        return check  # it stopped meanwhile: the next start loads the project as it is
    flows, changes = compared
    now: dict[str, list[str]] = {}
    for lw in loaded.workflows.values() if loaded is not None else []:
        now.setdefault(lw.source, []).append(lw.name)
    # A source the host loaded Workflows from also has a failed entry when it is listed
    # twice (the repeat is refused): the host runs it, so that is no difference.
    running = {info.source for info in flows if info.ready}
    fixed = [f"{source} failed to load when the host started and loads now "
             f"({', '.join(now[source])}); the host runs none of it."
             for source in dict.fromkeys(info.source for info in flows if not info.ready)
             if source in now and source not in running]
    if not changes and not fixed:
        return check
    found = " ".join([c.message for c in changes] + fixed)
    todo = ("The running host runs what it loaded at its start (new Runs too). To load the "
            "change: intloom stop, then intloom start")
    from intloom.client.drift import held_after

    held = held_after({c.change for c in changes})
    # None for a source moved with its tree or a port (no Run held for them), and for a
    # source that failed to load and was written since (its Runs are held already).
    if held is not None:
        todo += f"; {held} (the journals check lists them)"
    return Check("workflows", "attention",
                 f"{check.message} The running host (pid {service.pid}) differs: {found}",
                 todo + "." + (f" Also: {check.next}" if check.next else ""))


def _temp_files_check(paths: ProjectPaths) -> Check:
    try:
        os.listdir(paths.state)
    except PermissionError:
        # "ok: No temp file ... is left" was said of a .intloom/ that could not be listed.
        fact, fix = read_refusal(paths.state)
        if fix.startswith("Run chmod u+r "):  # a directory is listed with r, searched with x
            fix = f"Run chmod 700 {shell_arg(paths.state)}"
        return Check("temp_files", "not_checked",
                     f"Temp files an interrupted write left in .intloom/ cannot be looked for: "
                     f"{fact}, so it cannot be listed.", f"{fix}, then run intloom doctor "
                     "again; nothing was changed.")
    except OSError:
        pass  # absent (nothing was ever written there) or no directory: runtime_dir says so
    left, unsure = metadata_temps(paths)
    if not left and not unsure:
        return Check("temp_files", "ok",
                     "No temp file of an interrupted metadata write is left in .intloom/ "
                     "(the store's own, under runtime/, the next start removes).", None)
    message, todo = [], []
    if left:
        named = ", ".join(_temp_named(t) for t in left)
        many = len(left) > 1
        message.append(
            f"{len(left)} temp file{'s' if many else ''} in .intloom/ left by a write that "
            f"was interrupted (a crash): {named}. intloom never reads "
            f"{'them' if many else 'it'} and never removes {'them' if many else 'it'}.")
        todo.append(
            f"The file {'each' if many else 'it'} was written for is whole or absent, so "
            f"{'they hold' if many else 'it holds'} nothing intloom needs. To remove "
            f"{'them' if many else 'it'} (not while an intloom start runs), from the "
            f"project's root: rm -- {' '.join(t.path for t in left)}")
    if unsure:
        # Never offered for removal: its writer (a starting host) may still need it.
        named = "; ".join(f"{_temp_named(u.temp)}: {u.why}" for u in unsure)
        many = len(unsure) > 1
        message.append(
            f"{len(unsure)} temp file{'s' if many else ''} in .intloom/ may belong to a "
            f"write in progress (a starting host's), so {'they are' if many else 'it is'} "
            f"not called left behind: {named}.")
        blind = [u.temp.path for u in unsure if not u.probed]
        if len(blind) < len(unsure):
            todo.append("Run intloom doctor again in a moment: a write in progress is done "
                        "by then, and a temp file it left behind is named as such")
        if blind:
            todo.append(f"To tell whether a process still writes {' '.join(blind)}, run "
                        f"fuser -v {' '.join(blind)} from the project's root; if none has it "
                        "open, it was left by an interrupted write and holds nothing intloom "
                        "needs")
    return Check("temp_files", "attention", " ".join(message), ". ".join(todo))


def _host_check(service: ServiceView) -> Check | None:
    """What the running host says is wrong with its own disk: its journal or its log refuse
    to be written (every checkpoint fails until a restart, or it refuses new work). status
    said so; doctor, the command that explains, called the project healthy (exit 0) beside
    a host whose every checkpoint failed. None while neither is the case (a refused
    compaction is in status: the Runs go on)."""
    if service.journal_error is not None:
        fix = service.journal_fix or ("free space on the disk that holds .intloom/runtime "
                                      "(or fix it)")
        return Check("host", "attention",
                     f"The running host's journal takes no more checkpoints: "
                     f"{service.journal_error}. Every Run's next checkpoint fails until the "
                     "host restarts.",
                     f"Run intloom stop; {fix}; then intloom start.")
    if service.log_error is not None:
        return Check("host", "attention", f"The running host's log: {service.log_error}",
                     "It refuses new work: run intloom stop, fix the disk, then intloom "
                     "start.")
    return None


def _has_segments(wal: Path) -> bool:
    try:
        return any(name.endswith(".seg") for name in os.listdir(wal))
    except OSError:
        return False


def _left_home_check(paths: ProjectPaths, found: tuple[str, bytes] | None) -> Check | None:
    """The last host's fatal ``state_dir_moved``: it stopped serving because its
    ``.intloom/runtime/`` was moved or deleted. With ``runtime/`` alone gone, its log stayed
    in ``.intloom/logs/``, and doctor said "No .intloom/runtime/ yet" and "stale resources
    ... recover, then start": a start that begins with no Run, while the Runs may be in a
    moved directory. ``found``: that log's name and tail (``last_log``)."""
    if found is None or _has_segments(paths.runtime / "wal"):
        return None  # put back (its logs with it), or a new journal since: nothing to say
    name, tail = found
    left = next((r for r in log_records(tail) if r.get("event") == "state_dir_moved"), None)
    if left is None:
        return None
    return Check(
        "state_dir", "attention",
        f"The last host stopped serving ({left.get('time', '?')}, .intloom/logs/{name}): "
        f"{left.get('message', '?')}",
        f"{left.get('fix') or 'Put the moved .intloom/ back.'} Until then, an intloom start "
        "here begins with the Runs of whatever is at .intloom/runtime/ now (none, if it is "
        "missing).",
    )


def runtime_left(root: Path) -> str | None:
    """For ``status`` and ``recover``: the last host stopped serving because its
    ``.intloom/runtime/`` was moved or removed (doctor's ``state_dir`` check), as a line
    with the fix; None otherwise. They said only "stale resources ... recover, then start",
    and that start began an empty journal while the Runs sat in the moved directory."""
    paths = ProjectPaths(root)
    try:
        found = last_log(paths.logs)
    except OSError:
        return None
    return _left_home_line(_left_home_check(paths, found))


def _left_home_line(check: Check | None) -> str | None:
    """``_left_home_check``'s finding as ``startProblem``'s line, None without one."""
    if check is None:
        return None
    return f"But {check.message[:1].lower()}{check.message[1:]} {check.next}"


def _compaction_check(found: tuple[str, bytes] | None) -> Check | None:
    """The last host's failed compaction (``store_compaction_failed``) that the next start
    meets: one at its stop, or one no clean stop followed. Only its log said so once the
    host was gone, and status shows it (compactionError) only while a host runs. ``found``:
    that log's name and tail (``last_log``)."""
    if found is None:
        return None
    name, tail = found
    failed: dict[str, object] | None = None
    for record in log_records(tail):
        if record.get("event") == "store_compaction_failed":
            failed = record
        elif record.get("event") == "service_stopped" and failed is not None \
                and failed.get("when") != "stop":
            failed = None  # a later compaction (the stop's) wrote what that one could not
    if failed is None:
        return None
    return Check(
        "compaction", "attention",
        f"The last host could not write {failed.get('what', 'its snapshots')} at "
        f"{failed.get('when', '?')} ({failed.get('time', '?')}, "
        f".intloom/logs/{name}): {failed.get('cause', '?')}. The next intloom start reads "
        "more of the journal instead (slower; nothing is lost), and a disk that refused them "
        "may refuse its start too.",
        str(failed.get("effect") or "Free disk space, or fix the permissions of "
            ".intloom/runtime.").removeprefix(_NOT_SUMMARISED).strip(),
    )


# Events after which a host's log ends on purpose: a clean stop's, and the end of a host
# that found its directory moved away (``_left_home_check`` says that one).
_ENDS: Final = frozenset({"log_closed", "state_dir_moved"})


def _last_host_check(found: tuple[str, bytes] | None, root: Path, *,
                     current: bool) -> Check | None:
    """How the last host ended, when its log says it did not stop: the fatal error it
    logged (``process_failed``), or, with no last word, what that silence means and what
    it was doing last. Owners "gone" and "killed or crashed" were all doctor said of a
    crash: the log, kept for it, was read only for other checks. ``found``: that log's
    name and tail (``last_log``); None when it ended cleanly, or there is none.
    ``current``: its files are still there (attention, with the way to tell the cause);
    else recover has cleaned up after it, and this is its history (ok)."""
    if found is None:
        return None
    status: Literal["ok", "attention"] = "attention" if current else "ok"
    name, tail = found
    records = list(log_records(tail))
    where = f".intloom/logs/{name}"
    if records and records[-1].get("event") == "log_closed":
        # A start that failed and released everything: offline, and doctor said nothing of
        # why, while a supervisor's retries each failed the same way. The start's own error.
        refused = next((r for r in reversed(records)
                        if r.get("event") == "service_start_failed"), None)
        if refused is None:
            return None
        return Check(
            "last_host", status,
            f"The last start failed at {refused.get('time', '?')} ({where}): "
            f"{refused.get('code', '?')}: {refused.get('message', '?')}",
            None,
        )
    if not records or records[-1].get("event") in _ENDS:
        return None
    failed = next((r for r in reversed(records) if r.get("event") == "process_failed"), None)
    if failed is not None:
        detail = str(failed.get("detail") or "").strip()
        return Check(
            "last_host", status,
            f"The last host failed at {failed.get('time', '?')}: "
            f"{failed.get('error', '?')}{f': {detail}' if detail else ''} ({where}, "
            "process_failed). Its Runs are as their journals left them: the restart "
            "previews below say what a start does with each.",
            (str(failed.get("fix") or "") or None) if current else None,
        )
    last = records[-1]
    doing = str(last.get("event", "?"))
    run_id = last.get("runId")
    if run_id:
        doing = f"{doing} of Run {run_id}"
    dump = _fault_dump(tail, root)
    if dump is not None:
        fault, frame = dump
        at = f", in {frame}" if frame else ""
        return Check(
            "last_host", status,
            f"The last host crashed after {last.get('time', '?')} (its log's last event: "
            f"{doing}): Fatal Python error: {fault}{at}. A crash in native code (a C "
            "extension, ctypes) or an abort; the traceback Python wrote is at the end of "
            f"{where} (intloom logs shows it). The restart previews below say what a start "
            "does with each Run.",
            "Look at the code that traceback names first: the host runs the Workflows' "
            "code in its own process." if current else None,
        )
    stopping = next((r for r in reversed(records) if r.get("event") == "service_stopping"),
                    None)
    if stopping is not None:
        # "No stop after it ... its stop's lines are then missing" was said of a host whose
        # log shows its stop begun: killed in the middle of it (a supervisor's SIGKILL once
        # its own stop timeout ran out, say), which is what to look into.
        reason = str(stopping.get("reason") or "").strip()
        within = stopping.get("within")
        return Check(
            "last_host", status,
            f"The last host began to stop at {stopping.get('time', '?')}"
            f"{f' ({reason})' if reason else ''} and its log ({where}) ends at "
            f"{last.get('time', '?')} with {doing}, before that stop ended: the host was "
            "killed during its stop (a SIGKILL: a supervisor's, once its own stop timeout "
            "ran out, or kill -9) or crashed in native code then, since Python errors are "
            "logged. The Runs its stop had not saved are as their journals left them: the "
            "restart previews below say what a start does with each.",
            "Give a stop the time it asks for: intloom stop waits for it; a supervisor's stop "
            "timeout must exceed the bound the host logs with service_stopping (`within`"
            f"{f', {within} s here' if isinstance(within, (int, float)) else ''}). intloom "
            "logs shows how far the stop got." if current else None,
        )
    events = {r.get("event") for r in records}
    if "service_starting" in events and "service_ready" not in events:
        # Ended before it served: which part of its start, as start said it to a terminal
        # long closed ("It was importing ..."), is the first thing to look into.
        restored = sum(1 for r in records if r.get("event") == "run_restored")
        # Past its restore: listening, starting its journal segment (which summarises a
        # crashed host's leftovers, at length on a long log) or writing service.json. Said
        # "while it restored its Runs" of a log that says the restore had finished.
        phase = (f"while it imported {last.get('source')}" if last.get("event") ==
                 "source_importing" else
                 f"after it had restored its Runs ({restored} restored), before it served"
                 if "restore_finished" in events else
                 f"while it restored its Runs ({restored} restored)" if restored else
                 "before it served")
        return Check(
            "last_host", status,
            f"The last host ended during its start, {phase}: its log ({where}) ends at "
            f"{last.get('time', '?')} with {doing}, and no fatal error after it. That is a "
            "SIGKILL (kill -9, the kernel's out-of-memory killer), a crash in native code "
            "or os._exit in the Workflow code it imported, since Python errors are logged "
            "-- unless the host could no longer write its log (a full disk, a file size "
            "limit). The restart previews below say what a start does with each Run.",
            "To tell which: the kernel logs an out-of-memory kill and a segmentation fault "
            "(journalctl -k, or dmesg, names the pid); an import that is killed each time "
            "points at that source (python -c 'import ...' shows what it does)."
            if current else None,
        )
    return Check(
        "last_host", status,
        f"The last host's log ({where}) ends at {last.get('time', '?')} with {doing}, and "
        "no stop or fatal error after it: the host ended without a word. That is a "
        "SIGKILL (kill -9, the kernel's out-of-memory killer), a crash in native code (a "
        "segmentation fault, an abort) or os._exit in Workflow code, since Python errors "
        "are logged -- unless the host could no longer write its log (a full disk, a file "
        "size limit), whose later lines, its stop's included, are then missing. The restart "
        "previews below say what a start does with each Run.",
        "To tell which: the kernel logs an out-of-memory kill and a segmentation fault "
        "(journalctl -k, or dmesg, names the pid); intloom logs shows what the host did last."
        if current else None,
    )


def _fault_dump(tail: bytes, root: Path) -> tuple[str, str | None] | None:
    """What Python's fault handler wrote into the log at a fatal signal (``catch_faults``):
    the error ("Segmentation fault") and where in the thread it hit: its innermost frame
    (``File "x.py", line 19 in act``), and the innermost of the project's own code under
    ``root`` when that is another (a crash inside ctypes, called from a Step). None when
    the log holds no such dump."""
    every = tail.decode("utf-8", "replace").splitlines()
    # A line of its own: the text inside a logged message (a Step's error quoting a child's
    # crash) is no dump of this host's.
    at = next((i for i in range(len(every) - 1, -1, -1)
               if every[i].startswith("Fatal Python error: ")), None)
    if at is None:
        return None
    lines = every[at:]
    fault = lines[0].removeprefix("Fatal Python error: ").strip()[:200]
    frames: list[str] = []
    for i, line in enumerate(lines):
        if line.startswith("Current thread"):
            for each in lines[i + 1:]:
                if not each.startswith("  File "):
                    break
                frames.append(each.strip()[:300])
            break
    if not frames:
        return fault, None
    inner = f'File "{root}{os.sep}'
    own = next((f for f in frames if f.startswith(inner) and "site-packages" not in f), None)
    if own is None or own == frames[0]:
        return fault, frames[0]
    return fault, f"{frames[0]}, called from {own}"


def _with_tool_calls(runs: list[RunPreview],
                     read: Callable[[], tuple[str, bytes] | None]) -> list[RunPreview]:
    """``runs``, a Run whose Agent task's Tool call the last host left unfinished saying
    which (its log's word: Tool calls are not journaled, so the restart table names only
    the task, and its outcome is for the user to check). ``read``: the last host's log's
    evidence (``evidence_log``), read only when a Run waits on an Agent task."""
    tasks = [p for p in runs if p.verdict.row == "interrupted" and "Agent task" in
             p.verdict.reason]
    # A held Run too: it is the one a user is about to cancel, and its problem says what the
    # restart table would do with it once its code is back, its Agent task named.
    held = [p for p in runs if p.verdict.row == "needs_attention" and p.problem is not None
            and "Agent task" in p.problem]
    if not tasks and not held:
        return runs
    found = read()
    if found is None:
        return runs
    cut = tool_calls_cut(found, {p.run_id: p.agent_task for p in [*tasks, *held]
                                 if p.agent_task is not None})
    if not cut:
        return runs
    said = {p.run_id: msgspec.structs.replace(p, verdict=msgspec.structs.replace(
                p.verdict, reason=f"{p.verdict.reason}; {cut[p.run_id]}"))
            for p in tasks if p.run_id in cut}
    said.update({p.run_id: msgspec.structs.replace(
                     p, problem=f"{(p.problem or '').rstrip('.')}. Also, {cut[p.run_id]}.")
                 for p in held if p.run_id in cut})
    return [said.get(p.run_id, p) for p in runs]


_NOT_SUMMARISED: Final = ("The next start reads more of the log instead (slower; nothing is "
                          "lost).")


def _temp_named(temp: TempFile) -> str:
    return (f"{Path(temp.path).name} (for {temp.target}, {temp.size:,} "
            f"byte{'' if temp.size == 1 else 's'})")


def _own_log(paths: ProjectPaths) -> str | None:
    """The running host's log file name (service.json's); None when it cannot be read."""
    try:
        info = read_service(paths.service_json, paths.root)
    except IntloomError:
        return None
    return None if info is None or not info.log_file else Path(info.log_file).name


def _ports_differ(paths: ProjectPaths) -> str | None:
    """"service.json names port X and connection.json port Y", when both are valid and
    differ (status reports it as the problem); else None."""
    try:
        info = read_service(paths.service_json, paths.root)
        conn = read_connection(paths.connection_json, paths.root)
    except IntloomError:
        return None  # their own checks say why
    if info is None or conn is None or info.port == conn.port:
        return None
    return f"service.json names port {info.port} and connection.json port {conn.port}"


def _health(status: DiagnosisStatus, checks: list[Check]) -> Health:
    if status == "blocked":
        return "blocked"
    if status == "recovery_required" or any(c.status == "attention" for c in checks):
        return "attention"
    return "healthy"


def run_doctor(root: Path) -> DoctorReport:
    """Everything ``doctor`` checks, as one report. Read-only; never raises for metadata."""
    root = root.resolve()
    paths = ProjectPaths(root)
    port_taken: int | None = None
    port_holder: str | None = None
    insp: Inspection | None = None
    try:
        insp = inspect(root, probe=True)
        diagnosis, said = insp.diagnosis, insp.here
        port_taken, port_holder = insp.port_taken, insp.port_holder
    except IntloomError as exc:
        # One invalid file must not hide the owner of the other: a live host may hold it.
        diagnosis = Diagnosis(project_root=str(root), status="blocked", message=exc.message,
                              owners=judge_readable_owners(root))
        said = exc.here
    running = diagnosis.status == "running"
    by_resource = {owner.resource: owner for owner in diagnosis.owners}
    lock_problem = _file_problem(
        lambda: observe_file(paths.service_lock, ServiceLock, read_lock)
    )
    service_problem = _file_problem(
        lambda: observe_file(paths.service_json, ServiceInfo, lambda p: read_service(p, root))
    )

    connection_problem = _file_problem(lambda: read_connection(paths.connection_json, root))
    lock_unheld = unheld_lock(paths.service_lock) if lock_problem is None else None

    connection_missing = (connection_problem is None and not running
                          and not paths.connection_json.exists())
    starting_since = None
    if diagnosis.message.startswith(STARTING) and lock_problem is None:
        with contextlib.suppress(IntloomError):
            held = read_lock(paths.service_lock)
            starting_since = held.started_at if held is not None else None
    ports_differ = (None if running or service_problem or connection_problem
                    else _ports_differ(paths))
    # A problem the probe brought back from a host that answered its hello.
    refused = (insp.here if insp is not None and insp.answered
               and insp.problem is not None else None)
    refused_code = insp.refused_code if refused is not None and insp is not None else None
    info = None if running else _service_info(paths, root)
    holding = _holding(paths, info)
    # With no service.lock, proved to hold none of the files a host keeps open for life.
    holds_nothing = (bool(holding) and all(h is False for h in holding)
                     and not os.path.lexists(paths.service_lock))
    # "Serving" (and its advice to kill the pid) was said of whatever live process a
    # service.json named, pid 1 included: only one proved to hold a file of the project.
    serving_silent = (not running and service_problem is None and refused is None
                      and starting_since is None and any(h is True for h in holding)
                      and _serving_silent(paths, info))

    def context(other: str, other_problem: str | None) -> _Context:
        # recover refuses while any of the three metadata files is invalid, or
        # connection.json is missing.
        invalid = (f"{other} is invalid" if other_problem is not None
                   else "connection.json is invalid" if connection_problem is not None
                   else "connection.json is missing" if connection_missing else None)
        return _Context(running=running, invalid=invalid,
                        port_taken=port_taken, port_holder=port_holder,
                        lock_unheld=lock_unheld, starting_since=starting_since,
                        crashed_service_json=insp is not None and insp.crashed_service_json,
                        ports_differ=ports_differ, refused=refused,
                        refused_code=refused_code,
                        host_pid=diagnosis.service.pid if diagnosis.service else None,
                        serving_silent=serving_silent, holds_nothing=holds_nothing,
                        stopping=diagnosis.message.startswith(SHUTTING_DOWN))

    config_check, config = _config_check(root)
    blind = _unsearchable_state(paths)
    if blind is not None:
        return _blind_report(root, paths, diagnosis, config_check, config, blind)
    checks = [
        config_check,
        _runtime_dir_check(paths),
        _owner_check("owner.service_lock", "service.lock", paths.service_lock,
                     by_resource.get("service_lock"), lock_problem,
                     context("service.json", service_problem)),
        _owner_check("owner.service_json", "service.json", paths.service_json,
                     by_resource.get("service_info"), service_problem,
                     context("service.lock", lock_problem)),
        _connection_check(root, bool(diagnosis.owners) or lock_problem is not None
                          or service_problem is not None, running, config,
                          None if holds_nothing else
                          next((o.pid for o in diagnosis.owners if o.status == "alive"),
                               None)),
        _temp_files_check(paths),
    ]
    live = _host_check(diagnosis.service) if running and diagnosis.service else None
    if live is not None:
        checks.append(live)
    workflows_check, loaded = _workflows_check(root, config)
    if running and config is not None and diagnosis.service is not None:
        workflows_check = _with_host(root, diagnosis.service, workflows_check, loaded)
    checks.append(workflows_check)
    restore = diagnosis.service.restore if diagnosis.service is not None else None
    journals_check, runs = preview_runs(
        paths, loaded, host_running=running,
        interrupted_by_host=frozenset(restore.interrupted) if restore is not None else frozenset(),
        # The host names the first RESTORE_LISTED only: any of the others may be one.
        host_list_cut=restore is not None
        and restore.count("interrupted") > len(restore.interrupted),
    )
    checks.append(journals_check)
    stray_logs = _stray_logs_check(paths.logs)
    if stray_logs is not None:
        checks.append(stray_logs)
    left_home: Check | None = None
    if running:
        # The running host named, in each Run it restored RUN_INTERRUPTED, the Tool call its
        # last host left unfinished (from the log before its own): doctor said only
        # "waits on client Agent task ... (claimed)". It reads that log as the host did.
        current = _own_log(paths)
        if current is not None:
            runs = _with_tool_calls(runs, lambda: evidence_log(paths.logs, before=current))
    else:
        runs = _with_tool_calls(runs, lambda: evidence_log(paths.logs))
        last = last_log(paths.logs)
        compaction = _compaction_check(last)
        if compaction is not None:
            checks.append(compaction)
        left_home = _left_home_check(paths, last)
        if left_home is not None:
            checks.append(left_home)
        # Blocked with every owner proven gone (absent): no connection.json to recover
        # with (a first start killed before it saved one), not a host still there.
        gone = (diagnosis.status == "blocked" and bool(diagnosis.owners)
                and all(o.status == "absent" for o in diagnosis.owners))
        if diagnosis.status in ("recovery_required", "offline") or gone:
            # Only a host proven gone (or whose files recover removed) has ended: a paused or
            # hung one's log ends mid-way too.
            ended = _last_host_check(last, root,
                                     current=diagnosis.status != "offline")
            if ended is not None:
                checks.append(ended)
    return DoctorReport(
        schema_version=SCHEMA_VERSION,
        project_root=diagnosis.project_root,
        status=diagnosis.status,
        message=said,
        owners=diagnosis.owners,
        # The state_dir finding above, not the last log read again (runtime_left's).
        start_problem=(start_problem(root) if diagnosis.status == "offline" else None)
        or (_left_home_line(left_home)
            if diagnosis.status in ("offline", "recovery_required") else None),
        health=_health(diagnosis.status, checks),
        checks=checks,
        runs=runs,
        service=diagnosis.service,
    )


def _blind_report(root: Path, paths: ProjectPaths, diagnosis: Diagnosis, config_check: Check,
                  config: Config | None, blind: _Unsearchable) -> DoctorReport:
    """The report when ``.intloom/`` cannot be searched: one finding, in ``runtime_dir``,
    naming the directory, the fact and the fix; the checks of what lies under it are
    ``not_checked`` because of it. The diagnosis stays blocked: a host may own the project
    through files no one here can look at."""
    fact = blind.fact[:1].upper() + blind.fact[1:]
    said = f"{fact}. Nothing was changed. {blind.fix}, then run intloom doctor again."
    workflows_check, _loaded = _workflows_check(root, config)
    checks = [
        config_check,
        Check("runtime_dir", "attention", f"{fact}.",
              f"{blind.fix}, then run intloom doctor again; nothing was changed."),
        _skipped("owner.service_lock", "service.lock"),
        _skipped("owner.service_json", "service.json"),
        _skipped("connection", "connection.json"),
        _skipped("temp_files", "a temp file an interrupted write left in .intloom/"),
        workflows_check,
        _skipped("journals", "the journals in .intloom/runtime/"),
    ]
    return DoctorReport(
        schema_version=SCHEMA_VERSION,
        project_root=diagnosis.project_root,
        status=diagnosis.status,
        message=said,
        owners=diagnosis.owners,
        start_problem=None,
        health=_health(diagnosis.status, checks),
        checks=checks,
        runs=[],
        service=diagnosis.service,
    )
