"""``intloom init [DIR]``: scaffold a project. It starts nothing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from intloom.cli.inputs import UsageError
from intloom.cli.options import CliState, command, working_directory
from intloom.fsutil import shell_arg

__all__ = ["init"]


@command
def init(
    state: CliState,
    path: Annotated[
        str | None,
        # A str, not a Path: Path("") is ".", and `intloom init "$DIR"` with DIR unset
        # scaffolded the working directory, as --project "" once chose it (app.main).
        typer.Argument(
            metavar="DIR",
            help="A new or empty directory (default: the current one).", show_default=False
        ),
    ] = None,
) -> None:
    """Scaffold a project: intloom.toml, an example Workflow and a .gitignore."""
    from intloom.scaffold import SCAFFOLD, scaffold

    # Its Next: lines begin with the cd they need, and its refusals name no command to copy
    # ("intloom init got two targets" is prose): "The intloom commands above are for
    # --project's root" under them was untrue.
    state.where_said = True
    if path == "":
        raise UsageError("intloom init is given an empty path (a shell variable that is "
                         "unset or empty, say); pass the directory to scaffold, or none for "
                         "the working directory.")
    directory = None if path is None else Path(path)
    if (
        directory is not None
        and state.project is not None
        and os.path.abspath(directory) != os.path.abspath(state.project)
    ):
        raise UsageError(
            f"intloom init got two targets, {directory} and --project {state.project}. "
            "Pass the directory once."
        )
    target = directory if directory is not None else state.project or working_directory()
    root = scaffold(target)

    def text() -> list[str]:
        lines = [f"Scaffolded an intloom project in {root}", "  " + ", ".join(SCAFFOLD)]
        lines.append("Next:")
        try:
            here: Path | None = Path.cwd().resolve()
        except OSError:  # removed since: the project was still made, elsewhere
            here = None
        if root != here:
            lines.append(f"  cd {shell_arg(root)}")
        lines.append("  intloom start")
        lines.append('  intloom flow example --intent "Write release notes for 1.0"')
        return lines

    state.renderer.result({"projectRoot": str(root), "status": "scaffolded"}, text)
