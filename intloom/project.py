"""The project: where its root is, what ``intloom.toml`` says, and where its files live."""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
from pathlib import Path
from typing import Final

import msgspec

from intloom.errors import IntloomError

__all__ = [
    "CONFIG_NAME",
    "LOG_NAME",
    "STATE_PATH_BYTES",
    "Config",
    "ProjectPaths",
    "config_not_a_file",
    "find_root",
    "link_loop",
    "load_config",
    "locale_misreads",
    "no_line_breaks",
    "removed_working_directory",
    "require_short_path",
    "require_utf8_path",
    "scan_logs",
    "special_file",
]

CONFIG_NAME = "intloom.toml"
# The names a host gives its log in ``.intloom/logs/`` (``LOG-<UTC to the ms>Z.jsonl``), and
# only those: every reader of that directory (the next host, doctor, ``intloom logs``) takes
# an entry as a host's log by this one rule. ``LOG-<anything>.jsonl`` (a copy, a link) sorts
# after every stamp ("LOG-copy" > "LOG-2026..."), so it was taken as the last host's log.
LOG_NAME: Final = re.compile(r"LOG-[0-9]{8}T[0-9]{9}Z\.jsonl")

# Valid JSON as they are, but U+2028, U+2029 and U+0085 end a line for readers that split
# text on Unicode line breaks (str.splitlines, many log tools): one record read as several.
# JSON strings are the only place they can occur, so their escapes read back the same.
_LINE_BREAK: Final = re.compile(rb"\xe2\x80[\xa8\xa9]|\xc2\x85")


def _line_break_escape(match: re.Match[bytes]) -> bytes:
    return b"\\u%04x" % ord(match.group().decode("utf-8"))


def no_line_breaks(line: bytes) -> bytes:
    """``line`` (encoded JSON) with U+2028, U+2029 and U+0085 escaped (``_LINE_BREAK``)."""
    if _LINE_BREAK.search(line) is None:
        return line
    return _LINE_BREAK.sub(_line_break_escape, line)
_KNOWN_KEYS = {"workflows", "port"}


def scan_logs(logs_dir: Path) -> tuple[list[Path], list[tuple[Path, str]], list[Path]]:
    """What ``.intloom/logs/`` holds, by the one rule its readers share (``intloom logs``,
    doctor): the host logs (``LOG_NAME``, regular files), oldest first (their names sort by
    UTC time); the entries under a host log's name that are no regular file, with what each
    is (never to be opened or followed: a FIFO would block a reader, a link may lead
    anywhere); and the entries under a name no host writes there (dot names left out, as the
    store's check leaves them), each sorted. Nothing when there is no such directory;
    OSError when it cannot be listed or searched."""
    from intloom.fsutil import not_regular

    try:
        names = os.listdir(logs_dir)
    except (FileNotFoundError, NotADirectoryError):
        return [], [], []
    found: list[Path] = []
    skipped: list[tuple[Path, str]] = []
    foreign: list[Path] = []
    for name in names:
        if not LOG_NAME.fullmatch(name):
            if not name.startswith("."):
                foreign.append(logs_dir / name)
            continue
        path = logs_dir / name
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue  # gone since the listing (a host pruning its old logs)
        if stat.S_ISREG(mode):
            found.append(path)
        else:
            skipped.append((path, not_regular(mode)))
    return sorted(found), sorted(skipped), sorted(foreign)


# Structs, not dataclasses: every command imports this module, and making a dataclass costs
# ~1 ms of its start-up each (exec'd methods), a Struct ~0.04 ms.
class ProjectPaths(msgspec.Struct, frozen=True):
    """Every path under a project's ``.intloom/``, computed in one place."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / CONFIG_NAME

    @property
    def state(self) -> Path:
        return self.root / ".intloom"

    @property
    def service_lock(self) -> Path:
        return self.state / "service.lock"

    @property
    def service_json(self) -> Path:
        return self.state / "service.json"

    @property
    def connection_json(self) -> Path:
        return self.state / "connection.json"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def runtime(self) -> Path:
        return self.state / "runtime"


class Config(msgspec.Struct, frozen=True):
    """``intloom.toml``: where Workflows are loaded from, and the host's port (0 = pick one)."""

    workflows: tuple[str, ...]
    port: int | None


