"""The real ``intloom`` CLI as a subprocess: scaffolding, errors, streams, logs, and a Run's life.

Each test names the promise it checks. Hosts started here are reaped by the ``project``
fixture; a ``logs --follow`` process is killed in ``finally``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import (
    REPO,
    CliResult,
    Project,
    eventually,
    ok,
    snapshot_files,
    started_waiting,
)

pytestmark = pytest.mark.e2e

ANSI = re.compile(r"\x1b\[")


def run_cli(*args: str, cwd: Path, input: str | None = None, **env: str) -> CliResult:
    """The CLI with ``cwd`` as working directory and no --project (upward search applies)."""
    full_env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO), **env}
    proc = subprocess.run(
        [sys.executable, "-m", "intloom", *args],
        cwd=cwd, input=input, capture_output=True, text=True, timeout=30, env=full_env,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def only_json(result: CliResult) -> Any:
    """The single JSON document a --json invocation must print."""
    assert len(result.stdout.splitlines()) == 1, result.stdout
    return result.json


# ----- init ----------------------------------------------------------------------------------


def test_init_scaffolds_a_new_directory_that_a_host_can_load(tmp_path: Path) -> None:
    result = run_cli("init", "fresh", "--json", cwd=tmp_path)
    assert result.code == 0, result.stderr
    root = tmp_path / "fresh"
    assert only_json(result) == {"projectRoot": str(root), "status": "scaffolded"}
    assert "/.intloom/" in (root / ".gitignore").read_text().splitlines()
    assert 'workflows = ["workflows/example.py"]' in (root / "intloom.toml").read_text()
    example = REPO / "fixtures" / "projects" / "basic" / "workflows" / "example.py"
    assert (root / "workflows" / "example.py").read_bytes() == example.read_bytes()
    assert not (root / ".intloom").exists()  # init starts nothing


def test_init_text_names_the_next_two_commands(tmp_path: Path) -> None:
    result = run_cli("init", cwd=tmp_path)
    assert result.code == 0
    assert "intloom start" in result.stdout
    assert "intloom flow example --intent" in result.stdout
    assert "cd " not in result.stdout  # already there


@pytest.mark.parametrize("name", ["my prøject é", "it's $HOME", "two\nlines\tand\x1bESC"])
def test_init_prints_a_cd_that_pastes_into_a_shell(tmp_path: Path, name: str) -> None:
    result = run_cli("init", name, cwd=tmp_path)
    assert result.code == 0, result.stderr
    [cd] = [line.strip() for line in result.stdout.splitlines() if line.strip().startswith("cd ")]
    assert "\n" not in cd and "\x1b" not in cd  # one line, nothing a terminal would obey
    shell = subprocess.run(["bash", "-c", f"{cd} && pwd"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=30)
    assert shell.returncode == 0, (cd, shell.stderr)
    assert shell.stdout.rstrip("\n") == str(tmp_path / name), (cd, shell.stdout)


def test_init_refuses_a_non_empty_directory_and_touches_nothing(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    before = snapshot_files(tmp_path)
    result = run_cli("init", ".", "--json", cwd=tmp_path)
    assert result.code == 1
    assert only_json(result)["error"]["code"] == "CLI_INIT_TARGET_NOT_EMPTY"
    assert snapshot_files(tmp_path) == before


def test_init_with_project_from_inside_another_project_adds_no_where_line(
        tmp_path: Path) -> None:
    """``intloom --project NEW init`` run from inside another project: its Next: lines begin
    with ``cd NEW``, yet stderr added "The intloom commands above are for NEW; run from here
    they would act on the project at ..."; so did its refusal of two targets, which names no
    command to copy."""
    assert run_cli("init", "outer", "--json", cwd=tmp_path).code == 0
    inside = tmp_path / "outer" / "workflows"
    made = run_cli("--project", str(tmp_path / "new"), "init", cwd=inside)
    assert made.code == 0, made
    assert f"cd {tmp_path / 'new'}" in made.stdout, made.stdout
    assert "commands above" not in made.stderr, made.stderr
    refused = run_cli("--project", str(tmp_path / "outer"), "init", "other", cwd=tmp_path)
    assert refused.code == 2, refused
    assert "got two targets" in refused.stderr, refused.stderr
    assert "commands above" not in refused.stderr, refused.stderr


def test_init_of_a_name_too_long_says_to_choose_a_shorter_one(tmp_path: Path) -> None:
    """A name past the file system's limit (ENAMETOOLONG) was told to "check the directory's
    permissions and free space"; the parents init made for it are removed."""
    before = snapshot_files(tmp_path)
    result = run_cli("init", f"made/{'x' * 300}", "--json", cwd=tmp_path)
    assert result.code == 1, result
    error = only_json(result)["error"]
    assert error["code"] == "CLI_INIT_FAILED", error
    assert "(File name too long)" in error["message"], error
    assert "Choose a shorter path" in error["message"], error
    assert error["message"].endswith(", then run intloom init again."), error
    assert "permissions" not in error["message"], error
    assert snapshot_files(tmp_path) == before


def test_init_refuses_a_directory_inside_a_projects_private_state(tmp_path: Path) -> None:
    """``intloom init`` inside another project's .intloom/ was accepted; its files were then
    "unexpected" to that project's verify, and doctor said nothing of them."""
    assert run_cli("init", "outer", "--json", cwd=tmp_path).code == 0
    state = tmp_path / "outer" / ".intloom"
    (state / "runtime").mkdir(parents=True)
    before = snapshot_files(tmp_path)
    for cwd, target in ((state, "x"), (state, "runtime/y"), (tmp_path, "outer/.intloom")):
        result = run_cli("init", target, "--json", cwd=cwd)
        assert result.code == 1, (target, result)
        error = only_json(result)["error"]
        assert error["code"] == "CLI_INIT_TARGET_INVALID", error
        assert (f"is inside {state}, the private host state of the project "
                f"{tmp_path / 'outer'}") in error["message"], error
        assert snapshot_files(tmp_path) == before


