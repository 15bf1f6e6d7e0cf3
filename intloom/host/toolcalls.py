"""What the last host's log says of the Tool calls (and Agent completions) it left running.

Tool calls are not journaled (their receipts are not restored), so the restart table can
name only the Agent task a crash cut. The host log has each call's start and end: the next
host reads its predecessor's log to name the call in the Run's ``RUN_INTERRUPTED``
message, and logs what it named with the Run's ``run_restored`` record (``toolCall``), so
that the host after it still names it. ``doctor`` reads the same. A log is a diagnostic:
with it gone, the Run is still interrupted, named by its task only.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import msgspec

from intloom.project import scan_logs

__all__ = ["LOG_SCAN", "LOG_TAIL", "evidence_log", "last_line", "last_log", "log_records",
           "read_log", "tool_calls_cut"]

# The end of a host's log read for this: a stop's or a crash's last lines are there, and a
# log is read no further than this.
LOG_TAIL: Final = 256 * 1024
# How far back ``last_line`` looks for one line: a stop logs a line per loaded Run after its
# ``service_stopping`` (``run_suspended``, ~180 B), so 256 KiB held that line for ~1,400
# Runs only; 64 MiB holds it for ~300,000.
LOG_SCAN: Final = 64 * 1024 * 1024


def read_log(path: Path | None, limit: int, *, tail: bool) -> bytes | None:
    """At most ``limit`` bytes of the log at ``path``, its last ones when ``tail``, else its
    first; None when it is not a regular file that can be read. Never through a link, never
    blocked by a FIFO put in its place (an ``open`` of one waits for a writer for ever)."""
    fd = _open_regular(path)
    if fd is None:
        return None
    try:
        with open(fd, "rb") as fh:
            if tail:
                fh.seek(max(0, os.fstat(fd).st_size - limit))
            return fh.read(limit)
    except OSError:
        return None


def last_line(path: Path | None, needle: bytes, *, chunk: int = LOG_TAIL,
              limit: int = LOG_SCAN) -> bytes | None:
    """The last whole line of the log at ``path`` that holds ``needle``, searched back from
    its end through at most ``limit`` bytes, ``chunk`` bytes a read; None when there is
    none there, or the log is not a regular file that can be read (as ``read_log``)."""
    if chunk <= 0:
        raise ValueError(f"last_line: chunk must be positive, not {chunk}")
    fd = _open_regular(path)
    if fd is None:
        return None
    try:
        end = os.fstat(fd).st_size
        floor = max(0, end - limit)
        # The start of the part already searched, up to its first line break, in pieces:
        # a line longer than a chunk is joined once, not copied again at every read.
        after: list[bytes] = []
        while end > floor:
            begin = max(floor, end - chunk)
            piece = os.pread(fd, end - begin, begin)
            if begin == 0 or os.pread(fd, 1, begin - 1) == b"\n":
                cut = 0  # the read begins a line
            else:
                # A line the read cut at its start is searched with the read before it.
                cut = piece.find(b"\n") + 1
                if cut == 0:  # within one line longer than a chunk
                    after.append(piece)
                    end = begin
                    continue
            data = piece + b"".join(reversed(after))
            found = data.rfind(needle, cut)
            if found >= 0:
                start = data.rfind(b"\n", cut, found) + 1 or cut
                stop = data.find(b"\n", found)
                return data[start:stop if stop >= 0 else len(data)]
            after, end = [piece[:cut]], begin
        return None
    except OSError:
        return None
    finally:
        os.close(fd)


def _open_regular(path: Path | None) -> int | None:
    """A read descriptor of the regular file at ``path``; None when it is not one, or cannot
    be opened. Never through a link, never blocked by a FIFO put in its place (an ``open``
    of one waits for a writer for ever)."""
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        regular = False
    if not regular:
        os.close(fd)
        return None
    return fd


# The lines ``tool_calls_cut`` reads, found by these (a host writes its JSON compact).
_EVIDENCE: Final = (b'"event":"run_tool_', b'"event":"run_completion_',
                    b'"event":"run_restored"', b'"event":"run_needs_attention"')
_CHUNK: Final = 1 << 20


# A host log this short without ``restore_finished`` is a start's that ended before it had
# restored (it failed: a port taken, a log it could not write; or it was killed in its
# imports): no Run ran on it and it carried no evidence forward (``run_restored``'s
# ``toolCall``), so the evidence is in a log before it. Passed over, at most this many (a
# supervisor retrying a broken start writes one each time).
_UNRESTORED_MAX: Final = 64 * 1024
_RESTORED: Final = b'"event":"restore_finished"'
_PASSED_MAX: Final = 256


def evidence_log(logs: Path, *, before: str | None = None) -> tuple[str, bytes] | None:
    """``last_log``'s log, but only its lines of Tool calls, Agent completions and restored
    or held Runs, from its last ``LOG_SCAN`` bytes rather than ``LOG_TAIL``: a host busy after a
    long Tool call began (other Runs' Steps and Tool calls, ~1,500 lines) had pushed that
    call's start out of the tail, and the restart no longer named it. The logs of starts that
    ended before they restored are passed over (``_UNRESTORED_MAX``): one failed start after
    a crash left its log the newest, and the Tool call the crash cut went unnamed."""
    newest = _evidence_name(logs, before)
    if newest is None:
        return None
    fd = _open_regular(logs / newest)
    if fd is None:
        return None
    kept: list[bytes] = []
    try:
        end = os.fstat(fd).st_size
        at = max(0, end - LOG_SCAN)
        carry = b""
        while at < end:
            piece = os.pread(fd, min(_CHUNK, end - at), at)
            if not piece:
                break
            at += len(piece)
            data = carry + piece
            cut = data.rfind(b"\n") + 1 if at < end else len(data)
            data, carry = data[:cut], data[cut:]
            kept.extend(_evidence_lines(data))
    except OSError:
        return None
    finally:
        os.close(fd)
    return newest, b"\n".join(kept)


def _evidence_lines(data: bytes) -> list[bytes]:
    """The whole lines of ``data`` that hold one of ``_EVIDENCE``, in order (found with
    ``bytes.find``: a regular expression over 64 MiB of log is far slower)."""
    starts: set[int] = set()
    for needle in _EVIDENCE:
        found = data.find(needle)
        while found >= 0:
            starts.add(data.rfind(b"\n", 0, found) + 1)
            found = data.find(needle, found + len(needle))
    lines = []
    for start in sorted(starts):
        stop = data.find(b"\n", start)
        lines.append(data[start:] if stop < 0 else data[start:stop])
    return lines


def _evidence_name(logs: Path, before: str | None) -> str | None:
    """The newest host log before ``before`` whose host got as far as restoring its Runs
    (``_unrestored``), past at most ``_PASSED_MAX`` that did not (more: the newest, as
    before any was passed over); None when there is none."""
    names = _names_newest_first(logs, before)
    for passed, name in enumerate(names):
        if passed > _PASSED_MAX:
            return names[0]
        if not _unrestored(logs / name):
            return name
    return None


def _unrestored(path: Path) -> bool:
    """The log at ``path`` is short and has no ``restore_finished``: its start ended before
    it restored. An unreadable one is not passed over (nothing is known of it)."""
    head = read_log(path, _UNRESTORED_MAX + 1, tail=False)
    return head is not None and len(head) <= _UNRESTORED_MAX and _RESTORED not in head


def _names_newest_first(logs: Path, before: str | None) -> list[str]:
    """The host logs' names before ``before``, newest first; none when unlistable."""
    try:
        found, _, _ = scan_logs(logs)
    except OSError:
        return []
    return sorted((p.name for p in found if before is None or p.name < before), reverse=True)


def _newest_log(logs: Path, before: str | None) -> str | None:
    return next(iter(_names_newest_first(logs, before)), None)


def last_log(logs: Path, *, before: str | None = None) -> tuple[str, bytes] | None:
    """The newest host log (``LOG-<start>.jsonl``, a regular file under the name a host
    gives it) whose name sorts before ``before`` (a starting host's own; None: any), its
    name and its last ``LOG_TAIL`` bytes; None when there is none, or it cannot be read.
    Other entries (``scan_logs``: a copy, a link, a FIFO) are passed over, never opened or
    followed: no host wrote them, and a stray name such as ``LOG-copy.jsonl`` sorts after
    every host's."""
    newest = _newest_log(logs, before)
    if newest is None:
        return None
    # The newest only, even unreadable: an older log is of a host before the last one.
    data = read_log(logs / newest, LOG_TAIL, tail=True)
    return None if data is None else (newest, data)


def log_records(tail: bytes) -> Iterator[dict[str, Any]]:
    """The log records in ``tail``, skipping a line that is no JSON object: the first, cut
    by the tail, or one a full disk cut short."""
    for line in tail.splitlines():
        try:
            record = msgspec.json.decode(line)
        except (msgspec.DecodeError, RecursionError):
            # RecursionError: a line nested deeper than the decoder's stack (damage, a
            # foreign writer) failed logs, doctor and a start with CLI_INTERNAL_ERROR.
            continue
        if isinstance(record, dict):
            yield record


# Tool calls of a task named as done, at most: a task may make hundreds.
_DONE_SHOWN: Final = 5


def tool_calls_cut(found: tuple[str, bytes],
                   tasks: Mapping[str, str] | None = None) -> dict[str, str]:
    """Per Run, what the log ``found`` (name, tail) says of the Tool call its host left
    unfinished: a ``run_tool_started`` with no ``run_tool_ended`` after it (the host was
    killed during the call), one ended by the stop's grace (``CLI_SERVICE_CLOSING``), or
    what that host itself named when it restored or held the Run (the ``toolCall`` of
    ``run_restored`` or ``run_needs_attention``); and an Agent's completion never recorded
    (``run_completion_started`` with no ``run_completion_ended``: logged once its records
    are durable) or that a stop dropped (ended ``CLI_SERVICE_CLOSING``). Each is a clause:
    "the log of the host it ran on (...) says ...".

    ``tasks``: per Run, the Agent task it waited on when its host went. The Tool calls of
    that task that had ended are named too: their effects happened, and the task that made
    them is lost with its receipts, so a new Run's Agent would make them again. A call of
    any other task is behind a recorded completion, and is not named."""
    name, tail = found
    # (runId, callId) -> the Tool calls of that task that ended, as (id, Tool, outcome).
    done: dict[tuple[str, str], list[tuple[str, Any, Any]]] = {}
    # Keyed (runId, kind, id): an Agent picks its Tool call ids, so one could read as any
    # other kind's if they shared a key's shape.
    started: dict[tuple[str, str, str], dict[str, Any]] = {}
    cut: dict[tuple[str, str, str], str] = {}
    carried: dict[str, str] = {}
    for record in log_records(tail):
        event = str(record.get("event", ""))
        if (event in ("run_restored", "run_needs_attention")
                and isinstance(record.get("toolCall"), str)):
            carried[str(record.get("runId"))] = record["toolCall"]
            continue
        if event.startswith("run_completion_"):
            # An Agent task's on_complete: its completion is recorded only once it returns.
            key = (str(record.get("runId")), "completion", str(record.get("callId")))
            if event == "run_completion_started":
                started[key] = record
                cut.pop(key, None)
            elif event == "run_completion_ended" and key in started:
                begun = started.pop(key)
                if record.get("ended") == "CLI_SERVICE_CLOSING":
                    cut[key] = (f"the Agent completed task {begun.get('callId')} (outcome "
                                f"{begun.get('outcome')!r}) at {begun.get('time', '?')}, "
                                "while the host stopped: the completion was not recorded, and "
                                "the Agent's work is lost")
            continue
        if not event.startswith("run_tool_"):
            continue
        key = (str(record.get("runId")), "tool", str(record.get("toolCallId")))
        if event == "run_tool_started":
            started[key] = record
            cut.pop(key, None)
        elif event == "run_tool_ended" and key in started:
            begun = started.pop(key)
            if record.get("outcome") == "CLI_SERVICE_CLOSING":
                cut[key] = (f"Tool call {key[2]} (Tool {begun.get('tool')!r}, started "
                            f"{begun.get('time', '?')}) was still running when the stop's "
                            "grace ran out, so check what that Tool did")
            elif tasks is not None:
                done.setdefault((key[0], str(begun.get("callId"))), []).append(
                    (key[2], begun.get("tool"), record.get("outcome")))
    for key, begun in started.items():
        if key[1] == "completion":
            # on_complete runs no effect: nothing to check but that the Agent's work, done,
            # was lost with it.
            cut[key] = (f"the Agent completed task {begun.get('callId')} (outcome "
                        f"{begun.get('outcome')!r}) at {begun.get('time', '?')}, and the "
                        "host went before that completion was recorded (while its "
                        "on_complete ran, or its records were made durable), so the Agent's "
                        "work is lost")
            continue
        cut[key] = (f"Tool call {key[2]} (Tool {begun.get('tool')!r}) started "
                    f"{begun.get('time', '?')} and never returned: it was running when the "
                    "host went, so check what that Tool did")
    said: dict[str, str] = {}
    for (run_id, _, _), text in cut.items():
        said[run_id] = f"{said[run_id]}; {text}" if run_id in said else text
    for (run_id, call_id), calls in done.items():
        if tasks is None or tasks.get(run_id) != call_id:
            continue
        text = _ended_calls(call_id, calls)
        said[run_id] = f"{said[run_id]}; {text}" if run_id in said else text
    found_here = {run_id: f"the log of the host it ran on (.intloom/logs/{name}) says {text}"
                  for run_id, text in said.items()}
    return {**carried, **found_here}


def _ended_calls(call_id: str, calls: list[tuple[str, Any, Any]]) -> str:
    """The clause naming the Tool calls of task ``call_id`` that ended before its host went."""
    shown = ", ".join(
        f"{tool_call_id} (Tool {tool!r}, "
        f"{outcome if outcome in ('returned', 'raised') else f'ended {outcome}'})"
        for tool_call_id, tool, outcome in calls[:_DONE_SHOWN])
    more = f" and {len(calls) - _DONE_SHOWN} more" if len(calls) > _DONE_SHOWN else ""
    one = len(calls) == 1
    it, they = ("it", "it") if one else ("each", "they")
    return (f"task {call_id} had made Tool call{'' if one else 's'} {shown}{more} before "
            f"the host went: {it} ran, and what {they} did stands, so check it before "
            "starting new work")
