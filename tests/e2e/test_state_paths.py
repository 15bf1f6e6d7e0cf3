"""Paths under .intloom that are not what intloom made them: doctor reports each with the
fix its fact calls for, start refuses with that fix, and nothing reads through a link.
Real host and CLI; every file is checked byte-identical afterwards."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from intloom.store.framing import scan_segment
from tests.helpers import (
    FIXTURES,
    Project,
    make_project,
    ok,
    snapshot_files,
    started_waiting,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

T = TypeVar("T")


# Most tests here need a project that has been through a start and a stop, some with Runs
# left waiting, before they plant what they test. Each such state is built once per module
# (every command checked as before) and each test gets a copy of it as ``cp -a`` makes one
# (modes and times kept, links copied as links) at the very path it was built in: its
# connection.json names that root, and a copy elsewhere is refused as a moved project.


def _built(base: Path, steps: Callable[[Project], T]) -> tuple[Path, T]:
    """The basic fixture project at ``base``/proj taken through ``steps``, then kept aside
    as ``base``/template; and what ``steps`` returned."""
    builder = make_project(base)
    try:
        made = steps(builder)
    finally:
        builder.track_host()
        builder.reap()
    template = base / "template"
    builder.root.rename(template)
    return template, made


@contextlib.contextmanager
def _copy_of(template: Path) -> Iterator[Project]:
    """A copy of ``template`` where it was built; every host started for it is killed at
    the end, then the copy and whatever a test put beside it are removed."""
    root = template.parent / "proj"
    shutil.copytree(template, root, symlinks=True)
    project = Project(root=root)
    try:
        yield project
    finally:
        project.track_host()
        project.reap()
        for top, dirs, _ in os.walk(root):  # a test that failed may have left one 0500
            for name in dirs:
                if not os.path.islink(os.path.join(top, name)):
                    os.chmod(os.path.join(top, name), 0o700)
        for left in template.parent.iterdir():
            if left != template:
                if left.is_dir() and not left.is_symlink():
                    shutil.rmtree(left)
                else:
                    left.unlink()


def _start_and_stop(project: Project) -> None:
    ok(project.cli("start", "--json"))
    ok(project.cli("stop", "--json"))


@pytest.fixture(scope="module")
def _stopped_built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _built(tmp_path_factory.mktemp("stopped"), _start_and_stop)[0]


@pytest.fixture
def stopped(_stopped_built: Path) -> Iterator[Project]:
    """A project started once and stopped: no Runs, one sealed host log."""
    with _copy_of(_stopped_built) as project:
        yield project


def _three_flows(project: Project) -> list[dict[str, Any]]:
    ok(project.cli("start", "--json"))
    runs = [ok(project.cli("flow", "example", "--intent", f"r{i}", "--json"))["run"]
            for i in range(3)]
    ok(project.cli("stop", "--json"))  # the stop snapshots the waiting Runs
    return runs


@pytest.fixture(scope="module")
def _three_waiting_built(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, list[dict[str, Any]]]:
    return _built(tmp_path_factory.mktemp("three-waiting"), _three_flows)


@pytest.fixture
def three_waiting(
    _three_waiting_built: tuple[Path, list[dict[str, Any]]],
) -> Iterator[tuple[Project, list[dict[str, Any]]]]:
    """A project started once, with three Runs of the example left waiting, then stopped
    (the stop snapshots them); and the three Runs' views."""
    template, runs = _three_waiting_built
    with _copy_of(template) as project:
        yield project, json.loads(json.dumps(runs))


def test_a_logs_path_that_is_not_a_directory_is_reported_by_doctor_and_start(
    stopped: Project,
) -> None:
    project = stopped  # started once and stopped
    logs = project.state / "logs"
    for log in logs.iterdir():
        log.chmod(0o600)
        log.unlink()
    logs.rmdir()
    logs.write_bytes(b"x")
    logs.chmod(0o600)
    doctor = project.cli("doctor", "--json")
    [check] = [c for c in doctor.json["checks"] if c["id"] == "runtime_dir"]
    assert check["status"] == "attention", check
    assert f"{logs} is not a directory" in check["message"]
    assert f"mv {logs} {logs}.bad" in check["next"], check
    started = project.cli("start", "--json")
    assert started.code == 1, started.stdout
    message = started.json["error"]["message"]
    assert f"{logs} is not a directory" in message and f"mv {logs} {logs}.bad" in message
    assert "run intloom doctor" not in message, message
    assert logs.read_bytes() == b"x"