def test_init_refuses_a_link_that_leads_to_itself_naming_it(tmp_path: Path) -> None:
    """A link to itself (ELOOP) failed CLI_INTERNAL_ERROR, exit 70."""
    (tmp_path / "loop").symlink_to("loop")
    before = snapshot_files(tmp_path)
    for target in ("loop", "loop/sub"):
        result = run_cli("init", target, "--json", cwd=tmp_path)
        assert result.code == 1, result
        error = only_json(result)["error"]
        assert error["code"] == "CLI_INIT_TARGET_INVALID", error
        assert "cannot be examined (Too many levels of symbolic links)" in error["message"]
        assert snapshot_files(tmp_path) == before


def test_init_refuses_a_link_that_leads_nowhere_naming_it(tmp_path: Path) -> None:
    """A link to a missing path was refused CLI_INIT_TARGET_NOT_EMPTY: "appeared while
    intloom init was writing", which nothing did: it is the link, named, and where it leads."""
    (tmp_path / "gone").symlink_to("nowhere")
    before = snapshot_files(tmp_path)
    for target in ("gone", "gone/sub"):
        result = run_cli("init", target, "--json", cwd=tmp_path)
        assert result.code == 1, result
        error = only_json(result)["error"]
        assert error["code"] == "CLI_INIT_TARGET_INVALID", error
        assert (f"{tmp_path / 'gone'} is a link to nowhere, which does not exist; nothing was "
                "written") in error["message"], error
        assert "appeared" not in error["message"], error
        assert snapshot_files(tmp_path) == before
    assert not (tmp_path / "nowhere").exists()


def test_init_refuses_a_chain_of_links_that_leads_nowhere_naming_the_missing_end(
        tmp_path: Path) -> None:
    """A link to a link that leads nowhere was named "a link to <the second link>, which
    does not exist", where that link exists: the missing path at the chain's end is named."""
    (tmp_path / "gone").symlink_to("nowhere")
    (tmp_path / "chain").symlink_to("gone")
    before = snapshot_files(tmp_path)
    result = run_cli("init", "chain", "--json", cwd=tmp_path)
    assert result.code == 1, result
    error = only_json(result)["error"]
    assert error["code"] == "CLI_INIT_TARGET_INVALID", error
    assert (f"{tmp_path / 'chain'} is a link to gone, which leads to "
            f"{os.path.realpath(tmp_path / 'nowhere')}, which does not exist") in error["message"]
    assert snapshot_files(tmp_path) == before


def test_init_refuses_a_non_empty_directory_naming_what_it_holds(tmp_path: Path) -> None:
    for name in ("a", "b", "c", "d", "e"):
        (tmp_path / name).write_text(name)
    result = run_cli("init", ".", cwd=tmp_path)
    assert result.code == 1
    assert f"{tmp_path} already contains a, b, c and 2 more. intloom init" in result.stderr


@pytest.mark.parametrize("args", [
    ["flow", "example", "--intent", "a", "--intent-file", "x", "--json"],
    ["init", "one", "--project", "two", "--json"],
])
def test_options_that_contradict_each_other_are_a_usage_error(
    tmp_path: Path, args: list[str]
) -> None:
    result = run_cli(*args, cwd=tmp_path)
    assert result.code == 2, result.stdout  # as for any command line that cannot be parsed
    assert only_json(result)["error"]["code"] == "INVALID_REQUEST"
    assert list(tmp_path.iterdir()) == []  # nothing created


