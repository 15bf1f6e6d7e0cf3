"""scripts/soak: a bounded soak of one project host, judged from files outside the host.

Many concurrent Runs of the soak fixture Workflows (Step loops, effects, confirmations,
questions, client Agent tasks with a Tool) are driven through ``intloom.client.Client`` while
clients stay attached with ``Client.subscribe``, and the host is stopped and started
gracefully and SIGKILLed -> ``recover`` -> started at seeded random moments. When the load
window ends and every Run has settled, the verdict comes from evidence the host cannot
bend:

* every Run's journal (``intloom.store.verify_report``): completed, or ending where the
  restart table names the row the last host showed (RUN_INTERRUPTED, naming the effect that
  was in flight, if any); no journal or file fails verification;
* ``counters.log``, written by the Workflows themselves before each Step, effect and Tool
  call: nothing ran twice, every effect the journal calls done ran exactly once, and nothing
  ran that the journal had not announced first;
* the host process (psutil): memory and open descriptors back near where they started, and
  only 127.0.0.1 sockets.

It talks to 127.0.0.1 only, reaps the hosts it started, and stops by itself at ``--deadline``.
It prints one JSON summary and exits 0 when there are no violations, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import msgspec
import psutil

from intloom.authoring.loader import LoadedWorkflow, load_workflows
from intloom.client.client import Client
from intloom.client.lifecycle import start_service, stop_service
from intloom.diagnostics import diagnose, recover
from intloom.errors import IntloomError
from intloom.project import ProjectPaths, load_config
from intloom.runtime.machine import restart_verdict
from intloom.runtime.model import RunView
from intloom.runtime.records import EffectDone, EffectStarted, Record, StepResult, decode_record
from intloom.store import verify_report
from intloom.store.files import Layout, list_names, read_file
from intloom.store.framing import KIND_RECORD, KIND_VOID, VoidNotice, scan_segment, segment_number
from intloom.store.snapshots import read_manifest
from tests.helpers import port_free

REPO: Final = Path(__file__).resolve().parent.parent
FIXTURE: Final = REPO / "fixtures" / "projects" / "soak"
MIB: Final = 1024 * 1024
WORKFLOWS: Final = ("soak-ticker", "soak-review", "soak-agent", "soak-ask")
# Codes a request may meet while the host is being stopped, killed, recovered or started.
TRANSIENT: Final = frozenset({
    "CLI_SERVICE_OFFLINE", "CLI_SERVICE_UNAVAILABLE", "CLI_SERVICE_CLOSING",
    "PROJECT_REQUEST_FAILED", "PROJECT_CONNECTION_FAILED", "CLI_SERVICE_METADATA_INVALID",
    "EXECUTION_OWNERSHIP_LOST",
})
# Codes a request may meet when a restart happened between seeing a wait and answering it.
STALE: Final = frozenset({"CONFLICT", "NOT_FOUND"})


@dataclass(frozen=True)
class Config:
    runs: int = 200  # Runs kept live at once during the load window
    clients: int = 20  # attached clients (Client.subscribe)
    workers: int = 8  # driver threads answering waits and doing Agent tasks
    graceful: int = 10  # graceful stop/start cycles
    kills: int = 3  # SIGKILL -> recover -> start cycles
    window: float = 60.0  # seconds of load; the cycles land inside its first 80 %
    settle: float = 90.0  # after the window, how long Runs get to finish
    deadline: float = 600.0  # hard limit for the whole soak
    seed: int = 1
    max_goal: int = 12  # longest ticker loop
    keep: bool = False  # keep the project directory (printed in the summary)


@dataclass
class HostSample:
    pid: int
    create_time: float  # with the pid, who this host is: a reused pid is never ours
    cause: str  # first / graceful / kill / final-check
    ready_rss: int = 0
    ready_fds: int = 0
    peak_rss: int = 0
    peak_fds: int = 0
    last_rss: int = 0
    last_fds: int = 0
    listen: list[str] = field(default_factory=list)
    remote: list[str] = field(default_factory=list)


@dataclass
class RunInfo:
    workflow: str
    epoch: int
    status: str = "running"
    view: RunView | None = None
    seen_epoch: int = 0  # the host instance that last showed ``status``


class Soak:
    """Shared state of one soak: what was created, what the host showed, what went wrong."""

    def __init__(self, cfg: Config, root: Path) -> None:
        self.cfg = cfg
        self.root = root
        self.rng = random.Random(cfg.seed)
        self.lock = threading.Lock()
        self.runs: dict[str, RunInfo] = {}
        self.up = threading.Event()
        self.loading = threading.Event()  # creators may add Runs
        self.quit = threading.Event()
        self.cut = threading.Event()  # the hard deadline passed
        self.epoch = 0
        self.violations: list[str] = []
        self.stats: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.hosts: list[HostSample] = []
        self.jobs: list[tuple[float, int, tuple[Any, ...]]] = []  # heap of (due, n, job)
        self.jobs_cv = threading.Condition(self.lock)
        self.job_seq = 0
        self.dispatched: set[tuple[str, str]] = set()
        self.first_seen: dict[tuple[str, str], float] = {}
        self.threads: list[threading.Thread] = []
        self.followers: set[Client] = set()  # closed at quit: a stream has no timeout
        self.end_sample: HostSample | None = None  # the last soak host, idle, at the end

    # ----- bookkeeping ----------------------------------------------------------------------

    def violation(self, text: str) -> None:
        with self.lock:
            if len(self.violations) < 200:
                self.violations.append(text)

    def note_error(self, where: str, exc: IntloomError, epoch: int) -> None:
        """Classify an error: expected around a restart, a violation otherwise."""
        with self.lock:
            self.errors[exc.code] += 1
            restarted = epoch != self.epoch or not self.up.is_set()
        # Only a stop, a kill or a start between seeing something and acting on it excuses an
        # error; the same error while the host simply serves is a finding.
        if restarted and (exc.code in TRANSIENT or exc.code in STALE):
            return
        self.violation(f"{where}: unexpected {exc.code}: {exc.message}")

    def count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.stats[key] += n

    def host(self) -> HostSample | None:
        with self.lock:
            return self.hosts[-1] if self.hosts else None

    def connect(self) -> tuple[Client, int] | None:
        """A client of the current host and that host's epoch; None once quitting.

        The epoch is read before connecting: should a restart slip in between, the client
        is labelled with the older host, which only ever excuses more.
        """
        while not self.quit.is_set():
            if not self.up.wait(0.2):
                continue
            epoch = self.epoch
            try:
                return Client.connect(self.root, request_timeout=60.0), epoch
            except IntloomError as exc:
                self.note_error("connect", exc, epoch)
                self.quit.wait(0.05)
        return None

    def spawn(self, name: str, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()


# ----- the host ------------------------------------------------------------------------------


def _sample(proc: psutil.Process) -> tuple[int, int]:
    return proc.memory_info().rss, proc.num_fds()


def _sockets(pid: int) -> tuple[list[str], list[str]]:
    """Listening addresses, and any peer that is not 127.0.0.1."""
    listen: list[str] = []
    remote: list[str] = []
    for conn in psutil.Process(pid).net_connections(kind="inet"):
        if conn.status == psutil.CONN_LISTEN:
            listen.append(f"{conn.laddr.ip}:{conn.laddr.port}")
        elif conn.raddr and conn.raddr.ip != "127.0.0.1":
            remote.append(f"{conn.raddr.ip}:{conn.raddr.port}")
    return listen, remote


def start_host(soak: Soak, cause: str) -> None:
    if soak.cut.is_set():
        raise CutShort("the soak was cut short before a host start")
    service = start_service(soak.root, timeout=120.0).service
    proc = psutil.Process(service.pid)
    sample = HostSample(pid=service.pid, create_time=proc.create_time(), cause=cause)
    sample.ready_rss, sample.ready_fds = _sample(proc)
    sample.peak_rss, sample.peak_fds = sample.ready_rss, sample.ready_fds
    sample.last_rss, sample.last_fds = sample.ready_rss, sample.ready_fds
    sample.listen, sample.remote = _sockets(service.pid)
    if not sample.listen or any(not a.startswith("127.0.0.1:") for a in sample.listen):
        soak.violation(f"host {service.pid} listens on {sample.listen}, not only 127.0.0.1")
    with soak.lock:
        soak.hosts.append(sample)
        soak.epoch += 1
    soak.up.set()


def _gone(pid: int) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class CutShort(Exception):
    """The hard deadline passed: stop driving, judge what there is."""


def sleep_until(soak: Soak, moment: float) -> None:
    """Wait for a scheduled moment of the soak (not for a condition), unless it is cut short."""
    while time.monotonic() < moment:
        if soak.quit.wait(min(0.05, max(0.0, moment - time.monotonic()))):
            raise CutShort("the hard deadline passed")


def poll(what: str, fn: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not fn():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)  # a poll interval


def graceful_cycle(soak: Soak) -> None:
    soak.up.clear()
    if not stop_service(soak.root, timeout=60.0):
        soak.violation("graceful cycle: stop found no running host")
    soak.count("cycles.graceful", 1)
    start_host(soak, "graceful")


def kill_cycle(soak: Soak) -> None:
    sample = soak.host()
    assert sample is not None
    soak.up.clear()
    if psutil.Process(sample.pid).create_time() != sample.create_time:
        raise RuntimeError(f"host {sample.pid} is not the process this soak started")
    os.kill(sample.pid, signal.SIGKILL)
    port = json.loads((soak.root / ".intloom" / "connection.json").read_text())["port"]
    poll(f"host {sample.pid} to exit", lambda: _gone(sample.pid), 20.0)
    # Its other threads hold the OS lock and the port a moment longer than the pid.
    poll("the lock and the port to be released",
         lambda: diagnose(soak.root, probe=False).status == "recovery_required"
         and port_free(port), 20.0)
    result = recover(soak.root, dry_run=False)
    if not result.recovered:
        soak.violation(f"kill cycle: recover did not recover ({result})")
    soak.count("cycles.kill", 1)
    start_host(soak, "kill")


def sampler(soak: Soak) -> None:
    """Host memory and descriptors, a few times a second, per host instance."""
    while not soak.quit.is_set():
        sample = soak.host()
        if sample is not None and soak.up.is_set():
            with contextlib.suppress(psutil.Error):
                rss, fds = _sample(psutil.Process(sample.pid))
                sample.peak_rss = max(sample.peak_rss, rss)
                sample.peak_fds = max(sample.peak_fds, fds)
                sample.last_rss, sample.last_fds = rss, fds
                _listen, remote = _sockets(sample.pid)
                if remote:
                    soak.violation(f"host {sample.pid} has non-local peers {remote}")
        soak.quit.wait(0.25)


# ----- load ----------------------------------------------------------------------------------


def _intent(rng: random.Random, workflow: str, max_goal: int) -> str:
    delay = rng.choice((0.0, 0.005, 0.01, 0.02, 0.04))
    goal = rng.randint(1, max_goal)
    return f"soak {workflow} goal={goal} delay={delay}"


def _unfinished(soak: Soak) -> int:
    with soak.lock:
        return sum(1 for r in soak.runs.values() if r.status in ("running", "waiting"))


def creator(soak: Soak, index: int) -> None:
    rng = random.Random(soak.cfg.seed * 1000 + index)
    client: Client | None = None
    epoch = 0  # the host ``client`` is connected to
    while soak.loading.is_set() and not soak.quit.is_set():
        if _unfinished(soak) >= soak.cfg.runs:
            soak.quit.wait(0.05)
            continue
        if client is None:
            got = soak.connect()
            if got is None:
                return
            client, epoch = got
        workflow = rng.choice(WORKFLOWS)
        try:
            view = client.create_run(workflow, _intent(rng, workflow, soak.cfg.max_goal),
                                     wait=False)
        except IntloomError as exc:
            soak.note_error("create_run", exc, epoch)
            client.close()
            client = None
            continue
        with soak.lock:
            soak.runs.setdefault(view.run_id, RunInfo(workflow=workflow, epoch=epoch, view=view,
                                                      seen_epoch=epoch))
            soak.stats["runs.created"] += 1
    if client is not None:
        client.close()


def _schedule(soak: Soak, key: tuple[str, str], job: tuple[Any, ...], rng: random.Random) -> None:
    """Queue ``job`` once, after a seeded think time counted from when it was first seen."""
    now = time.monotonic()
    with soak.lock:
        if key in soak.dispatched:
            return
        first = soak.first_seen.setdefault(key, now)
        due = first + rng.choice((0.0, 0.05, 0.2, 0.5, 1.0))
        soak.dispatched.add(key)
        soak.job_seq += 1
        heapq.heappush(soak.jobs, (due, soak.job_seq, job))
        soak.jobs_cv.notify()


def scanner(soak: Soak) -> None:
    """Lists the host's Runs, records what it shows, and queues the answers and Agent work."""
    rng = random.Random(soak.cfg.seed + 7)
    client: Client | None = None
    epoch = 0  # the host ``client`` is connected to: the one whose listing this is
    seen_epoch = -1
    while not soak.quit.is_set():
        if client is None:
            got = soak.connect()
            if got is None:
                return
            client, epoch = got
        try:
            views = client.runs()
        except IntloomError as exc:
            soak.note_error("runs", exc, epoch)
            client.close()
            client = None
            continue
        listed = {v.run_id for v in views}
        with soak.lock:
            if epoch != seen_epoch and epoch == soak.epoch:
                # A new host lists only unfinished Runs: one not listed ended on disk.
                for run_id, known in soak.runs.items():
                    if run_id not in listed and known.status in ("running", "waiting") \
                            and known.epoch < epoch:
                        known.status = "ended-earlier"
                seen_epoch = epoch
            for view in views:
                info = soak.runs.get(view.run_id)
                if info is None:
                    # Created by a request whose reply was lost to a stop or a kill (it is
                    # never resent), or a moment ago: either way, drive it and judge it.
                    info = soak.runs[view.run_id] = RunInfo(workflow=view.flow_name,
                                                            epoch=epoch)
                info.status, info.view, info.seen_epoch = view.status, view, epoch
        for view in views:
            if view.status != "waiting":
                continue
            if view.pending_action is not None:
                action = view.pending_action
                _schedule(soak, (view.run_id, action.id),
                          ("answer", view.run_id, action.id, epoch, action.kind, action.request),
                          rng)
            elif view.pending_agent_call is not None and view.pending_agent_call.phase == \
                    "available":
                call = view.pending_agent_call
                _schedule(soak, (view.run_id, call.id),
                          ("agent", view.run_id, call.id, epoch), rng)
        soak.quit.wait(0.1)
    if client is not None:
        client.close()


