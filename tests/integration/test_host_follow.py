"""A follower of a busy Run: its events are written from the publish that makes them durable,
so the stream's guarantees (history then live, nothing lost or repeated between them, a
bound on what a slow reader makes the host hold) hold without a task between the two."""

from __future__ import annotations

import json
import os
import socket
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from intloom.client.client import Client
from intloom.errors import IntloomError
from intloom.protocol.messages import RunEvent
from tests.helpers import Project, eventually, one_source_project, reaped
from tests.integration.host_support import encode, hello_frame, raw, reply, start, token_of

# Each Step records one effect keyed by its count: a follower's effect keys must run 0, 1,
# 2, ... with no gap and no repeat, across its history and its live events alike. The long
# name makes each event ~1 KiB: a reader that stops fills the socket's buffers in moments.
BUSY = textwrap.dedent('''
    import msgspec

    import intloom


    class Count(msgspec.Struct):
        n: int = 0


    busy = intloom.Workflow("busy", version="1")
    spin = busy.stage("spin", state=Count)


    # "done" is never returned: a Workflow none of whose routes completes is refused.
    @spin.step("tick", routes={"again": "tick", "done": intloom.COMPLETE})
    async def tick(ctx):
        await ctx.aeffect("tick" * 250, str, key=str(ctx.state.n))
        ctx.state = Count(n=ctx.state.n + 1)
        return "again"
''')


FOLLOW_SNDBUF = 16 * 1024


@pytest.fixture
def busy(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "busy", BUSY))


def _effects(events: Iterator[RunEvent], live: int) -> list[tuple[int, bool]]:
    """(effect key, from the history) of each ``effect_done`` event, until ``live`` live
    ones came."""
    got: list[tuple[int, bool]] = []
    for event in events:
        if event.event == "effect_done":
            got.append((int(event.detail["key"]), event.history))
            if sum(1 for _, history in got if not history) >= live:
                break
    return got


def test_a_follower_of_a_busy_run_gets_its_history_then_every_live_event_once(
    busy: Project,
) -> None:
    start(busy)
    with Client.connect(busy.root) as client:
        run = client.create_run("busy", "{}", wait=False)
    # Attach mid-flight, while Steps keep publishing: the history read and the first live
    # publish must meet with nothing between them. A first follower sees a few effects done,
    # so the second one's history holds some (its first event was live once: attached at once).
    with Client.connect(busy.root) as early:
        warm = early.subscribe(run.run_id)
        _effects(warm, live=3)
        warm.close()
    with Client.connect(busy.root) as follower:
        stream = follower.subscribe(run.run_id)
        got = _effects(stream, live=300)
        stream.close()
    history = [h for _, h in got]
    assert history[0] and history == sorted(history, reverse=True), (
        "the follower's history did not come first, whole, before its live events")
    keys = [k for k, _ in got]
    first = keys[0]
    assert keys == list(range(first, first + len(keys))), (
        f"a gap or a repeat in the follower's effect keys at index "
        f"{next(i for i, k in enumerate(keys) if k != first + i)} "
        f"(the history has {sum(history)})")


