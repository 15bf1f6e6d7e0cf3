"""The renderer and the exit-code map: what the CLI prints and returns, without a host."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest

from intloom.cli import exit_codes, render
from intloom.cli.render import Renderer
from intloom.errors import IntloomError, error_view, starting_message

RUN: dict[str, Any] = {
    "runId": "RUN-1",
    "flowName": "example",
    "cursor": {"stage": "draft", "step": "review"},
    "status": "waiting",
    "createdAt": "2026-01-01T00:00:00.000Z",
    "updatedAt": "2026-01-01T00:00:01.000Z",
    "pendingAction": {"id": "ACT-1", "kind": "user_ask_confirmation", "request": {"context": {}}},
}


def test_every_known_error_exits_failure_and_the_rest_are_distinct() -> None:
    assert exit_codes.for_exception(IntloomError("CONFLICT")) == exit_codes.FAILURE == 1
    assert exit_codes.for_exception(RuntimeError("bug")) == exit_codes.INTERNAL
    assert exit_codes.for_exception(IntloomError("CLI_INTERNAL_ERROR")) == exit_codes.INTERNAL
    assert exit_codes.for_exception(KeyboardInterrupt()) == exit_codes.INTERRUPTED
    codes = {
        exit_codes.OK, exit_codes.FAILURE, exit_codes.USAGE, exit_codes.DOCTOR_ATTENTION,
        exit_codes.DOCTOR_BLOCKED, exit_codes.INTERNAL, exit_codes.INTERRUPTED,
        exit_codes.TERMINATED,
    }
    assert len(codes) == 8


@pytest.mark.parametrize(
    ("report", "code"),
    [
        ({"health": "healthy", "status": "blocked"}, exit_codes.OK),  # explicit health wins
        ({"health": "attention"}, exit_codes.DOCTOR_ATTENTION),
        ({"health": "blocked"}, exit_codes.DOCTOR_BLOCKED),
        ({"status": "offline", "checks": [{"status": "ok"}, {"status": "not_checked"}]}, 0),
        ({"status": "offline", "checks": [{"status": "attention"}]}, exit_codes.DOCTOR_ATTENTION),
        ({"status": "recovery_required", "checks": []}, exit_codes.DOCTOR_ATTENTION),
        ({"status": "blocked", "checks": []}, exit_codes.DOCTOR_BLOCKED),
    ],
)
def test_doctor_exit_codes(report: dict[str, Any], code: int) -> None:
    assert exit_codes.for_doctor(report) == code


def test_run_status_exit_codes() -> None:
    assert [exit_codes.for_run_status(s) for s in ("running", "waiting", "completed")] == [0] * 3
    assert exit_codes.for_run_status("failed") == exit_codes.RUN_FAILED == 1
    # Suspended by its host: not ended, so not a failed Run's 1 (docs/cli.md, Exit codes).
    assert exit_codes.for_run_status("failed", suspended=True) == exit_codes.RUN_SUSPENDED == 75
    assert exit_codes.for_run_status("waiting", suspended=True) == 0


def test_every_exit_code_is_in_the_docs_table() -> None:
    from tests.helpers import REPO

    text = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    table = text.split("\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    for name in exit_codes.__all__:
        value = getattr(exit_codes, name)
        if isinstance(value, int):
            assert f"| {value} | `{name}` |" in table, name


def test_error_in_text_mode_is_one_line_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    Renderer(json_mode=False).error(error_view("NOT_FOUND", "No Run RUN-9."))
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "Failure · NOT_FOUND: No Run RUN-9.\n"


def test_error_in_json_mode_always_carries_retryable(capsys: pytest.CaptureFixture[str]) -> None:
    Renderer(json_mode=True).error(error_view("CONFLICT"))
    out, err = capsys.readouterr()
    assert err == ""
    assert json.loads(out) == {
        "error": {
            "code": "CONFLICT",
            "message": "The request conflicts with the current state.",
            "retryable": False,
        }
    }


def test_an_error_after_the_json_document_goes_to_stderr(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``start --foreground --json`` prints its start result once the host serves; a host
    that then stops on its own printed its error as a second document on stdout."""
    renderer = Renderer(json_mode=True)
    renderer.result({"service": {"pid": 1}, "reused": False}, lambda: [])
    renderer.error(error_view("STORAGE_ERROR", "It moved."))
    out, err = capsys.readouterr()
    assert json.loads(out) == {"service": {"pid": 1}, "reused": False}
    assert json.loads(err) == {"error": {"code": "STORAGE_ERROR", "message": "It moved.",
                                         "retryable": False}}


def test_table_is_plain_aligned_text_when_not_a_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    Renderer().table(["A", "B"], [["x", "1"], ["long", "2"]])
    out = capsys.readouterr().out
    assert out == "x     1\nlong  2\n"
    assert "\x1b" not in out


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_no_color_disables_rich_even_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdout", _Tty())
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert Renderer().rich_out
    assert not Renderer(json_mode=True).rich_out
    monkeypatch.setenv("NO_COLOR", "1")
    assert not Renderer().rich_out


