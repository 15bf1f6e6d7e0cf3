"""``intloom attach`` answering on a real terminal (a pty), against a real host.

A picked option answers with the option's id (what a Step routes on), and a number that
is no option's is asked again rather than sent as text. A prompt whose action stops being
pending (answered or cancelled by another client, the host stopped or killed) is left at
once; EOF or Ctrl-C at a prompt detaches and leaves the Run waiting.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.terminal import Terminal
from tests.helpers import CliResult, Project, eventually, ok

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


def interrupt(proc: Any, leave: str) -> None:
    """Ctrl-C: SIGINT to the process. With ``ctrl-c-elsewhere``, first that no other thread
    of attach's can take it: the kernel may run a process's signal on any thread that does
    not hold it off, and on attach's event thread the C handler only flagged it for the
    main thread, asleep in a wait (or, with the wait's slice holding SIGINT off, raised it
    inside Condition.wait's window: exit 70). attach starts its threads with SIGINT held
    off, so the main thread takes it."""
    if leave == "ctrl-c-elsewhere":
        others = [t for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid]
        assert others, "attach has no thread besides its main one"
        for tid in others:
            with open(f"/proc/{proc.pid}/task/{tid}/status") as status:
                blocked = next(int(line.split()[1], 16) for line in status
                               if line.startswith("SigBlk:"))
            assert blocked & (1 << (signal.SIGINT - 1)), f"thread {tid} may take SIGINT"
    proc.send_signal(signal.SIGINT)


def answered(project: Project, run_id: str) -> Any:
    """The answer the Run's journal recorded."""
    records = ok(project.cli("inspect", run_id, "--json"))["records"]
    found = [r["record"]["answer"] for r in records if r["phase"] == "answered"]
    assert len(found) == 1, records
    return found[0]


def test_picking_an_option_answers_its_id_and_a_wrong_number_asks_again(
    asks_project: Project,
) -> None:
    project = asks_project
    ok(project.cli("start", "--json"))
    run_id = ok(project.cli("flow", "triage", "--intent", "ticket 7", "--json"))["run"]["runId"]
    with Terminal(["--project", str(project.root), "attach", run_id], project.root) as term:
        shown = term.expect("What should happen to this ticket?")
        assert "waiting" in shown  # the history came first
        options = term.expect("]: ")
        assert "2. won't fix [wontfix] (close it as is)" in options, options
        term.type("7")
        told = term.expect("]: ")
        assert "There is no option 7" in told and "1 to 3" in told, told
        term.type("2")
        term.expect("A note for the reporter?")
        term.expect("]: ")
        term.type("")  # skippable: Enter skips
        code = term.finish()
        assert code == 0, term.text()
        assert "Completed · triage" in term.rest(), term.text()
    assert answered(project, run_id) == [
        {"questionId": "resolution", "isSkipped": False, "answer": "wontfix"},
        {"questionId": "note", "isSkipped": True},
    ]


def test_free_text_is_still_an_answer_when_a_question_has_options(
    asks_project: Project,
) -> None:
    project = asks_project
    ok(project.cli("start", "--json"))
    run_id = ok(project.cli("flow", "triage", "--intent", "ticket 8", "--json"))["run"]["runId"]
    with Terminal(["--project", str(project.root), "attach", run_id], project.root) as term:
        term.expect("What should happen to this ticket?")
        options = term.expect("]: ")
        # Each option shows the id a typed answer would name (a label that is its id once).
        assert "1. fix it [fix]" in options and "3. duplicate\r\n" in options, options
        term.type("duplicate")  # typed, not picked: sent as it is
        term.expect("A note for the reporter?")
        term.expect("]: ")
        term.type("see ticket 3")
        assert term.finish() == 0, term.text()
        assert "Completed · triage" in term.rest(), term.text()
    assert answered(project, run_id) == [
        {"questionId": "resolution", "isSkipped": False, "answer": "duplicate"},
        {"questionId": "note", "isSkipped": False, "answer": "see ticket 3"},
    ]


def test_an_options_label_typed_picks_that_option(asks_project: Project) -> None:
    """Typing an option's label (WON'T FIX for "2. won't fix [wontfix]") was sent as free
    text, which a Step routing on option ids does not know. The label of exactly one option,
    in any case, picks it: the answer is its id, and attach says which it picked."""
    project = asks_project
    ok(project.cli("start", "--json"))
    run_id = ok(project.cli("flow", "triage", "--intent", "ticket 9", "--json"))["run"]["runId"]
    with Terminal(["--project", str(project.root), "attach", run_id], project.root) as term:
        term.expect("What should happen to this ticket?")
        term.expect("]: ")
        term.type("WON'T FIX")
        told = term.expect("A note for the reporter?")
        assert "Picked option 2, won't fix [wontfix]: the answer is its id, wontfix." in told, \
            told
        term.expect("]: ")
        term.type("")
        assert term.finish() == 0, term.text()
    assert answered(project, run_id) == [
        {"questionId": "resolution", "isSkipped": False, "answer": "wontfix"},
        {"questionId": "note", "isSkipped": True},
    ]


# ----- a prompt whose action is no longer pending -----------------------------------------
#
# Another client (or the host's end) moves the Run on while attach sits at a prompt: attach
# must leave the prompt at once, not after the person types (the CONFLICT that used to come
# then). ``Terminal`` fails an expect or finish that takes longer than its timeout.

QUESTIONS_FIX = json.dumps([
    {"questionId": "resolution", "isSkipped": False, "answer": "fix"},
    {"questionId": "note", "isSkipped": True},
])
PROMPT_DEADLINE = 20.0  # far above what attach needs (one event, one get_run)


def at_the_confirmation(project: Project, intent: str) -> tuple[str, str]:
    """A Run of ``triage`` whose questions are answered: it waits on the confirmation."""
    ok(project.cli("start", "--json"))
    run = ok(project.cli("flow", "triage", "--intent", intent, "--json"))["run"]
    # The reference's PendingUserAction: its kinds, and the flow named.
    assert run["pendingAction"]["kind"] == "user_ask_questions", run
    assert run["pendingAction"]["flowName"] == "triage", run
    run = ok(project.cli("answer", run["runId"], run["pendingAction"]["id"], QUESTIONS_FIX,
                         "--json"))["run"]
    assert run["pendingAction"]["kind"] == "user_ask_confirmation", run
    return str(run["runId"]), str(run["pendingAction"]["id"])


def test_a_prompt_answered_elsewhere_gives_way_to_the_next_one(asks_project: Project) -> None:
    project = asks_project
    ok(project.cli("start", "--json"))
    run = ok(project.cli("flow", "triage", "--intent", "ticket 9", "--json"))["run"]
    run_id, asked = run["runId"], run["pendingAction"]["id"]
    with Terminal(["--project", str(project.root), "attach", run_id], project.root,
                  timeout=PROMPT_DEADLINE) as term:
        term.expect("What should happen to this ticket?")
        term.expect("]: ")
        term.keys("3")  # typed at the stale prompt, no Enter: must not answer the next one
        term.expect("3")  # echoed: the terminal holds it
        now = ok(project.cli("answer", run_id, asked, QUESTIONS_FIX, "--json"))["run"]
        assert now["pendingAction"]["kind"] == "user_ask_confirmation", now
        moved = term.expect("Confirm? [y/n]: ")
        assert f"{asked} is no longer pending" in moved, term.text()
        assert "Confirmation requested:" in moved and "CONFLICT" not in moved, term.text()
        term.type("y")  # "3y" would be refused as invalid input and asked again
        told = term.expect("Feedback (optional, Enter to skip): ")
        assert "invalid input" not in told, term.text()
        term.type("")
        assert term.finish() == 0, term.text()
        assert "Completed · triage" in term.rest(), term.text()
    records = ok(project.cli("inspect", run_id, "--json"))["records"]
    found = [r["record"]["answer"] for r in records if r["phase"] == "answered"]
    assert found == [json.loads(QUESTIONS_FIX), {"isConfirmed": True}], found


BUSY = """
import os
import time

import intloom

wf = intloom.Workflow("busy", version="1")
main = wf.stage("main")


@main.step("work", routes={"done": intloom.COMPLETE})
def work(ctx: intloom.StepContext[None]) -> str:
    gate = ctx.intent
    open(gate + ".working", "w").close()  # for a test that waits for the Step to start
    deadline = time.monotonic() + 20  # the test opens the gate; this keeps a failure short
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)
    return "done"
"""


@pytest.mark.parametrize("elsewhere", ["cancel", "stop", "stop-busy", "kill"])
def test_a_prompt_ends_with_the_run_moved_on_elsewhere(
    asks_project: Project, elsewhere: str
) -> None:
    """Cancelled by another client, suspended by a stop (also one that waits for another
    Run's Step: the host answers CLI_SERVICE_CLOSING meanwhile), or its host SIGKILLed:
    attach leaves the confirmation prompt and ends with exit 1 (cancelled, or no host), or
    75 when a stop suspended the Run (not ended: it exited 1, as for a failed Run)."""
    project = asks_project
    gate = project.root / "gate"
    if elsewhere == "stop-busy":
        (project.root / "workflows" / "busy.py").write_text(BUSY)
        (project.root / "intloom.toml").write_text(
            'workflows = ["workflows/triage.py", "workflows/busy.py"]\n')
    run_id, asked = at_the_confirmation(project, f"ticket {elsewhere}")
    if elsewhere == "stop-busy":
        ok(project.cli("flow", "busy", "--intent", str(gate), "--detach", "--json"))
    with Terminal(["--project", str(project.root), "attach", run_id], project.root,
                  timeout=PROMPT_DEADLINE) as term:
        term.expect("Confirmation requested:")
        term.expect("Confirm? [y/n]: ")
        if elsewhere == "cancel":
            cancelled = ok(project.cli("cancel", run_id, "--json"))["run"]
            assert cancelled["lastError"]["code"] == "RUN_STOPPED", cancelled
        elif elsewhere == "stop":
            ok(project.cli("stop", "--json"))
        elif elsewhere == "stop-busy":
            stops: list[CliResult] = []
            stopper = threading.Thread(target=lambda: stops.append(project.cli("stop")))
            stopper.start()
            try:  # the prompt is left while the stop still waits for the busy Step
                term.expect(f"{asked} was not answered: the host suspended the Run")
            finally:
                gate.touch()
                stopper.join(timeout=30)
            assert [s.code for s in stops] == [0], stops
        else:
            project.kill_host()
        code = term.finish()
        shown = term.rest()
    assert code == (75 if elsewhere.startswith("stop") else 1), term.text()
    assert "CONFLICT" not in shown, term.text()
    if elsewhere == "kill":  # nothing left to ask: says so, and how to look again
        assert "Failure · " in shown and "connection to the host was lost" in shown, term.text()
        assert f"intloom attach {run_id}" in shown, term.text()
    elif elsewhere == "cancel":
        assert f"{asked} is no longer pending (the Run moved on elsewhere)" in term.text()
    else:
        # Suspended: not "moved on elsewhere", which it said of a Run that had not moved.
        # Nor "the wait is kept for the next start": this confirmation has no recover, and
        # the host's message below says the next start reports the Run RUN_INTERRUPTED.
        assert (f"{asked} was not answered: the host suspended the Run while it waited "
                "(intloom stop, or a log it could not write); nothing was answered here. "
                "What the next start does with the wait follows.") in term.text(), term.text()
        assert "moved on elsewhere" not in term.text(), term.text()
        assert "the wait is kept" not in term.text(), term.text()
        assert ("The next start reports the Run RUN_INTERRUPTED: Step intake/signoff waits on "
                f"confirmation {asked} but its Step has no recover entry.") in shown, shown
    if elsewhere == "cancel":
        assert "RUN_STOPPED" in shown and "Failure · CLI_RUN_FAILED" in shown, term.text()
    if elsewhere.startswith("stop"):
        # Suspended, not ended: it said "Inspect the results before running again" of a Run
        # the next start brings back waiting (the title stays IntLoom's).
        assert "Inspect the results before running again" not in shown, term.text()
        assert "next intloom start restores the Run" in shown, term.text()
        assert "RUN_INTERRUPTED" in shown and "Failure" not in shown, term.text()
        assert (f"Suspended · The Run {run_id} was suspended by its host, not ended (its view "
                "reads failed/RUN_INTERRUPTED until the next start)") in shown, term.text()


@pytest.mark.parametrize("leave", ["eof", "ctrl-c", "ctrl-c-elsewhere"])
def test_eof_or_ctrl_c_at_a_prompt_detaches_and_leaves_the_run_waiting(
    asks_project: Project, leave: str
) -> None:
    project = asks_project
    run_id, asked = at_the_confirmation(project, f"ticket {leave}")
    # SIGINT at its default disposition in the child (a runner started in the background
    # has it ignored, and an ignored SIGINT is inherited).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        term = Terminal(["--project", str(project.root), "attach", run_id], project.root,
                        timeout=PROMPT_DEADLINE)
    finally:
        signal.signal(signal.SIGINT, previous)
    with term:
        term.expect("Confirm? [y/n]: ")
        if leave == "eof":
            term.keys("\x04")  # ^D at the start of a line: EOF
        else:
            interrupt(term.proc, leave)  # the pty is not its controlling terminal
        assert term.finish() == 0, term.text()
        # How to attach again, as before the first view (it said only "left as it was").
        assert (f"Detached from {run_id}; the Run is left as it was. intloom attach {run_id} "
                "attaches again.") in term.rest(), term.text()
    run = ok(project.cli("attach", run_id, "--json"))["run"]
    assert (run["status"], run["pendingAction"]["id"]) == ("waiting", asked), run


