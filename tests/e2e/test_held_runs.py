"""A Run held at start (its Workflow changed while it waited) is known to the host: every
request about it says why it is held and what to do, and ``cancel`` ends it for good by
appending one terminal record -- nothing of its journal is rewritten or removed.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from intloom.store.snapshots import snapshot_name
from tests.helpers import CliResult, Project, ok, started_waiting

pytestmark = pytest.mark.e2e

YES = '{"isConfirmed": true}'


def refused(result: CliResult, code: str) -> str:
    assert result.code == 1, (result.code, result.stdout, result.stderr)
    error = result.json["error"]
    assert error["code"] == code, error
    message: str = error["message"]
    return message


def wal(project: Project) -> dict[str, bytes]:
    return {p.name: p.read_bytes()
            for p in sorted((project.state / "runtime" / "wal").iterdir())}


def records(project: Project, run_id: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = ok(project.cli("inspect", run_id, "--json"))["records"]
    return found


def test_a_run_held_for_a_changed_workflow_says_so_and_cancel_dismisses_it(
    project: Project,
) -> None:
    run_id, action = started_waiting(project)
    ok(project.cli("stop", "--json"))
    source = project.root / "workflows" / "example.py"
    source.write_text(source.read_text() + "# changed while the Run waited\n")
    before_wal, before_records = wal(project), records(project, run_id)
    snap, name = project.state / "runtime" / "snap", snapshot_name(run_id)
    assert (snap / "live" / name).is_file()

    restore = ok(project.cli("start", "--json"))["service"]["restore"]
    assert restore["needsAttention"] == [run_id]
    assert project.cli("doctor", "--json").code == 3

    for args in (["answer", run_id, action, YES], ["attach", run_id]):
        message = refused(project.cli(*args, "--json"), "JOURNAL_INCOMPATIBLE")
        assert f"Run {run_id} is held" in message, message
        assert "changed since the Run started" in message, message
        assert "restart the host" in message and f"intloom cancel {run_id}" in message
    text = project.cli("answer", run_id, action, YES)  # what a person reads
    assert text.code == 1 and text.stderr.startswith("Failure · JOURNAL_INCOMPATIBLE: "), text

    cancelled = ok(project.cli("cancel", run_id, "--json"))["run"]
    assert (cancelled["status"], cancelled["lastError"]["code"]) == ("failed", "RUN_STOPPED")
    assert "held" in cancelled["lastError"]["message"]
    assert ok(project.cli("cancel", run_id, "--json"))["run"] == cancelled  # idempotent
    attached = project.cli("attach", run_id, "--json")  # a stopped Run: exit 1, shown once
    assert attached.code == 1 and attached.json["run"] == cancelled
    # The host refuses a stream for it (the Run ended while held): that is no cut stream,
    # and attach must not say events are missing from what it showed.
    shown = project.cli("attach", run_id)
    assert shown.code == 1 and shown.stdout.startswith("Stopped · example"), shown
    assert "ended before its last event" not in shown.stderr, shown.stderr
    assert shown.stderr.startswith("Failure · CLI_RUN_FAILED: "), shown.stderr
    assert refused(project.cli("answer", run_id, action, YES, "--json"), "CONFLICT")
    doctor = project.cli("doctor", "--json")
    assert doctor.code == 0, doctor.stdout
    assert doctor.json["runs"] == []
    # The live host's own summary no longer lists it as needing attention either.
    assert ok(project.cli("status", "--json"))["service"]["restore"]["needsAttention"] == []
    ok(project.cli("stop", "--json"))

    # One terminal record appended; every earlier byte of the journal as it was.
    after_wal = wal(project)
    assert {name: after_wal[name] for name in before_wal} == before_wal
    after_records = records(project, run_id)
    assert after_records[:-1] == before_records
    last = after_records[-1]
    assert last["phase"] == "terminal" and last["verdict"] == "ok"
    assert last["record"]["error"]["code"] == "RUN_STOPPED"
    assert last["file"].startswith("wal/"), last  # in the log, a segment of the later host
    assert last["file"].removeprefix("wal/") not in before_wal, last

    # Its snapshot is a summary of the log, not evidence: as for any Run that ends, the
    # live one gives way to one in done/ (the log above holds every record).
    assert not (snap / "live" / name).exists() and (snap / "done" / name).is_file()

    # Never held again: a restart does not load it, doctor does not report it.
    restore = ok(project.cli("start", "--json"))["service"]["restore"]
    assert not any(restore[k] for k in ("resumed", "waiting", "interrupted", "needsAttention"))
    assert project.cli("doctor", "--json").code == 0


def test_a_run_whose_newest_segment_is_lost_is_held_not_taken_back_to_its_question(
    project: Project,
) -> None:
    """Answered and completed on a host that was then killed, the Run's last records are in
    that host's segment only. With that file gone, a start used to restore the Run at its
    question, as if it had never been answered (a person asked again, the Steps after the
    answer run again). It is held instead, naming the file, whose number is never reused;
    the copy put back restores the Run as it ended."""
    run_id, action = started_waiting(project)
    ok(project.cli("stop", "--json"))  # the question is in a snapshot and segment 1
    ok(project.cli("start", "--json"))
    assert ok(project.cli("answer", run_id, action, YES, "--json"))["run"]["status"] in (
        "running", "completed")
    done = ok(project.cli("attach", run_id, "--json"))["run"]
    assert done["status"] == "completed", done
    project.kill_host()
    segment = project.state / "runtime" / "wal" / "0000000002.seg"
    kept = segment.read_bytes()
    segment.unlink()
    ok(project.cli("recover", "--json"))  # the killed host's lock and metadata

    started = ok(project.cli("start", "--json"))["service"]
    assert started["restore"]["needsAttention"] == [run_id], started["restore"]
    assert started["restore"]["waiting"] == []
    missing = [p for p in started["storeProblems"] if p["kind"] == "missing"]
    assert [p["path"] for p in missing] == ["wal/0000000002.seg"], started["storeProblems"]
    message = refused(project.cli("answer", run_id, action, YES, "--json"), "JOURNAL_CORRUPT")
    assert "wal/0000000002.seg, which is missing, may have held its record" in message, message
    # Nothing is appended to a damaged journal (docs/recovery.md): cancel refuses, naming
    # the Run, why it is held and what to do, and writes nothing.
    before = wal(project)
    message = refused(project.cli("cancel", run_id, "--json"), "JOURNAL_CORRUPT")
    assert message.startswith(f"Run {run_id} is held, not restored"), message
    assert "which is missing, may have held its record" in message, message
    assert "cannot be cancelled" in message and f"intloom inspect {run_id}" in message, message
    # Without a backup, docs/recovery.md's way out (the "missing" row) is named too: the
    # Run's own snapshot, which this start has written for the held Run.
    snap = project.state / "runtime" / "snap" / "live" / snapshot_name(run_id)
    assert snap.exists()
    assert message.endswith(
        " Without a copy of wal/0000000002.seg, you may accept the loss: stop the host, move "
        f"{snap} out of the runtime directory and start it again; the Run is then restored "
        "from its last readable record, so a Step whose records were lost may run again "
        f"(check the effects intloom inspect {run_id} names first)."), message
    assert wal(project) == before
    doctor = project.cli("doctor", "--json")
    assert doctor.code == 3, doctor.stdout
    journals = next(c for c in doctor.json["checks"] if c["id"] == "journals")
    assert "segment(s) are missing from wal/" in journals["next"], journals
    ok(project.cli("stop", "--json"))
    assert not segment.exists()  # never numbered again by a later host

    segment.write_bytes(kept)  # the copy put back: the Run ended, as it did
    segment.chmod(0o600)
    restore = ok(project.cli("start", "--json"))["service"]["restore"]
    assert restore["needsAttention"] == [] and restore["waiting"] == [], restore
    assert ok(project.cli("doctor", "--json"))["runs"] == []
    ok(project.cli("stop", "--json"))


def test_a_run_held_because_its_source_fails_to_load_names_that_source(
    project: Project,
) -> None:
    """A syntax error in the Workflow's file while its Run waited: the Run was held with
    "Workflow 'example' is not loaded" and doctor's advice to "restore its source and its
    entry in intloom.toml" -- both still there; the source that fails went unnamed. Once
    cancelled, its lastError kept the advice to fix the source and restart."""
    run_id, action = started_waiting(project)
    ok(project.cli("stop", "--json"))
    source = project.root / "workflows" / "example.py"
    source.write_text(source.read_text() + "def broken(:\n")

    ok(project.cli("start", "--json"))
    message = refused(project.cli("answer", run_id, action, YES, "--json"),
                      "JOURNAL_INCOMPATIBLE")
    assert "workflows/example.py (listed in intloom.toml) failed to load" in message
    doctor = project.cli("doctor", "--json")
    [preview] = [r for r in doctor.json["runs"] if r["runId"] == run_id]
    problem = preview["problem"]
    assert "workflows/example.py (listed in intloom.toml) failed to load" in problem, problem
    assert "restore its source and its entry" not in problem, problem
    # A source deleted on purpose is no source to fix: cancel ends the Run, as for the rest.
    assert problem.endswith(f"; or end it with intloom cancel {run_id}"), problem
    inspected = ok(project.cli("inspect", run_id, "--json"))["run"]
    assert f"intloom cancel {run_id}" in inspected["problem"], inspected
    # Cancelled, it has ended: its record keeps the fact, not the advice to continue it.
    cancelled = ok(project.cli("cancel", run_id, "--json"))["run"]["lastError"]["message"]
    assert "workflows/example.py (listed in intloom.toml) failed to load" in cancelled
    assert "intloom start" not in cancelled and "fix it" not in cancelled, cancelled
    ok(project.cli("stop", "--json"))


def test_a_source_listed_twice_is_not_named_as_failed_for_a_run_it_cannot_define(
    project: Project,
) -> None:
    """A Run of 'other' held after its source left intloom.toml, while example.py is listed
    twice: the repeated entry is reported, but example.py loaded. Start and doctor named it
    as a source that "failed to load and may define it" (fix it), when the fix is to put
    back other's source and entry."""
    workflows = project.root / "workflows"
    (workflows / "other.py").write_text(
        (workflows / "example.py").read_text().replace('"example"', '"other"'))
    toml = project.root / "intloom.toml"
    toml.write_text('workflows = ["workflows/example.py", "workflows/other.py"]\n')
    run_id, action = started_waiting(project, "other")
    ok(project.cli("stop", "--json"))
    toml.write_text('workflows = ["workflows/example.py", "workflows/example.py"]\n')

    ok(project.cli("start", "--json"))
    message = refused(project.cli("answer", run_id, action, YES, "--json"),
                      "JOURNAL_INCOMPATIBLE")
    assert "failed to load" not in message, message
    assert "Put back the exact Workflow source the Run started with" in message, message
    doctor = project.cli("doctor", "--json")
    [preview] = [r for r in doctor.json["runs"] if r["runId"] == run_id]
    problem = preview["problem"]
    assert "failed to load" not in problem, problem
    assert "put back the source that defined it, under the name it had, and its entry in " \
        "intloom.toml" in problem, problem
    ok(project.cli("stop", "--json"))


