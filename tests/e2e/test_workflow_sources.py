"""What the host does with a Workflow's sources: its identity covers the sibling modules a
single-file entry imports, and a source that fails to load is named by ``start``, ``doctor``
and the error itself. Real host, real CLI subprocesses; every host is reaped."""

from __future__ import annotations

import importlib.util
import json
import os
import py_compile
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_cli_e2e import only_json, run_cli
from tests.helpers import (
    Project,
    foreground_host,
    ok,
    one_source_project,
    reaped,
    started_waiting,
)
from tests.unit.test_authoring_mistakes import SOURCES

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# A single-file entry that imports a sibling module of its directory, as a script would.
ACC = textwrap.dedent('''
    """Waits at a confirmation whose context comes from a sibling helper module."""

    from __future__ import annotations

    from workflows.helpers import label

    import intloom

    wf = intloom.Workflow("acc", version="1.0.0")
    check = wf.stage("check")


    @check.step("confirm", routes={"yes": intloom.COMPLETE, "no": intloom.COMPLETE})
    async def confirm(ctx: intloom.StepContext[None]) -> str:
        answer = await ctx.confirm({"label": label()})
        return "yes" if answer.confirmed else "no"


    @confirm.recover
    def confirm_recover(ctx: intloom.StepContext[None], saved: intloom.Recovery) -> str:
        return "yes" if saved.answer.confirmed else "no"
''')
HELPERS = 'def label() -> str:\n    return "v1"\n'


@pytest.fixture
def acc(tmp_path: Path) -> Iterator[Project]:
    """A project whose one Workflow, workflows/acc.py, imports workflows/helpers.py."""
    root = tmp_path / "proj"
    (root / "workflows").mkdir(parents=True)
    (root / "intloom.toml").write_text('workflows = ["workflows/acc.py"]\n')
    (root / "workflows" / "acc.py").write_text(ACC)
    (root / "workflows" / "helpers.py").write_text(HELPERS)
    yield from reaped(Project(root=root))


def _restore(project: Project) -> dict[str, Any]:
    restore: dict[str, Any] = ok(project.cli("start", "--json"))["service"]["restore"]
    return restore


def test_an_edited_sibling_module_holds_the_run_until_its_bytes_are_back(
    acc: Project,
) -> None:
    ok(acc.cli("start", "--json"))
    run = ok(acc.cli("flow", "acc", "--intent", "i", "--json"))["run"]
    assert run["status"] == "waiting" and run["pendingAction"]["request"] == {
        "context": {"label": "v1"}}
    ok(acc.cli("stop", "--json"))

    helpers = acc.root / "workflows" / "helpers.py"
    helpers.write_text(HELPERS.replace('"v1"', '"v2"'))
    doctor = acc.cli("doctor", "--json")
    assert doctor.code == 3, (doctor.code, doctor.stdout)
    [preview] = doctor.json["runs"]
    assert (preview["journal"], preview["verdict"]["row"]) == ("incompatible", "needs_attention")
    assert "Workflow 'acc' changed" in preview["problem"]

    restore = _restore(acc)
    assert restore["needsAttention"] == [run["runId"]]
    assert restore["waiting"] == restore["resumed"] == []
    assert ok(acc.cli("runs", "--json"))["runs"] == []  # held, not continued on new code
    ok(acc.cli("stop", "--json"))

    helpers.write_text(HELPERS)  # the bytes the Run started with
    restore = _restore(acc)
    assert restore["waiting"] == [run["runId"]] and restore["needsAttention"] == []
    action = run["pendingAction"]["id"]
    done = ok(acc.cli("answer", run["runId"], action, '{"isConfirmed": true}', "--json"))
    assert done["run"]["status"] == "completed"
    ok(acc.cli("stop", "--json"))


def test_stale_bytecode_never_runs_in_place_of_the_source_the_identity_covers(
    acc: Project,
) -> None:
    """Python takes a ``__pycache__`` file as current when its source has the recorded size
    and modification second: an edit of the same size within that second (a script, a
    checkout, a copy keeping times) left the host running the old code under the identity
    of the new bytes -- and, once the cache was refreshed, a Run started on the old code
    continued on the new one. The Workflow sources are compiled from their bytes."""
    entry, helpers = acc.root / "workflows" / "acc.py", acc.root / "workflows" / "helpers.py"
    for path, old, new in ((entry, '"1.0.0"', '"1.0.1"'), (helpers, '"v1"', '"v2"')):
        py_compile.compile(str(path), cfile=importlib.util.cache_from_source(str(path)),
                           doraise=True, invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
        before = path.stat()
        path.write_text(path.read_text().replace(old, new))
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))

    doctor = acc.cli("doctor", "--json")
    [workflows] = [c for c in doctor.json["checks"] if c["id"] == "workflows"]
    assert "acc 1.0.1" in workflows["message"], workflows
    ok(acc.cli("start", "--json"))
    [flow] = ok(acc.cli("flows", "--json"))["workflows"]
    assert flow["version"] == "1.0.1", flow
    run = ok(acc.cli("flow", "acc", "--intent", "i", "--json"))["run"]
    assert run["pendingAction"]["request"] == {"context": {"label": "v2"}}, run
    ok(acc.cli("stop", "--json"))


