"""``start`` reusing a running host says what changed on disk since that host loaded its
Workflows: a host loads them once, so an edited tree or a newly listed source would go
unseen, new Runs would use the old code, and the next restart would hold those Runs. Real
host, real CLI subprocesses; every host is reaped."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Project, make_project, ok, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

NOTE = textwrap.dedent('''
    import intloom

    wf = intloom.Workflow("NAME", version="1.0.0")
    s = wf.stage("s")


    @s.step("only", routes={"done": intloom.COMPLETE})
    def only(ctx: intloom.StepContext[None]) -> str:
        return "done"
''')


def _list_another(project: Project, name: str) -> None:
    """Add the package ``workflows/<name>`` (a Workflow of that name) to intloom.toml, after
    ``workflows/note``."""
    (project.root / "workflows" / name).mkdir()
    (project.root / "workflows" / name / "__init__.py").write_text(NOTE.replace("NAME", name))
    (project.root / "intloom.toml").write_text(
        f'workflows = ["workflows/note", "workflows/{name}"]\n')


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    root = tmp_path / "proj"
    (root / "workflows" / "note").mkdir(parents=True)
    (root / "workflows" / "note" / "__init__.py").write_text(NOTE.replace("NAME", "note"))
    (root / "intloom.toml").write_text('workflows = ["workflows/note"]\n')
    yield from reaped(Project(root=root))


def test_a_reused_host_names_what_changed_since_it_started(project: Project) -> None:
    first = ok(project.cli("start", "--json"))
    assert (first["reused"], first["changedSinceStart"]) == (False, [])
    again = ok(project.cli("start", "--json"))
    assert (again["reused"], again["changedSinceStart"]) == (True, [])
    assert _workflows_check(project)["status"] == "ok"

    (project.root / "workflows" / "note" / "prompt.txt").write_text("a data file of the tree")
    _list_another(project, "memo")
    reused = ok(project.cli("start", "--json"))
    assert reused["reused"] is True
    assert reused["service"]["pid"] == first["service"]["pid"]
    changes = {(c["source"], c["change"], c["workflow"]) for c in reused["changedSinceStart"]}
    assert changes == {("workflows/memo", "listed", None),
                       ("workflows/note", "edited", "note")}
    edited = next(c for c in reused["changedSinceStart"] if c["change"] == "edited")
    assert "changed since the host loaded note 1.0.0" in edited["message"]

    text = project.cli("start")
    assert text.code == 0, text.stderr
    assert "Reusing existing service" in text.stdout
    assert ("Changed  workflows/memo is listed in intloom.toml; the host started before and "
            "has not loaded it.") in text.stdout
    assert "To load the change: intloom stop, then intloom start" in text.stdout

    # status, the first thing a user runs, says the same (it never starts or writes
    # anything: it only compares).
    status = ok(project.cli("status", "--json"))
    assert status["service"]["pid"] == first["service"]["pid"]
    assert status["changedSinceStart"] == reused["changedSinceStart"]
    status_text = project.cli("status")
    assert status_text.code == 0, status_text.stderr
    assert ("Changed  workflows/memo is listed in intloom.toml; the host started before and "
            "has not loaded it.") in status_text.stdout
    assert "To load the change: intloom stop, then intloom start" in status_text.stdout

    check = _workflows_check(project)  # doctor says so too, with what to do
    assert check["status"] == "attention"
    assert f"The running host (pid {first['service']['pid']}) differs: " in check["message"]
    assert "workflows/memo is listed in intloom.toml" in check["message"]
    assert "workflows/note changed since the host loaded note 1.0.0" in check["message"]
    assert check["next"].startswith("The running host runs what it loaded at its start")

    # What the host runs is what it loaded: the new source is not there until a restart,
    # and a Run of it is refused saying so.
    assert [w["name"] for w in ok(project.cli("flows", "--json"))["workflows"]] == ["note"]
    refused = project.cli("flow", "memo", "--intent", "i", "--json")
    assert refused.code != 0 and refused.json["error"]["code"] == "NOT_FOUND", refused.stdout
    assert refused.json["error"]["message"].startswith(
        "Workflow 'memo' is not loaded (loaded: note).")
    assert ("The project changed since this host started: workflows/memo is listed in "
            "intloom.toml; the host started before and has not loaded it.") in (
        refused.json["error"]["message"])
    assert refused.json["error"]["message"].endswith(
        "To load it: intloom stop, then intloom start.")
    ok(project.cli("stop", "--json"))
    restarted = ok(project.cli("start", "--json"))
    assert (restarted["reused"], restarted["changedSinceStart"]) == (False, [])
    assert ok(project.cli("start", "--json"))["changedSinceStart"] == []
    assert ok(project.cli("status", "--json"))["changedSinceStart"] == []
    assert "Changed" not in project.cli("status").stdout
    assert sorted(w["name"] for w in ok(project.cli("flows", "--json"))["workflows"]) == [
        "memo", "note"]
    assert _workflows_check(project)["status"] == "ok"


def test_a_version_bump_is_not_given_an_identity_no_workflow_has(project: Project) -> None:
    """A Workflow's version bumped while its host runs: start's reuse and doctor said the
    source changed "(identity OLD, now X)", X hashed from the new tree with the *loaded*
    version, an identity no Workflow has; doctor's own line gave the real one beside it, and
    the next start's flows (and every held Run's message) another. Only identities a
    Workflow has are named."""
    loaded = ok(project.cli("start", "--json"))
    old = next(w["identity"] for w in ok(project.cli("flows", "--json"))["workflows"])
    source = project.root / "workflows" / "note" / "__init__.py"
    source.write_text(source.read_text().replace('version="1.0.0"', 'version="1.1.0"'))
    edited = next(c for c in ok(project.cli("start", "--json"))["changedSinceStart"]
                  if c["change"] == "edited")
    check = _workflows_check(project)
    ok(project.cli("stop", "--json"))
    restarted = ok(project.cli("start", "--json"))
    assert restarted["service"]["pid"] != loaded["service"]["pid"]
    new = next(w["identity"] for w in ok(project.cli("flows", "--json"))["workflows"])
    assert new != old
    for message in (edited["message"], check["message"]):
        assert f"changed since the host loaded note 1.0.0 (identity {old[:12]}" in message
        named = set(re.findall(r"\b[0-9a-f]{12}\b", message))
        assert named <= {old[:12], new[:12]}, (named, old, new, message)
    ok(project.cli("stop", "--json"))


def test_doctor_names_a_source_the_host_failed_to_load_that_loads_now(
    project: Project,
) -> None:
    """The host could not import a source at its start; it is fixed since. The project on
    disk loads it, the host runs none of it until a restart: a difference, so the workflows
    check is attention rather than ok (doctor exiting 0) while `flow` would refuse it."""
    memo = project.root / "workflows" / "memo"
    memo.mkdir()
    (memo / "__init__.py").write_text("this is not Python (\n")
    (project.root / "intloom.toml").write_text(
        'workflows = ["workflows/note", "workflows/memo"]\n')
    ok(project.cli("start", "--json"))
    assert _workflows_check(project)["status"] == "attention"  # it fails on disk too
    (memo / "__init__.py").write_text(NOTE.replace("NAME", "memo"))

    check = _workflows_check(project)
    assert check["status"] == "attention", check
    assert ("workflows/memo failed to load when the host started and loads now (memo); the "
            "host runs none of it.") in check["message"]
    assert "To load the change: intloom stop, then intloom start" in check["next"]
    ok(project.cli("stop", "--json"))


def test_doctor_does_not_call_a_source_listed_twice_one_the_host_failed_to_load(
    project: Project,
) -> None:
    """A source listed twice is loaded once, from its first entry; the second is reported
    as failed, under the same source. The host runs the source's Workflows: doctor must
    not say it failed at the host's start and "runs none of it" (and to restart for it)."""
    (project.root / "intloom.toml").write_text(
        'workflows = ["workflows/note", "workflows/note"]\n')
    ok(project.cli("start", "--json"))
    check = _workflows_check(project)
    assert check["status"] == "attention", check  # the repeated entry, on disk
    assert "is listed in intloom.toml twice" in check["message"], check
    assert "failed to load when the host started" not in check["message"], check
    assert "the host runs none of it" not in check["message"], check
    assert "The running host" not in check["message"], check
    ok(project.cli("stop", "--json"))


