"""The ``intloom`` command: a thin Typer adapter over the client, diagnostics and store.

``main`` is the only entry point. It runs the Typer app without Click's standalone error
handling, so that every outcome -- a result, a known error, a usage error, a bug -- is
written by the one renderer and turned into an exit code by the one mapping.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence
from typing import Annotated

import typer

from intloom.cli import exit_codes
from intloom.cli.commands import attach, diagnose, init, inspect, logs, runs, service
from intloom.cli.options import CliState, DebugOpt, JsonOpt, ProjectOpt
from intloom.errors import IntloomError, error_view

try:
    from typer._click.exceptions import ClickException, NoArgsIsHelpError
except ImportError:  # typer releases that still delegate to click
    from click.exceptions import (  # type: ignore[import-not-found, no-redef]
        ClickException,
        NoArgsIsHelpError,
    )

__all__ = ["app", "main"]

app = typer.Typer(
    name="intloom",
    help="Durable agent workflows on a local run host.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        import intloom

        typer.echo(f"intloom {intloom.__version__}")
        raise typer.Exit(exit_codes.OK)


@app.callback()
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


app.command("init")(init.init)
app.command("start")(service.start)
app.command("stop")(service.stop)
app.command("status")(diagnose.status)
app.command("doctor")(diagnose.doctor)
app.command("recover")(diagnose.recover)
app.command("flow")(runs.flow)
app.command("flows")(runs.flows)
app.command("runs")(runs.runs)
app.command("answer")(runs.answer)
app.command("cancel")(runs.cancel)
app.command("attach")(attach.attach)
app.command("inspect")(inspect.inspect)
app.command("logs")(logs.logs)


def _json_requested(args: Sequence[str]) -> bool:
    """Whether ``--json`` was asked for, before parsing (a usage error is still JSON then)."""
    options = args[: args.index("--")] if "--" in args else args
    return "--json" in options


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (see ``intloom.cli.exit_codes``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    state = CliState(json_mode=_json_requested(args))
    command = typer.main.get_command(app)
    try:
        result = command.main(
            args=args, prog_name="intloom", standalone_mode=False, obj=state
        )
    except NoArgsIsHelpError as exc:
        # Bare ``intloom`` shows the help, which is not a failure.
        sys.stdout.write(exc.format_message() + "\n")
        return exit_codes.OK
    except ClickException as exc:
        state.renderer.error(
            error_view("INVALID_REQUEST", f"{exc.format_message()} Run intloom --help.")
        )
        return exit_codes.USAGE
    except IntloomError as exc:
        state.renderer.error(exc.view())
        return exit_codes.for_exception(exc)
    except (KeyboardInterrupt, typer.Abort) as exc:
        state.renderer.note("Interrupted.")
        return exit_codes.for_exception(
            exc if isinstance(exc, KeyboardInterrupt) else KeyboardInterrupt()
        )
    except BrokenPipeError:
        # The reader went away (``| head``); there is no one left to tell, and the
        # interpreter's final flush must not complain either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return exit_codes.OK
    except Exception as exc:
        if state.debug:
            traceback.print_exc(file=sys.stderr)
        state.renderer.error(
            error_view(
                "CLI_INTERNAL_ERROR",
                "The local operation failed. Rerun with --debug to see the traceback, "
                "and report it.",
            )
        )
        return exit_codes.for_exception(exc)
    return result if isinstance(result, int) else exit_codes.OK
