"""Diagnosis: who owns the project's host resources, and what may be done about them.

Shared by ``status``, ``doctor`` and ``recover``. It reads, probes and judges; it starts
nothing and creates no file. States, first match wins (DESIGN section 3, reference 4.1):
``running`` · ``blocked`` by a problem (a host that does not answer, or one shutting down:
it closed its listener on its way out) · ``blocked`` by a start (in progress, or paused) ·
``blocked`` (an owner alive or unknown) · ``recovery_required`` (only gone owners, and a
valid ``connection.json``) · ``blocked`` (owners, no valid connection) · ``offline``. A
diagnosis made while the files changed under it is made again (``inspect``).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Final, Literal, NamedTuple

import msgspec

from intloom.errors import (
    NO_CONNECTION_FIX,
    SHUTTING_DOWN,
    STARTING,
    IntloomError,
    starting_message,
    unlistened_message,
)
from intloom.host.liveness import (
    Evidence,
    LockProbe,
    OwnerStatus,
    host_starting,
    judge,
    paused,
    probe_lock,
    probe_process,
)
from intloom.host.metadata import ServiceInfo, ServiceLock, boot_id, read_lock, read_service
from intloom.host.observe import Observed, Snapshot, observe, observe_file
from intloom.host.portholder import bind_refusal, port_holder
from intloom.project import ProjectPaths
from intloom.protocol.messages import ServiceView

__all__ = [
    "MESSAGES",
    "NO_CONNECTION_FIX",
    "STARTING",
    "Diagnosis",
    "DiagnosisStatus",
    "Inspection",
    "Owner",
    "bind_refusal",
    "diagnose",
    "inspect",
    "judge_owners",
    "judge_readable_owners",
    "port_free",
    "port_holder",
]

DiagnosisStatus = Literal["running", "blocked", "recovery_required", "offline"]

# Exactly the wording of the IntLoom we match (reference section 4.1).
MESSAGES: Final[dict[str, str]] = {
    "running": "The service is running.",
    "offline": "The service is offline. Run intloom start.",
    "recovery_required": (
        "Found stale resources from an exited process. Run intloom recover, then intloom start."
    ),
    "no_connection": (
        "Valid connection configuration is missing; recovery is unsafe. "
        "Check the project metadata."
    ),
    "owner_exists": (
        "A resource owner still exists or its exit cannot be verified. No cleanup performed."
    ),
}



# An owner's status as ``status``, ``doctor`` and ``recover`` show it: IntLoom's words
# (reference §4.1), so that a script written for one reads the other. ``absent`` is what
# DESIGN calls gone (proven: the lock free, and the pid dead, reused or a zombie).
WireStatus = Literal["alive", "absent", "unknown"]


def wire_status(status: OwnerStatus) -> WireStatus:
    return "absent" if status == "gone" else status


class Owner(msgspec.Struct, frozen=True, rename="camel"):
    """One recorded owner of a host resource, with what was checked to judge it."""

    resource: str  # "service_info" (service.json) or "service_lock" (service.lock)
    path: str
    pid: int
    status: WireStatus
    evidence: list[Evidence]


class Diagnosis(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    """The shape ``status --json`` prints when the host is not running."""

    project_root: str
    status: DiagnosisStatus
    message: str
    owners: list[Owner]
    service: ServiceView | None = None


class Inspection(msgspec.Struct, frozen=True):
    """A diagnosis together with the exact reading it was made from (for ``recover``)."""

    diagnosis: Diagnosis
    snapshot: Snapshot
    problem: str | None = None
    # The diagnosis message as intloom doctor says it (IntloomError.here): a problem's own
    # advice to run doctor left out.
    here: str = ""
    # A saved port that another process holds while every recorded owner is provably gone:
    # recover cannot guard it, so it refuses (docs/recovery.md, "the port is taken").
    port_taken: int | None = None
    port_holder: str | None = None
    # ``problem`` is what a live host answered to the hello (a refused token, another
    # instance than the metadata names): waiting for it to finish starting or stopping
    # changes nothing. False for a hello never answered (a hung or busy host) and the rest.
    answered: bool = False
    # The code of that answer (PROTOCOL_MISMATCH, UNAUTHORIZED, ...), None without one: the
    # way out differs (restart the host with this intloom, or put a file back).
    refused_code: str | None = None
    # service.json is a crashed host's (``_left_by_a_crash``), under the lock of another.
    crashed_service_json: bool = False


def judge_owners(snap: Snapshot, lock: LockProbe, *, lock_is_ours: bool = False
                 ) -> list[Owner]:
    """Judge every recorded owner against one probe of the OS lock. ``lock_is_ours``:
    this process holds that lock (recover, looking again), so who holds it says nothing of
    an owner: run with the recorded pid (PID 1 in a container, as its host was), recover
    took its own lock for a live owner's and refused for good (CLI_RECOVERY_CONFLICT)."""
    owners: list[Owner] = []
    current_boot = boot_id()
    state = snap.paths.state
    held_by = None if lock_is_ours else snap.paths.service_lock
    info = snap.service.value
    if info is not None:
        proc = probe_process(info.pid, info.create_time, None, current_boot, held_by)
        owners.append(Owner(
            resource="service_info",
            path=str(snap.paths.service_json.relative_to(state.parent)),
            pid=info.pid,
            status=wire_status(judge(lock, proc)),
            evidence=[*proc.evidence, lock.evidence],
        ))
    held = snap.lock.value
    if held is not None:
        proc = probe_process(held.pid, held.create_time, held.boot_id, current_boot,
                             held_by)
        owners.append(Owner(
            resource="service_lock",
            path=str(snap.paths.service_lock.relative_to(state.parent)),
            pid=held.pid,
            status=wire_status(judge(lock, proc)),
            evidence=[*proc.evidence, lock.evidence],
        ))
    return owners