def test_a_copy_defining_the_same_workflow_holds_its_runs_saying_so_until_one_remains(
    acc: Project,
) -> None:
    """A user copies workflows/acc.py to workflows/acc_copy.py and lists the copy first: the
    copy was loaded, the original failed, and the Run was held as "changed" -- not the true
    reason; listed the other way round, the Run would go on with whichever came first."""
    run_id, action = started_waiting(acc, "acc", "i")
    ok(acc.cli("stop", "--json"))
    original, copy = acc.root / "workflows" / "acc.py", acc.root / "workflows" / "acc_copy.py"
    copy.write_bytes(original.read_bytes())
    toml = acc.root / "intloom.toml"
    toml.write_text('workflows = ["workflows/acc_copy.py", "workflows/acc.py"]\n')
    both = "Workflow 'acc' is defined in both workflows/acc_copy.py and workflows/acc.py"

    service = ok(acc.cli("start", "--json"))["service"]
    assert service["workflowCount"] == 0, service
    assert [p["source"] for p in service["workflowProblems"]] == [
        "workflows/acc_copy.py", "workflows/acc.py"]
    for problem in service["workflowProblems"]:
        assert problem["code"] == "WORKFLOW_DEFINITION_INVALID", problem
        assert problem["message"].startswith(f"{both}, so neither file is loaded"), problem
        assert "delete it or move it to a directory of its own" in problem["message"]
    assert service["restore"]["needsAttention"] == [run_id]
    held = acc.cli("answer", run_id, action, '{"isConfirmed": true}', "--json")
    assert held.code == 1 and held.json["error"]["code"] == "JOURNAL_INCOMPATIBLE", held
    message = held.json["error"]["message"]
    assert f"{both}, so neither is loaded; keep only the source the Run started with" in (
        message), message
    assert "changed" not in message, message

    doctor = acc.cli("doctor", "--json")
    assert doctor.code == 3, (doctor.code, doctor.stdout)
    [check] = [c for c in doctor.json["checks"] if c["id"] == "workflows"]
    assert check["message"].startswith(f"2 Workflow source(s) failed to load: "
                                       f"workflows/acc_copy.py: WORKFLOW_DEFINITION_INVALID: "
                                       f"{both}"), check["message"]
    inspected = ok(acc.cli("inspect", run_id, "--json"))["run"]
    [preview] = doctor.json["runs"]
    for problem in (preview["problem"], inspected["problem"]):
        assert problem.startswith(f"{both}, so neither is loaded: the Run cannot be "
                                  "restored"), problem
        assert problem.endswith(f"or end it with intloom cancel {run_id})"), problem
    ok(acc.cli("stop", "--json"))

    # Unlisted but left beside the original, the copy is part of its tree: now the Run is
    # held as changed, which is then the truth (and what the problem above warned of).
    toml.write_text('workflows = ["workflows/acc.py"]\n')
    [preview] = acc.cli("doctor", "--json").json["runs"]
    assert "Workflow 'acc' changed" in preview["problem"], preview
    copy.unlink()
    assert _restore(acc)["waiting"] == [run_id]
    done = ok(acc.cli("answer", run_id, action, '{"isConfirmed": true}', "--json"))
    assert done["run"]["status"] == "completed"
    ok(acc.cli("stop", "--json"))


BROKEN = "import intloom\n\ndef oops(:\n    pass\n"  # a SyntaxError on line 3


@pytest.fixture
def broken(acc: Project) -> Project:
    """``acc`` plus a second source, in a directory of its own, that does not compile."""
    (acc.root / "workflows" / "broken").mkdir()
    (acc.root / "workflows" / "broken" / "broken_syntax.py").write_text(BROKEN)
    (acc.root / "intloom.toml").write_text(
        'workflows = ["workflows/acc.py", "workflows/broken/broken_syntax.py"]\n')
    return acc


def test_a_syntax_error_names_its_file_line_and_text(broken: Project) -> None:
    ok(broken.cli("start", "--json"))
    flows = ok(broken.cli("flows", "--json"))["workflows"]
    [problem] = [w["problem"] for w in flows if not w["ready"]]
    # The compiler's own location, not the importlib frame that re-raised it.
    assert "SyntaxError: invalid syntax (workflows/broken/broken_syntax.py, line 3" in problem
    assert "`def oops(:`" in problem and "<frozen" not in problem, problem
    ok(broken.cli("stop", "--json"))


