"""``intloom.toml`` as a user writes it: each mistake in it is named by ``start``,
``status`` and ``doctor`` in the same words, with where it is and the fix, and the file is
left byte-identical. Real CLI subprocesses; a host that a test starts is reaped."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Project, one_source_project, reaped, snapshot_files

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SOURCE = '''import intloom

wf = intloom.Workflow("note", version="1.0.0")
s = wf.stage("s")


@s.step("only", routes={"done": intloom.COMPLETE})
def only(ctx: intloom.StepContext[None]) -> str:
    return "done"
'''


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "note", SOURCE))


def refusals(project: Project, config: bytes) -> list[str]:
    """``config`` written as intloom.toml: the message start, status and doctor give for it
    (each with its documented exit code), checking the file is kept as it was."""
    path = project.root / "intloom.toml"
    path.write_bytes(config)
    start = project.cli("start", "--json")
    assert start.code == 1, (start.code, start.stdout, start.stderr)
    assert start.json["error"]["code"] == "INVALID_REQUEST", start.stdout
    status = project.cli("status", "--json")
    assert status.code == 0, (status.code, status.stdout, status.stderr)
    doctor = project.cli("doctor", "--json")
    assert doctor.code == 3, (doctor.code, doctor.stdout, doctor.stderr)
    check = next(c for c in doctor.json["checks"] if c["id"] == "config")
    assert check["status"] == "attention", check
    assert path.read_bytes() == config
    message = start.json["error"]["message"]
    refused = "But intloom start refuses the project as it is: "
    assert status.json["startProblem"] == refused + message
    assert check["message"] == message
    return [message]


def test_bytes_that_are_not_utf8_are_named_by_line_and_column(project: Project) -> None:
    """A config saved as Latin-1 (a comment with "café") was "not valid TOML ('utf-8' codec
    can't decode byte 0xe9 in position 51: invalid start byte)": an offset no editor shows,
    and TOML that was fine called invalid. It names the line and column, and the fix."""
    config = b'workflows = [\n  "workflows/note.py",  # caf\xe9\n]\n'
    (message,) = refusals(project, config)
    path = project.root / "intloom.toml"
    assert message == (
        f"{path} is not UTF-8 text: the byte 0xe9 at line 2, column 30 is not UTF-8, and "
        "TOML files are UTF-8 (a file saved as Latin-1 or Windows-1252 holds such bytes). "
        "Save it as UTF-8, or retype what is there, then retry."), message


def test_a_config_saved_as_utf16_says_so(project: Project) -> None:
    """An editor's "Unicode" (UTF-16) was byte 0xff "in position 0" of invalid TOML."""
    config = '\ufeffworkflows = ["workflows/note.py"]\n'.encode("utf-16-le")
    (message,) = refusals(project, config)
    assert "is saved as UTF-16 (it starts with a UTF-16 byte-order mark)" in message, message
    assert 'Save it as UTF-8 (the encoding "UTF-8"' in message, message


def test_crlf_and_lone_cr_line_endings_load_as_before(project: Project) -> None:
    """Read as bytes now, the config still ends lines as read_text() did."""
    for config in (b'workflows = ["workflows/note.py"]\r\nport = 0\r\n',
                   b'workflows = ["workflows/note.py"]\rport = 0\r'):
        (project.root / "intloom.toml").write_bytes(config)
        doctor = project.cli("doctor", "--json")
        check = next(c for c in doctor.json["checks"] if c["id"] == "config")
        assert check["status"] == "ok", check


@pytest.mark.parametrize(("config", "fact"), [
    ('workflows = "workflows/note.py"\n',
     "'workflows' is a string, not a list of paths: write it in brackets, "
     'workflows = ["workflows/note.py"].'),
    ('workflows = ["workflows/note.py", 3, ""]\n',
     "in 'workflows', entry 2 is an integer, entry 3 is empty, not a path in quotes; "),
    ('[workflows]\nnote = "workflows/note.py"\n', "'workflows' is a table, not a list; "),
    ('workflows = ["workflows/note.py"]\nport = 70000\n', "'port' is 70000, outside 0 to 65535; "),
    ('workflows = ["workflows/note.py"]\nport = "8765"\n',
     "'port' is a string (write it without quotes: port = 8765); "),
    ('workflows = ["workflows/note.py"]\nport = true\n',
     "'port' is a boolean (true), not a number; "),
    ('workflows = ["workflows/note.py"]\nport = 8765.0\n', "'port' is a float, not an integer; "),
], ids=["workflows-string", "workflows-entries", "workflows-table", "port-range",
        "port-quoted", "port-boolean", "port-float"])