def test_run_titles_follow_the_status() -> None:
    assert render.run_title(RUN) == "Waiting for an answer"
    assert render.run_title({**RUN, "status": "running"}) == "Running"
    assert render.run_title({**RUN, "status": "completed"}) == "Completed"
    stopped = {**RUN, "status": "failed", "lastError": {"code": "RUN_STOPPED", "message": ""}}
    assert render.run_title(stopped) == "Stopped"
    failed = {**RUN, "status": "failed", "lastError": {"code": "RUN_INTERRUPTED", "message": "m"}}
    assert render.run_title(failed) == "Execution failed"
    assert "RUN_INTERRUPTED: m" in render.run_lines(failed)
    # Its host suspended it (attach saw the stream end with ``suspended``): not an end. The
    # title stays IntLoom's (its titles are the reference's); the lines say what happened.
    lines = render.run_lines(failed, suspended=True)
    assert lines[0] == "Execution failed · example" and "RUN_INTERRUPTED: m" in lines
    assert any("not ended" in x and "next intloom start restores the Run" in x
               and "intloom attach RUN-1" in x for x in lines), lines
    assert not any("Inspect the results before running again" in x for x in lines)
    dismissed = {**failed, "dismissed": True}
    assert render.run_title(dismissed) == "Dismissed"
    assert render.run_lines(dismissed, suspended=True)[0] == "Dismissed · example"
    lines = render.run_lines(dismissed)
    assert "RUN_INTERRUPTED: m" in lines
    assert any("does not come back" in x and "intloom inspect" in x for x in lines)
    assert not any("Inspect the results before running again" in x for x in lines)
    agent = {**RUN, "pendingAction": None, "pendingAgentCall": {"id": "C", "agentId": "a"}}
    assert render.run_title(agent) == "Waiting for the client Agent"


def test_a_run_waiting_on_an_agent_shows_the_task_its_tools_and_what_comes_next() -> None:
    """flow, attach and answer printed only "Agent default · task CALL-... · available" for
    a Run waiting on a client Agent: not what was published (a confirmation shows its
    context), nor its Tools, nor what to do next (a person's wait has its answer command)."""
    agent = {**RUN, "pendingAction": None, "pendingAgentCall": {
        "id": "CALL-1", "agentId": "default", "phase": "available",
        "request": {"ticket": "login broken"}, "tools": ["lookup", "search"]}}
    lines = render.run_lines(agent)
    assert lines[-5:] == [
        "Agent   default · task CALL-1 · available",
        'Task    {"ticket":"login broken"}',
        "Tools   lookup, search",
        "Follow  intloom attach RUN-1",  # the command alone: copied whole, it runs
        "        a client Agent claims and completes the task through intloom.client.Client",
    ]
    long = {**agent, "pendingAgentCall": {**agent["pendingAgentCall"], "tools": [],
                                          "request": {"text": "x" * 400}}}
    task = [x for x in render.run_lines(long) if x.startswith("Task")]
    assert task[0].endswith("... (--json shows all of it)") and len(task[0]) < 360
    assert not any(x.startswith("Tools") for x in render.run_lines(long))


def test_waiting_run_says_how_to_resume() -> None:
    lines = render.run_lines(RUN)
    assert lines[0] == "Waiting for an answer · example"
    assert "Action  ACT-1 (confirmation)" in lines
    assert "Resume  intloom attach RUN-1" in lines


def test_restore_lines_name_interrupted_runs() -> None:
    lines = render.restore_lines({"resumed": ["RUN-a"], "interrupted": ["RUN-b"]})
    assert lines[0] == "Restore  resumed 1 · waiting 0 · interrupted 1 · needs attention 0"
    assert "RUN-b" in lines[1]
    # One Run interrupted: the command to see it names it, ready to paste.
    assert lines[1].endswith("Run intloom inspect RUN-b to see what was in flight."), lines
    two = render.restore_lines({"interrupted": ["RUN-b", "RUN-c"]})
    assert two[1].endswith("Run intloom inspect RUN to see what was in flight."), two
    assert render.restore_lines(None) == []


def test_restore_lines_say_why_runs_are_held_by_reason() -> None:
    one = render.restore_lines({"needsAttention": ["RUN-a", "RUN-b"],
                                "reasons": {"RUN-a": "changed", "RUN-b": "changed"}})
    assert one[1:] == ["Needs attention (journal kept as is, not loaded): RUN-a, RUN-b. "
                       "Run intloom doctor.", "  Why: changed."], one
    ids = [f"RUN-{n}" for n in range(6)]
    reasons = {run_id: f"reason {n % 5}\nwrapped" for n, run_id in enumerate(ids)}
    del reasons["RUN-5"]  # no reason sent for it: not named under one
    lines = render.restore_lines({"needsAttention": ids, "reasons": reasons})
    assert lines[2:] == ["  RUN-0: reason 0 wrapped.", "  RUN-1: reason 1 wrapped.",
                         "  RUN-2: reason 2 wrapped.",
                         "  And 2 more reasons (intloom doctor)."], lines
    four = render.restore_lines({"needsAttention": ids[:4],
                                 "reasons": {r: f"reason {n}" for n, r in enumerate(ids[:4])}})
    assert four[-1] == "  And 1 more reason (intloom doctor).", four
    # A host before reasons: the line alone, as before.
    assert len(render.restore_lines({"needsAttention": ["RUN-a"]})) == 2


