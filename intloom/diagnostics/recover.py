"""``recover``: remove the stale ``service.json`` and ``service.lock`` of a host that is gone.

Nothing else is ever touched: not ``connection.json`` (the next start reuses its port and
token), not ``runtime/`` (the Runs' journals), not the logs, not user data; nothing is
replayed. The sequence (DESIGN section 3, reference section 5, with our stronger liveness):

1. Diagnose with a probe; ``running`` or ``blocked`` refuses with CLI_RECOVERY_BLOCKED.
2. A dry run returns the plan -- paths in order, each with its evidence -- and stops.
3. Hold the saved port (no host can serve the project and no second ``recover`` can run),
   then take the OS lock on ``service.lock`` (no host can be holding it).
4. Read everything again: any byte changed, or an owner no longer provably gone, is
   CLI_RECOVERY_CONFLICT. Then remove ``service.json``, then ``service.lock``, and make the
   removals durable.

A ``recover`` killed part-way leaves at most ``service.lock`` behind, still owned by the dead
host; running ``recover`` again finishes the job.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from pathlib import Path
from typing import Final

import msgspec

from intloom.diagnostics.owners import (
    MESSAGES,
    NO_CONNECTION_FIX,
    Diagnosis,
    Inspection,
    inspect,
    judge_owners,
)
from intloom.diagnostics.portguard import PortGuard, port_in_use
from intloom.diagnostics.temps import TempFile, metadata_temps
from intloom.errors import ErrorView, IntloomError
from intloom.fsutil import exclusive_lock, fsync_dir, shell_arg, unlink_fix, unlink_refusal
from intloom.host.liveness import Evidence, LockProbe
from intloom.host.observe import Snapshot, observe
from intloom.protocol.framing import encode_frame
from intloom.protocol.messages import ErrorReply

__all__ = ["PlanItem", "RecoverResult", "recover"]

# A diagnosis elsewhere (status, doctor, another recover) holds the OS lock for an instant
# while it probes; only a holder that keeps it this long is a real owner.
_FLOCK_PATIENCE: Final = 1.0
_NO_CONNECTION = (
    "Valid connection configuration is missing; recovery is unsafe: recover checks the "
    "project's saved port with .intloom/connection.json and does not run without it. "
    f"{NO_CONNECTION_FIX}"
)


class PlanItem(msgspec.Struct, frozen=True):
    """One path ``recover`` removes (or would), with the evidence that its owner is gone."""

    path: str
    evidence: list[Evidence]


class RecoverResult(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    """``recover --json``: IntLoom's ``{projectRoot, dryRun, recovered, paths}`` plus the
    plan, and ``leftovers`` (only when there are any): temp files of interrupted metadata
    writes, kept as they are."""

    project_root: str
    dry_run: bool
    recovered: bool
    paths: list[str]
    plan: list[PlanItem]
    leftovers: list[TempFile] = msgspec.field(default_factory=list)


def _guard_reply(port: int) -> bytes:
    """What a client that connects meanwhile reads instead of a hello reply."""
    error = ErrorView(
        code="CLI_SERVICE_UNAVAILABLE",
        message=f"intloom recover is holding port {port} while it removes stale host "
        "resources. Retry when it has finished.",
        retryable=True,
    )
    return encode_frame(ErrorReply(error=error))


def _plan(insp: Inspection) -> list[PlanItem]:
    # service.json first: a recover killed in between leaves the lock, which still blocks a
    # start and is still judged by the same evidence next time.
    by_resource = {owner.resource: owner for owner in insp.diagnosis.owners}
    items: list[PlanItem] = []
    for resource in ("service_info", "service_lock"):
        owner = by_resource.get(resource)
        if owner is not None:
            items.append(PlanItem(path=owner.path, evidence=owner.evidence))
    return items


def _conflict(fact: str, removed: list[str] | None = None) -> IntloomError:
    done = f"Already removed: {', '.join(removed)}" if removed else "Nothing was removed"
    return IntloomError(
        "CLI_RECOVERY_CONFLICT",
        f"Project state changed during recovery: {fact}. {done}. Run intloom doctor again.",
    )


def _take_lock(path: Path) -> int | None:
    """The OS lock on ``service.lock``, held until closed; None when the file is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _conflict(f"{path.name} can no longer be opened ({exc.strerror})") from None
    deadline = time.monotonic() + _FLOCK_PATIENCE
    while True:
        try:
            return exclusive_lock(fd, path)  # on NFS, through a writable descriptor
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                os.close(fd)
                raise _conflict(
                    f"the OS lock on {path.name} cannot be taken ({exc.strerror})"
                ) from None
        if time.monotonic() > deadline:
            os.close(fd)
            raise _conflict(f"the OS lock on {path.name} is now held by a live process")
        time.sleep(0.01)  # a short poll of the OS lock, bounded by the patience above


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def _recheck(before: Snapshot, lock_fd: int | None) -> Snapshot | None:
    """Read everything again under the port and the lock; any change is a conflict.

    None when both files are gone: another ``recover`` finished first.
    """
    root = before.paths.root
    try:
        now = observe(root)
    except IntloomError as exc:
        raise _conflict(exc.message.rstrip(".")) from None
    if now.lock.value is None and now.service.value is None:
        return None
    for name, old, new in (
        ("connection.json", before.connection.raw, now.connection.raw),
        ("service.json", before.service.raw, now.service.raw),
        ("service.lock", before.lock.raw, now.lock.raw),
    ):
        if old != new:
            raise _conflict(f"{name} changed since it was inspected")
    if lock_fd is not None and not _same_file(lock_fd, now.paths.service_lock):
        raise _conflict("service.lock was replaced since it was inspected")
    held = LockProbe("free", Evidence("os_lock", "recover holds the OS lock on service.lock"))
    for owner in judge_owners(now, held, lock_is_ours=lock_fd is not None):
        if owner.status != "absent":
            raise _conflict(f"the owner of {owner.path} (pid {owner.pid}) is no longer "
                            "provably gone")
    return now


