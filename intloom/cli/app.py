"""The ``intloom`` command: a thin Typer adapter over the client, diagnostics and store.

``main`` is the only entry point. It runs the Typer app without Click's standalone error
handling, so that every outcome -- a result, a known error, a usage error, a bug -- is
written by the one renderer and turned into an exit code by the one mapping.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import os
import re
import shlex
import shutil
import sys
import traceback
from collections.abc import Sequence
from importlib import import_module
from itertools import pairwise
from typing import Annotated, Any, Final

import typer
from typer.core import TyperCommand, TyperGroup

from intloom.cli import coercion, exit_codes
from intloom.cli.inputs import UsageError
from intloom.cli.options import CliState, DebugOpt, Interrupted, JsonOpt, ProjectOpt
from intloom.errors import ErrorView, IntloomError, error_view, quoting_bounded

try:
    from typer._click.exceptions import ClickException, NoArgsIsHelpError, NoSuchOption
except ImportError:  # typer releases that still delegate to click
    from click.exceptions import (  # type: ignore[import-not-found, no-redef]
        ClickException,
        NoArgsIsHelpError,
        NoSuchOption,
    )

__all__ = ["COMMANDS", "HELP", "RICH_HELP_COLUMNS", "build_app", "main"]

# command -> (module under intloom.cli.commands, function). Order is the order of --help.
COMMANDS: Final[dict[str, tuple[str, str]]] = {
    "init": ("init", "init"),
    "start": ("service", "start"),
    "stop": ("service", "stop"),
    "status": ("diagnose", "status"),
    "doctor": ("diagnose", "doctor"),
    "recover": ("diagnose", "recover"),
    "flow": ("runs", "flow"),
    "flows": ("runs", "flows"),
    "runs": ("runs", "runs"),
    "answer": ("runs", "answer"),
    "cancel": ("runs", "cancel"),
    "attach": ("attach", "attach"),
    "inspect": ("inspect", "inspect"),
    "verify": ("verify", "verify"),
    "logs": ("logs", "logs"),
}
# command -> its help. Typer reads a command's docstring, which python -OO (PYTHONOPTIMIZE=2)
# strips: the help is given explicitly (tests/unit/test_cli_help.py keeps each the same as
# its command's docstring).
HELP: Final[dict[str, str]] = {
    "init": "Scaffold a project: intloom.toml, an example Workflow and a .gitignore.",
    "start": "Start the project's host (or reuse the one running) and restore its Runs.",
    "stop": "Ask the running host to stop, once, and wait until it has released its files.",
    "status": "Say whether the host is running, offline, or what blocks it. Exits 0 when "
              "diagnosable.",
    "doctor": "Check configuration, owners, Workflows and every journal; preview each "
              "restart.\n\nExit 0 healthy, 3 when something needs attention, 4 when blocked.",
    "recover": "Remove stale service files (service.json, service.lock) once their owner is "
               "gone.",
    "flow": "Create a Run and wait for its first question, confirmation or end.\n\nOn a "
            "terminal without --intent or --intent-file, the intent is asked for. Exit 0 "
            "when\nit waits, completes or runs on (--detach), 1 when it fails, 75 when its host "
            "stopped\nand suspended it meanwhile (not ended).",
    "flows": "List the Workflows the host loaded, with their identity and readiness.",
    "runs": "List the Runs of the current host (new ones and restored unfinished ones).",
    "answer": "Answer a pending question or confirmation, then wait for the next stable "
              "state.\n\nExit 0 unless the Run then fails (1), or its host stops and suspends it "
              "meanwhile (75).",
    "cancel": "Stop a Run for good (failed/RUN_STOPPED). Repeating it returns the same "
              "snapshot.",
    "attach": "Show a Run's history and live events; on a terminal, answer what it asks."
              "\n\nCtrl-C detaches and leaves the Run as it is. Exit 0 when it completes or "
              "still waits,\n1 when it fails or was stopped, 75 when its host stopped and "
              "suspended it (it has not\nended: start the host, then attach again).",
    "inspect": "Show a Run's journal, phase by phase, with verification results. Works "
               "offline.",
    "verify": "Check every journal and file of the store, old segments too. Works offline."
              "\n\nExit 0 when everything checks out (a file torn by a crash is listed, and "
              "is no damage),\n3 when something is damaged or unexpected.",
    "logs": "Show the host log (structured), optionally for one Run. Works offline.",
}
# Options of the root that take a value: the token after them is not a command name.
_VALUE_OPTIONS: Final = frozenset({"--project"})


def _version(ctx: typer.Context, value: bool) -> None:
    if value:
        import intloom

        # Eager: it runs before --json is parsed, so the state main() made from the whole
        # command line says whether JSON was asked for (``--version --json`` too).
        state = ctx.ensure_object(CliState)
        state.renderer.result({"version": intloom.__version__},
                              lambda: [f"intloom {intloom.__version__}"])
        raise typer.Exit(exit_codes.OK)


def _root(
    ctx: typer.Context,
    json_mode: JsonOpt = False,
    project: ProjectOpt = None,
    debug: DebugOpt = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Durable agent workflows on a local run host."""
    ctx.ensure_object(CliState).merge(json_mode=json_mode, project=project, debug=debug)