def locale_misreads(text: str) -> str | None:
    """What to do, when ``text`` (a path, or an argument from the command line) holds lone
    surrogates only because Python reads bytes as ASCII here (the C locale with
    ``PYTHONUTF8=0``), its bytes being UTF-8 all along; else None. Saying they were not
    UTF-8, and to rename a directory with convmv, was false of them."""
    encoding = sys.getfilesystemencoding()
    if encoding.lower().replace("-", "") == "utf8":
        return None
    try:
        os.fsencode(text).decode("utf-8")
    except (UnicodeError, ValueError):
        return None
    return (f"its bytes are UTF-8, but Python reads the command line and file names here as "
            f"{encoding} (the locale's encoding; Python's UTF-8 mode is off): set a UTF-8 "
            "locale (export LC_ALL=C.UTF-8) or PYTHONUTF8=1, then try again")


def require_utf8_path(root: Path, code: str = "CLI_PROJECT_INVALID") -> Path:
    """``root``, if its path is valid UTF-8; ``code`` otherwise, naming it with its bytes
    escaped. The project's path is written into its JSON metadata and sent to its host, so
    a name with undecodable bytes (a Latin-1 archive, say) failed deep in the host."""
    text = str(root)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(text).decode("utf-8", errors="backslashreplace")
        misread = locale_misreads(text)
        if misread is not None:
            raise IntloomError(
                code, f"The path {shown} cannot be recorded: {misread}. Nothing was written.",
            ) from None
        raise IntloomError(
            code,
            f"The path {shown} is not valid UTF-8, and intloom records a project's path in "
            "its metadata as UTF-8 text; nothing was written. Rename the directory to a UTF-8 "
            "name (convmv does it), then try again.",
        ) from None
    return root


# What the longest path intloom writes adds to a project's root: a snapshot's temp file,
# /.intloom/runtime/snap/live/.<sha256 hex>.snap.<16 hex>.tmp (docs/format.md).
STATE_PATH_BYTES = len("/.intloom/runtime/snap/live/.") + 64 + len(".snap.") + 16 + len(".tmp")
_PATH_MAX = 4096  # Linux's, where the OS does not say (os.pathconf)


def require_short_path(root: Path, code: str = "CLI_PROJECT_INVALID") -> Path:
    """``root``, if every file intloom writes under it fits the OS's path limit; ``code``
    otherwise. A root near the limit is valid and even starts (its lock and log fit), but
    a Run's snapshot, written later, could not be, so it is refused before anything is."""
    try:
        limit = os.pathconf("/", "PC_PATH_MAX")
    except (OSError, ValueError):
        limit = _PATH_MAX
    length = len(os.fsencode(str(root)))
    if length + STATE_PATH_BYTES < limit:  # the limit counts the terminating NUL
        return root
    raise IntloomError(
        code,
        f"{root} is {length:,} bytes long, and intloom's files under it need up to "
        f"{STATE_PATH_BYTES} bytes more, beyond the {limit:,} bytes the OS allows in a path "
        f"(at most {limit - 1 - STATE_PATH_BYTES:,} for a project's root); nothing was "
        "written. Move the project to a shorter path, then try again.",
    )


def removed_working_directory(path: Path) -> str | None:
    """Why ``path`` has no absolute form, when it is relative and the working directory it
    is relative to has no name any more (removed since the shell entered it); else None.
    Resolving it raised FileNotFoundError, which named the path, not the directory gone."""
    if path.is_absolute():
        return None
    try:
        os.getcwd()
    except OSError as exc:
        return (f"{path} is relative to the working directory, which cannot be examined "
                f"({exc.strerror or exc}): it was removed, or may not be read")
    return None


def special_file(mode: int) -> str | None:
    """What a file of ``mode`` is when it is a FIFO, a socket or a device, in words; else
    None. Such a file read as a config or a Workflow source waits for a writer, or never
    ends."""
    import stat

    kinds = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    return next((kind for test, kind in kinds if test(mode)), None)


