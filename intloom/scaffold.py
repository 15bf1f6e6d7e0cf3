"""``intloom init``: write a new project into a new or empty directory (version-control
metadata and virtualenvs aside), and nothing else.

The files come from ``intloom/templates/`` (package data). Each is created exclusively, so
a file that appears concurrently is never overwritten.
"""

from __future__ import annotations

import os
import stat
from importlib.resources import files
from pathlib import Path
from typing import Final

from intloom.errors import IntloomError
from intloom.project import (
    CONFIG_NAME,
    read_config_bytes,
    removed_working_directory,
    require_short_path,
    require_utf8_path,
)

__all__ = ["SCAFFOLD", "scaffold"]

# project-relative path -> template name
SCAFFOLD: Final = {
    "intloom.toml": "intloom.toml.tmpl",
    "workflows/example.py": "example.py.tmpl",
    ".gitignore": "gitignore.tmpl",
}

# What a fresh `git init` (or `hg init`, `jj init`, an svn checkout) leaves: the first thing
# many people do in a new directory. It holds no file of theirs, and init writes nothing
# into it, so a directory holding only these counts as empty.
_VCS_METADATA: Final = frozenset({".git", ".hg", ".jj", ".svn"})


def _template(name: str) -> bytes:
    return (files("intloom") / "templates" / name).read_bytes()


def _dangling_link(target: Path) -> Path | None:
    """``target`` or the nearest of its parents that is a link leading nowhere, if any."""
    for path in (target, *target.parents):
        if os.path.islink(path) and not os.path.exists(path):
            return path
    return None


def _leads_to(link: Path) -> str:
    """Where ``link`` leads: its destination, and through a chain of links the missing
    path at its end (the destination itself exists, as a link)."""
    destination = os.readlink(link)
    if not os.path.islink(os.path.join(link.parent, destination)):
        return destination
    return f"{destination}, which leads to {os.path.realpath(link)}"


