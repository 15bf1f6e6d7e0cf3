"""Write failures at the host's metadata, the store's snapshots and manifest, and the log.

* ``service.lock``, ``connection.json``, ``service.json``: the start fails with STORAGE_ERROR
  naming the file; what is on disk is the previous file or nothing -- never part of a write,
  never a leftover temp file -- and the next start works with the same token.
* snapshots and the manifest (written at stop): the stop still completes; the next start
  reads more of the log instead, and every Run comes back as it was.
* the log: a host whose log fails suspends its Runs at their boundaries, refuses new work
  with LOG_WRITE_FAILED and keeps answering status and reads; the next start resumes them.

Faults come only from explicit hooks: ``INTLOOM_TEST_WRITE_FAULT=GLOB=ERRNO`` (every atomic
replacement of a matching file fails after half its bytes) and
``INTLOOM_TEST_LOG_FAIL_AT=EVENT`` (log lines from that event on fail with ENOSPC).
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import socket
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from intloom.client.client import Client
from intloom.client.lifecycle import start_service, stop_service
from intloom.errors import IntloomError
from intloom.host.metadata import read_connection
from intloom.store import verify_report
from tests.helpers import Project, snapshot_files
from tests.integration.host_support import hello_frame, reply, start

pytestmark = pytest.mark.e2e


def _leftovers(state: Path) -> list[str]:
    """Temp files of an interrupted atomic write, anywhere under .intloom/."""
    return sorted(str(p.relative_to(state)) for p in state.rglob(".*.tmp"))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _failed_start(project: Project, **kwargs: object) -> IntloomError:
    with pytest.raises(IntloomError) as failed:
        start_service(project.root, timeout=30, **kwargs)  # type: ignore[arg-type]
    project.track_host()
    error = failed.value
    assert error.code == "STORAGE_ERROR", error
    assert "Traceback" not in error.message
    # Released on the way out: no lock, no service.json, no temp file.
    assert not (project.state / "service.lock").exists()
    assert not (project.state / "service.json").exists()
    assert _leftovers(project.state) == []
    return error


@pytest.mark.parametrize("name", ["service.lock", "service.json"])
def test_a_failed_service_file_write_fails_the_start_and_leaves_no_part_of_it(
    project: Project, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    start(project)
    assert stop_service(project.root)
    connection = (project.state / "connection.json").read_bytes()
    monkeypatch.setenv("INTLOOM_TEST_WRITE_FAULT", f"{name}=ENOSPC")
    error = _failed_start(project)
    assert name in error.message and "No space left on device" in error.message
    assert (project.state / "connection.json").read_bytes() == connection
    monkeypatch.delenv("INTLOOM_TEST_WRITE_FAULT")
    service = start(project).service
    with Client.connect(project.root) as client:
        assert client.status().instance_id == service.instance_id


def test_a_failed_connection_write_keeps_the_previous_file_byte_identical(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = start(project).service
    assert stop_service(project.root)
    before = (project.state / "connection.json").read_bytes()
    monkeypatch.setenv("INTLOOM_TEST_WRITE_FAULT", "connection.json=EIO")
    # A new port makes the host rewrite connection.json; that write fails half-way.
    error = _failed_start(project, port=_free_port())
    assert "connection.json" in error.message and "Input/output error" in error.message
    assert (project.state / "connection.json").read_bytes() == before
    assert read_connection(project.state / "connection.json", project.root) is not None
    monkeypatch.delenv("INTLOOM_TEST_WRITE_FAULT")
    again = start(project).service
    assert again.port == first.port  # the saved port and token still serve
    assert json.loads(before)["token"] == json.loads(
        (project.state / "connection.json").read_bytes())["token"]


def test_a_first_start_whose_connection_write_fails_leaves_nothing_to_misread(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INTLOOM_TEST_WRITE_FAULT", "connection.json=ENOSPC")
    _failed_start(project)
    assert not (project.state / "connection.json").exists()
    monkeypatch.delenv("INTLOOM_TEST_WRITE_FAULT")
    start(project)
    assert read_connection(project.state / "connection.json", project.root) is not None


@pytest.mark.parametrize("glob", ["*.snap", "manifest.json"])
def test_failed_snapshot_or_manifest_writes_at_stop_lose_nothing(
    soak_project: Project, monkeypatch: pytest.MonkeyPatch, glob: str
) -> None:
    project = soak_project
    monkeypatch.setenv("INTLOOM_TEST_WRITE_FAULT", f"{glob}=EIO")
    start(project)
    with Client.connect(project.root) as client:
        waiting = client.create_run("soak-review", "disk delay=0")
        done = client.create_run("soak-ticker", "disk goal=2 delay=0")
        assert client.wait_run(done.run_id).status == "completed"
    assert waiting.pending_action is not None
    runtime = project.state / "runtime"

    def hit() -> dict[str, bytes]:
        return {k: v for k, v in snapshot_files(runtime).items()
                if fnmatch.fnmatchcase(Path(k).name, glob)}

    before = hit()
    assert stop_service(project.root)  # the failed writes do not block the stop
    assert hit() == before  # none was replaced, none appeared half-written
    assert _leftovers(project.state) == []
    monkeypatch.delenv("INTLOOM_TEST_WRITE_FAULT")
    start(project)  # reads the log the snapshots would have summarised
    with Client.connect(project.root) as client:
        again = client.get_run(waiting.run_id)
        assert again.status == "waiting" and again.pending_action == waiting.pending_action
        assert done.run_id not in {r.run_id for r in client.runs()}
        finished = client.answer(waiting.run_id, waiting.pending_action.id, {"isConfirmed": True})
        assert finished.status == "completed"
    report = verify_report(runtime)
    assert [r for r in report.runs if r.status != "ok"] == [] and report.files == []
    counts = Counter((project.root / "counters.log").read_text().splitlines())
    assert max(counts.values()) == 1


@pytest.mark.parametrize(("glob", "what"), [("*.snap", "snapshots"),
                                            ("manifest.json", "manifest.json")])
def test_failed_snapshot_or_manifest_writes_are_logged(
    soak_project: Project, monkeypatch: pytest.MonkeyPatch, glob: str, what: str
) -> None:
    """The store swallowed these failures (correctly: the next start reads more of the log),
    and nothing said so: no log line at the start's manifest, none at the stop's, so a disk
    refusing them went unnoticed until restarts grew slow."""
    project = soak_project
    monkeypatch.setenv("INTLOOM_TEST_WRITE_FAULT", f"{glob}=EIO")
    service = start(project).service
    with Client.connect(project.root) as client:
        waiting = client.create_run("soak-review", "disk delay=0")
    assert waiting.status == "waiting"
    assert stop_service(project.root)
    assert service.log_file is not None
    lines = [json.loads(line) for line in
             (project.state / "logs" / service.log_file).read_text().splitlines()]
    failed = [line for line in lines if line["event"] == "store_compaction_failed"]
    when = [line["when"] for line in failed]
    assert when == (["open", "stop"] if what == "manifest.json" else ["stop"]), failed
    for line in failed:
        assert line["level"] == "warning" and line["what"] == what, line
        assert "Input/output error" in line["cause"], line
        assert "The next start reads more of the log instead" in line["effect"], line
    events = [line["event"] for line in lines]
    assert events.index("store_compaction_failed", events.index("service_stopping")) < (
        events.index("log_closed")), events


# ----- the log -------------------------------------------------------------------------------


def test_a_log_that_cannot_be_written_suspends_runs_and_refuses_new_work(
    soak_project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = soak_project
    # The first refused connection is the moment the log starts failing.
    monkeypatch.setenv("INTLOOM_TEST_LOG_FAIL_AT", "connection_refused")
    service = start(project).service
    with Client.connect(project.root) as client:
        waiting = client.create_run("soak-review", "log delay=0")
        busy = client.create_run("soak-ticker", "log goal=100 delay=0.01", wait=False)
    assert waiting.pending_action is not None
    with socket.create_connection(("127.0.0.1", service.port), timeout=10) as sock:
        sock.sendall(hello_frame("x" * 43))
        reply(sock)  # UNAUTHORIZED, and the log line about it cannot be written

    with Client.connect(project.root) as client:
        status = client.status()  # still answered
        assert status.instance_id == service.instance_id
        assert status.log_error is not None and service.log_file is not None
        assert service.log_file in status.log_error
        action_id = waiting.pending_action.id  # asserted not None above
        attempts: tuple[Callable[[], object], ...] = (
            lambda: client.create_run("soak-ticker", "log goal=1"),
            lambda: client.answer(waiting.run_id, action_id, {"isConfirmed": True}),
        )
        for attempt in attempts:
            with pytest.raises(IntloomError) as refused:
                attempt()
            assert refused.value.code == "LOG_WRITE_FAILED"
            assert "intloom stop" in refused.value.message
        # Reads go on; the Runs were suspended (not cancelled), naming the log.
        for run_id in (waiting.run_id, busy.run_id):
            view = client.wait_run(run_id)
            assert view.status == "failed" and view.last_error is not None
            assert view.last_error.code == "RUN_INTERRUPTED"
            assert "log" in view.last_error.message
    assert stop_service(project.root)
    monkeypatch.delenv("INTLOOM_TEST_LOG_FAIL_AT")
    restored = start(project).service.restore
    assert restored is not None and waiting.run_id in restored.waiting
    assert busy.run_id in restored.resumed + restored.interrupted
    with Client.connect(project.root) as client:
        again = client.get_run(waiting.run_id)
        assert again.pending_action == waiting.pending_action  # the same wait, not a new one
        done = client.answer(waiting.run_id, waiting.pending_action.id, {"isConfirmed": True})
        assert done.status == "completed"
        if busy.run_id in restored.resumed:
            assert client.wait_run(busy.run_id).status == "completed"
    counts = Counter((project.root / "counters.log").read_text().splitlines())
    assert max(counts.values()) == 1  # suspended, resumed: nothing ran twice


def test_a_log_whose_first_line_fails_fails_the_start_and_leaves_no_log(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A full disk: the log file is created, its first line (log_opened) is refused.
    monkeypatch.setenv("INTLOOM_TEST_LOG_FAIL_AT", "log_opened")
    for _ in range(2):
        with pytest.raises(IntloomError) as failed:
            start_service(project.root, timeout=30)
        project.track_host()
        assert failed.value.code == "LOG_WRITE_FAILED"
        assert "its first line cannot be written" in failed.value.message
    assert list((project.state / "logs").iterdir()) == []  # no empty sealed log per attempt
    assert not (project.state / "service.lock").exists()


def test_a_log_that_fails_while_starting_fails_the_start(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INTLOOM_TEST_LOG_FAIL_AT", "service_starting")
    with pytest.raises(IntloomError) as failed:
        start_service(project.root, timeout=30)
    project.track_host()
    assert failed.value.code == "LOG_WRITE_FAILED"
    assert not (project.state / "service.json").exists()
    assert not (project.state / "service.lock").exists()


# ----- directories that refuse new files (chattr +i: root ignores permission bits) -----------


def _chattr(path: Path, flag: str) -> bool:
    return subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0


@pytest.fixture
def immutable(tmp_path: Path) -> Iterator[Callable[[Path], None]]:
    """Make a directory immutable (EPERM for every new entry), undone at teardown so the
    temporary tree can be removed; skips where chattr cannot set the flag."""
    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed: cannot make a directory refuse new files")
    probe = tmp_path / "chattr-probe"
    probe.mkdir()
    if not _chattr(probe, "+i"):
        pytest.skip("chattr +i is not supported here (needs CAP_LINUX_IMMUTABLE and a "
                    "filesystem with the immutable flag)")
    _chattr(probe, "-i")
    frozen: list[Path] = []

    def freeze(path: Path) -> None:
        assert _chattr(path, "+i"), path
        frozen.append(path)

    try:
        yield freeze
    finally:
        for path in frozen:
            _chattr(path, "-i")


def test_a_state_directory_that_refuses_the_lock_fails_the_start_with_storage_error(
    project: Project, immutable: Callable[[Path], None]
) -> None:
    project.state.mkdir(mode=0o700)
    immutable(project.state)
    result = project.cli("--json", "start", "--timeout", "30")
    assert result.code == 1, result
    error = result.json["error"]
    assert error["code"] == "STORAGE_ERROR", error
    # The thing, the fact and the fix.
    assert "service.lock" in error["message"]
    assert "Operation not permitted" in error["message"]
    # What refuses, read from the file system (fsutil.write_refusal), not "make it writable".
    assert (f"{project.state} is immutable (chattr +i). Clear the flag (lsattr -d "
            f"{project.state} shows it) with chattr -i {project.state}, then start again."
            ) in error["message"], error
    assert sorted(p.name for p in project.state.iterdir()) == []
    subprocess.run(["chattr", "-i", str(project.state)], check=True)
    start(project)


def test_a_log_directory_that_refuses_the_log_fails_the_start_with_log_write_failed(
    project: Project, immutable: Callable[[Path], None]
) -> None:
    (project.state / "logs").mkdir(mode=0o700, parents=True)
    os.chmod(project.state, 0o700)
    immutable(project.state / "logs")
    with pytest.raises(IntloomError) as failed:
        start_service(project.root, timeout=30)
    project.track_host()
    error = failed.value
    assert error.code == "LOG_WRITE_FAILED", error
    assert str(project.state / "logs") in error.message
    logs = project.state / "logs"
    assert "Operation not permitted" in error.message, error
    assert (f"{logs} is immutable (chattr +i). Clear the flag (lsattr -d {logs} shows it) "
            f"with chattr -i {logs}, then start again.") in error.message, error
    # Released on the way out: no lock, no service.json, no temp file, no log.
    assert sorted(p.name for p in project.state.iterdir()) == ["logs"]
    assert list((project.state / "logs").iterdir()) == []
    subprocess.run(["chattr", "-i", str(project.state / "logs")], check=True)
    start(project)


def test_a_journal_whose_wal_refuses_a_new_segment_is_not_told_to_free_disk_space(
    project: Project, immutable: Callable[[Path], None]
) -> None:
    """wal/ and its segments made immutable under a serving host: its next write fails
    (EPERM) and so does the replacement segment, so the journal takes no more checkpoints.
    status gave the fix for a full disk ("free space on the disk that holds
    .intloom/runtime"), where the flag was what to clear."""
    start(project)
    wal = project.state / "runtime" / "wal"
    for segment in sorted(wal.glob("*.seg")):
        immutable(segment)
    immutable(wal)
    with Client.connect(project.root) as client:
        with pytest.raises(IntloomError) as refused:
            client.create_run("example", "refused")
        assert refused.value.code == "RUN_CHECKPOINT_FAILED", refused.value
        assert "intloom status names the cause and what to fix" in refused.value.message
        status = client.status()
    assert status.journal_error is not None and "(EPERM)" in status.journal_error, status
    clear = f"clear the flag (lsattr -d {wal} shows it) with chattr -i {wal}"
    assert status.journal_fix == f"{wal} is immutable (chattr +i): {clear}", status
    line = next(x for x in project.cli("status").stdout.splitlines()
                if x.startswith("Journal error "))
    assert f"run intloom stop; {wal} is immutable (chattr +i): {clear}; then intloom start." \
        in line, line
    assert "free space" not in line, line
    for path in (wal, *wal.glob("*.seg")):
        assert _chattr(path, "-i"), path
    assert project.cli("stop").code == 0


def test_an_answer_to_a_host_whose_journal_is_dead_is_refused_and_the_run_still_waits(
    project: Project, immutable: Callable[[Path], None]
) -> None:
    """Once the journal took no more checkpoints, an answer was taken all the same: its
    checkpoint failed and the Run with it (RUN_CHECKPOINT_FAILED), though the host knew it
    could not be saved. It is refused up front, and the Run still waits."""
    start(project)
    wal = project.state / "runtime" / "wal"
    with Client.connect(project.root) as client:
        waiting = client.create_run("example", "waits")
        assert waiting.status == "waiting" and waiting.pending_action is not None
        for segment in sorted(wal.glob("*.seg")):
            immutable(segment)
        immutable(wal)
        with pytest.raises(IntloomError) as refused:
            client.create_run("example", "breaks the journal")
        assert client.status().journal_error is not None
        with pytest.raises(IntloomError) as answered:
            client.answer(waiting.run_id, waiting.pending_action.id, {"isConfirmed": True})
        message = answered.value.message
        assert answered.value.code == "RUN_CHECKPOINT_FAILED", message
        assert "was not taken" in message and "the Run still waits on it" in message, message
        assert "intloom stop" in message, message
        after = client.get_run(waiting.run_id)
        assert after.status == "waiting", after
        assert after.pending_action == waiting.pending_action
    assert refused.value.code == "RUN_CHECKPOINT_FAILED"
    for path in (wal, *wal.glob("*.seg")):
        assert _chattr(path, "-i"), path
    assert project.cli("stop").code == 0


@pytest.mark.parametrize("stuck", ["service.json", "service.lock"])
def test_recover_that_cannot_remove_a_stale_file_says_which_and_what_was_removed(
    project: Project, immutable: Callable[[Path], None], stuck: str
) -> None:
    """A killed host's files, one of which cannot be removed (immutable here; a read-only
    .intloom for another user): recover failed with CLI_INTERNAL_ERROR (exit 70, "report
    it") and a traceback under --debug -- after removing service.json in the second case."""
    start(project)
    project.kill_host()
    immutable(project.state / stuck)
    result = project.cli("--json", "recover")
    assert result.code == 1, result
    error = result.json["error"]
    assert error["code"] == "STORAGE_ERROR", error
    message = error["message"]
    # The fact the host itself would log (fsutil.unlink_refusal), then its fix.
    assert (f".intloom/{stuck} could not be removed (Operation not permitted): it is "
            "immutable (chattr +i)") in message, message
    removed = "Already removed: .intloom/service.json" if stuck == "service.lock" else (
        "Nothing was removed")
    assert removed in message and "lsattr" in message and "intloom recover" in message
    assert "Make" not in message, message  # the file refuses, not .intloom
    assert f"with chattr -i {project.state / stuck}" in message, message
    subprocess.run(["chattr", "-i", str(project.state / stuck)], check=True)
    assert project.cli("--json", "recover").code == 0  # the rest is removed when run again
    assert not (project.state / "service.lock").exists()
    start(project)


def test_stop_of_a_host_that_could_not_remove_its_service_json_names_it(
    project: Project, immutable: Callable[[Path], None]
) -> None:
    """The host stopped but could not remove its (immutable) service.json: stop said only
    "Cannot verify resource cleanup by the original instance": not which file was left,
    nor that its host had exited after it was asked to stop."""
    service = start(project).service
    immutable(project.state / "service.json")
    result = project.cli("--json", "stop")
    assert result.code == 1, result
    error = result.json["error"]
    assert error["code"] == "CLI_SERVICE_BUSY", error
    message = error["message"]
    assert message.startswith("Cannot verify resource cleanup by the original instance."), message
    assert f"pid {service.pid}" in message, message
    assert "left .intloom/service.json behind" in message, message
    # Why, as its log said before it closed (the next test has the log's line).
    assert "it stopped as asked" in message and "chattr +i" in message, message
    subprocess.run(["chattr", "-i", str(project.state / "service.json")], check=True)
    assert project.cli("--json", "recover").code == 0
    start(project)


def test_a_host_that_cannot_remove_its_service_json_says_why_in_its_log_and_to_stop(
    project: Project, immutable: Callable[[Path], None]
) -> None:
    """Its log is closed before the files go (DESIGN §3), and release's problems went
    nowhere: the log ended with a clean log_closed, and stop could only guess ("crashed
    meanwhile, or could not remove it"). The host now says why in the log, before it closes,
    and stop quotes it."""
    service = start(project).service
    immutable(project.state / "service.json")
    result = project.cli("--json", "stop")
    assert result.code == 1, result
    message = result.json["error"]["message"]
    assert result.json["error"]["code"] == "CLI_SERVICE_BUSY", message
    assert "left .intloom/service.json behind" in message, message
    assert ("its log says: service.json cannot be removed: it is immutable (chattr +i)"
            in message), message
    assert "crashed meanwhile" not in message, message
    assert service.log_file is not None
    lines = [json.loads(line) for line in
             (project.state / "logs" / service.log_file).read_text().splitlines()]
    events = [line["event"] for line in lines]
    assert events[-3:] == ["service_files_kept", "service_stopped", "log_closed"], events
    kept = lines[-3]
    assert kept["level"] == "warning", kept
    assert kept["problems"] == ["service.json cannot be removed: it is immutable (chattr +i)"]
    subprocess.run(["chattr", "-i", str(project.state / "service.json")], check=True)
    assert project.cli("--json", "recover").code == 0
    start(project)


def test_a_foreground_host_that_cannot_remove_its_service_json_says_why(
    project: Project, immutable: Callable[[Path], None]
) -> None:
    """start --foreground then Ctrl-C: it failed CLI_INTERNAL_ERROR (exit 70, "see the log"),
    and the log did not say."""
    import signal

    from tests.helpers import foreground_host

    with foreground_host(project) as proc:
        assert project.cli("--json", "status").json["service"]["pid"] == proc.pid
        immutable(project.state / "service.json")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, (out, err)
    assert "CLI_INTERNAL_ERROR" not in err, err
    assert ("Failure · STORAGE_ERROR: The host stopped, but service.json cannot be removed: "
            "it is immutable (chattr +i)") in err, err
    assert "intloom recover" in err, err
    subprocess.run(["chattr", "-i", str(project.state / "service.json")], check=True)
    assert project.cli("--json", "recover").code == 0


def test_stop_after_a_kill_names_what_the_killed_host_left(project: Project) -> None:
    service = start(project).service
    project.kill_host()
    result = project.cli("--json", "stop")
    assert result.code == 1, result
    message = result.json["error"]["message"]
    assert (f"Its host (pid {service.pid}) has exited and left .intloom/service.json and "
            ".intloom/service.lock behind") in message, message
    assert "killed or crashed" in message, message