HINT = "Ctrl-C (or Ctrl-D) detaches without answering and leaves the Run waiting."


def test_the_first_prompt_says_once_how_to_leave_without_answering(
    asks_project: Project,
) -> None:
    """A person at attach's first prompt learned that Ctrl-C leaves it, and that the Run
    keeps waiting, only from the refusal of a wrong answer (at a confirmation). It is said
    once, above the first prompt, and not at the prompts after it; never with --json."""
    project = asks_project
    ok(project.cli("start", "--json"))
    run_id = ok(project.cli("flow", "triage", "--intent", "ticket 13", "--json"))["run"]["runId"]
    with Terminal(["--project", str(project.root), "attach", run_id], project.root,
                  timeout=PROMPT_DEADLINE) as term:
        first = term.expect("[a number or your own answer]: ")
        assert f"3. duplicate\r\n{HINT}\r\n[a number" in first, first
        term.type("1")
        term.expect("[your answer; Enter skips]: ")
        term.type("")
        term.expect("Confirm? [y/n]: ")
        term.type("y")
        term.expect("Feedback (optional, Enter to skip): ")
        term.type("")
        assert term.finish() == 0, term.text()
    assert term.text().count(HINT) == 1, term.text()
    waiting = ok(project.cli("flow", "triage", "--intent", "ticket 14", "--json"))["run"]
    with Terminal(["--project", str(project.root), "attach", waiting["runId"], "--json"],
                  project.root, timeout=PROMPT_DEADLINE) as term:
        assert term.finish() == 0, term.text()
    assert "detaches" not in term.text() and '"waiting"' in term.text(), term.text()


