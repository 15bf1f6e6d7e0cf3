"""Every command's help survives ``python -OO`` (PYTHONOPTIMIZE=2), which strips docstrings:
Typer read them, so ``intloom --help`` listed bare command names and ``intloom start --help``
said nothing of what start does. Real ``intloom`` subprocesses under -OO."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from importlib import import_module

import pytest

from intloom.cli.app import COMMANDS, HELP


def _help(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "intloom", *args, "--help"], capture_output=True, text=True,
        timeout=60, env={**os.environ, "PYTHONOPTIMIZE": "2", "NO_COLOR": "1", "COLUMNS": "200"},
    )
    assert result.returncode == 0, result
    return result.stdout


def test_the_help_table_says_what_each_docstring_says() -> None:
    assert list(HELP) == list(COMMANDS)
    for name, (module, function) in COMMANDS.items():
        doc = inspect.getdoc(getattr(import_module(f"intloom.cli.commands.{module}"), function))
        if doc is not None:  # None when this test itself runs under -OO
            assert HELP[name] == doc, name


def test_the_command_list_has_each_summary_under_oo() -> None:
    listed = _help()
    for name, text in HELP.items():
        summary = text.split("\n", 1)[0].split(". ")[0]
        line = next((ln for ln in listed.splitlines() if ln.strip().startswith(f"{name} ")),
                    None)
        assert line is not None and summary[:30] in line, (name, listed)


@pytest.mark.parametrize("name", ["start", "doctor", "attach"])
def test_a_commands_own_help_says_what_it_does_under_oo(name: str) -> None:
    shown = " ".join(_help(name).split())
    assert " ".join(HELP[name].split()) in shown, shown
