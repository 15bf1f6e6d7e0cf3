"""Argument -> call mapping of every command, against fakes (no host, no subprocess).

``main(argv)`` is the real entry point: parsing, the shared options, the renderer and the
exit-code map all run; only the client, lifecycle and diagnostics are replaced.
"""

from __future__ import annotations

import io
import json
import shlex
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

import intloom.client
import intloom.client.client
from intloom.cli import exit_codes
from intloom.cli.app import main
from intloom.client.lifecycle import CutRun, StopResult
from intloom.errors import ErrorView, IntloomError
from intloom.protocol.messages import RestoreSummary, ServiceView, WorkflowInfo
from intloom.runtime.model import Cursor, PendingAction, RunView

T0 = "2026-01-01T00:00:00.000Z"


def run_view(status: str = "waiting", code: str | None = None) -> RunView:
    action = None
    if status == "waiting":
        action = PendingAction(
            id="ACT-1", flow_name="f", kind="user_ask_confirmation",
            request={"context": {"draft": "d"}},
            cursor=Cursor("draft", "review"), created_at=T0,
        )
    error = ErrorView(code=code, message=f"{code} message") if code else None
    return RunView(
        run_id="RUN-1", flow_name="example", cursor=Cursor("draft", "review"),
        status=status, created_at=T0, updated_at=T0,  # type: ignore[arg-type]
        pending_action=action, last_error=error,
    )


@dataclass
class FakeClient:
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    result: RunView = field(default_factory=run_view)
    already_ended: bool = False
    runs_found: list[RunView] = field(default_factory=list)
    held: list[str] = field(default_factory=list)  # Runs the host's start held

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.calls.append(("close",))

    def create_run(self, workflow: str, intent: str, *, wait: bool = True) -> RunView:
        self.calls.append(("create_run", workflow, intent, wait))
        return self.result

    def answer(self, run_id: str, action_id: str, answer: Any, *,
               wait: bool = True) -> RunView:
        self.calls.append(("answer", run_id, action_id, answer))
        self.calls.append(("answer_waits", wait))
        return self.result

    def cancel(self, run_id: str) -> tuple[RunView, bool]:
        self.calls.append(("cancel", run_id))
        return self.result, self.already_ended

    def runs(self, flow: str | None = None) -> list[RunView]:
        self.calls.append(("runs", flow))
        if flow is not None and not self.runs_found and flow != "example":
            # As Client.runs answers (tests/integration/test_host_runs.py checks the real one).
            raise IntloomError("NOT_FOUND", f"Workflow {flow!r} is not loaded by this host, "
                               "so it has no Runs here. intloom flows lists the loaded "
                               "Workflows.")
        return self.runs_found

    def status(self) -> ServiceView:
        self.calls.append(("status",))
        return ServiceView("/p", 1, "i", 1, T0,
                           restore=RestoreSummary(needs_attention=list(self.held)))

    def workflows(self) -> list[WorkflowInfo]:
        self.calls.append(("workflows",))
        return [WorkflowInfo("example", "1.0.0", "ab" * 32, "workflows/example.py", ["draft"])]

    def get_run(self, run_id: str) -> RunView:
        self.calls.append(("get_run", run_id))
        return self.result

    def wait_run(self, run_id: str) -> RunView:
        self.calls.append(("wait_run", run_id))
        return self.result


@pytest.fixture
def proj(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "intloom.toml").write_text('workflows = ["workflows/example.py"]\n')
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch, proj: Path) -> FakeClient:
    fake = FakeClient()
    roots: list[Path] = []

    def connect(root: Path, **_timeouts: float | None) -> FakeClient:
        roots.append(root)
        assert root == proj.resolve()
        return fake

    monkeypatch.setattr(intloom.client.client.Client, "connect", staticmethod(connect))
    return fake


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# ----- shared options ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [["--json", "runs"], ["runs", "--json"], ["--project", ".", "runs", "--json"],
     ["runs", "--project", ".", "--json"]],
)
def test_shared_options_work_before_and_after_the_command(
    capsys: pytest.CaptureFixture[str], client: FakeClient, argv: list[str]
) -> None:
    code, out, err = cli(capsys, *argv)
    assert (code, err) == (0, "")
    assert json.loads(out) == {"runs": []}


def test_project_option_selects_exactly_that_directory(
    capsys: pytest.CaptureFixture[str], proj: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    elsewhere = tmp_path_factory.mktemp("empty")
    code, out, _ = cli(capsys, "runs", "--json", "--project", str(elsewhere))
    assert code == 1
    assert json.loads(out)["error"]["code"] == "CLI_PROJECT_INVALID"
    assert list(elsewhere.iterdir()) == []


def test_usage_error_is_invalid_request_in_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "flow", "--json")
    assert code == 2
    assert err == ""
    doc = json.loads(out)
    assert doc["error"]["code"] == "INVALID_REQUEST"
    assert doc["error"]["retryable"] is False
    assert "WORKFLOW" in doc["error"]["message"]


def test_usage_error_in_text_mode(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "runs", "--nope")
    assert (code, out) == (2, "")
    assert err.startswith("Failure · INVALID_REQUEST: No such option: --nope.")


def test_version_and_bare_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "--version")
    assert code == 0 and out.startswith("intloom ")
    code, out, _ = cli(capsys)
    assert code == 0 and "Usage" in out


