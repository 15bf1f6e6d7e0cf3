"""What one Run hands the host is bounded (docs/authoring.md "Limits"), so it can never break
the commands of every other Run: an exception's message is cut with a marker (the host log
keeps more), a request for a person or an Agent past 256 KiB is refused before anything is
journaled, `runs` pages however many Runs there are, and a reply that still cannot be framed
is RESPONSE_TOO_LARGE naming the request, never a bare CLI_INTERNAL_ERROR. Real host, real
CLI and client, real sockets; every host is reaped."""

from __future__ import annotations

import asyncio
import json
import re
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import intloom
from intloom.authoring.loader import load_workflows
from intloom.client.client import Client
from intloom.errors import IntloomError
from intloom.executor.runtime import Runtime
from intloom.project import ProjectPaths, load_config
from intloom.protocol.messages import ListRuns, RunsReply
from intloom.store import Store
from tests.helpers import CliResult, Project, ok, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

GIANT = textwrap.dedent('''
    """Each Step hands the host something large; the intent picks which Step runs."""

    from typing import Any

    import msgspec

    import intloom

    class St(msgspec.Struct):
        n: int = 0

    KINDS = ["exc5m", "conf5m", "ask300k", "conf250k", "effect_fails", "long_key",
             "long_akey", "long_outcome", "uni", "ask_ctrl", "agent300k", "agent_big_tool"]
    wf = intloom.Workflow("giant", version="1.0.0")
    st = wf.stage("s", state=St)


    @st.step("d", routes={kind: kind for kind in KINDS})
    def d(ctx: intloom.StepContext[St]) -> str:
        return ctx.intent


    @st.step("exc5m", routes={"x": intloom.COMPLETE})
    def exc5m(ctx: intloom.StepContext[St]) -> str:
        raise RuntimeError("E" * 5_000_000)


    @st.step("conf5m", routes={"x": intloom.COMPLETE})
    async def conf5m(ctx: intloom.StepContext[St]) -> str:
        await ctx.confirm({"big": "C" * 5_000_000})
        return "x"


    @conf5m.recover  # so that a legacy Run waiting here restores waiting
    def conf5m_recover(ctx: intloom.StepContext[St], saved: intloom.Recovery) -> str:
        return "x"


    @st.step("ask300k", routes={"x": intloom.COMPLETE})
    async def ask300k(ctx: intloom.StepContext[St]) -> str:
        await ctx.ask([intloom.Question(id="q", question="Q" * 300_000)])
        return "x"


    @st.step("conf250k", routes={"x": intloom.COMPLETE})
    async def conf250k(ctx: intloom.StepContext[St]) -> str:
        await ctx.confirm({"big": "C" * 250_000})
        return "x"


    def _boom() -> None:
        raise ValueError("F" * 5_000_000)


    @st.step("effect_fails", routes={"x": intloom.COMPLETE})
    def effect_fails(ctx: intloom.StepContext[St]) -> str:
        try:
            ctx.effect("boom", _boom)
        except ValueError:
            pass
        return "x"


    def _count(root: str) -> None:
        with open(root + "/called.log", "a") as fh:
            fh.write("called\\n")


    @st.step("long_key", routes={"x": intloom.COMPLETE})
    def long_key(ctx: intloom.StepContext[St]) -> str:
        ctx.effect("charge", _count, __file__.rsplit("/workflows/", 1)[0], key="K" * 2000)
        return "x"


    @st.step("long_akey", routes={"x": intloom.COMPLETE})
    async def long_akey(ctx: intloom.StepContext[St]) -> str:
        await ctx.aeffect("charge", _count, __file__.rsplit("/workflows/", 1)[0],
                          key="K" * 2000)
        return "x"


    @st.step("long_outcome", routes={"x": intloom.COMPLETE})
    def long_outcome(ctx: intloom.StepContext[St]) -> str:
        return "o" * 5000


    @st.step("uni", routes={"x": intloom.COMPLETE})
    def uni(ctx: intloom.StepContext[St]) -> str:
        raise ValueError("ünïcødé 💥 \\x00 nul \\n newline \\x1b[31mred \\u202e rtl \\x9b csi")


    @st.step("ask_ctrl", routes={"x": intloom.COMPLETE})
    async def ask_ctrl(ctx: intloom.StepContext[St]) -> str:
        await ctx.ask([intloom.Question(id="q", question="clear?\\x1b[2J now",
                                        options=[intloom.Option(id="a", label="é\\x07b")])])
        return "x"


    @st.agent_step("agent300k", routes={"x": intloom.COMPLETE})
    def agent300k(ctx: intloom.StepContext[St]) -> Any:
        return {"doc": "A" * 300_000}


    def _huge(_input: Any) -> str:
        return "T" * 5_000_000


    @st.agent_step("agent_big_tool", routes={"x": intloom.COMPLETE},
                   tools=[intloom.Tool("huge", _huge)])
    def agent_big_tool(ctx: intloom.StepContext[St]) -> Any:
        return {"task": "call huge"}
''')

