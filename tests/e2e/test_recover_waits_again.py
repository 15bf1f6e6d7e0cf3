"""A ``recover`` that waits again and is answered in the same host is still ``recover``: the
``executing`` written with that answer was folded as the Step's, so what recover did next was
named as the Step's body (which had not run) -- its mistakes ("Stage 'main', Step 'x': the
effect key ...") and, after a crash, the effect it had in flight ("Step main/x was running
effect ..."), where the docs promise "the recover entry". Real host, real CLI subprocesses, a
real stop and a real SIGKILL; every process is reaped."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Project, eventually, ok, one_source_project, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

AGAIN = textwrap.dedent('''
    import asyncio
    import pathlib

    import msgspec

    import intloom


    class S(msgspec.Struct):
        n: int = 0


    wf = intloom.Workflow("again", version="1.0.0")
    main = wf.stage("main", state=S)


    @main.step("pick", routes={"long_key": "long_key", "in_flight": "in_flight",
                               "charges": "charges"})
    def pick(ctx: intloom.StepContext[S]) -> str:
        return ctx.intent


    MARKER = pathlib.Path(__file__).resolve().parent.parent / "charges.log"


    async def forever() -> None:
        await asyncio.Event().wait()  # the host is killed while it runs


    async def rec_long_key(ctx, saved):
        await ctx.confirm({"second": "long_key"})
        await ctx.aeffect("x", forever, key="k" * 2000)
        return "done"


    async def rec_in_flight(ctx, saved):
        await ctx.confirm({"second": "in_flight"})
        await ctx.aeffect("hold", forever)
        return "done"


    def charge(marker):
        with open(marker, "a") as fh:  # outside the journal: how often it really ran
            fh.write("charged\\n")
        return "ch_1"


    async def rec_charges(ctx, saved):
        await ctx.aeffect("charge", charge, MARKER)
        await ctx.confirm({"charged": True})
        return "done"


    def waits(kind):
        @main.step(kind, routes={"done": intloom.COMPLETE})
        async def step(ctx: intloom.StepContext[S]) -> str:
            await ctx.confirm({"first": kind})
            return "done"

        step.recover(globals()[f"rec_{kind}"])


    for kind in ("long_key", "in_flight", "charges"):
        waits(kind)
''')

YES = '{"isConfirmed": true}'


@pytest.fixture
def again(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "again", AGAIN))


def _recover_asks_again(project: Project, kind: str, run: dict[str, Any]) -> str:
    """Answer the restored wait: recover runs and asks again; its new action's id."""
    view = ok(project.cli("answer", run["runId"], run["pendingAction"]["id"], YES,
                          "--json"))["run"]
    assert view["status"] == "waiting", view
    assert view["pendingAction"]["request"] == {"context": {"second": kind}}, view
    return str(view["pendingAction"]["id"])


def _phase(project: Project, run_id: str) -> str | None:
    phase: str | None = project.cli("inspect", run_id, "--json").json["run"].get("phase")
    return phase