@pytest.mark.parametrize("where", ["prompt", "agent-task"])
def test_ctrl_c_typed_on_the_terminal_leaves_the_detach_on_a_line_of_its_own(
    asks_project: Project, where: str
) -> None:
    """Ctrl-C typed on a terminal shows ``^C`` where the cursor stands. While attach
    followed an Agent task (any wait between prompts), that was the start of a line, and
    the detach went on after it: "^CDetached from RUN-...". At a prompt, which ends its
    line after the ``^C``, no empty line comes before it either."""
    project = asks_project
    if where == "agent-task":
        (project.root / "workflows" / "handoff.py").write_text(AGENT_THEN_CONFIRM)
        toml = project.root / "intloom.toml"
        toml.write_text(toml.read_text().replace("]", ', "workflows/handoff.py"]'))
    ok(project.cli("start", "--json"))
    flow = "handoff" if where == "agent-task" else "triage"
    run = ok(project.cli("flow", flow, "--intent", "ticket 15", "--json"))["run"]
    run_id = run["runId"]
    before = ("detaches.\n" if where == "agent-task" else
              "[a number or your own answer]: ")
    with Terminal(["--project", str(project.root), "attach", run_id], project.root,
                  timeout=PROMPT_DEADLINE, controlling=True) as term:
        term.expect(before.replace("\n", "\r\n"))
        term.keys("\x03")  # Ctrl-C, as typed: the terminal echoes it and sends SIGINT
        assert term.finish() == 0, term.text()
    assert (f"{before}^C\nDetached from {run_id}; the Run is left as it was. intloom "
            f"attach {run_id} attaches again.\n") in term.text(), term.text()
    now = ok(project.cli("attach", run_id, "--json"))["run"]
    pending = ("pendingAgentCall" if where == "agent-task" else "pendingAction")
    assert (now["status"], now[pending]["id"]) == ("waiting", run[pending]["id"]), now