def test_doctor_says_what_a_start_does_with_a_broken_source(broken: Project) -> None:
    ok(broken.cli("start", "--json"))
    run = ok(broken.cli("flow", "acc", "--intent", "i", "--json"))["run"]
    assert run["status"] == "waiting"  # the host did start, and runs the other Workflow
    doctor = broken.cli("doctor", "--json")
    assert doctor.code == 3, (doctor.code, doctor.stdout)
    [check] = [c for c in doctor.json["checks"] if c["id"] == "workflows"]
    assert check["status"] == "attention" and "broken_syntax.py" in check["message"]
    assert "refuses to start" not in check["next"], check["next"]
    assert "The host runs the Workflows that load" in check["next"], check["next"]
    assert "held" in check["next"]
    ok(broken.cli("stop", "--json"))


def test_start_names_each_source_that_failed_to_load(broken: Project) -> None:
    started = broken.cli("start")
    assert started.code == 0, started.stderr
    lines = started.stdout.splitlines()
    assert "Workflows 1 loaded · 1 failed to load" in lines, started.stdout
    [failed] = [line for line in lines if line.startswith("Failed to load ")]
    assert failed.startswith(
        "Failed to load workflows/broken/broken_syntax.py · WORKFLOW_LOAD_FAILED: "
        "Importing "), failed
    assert any("Runs of a Workflow that failed to load are held" in line for line in lines)

    service = ok(broken.cli("start", "--json"))["service"]  # reused: the same facts
    assert service["workflowCount"] == 1
    [problem] = service["workflowProblems"]
    assert (problem["source"], problem["code"]) == (
        "workflows/broken/broken_syntax.py", "WORKFLOW_LOAD_FAILED")
    assert "broken_syntax.py" in problem["message"]
    assert ok(broken.cli("status", "--json"))["service"]["workflowProblems"] == [problem]
    ok(broken.cli("stop", "--json"))


def test_a_source_path_the_os_cannot_examine_fails_alone_and_the_host_starts(
    acc: Project,
) -> None:
    """An entry of intloom.toml whose path the OS refuses to look at (a name over 255 bytes,
    ENAMETOOLONG: a pasted string, a path glued twice) made doctor fail CLI_INTERNAL_ERROR
    and the host refuse to start at all (CLI_INTERNAL_ERROR), where a missing source fails
    alone: it is named as one source that failed to load, and the others run."""
    long = "workflows/" + "x" * 300 + ".py"
    (acc.root / "intloom.toml").write_text(f'workflows = ["workflows/acc.py", "{long}"]\n')
    doctor = acc.cli("doctor", "--json")
    assert doctor.code == 3, (doctor.code, doctor.stdout, doctor.stderr)
    [check] = [c for c in doctor.json["checks"] if c["id"] == "workflows"]
    assert check["status"] == "attention", check
    assert "Loaded: acc 1.0.0" in check["message"], check["message"]
    service = ok(acc.cli("start", "--json"))["service"]
    assert service["workflowCount"] == 1
    [problem] = service["workflowProblems"]
    assert (problem["source"], problem["code"]) == (long, "WORKFLOW_LOAD_FAILED"), problem
    assert problem["message"] == (
        f"{long} (from intloom.toml) cannot be examined under {acc.root} (File name too "
        "long). Fix the path."), problem["message"]
    assert ok(acc.cli("flow", "acc", "--intent", "i", "--json"))["run"]["status"] == "waiting"
    ok(acc.cli("stop", "--json"))


THREADED = textwrap.dedent('''
    """Starts a background thread when imported, as a client library's poller does."""

    import threading
    import time

    import intloom


    def poll() -> None:
        while True:
            time.sleep(0.05)


    threading.Thread(target=poll, name="poller").start()  # not a daemon
    wf = intloom.Workflow("threaded", version="1.0.0")
    s = wf.stage("s")


    @s.step("only", routes={"done": intloom.COMPLETE})
    def only(ctx: intloom.StepContext[None]) -> str:
        return "done"
''')


