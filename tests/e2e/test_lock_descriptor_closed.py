"""Code running in the host closes the descriptor that holds the OS lock on ``service.lock``
(a Step's ``os.closerange``, a library that daemonises). The host served on with its lock
free: every command found the lock file's owner alive and its OS lock free and refused it
(CLI_SERVICE_METADATA_INVALID), and doctor called it another copy's host. The host now takes
the lock again within a look (0.2 s) and says so; when the lock file itself is no longer the
one it created, nothing keeps a second host off the project, and it stops. Real host and CLI
subprocesses; every host is reaped."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import textwrap
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Project, eventually, ok, one_source_project, pid_alive, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

CLOSER = textwrap.dedent('''\
    import os
    from pathlib import Path

    import msgspec

    import intloom


    class S(msgspec.Struct):
        n: int = 0


    wf = intloom.Workflow("closer", version="1.0.0")
    main = wf.stage("main", state=S)
    KEPT = []


    @main.step("close", routes={"done": intloom.COMPLETE})
    async def close(ctx: intloom.StepContext[S]) -> str:
        lock = Path(".intloom/service.lock").resolve()
        held = os.stat(lock)
        for fd in map(int, os.listdir("/proc/self/fd")):
            try:
                st = os.fstat(fd)
            except OSError:
                continue
            # Its descriptor names the temp file it was made as: found by its inode.
            if "close" in ctx.intent and (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino):
                if "reuse" in ctx.intent:
                    # Closed and its number given to this file at once (dup2): opened after
                    # a close, the file lost that number to another host thread's open
                    # under load (the CI's "8 != 4").
                    kept = open(Path("kept.txt").resolve(), "w")
                    os.dup2(kept.fileno(), fd)
                    KEPT.append(os.fdopen(fd, "w"))
                    kept.close()
                    Path("numbers.txt").write_text(f"{fd} {KEPT[0].fileno()}")
                else:
                    os.close(fd)
                if "remove" in ctx.intent:
                    os.unlink(lock)
        if "write" in ctx.intent:
            KEPT[0].write("still open")  # the host took its lock again, closing nothing
            KEPT[0].flush()
        return "done"
''')


def _events(project: Project) -> list[dict[str, Any]]:
    return [json.loads(line) for line in project.cli("logs", "--json").stdout.splitlines()]


def _logged(project: Project, event: str) -> list[dict[str, Any]]:
    return [e for e in _events(project) if e["event"] == event]


def _gone(pid: int) -> bool:
    return not pid_alive(pid)


def _lock_held_by_another(path: Path) -> bool:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@pytest.mark.parametrize("intent", ["close", "close and reuse its number"])
def test_a_lock_descriptor_closed_by_a_step_is_taken_again(tmp_path: Path, intent: str) -> None:
    for project in reaped(one_source_project(tmp_path, "closer", CLOSER)):
        ok(project.cli("start", "--json"))
        run = ok(project.cli("flow", "closer", "--intent", intent, "--json"))["run"]
        assert run["status"] == "completed", run
        retaken = eventually(
            partial(_logged, project, "service_lock_retaken"),
            timeout=20, what="the host to take its lock again")
        assert retaken[0]["level"] == "warning" and "closed the descriptor" in \
            retaken[0]["message"], retaken
        assert _lock_held_by_another(project.state / "service.lock")
        status = project.cli("status", "--json")
        assert status.code == 0 and status.json["service"]["pid"] == project.host_pid(), (
            status.stdout, status.stderr)
        doctor = ok(project.cli("doctor", "--json"))
        assert doctor["status"] == "running", doctor
        if "reuse" in intent:
            closed, taken = (project.root / "numbers.txt").read_text().split()
            assert closed == taken, "the Step's file did not get the lock's old number"
            wrote = ok(project.cli("flow", "closer", "--intent", "write", "--json"))["run"]
            assert wrote["status"] == "completed", wrote
            assert (project.root / "kept.txt").read_text() == "still open"
        pid = project.host_pid()
        ok(project.cli("stop", "--json"))
        # stop returns once the files are released; the process ends a moment later.
        eventually(partial(_gone, pid), timeout=20, what=f"the host (pid {pid}) to exit")
        assert not (project.state / "service.lock").exists()
        assert not (project.state / "service.json").exists()
        # Started again: the project is free, as after any stop.
        ok(project.cli("start", "--json"))
        ok(project.cli("stop", "--json"))


def test_a_lock_file_gone_with_its_descriptor_stops_the_host(tmp_path: Path) -> None:
    for project in reaped(one_source_project(tmp_path, "closer", CLOSER)):
        ok(project.cli("start", "--json"))
        pid = project.host_pid()
        project.cli("flow", "closer", "--intent", "close and remove", "--json", "--detach")
        eventually(partial(_gone, pid), timeout=30, what="the host to stop")
        events = _events(project)
        [lost] = [e for e in events if e["event"] == "service_lock_lost"]
        assert lost["level"] == "error" and "nothing keeps a second host off this project" in \
            lost["message"], lost
        stopping = [e for e in events if e["event"] == "service_stopping"]
        assert stopping and stopping[0]["reason"] == "service.lock lost", stopping
        assert events[-1]["event"] == "log_closed", events[-3:]
        with contextlib.suppress(FileNotFoundError):
            assert not (project.state / "service.json").exists()
        ok(project.cli("start", "--json"))
        ok(project.cli("stop", "--json"))