# The documented limits (docs/authoring.md "Limits"), as a user reads them.
MAX_MESSAGE = 4096
MAX_REQUEST_BYTES = 262_144
MARKER = re.compile(r"\.\.\. \[[\d,]+ more characters cut\]$")


@pytest.fixture
def giant(tmp_path: Path) -> Iterator[Project]:
    root = tmp_path / "proj"
    (root / "workflows" / "giant").mkdir(parents=True)
    (root / "workflows" / "giant" / "giant.py").write_text(GIANT)
    (root / "intloom.toml").write_text('workflows = ["workflows/giant/giant.py"]\n')
    project = Project(root=root)
    yield from reaped(project)


def _flow(project: Project, kind: str, *extra: str) -> CliResult:
    return project.cli("flow", "giant", "--intent", kind, *extra)


def _failed(project: Project, kind: str) -> dict[str, Any]:
    result = _flow(project, kind, "--json")
    assert result.code == 1, (result.code, result.stdout[:500], result.stderr[:500])
    run: dict[str, Any] = result.json["run"]
    assert run["status"] == "failed", run
    return run


def _records(project: Project, run_id: str) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = ok(project.cli("inspect", run_id, "--json"))["records"]
    return records


def _log(project: Project, event: str) -> list[dict[str, Any]]:
    result = project.cli("logs", "--json")
    assert result.code == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines() if line]
    return [line for line in lines if line.get("event") == event]


def test_a_huge_exception_message_is_cut_and_every_command_still_works(giant: Project) -> None:
    ok(giant.cli("start", "--json"))
    text = _flow(giant, "exc5m")
    assert text.code == 1, (text.code, text.stderr[:500])
    run_id = re.search(r"^Run\s+(RUN-\S+)$", text.stdout, re.M)
    assert run_id is not None, text.stdout[:500]  # the Run id is printed
    assert "Failure · CLI_RUN_FAILED" in text.stderr
    run = _failed(giant, "exc5m")
    error = run["lastError"]
    assert error["code"] == "STEP_EXECUTION_FAILED"
    message = error["message"]
    # Where it raised comes before the text, which is cut.
    line = GIANT.splitlines().index('    raise RuntimeError("E" * 5_000_000)') + 1
    assert message.startswith(f"Stage 's', Step 'exc5m' raised RuntimeError at line {line} of "
                              "workflows/giant/giant.py: EEEE"), message[:120]
    # 4,096 characters kept, then the marker naming what was cut.
    assert message[:MAX_MESSAGE].endswith("E") and len(message) < MAX_MESSAGE + 60
    assert MARKER.search(message) and "4,995,9" in message, message[-60:]
    # One Run's failure breaks no command of the host.
    runs = ok(giant.cli("runs", "--json"))["runs"]
    assert {r["runId"] for r in runs} == {run_id.group(1), run["runId"]}
    assert giant.cli("runs").code == 0
    attached = giant.cli("attach", run["runId"], "--json")
    assert attached.code == 1 and attached.json["run"]["lastError"] == error  # it failed
    assert ok(giant.cli("cancel", run["runId"], "--json"))["run"]["lastError"] == error
    # The journal keeps the cut message; the host log keeps more of it, bounded too.
    [terminal] = [r for r in _records(giant, run["runId"]) if r["phase"] == "terminal"]
    assert terminal["record"]["error"]["message"] == message
    cut = [c for c in _log(giant, "run_message_cut") if c["runId"] == run["runId"]]
    assert cut and cut[0]["characters"] == 5_000_000 + len(message.split("EEE")[0])
    assert 64 * 1024 <= len(cut[0]["message"]) < 64 * 1024 + 60
    ok(giant.cli("stop", "--json"))


@pytest.mark.parametrize(("kind", "what", "size"), [
    ("conf5m", "the context given to ctx.confirm", "5,000,0"),
    ("ask300k", "the questions given to ctx.ask", "300,0"),
    ("agent300k", "the Agent task it returned", "300,0"),
])
def test_a_request_over_the_limit_is_refused_before_it_is_journaled(
    giant: Project, kind: str, what: str, size: str
) -> None:
    ok(giant.cli("start", "--json"))
    run = _failed(giant, kind)
    error = run["lastError"]
    assert error["code"] == "STEP_INTERACTION_INVALID", error
    message = error["message"]
    assert message.startswith(f"Stage 's', Step '{kind}': {what} is {size}"), message
    assert f"over the {MAX_REQUEST_BYTES:,}-byte limit" in message
    assert "nothing was recorded" in message and "instead" in message  # the fix
    phases = [r["phase"] for r in _records(giant, run["runId"])]
    assert "waiting" not in phases and phases[-1] == "terminal", phases
    assert ok(giant.cli("runs", "--json"))["runs"] == [run]
    ok(giant.cli("stop", "--json"))


