"""A Workflow whose definition changed outside its source tree while Runs were unfinished.

The identity covers the Workflow's source tree only (docs/authoring.md, "Changing a
Workflow"): code imported from elsewhere in the project -- here a builder in ``common/``
that declares the Stages and Steps -- can change without changing it. A restart must still
never drive a Run from a place the loaded Workflow no longer has, nor let one Run's saved
State stop the host: such a Run is held (needs attention, journal kept) by ``start`` and in
``doctor``'s preview alike, and continues once the code is back. Real host, real CLI.
"""

from __future__ import annotations

import contextlib
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from intloom.authoring.loader import load_workflows
from intloom.client import Client
from intloom.errors import IntloomError
from intloom.project import ProjectPaths, load_config
from intloom.runtime.records import Header, Record, StagePending
from intloom.store import read_history
from intloom.store.writer import Store
from tests.helpers import (
    CliResult,
    Project,
    eventually,
    make_project,
    ok,
    reaped,
    started_waiting,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# The builder, outside the entry's tree (workflows/): NEXT names the second Step.
PARTS = textwrap.dedent('''
    import os
    import time

    import msgspec

    import intloom

    NEXT = "second"


    class Draft(msgspec.Struct):
        text: str = ""
        attempts: int = 0
        POST_INIT


    def _held_until_released(marker: str) -> str:
        deadline = time.monotonic() + 60
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.02)  # a poll: the test writes the marker once the stop has begun
        return "released"


    def build(wf):
        s = wf.stage("s", state=Draft)

        @s.step("first", routes={"done": NEXT, "wait": "review"})
        def first(ctx):
            if ctx.intent == "wait":
                ctx.state = Draft(text="draft", attempts=1)
                return "wait"
            ctx.effect("hold", _held_until_released, ctx.intent)
            return "done"

        @s.step(NEXT, routes={"done": intloom.COMPLETE})
        def second(ctx):
            return "done"

        @s.step("review", routes={"yes": intloom.COMPLETE, "no": intloom.COMPLETE})
        async def review(ctx):
            answer = await ctx.confirm({"text": ctx.state.text})
            return "yes" if answer.confirmed else "no"

        @review.recover
        def review_recover(ctx, saved):
            return "yes" if saved.answer.confirmed else "no"
''')
ENTRY = textwrap.dedent('''
    import intloom
    from common.parts import build

    wf = intloom.Workflow("shared", version="1")
    build(wf)
''')
NO_POST_INIT = "pass"
AT = "2026-11-30T00:00:00.000Z"


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Project]:
    root = tmp_path / "proj"
    (root / "workflows").mkdir(parents=True)
    (root / "common").mkdir()
    (root / "common" / "__init__.py").write_text("")
    _parts(root, NO_POST_INIT)
    (root / "workflows" / "flow.py").write_text(ENTRY)
    (root / "intloom.toml").write_text('workflows = ["workflows/flow.py"]\n')
    yield from reaped(Project(root=root))


# Why a Run is held whose identity is as it was (intloom.authoring.compat).
OUTSIDE = ("the Workflow's source tree is as it was, so this changed outside it, which the "
           "identity does not cover")


def _parts(root: Path, post_init: str, next_step: str = "second") -> None:
    text = PARTS.replace("POST_INIT", post_init).replace('NEXT = "second"',
                                                         f"NEXT = {next_step!r}")
    (root / "common" / "parts.py").write_text(text)


def _wal(project: Project) -> dict[str, bytes]:
    return {p.name: p.read_bytes()
            for p in sorted((project.state / "runtime" / "wal").iterdir())}


def _stopping(project: Project) -> bool:
    try:
        with Client.connect(project.root) as probe:
            probe.runs()
    except IntloomError as exc:
        return exc.code == "CLI_SERVICE_CLOSING"
    return False