@pytest.mark.parametrize("argv", [["--json", "--version"], ["--version", "--json"]])
def test_version_in_json_mode_is_one_json_document(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """``intloom --json --version`` printed ``intloom 0.1.0``: --json promises one JSON
    document on stdout, and a script parsing it failed."""
    import intloom

    code, out, err = cli(capsys, *argv)
    assert (code, err) == (0, "")
    assert json.loads(out) == {"version": intloom.__version__}


def test_unknown_exception_is_internal_error_traceback_only_with_debug(
    capsys: pytest.CaptureFixture[str], client: FakeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(flow: str | None = None) -> list[RunView]:
        raise RuntimeError("secret cause")

    monkeypatch.setattr(client, "runs", boom)
    code, out, err = cli(capsys, "runs", "--json")
    assert code == 70
    assert json.loads(out)["error"]["code"] == "CLI_INTERNAL_ERROR"
    assert "secret cause" not in out + err and "Traceback" not in err
    code, out, err = cli(capsys, "runs", "--debug")
    assert code == 70 and out == ""
    assert "Traceback" in err and "Failure · CLI_INTERNAL_ERROR" in err


def test_an_internal_error_reported_by_the_host_exits_70_like_our_own(
    capsys: pytest.CaptureFixture[str], client: FakeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # docs/cli.md: 70 for CLI_INTERNAL_ERROR, whichever side found the bug.
    def reported(flow: str | None = None) -> list[RunView]:
        raise IntloomError("CLI_INTERNAL_ERROR", "The host failed while starting.")

    monkeypatch.setattr(client, "runs", reported)
    code, out, _err = cli(capsys, "runs", "--json")
    assert code == 70
    assert json.loads(out)["error"]["code"] == "CLI_INTERNAL_ERROR"
    code, _out, err = cli(capsys, "runs")
    assert code == 70 and "Failure · CLI_INTERNAL_ERROR" in err


def test_known_error_has_no_traceback(
    capsys: pytest.CaptureFixture[str], client: FakeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing(run_id: str) -> tuple[RunView, bool]:
        raise IntloomError("NOT_FOUND", f"No Run {run_id}.")

    monkeypatch.setattr(client, "cancel", missing)
    code, out, err = cli(capsys, "cancel", "RUN-9", "--debug")
    assert (code, out) == (1, "")
    assert err == "Failure · NOT_FOUND: No Run RUN-9.\n"


def _ctrl_c(*_args: object, **_kwargs: object) -> Any:
    raise KeyboardInterrupt


@pytest.mark.parametrize("json_mode", [False, True])
def test_ctrl_c_in_a_command_says_interrupted_once_on_stderr(
    capsys: pytest.CaptureFixture[str], client: FakeClient, monkeypatch: pytest.MonkeyPatch,
    json_mode: bool,
) -> None:
    """Typer turned a KeyboardInterrupt leaving a command into a silent exit 130 before
    main() could say "Interrupted.": a person saw the prompt come back with no word."""
    monkeypatch.setattr(client, "runs", _ctrl_c)
    code, out, err = cli(capsys, "runs", *(["--json"] if json_mode else []))
    assert (code, out) == (130, "")  # nothing on stdout, not even with --json (docs/cli.md)
    assert err == ("" if json_mode else "Interrupted.\n")


@pytest.mark.parametrize("json_mode", [False, True])
def test_ctrl_c_while_the_command_line_is_parsed_says_interrupted(
    capsys: pytest.CaptureFixture[str], client: FakeClient, monkeypatch: pytest.MonkeyPatch,
    json_mode: bool,
) -> None:
    """A Ctrl-C that landed while Typer parsed the command line, before the command began,
    was a bare exit 130 with nothing on stderr (Typer returns 130 for it instead of raising)."""
    from typer._click.core import Command

    monkeypatch.setattr(Command, "parse_args", _ctrl_c)
    code, out, err = cli(capsys, "runs", *(["--json"] if json_mode else []))
    assert (code, out) == (130, "")
    assert err == ("" if json_mode else "Interrupted.\n")


def test_ctrl_c_while_flow_waits_says_so_once(
    capsys: pytest.CaptureFixture[str], client: FakeClient, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """flow's own words (the Run goes on, how to find it) are the whole message."""
    monkeypatch.setattr(client, "create_run", _ctrl_c)
    code, out, err = cli(capsys, "flow", "example", "--intent", "x")
    assert (code, out) == (130, "")
    assert err.startswith("Stopped waiting (Ctrl-C). A Run this command created goes on"), err
    assert len(err.splitlines()) == 1 and "Interrupted." not in err, err


# ----- flow ----------------------------------------------------------------------------------


def test_flow_waits_by_default_and_detach_does_not(
    capsys: pytest.CaptureFixture[str], client: FakeClient
) -> None:
    code, out, _ = cli(capsys, "flow", "example", "--intent", "notes", "--json")
    assert code == 0
    assert json.loads(out)["run"]["pendingAction"]["id"] == "ACT-1"
    cli(capsys, "flow", "example", "--intent", "notes", "--detach")
    # Created, then waited for in a request of its own (a Ctrl-C while it waits can name
    # the Run); --detach does not wait.
    calls = [c for c in client.calls if c[0] in ("create_run", "wait_run")]
    assert calls == [("create_run", "example", "notes", False), ("wait_run", "RUN-1"),
                     ("create_run", "example", "notes", False)]


@pytest.mark.parametrize("argv", [["flow", "example", "--intent", "notes"],
                                  ["answer", "RUN-1", "ACT-1", '{"isConfirmed": true}']])
def test_a_run_its_host_suspended_under_flow_or_answer_is_not_called_failed(
    capsys: pytest.CaptureFixture[str], client: FakeClient, argv: list[str]
) -> None:
    """``intloom stop`` while flow (or answer) waits: the reply is the suspended Run's view,
    failed/RUN_INTERRUPTED, as attach gets it. A Run this command created or just answered
    cannot be one a start restored interrupted, so it was suspended: it has not ended, and
    the next start continues it (here, from its saved boundary) -- not "Failure does not
    undo committed data"."""
    client.result = msgspec.structs.replace(
        run_view("failed", "RUN_INTERRUPTED"),
        last_error=ErrorView("RUN_INTERRUPTED", "The host stopped. The Run continues from its "
                             "last saved boundary on the next start, as the restart table "
                             "allows."))
    code, out, err = cli(capsys, *argv)
    # Not 1, a failed Run's: it exited 1 with CLI_RUN_FAILED, as IntLoom does, of a Run that
    # had not failed (DESIGN: the exit code mirrors the Run's outcome; not decided yet).
    assert code == exit_codes.RUN_SUSPENDED == 75
    assert "Suspended by its host, not ended" in out, out
    assert "Failure does not undo committed data" not in out, out
    assert err.startswith("Suspended · The Run RUN-1 was suspended by its host, not ended (its "
                          "view reads failed/RUN_INTERRUPTED until the next start): The host "
                          "stopped."), err
    assert "Failure" not in err and "CLI_RUN_FAILED" not in err, err
    # --json: the same view, the same exit code.
    code, out, err = cli(capsys, *argv, "--json")
    assert code == 75 and err == "", err
    assert json.loads(out)["run"]["lastError"]["code"] == "RUN_INTERRUPTED"


def test_flow_intent_file_and_stdin(
    capsys: pytest.CaptureFixture[str], client: FakeClient, proj: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (proj / "intent.txt").write_text("from a file\n")
    assert cli(capsys, "flow", "example", "--intent-file", "intent.txt")[0] == 0
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"from stdin\n")))
    assert cli(capsys, "flow", "example", "--intent-file", "-")[0] == 0
    intents = [c[2] for c in client.calls if c[0] == "create_run"]
    assert intents == ["from a file", "from stdin"]


@pytest.mark.parametrize(
    ("args", "code", "exit_expected"),
    [
        (["--intent", "   "], "INVALID_REQUEST", 1),
        ([], "INVALID_REQUEST", 1),
        (["--intent", "x", "--intent-file", "f"], "INVALID_REQUEST", 2),  # a usage error
        (["--intent", "a", "--intent", "b"], "INVALID_REQUEST", 2),  # not the last silently
        (["--intent=a", "--intent", "b"], "INVALID_REQUEST", 2),
        (["--intent-file", "missing.txt"], "CLI_INTENT_FILE_INVALID", 1),
        (["--intent-file", "."], "CLI_INTENT_FILE_INVALID", 1),
    ],
)
def test_flow_bad_intent_never_connects(
    capsys: pytest.CaptureFixture[str], client: FakeClient, args: list[str], code: str,
    exit_expected: int,
) -> None:
    exit_code, out, _ = cli(capsys, "flow", "example", *args, "--json")
    assert exit_code == exit_expected
    assert json.loads(out)["error"]["code"] == code
    assert client.calls == []


def test_a_value_spelled_like_an_option_is_no_repeat(
    capsys: pytest.CaptureFixture[str], client: FakeClient, proj: Path,
) -> None:
    code, out, _ = cli(capsys, "--project", str(proj), "flow", "example", "--intent",
                       "--project", "--json")
    assert code != 2, out
    assert any(c[0] == "create_run" and c[2] == "--project" for c in client.calls), (
        client.calls)


def test_a_project_given_twice_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                                proj: Path) -> None:
    code, out, _ = cli(capsys, "--project", str(proj), "status", "--project", "/elsewhere",
                       "--json")
    assert code == 2
    assert json.loads(out)["error"]["message"].startswith("--project is given more than once")


def test_flow_failed_run_prints_run_once_and_exits_1(
    capsys: pytest.CaptureFixture[str], client: FakeClient
) -> None:
    client.result = run_view("failed", "STEP_EXECUTION_FAILED")
    code, out, err = cli(capsys, "flow", "example", "--intent", "x", "--json")
    assert code == 1 and err == ""
    assert len(out.splitlines()) == 1
    assert json.loads(out)["run"]["lastError"]["code"] == "STEP_EXECUTION_FAILED"
    code, out, err = cli(capsys, "flow", "example", "--intent", "x")
    assert code == 1
    assert out.startswith("Execution failed · example")
    assert err.startswith("Failure · CLI_RUN_FAILED: The Run RUN-1 ended failed with "
                          "STEP_EXECUTION_FAILED.")
    # A Run a host stop suspended has not ended: its own message says it continues.
    client.result = run_view("failed", "RUN_INTERRUPTED")
    code, _, err = cli(capsys, "flow", "example", "--intent", "x")
    assert code == exit_codes.RUN_SUSPENDED
    assert err.startswith("Suspended · The Run RUN-1 was suspended by its host, not ended (its "
                          "view reads failed/RUN_INTERRUPTED until the next start): "
                          "RUN_INTERRUPTED message Run intloom stop first if its host still "
                          "serves")


# ----- answer, cancel, runs, flows, attach ----------------------------------------------------


def test_answer_parses_json_and_reads_stdin(
    capsys: pytest.CaptureFixture[str], client: FakeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.result = run_view("completed")
    code, out, _ = cli(capsys, "answer", "RUN-1", "ACT-1", '{"isConfirmed": true}', "--json")
    assert code == 0 and json.loads(out)["run"]["status"] == "completed"
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b'[{"questionId": "q"}]')))
    assert cli(capsys, "answer", "RUN-1", "ACT-2", "-")[0] == 0
    answers = [c[1:] for c in client.calls if c[0] == "answer"]
    assert answers == [("RUN-1", "ACT-1", {"isConfirmed": True}),
                       ("RUN-1", "ACT-2", [{"questionId": "q"}])]
    # Delivered without waiting, then waited for in a request of its own: a Ctrl-C while it
    # waits can say the answer was recorded.
    sent = [c for c in client.calls if c[0] in ("answer_waits", "wait_run")]
    assert sent == [("answer_waits", False), ("wait_run", "RUN-1")] * 2, sent


_NO_RUN = "Pass the Run's id (RUN-<UTC>-<random>; intloom runs lists the current host's Runs)."
_NO_ACTION = ("Pass the action's id (ASK-<random>; intloom runs shows what each waiting Run "
              "asks, with the command that answers it).")