LAZY = textwrap.dedent('''
    import intloom

    wf = intloom.Workflow("lazy", version="1.0.0")
    s = wf.stage("s")


    @s.step("only", routes={"old": intloom.COMPLETE, "new": intloom.COMPLETE})
    def only(ctx: intloom.StepContext[None]) -> str:
        from . import helper  # imported by the Step, after the host loaded the Workflow

        return helper.OUTCOME
''')


def _lazy_project(tmp_path: Path, helper: str | None) -> tuple[Project, Path]:
    root = tmp_path / "proj"
    lazy = root / "workflows" / "lazy"
    lazy.mkdir(parents=True)
    (lazy / "__init__.py").write_text(LAZY)
    if helper is not None:
        (lazy / "helper.py").write_text(helper)
    (root / "intloom.toml").write_text('workflows = ["workflows/lazy"]\n')
    return Project(root=root), lazy


def _outcome(project: Project, run_id: str) -> str:
    records = ok(project.cli("inspect", run_id, "--json"))["records"]
    return str(next(r["record"]["outcome"] for r in records if r["phase"] == "step_result"))


def test_a_module_a_step_imports_after_an_edit_runs_the_bytes_the_host_loaded(
    tmp_path: Path,
) -> None:
    """start says the host runs the code it loaded, and a Run's journal names that code's
    identity. A tree module a Step imports only when it runs was read for the identity at
    the host's start, but imported later from the bytes on disk: edited since, the Run ran
    code its journal does not name; then the import was refused, failing the Run for good
    (a file saved, a git pull before a restart). It runs the bytes the host loaded."""
    made, lazy = _lazy_project(tmp_path, 'OUTCOME = "old"\n')
    for project in reaped(made):
        ok(project.cli("start", "--json"))
        (lazy / "helper.py").write_text('OUTCOME = "new"\n')
        assert [c["change"] for c in ok(project.cli("start", "--json"))["changedSinceStart"]
                ] == ["edited"]
        run = ok(project.cli("flow", "lazy", "--intent", "i", "--json"))["run"]
        assert run["status"] == "completed", run
        assert _outcome(project, run["runId"]) == "old"
        ok(project.cli("stop", "--json"))
        ok(project.cli("start", "--json"))  # loaded now: the new code, under its identity
        run = ok(project.cli("flow", "lazy", "--intent", "i", "--json"))["run"]
        assert _outcome(project, run["runId"]) == "new"
        ok(project.cli("stop", "--json"))