def _stop_then_release(project: Project, marker: Path) -> None:
    """A graceful stop while the first Step's effect is held; released once the stop has
    begun, so the Step ends in its grace and the Run is suspended at its next Step."""
    stops: list[CliResult] = []
    stopper = threading.Thread(target=lambda: stops.append(project.cli("stop", "--timeout",
                                                                       "30", "--json")))
    stopper.start()
    try:
        eventually(lambda: _stopping(project), timeout=15, what="the stop to begin")
    finally:
        marker.write_text("go")
        stopper.join(timeout=40)
    [stopped] = stops
    assert stopped.code == 0, stopped.stderr


def _ended(project: Project, run_id: str) -> dict[str, Any] | None:
    [run] = [r for r in ok(project.cli("runs", "--json"))["runs"] if r["runId"] == run_id]
    return run if run["status"] not in ("running",) else None


def _preview(project: Project, run_id: str) -> dict[str, Any]:
    doctor = project.cli("doctor", "--json")
    [found] = [r for r in doctor.json["runs"] if r["runId"] == run_id]
    return {"code": doctor.code, **found}


def test_a_run_at_a_step_the_loaded_workflow_no_longer_has_is_held_not_failed(
    shared: Project,
) -> None:
    marker = shared.root / "release"
    ok(shared.cli("start", "--json"))
    run_id = ok(shared.cli("flow", "shared", "--intent", str(marker), "--detach",
                           "--json"))["run"]["runId"]
    _stop_then_release(shared, marker)
    assert _preview(shared, run_id)["verdict"]["row"] == "resume"

    _parts(shared.root, NO_POST_INIT, next_step="third")  # renamed outside the tree
    before = _wal(shared)
    preview = _preview(shared, run_id)
    assert preview["code"] == 3, preview
    assert preview["verdict"]["row"] == "needs_attention", preview
    assert "Step s/second" in preview["problem"], preview
    restore = ok(shared.cli("start", "--json"))["service"]["restore"]
    assert restore["needsAttention"] == [run_id], restore
    held = shared.cli("attach", run_id, "--json")
    assert held.code == 1 and held.json["error"]["code"] == "JOURNAL_INCOMPATIBLE", held
    assert "Step s/second" in held.json["error"]["message"]
    ok(shared.cli("stop", "--json"))
    after = _wal(shared)  # each host opens a segment of its own; the old ones as they were
    assert {name: after[name] for name in before} == before

    _parts(shared.root, NO_POST_INIT)  # the code is back: the Run continues
    restore = ok(shared.cli("start", "--json"))["service"]["restore"]
    assert restore["resumed"] == [run_id], restore
    run = eventually(lambda: _ended(shared, run_id), timeout=20, what="the Run to end")
    assert run["status"] == "completed", run
    ok(shared.cli("stop", "--json"))


def test_a_wait_in_a_step_the_loaded_workflow_no_longer_has_is_held(shared: Project) -> None:
    run_id, action = started_waiting(shared, "shared", "wait")
    ok(shared.cli("stop", "--json"))
    text = (shared.root / "common" / "parts.py").read_text()
    (shared.root / "common" / "parts.py").write_text(
        text.replace('"wait": "review"', '"wait": "approve"')
        .replace('@s.step("review"', '@s.step("approve"'))

    preview = _preview(shared, run_id)
    assert preview["verdict"]["row"] == "needs_attention", preview  # not "no recover entry"
    assert "Step s/review" in preview["problem"], preview
    restore = ok(shared.cli("start", "--json"))["service"]["restore"]
    assert restore["needsAttention"] == [run_id] and restore["interrupted"] == [], restore
    listed = shared.cli("runs")  # "no Runs" alone would hide it from a person
    assert listed.code == 0, listed
    assert "The current service has no Runs." in listed.stdout, listed
    assert f"Not listed, needs attention (journal kept as is, not loaded): {run_id}. Run " \
        "intloom doctor." in " ".join(listed.stdout.split()), listed
    # A script reading runs --json is told of it too, beside DESIGN's document.
    assert ok(shared.cli("runs", "--json")) == {"runs": [], "needsAttention": [run_id],
                                                "needsAttentionCount": 1}
    assert ok(shared.cli("runs", "--flow", "shared", "--json")) == {"runs": []}
    ok(shared.cli("stop", "--json"))

    (shared.root / "common" / "parts.py").write_text(text)
    restore = ok(shared.cli("start", "--json"))["service"]["restore"]
    assert restore["waiting"] == [run_id], restore
    answered = ok(shared.cli("answer", run_id, action, '{"isConfirmed": true}', "--json"))
    assert answered["run"]["status"] == "completed", answered
    ok(shared.cli("stop", "--json"))