AGENT_THEN_CONFIRM = """
from typing import Any

import intloom

wf = intloom.Workflow("handoff", version="1")
main = wf.stage("main")


@main.agent_step("look", routes={"found": "check"})
def look(ctx: intloom.StepContext[None]) -> Any:
    return {"topic": ctx.intent}


@main.step("check", routes={"ok": intloom.COMPLETE, "no": intloom.COMPLETE})
async def check(ctx: intloom.StepContext[None]) -> str:
    answer = await ctx.confirm({"checked": ctx.intent})
    return "ok" if answer.confirmed else "no"
"""


@pytest.mark.parametrize("leave", ["agent", "ctrl-c", "ctrl-c-elsewhere"])
def test_attach_follows_a_run_through_its_agent_task_to_the_next_prompt(
    asks_project: Project, leave: str
) -> None:
    """On a terminal, attach to a Run waiting on a client Agent printed the Run and exited:
    it did not follow the live events (DESIGN: attach follows them), so the confirmation the
    Run asked once the Agent was done went unseen. It follows until the Agent completes the
    task, then prompts; Ctrl-C detaches meanwhile. A SIGINT whose handler ran before the
    wait for the task went to sleep (``ctrl-c-elsewhere``) was not seen by the wait: attach
    went on waiting, and only an event woke it; it detaches within a moment."""
    from intloom.client.client import Client

    project = asks_project
    (project.root / "workflows" / "handoff.py").write_text(AGENT_THEN_CONFIRM)
    toml = project.root / "intloom.toml"
    toml.write_text(toml.read_text().replace("]", ', "workflows/handoff.py"]'))
    ok(project.cli("start", "--json"))
    run = ok(project.cli("flow", "handoff", "--intent", "ticket 12", "--json"))["run"]
    run_id, call = run["runId"], run["pendingAgentCall"]["id"]
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        term = Terminal(["--project", str(project.root), "attach", run_id], project.root,
                        timeout=PROMPT_DEADLINE)
    finally:
        signal.signal(signal.SIGINT, previous)
    with term:
        term.expect(f"Waiting for the client Agent to complete or fail task {call}")
        if leave != "agent":
            interrupt(term.proc, leave)
            assert term.finish() == 0, term.text()
            assert (f"Detached from {run_id}; the Run is left as it was. intloom attach "
                    f"{run_id} attaches again.") in term.rest(), term.text()
            return
        with Client.connect(project.root) as agent:
            token, _ = agent.claim_agent_call(run_id, call, "agent-1")
            agent.complete_agent_call(run_id, call, token, "found", {})
        term.expect("Confirm? [y/n]: ")
        term.type("y")
        term.expect("Feedback (optional, Enter to skip): ")
        term.type("")
        assert term.finish() == 0, term.text()
        assert "Completed · handoff" in term.rest(), term.text()
        # Said once: it was repeated without end when the Step's records shared the wait's
        # millisecond (most Runs of this Workflow).
        assert term.text().count("Waiting for the client Agent") == 1, term.text()[:2000]
    assert answered(project, run_id) == {"isConfirmed": True}


