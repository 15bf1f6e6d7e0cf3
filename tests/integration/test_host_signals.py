"""Signals are flags: SIGTERM/SIGINT stop the host gracefully, a second one cuts the waits
short, a signal during startup aborts it cleanly, and --foreground stops on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from intloom.client.client import Client
from intloom.client.lifecycle import STOP_TIMEOUT_ENV, start_service
from intloom.errors import IntloomError
from tests.helpers import REPO, Project, eventually, foreground_host, ok, pid_alive
from tests.integration.host_support import metadata, start, start_on_a_thread


def _released(project: Project, pid: int) -> bool:
    return (
        not pid_alive(pid)
        and not (project.state / "service.json").exists()
        and not (project.state / "service.lock").exists()
    )


def _events(project: Project, log_file: str | None) -> list[str]:
    assert log_file is not None
    path = project.state / "logs" / log_file
    return [json.loads(line)["event"] for line in path.read_text().splitlines()]


def _sealed(project: Project, log_file: str | None) -> bool:
    assert log_file is not None
    return stat.S_IMODE((project.state / "logs" / log_file).stat().st_mode) == 0o400


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGQUIT, signal.SIGXCPU, signal.SIGPWR],
                         ids=lambda sig: sig.name)
def test_sigterm_and_sigquit_are_a_graceful_stop(project: Project, sig: signal.Signals) -> None:
    """SIGQUIT (Ctrl-\\) too: its default action ended the host without a word and left its
    service files stale. So did SIGXCPU (a CPU-time limit's warning) and SIGPWR."""
    service = start(project).service
    os.kill(service.pid, sig)
    eventually(lambda: _released(project, service.pid), timeout=10,
               what="the host to release its files")
    events = _events(project, service.log_file)
    assert "signal_received" in events
    assert events[-1] == "log_closed"
    assert _sealed(project, service.log_file)
    assert (project.state / "connection.json").exists()


GATE_STEP = textwrap.dedent('''
    from __future__ import annotations

    import time
    from pathlib import Path

    import msgspec

    import intloom


    class Box(msgspec.Struct):
        value: str = ""


    wf = intloom.Workflow("stuck", version="1.0.0")
    main = wf.stage("main", state=Box)
    HERE = Path(__file__).resolve().parent.parent


    def wait_for_gate() -> str:
        (HERE / "entered").touch()
        deadline = time.monotonic() + 30  # longer than any test holds it
        while not (HERE / "gate").exists():
            if time.monotonic() > deadline:  # fails the Run, with why, not a hang
                raise TimeoutError(f"{HERE / 'gate'} was not created within 30 s: the test "
                                   "holding this Step never let it go on")
            time.sleep(0.01)  # user code stuck in an external call
        return "done"


    @main.step("work", routes={"done": intloom.COMPLETE})
    def work(ctx: intloom.StepContext[Box]) -> str:
        return ctx.effect("wait", wait_for_gate)
''')


def _stopping_in_its_grace(project: Project, monkeypatch: pytest.MonkeyPatch,
                           grace: str = "45", signalled: bool = False) -> tuple[Any, str]:
    """The project's host started with a Run whose Step is stuck (GATE_STEP, released by
    the ``gate`` file), then asked to stop (``signalled``: by SIGTERM, else by a client's
    stop request): it is in its grace. Its ServiceView, and the Run's id."""
    (project.root / "workflows" / "stuck.py").write_text(GATE_STEP)
    (project.root / "intloom.toml").write_text('workflows = ["workflows/stuck.py"]\n')
    monkeypatch.setenv("INTLOOM_TEST_SUSPEND_GRACE", grace)
    service = start(project).service
    try:
        with Client.connect(project.root) as client:
            run_id = client.create_run("stuck", "go", wait=False).run_id
            eventually(lambda: (project.root / "entered").exists(), timeout=10,
                       what="the Step to start")
            if not signalled:
                client.stop(service.instance_id)
        if signalled:
            os.kill(service.pid, signal.SIGTERM)
        eventually(lambda: "service_stopping" in _events(project, service.log_file),
                   timeout=10, what="the graceful stop to begin")
    except BaseException:
        (project.root / "gate").touch()
        raise
    return service, run_id


def test_second_signal_cuts_the_graceful_wait_short(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    service, _ = _stopping_in_its_grace(project, monkeypatch, signalled=True)
    try:
        os.kill(service.pid, signal.SIGTERM)
        # Far sooner than the 45 s grace: the second signal forced the exit.
        eventually(lambda: _released(project, service.pid), timeout=10,
                   what="the host to exit after the second signal")
        events = _events(project, service.log_file)
        assert "shutdown_step_cut_short" in events
        assert events[-1] == "log_closed"
    finally:
        (project.root / "gate").touch()


def test_a_second_ctrl_c_on_a_foreground_host_says_what_it_cut_short(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second Ctrl-C ends a foreground host at once (os._exit, not waiting for the Step
    inside user code): the terminal is still told that it stopped, and that the Steps it did
    not wait for come back RUN_INTERRUPTED -- not silence."""
    (project.root / "workflows" / "stuck.py").write_text(GATE_STEP)
    (project.root / "intloom.toml").write_text('workflows = ["workflows/stuck.py"]\n')
    monkeypatch.setenv("INTLOOM_TEST_SUSPEND_GRACE", "45")
    try:
        with foreground_host(project) as proc:
            log_file = metadata(project, "service.json")["logFile"]
            with Client.connect(project.root) as client:
                client.create_run("stuck", "go", wait=False)
            eventually(lambda: (project.root / "entered").exists(), timeout=10,
                       what="the Step to start")
            proc.send_signal(signal.SIGINT)
            eventually(lambda: "service_stopping" in _events(project, log_file),
                       timeout=10, what="the graceful stop to begin")
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, (out, err)
        assert "Traceback" not in err
        assert err.splitlines()[-1].startswith(
            "The service stopped at once (a second Ctrl-C or signal): it did not wait for the "
            "Steps still running; the next start reports their Runs RUN_INTERRUPTED"), err
    finally:
        (project.root / "gate").touch()


SLOW_IMPORT = textwrap.dedent('''
    import time
    from pathlib import Path

    HERE = Path(__file__).resolve().parent.parent
    (HERE / "importing").touch()
    deadline = time.monotonic() + 30  # longer than any test holds it
    while not (HERE / "gate").exists():
        if time.monotonic() > deadline:  # fails the start, with why, not a hang
            raise TimeoutError(f"{HERE / 'gate'} was not created within 30 s: the test "
                               "holding this import never let it go on")
        time.sleep(0.01)  # a Workflow module that takes a while to import

    from workflows.example import wf  # noqa: E402,F401
''')


def test_signal_during_startup_aborts_it_and_releases_everything(
    project: Project,
) -> None:
    (project.root / "workflows" / "__init__.py").write_text("")
    (project.root / "workflows" / "slow.py").write_text(SLOW_IMPORT)
    (project.root / "intloom.toml").write_text('workflows = ["workflows/slow.py"]\n')
    thread, outcome = start_on_a_thread(project, timeout=40)
    try:
        eventually(lambda: (project.root / "importing").exists(), timeout=20,
                   what="the host to load Workflows")
        pid = int(metadata(project, "service.lock")["pid"])
        project.pids.add(pid)
        os.kill(pid, signal.SIGTERM)
    finally:
        (project.root / "gate").touch()
        thread.join(timeout=45)
    assert len(outcome) == 1
    error = outcome[0]
    assert isinstance(error, IntloomError), error
    assert error.code == "CLI_SERVICE_CLOSING"
    eventually(lambda: _released(project, pid), timeout=10, what="the host to release")


FOREGROUND = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    from intloom.client.lifecycle import start_service

    def ready(result):
        print(json.dumps({"pid": result.service.pid, "log": result.service.log_file}),
              flush=True)

    result = start_service(Path(sys.argv[1]), foreground=True, on_ready=ready)
    print(json.dumps({"stopped": result.service.instance_id}), flush=True)
''')


def test_foreground_host_stops_gracefully_on_ctrl_c(project: Project) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", FOREGROUND, str(project.root)], cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    project.pids.add(proc.pid)
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert first["pid"] == proc.pid  # the host runs in this very process
        with Client.connect(project.root) as client:
            assert client.status().pid == proc.pid
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        assert "stopped" in json.loads(out.splitlines()[-1])
        assert not (project.state / "service.json").exists()
        assert not (project.state / "service.lock").exists()
        assert _sealed(project, first["log"])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


TO_THREAD_STEP = textwrap.dedent('''
    from __future__ import annotations

    import asyncio
    import time
    from pathlib import Path

    import intloom

    HERE = Path(__file__).resolve().parent.parent
    wf = intloom.Workflow("offloaded", version="1.0.0")
    main = wf.stage("main")


    def blocking_call() -> None:
        (HERE / "entered").touch()
        deadline = time.monotonic() + 30  # longer than the test waits for the host to exit
        while not (HERE / "gate").exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{HERE / 'gate'} was not created within 30 s: the test "
                                   "holding this call never let it go on")
            time.sleep(0.01)  # user code stuck in an external call, on asyncio's executor


    @main.step("work", routes={"done": intloom.COMPLETE})
    async def work(ctx: intloom.StepContext[None]) -> str:
        await asyncio.to_thread(blocking_call)
        return "done"
''')


def test_a_foreground_host_exits_though_a_to_thread_call_never_returns(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C on start --foreground while an async Step waits in asyncio.to_thread: the
    host waits a bounded time for asyncio's executor, then exits; it must not wait for user
    code (Python 3.11's loop.shutdown_default_executor joins its thread even when cancelled)."""
    monkeypatch.setenv("INTLOOM_TEST_SUSPEND_GRACE", "0.2")
    (project.root / "workflows" / "offloaded.py").write_text(TO_THREAD_STEP)
    (project.root / "intloom.toml").write_text('workflows = ["workflows/offloaded.py"]\n')
    try:
        with foreground_host(project) as proc:
            with Client.connect(project.root) as client:
                run = client.create_run("offloaded", "go", wait=False)
            eventually(lambda: (project.root / "entered").exists(), timeout=10,
                       what="the Step to call its blocking function")
            proc.send_signal(signal.SIGINT)
            try:
                out, err = proc.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                pytest.fail("the foreground host still waits for a thread inside user code")
        assert proc.returncode == 0, (out, err)
        assert "Traceback" not in err
        assert _released(project, proc.pid)
        # It ends with os._exit (the interpreter would join that thread): what its stop did
        # is said before, as after any Ctrl-C.
        assert f"  {run.run_id}: Step main/work was running" in err, err
    finally:
        (project.root / "gate").touch()


def test_start_does_not_wait_out_its_timeout_for_a_stopping_host_that_was_paused(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """start waits for a host that is stopping; one paused (SIGSTOP) on its way out finishes
    nothing, so start reports it (the hello went unanswered) instead of waiting out its whole
    --timeout."""
    service, _ = _stopping_in_its_grace(project, monkeypatch)
    try:
        os.kill(service.pid, signal.SIGSTOP)
        # The same unanswered hello, bounded at 1 s rather than the client's 5 s.
        monkeypatch.setenv("INTLOOM_TEST_CLIENT_HELLO_TIMEOUT", "1")
        began = time.monotonic()
        with pytest.raises(IntloomError) as failed:
            start_service(project.root, timeout=40)
        took = time.monotonic() - began
        assert failed.value.code == "CLI_SERVICE_UNAVAILABLE", failed.value
        assert took < 20, f"start waited {took:.1f} s of its 40 s for a paused host"
    finally:
        os.kill(service.pid, signal.SIGCONT)
        (project.root / "gate").touch()


def test_a_stop_that_finds_the_stopping_host_paused_says_so_at_once(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host paused (SIGSTOP) in its stop's grace: a second stop waited out the whole bound
    the host gave for its stop (27 s here), then timed out. It reads the pause and says it,
    with the kill -CONT that lets the host finish."""
    from intloom.client.lifecycle import stop_service_report

    service, _ = _stopping_in_its_grace(project, monkeypatch)
    try:
        os.kill(service.pid, signal.SIGSTOP)
        # Stopped by then, as a host a person paused is: one paused during the stop's hello
        # is waited for as long as --timeout allows (a busy host's hello may take long).
        eventually(lambda: psutil.Process(service.pid).status() == psutil.STATUS_STOPPED,
                   timeout=10, what="the host to be stopped by the signal")
        began = time.monotonic()
        with pytest.raises(IntloomError) as paused:
            stop_service_report(project.root, timeout=40)
        took = time.monotonic() - began
    finally:
        os.kill(service.pid, signal.SIGCONT)
        (project.root / "gate").touch()
    assert paused.value.code == "CLI_SERVICE_UNAVAILABLE", paused.value
    assert paused.value.message.startswith(
        f"The project's host (pid {service.pid}) was asked to stop, and is stopped by a "
        "signal"), paused.value.message
    assert f"kill -CONT {service.pid}" in paused.value.message
    assert took < 10, f"stop waited {took:.1f} s of its 40 s for a paused host"
    eventually(lambda: _released(project, service.pid), timeout=20,
               what="the host, resumed, to finish its stop")


def test_a_host_paused_through_its_stop_grace_still_names_the_runs_it_cut(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paused (SIGSTOP) past its grace and the bound around it, the stopping host found every
    timer due at once on SIGCONT: the bound cut the suspension before it logged which Runs
    it cut, and intloom stop blamed the log. The bound's late timer now gives it a moment."""
    # Grace 1 s: the suspension's bound is 3 s.
    service, run_id = _stopping_in_its_grace(project, monkeypatch, "1", signalled=True)
    try:
        os.kill(service.pid, signal.SIGSTOP)
        try:
            # The pause itself, the fault under test: past the grace and its bound (3 s),
            # and more than a second past it, so that the bound's timer fires late.
            time.sleep(5)
        finally:
            os.kill(service.pid, signal.SIGCONT)
        eventually(lambda: _released(project, service.pid), timeout=20,
                   what="the host to finish its stop")
        path = project.state / "logs" / str(service.log_file)
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        cut = [line for line in lines if line["event"] == "runs_cut_at_stop"]
        assert cut and cut[0]["runs"][0]["runId"] == run_id, lines[-8:]
        assert "wait" in cut[0]["runs"][0]["evidence"], cut
        assert not [line for line in lines if line["event"] == "shutdown_step_cut_short"
                    and line["step"] == "suspend"], lines[-8:]
    finally:
        (project.root / "gate").touch()


def test_a_plain_stop_waits_as_long_as_the_host_says_its_stop_may_take(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``intloom stop`` without --timeout gave up after 10 s whatever the host's stop had to
    do: a host closing 30,000 new snapshots (or holding a Step for its grace) went on to stop
    cleanly while the command reported CLI_SERVICE_TIMEOUT. Here the grace holds the stop
    past the stop's own deadline (those 10 s, and the grace 12 s, scaled down by their test
    hooks to 2 s and 5 s): the stop that sent the request waits for the bound the host's
    reply gave, and a second stop, refused at its hello as the host is stopping, for the
    bound the host's log gave. Both report the stop, and the Run it cut."""
    (project.root / "workflows" / "stuck.py").write_text(GATE_STEP)
    (project.root / "intloom.toml").write_text('workflows = ["workflows/stuck.py"]\n')
    own, grace = 2, 5  # the stop's deadline without --timeout; the grace outlasts it
    monkeypatch.setenv(STOP_TIMEOUT_ENV, str(own))
    monkeypatch.setenv("INTLOOM_TEST_SUSPEND_GRACE", str(grace))
    service = start(project).service
    stops: list[Any] = []
    first = threading.Thread(target=lambda: stops.append(project.cli("stop", "--json")))
    try:
        with Client.connect(project.root) as client:
            run_id = client.create_run("stuck", "go", wait=False).run_id
        eventually(lambda: (project.root / "entered").exists(), timeout=10,
                   what="the Step to start")
        first.start()
        eventually(lambda: "service_stopping" in _events(project, service.log_file),
                   timeout=10, what="the graceful stop to begin")
        second = project.cli("stop", "--json")
        first.join(60)
        assert not first.is_alive(), "the first stop did not end"
        for done in (stops[0], second):
            doc = ok(done)
            assert doc["stopped"] is True, doc
            assert [cut["runId"] for cut in doc["cut"]] == [run_id], doc
        assert _released(project, service.pid)
        assert service.log_file is not None
        lines = (project.state / "logs" / service.log_file).read_text().splitlines()
        stopping = next(e for e in map(json.loads, lines) if e["event"] == "service_stopping")
        # The grace, then closing connections and the store, then sealing the log.
        assert stopping["within"] > grace + 10, stopping
    finally:
        (project.root / "gate").touch()
        if first.is_alive():
            first.join(60)


@pytest.mark.parametrize(("value", "seconds"), [
    ("2", 2.0), ("0.5", 0.5), ("", 10.0), ("x", 10.0), ("0", 10.0), ("-1", 10.0),
    ("nan", 10.0), ("inf", 10.0),
])
def test_the_stop_timeout_hook_takes_only_a_positive_number_of_seconds(
    monkeypatch: pytest.MonkeyPatch, value: str, seconds: float
) -> None:
    """The hook the test above scales the stop's own deadline down with: anything but a
    positive number of seconds leaves the 10 s (a test hook must not fail a CLI)."""
    from intloom.client.lifecycle import _default_stop_timeout

    monkeypatch.setenv(STOP_TIMEOUT_ENV, value)
    assert _default_stop_timeout() == seconds


IGNORED = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGVTALRM, signal.SIGPROF)


def test_a_signal_the_host_does_not_use_is_logged_and_ignored(project: Project) -> None:
    """SIGUSR1 and SIGUSR2 (log rotation tools send them), and SIGALRM, SIGVTALRM and SIGPROF
    (a stray timer), used to end the host at once, by their default action: no line in its
    log, its service files left stale, its Runs cut."""
    service = start(project).service
    for sig in IGNORED:
        os.kill(service.pid, sig)

    def ignored() -> list[dict[str, Any]] | None:
        assert service.log_file is not None
        lines = [json.loads(line) for line in
                 (project.state / "logs" / service.log_file).read_text().splitlines()]
        found = [e for e in lines if e["event"] == "signal_received"
                 and e.get("action") == "ignore"]
        return found if len(found) == len(IGNORED) else None

    seen = eventually(ignored, timeout=10, what="every signal logged as ignored")
    assert sorted(e["signal"] for e in seen) == sorted(sig.name for sig in IGNORED)
    assert pid_alive(service.pid)
    with Client.connect(project.root) as client:
        assert client.status().pid == service.pid
    assert metadata(project, "service.json")["pid"] == service.pid


RESETTER = textwrap.dedent('''
    import signal

    import intloom

    wf = intloom.Workflow("resetter", version="1")
    s = wf.stage("s")


    @s.step("a", routes={"done": intloom.COMPLETE})
    async def a(ctx: intloom.StepContext[None]) -> str:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # what a library may do
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        return "done"
''')


def test_a_handler_workflow_code_replaced_is_put_back_and_a_sigterm_still_stops_gracefully(
        project: Project) -> None:
    """An async Step that set SIGTERM back to its default: the next kill -TERM (a
    supervisor's stop) killed the host on the spot, with no line in its log and its files
    left as a crash leaves them."""
    (project.root / "workflows" / "resetter.py").write_text(RESETTER)
    (project.root / "intloom.toml").write_text('workflows = ["workflows/resetter.py"]\n')
    service = start(project).service
    with Client.connect(project.root) as client:
        assert client.create_run("resetter", "x").status == "completed"

    def put_back() -> list[str] | None:
        assert service.log_file is not None
        lines = [json.loads(line) for line in
                 (project.state / "logs" / service.log_file).read_text().splitlines()]
        found = sorted(e["signal"] for e in lines if e["event"] == "signal_handler_replaced")
        return found if len(found) == 2 else None

    assert eventually(put_back, timeout=10, what="both handlers put back") == ["SIGTERM",
                                                                                "SIGUSR1"]
    os.kill(service.pid, signal.SIGUSR1)  # ignored again, not the default's end
    os.kill(service.pid, signal.SIGTERM)
    eventually(lambda: _released(project, service.pid), timeout=10,
               what="the host to stop gracefully")
    events = _events(project, service.log_file)
    assert events[-1] == "log_closed" and "signal_received" in events, events


def _started_from(project: Project, preexec: Callable[[], None]) -> dict[str, Any]:
    """``intloom start --json`` run by a launcher that ran ``preexec`` before the exec (its
    signal mask or dispositions, which the host inherits); the started service's view."""
    result = subprocess.run(
        [sys.executable, "-m", "intloom", "--project", str(project.root), "start", "--json"],
        capture_output=True, text=True, timeout=60, preexec_fn=preexec,
        env={**os.environ, "NO_COLOR": "1"},
    )
    project.track_host()
    assert result.returncode == 0, result.stderr
    service: dict[str, Any] = json.loads(result.stdout)["service"]
    return service


def test_a_host_launched_with_the_stop_signals_blocked_still_stops_on_them(
        project: Project) -> None:
    """A blocked signal mask survives fork and exec: a host launched by a program that blocks
    SIGTERM, SIGINT and SIGHUP (as some supervisors and threaded programs do) left every
    ``kill -TERM`` pending for ever, and a start --timeout's SIGTERM ended in a SIGKILL."""
    stops = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}

    def blocked() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, stops)

    service = _started_from(project, blocked)
    pid = service["pid"]
    os.kill(pid, signal.SIGTERM)
    eventually(lambda: _released(project, pid), timeout=15,
               what="the host to stop on SIGTERM and release its files")
    assert "signal_received" in _events(project, service["logFile"])


EXIT_CODE_STEP = textwrap.dedent('''
    from __future__ import annotations

    import subprocess
    import sys
    from pathlib import Path

    import intloom

    wf = intloom.Workflow("child", version="1.0.0")
    main = wf.stage("main")


    @main.step("run", routes={"done": intloom.COMPLETE})
    def run(ctx: intloom.StepContext[None]) -> str:
        code = subprocess.run([sys.executable, "-c", "raise SystemExit(3)"]).returncode
        (Path(__file__).resolve().parent.parent / "code").write_text(str(code))
        return "done"
''')


def test_a_step_sees_its_child_process_exit_status_though_the_launcher_ignored_sigchld(
        project: Project) -> None:
    """SIGCHLD ignored survives exec, and then the kernel reaps every child at once: a host
    launched by a program that ignores it ran Steps whose subprocess.run() said 0 of a
    program that failed."""
    (project.root / "workflows" / "child.py").write_text(EXIT_CODE_STEP)
    (project.root / "intloom.toml").write_text('workflows = ["workflows/child.py"]\n')

    def ignored() -> None:
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)

    _started_from(project, ignored)
    run = ok(project.cli("flow", "child", "--intent", "go", "--json"))["run"]
    assert run["status"] == "completed", run
    assert (project.root / "code").read_text() == "3"


def test_a_command_to_a_host_stopped_by_sigstop_says_so_and_how_to_resume_it(
        project: Project) -> None:
    """A host paused by SIGSTOP (Ctrl-Z, a debugger) left every command at "a hung, paused
    or busy host, or another program on the port", though which it is can be read."""
    pid = start(project).service.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        runs = project.cli("runs", "--json",
                           env={"INTLOOM_TEST_CLIENT_HELLO_TIMEOUT": "0.5"})
    finally:
        os.kill(pid, signal.SIGCONT)
    error = runs.json["error"]
    assert error["code"] == "CLI_SERVICE_UNAVAILABLE", error
    assert f"The host (pid {pid}) is stopped by a signal" in error["message"], error
    assert f"kill -CONT {pid}" in error["message"], error
    with Client.connect(project.root) as client:  # resumed, it answers again
        assert client.status().pid == pid


def test_start_against_a_host_stopped_by_sigstop_says_it_is_alive_and_how_to_resume_it(
        project: Project) -> None:
    """start against a paused host gave the client's "then try again", which left open
    whether a start would launch over it. It is CLI_SERVICE_UNAVAILABLE, as for any host
    that does not answer (not BUSY, whose way out is recover once the owner has exited):
    the host is alive, nothing else was started, and kill -CONT resumes it."""
    pid = start(project).service.pid
    logs = sorted((project.state / "logs").iterdir())
    os.kill(pid, signal.SIGSTOP)
    try:
        refused = project.cli("start", "--json",
                              env={"INTLOOM_TEST_CLIENT_HELLO_TIMEOUT": "0.5"})
        assert psutil.Process(pid).status() == psutil.STATUS_STOPPED
    finally:
        os.kill(pid, signal.SIGCONT)
    error = refused.json["error"]
    assert refused.code == 1 and error["code"] == "CLI_SERVICE_UNAVAILABLE", refused
    assert error["message"].startswith(
        f"The project's host (pid {pid}) is alive but stopped by a signal (SIGSTOP, Ctrl-Z "
        "or a debugger)"), error
    assert "did not start a second host" in error["message"], error
    assert f"Resume it with kill -CONT {pid}: it then serves again" in error["message"], error
    assert sorted((project.state / "logs").iterdir()) == logs  # no host was launched
    resumed = ok(project.cli("start", "--json"))
    assert resumed["reused"] is True and resumed["service"]["pid"] == pid, resumed


def _start_with_site(project: Project, tmp_path: Path, site: str) -> dict[str, Any]:
    """``intloom start`` whose host runs ``site`` (a sitecustomize on PYTHONPATH, which the
    host inherits) as its interpreter starts: before any line of intloom."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(
        "import os, signal, sys\n"
        "if 'intloom.host' in sys.orig_argv:\n"
        f"    {site}\n")
    env = {**os.environ, "NO_COLOR": "1",
           "PYTHONPATH": os.pathsep.join((str(tmp_path / "site"), str(REPO)))}
    try:
        result = subprocess.run(
            [sys.executable, "-m", "intloom", "--project", str(project.root), "start",
             "--json"], capture_output=True, text=True, timeout=60, env=env)
    finally:
        project.track_host()
    assert result.returncode == 1, result
    error: dict[str, Any] = json.loads(result.stdout)["error"]
    return error


def test_a_sigterm_in_the_hosts_first_moments_stops_its_start(
        project: Project, tmp_path: Path) -> None:
    """Before the host installed its handlers (~0.2 s of imports), SIGTERM ended it by its
    default action; once unblocked, it was heard only after the host had reported ready."""
    error = _start_with_site(project, tmp_path, "os.kill(os.getpid(), signal.SIGTERM)")
    assert error["code"] == "CLI_SERVICE_CLOSING", error
    assert "asked to stop (SIGTERM)" in error["message"], error
    assert not (project.state / "service.lock").exists()
    assert not (project.state / "service.json").exists()


def test_a_host_killed_before_it_took_its_lock_is_said_to_leave_nothing(
        project: Project, tmp_path: Path) -> None:
    """The start sent the user to a log and a stale service.lock that did not exist."""
    error = _start_with_site(project, tmp_path, "os.kill(os.getpid(), signal.SIGKILL)")
    assert error["code"] == "CLI_SERVICE_UNAVAILABLE", error
    assert "was killed by SIGKILL before it took service.lock or opened a log" in \
        error["message"], error
    assert "intloom recover" not in error["message"], error
    assert not (project.state / "service.lock").exists()
