"""A first start killed while it imports a Workflow (a slow import, OOM, a crashing C
extension) used to leave the project stuck: a stale ``service.lock`` and no
``connection.json``, so ``recover`` refused (no valid connection, DESIGN section 3), ``start``
was CLI_SERVICE_BUSY, and doctor recommended the recover that refused. The host now binds its
port and saves ``connection.json`` before any user code runs: doctor's advice works."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from intloom.authoring.loader import IMPORT_NOTICE_ENV
from tests.helpers import (
    REPO,
    CliResult,
    Project,
    eventually,
    ok,
    one_source_project,
    pid_alive,
    reaped,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SLOW = '''
import time
from pathlib import Path

import intloom

_HERE = Path(__file__).resolve().parent.parent
(_HERE / "importing").write_text("the import started")
_deadline = time.monotonic() + 30
while not (_HERE / "release").exists() and time.monotonic() < _deadline:
    time.sleep(0.01)

wf = intloom.Workflow("slow", version="1")
st = wf.stage("s")


@st.step("a", routes={"ok": intloom.COMPLETE})
def a(ctx: intloom.StepContext[None]) -> str:
    return "ok"
'''


@pytest.fixture
def slow(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "slow", SLOW))


def test_a_first_start_killed_in_a_workflow_import_is_recovered_as_doctor_says(
    slow: Project,
) -> None:
    started: list[CliResult] = []
    starting = threading.Thread(target=lambda: started.append(slow.cli("start", "--json")))
    starting.start()
    try:
        eventually((slow.root / "importing").exists, timeout=20, what="the import to start")
        lock = json.loads((slow.state / "service.lock").read_text())
        connection = json.loads((slow.state / "connection.json").read_text())
        slow.pids.add(lock["pid"])
        os.kill(lock["pid"], signal.SIGKILL)
        slow.wait_released(lock["pid"])  # the OS lock and the saved port are free
    finally:
        starting.join(timeout=60)
    [first] = started
    error = first.json["error"]
    assert first.code != 0 and error["code"] == "CLI_SERVICE_UNAVAILABLE"
    # The facts (which process, how it ended) and the way out.
    assert f"pid {lock['pid']}) was killed by SIGKILL" in error["message"], error
    assert ("It was importing workflows/slow.py. SIGKILL comes from outside the process"
            ) in error["message"], error
    assert "intloom doctor" in error["message"] and "intloom recover" in error["message"]
    assert (slow.state / "service.lock").exists()  # stale: its owner was killed
    # A command that needs the host said "offline. Run intloom start", which start refuses
    # (CLI_SERVICE_BUSY) over that lock; it names the lock and the way out.
    offline = slow.cli("runs", "--json").json["error"]
    assert offline["code"] == "CLI_SERVICE_OFFLINE", offline
    assert offline["message"] == (
        f"The project service is offline: its last host (pid {lock['pid']}) has exited "
        f"without removing {slow.state / 'service.lock'} (it was killed, or crashed), and "
        "intloom start refuses the project until that file is removed (CLI_SERVICE_BUSY). Run "
        "intloom recover (intloom doctor says what it removes), then intloom start."), offline
    (slow.root / "release").write_text("")  # doctor imports the Workflows too

    doctor = slow.cli("doctor", "--json").json
    assert doctor["status"] == "recovery_required", doctor["message"]
    # Which source it died in, once start's terminal is gone: the log says (it said only
    # "ends ... with service_starting").
    [ended] = [c for c in doctor["checks"] if c["id"] == "last_host"]
    assert ended["message"].startswith(
        "The last host ended during its start, while it imported workflows/slow.py: its log "
        "(.intloom/logs/LOG-"), ended
    assert ok(slow.cli("recover", "--json"))["recovered"] is True
    service = ok(slow.cli("start", "--json"))["service"]
    assert service["port"] == connection["port"]  # the port the killed start had saved
    ok(slow.cli("stop", "--json"))


FORKS = '''
import ctypes
import os
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent.parent
child = os.fork()
if child == 0:  # keeps every descriptor the host had, its readiness pipe among them
    time.sleep(60)
    os._exit(0)
(_HERE / "child.pid").write_text(str(child))
ctypes.CDLL(None)._exit(5)  # as a crashing extension ends it: os._exit is a load failure
'''


def test_a_host_whose_workflow_forked_and_exited_in_its_import_is_said_dead_at_once(
    tmp_path: Path,
) -> None:
    """A Workflow source that forks a long-lived child while it is imported, then ends the
    process: the child held the readiness pipe, so the start waited until its --timeout and
    then said the host "stopped and released its files" (its service.lock was left). It now
    notices its host exited and says so at once, with the exit status and the source."""
    for project in reaped(one_source_project(tmp_path, "forks", FORKS)):
        child: int | None = None
        try:
            started = project.cli("start", "--json", "--timeout", "20")
            child = int((project.root / "child.pid").read_text())
            assert started.code == 1, started.stdout
            error = started.json["error"]
            assert error["code"] == "CLI_SERVICE_UNAVAILABLE", error
            assert "exited with status 5 before it reported ready" in error["message"], error
            assert "It was importing workflows/forks.py" in error["message"], error
            assert "service.lock" in error["message"], error  # left, and named
        finally:
            if child is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)


@pytest.mark.parametrize("moved", ["state", "project"])
def test_a_project_moved_while_its_host_imports_fails_the_start_and_writes_nothing_there(
    slow: Project, moved: str,
) -> None:
    """The project (or its .intloom/) moved while the starting host imported its Workflows:
    the store, opened by path, made a new, empty journal at the old place, and the start
    said "Service started ... no unfinished Runs to restore" while the Runs were in the
    moved journal. The start now fails before the store opens, and writes nothing there."""
    started: list[CliResult] = []
    starting = threading.Thread(target=lambda: started.append(slow.cli("start", "--json")))
    starting.start()
    try:
        eventually((slow.root / "importing").exists, timeout=20, what="the import to start")
        slow.pids.add(json.loads((slow.state / "service.lock").read_text())["pid"])
        if moved == "state":
            slow.state.rename(slow.root / ".intloom.moved")
        else:
            slow.root.rename(slow.root.parent / "moved")
            slow.root.mkdir()  # what the import waits on is at the old place
        (slow.root / "release").write_text("")
    finally:
        starting.join(timeout=60)
    [result] = started
    assert result.code == 1, result.stdout
    error = result.json["error"]
    assert error["code"] == "STORAGE_ERROR", error
    assert "was moved while this host started" in error["message"], error
    assert not (slow.root / ".intloom").exists()  # no new, empty journal: nothing at all


def test_a_start_stuck_in_a_workflow_import_names_the_source(slow: Project) -> None:
    """A source that loops or waits when imported kept ``start`` silent until its --timeout
    (300 s by default), whose error then named no source ("within --timeout; ... see
    .intloom/logs/ for the slow step"), and the log said only ``loading_workflows``. The
    start now says which source it is still importing, while it waits and when it gives
    up, and the host's log names it too."""
    started = slow.cli("start", "--timeout", "3", env={IMPORT_NOTICE_ENV: "0.2"})
    assert started.code != 0, started
    assert ("Still importing workflows/slow.py after 0.2 s: a Workflow source that waits or "
            "loops while it is imported keeps the host from starting") in started.stderr, started
    assert "CLI_SERVICE_TIMEOUT" in started.stderr, started
    assert "It was still importing workflows/slow.py (for " in started.stderr, started
    assert "Check what workflows/slow.py does when it is imported" in started.stderr, started
    [log] = (slow.state / "logs").iterdir()
    [interrupted] = [line for line in map(json.loads, log.read_text().splitlines())
                     if line["event"] == "startup_interrupted"]
    assert interrupted["source"] == "workflows/slow.py", interrupted
    assert not (slow.state / "service.lock").exists()  # it stopped and let go


def test_a_foreground_start_stuck_in_a_workflow_import_names_the_source(
    slow: Project, tmp_path: Path,
) -> None:
    """``start --foreground`` imports the sources in its own process: one that waits when
    imported held the terminal silent (no spinner, no note) for as long as it waited."""
    said = tmp_path / "stderr.txt"
    with said.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "intloom", "start", "--foreground"], cwd=slow.root,
            stdout=subprocess.DEVNULL, stderr=err,
            env={**os.environ, "NO_COLOR": "1", IMPORT_NOTICE_ENV: "0.2"})
    slow.pids.add(proc.pid)
    try:
        eventually(lambda: "Still importing workflows/slow.py after 0.2 s" in said.read_text(),
                   timeout=20, what="the foreground start to name the slow source")
        (slow.root / "release").write_text("")
        eventually((slow.state / "service.json").exists, timeout=20, what="the host to serve")
        ok(slow.cli("stop", "--json"))
        assert proc.wait(timeout=30) == 0, said.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert said.read_text().count("Still importing") == 1, said.read_text()