def test_effect_failures_keys_and_outcomes_are_bounded_in_the_journal(giant: Project) -> None:
    ok(giant.cli("start", "--json"))
    done = ok(_flow(giant, "effect_fails", "--json"))["run"]
    assert done["status"] == "completed"
    [effect] = [r["record"] for r in _records(giant, done["runId"]) if r["phase"] == "effect_done"]
    assert effect["error"].startswith("ValueError: FFFF") and MARKER.search(effect["error"])
    assert len(effect["error"]) < MAX_MESSAGE + 60

    for kind, call in (("long_key", "ctx.effect"), ("long_akey", "ctx.aeffect")):
        keyed = _failed(giant, kind)
        assert keyed["lastError"]["code"] == "STEP_INTERACTION_INVALID"
        message = keyed["lastError"]["message"]
        assert message.startswith(f"Stage 's', Step '{kind}': the effect key given to {call} "
                                  "is 2,000 characters"), message
        assert "over the 1,024-character limit; the effect was not called" in message
        assert not (giant.root / "called.log").exists()
        phases = [r["phase"] for r in _records(giant, keyed["runId"])]
        assert "effect_started" not in phases, phases

    routed = _failed(giant, "long_outcome")
    assert routed["lastError"]["code"] == "STEP_OUTCOME_NOT_HANDLED"
    assert "returned an outcome of 5,000 characters" in routed["lastError"]["message"]
    # The cut is counted on the whole repr (5,002 characters), not on a shortened one.
    assert "... [4,922 more characters cut])" in routed["lastError"]["message"]
    assert "over the 1,024-character limit; it was not recorded" in routed["lastError"]["message"]
    assert len(routed["lastError"]["message"]) < 300
    results = [r["record"]["step"] for r in _records(giant, routed["runId"])
               if r["phase"] == "step_result"]
    assert results == ["d"], results  # the picking Step's only: the long one is not recorded
    ok(giant.cli("stop", "--json"))


def test_runs_lists_every_run_when_together_they_exceed_a_frame(giant: Project) -> None:
    ok(giant.cli("start", "--json"))
    with Client.connect(giant.root) as client:
        created = [client.create_run("giant", "conf250k") for _ in range(20)]
        assert all(run.status == "waiting" for run in created)
        # Twenty 250 KB confirmations: ~5 MB of views, over the 4 MiB frame. A client that
        # does not page gets a clear error naming its request and the way out.
        with pytest.raises(IntloomError) as too_large:
            client._call(ListRuns(), RunsReply)
        assert too_large.value.code == "RESPONSE_TOO_LARGE"
        message = too_large.value.message
        assert message.startswith("The host's reply to the ListRuns request (RunsReply, 5,0")
        assert "over the 4,194,304-byte frame limit" in message and "pages" in message
        assert client.get_run(created[0].run_id) == created[0]  # the connection goes on
        assert client.runs() == created  # paged: all of them, in order, in full
    listed = ok(giant.cli("runs", "--json"))["runs"]
    assert [r["runId"] for r in listed] == [r.run_id for r in created]
    assert all(len(r["pendingAction"]["request"]["context"]["big"]) == 250_000 for r in listed)
    text = giant.cli("runs")
    assert text.code == 0, text.stderr
    assert text.stdout.count(" waits on ") == 20
    assert ok(giant.cli("runs", "--flow", "giant", "--json"))["runs"] == listed
    ok(giant.cli("stop", "--json"))


def _legacy_run(project: Project, monkeypatch: pytest.MonkeyPatch) -> str:
    """A Run waiting on a 5 MB confirmation, journaled as an intloom without request limits
    did: the real Runtime and store, in this process, with the limit lifted."""
    monkeypatch.setattr("intloom.executor.runtime.MAX_REQUEST_BYTES", 1 << 30)

    async def write() -> str:
        loaded = load_workflows(project.root, load_config(project.root))
        store = Store.open(ProjectPaths(project.root).runtime, instance_id=str(uuid.uuid4()),
                           package_version=intloom.__version__)
        rt = Runtime(loaded.workflows, store, package_version=intloom.__version__)
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("giant", "conf5m")).run_id)
        assert view.status == "waiting", view
        await rt.suspend(grace=1.0)
        await store.close()
        return view.run_id

    return asyncio.run(asyncio.wait_for(write(), timeout=30))


