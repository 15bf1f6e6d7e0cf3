"""Local security: the token stays in connection.json, state is private, links and foreign
directories are refused, and only 127.0.0.1 is bound (docs/security.md maps each promise to
the test here that checks it).
"""

from __future__ import annotations

import json
import os
import signal
import stat
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from intloom.client.client import Client
from intloom.client.lifecycle import stop_service
from intloom.errors import IntloomError
from intloom.store.snapshots import snapshot_name
from tests.helpers import CliResult, Project, eventually, make_project, pid_alive
from tests.integration.host_support import hello_frame, raw, reply, start

pytestmark = pytest.mark.e2e

NOBODY = 65534


def _token(project: Project) -> str:
    return str(json.loads((project.state / "connection.json").read_bytes())["token"])


def _no_token(token: str, where: str, text: str | bytes) -> None:
    data = text.encode() if isinstance(text, str) else text
    assert token.encode() not in data, f"the token leaked into {where}"


# ----- the token -----------------------------------------------------------------------------


def test_the_token_never_leaves_connection_json(project: Project) -> None:
    outputs: list[tuple[str, CliResult]] = []

    def cli(*args: str) -> CliResult:
        result = project.cli(*args)
        outputs.append((" ".join(args), result))
        return result

    started = cli("start", "--json")
    assert started.code == 0, started.stderr
    token = _token(project)
    pid = project.host_pid()
    # The host's command line and environment: the token is read from the file, never passed.
    for name in ("cmdline", "environ"):
        _no_token(token, f"/proc/{pid}/{name}", Path(f"/proc/{pid}/{name}").read_bytes())
    flow = cli("flow", "example", "--intent", "security", "--json")
    run = flow.json["run"]
    port = json.loads((project.state / "connection.json").read_bytes())["port"]
    with raw(port) as sock:  # wrong tokens are refused and logged, never echoed
        sock.sendall(hello_frame(token[::-1]))
        refused = reply(sock)
        _no_token(token, "an UNAUTHORIZED reply", repr(refused))
    for args in (("status",), ("status", "--json"), ("doctor",), ("doctor", "--json"),
                 ("runs",), ("flows", "--json"), ("logs",), ("logs", "--json"),
                 ("inspect", run["runId"]), ("answer", run["runId"], "ASK-none", "{}"),
                 ("flow", "nope", "--intent", "x", "--json"), ("recover", "--json"),
                 ("start", "--port", "1", "--json")):
        cli(*args)
    os.kill(pid, signal.SIGKILL)
    eventually(lambda: not pid_alive(pid), what="the host to exit")
    for args in (("status", "--json"), ("doctor", "--json"), ("doctor",), ("stop", "--json"),
                 ("start", "--json"), ("recover", "--dry-run")):
        cli(*args)
    assert any(result.code != 0 for _, result in outputs)  # error paths were exercised
    for label, result in outputs:
        _no_token(token, f"`intloom {label}` stdout", result.stdout)
        _no_token(token, f"`intloom {label}` stderr", result.stderr)
    # Every file of the state but connection.json: logs, service files, journal, snapshots.
    for path in project.state.rglob("*"):
        if path.is_file() and path.name != "connection.json":
            _no_token(token, str(path.relative_to(project.root)), path.read_bytes())


# ----- private state -------------------------------------------------------------------------


def test_connection_json_and_all_state_are_private(project: Project) -> None:
    start(project)
    with Client.connect(project.root) as client:
        client.create_run("example", "private")
    assert stop_service(project.root)
    start(project)  # a second instance: a second log, a second segment, snapshots
    found = 0
    for path in [project.state, *project.state.rglob("*")]:
        st = os.lstat(path)
        assert st.st_uid == os.getuid(), path
        assert not stat.S_ISLNK(st.st_mode), path
        if stat.S_ISDIR(st.st_mode):
            assert stat.S_IMODE(st.st_mode) == 0o700, (path, oct(st.st_mode))
        else:
            assert stat.S_ISREG(st.st_mode), path
            assert stat.S_IMODE(st.st_mode) & 0o077 == 0, (path, oct(st.st_mode))
            found += 1
    assert stat.S_IMODE(os.stat(project.state / "connection.json").st_mode) == 0o600
    assert found >= 8  # connection, service json+lock, 2 logs, manifest, segments, snapshots