def _check_target(target: Path) -> None:
    require_utf8_path(target, "CLI_INIT_TARGET_INVALID")
    # And where it leads: through a link (or a parent that is one), the project's recorded
    # path is the resolved one (find_root, scaffold's result).
    require_utf8_path(Path(os.path.realpath(target)), "CLI_INIT_TARGET_INVALID")
    # A project there would be refused by start: said now, before it is written.
    require_short_path(Path(os.path.realpath(target)), "CLI_INIT_TARGET_INVALID")
    try:
        st = os.stat(target)
    except FileNotFoundError:
        dangling = _dangling_link(target)
        if dangling is not None:
            # Else mkdir fails on the link, which was called a file that "appeared while
            # intloom init was writing": nothing appeared, the link was there all along.
            raise IntloomError(
                "CLI_INIT_TARGET_INVALID",
                f"{dangling} is a link to {_leads_to(dangling)}, which does not exist; "
                "nothing was written. Pass a new or empty directory (a link must lead to "
                "one).",
            ) from None
        return
    except NotADirectoryError:
        raise IntloomError(
            "CLI_INIT_TARGET_INVALID",
            f"{target} is inside a file, not a directory. Pass a new or empty directory.",
        ) from None
    except OSError as exc:  # a link that leads to itself (ELOOP), a directory we may not read
        raise IntloomError(
            "CLI_INIT_TARGET_INVALID",
            f"{target} cannot be examined ({exc.strerror or exc}); nothing was written. Pass "
            "a new or empty directory you can read (a link must lead to one).",
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise IntloomError(
            "CLI_INIT_TARGET_INVALID",
            f"{target} is a file, not a directory. Pass a new or empty directory to intloom init.",
        )
    unsafe = _not_yours(target, st)
    if unsafe is not None:
        raise IntloomError("CLI_INIT_TARGET_INVALID", unsafe)
    try:
        entries = sorted(name for name in set(os.listdir(target)) - _VCS_METADATA
                         if not _is_virtualenv(target / name))
    except OSError as exc:
        raise IntloomError(
            "CLI_INIT_TARGET_INVALID",
            f"{target} cannot be listed ({exc.strerror or exc}), so intloom init cannot tell "
            "it is empty; nothing was written. Pass a new or empty directory you can read.",
        ) from None
    if CONFIG_NAME in entries:
        # Most often init run a second time: "write intloom.toml there by hand" (below)
        # would send the user to write the file the directory already has.
        raise IntloomError(
            "CLI_INIT_TARGET_NOT_EMPTY",
            f"{target} is already an intloom project (it holds {CONFIG_NAME}); nothing was "
            "written. Run intloom start there to use it, or pass a new or empty directory to "
            "intloom init for another.",
        )
    if entries:
        shown = ", ".join(entries[:3]) + (
            f" and {len(entries) - 3} more" if len(entries) > 3 else "")
        raise IntloomError(
            "CLI_INIT_TARGET_NOT_EMPTY",
            f"{target} already contains {shown}. intloom init writes only into a new or empty "
            "directory; choose another one (a new subdirectory will do), or write "
            f'{CONFIG_NAME} there by hand, one line: workflows = ["flows/my_flow.py"] (the '
            "paths of your Workflow files, relative to it; docs/authoring.md), and add "
            "/.intloom/ and __pycache__/ to its .gitignore: the host keeps its state and its "
            "connection token in .intloom/, which git must not take, and caches your "
            "Workflows' bytecode in __pycache__/.",
        )


def _not_yours(target: Path, st: os.stat_result) -> str | None:
    """Why a project in the existing directory ``target`` would not be this user's alone:
    another user owns it, or every user may write in it. Its Workflow code runs as this
    user, and whoever may write there may replace it (rename ``workflows/``, plant a file);
    init wrote there, then the start it advised was refused as another user's project.
    None when it is fine (under sudo, the user sudo was run by counts as this one)."""
    me = os.geteuid()
    sudo = os.environ.get("SUDO_UID", "") if me == 0 else ""
    if st.st_uid != me and str(st.st_uid) != sudo:
        return (f"{target} belongs to another user (uid {st.st_uid}, not {me}): the "
                "Workflow code of a project there runs as you, and its owner may replace it, "
                "so intloom does not use such a project; nothing was written. Pass a new "
                "directory, or an empty one of your own.")
    if st.st_mode & stat.S_IWOTH:
        return (f"{target} may be written by every user (mode {stat.S_IMODE(st.st_mode):04o}): "
                "the Workflow code of a project there runs as you, and any of them could "
                "replace it; nothing was written. Pass a new directory, or make this one "
                f"yours alone (chmod o-w {target}), then run intloom init again.")
    return None


def _is_virtualenv(path: Path) -> bool:
    """A virtualenv (``python -m venv .venv``, made to install intloom in before init),
    marked as the Workflow identity marks one (``pyvenv.cfg``): no file of the user's, and
    init writes nothing into it."""
    return not os.path.islink(path) and os.path.isfile(path / "pyvenv.cfg")


def _other_virtualenvs(root: Path) -> bytes:
    """The .gitignore lines for the virtualenvs ``root`` holds beside ``.venv`` (which the
    template names): init took the directory for them (``_check_target``), and a Python
    before 3.13 writes no .gitignore into a virtualenv, so git add -A took all of it."""
    try:
        names = sorted(name for name in os.listdir(root)
                       if name != ".venv" and _is_virtualenv(root / name))
    except OSError:
        return b""
    # Anchored (/name/), with the characters git reads as a pattern escaped; a name with a
    # line break cannot be written as one line.
    lines = ["/" + "".join(f"\\{c}" if c in "\\*?[" else c for c in name) + "/\n"
             for name in names if "\n" not in name and "\r" not in name]
    return "".join(lines).encode("utf-8", "surrogateescape")


def _listed_anyway(config: Path) -> tuple[str, ...] | None:
    """The 'workflows' entries of a config that ``load_config`` refuses for another reason
    (a misspelt key, a bad port): they are the trees its next start loads once the slip is
    fixed, so init must not write into them either. None when it cannot be read or
    parsed: then no one can tell which trees those are."""
    import tomllib

    try:
        text = read_config_bytes(config).decode("utf-8")
        listed = tomllib.loads(text.replace("\r\n", "\n").replace("\r", "\n")).get("workflows")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, IntloomError):
        return None
    if not isinstance(listed, list):
        return ()
    return tuple(entry for entry in listed
                 if isinstance(entry, str) and entry and "\x00" not in entry
                 and not os.path.isabs(entry))