def test_a_run_held_for_an_edit_of_its_source_names_what_changed_and_both_ways_on(
    project: Project,
) -> None:
    """A field's type changed (int -> str) and the waiting Step renamed: what held the Run
    named only two identity hashes, so the user could not tell that the edit reached the
    Run's State and its Step; doctor and inspect did not say that cancel ends it."""
    run_id, action = started_waiting(project)
    ok(project.cli("stop", "--json"))
    source = project.root / "workflows" / "example.py"
    text = source.read_text()
    source.write_text(text.replace("attempts: int = 0", 'attempts: str = "0"')
                      .replace("ctx.state.attempts + 1", "int(ctx.state.attempts) + 1")
                      .replace("attempts=attempt", "attempts=str(attempt)")
                      .replace('"written": "review"', '"written": "check"')
                      .replace('@draft.step("review"', '@draft.step("check"'))
    facts = ("the State schema of Stage 'draft' changed; Step draft/review, where the Run is, "
             "is no longer declared")

    doctor = project.cli("doctor", "--json")
    [preview] = [r for r in doctor.json["runs"] if r["runId"] == run_id]
    assert facts in preview["problem"], preview
    assert f"or end it with intloom cancel {run_id}" in preview["problem"], preview
    inspected = ok(project.cli("inspect", run_id, "--json"))["run"]
    assert facts in inspected["problem"] and f"intloom cancel {run_id}" in \
        inspected["problem"], inspected
    assert ok(project.cli("start", "--json"))["service"]["restore"]["needsAttention"] == [run_id]
    message = refused(project.cli("answer", run_id, action, YES, "--json"),
                      "JOURNAL_INCOMPATIBLE")
    assert facts in message and f"intloom cancel {run_id}" in message, message
    ok(project.cli("stop", "--json"))

    source.write_text(text)  # the edit reverted: the Run waits on the same action again
    assert ok(project.cli("start", "--json"))["service"]["restore"]["waiting"] == [run_id]
    answered = ok(project.cli("answer", run_id, action, YES, "--json"))
    assert answered["run"]["status"] == "completed", answered
    ok(project.cli("stop", "--json"))