def test_init_refuses_a_file(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    result = run_cli("init", "a-file", cwd=tmp_path)
    assert result.code == 1 and result.stdout == ""
    assert result.stderr.startswith("Failure · CLI_INIT_TARGET_INVALID: ")
    assert (tmp_path / "a-file").read_text() == "x"


# ----- errors and streams --------------------------------------------------------------------


@pytest.mark.parametrize("command", [["runs"], ["status"], ["logs"], ["inspect", "RUN-x"]])
def test_outside_a_project_nothing_is_created(tmp_path: Path, command: list[str]) -> None:
    result = run_cli(*command, "--json", cwd=tmp_path)
    assert result.code == 1
    error = only_json(result)["error"]
    assert error == {"code": "CLI_PROJECT_INVALID", "message": error["message"],
                     "retryable": False}
    assert str(tmp_path) in error["message"] and "intloom init" in error["message"]
    assert list(tmp_path.iterdir()) == []
    assert result.stderr == ""


@pytest.mark.parametrize("given", ["the config file", "a missing directory",
                                   "a directory inside the project", "a FIFO", "a device"])
def test_a_project_option_that_is_no_directory_says_what_it_is(
    project: Project, tmp_path: Path, given: str,
) -> None:
    """--project intloom.toml (the file, as other tools take their config) said
    ".../intloom.toml has no intloom.toml", and a mistyped directory "has no intloom.toml":
    the fact is what the path is, and the fix names the directory to pass. A directory
    inside a project said only "has no intloom.toml. Pass the project's root ... or run
    intloom init there", which would make a second project inside the first."""
    path = {"the config file": project.root / "intloom.toml",
            "a missing directory": tmp_path / "no-such-dir",
            "a directory inside the project": project.root / "workflows",
            "a FIFO": tmp_path / "fifo", "a device": Path("/dev/null")}[given]
    if given == "a FIFO":
        os.mkfifo(path)
    result = run_cli("--project", str(path), "status", "--json", cwd=tmp_path)
    assert result.code == 1, result.stdout
    error = only_json(result)["error"]
    assert error["code"] == "CLI_PROJECT_INVALID", error
    if given == "the config file":
        assert error["message"] == (
            f"{path} is a file, not a directory: --project takes the project's root, the "
            f"directory that holds intloom.toml (here {project.root}).")
    elif given in ("a FIFO", "a device"):
        # Said to have "no intloom.toml" (before 2026-12-04), as a directory would be.
        kind = "a FIFO (named pipe)" if given == "a FIFO" else "a device"
        assert error["message"] == (
            f"{path} is {kind}, not a directory: --project takes the project's root, the "
            "directory that holds intloom.toml.")
    elif given == "a missing directory":
        assert error["message"] == (
            f"{path} does not exist. Pass the project's root to --project, or run intloom "
            "init there.")
    else:
        assert error["message"] == (
            f"{path} has no intloom.toml: it is inside the project {project.root}. Pass "
            f"--project {project.root} (the directory that holds intloom.toml).")
    assert not (tmp_path / "no-such-dir").exists()


def test_a_project_option_the_os_cannot_examine_is_named_not_an_internal_error(
    tmp_path: Path,
) -> None:
    """--project with a name over 255 bytes (ENAMETOOLONG: a pasted string) failed
    CLI_INTERNAL_ERROR, exit 70: pathlib answers False for a missing path, not for this."""
    path = tmp_path / ("x" * 300)
    result = run_cli("--project", str(path), "status", "--json", cwd=tmp_path)
    assert result.code == 1, result.stdout
    assert only_json(result)["error"] == {
        "code": "CLI_PROJECT_INVALID", "retryable": False,
        "message": f"{path} cannot be examined (File name too long). Pass the project's "
                   "root to --project."}


def test_a_project_option_that_is_a_symlink_loop_is_named_not_an_internal_error(
    tmp_path: Path,
) -> None:
    """--project naming a symbolic link that points to itself (ELOOP) failed
    CLI_INTERNAL_ERROR, exit 70: resolving it raised RuntimeError "Symlink loop"."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    result = run_cli("--project", str(loop), "status", "--json", cwd=tmp_path)
    assert result.code == 1, result.stdout
    error = only_json(result)["error"]
    assert error["code"] == "CLI_PROJECT_INVALID", error
    assert error["message"].startswith(f"{loop} cannot be examined ("), error
    assert error["message"].endswith("Pass the project's root to --project."), error


def test_a_working_directory_removed_since_is_named_not_an_internal_error(
    tmp_path: Path,
) -> None:
    """intloom status without --project, run from a directory removed since (a shell left
    in a deleted build directory), failed CLI_INTERNAL_ERROR, exit 70: Path.cwd() raised."""
    gone = tmp_path / "gone"
    gone.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "intloom", "status", "--json"],
        cwd=gone, capture_output=True, text=True, timeout=30,
        env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)},
        preexec_fn=lambda: os.rmdir(gone),  # in the child, once it is in that directory
    )
    result = CliResult(proc.returncode, proc.stdout, proc.stderr)
    assert result.code == 1, result.stdout
    error = only_json(result)["error"]
    assert error["code"] == "CLI_PROJECT_INVALID", error
    assert error["message"].startswith("The working directory cannot be examined ("), error
    assert "pass the project's root to --project" in error["message"], error


def test_init_of_a_directory_from_a_working_directory_removed_since_reports_it(
    tmp_path: Path,
) -> None:
    """intloom init DIR run from a directory removed since wrote the project, then failed
    CLI_INTERNAL_ERROR, exit 70, asking for the working directory to word its advice; with
    no DIR it failed the same way before writing anything."""
    gone = tmp_path / "gone"
    target = tmp_path / "made"

    def init(*args: str) -> CliResult:
        gone.mkdir()
        proc = subprocess.run(
            [sys.executable, "-m", "intloom", "init", *args],
            cwd=gone, capture_output=True, text=True, timeout=30,
            env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)},
            preexec_fn=lambda: os.rmdir(gone),  # in the child, once it is in that directory
        )
        return CliResult(proc.returncode, proc.stdout, proc.stderr)

    made = init(str(target))
    assert made.code == 0, (made.stdout, made.stderr)
    assert f"Scaffolded an intloom project in {target}" in made.stdout, made.stdout
    assert f"  cd {target}" in made.stdout, made.stdout
    assert (target / "intloom.toml").is_file()
    nowhere = init("--json")
    assert nowhere.code == 1, nowhere.stdout
    assert only_json(nowhere)["error"]["code"] == "CLI_PROJECT_INVALID", nowhere.stdout


def test_json_error_shape_and_usage_errors(project: Project) -> None:
    offline = project.cli("runs", "--json")
    assert offline.code == 1 and offline.stderr == ""
    assert set(only_json(offline)["error"]) == {"code", "message", "retryable"}
    assert only_json(offline)["error"]["code"] == "CLI_SERVICE_OFFLINE"
    usage = project.cli("flow", "--json")
    assert usage.code == 2
    assert only_json(usage)["error"]["code"] == "INVALID_REQUEST"
    assert "Traceback" not in usage.stderr + offline.stderr
    assert not project.state.exists()  # a failed query creates no host state


def test_piped_and_no_color_output_has_no_escapes(project: Project) -> None:
    for args in (["--help"], ["runs", "--help"], ["status"], ["runs"], ["doctor"],
                 ["flow", "example", "--intent", "x"], ["flow"]):
        result = project.cli(*args, env={"TERM": "xterm-256color", "FORCE_COLOR": ""})
        assert not ANSI.search(result.stdout + result.stderr), args
    plain = project.cli("status")
    assert plain.code == 0 and plain.stdout.startswith("The service is offline.")


def test_intent_file_errors_name_the_file_as_given(project: Project) -> None:
    large, blank = project.root / "big notes.txt", project.root / "empty.txt"
    large.write_bytes(b"x" * (2 << 20))
    blank.write_bytes(b"\n  \n")
    big = project.cli("flow", "example", "--intent-file", str(large))
    assert big.code == 1, big.stderr
    assert big.stderr.startswith(f"Failure \u00b7 CLI_INTENT_FILE_INVALID: The intent file {large} "
                                 "is larger than the 1,048,576-byte limit"), big.stderr
    piped = project.cli("flow", "example", "--intent-file", "-", input="x" * (2 << 20))
    assert "The intent read from stdin (-) is larger than" in piped.stderr, piped.stderr
    # answer takes no path: the fix names where a path goes (a text the Step reads).
    answer = project.cli("answer", "RUN-1", "ASK-1", "-", input="x" * (2 << 20))
    assert answer.code == 1 and "larger than the 1,048,576-byte limit" in answer.stderr
    assert answer.stderr.rstrip().endswith(
        "Put large text in a file the Step can read, and give its path as the answer's text "
        "(a question's answer, or a confirmation's feedback)."), answer.stderr
    empty = project.cli("flow", "example", "--intent-file", str(blank))
    assert empty.code == 1, empty.stderr
    # The fact is about the file: "The intent is blank" sent people looking at --intent.
    assert empty.stderr.startswith(f"Failure \u00b7 INVALID_REQUEST: The intent file {blank} "
                                   "is empty or blank"), empty.stderr
    assert not project.state.exists()


def test_an_intent_file_at_the_limit_with_its_newline_creates_the_run(project: Project) -> None:
    """A trailing newline is not part of the intent (docs/cli.md), so it does not count
    against the 1 MiB limit: a file holding an intent of exactly the limit and the line
    break an editor ends it with was refused as "larger than the limit", though the host
    takes that intent."""
    ok(project.cli("start", "--json"))
    at_limit = project.root / "at limit.txt"
    at_limit.write_bytes(b"x" * (1 << 20) + b"\r\n")
    run = ok(project.cli("flow", "example", "--intent-file", str(at_limit), "--detach",
                         "--json"))["run"]
    header = ok(project.cli("inspect", run["runId"], "--json"))["records"][0]["record"]
    assert header["intent"] == "x" * (1 << 20)
    piped = project.cli("flow", "example", "--intent-file", "-", "--detach", "--json",
                        input="x" * (1 << 20) + "\n")
    assert piped.code == 0, piped.stdout
    # One byte more than the limit is still refused, newline or not, before anything is sent.
    over = project.root / "over.txt"
    over.write_bytes(b"x" * ((1 << 20) + 1) + b"\n")
    refused = project.cli("flow", "example", "--intent-file", str(over), "--json")
    assert refused.json["error"]["code"] == "CLI_INTENT_FILE_INVALID", refused.stdout
    assert len(ok(project.cli("runs", "--json"))["runs"]) == 2
    ok(project.cli("stop", "--json"))


@pytest.mark.parametrize(("args", "code", "what"), [
    (["flow", "example", "--intent-file", "-"], "CLI_INTENT_FILE_INVALID", "The intent"),
    (["answer", "RUN-x", "ASK-y", "-"], "INVALID_REQUEST", "The answer"),
])
def test_reading_a_closed_stdin_is_named_not_an_internal_error(
    project: Project, args: list[str], code: str, what: str
) -> None:
    # A script or service manager may start the CLI with no descriptor 0 at all (``<&-``).
    proc = subprocess.run(
        [sys.executable, "-m", "intloom", "--project", str(project.root), *args],
        capture_output=True, text=True, timeout=60, preexec_fn=lambda: os.close(0),
        env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith(f"Failure \u00b7 {code}: {what} "), proc.stderr
    assert "stdin is closed" in proc.stderr and "Traceback" not in proc.stderr
    assert not project.state.exists()  # refused before anything was sent


def test_a_stdout_that_cannot_encode_the_text_gets_it_escaped_and_json_as_utf8(
    tmp_path: Path,
) -> None:
    # A terminal in a non-UTF-8 locale (latin-1, ASCII): the project path, an intent or the
    # "·" separator cannot be encoded there, which must not become an internal error.
    root = tmp_path / "projét"
    shutil.copytree(REPO / "fixtures" / "projects" / "basic", root)
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO), "PYTHONIOENCODING": "ascii"}

    def cli(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([sys.executable, "-m", "intloom", "--project", str(root), *args],
                              capture_output=True, timeout=60, env=env)

    text = cli("status")
    assert text.returncode == 0, (text.stdout, text.stderr)
    assert text.stdout.decode("ascii").startswith("The service is offline."), text.stdout
    for args in (["doctor"], ["logs"]):  # the path and the separators in their text
        done = cli(*args)
        assert b"CLI_INTERNAL_ERROR" not in done.stdout + done.stderr, (args, done.stderr)
    doc = cli("status", "--json")
    assert doc.returncode == 0, (doc.stdout, doc.stderr)
    assert json.loads(doc.stdout.decode("utf-8"))["projectRoot"] == str(root)  # JSON is UTF-8
    refused = cli("flow", "example", "--intent", "x")
    assert refused.returncode == 1 and b"CLI_SERVICE_OFFLINE" in refused.stderr, refused.stderr
    assert not (root / ".intloom").exists()


def test_a_c_locale_stdout_gets_the_text_escaped_and_a_non_utf8_path_its_json(
    project: Project, tmp_path: Path,
) -> None:
    # LC_ALL=C without UTF-8 mode or locale coercion: stdout is ASCII with surrogateescape
    # (not "strict"), and the escaping was left off: status of a running host exited 70 on
    # its "·". And a path that is not UTF-8 (a surrogate in Python) in a --json document
    # was an uncaught UnicodeEncodeError: JSON escapes it.
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO), "LC_ALL": "C",
           "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    env.pop("PYTHONIOENCODING", None)
    ok(project.cli("start", "--json"))
    text = subprocess.run(
        [sys.executable, "-m", "intloom", "--project", str(project.root), "status"],
        capture_output=True, timeout=60, env=env)
    assert text.returncode == 0, (text.stdout, text.stderr)
    assert b"\\xb7" in text.stdout, text.stdout  # the "·", escaped
    ok(project.cli("stop", "--json"))

    bad = tmp_path / os.fsdecode(b"bad\xff")
    bad.mkdir()
    for locale in (env, {**env, "LC_ALL": "C.UTF-8"}):
        doc = subprocess.run([sys.executable, "-m", "intloom", "status", "--json"], cwd=bad,
                             capture_output=True, timeout=60, env=locale)
        assert doc.returncode == 1, (doc.stdout, doc.stderr)
        assert b"Traceback" not in doc.stderr, doc.stderr
        error = json.loads(doc.stdout.decode("utf-8"))["error"]
        assert error["code"] == "CLI_PROJECT_INVALID", error
        assert str(bad) in error["message"], error  # the byte, as Python reads the path


@pytest.mark.parametrize("args", [["--help"], ["runs", "--help"], ["attach", "-h"]])
def test_piped_help_is_plain_text_even_without_no_color(tmp_path: Path, args: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    result = subprocess.run([sys.executable, "-m", "intloom", *args], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage: intloom"), result.stdout
    assert "\u256d" not in result.stdout and "\u2502" not in result.stdout  # no Rich panels
    assert not [line for line in result.stdout.splitlines() if line != line.rstrip()]


# ----- logs (offline: synthetic host logs) ---------------------------------------------------


def _write_log(logs: Path, name: str, *records: dict[str, Any], newline: bool = True) -> Path:
    logs.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = logs / name
    text = "\n".join(json.dumps(r) for r in records) + ("\n" if newline else "")
    with open(path, "a") as fh:
        fh.write(text)
    os.chmod(path, 0o600)
    return path


def test_logs_render_filter_and_stream_raw_json(project: Project) -> None:
    logs = project.state / "logs"
    project.state.mkdir(mode=0o700)
    _write_log(logs, "LOG-20260101T000000000Z.jsonl",
               {"time": "T0", "level": "info", "event": "old_host"})
    _write_log(logs, "LOG-20260102T000000000Z.jsonl",
               {"time": "T1", "level": "info", "event": "log_opened", "pid": 1},
               {"time": "T2", "level": "warning", "event": "run_x", "runId": "RUN-a"},
               {"time": "T3", "level": "info", "event": "run_y", "runId": "RUN-b"})
    text = project.cli("logs")
    assert text.code == 0
    assert text.stdout.splitlines() == [
        "T1 info    log_opened pid=1", "T2 warning run_x runId=RUN-a",
        "T3 info    run_y runId=RUN-b",
    ]
    assert project.cli("logs", "--all").stdout.splitlines()[0] == "T0 info    old_host"
    raw = project.cli("logs", "RUN-a", "--json")
    assert [json.loads(line)["event"] for line in raw.stdout.splitlines()] == ["run_x"]


def test_logs_tail_prints_only_the_last_records_it_would_print(project: Project) -> None:
    """``--tail N``: the last N of the records ``logs`` would print, of the newest log, of
    every log with ``--all``, of one Run's records with RUN. An unreadable line among them
    keeps its own file and offset, though it is printed after the lines read past it."""
    logs = project.state / "logs"
    project.state.mkdir(mode=0o700)
    _write_log(logs, "LOG-20260101T000000000Z.jsonl",
               {"time": "T0", "level": "info", "event": "old_host", "runId": "RUN-a"})
    newest = _write_log(logs, "LOG-20260102T000000000Z.jsonl",
                        {"time": "T1", "level": "info", "event": "log_opened", "pid": 1})
    torn_at = newest.stat().st_size
    with open(newest, "a") as fh:
        fh.write('{"time": "T2", "torn\n')
    _write_log(logs, newest.name,
               {"time": "T3", "level": "warning", "event": "run_x", "runId": "RUN-a"},
               {"time": "T4", "level": "info", "event": "run_y", "runId": "RUN-b"})
    assert project.cli("logs", "--tail", "2").stdout.splitlines() == [
        "T3 warning run_x runId=RUN-a", "T4 info    run_y runId=RUN-b"]
    every = project.cli("logs", "--all", "-n", "5", "--json")
    assert every.code == 0, every.stderr
    records = [json.loads(line) for line in every.stdout.splitlines()]
    assert [r["event"] for r in records] == [
        "old_host", "log_opened", "unreadable_line", "run_x", "run_y"], records
    assert (records[2]["file"], records[2]["offset"]) == (
        f".intloom/logs/{newest.name}", torn_at), records[2]
    assert [r["event"] for r in records][-3:] == [
        json.loads(line)["event"]
        for line in project.cli("logs", "--tail", "3", "--json").stdout.splitlines()]
    only = project.cli("logs", "RUN-a", "--all", "--tail", "1", "--json")
    assert [json.loads(line)["event"] for line in only.stdout.splitlines()] == ["run_x"]
    nothing = project.cli("logs", "--tail", "0")
    assert (nothing.code, nothing.stdout, nothing.stderr) == (0, "", "")
    refused = project.cli("logs", "--tail", "-1")
    assert refused.code == 2 and "-1" in refused.stderr, refused.stderr
    # Past what a deque can hold: a usage error too, not CLI_INTERNAL_ERROR (exit 70).
    huge = project.cli("logs", "--tail", str(2**63))
    assert huge.code == 2 and "INVALID_REQUEST" in huge.stderr, huge.stderr


def test_logs_report_a_fifo_or_a_link_among_the_logs_and_leave_them_untouched(
    project: Project,
) -> None:
    """A FIFO or a symbolic link named like a host log was skipped without a word: a reader
    saw an older host's log as the newest. Each is named, with what it is, on stderr (a
    record in the --json stream); neither is opened (a FIFO would hang the command), and
    both stay as they were."""
    logs = project.state / "logs"
    project.state.mkdir(mode=0o700)
    _write_log(logs, "LOG-20260101T000000000Z.jsonl",
               {"time": "T1", "level": "info", "event": "log_opened", "runId": "RUN-a"})
    fifo, link = logs / "LOG-20260103T000000000Z.jsonl", logs / "LOG-20260102T000000000Z.jsonl"
    os.mkfifo(fifo, 0o600)
    link.symlink_to(logs / "LOG-20260101T000000000Z.jsonl")
    said = {
        fifo: "it is a FIFO (named pipe), not a regular file",
        link: "it is a symbolic link, not a regular file",
    }
    for args in (["logs"], ["logs", "--all"], ["logs", "RUN-a"]):
        text = project.cli(*args, timeout=20)
        assert text.code == 0, (args, text.stderr)
        assert text.stdout == "T1 info    log_opened runId=RUN-a\n", (args, text.stdout)
        for path, fact in said.items():
            notice = (f"Skipped .intloom/logs/{path.name}: {fact}; intloom logs reads only "
                      "regular files and left it untouched.")
            assert notice in text.stderr, (args, text.stderr)
    stream = project.cli("logs", "--json", timeout=20)
    assert stream.code == 0 and stream.stderr == "", stream.stderr
    records = [json.loads(line) for line in stream.stdout.splitlines()]
    skipped = {r["file"]: r for r in records if r["event"] == "skipped_file"}
    assert sorted(skipped) == [f".intloom/logs/{link.name}", f".intloom/logs/{fifo.name}"]
    assert skipped[f".intloom/logs/{fifo.name}"] == {
        "time": None, "level": "warning", "event": "skipped_file",
        "file": f".intloom/logs/{fifo.name}", "fact": said[fifo]}
    assert [r["event"] for r in records if r["event"] != "skipped_file"] == ["log_opened"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert os.readlink(link) == str(logs / "LOG-20260101T000000000Z.jsonl")


class _Lines:
    """Lines of a child's stdout, each awaited with a deadline (never a blind wait)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self._fd = proc.stdout.fileno()
        self._buffer = b""

    def next(self, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no line within {timeout}s (got {self._buffer!r})"
            ready, _, _ = select.select([self._fd], [], [], remaining)
            if ready:
                chunk = os.read(self._fd, 4096)
                assert chunk, f"stdout closed (got {self._buffer!r})"
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()


@contextlib.contextmanager
def _following(project: Project, *more: str) -> Iterator[subprocess.Popen[bytes]]:
    """``intloom logs --follow [MORE]`` on ``project``, killed and reaped if still running."""
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)}
    with subprocess.Popen(
        [sys.executable, "-m", "intloom", "--project", str(project.root), "logs", "--follow",
         *more],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    ) as proc:
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