def test_attach_without_an_event_stream_stops_following_an_agent_task(
    asks_project: Project,
) -> None:
    """When attach's event stream could not be opened (the host's connection cap) or was
    dropped while the Run waited on an Agent task, attach asked the Run again at once,
    without end: thousands of "Waiting for the client Agent" lines a second, each a request
    to the host. It says the stream ended and leaves the Run waiting (exit 0)."""
    from intloom.client.client import Client
    from intloom.errors import IntloomError

    project = asks_project
    (project.root / "workflows" / "handoff.py").write_text(AGENT_THEN_CONFIRM)
    toml = project.root / "intloom.toml"
    toml.write_text(toml.read_text().replace("]", ', "workflows/handoff.py"]'))
    # One connection: attach's own; the stream's is refused (BUSY).
    ok(project.cli("start", "--json", env={"INTLOOM_TEST_MAX_CONNECTIONS": "1"}))
    run = ok(project.cli("flow", "handoff", "--intent", "ticket 12", "--json"))["run"]
    run_id, call = run["runId"], run["pendingAgentCall"]["id"]

    def free() -> bool:  # the CLI's own connections are gone: attach gets the one slot
        try:
            Client.connect(project.root).close()
        except IntloomError:
            return False
        return True

    eventually(free, timeout=10, what="the host to serve a connection again")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        term = Terminal(["--project", str(project.root), "attach", run_id], project.root,
                        timeout=PROMPT_DEADLINE)
    finally:
        signal.signal(signal.SIGINT, previous)
    with term:
        assert term.finish() == 0, term.text()[:2000]
        text = term.text()
    assert text.count(f"complete or fail task {call}") == 1, text[:2000]
    assert (f"The Run's event stream ended (or could not be opened) while it still waits on "
            f"task {call}; attach stops following") in text, text[:2000]
    assert ok(project.cli("runs", "--json"))["runs"][0]["status"] == "waiting"