def test_recover_lines() -> None:
    assert render.recover_lines({"dryRun": True, "paths": []}) == [
        "Recovery plan: no stale resources. No cleanup performed."
    ]
    assert render.recover_lines({"dryRun": False, "recovered": False, "paths": []}) == [
        "There are no stale resources to clean up."
    ]
    done = render.recover_lines({"dryRun": False, "recovered": True, "paths": ["a", "b"]})
    assert done[-1].startswith("Stale execution resources removed.")


def test_diagnosis_lines_show_owner_evidence_and_the_blocked_hint() -> None:
    lines = render.diagnosis_lines(
        {
            "status": "blocked",
            "message": "A resource owner still exists.",
            "owners": [
                {"resource": "service_lock", "pid": 7, "status": "alive",
                 "evidence": [{"check": "os_lock", "found": "held"}]}
            ],
        }
    )
    assert lines == [
        "A resource owner still exists.",
        "service_lock · PID 7 · Process still exists",
        "    os_lock: held",
        "Run intloom doctor. Do not delete locks whose owners are still active.",
    ]


def test_log_line_is_time_level_event_then_context() -> None:
    record = {"time": "T", "level": "info", "event": "run_created", "runId": "RUN-1", "n": [1]}
    assert render.log_line(record) == "T info    run_created runId=RUN-1 n=[1]"


def test_a_log_line_without_a_level_says_so_rather_than_info() -> None:
    """A line some other program wrote into the log (no level) read as ``info``: the
    level, like a missing time or event, is shown missing."""
    assert render.log_line({"time": "T", "event": "e", "x": 1}) == "T -       e x=1"
    assert render.log_line({}) == "- -       -"