def _ends_as_removed(proc: subprocess.Popen[bytes], root: Path) -> None:
    """``root`` is removed: the follow ends CLI_PROJECT_INVALID, naming it."""
    shutil.rmtree(root)
    assert proc.wait(timeout=20) == 1
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    assert err.startswith("Failure \u00b7 CLI_PROJECT_INVALID: "), err
    assert str(root) in err and "removed" in err, err


def test_logs_follow_survives_a_new_host_log_and_stops_on_sigterm(project: Project) -> None:
    logs = project.state / "logs"
    project.state.mkdir(mode=0o700)
    _write_log(logs, "LOG-20260101T000000000Z.jsonl", {"time": "T1", "event": "first"})
    with _following(project) as proc:
        lines = _Lines(proc)
        assert "first" in lines.next()
        _write_log(logs, "LOG-20260101T000000000Z.jsonl", {"time": "T2", "event": "appended"})
        assert "appended" in lines.next()
        # A restarted host writes a new file; following moves on to it.
        _write_log(logs, "LOG-20260102T000000000Z.jsonl", {"time": "T3", "event": "new_host"})
        assert "new_host" in lines.next()
        # A host started after the clock was moved back names its file earlier: it is
        # still new, and followed.
        _write_log(logs, "LOG-20250101T000000000Z.jsonl", {"time": "T4", "event": "back"})
        assert "back" in lines.next()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0