def config_not_a_file(directory: Path) -> str | None:
    """Why ``directory``'s ``intloom.toml``, when there is one that is not a regular file
    (or a link to one), cannot be the project's config, with the fix; else None. Such a
    config was passed over as absent: "No intloom.toml ... Run intloom init", while
    ``init`` said the directory holds one, to ``start`` there -- or the search went on
    upward and took the enclosing project for this one."""
    import stat

    config = directory / CONFIG_NAME
    try:
        here = os.lstat(config)
    except OSError:
        return None
    fact: str | None = None
    if stat.S_ISLNK(here.st_mode):
        try:
            leads = os.readlink(config)
        except OSError:
            leads = "?"
        try:
            there = os.stat(config).st_mode
        except OSError as exc:
            fact = (f"a symbolic link to {leads}, which "
                    + ("does not exist" if exc.errno == errno.ENOENT else
                       f"cannot be read ({exc.strerror or exc})"))
        else:
            fact = None if stat.S_ISREG(there) else f"a symbolic link to {leads}, " + (
                "a directory" if stat.S_ISDIR(there) else "which is not a regular file")
    elif stat.S_ISDIR(here.st_mode):
        fact = "a directory"
    elif not stat.S_ISREG(here.st_mode):
        fact = special_file(here.st_mode) or "not a regular file"
    if fact is None:
        return None
    return (f"{config} is {fact}, and a project's {CONFIG_NAME} is a file (or a link to "
            "one) that intloom reads its configuration from. Put the file there (from "
            "version control, or write one listing the Workflow sources, e.g. "
            'workflows = ["workflows/example.py"]), then run the command again.')


def foreign_owner(root: Path) -> int | None:
    """The uid of another user who owns ``root``, its ``intloom.toml`` or what that links
    to: a project whose Workflow code would run as this user without being theirs. Under
    sudo, the user sudo was run by counts as this one. None when all are ours, or when they
    cannot be examined (reading them says why)."""
    me = os.geteuid()
    sudo = os.environ.get("SUDO_UID", "") if me == 0 else ""
    try:
        stats = (os.lstat(root), os.lstat(root / CONFIG_NAME), os.stat(root / CONFIG_NAME))
    except OSError:
        return None
    return next((st.st_uid for st in stats if st.st_uid != me and str(st.st_uid) != sudo),
                None)


def _foreign_config(root: Path) -> str | None:
    """Why the ``intloom.toml`` an upward search found in ``root`` is not taken: it, what a
    link there leads to, or the directory holding it belongs to another user. Found in a
    shared directory above the working directory (/tmp, say), another user's project made
    every command, doctor's read-only look too, import that user's Workflow code as this
    one (git refuses such a repository for the same reason). Under sudo, the user sudo was
    run by counts as this one. None when all are ours (or cannot be examined: reading them
    says why)."""
    owner = foreign_owner(root)
    if owner is None:
        return None
    me = os.geteuid()
    from intloom.fsutil import shell_arg  # only on this refusal

    return (f"{root / CONFIG_NAME}, found by searching upward from the working directory, "
            f"belongs to another user (uid {owner}, not {me}), or its directory or what it "
            "links to does: a command would run the Workflow code it lists as you, so that "
            f"project is not used. If it is the project you mean, pass --project "
            f"{shell_arg(str(root))}; otherwise run intloom init for a project of your own.")