def test_a_wrong_value_says_what_is_there_and_how_to_write_it(
        project: Project, config: str, fact: str) -> None:
    """A wrong value said only what was expected ("'port' must be an integer from 0 to
    65535"), never what was found: a quoted "8765", a single string where a list goes, or
    which of ten entries was empty. It names what is there, then the fix."""
    (message,) = refusals(project, config.encode())
    assert message.startswith(f"{project.root / 'intloom.toml'}: {fact}"), message


@pytest.mark.parametrize(("config", "fact"), [
    ('workflows = ["workflows/note.py"]\nprot = 8765\n',
     "unknown key 'prot' (did you mean 'port'?). Known keys: port, workflows. "
     "Remove or rename it."),
    ('workflow = ["workflows/note.py"]\ncolour = "red"\n',
     "unknown keys 'colour' and 'workflow' (did you mean 'workflows'?). Known keys: port, "
     "workflows. Remove or rename them."),
    ('[tool.intloom]\nworkflows = ["workflows/note.py"]\n',
     "unknown key 'tool' (a table holding 'tool.intloom.workflows': intloom.toml takes its "
     "keys at the top level, before any [table] header). Known keys: port, workflows. "
     "Remove or rename it."),
], ids=["typo", "two-keys", "table"])
def test_unknown_keys_are_all_named_with_the_known_key_meant(
        project: Project, config: str, fact: str) -> None:
    """Only the first unknown key was named, so a config with two slips took two rounds,
    and "unknown key 'prot'" or "unknown key 'tool'" (a [tool.intloom] table copied from a
    pyproject.toml) did not say which known key was meant or where it went."""
    (message,) = refusals(project, config.encode())
    assert message == f"{project.root / 'intloom.toml'}: {fact}", message


def test_a_source_that_is_no_python_file_is_refused_unread_and_the_rest_runs(
        project: Project) -> None:
    """Any listed path was run as Python: a FIFO (workflows/feed.py) held start and doctor
    until their deadline, waiting for a writer, and a notes.txt listed by mistake was
    executed. Each is now a source that failed to load, named with what it is; nothing of
    it is read, and the host starts with the others."""
    import os

    os.mkfifo(project.root / "workflows" / "feed.py")
    (project.root / "notes.txt").write_text('open("executed", "w").close()\n')
    (project.root / "intloom.toml").write_text(
        'workflows = ["workflows/note.py", "workflows/feed.py", "notes.txt"]\n')
    started = project.cli("start", "--json", "--timeout", "20")
    assert started.code == 0, (started.code, started.stdout, started.stderr)
    service = started.json["service"]
    assert service["workflowCount"] == 1, service
    problems = {p["source"]: p for p in service["workflowProblems"]}
    assert set(problems) == {"workflows/feed.py", "notes.txt"}, problems
    assert problems["workflows/feed.py"]["message"].startswith(
        "workflows/feed.py (from intloom.toml) is a FIFO (named pipe), and a Workflow source "
        "is a Python file (its name ends in .py) or a package"), problems
    assert problems["notes.txt"]["message"].startswith(
        "notes.txt (from intloom.toml) is not a Python file (its name does not end in .py)"
    ), problems
    assert not (project.root / "executed").exists()
    doctor = project.cli("doctor", "--json", timeout=30)
    check = next(c for c in doctor.json["checks"] if c["id"] == "workflows")
    assert "is a FIFO (named pipe)" in check["message"], check
    assert project.cli("stop", "--json").code == 0