def test_logs_follow_with_tail_starts_from_the_last_records_then_prints_every_new_one(
    project: Project,
) -> None:
    logs = project.state / "logs"
    project.state.mkdir(mode=0o700)
    _write_log(logs, "LOG-20260101T000000000Z.jsonl",
               *({"time": f"T{i}", "event": f"old_{i}"} for i in range(5)))
    with _following(project, "--tail", "2") as proc:
        lines = _Lines(proc)
        assert "old_3" in lines.next() and "old_4" in lines.next()
        _write_log(logs, "LOG-20260101T000000000Z.jsonl", {"time": "T5", "event": "new_5"},
                   {"time": "T6", "event": "new_6"})
        assert "new_5" in lines.next() and "new_6" in lines.next()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0


def test_logs_follow_of_a_project_removed_under_it_ends_with_a_known_error(
    project: Project,
) -> None:
    project.state.mkdir(mode=0o700)
    _write_log(project.state / "logs", "LOG-20260101T000000000Z.jsonl",
               {"time": "T1", "event": "first"})
    with _following(project) as proc:
        assert "first" in _Lines(proc).next()
        _ends_as_removed(proc, project.root)


def _watches(pid: int, directory: Path) -> bool:
    """Whether process ``pid`` holds an inotify watch on ``directory`` (Linux: each watch
    is a line of the inotify descriptor's fdinfo, naming the watched inode in hex)."""
    inode = f"ino:{os.stat(directory).st_ino:x} "
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:inotify":
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                if any(inode in line for line in info):
                    return True
        except OSError:  # the descriptor closed meanwhile
            continue
    return False