def judge_readable_owners(root: Path) -> list[Owner]:
    """The owners of the files that *can* be read, when another one is invalid.

    ``observe`` raises on the first invalid file; doctor must still show the valid one's
    owner (a live host may hold it), so each file is read on its own here. An invalid file
    is left out: its own check reports it.
    """
    paths = ProjectPaths(root)
    lock: Observed[ServiceLock] = Observed(None, None)
    info: Observed[ServiceInfo] = Observed(None, None)
    if not paths.state.is_dir() or paths.state.is_symlink():
        return []
    with contextlib.suppress(IntloomError):
        lock = observe_file(paths.service_lock, ServiceLock, read_lock)
    with contextlib.suppress(IntloomError):
        info = observe_file(paths.service_json, ServiceInfo, lambda p: read_service(p, root))
    snap = Snapshot(paths, lock, info, Observed(None, None))
    return judge_owners(snap, probe_lock(paths.service_lock))


def port_free(port: int) -> bool:
    """Whether ``recover`` could hold 127.0.0.1:``port`` now (bound, never listened on)."""
    return bind_refusal(port) is None


def _port_taken_problem(port: int, holder: str | None, owners: list[Owner]) -> str:
    pids = ", ".join(sorted({str(owner.pid) for owner in owners}))
    who = holder if holder is not None else (
        f"not identified; find it with: ss -ltnp 'sport = :{port}'"
    )
    return (
        f"Port {port} on 127.0.0.1, this project's saved port, is in use by another process "
        f"({who}); the recorded host (pid {pids}) has exited. intloom recover refuses while "
        "the port is taken, and intloom start cannot serve the project on it. Stop that "
        "process (or wait until it has exited), then run intloom recover, then intloom start."
    )


# A diagnosis of a host that is stopping (it refuses connections with CLI_SERVICE_CLOSING
# until it exits). It begins with the error's catalogue text: renderers recognise it so.
STOPPING: Final = (
    f"{SHUTTING_DOWN}: it is suspending its Runs, then exits. intloom status "
    "says offline once it has; intloom start waits for that, then starts a new host."
)
# The same once it has stopped listening (a stop closes its listener after suspending the
# Runs, then writes their snapshots and removes its files): the port refuses, or resets a
# hello it had not accepted yet. status said a live owner blocked the project, or blamed
# "a hung, paused or busy host" at the hello.
_UNLISTENED_THEN: Final = (
    "intloom status says offline once it has; intloom start waits for that, then starts a "
    "new host."
)