def _answer_for(kind: str, request: Any, rng: random.Random) -> Any:
    if kind == "user_ask_confirmation":
        return {"isConfirmed": rng.random() > 0.2}
    return [
        {"questionId": q["id"], "isSkipped": True} if q.get("isSkippable") and rng.random() < 0.5
        else {"questionId": q["id"], "isSkipped": False, "answer": "soak answer"}
        for q in request
    ]


def _do_job(soak: Soak, client: Client, job: tuple[Any, ...], rng: random.Random) -> None:
    if job[0] == "answer":
        _, run_id, action_id, _epoch, kind, request = job
        answer = _answer_for(kind, request, rng)
        client.answer(run_id, action_id, answer)
        soak.count("answers", 1)
        if kind == "user_ask_confirmation" and not answer["isConfirmed"]:
            soak.count("answers.declined", 1)
        return
    _, run_id, call_id, _epoch = job
    owner, _call = client.claim_agent_call(run_id, call_id, f"claim-{uuid.uuid4()}")
    tool_call = f"{call_id}-lookup"
    payload = {"runId": run_id, "callKey": tool_call}
    first, replayed = client.call_tool(run_id, call_id, owner, tool_call, "lookup", payload)
    again, replayed_again = client.call_tool(run_id, call_id, owner, tool_call, "lookup", payload)
    if replayed or not replayed_again or again != first:
        soak.violation(f"Run {run_id}: Tool receipt {tool_call} was not replayed exactly "
                       f"({replayed}, {replayed_again}, {first!r}, {again!r})")
    soak.count("tool.calls", 2)
    client.complete_agent_call(run_id, call_id, owner, "solved", {"answer": first})
    soak.count("agent.tasks", 1)


