"""``intloom logs [RUN] [--follow] [--tail N]``: the host's structured log. Works offline.

Text mode renders ``time level event key=value``; ``--json`` streams the raw JSONL lines (the
one exception to "one JSON document": a stream of them), an unreadable line wrapped as a record
(``unreadable_line``) so that every line of the stream is a JSON object. ``--follow`` keeps
reading across host restarts, each of which starts a new log file, until Ctrl-C or SIGTERM.
``--tail N`` prints only the last N of the records it would print (then, with ``--follow``,
every new one).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import stat
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Final

import msgspec
import typer

from intloom.cli.logtail import Line, LogTail, log_files, unlistable
from intloom.cli.options import CliState, command
from intloom.cli.readerwatch import on_reader_gone
from intloom.cli.render import Renderer, log_line
from intloom.errors import IntloomError, quoted
from intloom.project import no_line_breaks

__all__ = ["logs"]

# A change notification can be missed in the gap before a watch starts; this is the
# longest such a line waits before a periodic read shows it.
_RESCAN_MS: Final = 1000


def _about(record: Mapping[str, Any], run_id: str) -> bool:
    """Whether a record is about ``run_id``: its own ``runId``, or one of the Runs a host-wide
    record lists (``runs_cut_at_stop``: ``runs: [{runId, evidence}]``)."""
    if record.get("runId", record.get("run_id")) == run_id:
        return True
    runs = record.get("runs")
    return isinstance(runs, list) and any(
        isinstance(item, Mapping) and item.get("runId") == run_id for item in runs)


def _invalid_utf8(line: str) -> bytes | None:
    """The line's bytes when they are not valid UTF-8 (read with surrogateescape), else
    None."""
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        return line.encode("utf-8", errors="surrogateescape")
    return None


# A line chosen to be printed: (its text, whether it is in a fault dump, its file and offset
# when it is no record), and what decoding it gave (None once held: decoded again to print).
_Chosen = tuple[str, bool, dict[str, Any], tuple[bytes | None, str, Any] | None]


class _Printer:
    """An ``emit`` for LogTail, the lines it chose (``printed``), and ``release``: with
    ``keep`` (``--tail N``), the lines chosen are held, the last ``keep`` of them, until
    ``release`` prints them; every line after is printed as it comes. ``take`` is a
    ``LogTail.pump_last`` take for them, ``pick`` what it holds."""

    def __init__(self, choose: Callable[[str], _Chosen | None],
                 show: Callable[[_Chosen], None], keep: int | None,
                 pick: Callable[[Iterator[Line], int], Iterator[_Chosen]]) -> None:
        self.choose = choose
        self.show = show
        self.pick = pick
        self.printed = 0
        self.held: deque[_Chosen] | None = None if keep is None else deque(maxlen=keep)

    def take(self, lines: Iterator[Line], need: int) -> None:
        """The last ``need`` lines ``choose`` would take among ``lines`` (the logs' last
        first), held as ``emit`` holds them."""
        for chosen in self.pick(lines, need):
            self.printed += 1
            if self.held is not None:
                self.held.append(chosen)

    def emit(self, line: str) -> None:
        chosen = self.choose(line)
        if chosen is None:
            return
        self.printed += 1
        if self.held is None:
            self.show(chosen)
        else:
            # Only the last N are rendered, and held as their text alone (a decoded record
            # is ~7x its line: --tail 200000 of a 50 MB log took 340 MB).
            self.held.append((chosen[0], chosen[1], chosen[2], None))

    def release(self) -> None:
        held, self.held = self.held, None
        for chosen in held or ():
            self.show(chosen)


def _printer(renderer: Renderer, run_id: str | None, root: Path,
             where: Callable[[], tuple[Path, int] | None], keep: int | None = None
             ) -> _Printer:
    """The ``_Printer`` of ``logs``. ``where`` gives the file and byte offset of the line
    being emitted (``LogTail.line_at``)."""
    # Inside the traceback Python's fault handler wrote at a fatal signal (HostLog.
    # catch_faults): its plain text lines are the host's last words, not damage.
    dumping = [False]
    # Where the last line chosen from was: a dump ends with its log, and the next log (a
    # new host's) starts outside one. Carried over, that log's first plain lines (a torn
    # first write) were shown as the dead host's fault_dump.
    last: list[tuple[Path, int] | None] = [None]

    def place(at: tuple[Path, int] | None) -> dict[str, Any]:
        if at is None:
            return {}
        path, offset = at
        return {"file": str(path.relative_to(root)) if path.is_relative_to(root) else str(path),
                "offset": offset}

    def dump_state(line: str, record: Any) -> bool | None:
        """Whether the lines after ``line`` are in a fault dump; None: as before it."""
        if isinstance(record, Mapping):
            return False
        return True if line.startswith("Fatal Python error: ") else None

    def wanted(line: str, record: Any) -> bool:
        # An unreadable line (a crashed host's torn last one) is kept when it names the Run.
        return run_id is None or (
            _about(record, run_id) if isinstance(record, Mapping) else run_id in line)

    def choose(line: str) -> _Chosen | None:
        """``line`` as ``_Chosen``, or None when it is not to be printed."""
        now = where()
        if now is not None and last[0] is not None and (
                now[0] != last[0][0] or now[1] <= last[0][1]):
            dumping[0] = False  # another log, or this one read again from its start
        last[0] = now
        decoded = _decoded(line)
        record = decoded[2]
        state = dump_state(line, record)
        if state is not None:
            dumping[0] = state
        if not wanted(line, record):
            return None
        # Where an unreadable line is, and whether it is in a fault dump, as of now: it may
        # be printed after the lines that follow it are read.
        at = place(now) if not isinstance(record, Mapping) else {}
        return line, dumping[0], at, decoded

    def show(chosen: _Chosen) -> None:
        line, fault, at, decoded = chosen
        raw, readable, record = _decoded(line) if decoded is None else decoded
        if renderer.json_mode:
            # Bytes that are not UTF-8 are shown as U+FFFD, so that every JSON reader takes
            # the line; lineBase64 keeps them as they are in the file and marks the line.
            exact = {} if raw is None else {"lineBase64": base64.b64encode(raw).decode()}
            if not isinstance(record, Mapping):
                # A torn or damaged line is no JSON record: passed on raw, it broke every
                # JSONL reader of the stream. It is wrapped as one, its text kept.
                # Its file and offset: with --all, or beside a good copy, "which line" is
                # otherwise left to guess.
                kind = ({"time": None, "level": "fatal", "event": "fault_dump"} if fault
                        else {"time": None, "level": "error", "event": "unreadable_line"})
                readable = no_line_breaks(msgspec.json.encode(
                    {**kind, "line": readable, **exact, **at})).decode()
            elif exact:
                # Encoded again: escaped as the host escapes a line it writes, since readers
                # that split on Unicode line breaks took one record for several.
                readable = no_line_breaks(msgspec.json.encode({**record, **exact})).decode()
            renderer.raw(readable + "\n")
        elif isinstance(record, Mapping):
            if raw is not None:
                # Read again keeping each such byte a lone surrogate, which text shows as
                # its escape (\udcff), as the unreadable line below and every path do.
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
            renderer.lines([log_line(record)])
        elif fault:
            renderer.lines([f"- fatal   fault_dump {line[:200]}"])  # log_line's columns
        else:
            shown = f" ({at['file']} at byte {at['offset']})" if at else ""
            renderer.lines([f"- ????? unreadable log line{shown}: {line[:200]}"])

    # An id the log's JSON writes as it is (no character it escapes): found in a line's text
    # whenever a record of the line names it.
    literal = run_id is not None and run_id.isascii() and run_id.isprintable() and not (
        '"' in run_id or "\\" in run_id)

    def pick(lines: Iterator[Line], need: int) -> Iterator[_Chosen]:
        """The last ``need`` lines ``choose`` takes, among ``lines`` (the logs' last first),
        in the logs' order, each as ``choose`` gives it once held; and ``choose`` left as
        at the logs' end. Whether a line that is no record is in a fault dump is known only
        once a line before it is found that starts or ends one (or its log's start): the
        lines are read back that far, and no further. Every line read is taken as read:
        what they hold is found on the way back, and none is read again."""
        found: list[list[Any]] = []  # last first: as _Chosen, its fault None while unknown
        unknown: list[list[Any]] = []  # those whose fault is not known yet
        end = [True]  # whether the state at the logs' end is not known yet

        def settle(state: bool) -> None:
            for item in unknown:
                item[1] = state
            unknown.clear()
            if end[0]:
                dumping[0], end[0] = state, False

        log = None
        for path, offset, line in lines:
            if path != log:
                if log is None:
                    last[0] = (path, offset)  # read on from here, as if chosen from
                else:
                    settle(False)  # its log's start: no dump carries into it
                log = path
            if len(found) >= need and not unknown and not end[0]:
                break
            # Without RUN every line is taken. With it, a line holding neither the id nor
            # an escape cannot be about the Run: it is not decoded to be counted out (a Run
            # with fewer than N records had the logs decoded twice).
            maybe = len(found) < need and (run_id is None or not (
                literal and run_id not in line and "\\" not in line))
            if not (maybe or unknown or end[0]):
                continue
            decoded = _decoded(line)
            record = decoded[2]
            state = dump_state(line, record)
            if maybe and wanted(line, record):
                at = place((path, offset)) if not isinstance(record, Mapping) else {}
                found.append([line, state, at, None])
                if state is None:
                    unknown.append(found[-1])
            if state is not None:
                settle(state)
        settle(False)  # the first log's start (or nothing is unknown)
        while found:  # each let go as it is held
            line, fault, at, _ = found.pop()
            yield line, bool(fault), at, None

    return _Printer(choose, show, keep, pick)


def _decoded(line: str) -> tuple[bytes | None, str, Any]:
    """(its bytes when they are not UTF-8, its text with those shown as U+FFFD, the JSON
    value it holds or None)."""
    # LogTail decodes with surrogateescape: a byte that is not UTF-8 (damage, a foreign
    # writer) is a lone surrogate here, so the line's bytes are still known exactly.
    raw = _invalid_utf8(line)
    readable = line if raw is None else raw.decode("utf-8", errors="replace")
    try:
        record: Any = msgspec.json.decode(readable)
    except (msgspec.DecodeError, RecursionError):  # nested past the decoder's stack
        record = None
    return raw, readable, record


def _skipped(renderer: Renderer, root: Path) -> Callable[[Path, str], None]:
    """An ``on_skipped`` for LogTail: an entry named like a log that is not a regular file is
    named with what it is, on stderr, or as a record of the --json stream (so that the
    stream still shows why a log seems to be missing)."""

    def report(path: Path, what: str) -> None:
        fact = f"it is {what}, not a regular file"
        _file_note(renderer, root, "skipped_file", path, fact, lambda shown: (
            f"Skipped {shown}: {fact}; intloom logs reads only regular files and left it "
            "untouched. A host writes only regular files there: move it out of "
            ".intloom/logs/ unless you need it there."))

    return report


def _foreign(renderer: Renderer, root: Path) -> Callable[[Path], None]:
    """An ``on_foreign`` for LogTail: an entry in ``.intloom/logs/`` under a name no host
    writes is named, on stderr or as a record of the --json stream, as the other commands
    name unexpected files (kept as they are); it was passed over in silence."""

    def report(path: Path) -> None:
        fact = "it is not a log intloom writes (a host writes only LOG-<UTC>.jsonl there)"
        _file_note(renderer, root, "unexpected_file", path, fact, lambda shown: (
            f"Passed over {shown}: {fact}; intloom logs does not read it and left it as it "
            "is. Move it out of .intloom/logs/ unless you need it there."))

    return report


def _file_note(renderer: Renderer, root: Path, event: str, path: Path, fact: str,
               text: Callable[[str], str]) -> None:
    """What happened to a log file: a warning record of the --json stream, or ``text`` (given
    the file's path as shown) on stderr."""
    shown = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
    if renderer.json_mode:
        renderer.raw(msgspec.json.encode({"time": None, "level": "warning", "event": event,
                                          "file": shown, "fact": fact}).decode() + "\n")
    else:
        renderer.note(text(shown))


def _reread(renderer: Renderer, root: Path) -> Callable[[Path, str], None]:
    """An ``on_reread`` for LogTail: a followed log that shrank or was replaced is read again
    from its start; said on stderr, or as a record of the --json stream (so that lines seen
    twice, or a gap, have their reason in the stream)."""

    def report(path: Path, fact: str) -> None:
        _file_note(renderer, root, "reread_file", path, fact, lambda shown: (
            f"Reading {shown} again from its start: {fact} while it was followed (a host "
            "only appends to its log: something else changed it)."))

    return report


def _refusal(path: Path, exc: OSError) -> tuple[str, str]:
    """Why the log ``path`` could not be opened, and the fix (without a full stop)."""
    if isinstance(exc, PermissionError):
        from intloom.fsutil import read_refusal  # only on this refusal

        return read_refusal(path)
    return (f"{path} cannot be read ({exc.strerror or exc})",
            "Check the file (ls -l shows what it is)")


def _watch_target(root: Path, logs_dir: Path) -> tuple[Path, bool]:
    """The nearest existing directory to watch, and whether to watch it recursively."""
    if logs_dir.is_dir():
        return logs_dir, False
    state_dir = logs_dir.parent
    if state_dir.is_dir():
        return state_dir, False
    return root, False


def _project_removed(root: Path) -> IntloomError:
    return IntloomError(
        "CLI_PROJECT_INVALID",
        f"The project directory {root} was removed while intloom logs --follow watched it; "
        "no log can appear there any more. Run intloom logs again once the project is back.",
    )


class _Terminated(KeyboardInterrupt):
    """A SIGTERM while the backlog printed: it stops ``logs`` as a Ctrl-C does, but nothing
    was echoed on the terminal for a line break to end."""


def _into_a_pipe() -> bool:
    """Whether what ``logs`` prints goes into a pipe (``intloom logs -f | grep ...``)."""
    try:
        return stat.S_ISFIFO(os.fstat(sys.stdout.fileno()).st_mode)
    except (AttributeError, ValueError, OSError):  # no stdout, or one with no descriptor
        return False


def _interrupt(_signo: int, _frame: object) -> None:
    raise _Terminated


def _follow(tail: LogTail, root: Path, logs_dir: Path, stop: threading.Event) -> None:
    """Print what the logs gain until ``stop`` is set (SIGTERM, or the reader went)."""
    import watchfiles

    previous = signal.signal(signal.SIGTERM, lambda _signo, _frame: stop.set())
    try:
        while not stop.is_set():
            target, recursive = _watch_target(root, logs_dir)
            moved = False
            try:
                for _changes in watchfiles.watch(
                    target,
                    recursive=recursive,
                    stop_event=stop,
                    # Ctrl-C inside the watcher raises, as anywhere else, and ``logs`` ends on
                    # it quietly; not raising makes watchfiles log a warning line to stderr.
                    raise_interrupt=True,
                    rust_timeout=_RESCAN_MS,
                    yield_on_timeout=True,
                    debounce=50,
                    step=25,
                ):
                    tail.pump()
                    if target == root and not root.is_dir():
                        # Watched itself (no .intloom/ yet), the project went: the watch
                        # goes on, on a directory gone, and nothing else would change.
                        raise _project_removed(root)
                    if _watch_target(root, logs_dir) != (target, recursive):
                        moved = True
                        break
            except FileNotFoundError:
                # The directory went between choosing it and watching it: choose again,
                # unless the project itself is gone, where no log can appear any more.
                if not root.is_dir():
                    raise _project_removed(root) from None
                if target.is_dir():
                    raise  # not that race: a failure of the watch itself
                continue
            if not moved:
                return  # stopped: SIGTERM, or stdout's reader went away
    finally:
        signal.signal(signal.SIGTERM, previous)


def _hosts_log(root: Path, logs_dir: Path) -> Path | None:
    """The log of the host ``service.json`` names (running, or killed): the newest one."""
    from intloom.client.hostlog import host_log_name

    name = host_log_name(root)
    return logs_dir / name if name is not None else None


def _refuse_links(*directories: Path) -> None:
    """Readers of .intloom never follow a link (DESIGN section 2), as every other command
    refuses: a linked .intloom or logs/ is named with its fix, and nothing is read there."""
    import os

    from intloom.fsutil import PrivacyError, dir_problem, privacy_fix

    for directory in directories:
        try:
            st = os.lstat(directory)
        except FileNotFoundError:
            return  # no logs yet: said below, and --follow waits for them
        except OSError as exc:  # .intloom/ that may not be searched: named, with its fix
            raise unlistable(directories[-1], exc) from None
        # Modes are not judged here (status does not either): doctor reports them.
        problem = dir_problem(st, private=False)
        if problem is not None:
            # The words of every other command's refusal (host.metadata.privacy_invalid).
            fix = privacy_fix(PrivacyError(directory, problem))
            raise IntloomError(
                "CLI_SERVICE_METADATA_INVALID",
                f"{directory} {problem}. It was left as it is. {fix}.",
            )


def _backlog(tail: LogTail, printer: _Printer, last: int | None, *, follow: bool) -> None:
    """What the logs hold now, into ``printer``; with ``--tail N`` (``last``), read from their
    ends back to the last N records and no further (``finish`` and ``release`` are left to
    the caller)."""
    if last is None:
        tail.pump()
        return
    # Without --follow one more is sought when N is 0: whether the logs hold any record at
    # all decides the note printed when none is (a newest log still empty).
    need = last if follow else max(last, 1)
    tail.pump_last(lambda lines: printer.take(lines, need), finishing=not follow)


@command
def logs(
    state: CliState,
    run_id: Annotated[
        str | None,
        typer.Argument(metavar="RUN", help="Only records about this Run.", show_default=False),
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new records, across restarts.")
    ] = False,
    all_files: Annotated[
        bool, typer.Option("--all", help="Every host's log, oldest first, not only the newest.")
    ] = False,
    last: Annotated[
        int | None,
        # max: a deque's length is a C ssize_t; past it, CLI_INTERNAL_ERROR (exit 70).
        typer.Option("--tail", "-n", min=0, max=sys.maxsize, metavar="N", show_default=False,
                     help="Only the last N records (then, with --follow, every new one)."),
    ] = None,
) -> None:
    """Show the host log (structured), optionally for one Run. Works offline."""
    from intloom.project import ProjectPaths

    if run_id is not None:
        from intloom.cli.inputs import run_id_problem

        bad = run_id_problem(run_id)
        if bad is not None:
            raise bad
    root = state.root()
    paths = ProjectPaths(root)
    logs_dir = paths.logs
    _refuse_links(paths.state, logs_dir)
    renderer = state.renderer
    tails: list[LogTail] = []  # the printer asks the tail where each line is
    printer = _printer(renderer, run_id, root, lambda: tails[0].line_at if tails else None,
                       last)
    refused: list[tuple[str, str]] = []

    def on_refused(path: Path, exc: OSError) -> None:
        # A log the OS would not open (mode 0000, another user's) printed nothing, exit 0,
        # and the newest one was then said to have "no record yet: its host wrote none".
        fact, fix = _refusal(path, exc)
        if not follow:
            refused.append((fact, fix))  # the command fails once every readable log is shown
            return
        _file_note(renderer, root, "unreadable_file", path, fact, lambda shown: (
            f"{fact}; its records are not shown. {fix}."))

    named = _hosts_log(root, logs_dir)
    if named is not None and not os.path.lexists(named):
        named_gone, named = named, None
    else:
        named_gone = None
    if named_gone is not None and not all_files:
        # Its host's log removed (or moved): the newest one left, an earlier host's, was
        # shown in silence, as if it were that host's (a clean stop read for a killed host).
        fact = "service.json names this host log, which is not there (removed or moved)"
        _file_note(renderer, root, "missing_file", named_gone, fact, lambda shown: (
            f"{shown} is missing: service.json names it as its host's log, and it is not "
            "there (removed or moved). What follows is the newest log left, an earlier "
            "host's; intloom logs --all shows every log there is."))
    tail = LogTail(logs_dir, printer.emit, all_files=all_files, on_skipped=_skipped(renderer, root),
                   newest=named, on_reread=_reread(renderer, root),
                   on_refused=on_refused, on_foreign=_foreign(renderer, root))
    tails.append(tail)
    try:
        if follow:
            # The backlog too: Ctrl-C while it still printed (a long log, a slow reader) ended
            # with 130 and "Interrupted.", not the 0 a follow stops with (docs/cli.md).
            stop = threading.Event()

            def gone() -> None:  # ``logs -f | grep -m1 ...`` had its line: stop now, quietly
                state.reader_gone = True
                stop.set()

            # While the backlog prints, a SIGTERM stops it as Ctrl-C does (a write blocked on a
            # slow reader is left only by an exception); _follow then sets its own handler.
            previous = signal.signal(signal.SIGTERM, _interrupt)
            try:
                with on_reader_gone(gone):
                    _backlog(tail, printer, last, follow=True)
                    printer.release()
                    _follow(tail, root, logs_dir, stop)
            except KeyboardInterrupt as exc:
                # A follow ends 0 on Ctrl-C, so no shell ends the line after the ^C the terminal
                # echoed (as for a command SIGINT killed): its prompt came on after it.
                # Not into a pipe: the Ctrl-C reached the pipeline's reader too, which died of
                # it, and the shell ends that line itself (a break here left an empty line).
                if not isinstance(exc, _Terminated) and not _into_a_pipe():
                    renderer.after_ctrl_c(exc)
            finally:
                signal.signal(signal.SIGTERM, previous)
            return
        _backlog(tail, printer, last, follow=False)
        tail.finish()
        printer.release()
        if refused:
            facts = "; ".join(fact for fact, _ in refused)
            fixes = "; ".join(dict.fromkeys(fix for _, fix in refused))
            others = " (the other logs' records are)" if all_files else ""
            raise IntloomError(
                "STORAGE_ERROR",
                f"{facts}: {'its' if len(refused) == 1 else 'their'} records are not shown"
                f"{others}. {fixes}, then run intloom "
                "logs again; the "
                f"{'file was' if len(refused) == 1 else 'files were'} left as "
                f"{'it is' if len(refused) == 1 else 'they are'}.",
            )
        if printer.printed == 0:
            if not log_files(logs_dir):
                renderer.note(f"No host log yet under {logs_dir}; intloom start writes one.")
            elif run_id is not None:
                where = ("in any log" if all_files
                         else "in the newest log (try --all for the earlier hosts' logs)")
                renderer.note(f"No log records about {quoted(run_id)} {where}.")
            elif not all_files:
                # A host killed between creating its log and writing a line leaves an empty
                # file, which printed nothing at all, as if logs had failed.
                newest = named or log_files(logs_dir)[-1]
                renderer.note(f"The newest log, {newest.name}, has no record yet: its host wrote "
                              "none (it ended, or was killed, as it started). intloom logs --all "
                              "shows the earlier hosts' logs.")
    finally:
        tail.close()  # the newest log, kept open to be read on