def _remove(path: Path, lock_fd: int | None, removed: list[str]) -> None:
    if lock_fd is not None and not _same_file(lock_fd, path):
        raise _conflict(f"{path.name} was replaced just before removal", removed)
    try:
        os.unlink(path)
    except FileNotFoundError:
        raise _conflict(f"{path.name} was removed by someone else", removed) from None
    except OSError as exc:  # EPERM/EACCES (immutable, a read-only .intloom), EROFS, EIO
        done = f"Already removed: {', '.join(removed)}" if removed else "Nothing was removed"
        fact, fix = _unremovable(path, exc)
        raise IntloomError(
            "STORAGE_ERROR",
            f"{path.parent.name}/{path.name} could not be removed ({exc.strerror or exc})"
            f"{fact}. {done}. {fix}, then run intloom recover again.",
        ) from None


def _unremovable(path: Path, exc: OSError) -> tuple[str, str]:
    """Why unlink refused ``path`` (": it is immutable (chattr +i)", in the words the host
    logs when it must keep its own files: ``fsutil.unlink_refusal``) and the fix for it."""
    refused = unlink_refusal(path)
    if refused is None:
        if exc.errno == errno.EROFS:
            return "", "Its file system is read-only: remount it read-write"
        return "", (f"Check {path.parent}: its permissions and owner, and the flags of it and "
                    f"of the file (lsattr -d {shell_arg(path.parent)}; lsattr {shell_arg(path)})")
    fix = unlink_fix(refused, path)
    return f": {refused.fact}", fix