@pytest.mark.parametrize("command", ["doctor", "inspect"])
def test_doctor_and_inspect_end_when_a_source_leaves_a_thread_running(
    acc: Project, command: str,
) -> None:
    """doctor and inspect import the Workflow sources; one that starts a thread that never
    ends (not a daemon: a poller, a metrics client) kept the command from exiting after it
    had printed its report, so it never returned. The host exits regardless; so do they."""
    (acc.root / "workflows" / "threaded").mkdir()
    (acc.root / "workflows" / "threaded" / "__init__.py").write_text(THREADED)
    (acc.root / "intloom.toml").write_text(
        'workflows = ["workflows/acc.py", "workflows/threaded"]\n')
    ok(acc.cli("start", "--json"))
    run_id = ok(acc.cli("flow", "threaded", "--intent", "i", "--json"))["run"]["runId"]
    ok(acc.cli("stop", "--json"))
    args = ["doctor", "--json"] if command == "doctor" else ["inspect", run_id, "--json"]
    done = acc.cli(*args, timeout=30)  # subprocess.run kills it and raises at the deadline
    assert done.code == 0, (done.code, done.stdout, done.stderr)
    if command == "doctor":
        assert done.json["health"] == "healthy", done.stdout
    else:
        assert done.json["run"]["status"] == "completed", done.stdout


ASYNC_SETUP = textwrap.dedent('''
    """Sets an async client up when imported, as a script would."""

    import asyncio

    import intloom


    async def connect() -> str:
        await asyncio.sleep(0)
        return "client"


    CLIENT = asyncio.run(connect())
    _loop = asyncio.new_event_loop()
    POOL = _loop.run_until_complete(connect())
    _loop.close()
    wf = intloom.Workflow("setup", version="1.0.0")
    s = wf.stage("s")


    @s.step("only", routes={"client": intloom.COMPLETE})
    async def only(ctx: intloom.StepContext[None]) -> str:
        await asyncio.sleep(0)  # the host's loop runs the Step
        return CLIENT
''')


def test_a_source_that_runs_asyncio_when_imported_loads_in_the_host_as_in_doctor(
    acc: Project,
) -> None:
    """The host imported the Workflow modules on its running event loop, so a module that
    set itself up with asyncio.run(...) (or a loop of its own's run_until_complete) failed to
    load in the host, "asyncio.run() cannot be called from a running event loop", while
    doctor, importing it as a script does, said it loads. It loads in both."""
    _loads_in_doctor_and_in_the_host(acc, ASYNC_SETUP)
    run = ok(acc.cli("flow", "setup", "--intent", "i", "--json"))["run"]
    assert run["status"] == "completed", run
    assert ok(acc.cli("flow", "acc", "--intent", "i", "--json"))["run"]["status"] == "waiting"
    ok(acc.cli("stop", "--json"))


READS_DATA = textwrap.dedent('''
    """Reads a project file when imported, by a path relative to the project root."""

    import intloom

    PROMPT = open("data/prompt.txt", encoding="utf-8").read()
    wf = intloom.Workflow("reads", version="1.0.0")
    s = wf.stage("s")


    @s.step("only", routes={"done": intloom.COMPLETE})
    async def only(ctx: intloom.StepContext[None]) -> str:
        await ctx.confirm({"prompt": PROMPT})
        return "done"


    @only.recover
    def only_recover(ctx: intloom.StepContext[None], saved: intloom.Recovery) -> str:
        return "done"
''')


def test_doctor_and_inspect_import_the_sources_from_the_project_root_as_the_host_does(
    acc: Project,
) -> None:
    """The host runs in the project root; doctor and inspect imported the sources in the
    directory they were run from. A module reading data/prompt.txt when imported loads in
    the host, but doctor run from a subdirectory (or with --project from elsewhere) said it
    failed to load (FileNotFoundError), and inspect previewed its Runs as held."""
    (acc.root / "data").mkdir()
    (acc.root / "data" / "prompt.txt").write_text("Summarise.")
    (acc.root / "workflows" / "reads").mkdir()
    (acc.root / "workflows" / "reads" / "__init__.py").write_text(READS_DATA)
    (acc.root / "intloom.toml").write_text(
        'workflows = ["workflows/acc.py", "workflows/reads"]\n')
    assert ok(acc.cli("start", "--json"))["service"]["workflowProblems"] == []
    run_id = ok(acc.cli("flow", "reads", "--intent", "i", "--json"))["run"]["runId"]
    ok(acc.cli("stop", "--json"))
    for cwd in (acc.root / "workflows", acc.root.parent):
        project = () if cwd.is_relative_to(acc.root) else ("--project", str(acc.root))
        doctor = run_cli(*project, "doctor", "--json", cwd=cwd)
        [check] = [c for c in only_json(doctor)["checks"] if c["id"] == "workflows"]
        assert check["status"] == "ok", (cwd, check)
        inspected = only_json(run_cli(*project, "inspect", run_id, "--json", cwd=cwd))
        assert inspected["run"]["restart"]["row"] == "restore_wait", (cwd, inspected["run"])
        assert os.getcwd() != str(acc.root)  # the test's own directory is not the project