# A check added to the State class (outside the tree: the identity does not change, nor does
# the State's JSON Schema) that the State saved with the wait no longer passes.
CHECKED = {
    "ValueError": ("def __post_init__(self):\n"
                   "        if self.attempts:\n"
                   "            raise ValueError('attempts must be 0')"),
    "AssertionError": ("def __post_init__(self):\n"
                       "        assert not self.attempts, 'attempts must be 0'"),
}


def _waiting_and_done(project: Project) -> tuple[str, str]:
    """One Run waiting on its confirmation (its State saved with attempts=1), one ended."""
    ok(project.cli("start", "--json"))
    waiting = ok(project.cli("flow", "shared", "--intent", "wait", "--json"))["run"]
    other = ok(project.cli("flow", "shared", "--intent", "wait", "--json"))["run"]
    ok(project.cli("answer", other["runId"], other["pendingAction"]["id"],
                   '{"isConfirmed": true}', "--json"))
    ok(project.cli("stop", "--json"))
    return waiting["runId"], waiting["pendingAction"]["id"]


@pytest.mark.parametrize("raised", sorted(CHECKED))
def test_a_saved_state_the_state_class_now_refuses_holds_its_run_only(
    shared: Project, raised: str,
) -> None:
    run_id, action = _waiting_and_done(shared)
    _parts(shared.root, CHECKED[raised])
    started = shared.cli("start", "--json")  # one Run's State never stops the host
    assert started.code == 0, (started.stdout, started.stderr)
    restore = started.json["service"]["restore"]
    assert restore["needsAttention"] == [run_id], restore
    message = shared.cli("answer", run_id, action, '{"isConfirmed": true}', "--json")
    assert message.json["error"]["code"] == "JOURNAL_INCOMPATIBLE", message
    assert "attempts must be 0" in message.json["error"]["message"], message
    ok(shared.cli("stop", "--json"))

    _parts(shared.root, NO_POST_INIT)
    assert ok(shared.cli("start", "--json"))["service"]["restore"]["waiting"] == [run_id]
    ok(shared.cli("stop", "--json"))


@pytest.mark.parametrize("raised", sorted(CHECKED))
def test_doctor_and_inspect_preview_a_refused_saved_state_as_start_holds_it(
    shared: Project, raised: str,
) -> None:
    run_id, _action = _waiting_and_done(shared)
    _parts(shared.root, CHECKED[raised])
    preview = _preview(shared, run_id)  # doctor said healthy and restore_wait
    assert preview["code"] == 3, preview
    assert preview["verdict"]["row"] == "needs_attention", preview
    assert "attempts must be 0" in preview["problem"], preview
    inspected = ok(shared.cli("inspect", run_id, "--json"))
    assert inspected["run"]["restart"]["row"] == "needs_attention", inspected["run"]
    restore = ok(shared.cli("start", "--json"))["service"]["restore"]
    assert restore["needsAttention"] == [run_id], restore  # what the preview said
    ok(shared.cli("stop", "--json"))


def test_a_bumped_version_is_named_in_what_holds_the_run(shared: Project) -> None:
    """Held for a changed identity, the Run said only that two hashes differ; when the
    Workflow's version is what the user changed, they are told so."""
    run_id, action = _waiting_and_done(shared)
    entry = shared.root / "workflows" / "flow.py"
    entry.write_text(ENTRY.replace('version="1"', 'version="2"'))
    preview = _preview(shared, run_id)
    assert preview["verdict"]["row"] == "needs_attention", preview
    assert "version '1' when the Run started, '2' now" in preview["problem"], preview
    ok(shared.cli("start", "--json"))
    held = shared.cli("answer", run_id, action, '{"isConfirmed": true}', "--json")
    assert held.json["error"]["code"] == "JOURNAL_INCOMPATIBLE", held
    assert "version '1' when the Run started, '2' now" in held.json["error"]["message"], held
    ok(shared.cli("stop", "--json"))