def test_what_recover_does_after_its_own_answer_is_named_as_recovers(again: Project) -> None:
    ok(again.cli("start", "--json"))
    runs = {kind: ok(again.cli("flow", "again", "--intent", kind, "--json"))["run"]
            for kind in ("long_key", "in_flight")}
    ok(again.cli("stop", "--json"))
    ok(again.cli("start", "--json"))  # each answer now goes to the Step's recover
    second = {kind: _recover_asks_again(again, kind, run) for kind, run in runs.items()}

    run_id = runs["long_key"]["runId"]
    failed = again.cli("answer", run_id, second["long_key"], YES, "--json").json["run"]
    assert failed["lastError"]["code"] == "STEP_INTERACTION_INVALID", failed
    assert failed["lastError"]["message"].startswith(
        "Stage 'main', Step 'long_key' recover: the effect key given to ctx.aeffect is 2,000 "
        "characters"), failed

    # The answer's reply waits for a Run that never settles: its client dies with the host.
    run_id = runs["in_flight"]["runId"]
    answering = subprocess.Popen(
        [sys.executable, "-m", "intloom", "--project", str(again.root), "answer", run_id,
         second["in_flight"], YES, "--json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        eventually(lambda: _phase(again, run_id) == "effect_started", timeout=30,
                   what="recover's effect 'hold' to be journaled as started")
        again.kill_host()
        answering.wait(timeout=30)
    finally:
        if answering.poll() is None:
            answering.kill()
            answering.wait()
    ok(again.cli("recover", "--json"))
    ok(again.cli("start", "--json"))
    view = ok(again.cli("runs", "--json"))["runs"]
    error = next(run for run in view if run["runId"] == run_id)["lastError"]
    assert error["code"] == "RUN_INTERRUPTED", error
    assert "the recover entry of Step main/in_flight was running effect 'hold' (key 'hold#1'" \
        in error["message"], error
    ok(again.cli("stop", "--json"))


def _charged_then_asked_again(again: Project) -> tuple[dict[str, Any], dict[str, Any]]:
    """A "charges" Run, stopped at its confirmation and restarted, answered: recover calls
    its effect once, then asks again. The Run as created, and its view asking again."""
    ok(again.cli("start", "--json"))
    run = ok(again.cli("flow", "again", "--intent", "charges", "--json"))["run"]
    ok(again.cli("stop", "--json"))
    ok(again.cli("start", "--json"))
    view = ok(again.cli("answer", run["runId"], run["pendingAction"]["id"], YES,
                        "--json"))["run"]
    assert view["pendingAction"]["request"] == {"context": {"charged": True}}, view
    assert (again.root / "charges.log").read_text() == "charged\n"
    return run, view


def test_a_wait_recover_makes_after_an_effect_is_not_restored_to_call_it_again(
        again: Project) -> None:
    """Answered after a restart, such a wait calls recover again from its start, and recover
    called the effect it had recorded again (the journal held 'charge#1' done twice)."""
    run, view = _charged_then_asked_again(again)
    marker = again.root / "charges.log"
    ok(again.cli("stop", "--json"))
    preview = again.cli("doctor", "--json").json
    ok(again.cli("start", "--json"))
    runs = ok(again.cli("runs", "--json"))["runs"]
    error = next(r for r in runs if r["runId"] == run["runId"])["lastError"]
    assert error["code"] == "RUN_INTERRUPTED", error
    assert ("the recover entry of Step main/charges waits on confirmation "
            f"{view['pendingAction']['id']} after it ran effect 'charge' (key 'charge#1', "
            in error["message"]), error
    assert "recover would run again from its start and call it again" in error["message"]
    assert "recover would run again" in json.dumps(preview), preview
    refused = again.cli("answer", run["runId"], view["pendingAction"]["id"], YES, "--json")
    assert refused.code == 1 and refused.json["error"]["code"] == "CONFLICT", refused
    assert marker.read_text() == "charged\n"
    ok(again.cli("stop", "--json"))


def test_an_older_folds_snapshot_of_such_a_wait_is_folded_again_not_trusted(
        again: Project) -> None:
    """A snapshot written before the fold derived ``recover_effect`` says none: trusted after
    an upgrade, doctor called the Run healthy, start restored the wait, and its answer ran
    recover -- and the effect -- again, while verify called the snapshot corrupt. The Run is
    folded again from its records, as without a snapshot."""
    import msgspec

    from intloom.store.snapshots import encode_snapshot, read_snapshot, snapshot_name

    run, view = _charged_then_asked_again(again)
    marker = again.root / "charges.log"
    ok(again.cli("stop", "--json"))
    path = again.state / "runtime" / "snap" / "live" / snapshot_name(run["runId"])
    snap = read_snapshot(path)
    assert snap is not None and snap.state is not None and snap.fold == 1, snap
    assert snap.state.recover_effect is not None
    # As an intloom before 2026-12-02 wrote it: no recover fields, no fold.
    older = msgspec.structs.replace(snap, fold=0, state=msgspec.structs.replace(
        snap.state, recover_effect=None, recover_resumed=False))
    mode = path.stat().st_mode
    path.chmod(0o600)
    path.write_bytes(encode_snapshot(older))
    path.chmod(mode)

    verified = again.cli("verify", "--json")
    assert verified.code == 0 and verified.json["sound"], verified.stdout
    preview = json.dumps(again.cli("doctor", "--json").json)
    assert "recover would run again from its start and call it again" in preview, preview
    ok(again.cli("start", "--json"))
    runs = ok(again.cli("runs", "--json"))["runs"]
    error = next(r for r in runs if r["runId"] == run["runId"])["lastError"]
    assert error["code"] == "RUN_INTERRUPTED", error
    assert "after it ran effect 'charge' (key 'charge#1'" in error["message"], error
    refused = again.cli("answer", run["runId"], view["pendingAction"]["id"], YES, "--json")
    assert refused.code == 1 and refused.json["error"]["code"] == "CONFLICT", refused
    assert marker.read_text() == "charged\n"
    ok(again.cli("stop", "--json"))
