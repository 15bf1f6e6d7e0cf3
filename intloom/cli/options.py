"""Options every command takes (``--json``, ``--project``, ``--debug``), defined once.

They are accepted both before the command (``intloom --json runs``) and after it
(``intloom runs --json``): :func:`command` adds them to a command's signature, so command
functions take a :class:`CliState` and only their own options.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from intloom.cli.render import CopyableWatch, PromptInterrupted, Renderer

if TYPE_CHECKING:
    from intloom.client.client import Client

__all__ = ["CliState", "DebugOpt", "Interrupted", "JsonOpt", "ProjectOpt", "command",
           "sigterm_as_ctrl_c", "working_directory"]

JsonOpt = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Write one JSON document to stdout (logs: one record a line); no prompts, no "
        "colour.",
    ),
]
ProjectOpt = Annotated[
    Path | None,
    typer.Option(
        "--project",
        metavar="DIR",
        help="Use exactly this project root (no upward search for intloom.toml).",
        show_default=False,
    ),
]
DebugOpt = Annotated[
    bool, typer.Option("--debug", help="Show a traceback when intloom itself fails.")
]


class Interrupted(typer.Abort):
    """Ctrl-C ended the command: main() says ``note`` on stderr (text mode) and exits 130.

    A KeyboardInterrupt that leaves a command is turned by Typer into a silent exit 130
    before main() sees it; an Abort it passes on. A command with more to say than
    "Interrupted." (flow: the Run goes on, and how to find it) raises this with its words.
    """

    def __init__(self, note: str = "Interrupted.") -> None:
        super().__init__(note)
        self.note = note


class CliState:
    """What the shared options said, wherever on the command line they were given."""

    def __init__(self, *, json_mode: bool = False) -> None:
        self.json_mode = json_mode
        self.project: Path | None = None
        self.debug = False
        # The exit code a command has decided before it prints (doctor's verdict, a failed
        # Run's 1): still its exit code if the reader goes away mid-print (``| head``).
        self.verdict: int | None = None
        self.terminated = False  # a SIGTERM ended the wait (sigterm_as_ctrl_c)
        # stdout's reader went away while the command waited (readerwatch): it ends quietly.
        self.reader_gone = False
        self._renderer: Renderer | None = None
        # The root this invocation resolved, once it did, and whether a command line for a
        # person to copy was printed: main() compares that root with the working directory's.
        self.resolved: Path | None = None
        self.copyable = CopyableWatch()
        # The command says itself where its commands run (init's "cd DIR"), or names none
        # to copy: elsewhere() adds no line.
        self.where_said = False
        self._here_root: tuple[Path | None] | None = None  # the working directory's, once

    def merge(self, *, json_mode: bool, project: Path | None, debug: bool) -> None:
        self.json_mode = self.json_mode or json_mode
        self.debug = self.debug or debug
        if project is not None:
            self.project = project

    @property
    def renderer(self) -> Renderer:
        """One for the invocation: it knows whether stdout has its one document already,
        so that an error after it (``main``'s, for a ``start --foreground`` whose stop
        failed) goes to stderr, never as a second document."""
        made = self._renderer
        if made is not None and made.json_mode == self.json_mode:
            return made
        renderer = self._renderer = Renderer(json_mode=self.json_mode,  # --json came later
                                             watch=self.copyable)
        if made is not None:
            renderer.documented, renderer.stdout = made.documented, made.stdout
        return renderer

    def root(self) -> Path:
        """The project root; CLI_PROJECT_INVALID (creating nothing) outside a project."""
        from intloom.project import find_root

        if self.project is not None:
            self.resolved = find_root(self.project, explicit=True)
        else:
            self.resolved = find_root(working_directory())
        return self.resolved

    def _here(self) -> tuple[bool, Path | None]:
        """Whether the working directory resolves to another root than this invocation's
        (only ``--project`` from elsewhere can), and that root (None: in no project)."""
        if self.resolved is None or self.project is None:
            return False, None  # without --project the root is the working directory's
        if self._here_root is None:
            from intloom.errors import IntloomError
            from intloom.project import find_root

            try:
                self._here_root = (find_root(working_directory()),)
            except IntloomError:
                self._here_root = (None,)
        here = self._here_root[0]
        return here != self.resolved, here

    def after_ctrl_c(self, exc: BaseException) -> None:
        """Before what is said of ``exc``, which ended a wait: after a Ctrl-C, a line break
        past the ``^C`` the terminal echoed (``Renderer.after_ctrl_c``). Not after what
        echoes nothing: a SIGTERM, EOF at a prompt (an Abort that is no ``Interrupted``)."""
        if self.terminated or (isinstance(exc, typer.Abort)
                               and not isinstance(exc, Interrupted)):
            return
        self.renderer.after_ctrl_c(exc)

    def stopped_by(self) -> str:
        """What ended a wait, in the words a person used: ``Ctrl-C`` or ``SIGTERM``."""
        return "SIGTERM" if self.terminated else "Ctrl-C"

    def intloom(self) -> str:
        """How a command this invocation prints for a person begins: ``intloom``, or
        ``intloom --project ROOT`` when, copied as it is, it would reach the working
        directory's project instead (or none). Call it once the root is resolved."""
        if not self._here()[0]:
            return "intloom"
        from intloom.fsutil import shell_arg

        assert self.resolved is not None  # _here said so
        return f"intloom --project {shell_arg(self.resolved)}"

    def elsewhere(self) -> str | None:
        """When this invocation's project is not the working directory's (``--project``
        from elsewhere) and it printed commands to copy without --project: the line saying
        where to run them. Copied as they are, they would act on the working directory's
        project, or fail."""
        if self.json_mode or not self.copyable.seen or self.where_said:
            return None
        if self.resolved is None and self.project is not None:
            # Refused before the command looked for its project (an ANSWER that is not
            # JSON), its message naming a command to copy: the line was left out.
            from intloom.errors import IntloomError

            try:
                self.root()
            except IntloomError:
                return None  # no project there: its commands would fail anywhere
        differs, here = self._here()
        if not differs or self.resolved is None:
            return None
        from intloom.fsutil import shell_arg

        there = (f"the project at {shell_arg(here)}" if here is not None
                 else "no project (the working directory is in none)")
        root = shell_arg(self.resolved)
        return (f"The intloom commands above are for {root}; run from here they would act on "
                f"{there}. Run them from {root}, or add --project {root} to them.")

    def client(self, *, waits: bool = False) -> Client:
        """A verified connection to this project's live host.

        ``waits``: the request waits for a Run to reach a stable state, which may take as
        long as its Steps do, so no reply deadline applies (Ctrl-C still works).
        """
        from intloom.client.client import Client

        if waits:
            return Client.connect(self.root(), request_timeout=None)
        return Client.connect(self.root())