def _check_conflict(soak: Soak, client: Client, job: tuple[Any, ...]) -> None:
    """A CONFLICT is right only if the wait it answered is no longer the Run's current one."""
    run_id, wait_id = job[1], job[2]
    try:
        view = client.get_run(run_id)
    except IntloomError:
        return  # the host went away meanwhile; nothing to compare with
    current = view.pending_action.id if view.pending_action is not None else None
    call = view.pending_agent_call
    if call is not None and call.phase == "available":
        current = call.id
    if view.status == "waiting" and current == wait_id:
        soak.violation(f"Run {run_id}: {job[0]} to {wait_id} got CONFLICT, yet the Run still "
                       "waits on it")


def worker(soak: Soak, index: int) -> None:
    rng = random.Random(soak.cfg.seed * 31 + index)
    client: Client | None = None
    client_epoch = 0
    while not soak.quit.is_set():
        with soak.jobs_cv:
            while not soak.quit.is_set():
                if soak.jobs and soak.jobs[0][0] <= time.monotonic():
                    _due, _n, job = heapq.heappop(soak.jobs)
                    break
                wait = soak.jobs[0][0] - time.monotonic() if soak.jobs else 0.2
                soak.jobs_cv.wait(max(0.01, min(wait, 0.2)))
            else:
                break
        key = (job[1], job[2])
        if client is None:
            got = soak.connect()
            if got is None:
                return
            client, client_epoch = got
        # The older of the host that showed the wait and the one we talk to: a restart
        # since either makes an error expected.
        epoch = min(job[3], client_epoch)
        try:
            _do_job(soak, client, job, rng)
        except IntloomError as exc:
            soak.note_error(job[0], exc, epoch)
            if exc.code == "CONFLICT":
                _check_conflict(soak, client, job)
            if exc.code in TRANSIENT:
                client.close()
                client = None
            with soak.lock:
                # Seen again after the restart (a restored wait): it may be answered again.
                soak.dispatched.discard(key)
    if client is not None:
        client.close()