# The narrowest terminal on which every command's Rich help shows every word whole
# (tests/unit/test_cli_output.py checks each command's at this width).
RICH_HELP_COLUMNS: Final = 80


def _rich_help(json_mode: bool = False) -> bool:
    # --json promises no colour on stdout: its --help is Click's plain text, as when piped.
    return (not json_mode and "NO_COLOR" not in os.environ and sys.stdout.isatty()
            and shutil.get_terminal_size().columns >= RICH_HELP_COLUMNS)


def _plain_help_width() -> int | None:
    """The width Click's plain help wraps to on a terminal narrower than its own floor (it
    keeps 50 columns, whatever the terminal's): every line then overflowed a 20- or
    40-column terminal. None (Click's own choice) elsewhere."""
    columns = shutil.get_terminal_size().columns
    return max(columns - 2, 10) if columns < 52 else None


def _help_params(params: list[Any]) -> list[Any]:
    """``params`` with every flag's metavar empty: this Typer's Rich help otherwise shows
    ``<bool>`` after a flag (``--detach <bool>``), as if it took a value, and ``--detach
    true`` is a usage error. Click's plain help never shows a flag's metavar."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
        if param.name == "help" and not getattr(param.callback, "guarded", False):
            param.callback = _help_written(param.callback)
    return params


def _help_written(show: Any) -> Any:
    """Click's ``--help`` callback, writing as every output does: a stdout that refuses it
    (``intloom --help > /dev/full``) is CLI_OUTPUT_FAILED (main()), not an internal error."""
    from intloom.cli.render import OutputFailed

    def guarded(*args: Any) -> Any:
        try:
            return show(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputFailed(exc.errno, exc.strerror) from exc

    guarded.guarded = True  # type: ignore[attr-defined]
    return guarded


def _usage_pieces(pieces: list[str]) -> list[str]:
    """The usage line's pieces with a required argument written as docs/cli.md writes it,
    ``WORKFLOW``, not this Typer's ``{WORKFLOW}``."""
    return [re.sub(r"^\{([^{}]+)\}", r"\1", piece) for piece in pieces]


def _no_trailing_spaces(text: str) -> str:
    """Plain help as docs/cli.md promises piped output, without trailing spaces: below 52
    columns Click writes the usage's prefix ("Usage: intloom flow ") on a line of its own,
    keeping the space before the arguments it moved to the next. (Rich help is printed, and
    this is then empty.)"""
    return "\n".join(line.rstrip() for line in text.split("\n"))