def test_a_view_too_large_to_send_names_the_run_and_the_way_out(
    giant: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    ok(giant.cli("start", "--json"))
    ok(giant.cli("stop", "--json"))
    run_id = _legacy_run(giant, monkeypatch)
    start = ok(giant.cli("start", "--json"))
    assert start["service"]["restore"]["waiting"] == [run_id]
    listed = giant.cli("runs", "--json")
    assert listed.code == 1, listed
    error = listed.json["error"]
    assert error["code"] == "RESPONSE_TOO_LARGE", error
    assert error["message"].startswith(f"Run {run_id}'s view is 5,0"), error
    assert f"intloom cancel {run_id}" in error["message"]
    attached = giant.cli("attach", run_id, "--json")
    assert attached.code == 1 and attached.json["error"]["code"] == "RESPONSE_TOO_LARGE"
    message = attached.json["error"]["message"]
    assert f"Run {run_id} exists (waiting)" in message, message
    assert f"intloom inspect {run_id}" in message
    text = giant.cli("runs")
    assert text.code == 1 and text.stderr.startswith("Failure · RESPONSE_TOO_LARGE: "), text
    # The way out works, and then every command does again.
    assert ok(giant.cli("cancel", run_id, "--json"))["run"]["status"] == "failed"
    assert [r["runId"] for r in ok(giant.cli("runs", "--json"))["runs"]] == [run_id]
    ok(giant.cli("stop", "--json"))


def test_a_tool_output_too_large_to_send_is_named_not_internal(giant: Project) -> None:
    ok(giant.cli("start", "--json"))
    with Client.connect(giant.root) as client:
        run = client.create_run("giant", "agent_big_tool")
        call = run.pending_agent_call
        assert call is not None, run
        token, _ = client.claim_agent_call(run.run_id, call.id, "agent-1")
        with pytest.raises(IntloomError) as too_large:
            client.call_tool(run.run_id, call.id, token, "tc-1", "huge", None)
        assert too_large.value.code == "RESPONSE_TOO_LARGE", too_large.value
        message = too_large.value.message
        assert "reply to the CallTool request (ToolResult, 5,0" in message, message
        assert "Make the Tool return less" in message
        # The retry it offered as a way to the output was refused the same way.
        with pytest.raises(IntloomError) as again:
            client.call_tool(run.run_id, call.id, token, "tc-1", "huge", None)
        assert again.value.code == "RESPONSE_TOO_LARGE", again.value
        assert ("is not run again and gets this same refusal" in message
                and "complete or fail the task without this output" in message), message
        assert client.get_run(run.run_id).status == "waiting"  # the connection goes on
    logged = _log(giant, "reply_too_large")
    assert logged and logged[-1]["request"] == "CallTool", logged
    ok(giant.cli("stop", "--json"))


def test_an_intent_over_one_mib_creates_no_run(giant: Project) -> None:
    ok(giant.cli("start", "--json"))
    with Client.connect(giant.root) as client:
        with pytest.raises(IntloomError) as refused:
            client.create_run("giant", "x" * (1 << 20) + "x")
        assert refused.value.code == "INVALID_REQUEST"
        assert refused.value.message.startswith(
            "The intent is 1,048,577 bytes, over the 1,048,576-byte limit; no Run was created.")
        for blank in ("", " \n\t"):  # one message for both, naming the fix
            with pytest.raises(IntloomError) as refused:
                client.create_run("giant", blank)
            assert (refused.value.code, refused.value.message) == ("INVALID_REQUEST", (
                "The intent is blank (empty or only whitespace); no Run was created. Say what "
                "the Run is for.")), blank
        assert client.runs() == []
    ok(giant.cli("stop", "--json"))


def test_text_output_escapes_control_characters(giant: Project) -> None:
    ok(giant.cli("start", "--json"))
    text = _flow(giant, "uni")
    assert text.code == 1
    shown = ("of workflows/giant/giant.py: ünïcødé 💥 \\x00 nul \\n newline \\x1b[31mred "
             "\\u202e rtl \\x9b csi")
    assert shown in text.stdout, text.stdout
    for stream in (text.stdout, text.stderr):
        assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]", stream), repr(stream)
    [line] = [ln for ln in text.stdout.splitlines() if ln.startswith("STEP_EXECUTION_FAILED")]
    assert line.endswith("csi")  # the message's newline did not break its line
    # JSON stays exact: the original characters, JSON-escaped.
    run = _failed(giant, "uni")
    assert run["lastError"]["message"].endswith(
        "ünïcødé 💥 \x00 nul \n newline \x1b[31mred \u202e rtl \x9b csi")
    asked = _flow(giant, "ask_ctrl")
    assert asked.code == 0, asked.stderr
    listing = giant.cli("runs")
    for out in (asked.stdout, listing.stdout):
        assert "clear?\\x1b[2J now" in out and "a (é\\x07b)" in out, out
        assert "\x1b" not in out and "\x07" not in out
    ok(giant.cli("stop", "--json"))