def test_a_long_cell_does_not_widen_every_row_of_a_piped_table(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A cell past the alignment limit overflows its own row; the other rows stay as wide
    as their own cells (a long "not ready" problem used to pad every Workflow of ``flows``
    to its width)."""
    problem = "not ready: " + "x" * 200
    Renderer().table(
        ["WORKFLOW", "READINESS", "SOURCE"],
        [["a", "ready", "a.py"], ["broken", problem, "broken.py"], ["bb", "ready", "bb.py"]],
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["a       ready  a.py", f"broken  {problem}  broken.py", "bb      ready  bb.py"]


def test_a_waiting_run_says_what_it_asks_and_how_to_answer() -> None:
    import shlex

    long = {**RUN, "pendingAction": {"id": "ACT-1", "kind": "user_ask_confirmation",
                                     "request": {"context": {"draft": "y" * 1000}}}}
    lines = render.run_lines(long)
    context = next(x for x in lines if x.startswith("Confirm "))
    assert len(context) < 400 and context.endswith("... (--json shows all of it)")
    assert "Answer  intloom answer RUN-1 ACT-1 '{\"isConfirmed\":true}'" in "\n".join(lines)

    odd = {**RUN, "pendingAction": {"id": "ACT-2", "kind": "user_ask_questions", "request": [
        {"id": "it's", "question": "Q?", "isSkippable": False}]}}
    label, what, command = render.asked(odd) or ("", [], "")
    assert (label, what) == ("Ask", ["it's: Q?"])
    argv = shlex.split(command)  # one shell word, quotes and all
    assert argv[:4] == ["intloom", "answer", "RUN-1", "ACT-2"]
    assert json.loads(argv[4]) == [{"questionId": "it's", "isSkipped": False,
                                    "answer": "<text>"}]
    assert render.asked({**RUN, "status": "running"}) is None


def test_a_question_and_an_option_are_shown_with_their_descriptions() -> None:
    """flow, answer and runs showed a question's id, text and options but dropped the
    descriptions the Step gave them (attach shows both): a person answering from that text
    never read "Answer with an ISO date" or what an option means."""
    run = {**RUN, "pendingAction": {"id": "ACT-3", "kind": "user_ask_questions", "request": [
        {"id": "when", "question": "Due?", "description": "An ISO date", "isSkippable": False,
         "options": [{"id": "now", "label": "Today", "description": "ships at once"},
                     {"id": "later", "label": "later"}]}]}}
    _, what, _ = render.asked(run) or ("", [], "")
    assert what == ["when: Due?", "  An ISO date",
                    "  options: now (Today): ships at once · later"], what


def test_a_terminal_table_never_cuts_or_folds_a_cell(monkeypatch: pytest.MonkeyPatch) -> None:
    """At 80 columns a Run and its status, cursor and timestamp do not fit on one line.
    Nothing is cut ("…") and no cell is folded mid-word ("waitin" / "g", "WORKFLO" / "W"):
    each row's id gets a line of its own, its other cells follow, whole. Wide enough, it
    is a table with one line per row."""
    monkeypatch.delenv("NO_COLOR", raising=False)
    run_id = "RUN-20261130T153947918Z-jD4bXnc9sfH8bFJBxyzAbCdEf"
    at = "2026-11-30T15:39:47.933Z"
    columns = ["RUN", "WORKFLOW", "STATUS", "CURSOR", "UPDATED"]
    rows = [[run_id, "example", "waiting", "draft/review", at],
            [run_id.replace("jD4", "kE5"), "x", "failed (RUN_INTERRUPTED)", "draft", at]]

    def shown(width: int) -> list[str]:
        out = _Tty()
        monkeypatch.setattr("sys.stdout", out)
        monkeypatch.setenv("COLUMNS", str(width))
        Renderer().table(columns, rows)
        return re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue()).splitlines()

    narrow = shown(80)
    assert "…" not in "".join(narrow)
    assert narrow == [
        "RUN", "  WORKFLOW · STATUS · CURSOR · UPDATED",
        run_id, f"  example · waiting · draft/review · {at}",
        rows[1][0], f"  x · failed (RUN_INTERRUPTED) · draft · {at}",
    ]
    wide = shown(160)
    assert len(wide) == 3 and wide[0].split() == columns
    assert wide[1].split() == rows[0]
    assert all(cell in wide[2] for cell in rows[1])


@pytest.mark.parametrize("width", [20, 5])
def test_a_very_narrow_terminal_folds_no_header_either(
    monkeypatch: pytest.MonkeyPatch, width: int
) -> None:
    """COLUMNS=20 split the header as "WORKFLOW · STATUS " / "· CURSOR · UPDATED", and a
    few columns less folded it mid-word ("WOR" / "KFLOW"): the rows never were."""
    monkeypatch.delenv("NO_COLOR", raising=False)
    out = _Tty()
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.setenv("COLUMNS", str(width))
    run_id = "RUN-20261130T153947918Z-jD4bXnc9sfH8bFJBxyzAbCdEf"
    at = "2026-11-30T15:39:47.933Z"
    Renderer().table(["RUN", "WORKFLOW", "STATUS", "CURSOR", "UPDATED"],
                     [[run_id, "example", "waiting", "draft/review", at],
                      [run_id, "example", "", "", at]])  # empty cells (flows' failed source)
    lines = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue()).splitlines()
    assert lines == ["RUN", "  WORKFLOW · STATUS · CURSOR · UPDATED",
                     run_id, f"  example · waiting · draft/review · {at}",
                     run_id, f"  example · - · - · {at}"]  # not "example ·  ·  · ..."


HOSTILE = ("ünïcødé 💥 \x00 nul \n newline \x1b[31mred\x1b[0m \r\t \x7f \x9b \u202e rtl "
           "\u2028 \udcff")
ESCAPED = ("ünïcødé 💥 \\x00 nul \\n newline \\x1b[31mred\\x1b[0m \\r\\t \\x7f \\x9b \\u202e rtl "
           "\\u2028 \\udcff")


def test_printable_escapes_what_a_terminal_would_obey_and_keeps_the_rest() -> None:
    assert render.printable(HOSTILE) == ESCAPED
    # Printable Unicode is shown as it is: accents, emoji (with their joiners), CJK, NBSP.
    family = "👨\u200d👩\u200d👧 漢字 a\u00a0b — ok"
    assert render.printable(family) == family


def test_printable_escapes_what_shows_as_nothing() -> None:
    # Directional marks, zero-width characters and the BOM: "RUN-a\u200fb" looked like
    # "RUN-ab" on a terminal.
    hidden = "a\u200eb\u200fc\u061cd\u200be\u2060f\u2062g\ufeffh"
    assert render.printable(hidden) == (
        "a\\u200eb\\u200fc\\u061cd\\u200be\\u2060f\\u2062g\\ufeffh")
    # A joiner next to ASCII, or at an end, joins nothing visible.
    assert render.printable("RUN-a\u200db\u200cc") == "RUN-a\\u200db\\u200cc"
    assert render.printable("\u200d👩 👩\u200d") == "\\u200d👩 👩\\u200d"
    assert render.printable("👩\u200d\u200f👩") == "👩\\u200d\\u200f👩"
    # Between two other non-ASCII characters it joins: emoji sequences, Persian words.
    for joined in ("❤\ufe0f\u200d🔥", "👩\u200d💻", "می\u200cخواهم"):
        assert render.printable(joined) == joined


def test_every_text_write_escapes_workflow_text(capsys: pytest.CaptureFixture[str]) -> None:
    renderer = Renderer()
    renderer.lines([f"message {HOSTILE}"])
    renderer.table(["A", "B"], [[HOSTILE, "x"]])
    renderer.note(HOSTILE)
    renderer.error(error_view("STEP_EXECUTION_FAILED", HOSTILE))
    out, err = capsys.readouterr()
    assert out == f"message {ESCAPED}\n{ESCAPED}  x\n"
    assert err == f"{ESCAPED}\nFailure · STEP_EXECUTION_FAILED: {ESCAPED}\n"
    # What a waiting Run asks goes through the same writes.
    run = {**RUN, "pendingAction": {"id": "A", "kind": "user_ask_questions", "request": [
        {"id": "q", "question": "clear?\x1b[2J", "options": [{"id": "o", "label": "\x07"}]}]}}
    renderer.lines(render.run_lines(run))
    out = capsys.readouterr().out
    assert "q: clear?\\x1b[2J" in out and "o (\\x07)" in out and "\x1b" not in out


def test_json_output_keeps_the_exact_text(capsys: pytest.CaptureFixture[str]) -> None:
    text = HOSTILE.replace("\udcff", "")  # JSON holds text; a lone surrogate is none
    Renderer(json_mode=True).error(error_view("STEP_EXECUTION_FAILED", text))
    assert json.loads(capsys.readouterr().out)["error"]["message"] == text


def test_a_terminal_table_neither_obeys_escapes_nor_reads_markup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = _Tty()
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.delenv("NO_COLOR", raising=False)
    Renderer().table(["RUN"], [["[bold red]x[/] \x1b[2J"]])
    shown = out.getvalue()
    assert "[bold red]x[/] \\x1b[2J" in shown, repr(shown)
    assert "\x1b[2J" not in shown


@pytest.mark.parametrize(("message", "owner", "footer"), [
    ("A resource owner still exists or its exit cannot be verified.", "alive", True),
    ("Port 5 on 127.0.0.1 ... is in use by another process (pid 9 (python3)).", "absent", False),
    ("The service is shutting down: it is suspending its Runs, then exits.", "alive", False),
    # The wording status builds (errors.starting_message), which the renderer recognises.
    (starting_message(9, "2026-01-01T00:00:00.000Z", "Run intloom status again."), "alive",
     False),
])
def test_status_says_not_to_delete_locks_only_while_an_owner_may_live(
        message: str, owner: str, footer: bool) -> None:
    lines = render.diagnosis_lines({"status": "blocked", "message": message, "owners": [
        {"resource": "service_lock", "pid": 9, "status": owner}]})
    assert lines[0] == message
    assert ("Run intloom doctor. Do not delete locks whose owners are still active."
            in lines) == footer, lines


def test_a_host_whose_only_workflow_failed_to_load_does_not_say_the_others_run() -> None:
    problem = {"source": "workflows/example.py", "code": "WORKFLOW_LOAD_FAILED",
               "message": "SystemExit(3) (line 1 of workflows/example.py)"}
    base = {"projectRoot": "/p", "port": 1, "pid": 2, "instanceId": "i",
            "workflowProblems": [problem]}
    alone = "\n".join(render.service_lines({**base, "workflowCount": 0}))
    assert "Workflows 0 loaded · 1 failed to load" in alone
    assert "No Workflow loaded, so no Run can be started." in alone
    assert "The other Workflows run." not in alone
    assert "The other Workflows run." in "\n".join(
        render.service_lines({**base, "workflowCount": 2}))


def test_status_with_waiting_runs_says_where_to_see_what_they_ask() -> None:
    """``status`` and ``start`` counted the waiting Runs and said nothing of where their
    questions and the answer command are."""
    base = {"projectRoot": "/p", "port": 1, "pid": 2, "instanceId": "i", "workflowCount": 1}
    hint = ("Waiting  intloom runs shows what each waiting Run asks, and the command that "
            "answers it")
    waiting = render.service_lines({**base, "waitingRuns": 2})
    assert waiting[waiting.index("Runs running 0 · waiting 2 · completed 0 · failed or "
                                 "stopped 0") + 1] == hint, waiting
    assert hint not in render.service_lines({**base, "waitingRuns": 0})


def test_a_missing_segment_says_runs_are_held_only_when_the_restore_held_some() -> None:
    """A wal/ segment removed while the host ran: the next start's status said "those Runs
    are held" beside "needs attention 0"."""
    base = {"projectRoot": "/p", "port": 1, "pid": 2, "instanceId": "i", "workflowCount": 1,
            "storeProblems": [{"path": "wal/0000000002.seg", "kind": "missing",
                               "problem": "is missing"}]}
    held = "A missing or emptied segment may have held Runs' records: those Runs are held"

    def said(restore: dict[str, Any] | None) -> bool:
        lines = render.service_lines({**base, "restore": restore} if restore else base)
        return any(line.startswith(held) for line in lines)

    assert not said({"resumed": ["R1"], "waiting": [], "interrupted": [],
                     "needsAttention": []})
    assert said({"resumed": [], "waiting": [], "interrupted": [], "needsAttention": ["R2"]})
    assert said(None)  # a host that says nothing of its restore: as before


def test_attach_waits_for_the_whole_history_before_it_prompts_or_ends(tmp_path: Any) -> None:
    """A restored Run's history shows its view twice: the earlier host's `waiting`, then
    `restored`. The display has caught up only once the host's `caughtUp` event (or a live
    one) has arrived: attach went on at `waiting` and printed `restored` after the view."""
    from intloom.cli.commands.attach import _Follower
    from intloom.protocol.messages import RunEvent
    from intloom.runtime.model import Cursor, PendingAction, RunView

    action = PendingAction(id="ASK-1", flow_name="f", kind="user_ask_confirmation",
                           cursor=Cursor(stage="s", step="a"), request={"context": "ok?"},
                           created_at="2026-12-01T00:00:00.000Z")
    view = RunView(run_id="RUN-1", flow_name="f", cursor=Cursor(stage="s", step="a"),
                   status="waiting", created_at="2026-12-01T00:00:00.000Z",
                   updated_at="2026-12-01T00:00:01.000Z", pending_action=action)
    follower = _Follower(tmp_path, "RUN-1", Renderer(), None)
    follower.took(RunEvent(run=view, event="waiting", history=True))
    assert not follower._reached(view)  # `restored` is still to come
    follower.took(RunEvent(run=view, event="restored", history=True, caught_up=True))
    assert follower._reached(view)

    live = _Follower(tmp_path, "RUN-1", Renderer(), None)
    live.met(["caughtUp"])
    live.took(RunEvent(run=view, event="waiting", history=True))
    live.took(RunEvent(run=view, event="answered", history=False))  # a live event says so too
    assert live._reached(view)

    older = _Follower(tmp_path, "RUN-1", Renderer(), None)
    older.met([])  # a host from before caughtUp: nothing to wait for (it waited 3 s each time)
    older.took(RunEvent(run=view, event="waiting", history=True))
    assert older._reached(view)


def test_doctor_does_not_send_the_user_to_doctor() -> None:
    """A paused host: status says to run doctor; doctor itself points at its own checks."""
    report = {"status": "blocked", "message": "The service did not complete the hello.",
              "owners": [{"resource": "service_lock", "pid": 9, "status": "alive"}],
              "checks": [{"id": "owner.service_lock", "status": "attention",
                          "message": "paused", "next": "Resume it (kill -CONT 9)."}]}
    lines = render.doctor_lines(report)
    assert ("Each check below says what to do next. Do not delete locks whose owners are "
            "still active.") in lines, lines
    assert not any("Run intloom doctor" in line for line in lines), lines
    assert "Run intloom doctor. Do not delete locks whose owners are still active." in (
        render.diagnosis_lines(report))


def test_doctor_says_what_start_would_refuse_under_run_intloom_start() -> None:
    """Offline with an intloom.toml start refuses, doctor's first line said "Run intloom
    start." with nothing after it; status adds why that start fails, and doctor does too."""
    refusal = ("But intloom start refuses the project as it is: /p/intloom.toml: unknown key "
               "'foo'. Known keys: port, workflows. Remove or rename it.")
    report = {"status": "offline", "message": "The service is offline. Run intloom start.",
              "owners": [], "startProblem": refusal,
              "checks": [{"id": "config", "status": "attention", "message": "m", "next": "n"}]}
    assert render.doctor_lines(report)[:2] == [report["message"], refusal]
    assert render.doctor_lines({**report, "startProblem": None})[1].startswith("config")


def test_status_says_run_intloom_doctor_once() -> None:
    """A live host that is not the instance service.json names: the message ends "Run
    intloom doctor." and status added the same sentence again on its last line."""
    message = ("The listening service does not match the saved project identity (it is "
               "instance a, pid 9; service.json names b, pid 9). Run intloom doctor.")
    lines = render.diagnosis_lines({"status": "blocked", "message": message, "owners": [
        {"resource": "service_lock", "pid": 9, "status": "alive"}]})
    assert lines[0] == message
    assert lines[-1] == "Do not delete locks whose owners are still active.", lines


def test_attach_waits_past_an_agent_task_only_for_what_came_after_its_wait(
        tmp_path: Any) -> None:
    """An Agent Step's records share a millisecond: its `running` events had the wait's very
    time, so attach took them for "the Run moved past the task" at once, asked again, and
    printed "Waiting for the client Agent ..." tens of thousands of times a second (a Run
    of the handoff Workflow did so 7 times in 10), sending as many requests to the host."""
    import threading

    import msgspec

    from intloom.cli.commands.attach import _Follower
    from intloom.protocol.messages import RunEvent
    from intloom.runtime.model import Cursor, PendingAgentCall, RunView

    at = "2026-12-01T00:00:01.000Z"
    task = PendingAgentCall(id="AG-1", agent_id="a", phase="available", request={},
                            tools=[], created_at=at)
    running = RunView(run_id="RUN-1", flow_name="f", cursor=Cursor(stage="s", step="a"),
                      status="running", created_at=at, updated_at=at)
    view = msgspec.structs.replace(running, status="waiting", pending_agent_call=task)
    follower = _Follower(tmp_path, "RUN-1", Renderer(), None)
    follower.met(["caughtUp"])
    follower.took(RunEvent(run=running, event="executing", history=True))
    follower.took(RunEvent(run=view, event="waiting", history=True, caught_up=True))
    waiter = threading.Thread(target=follower.past_task, args=(view,), daemon=True)
    waiter.start()
    waiter.join(timeout=0.5)
    assert waiter.is_alive(), "past_task returned while the Run still waits on its task"
    done = msgspec.structs.replace(view, updated_at="2026-12-01T00:00:02.000Z",
                                   status="running", pending_agent_call=None)
    follower.took(RunEvent(run=done, event="agent_completed"))
    waiter.join(timeout=10)
    assert not waiter.is_alive()


def test_recover_names_the_temp_files_it_keeps() -> None:
    leftovers = [{"path": ".intloom/.service.lock.0123456789abcdef.tmp",
                  "target": "service.lock", "size": 21}]
    for dry_run, recovered in ((True, False), (False, True), (False, False)):
        lines = render.recover_lines({"dryRun": dry_run, "recovered": recovered,
                                      "paths": [], "leftovers": leftovers})
        assert lines[-1] == (
            "Kept as it is: .intloom/.service.lock.0123456789abcdef.tmp, the temp file of a "
            "write that was interrupted (recover never removes it; intloom doctor says more)."
        ), lines


def test_a_suspended_runs_failure_says_to_stop_a_host_that_still_serves(
        capsys: pytest.CaptureFixture[str]) -> None:
    """attach on a Run its host suspended because its log failed: that host serves on
    (refusing new work), so "Run intloom start, then intloom attach" reused it and showed
    the same failed Run; the restore needs that host stopped first."""
    import msgspec

    from intloom.cli.commands.runs import finish_run
    from intloom.cli.options import CliState
    from intloom.runtime.model import RunView

    said = ("The host log .intloom/logs/LOG-1.jsonl could not be written (ENOSPC). The host "
            "suspended the Run and refuses new work.")
    run = msgspec.convert({**RUN, "status": "failed", "pendingAction": None,
                           "lastError": {"code": "RUN_INTERRUPTED", "message": said,
                                         "retryable": False}}, RunView)
    assert finish_run(CliState(), run, suspended=True) == exit_codes.RUN_SUSPENDED
    err = capsys.readouterr().err
    assert f"was suspended by its host, not ended (its view reads failed/RUN_INTERRUPTED until " \
           f"the next start): {said}" in err, err
    assert ("Run intloom stop first if its host still serves (intloom status says; one "
            "whose log failed does), then intloom start, then intloom attach RUN-1.") in err, err


def _help_on_a_terminal(monkeypatch: pytest.MonkeyPatch, columns: int, *args: str) -> str:
    from intloom.cli.app import main

    out = _Tty()
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main([*args, "--help"]) == 0
    return re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())


