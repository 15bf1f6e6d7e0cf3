"""The CLI's helpers: start-up imports, plain option conversion, the log tail, scaffolding."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from intloom.cli.app import COMMANDS, _command_name, main
from intloom.cli.logtail import LogTail, log_files
from intloom.client.lifecycle import start_service, stop_service_report
from intloom.errors import IntloomError
from intloom.scaffold import SCAFFOLD, scaffold
from tests.helpers import REPO

# Heavy or unrelated modules a query against the host must not import (start-up budget).
_NOT_ON_THE_QUERY_PATH = (
    "pydantic", "rich", "watchfiles", "psutil", "intloom.diagnostics", "intloom.store",
    "intloom.authoring", "intloom.executor", "intloom.host.daemon", "intloom.cli.commands.logs",
    "intloom.cli.commands.attach",
    # ~5 ms with OpenSSL's _hashlib: metadata's copy check needs hmac only on its refusal.
    "hmac", "hashlib",
)

# Host log names (LOG_NAME), oldest first.
LOG1, LOG2, LOG3 = (f"LOG-20260101T00000000{n}Z.jsonl" for n in (1, 2, 3))


def _probe(root: Path, command: str, then: str,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``intloom COMMAND`` through ``main`` in a fresh interpreter, in a project at
    ``root`` with no host, then ``then`` (Python that sees ``code``, main's exit code)."""
    (root / "intloom.toml").write_text("workflows = []\n")
    probe = (
        "import sys, json\n"
        "from intloom.cli.app import main\n"
        f"code = main(['--project', {str(root)!r}, *{command.split()!r}])\n" + then
    )
    return subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=30, check=True,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


def test_a_query_imports_only_what_it_needs(tmp_path: Path) -> None:
    out = _probe(tmp_path, "runs --json",
                 "print(json.dumps([code, sorted(sys.modules)]))\n").stdout.splitlines()
    assert json.loads(out[0])["error"]["code"] == "CLI_SERVICE_OFFLINE"
    code, modules = json.loads(out[-1])
    assert code == 1
    loaded = [m for m in _NOT_ON_THE_QUERY_PATH if any(
        name == m or name.startswith(m + ".") for name in modules)]
    assert loaded == []


# Probe code: the classes intloom's loaded modules define with @dataclass of their own.
_MADE = (
    "made = sorted(f'{m}.{name}' for m, mod in list(sys.modules.items())\n"
    "              if m.startswith('intloom') and mod is not None\n"
    "              for name, value in vars(mod).items()\n"
    "              if isinstance(value, type) and value.__module__ == m\n"
    "              and '__dataclass_params__' in vars(value))\n"
)


def test_a_query_builds_nothing_it_does_not_use(tmp_path: Path) -> None:
    """A ``--json`` query makes no dataclass of intloom's (~1 ms of start-up each), nor the
    renderer's terminal-escaping patterns or the host's request decoders (~3 ms)."""
    then = _MADE + (
        "from intloom.cli import render\n"
        "from intloom.protocol import framing\n"
        "built = [render._patterns.cache_info().currsize,\n"
        "         framing._request_decoders.cache_info().currsize]\n"
        "print(json.dumps([code, made, built]))\n"
    )
    code, made, built = json.loads(_probe(tmp_path, "runs --json", then).stdout.splitlines()[-1])
    assert (code, made, built) == (1, [], [0, 0])


@pytest.mark.parametrize("command", ["status --json", "stop --json"])
def test_the_lifecycle_commands_make_no_dataclass(tmp_path: Path, command: str) -> None:
    """Nor do ``status`` (offline, it reads the store) and ``stop``: the client's lifecycle
    code, the store's readers and the host's options are Structs (~1 ms saved per class)."""
    then = _MADE + "print(json.dumps([made, sorted(sys.modules)]))\n"
    made, modules = json.loads(_probe(tmp_path, command, then).stdout.splitlines()[-1])
    assert made == []
    if command.startswith("status"):  # so that the store's classes were looked at
        assert "intloom.store.reader" in modules


def test_printable_escapes_after_its_patterns_are_made_lazily() -> None:
    from intloom.cli.render import printable

    # Hidden characters escaped; a joiner kept between two non-ASCII characters only.
    assert printable("a\x1b[31mb\n\u202e") == "a\\x1b[31mb\\n\\u202e"
    assert printable("\U0001f469\u200d\U0001f467") == "\U0001f469\u200d\U0001f467"
    assert printable("RUN-1\u200d") == "RUN-1\\u200d"