def test_a_follower_that_stops_reading_a_busy_run_is_disconnected_at_the_bound(
    busy: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With events written from the publish, nothing waits for a slow reader: past the
    bound of bytes unsent, the host closes that connection (the Run, and the host, go on)."""
    monkeypatch.setenv("INTLOOM_TEST_FOLLOW_BACKLOG", str(64 * 1024))
    # The follower's kernel send buffer held ~4 MiB (autotuned) before any of the backlog
    # did: 1-12 s of events, by the disk's fsync speed. A small one is full in moments.
    monkeypatch.setenv("INTLOOM_TEST_FOLLOW_SNDBUF", str(FOLLOW_SNDBUF))
    service = start(busy).service
    with Client.connect(busy.root) as client:
        run = client.create_run("busy", "{}", wait=False)
        sock = raw(service.port)
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(hello_frame(token_of(busy)))
            reply(sock)  # the hello's answer; from here on, nothing is read
            sock.sendall(encode({"op": "subscribe", "runId": run.run_id}))
            (log,) = (busy.state / "logs").iterdir()
            eventually(lambda: "follower_too_slow" in log.read_text(), timeout=20,
                       what="the host to close the follower that stopped reading")
            # Closed by the host: a byte sent now meets a reset (the kernel may still hold
            # bytes the host wrote before; reading them at this window would take minutes).
            eventually(lambda: _reset(sock), timeout=10, what="the follower's connection closed")
        # Keyed runId as every other record about a Run (jq 'select(.runId == ...)'
        # missed it, keyed run_id only).
        (cut,) = [record for line in log.read_text().splitlines()
                  for record in (json.loads(line),) if record["event"] == "follower_too_slow"]
        assert cut["runId"] == run.run_id
        assert client.get_run(run.run_id).status == "running"
        client.cancel(run.run_id)



def test_a_client_cut_as_too_slow_is_told_its_host_still_serves(
    busy: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Client's own stream cut at the bound: its error said "the host may have stopped
    or crashed" and to wait "once a host runs", while the host served on."""
    monkeypatch.setenv("INTLOOM_TEST_FOLLOW_BACKLOG", str(64 * 1024))
    # The follower's kernel send buffer held ~4 MiB (autotuned) before any of the backlog
    # did: 1-12 s of events, by the disk's fsync speed. A small one is full in moments.
    monkeypatch.setenv("INTLOOM_TEST_FOLLOW_SNDBUF", str(FOLLOW_SNDBUF))
    start(busy)
    with Client.connect(busy.root) as client, Client.connect(busy.root) as follower:
        run = client.create_run("busy", "{}", wait=False)
        stream = follower.subscribe(run.run_id)
        next(stream)  # subscribed; from here on, nothing is read until the host cuts it
        (log,) = (busy.state / "logs").iterdir()
        eventually(lambda: "follower_too_slow" in log.read_text(), timeout=20,
                   what="the host to close the follower that stopped reading")
        with pytest.raises(IntloomError) as caught:
            for _event in stream:
                pass
        assert caught.value.code == "PROJECT_REQUEST_FAILED"
        message = caught.value.message
        assert "may have stopped or crashed" not in message, message
        assert f"its host (pid {follower.hello.pid}) still serves" in message, message
        assert "follower_too_slow" in message and f"intloom inspect {run.run_id}" in message
        # A read the host that serves on closed: safe to send again, on this very Client,
        # which refused it ("its connection broke") with retryable false.
        assert caught.value.retryable is True
        assert follower.get_run(run.run_id).run_id == run.run_id
        assert client.get_run(run.run_id).status == "running"
        client.cancel(run.run_id)


def _reset(sock: socket.socket) -> bool:
    try:
        sock.send(b"x")
    except OSError:
        return True
    return False


# Each Run writes a few MiB (its effects' results) and then waits: a log of several Runs
# that a follower of any of them, once restored, reads back for its history.
HEAVY = textwrap.dedent('''
    import intloom


    heavy = intloom.Workflow("heavy", version="1")
    work = heavy.stage("work")


    @work.step("fill", routes={"filled": "wait"})
    def fill(ctx):
        for i in range(4):
            ctx.effect("blob", str, "x" * 1_000_000, key=str(i))
        return "filled"


    @work.step("wait", routes={"ok": intloom.COMPLETE})
    async def wait(ctx):
        answer = await ctx.confirm({"go": True})
        return "ok"


    @wait.recover
    def wait_recover(ctx, saved):
        return "ok"
''')


@pytest.fixture
def heavy(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "heavy", HEAVY))