@pytest.mark.parametrize("change", ["removed", "renamed", "package renamed",
                                    "removed, a folder of its name left",
                                    "removed, a .pyc left"])
def test_a_module_a_step_imports_after_its_file_is_gone_runs_the_bytes_the_host_loaded(
    tmp_path: Path, change: str,
) -> None:
    """The same module removed, or renamed (a checkout, a git pull), while the host runs:
    Python's finder no longer found it, so the kept bytes were never asked for, and the Run
    failed for good with "cannot import name 'helper' from '_intloom_wf_...'", while status
    said the host runs the code it loaded; or the name found what is there now (an empty
    namespace package, a stale .pyc). It runs the bytes the host loaded."""
    import py_compile

    made, lazy = _lazy_project(tmp_path, None)
    if change == "package renamed":
        (lazy / "helper").mkdir()
        (lazy / "helper" / "__init__.py").write_text("from .values import OUTCOME\n")
        (lazy / "helper" / "values.py").write_text('OUTCOME = "old"\n')
    else:
        (lazy / "helper.py").write_text('OUTCOME = "old"\n')
    if change == "removed, a folder of its name left":
        (lazy / "helper").mkdir()
        (lazy / "helper" / "prompt.txt").write_text("a template\n")
    for project in reaped(made):
        # Bytecode written (this VM's environment turns it off): nothing may be written
        # where a file was.
        ok(project.cli("start", "--json", env={"PYTHONDONTWRITEBYTECODE": ""}))
        if change == "renamed":
            (lazy / "helper.py").rename(lazy / "helper_values.py")
        elif change == "package renamed":
            (lazy / "helper").rename(lazy / "helper_pkg")
        else:
            if change == "removed, a .pyc left":
                stale = lazy / "stale.py"
                stale.write_text('OUTCOME = "stale"\n')
                py_compile.compile(str(stale), cfile=str(lazy / "helper.pyc"))
                stale.unlink()
            (lazy / "helper.py").unlink()
        run = ok(project.cli("flow", "lazy", "--intent", "i", "--json"))["run"]
        assert run["status"] == "completed", run
        assert _outcome(project, run["runId"]) == "old"
        # Nothing was written where the files were (no __pycache__ made again there).
        assert not (lazy / "helper.py").exists()
        if change == "package renamed":
            assert not (lazy / "helper").exists()
        ok(project.cli("stop", "--json"))