def follower(soak: Soak, index: int) -> None:
    """An attached client: follows one Run to its end, then another, across restarts."""
    rng = random.Random(soak.cfg.seed * 97 + index)
    while not soak.quit.is_set():
        with soak.lock:
            live = {r: i.seen_epoch for r, i in soak.runs.items()
                    if i.status in ("running", "waiting")}
        if not live:
            soak.quit.wait(0.1)
            continue
        run_id = rng.choice(sorted(live))
        got = soak.connect()
        if got is None:
            return
        client, client_epoch = got
        with soak.lock:
            soak.followers.add(client)
        epoch = min(live[run_id], client_epoch)  # what the choice was based on
        live_seen = False
        try:
            for event in client.subscribe(run_id):
                soak.count("subscribe.events", 1)
                if event.run.run_id != run_id:
                    soak.violation(f"subscribe {run_id} streamed Run {event.run.run_id}")
                if event.history and live_seen:
                    soak.violation(f"subscribe {run_id}: a history event after a live one")
                live_seen = live_seen or not event.history
                if soak.quit.is_set():
                    break
            else:
                soak.count("subscribe.streams", 1)
        except IntloomError as exc:
            if not soak.quit.is_set():
                soak.note_error("subscribe", exc, epoch)
        finally:
            with soak.lock:
                soak.followers.discard(client)
            client.close()