def find_root(start: Path, *, explicit: bool = False) -> Path:
    """The project root: ``start`` itself when explicit, else the nearest ancestor with a config.

    Raises CLI_PROJECT_INVALID naming where it looked; creates nothing.
    """
    try:
        start = start.resolve()
    except (OSError, RuntimeError) as exc:
        # A symbolic link loop: Python before 3.13 raises RuntimeError for it, not OSError.
        why = (os.strerror(errno.ELOOP) if isinstance(exc, RuntimeError)
               else exc.strerror or str(exc))
        gone = removed_working_directory(start)
        if gone is not None:
            raise IntloomError(
                "CLI_PROJECT_INVALID",
                f"{gone}. Change to an existing directory, or pass the project's root to "
                "--project as an absolute path.",
            ) from None
        raise IntloomError(
            "CLI_PROJECT_INVALID",
            f"{start} cannot be examined ({why}). Pass the project's root to --project.",
        ) from None
    if explicit:
        try:
            # Not a directory: a regular file, or a FIFO, a device (/dev/null), a socket,
            # which were said to have "no intloom.toml".
            is_root, exists = (start / CONFIG_NAME).is_file(), start.exists()
            is_file = exists and not start.is_dir()
        except OSError as exc:  # pathlib answers False for a missing path, not for these
            from intloom.fsutil import search_refused  # only on this refusal

            # EACCES: the path may well be the root; the permissions on the way refuse it.
            # Looked up through the config: a root that may not be searched itself (mode
            # 0000) refuses only the look-up of its intloom.toml, and was told "Pass the
            # project's root to --project" when it was that root.
            refused = (search_refused(start / CONFIG_NAME) if isinstance(exc, PermissionError)
                       else None)
            fix = f"{refused}." if refused else "Pass the project's root to --project."
            raise IntloomError(
                "CLI_PROJECT_INVALID",
                f"{start} cannot be examined ({exc.strerror or exc}). {fix}",
            ) from None
        if is_root:
            return require_utf8_path(start)
        broken = config_not_a_file(start)
        if broken is not None:
            raise IntloomError("CLI_PROJECT_INVALID", broken)
        # "X has no intloom.toml" was false of the config file itself (passed as other
        # tools take theirs) and said nothing of a path that does not exist.
        if is_file:
            from intloom.fsutil import not_regular  # only on this refusal

            where = f" (here {start.parent})" if start.name == CONFIG_NAME else ""
            try:
                mode = os.stat(start).st_mode
            except OSError:
                mode = stat.S_IFREG
            kind = "a file" if stat.S_ISREG(mode) else not_regular(mode)
            raise IntloomError(
                "CLI_PROJECT_INVALID",
                f"{start} is {kind}, not a directory: --project takes the project's root, "
                f"the directory that holds {CONFIG_NAME}{where}.",
            )
        if not exists:
            raise IntloomError(
                "CLI_PROJECT_INVALID",
                f"{start} does not exist. Pass the project's root to --project, "
                "or run intloom init there.",
            )
        around = enclosing(start)
        if around is not None:
            from intloom.fsutil import shell_arg  # only on this refusal

            # "run intloom init there" would make a second project inside this one.
            raise IntloomError(
                "CLI_PROJECT_INVALID",
                f"{start} has no {CONFIG_NAME}: it is inside the project {around}. Pass "
                f"--project {shell_arg(str(around))} (the directory that holds "
                f"{CONFIG_NAME}).",
            )
        orphan = _config_gone(start)
        raise IntloomError(
            "CLI_PROJECT_INVALID",
            f"{start} has no {CONFIG_NAME}"
            + (f", {orphan}" if orphan else
               ". Pass the project's root to --project, or run intloom init there."),
        )
    for candidate in (start, *start.parents):
        try:
            found = (candidate / CONFIG_NAME).is_file()
        except OSError as exc:
            if exc.errno == errno.ENAMETOOLONG:
                # A directory deeper than the OS's path limit: no project's root can be
                # there (require_short_path), but one may be above it. "Check its
                # permissions" sent the user the wrong way.
                continue
            # A working directory (or a parent) this user may not search: is_file() let the
            # PermissionError out, and every command failed CLI_INTERNAL_ERROR, exit 70.
            from intloom.fsutil import search_refused  # only on this refusal

            refused = (search_refused(candidate / CONFIG_NAME)
                       if isinstance(exc, PermissionError) else None)
            raise IntloomError(
                "CLI_PROJECT_INVALID",
                f"Cannot look for {CONFIG_NAME} in {candidate} ({exc.strerror or exc}), so "
                "the project root cannot be found. "
                + (f"{refused}, or pass --project DIR." if refused else
                   "Check its permissions (ls -ld), or pass --project DIR."),
            ) from None
        if found:
            foreign = _foreign_config(candidate)
            if foreign is not None:
                raise IntloomError("CLI_PROJECT_INVALID", foreign)
            return require_utf8_path(candidate)
        broken = config_not_a_file(candidate)
        if broken is not None:  # this directory is the project: not the one around it
            raise IntloomError("CLI_PROJECT_INVALID", broken)
    orphan = next(filter(None, map(_config_gone, (start, *start.parents))), None)
    raise IntloomError(
        "CLI_PROJECT_INVALID",
        f"No {CONFIG_NAME} in {start} or any parent directory"
        + (f", {orphan}" if orphan else
           ". Run intloom init to create a project, or pass --project DIR."),
    )


def _config_gone(directory: Path) -> str | None:
    """The rest of the sentence when ``directory`` holds a project's state (``.intloom/``)
    but no config: its config was removed or renamed (a checkout, a slip), and "run intloom
    init" was no way out -- init writes only into an empty directory -- while a host may
    still serve the project, which ``intloom stop`` could no longer reach."""
    state = directory / ".intloom"
    try:
        if not state.is_dir() or state.is_symlink() or (directory / CONFIG_NAME).exists():
            return None
    except OSError:
        return None
    return (f"but {state} holds the state of an intloom project (its Runs, its logs, and "
            f"perhaps a host still running for it): its {CONFIG_NAME} was removed or renamed. "
            f"Put it back in {directory} (from version control, or write one listing its "
            'Workflow sources, e.g. workflows = ["workflows/example.py"]), then run the '
            "command again; every command needs it, intloom stop too.")