@contextlib.contextmanager
def _while_starting(project: Project, env: dict[str, str] | None = None
                    ) -> Iterator[dict[str, Any]]:
    """A ``start`` held in its Workflow's import: yields its ``service.lock``. Then the
    import goes on, and the start must succeed."""
    started: list[CliResult] = []
    starting = threading.Thread(
        target=lambda: started.append(project.cli("start", "--json", env=env)))
    starting.start()
    try:
        eventually((project.root / "importing").exists, timeout=20,
                   what="the import to start")
        lock: dict[str, Any] = json.loads((project.state / "service.lock").read_text())
        project.pids.add(lock["pid"])
        yield lock
    finally:
        (project.root / "release").write_text("")
        starting.join(timeout=60)
    [result] = started
    ok(result)


def test_a_stop_that_saw_a_starting_host_another_stop_ended_says_it_served(
        slow: Project) -> None:
    """A stop that found the host starting (its lock only) asks it once it serves; when a
    second stop asked first and the host served, stopped and removed its files between two
    of the first stop's polls, the first said "It exited before it ever served requests ...
    it had taken on no Run", of a host that had served (and suspended Runs, had it any).
    The first stop here is paused (SIGSTOP) over that window, to make it certain."""
    with _while_starting(slow):
        first = subprocess.Popen([sys.executable, "-m", "intloom", "stop"], cwd=slow.root,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert first.stderr is not None
            seen = ""
            while "is still starting" not in seen:  # it observed the lock, and polls
                line = first.stderr.readline()
                assert line, (seen, first.wait(timeout=10))
                seen += line
            first.send_signal(signal.SIGSTOP)
        except BaseException:
            first.kill()
            first.wait(timeout=10)
            raise
    try:
        second = ok(slow.cli("stop", "--json"))  # the host served: this stop ends it
        assert second["stopped"] is True and second.get("served", True) is True, second
        first.send_signal(signal.SIGCONT)
        out, err = first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGCONT)
            first.kill()
            first.wait(timeout=10)
    assert first.returncode == 0, (out, err)
    assert "before it ever served" not in out, out
    assert "The original service instance stopped." in out, out