def test_journals_are_never_read_through_a_linked_state_directory(project: Project) -> None:
    ok(project.cli("start", "--json"))
    run = ok(project.cli("flow", "example", "--intent", "i", "--json"))["run"]
    ok(project.cli("stop", "--json"))
    real = project.root / "elsewhere"
    project.state.rename(real)
    project.state.symlink_to(real)
    before = snapshot_files(real)
    inspect = project.cli("inspect", run["runId"], "--json")
    assert inspect.code == 1, inspect.stdout
    assert inspect.json["error"]["code"] == "CLI_SERVICE_METADATA_INVALID"
    assert "is a symbolic link" in inspect.json["error"]["message"]
    doctor = project.cli("doctor", "--json")
    [journals] = [c for c in doctor.json["checks"] if c["id"] == "journals"]
    assert journals["status"] == "attention", journals
    assert journals["message"].startswith("The journals were not read"), journals
    assert snapshot_files(real) == before


@pytest.mark.parametrize("linked", [".intloom", ".intloom/logs"])
def test_logs_are_never_read_through_a_linked_state_or_logs_directory(
    stopped: Project, linked: str
) -> None:
    project = stopped  # started once and stopped
    path = project.root / linked
    real = project.root / "elsewhere"
    path.rename(real)
    path.symlink_to(real)
    before = snapshot_files(real)
    for args in (["logs"], ["logs", "--all", "--json"], ["logs", "--follow"]):
        refused = project.cli(*args, timeout=30)
        assert refused.code == 1, (args, refused.stdout, refused.stderr)
        shown = refused.json["error"]["message"] if "--json" in args else refused.stderr
        assert "CLI_SERVICE_METADATA_INVALID" in refused.stdout + refused.stderr, shown
        assert f"{path} is a symbolic link" in shown, shown
        assert "log_opened" not in refused.stdout, refused.stdout  # nothing read through it
    assert snapshot_files(real) == before
    assert path.is_symlink()


@pytest.mark.parametrize("loose", [
    ".intloom", ".intloom/logs", ".intloom/runtime", ".intloom/runtime/wal",
    ".intloom/runtime/snap", ".intloom/runtime/snap/live", ".intloom/runtime/snap/done",
])
def test_status_does_not_send_to_a_start_that_refuses_a_loose_state_directory(
    stopped: Project, loose: str
) -> None:
    project = stopped  # started once and stopped
    path = project.root / loose
    path.chmod(0o755)
    refused = project.cli("start")
    assert refused.code == 1, refused.stdout
    status = project.cli("status")
    assert status.code == 0, status.stderr  # offline is still a diagnosis
    # "Run intloom start" alone sent people to the refusal above: status says why first.
    assert f"{path} has mode 0755" in status.stdout, status.stdout
    assert f"Run chmod 700 {path}" in status.stdout, status.stdout
    assert ok(project.cli("status", "--json"))["status"] == "offline"  # the document as is
    path.chmod(0o700)
    assert "mode" not in project.cli("status").stdout
    ok(project.cli("start", "--json"))
    ok(project.cli("stop", "--json"))


def test_doctor_flags_a_host_log_others_may_read(stopped: Project) -> None:
    """A log holds what the Runs did (Step errors, reasons); DESIGN: every file is 0600. No
    start reads an old log again, so doctor is the only one to tell."""
    project = stopped  # started once and stopped
    [log] = (project.state / "logs").iterdir()
    sealed = log.stat().st_mode & 0o777
    log.chmod(0o644)
    doctor = project.cli("doctor", "--json")
    assert doctor.code == 3, doctor.stdout
    [check] = [c for c in doctor.json["checks"] if c["id"] == "runtime_dir"]
    assert check["status"] == "attention", check
    assert f"{log} has mode 0644" in check["message"], check
    assert log.stat().st_mode & 0o777 == 0o644  # reported, never "fixed"
    _pasted(check["next"], r"Run (chmod .+?) \(", project.root)
    assert log.stat().st_mode & 0o077 == 0
    [check] = [c for c in project.cli("doctor", "--json").json["checks"]
               if c["id"] == "runtime_dir"]
    assert check["status"] == "ok", check
    assert sealed & 0o077 == 0