@pytest.mark.parametrize(("entry", "rest"), [
    ("workflows/note", "Did you mean 'workflows/note.py'?"),
    ("Workflows/note.py", "Did you mean 'workflows/note.py'?"),
    ("workflows/note.py ", "Did you mean 'workflows/note.py' (without the spaces)?"),
    ("workflows/noet.py", "Did you mean 'workflows/note.py'?"),
    ("workflows/other.py", "workflows/ holds no 'other.py'."),
    ("flows/note.py", "The project root holds no 'flows'."),
    ("workflows/note.py/x.py", "workflows/note.py is a file, not a directory."),
], ids=["no-suffix", "case", "space", "typo", "no-file", "no-dir", "below-a-file"])
def test_a_missing_source_names_the_path_it_is_a_slip_of(
        project: Project, entry: str, rest: str) -> None:
    """A missing source was "does not exist under ROOT. Fix the path." and no more: a
    missing .py, a capital, a trailing space in the quotes (invisible in the message) or
    a swapped letter left the user to compare the path with the disk by hand."""
    (project.root / "intloom.toml").write_text(f'workflows = ["{entry}"]\n')
    started = project.cli("start", "--json")
    assert started.code == 0, (started.code, started.stdout, started.stderr)
    (problem,) = started.json["service"]["workflowProblems"]
    assert problem["message"] == (
        f"{entry} (from intloom.toml) does not exist under {project.root}. {rest} "
        "Fix the path."), problem
    doctor = project.cli("doctor", "--json")
    check = next(c for c in doctor.json["checks"] if c["id"] == "workflows")
    assert f"{rest} Fix the path." in check["message"], check
    assert project.cli("stop", "--json").code == 0


def test_a_config_that_is_no_file_is_named_and_the_project_around_is_not_taken(
        tmp_path: Path) -> None:
    """A project whose intloom.toml is a link that leads nowhere (its target moved), a
    directory or a FIFO was passed over as if it had none: inside another project, status
    reported that outer project as this one's; alone, "No intloom.toml ... Run intloom
    init", while init answered that the directory holds intloom.toml, to start there."""
    import os
    import subprocess
    import sys

    outer = tmp_path / "outer"
    inner = outer / "tools" / "inner"
    inner.mkdir(parents=True)
    (outer / "intloom.toml").write_text("workflows = []\n")
    env = {**os.environ, "NO_COLOR": "1"}

    def cli(*args: str) -> tuple[int, dict[str, object]]:
        done = subprocess.run([sys.executable, "-m", "intloom", *args, "--json"], cwd=inner,
                              capture_output=True, text=True, timeout=60, env=env)
        return done.returncode, json.loads(done.stdout)

    fix = (", and a project's intloom.toml is a file (or a link to one) that intloom reads "
           "its configuration from. Put the file there (from version control, or write one "
           'listing the Workflow sources, e.g. workflows = ["workflows/example.py"]), then '
           "run the command again.")
    config = inner / "intloom.toml"
    for kind, fact in [
        ("link", "a symbolic link to ../../shared/intloom.toml, which does not exist"),
        ("directory", "a directory"),
        ("fifo", "a FIFO (named pipe)"),
    ]:
        if kind == "link":
            config.symlink_to("../../shared/intloom.toml")
        elif kind == "directory":
            config.mkdir()
        else:
            os.mkfifo(config)
        for args in (("status",), ("doctor",), ("--project", str(inner), "start")):
            code, reply = cli(*args)
            assert code == 1, (args, code, reply)
            assert reply == {"error": {
                "code": "CLI_PROJECT_INVALID", "message": f"{config} is {fact}{fix}",
                "retryable": False}}, (args, reply)
        assert not (inner / ".intloom").exists() and not (outer / ".intloom").exists()
        if kind == "directory":
            config.rmdir()
        else:
            config.unlink()


@pytest.mark.parametrize(("first", "again"), [
    ("workflows/note.py", "linked/note.py"),
    ("pkg", "pkg/__init__.py"),
], ids=["linked-directory", "package-init"])
def test_one_source_spelled_two_ways_is_loaded_once_not_held_as_two_definitions(
        project: Project, first: str, again: str) -> None:
    """The same file listed through a linked directory, or a package listed both as pkg and
    pkg/__init__.py, counted as two sources defining one Workflow: neither loaded, its Runs
    were held, and the message said to delete the "copy" (the package's own __init__.py)
    or rename the Workflow. It is one source listed twice: loaded from the first entry."""
    (project.root / "linked").symlink_to("workflows")
    (project.root / "pkg").mkdir()
    (project.root / "pkg" / "__init__.py").write_text(SOURCE)
    (project.root / "intloom.toml").write_text(f'workflows = ["{first}", "{again}"]\n')
    started = project.cli("start", "--json")
    assert started.code == 0, (started.code, started.stdout, started.stderr)
    service = started.json["service"]
    assert service["workflowCount"] == 1, service
    assert service["workflowProblems"] == [{
        "source": again, "code": "WORKFLOW_LOAD_FAILED",
        "message": f"{again} is listed in intloom.toml twice (as {first!r} and {again!r}); "
                   "it is loaded once, from the first. Remove the repeated entry from "
                   "'workflows'."}], service["workflowProblems"]
    run = project.cli("flow", "note", "--intent", "x", "--json")
    assert run.code == 0 and run.json["run"]["status"] == "completed", run
    assert project.cli("stop", "--json").code == 0


