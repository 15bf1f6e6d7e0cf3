"""``intloom flow WORKFLOW`` on a terminal without --intent asks for the intent. It used to
ask first and connect after: a person typed what the Run was for, then learned the host was
offline or the Workflow's name misspelt, and the intent was lost. What can fail without the
intent is now found out before the prompt. Also: the line a Ctrl-C typed on the terminal
leaves (flow waiting, flow's prompt, ``logs --follow``)."""

from __future__ import annotations

import os
import select
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.terminal import Terminal
from tests.e2e.test_cli_attach_prompts import BUSY
from tests.helpers import Project, eventually, ok, one_source_project, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


def runs_of(project: Project) -> list[object]:
    return list(ok(project.cli("runs", "--json"))["runs"])


def test_an_offline_host_is_said_before_the_intent_is_asked(project: Project) -> None:
    with Terminal(["--project", str(project.root), "flow", "example"], project.root) as term:
        code = term.finish()
    assert code != 0, term.text()
    assert "Intent:" not in term.text(), term.text()
    assert "offline" in term.text().lower(), term.text()


def test_an_unknown_workflow_is_said_before_the_intent_is_asked(project: Project) -> None:
    ok(project.cli("start", "--json"))
    with Terminal(["--project", str(project.root), "flow", "exampel"], project.root) as term:
        code = term.finish()
    assert code != 0, term.text()
    assert "Intent:" not in term.text(), term.text()
    assert "Workflow 'exampel' is not loaded (loaded: example)" in term.text().replace(
        "\n", " "), term.text()
    assert runs_of(project) == []  # the look created nothing


def test_a_loaded_workflow_asks_and_creates_one_run(project: Project) -> None:
    ok(project.cli("start", "--json"))
    with Terminal(["--project", str(project.root), "flow", "example"], project.root) as term:
        term.expect("Intent: ")
        term.type("write the release notes")
        code = term.finish()
    assert code == 0, term.text()
    (run,) = runs_of(project)
    assert isinstance(run, dict) and run["status"] == "waiting", run  # its review asks
    header = ok(project.cli("inspect", run["runId"], "--json"))["records"][0]["record"]
    assert header["intent"] == "write the release notes", header


def test_a_workflow_name_that_cannot_be_sent_is_said_before_the_intent_is_asked(
    project: Project,
) -> None:
    """A name not in UTF-8 (argv's byte 0xff): the client refuses to send it, also
    INVALID_REQUEST, which the look before the prompt took for the host's refusal of its
    blank intent; the prompt came, and the create failed once the intent was typed."""
    ok(project.cli("start", "--json"))
    name = "ex\udcffample"  # os.fsdecode(b"ex\xffample")
    with Terminal(["--project", str(project.root), "flow", name], project.root) as term:
        code = term.finish()
    assert code != 0, term.text()
    assert "Intent:" not in term.text(), term.text()
    assert "not valid Unicode" in term.text().replace("\n", " "), term.text()
    assert runs_of(project) == []


@pytest.fixture
def gated_project(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "busy", BUSY))


@pytest.mark.parametrize("where", ["wait", "intent"])
def test_ctrl_c_typed_on_the_terminal_leaves_what_flow_says_on_a_line_of_its_own(
    gated_project: Project, where: str
) -> None:
    """Ctrl-C typed while flow waits for its Run (no spinner to draw over it: NO_COLOR)
    shows ``^C`` at the start of a line, and what flow said went on after it: "^CStopped
    waiting (Ctrl-C). Run ...". At the intent prompt, which ends its line after the ``^C``,
    no empty line comes before "Interrupted." either."""
    project = gated_project
    gate = project.root / "gate"
    ok(project.cli("start", "--json"))
    args = ["--project", str(project.root), "flow", "busy"]
    if where == "wait":
        args += ["--intent", str(gate)]
    try:
        with Terminal(args, project.root, controlling=True) as term:
            if where == "wait":
                eventually(Path(f"{gate}.working").exists, timeout=20,
                           what="the Run's Step to start")
            else:
                term.expect("Intent: ")
            term.keys("\x03")  # Ctrl-C, as typed: the terminal echoes it and sends SIGINT
            assert term.finish() == 130, term.text()
    finally:
        gate.touch()  # the Step ends; the host is reaped all the same
    said = term.text()
    if where == "intent":
        assert said.endswith("Intent: ^C\nInterrupted.\n"), said
        assert runs_of(project) == []
    else:
        assert said.startswith("^C\nStopped waiting (Ctrl-C). Run RUN-"), said


def test_ctrl_c_typed_on_a_followed_log_ends_the_echoed_line(gated_project: Project) -> None:
    """``logs --follow`` stopped by a Ctrl-C typed on its terminal exits 0 (it stops there),
    so no shell ends the line after the ``^C`` the terminal echoed, as it does for a command
    that SIGINT killed: the shell's prompt came on after ``^C``."""
    project = gated_project
    ok(project.cli("start", "--json"))
    args = ["--project", str(project.root), "logs", "--follow"]
    with Terminal(args, project.root, controlling=True) as term:
        term.expect("service_ready")
        term.keys("\x03")  # Ctrl-C, as typed: the terminal echoes it and sends SIGINT
        assert term.finish() == 0, term.text()
    said = term.text()
    assert said.endswith("^C\n"), said
    assert "\n\n" not in said[-4:], said


def test_ctrl_c_on_a_followed_log_into_a_pipe_leaves_the_line_to_the_shell(
    gated_project: Project
) -> None:
    """``logs --follow | grep ...``: the Ctrl-C goes to the whole pipeline, its reader dies of
    it, and the shell ends the ``^C`` line itself; a break written here as well left an
    empty line before the shell's prompt."""
    project = gated_project
    ok(project.cli("start", "--json"))
    args = ["--project", str(project.root), "logs", "--follow"]
    with Terminal(args, project.root, controlling=True, piped_stdout=True) as term:
        out = term.proc.stdout
        assert out is not None
        seen = b""
        deadline = time.monotonic() + 30
        while b"service_ready" not in seen:  # the backlog is out: it follows now
            assert time.monotonic() < deadline, seen
            ready, _, _ = select.select([out], [], [], deadline - time.monotonic())
            if ready:
                chunk = os.read(out.fileno(), 65536)
                assert chunk, f"logs ended: {seen!r}"
                seen += chunk
        term.keys("\x03")
        assert term.finish() == 0, term.text()
    assert term.text() == "^C", term.text()