def test_start_lists_a_damaged_snapshot_it_read_past(project: Project) -> None:
    ok(project.cli("start", "--json"))
    run = ok(project.cli("flow", "example", "--intent", "i", "--json"))["run"]
    ok(project.cli("stop", "--json"))  # the stop snapshots the waiting Run
    [snap] = (project.state / "runtime" / "snap" / "live").iterdir()
    data = bytearray(snap.read_bytes())
    data[len(data) // 2] ^= 0xFF
    snap.write_bytes(bytes(data))
    service = ok(project.cli("start", "--json"))["service"]
    [problem] = service["storeProblems"]
    assert problem["path"] == f"snap/live/{snap.name}" and problem["kind"] == "corrupt", problem
    assert service["restore"]["waiting"] == [run["runId"]]  # judged from the log instead
    ok(project.cli("stop", "--json"))
    text = project.cli("start")
    assert f"Store file .intloom/runtime/snap/live/{snap.name} · corrupt: " in text.stdout, (
        text.stdout)
    assert snap.read_bytes() == bytes(data)


def _plant(kind: str, snap: Path, outside: Path) -> str:
    """Make one Run's snapshot file unusable as ``kind`` says; the fact a reader states."""
    if kind == "symlink":  # to a good copy of itself: still never followed
        outside.write_bytes(snap.read_bytes())
        outside.chmod(0o600)
        snap.unlink()
        snap.symlink_to(outside)
        return "is a symbolic link; intloom never follows links"
    if kind in ("directory", "fifo"):
        snap.unlink()
        if kind == "directory":
            snap.mkdir(mode=0o700)
        else:
            os.mkfifo(snap, 0o600)
        return "is not a regular file"
    if kind == "mode-0644":
        snap.chmod(0o644)
        return "has mode 0644; private files must be 0600"
    os.chown(snap, 12345, -1)
    return "is owned by uid 12345, not by you"


def _as_is(path: Path) -> tuple[object, ...]:
    st = os.lstat(path)
    body = (os.readlink(path) if os.path.islink(path) else
            path.read_bytes() if path.is_file() else None)
    return st.st_mode, st.st_uid, st.st_ino, st.st_size, st.st_mtime_ns, body


@pytest.mark.parametrize("kind", ["symlink", "directory", "fifo", "mode-0644", "other-owner"])
def test_one_unusable_snapshot_holds_back_no_run(
    three_waiting: tuple[Project, list[dict[str, Any]]], kind: str
) -> None:
    """One Run's snap/live/ file a link, a directory, a FIFO, open to others or another
    user's refused the whole store (STORAGE_ERROR at start, inspect and verify; status
    and doctor said start refuses): no Run restored. It is judged as a damaged snapshot
    is: reported with its fact and fix, never opened nor written over, and every Run (its
    own from the log) restores, by start, doctor, inspect and verify alike."""
    if kind == "other-owner" and os.getuid() != 0:
        pytest.skip("chown to another user needs root")
    from intloom.store.reader import verify_report
    from intloom.store.snapshots import snapshot_name

    project, runs = three_waiting  # stopped, three Runs waiting, snapshotted by the stop
    victim = runs[1]
    name = snapshot_name(victim["runId"])
    rel = f"snap/live/{name}"
    snap = project.state / "runtime" / rel
    outside = project.root.parent / "outside.snap"
    fact = _plant(kind, snap, outside)
    planted = _as_is(snap)
    copy = outside.read_bytes() if kind == "symlink" else None
    waiting = sorted(run["runId"] for run in runs)

    doctor = project.cli("doctor", "--json").json
    checks = {check["id"]: check for check in doctor["checks"]}
    assert checks["runtime_dir"]["status"] == "ok", checks["runtime_dir"]
    journals = checks["journals"]
    assert journals["status"] == "attention" and f"{rel} is corrupt: {fact}" in (
        journals["message"]), journals
    assert "3 verified, 0 corrupt" in journals["message"], journals
    assert "start refuses" not in project.cli("status").stdout

    inspected = ok(project.cli("inspect", victim["runId"], "--json"))
    assert inspected["run"]["status"] == "waiting", inspected["run"]
    assert [(f["path"], f["kind"]) for f in inspected["files"]] == [(rel, "corrupt")]
    report = verify_report(project.state / "runtime")
    assert sorted((j.run_id, j.status) for j in report.runs) == [(r, "ok") for r in waiting]
    [finding] = [f for f in report.files if f.path == rel]
    assert finding.problem.startswith(f"{fact}; every segment was read instead"), finding

    for _ in range(2):  # and again after a stop whose compaction passed the file by
        service = ok(project.cli("start", "--json"))["service"]
        assert [(p["path"], p["kind"]) for p in service["storeProblems"]] == [
            (rel, "corrupt")], service["storeProblems"]
        assert fact in service["storeProblems"][0]["problem"]
        assert sorted(service["restore"]["waiting"]) == waiting, service["restore"]
        listed = {r["runId"]: r for r in ok(project.cli("runs", "--json"))["runs"]}
        assert listed[victim["runId"]]["pendingAction"] == victim["pendingAction"]
        ok(project.cli("stop", "--json"))
        assert _as_is(snap) == planted  # never opened, replaced or "repaired"
        if copy is not None:
            assert outside.read_bytes() == copy


@pytest.mark.parametrize("kind", ["symlink", "directory", "fifo", "mode-0644", "other-owner"])
def test_an_unusable_manifest_holds_back_no_run(
    three_waiting: tuple[Project, list[dict[str, Any]]], kind: str
) -> None:
    """runtime/manifest.json a link, a directory, a FIFO, open to others or another user's
    refused the whole store (STORAGE_ERROR at start and inspect): no Run restored. The
    manifest only says which segments a restore may skip, so it is read past as a damaged
    one is: reported, never opened nor written over, every segment read instead."""
    if kind == "other-owner" and os.getuid() != 0:
        pytest.skip("chown to another user needs root")
    project, runs = three_waiting  # stopped, three Runs waiting, snapshotted by the stop
    manifest = project.state / "runtime" / "manifest.json"
    outside = project.root.parent / "outside.json"
    fact = _plant(kind, manifest, outside)
    planted = _as_is(manifest)
    copy = outside.read_bytes() if kind == "symlink" else None
    waiting = sorted(run["runId"] for run in runs)

    checks = {c["id"]: c for c in project.cli("doctor", "--json").json["checks"]}
    assert checks["runtime_dir"]["status"] == "ok", checks["runtime_dir"]
    assert checks["journals"]["status"] == "attention", checks["journals"]
    assert f"manifest.json is corrupt: {fact}" in checks["journals"]["message"]
    assert "3 verified, 0 corrupt" in checks["journals"]["message"], checks["journals"]
    assert "start refuses" not in project.cli("status").stdout
    inspected = ok(project.cli("inspect", runs[0]["runId"], "--json"))
    assert inspected["run"]["status"] == "waiting", inspected["run"]
    for _ in range(2):  # and again after a stop that wrote no manifest over it
        service = ok(project.cli("start", "--json"))["service"]
        assert [(p["path"], p["kind"]) for p in service["storeProblems"]] == [
            ("manifest.json", "corrupt")], service["storeProblems"]
        assert fact in service["storeProblems"][0]["problem"]
        assert sorted(service["restore"]["waiting"]) == waiting, service["restore"]
        ok(project.cli("stop", "--json"))
        assert _as_is(manifest) == planted
        if copy is not None:
            assert outside.read_bytes() == copy


def test_a_segment_no_start_reads_that_is_not_private_is_a_finding_not_a_refusal(
        project: Project) -> None:
    """A start never reads the old segment again, so neither does inspect: it names it as a
    finding of every Run's inspect (before 2026-12-02 it refused them all with
    STORAGE_ERROR). A segment a start reads stays refused by both."""
    ok(project.cli("start", "--json"))
    run = ok(project.cli("flow", "example", "--intent", "i", "--json"))["run"]
    ok(project.cli("stop", "--json"))
    ok(project.cli("start", "--json"))
    later = ok(project.cli("flow", "example", "--intent", "j", "--json"))["run"]
    first, current = sorted((project.state / "runtime" / "wal").iterdir())[:2]
    first.chmod(0o644)
    doctor = project.cli("doctor", "--json")
    [check] = [c for c in doctor.json["checks"] if c["id"] == "runtime_dir"]
    assert check["status"] == "attention", check
    assert f"{first} has mode 0644" in check["message"]
    assert f"chmod 600 {first}" in check["next"]
    for run_id in (run["runId"], later["runId"]):
        inspected = ok(project.cli("inspect", run_id, "--json"))
        [finding] = inspected["files"]
        assert (finding["path"], finding["kind"]) == (f"wal/{first.name}", "corrupt")
        assert finding["problem"].startswith("has mode 0644; private files must be 0600; it "
                                             "was not read"), finding
        assert f"chmod 600 {first}" in finding["problem"]
        assert inspected["run"]["status"] == "waiting", inspected["run"]
    # The Run whose records it holds: not shown, named as not read, restored from its
    # snapshot; the file is kept as it is.
    old = ok(project.cli("inspect", run["runId"], "--json"))
    assert f"not read: wal/{first.name}" in old["run"]["problem"], old["run"]
    assert old["run"]["restoreVerdict"] == "ok"
    assert first.stat().st_mode & 0o777 == 0o644
    project.kill_host()  # the segment it wrote stays one the next start reads
    ok(project.cli("recover", "--json"))
    current.chmod(0o644)  # so both refuse it
    assert project.cli("start", "--json").json["error"]["code"] == "STORAGE_ERROR"
    refused = project.cli("inspect", later["runId"], "--json")
    assert refused.json["error"]["code"] == "STORAGE_ERROR", refused.stdout
    assert f"chmod 600 {current}" in refused.json["error"]["message"]


def test_a_damaged_segment_put_back_from_a_copy_lets_the_held_run_go_on(
    project: Project,
) -> None:
    """What JOURNAL_CORRUPT advises: put back a copy of the file from before the damage and
    restart. The first start held the Run (and snapshotted it as corrupt); the start after
    the copy is back must restore it, and its answer must go through."""
    run_id, action = started_waiting(project, "example", "i")
    project.kill_host()  # the segment stays unsealed: the next start reads it
    assert ok(project.cli("recover", "--json"))["recovered"] is True
    wal = project.state / "runtime" / "wal"
    [segment] = [p for p in sorted(wal.iterdir())
                 if any(f.run_id == run_id for f in scan_segment(p.name, 0, p.read_bytes()).frames)]
    good = segment.read_bytes()
    last = [f for f in scan_segment(segment.name, 0, good).frames if f.run_id == run_id][-1]
    damaged = bytearray(good)
    damaged[last.end - 3] ^= 0xFF
    segment.write_bytes(bytes(damaged))

    held = ok(project.cli("start", "--json"))["service"]["restore"]
    assert held["needsAttention"] == [run_id], held
    # --strict is not silently dropped for the host already running without it.
    strict = project.cli("start", "--strict", "--json")
    assert strict.code == 1, strict.stdout
    error = strict.json["error"]
    assert error["code"] == "CLI_SERVICE_CONFLICT", error
    assert f"1 Run(s) it did not restore (first: {run_id})" in error["message"], error
    assert "1 damaged file(s)" in error["message"], error
    assert ok(project.cli("status", "--json"))["service"]["pid"] == project.host_pid()
    refused = project.cli("answer", run_id, action, '{"isConfirmed": true}', "--json")
    assert refused.json["error"]["code"] == "JOURNAL_CORRUPT", refused.stdout
    assert "put it back" in refused.json["error"]["message"]
    ok(project.cli("stop", "--json"))
    assert segment.read_bytes() == bytes(damaged)  # kept as it was found

    segment.write_bytes(good)
    restored = ok(project.cli("start", "--json"))["service"]["restore"]
    assert restored["waiting"] == [run_id] and not restored.get("needsAttention"), restored
    answered = ok(project.cli("answer", run_id, action, '{"isConfirmed": true}', "--json"))
    assert answered["run"]["status"] == "completed", answered
    ok(project.cli("stop", "--json"))


def test_a_project_path_that_is_not_utf8_is_refused_with_its_name(tmp_path: Path) -> None:
    """A directory name with bytes that are not UTF-8 (a Latin-1 archive): init scaffolded
    it, then start failed as CLI_INTERNAL_ERROR ("The host failed while starting", exit 70)
    with an empty host log left behind, and status --json also failed with exit 70. Both now
    refuse, naming the path and the fix, and write nothing."""
    bad = Path(os.fsdecode(os.fsencode(tmp_path) + b"/bad\xffname"))
    cli = Project(root=bad)
    init = cli.cli("init", str(bad), "--json")
    assert init.code == 1, (init.stdout, init.stderr)
    assert init.json["error"]["code"] == "CLI_INIT_TARGET_INVALID"
    assert "bad\\xffname is not valid UTF-8" in init.json["error"]["message"]
    assert not os.path.lexists(bad)
    shutil.copytree(FIXTURES / "projects" / "basic", bad)
    before = snapshot_files(bad)
    for args in (("start", "--json"), ("status", "--json"), ("doctor", "--json")):
        result = cli.cli(*args)
        assert result.code == 1, (args, result.stdout, result.stderr)
        error = result.json["error"]
        assert error["code"] == "CLI_PROJECT_INVALID", error
        assert "Rename the directory" in error["message"], error
    text = cli.cli("start")
    assert text.code == 1 and "Failure · CLI_PROJECT_INVALID" in text.stderr, text.stderr
    assert not os.path.lexists(bad / ".intloom")
    assert snapshot_files(bad) == before


def _deep_dir(parent: Path, length: int) -> Path:
    """A directory whose absolute path is ``length`` bytes: valid, but near PATH_MAX."""
    path = str(parent)
    while len(path) < length:
        path = os.path.join(path, "d" * max(1, min(200, length - len(path) - 1)))
    os.makedirs(path)
    return Path(path)


def test_a_project_path_too_long_for_its_state_files_is_refused_by_init_and_start(
        tmp_path: Path) -> None:
    """A root of ~4,000 bytes is a valid path, but the files intloom writes under it (a
    snapshot's temp file adds 119 bytes) are not: start failed STORAGE_ERROR "... (File name
    too long) ... Check the disk", or, a little shorter, started and failed later, when a
    Run's snapshot was written. init and start refuse it, naming the path, its length, the
    OS limit and the fix; nothing is written."""
    deep = _deep_dir(tmp_path, 4000)
    root = deep / "p"
    cli = Project(root=root)
    init = cli.cli("init", str(root), "--json")
    assert init.code == 1, (init.stdout, init.stderr)
    assert init.json["error"]["code"] == "CLI_INIT_TARGET_INVALID"
    assert not os.path.lexists(root)
    shutil.copytree(FIXTURES / "projects" / "basic", root)
    before = snapshot_files(root)
    start = cli.cli("start", "--json")
    assert start.code == 1, (start.stdout, start.stderr)
    error = start.json["error"]
    assert error["code"] == "CLI_PROJECT_INVALID", error
    length = len(os.fsencode(str(root)))
    assert f"{root} is {length:,} bytes long" in error["message"], error
    assert "4,096" in error["message"] and "shorter path" in error["message"], error
    assert init.json["error"]["message"].startswith(f"{root} is {length:,} bytes long")
    assert not os.path.lexists(root / ".intloom")
    assert snapshot_files(root) == before
    # status and doctor said "offline. Run intloom start" and "intloom start creates it".
    status = cli.cli("status", "--json")
    assert "intloom start refuses this project" in status.json["message"], status.stdout
    assert f"{root} is {length:,} bytes long" in status.json["message"], status.stdout
    doctor = cli.cli("doctor", "--json")
    [runtime_dir] = [c for c in doctor.json["checks"] if c["id"] == "runtime_dir"]
    assert runtime_dir["status"] == "attention", runtime_dir
    assert "shorter path" in runtime_dir["next"], runtime_dir
    assert snapshot_files(root) == before
    # A root just short enough starts, and its Run's snapshot (written by the restore of
    # the next start, through a temp file of exactly 4,095 bytes) is written.
    ok_root = _deep_dir(tmp_path / "ok", 4095 - 119)
    shutil.rmtree(ok_root)
    shutil.copytree(FIXTURES / "projects" / "basic", ok_root)
    fits = Project(root=ok_root)
    try:
        started_waiting(fits)
        ok(fits.cli("stop", "--json"))
        ok(fits.cli("start", "--json"))
        ok(fits.cli("stop", "--json"))
        assert list((fits.state / "runtime" / "snap" / "live").glob("*.snap"))
    finally:
        fits.track_host()
        fits.reap()


def _as_plain_user() -> list[str]:
    """A command prefix under which file modes bind this process (root without the
    capabilities that override them), or skip."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("root without setpriv: file modes do not bind")
    caps = "-dac_override,-dac_read_search"
    return [setpriv, "--bounding-set", caps, "--inh-caps", caps]


@pytest.mark.parametrize("where", [".intloom", ".intloom/logs", ".intloom/runtime/wal"])
def test_doctor_reports_a_state_directory_it_cannot_write(
    stopped: Project, where: str,
) -> None:
    """A .intloom/ directory made read-only (0500): start fails (STORAGE_ERROR,
    LOG_WRITE_FAILED), yet doctor said "ok: ... are private directories (0700) of yours"
    and exited 0. It now names the directory, its mode and the fix, and exits 3."""
    project = stopped  # started once and stopped
    path = project.root / where
    prefix = _as_plain_user()
    env = {**os.environ, "NO_COLOR": "1"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*prefix, sys.executable, "-m", "intloom", "--project", str(project.root), *args],
            capture_output=True, text=True, timeout=60, env=env)

    path.chmod(0o500)
    try:
        before = snapshot_files(project.root)
        doctor = cli("doctor", "--json")
        status = cli("status")
        assert snapshot_files(project.root) == before
        started = cli("start", "--json")
    finally:
        path.chmod(0o700)
        project.track_host()
    assert started.returncode == 1, started.stdout  # the fact doctor must not call ok
    assert doctor.returncode == 3, doctor.stdout
    [check] = [c for c in json.loads(doctor.stdout)["checks"] if c["id"] == "runtime_dir"]
    assert check["status"] == "attention", check
    assert f"{path} is not writable by you (mode 0500)" in check["message"], check
    assert f"chmod 700 {path}" in check["next"], check
    # status's "Run intloom start" came with no word of it (its hint knew loose modes only).
    assert status.returncode == 0, status.stderr
    assert (f"But intloom start fails on the project as it is: {path} is not writable by you "
            "(mode 0500)") in status.stdout, status.stdout
    assert f"Run chmod 700 {path}." in status.stdout, status.stdout
    assert ok(project.cli("doctor", "--json"))["health"] == "healthy"


def test_doctor_and_status_report_a_root_where_the_first_start_cannot_create_its_state(
        tmp_path: Path) -> None:
    """A project never started whose root this user may not write (0500): doctor said "ok:
    No .intloom/ yet; intloom start creates it" (exit 0) and status "Run intloom start",
    which then failed STORAGE_ERROR. Both now name the root, its mode and the fix."""
    prefix = _as_plain_user()
    root = make_project(tmp_path / "proj").root
    env = {**os.environ, "NO_COLOR": "1"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*prefix, sys.executable, "-m", "intloom", "--project", str(root), *args],
            capture_output=True, text=True, timeout=60, env=env)

    root.chmod(0o500)
    try:
        doctor = cli("doctor", "--json")
        status = cli("status")
    finally:
        root.chmod(0o755)
    assert not (root / ".intloom").exists()
    assert doctor.returncode == 3, doctor.stdout
    [check] = [c for c in json.loads(doctor.stdout)["checks"] if c["id"] == "runtime_dir"]
    assert check["status"] == "attention", check
    assert check["message"].startswith(
        f"No .intloom/ yet, and intloom start cannot create it: {root} is not writable by "
        "you (mode 0500)"), check
    assert f"chmod 700 {root}" in check["next"], check
    assert status.returncode == 0, status.stderr
    assert (f"But intloom start fails on the project as it is: {root} is not writable by you "
            "(mode 0500)") in status.stdout, status.stdout


def test_init_through_a_link_to_a_directory_that_is_not_utf8_writes_nothing(
        tmp_path: Path) -> None:
    """init checked the path as given, not where it leads: through a UTF-8 symlink to a
    directory whose name is not UTF-8 it scaffolded the project (every later command refuses
    it, CLI_PROJECT_INVALID) and init --json failed as CLI_INTERNAL_ERROR (exit 70)."""
    bad = Path(os.fsdecode(os.fsencode(tmp_path) + b"/bad\xffname"))
    bad.mkdir()
    link = tmp_path / "link"
    link.symlink_to(bad)
    init = Project(root=link).cli("init", str(link), "--json")
    assert init.code == 1, (init.stdout, init.stderr)
    assert init.json["error"]["code"] == "CLI_INIT_TARGET_INVALID", init.json
    assert "bad\\xffname is not valid UTF-8" in init.json["error"]["message"]
    assert os.listdir(bad) == []


def _pasted(message: str, pattern: str, cwd: Path) -> None:
    """Run the command ``message`` gives (matched by ``pattern``) as a person pastes it."""
    import re

    found = re.search(pattern, message)
    assert found, message
    done = subprocess.run(["sh", "-c", found.group(1)], cwd=cwd, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, (found.group(1), done.stderr)


def test_the_fixes_messages_give_paste_into_a_shell_for_a_path_with_spaces(
    tmp_path: Path,
) -> None:
    root = tmp_path / "my prøject é"  # a space and non-ASCII letters, as people name them
    shutil.copytree(FIXTURES / "projects" / "basic", root)
    project = Project(root=root)
    try:
        ok(project.cli("start", "--json"))
        ok(project.cli("stop", "--json"))
        connection = project.state / "connection.json"

        service = project.state / "service.json"
        service.write_text("{}")
        service.chmod(0o644)
        refused = project.cli("status", "--json")
        assert refused.code == 1, refused.stdout
        _pasted(refused.json["error"]["message"], r"Run (chmod .+?), then try again", tmp_path)
        assert service.stat().st_mode & 0o777 == 0o600
        service.unlink()
        connection.chmod(0o644)  # a token others could read: moved aside, not chmod'ed
        refused = project.cli("status", "--json")
        assert refused.code == 1, refused.stdout
        _pasted(refused.json["error"]["message"], r"\((mv .+?)\) before the next", tmp_path)
        assert (project.state / "connection.json.exposed").is_file()
        ok(project.cli("start", "--json"))  # a new token
        ok(project.cli("stop", "--json"))

        real = tmp_path / "elsewhere"
        project.state.rename(real)
        project.state.symlink_to(real)
        doctor = project.cli("doctor", "--json")
        [check] = [c for c in doctor.json["checks"] if c["id"] == "runtime_dir"]
        # The directory it leads to is put in its place (moved aside, the link left the
        # next start a new, empty .intloom/).
        _pasted(check["next"], r"\((rm .+?; mv .+?)\)", tmp_path)
        assert project.state.is_dir() and not project.state.is_symlink()
        assert connection.is_file() and not real.exists()

        saved = json.loads(connection.read_text())
        connection.write_text(json.dumps({**saved, "projectRoot": str(tmp_path / "old")}))
        connection.chmod(0o600)
        moved = project.cli("start", "--json")
        assert moved.code == 1, moved.stdout
        _pasted(moved.json["error"]["message"], r"\((mv .+?)\)", tmp_path)
        assert (project.state / "connection.json.moved").is_file()
        ok(project.cli("start", "--json"))
        ok(project.cli("stop", "--json"))
    finally:
        project.track_host()
        project.reap()


def test_a_root_behind_a_directory_that_refuses_search_names_its_permissions(
        tmp_path: Path) -> None:
    """A project under a directory this user may not search (EACCES): Client.connect said
    "Client.connect takes a project's root, the directory that holds intloom.toml", and the
    CLI "Pass the project's root to --project", of a path that is the root. Both now name
    the directory that refuses, its mode and owner, and the chmod that lets it be searched."""
    prefix = _as_plain_user()
    locked = tmp_path / "locked"
    root = make_project(locked).root
    if os.geteuid() == 0:
        os.chown(locked, 65534, -1)  # another user's 0700 directory
    locked.chmod(0o700 if os.geteuid() == 0 else 0o600)
    connect = ("from intloom.client.client import Client\n"
               "try:\n    Client.connect(__import__('sys').argv[1])\n"
               "except Exception as exc:\n    print(exc.code, exc.message)\n")
    try:
        said = subprocess.run([*prefix, sys.executable, "-c", connect, str(root)],
                              capture_output=True, text=True, timeout=60, check=True).stdout
        cli = subprocess.run([*prefix, sys.executable, "-m", "intloom", "--project", str(root),
                              "status", "--json"], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "NO_COLOR": "1"})
    finally:
        locked.chmod(0o700)
        if os.geteuid() == 0:
            os.chown(locked, 0, -1)
    bit = "o+x" if os.geteuid() == 0 else "u+x"
    fact = f"{locked} (mode 0700" if os.geteuid() == 0 else f"{locked} (mode 0600"
    assert said.startswith("CLI_PROJECT_INVALID "), said
    assert fact in said and f"chmod {bit} {locked}" in said, said
    assert "takes a project's root" not in said, said
    assert cli.returncode == 1, cli.stdout
    message = json.loads(cli.stdout)["error"]["message"]
    assert fact in message and f"chmod {bit} {locked}" in message, message
    assert "Pass the project's root" not in message, message


@pytest.mark.parametrize("kind", ["directory", "symlink"])
def test_start_names_a_service_lock_that_is_no_lock_as_status_does(
        project: Project, kind: str) -> None:
    """A directory (or a link) in service.lock's place: status, stop and doctor said it is
    not a regular file and how to move it aside, but start said "locked, no live host
    answers; use intloom recover only after its owner has exited" -- and recover refuses
    it, for an owner there is none of."""
    ok(project.cli("start", "--json"))
    ok(project.cli("stop", "--json"))
    lock = project.state / "service.lock"
    if kind == "directory":
        lock.mkdir(mode=0o700)
    else:
        lock.symlink_to(project.root / "nowhere")
    planted = _as_is(lock)
    said = {}
    for command in ("start", "status", "stop"):
        result = project.cli(command, "--json")
        assert result.code != 0, (command, result.stdout)
        error = json.loads(result.stdout)["error"]
        said[command] = (error["code"], error["message"])
    assert said["start"] == said["status"] == said["stop"], said
    code, message = said["start"]
    assert code == "CLI_SERVICE_METADATA_INVALID", said
    assert "Move it aside (mv " in message and "locked" not in message, message
    assert _as_is(lock) == planted
