"""The real CLI on a pseudo-terminal: ``NO_COLOR`` means no escapes and no boxes there too,
help included; without it, the help is Rich's, and the command works the same."""

from __future__ import annotations

import errno
import os
import pty
import re
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO, Project, ok, one_source_project

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

ESC = b"\x1b"
BOX = "╭".encode()


def on_a_terminal(args: list[str], cwd: Path, *, no_color: bool) -> tuple[int, bytes]:
    """Run the CLI with stdin, stdout and stderr on a new pty; its exit code and output."""
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env.update({"TERM": "xterm-256color", "COLUMNS": "100", "PYTHONPATH": str(REPO)})
    if no_color:
        env["NO_COLOR"] = "1"
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "intloom", *args], cwd=cwd, env=env,
                                stdin=follower, stdout=follower, stderr=follower)
    finally:
        os.close(follower)  # the child holds it: EOF on the leader once the child is gone
    try:
        out = b""
        deadline = time.monotonic() + 30
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no end of output within 30 s (got {out!r})"
            ready, _, _ = select.select([leader], [], [], remaining)
            if not ready:
                continue
            try:
                chunk = os.read(leader, 65536)
            except OSError as exc:  # Linux reports the closed follower as EIO
                if exc.errno != errno.EIO:
                    raise
                break
            if not chunk:
                break
            out += chunk
        return proc.wait(timeout=10), out
    finally:
        os.close(leader)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


@pytest.mark.parametrize(
    "args", [["--help"], [], ["attach", "--help"], ["runs", "-h"], ["logs", "--help"]]
)
def test_no_color_help_on_a_terminal_is_plain(tmp_path: Path, args: list[str]) -> None:
    code, out = on_a_terminal(args, tmp_path, no_color=True)
    assert code == 0, out
    assert ESC not in out and BOX not in out, out
    assert b"Usage: intloom" in out


def test_no_color_errors_on_a_terminal_are_plain(tmp_path: Path) -> None:
    code, out = on_a_terminal(["runs", "--nope"], tmp_path, no_color=True)
    assert code == 2
    assert ESC not in out
    assert out.startswith(b"Failure \xc2\xb7 INVALID_REQUEST: No such option: --nope."), out


def test_without_no_color_the_terminal_help_is_richs(tmp_path: Path) -> None:
    code, out = on_a_terminal(["attach", "--help"], tmp_path, no_color=False)
    assert code == 0, out
    # The probe sees escapes when there are some, so their absence above means something.
    assert ESC in out and BOX in out
    assert b"Usage:" in out and b"RUN" in out


@pytest.mark.parametrize("args", [
    ["--json", "attach", "--help"], ["attach", "--help", "--json"], ["--json", "--help"],
])
def test_json_help_on_a_terminal_is_plain(tmp_path: Path, args: list[str]) -> None:
    """--json promises no colour on stdout (docs/cli.md, "Shared options"), but its --help
    on a terminal was Rich's, escapes and boxes, as without it."""
    code, out = on_a_terminal(args, tmp_path, no_color=False)
    assert code == 0, out
    assert ESC not in out and BOX not in out, out
    assert b"Usage: intloom" in out


@pytest.mark.parametrize("args", [
    ["flow", "example", "--intent", "--json", "--help"],
    ["flow", "example", "--intent", "--json", "--json", "--help"],
    ["flow", "example", "--intent", "--project", "--json", "--help"],
])
def test_help_follows_the_json_click_parses_not_the_word(
    tmp_path: Path, args: list[str]
) -> None:
    """A ``--json`` that is ``--intent``'s value asks for no JSON: the help stays the
    terminal's (Rich's) as without it; one after ``--intent --project`` is the option, and
    its help is plain. The app was built from a first look that knew only ``--project``."""
    code, out = on_a_terminal(args, tmp_path, no_color=False)
    assert code == 0, out
    rich = args.count("--json") == 1 and "--project" not in args
    assert (ESC in out and BOX in out) is rich, out
    assert b"Usage:" in out and b"WORKFLOW" in out