# ----- the run -------------------------------------------------------------------------------


def _cycle_plan(soak: Soak) -> list[tuple[float, str]]:
    cfg = soak.cfg
    kinds = ["graceful"] * cfg.graceful + ["kill"] * cfg.kills
    soak.rng.shuffle(kinds)
    moments = sorted(soak.rng.uniform(0.05, 0.8) * cfg.window for _ in kinds)
    return list(zip(moments, kinds, strict=True))


def _settled(soak: Soak) -> bool:
    with soak.lock:
        return all(i.status not in ("running", "waiting") for i in soak.runs.values())


def drive(soak: Soak, started: float) -> None:
    cfg = soak.cfg
    start_host(soak, "first")
    soak.loading.set()
    soak.spawn("sampler", sampler, soak)
    soak.spawn("scanner", scanner, soak)
    for i in range(4):
        soak.spawn(f"creator-{i}", creator, soak, i)
    for i in range(cfg.workers):
        soak.spawn(f"worker-{i}", worker, soak, i)
    for i in range(cfg.clients):
        soak.spawn(f"follower-{i}", follower, soak, i)
    soak.stats["clients.attached"] = cfg.clients
    last_end = time.monotonic()
    try:
        for moment, kind in _cycle_plan(soak):
            sleep_until(soak, max(started + moment, last_end + 0.5))
            (graceful_cycle if kind == "graceful" else kill_cycle)(soak)
            last_end = time.monotonic()
        sleep_until(soak, started + cfg.window)  # the rest of the load window
        soak.loading.clear()
        settle_by = time.monotonic() + cfg.settle
        while not _settled(soak):
            if time.monotonic() > settle_by:
                with soak.lock:
                    left = [r for r, i in soak.runs.items() if i.status in ("running", "waiting")]
                soak.violation(f"{len(left)} Run(s) did not settle within {cfg.settle}s: "
                               f"{left[:5]}")
                break
            sleep_until(soak, time.monotonic() + 0.1)  # a poll of what the scanner saw
    finally:
        _unwind(soak)