def _read_bytes(pid: int) -> int:
    """Bytes the process has read (files and sockets alike), as the kernel counts them."""
    with open(f"/proc/{pid}/io", encoding="ascii") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("rchar:"))


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs /proc/<pid>/io")
def test_followers_of_restored_runs_at_once_share_one_read_of_the_log(
    heavy: Project,
) -> None:
    # The first follower of a restored Run reads its earlier history from the log: every
    # segment, one read at a time. Each follower had a read of its own, so the last of many
    # waited for all of them (8 followers of a busy project's restored Runs: 76 s for the
    # last one's first event). Reads that begin while others wait now serve them all.
    project = heavy
    start(project)
    with Client.connect(project.root) as client:
        runs = [client.create_run("heavy", "{}", wait=True).run_id for _ in range(6)]
    assert project.cli("stop", "--json").code == 0
    log = sum(f.stat().st_size for f in (project.state / "runtime" / "wal").iterdir())
    assert log > 20_000_000
    pid = start(project).service.pid
    before = _read_bytes(pid)
    firsts: dict[str, RunEvent] = {}

    def follow(run_id: str) -> None:
        with Client.connect(project.root) as client:
            stream = client.subscribe(run_id)
            firsts[run_id] = next(stream)
            stream.close()

    threads = [threading.Thread(target=follow, args=(run_id,)) for run_id in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(firsts) == sorted(runs)
    assert all(event.history for event in firsts.values())
    reads = (_read_bytes(pid) - before) / log
    # One read for the first follower, one for those that came while it ran (a third
    # for a late one at most); one each was six.
    assert reads < 3.5, f"the host read the log {reads:.1f} times for 6 followers"


def test_attach_waits_for_a_history_the_host_is_slow_to_send(
    project: Project, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first follower of a restored Run waits while the host reads its earlier records
    from the journal (seconds, on a log of some GB). attach gave the history the 3 s it gives
    a display that lags: without a terminal it printed the Run's view with no history at all,
    and on one it prompted, the history printed under the prompt. Here the host is held
    (SIGSTOP) past that bound, then let go."""
    import signal

    from intloom.cli.commands import attach
    from intloom.cli.render import Renderer

    monkeypatch.setattr(attach, "_CATCH_UP", 0.2)
    start(project)
    with Client.connect(project.root) as client:
        run = client.create_run("example", "notes")
    assert run.status == "waiting"
    with Client.connect(project.root) as client:
        client.stop(client.hello.instance_id)
    eventually(lambda: not (project.state / "service.json").exists(), what="the host to stop")
    pid = start(project).service.pid
    with Client.connect(project.root) as client:
        view = client.get_run(run.run_id)
    follower = attach._Follower(project.root, run.run_id, Renderer(), None)
    os.kill(pid, signal.SIGSTOP)
    resume = threading.Timer(1.0, os.kill, (pid, signal.SIGCONT))  # the slow read's length
    try:
        resume.start()
        follower.start()
        follower.catch_up(view)
        shown = capsys.readouterr().out
    finally:
        resume.cancel()
        os.kill(pid, signal.SIGCONT)
        follower.close(wait=False)
        follower.join(timeout=10)
    assert "  restored  " in shown and "  waiting  " in shown, (
        f"attach went ahead of the history it had not received yet:\n{shown}")


# A Run with a long history that then waits, publishing nothing: ~200 KB per confirmation.
ASKER = textwrap.dedent('''
    import intloom

    asker = intloom.Workflow("asker", version="1")
    main = asker.stage("main")


    @main.step("ask", routes={"again": "ask", "done": intloom.COMPLETE})
    async def ask(ctx):
        confirmed = await ctx.confirm({"blob": "x" * 200_000})
        return "done" if confirmed.confirmed else "again"
''')


@pytest.fixture
def asker(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "asker", ASKER))


def _long_history(project: Project, client: Client, rounds: int) -> str:
    run = client.create_run("asker", "x")
    for _ in range(rounds):
        assert run.pending_action is not None, run
        run = client.answer(run.run_id, run.pending_action.id, {"isConfirmed": False})
    return run.run_id


def _stalled(port: int, project: Project, run_id: str, *, small: bool = True) -> socket.socket:
    """A subscriber that reads nothing after the hello's reply (``small``: with a receive
    buffer of 4 KiB, so the host's side fills in moments)."""
    sock = raw(port)
    if small:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(hello_frame(token_of(project)))
    reply(sock)
    sock.sendall(encode({"op": "subscribe", "runId": run_id}))
    return sock


def test_a_follower_that_never_reads_a_waiting_runs_history_is_closed(
    asker: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backlog was checked only when the Run published: a follower that stopped reading
    the history of a waiting Run (which publishes nothing) held it in the host for good, ~78
    MB each for an 84 MB history. Not drained within the write timeout, it is closed."""
    monkeypatch.setenv("INTLOOM_TEST_WRITE_TIMEOUT", "1")
    monkeypatch.setenv("INTLOOM_TEST_FOLLOW_SNDBUF", str(FOLLOW_SNDBUF))
    service = start(asker).service
    with Client.connect(asker.root) as client:
        run_id = _long_history(asker, client, 10)  # ~4 MB of history
        with _stalled(service.port, asker, run_id) as sock:
            (log,) = (asker.state / "logs").iterdir()
            eventually(lambda: "follower_too_slow" in log.read_text(), timeout=20,
                       what="the host to close the follower that never read")
            eventually(lambda: _reset(sock), timeout=10, what="the follower's connection closed")
        assert client.get_run(run_id).status == "waiting"


def test_a_follower_is_refused_while_the_others_hold_too_much_unread(
    asker: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twenty followers that stopped reading an 84 MB history held 1.67 GB: each history is
    built whole. Past a bound on what followers together leave unread, a new one is refused
    BUSY (retryable), saying why and what frees it."""
    monkeypatch.setenv("INTLOOM_TEST_FOLLOW_HELD", str(512 * 1024))
    monkeypatch.setenv("INTLOOM_TEST_FOLLOW_SNDBUF", str(FOLLOW_SNDBUF))
    service = start(asker).service
    with Client.connect(asker.root) as client:
        run_id = _long_history(asker, client, 10)
        with _stalled(service.port, asker, run_id):
            with pytest.raises(IntloomError) as refused:
                eventually(lambda: next(iter(client.subscribe(run_id))) and False,
                           timeout=20, what="a follower to be refused")
            assert refused.value.code == "BUSY", refused.value
            assert refused.value.retryable is True
            assert "followers have not read" in refused.value.message, refused.value.message


def test_a_follower_that_reads_a_long_history_slowly_is_not_closed(
    asker: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The history must be read, not read within the write timeout: a follower reading ~8 MB
    of events at a steady pace, slower than the 1 s timeout set here, gets all of it and its
    caught-up mark, where the first form of the check closed it after 1 s."""
    monkeypatch.setenv("INTLOOM_TEST_WRITE_TIMEOUT", "1")
    monkeypatch.setenv("INTLOOM_TEST_FOLLOW_SNDBUF", str(FOLLOW_SNDBUF))
    service = start(asker).service
    with Client.connect(asker.root) as client:
        run_id = _long_history(asker, client, 20)
        # Not a 4 KiB receive buffer: over loopback, its window stalls on delayed ACKs.
        with _stalled(service.port, asker, run_id, small=False) as sock:
            events = 0
            began = time.monotonic()
            sock.settimeout(20)
            while True:
                event = reply(sock)
                assert isinstance(event, RunEvent), event  # not closed as too slow
                events += 1
                if event.caught_up:
                    break
                time.sleep(0.015)  # the pace of a slow reader, not a wait for anything
            took = time.monotonic() - began
        (log,) = (asker.state / "logs").iterdir()
        assert "follower_too_slow" not in log.read_text()
        assert took > 1.0, took  # slower than the write timeout, so the test means something
        assert events > 100, events
        assert client.get_run(run_id).status == "waiting"


def test_the_streams_of_ended_runs_count_toward_what_followers_leave_unread(
    asker: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ended Run's stream is written whole before it is counted, and dropped from the
    count as its final event went out: five followers that never read a completed Run's
    history were all admitted past the bound, and a sixth was served too."""
    monkeypatch.setenv("INTLOOM_TEST_FOLLOW_HELD", str(512 * 1024))
    monkeypatch.setenv("INTLOOM_TEST_FOLLOW_SNDBUF", str(FOLLOW_SNDBUF))
    service = start(asker).service
    with Client.connect(asker.root) as client:
        run_id = _long_history(asker, client, 10)
        pending = client.get_run(run_id).pending_action
        assert pending is not None
        assert client.answer(run_id, pending.id, {"isConfirmed": True}).status == "completed"
        with _stalled(service.port, asker, run_id):
            with pytest.raises(IntloomError) as refused:
                eventually(lambda: next(iter(client.subscribe(run_id))) and False,
                           timeout=20, what="a follower to be refused")
            assert refused.value.code == "BUSY", refused.value


def test_a_follower_of_a_cancelled_run_sees_what_a_later_attach_sees(
    project: Project,
) -> None:
    """The cancel's `failed` was published after the flush that showed `terminal`, which
    ends a follower's stream: the follower never saw it, a later attach did (in the
    history). It is now in the same change, and final."""
    start(project)
    with Client.connect(project.root) as client, Client.connect(project.root) as follower:
        run = client.create_run("example", "notes", wait=True)
        assert run.status == "waiting"
        stream = follower.subscribe(run.run_id)
        live = [next(stream)]  # subscribed: the history is on its way
        client.cancel(run.run_id)
        live.extend(stream)
        late = list(client.subscribe(run.run_id))
    assert [(e.event, e.final) for e in live[-2:]] == [("terminal", False), ("failed", True)]
    assert live[-1].detail == {"code": "RUN_STOPPED"}
    # The same events, each once; a later subscriber's history ends with the Run's end.
    assert [e.event for e in live] == [e.event for e in late[:-1]]
    assert (late[-1].event, late[-1].final) == ("end", True)