def _looping_link(root: Path, rel: str) -> str | None:
    """The first part of ``rel`` (as spelled there) that the OS cannot follow for a loop of
    symbolic links (ELOOP), or None: pathlib's ``exists()`` answers False for a loop, as
    for a missing path, which sent the user looking for a file that is there."""
    parts = Path(rel).parts
    for end in range(1, len(parts) + 1):
        try:
            os.stat(root.joinpath(*parts[:end]))
        except OSError as exc:
            return Path(*parts[:end]).as_posix() if exc.errno == errno.ELOOP else None
    return None


def link_loop(root: Path, rel: str) -> str | None:
    """Why the entry ``rel`` (from intloom.toml) cannot be reached for a loop of symbolic
    links, with the fix; None when there is none. Shared by the loader and ``client.drift``
    (here, not in the loader, which ``status`` and ``start`` reusing a host must not import),
    so what a reused host is told has changed names the loop as the next start would."""
    looping = _looping_link(root, rel)
    if looping is None:
        return None
    fix = ("Name the real file or package in 'workflows' in intloom.toml instead."
           if looping == Path(rel).as_posix() else
           f"Make {looping} lead to a real directory (ls -l shows where each link "
           "leads), or name the real path in 'workflows' in intloom.toml.")
    return (f"{rel} (from intloom.toml) cannot be reached under {root}: {looping} is a "
            f"symbolic link that leads into a loop of links ({os.strerror(errno.ELOOP)}). "
            f"{fix}")


def link_leads(link: Path, root: Path, within: str = "the project") -> str:
    """Where the symbolic link ``link`` leads, as "a symbolic link ..." goes on: "to" the
    link's own text and, when that differs, the path it reaches (relative to ``root`` when
    under it), or that it reaches nothing. "Is a symbolic link; name the real file" left the
    person to find that file with ls -l. ``within`` names ``root``."""
    try:
        text = os.readlink(link)
    except OSError as exc:
        return f"whose target cannot be read ({exc.strerror or exc})"
    try:
        real = link.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        why = ("which does not exist" if getattr(exc, "errno", None) == errno.ENOENT
               else f"which cannot be reached ({getattr(exc, 'strerror', None) or exc})")
        return f"to {text}, {why}"
    try:
        shown = real.relative_to(root.resolve()).as_posix()
    except (ValueError, OSError, RuntimeError):
        return f"to {text}" + ("" if str(real) == text else f", which is {real}") + \
            f", outside {within}"
    return f"to {text}" + ("" if shown == text else f", which is {shown} in {within}")


def enclosing(directory: Path) -> Path | None:
    """The nearest parent of ``directory`` that holds a config: the project it is in."""
    for candidate in directory.parents:
        try:
            if (candidate / CONFIG_NAME).is_file():
                return candidate
        except OSError:
            return None
    return None