def _unwind(soak: Soak) -> None:
    """Stop every driver thread; a follower blocked on a stream is unblocked by closing it."""
    soak.loading.clear()
    soak.quit.set()
    with soak.jobs_cv:
        soak.jobs_cv.notify_all()
        followers = list(soak.followers)
    for client in followers:
        # A stream has no timeout, and closing a socket does not wake a thread blocked in
        # recv on it: shut it down first (a follower of a Run that never ended).
        sock = getattr(client, "_sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        client.close()
    join_by = time.monotonic() + 30
    for thread in soak.threads:
        thread.join(timeout=max(0.1, join_by - time.monotonic()))
        if thread.is_alive():
            soak.violation(f"thread {thread.name} did not finish")


def _final_host_check(soak: Soak) -> list[RunView]:
    """The last host, idle: its memory and descriptors, and the Runs it shows."""
    sample = soak.host()
    assert sample is not None
    proc = psutil.Process(sample.pid)
    # Closed client connections are released by the host asynchronously.
    with contextlib.suppress(RuntimeError):
        poll("the host to release client sockets",
             lambda: proc.num_fds() <= soak.hosts[0].ready_fds + 2, 10.0)
    sample.last_rss, sample.last_fds = _sample(proc)
    soak.end_sample = sample
    with Client.connect(soak.root) as client:
        return client.runs()


def rss_limit(start: int) -> int:
    """How far above its start an idle host may sit and still count as "back near it".

    By design it keeps the 1,000 most recently ended Runs (~5 MB, histories packed) and the
    decoded tail of its current segment (bounded by rotation), and the allocator keeps its
    high-water mark; a leak grows with every Run and crosses this in a full soak.
    """
    return start + max(32 * MIB, start // 2)


def _memory_verdict(soak: Soak) -> None:
    first, last = soak.hosts[0], soak.end_sample
    assert last is not None
    if last.last_rss > rss_limit(first.ready_rss):
        soak.violation(f"host memory did not come back: {last.last_rss // MIB} MiB at the end "
                       f"against {first.ready_rss // MIB} MiB at the start")
    if last.last_fds > first.ready_fds + 4:
        soak.violation(f"host descriptors did not come back: {last.last_fds} at the end "
                       f"against {first.ready_fds} at the start")


def _counters(root: Path) -> Counter[tuple[str, str, str]]:
    lines = Counter[tuple[str, str, str]]()
    path = root / "counters.log"
    if path.exists():
        for line in path.read_text().splitlines():
            run_id, kind, key = line.split(" ", 2)
            lines[(run_id, kind, key)] += 1
    return lines


def _records(runtime: Path) -> dict[str, list[Record]]:
    """Every durable record of every Run, in log order, in one pass over the segments.

    (``read_history`` does this for one Run per pass.) Segments are never deleted, so the
    log holds every record; bytes at or after a void notice's offset never count.
    """
    layout = Layout(runtime)
    scans = []
    for name in list_names(layout.wal):
        number = segment_number(name)
        data = read_file(layout.wal / name) if number is not None else None
        if number is not None and data is not None:
            scans.append(scan_segment(name, number, data))
    manifest = read_manifest(layout)
    notices = list(manifest.voids) if manifest else []
    for scan in scans:
        notices.extend(msgspec.msgpack.decode(f.payload, type=VoidNotice)
                       for f in scan.frames if f.kind == KIND_VOID)
    cuts: dict[int, int] = {}
    for notice in notices:
        cuts[notice.segment] = min(cuts.get(notice.segment, notice.offset), notice.offset)
    out: dict[str, list[Record]] = {}
    for scan in sorted(scans, key=lambda s: s.number):
        cut = cuts.get(scan.number)
        for frame in scan.frames:
            if frame.kind == KIND_RECORD and (cut is None or frame.offset < cut):
                out.setdefault(frame.run_id, []).append(decode_record(frame.payload))
    return out


def judge(soak: Soak, last_views: list[RunView] | None,
          restarted_views: list[RunView] | None) -> dict[str, Any]:
    """The offline verdict: journals, counters, and (when given) what the hosts showed."""
    runtime = ProjectPaths(soak.root).runtime
    report = verify_report(runtime)
    records = _records(runtime)
    journals = {j.run_id: j for j in report.runs}
    counters = _counters(soak.root)
    workflows: dict[str, LoadedWorkflow] = load_workflows(
        soak.root, load_config(soak.root)).workflows
    shown = {v.run_id: v for v in last_views or []}
    restarted = {v.run_id: v for v in restarted_views or []}
    hosts = [] if last_views is None or restarted_views is None else [
        (shown, "the last host"), (restarted, "a restarted host")]
    out: Counter[str] = Counter()
    for problem in report.files:
        if problem.kind == "torn":
            out["journal.tornTails"] += 1  # a SIGKILL mid-append: evidence, not corruption
        else:
            soak.violation(f"store file {problem.path}: {problem.kind}: {problem.problem}")
    for (run_id, kind, key), n in counters.items():
        if n > 1:
            soak.violation(f"Run {run_id}: {kind} {key} ran {n} times")
    # A Run whose create reply was lost and that ended before any listing showed it.
    out["runs.unseen"] = len(set(journals) - set(soak.runs))
    for run_id in sorted(set(soak.runs) | set(journals)):
        journal = journals.get(run_id)
        if journal is None or journal.state is None:
            soak.violation(f"Run {run_id}: no journal")
            continue
        if journal.status != "ok":
            soak.violation(f"Run {run_id}: journal {journal.status}: {journal.problem}")
            continue
        state = journal.state
        started: set[str] = set()
        done: set[str] = set()
        for record in records.get(run_id, []):
            if isinstance(record, EffectStarted):
                started.add(record.key)
            elif isinstance(record, EffectDone):
                done.add(record.key)
                out["effects.done"] += 1
            elif isinstance(record, StepResult):
                out["steps.results"] += 1
        ran = {key for (rid, kind, key) in counters if rid == run_id and kind == "effect"}
        for key in done:
            if key not in ran:
                soak.violation(f"Run {run_id}: effect {key} is done in the journal but never ran")
        for key in ran - started:
            soak.violation(f"Run {run_id}: effect {key} ran without a durable effect_started")
        in_flight = started - done
        if len(in_flight) > 1:
            soak.violation(f"Run {run_id}: several effects in flight {sorted(in_flight)}")
        if state.phase == "terminal":
            if state.status == "completed":
                out["runs.completed"] += 1
            else:
                soak.violation(f"Run {run_id}: ended {state.status} {state.last_error}")
            if run_id in restarted:
                soak.violation(f"Run {run_id}: terminal, yet a restarted host lists it")
            continue
        lw = workflows[state.workflow]
        verdict = restart_verdict(state, lw.has_recover(state.cursor.stage, state.cursor.step))
        out[f"runs.row.{verdict.row}"] += 1
        if verdict.row != "interrupted":
            soak.violation(f"Run {run_id}: settled, yet its journal ends at {state.phase} "
                           f"(row {verdict.row})")
            continue
        if in_flight:
            out["effects.inFlightAtCrash"] += 1
            if verdict.effect is None or verdict.effect.key not in in_flight:
                soak.violation(f"Run {run_id}: effect {sorted(in_flight)} in flight, not named")
        for views, who in hosts:
            view = views.get(run_id)
            code = view.last_error.code if view and view.last_error else None
            if view is None or view.status != "failed" or code != "RUN_INTERRUPTED":
                soak.violation(f"Run {run_id}: row interrupted, but {who} shows "
                               f"{view.status if view else 'nothing'} {code}")
            elif verdict.effect is not None and view.last_error is not None \
                    and verdict.effect.key not in view.last_error.message:
                soak.violation(f"Run {run_id}: RUN_INTERRUPTED does not name effect "
                               f"{verdict.effect.key}")
    extra = set(restarted) - set(journals)
    if extra:
        soak.violation(f"a restarted host lists Runs without a journal: {sorted(extra)[:5]}")
    out["effects.ran"] = sum(1 for (_r, kind, _k) in counters if kind == "effect")
    out["steps.ran"] = sum(1 for (_r, kind, _k) in counters if kind in ("step", "init",
                                                                       "recover"))
    out["tool.ran"] = sum(1 for (_r, kind, _k) in counters if kind == "tool")
    out["journal.runsVerified"] = len(report.runs)
    out["journal.segmentsRead"] = report.stats.segments_read
    return dict(out)


def rejudge(root: Path) -> list[str]:
    """The offline part of the verdict again, on a kept project (journals and counters)."""
    soak = Soak(Config(), root.resolve())
    judge(soak, None, None)
    return soak.violations


def run_soak(cfg: Config, workdir: Path | None = None) -> dict[str, Any]:
    """One soak in a fresh copy of the fixture project; returns the summary."""
    began = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="intloom-soak-", dir=workdir))
    root = tmp / "project"
    shutil.copytree(FIXTURE, root)
    soak = Soak(cfg, root.resolve())
    hard_stop = threading.Timer(cfg.deadline, _deadline, args=(soak,))
    hard_stop.daemon = True
    hard_stop.start()
    verdict: dict[str, Any] = {}
    try:
        drive(soak, time.monotonic())
        last_views = _final_host_check(soak)
        if not stop_service(soak.root, timeout=60.0):
            soak.violation("final stop found no running host")
        # One more start: what a fresh host restores must match the journals' rows.
        start_host(soak, "final-check")
        with Client.connect(soak.root) as client:
            restarted = client.runs()
        stop_service(soak.root, timeout=60.0)
        verdict = judge(soak, last_views, restarted)
        _memory_verdict(soak)
    except Exception as exc:  # the summary must still come out, naming what broke
        if not isinstance(exc, CutShort) and not soak.cut.is_set():
            soak.violation(f"the soak itself failed: {type(exc).__name__}: {exc}")
        _reap(soak)
        with contextlib.suppress(Exception):  # what is on disk can still be judged
            verdict = judge(soak, None, None)
    finally:
        hard_stop.cancel()
        soak.quit.set()
        _reap(soak)
    summary = _summary(soak, verdict, time.monotonic() - began)
    if cfg.keep:
        summary["project"] = str(root)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return summary