@pytest.mark.parametrize(("argv", "said"), [
    (["answer", "", "ACT-1", "-"], f"RUN is empty; nothing was sent. {_NO_RUN}"),
    (["answer", "RUN-1", "", "-"], f"ACTION is empty; nothing was sent. {_NO_ACTION}"),
    (["answer", " ", "ACT-1", "-"], f"RUN ' ' is blank (only whitespace); nothing was sent. "
                                    f"{_NO_RUN}"),
    (["answer", "RUN-1", "\t", "-"], f"ACTION '\\t' is blank (only whitespace); nothing was "
                                     f"sent. {_NO_ACTION}"),
    (["answer", "", "", "-"], f"RUN is empty; nothing was sent. {_NO_RUN}"),  # RUN first
    (["attach", ""], f"RUN is empty; nothing was sent. {_NO_RUN}"),
    (["cancel", ""], f"RUN is empty; nothing was sent. {_NO_RUN}"),
    (["cancel", "  "], f"RUN '  ' is blank (only whitespace); nothing was sent. {_NO_RUN}"),
    (["inspect", ""], f"RUN is empty; nothing was read. {_NO_RUN}"),
    (["inspect", " "], f"RUN ' ' is blank (only whitespace); nothing was read. {_NO_RUN}"),
])
def test_an_empty_or_blank_id_is_a_bad_argument_named_not_a_run_not_found(
    capsys: pytest.CaptureFixture[str], client: FakeClient, monkeypatch: pytest.MonkeyPatch,
    argv: list[str], said: str,
) -> None:
    """An empty RUN reached the host, which said NOT_FOUND "Run '' is not known to this
    host", where an empty ACTION was INVALID_REQUEST "action_id is empty": both are
    arguments no id can be, refused before anything is sent (or ANSWER read from stdin),
    naming the argument as the command line does and saying what an id looks like."""
    stdin = io.TextIOWrapper(io.BytesIO(b'{"isConfirmed": true}'))
    monkeypatch.setattr("sys.stdin", stdin)
    for json_mode in (True, False):
        code, out, err = cli(capsys, *argv, *(["--json"] if json_mode else []))
        assert code == 1, (argv, code, out, err)
        if json_mode:
            assert json.loads(out) == {"error": {"code": "INVALID_REQUEST", "message": said,
                                                 "retryable": False}}, out
        else:
            assert (out, err) == ("", f"Failure · INVALID_REQUEST: {said}\n"), err
    assert client.calls == []  # not even connected
    assert stdin.buffer.tell() == 0  # ANSWER was not read


def test_an_answer_file_saved_with_a_utf8_bom_is_read(
    capsys: pytest.CaptureFixture[str], client: FakeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A UTF-8 file with a byte order mark, piped in, was refused "invalid character (byte
    0)": a byte its editor does not show."""
    client.result = run_view("completed")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(
        io.BytesIO(b'\xef\xbb\xbf{"isConfirmed": true, "feedback": "\xef\xbb\xbfkept"}\r\n')))
    assert cli(capsys, "answer", "RUN-1", "ACT-1", "-")[0] == 0
    # Only the mark before the JSON: one inside a string is the person's text.
    assert [c[1:] for c in client.calls if c[0] == "answer"] == [
        ("RUN-1", "ACT-1", {"isConfirmed": True, "feedback": "\ufeffkept"})]


@pytest.mark.parametrize(("data", "said"), [
    ('{"isConfirmed": true}'.encode("utf-16"),
     "it begins with a UTF-16 byte order mark: the file is UTF-16"),
    (b'{"isConfirmed": true, "feedback": "caf\xe9"}', "(byte 38 is 0xe9); nothing was sent"),
    (b"\xff", "byte 0 is 0xff"),
], ids=["utf16", "latin1", "binary"])
def test_an_answer_from_stdin_that_is_not_utf8_says_so(
    capsys: pytest.CaptureFixture[str], client: FakeClient, monkeypatch: pytest.MonkeyPatch,
    data: bytes, said: str,
) -> None:
    """A UTF-16 answer file was refused as bare text "'\ufffd\ufffd{...' is not JSON", a
    Latin-1 one as "not valid JSON (Invalid UTF-8 encoded string)"."""
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
    code, out, _ = cli(capsys, "answer", "RUN-1", "ACT-1", "-", "--json")
    assert code == 1
    message = json.loads(out)["error"]["message"]
    assert message.startswith("The answer read from stdin (-) is not UTF-8 text ("), message
    assert said in message and "nothing was sent. Save it as UTF-8" in message, message
    assert client.calls == []


class _TerminalStdin(io.TextIOWrapper):
    def isatty(self) -> bool:
        return True


def test_answer_from_stdin_on_a_terminal_says_how_to_end_it(
    capsys: pytest.CaptureFixture[str], client: FakeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``intloom answer RUN ACTION -`` with nothing piped in waited, silent, for the person
    to type the answer and end it: it looked like a hung command. With --json the hint is
    not said (it was, on stderr, which --json keeps for its one error document, as every
    other person's note is kept out); nor is it for ``flow --intent-file -``."""
    client.result = run_view("completed")
    monkeypatch.setattr("sys.stdin", _TerminalStdin(io.BytesIO(b'{"isConfirmed": true}')))
    code, out, err = cli(capsys, "answer", "RUN-1", "ACT-1", "-")
    assert code == 0 and "Completed" in out, out
    assert err == ("Reading the answer from stdin: type or paste it, then press Ctrl-D on a "
                   "line of its own (Ctrl-C cancels).\n")
    monkeypatch.setattr("sys.stdin", _TerminalStdin(io.BytesIO(b'{"isConfirmed": true}')))
    code, out, err = cli(capsys, "answer", "RUN-1", "ACT-1", "-", "--json")
    assert code == 0 and json.loads(out)["run"]["status"] == "completed"
    assert err == "", err
    monkeypatch.setattr("sys.stdin", _TerminalStdin(io.BytesIO(b"write the notes")))
    code, out, err = cli(capsys, "flow", "example", "--intent-file", "-", "--json")
    assert err == "" and "run" in json.loads(out), (code, out, err)
    # Piped, nothing is said.
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b'{"isConfirmed": true}')))
    assert cli(capsys, "answer", "RUN-1", "ACT-1", "-")[2] == ""


def test_answer_that_is_not_json(capsys: pytest.CaptureFixture[str], client: FakeClient) -> None:
    code, out, _ = cli(capsys, "answer", "RUN-1", "ACT-1", "{yes", "--json")
    assert code == 1
    error = json.loads(out)["error"]
    assert error["code"] == "INVALID_REQUEST" and "isConfirmed" in error["message"]
    assert client.calls == []


@pytest.mark.parametrize("bare", ["fix", "yes", "won't fix", "y" * 50],
                         ids=["fix", "yes", "label", "long"])
def test_an_answer_given_as_bare_text_says_answer_is_the_whole_answer_as_json(
        capsys: pytest.CaptureFixture[str], client: FakeClient, bare: str) -> None:
    """The answer's text alone was refused with msgspec's reason: "Input data was truncated"
    for fix, "invalid character (byte 0)" for yes."""
    code, out, _ = cli(capsys, "answer", "RUN-1", "ACT-1", bare, "--json")
    assert code == 1
    error = json.loads(out)["error"]
    shown = bare if len(bare) <= 40 else f"{bare[:40]}..."
    assert error["code"] == "INVALID_REQUEST"
    assert error["message"].startswith(
        f"ANSWER {shown!r} is not JSON: ANSWER is the whole answer as JSON"), error
    assert "truncated" not in error["message"] and "byte 0" not in error["message"]
    assert '"isConfirmed": true' in error["message"] and "nothing was sent" in error["message"]
    assert client.calls == []


@pytest.mark.parametrize(("text", "said"), [
    ("<text>", "The answer to question 'note' is still the placeholder '<text>'"),
    ("<fix|wontfix or text>",
     "The answer to question 'note' is still the placeholder '<fix|wontfix or text>'"),
])
def test_an_answer_still_holding_a_printed_placeholder_is_not_sent(
        capsys: pytest.CaptureFixture[str], client: FakeClient, text: str, said: str) -> None:
    """The answer command flow and runs print, pasted without filling in its placeholders,
    was sent: the host took "<text>" as the person's answer, for good, and the Step went on
    with it (or failed STEP_OUTCOME_NOT_HANDLED routing on "<fix|wontfix or text>")."""
    answer = json.dumps([{"questionId": "r", "isSkipped": False, "answer": "fix"},
                         {"questionId": "note", "isSkipped": False, "answer": text}])
    code, out, _ = cli(capsys, "answer", "RUN-1", "ACT-1", answer, "--json")
    assert code == 1
    error = json.loads(out)["error"]
    assert error["code"] == "INVALID_REQUEST" and said in error["message"], error
    assert "nothing was sent" in error["message"] and '"isSkipped": true' in error["message"]
    assert client.calls == []


