"""What the loop watcher says holds a blocked event loop (``blocked_by``), from real frames
of real threads: the project's code on the loop's thread (an async Step that blocks); the
loop waiting for work while another thread holds the interpreter (a plain def Step
computing in one long call), which the advice to make the Step a plain def does not fix;
or intloom's own work. It said "an async Step" of each, from asyncio's frame or select's."""

from __future__ import annotations

import sys
import sysconfig
import threading
from pathlib import Path
from typing import Any

import pytest

from intloom.host.loopwatch import _INTLOOM, Blocker, blocked_by

pytestmark = pytest.mark.timeout(30)


def _compiled(path: str, source: str) -> dict[str, Any]:
    """``source``'s functions, as if defined in a file at ``path`` (their frames say so)."""
    namespace: dict[str, Any] = {"sys": sys, "threading": threading}
    exec(compile(source, path, "exec"), namespace)
    return namespace


def test_the_projects_code_on_the_loops_thread_is_an_async_step_blocking(tmp_path: Path) -> None:
    step = _compiled(str(tmp_path / "flows" / "w.py"),
                     "def a():\n    return sys._current_frames()\n")
    said = blocked_by(step["a"](), threading.get_ident(), tmp_path)
    assert said == Blocker("step", "flows/w.py:2 in a"), said


def test_a_loop_waiting_in_select_is_held_by_the_thread_running_project_code(
        tmp_path: Path) -> None:
    idle = _compiled("/usr/lib/python3/selectors.py",
                     "def select():\n    return sys._current_frames()\n")
    worker = _compiled(str(tmp_path / "flows" / "w.py"),
                       "def crunch(entered, done):\n    entered.set()\n    done.wait(10)\n")
    entered, done = threading.Event(), threading.Event()
    thread = threading.Thread(target=worker["crunch"], args=(entered, done))
    thread.start()
    try:
        assert entered.wait(10)
        said = blocked_by(idle["select"](), threading.get_ident(), tmp_path)
    finally:
        done.set()
        thread.join(10)
    # Which thread held it cannot be told (each waits or runs alike in its frames): naming
    # the first with a project frame named an idle Step as often as the busy one.
    assert said == Blocker("interpreter", None), said


def test_pythons_own_files_inside_the_project_are_not_its_code(tmp_path: Path) -> None:
    """A conda or pixi environment inside the project (or a project that is $HOME, with
    pyenv's Pythons): selectors.py under the root was taken for the project's code, and an
    idle loop for an async Step blocking it."""
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    idle = _compiled(str(stdlib / "selectors.py"),
                     "def select():\n    return sys._current_frames()\n")
    said = blocked_by(idle["select"](), threading.get_ident(), stdlib.parent)
    assert said == Blocker("interpreter", None), said


def test_intlooms_own_code_on_the_loops_thread_is_said_as_such(tmp_path: Path) -> None:
    ours = _compiled(_INTLOOM + "store/writer.py",
                     "def flush():\n    return sys._current_frames()\n")
    said = blocked_by(ours["flush"](), threading.get_ident(), tmp_path)
    assert said.cause == "intloom" and said.at is not None, said
    assert said.at.endswith("intloom/store/writer.py:2 in flush"), said