def test_attach_whose_stream_was_never_opened_says_so_not_that_it_read_too_slowly(
    soak_project: Project,
) -> None:
    """attach's event stream refused at the host's connection cap, then the host stopped:
    attach said the stream "ended before its last event (a host closes the stream of a
    follower that reads its events too slowly: its log then says follower_too_slow)", which
    no log said. It says the stream could not be opened, and why."""
    import subprocess
    import sys

    import psutil

    project = soak_project
    # One connection: attach's own; its stream's is refused (BUSY).
    ok(project.cli("start", "--json", env={"INTLOOM_TEST_MAX_CONNECTIONS": "1"}))
    run_id = ok(project.cli("flow", "soak-ticker", "--intent", "goal=100000 delay=0.05",
                            "--detach", "--json"))["run"]["runId"]
    port = json.loads((project.state / "connection.json").read_text())["port"]
    attach = subprocess.Popen(
        [sys.executable, "-m", "intloom", "--project", str(project.root), "attach", run_id],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "NO_COLOR": "1"})
    try:
        def connected() -> bool:  # attach holds the one slot: its main connection
            return any(c.raddr and c.raddr.port == port and c.status == "ESTABLISHED"
                       for c in psutil.Process(attach.pid).net_connections())

        eventually(connected, timeout=20, what="attach to connect")
        ok(project.cli("stop", "--json"))
        out, err = attach.communicate(timeout=30)
    finally:
        attach.kill()
        attach.wait()
    assert attach.returncode == 75, (out, err)  # suspended by the stop, not ended
    assert "RUN_INTERRUPTED" in out, out
    assert "too slowly" not in err and "follower_too_slow" not in err, err
    assert f"The event stream of Run {run_id} could not be opened (" in err, err


GATED = """
import os
import pathlib
import time

import intloom

wf = intloom.Workflow("gated", version="1")
main = wf.stage("main")


@main.step("ask", routes={"yes": "work", "no": intloom.COMPLETE})
async def ask(ctx: intloom.StepContext[None]) -> str:
    answer = await ctx.confirm({"go": ctx.intent})
    return "yes" if answer.confirmed else "no"


@main.step("work", routes={"done": intloom.COMPLETE})
def work(ctx: intloom.StepContext[None]) -> str:
    gate = pathlib.Path(ctx.intent)
    pathlib.Path(str(gate) + ".working").touch()
    deadline = time.monotonic() + 20  # the host is killed first; this keeps a failure short
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return "done"
"""


@pytest.fixture
def gated_project(tmp_path: Any) -> Iterator[Project]:
    from tests.helpers import one_source_project, reaped

    yield from reaped(one_source_project(tmp_path, "gated", GATED))


def test_an_answer_whose_reply_a_kill_took_is_said_taken_when_the_stream_showed_it(
        gated_project: Project) -> None:
    """Answered at attach's prompt, the Run went on into a long Step, and the host was
    killed: attach said "No reply came for the answer ... It was not replayed, since the
    host may have acted on it ... check before retrying" under the very lines that showed
    the answer taken and the next Step started, as if the answer might be lost."""
    project = gated_project
    gate = project.root / "gate"
    working = project.root / "gate.working"
    ok(project.cli("start", "--json"))
    run = ok(project.cli("flow", "gated", "--intent", str(gate), "--json"))["run"]
    asked = run["pendingAction"]["id"]
    with Terminal(["--project", str(project.root), "attach", run["runId"]], project.root,
                  timeout=PROMPT_DEADLINE) as term:
        term.expect("Confirm? [y/n]: ")
        term.type("y")
        term.expect("Feedback (optional, Enter to skip): ")
        term.type("")
        # The kill waits until attach has shown the Run gone on: the Step can be running
        # before attach has read the records that name it, and killed then, the host leaves
        # attach at the answered Step (CI saw it stop at 'executing main/ask', and say,
        # rightly, that main/ask went on with the answer).
        term.expect("main/work")
        eventually(working.exists, timeout=20, what="the Step after the confirmation to run")
        project.kill_host()
        code = term.finish()
        shown = term.rest()
    assert code == 1, term.text()
    assert "No reply came for the answer" not in shown, term.text()
    assert (f"An answer to {asked} was taken: the Run's events showed it answered, and "
            "the Run went on to main/work.") in shown, term.text()
    assert "Do not answer it again." in shown, term.text()