def test_a_listed_source_that_is_a_symbolic_link_names_where_it_leads(
        project: Project) -> None:
    """A Workflow source listed in intloom.toml that is a symbolic link was refused as "is
    a symbolic link; name the real file or package instead", without saying which file that
    is. The refusal names where the link leads: the file in the project to list instead, a
    target outside the project, or one that does not exist."""
    (project.root / "shared").mkdir()
    (project.root / "shared" / "real.py").write_text(SOURCE)
    (project.root / "workflows" / "link.py").symlink_to("../shared/real.py")
    (project.root / "workflows" / "gone.py").symlink_to("/nonexistent/flow.py")
    (project.root / "intloom.toml").write_text(
        'workflows = ["workflows/link.py", "workflows/gone.py"]\n')
    started = project.cli("start", "--json")
    assert started.code == 0, started
    problems = {p["source"]: p["message"] for p in started.json["service"]["workflowProblems"]}
    assert problems["workflows/link.py"].startswith(
        "workflows/link.py (from intloom.toml) is a symbolic link to ../shared/real.py, "
        "which is shared/real.py in the project; intloom loads a Workflow from the real "
        "file or package only"), problems
    assert problems["workflows/gone.py"].startswith(
        "workflows/gone.py (from intloom.toml) is a symbolic link to /nonexistent/flow.py, "
        "which does not exist;"), problems
    assert "Name the real file or package in 'workflows'" in problems["workflows/gone.py"]
    assert project.cli("stop", "--json").code == 0


def test_commands_of_an_offline_project_with_a_broken_config_name_it(project: Project) -> None:
    """With no host running, `intloom runs`, `flow` and `flows` said only "Run intloom
    start in this project first" of a project whose intloom.toml cannot be parsed; that
    start then refused it. They say so now (the file, why, the fix), as status does; with
    a config that parses, the message is as it was."""
    config = project.root / "intloom.toml"
    good = config.read_text()
    config.write_text(good + "workflows = [\n")
    for args in (("runs",), ("flow", "note", "--intent", "x"), ("flows",)):
        result = project.cli(*args, "--json")
        assert result.code == 1, result
        error = result.json["error"]
        assert error["code"] == "CLI_SERVICE_OFFLINE", error
        assert error["message"].startswith(
            "Run intloom start in this project first. But intloom start refuses the project "
            f"as it is: {config} is not valid TOML ("), error
    config.write_text(good)
    error = project.cli("runs", "--json").json["error"]
    assert error["message"] == "Run intloom start in this project first.", error


def test_a_config_past_one_mib_is_refused_unread_naming_its_size(project: Project) -> None:
    """An intloom.toml of 100 MB (a log pasted in) was parsed by every command: status took
    1.5 s. One past 1 MiB is refused unread, naming the file, its size and the limit; one
    of exactly 1 MiB still loads. The file is left byte-identical."""
    config = project.root / "intloom.toml"
    good = config.read_bytes()
    limit = 1 << 20
    pad = b"# " + b"x" * 97 + b"\n"
    exact = good + pad * ((limit - len(good)) // len(pad))
    exact += b"#" * (limit - len(exact) - 1) + b"\n"
    assert len(exact) == limit
    config.write_bytes(exact)
    started = project.cli("start", "--json")
    assert started.code == 0, started
    assert project.cli("stop", "--json").code == 0

    big = exact + pad * 1000
    config.write_bytes(big)
    said = (f"{config} is {len(big):,} bytes, over the 1,048,576-byte (1 MiB) limit of "
            "intloom.toml, so it was not read.")
    refused = project.cli("start", "--json")
    assert refused.code == 1, refused
    error = refused.json["error"]
    assert error["code"] == "INVALID_REQUEST" and error["message"].startswith(said), error
    status = project.cli("status", "--json").json
    assert said in status["startProblem"], status
    offline = project.cli("runs", "--json").json["error"]
    assert said in offline["message"], offline
    assert config.read_bytes() == big


def test_init_reads_the_trees_of_a_project_whose_config_has_a_slip(tmp_path: Path) -> None:
    """intloom init refuses a directory inside the source tree of the project around it,
    whose Runs the example written there would hold as changed. With a misspelt key (or a
    bad port) in that project's intloom.toml, init wrote there all the same: the trees it
    lists were not read. They are, unless the file cannot be parsed at all."""
    import subprocess
    import sys

    def init(target: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "intloom", "init", str(target), "--json"],
                              capture_output=True, text=True, timeout=60)

    outer = tmp_path / "outer"
    assert init(outer).returncode == 0
    with (outer / "intloom.toml").open("a") as config:
        config.write("prot = 8765\n")
    refused = init(outer / "workflows" / "new")
    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    error = json.loads(refused.stdout)["error"]
    assert error["code"] == "CLI_INIT_TARGET_INVALID", error
    assert f"inside the project {outer}, in the source tree {outer / 'workflows'}" in (
        error["message"]), error
    assert not (outer / "workflows" / "new").exists()
    assert init(outer / "tools").returncode == 0  # outside every tree: still fine