# ----- directories that are not ours ---------------------------------------------------------


def _symlink_to(victim: Path) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        path.symlink_to(victim, target_is_directory=True)
    return make


def _foreign_owner(path: Path) -> None:
    path.mkdir(mode=0o700)
    os.chown(path, NOBODY, NOBODY)


def _open_to_others(path: Path) -> None:
    path.mkdir(mode=0o700)
    os.chmod(path, 0o777)


@pytest.mark.parametrize("where", [".intloom", ".intloom/runtime", ".intloom/logs"])
@pytest.mark.parametrize("how", ["symlink", "foreign-owner", "writable-by-others"])
def test_a_state_directory_that_is_not_private_is_refused(
    tmp_path: Path, where: str, how: str
) -> None:
    if how == "foreign-owner" and os.getuid() != 0:
        pytest.skip("chown to another user needs root")
    project = make_project(tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    target = project.root / where
    target.parent.mkdir(mode=0o700, exist_ok=True)
    {"symlink": _symlink_to(victim), "foreign-owner": _foreign_owner,
     "writable-by-others": _open_to_others}[how](target)
    before = os.lstat(target)
    try:
        result = project.cli("start", "--json")
    finally:
        project.reap()
    assert result.code != 0
    error = result.json["error"]
    assert error["code"] in ("CLI_SERVICE_METADATA_INVALID", "STORAGE_ERROR"), error
    fact = {"symlink": "symbolic link", "foreign-owner": f"owned by uid {NOBODY}",
            "writable-by-others": "mode 0777"}[how]
    assert str(target) in error["message"] and fact in error["message"], error
    after = os.lstat(target)  # refused, not "fixed"
    assert (after.st_mode, after.st_uid) == (before.st_mode, before.st_uid)
    assert list(victim.iterdir()) == []
    assert not (project.state / "service.json").exists()


# ----- links are never followed --------------------------------------------------------------


@pytest.mark.parametrize("name", ["connection.json", "service.json",
                                  "runtime/wal/0000000002.seg"])
def test_a_link_planted_in_the_state_is_refused_and_its_target_untouched(
    project: Project, name: str
) -> None:
    start(project)
    assert stop_service(project.root)
    victim = project.root.parent / "victim"
    victim.write_bytes(b"precious")
    link = project.state / name
    saved = link.read_bytes() if link.exists() else None
    if saved is not None:
        link.unlink()
    link.symlink_to(victim)
    with pytest.raises(IntloomError) as refused:
        start(project)
    assert refused.value.code in ("CLI_SERVICE_METADATA_INVALID", "STORAGE_ERROR")
    assert str(link) in refused.value.message and "symbolic link" in refused.value.message
    assert victim.read_bytes() == b"precious" and link.is_symlink()
    link.unlink()
    if saved is not None:
        link.write_bytes(saved)
        link.chmod(0o600)
    start(project)  # with the link moved aside, the project starts again


def test_a_link_planted_at_the_manifest_is_never_followed_and_holds_back_no_run(
    project: Project,
) -> None:
    """runtime/manifest.json a link refused the whole store. Read past as a damaged manifest
    is: never opened, reported, every segment read instead, nothing written through it."""
    start(project)
    with Client.connect(project.root) as client:
        waiting = client.create_run("example", "links")
    assert stop_service(project.root)
    victim = project.root.parent / "victim"
    victim.write_bytes(b"precious")
    link = project.state / "runtime" / "manifest.json"
    link.unlink()
    link.symlink_to(victim)
    started = project.cli("start", "--json")
    assert started.code == 0, started.stderr
    [problem] = started.json["service"]["storeProblems"]
    assert (problem["path"], problem["kind"]) == ("manifest.json", "corrupt"), problem
    assert problem["problem"].startswith("is a symbolic link; intloom never follows links")
    with Client.connect(project.root) as client:
        assert client.get_run(waiting.run_id).pending_action == waiting.pending_action
    assert stop_service(project.root)  # its compaction writes no manifest over the link
    assert victim.read_bytes() == b"precious" and link.is_symlink()


def test_a_link_swapped_in_while_the_host_runs_is_not_written_through(project: Project) -> None:
    start(project)
    with Client.connect(project.root) as client:
        waiting = client.create_run("example", "links")
        beside = client.create_run("example", "beside")
    assert waiting.status == "waiting"
    victim = project.root.parent / "victim"
    victim.write_bytes(b"precious")
    # Where the stop will write this Run's snapshot.
    link = project.state / "runtime" / "snap" / "live" / snapshot_name(waiting.run_id)
    link.symlink_to(victim)
    assert stop_service(project.root)  # the snapshot write is refused; the stop completes
    assert victim.read_bytes() == b"precious" and link.is_symlink()
    # The link held up no other Run's snapshot.
    assert (link.parent / snapshot_name(beside.run_id)).is_file()
    # Reported, kept, never followed; the log still holds the Run: it comes back as it was.
    started = project.cli("start", "--json")
    assert started.code == 0, started.stderr
    [problem] = started.json["service"]["storeProblems"]
    assert problem["path"] == f"snap/live/{link.name}", problem
    assert problem["problem"].startswith("is a symbolic link; intloom never follows links")
    with Client.connect(project.root) as client:
        assert client.get_run(waiting.run_id).pending_action == waiting.pending_action
    assert stop_service(project.root)
    assert victim.read_bytes() == b"precious" and link.is_symlink()


def test_a_snap_directory_swapped_for_a_link_while_the_host_runs_is_not_written_through(
        project: Project) -> None:
    service = start(project).service
    with Client.connect(project.root) as client:
        waiting = client.create_run("example", "snap-link")
    assert waiting.pending_action is not None
    snap = project.state / "runtime" / "snap"
    real = project.root.parent / "snap-real"
    snap.rename(real)
    snap.symlink_to(real)
    before = {p.name for p in (real / "live").iterdir()}
    with Client.connect(project.root) as client:
        answered = client.answer(waiting.run_id, waiting.pending_action.id,
                                 {"isConfirmed": False})
    assert answered.pending_action is not None
    assert stop_service(project.root)  # its compaction writes nothing through the link
    assert {p.name for p in (real / "live").iterdir()} == before
    assert service.log_file is not None
    events = [json.loads(line) for line in
              (project.state / "logs" / service.log_file).read_text().splitlines()]
    [failed] = [e for e in events if e["event"] == "store_compaction_failed"]
    assert failed["cause"].startswith(f"Checkpoint store path {snap} is a symbolic link"), failed
    assert "the next intloom start refuses the store" in failed["effect"], failed
    refused = project.cli("start", "--json")
    assert refused.json["error"]["code"] == "STORAGE_ERROR", refused.stdout
    snap.unlink()
    real.rename(snap)  # put right: the log holds the answer
    started = project.cli("start", "--json")
    assert started.code == 0, started.stderr
    with Client.connect(project.root) as client:
        assert client.get_run(waiting.run_id).pending_action == answered.pending_action
    assert stop_service(project.root)


def _plant(path: Path, kind: str) -> Callable[[], bool]:
    """Plant a file intloom must not write over at ``path``; a check that it is untouched."""
    if kind == "fifo":
        os.mkfifo(path, 0o600)
        return lambda: stat.S_ISFIFO(os.lstat(path).st_mode)
    path.write_bytes(b"planted")
    path.chmod(0o644)
    return lambda: (path.read_bytes() == b"planted"
                    and stat.S_IMODE(os.lstat(path).st_mode) == 0o644)


@pytest.mark.parametrize("kind", ["fifo", "mode-0644"])
def test_a_file_planted_at_a_snapshot_while_the_host_runs_is_kept(
        project: Project, kind: str) -> None:
    service = start(project).service
    with Client.connect(project.root) as client:
        waiting = client.create_run("example", "planted")
        other = client.create_run("example", "beside")
    assert waiting.pending_action is not None
    live = project.state / "runtime" / "snap" / "live"
    planted = live / snapshot_name(waiting.run_id)
    untouched = _plant(planted, kind)
    with Client.connect(project.root) as client:
        answered = client.answer(waiting.run_id, waiting.pending_action.id,
                                 {"isConfirmed": False})
    assert answered.status == "waiting" and answered.pending_action is not None
    assert stop_service(project.root)  # its compaction leaves the planted file as it is
    assert untouched(), f"{planted} was written over"
    # Every other Run's snapshot is still written.
    assert (live / snapshot_name(other.run_id)).is_file()
    assert service.log_file is not None
    events = [json.loads(line) for line in
              (project.state / "logs" / service.log_file).read_text().splitlines()]
    [told] = [e for e in events if e["event"] == "store_file_problem"]
    assert told["path"] == f"snap/live/{planted.name}", told
    # The next start reports it in the same words, and the log restores the Run as answered.
    started = project.cli("start", "--json")
    assert started.code == 0, started.stderr
    [problem] = started.json["service"]["storeProblems"]
    assert (problem["path"], problem["problem"]) == (told["path"], told["problem"])
    with Client.connect(project.root) as client:
        assert client.get_run(waiting.run_id).pending_action == answered.pending_action
    assert stop_service(project.root)
    assert untouched()


# ----- the network ---------------------------------------------------------------------------


def test_only_127_0_0_1_is_bound(project: Project) -> None:
    service = start(project).service
    with Client.connect(project.root) as client:
        client.create_run("example", "network")
        sockets = psutil.Process(service.pid).net_connections(kind="inet")
    listening = [c for c in sockets if c.status == psutil.CONN_LISTEN]
    assert [(c.laddr.ip, c.laddr.port) for c in listening] == [("127.0.0.1", service.port)]
    for conn in sockets:
        assert conn.laddr.ip == "127.0.0.1", conn
        if conn.raddr:
            assert conn.raddr.ip == "127.0.0.1", conn


@pytest.mark.timeout(60)
@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_doctor_does_not_import_another_users_workflow_code_named_with_project(
        tmp_path: Path) -> None:
    """``intloom --project ~alice/p doctor``, run by root (an administrator looking at a
    user's project): doctor, read-only, imported that user's Workflow code as root -- a
    source that wrote a file at import wrote it as uid 0. It names the owner and how to run
    doctor as them, and imports nothing."""
    from tests.helpers import one_source_project

    marker = tmp_path / "imported"
    project = one_source_project(tmp_path, "evil", (
        "import os, pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text(str(os.geteuid()))\n"
        "import intloom\n"
        'wf = intloom.Workflow("evil", version="1")\n'))
    for path in (project.root, project.root / "intloom.toml"):
        os.chown(path, NOBODY, NOBODY)
    doctor = project.cli("doctor", "--json")
    assert not marker.exists(), marker.read_text()
    check = next(c for c in doctor.json["checks"] if c["id"] == "workflows")
    assert check["status"] == "not_checked", check
    assert (f"belongs to another user (uid {NOBODY}, not 0), and importing its Workflow code "
            "would run that code as you") in check["message"], check
    assert f"sudo -u '#{NOBODY}' intloom --project {project.root} doctor" in check["next"]
    # Its own project: imported as before.
    for path in (project.root, project.root / "intloom.toml"):
        os.chown(path, 0, 0)
    project.cli("doctor", "--json")
    assert marker.read_text() == "0"


def test_roots_fix_for_another_users_state_is_to_run_as_that_user_not_to_take_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Root diagnosing a user's project was told to "chown it to yourself (uid 0)": the
    state taken from its owner, whose own commands then refuse it."""
    from intloom.fsutil import PrivacyError, privacy_fix

    error = PrivacyError(tmp_path / ".intloom", f"is owned by uid {NOBODY}, not by you")
    monkeypatch.setattr(os, "getuid", lambda: 0)
    fix = privacy_fix(error)
    assert fix.startswith(f"It is another user's: run intloom as that user (sudo -u "
                          f"'#{NOBODY}' intloom ...)"), fix
    assert "chown" not in fix
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    assert "chown it to yourself (uid 1000)" in privacy_fix(error)