def test_a_journal_a_newer_intloom_wrote_is_previewed_as_start_holds_it(
    tmp_path: Path,
) -> None:
    """After a downgrade of intloom, start holds a Run whose header a newer intloom wrote
    ("upgrade intloom"); doctor and inspect previewed it verified, restore_wait, exit 0."""
    project = make_project(tmp_path)
    with contextlib.ExitStack() as stack:
        stack.callback(project.reap)
        ok(project.cli("start", "--json"))
        run = ok(project.cli("flow", "example", "--intent", "x", "--json"))["run"]
        ok(project.cli("stop", "--json"))
        wf = load_workflows(project.root, load_config(project.root)).workflows["example"]
        newer = "RUN-20261130T000000000Z-newerintloom00000000"
        records: list[Record] = [
            Header(at=AT, run_id=newer, workflow="example", workflow_version=wf.version,
                   identity=wf.identity, schemas=dict(wf.schemas), intent="x",
                   package_version="99.0.0"),
            StagePending(at=AT, stage="draft"),
        ]
        store = Store.open(ProjectPaths(project.root).runtime, instance_id="newer",
                           package_version="99.0.0")
        try:
            for record in records:
                store.append(newer, record)
            store.sync_blocking()
        finally:
            store.close_blocking()

        preview = _preview(project, newer)
        assert preview["code"] == 3, preview
        assert preview["verdict"]["row"] == "needs_attention", preview
        assert "99.0.0" in preview["problem"], preview
        inspected = ok(project.cli("inspect", newer, "--json"))["run"]
        assert inspected["restart"]["row"] == "needs_attention", inspected
        restore = ok(project.cli("start", "--json"))["service"]["restore"]
        assert restore["needsAttention"] == [newer], restore
        assert restore["waiting"] == [run["runId"]], restore
        ok(project.cli("stop", "--json"))


# A builder outside the tree whose first Step's outcome is OUTCOME; the Step routes it to
# the second, which completes the Run.
ROUTED = textwrap.dedent('''
    import msgspec

    import intloom

    ROUTED_AS = "done"


    class Count(msgspec.Struct):
        n: int = 0


    def build(wf):
        s = wf.stage("s", state=Count)

        @s.step("first", routes={ROUTED_AS: "second"})
        def first(ctx):
            ctx.state = Count(n=1)
            return "done"

        @s.step("second", routes={"done": intloom.COMPLETE})
        def second(ctx):
            return "done"
''')