def test_logs_follow_watching_the_project_itself_ends_once_it_is_removed(
    project: Project,
) -> None:
    """With no .intloom/ yet, logs --follow watches the project directory itself. Removed
    under it, the watch went on, on a directory gone, and logs never ended (it only
    re-chose what to watch when .intloom/ or logs/ came or went)."""
    assert not project.state.exists()
    with _following(project) as proc:
        eventually(lambda: _watches(proc.pid, project.root), timeout=20,
                   what="logs --follow to watch the project directory")
        _ends_as_removed(proc, project.root)


# ----- a Run's life against a real host ------------------------------------------------------


def _run_of(result: CliResult) -> dict[str, Any]:
    assert result.code in (0, 1), result.stderr
    run: dict[str, Any] = only_json(result)["run"]
    return run


def test_run_lifecycle_through_the_cli(project: Project) -> None:
    started = project.cli("start", "--json")
    assert started.code == 0, started.stderr
    service = only_json(started)["service"]
    assert only_json(started)["reused"] is False
    assert {"projectRoot", "pid", "instanceId", "port", "startedAt"} <= set(service)
    again = project.cli("start", "--json")
    assert only_json(again)["reused"] is True
    assert only_json(again)["service"]["instanceId"] == service["instanceId"]

    assert only_json(project.cli("flows", "--json"))["workflows"][0]["name"] == "example"

    run = _run_of(project.cli("flow", "example", "--intent", "release notes", "--json"))
    assert run["status"] == "waiting"
    first_action = run["pendingAction"]["id"]
    run_id = run["runId"]
    listed = only_json(project.cli("runs", "--json"))["runs"]
    assert [r["runId"] for r in listed] == [run_id]
    assert "waiting" in project.cli("runs").stdout

    declined = _run_of(project.cli(
        "answer", run_id, first_action, '{"isConfirmed": false, "feedback": "shorter"}', "--json"
    ))
    assert declined["status"] == "waiting"
    assert declined["pendingAction"]["id"] != first_action

    stale = project.cli("answer", run_id, first_action, '{"isConfirmed": true}', "--json")
    assert stale.code == 1
    assert only_json(stale)["error"]["code"] == "CONFLICT"

    done = _run_of(project.cli(
        "answer", run_id, declined["pendingAction"]["id"], "-", "--json",
        input='{"isConfirmed": true}',
    ))
    assert done["status"] == "completed"

    attached = project.cli("attach", run_id)
    assert attached.code == 0, attached.stderr
    assert "Completed · example" in attached.stdout
    assert "waiting" in attached.stdout  # the history came first

    second = _run_of(project.cli("flow", "example", "--intent", "to cancel", "--json"))
    first_cancel = project.cli("cancel", second["runId"], "--json")
    second_cancel = project.cli("cancel", second["runId"], "--json")
    assert first_cancel.code == second_cancel.code == 0
    assert first_cancel.stdout == second_cancel.stdout
    assert _run_of(first_cancel)["lastError"]["code"] == "RUN_STOPPED"
    stopped = project.cli("attach", second["runId"], "--json")
    assert stopped.code == 1
    assert _run_of(stopped)["status"] == "failed"
    ended = project.cli("cancel", run_id)
    assert ended.code == 0 and ended.stdout.startswith("The Run has ended; no stop is needed.")

    missing = project.cli("attach", "RUN-missing", "--json")
    assert missing.code == 1 and only_json(missing)["error"]["code"] == "NOT_FOUND"

    inspected = project.cli("inspect", run_id, "--json")
    assert inspected.code == 0, inspected.stdout + inspected.stderr
    phases = [r.get("phase") for r in only_json(inspected)["records"]]
    assert phases[0] == "header" and phases[-1] == "terminal"
    assert "effect_started" in phases and "waiting" in phases
    assert only_json(inspected)["run"]["status"] == "completed"

    assert "log_opened" in project.cli("logs").stdout

    stop = project.cli("stop", "--json")
    assert only_json(stop) == {"projectRoot": str(project.root), "stopped": True, "cut": [],
                               "cutCount": 0, "lost": [], "lostCount": 0, "suspended": 0,
                               "others": 0, "changedSinceLoad": [], "served": True}
    assert project.cli("stop").stdout.startswith("The service is not running; no stop is needed.")
    # inspect works offline
    assert project.cli("inspect", run_id).code == 0