def test_a_run_held_for_a_file_it_cannot_see_changed_is_told_which_file_was_written(
    project: Project,
) -> None:
    """A file added to the tree (a copy left beside the Workflow, an editor's backup renamed
    in, keeping its old modification time): the held Run was told only that "a file of its
    source tree" changed, with nothing in git diff to find. Its times name it; an untouched
    file is not named."""
    run_id, _action = started_waiting(project)
    ok(project.cli("stop", "--json"))
    tree = project.root / "workflows"
    backup = tree / "example_old.py"
    backup.write_text((tree / "example.py").read_text())
    os.utime(backup, (0, 0))  # as a rename keeps it: only its inode change time is new
    preview = _problem(project, run_id)
    assert ("; from file times, written since the Run began: workflows/example_old.py (a file "
            "removed since leaves no time)") in preview, preview
    assert "workflows/example.py," not in preview and "workflows/example.py " not in preview


def test_a_run_begun_after_an_edit_its_host_had_not_loaded_is_not_told_of_no_file(
    project: Project,
) -> None:
    """An edit made after the host loaded the code, before the Run began (flow after an
    edit): no file is newer than the Run, and the hint must not read as if nothing was
    edited."""
    ok(project.cli("start", "--json"))
    source = project.root / "workflows" / "example.py"
    source.write_text(source.read_text() + "# edited before the Run\n")
    run_id = ok(project.cli("flow", "example", "--intent", "x", "--json"))["run"]["runId"]
    ok(project.cli("stop", "--json"))
    problem = _problem(project, run_id)
    assert ("; no file of it was written since the Run began, by file times: the edit is older "
            "(made after the Run's host had loaded the code), or removed a file") in problem, \
        problem