def test_status_during_a_normal_start_says_the_host_is_starting(slow: Project) -> None:
    """A host that holds its lock while it imports its Workflows is starting, not stuck:
    status said "A resource owner still exists ... Do not delete locks", which reads as a
    project in trouble. The JSON status stays DESIGN's ``blocked`` (an owner is alive)."""
    with _while_starting(slow) as lock:
        text = slow.cli("status")
        doc = slow.cli("status", "--json")
    assert text.code == 0, text
    first = text.stdout.splitlines()[0]
    assert first.startswith(f"The service is starting (pid {lock['pid']}, since "
                            f"{lock['startedAt']})"), text.stdout
    assert "Do not delete locks" not in text.stdout and "intloom status" in first
    assert doc.code == 0 and doc.json["status"] == "blocked"
    assert doc.json["message"] == first
    assert ok(slow.cli("status", "--json"))["service"]["pid"] == lock["pid"]
    ok(slow.cli("stop", "--json"))


def test_commands_during_a_normal_start_say_the_host_is_starting(slow: Project) -> None:
    """``runs``, ``flows``, ``flow`` (and Client.connect) while a host holds its lock and
    imports its Workflows said CLI_SERVICE_OFFLINE "The project service is offline. Run
    intloom start." -- untrue, and start would only wait for that host. They say it is
    starting, retryable; with no host starting they still say offline."""
    from intloom.client import Client
    from intloom.errors import IntloomError

    offline = slow.cli("runs", "--json")
    assert offline.code != 0 and offline.json["error"]["code"] == "CLI_SERVICE_OFFLINE"
    with _while_starting(slow) as lock:
        runs = slow.cli("runs", "--json")
        text = slow.cli("flows")
        flow = slow.cli("flow", "slow", "--intent", "x", "--json")
        with pytest.raises(IntloomError) as raised:
            Client.connect(slow.root)
    expected = f"The service is starting (pid {lock['pid']}, since {lock['startedAt']})"
    for result in (runs, flow):
        error = result.json["error"]
        assert result.code != 0 and error["code"] == "CLI_SERVICE_UNAVAILABLE", error
        assert error["retryable"] is True
        assert error["message"].startswith(expected), error
        assert "intloom start waits for it" in error["message"], error
    assert text.code != 0 and "CLI_SERVICE_UNAVAILABLE" in text.stderr, text
    assert expected in text.stderr and "offline" not in text.stderr, text
    assert raised.value.code == "CLI_SERVICE_UNAVAILABLE" and raised.value.retryable
    assert raised.value.message.startswith(expected)
    assert ok(slow.cli("runs", "--json"))["runs"] == []
    ok(slow.cli("stop", "--json"))