def test_terminal_help_shows_flags_as_flags_and_arguments_as_the_docs_do(
    tmp_path: Path,
) -> None:
    """Rich's help showed every flag as taking a value (``--detach <bool>``, ``-h --help
    <bool>``), though ``--detach true`` is a usage error, and the usage line read
    ``{WORKFLOW}`` where docs/cli.md writes ``WORKFLOW``."""
    code, out = on_a_terminal(["flow", "--help"], tmp_path, no_color=False)
    assert code == 0, out
    assert BOX in out, out  # Rich's help, at 100 columns
    text = _SGR.sub(b"", out).decode()
    assert "Usage: intloom flow [OPTIONS] WORKFLOW " in text, text
    assert "<bool>" not in text and "{" not in text, text
    assert re.search(r"│ --detach +Return as soon as the Run is created\.", text), text
    assert re.search(r"│ --help +-h +Show this message and exit\.", text), text
    assert re.search(r"│ --intent +TEXT +What the Run is for\.", text), text


# A Workflow that fails with its Run's intent as the message: each text below reaches the
# terminal as an intent (inspect's table, Rich's on a terminal) and as an error (attach).
ECHO = '''
import intloom

wf = intloom.Workflow("echo", version="1")
main = wf.stage("main")


@main.step("fail", routes={"done": intloom.COMPLETE})
def fail(ctx: intloom.StepContext[None]) -> str:
    raise RuntimeError(ctx.intent)
'''

# Each kind of text a terminal would obey, or Rich would read, and how text mode shows it.
HOSTILE = {
    "osc_title": ("a\x1b]0;pwned\x07b", "a\\x1b]0;pwned\\x07b"),
    "csi_clear": ("a\x1b[2J\x1b[Hb", "a\\x1b[2J\\x1b[Hb"),
    "c1_csi": ("a\x9b31mb", "a\\x9b31mb"),
    "carriage_return": ("fake\rreal", "fake\\rreal"),
    "backspace": ("ab\x08\x08cd", "ab\\x08\\x08cd"),
    "bidi_override": ("a\u202etxt.exe", "a\\u202etxt.exe"),
    "nul": ("a\x00b", "a\\x00b"),
    "newline_prompt": ("a\nConfirm? [y/n]: ", "a\\nConfirm? [y/n]: "),
    "rich_markup": ("[red]a[/red] [bold]b", "[red]a[/red] [bold]b"),
    "rich_link": ("[link=https://evil.example]c[/link]", "[link=https://evil.example]c[/link]"),
    "rich_emoji": (":warning: :red_heart:", ":warning: :red_heart:"),
}
# What Rich itself writes (bold headers): Select Graphic Rendition, nothing else.
_SGR = re.compile(rb"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def hostile_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Project,
                                                                               dict[str, str]]]:
    """One host, and a failed Run per kind of ``HOSTILE`` text (its intent and message)."""
    tmp = tmp_path_factory.mktemp("hostile")
    project = one_source_project(tmp, "echo", ECHO)
    try:  # as reaped() does: the host is reaped when the set-up fails too
        ok(project.cli("start", "--json"))
        runs = {}
        for kind, (text, _) in HOSTILE.items():
            (tmp / kind).write_text(text, newline="")
            result = project.cli("flow", "echo", "--intent-file", str(tmp / kind), "--json")
            assert result.code == 1, (result.code, result.stdout, result.stderr)
            # --json keeps the text exactly, whatever text mode shows of it.
            assert result.json["run"]["lastError"]["message"].endswith(text), result.stdout
            runs[kind] = result.json["run"]["runId"]
        yield project, runs
        ok(project.cli("stop", "--json"))
    finally:
        project.track_host()
        project.reap()


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("args", [["inspect"], ["attach"]], ids=["inspect", "attach"])
def test_workflow_text_reaches_a_rich_terminal_shown_not_obeyed(
    hostile_runs: tuple[Project, dict[str, str]], kind: str, args: list[str],
) -> None:
    """Rich is on (a terminal, no NO_COLOR): inspect draws its table with it. An emoji code
    (":warning:") in an intent was drawn as the emoji there: Rich read it as markup."""
    project, runs = hostile_runs
    code, out = on_a_terminal(["--project", str(project.root), *args, runs[kind]],
                              project.root, no_color=False)
    assert code == (0 if args == ["inspect"] else 1), out
    shown = out.decode("utf-8")
    assert HOSTILE[kind][1] in shown, shown
    # Only Rich's own colours, and the pty's line ends: nothing of the text as a control.
    rest = _SGR.sub(b"", out).replace(b"\r\n", b"\n")
    assert not re.search(rb"[\x00-\x08\x0b-\x1f\x7f]", rest), rest
    assert not re.search("[\x80-\x9f\u202a-\u202e\u2066-\u2069\u26a0\u2764]", shown), shown