def _check_outside_state(target: Path) -> None:
    """Refuse a ``target`` inside a project's ``.intloom/`` (its private host state): a
    project made there was accepted, and its files were then found there by the enclosing
    project's ``verify`` ("unexpected") or passed over by its ``doctor``, unexplained."""
    real = Path(os.path.realpath(target))
    for state in (real, *real.parents):
        if state.name == ".intloom" and (state.parent / CONFIG_NAME).is_file():
            raise IntloomError(
                "CLI_INIT_TARGET_INVALID",
                f"{target} is inside {state}, the private host state of the project "
                f"{state.parent} (its journals, logs and connection token): only intloom's "
                "host writes there, and a project there would be read as a stray file of "
                "it; nothing was written. Choose a directory outside it.",
            )


def _check_outside_sources(target: Path) -> None:
    """Refuse a ``target`` inside a Workflow source tree of the project that encloses it.
    The example written there joined that tree, and so the identity of the Workflows loaded
    from it: their unfinished Runs were held as changed at the enclosing project's next
    start, and every later edit of the new project held them again."""
    from intloom.project import enclosing, load_config

    real = Path(os.path.realpath(target))
    around = enclosing(real)
    if around is None:
        return
    try:
        listed = load_config(around).workflows
    except IntloomError as invalid:  # its own start names that; what it lists may be read
        anyway = _listed_anyway(around / CONFIG_NAME)
        if anyway is None:
            # Unparseable, its trees cannot be told: any directory of that project may be
            # one (a file at its root covers all of it). Every command that acts on it
            # refuses it until it is fixed; init, which may change what it loads, too.
            raise IntloomError(
                "CLI_INIT_TARGET_INVALID",
                f"{target} is inside the project {around}, and its {CONFIG_NAME} cannot be "
                f"read as a configuration: {invalid.message} Until it can, the directories "
                "that project loads Workflows from cannot be told, and the example intloom "
                "init writes could join one of them (its unfinished Runs would be held as "
                "changed at its next start); nothing was written. Fix that file first, or "
                f"choose a directory outside {around}.",
            ) from None
        listed = anyway
    from intloom.authoring.identity import in_source_tree, source_root  # only when nested

    written = [real / name for name in SCAFFOLD if name.endswith(".py")]
    for rel in listed:
        try:
            tree = Path(os.path.realpath(source_root(around / rel)))
        except OSError:
            continue
        joined = [path for path in written if in_source_tree(tree, path)]
        if joined:
            raise IntloomError(
                "CLI_INIT_TARGET_INVALID",
                f"{target} is inside the project {around}, in the source tree {tree} of "
                f"{rel} (listed in its {CONFIG_NAME}): the Workflow file intloom init writes "
                f"({joined[0].relative_to(real).as_posix()}) would become part of that "
                "source's identity, so the project's unfinished Runs of its Workflows would "
                "be held as changed at its next start; nothing was written. Choose a "
                f"directory outside {tree}.",
            )