def test_a_module_added_to_the_tree_after_the_load_is_not_imported(tmp_path: Path) -> None:
    """A tree module that was not there when the host loaded the Workflow has no bytes its
    identity took: its import is refused, naming the file and the restart that loads it."""
    made, lazy = _lazy_project(tmp_path, None)
    for project in reaped(made):
        ok(project.cli("start", "--json"))
        (lazy / "helper.py").write_text('OUTCOME = "new"\n')
        run = project.cli("flow", "lazy", "--intent", "i", "--json").json["run"]
        assert run["status"] == "failed", run  # not completed through code never loaded
        assert run["lastError"]["code"] == "STEP_EXECUTION_FAILED", run
        message = run["lastError"]["message"]
        assert f"{lazy / 'helper.py'} changed since the host loaded Workflow lazy 1.0.0 (it " \
            "was not in the source tree then)" in message, message
        assert "intloom stop, then intloom start" in message, message
        ok(project.cli("stop", "--json"))


def _workflows_check(project: Project) -> dict[str, Any]:
    doctor = project.cli("doctor", "--json")
    assert doctor.code in (0, 3), (doctor.code, doctor.stdout, doctor.stderr)
    check: dict[str, Any] = next(c for c in doctor.json["checks"] if c["id"] == "workflows")
    return check


def test_a_port_set_in_intloom_toml_after_the_host_started_is_named(project: Project) -> None:
    """``port`` added to intloom.toml while a host runs elsewhere: the next start listens
    there (the config's port wins over the saved one), but start's reuse said nothing
    changed, and status neither."""
    service = ok(project.cli("start", "--json"))["service"]
    other = service["port"] + 1 if service["port"] < 65535 else 1024
    (project.root / "intloom.toml").write_text(
        f'workflows = ["workflows/note"]\nport = {other}\n')
    changed = ok(project.cli("start", "--json"))["changedSinceStart"]
    assert [(c["source"], c["change"], c["workflow"]) for c in changed] == [
        ("intloom.toml", "port", None)], changed
    assert (f"intloom.toml sets port {other}; the host listens on {service['port']}"
            in changed[0]["message"]), changed
    assert ok(project.cli("status", "--json"))["changedSinceStart"] == changed
    (project.root / "intloom.toml").write_text(
        f'workflows = ["workflows/note"]\nport = {service["port"]}\n')
    assert ok(project.cli("start", "--json"))["changedSinceStart"] == []
    ok(project.cli("stop", "--json"))