ASKS_AT_IMPORT = textwrap.dedent('''
    """Asks for a key on stdin when it is not in the environment, as a script might."""

    import os

    import intloom

    KEY = os.environ.get("NO_SUCH_KEY_VAR") or input("API key: ")
    wf = intloom.Workflow("asks", version="1.0.0")
    s = wf.stage("s")


    @s.step("only", routes={"done": intloom.COMPLETE})
    def only(ctx: intloom.StepContext[None]) -> str:
        return "done"
''')


def test_doctor_judges_a_source_reading_stdin_as_the_host_does_without_waiting(
    acc: Project,
) -> None:
    """The host imports with stdin on /dev/null: a module calling input() fails to load
    there (EOFError). doctor imported it on the terminal's stdin, so it sat waiting for a
    line behind a prompt it had set aside (the module's output is shown afterwards), and
    what was typed made it say the source loads. It reads /dev/null as the host does."""
    (acc.root / "workflows" / "asks").mkdir()
    (acc.root / "workflows" / "asks" / "__init__.py").write_text(ASKS_AT_IMPORT)
    (acc.root / "intloom.toml").write_text(
        'workflows = ["workflows/acc.py", "workflows/asks"]\n')
    [problem] = ok(acc.cli("start", "--json"))["service"]["workflowProblems"]
    assert "EOFError" in problem["message"], problem
    ok(acc.cli("stop", "--json"))
    held_open, writer = os.pipe()  # a terminal nobody types into: never at end of file
    try:
        doctor = subprocess.run(
            [sys.executable, "-m", "intloom", "--project", str(acc.root), "doctor", "--json"],
            stdin=held_open, capture_output=True, text=True, timeout=30,
            env={**os.environ, "NO_COLOR": "1"},
        )
    finally:
        os.close(held_open)
        os.close(writer)
    assert doctor.returncode == 3, (doctor.returncode, doctor.stdout, doctor.stderr)
    [check] = [c for c in json.loads(doctor.stdout)["checks"] if c["id"] == "workflows"]
    assert "workflows/asks: WORKFLOW_LOAD_FAILED" in check["message"], check
    assert "EOFError" in check["message"], check


GET_EVENT_LOOP_SETUP = textwrap.dedent('''
    """Sets an async client up when imported the older way: the thread's event loop."""

    import asyncio

    import intloom


    async def connect() -> str:
        await asyncio.sleep(0)
        return "client"


    CLIENT = asyncio.get_event_loop().run_until_complete(connect())
    wf = intloom.Workflow("setup", version="1.0.0")
    s = wf.stage("s")


    @s.step("only", routes={"client": intloom.COMPLETE})
    async def only(ctx: intloom.StepContext[None]) -> str:
        await asyncio.sleep(0)
        return CLIENT
''')


def test_a_source_that_runs_the_threads_event_loop_when_imported_loads_in_the_host(
    acc: Project,
) -> None:
    """The host hid its running loop while the modules imported, but left it the thread's
    event loop: asyncio.get_event_loop().run_until_complete(...) at import, which a script
    (doctor) runs on a loop of its own, got the host's loop and failed to load, "This event
    loop is already running" (and a task a module created there would run in the host)."""
    _loads_in_doctor_and_in_the_host(acc, GET_EVENT_LOOP_SETUP)
    run = ok(acc.cli("flow", "setup", "--intent", "i", "--json"))["run"]
    assert run["status"] == "completed", run
    ok(acc.cli("stop", "--json"))


def test_all_sources_loading_is_an_empty_list_not_a_missing_key(acc: Project) -> None:
    service = ok(acc.cli("start", "--json"))["service"]
    assert service["workflowProblems"] == [] and service["workflowCount"] == 1
    assert "failed to load" not in acc.cli("start").stdout
    ok(acc.cli("stop", "--json"))


MIXED = textwrap.dedent('''
    import intloom

    good = intloom.Workflow("mixed-good", version="1")
    s = good.stage("s")


    @s.step("a", routes={"x": intloom.COMPLETE})
    def a(ctx: intloom.StepContext[None]) -> str:
        return "x"


    bad = intloom.Workflow("mixed-bad", version="1")
    t = bad.stage("t")  # a Stage with no Step
''')
TWINS = textwrap.dedent('''
    import intloom

    first = intloom.Workflow("twin", version="1")
    s = first.stage("s")


    @s.step("a", routes={"x": intloom.COMPLETE})
    def a(ctx: intloom.StepContext[None]) -> str:
        return "x"


    second = intloom.Workflow("twin", version="2")
    t = second.stage("t")


    @t.step("b", routes={"x": intloom.COMPLETE})
    def b(ctx: intloom.StepContext[None]) -> str:
        return "x"
''')