# As SLOW, but only the host holds its import (doctor imports the Workflows too).
HELD_IN_HOST = SLOW.replace(
    "while not", "while os.environ.get('HOLD_IMPORT') and not").replace(
    "import time\n", "import os\nimport time\n", 1)


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "slow", HELD_IN_HOST))


def test_doctor_during_a_normal_start_says_the_host_is_starting(held: Project) -> None:
    """doctor's owner check said a host in its start-up "does not answer as this project's
    host (it may be starting or stopping)"; status says it is starting."""
    with _while_starting(held, env={"HOLD_IMPORT": "1"}) as lock:
        doctor = held.cli("doctor", "--json")
    report = doctor.json
    assert report["status"] == "blocked" and report["message"].startswith(
        f"The service is starting (pid {lock['pid']}"), report["message"]
    check = {c["id"]: c for c in report["checks"]}["owner.service_lock"]
    assert check["message"].startswith(
        f"service.lock names pid {lock['pid']}, which is alive and starting (since "
        f"{lock['startedAt']})"), check
    assert "stopping" not in check["message"], check
    ok(held.cli("stop", "--json"))


def test_status_and_doctor_during_a_start_over_a_crashed_hosts_service_json(
    held: Project,
) -> None:
    """A start over the service.json a killed host left (its service.lock removed by hand)
    was "A resource owner still exists or its exit cannot be verified" for status and
    doctor, for the whole start, and doctor said to make the lock's holder (the starting
    host) exit. They say the host is starting, as without a crashed predecessor; paused,
    they say so. The dead host's file is read, never changed, until the new host replaces
    it."""
    first = ok(held.cli("start", "--json"))["service"]
    held.kill_host()
    (held.state / "service.lock").unlink()
    (held.root / "importing").unlink()
    crashed = (held.state / "service.json").read_bytes()
    with _while_starting(held, env={"HOLD_IMPORT": "1"}) as lock:
        text = held.cli("status")
        doc = held.cli("status", "--json")
        doctor = held.cli("doctor", "--json")
        os.kill(lock["pid"], signal.SIGSTOP)
        try:
            eventually(lambda: _stopped(lock["pid"]), timeout=10, what="the host to pause")
            paused = held.cli("status", "--json")
        finally:
            os.kill(lock["pid"], signal.SIGCONT)
        assert (held.state / "service.json").read_bytes() == crashed
    starting = f"The service is starting (pid {lock['pid']}, since {lock['startedAt']})"
    assert text.code == 0 and text.stdout.startswith(starting), text.stdout
    assert doc.code == 0 and doc.json["status"] == "blocked", doc.json
    assert doc.json["message"].startswith(starting), doc.json["message"]
    # DESIGN: an owner is never gone while the OS lock is held (here, by the new host).
    assert {o["resource"]: o["status"] for o in doc.json["owners"]} == {
        "service_info": "unknown", "service_lock": "alive"}, doc.json["owners"]
    report = doctor.json
    assert report["status"] == "blocked" and report["message"].startswith(starting), report
    checks = {c["id"]: c for c in report["checks"]}
    assert checks["owner.service_lock"]["message"].startswith(
        f"service.lock names pid {lock['pid']}, which is alive and starting"), checks
    dead = checks["owner.service_json"]
    assert dead["message"].startswith(
        f"service.json names pid {first['pid']}, a host that has exited without removing it "
        f"(a crash). The host starting since {lock['startedAt']} holds the project's lock"
    ), dead
    assert "fuser" not in dead["next"] and "Leave service.json as it is" in dead["next"], dead
    assert paused.json["message"].startswith(
        f"The host starting since {lock['startedAt']} (pid {lock['pid']}) is paused"), paused.json
    service = ok(held.cli("status", "--json"))["service"]
    assert service["pid"] == lock["pid"] and service["instanceId"] != first["instanceId"]
    ok(held.cli("stop", "--json"))