def test_a_port_given_to_start_is_not_named_as_changed_since_start(project: Project) -> None:
    """``start --port 0`` (or ``--port N``) with a ``port`` in intloom.toml: the host
    listens where it was told, and nothing changed on disk since, yet status, start's reuse
    and doctor named intloom.toml's port as changed since the start and said to restart to
    load it. A port edited in intloom.toml after that start is still named."""
    first = ok(project.cli("start", "--json"))["service"]["port"]
    ok(project.cli("stop", "--json"))
    (project.root / "intloom.toml").write_text(f'workflows = ["workflows/note"]\nport = {first}\n')
    service = ok(project.cli("start", "--port", "0", "--json"))["service"]
    assert service["port"] != first, service
    assert ok(project.cli("status", "--json"))["changedSinceStart"] == []
    assert ok(project.cli("start", "--json"))["changedSinceStart"] == []
    assert _workflows_check(project)["status"] == "ok"
    other = first + 1 if first < 65535 else 1024
    (project.root / "intloom.toml").write_text(f'workflows = ["workflows/note"]\nport = {other}\n')
    changed = ok(project.cli("status", "--json"))["changedSinceStart"]
    assert [(c["source"], c["change"]) for c in changed] == [("intloom.toml", "port")], changed
    ok(project.cli("stop", "--json"))