def _left_by_a_crash(snap: Snapshot) -> bool:
    """Whether ``service.json`` is a crashed host's: it names another instance than
    ``service.lock`` does, and a process proven gone (no such pid, a zombie, the pid
    reused). A start over it (the lock was removed by hand) holds the new lock and replaces
    the file once it serves, so the file does not mean that its start is over. Its owner
    stays ``unknown`` all the same (DESIGN: never gone while the OS lock is held, here by
    the starting host), which keeps recover blocked."""
    info, held = snap.service.value, snap.lock.value
    if info is None or held is None or info.instance_id == held.instance_id:
        return False
    return probe_process(info.pid, info.create_time, None, boot_id(),
                         snap.paths.service_lock).state == "gone"


def _starting(snap: Snapshot, lock: LockProbe, owners: list[Owner],
              crashed_service_json: bool) -> str | None:
    """The message for a host in its start-up (``liveness.host_starting``, judged from the
    snapshot), or None. DESIGN's state stays ``blocked`` (an owner is alive); the words say
    it is a normal, passing state. A crashed host's ``service.json`` counts as none (the
    client's ``starting_owner`` judges it so): status said "A resource owner still exists"
    for the whole of a start over one."""
    held = snap.lock.value
    owner = next((o.status for o in owners if o.resource == "service_lock"), None)
    if held is None or not host_starting(
            service_json=snap.service.value is not None and not crashed_service_json,
            os_lock=lock.state, owner=owner, owner_paused=paused(held.pid)):
        return None
    return starting_message(held.pid, held.started_at, "Run intloom status again in a moment "
                            "(intloom start waits for it); if it stays starting, run intloom "
                            "doctor or intloom logs.")


def _paused_start(snap: Snapshot, lock: LockProbe, owners: list[Owner],
                  crashed_service_json: bool) -> str | None:
    """The message for a host stopped by a signal in its start-up, or None: status gave it
    the generic "a resource owner still exists", and only doctor said it was paused."""
    held = snap.lock.value
    owner = next((o.status for o in owners if o.resource == "service_lock"), None)
    if (held is None or (snap.service.value is not None and not crashed_service_json)
            or lock.state != "held"
            or owner != "alive" or not paused(held.pid)):
        return None
    return (f"The host starting since {held.started_at} (pid {held.pid}) is paused (stopped by "
            "a signal: SIGSTOP, Ctrl-Z or a debugger): it holds the project's lock and "
            f"finishes starting only once resumed. Resume it with kill -CONT {held.pid} (or "
            "fg in its terminal), then run intloom status again.")


class _Probe(NamedTuple):
    service: ServiceView | None = None
    # An error for its two wordings (``IntloomError.here``), never raised.
    problem: IntloomError | None = None
    answered: bool = False  # the problem is what a host answered (``Inspection.answered``)
    # No listener took the hello: the port refused, or cut the hello and then refused.
    unreached: bool = False


# A request's connection lost after the hello: before it was sent (the client's own attempt
# to connect again failed), or before its reply.
_CONNECTION_LOST: Final = ("PROJECT_CONNECTION_FAILED", "PROJECT_REQUEST_FAILED")