def test_logs_reads_files_without_the_client(tmp_path: Path) -> None:
    """``logs`` needs only the log's name from service.json: it imported the client, its
    socket and the protocol (intloom.client.lifecycle) for it."""
    out = _probe(tmp_path, "logs", "print(json.dumps([code, sorted(sys.modules)]))\n",
                 env={"NO_COLOR": "1"})
    code, modules = json.loads(out.stdout.splitlines()[-1])
    assert code == 0 and "No host log yet" in out.stdout + out.stderr, out
    assert "intloom.client.hostlog" in modules
    heavy = ("intloom.client.client", "intloom.client.lifecycle", "intloom.protocol", "socket")
    assert [m for m in heavy if m in modules] == []


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["runs", "--json"], "runs"),
        (["--json", "--project", "runs", "flows"], "flows"),  # a project dir named "runs"
        (["--project=x", "start"], "start"),
        (["runs", "--help"], "runs"),
        (["--help", "runs"], None),
        (["nope"], None),
        ([], None),
    ],
)
def test_only_the_invoked_command_is_built(argv: list[str], name: str | None) -> None:
    assert _command_name(argv) == name
    assert name is None or name in COMMANDS


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["start", "--port", "abc"], "'abc' is not an integer."),
        (["start", "--port", "70000"], "70000 is not in the range 0<=x<=65535."),
        (["stop", "--timeout", "-1"], "-1 is not in the range 0<=x<=1e+09."),
        (["start", "--timeout", "1e10"], "1e+10 is not in the range 0<=x<=1e+09."),
        # Just past the bound: written to 6 digits (1e+09), it read as inside the range.
        (["start", "--timeout", "1000000001"], "1000000001 is not in the range 0<=x<=1e+09."),
        (["stop", "--timeout", "1000000000.5"],
         "1000000000.5 is not in the range 0<=x<=1e+09."),
        (["stop", "--timeout", "-0.0000001"], "-1e-07 is not in the range 0<=x<=1e+09."),
        (["stop", "--timeout", "soon"], "'soon' is not a number."),
        (["stop", "--timeout", "nan"], "'nan' is not a finite number."),
        (["start", "--timeout", "inf"], "'inf' is not a finite number."),
        (["stop", "--timeout", "1e400"], "'1e400' is not a finite number."),
        # Path("") is "." : the working directory was taken for the project.
        (["--project", "", "status"], "--project is given an empty path"),
        (["stop", "--project="], "--project is given an empty path"),
        # The same for init's DIR: `intloom init "$DIR"` with DIR unset scaffolded the
        # working directory (refused here only because it is not empty).
        (["init", ""], "intloom init is given an empty path"),
    ],
)
def test_bad_option_values_are_usage_errors(
    capsys: pytest.CaptureFixture[str], args: list[str], fragment: str
) -> None:
    assert main([*args, "--json"]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["code"] == "INVALID_REQUEST"
    assert fragment in error["message"]


@pytest.mark.parametrize("timeout", [math.nan, math.inf, -1.0, "5"])
def test_lifecycle_refuses_a_timeout_that_is_no_finite_number_of_seconds(
    tmp_path: Path, timeout: Any
) -> None:
    """From Python too: a NaN deadline passed every comparison and failed in a socket call
    (CLI_INTERNAL_ERROR); nothing is observed, launched or signalled."""
    for call in (lambda: start_service(tmp_path, timeout=timeout),
                 lambda: stop_service_report(tmp_path, timeout=timeout)):
        with pytest.raises(IntloomError) as info:
            call()
        assert info.value.code == "INVALID_REQUEST"
        assert "finite number of seconds" in info.value.message
    assert list(tmp_path.iterdir()) == []


def test_a_host_that_cannot_be_launched_names_what_was_run_and_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Creating the host process failed (an interpreter this user may not run): start said
    "Could not launch the project host (Permission denied)", naming neither."""
    from intloom.client.lifecycle import _launch_reported

    python = tmp_path / "python"
    python.write_text("")
    python.chmod(0o600)  # no execute bit: refused even to root
    monkeypatch.setattr(sys, "executable", str(python))
    with pytest.raises(IntloomError) as info:
        _launch_reported(tmp_path, port=None, strict=False, deadline=0.0, progress=None,
                         slow_import=None)
    assert info.value.code == "CLI_SERVICE_UNAVAILABLE"
    assert info.value.message.startswith(
        f"Could not launch the project host: {python} -m intloom.host, in {tmp_path}, failed "
        "(Permission denied). The host runs with the Python that runs this command: check "
        f"that this user may run {python} and enter {tmp_path}"), info.value.message


def test_a_host_killed_by_a_real_time_signal_while_starting_is_named_by_its_number() -> None:
    """signal.Signals has no member for SIGRTMIN+n: naming it raised ValueError, and start
    failed with an internal error instead of saying how the host ended."""
    from intloom.client.lifecycle import _died_starting

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        number = signal.SIGRTMIN + 6
        os.kill(proc.pid, number)
        error = _died_starting(proc)
    finally:
        proc.kill()
        proc.wait()
    assert error.code == "CLI_SERVICE_UNAVAILABLE"
    assert f"(pid {proc.pid}) was killed by signal {int(number)} before" in error.message


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGSEGV], ids=lambda s: s.name)
def test_a_host_killed_while_importing_blames_the_source_only_for_what_it_can_cause(
        signum: signal.Signals) -> None:
    """A kill -9 while the host imported a slow source was put down to the source ("a
    Workflow source that ends the process when it is imported ... ends the host with it"),
    though no source sends SIGKILL by a crash: it comes from another process or the
    kernel's out-of-memory killer. A signal a crash raises (SIGSEGV) still names the
    source as the likely cause."""
    from intloom.client.lifecycle import _died_starting, _Importing

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        os.kill(proc.pid, signum)
        importing = _Importing(locking=True)
        importing.seen({"step": "importing", "source": "workflows/slow.py"})
        message = _died_starting(proc, importing).message
    finally:
        proc.kill()
        proc.wait()
    assert f"(pid {proc.pid}) was killed by {signum.name} before it reported ready." in message
    blamed = "a Workflow source that ends the process when it is imported"
    if signum == signal.SIGKILL:
        assert (" It was importing workflows/slow.py. SIGKILL comes from outside the process: "
                "another process (kill -9), or the kernel's out-of-memory killer") in message
        assert blamed not in message, message
    else:
        assert f" It was importing workflows/slow.py: {blamed}" in message, message


def test_a_store_on_a_file_system_that_cannot_lock_a_directory_still_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NFS emulates flock with fcntl locks, which need a file open for writing: a directory
    cannot be locked there (EBADF). The store opens without its own lock (service.lock still
    guards the project) rather than refusing every start."""
    import errno
    import fcntl

    from intloom.store import files

    def no_dir_locks(fd: int, operation: int) -> None:
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(fcntl, "flock", no_dir_locks)
    assert files.lock_dir(tmp_path) == -1
    from tests.unit.test_store_support import open_store

    store = open_store(tmp_path / "runtime")
    store.close_blocking()


def test_a_reader_that_goes_away_is_no_failure(tmp_path: Path) -> None:
    """``intloom logs --all | head -1``: Click turned the BrokenPipeError inside the command
    into exit 1 (with nothing on stderr), where ``runs | head`` exited 0."""
    (tmp_path / "intloom.toml").write_text('workflows = []\n')
    logs = tmp_path / ".intloom" / "logs"
    logs.mkdir(parents=True)
    (tmp_path / ".intloom").chmod(0o700)
    logs.chmod(0o700)
    record = json.dumps({"ts": "T", "level": "info", "event": "e", "pad": "x" * 200})
    (logs / "LOG-20260101T000000000Z.jsonl").write_text((record + "\n") * 5000)
    proc = subprocess.Popen([sys.executable, "-m", "intloom", "--project", str(tmp_path),
                             "logs", "--all"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline().startswith(b"T info")
        proc.stdout.close()  # the reader goes away, as head does
        assert proc.wait(timeout=30) == 0
        assert proc.stderr.read() == b""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_a_reader_that_goes_away_keeps_the_verdict_the_exit_code_carries(
        tmp_path: Path) -> None:
    """``intloom doctor | head -1`` exited 0, whatever doctor found: a closed reader was
    mapped to 0. Under ``set -o pipefail`` that reads as healthy. The verdict a command had
    reached before printing (doctor: 3, attention) is its exit code still."""
    (tmp_path / "intloom.toml").write_text('workflows = ["workflows/missing.py"]\n')
    command = [sys.executable, "-m", "intloom", "--project", str(tmp_path), "doctor"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    assert subprocess.run(command, capture_output=True, env=env, timeout=60).returncode == 3
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # gone before doctor prints a line
        assert proc.wait(timeout=60) == 3
        assert proc.stderr.read() == b""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


# ----- log tail ------------------------------------------------------------------------------


def test_log_tail_holds_back_partial_lines_and_follows_new_files(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / LOG1).write_text('{"a": 1}\n')
    (logs / LOG2).write_text('{"b": 1}\n{"b": 2')
    (logs / "other.txt").write_text("ignored\n")
    seen: list[str] = []
    tail = LogTail(logs, seen.append, all_files=False)
    tail.pump()
    assert seen == ['{"b": 1}']  # newest file only; the torn line waits
    with open(logs / LOG2, "a") as fh:
        fh.write('}\n')
    tail.pump()
    assert seen[-1] == '{"b": 2}'
    (logs / LOG3).write_text('{"c": 1}\n')
    tail.pump()
    assert seen == ['{"b": 1}', '{"b": 2}', '{"c": 1}']
    everything: list[str] = []
    LogTail(logs, everything.append, all_files=True).pump()
    assert everything == ['{"a": 1}', '{"b": 1}', '{"b": 2}', '{"c": 1}']


def test_log_tail_reads_a_followed_file_again_once_it_is_truncated_or_replaced(
        tmp_path: Path) -> None:
    """A followed log truncated (by hand, or a copytruncate rotation) kept its old offset:
    the lines written after it were not shown until the file grew past that offset again,
    and then from the middle of a line. One replaced by a new file was read from the old
    offset too."""
    log = tmp_path / LOG1
    log.write_text('{"a": 1}\n{"a": 2}\n')
    seen: list[str] = []
    reread: list[tuple[str, str]] = []
    tail = LogTail(tmp_path, seen.append, all_files=False,
                   on_reread=lambda path, fact: reread.append((path.name, fact)))
    tail.pump()
    with open(log, "r+") as fh:
        fh.truncate(0)
    with open(log, "a") as fh:
        fh.write('{"b": 1}\n')
    tail.pump()
    assert seen == ['{"a": 1}', '{"a": 2}', '{"b": 1}']
    assert reread == [(LOG1, "it was truncated from 18 to 9 bytes")]
    log.rename(tmp_path / "old")
    log.write_text('{"c": 1}\n{"c": 2}\n')  # longer than the old one: no shrink to see
    tail.pump()
    assert seen[3:] == ['{"c": 1}', '{"c": 2}']
    assert reread[1:] == [(LOG1, "it was replaced by another file")]
    tail.pump()
    assert len(seen) == 5 and len(reread) == 2  # read once, said once


def test_log_tail_reads_on_in_a_followed_file_removed_or_moved_away(tmp_path: Path) -> None:
    """A followed log removed (or moved away) while its host still writes into it was
    reopened by its name at each read: every line the host wrote after that was lost."""
    log = tmp_path / LOG1
    log.write_text('{"a": 1}\n')
    seen: list[str] = []
    reread: list[str] = []
    tail = LogTail(tmp_path, seen.append, all_files=False,
                   on_reread=lambda path, fact: reread.append(fact))
    tail.pump()
    with open(log, "a") as host:  # the host's descriptor, which it goes on writing to
        log.rename(tmp_path / "moved")
        host.write('{"a": 2}\n')
        host.flush()
        tail.pump()
        (tmp_path / "moved").unlink()
        host.write('{"a": 3}\n')
        host.flush()
        tail.pump()
    assert seen == ['{"a": 1}', '{"a": 2}', '{"a": 3}']
    assert reread == []  # nothing to read again: it was read on


def test_log_files_skip_links(tmp_path: Path) -> None:
    (tmp_path / LOG1).write_text("")
    (tmp_path / LOG2).symlink_to(tmp_path / LOG1)
    assert log_files(tmp_path) == [tmp_path / LOG1]
    assert log_files(tmp_path / "missing") == []


def test_log_tail_names_each_entry_that_is_no_log_once_even_when_following(
        tmp_path: Path) -> None:
    (tmp_path / LOG1).write_text('{"a": 1}\n')
    (tmp_path / LOG2).symlink_to(tmp_path / LOG1)
    skipped: list[tuple[str, str]] = []
    seen: list[str] = []
    tail = LogTail(tmp_path, seen.append, all_files=False,
                   on_skipped=lambda path, what: skipped.append((path.name, what)))
    tail.pump()
    os.mkfifo(tmp_path / LOG3)  # appears while following: never opened
    tail.pump()
    tail.pump()
    assert seen == ['{"a": 1}']
    assert skipped == [(LOG2, "a symbolic link"), (LOG3, "a FIFO (named pipe)")]


# ----- scaffold ------------------------------------------------------------------------------


def test_the_template_is_the_fixture_the_e2e_tests_run(tmp_path: Path) -> None:
    root = scaffold(tmp_path / "p")
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == sorted(
        SCAFFOLD
    )
    fixture = REPO / "fixtures" / "projects" / "basic"
    for name in ("workflows/example.py",):
        assert (root / name).read_bytes() == (fixture / name).read_bytes()
    from intloom.project import load_config

    assert load_config(root).workflows == ("workflows/example.py",)


def test_scaffold_refusals(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    (tmp_path / "file").write_text("")
    for target, code in (("full", "CLI_INIT_TARGET_NOT_EMPTY"), ("file", "CLI_INIT_TARGET_INVALID"),
                         ("file/below", "CLI_INIT_TARGET_INVALID")):
        with pytest.raises(IntloomError) as caught:
            scaffold(tmp_path / target)
        assert caught.value.code == code
        assert str(tmp_path / target) in caught.value.message
    assert scaffold(tmp_path / "empty-ok") == (tmp_path / "empty-ok").resolve()


def test_a_relative_path_from_a_removed_working_directory_names_that_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """From a shell left in a directory removed since, `intloom init notes` failed
    CLI_INTERNAL_ERROR (os.path.abspath raised), and `--project ../notes` said "../notes
    cannot be examined (No such file or directory)" of a project that exists."""
    from intloom.project import find_root

    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)  # restored at teardown, by its absolute path
    gone.rmdir()
    with pytest.raises(IntloomError) as made:
        scaffold(Path("notes"))
    assert made.value.code == "CLI_INIT_TARGET_INVALID"
    assert made.value.message.startswith(
        "notes is relative to the working directory, which cannot be examined ("), made.value
    assert "absolute path" in made.value.message
    with pytest.raises(IntloomError) as found:
        find_root(Path("../notes"), explicit=True)
    assert found.value.code == "CLI_PROJECT_INVALID"
    assert found.value.message.startswith(
        "../notes is relative to the working directory, which cannot be examined ("), found.value
    assert list(tmp_path.iterdir()) == []


def test_client_connect_to_a_relative_root_from_a_removed_working_directory_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Client.connect("../notes") from a directory removed since raised a bare
    FileNotFoundError, naming neither the root nor the directory gone."""
    from intloom.client import Client

    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)  # restored at teardown, by its absolute path
    gone.rmdir()
    with pytest.raises(IntloomError) as info:
        Client.connect("../notes")
    assert info.value.code == "CLI_PROJECT_INVALID"
    assert info.value.message.startswith(
        "Client.connect('../notes'): ../notes is relative to the working directory, which "
        "cannot be examined ("), info.value.message
    assert info.value.message.endswith("as an absolute path. Nothing was sent.")


_READ_AS_ASCII = r"""
import json, os, sys
from pathlib import Path
from intloom.cli.inputs import read_answer
from intloom.client.outgoing import frame_of
from intloom.errors import IntloomError
from intloom.project import require_utf8_path
from intloom.protocol.messages import CreateRun

def said(call):
    try:
        call()
    except IntloomError as exc:
        return exc.message
    return None

utf8, latin1 = os.fsdecode("/p/caf\u00e9".encode()), os.fsdecode(b"/p/caf\xe9")
print(json.dumps({
    "encoding": sys.getfilesystemencoding(),
    "path": said(lambda: require_utf8_path(Path(utf8))),
    "intent": said(lambda: frame_of(CreateRun(workflow="w", intent=utf8))),
    "answer": said(lambda: read_answer(utf8)),
    "latin1": said(lambda: require_utf8_path(Path(latin1))),
}))
"""


def test_utf8_read_as_ascii_under_a_c_locale_says_so_not_that_it_is_no_utf8() -> None:
    """Under LC_ALL=C with PYTHONUTF8=0 Python reads argv and file names as ASCII: a UTF-8
    project path was called "not valid UTF-8" with the fix to rename it with convmv, and a
    UTF-8 intent "not valid Unicode ... Send UTF-8 text"; the locale is at fault."""
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0",
           "PYTHONCOERCECLOCALE": "0", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", _READ_AS_ASCII], capture_output=True,
                          text=True, env=env, timeout=30, check=True)
    said = json.loads(proc.stdout)
    assert said["encoding"] == "ascii", said
    for key in ("path", "intent", "answer"):
        assert "its bytes are UTF-8, but Python reads the command line and file names here "\
            "as ascii" in said[key], said
        assert "export LC_ALL=C.UTF-8) or PYTHONUTF8=1" in said[key], said
        assert "convmv" not in said[key] and "Send UTF-8 text" not in said[key], said
    assert "is not valid UTF-8" in said["latin1"] and "convmv" in said["latin1"], said


def test_init_takes_a_directory_that_holds_only_a_fresh_repository(tmp_path: Path) -> None:
    """mkdir p && cd p && git init && intloom init was refused, "already contains .git":
    the metadata holds no file of the user's, and init writes nothing into it."""
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    assert scaffold(repo) == repo.resolve()
    assert sorted(p.name for p in repo.iterdir()) == [".git", ".gitignore", "intloom.toml",
                                                      "workflows"]
    assert (repo / ".git" / "HEAD").read_text() == "ref: refs/heads/main\n"
    # A file of the user's beside it is still refused, and named, not the metadata.
    kept = tmp_path / "kept"
    (kept / ".git").mkdir(parents=True)
    (kept / "README.md").write_text("")
    with pytest.raises(IntloomError) as refused:
        scaffold(kept)
    assert refused.value.code == "CLI_INIT_TARGET_NOT_EMPTY"
    assert f"{kept} already contains README.md." in refused.value.message


def test_init_takes_a_directory_that_holds_only_a_virtualenv(tmp_path: Path) -> None:
    """python -m venv .venv, pip install intloom, intloom init: refused, "already contains
    .venv". A virtualenv holds no file of the user's (the identity skips it, too)."""
    root = tmp_path / "p"
    (root / ".venv").mkdir(parents=True)
    (root / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert scaffold(root) == root.resolve()
    assert (root / "intloom.toml").is_file()
    # A directory of the user's that is no virtualenv is still refused.
    other = tmp_path / "other"
    (other / "env").mkdir(parents=True)
    with pytest.raises(IntloomError) as refused:
        scaffold(other)
    assert f"{other} already contains env." in refused.value.message


def test_init_run_again_says_the_directory_is_a_project_already(tmp_path: Path) -> None:
    """intloom init a second time said "already contains .gitignore, intloom.toml, workflows
    ... choose another one, or write intloom.toml there by hand": it has one."""
    root = scaffold(tmp_path / "p")
    with pytest.raises(IntloomError) as refused:
        scaffold(root)
    assert refused.value.code == "CLI_INIT_TARGET_NOT_EMPTY"
    assert refused.value.message == (
        f"{root} is already an intloom project (it holds intloom.toml); nothing was written. "
        "Run intloom start there to use it, or pass a new or empty directory to intloom init "
        "for another.")


def test_init_in_a_project_of_the_users_says_what_intloom_toml_to_write(tmp_path: Path) -> None:
    """intloom init in an existing Python project (pyproject.toml) is refused, as designed,
    and said "or write intloom.toml there by hand" without a word of what goes in it."""
    from intloom.project import load_config

    root = tmp_path / "app"
    root.mkdir()
    (root / "pyproject.toml").write_text('[project]\nname = "app"\n')
    with pytest.raises(IntloomError) as refused:
        scaffold(root)
    assert refused.value.code == "CLI_INIT_TARGET_NOT_EMPTY"
    message = refused.value.message
    assert message.startswith(f"{root} already contains pyproject.toml. "), message
    assert list(root.iterdir()) == [root / "pyproject.toml"]
    # Made by hand, the project gets no .gitignore from init: git add -A took .intloom/,
    # its connection token included, and the bytecode the host writes beside the Workflows
    # (docs/authoring.md names both).
    assert "and add /.intloom/ and __pycache__/ to its .gitignore" in message, message
    # The line it gives is one load_config takes as it is.
    line = message.split("intloom.toml there by hand, one line: ")[1].split(" (")[0]
    (root / "intloom.toml").write_text(line + "\n")
    assert load_config(root).workflows == ("flows/my_flow.py",)


def test_the_scaffolded_gitignore_keeps_host_state_and_bytecode_out_of_git(
        tmp_path: Path) -> None:
    """The host writes workflows/__pycache__/example.cpython-3XX.pyc (its hash-based cache)
    at the first start, and git add -A committed it: the .gitignore held only /.intloom/."""
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")
    root = scaffold(tmp_path / "p")
    subprocess.run([git, "init", "-q", str(root)], check=True, timeout=30)
    asked = [".intloom/runtime/runs/x/wal/0000000001.seg",
             "workflows/__pycache__/example.cpython-311.pyc", ".venv/pyvenv.cfg",
             "workflows/example.py",
             "intloom.toml"]
    out = subprocess.run([git, "-C", str(root), "-c", "core.excludesFile=/dev/null",
                          "check-ignore", "--no-index", *asked], capture_output=True,
                         text=True, timeout=30)
    assert out.stdout.splitlines() == asked[:3], out.stderr


def test_init_refuses_a_directory_inside_a_source_tree_of_the_project_around_it(
        tmp_path: Path) -> None:
    """intloom init my-project/workflows/new wrote workflows/new/workflows/example.py into
    the tree of my-project's workflows/example.py: its identity changed, and my-project's
    unfinished Runs were held as changed at its next start, with no word from init."""
    outer = scaffold(tmp_path / "outer")
    with pytest.raises(IntloomError) as refused:
        scaffold(outer / "workflows" / "new")
    assert refused.value.code == "CLI_INIT_TARGET_INVALID"
    message = refused.value.message
    assert f"inside the project {outer}, in the source tree {outer / 'workflows'}" in message
    assert "nothing was written" in message, message
    assert not (outer / "workflows" / "new").exists()
    # Outside every tree (or in one its walk skips), a project inside another is fine.
    assert scaffold(outer / "tools") == outer / "tools"
    assert scaffold(outer / "workflows" / ".scratch") == outer / "workflows" / ".scratch"


def test_init_that_fails_midway_takes_back_what_it_wrote(tmp_path: Path) -> None:
    """A write that failed after the first (here: under umask 0277 the workflows/ directory
    init makes is 0500) left intloom.toml and workflows/ behind, and the "run intloom init
    again" of its error was refused, CLI_INIT_TARGET_NOT_EMPTY. Root writes anywhere, so as
    root the probe runs without the capabilities that let it (setpriv)."""
    target = tmp_path / "proj"
    target.mkdir()
    code, message = _as_a_user((
        "import os, sys\n"
        "from intloom.scaffold import scaffold\n"
        "os.umask(0o277)\n"
        "scaffold(sys.argv[1])\n"), str(target))
    assert code == "CLI_INIT_FAILED"
    assert list(target.iterdir()) == [], message
    assert (f"intloom init created {target / 'workflows'} with mode 0500, as your umask (0277) "
            "has it") in message, message
    assert "what it had written is removed. Set a umask that does" in message, message
    assert scaffold(target) == target  # the retry its message advises


def test_init_refuses_a_umask_that_takes_the_owners_read_permission(tmp_path: Path) -> None:
    """Under umask 0477 init wrote every file mode 0200 and said "Scaffolded": the intloom
    start it advised was refused, intloom.toml not readable. Refused before any write."""
    target = tmp_path / "proj"
    target.mkdir()
    previous = os.umask(0o477)
    try:
        with pytest.raises(IntloomError) as refused:
            scaffold(target)
    finally:
        os.umask(previous)
    assert refused.value.code == "CLI_INIT_FAILED"
    assert refused.value.message.startswith(
        "Your umask (0477) takes the owner's read permission, so the files intloom init "
        "writes would have mode 0200"), refused.value.message
    assert "nothing was written. Set a umask that does not (umask 022" in refused.value.message
    assert list(target.iterdir()) == []
    assert scaffold(target) == target  # the retry its message advises, the umask put back


def test_init_in_a_read_only_directory_says_nothing_was_written(tmp_path: Path) -> None:
    """Refused its first write, init said "what it had written is removed" when it had
    written nothing."""
    target = tmp_path / "ro"
    target.mkdir()
    target.chmod(0o555)
    code, message = _as_a_user(
        "import sys\nfrom intloom.scaffold import scaffold\nscaffold(sys.argv[1])\n",
        str(target))
    assert code == "CLI_INIT_FAILED"
    assert (f"Could not write {target / 'intloom.toml'} (Permission denied): {target} is not "
            "writable by you (mode 0555); nothing was written. Run chmod u+wx") in message, message
    assert "removed" not in message, message
    assert list(target.iterdir()) == []


def test_a_project_whose_config_is_gone_is_named_with_the_way_back(tmp_path: Path) -> None:
    """intloom.toml removed (or renamed) beside a project's .intloom/, a host perhaps still
    serving it: every command, stop included, said "No intloom.toml ... Run intloom init to
    create a project", which refuses that non-empty directory, with no word of the Runs."""
    from intloom.project import find_root

    root = tmp_path / "proj"
    (root / ".intloom").mkdir(parents=True)
    (root / "workflows").mkdir()
    for start, explicit in ((root / "workflows", False), (root, True)):
        with pytest.raises(IntloomError) as refused:
            find_root(start, explicit=explicit)
        assert refused.value.code == "CLI_PROJECT_INVALID"
        message = refused.value.message
        assert f"but {root / '.intloom'} holds the state of an intloom project" in message
        assert f"its intloom.toml was removed or renamed. Put it back in {root}" in message
        assert "Run intloom init" not in message and "run intloom init" not in message
    (root / "intloom.toml").write_text("workflows = []\n")
    assert find_root(root / "workflows") == root


def test_a_working_directory_beyond_the_path_limit_finds_the_project_above_it(
        tmp_path: Path) -> None:
    """From a directory deeper than PATH_MAX (4,096 bytes), looking for intloom.toml there
    failed ENAMETOOLONG and every command said "Cannot look for intloom.toml ... Check its
    permissions (ls -ld), or pass --project DIR": neither is the fix. No project's root can
    be that long; the search goes on to the directories above it."""
    from intloom.project import find_root

    root = tmp_path / "proj"
    root.mkdir()
    (root / "intloom.toml").write_text("workflows = []\n")
    deep, fd = root, os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        while len(os.fsencode(str(deep))) <= 4_200:
            os.mkdir("d" * 200, dir_fd=fd)
            inner = os.open("d" * 200, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd, deep = inner, deep / ("d" * 200)
    finally:
        os.close(fd)
    assert find_root(deep) == root


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_an_upward_search_does_not_take_another_users_project(tmp_path: Path) -> None:
    """An intloom.toml another user put in a shared directory above the working directory
    (/tmp) was taken as the project: doctor, read-only, imported that user's Workflow code
    as this one. It is refused, naming the owner and --project for the one meant."""
    from intloom.project import find_root

    shared = tmp_path / "shared"
    (shared / "mine").mkdir(parents=True)
    config = shared / "intloom.toml"
    config.write_text('workflows = ["evil.py"]\n')
    os.chown(config, 65534, 65534)
    with pytest.raises(IntloomError) as refused:
        find_root(shared / "mine")
    assert refused.value.code == "CLI_PROJECT_INVALID"
    assert (f"{config}, found by searching upward from the working directory, belongs to "
            "another user (uid 65534, not 0)") in refused.value.message, refused.value
    assert f"pass --project {shared}" in refused.value.message
    assert find_root(shared, explicit=True) == shared  # the one meant, named
    os.chown(config, 0, 0)
    assert find_root(shared / "mine") == shared
    # A link there to a config of ours, in a directory of theirs: the root would be theirs.
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "intloom.toml").write_text("workflows = []\n")
    theirs = tmp_path / "theirs"
    (theirs / "sub").mkdir(parents=True)
    (theirs / "intloom.toml").symlink_to(ours / "intloom.toml")
    os.chown(theirs, 65534, 65534)
    os.lchown(theirs / "intloom.toml", 65534, 65534)
    with pytest.raises(IntloomError) as linked:
        find_root(theirs / "sub")
    assert "belongs to another user (uid 65534, not 0)" in linked.value.message
    # Under sudo, the user sudo was run by is this one.
    os.environ["SUDO_UID"] = "65534"
    try:
        assert find_root(theirs / "sub") == theirs
    finally:
        del os.environ["SUDO_UID"]


def test_a_workflows_entry_holding_a_nul_is_a_config_error(tmp_path: Path) -> None:
    """workflows = ["a\\u0000b.py"] loaded, and the source failed "WORKFLOW_DEFINITION_INVALID:
    checking its Workflows raised ValueError: embedded null byte. Fix the definition": the
    entry, not a definition, is wrong."""
    from intloom.project import load_config

    (tmp_path / "intloom.toml").write_text('workflows = ["ok.py", "a\\u0000b.py"]\n')
    with pytest.raises(IntloomError) as refused:
        load_config(tmp_path)
    assert refused.value.code == "INVALID_REQUEST"
    assert "an entry of 'workflows' holds a NUL character" in refused.value.message


def test_an_absolute_workflows_entry_is_a_config_error_with_its_relative_form(
        tmp_path: Path) -> None:
    """DESIGN: entries are paths relative to the root. An absolute one was loaded from that
    fixed place, so a copied project ran the original's code; it names the relative form."""
    from intloom.project import load_config

    (tmp_path / "wf.py").write_text("")
    (tmp_path / "intloom.toml").write_text(f'workflows = ["ok.py", "{tmp_path}/wf.py"]\n')
    with pytest.raises(IntloomError) as refused:
        load_config(tmp_path)
    assert refused.value.code == "INVALID_REQUEST"
    assert (f"the 'workflows' entry '{tmp_path}/wf.py' is an absolute path; entries are "
            f"relative to the project root ({tmp_path}). Write it as 'wf.py'."
            ) in refused.value.message, refused.value.message
    (tmp_path / "intloom.toml").write_text('workflows = ["../shared/wf.py", "wf.py"]\n')
    assert load_config(tmp_path).workflows == ("../shared/wf.py", "wf.py")


def test_a_config_saved_with_a_byte_order_mark_is_named_as_such(tmp_path: Path) -> None:
    """Saved by an editor as "UTF-8 with BOM", intloom.toml was "not valid TOML (Invalid
    statement (at line 1, column 1))": line 1 looks right, and nothing said why."""
    from intloom.project import load_config

    (tmp_path / "intloom.toml").write_bytes(b'\xef\xbb\xbfworkflows = ["w.py"]\r\n')
    with pytest.raises(IntloomError) as refused:
        load_config(tmp_path)
    assert refused.value.code == "INVALID_REQUEST"
    message = refused.value.message
    assert "starts with a byte-order mark (U+FEFF)" in message, message
    assert "UTF-8 without a BOM" in message, message


def test_a_config_that_is_not_utf8_names_the_line_column_and_byte(tmp_path: Path) -> None:
    """Saved as Latin-1, intloom.toml was "not valid TOML ('utf-8' codec can't decode byte
    0xe9 in position 31: invalid continuation byte)": Python's words, and an offset in the
    file no editor shows."""
    from intloom.project import load_config

    (tmp_path / "intloom.toml").write_bytes(b'workflows = ["w.py"]\n# caf\xe9 notes\n')
    with pytest.raises(IntloomError) as refused:
        load_config(tmp_path)
    assert refused.value.code == "INVALID_REQUEST"
    message = refused.value.message
    assert message.startswith(f"{tmp_path / 'intloom.toml'} is not UTF-8 text: the byte 0xe9 "
                              "at line 2, column 6 is not UTF-8"), message
    assert "Save it as UTF-8" in message and "position" not in message, message


def test_a_config_its_user_may_not_read_is_named_with_its_mode_and_the_fix(
        tmp_path: Path) -> None:
    """An intloom.toml of mode 0000 ended status, start and doctor with CLI_INTERNAL_ERROR
    (load_config let the PermissionError out). Root reads any file, so as root the probe
    runs without the capabilities that let it (setpriv)."""
    config = tmp_path / "intloom.toml"
    config.write_text("workflows = []\n")
    config.chmod(0)
    code, message = _as_a_user((
        "import sys\n"
        "from pathlib import Path\n"
        "from intloom.project import load_config\n"
        "load_config(Path(sys.argv[1]))\n"), str(tmp_path))
    assert code == "CLI_PROJECT_INVALID"
    assert f"{config} is not readable by you (mode 0000)" in message, message
    assert f"Run chmod u+r {config}" in message, message


@pytest.mark.parametrize("planted", ["fifo", "link", "absolute-name"])
def test_stop_after_a_crash_reads_the_hosts_log_only_as_its_own_plain_file(
    tmp_path: Path, planted: str
) -> None:
    """``stop`` reads the log service.json names to say why a host left its files. It opened
    that name as given: a FIFO there hung it past its deadline (for ever), and a link or an
    absolute name made it quote ``service_files_kept`` from a file outside .intloom/logs."""
    import threading

    from intloom.host.metadata import ServiceInfo, read_service, write_service
    from intloom.project import ProjectPaths
    from tests.unit.diagnostics_support import crash_leftovers, dead_pid, make_root, tree

    root = make_root(tmp_path)
    crash_leftovers(root, dead_pid(), 1_000_000.0)
    paths = ProjectPaths(root)
    paths.logs.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text('{"event":"service_files_kept","problems":["PLANTED"]}\n')
    name = "LOG-20261130T000000000Z.jsonl"
    if planted == "fifo":
        os.mkfifo(paths.logs / name, 0o600)
    elif planted == "link":
        (paths.logs / name).symlink_to(elsewhere)
    else:
        name = str(elsewhere)
    info = read_service(paths.service_json, root)
    assert info is not None
    os.unlink(paths.service_json)
    write_service(paths.service_json, ServiceInfo(**{
        **{f: getattr(info, f) for f in info.__struct_fields__}, "log_file": name}))
    before = tree(root)
    outcome: list[BaseException] = []
    stopper = threading.Thread(target=lambda: _stop_into(root, outcome), daemon=True)
    stopper.start()
    stopper.join(timeout=10)
    if stopper.is_alive():  # blocked opening the FIFO: a writer's open and close frees it
        os.close(os.open(paths.logs / name, os.O_WRONLY | os.O_NONBLOCK))
        stopper.join(timeout=10)
        pytest.fail("intloom stop blocked on the FIFO planted at the host's log")
    [error] = outcome
    assert isinstance(error, IntloomError) and error.code == "CLI_SERVICE_BUSY", error
    assert "PLANTED" not in error.message and "killed or crashed" in error.message, error
    assert tree(root) == before


def test_stop_names_each_files_instance_and_pid_when_they_differ(tmp_path: Path) -> None:
    """service.json naming another pid than service.lock (one instance): stop said the two
    "name different instances", which they did not, and only "Check the status again"."""
    from intloom.host.metadata import ServiceInfo, read_service, write_service
    from intloom.project import ProjectPaths
    from tests.unit.diagnostics_support import crash_leftovers, dead_pid, make_root, tree

    root = make_root(tmp_path)
    dead = dead_pid()
    crash_leftovers(root, dead, 1_000_000.0)
    paths = ProjectPaths(root)
    info = read_service(paths.service_json, root)
    assert info is not None
    os.unlink(paths.service_json)
    write_service(paths.service_json, ServiceInfo(**{
        **{f: getattr(info, f) for f in info.__struct_fields__}, "pid": 1}))
    before = tree(root)
    with pytest.raises(IntloomError) as refused:
        stop_service_report(root, timeout=5)
    assert refused.value.code == "CLI_SERVICE_CONFLICT"
    assert (f"service.json names instance {info.instance_id} (pid 1) and service.lock "
            f"instance {info.instance_id} (pid {dead})") in refused.value.message, refused.value
    assert "Nothing was sent" in refused.value.message and "intloom doctor" in refused.value.message
    assert tree(root) == before


def _stop_into(root: Path, outcome: list[BaseException]) -> None:
    try:
        stop_service_report(root, timeout=5)
    except BaseException as exc:  # the test judges what was raised, whatever it is
        outcome.append(exc)


def test_stop_says_what_a_listener_answered_to_its_hello_not_that_it_was_silent(
    tmp_path: Path,
) -> None:
    """The host service.json names (alive, its create time matching) answers the hello with
    what is no frame of a host: stop said it "did not answer the hello within 0.5 s (paused,
    hung or busy)", a fact it had not found; it now says what came back."""
    import contextlib
    import socket
    import struct
    import threading

    from tests.unit.diagnostics_support import (
        crash_leftovers,
        create_time,
        lock_held_here,
        make_root,
    )

    root = make_root(tmp_path)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        crash_leftovers(root, os.getpid(), create_time(os.getpid()), port=port)

        def answer_garbage() -> None:
            with contextlib.suppress(OSError):
                peer, _ = listener.accept()
                with peer:
                    peer.recv(4096)
                    peer.sendall(struct.pack(">I", 3) + b"\xc1\xc1\xc1")

        threading.Thread(target=answer_garbage, daemon=True).start()
        with lock_held_here(root / ".intloom" / "service.lock"), \
                pytest.raises(IntloomError) as timed_out:
            stop_service_report(root, timeout=0.5)
    message = timed_out.value.message
    assert timed_out.value.code == "CLI_SERVICE_TIMEOUT", message
    assert "(paused, hung or busy)" not in message, message
    assert "the frame is not a valid response" in message, message


def _as_a_user(probe: str, arg: str) -> tuple[str, str]:
    """The code and message of the IntloomError ``probe`` raises, run in a child without the
    capabilities that let root read and write any file (setpriv), so that modes bind."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("root reads and writes anything, and setpriv (util-linux) is not "
                        "here to drop that")
        drop = "-dac_override,-dac_read_search"
        prefix = [setpriv, f"--bounding-set={drop}", f"--inh-caps={drop}"]
    script = ("import json\nfrom intloom.errors import IntloomError\ntry:\n"
              + "".join(f"    {line}\n" for line in probe.splitlines())
              + "except IntloomError as exc:\n    print(json.dumps([exc.code, exc.message]))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([*prefix, sys.executable, "-c", script, arg], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout, out.stderr
    code, message = json.loads(out.stdout)
    return code, message


@pytest.mark.parametrize("connection", ["missing", "another port"])
def test_stop_that_cannot_reach_the_live_host_names_why_and_the_way_out(
    tmp_path: Path, connection: str,
) -> None:
    """connection.json removed (or naming another port) while the host service.json names
    still runs and holds the lock: stop said only "Service identity does not match
    connection configuration. Shutdown was not requested; run intloom doctor.", where every
    other command names the missing file and the way out (docs/lifecycle.md: put it back,
    or kill -TERM PID)."""
    from tests.unit.diagnostics_support import (
        crash_leftovers,
        create_time,
        lock_holder,
        make_root,
        tree,
        write_connection_json,
    )

    root = make_root(tmp_path)
    pid = os.getpid()
    port = crash_leftovers(root, pid, create_time(pid), connection=False)
    if connection == "another port":
        write_connection_json(root, port + 1 if port < 65535 else port - 1)
    state = root / ".intloom"
    before = tree(root)
    with lock_holder(state / "service.lock"), pytest.raises(IntloomError) as info:
        stop_service_report(root, timeout=5)
    assert info.value.code == "CLI_SERVICE_METADATA_INVALID", info.value
    message = info.value.message
    assert message.startswith(
        "Service identity does not match connection configuration. Shutdown was not "
        "requested."), message
    if connection == "missing":
        assert f"{state / 'connection.json'} is missing" in message, message
    else:
        assert f"{state / 'service.json'} names port {port} but " in message, message
    assert f"(pid {pid}" in message and f"kill -TERM {pid}" in message, message
    assert tree(root) == before


def test_stop_facing_crash_leftovers_without_connection_json_says_how_to_clean_up(
    tmp_path: Path,
) -> None:
    """Its host killed and connection.json lost: recover refuses without the saved port, so
    stop's way out is the one status and doctor give (remove the two files by hand once the
    owner is proved gone, then start), not a bare "run intloom doctor"."""
    from tests.unit.diagnostics_support import crash_leftovers, dead_pid, make_root, tree

    root = make_root(tmp_path)
    pid = dead_pid()
    crash_leftovers(root, pid, 1.0e9, connection=False)
    before = tree(root)
    with pytest.raises(IntloomError) as info:
        stop_service_report(root, timeout=5)
    assert info.value.code == "CLI_SERVICE_METADATA_INVALID", info.value
    message = info.value.message
    assert f"(pid {pid}) has exited" in message, message
    assert "remove .intloom/service.lock and .intloom/service.json yourself" in message, message
    assert "kill -TERM" not in message, message
    assert tree(root) == before


def test_the_timeout_options_bound_is_the_clients() -> None:
    """--timeout is bounded while parsing (a usage error, exit 2), by a copy of the bound
    the client refuses above: the two must not drift apart."""
    from intloom.cli.commands.service import MAX_TIMEOUT
    from intloom.client.client import MAX_SECONDS

    assert MAX_TIMEOUT == MAX_SECONDS


@pytest.mark.parametrize(("args", "lines"), [
    (["init", "--help"], ["Usage: intloom init [OPTIONS] [DIR]"]),
    (["logs", "--help"], ["Usage: intloom logs [OPTIONS] [RUN]", "(logs: one record a line)"]),
    (["start", "--help"], ["--port N", "Give up after S seconds (default 300).",
                           "Listen on this port; later starts reuse it unless intloom.toml "
                           "sets a port."]),
    (["stop", "--help"], ["Give up after S seconds (default 10, or as long as the host says "
                          "its stop may take; 300 for a host still starting)."]),
])
def test_the_help_spells_the_usage_as_docs_cli_does(
    capsys: pytest.CaptureFixture[str], args: list[str], lines: list[str],
) -> None:
    """The help said ``init [directory]``, ``logs [[RUN]]`` and ``--port <int range>``, gave
    no default for --timeout, and promised exactly one JSON document from ``logs --json``,
    where docs/cli.md says ``init [DIR]``, ``logs [RUN]``, ``--port N``, the defaults (300 s
    for start, 10 s for stop) and that logs streams JSONL. ``--port`` said "(saved for later
    starts)", but a port set in intloom.toml wins over the saved one."""
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())  # as if unwrapped
    for line in lines:
        assert line in out, out


def test_init_keeps_a_virtualenv_it_was_given_out_of_git_whatever_its_name(
        tmp_path: Path) -> None:
    """init takes a directory holding a virtualenv of any name (``python -m venv venv``), but
    its .gitignore named only /.venv/: git add -A committed the whole of venv/ (a Python
    before 3.13 writes no .gitignore into it)."""
    root = tmp_path / "p"
    for name in ("venv", ".venv", "my env*"):
        (root / name).mkdir(parents=True)
        (root / name / "pyvenv.cfg").write_text("home = /usr/bin\n")
    scaffold(root)
    lines = (root / ".gitignore").read_text().splitlines()
    assert "/venv/" in lines and "/my env\\*/" in lines, lines
    assert lines.count("/.venv/") == 1, lines
    git = shutil.which("git")
    if git is None:
        return
    subprocess.run([git, "init", "-q", str(root)], check=True, timeout=30)
    asked = ["venv/pyvenv.cfg", "my env*/pyvenv.cfg", "my envx/pyvenv.cfg"]
    out = subprocess.run([git, "-C", str(root), "-c", "core.excludesFile=/dev/null",
                          "check-ignore", "--no-index", *asked], capture_output=True,
                         text=True, timeout=30)
    assert out.stdout.splitlines() == asked[:2], out.stderr


def test_a_host_left_unreachable_is_named_with_its_own_way_out_and_no_more(
    tmp_path: Path,
) -> None:
    """connection.json removed while its host runs: the message gives the way out (put the
    file back, or kill -TERM PID and start). Once _metadata_invalid added "Run intloom
    doctor." to every message (IntloomError.here), this one ended with it too, after the
    fix it had already given."""
    from intloom.client.client import _unreachable_host
    from intloom.project import ProjectPaths
    from tests.unit.diagnostics_support import (
        crash_leftovers,
        create_time,
        lock_holder,
        make_root,
    )

    root = make_root(tmp_path)
    pid = os.getpid()
    crash_leftovers(root, pid, create_time(pid), connection=False)
    with lock_holder(root / ".intloom" / "service.lock"):
        error = _unreachable_host(ProjectPaths(root), root)
    assert error is not None and error.code == "CLI_SERVICE_METADATA_INVALID", error
    assert error.message.endswith("then run intloom start, which writes a new one."), error
    assert error.here == error.message


def test_init_under_umask_000_writes_a_project_no_other_user_may_rewrite(
        tmp_path: Path) -> None:
    """Under umask 000 init made the project 0777 and its files 0666: any local user could
    rewrite the Workflow code a start then ran as this user (doctor said config ok)."""
    target = tmp_path / "proj"
    previous = os.umask(0)
    try:
        scaffold(target)
    finally:
        os.umask(previous)
    modes = {str(p.relative_to(tmp_path)): stat.S_IMODE(p.lstat().st_mode)
             for p in [target, *target.rglob("*")]}
    assert modes == {"proj": 0o755, "proj/workflows": 0o755, "proj/intloom.toml": 0o644,
                     "proj/workflows/example.py": 0o644, "proj/.gitignore": 0o644}, modes


def test_init_refuses_a_directory_every_user_may_write(tmp_path: Path) -> None:
    """An empty 0777 directory took a project whose Workflow code any local user could
    replace (rename workflows/, plant a file), run as this user at every start."""
    target = tmp_path / "open"
    target.mkdir()
    target.chmod(0o777)
    with pytest.raises(IntloomError) as refused:
        scaffold(target)
    assert refused.value.code == "CLI_INIT_TARGET_INVALID"
    assert refused.value.message.startswith(
        f"{target} may be written by every user (mode 0777)"), refused.value.message
    assert f"chmod o-w {target}" in refused.value.message
    assert list(target.iterdir()) == []
    target.chmod(0o700)
    assert scaffold(target) == target  # the fix it names


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_init_refuses_a_directory_another_user_owns(tmp_path: Path) -> None:
    """init wrote into another user's empty directory and advised intloom start there, which
    then refused it as another user's project (the owner may replace its code)."""
    target = tmp_path / "theirs"
    target.mkdir()
    os.chown(target, 65534, 65534)
    with pytest.raises(IntloomError) as refused:
        scaffold(target)
    assert refused.value.code == "CLI_INIT_TARGET_INVALID"
    assert refused.value.message.startswith(
        f"{target} belongs to another user (uid 65534, not 0)"), refused.value.message
    assert list(target.iterdir()) == []


@pytest.mark.parametrize("saved", [False, True], ids=["first_start", "saved_before"])
def test_a_host_killed_before_it_saved_connection_json_is_not_left_to_recover(
        tmp_path: Path, saved: bool) -> None:
    """A project's first start killed after service.lock and before connection.json: start
    said "intloom recover removes it", recover refused (no connection.json: DESIGN section
    3), and the next start's CLI_SERVICE_BUSY sent the user back to recover."""
    import msgspec

    from intloom.client.lifecycle import _died_starting
    from intloom.host import metadata
    from intloom.project import ProjectPaths

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        paths = ProjectPaths(tmp_path)
        paths.state.mkdir(mode=0o700)
        lock = metadata.ServiceLock(version=metadata.METADATA_VERSION, pid=proc.pid,
                                    create_time=1_000_000.0, boot_id="b",
                                    instance_id="0f0e0d0c-0b0a-4908-8706-050403020100",
                                    started_at="2026-01-01T00:00:00Z")
        paths.service_lock.write_bytes(msgspec.json.encode(lock))
        paths.service_lock.chmod(0o600)
        if saved:
            paths.connection_json.write_text("{}")
        os.kill(proc.pid, signal.SIGKILL)
        message = _died_starting(proc, None, paths).message
    finally:
        proc.kill()
        proc.wait()
    if saved:
        assert ("the service.lock it left is stale, and intloom recover removes it before the "
                "next intloom start") in message, message
    else:
        assert ("The service.lock it left is stale, but it had not saved "
                ".intloom/connection.json yet, which intloom recover needs (it checks the "
                "project's saved port with it): once intloom doctor shows the host exited "
                "(the OS lock on service.lock free), remove it yourself, then run intloom "
                "start.") in message, message
        assert "intloom recover removes" not in message, message