def test_cancel_is_identical_json_and_prefixes_an_ended_run(
    capsys: pytest.CaptureFixture[str], client: FakeClient
) -> None:
    client.result = run_view("failed", "RUN_STOPPED")
    first = cli(capsys, "cancel", "RUN-1", "--json")
    client.already_ended = True
    second = cli(capsys, "cancel", "RUN-1", "--json")
    assert first == second and first[0] == 0
    code, out, _ = cli(capsys, "cancel", "RUN-1")
    assert code == 0 and out.startswith("Stopped · example")
    client.result = run_view("completed")
    code, out, _ = cli(capsys, "cancel", "RUN-1")
    assert code == 0 and out.startswith("The Run has ended; no stop is needed.\nCompleted")


def test_runs_text_and_flow_filter(capsys: pytest.CaptureFixture[str], client: FakeClient) -> None:
    code, out, _ = cli(capsys, "runs", "--flow", "example")
    assert (code, out) == (0, "The current service has no Runs of Workflow 'example'.\n")
    code, out, err = cli(capsys, "runs", "--flow", "nosuch")
    assert (code, out) == (1, "")
    assert "NOT_FOUND: Workflow 'nosuch' is not loaded by this host" in err
    client.runs_found = [run_view("waiting"), run_view("failed", "RUN_INTERRUPTED")]
    code, out, _ = cli(capsys, "runs")
    lines = out.splitlines()
    assert lines[0].startswith("RUN-1  example  waiting")
    assert "failed (RUN_INTERRUPTED)" in lines[1]
    # Then, after a blank line, what the waiting one asks (the failed one asks nothing).
    assert lines[2:] == [
        "", "RUN-1 waits on ACT-1 (confirmation):", '  {"draft":"d"}',
        '  (false declines; "feedback" is optional)',
        "  answer: intloom answer RUN-1 ACT-1 '{\"isConfirmed\":true}'",
    ]
    # The answer line holds the command alone: copied whole, it runs ("... '{...}'  (false
    # declines; ...)" was a shell syntax error).
    assert shlex.split(lines[-1].removeprefix("  answer: ")) == [
        "intloom", "answer", "RUN-1", "ACT-1", '{"isConfirmed":true}']
    assert ("runs", "example") in client.calls and ("runs", None) in client.calls
    # Runs the start held are not the host's: named below, never hidden behind "no Runs".
    client.held = ["RUN-9"]
    code, out, _ = cli(capsys, "runs")
    assert out.splitlines()[-2:] == [
        "", "Not listed, needs attention (journal kept as is, not loaded): RUN-9. Run intloom "
        "doctor."]
    client.runs_found = []
    code, out, _ = cli(capsys, "runs")
    assert out.splitlines() == [
        "The current service has no Runs.",
        "Not listed, needs attention (journal kept as is, not loaded): RUN-9. Run intloom "
        "doctor."]
    # DESIGN's document, and the held Runs beside it (a script would not see them either).
    code, out, _ = cli(capsys, "runs", "--json")
    assert json.loads(out) == {"runs": [], "needsAttention": ["RUN-9"], "needsAttentionCount": 1}
    code, out, _ = cli(capsys, "runs", "--flow", "example", "--json")
    assert json.loads(out) == {"runs": []}
    client.held = []
    code, out, _ = cli(capsys, "runs", "--json")  # none held: the document as DESIGN gives it
    assert json.loads(out) == {"runs": []}


def test_flows(capsys: pytest.CaptureFixture[str], client: FakeClient) -> None:
    code, out, _ = cli(capsys, "flows", "--json")
    assert code == 0
    assert json.loads(out)["workflows"][0]["name"] == "example"
    code, out, _ = cli(capsys, "flows")
    assert out.startswith("example  1.0.0  ready  abababababab")