def test_an_answer_that_lost_a_race_to_cancel_or_another_answer_says_what_won(
    project: Project,
) -> None:
    run_id, action = started_waiting(project)
    ok(project.cli("cancel", run_id, "--json"))
    late = project.cli("answer", run_id, action, '{"isConfirmed": true}')
    assert late.code == 1, late.stdout
    # "it is failed with no question or confirmation pending" did not say it was cancelled.
    assert "CONFLICT" in late.stderr and "was stopped (RUN_STOPPED" in late.stderr, late.stderr
    assert "nothing was recorded" in late.stderr, late.stderr
    done = ok(project.cli("flow", "example", "--intent", "again", "--json"))["run"]
    answer = ["answer", done["runId"], done["pendingAction"]["id"], '{"isConfirmed": true}']
    assert ok(project.cli(*answer, "--json"))["run"]["status"] == "completed"
    again = project.cli(*answer)
    assert again.code == 1 and "has completed" in again.stderr, again.stderr


def test_crash_diagnose_recover_and_restore_through_the_cli(project: Project) -> None:
    assert project.cli("start").code == 0
    run = _run_of(project.cli("flow", "example", "--intent", "survive", "--json"))
    project.kill_host()

    status = project.cli("status", "--json")
    assert status.code == 0
    assert only_json(status)["status"] == "recovery_required"
    doctor = project.cli("doctor", "--json")
    assert doctor.code == 3  # attention: stale resources
    assert only_json(doctor)["health"] == "attention"
    busy = project.cli("start", "--json")
    assert busy.code == 1 and only_json(busy)["error"]["code"] == "CLI_SERVICE_BUSY"

    plan = project.cli("recover", "--dry-run", "--json")
    assert only_json(plan)["recovered"] is False and only_json(plan)["paths"]
    assert only_json(project.cli("recover", "--json"))["recovered"] is True

    restarted = project.cli("start")
    assert restarted.code == 0
    assert "Restore  resumed 0 · waiting 1" in restarted.stdout
    restored = eventually(
        lambda: only_json(project.cli("runs", "--json"))["runs"], timeout=10, what="runs"
    )
    assert restored[0]["runId"] == run["runId"]
    assert restored[0]["pendingAction"]["id"] == run["pendingAction"]["id"]