def scaffold(target: Path) -> Path:
    """Create the project at ``target`` (new or empty directory); returns its absolute root."""
    try:
        root = Path(os.path.abspath(target))
    except OSError:
        # Only a relative target reaches the working directory, and only a removed one fails.
        gone = removed_working_directory(target) or f"{target} cannot be made absolute"
        raise IntloomError(
            "CLI_INIT_TARGET_INVALID",
            f"{gone}; nothing was written. Pass the directory as an absolute path, or change "
            "to an existing directory first.",
        ) from None
    _check_outside_state(root)  # first: a state directory is never empty ("not empty")
    _check_target(root)
    _check_outside_sources(root)
    _check_umask()
    current = root / "."
    # What this init made, to take back when a later write fails: a half-written project
    # was left behind (intloom.toml, an empty workflows/), and the "run intloom init again"
    # its error advised was refused, the directory no longer empty.
    made: list[Path] = []
    try:
        _make_dirs(root, made)
        for relative, template in SCAFFOLD.items():
            current = root / relative
            _make_dirs(current.parent, made)
            if current.parent != root and os.path.islink(current.parent):
                current = current.parent
                raise FileExistsError(current)  # a link swapped in: never written through
            data = _template(template)
            if relative == ".gitignore":
                data += _other_virtualenvs(root)
            # 0644 (and 0755 directories) whatever the umask takes away: umask 000 made a
            # project every local user could rewrite, its Workflow code running as you.
            fd = os.open(current, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o644)
            made.append(current)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
    except NotADirectoryError:
        _take_back(made)
        raise IntloomError(
            "CLI_INIT_TARGET_INVALID",
            f"{root} is inside a file, not a directory. Pass a new or empty directory.",
        ) from None
    except FileExistsError:
        _take_back(made)  # only what this init created: the file that appeared is not
        raise IntloomError(
            "CLI_INIT_TARGET_NOT_EMPTY",
            f"{current} appeared while intloom init was writing; it was left as it is. "
            "Choose a new or empty directory.",
        ) from None
    except OSError as exc:
        from intloom.fsutil import storage_fix, write_refusal  # only on this failure

        refused = write_refusal(current, replaced=False)
        if refused is not None and current.parent in made:
            # A directory init made itself refuses: the umask gave it no write permission,
            # and a chmod of it (gone once taken back) is no fix.
            refused = _umask_refusal(current.parent) or refused
        wrote = bool(made)
        left = _take_back(made)
        fact = f": {refused[0]}" if refused else ""
        again = ", then run intloom init again"
        # Else the store's own advice by errno (a full disk or no inode left, a name too
        # long, a limit of the process): "check the directory's permissions and free space"
        # sent the reader to look for what is not wrong.
        fix = (f"{refused[1]}{again}." if refused
               else storage_fix(exc, current, replaced=False, then=again))
        if left:
            kept = (f"; what it wrote could not all be removed ({', '.join(map(str, left))}): "
                    "remove it")
        else:
            kept = "; what it had written is removed" if wrote else "; nothing was written"
        raise IntloomError(
            "CLI_INIT_FAILED",
            f"Could not write {current} ({exc.strerror}){fact}{kept}. {fix}",
        ) from None
    return root.resolve()


def _check_umask() -> None:
    """A umask that takes the owner's read permission (0477) let init write every file and
    report success, its files mode 0200: the intloom start it then advised was refused,
    intloom.toml "not readable by you". Refused before anything is written. (A umask that
    takes the owner's write or search permission fails init's own writes: _umask_refusal.)"""
    umask = os.umask(0)
    os.umask(umask)
    if umask & 0o400:
        mode = 0o666 & ~umask
        raise IntloomError(
            "CLI_INIT_FAILED",
            f"Your umask ({umask:04o}) takes the owner's read permission, so the files intloom "
            f"init writes would have mode {mode:04o}: intloom start could not read "
            "intloom.toml, nor the host its Workflows; nothing was written. Set a umask that "
            "does not (umask 022, or 077 to keep the project private), then run intloom init "
            "again.",
        )


def _umask_refusal(directory: Path) -> tuple[str, str] | None:
    """Why ``directory``, which init created, refuses it a write, when the mode it got from
    the umask is the reason: (the fact, the fix); None otherwise."""
    try:
        mode = stat.S_IMODE(os.stat(directory).st_mode)
    except OSError:
        return None
    if mode & 0o300 == 0o300:
        return None
    umask = os.umask(0)
    os.umask(umask)
    return (f"intloom init created {directory} with mode {mode:04o}, as your umask ({umask:04o}) "
            "has it, which does not let its owner write in it",
            "Set a umask that does (umask 022, or 077 to keep the project private)")


def _make_dirs(directory: Path, made: list[Path]) -> None:
    """``mkdir -p directory``, adding each directory it creates to ``made``, outermost first."""
    missing = []
    for path in (directory, *directory.parents):
        if os.path.lexists(path):
            break
        missing.append(path)
    for path in reversed(missing):
        path.mkdir(mode=0o755)
        made.append(path)


def _take_back(made: list[Path]) -> list[Path]:
    """Remove what this init made (files it created exclusively, directories it created),
    newest first; returns what could not be removed."""
    left = []
    for path in reversed(made):
        try:
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            else:
                path.unlink()
        except OSError:
            left.append(path)
    return left