class _Command(TyperCommand):
    def get_params(self, ctx: Any) -> list[Any]:
        return _help_params(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return _usage_pieces(super().collect_usage_pieces(ctx))

    def get_help(self, ctx: Any) -> str:
        return _no_trailing_spaces(super().get_help(ctx))


class _Group(TyperGroup):
    def get_params(self, ctx: Any) -> list[Any]:
        return _help_params(super().get_params(ctx))

    def get_help(self, ctx: Any) -> str:
        return _no_trailing_spaces(super().get_help(ctx))


def build_app(only: str | None = None, *, json_mode: bool = False) -> typer.Typer:
    """The Typer app with every command, or with ``only`` that one (``json_mode``: for a
    command line holding ``--json``, whose help is plain).

    A command's module is imported only when it is registered, so ``intloom runs`` does not
    pay for importing ``logs``, ``attach`` and the rest (start-up time is a requirement).
    """
    app = typer.Typer(
        name="intloom",
        help="Durable agent workflows on a local run host.",
        add_completion=False,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        # NO_COLOR promises plain output even on a terminal, and piped output is plain text
        # without trailing spaces. Rich honours NO_COLOR for colour only (bold and the boxed
        # panels stay), so Typer's Rich help is switched off for both: without a markup mode
        # Typer prints Click's plain help. So it is on a narrow terminal, where Rich's
        # panels cut option names and words to fit ("--foreg…"); Click's help wraps them.
        rich_markup_mode="rich" if _rich_help(json_mode) else None,
        context_settings={"help_option_names": ["-h", "--help"],
                          "terminal_width": _plain_help_width()},
        cls=_Group,
    )
    app.callback()(_root)
    for name, (module, function) in COMMANDS.items():
        if only is None or name == only:
            command = getattr(import_module(f"intloom.cli.commands.{module}"), function)
            app.command(name, cls=_Command, help=HELP[name])(command)
    return app


def _command_name(args: Sequence[str]) -> str | None:
    """The command ``args`` invoke, when it is one of ours; None for help and unknowns."""
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in _VALUE_OPTIONS:
            skip = True
        elif arg in ("-h", "--help", "--"):
            return None
        elif not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


def _repeated_option(args: Sequence[str], command: object, name: str | None) -> str | None:
    """An option that takes one value and is given more than once (``--intent a --intent
    b``, ``--project`` before and after the command): Click would keep the last silently."""
    commands = [command]
    sub = getattr(command, "commands", {}).get(name) if name is not None else None
    if sub is not None:
        commands.append(sub)
    single: dict[str, str] = {}  # every spelling -> the option's first name
    for cmd in commands:
        for param in getattr(cmd, "params", ()):
            if (getattr(param, "param_type_name", "") == "option" and not param.is_flag
                    and not param.multiple and not param.count):
                for spelling in param.opts:
                    single[spelling] = param.opts[0]
    seen: set[str] = set()
    value_next = False
    for arg in args[: args.index("--")] if "--" in args else args:
        if value_next:  # the value of the option before it (``--intent --project``)
            value_next = False
            continue
        option = single.get(arg.split("=", 1)[0] if arg.startswith("--") else arg)
        if option is None:
            continue
        if option in seen:
            return option
        seen.add(option)
        value_next = "=" not in arg
    return None


def _empty_project(args: Sequence[str]) -> bool:
    """Whether ``--project`` is given the empty string (``--project ""``, ``--project=``)."""
    options = args[: args.index("--")] if "--" in args else args
    return "--project=" in options or any(
        arg == "--project" and value == "" for arg, value in pairwise(options))


def _value_options(command: object, name: str | None) -> frozenset[str]:
    """Every spelling of an option, of the root or of command ``name``, that takes a value."""
    commands = [command]
    sub = getattr(command, "commands", {}).get(name) if name is not None else None
    if sub is not None:
        commands.append(sub)
    return frozenset(
        spelling for cmd in commands for param in getattr(cmd, "params", ())
        if getattr(param, "param_type_name", "") == "option" and not param.is_flag
        and not param.count for spelling in param.opts)


def _json_requested(args: Sequence[str], value_options: frozenset[str] = _VALUE_OPTIONS) -> bool:
    """Whether ``--json`` was asked for, before parsing (a usage error is still JSON then).
    A ``--json`` that is an option's value (``--intent --json``, as Click reads it) is not."""
    value_next = False
    for arg in args[: args.index("--")] if "--" in args else args:
        if value_next:
            value_next = False
        elif arg == "--json":
            return True
        else:
            value_next = arg in value_options
    return False


_EXTRA: Final = "Got unexpected extra argument(s) ("


def _flow_fix(ctx: object, message: str) -> str | None:
    """For ``flow WORKFLOW some intent``: the command line that says it, with --intent. The
    intent is an option (DESIGN), and Click only says that an argument was not expected."""
    command = getattr(ctx, "command", None)
    params = getattr(ctx, "params", None)
    if getattr(command, "name", None) != "flow" or not isinstance(params, dict):
        return None
    if not message.startswith(_EXTRA) or not message.endswith(")"):
        return None
    extra = message[len(_EXTRA):-1]  # the words, joined by spaces: as a shell split them
    if params.get("intent_file") is not None:
        return (f"flow takes one WORKFLOW, and the intent comes from --intent-file; "
                f"leave out {shlex.quote(extra)}.")
    intent = params.get("intent")
    if intent is not None:
        return ("flow takes one WORKFLOW; an intent of several words is one quoted value: "
                f"--intent {shlex.quote(f'{intent} {extra}')}.")
    # Not the whole command line: the options given before the words (--project, --json,
    # --detach) are not known here, and a line without them would be a different command.
    return f"The intent is an option: give it as --intent {shlex.quote(extra)}."


def _misplaced_option(exc: ClickException, args: Sequence[str], root: object) -> str | None:
    """For ``intloom --port 5000 start``: the usage error that says --port is start's, to be
    given after it (Click only knows that the root has no --port, and suggests --project);
    for ``intloom runs --version``, that --version is the root's, to be given before it."""
    ctx = getattr(exc, "ctx", None)
    if not isinstance(exc, NoSuchOption) or ctx is None:
        return None
    option = exc.option_name
    if ctx.parent is not None:
        if not any(option in param.opts for param in ctx.parent.command.params):
            return None
        return (f"{option} is an option of intloom, not of {ctx.command_path}: give it "
                f"before the command: intloom {option}. Run intloom --help for the usage.")
    commands = getattr(root, "commands", {})
    for arg in args:  # the command named on the line, the first word that is one
        sub = commands.get(arg) if arg in COMMANDS else None
        if sub is None:
            continue
        for param in sub.params:
            if option in (*param.opts, *param.secondary_opts):
                value = "" if param.is_flag else f" {param.metavar or 'VALUE'}"
                return (f"{option} is an option of intloom {arg}, not of intloom: give it "
                        f"after the command: intloom {arg} {option}{value}. Run intloom "
                        f"{arg} --help for the usage.")
        return None
    return None


def _usage_message(exc: ClickException, name: str | None = None) -> str:
    ctx = getattr(exc, "ctx", None)
    # An option given without its value is reported with no context: its command's help,
    # not the root's, describes it.
    where = (ctx.command_path if ctx is not None
             else f"intloom {name}" if name is not None else "intloom")
    message = exc.format_message().strip()
    fix = _flow_fix(ctx, message)
    # Click ends some messages with a question ("Did you mean 'logs'?"): never add a period
    # after a sentence that is already ended.
    if not message.endswith((".", "?", "!")):
        message += "."
    if fix is not None:
        message = f"{message} {fix}"
    return f"{message} Run {where} --help for the usage."


def _reader_gone(state: CliState) -> int:
    """The reader went away (``| head``): there is no one left to tell, and the
    interpreter's final flush must not complain either. No failure of the command's own:
    the verdict it had reached before printing, if any, is still its exit code (``doctor
    | head -1`` under ``set -o pipefail`` must not read as healthy)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return exit_codes.OK if state.verdict is None else state.verdict


def _encodable_stdout(json_mode: bool) -> None:
    """A stdout whose encoding cannot hold all text (a latin-1 or ASCII locale, or
    PYTHONIOENCODING) failed every command that printed a path, an intent or a "·" as an
    internal error. JSON is UTF-8 by definition; text gets what the stream cannot encode
    escaped (``\xe9``), as Python does on stderr -- whatever the stream's error handler:
    the C locale's surrogateescape fails on a "·" as strict does. Only a UTF-8 stream that
    already writes a path's undecodable bytes back (surrogateescape) is left as it is."""
    stream = sys.stdout
    if not isinstance(stream, io.TextIOWrapper):
        return
    utf8 = codecs.lookup(stream.encoding).name == "utf-8"
    if json_mode:
        if not utf8:
            stream.reconfigure(encoding="utf-8")
    elif not utf8 or stream.errors == "strict":
        stream.reconfigure(errors="backslashreplace")


def _standard_fds() -> None:
    """Put ``/dev/null`` on a standard descriptor that was closed (``intloom start
    --foreground >&-``, a supervisor that closes stdout). Python then sets ``sys.stdout``
    (or stderr) to None, and every command failed as an internal error on its first look
    at it; and the next file opened took the number: the host's own ``service.lock`` or
    log became the stdout of a subprocess a Step starts, and its output went into them."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        try:
            null = os.open(os.devnull, os.O_RDWR)
        except OSError:
            return  # nothing to put there: the commands say what they can
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        name = ("stdin", "stdout", "stderr")[fd]
        # sys.stdin stays None: reading "-" then says stdin is closed (cli.inputs), where
        # /dev/null would read as an empty answer or intent. Descriptor 0 is still taken.
        if fd != 0 and getattr(sys, name) is None:
            setattr(sys, name, open(fd, "r" if fd == 0 else "w",  # noqa: SIM115 (for life)
                                    encoding="utf-8", closefd=False))


def _blocking(fd: int) -> bool:
    try:
        return os.get_blocking(fd)
    except OSError:
        return True  # nothing to write there: _standard_fds put what it could


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (see ``intloom.cli.exit_codes``)."""
    _standard_fds()
    if not _blocking(1) or not _blocking(2):
        # Only then: every command's start-up would import it for a case most never meet.
        from intloom.cli.blocking import blocking_output

        blocking_output()
    args = list(sys.argv[1:] if argv is None else argv)
    state = CliState(json_mode=_json_requested(args))
    _encodable_stdout(state.json_mode)
    state.debug = "--debug" in args
    try:
        return _main(state, args)
    except OSError as exc:
        # Raised by a write to stdout as main reported an error there (JSON mode), or let
        # through below: a traceback, where the error was only the output's.
        if not _output_refused(exc):
            raise
        return _output_failed(state, exc)


def _output_refused(exc: BaseException) -> bool:
    """``exc`` is stdout refusing what was written (a full disk, an I/O error), not a fault
    of intloom's."""
    from intloom.cli.render import OutputFailed

    return isinstance(exc, OutputFailed)


def _output_failed(state: CliState, exc: OSError) -> int:
    """CLI_OUTPUT_FAILED on stderr (in JSON mode too: stdout takes nothing more), and stdout
    pointed at /dev/null, so that the interpreter's last flush does not fail again."""
    import errno

    name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    view = error_view(
        "CLI_OUTPUT_FAILED",
        f"intloom could not write its output to stdout: {exc.strerror} ({name}). The output "
        "is cut short there, but what the command did stands: attach and logs change "
        "nothing, and a Run that flow, answer or cancel acted on is as the host left it "
        "(intloom runs shows it). Free space where stdout goes, or send it elsewhere.")
    _error_to_stderr(state, view)
    return exit_codes.FAILURE


def _error_to_stderr(state: CliState, view: ErrorView) -> None:
    """``view`` on stderr once stdout refused what was written: stdout is pointed at
    /dev/null, so that the interpreter's last flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, state.renderer.out.fileno())
    os.close(devnull)
    state.renderer.documented = True  # a JSON error document goes to stderr
    with contextlib.suppress(OSError):
        state.renderer.error(view)


_PATH_MAX: Final = 4096  # Linux's longest path: a longer argument is no path


def _main(state: CliState, args: list[str]) -> int:
    name = _command_name(args)
    command: object = None
    try:
        command = typer.main.get_command(build_app(name, json_mode=state.json_mode))
        coercion.install(command)
        json_mode = _json_requested(args, _value_options(command, name))
        if json_mode != state.json_mode:
            # The first guess knew only the root's options that take a value: with the
            # command's, ``flow X --intent --json --help`` asks for no JSON (--json is the
            # intent), and its help is the terminal's, as without it. Rare: built again.
            state.json_mode = json_mode
            command = typer.main.get_command(build_app(name, json_mode=json_mode))
            coercion.install(command)
        repeated = _repeated_option(args, command, name)
        if repeated is not None:
            raise UsageError(f"{repeated} is given more than once; pass it once.")
        if _empty_project(args):
            # Path("") is ".": `--project "$DIR"` with DIR unset acted on the working
            # directory, where --project selects exactly the directory it names.
            raise UsageError("--project is given an empty path (a shell variable that is "
                             "unset or empty, say); pass the project's root directory.")
        result = command.main(
            args=args, prog_name="intloom", standalone_mode=False, obj=state
        )
        if result == exit_codes.INTERRUPTED:
            # Typer returns a bare 130 for a Ctrl-C outside the command (while it parses the
            # command line; one inside it is Interrupted, options.command), which no command
            # returns: it ended with no word, where one a moment later said "Interrupted.".
            raise KeyboardInterrupt
    except NoArgsIsHelpError as exc:
        # Bare ``intloom`` shows the help, which is not a failure; written as every output
        # is (a reader gone is no failure, a full disk is CLI_OUTPUT_FAILED: main()).
        try:
            state.renderer.raw(exc.format_message() + "\n")
        except BrokenPipeError:
            return _reader_gone(state)
        return exit_codes.OK
    except ClickException as exc:
        message = _misplaced_option(exc, args, command) or _usage_message(exc, name)
        return _failed(state, error_view("INVALID_REQUEST", message), exit_codes.USAGE)
    except IntloomError as exc:
        view = exc.view()
        # An id or name typed on the command line, of a megabyte say, is quoted by its start
        # and length: quoted whole, the error was as long (the host cuts what it quotes).
        # Not one that may be a path (PATH_MAX): a path is named whole, to be found.
        message = quoting_bounded(view.message, args, longer_than=_PATH_MAX)
        if message != view.message:
            view = ErrorView(code=view.code, message=message, retryable=view.retryable)
        return _failed(state, view, exit_codes.for_exception(exc), where=True)
    except (KeyboardInterrupt, typer.Abort) as exc:
        if state.reader_gone:
            return _reader_gone(state)  # its wait ended for that (readerwatch): no Ctrl-C
        # Once, whatever ended the command: Ctrl-C in it (Interrupted, with its own words
        # for flow and answer), a prompt given up (Abort) or Ctrl-C before it began.
        state.after_ctrl_c(exc)
        state.renderer.note(exc.note if isinstance(exc, Interrupted) else "Interrupted.")
        _say_where(state)
        if state.terminated:
            return exit_codes.TERMINATED
        return exit_codes.for_exception(
            exc if isinstance(exc, KeyboardInterrupt) else KeyboardInterrupt()
        )
    except BrokenPipeError:
        return _reader_gone(state)
    except SystemExit as exc:
        # Click turns a BrokenPipeError raised inside a command into exit 1 (its standalone
        # habit, kept even with standalone_mode=False): ``intloom logs | head`` is no failure.
        if isinstance(exc.__context__, BrokenPipeError):
            return _reader_gone(state)
        raise
    except Exception as exc:
        if _output_refused(exc):
            raise
        if state.debug:
            traceback.print_exc(file=sys.stderr)
        return _failed(
            state,
            error_view(
                "CLI_INTERNAL_ERROR",
                "The local operation failed. Rerun with --debug to see the traceback, "
                "and report it.",
            ),
            exit_codes.for_exception(exc),
        )
    code = result if isinstance(result, int) else exit_codes.OK
    if state.reader_gone:
        _reader_gone(state)  # the wait ended for that (readerwatch): nobody to tell where
        return code
    try:
        _say_where(state)
    except BrokenPipeError:
        return _reader_gone(state)
    # attach detaches on a SIGTERM as on Ctrl-C, but whoever sent it learns it took.
    return exit_codes.TERMINATED if state.terminated and code == exit_codes.OK else code


def _failed(state: CliState, view: ErrorView, code: int, *, where: bool = False) -> int:
    """Report a failure and return its exit code. A reader of the error that went away
    (``intloom --json runs | head -1``, whose error document is on stdout) is no one to
    tell, and no traceback: the command still ends with the failure's own code, so that
    ``set -o pipefail`` sees it."""
    try:
        state.renderer.error(view)
        if where:
            _say_where(state)
    except BrokenPipeError:
        _reader_gone(state)
    except OSError as exc:
        if not _output_refused(exc):
            raise
        # A --json error whose document a full stdout refused: the command's own error is
        # what a script must learn, by its code and its exit code (a usage error stays 2),
        # not CLI_OUTPUT_FAILED, which says only where the document could not go.
        _error_to_stderr(state, view)
    return code


def _say_where(state: CliState) -> None:
    """Once, last: where the commands printed for a person to copy must run, when that is
    not the working directory (docs/cli.md, "Commands to copy")."""
    line = state.elsewhere()
    if line is not None:
        state.renderer.note(line)