def _problem(project: Project, run_id: str) -> str:
    doctor = project.cli("doctor", "--json")
    [preview] = [r for r in doctor.json["runs"] if r["runId"] == run_id]
    return str(preview["problem"])


def test_a_run_whose_workflow_was_renamed_is_told_which_names_the_sources_define(
    project: Project,
) -> None:
    """``Workflow("example")`` renamed in its own source: the held Run was told to "restore
    its source and its entry in intloom.toml", both of which were there."""
    run_id, action = started_waiting(project)
    ok(project.cli("stop", "--json"))
    source = project.root / "workflows" / "example.py"
    text = source.read_text()
    source.write_text(text.replace('intloom.Workflow("example"', 'intloom.Workflow("sample"'))
    fact = ("Workflow 'example' is not loaded, so the Run cannot be restored: no source of "
            "intloom.toml defines it now (they define 'sample' from workflows/example.py)")

    doctor = project.cli("doctor", "--json")
    [preview] = [r for r in doctor.json["runs"] if r["runId"] == run_id]
    assert fact in preview["problem"], preview
    assert "under the name it had" in preview["problem"], preview
    assert f"intloom cancel {run_id}" in preview["problem"], preview
    assert ok(project.cli("start", "--json"))["service"]["restore"]["needsAttention"] == [run_id]
    message = refused(project.cli("answer", run_id, action, YES, "--json"),
                      "JOURNAL_INCOMPATIBLE")
    assert "no source of intloom.toml defines it now (they define 'sample' from " \
        "workflows/example.py)" in message, message
    ok(project.cli("stop", "--json"))

    source.write_text(text)
    assert ok(project.cli("start", "--json"))["service"]["restore"]["waiting"] == [run_id]
    ok(project.cli("stop", "--json"))


def test_a_run_held_for_an_edit_of_another_workflow_in_its_directory_is_told_where_to_look(
    project: Project,
) -> None:
    """Workflow 'other' shares workflows/ with example.py, which was edited: other's Run was
    held for "changed" with two hashes, although nothing of 'other' the journal records
    changed, and nothing pointed at its source tree."""
    workflows = project.root / "workflows"
    (workflows / "other.py").write_text(
        (workflows / "example.py").read_text().replace('"example"', '"other"'))
    (project.root / "intloom.toml").write_text(
        'workflows = ["workflows/example.py", "workflows/other.py"]\n')
    run_id, action = started_waiting(project, "other")
    ok(project.cli("stop", "--json"))
    example = workflows / "example.py"
    text = example.read_text()
    example.write_text(text + "# edited while other's Run waited\n")
    fact = ("its version, its Stages' State schemas and the Step the Run is at are as they "
            "were, so what changed is a file of its source tree, workflows/")

    doctor = project.cli("doctor", "--json")
    [preview] = [r for r in doctor.json["runs"] if r["runId"] == run_id]
    assert "Workflow 'other' changed" in preview["problem"] and fact in preview["problem"], \
        preview
    assert ok(project.cli("start", "--json"))["service"]["restore"]["needsAttention"] == [run_id]
    message = refused(project.cli("answer", run_id, action, YES, "--json"),
                      "JOURNAL_INCOMPATIBLE")
    assert fact in message, message
    ok(project.cli("stop", "--json"))

    example.write_text(text)
    assert ok(project.cli("start", "--json"))["service"]["restore"]["waiting"] == [run_id]
    ok(project.cli("stop", "--json"))