def test_a_narrow_terminal_gets_help_that_cuts_no_option_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At 40 columns Rich's help panels cut names and words to fit: ``--foreg…``,
    ``--timeo…``, ``incompat…``. Help too narrow for them is Click's, which wraps."""
    text = _help_on_a_terminal(monkeypatch, 40, "start")
    assert "…" not in text, text
    for name in ("--port N", "--foreground", "--strict", "--timeout S", "--project DIR"):
        assert name in text, text
    assert "incompatible." in text, text
    # Click's plain help keeps 50 columns whatever the terminal's: at 40 every long line
    # overflowed it. Each command's help now fits.
    from intloom.cli.app import COMMANDS

    for args in ([], *([name] for name in COMMANDS)):
        text = _help_on_a_terminal(monkeypatch, 40, *args)
        wide = [line for line in text.splitlines() if len(line) > 40]
        assert not wide, (args, wide)
        # Nor a trailing space (docs/cli.md): the usage's prefix, alone on its line, kept one.
        spaced = [line for line in text.splitlines() if line != line.rstrip()]
        assert not spaced, (args, spaced)


def test_every_commands_rich_help_fits_the_width_it_is_shown_at(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from intloom.cli.app import COMMANDS, RICH_HELP_COLUMNS

    for args in ([], *([name] for name in COMMANDS)):
        text = _help_on_a_terminal(monkeypatch, RICH_HELP_COLUMNS, *args)
        assert "╭" in text, text  # Rich's, at that width
        assert "…" not in text, text


def test_no_help_shows_a_flag_as_taking_a_value_or_braces_an_argument(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """Rich's help wrote ``--json <bool>`` and both helps ``answer [OPTIONS] {RUN} {ACTION}
    {ANSWER}``; docs/cli.md writes ``intloom answer RUN ACTION ANSWER``."""
    from intloom.cli.app import COMMANDS, main

    for args in ([], *([name] for name in COMMANDS)):
        text = _help_on_a_terminal(monkeypatch, 100, *args)
        assert "╭" in text, text
        assert "<bool>" not in text and "{" not in text, text
    monkeypatch.undo()
    assert main(["answer", "--help"]) == 0
    plain = capsys.readouterr().out
    assert plain.startswith("Usage: intloom answer [OPTIONS] RUN ACTION ANSWER\n"), plain
    assert main(["logs", "--help"]) == 0
    assert capsys.readouterr().out.startswith("Usage: intloom logs [OPTIONS] [RUN]\n")


def test_doctor_names_the_first_runs_that_need_a_person_and_counts_the_rest() -> None:
    """30,000 held Runs printed 10.8 MB of preview lines. The text names those that need a
    person first (interrupted, held), up to DOCTOR_RUNS_SHOWN, and counts the rest by row;
    the JSON keeps every preview."""
    def preview(n: int, row: str, problem: str | None = None) -> dict[str, Any]:
        return {"runId": f"RUN-{n}", "verdict": {"row": row, "reason": f"why {n}"},
                **({"problem": problem} if problem else {})}

    runs = ([preview(n, "resume") for n in range(70)] + [preview(70, "interrupted")]
            + [preview(n, "restore_wait") for n in range(71, 100)]
            + [preview(100, "resume", "held: the Workflow changed")])
    lines = render.doctor_lines({"status": "offline", "message": "m", "owners": [],
                                 "checks": [], "runs": runs})
    named = [line for line in lines if line.startswith("  RUN-")]
    assert len(named) == render.DOCTOR_RUNS_SHOWN == 50
    assert named[:2] == ["  RUN-70 · interrupted: why 70", "  RUN-100 · resume: why 100"]
    assert "    held: the Workflow changed" in lines
    assert named[2] == "  RUN-0 · resume: why 0"  # then in the report's order
    assert lines[-1] == ("  ... and 51 more (29 restore_wait, 22 resume): intloom doctor "
                         "--json lists every Run with its reason.")
    few = render.doctor_lines({"status": "offline", "message": "m", "owners": [],
                               "checks": [], "runs": runs[:3]})
    assert not any(line.startswith("  ...") for line in few)


def test_a_table_too_long_for_rich_is_aligned_lines_under_a_header_on_a_terminal(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rich laid out every row: `runs` of 10,000 Runs took 11.9 s on a terminal, 1.1 s
    piped. Past 500 rows a terminal gets the piped layout, with its header."""
    monkeypatch.delenv("NO_COLOR", raising=False)
    out = _Tty()
    monkeypatch.setattr("sys.stdout", out)
    rows = [[f"RUN-{n}", "example", "waiting \x1b[2J"] for n in range(501)]
    Renderer().table(["RUN", "WORKFLOW", "STATUS"], rows)
    lines = out.getvalue().splitlines()
    assert len(lines) == 502, len(lines)
    assert lines[0].split() == ["RUN", "WORKFLOW", "STATUS"]
    assert lines[1].split() == ["RUN-0", "example", "waiting", "\\x1b[2J"]  # printable still
    assert lines[1].index("example") == lines[0].index("WORKFLOW")  # aligned
    assert "\x1b" not in out.getvalue()


def test_a_table_wider_than_a_terminal_without_colour_is_not_wrapped_mid_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``NO_COLOR=1 intloom runs`` on a 40-column terminal printed the piped rows (107
    characters each), which the terminal wrapped mid-id and mid-time: NO_COLOR is to take
    the colour away, not the layout for the terminal's width."""
    import os
    import select

    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "40")
    leader, follower = os.openpty()
    stream = os.fdopen(follower, "w", encoding="utf-8")
    try:
        renderer = Renderer()
        renderer.stdout = stream
        run_id = "RUN-20261205T202446976Z-WjGXcA3MiJz9t6DTxPBij"
        renderer.table(["RUN", "WORKFLOW", "STATUS"],
                       [[run_id, "slow", "completed"], ["RUN-2", "", "waiting"]])
        shown = b""
        while select.select([leader], [], [], 1)[0]:
            shown += os.read(leader, 4096)
            if shown.count(b"\n") >= 4:
                break
    finally:
        stream.close()
        os.close(leader)
    assert shown.decode().splitlines() == [
        run_id, "  slow · completed", "RUN-2", "  - · waiting"], shown
    assert b"\x1b" not in shown


def test_a_piped_table_is_never_laid_out_for_a_width(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "10")
    Renderer().table(["RUN", "STATUS"], [["RUN-1234567890", "completed"]])
    assert capsys.readouterr().out == "RUN-1234567890  completed\n"


def test_a_tables_width_on_a_terminal_counts_screen_cells() -> None:
    """Counted in code points, a row of CJK text (two cells a character) was judged to fit
    a terminal it overflowed, and wrapped mid-id."""
    from intloom.cli.render import _cells_wide

    assert _cells_wide([["RUN-1", "概要を書く"]]) == 5 + 2 + 10
    assert _cells_wide([["a", "b" * 300], ["cc", "d"]]) == 2 + 2 + 300  # past the alignment


# ----- a line break after the ^C a terminal echoed ----------------------------------------

_ECHOED = """
import sys, fcntl, termios
from intloom.cli.render import ctrl_c_echoed
fcntl.ioctl(0, termios.TIOCSCTTY, 0)
print(ctrl_c_echoed(sys.stderr), flush=True)
"""


@pytest.mark.timeout(30)
@pytest.mark.parametrize("echoctl", [True, False])
def test_ctrl_c_is_said_echoed_only_by_a_controlling_terminal_that_echoes_it(
    echoctl: bool,
) -> None:
    """The ``^C`` shows where the cursor stands only on the terminal the keyboard's SIGINT
    comes from, with ECHO and ECHOCTL on (``stty -echoctl`` shows nothing)."""
    import os
    import pty
    import subprocess
    import sys
    import termios

    from tests.helpers import REPO

    leader, follower = pty.openpty()
    try:
        attrs = termios.tcgetattr(follower)
        attrs[3] = attrs[3] | termios.ECHOCTL if echoctl else attrs[3] & ~termios.ECHOCTL
        termios.tcsetattr(follower, termios.TCSANOW, attrs)
        done = subprocess.run([sys.executable, "-c", _ECHOED], stdin=follower,
                              stderr=follower, stdout=subprocess.PIPE, text=True,
                              start_new_session=True, env={**os.environ, "PYTHONPATH": str(REPO)},
                              timeout=20, check=True)
    finally:
        os.close(follower)
        os.close(leader)
    assert done.stdout.strip() == str(echoctl), done


def test_no_line_break_after_ctrl_c_where_nothing_was_echoed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Piped stderr (and a terminal that is not the controlling one, as here, which
    a SIGINT sent by another process reaches with no ``^C``) stays exactly as it was."""
    import os
    import pty
    import select
    import sys

    Renderer().after_ctrl_c(KeyboardInterrupt())
    assert capsys.readouterr().err == ""
    leader, follower = pty.openpty()
    try:
        with open(follower, "w", closefd=False) as tty:
            assert not render.ctrl_c_echoed(tty)
            saved, sys.stderr = sys.stderr, tty
            try:
                Renderer().after_ctrl_c(KeyboardInterrupt())
            finally:
                sys.stderr = saved
        assert select.select([leader], [], [], 0)[0] == [], os.read(leader, 100)
    finally:
        os.close(follower)
        os.close(leader)