def _starts_with_bom(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(3) == b"\xef\xbb\xbf"
    except OSError:
        return False


def _not_utf8(path: Path, data: bytes, exc: UnicodeDecodeError) -> str:
    """What to say of a config whose bytes are not UTF-8: where, as a line and column an
    editor shows, and the fix. Python's "can't decode byte 0xe9 in position 1234" named a
    byte offset no editor shows, and the file was called "not valid TOML" while its TOML
    may well be fine."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return (f"{path} is saved as UTF-16 (it starts with a UTF-16 byte-order mark), and "
                "TOML files are UTF-8. Save it as UTF-8 (the encoding \"UTF-8\", not "
                "\"UTF-16\" or \"Unicode\"), then retry.")
    before = data[:exc.start]
    line = before.count(b"\n") + 1
    column = len(before[before.rfind(b"\n") + 1:].decode("utf-8", errors="replace")) + 1
    return (f"{path} is not UTF-8 text: the byte 0x{data[exc.start]:02x} at line {line}, "
            f"column {column} is not UTF-8, and TOML files are UTF-8 (a file saved as "
            "Latin-1 or Windows-1252 holds such bytes). Save it as UTF-8, or retype what "
            "is there, then retry.")


def _nested_known(value: object, trail: str) -> str | None:
    """The dotted name of the first known key inside the table ``value`` (``trail`` its
    own name), as ``[tool.intloom]`` copied from a pyproject.toml, or a ``port =`` line
    written below a ``[table]`` header, put it; else None. Walked without recursion: a
    dotted key may nest tables deeper than Python's stack."""
    pending: list[tuple[object, str]] = [(value, trail)]
    while pending:
        table, name = pending.pop()
        if not isinstance(table, dict):
            continue
        known = sorted(set(table) & _KNOWN_KEYS)
        if known:
            return f"{name}.{known[0]}"
        pending.extend((inner, f"{name}.{key}") for key, inner in reversed(table.items()))
    return None


_NAMED_KEYS = 20  # unknown keys named in one message; the rest are counted


def _unknown_keys(raw: dict[str, object], unknown: list[str]) -> str:
    """The refusal of ``unknown`` keys: every one of them (fixing the first only to be told
    of the next was a round trip per key), each with the known key it is a slip of, or
    the known key found inside it."""
    import difflib

    def described(key: str) -> str:
        inside = _nested_known(raw[key], key)
        if inside is not None:
            if len(inside) > 120:  # a dotted key thousands of tables deep
                inside = f"{inside[:60]}...{inside[-40:]}"
            return (f"{key!r} (a table holding {inside!r}: intloom.toml takes its keys at the "
                    "top level, before any [table] header)")
        close = difflib.get_close_matches(key.lower(), sorted(_KNOWN_KEYS), n=1)
        return f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key)

    names = [described(key) for key in unknown[:_NAMED_KEYS]]
    if len(unknown) > _NAMED_KEYS:
        names.append(f"{len(unknown) - _NAMED_KEYS:,} more")
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    return (f"unknown key{'s' if len(names) > 1 else ''} {listed}. Known keys: "
            f"{', '.join(sorted(_KNOWN_KEYS))}. Remove or rename "
            f"{'them' if len(names) > 1 else 'it'}.")


def _toml_type(value: object) -> str:
    """What TOML calls ``value``'s type, with its article, as a message names it."""
    import datetime

    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, datetime.datetime):
        return "a date-time"
    kinds: tuple[tuple[type, str], ...] = (
        (str, "a string"), (int, "an integer"), (float, "a float"), (list, "an array"),
        (dict, "a table"), (datetime.date, "a date"), (datetime.time, "a time"))
    return next((name for kind, name in kinds if isinstance(value, kind)), "a value")


def _wrong_workflows(workflows: object) -> str | None:
    """What is wrong with the value of 'workflows', every wrong entry named by its place
    (first is 1); None when it is a list of non-empty strings. "must be a list of paths"
    alone did not say what was there: a single string, which entry, an empty one."""
    if isinstance(workflows, str):
        import json  # only on this refusal: every command imports this module

        return ("'workflows' is a string, not a list of paths: write it in brackets, "
                f"workflows = [{json.dumps(workflows, ensure_ascii=False)}].")
    example = ('\'workflows\' must be a list of paths (files or packages) relative to the '
               'project root, e.g. workflows = ["workflows/example.py"].')
    if not isinstance(workflows, list):
        return f"'workflows' is {_toml_type(workflows)}, not a list; {example}"
    wrong = [f"entry {place} is " + ("empty" if entry == "" else _toml_type(entry))
             for place, entry in enumerate(workflows, 1)
             if not isinstance(entry, str) or not entry]
    if not wrong:
        return None
    return f"in 'workflows', {', '.join(wrong)}, not a path in quotes; {example}"


def _wrong_port(port: object) -> str:
    """What is wrong with the value of 'port' (a port number is no secret; a string's text
    is shown only when it is a port number, to say to write it without quotes)."""
    if isinstance(port, bool):
        return f"'port' is a boolean ({'true' if port else 'false'}), not a number"
    if isinstance(port, int):
        return f"'port' is {port}, outside 0 to 65535"
    if isinstance(port, str):
        if port.strip().isascii() and port.strip().isdigit() and int(port) <= 65535:
            return (f"'port' is a string (write it without quotes: port = "
                    f"{int(port)})")
        return "'port' is a string, not a number"
    return f"'port' is {_toml_type(port)}, not an integer"


# The largest intloom.toml read: it lists Workflow sources and a port, a few lines. One of
# 100 MB (a log pasted in, a generated file) was parsed by every command, status taking
# 1.5 s, and held in memory by each.
MAX_CONFIG: Final = 1 << 20