def test_status_and_runs_text_on_a_live_host(project: Project) -> None:
    assert project.cli("start").code == 0
    status = project.cli("status")
    assert status.stdout.startswith(f"Service running · {project.root}")
    assert project.cli("runs").stdout == "The current service has no Runs.\n"
    assert only_json(project.cli("runs", "--json")) == {"runs": []}
    assert project.cli("runs", "--flow", "example").stdout == (
        "The current service has no Runs of Workflow 'example'.\n")
    unknown = project.cli("runs", "--flow", "nosuch", "--json")
    assert unknown.code == 1 and only_json(unknown)["error"]["code"] == "NOT_FOUND"


def test_piped_tables_are_not_padded(project: Project) -> None:
    """Piped text is as wide as what it says: no trailing spaces, and one long cell (a
    broken Workflow's problem) does not pad the other rows out to its width."""
    (project.root / "workflows" / "broken.py").write_text("import no_such_module_here\n")
    (project.root / "intloom.toml").write_text(
        'workflows = ["workflows/example.py", "workflows/broken.py"]\n')
    assert project.cli("start").code == 0
    assert project.cli("flow", "example", "--intent", "x").code == 0
    for args in (["flows"], ["runs"], ["doctor"], ["status"]):
        result = project.cli(*args, env={"COLUMNS": "250"})
        assert result.stdout, args
        for line in result.stdout.splitlines():
            assert line == line.rstrip(), (args, line)
    flows = project.cli("flows").stdout.splitlines()
    ready = next(line for line in flows if line.startswith("example "))
    broken = next(line for line in flows if line.startswith("workflows/broken.py "))
    assert "No module named 'no_such_module_here'" in broken
    # Where to install it: the host's own interpreter (it said only "fix the module").
    assert "install it for the Python the host runs" in broken, broken
    assert len(ready) < 80, ready  # name, version, readiness, identity, source


def _answer_command(text: str, prefix: str, root: Path) -> list[str]:
    """The ``intloom answer`` command a text output offers, as argv after ``intloom
    --project ROOT`` (Project.cli runs from outside the project, so the command names it)."""
    import shlex

    line = next(x for x in text.splitlines() if x.lstrip().startswith(prefix))
    # The whole line after its label: a person copies it whole.
    argv = shlex.split(line.lstrip()[len(prefix):])
    assert argv[:4] == ["intloom", "--project", str(root), "answer"], line
    return argv[3:]


def test_text_output_says_what_a_waiting_run_asks(asks_project: Project) -> None:
    """Without a terminal (no prompts) and without --json, flow, runs and attach show the
    questions (ids, text, options, skippable) or the confirmation's context, and an answer
    command naming the action: enough to answer from the text alone."""
    project = asks_project
    assert project.cli("start").code == 0
    flow = project.cli("flow", "triage", "--intent", "ticket 7")
    assert flow.code == 0, flow.stderr
    run = only_json(project.cli("runs", "--json"))["runs"][0]
    run_id, action_id = run["runId"], run["pendingAction"]["id"]
    for shown in (flow.stdout, project.cli("runs").stdout,
                  project.cli("attach", run_id, input="").stdout):
        assert "resolution: What should happen to this ticket?" in shown, shown
        assert ("options: fix (fix it) · wontfix (won't fix): close it as is · duplicate"
                in shown), shown
        assert "note (skippable): A note for the reporter?" in shown, shown
        assert f" answer {run_id} {action_id} '[" in shown, shown

    argv = _answer_command(flow.stdout, "Answer  ", project.root)
    argv[-1] = (argv[-1].replace("<fix|wontfix|duplicate or text>", "fix")
                .replace("<text>", "it's fixed"))
    confirm = project.cli(*argv)
    assert confirm.code == 0, confirm.stderr
    assert 'Confirm {"fix":"ticket 7","note":"it\'s fixed"}' in confirm.stdout, confirm.stdout
    listed = project.cli("runs").stdout
    assert '  {"fix":"ticket 7","note":"it\'s fixed"}' in listed, listed
    done = project.cli(*_answer_command(listed, "answer: ", project.root))
    assert done.code == 0 and done.stdout.startswith("Completed · triage"), done


def test_logs_shows_the_running_hosts_log_after_the_clock_was_moved_back(
    project: Project,
) -> None:
    """Log files are named by the wall clock when their host starts. A host that ran while
    the clock was ahead (set back since, by hand or by NTP) left a log whose name sorts after
    the running host's: `intloom logs` showed that old host's records as the newest, and
    `intloom logs RUN` found nothing about the running host's Runs. The running host's log,
    the one service.json names, is the newest."""
    logs = project.state / "logs"
    project.state.mkdir(mode=0o700)
    _write_log(logs, "LOG-20991231T000000000Z.jsonl",
               {"time": "2099-12-31T00:00:00.000Z", "level": "info", "event": "log_opened",
                "instanceId": "an-earlier-host"})
    started = project.cli("start", "--json")
    try:
        assert started.code == 0, started.stderr
        service = only_json(started)["service"]
        shown = project.cli("logs", "--json")
        assert shown.code == 0, shown.stderr
        first = json.loads(shown.stdout.splitlines()[0])
        assert (first["event"], first.get("instanceId")) == (
            "log_opened", service["instanceId"]), shown.stdout
    finally:
        assert project.cli("stop").code == 0


def test_runs_shows_the_questions_of_the_first_waiting_runs_and_counts_the_rest(
        project: Project) -> None:
    """10,000 waiting Runs printed 50,000 lines of what each asks under the table, which
    scrolled away: the first 20 are shown, the rest counted, with where to see them."""
    from intloom.client.client import Client

    ok(project.cli("start", "--json"))
    with Client.connect(project.root) as client:
        for n in range(23):
            assert client.create_run("example", f"notes {n}").status == "waiting"
    listed = project.cli("runs").stdout
    assert listed.count("  answer: ") == 20, listed
    assert listed.rstrip().endswith(
        "... and 3 more waiting Runs: intloom attach RUN shows what one asks, intloom runs "
        "--json lists every one."), listed[-300:]
    assert len(ok(project.cli("runs", "--json"))["runs"]) == 23