def _reap(soak: Soak) -> None:
    """Kill any host this soak started that is still alive: by pid *and* create time."""
    with soak.lock:
        samples = list(soak.hosts)
    for sample in samples:
        with contextlib.suppress(Exception):
            proc = psutil.Process(sample.pid)
            if proc.create_time() == sample.create_time and \
                    proc.status() != psutil.STATUS_ZOMBIE:
                proc.kill()
                proc.wait(5)


def _deadline(soak: Soak) -> None:
    """The hard deadline: record it, stop the drivers, kill our hosts; the judge still runs."""
    soak.violation(f"hard deadline of {soak.cfg.deadline}s reached; the soak was cut short")
    soak.cut.set()
    soak.quit.set()
    _reap(soak)


def _summary(soak: Soak, verdict: dict[str, Any], elapsed: float) -> dict[str, Any]:
    cfg = soak.cfg
    hosts = soak.hosts
    first = hosts[0] if hosts else HostSample(pid=0, create_time=0.0, cause="none")
    last = soak.end_sample or first
    listen = sorted({a.split(":")[0] for h in hosts for a in h.listen})
    return {
        "seed": cfg.seed,
        "durationS": round(elapsed, 1),
        "runs": {
            "created": len(soak.runs),
            "replyLost": len(soak.runs) - soak.stats["runs.created"]
            + verdict.get("runs.unseen", 0),
            "concurrent": cfg.runs,
            "completed": verdict.get("runs.completed", 0),
            "interrupted": verdict.get("runs.row.interrupted", 0),
            "byWorkflow": dict(Counter(i.workflow for i in soak.runs.values())),
        },
        "steps": {"results": verdict.get("steps.results", 0),
                  "executions": verdict.get("steps.ran", 0)},
        "effects": {"done": verdict.get("effects.done", 0), "ran": verdict.get("effects.ran", 0),
                    "inFlightAtCrash": verdict.get("effects.inFlightAtCrash", 0)},
        "interactions": {"answers": soak.stats["answers"],
                         "declined": soak.stats["answers.declined"],
                         "agentTasks": soak.stats["agent.tasks"],
                         "toolCalls": soak.stats["tool.calls"],
                         "toolRuns": verdict.get("tool.ran", 0)},
        "cycles": {"graceful": soak.stats["cycles.graceful"], "kill": soak.stats["cycles.kill"]},
        "attachedClients": cfg.clients,
        "subscribe": {"streams": soak.stats["subscribe.streams"],
                      "events": soak.stats["subscribe.events"]},
        "host": {
            "instances": len(hosts),
            "startRssMiB": round(first.ready_rss / MIB, 1),
            "startFds": first.ready_fds,
            "peakRssMiB": round(max((h.peak_rss for h in hosts), default=0) / MIB, 1),
            "peakFds": max((h.peak_fds for h in hosts), default=0),
            "endRssMiB": round(last.last_rss / MIB, 1),
            "endFds": last.last_fds,
            "endRssLimitMiB": round(rss_limit(first.ready_rss) / MIB, 1),
            # Each instance's memory once ready and at its highest: a restart's cost is told
            # apart from what a long-lived host accumulates.
            "rssMiBByInstance": [[round(h.ready_rss / MIB, 1), round(h.peak_rss / MIB, 1)]
                                 for h in hosts],
            "listen": listen,
        },
        "journal": {"runsVerified": verdict.get("journal.runsVerified", 0),
                    "segmentsRead": verdict.get("journal.segmentsRead", 0),
                    "tornTails": verdict.get("journal.tornTails", 0)},
        "expectedErrors": dict(soak.errors),
        "violations": list(soak.violations),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/soak", description=__doc__.split("\n")[0])
    defaults = Config()
    for name in ("runs", "clients", "workers", "graceful", "kills", "seed", "max_goal"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int,
                            default=getattr(defaults, name))
    for name in ("window", "settle", "deadline"):
        parser.add_argument(f"--{name}", type=float, default=getattr(defaults, name))
    parser.add_argument("--keep", action="store_true", help="keep the project directory")
    args = parser.parse_args(argv)
    cfg = Config(**{k: v for k, v in vars(args).items()})
    # Last resort, should unwinding after the deadline itself hang: exit, never linger.
    stuck = threading.Timer(cfg.deadline + 120.0, _stuck)
    stuck.daemon = True
    stuck.start()
    summary = run_soak(cfg)
    stuck.cancel()
    print(json.dumps(summary, indent=2), flush=True)
    return 1 if summary["violations"] else 0


def _stuck() -> None:
    print(json.dumps({"violations": ["the soak did not unwind after its hard deadline"]}),
          flush=True)
    os._exit(2)


if __name__ == "__main__":
    sys.exit(main())