@pytest.mark.parametrize("damage", [b"workflows = [\n", b"workflows = [\"caf\xe9.py\"]\n"],
                         ids=["not-toml", "not-utf8"])
def test_init_inside_a_project_whose_config_cannot_be_parsed_writes_nothing(
        tmp_path: Path, damage: bytes) -> None:
    """With the intloom.toml of the project around it unparseable, init wrote the new
    project anywhere in it: which trees that project loads could not be read, and none was
    taken to be one, so the example could join a tree and hold its Runs as changed. Every
    command acting on that project refuses the file until it is fixed; init now too, naming
    it and its fault, and writes nothing. Once it parses, the same init works."""
    import subprocess
    import sys

    def init(target: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "intloom", "init", str(target), "--json"],
                              capture_output=True, text=True, timeout=60)

    outer = tmp_path / "outer"
    assert init(outer).returncode == 0
    config = outer / "intloom.toml"
    good = config.read_bytes()
    config.write_bytes(damage)
    before = snapshot_files(outer)
    refused = init(outer / "tools")
    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    error = json.loads(refused.stdout)["error"]
    assert error["code"] == "CLI_INIT_TARGET_INVALID", error
    assert error["message"].startswith(
        f"{outer / 'tools'} is inside the project {outer}, and its intloom.toml cannot be "
        f"read as a configuration: {config} "), error
    assert "nothing was written" in error["message"], error
    assert f"Fix that file first, or choose a directory outside {outer}." in (
        error["message"]), error
    assert not (outer / "tools").exists()
    assert snapshot_files(outer) == before  # the file at fault is kept as it is
    config.write_bytes(good)
    assert init(outer / "tools").returncode == 0


@pytest.mark.parametrize("config", [b"", b"workflows = []\n"], ids=["empty-file", "empty-list"])
def test_a_host_started_with_no_source_listed_says_so_and_how_to_add_one(
        project: Project, config: bytes) -> None:
    """An empty intloom.toml (`touch intloom.toml`, a save that lost its contents) started a
    host that said "Workflows 0 loaded" and no more, until a flow failed NOT_FOUND; doctor
    named it, start and status did not."""
    (project.root / "intloom.toml").write_bytes(config)
    said = ('No Workflow source was listed in intloom.toml when the host started, so no Run '
            'can be started: add one (e.g. workflows = ["workflows/example.py"]), then '
            "intloom stop and intloom start.")
    started = project.cli("start")
    assert started.code == 0, (started.stdout, started.stderr)
    assert said in started.stdout.splitlines(), started.stdout
    status = project.cli("status")
    assert said in status.stdout.splitlines(), status.stdout
    assert project.cli("stop", "--json").code == 0


def test_unknown_keys_in_bulk_or_deeply_nested_are_named_within_bounds(
        project: Project) -> None:
    """Naming every unknown key must not turn a config with hundreds of them into a
    message as long, nor a dotted key thousands of tables deep into a crash."""
    many = "".join(f"key{n:03} = 1\n" for n in range(300))
    (message,) = refusals(project, f'workflows = ["workflows/note.py"]\n{many}'.encode())
    assert "'key000', 'key001'" in message and "'key019' and 280 more." in message, message
    deep = "a." + ".".join(["b"] * 3000) + ".port = 1\n"
    (message,) = refusals(project, f'workflows = ["workflows/note.py"]\n{deep}'.encode())
    assert message.startswith(f"{project.root / 'intloom.toml'}: unknown key 'a' (a table "
                              "holding 'a.b.b."), message
    assert "....b.b." in message and ".b.port': intloom.toml takes its keys" in message
    assert len(message) < 600, len(message)