def test_a_source_with_one_bad_workflow_loads_none_of_them(acc: Project) -> None:
    for name, text in (("mixed", MIXED), ("twins", TWINS)):
        (acc.root / "workflows" / name).mkdir()
        (acc.root / "workflows" / name / "wf.py").write_text(text)
    (acc.root / "intloom.toml").write_text(
        'workflows = ["workflows/acc.py", "workflows/mixed/wf.py", "workflows/twins/wf.py"]\n')
    started = acc.cli("start")
    assert started.code == 0, started.stderr
    assert "Workflows 1 loaded · 2 failed to load" in started.stdout.splitlines(), started.stdout
    flows = ok(acc.cli("flows", "--json"))["workflows"]
    # Reported as failed, and not half-loaded: neither file's good Workflow runs.
    assert {w["name"] for w in flows if w["ready"]} == {"acc"}, flows
    problems = ok(acc.cli("status", "--json"))["service"]["workflowProblems"]
    by_source = {p["source"]: p["message"] for p in problems}
    assert "mixed-bad" in by_source["workflows/mixed/wf.py"], by_source
    assert by_source["workflows/twins/wf.py"] == (
        "workflows/twins/wf.py defines Workflow 'twin' twice (first and second). "
        "Give each its own name.")
    assert acc.cli("flow", "mixed-good", "--intent", "i", "--json").json["error"]["code"] in (
        "NOT_FOUND", "WORKFLOW_LOAD_FAILED", "WORKFLOW_DEFINITION_INVALID")
    ok(acc.cli("stop", "--json"))


# Sources that raise at import what is not an ordinary Exception, or that define a State the
# host cannot fingerprint: each fails alone, named, and the host still starts.
ESCAPES = {
    **{name: SOURCES[name] for name in ("pathstate", "exits", "argv")},
    # What a module prints while doctor or inspect imports it goes to stderr, never into
    # their one JSON document: print, and writes to the file descriptor itself (as a C
    # library's banner or a program the module runs would make).
    "prints": ('import os\nprint("loading example workflow")\n'
               'os.write(1, b"fd-level banner\\n")\n\nraise RuntimeError("not today")\n'),
    # A BaseException of the module's own (pytest.skip at module level raises one), and
    # asyncio's CancelledError: they passed the loader, failed the host's start
    # (CLI_INTERNAL_ERROR, no file named) and ended doctor and inspect with a traceback.
    "based": 'class Skip(BaseException):\n    pass\n\n\nraise Skip("not a workflow")\n',
    "cancels": 'import asyncio\n\n\n\nraise asyncio.CancelledError()\n',
}


@pytest.fixture
def escapes(acc: Project) -> Project:
    """``acc`` plus each of ``ESCAPES``, in a directory of its own."""
    for name, text in ESCAPES.items():
        (acc.root / "workflows" / name).mkdir()
        (acc.root / "workflows" / name / "wf.py").write_text(text)
    sources = ", ".join(f'"workflows/{name}/wf.py"' for name in ESCAPES)
    (acc.root / "intloom.toml").write_text(f'workflows = ["workflows/acc.py", {sources}]\n')
    return acc