def _blocked_message(diagnosis: Diagnosis) -> str:
    """The diagnosis message (reference wording), and for an owner alive or unknown what
    status shows under it: each file, its pid and the evidence -- the sentence alone names
    neither the file nor the process -- then the way on."""
    if diagnosis.message != MESSAGES["owner_exists"]:
        return diagnosis.message  # a host starting or stopping, a port, a connection: named
    facts: list[str] = []
    held = False  # the OS lock is someone's: fuser finds who
    for owner in diagnosis.owners:
        if owner.status == "absent":
            continue
        verdict = "which is alive" if owner.status == "alive" else (
            "whose exit cannot be verified")
        found = "; ".join(item.found for item in owner.evidence if item.check != "boot_id")
        facts.append(f"{owner.path} names pid {owner.pid}, {verdict}: {found}.")
        held = held or any(item.check == "os_lock" and "held" in item.found
                           for item in owner.evidence)
    find = ("find the process that holds the lock with fuser -v .intloom/service.lock and "
            "let it exit" if held else "let that process exit")
    return (f"{diagnosis.message} {' '.join(facts)} Run intloom doctor: it says what to do "
            f"for each. Do not remove these files by hand while their owner may still run: "
            f"{find} first.")


def recover(root: Path, *, dry_run: bool) -> RecoverResult:
    """Remove stale host resources after their owner is verifiably gone (or plan it).

    Raises CLI_RECOVERY_BLOCKED (nothing touched; for invalid metadata too, with the
    reader's finding: DESIGN names it among what blocks recover) or CLI_RECOVERY_CONFLICT
    (something changed while it worked).
    """
    root = root.resolve()
    try:
        insp = inspect(root, probe=True)
    except IntloomError as exc:
        if exc.code != "CLI_SERVICE_METADATA_INVALID":
            raise
        raise IntloomError("CLI_RECOVERY_BLOCKED", f"{exc.message} No cleanup performed.",
                           here=f"{exc.here} No cleanup performed.") from exc
    diagnosis = insp.diagnosis
    if diagnosis.status == "running":
        raise IntloomError(
            "CLI_RECOVERY_BLOCKED",
            f"{diagnosis.message} recover only cleans up after a host that has exited; "
            "stop it with intloom stop. No cleanup performed.",
        )
    if insp.port_taken is not None:
        # Every owner is gone, but the guard could not hold the port: refuse as the guard
        # would, before anything is read a second time.
        raise port_in_use(insp.port_taken, insp.port_holder)
    if diagnosis.status == "blocked":
        raise IntloomError("CLI_RECOVERY_BLOCKED", _blocked_message(diagnosis))
    plan = _plan(insp)
    # Named, never removed: DESIGN lets recover remove service.json and service.lock only.
    # Only those whose writer is provably gone: a starting host's lock is written through one.
    leftovers = metadata_temps(insp.snapshot.paths).left
    if dry_run or diagnosis.status == "offline":
        return RecoverResult(
            project_root=str(root),
            dry_run=dry_run,
            recovered=False,
            paths=[item.path for item in plan],
            plan=plan,
            leftovers=leftovers,
        )
    snap = insp.snapshot
    connection = snap.connection.value
    if connection is None:
        raise IntloomError("CLI_RECOVERY_BLOCKED", _NO_CONNECTION)
    ports = [connection.port]
    if snap.service.value is not None and snap.service.value.port != connection.port:
        ports.append(snap.service.value.port)

    with contextlib.ExitStack() as stack:
        for port in ports:
            stack.enter_context(PortGuard(port, reply=_guard_reply(port)))
        lock_fd = _take_lock(snap.paths.service_lock)
        if lock_fd is not None:
            stack.callback(os.close, lock_fd)
        if _recheck(snap, lock_fd) is None:
            return RecoverResult(str(root), dry_run=False, recovered=False, paths=[], plan=[],
                                 leftovers=leftovers)
        removed: list[str] = []
        for item in plan:
            path = root / item.path
            _remove(path, lock_fd if path == snap.paths.service_lock else None, removed)
            removed.append(item.path)
        fsync_dir(snap.paths.state)
    return RecoverResult(
        project_root=str(root), dry_run=False, recovered=True, paths=removed, plan=plan,
        leftovers=leftovers,
    )