def test_attach_json_waits_for_a_stable_view(
    capsys: pytest.CaptureFixture[str], client: FakeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    views = iter([run_view("running"), run_view("failed", "RUN_STOPPED")])
    monkeypatch.setattr(client, "get_run", lambda run_id: next(views))
    monkeypatch.setattr(client, "wait_run", lambda run_id: next(views))
    code, out, _ = cli(capsys, "attach", "RUN-1", "--json")
    assert code == 1
    assert json.loads(out)["run"]["lastError"]["code"] == "RUN_STOPPED"


@pytest.mark.parametrize(("phase", "expected"), [("waiting", 75), ("executing", 75),
                                              ("terminal", 1), (None, 1)])
def test_attach_at_a_run_by_its_phase_tells_suspended_from_interrupted(
    capsys: pytest.CaptureFixture[str], client: FakeClient, phase: str | None, expected: int
) -> None:
    """attach begun at a failed/RUN_INTERRUPTED Run: one its host suspended (a host whose
    log failed serves on) is not over, its ``phase`` that of its last record, and exits 75;
    one a start restored RUN_INTERRUPTED (``phase`` terminal: nothing resumes it) failed."""
    client.result = msgspec.structs.replace(run_view("failed", "RUN_INTERRUPTED"), phase=phase)
    for mode in ([], ["--json"]):
        code, out, err = cli(capsys, "attach", "RUN-1", *mode)
        assert code == expected, (mode, out, err)
        if not mode:
            assert ("Suspended · " in err) == (expected == 75), err
            assert ("Failure · CLI_RUN_FAILED" in err) == (expected == 1), err


# ----- start / stop / status / doctor / recover (lifecycle and diagnostics faked) ------------

SERVICE = ServiceView(project_root="/p", pid=42, instance_id="I-1", port=5000, started_at=T0)


@dataclass
class StartResult:
    service: ServiceView
    reused: bool
    changed: list[Any] = field(default_factory=list)


@pytest.fixture
def lifecycle(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    calls: list[tuple[Any, ...]] = []
    fake = types.ModuleType("intloom.client.lifecycle")

    def start_service(root: Path, **kwargs: Any) -> StartResult:
        calls.append(("start", root, {k: v for k, v in kwargs.items()
                                      if k not in ("progress", "slow_import", "waiting")}))
        assert callable(kwargs["progress"])
        return StartResult(SERVICE, reused=bool(kwargs.get("port") == 5000))

    def stop_service_report(root: Path, **kwargs: Any) -> StopResult:
        calls.append(("stop", root, kwargs))
        return STOPPED

    fake.start_service = start_service  # type: ignore[attr-defined]
    fake.stop_service_report = stop_service_report  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "intloom.client.lifecycle", fake)
    monkeypatch.setattr(intloom.client, "lifecycle", fake, raising=False)
    return calls


def test_start_passes_options_and_prints_service(
    capsys: pytest.CaptureFixture[str], proj: Path, lifecycle: list[tuple[Any, ...]]
) -> None:
    code, out, _ = cli(capsys, "start", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["reused"] is False
    assert {"projectRoot": "/p", "pid": 42, "instanceId": "I-1", "port": 5000}.items() <= doc[
        "service"
    ].items()
    code, out, _ = cli(capsys, "start", "--port", "5000", "--strict", "--timeout", "9")
    assert out.startswith("Reusing existing service · /p")
    assert lifecycle[0] == ("start", proj.resolve(),
                            {"port": None, "strict": False, "foreground": False})
    assert lifecycle[1][2] == {"port": 5000, "strict": True, "foreground": False, "timeout": 9.0}


STOPPED = StopResult(stopped=True, cut=[CutRun("RUN-a", "Step main/pay was running")],
                     cut_count=3)


def test_stop(capsys: pytest.CaptureFixture[str], proj: Path,
              lifecycle: list[tuple[Any, ...]]) -> None:
    code, out, _ = cli(capsys, "stop", "--json", "--timeout", "3")
    assert code == 0
    # DESIGN's two fields, and what the text says of the Runs, so that a script learns
    # which ones the next start reports RUN_INTERRUPTED.
    assert json.loads(out) == {
        "projectRoot": str(proj.resolve()), "stopped": True,
        "cut": [{"runId": "RUN-a", "evidence": "Step main/pay was running"}], "cutCount": 3,
        "lost": [], "lostCount": 0, "suspended": None, "others": 0,
        "changedSinceLoad": [], "served": True}
    assert [(op, root, {k: v for k, v in kw.items() if k != "starting"})
            for op, root, kw in lifecycle] == [("stop", proj.resolve(), {"timeout": 3.0})]
    assert callable(lifecycle[0][2]["starting"])  # told while a starting host is awaited


def test_stop_text_names_the_runs_it_cut(capsys: pytest.CaptureFixture[str], proj: Path,
                                        lifecycle: list[tuple[Any, ...]]) -> None:
    code, out, err = cli(capsys, "--debug", "stop")
    assert code == 0, err
    assert out.splitlines() == [
        "The original service instance stopped. 3 Runs still had a Step, Tool or "
        "on_complete running when the stop began that did not reach its checkpoint (the "
        "stop's grace ran out, or it was an on_complete, whose completion a stopping host "
        "never records); the next start reports them RUN_INTERRUPTED and replays nothing:",
        "  RUN-a: Step main/pay was running",
        "  ... and 2 more (intloom start lists them all).",
        "Its log does not say what the stop did to the other unfinished Runs (the log "
        "cannot be read, or its last lines were never written, as on a full disk): intloom "
        "doctor previews what the next start does with each.",
    ]


@pytest.fixture
def diagnostics(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    import intloom.diagnostics as real

    answers: dict[str, Any] = {}
    monkeypatch.setattr(real, "diagnose", lambda root: answers["diagnose"])
    monkeypatch.setattr(real, "run_doctor", lambda root: answers["doctor"])
    monkeypatch.setattr(
        real, "recover", lambda root, dry_run: {**answers["recover"], "dryRun": dry_run}
    )
    return answers


@dataclass
class Diagnosis:
    projectRoot: str  # the wire name, so plain() yields it as is
    status: str
    message: str
    owners: list[Any]
    service: ServiceView | None = None


def test_status_running_is_the_service_and_what_changed_since_it_started(
    capsys: pytest.CaptureFixture[str], proj: Path, diagnostics: dict[str, Any]
) -> None:
    diagnostics["diagnose"] = Diagnosis("/p", "running", "The service is running.", [], SERVICE)
    code, out, _ = cli(capsys, "status", "--json")
    # No host answers here for its Workflows (gone meanwhile): nothing is said of them.
    assert code == 0 and json.loads(out) == {"service": msgspec.to_builtins(SERVICE),
                                             "changedSinceStart": []}
    diagnostics["diagnose"] = Diagnosis("/p", "blocked", "Blocked.", [])
    code, out, _ = cli(capsys, "status", "--json")
    assert code == 0
    assert json.loads(out) == {"projectRoot": "/p", "status": "blocked", "message": "Blocked.",
                               "owners": [], "startProblem": None}


def test_status_offline_says_when_start_would_refuse_intloom_toml_in_text_and_json(
    capsys: pytest.CaptureFixture[str], proj: Path
) -> None:
    """The real diagnosis (read-only, no host): "offline. Run intloom start." sent people
    into start's refusal of an intloom.toml it cannot use; status says why first, and its
    JSON carries the same line (startProblem), as doctor's does."""
    config = proj / "intloom.toml"
    config.write_text('workflows = ["workflows/example.py"]\nfoo = 1\n')
    code, out, err = cli(capsys, "status")
    assert (code, err) == (0, "")
    assert (out_lines := out.splitlines()) == [
        "The service is offline. Run intloom start.",
        f"But intloom start refuses the project as it is: {config}: unknown key 'foo'. Known "
        "keys: port, workflows. Remove or rename it.",
    ]
    code, out, _ = cli(capsys, "status", "--json")  # a script is told the same
    doc = json.loads(out)
    assert code == 0 and doc["status"] == "offline"
    assert doc["startProblem"] == out_lines[1], doc
    assert sorted(p.name for p in proj.iterdir()) == ["intloom.toml"]  # nothing created
    config.write_text('workflows = ["workflows/example.py"]\n')
    assert cli(capsys, "status")[1] == "The service is offline. Run intloom start.\n"
    assert json.loads(cli(capsys, "status", "--json")[1])["startProblem"] is None


def test_status_offline_names_a_store_file_start_refuses(
    capsys: pytest.CaptureFixture[str], proj: Path
) -> None:
    """.intloom/runtime/wal/0000000001.seg a directory: start fails STORAGE_ERROR on it,
    yet status said only "offline. Run intloom start.". It names the file, the fact and the
    fix, in the words of the restore that refuses it, and changes nothing. A manifest.json
    that is a directory, or a snapshot that is a link, is not named: a start reports it as
    a damaged file and restores every Run."""
    from intloom.errors import IntloomError
    from intloom.store.reader import load
    from tests.unit.diagnostics_support import tree

    runtime = proj / ".intloom" / "runtime"
    for directory in (proj / ".intloom", runtime, runtime / "wal", runtime / "snap",
                      runtime / "snap" / "live"):
        directory.mkdir(mode=0o700)
    segment = runtime / "wal" / "0000000001.seg"
    segment.mkdir(mode=0o700)
    before = tree(proj)
    with pytest.raises(IntloomError) as start:
        load(runtime, "restore")  # what a start's restore raises on it
    assert start.value.code == "STORAGE_ERROR"
    line = f"But intloom start refuses the project as it is: {start.value.message}"
    code, out, _ = cli(capsys, "status")
    assert code == 0 and out.splitlines()[-1] == line, out
    assert f"{segment} is " in line and "move it aside" in line, line
    assert json.loads(cli(capsys, "status", "--json")[1])["startProblem"] == line
    assert tree(proj) == before
    segment.rmdir()
    (runtime / "manifest.json").mkdir(mode=0o700)
    snapshot = runtime / "snap" / "live" / f"{'a' * 64}.snap"
    snapshot.symlink_to(proj / "elsewhere.snap")
    loaded = load(runtime, "restore")
    assert sorted((f.path, f.kind) for f in loaded.files) == [
        ("manifest.json", "corrupt"), (f"snap/live/{snapshot.name}", "corrupt")]
    assert json.loads(cli(capsys, "status", "--json")[1])["startProblem"] is None
    assert snapshot.is_symlink()


def test_status_offline_names_a_saved_port_another_process_holds(
    capsys: pytest.CaptureFixture[str], proj: Path
) -> None:
    """The port saved in connection.json taken by another program: start fails on it
    (CLI_SERVICE_UNAVAILABLE, "could not listen"), yet status said "Run intloom start". It
    names the port, who holds it and the way out, as doctor's connection check does; and an
    invalid connection.json, which start refuses, likewise."""
    import os
    import socket

    from intloom.diagnostics.doctor import start_problem
    from intloom.host.metadata import METADATA_VERSION, Connection, write_connection
    from tests.unit.diagnostics_support import tree

    (proj / ".intloom").mkdir(mode=0o700)
    saved = proj / ".intloom" / "connection.json"
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        write_connection(saved, Connection(version=METADATA_VERSION, project_root=str(proj),
                                           port=port, token="t" * 43))
        before = tree(proj)
        code, out, _ = cli(capsys, "status")
        assert code == 0 and out.splitlines()[0].startswith("The service is offline"), out
        line = out.splitlines()[-1]
        assert line.startswith(
            f"But port {port} on 127.0.0.1 (the port saved in connection.json), where the next "
            f"intloom start would listen, is in use by another process (pid {os.getpid()} "), line
        assert line.endswith("that start fails. Stop that process, or run intloom start --port "
                             "0 to pick a new port (saved in connection.json; clients using the "
                             "old one must be told), then run intloom doctor again."), line
        assert json.loads(cli(capsys, "status", "--json")[1])["startProblem"] == line
        assert tree(proj) == before  # nothing created or changed
    assert json.loads(cli(capsys, "status", "--json")[1])["startProblem"] is None  # freed
    saved.write_text("{")  # status refuses it itself (CLI_SERVICE_METADATA_INVALID); doctor
    said = start_problem(proj)  # runs this while it is offline
    assert said is not None and said.startswith(
        f"But intloom start refuses the project as it is: {saved} is not valid metadata"), said


@pytest.mark.parametrize(("health", "code"), [("healthy", 0), ("attention", 3), ("blocked", 4)])
def test_doctor_exit_code_follows_health(
    capsys: pytest.CaptureFixture[str], proj: Path, diagnostics: dict[str, Any],
    health: str, code: int,
) -> None:
    diagnostics["doctor"] = {"status": "offline", "message": "m", "owners": [], "health": health,
                             "checks": [{"id": "config", "status": "ok", "message": "fine",
                                         "next": None}], "runs": []}
    exit_code, out, _ = cli(capsys, "doctor", "--json")
    assert exit_code == code and json.loads(out)["health"] == health
    exit_code, out, _ = cli(capsys, "doctor")
    assert exit_code == code and "config · ok: fine" in out


def test_recover_dry_run(
    capsys: pytest.CaptureFixture[str], proj: Path, diagnostics: dict[str, Any]
) -> None:
    diagnostics["recover"] = {"projectRoot": "/p", "recovered": False,
                              "paths": [".intloom/service.lock"]}
    code, out, _ = cli(capsys, "recover", "--dry-run")
    assert (code, out) == (0, "Recovery plan: .intloom/service.lock. No cleanup performed.\n")


def test_a_suggestion_for_an_unknown_command_ends_with_one_question_mark(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = cli(capsys, "log")
    assert (code, out) == (2, "")
    assert "Did you mean 'logs'? Run intloom --help for the usage." in err, err
    assert "?." not in err


@pytest.mark.parametrize(("args", "where"), [
    (["runs", "--flow"], "intloom runs"),
    (["start", "--port"], "intloom start"),
    (["flow", "example", "--intent"], "intloom flow"),
    (["--project"], "intloom"),
])
def test_an_option_missing_its_value_points_to_its_command_help(
    capsys: pytest.CaptureFixture[str], args: list[str], where: str,
) -> None:
    """``intloom runs --flow`` said "Run intloom --help for the usage", whose page does not
    describe --flow: the command's own help does."""
    code, out, err = cli(capsys, *args)
    assert (code, out) == (2, "")
    assert f"requires an argument. Run {where} --help for the usage." in err, err


# ----- inspect: a Run whose log records are gone ---------------------------------------------


def test_inspect_shows_a_run_whose_log_records_are_gone_as_damage_not_unknown(
    capsys: pytest.CaptureFixture[str], proj: Path
) -> None:
    """The segment holding every record of two Runs is cut back to its header; their
    snapshots remain. inspect shows what the snapshot says and that the records are missing
    (not "check the Run id"), for an unfinished and an ended Run alike."""
    from tests.unit.test_store_support import frames_of, open_store, walk

    (proj / ".intloom").mkdir(mode=0o700)
    runtime = proj / ".intloom" / "runtime"
    store = open_store(runtime)
    for run_id, records in (("RUN-A", walk("RUN-A", 8, 1)),
                            ("RUN-E", walk("RUN-E", 6, 2, terminal=True))):
        for record in records:
            store.append(run_id, record)
    store.sync_blocking()
    store.close_blocking()
    segment = runtime / "wal" / "0000000001.seg"
    header_end = frames_of(segment, "RUN-A")[0].offset
    with segment.open("r+b") as fh:
        fh.truncate(header_end)
    for run_id, seq, phase in (("RUN-A", 8, None), ("RUN-E", 6, "terminal")):
        code, out, _ = cli(capsys, "inspect", run_id, "--json")
        assert code == 0, out
        doc = json.loads(out)
        assert doc["run"]["verdict"] == "corrupt"
        assert f"records 1..{seq} are missing from the log" in doc["run"]["problem"]
        [entry] = doc["records"]
        assert entry["verdict"] == "snapshot" and entry["seq"] == seq
        if phase is not None:
            assert doc["run"]["phase"] == phase
    code, out, _ = cli(capsys, "inspect", "RUN-NOBODY", "--json")
    assert code != 0 and "NOT_FOUND" in out


def test_inspect_reports_a_damaged_done_snapshot_and_a_stray_file_in_done(
    capsys: pytest.CaptureFixture[str], proj: Path
) -> None:
    """doctor and start never read snap/done/, and docs/recovery.md sends the user to inspect
    for what is wrong there; inspect said "journal ok" and nothing else. It now lists the
    whole-file findings of its full read, and keeps the files byte-identical."""
    from intloom.store.snapshots import snapshot_name
    from tests.unit.test_store_support import open_store, walk

    (proj / ".intloom").mkdir(mode=0o700)
    runtime = proj / ".intloom" / "runtime"
    store = open_store(runtime)
    for record in walk("RUN-E", 6, 2, terminal=True):
        store.append("RUN-E", record)
    store.sync_blocking()
    store.close_blocking()
    done = runtime / "snap" / "done" / snapshot_name("RUN-E")
    data = bytearray(done.read_bytes())
    data[-3] ^= 0xFF
    done.write_bytes(bytes(data))
    stray = runtime / "snap" / "done" / "notes.txt"
    stray.write_bytes(b"x")
    stray.chmod(0o600)
    code, out, _ = cli(capsys, "inspect", "RUN-E", "--json")
    assert code == 0, out
    files = {f["path"]: f["kind"] for f in json.loads(out)["files"]}
    assert files == {f"snap/done/{done.name}": "corrupt", "snap/done/notes.txt": "unexpected"}
    code, out, _ = cli(capsys, "inspect", "RUN-E")
    assert f"File snap/done/{done.name} is corrupt" in out
    assert done.read_bytes() == bytes(data) and stray.read_bytes() == b"x"


def test_inspect_of_a_run_whose_only_segment_is_gone_names_the_missing_segment(
    capsys: pytest.CaptureFixture[str], proj: Path
) -> None:
    """A host was killed and the segment it was writing, the only one holding RUN-A, was
    deleted. inspect said only "Check the Run id", which is right; it now names the missing
    segment (as doctor does) and the way back: a copy of it."""
    from tests.unit.test_store_support import abandon, open_store, walk

    (proj / ".intloom").mkdir(mode=0o700)
    runtime = proj / ".intloom" / "runtime"
    store = open_store(runtime)
    for record in walk("RUN-A", 6, 1):
        store.append("RUN-A", record)
    store.sync_blocking()
    abandon(store)
    (runtime / "wal" / "0000000001.seg").unlink()
    code, out, _ = cli(capsys, "inspect", "RUN-A", "--json")
    error = json.loads(out)["error"]
    assert code == 1 and error["code"] == "NOT_FOUND", out
    assert "wal/0000000001.seg is missing" in error["message"], error
    assert "back from a copy" in error["message"]


def test_inspect_of_a_run_whose_only_trace_is_its_damaged_snapshot_names_that_file(
    capsys: pytest.CaptureFixture[str], proj: Path
) -> None:
    """RUN-A's records gone from the log (its old segment moved out) and its snapshot
    damaged: doctor named the file as the Run's only trace, inspect RUN-A said "Check the
    Run id", which was right, and named no file. It names the snapshot and what is wrong."""
    from intloom.store.snapshots import snapshot_name
    from tests.unit.test_store_support import open_store, walk

    (proj / ".intloom").mkdir(mode=0o700)
    runtime = proj / ".intloom" / "runtime"
    store = open_store(runtime)
    for record in walk("RUN-A", 3, 1):
        store.append("RUN-A", record)
    store.sync_blocking()
    store.close_blocking()  # RUN-A's snapshot written
    snap = runtime / "snap" / "live" / snapshot_name("RUN-A")
    data = bytearray(snap.read_bytes())
    data[len(data) // 2] ^= 0xFF
    snap.write_bytes(bytes(data))
    (runtime / "wal" / "0000000001.seg").unlink()
    code, out, _ = cli(capsys, "inspect", "RUN-A", "--json")
    error = json.loads(out)["error"]
    assert code == 1 and error["code"] == "NOT_FOUND", out
    assert (f"its snapshot snap/live/{snapshot_name('RUN-A')} fails its checksum. That file is "
            "its only trace, kept as it is") in error["message"], error
    assert "Check the Run id" not in error["message"], error
    assert snap.read_bytes() == bytes(data)


def test_inspect_does_not_call_an_effect_in_flight_when_the_run_went_on_past_the_damage(
    capsys: pytest.CaptureFixture[str], proj: Path
) -> None:
    """One flipped byte in an effect's ``effect_done``: the fold stops there, at
    effect_started, but the Run's later records (its result, the next Step) are readable. The
    effect is not shown in flight: the Run went on past it, and inspect says so."""
    from intloom.runtime.records import (
        EffectDone,
        EffectStarted,
        Executing,
        Record,
        StagePending,
        StepReady,
        StepResult,
    )
    from tests.unit.test_store_support import abandon, frames_of, header, open_store

    (proj / ".intloom").mkdir(mode=0o700)
    runtime = proj / ".intloom" / "runtime"
    records: list[Record] = [
        header("RUN-D"), StagePending(at="t1", stage="draft"),
        StepReady(at="t2", stage="draft", step="s1", state=b"{}"),
        Executing(at="t3", stage="draft", step="s1"),
        EffectStarted(at="t4", name="compose", key="compose#1"),
        EffectDone(at="t5", name="compose", key="compose#1", result="done"),
        StepResult(at="t6", stage="draft", step="s1", outcome="ok", state=b"{}"),
    ]
    store = open_store(runtime)
    for record in records:
        store.append("RUN-D", record)
    store.sync_blocking()
    abandon(store)  # a crash: no snapshot covers the records
    segment = runtime / "wal" / "0000000001.seg"
    done = frames_of(segment, "RUN-D")[5]
    data = bytearray(segment.read_bytes())
    data[done.end - 3] ^= 0xFF
    segment.write_bytes(bytes(data))

    code, out, _ = cli(capsys, "inspect", "RUN-D", "--json")
    assert code == 0, out
    run = json.loads(out)["run"]
    assert run["verdict"] == "corrupt" and run["phase"] == "effect_started"
    assert "effectInFlight" not in run, run
    assert run["wentOn"] == {"seq": 7, "phase": "step_result"}
    code, out, _ = cli(capsys, "inspect", "RUN-D")
    assert code == 0
    assert "In flight" not in out
    assert "Readable records follow the damage (the last: record 7, step_result)" in out



# ----- logs ----------------------------------------------------------------------------------


def test_logs_for_a_run_include_host_records_naming_it_and_show_a_torn_last_line(
    capsys: pytest.CaptureFixture[str], proj: Path
) -> None:
    """``logs RUN`` kept only records with a top-level runId, so the stop's record of what it
    cut (``runs_cut_at_stop``: runs=[{runId, evidence}]) was left out; a crashed host's last
    line, with no newline, was never shown; text printed Python's None and False."""
    logs = proj / ".intloom" / "logs"
    logs.mkdir(parents=True, mode=0o700)
    lines = [
        {"ts": "T1", "level": "info", "event": "run_created", "runId": "RUN-1", "port": None},
        {"ts": "T2", "level": "warning", "event": "runs_cut_at_stop", "count": 1,
         "runs": [{"runId": "RUN-1", "evidence": "Tool call t5 was running"}]},
        {"ts": "T3", "level": "info", "event": "run_created", "runId": "RUN-2",
         "strict": False},
    ]
    text = "".join(json.dumps(line) + "\n" for line in lines)
    text += '{"ts": "T4", "level": "error", "event": "process_failed", "runId": "RUN-1"'
    (logs / "LOG-20260101T000000000Z.jsonl").write_text(text)
    code, out, _ = cli(capsys, "logs", "RUN-1")
    assert code == 0
    shown = out.splitlines()
    assert shown[0] == "T1 info    run_created runId=RUN-1 port=null"
    assert shown[1].startswith("T2 warning runs_cut_at_stop count=1 runs=[") and (
        "Tool call t5 was running" in shown[1])
    at = len(text) - len(text.rsplit("\n", 1)[1])
    assert shown[2].startswith("- ????? unreadable log line (.intloom/logs/"
                               f"LOG-20260101T000000000Z.jsonl at byte {at}): ") and (
        "process_failed" in shown[2])
    assert len(shown) == 3
    code, out, err = cli(capsys, "logs", "--all", "RUN-9")
    assert code == 0 and out == ""
    assert "No log records about RUN-9 in any log." in err and "--all" not in err
    code, out, err = cli(capsys, "logs", "RUN-9")
    assert "in the newest log (try --all" in err


def test_logs_say_the_newest_log_is_empty_rather_than_print_nothing(
    capsys: pytest.CaptureFixture[str], proj: Path
) -> None:
    """A host killed between creating its log and writing its first line leaves an empty
    LOG file; ``intloom logs`` printed nothing and said nothing, as if it had failed."""
    logs = proj / ".intloom" / "logs"
    logs.mkdir(parents=True, mode=0o700)
    older = {"ts": "T1", "level": "info", "event": "log_opened"}
    (logs / "LOG-20260101T000000000Z.jsonl").write_text(json.dumps(older) + "\n")
    (logs / "LOG-20260102T000000000Z.jsonl").write_text("")
    code, out, err = cli(capsys, "logs")
    assert code == 0 and out == ""
    assert ("The newest log, LOG-20260102T000000000Z.jsonl, has no record yet: its host "
            "wrote none (it ended, or was killed, as it started). intloom logs --all shows "
            "the earlier hosts' logs.") in " ".join(err.split()), err
    code, out, err = cli(capsys, "logs", "--all")
    assert code == 0 and "log_opened" in out and "has no record yet" not in err


def test_logs_keep_a_line_that_is_not_utf8_exactly_and_mark_it(
    capsys: pytest.CaptureFixture[str], proj: Path
) -> None:
    """A log line holding bytes that are not UTF-8 (damage, another writer) reached
    ``logs --json`` with each such byte replaced by U+FFFD, unmarked: the line as it is in
    the file was lost. It is still shown with U+FFFD (every JSON reader takes it), marked by
    an added ``lineBase64``, its bytes as they are; text shows each such byte's escape."""
    import base64

    logs = proj / ".intloom" / "logs"
    logs.mkdir(parents=True, mode=0o700)
    good = b'{"time":"T1","level":"info","event":"run_created","runId":"RUN-1"}'
    bad = b'{"time":"T2","level":"error","event":"run_failed","runId":"RUN-1","m":"a\xffb"}'
    torn = b'{"time":"T3","runId":"RUN-1","ev\xfe'
    (logs / "LOG-20260101T000000000Z.jsonl").write_bytes(b"\n".join([good, bad, torn, b""]))
    code, out, _ = cli(capsys, "logs", "--json", "RUN-1")
    assert code == 0
    shown = [json.loads(line) for line in out.splitlines()]
    assert out.splitlines()[0] == good.decode()  # a UTF-8 line is passed on unchanged
    assert shown[1] == {**json.loads(bad.decode("utf-8", "replace")),
                        "lineBase64": base64.b64encode(bad).decode()}, shown[1]
    assert shown[1]["m"] == "a\ufffdb"
    assert shown[2] == {"time": None, "level": "error", "event": "unreadable_line",
                        "line": '{"time":"T3","runId":"RUN-1","ev\ufffd',
                        "lineBase64": base64.b64encode(torn).decode(),
                        "file": ".intloom/logs/LOG-20260101T000000000Z.jsonl",
                        "offset": len(good) + len(bad) + 2}, shown[2]
    assert len(shown) == 3
    code, out, _ = cli(capsys, "logs", "RUN-1")
    assert out.splitlines()[1:] == ["T2 error   run_failed runId=RUN-1 m=a\\udcffb",
                                    "- ????? unreadable log line (.intloom/logs/LOG-20260101T"
                                    f"000000000Z.jsonl at byte {len(good) + len(bad) + 2}): "
                                    '{"time":"T3","runId":"RUN-1",'
                                    '"ev\\udcfe'], out


@pytest.mark.parametrize(("result", "expected"), [
    (dict(suspended=0), ["The original service instance stopped. No Run was unfinished."]),
    (dict(suspended=1), [
        "The original service instance stopped. 1 unfinished Run was suspended at its last "
        "checkpoint; committed data is retained. Run intloom start to resume it."]),
    (dict(suspended=3, lost=[("RUN-w", "Stage 'a', Step 'b' waits with no recover")],
          lost_count=1), [
        "The original service instance stopped. 1 Run waits on what the next start cannot "
        "restore (a question or confirmation whose Step has no recover, or that recover "
        "asked after running an effect, or a task for a client Agent); it reports it "
        "RUN_INTERRUPTED:",
        "  RUN-w: Stage 'a', Step 'b' waits with no recover",
        "2 other unfinished Runs were suspended at their last checkpoint; committed data is "
        "retained. Run intloom start to resume them."]),
    (dict(suspended=2, cut=[("RUN-c", "Step main/pay was running")], cut_count=1,
          lost=[("RUN-w", "an Agent task")], lost_count=1), [
        "The original service instance stopped. 1 Run still had a Step, Tool or on_complete "
        "running when the stop began that did not reach its checkpoint (the stop's grace ran "
        "out, or it was an on_complete, whose completion a stopping host never records); the "
        "next start reports it RUN_INTERRUPTED and replays nothing:",
        "  RUN-c: Step main/pay was running",
        "1 Run waits on what the next start cannot restore (a question or confirmation whose "
        "Step has no recover, or that recover asked after running an effect, or a task for a "
        "client Agent); it reports it RUN_INTERRUPTED:",
        "  RUN-w: an Agent task"]),
    (dict(suspended=1, others=2), [
        "The original service instance stopped. 1 unfinished Run was suspended at its last "
        "checkpoint; committed data is retained. Run intloom start to resume it.",
        "2 Runs stay unfinished as this host found or left them (interrupted earlier and not "
        "dismissed, held, or failed by a checkpoint): the next start reports them again "
        "(intloom doctor previews it)."]),
    (dict(), [  # an older host, or a log that cannot be read: nothing is counted
        "The original service instance stopped. Its log does not say what the stop did to "
        "the unfinished Runs (the log cannot be read, or its last lines were never written, "
        "as on a full disk): intloom doctor previews what the next start does with each."]),
])
def test_stop_text_says_what_the_next_start_does_with_the_runs(
    result: dict[str, Any], expected: list[str],
) -> None:
    """It said "Unfinished Runs were suspended ... Run intloom start to resume them" with no
    Run at all, and for waits the next start reports RUN_INTERRUPTED."""
    from intloom.cli.commands.service import stop_lines

    cut = [CutRun(*pair) for pair in result.pop("cut", [])]
    lost = [CutRun(*pair) for pair in result.pop("lost", [])]
    assert stop_lines(StopResult(stopped=True, cut=cut, lost=lost, **result)) == expected


@pytest.mark.parametrize(("argv", "fix"), [
    (["flow", "example", "some intent"],
     "The intent is an option: give it as --intent 'some intent'."),
    (["flow", "example", "release", "notes"],  # unquoted words: one intent, quoted
     "The intent is an option: give it as --intent 'release notes'."),
    (["flow", "example", "--intent", "x", "more"],
     "flow takes one WORKFLOW; an intent of several words is one quoted value: "
     "--intent 'x more'."),
    (["flow", "example", "--intent-file", "f.txt", "more"],
     "flow takes one WORKFLOW, and the intent comes from --intent-file; leave out more."),
])
def test_flow_with_a_positional_intent_names_the_intent_option(
    capsys: pytest.CaptureFixture[str], client: FakeClient, argv: list[str], fix: str
) -> None:
    code, out, err = cli(capsys, *argv)
    assert (code, out) == (2, "")
    assert fix in err, err
    assert err.endswith("Run intloom flow --help for the usage.\n"), err
    assert client.calls == []
    code, out, _ = cli(capsys, *argv, "--json")
    assert code == 2 and fix in json.loads(out)["error"]["message"]


@pytest.mark.parametrize(("args", "fix"), [
    (["--timeout", "5", "stop"], "--timeout is an option of intloom stop"),
    (["--port=5000", "start", "--json"], "--port is an option of intloom start"),
    (["--strict", "start"], "--strict is an option of intloom start"),
    (["-f", "logs"], "-f is an option of intloom logs"),
])
def test_a_commands_option_given_before_the_command_says_where_it_goes(
    capsys: pytest.CaptureFixture[str], args: list[str], fix: str,
) -> None:
    """``intloom --port 5000 start`` said "No such option: --port (Possible options:
    --project). Run intloom --help", whose page has no --port: nothing said that it is
    start's option, to be given after ``start``."""
    code, out, err = cli(capsys, *args)
    assert code == 2
    message = json.loads(out)["error"]["message"] if "--json" in args else err
    command = fix.rsplit(" ", 1)[1]
    option = fix.split(" ", 1)[0]
    assert f"{fix}, not of intloom: give it after the command" in message, message
    assert f"Run intloom {command} --help for the usage." in message, message
    assert "Possible options" not in message, message
    assert option in message.split("command", 1)[1], message  # the line to type shows it


def test_version_after_a_command_says_it_goes_before(capsys: pytest.CaptureFixture[str]) -> None:
    """``intloom runs --version`` said "No such option: --version (Possible options:
    --json)": --version is the root's alone (docs/cli.md), which nothing said."""
    code, out, err = cli(capsys, "runs", "--version")
    assert (code, out) == (2, "")
    assert ("--version is an option of intloom, not of intloom runs: give it before the "
            "command: intloom --version. Run intloom --help for the usage.") in err, err


@pytest.mark.parametrize("argv", [["flow", "example", "--intent", "--json"],
                                  ["--project", "--json", "flow", "example", "--intent", "x"]])
def test_json_spelled_as_an_options_value_is_that_value_not_json_mode(
    capsys: pytest.CaptureFixture[str], client: FakeClient, argv: list[str],
) -> None:
    """Click reads ``--intent --json`` as the intent "--json", and the command runs in text
    mode, but the output was JSON: the scan for --json did not skip options' values, as
    ``--intent=--json`` (text) does."""
    code, out, err = cli(capsys, *argv)
    if argv[0] == "flow":  # the Run is created with that intent, and shown as text
        assert code == 0 and out.startswith("Waiting for an answer"), out
        assert ("create_run", "example", "--json", False) in client.calls
    else:  # the project "--json" does not exist: said as text on stderr
        assert (code, out) == (1, "")
        assert err.startswith("Failure · CLI_PROJECT_INVALID: "), err


# ----- commands to copy, printed for another project than the working directory's ------------


def _where_line(err: str) -> str | None:
    lines = [line for line in err.splitlines() if line.startswith("The intloom commands above")]
    return lines[0] if lines else None


@pytest.mark.parametrize("here_is_a_project", [False, True])
def test_commands_printed_for_another_project_reach_it(
    capsys: pytest.CaptureFixture[str], client: FakeClient, proj: Path,
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
    here_is_a_project: bool,
) -> None:
    """``intloom answer RUN ...`` copied into a shell in another directory ran against that
    directory's project (NOT_FOUND, or a stop or cancel of the wrong one). The Run's own
    command lines carry --project; a message with a command in its prose (the host's, which
    cannot know this directory) is followed by a line naming the project and the --project."""
    here = tmp_path_factory.mktemp("elsewhere with space")
    if here_is_a_project:
        (here / "intloom.toml").write_text("workflows = []\n")
    monkeypatch.chdir(here)
    code, out, err = cli(capsys, "--project", str(proj), "flow", "example", "--intent", "n")
    assert code == 0
    root = shlex.quote(str(proj.resolve()))
    assert f"Answer  intloom --project {root} answer RUN-1 ACT-1 '{{" in out, out
    assert f"Resume  intloom --project {root} attach RUN-1\n" in out, out
    assert _where_line(err) is None, err  # nothing printed that needs it
    client.runs_found = [run_view()]
    code, out, _ = cli(capsys, "runs", "--project", str(proj))
    assert code == 0 and f"  answer: intloom --project {root} answer RUN-1 ACT-1 '" in out, out

    def missing(run_id: str) -> tuple[RunView, bool]:
        raise IntloomError("NOT_FOUND", f"Run {run_id} does not exist. intloom runs lists "
                           "the Runs.")

    monkeypatch.setattr(client, "cancel", missing)
    code, _, err = cli(capsys, "cancel", "RUN-9", "--project", str(proj))
    assert code == 1
    there = (f"the project at {shlex.quote(str(here.resolve()))}" if here_is_a_project
             else "no project (the working directory is in none)")
    where = (f"The intloom commands above are for {root}; run from here they would act on "
             f"{there}. Run them from {root}, or add --project {root} to them.")
    assert err.splitlines()[-1] == where and err.count(where) == 1, err  # once, last
    # Refused before the command looked for its project (an ANSWER that is not JSON), its
    # message naming intloom runs: the line was left out.
    code, _, err = cli(capsys, "--project", str(proj), "answer", "RUN-1", "ACT-1", "notjson")
    assert code == 1 and "intloom runs prints the command" in err, err
    assert err.splitlines()[-1] == where, err


def test_commands_printed_for_the_working_directorys_project_stay_as_they_are(
    capsys: pytest.CaptureFixture[str], client: FakeClient, proj: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The usual case keeps its hints short: no line when the working directory (a
    subdirectory too) resolves to the same root, in JSON mode, or with no command printed."""
    (proj / "workflows").mkdir()
    monkeypatch.chdir(proj / "workflows")
    for argv in (["flow", "example", "--intent", "n"],
                 ["--project", str(proj), "flow", "example", "--intent", "n"]):
        code, out, err = cli(capsys, *argv)
        assert code == 0 and "Answer  intloom answer RUN-1" in out, out
        assert _where_line(err) is None
    monkeypatch.chdir(proj.parent)
    code, out, err = cli(capsys, "--project", str(proj), "--json", "flow", "example",
                         "--intent", "n")
    assert code == 0 and err == ""
    json.loads(out)
    client.result = run_view("completed")
    code, out, err = cli(capsys, "--project", str(proj), "flow", "example", "--intent", "n")
    assert code == 0 and "intloom" not in out + err


def test_a_line_logs_encodes_again_escapes_unicode_line_breaks(
    capsys: pytest.CaptureFixture[str], proj: Path
) -> None:
    """A line with bytes that are not UTF-8 is encoded again for ``--json``; U+2028 in it
    came out raw, where the host writes ``\\u2028``: a reader that splits on Unicode line
    breaks took that one record for two."""
    logs = proj / ".intloom" / "logs"
    logs.mkdir(parents=True, mode=0o700)
    bad = (b'{"time":"T2","level":"error","event":"run_failed","runId":"RUN-1",'
           b'"m":"a\\u2028b"}')
    bad = bad.replace(b"\\u2028", "\u2028".encode()) + b"\xff"  # raw U+2028, then damage
    (logs / "LOG-20260101T000000000Z.jsonl").write_bytes(bad + b"\n")
    code, out, _ = cli(capsys, "logs", "--json", "RUN-1")
    assert code == 0
    assert "\u2028" not in out and "\\u2028" in out, out
    assert len(out.splitlines()) == 1 and len(out.split("\n")) == 2, out