def _probe_host(root: Path, snap: Snapshot) -> _Probe:
    """Ask a live host who it is.

    Only ``CLI_SERVICE_OFFLINE`` (or a host starting) means "no live host"; any other answer
    (closing, an identity mismatch, a rejected token, a listener that is not ours) is a
    problem that blocks cleanup.
    """
    # Imported here: the client pulls in the socket stack, which a lock-only diagnosis
    # (and every offline status) does not need.
    from intloom.client.client import (
        Client,
        HelloFailed,
        NotThisProjectsHost,
        ServiceStarting,
        ServiceUnlistened,
    )

    for attempt in range(2):
        try:
            with Client.connect(root) as client:
                hello = client.hello
                held = snap.lock.value
                if held is not None and held.instance_id != hello.instance_id:
                    fact = (f"The live host (instance {hello.instance_id}, pid {hello.pid}) "
                            f"is not the owner named by service.lock (instance "
                            f"{held.instance_id}). No cleanup performed")
                    return _Probe(problem=IntloomError(
                        "CLI_SERVICE_METADATA_INVALID", f"{fact}; run intloom doctor.",
                        here=f"{fact}."), answered=True)
                return _Probe(service=client.status())
        except IntloomError as exc:
            if isinstance(exc, ServiceStarting | NotThisProjectsHost):
                # _classify says what the files show (for the latter: an owner alive, whose
                # evidence shows its lock free; doctor says it is not this project's host).
                return _Probe()
            if exc.code == "CLI_SERVICE_OFFLINE" or isinstance(exc, ServiceUnlistened):
                return _Probe(unreached=True)  # _unlistened says which
            if exc.code == "CLI_SERVICE_CLOSING":
                # The host's refusal is worded for a refused request; this one asked who it
                # is.
                return _Probe(problem=IntloomError(exc.code, STOPPING))
            if attempt == 0 and isinstance(exc, HelloFailed) and exc.cause is not None:
                # Cut mid-hello: a stop that closes its listener resets the connections it
                # had not accepted yet. Asked again, such a host's port refuses.
                continue
            if attempt == 0 and exc.code in _CONNECTION_LOST:
                # The status request lost its connection after the hello (the host was
                # killed, or stopped, meanwhile): it only reads, so it is sent again, and a
                # gone host's port refuses. Its own error ("run intloom status") was the
                # diagnosis of files whose owner had gone.
                continue
            # The files themselves were already read strictly; what is left is a listener
            # that is not the recorded host (a mismatch, a foreign program). A hello never
            # answered (CLI_SERVICE_UNAVAILABLE) may still be a busy host's.
            return _Probe(problem=exc, answered=exc.code != "CLI_SERVICE_UNAVAILABLE")
    raise AssertionError("unreachable: the second attempt returns")


def _unlistened(snap: Snapshot, lock: LockProbe, owners: list[Owner]) -> str | None:
    """The message for a host that stopped listening on its way out, or None.

    Its files name one instance, both owners are alive (the OS lock held), it is not paused,
    and its own log says ``service_stopping``: a host that served (service.json is written
    once it listens) closes its listener only at a stop.
    """
    info, held = snap.service.value, snap.lock.value
    if (info is None or held is None or info.instance_id != held.instance_id
            or lock.state != "held"
            or len(owners) != 2 or any(owner.status != "alive" for owner in owners)
            or paused(info.pid)):
        return None
    from intloom.client.hostlog import log_says_stopping  # a file read, no socket stack

    if not log_says_stopping(snap.paths, info):
        return None
    return unlistened_message(info.pid, info.port, _UNLISTENED_THEN)


def _classify(
    snap: Snapshot, lock: LockProbe, owners: list[Owner], service: ServiceView | None,
    problem: str | None, crashed_service_json: bool,
) -> tuple[DiagnosisStatus, str]:
    if service is not None:
        return "running", MESSAGES["running"]
    has_connection = snap.connection.value is not None
    if problem is not None:
        return "blocked", problem
    starting = _starting(snap, lock, owners, crashed_service_json)
    if starting is not None:
        # Before the missing-connection wording: a first start writes connection.json a
        # moment after it takes the lock, and the project is not in trouble meanwhile.
        return "blocked", starting
    paused_start = _paused_start(snap, lock, owners, crashed_service_json)
    if paused_start is not None:
        return "blocked", paused_start
    if any(owner.status != "absent" for owner in owners):
        if not has_connection:
            return "blocked", MESSAGES["no_connection"]
        return "blocked", MESSAGES["owner_exists"]
    if owners and has_connection:
        return "recovery_required", MESSAGES["recovery_required"]
    if owners:  # every owner gone: only the missing file stands in the way
        return "blocked", f"{MESSAGES['no_connection']} {NO_CONNECTION_FIX}"
    return "offline", MESSAGES["offline"]


