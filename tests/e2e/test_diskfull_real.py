"""A real full disk: a project on a small tmpfs, filled to the last byte by a file beside it.

The fault-injection tests (test_diskfault_*.py) fail a write on purpose; these let the
kernel refuse it, as a user meets it: a log line cut short, a checkpoint refused. Mounting
needs root (and permission to mount): elsewhere they skip, saying so.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from intloom.client.client import Client
from intloom.errors import IntloomError
from tests.helpers import FIXTURES, Project, eventually, reaped
from tests.integration.host_support import hello_frame, reply, start

pytestmark = pytest.mark.e2e


def _tmpfs(prefix: str, options: str) -> Iterator[Path]:
    """A tmpfs mounted with ``options``, unmounted at teardown whatever happened."""
    mount = Path(tempfile.mkdtemp(prefix=prefix))
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        mount.rmdir()
        pytest.skip(f"a real full disk needs a tmpfs mount, and mount was refused "
                    f"({made.stderr.strip() or made.returncode}): run as root to test it")
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            # A process of the test still inside it: detach it now, it goes when they do.
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)
        mount.rmdir()


@pytest.fixture
def small_disk() -> Iterator[Path]:
    """A 2 MiB tmpfs."""
    yield from _tmpfs("intloom-fulldisk-", "size=2m")


@pytest.fixture
def few_inodes() -> Iterator[Path]:
    """A tmpfs with blocks to spare and 40 inodes."""
    yield from _tmpfs("intloom-inodes-", "size=2m,nr_inodes=40")


@pytest.fixture
def full_project(small_disk: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Project]:
    """fixtures/projects/basic on the small disk; its hosts are killed before the unmount.
    Each wrong-token connection is logged (no quiet period): how these tests make the host
    write a log line and no checkpoint. Its segments are not preallocated (``no_preallocate``):
    these tests count the bytes each checkpoint takes of the disk as it fills, and a MiB
    taken ahead of them would move every count (one test below preallocates)."""
    monkeypatch.setenv("INTLOOM_TEST_REFUSED_QUIET", "0")
    monkeypatch.setenv("INTLOOM_FAULT", "no_preallocate=1")
    yield from reaped(basic_project(small_disk / "proj"))


def fill(disk: Path) -> Path:
    """Take every free byte of ``disk`` with one file (removed to free the space again)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    chunk = b"\0" * 65536
    try:
        while True:
            try:
                if os.write(fd, chunk) < len(chunk):
                    chunk = chunk[: max(1, len(chunk) // 2)]
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    return filler
                chunk = chunk[: len(chunk) // 2]
    finally:
        os.close(fd)


def take_inodes(disk: Path, taken: list[Path]) -> None:
    """Take every inode left on ``disk`` with empty files (no block is used), each noted in
    ``taken`` as it is made, so that the test gives them back (``give_back``) whatever
    happens."""
    while True:
        path = disk / f"inode-{len(taken)}"
        try:
            path.touch()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
            return
        taken.append(path)


def give_back(taken: list[Path]) -> None:
    for path in taken:
        path.unlink()
    taken.clear()


def basic_project(root: Path) -> Project:
    """A copy of fixtures/projects/basic at ``root``."""
    shutil.copytree(FIXTURES / "projects" / "basic", root)
    return Project(root=root)


def refused_hello(port: int) -> None:
    """A connection with a wrong token: the host logs it, and writes no checkpoint."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(hello_frame("x" * 43))
        reply(sock)


def log_error(project: Project, port: int) -> str | None:
    refused_hello(port)
    with Client.connect(project.root) as client:
        return client.status().log_error


def test_a_log_line_cut_short_by_a_full_disk_names_no_space_left_on_device(
    full_project: Project, small_disk: Path,
) -> None:
    """A full disk takes the part of a log line that fits and returns the count: the host
    said "only 46 of 177 bytes of a line were written (disk full?)", a guess, not the
    kernel's ENOSPC."""
    service = start(full_project).service
    fill(small_disk)
    error = eventually(lambda: log_error(full_project, service.port), timeout=30,
                       what="a log line to be refused by the full disk")
    assert "No space left on device" in error, error
    assert "disk full?" not in error, error
    assert service.log_file is not None and service.log_file in error


def test_a_stop_whose_log_the_full_disk_cut_promises_no_resumption(
    full_project: Project, small_disk: Path,
) -> None:
    """The disk filled under a host: checkpoints failed, then its log. Its stop's lines
    never reached the log, and the stop said "Unfinished Runs were suspended at their last
    checkpoint ... Run intloom start to resume them", of Runs failed by a checkpoint, which
    the next start reports RUN_INTERRUPTED."""
    service = start(full_project).service
    with Client.connect(full_project.root) as client:
        waiting = client.create_run("example", "kept")
    assert waiting.pending_action is not None
    filler = fill(small_disk)
    failed: list[str] = []  # Runs that got as far as a Step before a checkpoint failed
    with Client.connect(full_project.root) as client:
        for n in range(50):
            try:
                run = client.create_run("example", f"busy {n}")
            except IntloomError as exc:
                assert exc.code in ("RUN_CHECKPOINT_FAILED", "LOG_WRITE_FAILED"), exc
                break
            if run.status == "failed":
                assert run.last_error is not None
                assert run.last_error.code == "RUN_CHECKPOINT_FAILED", run.last_error
                failed.append(run.run_id)
    assert failed, "no Run got as far as a Step before the full disk refused a checkpoint"
    eventually(lambda: log_error(full_project, service.port), timeout=30,
               what="a log line to be refused by the full disk")

    stopped = full_project.cli("stop")
    assert stopped.code == 0, stopped
    assert "resume" not in stopped.stdout, stopped.stdout
    assert stopped.stdout.startswith(
        "The original service instance stopped. Its log does not say what the stop did to "
        "the unfinished Runs"), stopped.stdout
    assert "intloom doctor previews" in stopped.stdout
    assert "Traceback" not in stopped.stdout + stopped.stderr

    doctor = full_project.cli("doctor", "--json")  # offline, on the full disk
    assert "Traceback" not in doctor.stderr, doctor  # exit 3: it needs attention
    preview = {run["runId"]: run["verdict"]["row"] for run in doctor.json["runs"]}
    assert preview[waiting.run_id] == "restore_wait"
    filler.unlink()
    restored = start(full_project).service.restore
    assert restored is not None and waiting.run_id in restored.waiting
    for run_id in failed:  # what the stop would have promised to resume
        assert run_id in restored.interrupted and preview[run_id] == "interrupted"
    with Client.connect(full_project.root) as client:
        assert client.get_run(waiting.run_id).pending_action == waiting.pending_action
    assert full_project.cli("stop").code == 0


def test_a_start_the_full_disk_refused_a_segment_says_what_next_and_doctor_why(
    full_project: Project, small_disk: Path,
) -> None:
    """The disk had room for the lock, the log and connection.json, not the first segment:
    the start said "free disk space (or quota) for it." and stopped there, and doctor then
    called the empty segment it left what a crash leaves."""
    page = 4096
    failed = None
    for pages in range(1, 9):  # as little room as gets the start to its first segment
        filler = fill(small_disk)
        os.truncate(filler, max(0, filler.stat().st_size - pages * page))
        result = full_project.cli("start")
        assert result.code != 0, (pages, result)  # a full disk never starts a host
        assert "Traceback" not in result.stdout + result.stderr
        if "cannot hold a new segment" in result.stderr:
            failed = result
            break
    assert failed is not None, "no room left got the start as far as its first segment"
    assert "STORAGE_ERROR" in failed.stderr and "No space left on device" in failed.stderr
    assert "free disk space (or quota) for it, then start again." in failed.stderr, failed
    empty = [p for p in (full_project.state / "runtime" / "wal").iterdir()
             if p.stat().st_size == 0]
    assert len(empty) == 1, empty  # kept: nothing is deleted to make room

    doctor = full_project.cli("doctor", "--json")  # read-only, on the full disk
    assert "Traceback" not in doctor.stderr, doctor
    [journals] = [c for c in doctor.json["checks"] if c["id"] == "journals"]
    assert f"wal/{empty[0].name} is torn: has 0 bytes" in journals["message"], journals
    assert "or a full disk that refused its header" in journals["message"], journals

    (small_disk / "filler").unlink()
    assert start(full_project).service.restore is not None
    assert empty[0].exists() and empty[0].stat().st_size == 0
    assert full_project.cli("stop").code == 0


def test_status_on_a_full_disk_says_the_start_it_suggests_would_fail(
    full_project: Project, small_disk: Path, few_inodes: Path,
) -> None:
    """Offline on a full disk (or one out of inodes), status said "The service is offline.
    Run intloom start." with no startProblem, and that start failed STORAGE_ERROR."""
    filler = fill(small_disk)
    try:
        status = full_project.cli("status", "--json")
        assert status.code == 0 and status.json["status"] == "offline", status.stdout
        problem = status.json["startProblem"]
        assert problem is not None and problem.startswith(
            "But intloom start is likely to fail on the project as it is: the file system holding "
            f"{full_project.root}"), problem
        assert "bytes free" in problem and "free disk space" in problem, problem
        assert full_project.cli("doctor", "--json").json["startProblem"] == problem
    finally:
        filler.unlink()
    assert full_project.cli("status", "--json").json["startProblem"] is None
    inodes = basic_project(few_inodes / "proj")
    taken: list[Path] = []
    try:
        take_inodes(few_inodes, taken)
        problem = inodes.cli("status", "--json").json["startProblem"]
        assert problem is not None and "no inode left" in problem and "df -i" in problem, problem
    finally:
        give_back(taken)


def test_a_compaction_the_full_disk_refused_is_in_status_not_only_the_log(
    full_project: Project, small_disk: Path,
) -> None:
    """Snapshots a full disk refused at a host's stop and again at the next open: the host
    ran on (correctly: the next start reads more of the log), and only its log said so;
    status looked healthy while the disk refused every compaction."""
    start(full_project)
    with Client.connect(full_project.root) as client:
        # Its State and view hold the intent twice: a snapshot of some 200 KB; its records
        # (some 400 KB) stay in the first segment, whose rotation would snapshot it first.
        waiting = client.create_run("example", "x" * 100_000)
    assert waiting.status == "waiting", waiting
    filler = fill(small_disk)
    assert full_project.cli("stop").code == 0  # its snapshots refused, the stop completes
    # Room for the start's small files, not for that Run's snapshot.
    os.truncate(filler, filler.stat().st_size - 96 * 1024)
    start(full_project)
    with Client.connect(full_project.root) as client:
        status = client.status()
        assert client.get_run(waiting.run_id).pending_action == waiting.pending_action
    error = status.compaction_error
    assert error is not None, status
    assert error.startswith("snapshots could not be written at open ("), error
    assert "No space left on device" in error and "nothing is lost" in error, error
    shown = full_project.cli("status")
    assert f"Compaction {error}" in shown.stdout, shown
    assert full_project.cli("stop").code == 0
    filler.unlink()
    again = start(full_project).service  # room again: the Run is as it was
    assert again.compaction_error is None, again
    assert again.restore is not None and waiting.run_id in again.restore.waiting
    assert full_project.cli("stop").code == 0


def test_a_start_out_of_inodes_says_so_not_free_disk_space(few_inodes: Path) -> None:
    """ENOSPC is also a file system with free blocks and no inode left: the start said
    "Free disk space (or quota)", and df showed plenty of it."""
    project = basic_project(few_inodes / "proj")
    (project.root / ".intloom").mkdir(mode=0o700)
    taken: list[Path] = []
    try:
        take_inodes(few_inodes, taken)
        assert os.statvfs(few_inodes).f_bfree > 0
        result = project.cli("start")
        project.reap()
        assert result.code != 0, result
        assert "Traceback" not in result.stdout + result.stderr
        assert "STORAGE_ERROR" in result.stderr and "No space left on device" in result.stderr
        assert "no inode left" in result.stderr and "df -i" in result.stderr, result.stderr
        assert "Free disk space (or quota)" not in result.stderr, result.stderr
    finally:
        project.reap()
        give_back(taken)
    started = project.cli("start")  # inodes again: it starts
    try:
        assert started.code == 0, started
    finally:
        project.cli("stop")
        project.reap()


def test_out_of_inodes_and_of_space_too_is_said_as_both(few_inodes: Path) -> None:
    """Out of inodes, the fix said to free inodes "whatever free space df shows": with the
    blocks gone as well, freeing inodes alone left the next write failing."""
    from intloom.fsutil import no_inode_left

    (few_inodes / "filler").touch()  # its inode, before they are all taken
    taken: list[Path] = []
    try:
        take_inodes(few_inodes, taken)
        only_inodes = no_inode_left(few_inodes)
        assert only_inodes is not None and "whatever free space df shows" in only_inodes
        fill(few_inodes)
        both = no_inode_left(few_inodes)
        assert both is not None and "neither an inode nor free space left" in both, both
        assert "whatever free space df shows" not in both, both
    finally:
        give_back(taken)
        (few_inodes / "filler").unlink()


def test_a_compaction_out_of_inodes_says_so_not_free_disk_space(few_inodes: Path) -> None:
    """Snapshots refused for want of inodes (ENOSPC, with free blocks) said "Free disk
    space, or fix the permissions of .intloom/runtime" in the log (and in status)."""
    project = basic_project(few_inodes / "proj")
    taken: list[Path] = []
    try:
        log = start(project).service.log_file
        assert log is not None
        with Client.connect(project.root) as client:
            for n in range(3):
                assert client.create_run("example", f"r{n}").status == "waiting"
        take_inodes(few_inodes, taken)
        assert project.cli("stop").code == 0  # no inode for its snapshots
        lines = [json.loads(line) for line in (project.state / "logs" / log).read_text()
                 .splitlines()]
        [failed] = [e for e in lines if e["event"] == "store_compaction_failed"]
        assert (failed["what"], failed["when"]) == ("snapshots", "stop"), failed
        assert "no inode left" in failed["effect"] and "df -i" in failed["effect"], failed
        assert "Free disk space" not in failed["effect"], failed
        give_back(taken)
        restore = start(project).service.restore
        assert restore is not None and len(restore.waiting) == 3
        assert project.cli("stop").code == 0
    finally:
        project.reap()
        give_back(taken)


def test_a_start_out_of_inodes_for_the_stores_directories_says_so(few_inodes: Path) -> None:
    """A checkpoint store directory that could not be created for want of an inode said
    "free disk space (or quota) for it" of a nearly empty disk: the inode count was asked
    of the directory not created, and statvfs of it failed."""
    project = basic_project(few_inodes / "proj")
    taken: list[Path] = []
    said: dict[int, str] = {}
    try:
        for free in range(1, 14):  # each start takes one more step before it runs out
            shutil.rmtree(project.state, ignore_errors=True)
            take_inodes(few_inodes, taken)
            give_back(taken[len(taken) - free:])
            del taken[len(taken) - free:]
            started = project.cli("start", "--json")
            if started.code == 0:
                assert project.cli("stop").code == 0
                continue
            message = started.json["error"]["message"]
            if "Checkpoint store path" in message and "cannot be created" in message:
                said[free] = message
            give_back(taken)
    finally:
        project.reap()
        give_back(taken)
    assert said, "no start ran out of inodes at the store's directories"
    for free, message in said.items():
        assert "no inode left" in message and "df -i" in message, (free, message)
        assert "free disk space" not in message, (free, message)


def test_a_run_a_full_disk_failed_by_a_checkpoint_is_not_said_to_be_over(
    full_project: Project, small_disk: Path,
) -> None:
    """A Run failed by a checkpoint said "Execution cannot safely continue" (attach, flow)
    and "Failure does not undo committed data" as for a Run that ended, and the next start
    brought it back by the restart table (DESIGN §6)."""
    start(full_project)
    filler = fill(small_disk)
    for n in range(50):  # until a Run gets as far as a Step before a checkpoint fails
        flowed = full_project.cli("flow", "example", "--intent", f"busy {n}")
        if "RUN_CHECKPOINT_FAILED" in flowed.stdout:
            break
    assert flowed.code == 1 and "RUN_CHECKPOINT_FAILED" in flowed.stdout, flowed
    run_id = next(line.split()[1] for line in flowed.stdout.splitlines()
                  if line.startswith("Run "))
    for shown in (flowed.stdout, full_project.cli("attach", run_id).stdout):
        assert "RUN_CHECKPOINT_FAILED" in shown, shown
        assert "cannot safely continue" not in shown, shown
        assert "Failure does not undo committed data" not in shown, shown
        assert "so this host stopped the Run" in shown, shown
        assert "intloom doctor previews it" in shown, shown
    listed = full_project.cli("runs")
    assert f"{run_id}" in listed.stdout and "this host stopped the Run" in listed.stdout, listed
    # The failed batch's bytes are cut off its segment (no space is needed for that): with no
    # room for the void notice's segment or a manifest, whole frames of it that reached the
    # file read back as records at the next start (before 2026-12-04).
    failed = re.search(r"(?:write|fdatasync) of (wal/\d+\.seg) failed at offset (\d+)",
                       full_project.cli("status", "--json").json["service"]["journalError"])
    assert failed is not None
    segment = full_project.root / ".intloom" / "runtime" / failed[1]
    assert segment.stat().st_size == int(failed[2]), (segment, failed[0])
    assert full_project.cli("stop").code == 0
    doctor = full_project.cli("doctor", "--json")
    preview = {run["runId"]: run["verdict"]["row"] for run in doctor.json["runs"]}
    assert run_id in preview, doctor.json["runs"]  # the next start decides, not this host
    filler.unlink()
    restore = start(full_project).service.restore
    assert restore is not None and run_id in restore.interrupted + restore.waiting, restore
    assert full_project.cli("stop").code == 0


def test_checkpoints_go_on_into_the_room_preallocated_once_the_disk_is_full(
    full_project: Project, small_disk: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A format-2 segment holds its MiB before the disk fills: Runs go on checkpointing
    into it with no byte left on the disk, and the stop's seal gives back what was not
    used (it cuts the zeros off), so the stop's snapshots are written too."""
    monkeypatch.delenv("INTLOOM_FAULT")  # this one preallocates, as every host does
    start(full_project)
    segment = full_project.root / ".intloom" / "runtime" / "wal" / "0000000001.seg"
    assert segment.stat().st_size >= 1 << 20  # the room was taken at the start
    filler = fill(small_disk)
    assert os.statvfs(small_disk).f_bavail == 0
    done = []
    for n in range(5):
        flowed = full_project.cli("flow", "example", "--intent", f"full {n}", "--json")
        assert flowed.code == 0, flowed  # waiting for its confirmation, checkpointed
        done.append(flowed.json["run"]["runId"])
    status = full_project.cli("status", "--json").json["service"]
    assert status["journalError"] is None and status["compactionError"] is None, status
    assert full_project.cli("stop").code == 0
    assert segment.stat().st_size < 1 << 20  # sealed: its zeros cut off, given back
    restore = start(full_project).service
    assert restore.compaction_error is None, restore
    assert restore.restore is not None and sorted(restore.restore.waiting) == sorted(done)
    assert full_project.cli("stop").code == 0
    filler.unlink()


def test_a_host_whose_log_the_full_disk_refused_does_not_say_it_suspended_failed_runs(
    full_project: Project, small_disk: Path,
) -> None:
    """The refusal of new work said "suspended its Runs at their last saved boundaries" of
    Runs a failed checkpoint had already stopped, which no suspension touches."""
    service = start(full_project).service
    fill(small_disk)
    failed: list[str] = []
    with Client.connect(full_project.root) as client:
        for n in range(50):
            try:
                run = client.create_run("example", f"busy {n}")
            except IntloomError as exc:
                assert exc.code in ("RUN_CHECKPOINT_FAILED", "LOG_WRITE_FAILED"), exc
                break
            if run.status == "failed":
                failed.append(run.run_id)
    assert failed, "no Run got as far as a Step before the full disk refused a checkpoint"
    eventually(lambda: log_error(full_project, service.port), timeout=30,
               what="a log line to be refused by the full disk")
    with Client.connect(full_project.root) as client, \
            pytest.raises(IntloomError) as refused:
        client.create_run("example", "later")
    assert refused.value.code == "LOG_WRITE_FAILED", refused.value
    message = refused.value.message
    runs = "1 Run" if len(failed) == 1 else f"{len(failed)} Runs"
    assert (f"suspended its running Runs at their last saved boundaries; {runs} that a "
            "failed checkpoint had already stopped (failed/RUN_CHECKPOINT_FAILED) it did not "
            "suspend.") in message, message
    assert "from its last durable checkpoint" in message, message
    assert full_project.cli("stop").code == 0


def test_a_journal_out_of_inodes_is_not_told_to_free_disk_space_in_status(
    few_inodes: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failed write (injected) whose replacement segment found no inode left: status said
    "free space on the disk that holds .intloom/runtime", and df showed plenty of it."""
    monkeypatch.setenv("INTLOOM_FAULT", "fail_sync=3")
    project = basic_project(few_inodes / "proj")
    taken: list[Path] = []
    try:
        start(project)
        take_inodes(few_inodes, taken)
        with Client.connect(project.root) as client:
            run = client.create_run("example", "no inode")
            assert run.last_error is not None and run.last_error.code == "RUN_CHECKPOINT_FAILED"
            status = client.status()
        assert status.journal_error is not None, status
        assert status.journal_fix is not None and "no inode left" in status.journal_fix, status
        shown = project.cli("status").stdout
        line = next(x for x in shown.splitlines() if x.startswith("Journal error "))
        assert "no inode left" in line and "df -i" in line, line
        assert "free space on the disk" not in line, line
        assert line.endswith("then intloom start."), line
        assert project.cli("stop").code == 0
    finally:
        project.reap()
        give_back(taken)


def test_a_compaction_the_full_disk_refused_at_a_stop_is_in_doctor_offline(
    full_project: Project, small_disk: Path,
) -> None:
    """Snapshots a full disk refused at a host's stop were only in its log: doctor, the
    command to run before the next start, said nothing of them."""
    start(full_project)
    with Client.connect(full_project.root) as client:
        waiting = client.create_run("example", "x" * 100_000)  # a snapshot of some 200 KB
    assert waiting.status == "waiting", waiting
    filler = fill(small_disk)
    assert full_project.cli("stop").code == 0  # its snapshots refused, the stop completes
    os.truncate(filler, filler.stat().st_size - 64 * 1024)  # room for doctor's reading
    doctor = full_project.cli("doctor", "--json")
    assert "Traceback" not in doctor.stderr, doctor
    assert doctor.code == 3, doctor  # attention
    [check] = [c for c in doctor.json["checks"] if c["id"] == "compaction"]
    assert check["status"] == "attention", check
    assert check["message"].startswith("The last host could not write snapshots at stop ("), check
    assert "No space left on device" in check["message"], check
    assert check["next"].startswith("Free disk space"), check
    text = full_project.cli("doctor").stdout
    assert "compaction · attention: The last host could not write snapshots" in text, text
    filler.unlink()
    again = start(full_project).service  # room again: the stop's snapshots are written
    assert again.restore is not None and waiting.run_id in again.restore.waiting
    assert full_project.cli("stop").code == 0
    after = full_project.cli("doctor", "--json")
    assert not [c for c in after.json["checks"] if c["id"] == "compaction"], after.json