def read_config_bytes(path: Path) -> bytes:
    """The bytes of ``path`` (an intloom.toml); INVALID_REQUEST naming its size and the limit,
    unread, past ``MAX_CONFIG``. OSError as ``open`` raises it."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        data = fh.read(MAX_CONFIG + 1) if size <= MAX_CONFIG else b""
    if size > MAX_CONFIG or len(data) > MAX_CONFIG:
        raise IntloomError(
            "INVALID_REQUEST",
            f"{path} is {max(size, len(data)):,} bytes, over the {MAX_CONFIG:,}-byte (1 MiB) "
            f"limit of {CONFIG_NAME}, so it was not read. It lists the Workflow sources and "
            "a port, a few lines: move anything else it holds into a file of its own, then "
            "retry.")
    return data


def load_config(root: Path) -> Config:
    """Parse and check ``intloom.toml``. Errors name the key, never echo its value."""
    import tomllib  # only commands that read the config pay for the TOML parser

    path = root / CONFIG_NAME
    try:
        data = read_config_bytes(path)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise IntloomError("INVALID_REQUEST", _not_utf8(path, data, exc)) from None
        # As read_text() read it: universal newlines (a lone CR ends a line too).
        raw = tomllib.loads(text.replace("\r\n", "\n").replace("\r", "\n"))
    except FileNotFoundError:
        raise IntloomError(
            "CLI_PROJECT_INVALID", f"{path} is missing. Run intloom init to create it."
        ) from None
    except tomllib.TOMLDecodeError as exc:
        if _starts_with_bom(path):
            # What the parser says ("line 1, column 1") points at nothing a person sees.
            raise IntloomError(
                "INVALID_REQUEST",
                f"{path} starts with a byte-order mark (U+FEFF), which TOML does not allow. "
                "Save it as UTF-8 without a BOM (the encoding \"UTF-8\", not \"UTF-8 with "
                "BOM\"), then retry.",
            ) from None
        # The parser's message names a line and column, not the file's contents.
        raise IntloomError(
            "INVALID_REQUEST", f"{path} is not valid TOML ({exc}). Fix the file and retry."
        ) from None
    except OSError as exc:
        # Unhandled, a file its user may not read ended status, start and doctor with
        # CLI_INTERNAL_ERROR and a traceback under --debug.
        if isinstance(exc, PermissionError):
            from intloom.fsutil import read_refusal  # only on this refusal

            fact, fix = read_refusal(path)
        else:
            fact = f"{path} cannot be read ({exc.strerror or exc})"
            fix = "Check the file (ls -l shows what it is)"
        raise IntloomError("CLI_PROJECT_INVALID", f"{fact}. {fix}, then retry.") from None
    unknown = sorted(set(raw) - _KNOWN_KEYS)
    if unknown:
        raise IntloomError("INVALID_REQUEST", f"{path}: {_unknown_keys(raw, unknown)}")
    workflows = raw.get("workflows", [])
    wrong = _wrong_workflows(workflows)
    if wrong is not None:
        raise IntloomError(
            "INVALID_REQUEST",
            f"{path}: {wrong}",
        )
    if any("\x00" in entry for entry in workflows):
        # The loader failed the source as WORKFLOW_DEFINITION_INVALID, "checking its
        # Workflows raised ValueError: embedded null byte. Fix the definition".
        raise IntloomError(
            "INVALID_REQUEST",
            f"{path}: an entry of 'workflows' holds a NUL character (\\u0000), which no path "
            "can hold. Remove it from the entry.",
        )
    absolute = next((entry for entry in workflows if os.path.isabs(entry)), None)
    if absolute is not None:
        # Joined to the root, an absolute entry is itself: the project would load code at a
        # fixed place on this machine, which DESIGN's "relative to the root" rules out.
        relative = os.path.relpath(absolute, root)
        raise IntloomError(
            "INVALID_REQUEST",
            f"{path}: the 'workflows' entry {absolute!r} is an absolute path; entries are "
            f"relative to the project root ({root}). Write it as {relative!r}.",
        )
    port = raw.get("port")
    if port is not None and (
        not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535
    ):
        raise IntloomError(
            "INVALID_REQUEST",
            f"{path}: {_wrong_port(port)}; 'port' must be an integer from 0 to 65535 "
            "(0 or absent: the first start picks a free port and keeps it).",
        )
    return Config(workflows=tuple(workflows), port=port)