def _named(problems: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    return {p["source"]: (p["code"], p["message"]) for p in problems}


def _check_escapes(named: dict[str, tuple[str, str]]) -> None:
    assert set(named) == {f"workflows/{name}/wf.py" for name in ESCAPES}, named
    code, message = named["workflows/pathstate/wf.py"]
    assert code == "WORKFLOW_DEFINITION_INVALID"
    assert ("Workflow 'pathstate', Stage 's': State Notes field 'out' has type pathlib.Path, "
            "which has no JSON Schema") in message, message
    assert "Declare 'out' as str" in message
    for name, exit_code in (("exits", 0), ("argv", 2)):
        code, message = named[f"workflows/{name}/wf.py"]
        assert code == "WORKFLOW_LOAD_FAILED"
        assert f"SystemExit({exit_code}) (line 5 of workflows/{name}/wf.py)" in message, message
    for name, raised in (("based", "Skip('not a workflow')"), ("cancels", "CancelledError")):
        code, message = named[f"workflows/{name}/wf.py"]
        assert code == "WORKFLOW_LOAD_FAILED"
        assert f"{raised} (line 5 of workflows/{name}/wf.py)" in message, message
        assert "(a BaseException, which the process keeps for itself)" in message, message


def test_a_source_raising_anything_at_import_fails_alone_and_the_host_starts(
    escapes: Project,
) -> None:
    started = escapes.cli("start", "--json")
    service = ok(started)["service"]
    assert service["workflowCount"] == 1
    _check_escapes(_named(service["workflowProblems"]))
    flows = ok(escapes.cli("flows", "--json"))["workflows"]
    assert [w["name"] for w in flows if w["ready"]] == ["acc"], flows
    # Each failed source is listed by its path, as docs/cli.md says, with its error.
    failed = {w["source"]: w for w in flows if not w["ready"]}
    assert set(failed) == {f"workflows/{name}/wf.py" for name in ESCAPES}, flows
    for source, info in failed.items():
        assert (info["name"], info["version"], info["identity"], info["stages"]) == (
            source, "", "", []), info
        assert info["problem"].startswith("WORKFLOW_"), info
    run = ok(escapes.cli("flow", "acc", "--intent", "i", "--json"))["run"]
    assert run["status"] == "waiting"
    # A Workflow whose source failed to load is "not loaded", and the sources that failed
    # are named (it said "loaded: acc" and nothing of them).
    missing = escapes.cli("flow", "pathstate", "--intent", "i", "--json")
    assert missing.code == 1, missing.stdout
    error = missing.json["error"]
    assert error["code"] == "NOT_FOUND"
    assert f"{len(ESCAPES)} Workflow source(s) failed to load and may define it" in (
        error["message"]), error["message"]
    assert "workflows/pathstate/wf.py" in error["message"]
    ok(escapes.cli("stop", "--json"))


@pytest.mark.parametrize("name", list(ESCAPES))
def test_doctor_and_inspect_report_such_a_source_in_one_json_document(
    escapes: Project, name: str,
) -> None:
    # The Run is started while only acc is listed: the commands below are then all that
    # imports the other source, in their own process.
    toml = escapes.root / "intloom.toml"
    toml.write_text('workflows = ["workflows/acc.py"]\n')
    ok(escapes.cli("start", "--json"))
    run = ok(escapes.cli("flow", "acc", "--intent", "i", "--json"))["run"]
    ok(escapes.cli("stop", "--json"))
    source = f"workflows/{name}/wf.py"
    toml.write_text(f'workflows = ["workflows/acc.py", "{source}"]\n')

    doctor = escapes.cli("--json", "doctor")  # argv as the review ran it
    inspected = escapes.cli("--json", "inspect", run["runId"])
    assert (doctor.code, inspected.code) == (3, 0), (doctor, inspected)
    [check] = [c for c in doctor.json["checks"] if c["id"] == "workflows"]
    assert check["status"] == "attention", check
    assert check["message"].startswith(
        f"1 Workflow source(s) failed to load: {source}: WORKFLOW_"), check["message"]
    assert "Loaded: acc 1.0.0" in check["message"]
    assert inspected.json["run"]["runId"] == run["runId"], inspected.stdout
    if name == "prints":  # moved, not lost, and shown as the module's
        for done in (doctor, inspected):
            assert "Workflow sources wrote this while they were imported:" in done.stderr
            assert "  | loading example workflow" in done.stderr, done.stderr
            assert "  | fd-level banner" in done.stderr, done.stderr
    if name == "argv":  # argparse's complaint is the module's, not intloom's own
        for done in (doctor, inspected):
            lines = done.stderr.splitlines()
            assert "Workflow sources wrote this while they were imported:" in lines, lines
            assert any(line.startswith("  | usage: ") for line in lines), lines
            assert not any(line.startswith("usage: ") for line in lines), lines


def test_stale_bytecode_of_a_later_entrys_tree_never_runs_when_an_earlier_entry_imports_it(
    tmp_path: Path,
) -> None:
    """Each entry's tree was compiled from its bytes only from that entry's own import on:
    a module of a later entry's tree imported first by an earlier entry ran from its stale
    ``__pycache__`` file, under the identity of its new bytes (beta said 1.0.0)."""
    root = tmp_path / "proj"
    for tree in ("a", "b"):
        (root / tree).mkdir(parents=True)
        (root / tree / "wf.py").write_text(textwrap.dedent(f'''
            import intloom
            from b import helpers

            wf = intloom.Workflow("{'alpha' if tree == 'a' else 'beta'}",
                                  version={'"1.0.0"' if tree == 'a' else 'helpers.VERSION'})
            main = wf.stage("main")


            @main.step("go", routes={{"ok": intloom.COMPLETE}})
            def go(ctx: intloom.StepContext[None]) -> str:
                return "ok"
        '''))
    helpers = root / "b" / "helpers.py"
    helpers.write_text('VERSION = "1.0.0"\n')
    (root / "intloom.toml").write_text('workflows = ["a/wf.py", "b/wf.py"]\n')
    py_compile.compile(str(helpers), cfile=importlib.util.cache_from_source(str(helpers)),
                       doraise=True, invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
    before = helpers.stat()
    helpers.write_text('VERSION = "2.0.0"\n')
    os.utime(helpers, ns=(before.st_atime_ns, before.st_mtime_ns))
    doctor = Project(root=root).cli("doctor", "--json")
    [workflows] = [c for c in doctor.json["checks"] if c["id"] == "workflows"]
    assert "beta 2.0.0" in workflows["message"], workflows


@pytest.mark.parametrize("spelling", ["dotdot", "linked"])
def test_stale_bytecode_never_runs_when_a_sibling_is_found_through_its_real_path(
    tmp_path: Path, spelling: str,
) -> None:
    """An entry named through ``..`` or a linked directory (``shared/wf.py``, ``linked/wf.py``)
    whose module puts its own directory on sys.path the usual way
    (``os.path.dirname(os.path.abspath(__file__))``, ``Path(__file__).resolve().parent``)
    imports its helpers by another spelling of its tree: they ran from their stale
    ``__pycache__`` file under the identity of their new bytes (doctor said 1.0.0)."""
    root, tree = tmp_path / "proj", tmp_path / "shared"
    tree.mkdir()
    root.mkdir()
    (tree / "wf.py").write_text(textwrap.dedent('''
        import os, sys
        from pathlib import Path
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import intloom
        import shared_helpers

        wf = intloom.Workflow("shared", version=shared_helpers.VERSION)
        main = wf.stage("main")


        @main.step("go", routes={"ok": intloom.COMPLETE})
        def go(ctx: intloom.StepContext[None]) -> str:
            return "ok"
    '''))
    if spelling == "linked":
        (root / "linked").symlink_to(tree, target_is_directory=True)
        entry = "linked/wf.py"
    else:
        entry = "../shared/wf.py"
    helpers = tree / "shared_helpers.py"
    helpers.write_text('VERSION = "1.0.0"\n')
    (root / "intloom.toml").write_text(f'workflows = ["{entry}"]\n')
    py_compile.compile(str(helpers), cfile=importlib.util.cache_from_source(str(helpers)),
                       doraise=True, invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
    before = helpers.stat()
    helpers.write_text('VERSION = "2.0.0"\n')
    os.utime(helpers, ns=(before.st_atime_ns, before.st_mtime_ns))
    doctor = Project(root=root).cli("doctor", "--json")
    [workflows] = [c for c in doctor.json["checks"] if c["id"] == "workflows"]
    assert "shared 2.0.0" in workflows["message"], workflows


def _loads_in_doctor_and_in_the_host(acc: Project, source: str) -> None:
    """``source`` as the package workflows/setup beside acc.py: doctor's workflows check is
    ok, and the host started on it loads both, with no problem."""
    (acc.root / "workflows" / "setup").mkdir()
    (acc.root / "workflows" / "setup" / "__init__.py").write_text(source)
    (acc.root / "intloom.toml").write_text(
        'workflows = ["workflows/acc.py", "workflows/setup"]\n')
    doctor = acc.cli("doctor", "--json")
    [check] = [c for c in doctor.json["checks"] if c["id"] == "workflows"]
    assert check["status"] == "ok", check
    service = ok(acc.cli("start", "--json"))["service"]
    assert (service["workflowCount"], service["workflowProblems"]) == (2, []), (
        service["workflowProblems"])


TALKS = textwrap.dedent('''
    import os
    import sys

    import intloom

    print("printed when imported")
    os.write(1, b"written to fd 1 when imported\\n")
    print("to stderr when imported", file=sys.stderr)

    wf = intloom.Workflow("talks", version="1")
    s = wf.stage("s")


    @s.step("a", routes={"ok": intloom.COMPLETE})
    def a(ctx: intloom.StepContext[None]) -> str:
        print("printed by the Step")
        return "ok"
''')


def test_json_start_foreground_keeps_stdout_to_its_one_document(tmp_path: Path) -> None:
    """``intloom --json start --foreground`` with a source that prints when imported wrote
    that output to stdout ahead of the one JSON document the command promises there, and
    a Step's ``print`` after it: a script's ``json.loads`` of stdout failed. In JSON mode
    what the Workflows write goes to stderr; stdout holds the document alone."""
    project = one_source_project(tmp_path, "talks", TALKS)
    try:
        with foreground_host(project, "--json") as proc:
            run = ok(project.cli("flow", "talks", "--intent", "x", "--json"))["run"]
            assert run["status"] == "completed", run
            ok(project.cli("stop", "--json"))
            out, err = proc.communicate(timeout=30)
    finally:
        project.reap()
    assert proc.returncode == 0, (out, err)
    assert json.loads(out)["service"]["pid"] == proc.pid, out  # one document, nothing else
    for said in ("printed when imported", "written to fd 1 when imported",
                 "to stderr when imported", "printed by the Step"):
        assert said in err, (said, err)