def test_workflows_sharing_a_directory_have_it_read_once_per_look(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Twenty single-file Workflows in workflows/ share one source tree (the directory's
    Python files). status, doctor and a reusing start compared each one's identity by
    reading the whole tree again: 300 files there were 90,000 reads, 1.5 s for a status.
    Each look now reads each file once, and still names every Workflow an edit changed."""
    from intloom.client import Client
    from intloom.client.drift import against_host

    root = tmp_path / "proj"
    (root / "workflows").mkdir(parents=True)
    names = [f"w{i:02d}" for i in range(20)]
    for name in names:
        (root / "workflows" / f"{name}.py").write_text(NOTE.replace("NAME", name))
    listed = ", ".join(f'"workflows/{name}.py"' for name in names)
    (root / "intloom.toml").write_text(f"workflows = [{listed}]\n")
    project = Project(root=root)
    try:
        ok(project.cli("start", "--json"))
        with Client.connect(root) as client:
            service = client.status()
        reads: list[Path] = []
        real = Path.read_bytes

        def counted(path: Path) -> bytes:
            reads.append(path)
            return real(path)

        monkeypatch.setattr(Path, "read_bytes", counted)
        found = against_host(root, service)
        assert found is not None
        flows, changes = found
        assert len(flows) == 20 and changes == [], changes
        sources = sorted(p.name for p in reads if p.parent.name == "workflows")
        assert sources == sorted(f"{name}.py" for name in names), len(sources)

        (root / "workflows" / "w07.py").write_text(NOTE.replace("NAME", "w07") + "# edited\n")
        reads.clear()
        found = against_host(root, service)
        assert found is not None
        edited = sorted(c.workflow or "" for c in found[1] if c.change == "edited")
        assert edited == names, found[1]  # the tree changed for every one of them
        assert len([p for p in reads if p.parent.name == "workflows"]) == 20
        monkeypatch.undo()
        status = ok(project.cli("status", "--json"))
        assert len(status["changedSinceStart"]) == 20, status
    finally:
        project.track_host()
        project.reap()


def test_flows_names_a_source_listed_since_the_host_started(project: Project) -> None:
    """A source added to intloom.toml while the host ran: flows, where one looks first,
    listed only what the host had loaded, with no word of the new entry (only flow of its
    Workflow said it)."""
    ok(project.cli("start", "--json"))
    _list_another(project, "later")
    listed = ok(project.cli("flows", "--json"))
    assert [w["name"] for w in listed["workflows"]] == ["note"], listed
    assert [(c["source"], c["change"]) for c in listed["changedSinceStart"]] == [
        ("workflows/later", "listed")], listed
    text = project.cli("flows")
    assert text.code == 0, text.stderr
    # On stderr: stdout stays one line per Workflow for a script reading it.
    assert ("Changed  workflows/later is listed in intloom.toml; the host started before "
            "and has not loaded it.") in text.stderr, text.stderr
    assert "To load the change: intloom stop, then intloom start" in text.stderr
    assert text.stdout.strip().splitlines()[-1].split()[0] == "note", text.stdout
    assert "Changed" not in text.stdout
    ok(project.cli("stop", "--json"))


def test_a_workflow_moved_with_its_tree_is_not_said_to_hold_its_runs(tmp_path: Path) -> None:
    """A Workflow file alone in its directory, moved to another and listed there: its
    identity is the same, and the next start restores its Runs. status said it was no
    longer listed and that a restart holds its Runs; stop said the next start holds every
    unfinished Run of it."""
    for project in reaped(make_project(tmp_path)):
        _moved_and_restored(project)


def _moved_and_restored(project: Project) -> None:
    ok(project.cli("start", "--json"))
    run = ok(project.cli("flow", "example", "--intent", "moved", "--json"))["run"]
    moved = project.root / "flows" / "example.py"
    moved.parent.mkdir()
    (project.root / "workflows" / "example.py").rename(moved)
    (project.root / "intloom.toml").write_text('workflows = ["flows/example.py"]\n')
    changed = ok(project.cli("start", "--json"))["changedSinceStart"]
    assert {c["change"] for c in changed} == {"listed", "moved"}, changed
    [said] = [c for c in changed if c["change"] == "moved"]
    assert said["source"] == "workflows/example.py", said
    assert "flows/example.py is" in said["message"] and "continues its Runs" in said["message"]
    status = project.cli("status").stdout
    assert "held" not in status, status
    stop = project.cli("stop")
    assert stop.code == 0, stop.stderr
    assert "holds" not in stop.stdout + stop.stderr, stop.stdout
    started = ok(project.cli("start", "--json"))["service"]["restore"]
    assert started["waiting"] == [run["runId"]], started
    ok(project.cli("stop", "--json"))


def test_flow_of_a_workflow_edited_since_the_host_started_says_its_run_uses_the_old_code(
        project: Project) -> None:
    """flow said nothing of an edit (status and a reusing start did): the new Run ran the
    code the host had loaded, and the next start held it. Only the flow's own Workflow
    counts: another source listed since is flows' and status's to name."""
    ok(project.cli("start", "--json"))
    plain = project.cli("flow", "note", "--intent", "x")
    assert (plain.code, plain.stderr) == (0, ""), plain.stderr
    assert "changedSinceStart" not in ok(project.cli("flow", "note", "--intent", "x", "--json"))

    _list_another(project, "memo")  # another source: not this flow's business
    tree = project.root / "workflows" / "note"
    (tree / "__init__.py").write_text(NOTE.replace("NAME", "note") + "# edited\n")
    doc = ok(project.cli("flow", "note", "--intent", "x", "--json"))
    assert doc["run"]["status"] == "completed"
    assert [(c["source"], c["change"], c["workflow"]) for c in doc["changedSinceStart"]] == [
        ("workflows/note", "edited", "note")]
    text = project.cli("flow", "note", "--intent", "x", "--detach")
    assert text.code == 0, text.stderr
    run_id = re.search(r"RUN-\S+", text.stdout)
    assert run_id is not None, text.stdout
    changed, advice = text.stderr.splitlines()[:2]  # then where to run the commands
    assert changed.startswith("Changed  workflows/note changed since the host loaded note "
                              "1.0.0"), changed
    assert advice.startswith(f"Run {run_id.group(0)}, like every new Run, uses what the host "
                             "loaded when it started. To load the change: intloom stop, then "
                             "intloom start"), advice