# How many times a diagnosis is made again when the files it was made from changed meanwhile.
_ATTEMPTS: Final = 3


def inspect(root: Path, *, probe: bool = True) -> Inspection:
    """Diagnose and keep the reading behind it. Raises CLI_SERVICE_METADATA_INVALID.

    The files are read first and their owners judged after: a host that removes its files
    and exits in between (the end of a clean stop) was judged gone over files already gone,
    and status said ``recovery_required``. A diagnosis stands only when the files read again
    after it are the ones it was made from; else it is made again (a few times: files that
    keep changing, hosts starting and stopping, get the last one).
    """
    root = root.resolve()
    for _ in range(_ATTEMPTS - 1):
        found = _inspect(root, probe)
        if found.diagnosis.status in ("running", "offline") or _unchanged(found.snapshot):
            return found
    return _inspect(root, probe)


def _unchanged(snap: Snapshot) -> bool:
    """Whether the metadata files are still the bytes ``snap`` read."""
    try:
        now = observe(snap.paths.root)
    except IntloomError:
        return False  # being replaced, or damaged: the next reading says which
    return ((now.lock.raw, now.service.raw, now.connection.raw)
            == (snap.lock.raw, snap.service.raw, snap.connection.raw))


def _inspect(root: Path, probe: bool) -> Inspection:
    snap = observe(root)
    service: ServiceView | None = None
    problem: str | None = None
    here: str | None = None  # the problem as doctor says it
    taken: int | None = None
    holder: str | None = None
    answered = False
    refused_code: str | None = None
    lock = probe_lock(snap.paths.service_lock)
    owners = judge_owners(snap, lock)
    connection = snap.connection.value
    if owners and all(owner.status == "absent" for owner in owners):
        # The recorded host provably exited: whatever listens on its port now is another
        # program. It gets no hello (and so never the token); it is named instead, because
        # recover cannot hold a taken port and would refuse.
        ports = [] if connection is None else [connection.port]
        if snap.service.value is not None and snap.service.value.port not in ports:
            ports.append(snap.service.value.port)
        taken = next((port for port in ports if not port_free(port)), None)
        if taken is not None:
            holder = port_holder(taken)
            problem = _port_taken_problem(taken, holder, owners)
    elif probe and connection is not None and snap.service.value is not None:
        found = _probe_host(root, snap)
        service, answered = found.service, found.answered
        if found.problem is not None:
            problem, here = found.problem.message, found.problem.here
            refused_code = found.problem.code if answered else None
        # Judged again after the probe: a host that was starting may have answered meanwhile.
        lock = probe_lock(snap.paths.service_lock)
        owners = judge_owners(snap, lock)
        if found.unreached:
            problem = here = _unlistened(snap, lock, owners)
    crashed = service is None and _left_by_a_crash(snap)
    status, message = _classify(snap, lock, owners, service, problem, crashed)
    if status == "offline":
        # "Run intloom start" of a root that start refuses (too long a path for the files
        # it writes): the same refusal now, not after the advice is followed.
        from intloom.project import require_short_path

        try:
            require_short_path(root)
        except IntloomError as exc:
            message = f"The service is offline, and intloom start refuses this project: " \
                f"{exc.message}"
    # A problem is the diagnosis's message whenever there is one (_classify), so doctor's
    # wording is the problem's own.
    said = here if here is not None else message
    diagnosis = Diagnosis(
        project_root=str(root), status=status, message=message, owners=owners, service=service
    )
    return Inspection(diagnosis=diagnosis, snapshot=snap, problem=problem, here=said,
                      port_taken=taken, port_holder=holder, answered=answered,
                      refused_code=refused_code, crashed_service_json=crashed)


def diagnose(root: Path, *, probe: bool = True) -> Diagnosis:
    """The project's host diagnosis. Read-only: starts nothing, creates no file.

    ``probe=False`` skips asking a live host over the socket (the owners are still judged).
    Raises ``CLI_SERVICE_METADATA_INVALID`` for invalid metadata, leaving the file untouched.
    """
    return inspect(root, probe=probe).diagnosis