def _stopped(pid: int) -> bool:
    """``pid`` is stopped by a signal (the state letter T in /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        return fh.read().rpartition(") ")[2][:1] == "T"


# Sleeps when imported, as a module that calls a slow service at import time does.
SLEEPS = '''
import time
from pathlib import Path

import intloom

(Path(__file__).resolve().parent.parent / "importing").write_text("the import started")
time.sleep(20)

wf = intloom.Workflow("slow", version="1")
st = wf.stage("s")


@st.step("a", routes={"ok": intloom.COMPLETE})
def a(ctx: intloom.StepContext[None]) -> str:
    return "ok"
'''


def _ready_lines(fd: int, deadline: float) -> list[dict[str, Any]]:
    """Every readiness line the host writes on ``fd`` until it closes its end."""
    data = b""
    while time.monotonic() < deadline:
        readable, _, _ = select.select([fd], [], [], 0.5)
        if readable:
            chunk = os.read(fd, 65536)
            if not chunk:
                return [json.loads(line) for line in data.splitlines()]
            data += chunk
    raise AssertionError(f"the host did not close its readiness pipe: {data[-500:]!r}")


@pytest.fixture
def sleeps(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "slow", SLEEPS))


def _full_pipe() -> tuple[int, int, int]:
    """A pipe whose buffer is full: (read end, write end, how many bytes fill it)."""
    read_fd, write_fd = os.pipe()
    filled = 0
    os.set_blocking(write_fd, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            filled += os.write(write_fd, b"x" * 4096)
    os.set_blocking(write_fd, True)
    return read_fd, write_fd, filled


def test_a_stop_signal_before_the_workflow_import_stops_the_start_at_once(
    sleeps: Project,
) -> None:
    """A SIGTERM that came after the host installed its handlers but before its Workflow
    import began was seen only when the start-up first awaited, after every import: the
    host sat through a module's 20 s import, reported ready (the launcher said started),
    and stopped at once. The start now ends before any import, saying so.

    The host is held at its first readiness report, before the imports, by a readiness pipe
    that is full (its launcher not reading yet), and signalled there."""
    read_fd, write_fd, filled = _full_pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "intloom.host", "--project", str(sleeps.root),
             "--ready-fd", str(write_fd)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(write_fd,), cwd=sleeps.root, env={**os.environ, "PYTHONPATH": str(REPO)})
        sleeps.pids.add(proc.pid)
        os.close(write_fd)
        write_fd = -1
        try:
            wchan = Path(f"/proc/{proc.pid}/wchan")
            eventually(lambda: wchan.read_text().endswith("pipe_write"), timeout=20,
                       what="the host to block on its first readiness report")
            os.kill(proc.pid, signal.SIGTERM)
            began = time.monotonic()
            while filled:  # the filler out: the host's report goes through, and it goes on
                filled -= len(os.read(read_fd, filled))
            lines = _ready_lines(read_fd, began + 60)
            took = time.monotonic() - began
            assert proc.wait(timeout=30) != 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
    ended = [line for line in lines if line["event"] != "progress"]
    assert ended == [{"event": "error", "error": {
        "code": "CLI_SERVICE_CLOSING", "retryable": False, "message": (
            "The host was asked to stop (SIGTERM) before it imported Workflows; it did not "
            "start and released its files.")}}], lines
    assert took < 10, took  # not after the module's 20 s import
    assert not (sleeps.root / "importing").exists()  # no Workflow code ran
    [log] = (sleeps.state / "logs").iterdir()
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    [interrupted] = [e for e in logged if e["event"] == "startup_interrupted"]
    assert (interrupted["signal"], interrupted["source"]) == ("SIGTERM", None), interrupted
    assert logged[-1]["event"] == "log_closed"
    assert not (sleeps.state / "service.lock").exists()  # it let go of everything


# Its import catches whatever interrupts it, as a module with a bare ``except:`` does.
SWALLOWS = SLEEPS.replace("time.sleep(20)\n", "try:\n    time.sleep(20)\nexcept BaseException:\n"
                          "    pass\n")


@pytest.fixture
def swallows(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "slow", SWALLOWS))


def test_a_stop_signal_a_workflow_import_swallowed_still_stops_the_start(
    swallows: Project,
) -> None:
    """A module that caught the SIGTERM's interruption of its import let the start go on:
    the host reported ready (start said started, exit 0), then stopped at once. The start
    now ends before it serves, and says it was asked to stop."""
    started: list[CliResult] = []
    starting = threading.Thread(
        target=lambda: started.append(swallows.cli("start", "--json")))
    starting.start()
    try:
        eventually((swallows.root / "importing").exists, timeout=20,
                   what="the import to start")
        lock = json.loads((swallows.state / "service.lock").read_text())
        swallows.pids.add(lock["pid"])
        os.kill(lock["pid"], signal.SIGTERM)
    finally:
        starting.join(timeout=60)
    [result] = started
    assert result.code != 0, result
    assert result.json["error"] == {"code": "CLI_SERVICE_CLOSING", "retryable": False,
                                    "message": "The host was asked to stop (SIGTERM) while it "
                                    "was starting; it did not start and released its "
                                    "files."}, result
    assert not (swallows.state / "service.json").exists()
    assert not (swallows.state / "service.lock").exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGQUIT])
def test_a_start_sent_sigterm_while_it_waits_stops_the_host_it_launched(
        slow: Project, signum: signal.Signals) -> None:
    """``timeout 30 intloom start`` (SIGTERM), or a supervisor's stop, while the host was
    still importing ended the command by SIGTERM's default action and left the half-started
    host to go on and serve, unknown to whoever gave up on the start; Ctrl-C already stopped
    it. The start now stops the host it launched and says so (CLI_SERVICE_CLOSING). Ctrl-\\
    (SIGQUIT, which the terminal sends to the start alone: the host has a session of its
    own) dumped the start's core and likewise left the host to serve."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "intloom", "--project", str(slow.root), "start", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "NO_COLOR": "1"})
    slow.pids.add(proc.pid)
    try:
        eventually((slow.root / "importing").exists, timeout=20, what="the import to start")
        host = json.loads((slow.state / "service.lock").read_text())["pid"]
        slow.pids.add(host)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
    finally:
        (slow.root / "release").write_text("")  # a host still importing finishes
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 1, (proc.returncode, out, err)
    error = json.loads(out)["error"]
    assert error["code"] == "CLI_SERVICE_CLOSING", error
    assert f"(pid {host})" in error["message"], error
    assert f"This start was asked to stop ({signum.name})" in error["message"], error
    eventually(lambda: not pid_alive(host), timeout=10, what=f"the host (pid {host}) to exit")
    assert not (slow.state / "service.lock").exists()
    assert not (slow.state / "service.json").exists()