_SHARED = (
    inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context),
    inspect.Parameter(
        "json_mode", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=JsonOpt
    ),
    inspect.Parameter(
        "project", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ProjectOpt
    ),
    inspect.Parameter("debug", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=DebugOpt),
)


def command(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Give ``fn(state, ...)`` the shared options; Typer sees them in the signature."""
    signature = inspect.signature(fn, eval_str=True)
    own = [p for name, p in signature.parameters.items() if name != "state"]

    @functools.wraps(fn)
    def wrapper(
        *args: Any, ctx: typer.Context, json_mode: bool, project: Path | None, debug: bool,
        **kwargs: Any,
    ) -> Any:
        state = ctx.ensure_object(CliState)
        state.merge(json_mode=json_mode, project=project, debug=debug)
        try:
            return fn(state, *args, **kwargs)
        except KeyboardInterrupt as exc:
            if isinstance(exc, PromptInterrupted):
                state.renderer.ctrl_c_line_ended()  # Interrupted no longer says so
            raise Interrupted() from None

    parameters = [*own, *_SHARED]
    # Typer reads __signature__ (and the evaluated annotations), not the wrapped function.
    del wrapper.__wrapped__
    wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
    return wrapper


@contextlib.contextmanager
def sigterm_as_ctrl_c(state: CliState) -> Iterator[None]:
    """A SIGTERM ends the command as Ctrl-C does (a KeyboardInterrupt in the main thread),
    for the commands that wait on a Run: its default ended flow, answer or attach with exit
    143 and not a word, though the Run goes on in the host. main() exits TERMINATED."""

    def terminated(_signo: int, _frame: object) -> None:
        state.terminated = True
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def working_directory() -> Path:
    """The working directory; CLI_PROJECT_INVALID when it has no name any more (removed
    since the shell entered it), where ``Path.cwd()`` raised and the command failed
    CLI_INTERNAL_ERROR."""
    try:
        return Path.cwd()
    except OSError as exc:
        from intloom.errors import IntloomError

        raise IntloomError(
            "CLI_PROJECT_INVALID",
            f"The working directory cannot be examined ({exc.strerror or exc}): it was "
            "removed, or may not be read. Change to the project's directory, or pass the "
            "project's root to --project.",
        ) from None