def test_a_saved_outcome_the_loaded_step_no_longer_routes_is_held_until_it_does(
    tmp_path: Path,
) -> None:
    """A Run whose journal ends at a Step's result (a crash tore off what followed it) is
    routed at the restart. When the outcome's route was renamed outside the tree, doctor
    previewed "route", and start failed the Run STEP_OUTCOME_NOT_HANDLED for good: putting
    the code back could not bring it back. It is held instead, and continues once it is."""
    root = tmp_path / "proj"
    (root / "workflows").mkdir(parents=True)
    (root / "common").mkdir()
    (root / "common" / "__init__.py").write_text("")
    parts = root / "common" / "routed.py"
    parts.write_text(ROUTED)
    (root / "workflows" / "flow.py").write_text(
        ENTRY.replace("common.parts", "common.routed"))
    (root / "intloom.toml").write_text('workflows = ["workflows/flow.py"]\n')
    project = Project(root=root)
    with contextlib.ExitStack() as stack:
        stack.callback(project.reap)
        # The host kills itself before it syncs its 3rd batch: the first Step's result and
        # the second Step's start, written but not durable.
        ok(project.cli("start", "--json", env={"INTLOOM_FAULT": "crash_before_sync=3"}))
        pid = project.host_pid()
        project.cli("flow", "shared", "--intent", "x", "--json")
        project.wait_released(pid)
        ok(project.cli("recover", "--json"))
        runtime = project.state / "runtime"
        [run_id] = [r["runId"] for r in project.cli("doctor", "--json").json["runs"]]
        entries = read_history(runtime, run_id)
        phases = [e.phase for e in entries]
        assert phases[-3:] == ["step_result", "step_ready", "executing"], phases
        # A torn write that kept exactly the batch's first record: the journal ends there.
        with open(runtime / entries[-2].file, "r+b") as fh:
            fh.truncate(entries[-2].offset)
        assert _preview(project, run_id)["verdict"]["row"] == "route"

        parts.write_text(ROUTED.replace('ROUTED_AS = "done"', 'ROUTED_AS = "finished"'))
        before = _wal(project)
        preview = _preview(project, run_id)
        assert preview["code"] == 3, preview
        assert preview["verdict"]["row"] == "needs_attention", preview
        assert "no route for outcome 'done', which Step s/first returned" in \
            preview["problem"], preview
        restore = ok(project.cli("start", "--json"))["service"]["restore"]
        assert restore["needsAttention"] == [run_id] and restore["resumed"] == [], restore
        held = project.cli("attach", run_id, "--json")
        assert held.json["error"]["code"] == "JOURNAL_INCOMPATIBLE", held
        assert "no route for outcome 'done'" in held.json["error"]["message"], held
        ok(project.cli("stop", "--json"))
        after = _wal(project)
        assert {name: after[name] for name in before} == before

        parts.write_text(ROUTED)  # the route is back: the Run goes on from its outcome
        restore = ok(project.cli("start", "--json"))["service"]["restore"]
        assert restore["resumed"] == [run_id], restore
        run = eventually(lambda: _ended(project, run_id), timeout=20, what="the Run to end")
        assert run["status"] == "completed" and run["cursor"]["step"] == "second", run
        ok(project.cli("stop", "--json"))


# A second Stage, declared by the builder after the first (a Stage without State).
SECOND_STAGE = '''
    t = wf.stage("t")

    @t.step("end", routes={"done": intloom.COMPLETE})
    def end(ctx):
        return "done"
'''


def test_a_stage_no_longer_declared_is_named_as_gone_not_as_a_changed_schema(
    shared: Project,
) -> None:
    """Stage 't' removed outside the tree while a Run waited in Stage 's': the Run was held
    for "Stage 't' State schema changed", an edit of a State class nobody made."""
    parts = shared.root / "common" / "parts.py"
    _parts(shared.root, NO_POST_INIT)
    parts.write_text(parts.read_text() + SECOND_STAGE)
    run_id, action = started_waiting(shared, "shared", "wait")
    ok(shared.cli("stop", "--json"))
    _parts(shared.root, NO_POST_INIT)  # without Stage 't'

    preview = _preview(shared, run_id)
    assert preview["verdict"]["row"] == "needs_attention", preview
    gone = f"since the Run started, Stage 't' is no longer declared: {OUTSIDE}"
    assert gone in preview["problem"], preview
    assert "schema" not in preview["problem"], preview
    ok(shared.cli("start", "--json"))
    held = shared.cli("answer", run_id, action, '{"isConfirmed": true}', "--json")
    assert held.json["error"]["code"] == "JOURNAL_INCOMPATIBLE", held
    message = held.json["error"]["message"]
    assert gone in message, held
    assert "schema changed" not in message, held
    # The fix names the modules outside the source, where the change is.
    assert "and any module outside it that its definition comes from" in message, held
    ok(shared.cli("stop", "--json"))

    parts.write_text(parts.read_text() + SECOND_STAGE)
    assert ok(shared.cli("start", "--json"))["service"]["restore"]["waiting"] == [run_id]
    ok(shared.cli("stop", "--json"))