def _sigchld_ignored() -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # inherited across exec, as from a wrapper


def test_a_start_whose_caller_ignores_sigchld_says_how_its_host_died(slow: Project) -> None:
    """A program that ignores SIGCHLD ran ``intloom start``: the kernel reaped the host it
    launched, so a host killed while it imported was said to have "exited with status 0"."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "intloom", "--project", str(slow.root), "start", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "NO_COLOR": "1"}, preexec_fn=_sigchld_ignored)
    slow.pids.add(proc.pid)
    try:
        eventually((slow.root / "importing").exists, timeout=20, what="the import to start")
        host = json.loads((slow.state / "service.lock").read_text())["pid"]
        slow.pids.add(host)
        os.kill(host, signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 1, (proc.returncode, out, err)
    error = json.loads(out)["error"]
    assert error["code"] == "CLI_SERVICE_UNAVAILABLE", error
    assert f"the host (pid {host}) was killed by SIGKILL" in error["message"], error


def test_a_start_whose_caller_ignores_sigchld_gives_its_hosts_exit_status(
        tmp_path: Path) -> None:
    # libc's _exit, as a crashing extension ends the host (os._exit is a load failure).
    project = one_source_project(tmp_path, "dies", "import ctypes\nctypes.CDLL(None)._exit(3)\n")
    try:
        result = subprocess.run(
            [sys.executable, "-m", "intloom", "--project", str(project.root), "start",
             "--json"], capture_output=True, text=True, timeout=60,
            env={**os.environ, "NO_COLOR": "1"}, preexec_fn=_sigchld_ignored)
    finally:
        project.track_host()
        project.reap()
    assert result.returncode == 1, result
    error = json.loads(result.stdout)["error"]
    assert "exited with status 3" in error["message"], error
