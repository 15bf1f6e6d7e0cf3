"""Is the owner recorded in the host's metadata still there? Evidence, not guesses.

An owner is **gone** only when the OS lock on ``service.lock`` can be taken *and* the process
is provably not the owner: no process has the pid, the pid belongs to a process with another
create time, the boot id changed, or the process is a zombie. A process that matches is
**alive**. Everything else -- the lock held, permission denied, an unreadable ``/proc`` -- is
**unknown**, and unknown blocks every cleanup. A bare ``kill(pid, 0)`` is not enough: a
reused pid would look alive and a lock held by a new owner would look free.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Literal

import msgspec
import psutil

from intloom.errors import IntloomError
from intloom.fsutil import exclusive_lock, os_lock
from intloom.host.metadata import CREATE_TIME_TOLERANCE, ServiceLock, boot_id, read_lock
from intloom.project import ProjectPaths

__all__ = [
    "CREATE_TIME_TOLERANCE",
    "Evidence",
    "LockProbe",
    "OwnerStatus",
    "ProcessProbe",
    "flock_holders",
    "holds_flock",
    "holds_open",
    "host_starting",
    "judge",
    "paused",
    "probe_lock",
    "probe_process",
    "starting_owner",
    "unheld_lock",
]

OwnerStatus = Literal["alive", "gone", "unknown"]



class Evidence(msgspec.Struct, frozen=True):
    """One thing that was checked (a stable id) and what was found, in words."""

    check: str
    found: str


class LockProbe(msgspec.Struct, frozen=True):
    """The OS lock on ``service.lock``: ``free`` (taken and released at once), or not."""

    state: Literal["free", "held", "unknown"]
    evidence: Evidence


class ProcessProbe(msgspec.Struct, frozen=True):
    """What the process table says about one saved owner."""

    state: OwnerStatus
    evidence: list[Evidence]


def probe_lock(path: Path) -> LockProbe:
    """The OS lock on ``path`` (``fsutil.os_lock``), with what was found in words."""
    name = path.name
    state, why = os_lock(path)
    if state == "absent":
        return LockProbe(
            "free", Evidence("os_lock", f"{name} does not exist, so no process holds its OS lock")
        )
    if state == "free":
        return LockProbe(
            "free", Evidence("os_lock", f"the OS lock on {name} was free (taken and released)")
        )
    if state == "held":
        return LockProbe(
            "held", Evidence("os_lock", f"the OS lock on {name} is held by a live process"
                             f"{_holders(path)}")
        )
    if state == "unopenable":
        return LockProbe(
            "unknown", Evidence("os_lock", f"{name} could not be opened to probe its OS lock "
                                f"({why})")
        )
    return LockProbe(
        "unknown", Evidence("os_lock", f"the OS lock on {name} could not be probed ({why})")
    )


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z"
    )


def flock_holders(path: Path) -> list[int] | None:
    """The pids holding the OS lock (flock) on the file at ``path``, from the kernel's
    ``/proc/locks``; None when that cannot be told (no ``/proc``, the file gone). A holder
    in no pid namespace of ours reads as 0 or -1 there, and is left out."""
    try:
        st = os.stat(path, follow_symlinks=False)
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            text = locks.read()
    except OSError:
        return None
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    found: list[int] = []
    for line in text.splitlines():
        parts = line.split()
        if _locks(parts, want):
            try:
                pid = int(parts[4])
            except ValueError:
                continue
            if pid > 0:
                found.append(pid)
    return found


def holds_flock(pid: int, path: Path) -> bool | None:
    """Whether process ``pid`` holds the OS lock (flock) on the file at ``path``, from the
    kernel's ``/proc/locks``; None when that cannot be told (no ``/proc``, the file gone)."""
    holders = flock_holders(path)
    return None if holders is None else pid in holders


def _holders(path: Path) -> str:
    """Who holds the lock, for the evidence: the pid and its process name (never its command
    line, which may hold secrets), so a person need not hunt for it with fuser; empty when
    the kernel does not say."""
    named: list[str] = []
    exited: list[int] = []
    for pid in dict.fromkeys(flock_holders(path) or []):
        if not _exists(pid):
            exited.append(pid)
            continue
        try:
            named.append(f"pid {pid} ({psutil.Process(pid).name()})")
        except psutil.Error:
            named.append(f"pid {pid}")
    told = "the kernel's /proc/locks"
    if not named:
        # /proc/locks names the process that took the lock: after it exits, a child that
        # inherited its descriptor holds it ("a live process: pid N" named a pid no process
        # had), and in a pid namespace where that process is not seen it names none.
        took = (f", through a descriptor inherited from {_pids(exited)} (which took the lock "
                "and has exited)") if exited else ""
        heirs = _lock_heirs(path)
        if heirs:
            named.append(", ".join(f"pid {pid} ({name})" for pid, name in heirs) + took)
            told = "the kernel's /proc/locks and /proc/PID/fdinfo"
        elif exited:
            named.append(f"a process{took}")
    return f": {', '.join(named)} ({told})" if named else ""


def _exists(pid: int) -> bool:
    """Whether a process has ``pid``: False only when the kernel says none does (ESRCH).
    psutil's NoSuchProcess is no proof of that (``/proc`` mounted ``hidepid``, another
    user's process)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _pids(pids: list[int]) -> str:
    return f"pid {pids[0]}" if len(pids) == 1 else "pids " + ", ".join(map(str, pids))


def _lock_heirs(path: Path) -> list[tuple[int, str]]:
    """The processes with a descriptor that holds a lock on the file at ``path``, with their
    names, from each descriptor's ``/proc/PID/fdinfo`` (its lock lines name the file by
    device and inode: no descriptor's file is looked up, which could hang on a dead network
    mount). Only looked for when ``/proc/locks`` names no live holder: it reads every
    process's descriptors. Another user's processes cannot be read and are left out."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return []
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    found: list[tuple[int, str]] = []
    for pid in psutil.pids():
        try:
            fds = os.listdir(f"/proc/{pid}/fdinfo")
        except OSError:
            continue
        for fd in fds:
            try:
                with open(f"/proc/{pid}/fdinfo/{fd}", encoding="ascii",
                          errors="replace") as info:
                    lines = [line for line in info if line.startswith("lock:")]
            except OSError:
                continue
            if any(_locks(line.split()[1:], want) for line in lines):
                try:
                    found.append((pid, psutil.Process(pid).name()))
                except psutil.Error:
                    found.append((pid, "?"))
                break
    return found


def _locks(parts: list[str], want: tuple[int, int, int]) -> bool:
    """A line of ``/proc/locks`` (or an fdinfo ``lock:`` line), split: a flock held (not
    waited for) on the file ``want`` (major, minor, inode)."""
    # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:2146553 0 EOF"; a waiter's line reads
    # "1: -> FLOCK ...": it holds nothing, and its fields are one to the right.
    if len(parts) < 6 or parts[1] != "FLOCK":
        return False
    try:
        major, minor, inode = parts[5].split(":")
        return (int(major, 16), int(minor, 16), int(inode)) == want
    except ValueError:
        return False


# Two reads of one process's create time: equal but for psutil's float arithmetic (a start
# time is counted in clock ticks, 10 ms), or whole seconds apart.
_TICKS_APART: Final = 0.02


def probe_process(
    pid: int, create_time: float, saved_boot_id: str | None, current_boot_id: str,
    lock_path: Path | None = None,
) -> ProcessProbe:
    """Judge the process side of one owner: ``gone`` only on proof, ``alive`` on a match.

    A zombie has exited, but its other threads may still be closing its files for a moment;
    that is why ``judge`` also needs the OS lock to be free before it calls the owner gone.

    ``saved_boot_id`` is ``None`` when the metadata does not record one (``service.json``).
    ``lock_path``: the ``service.lock`` the owner holds the OS lock on for its life. A
    create time read now is the boot time plus the process's age, and the boot time moves
    when the system clock is set (an NTP step): a pid whose create time no longer matches
    but that holds that lock (the kernel says so) is the owner, not a pid reused.
    """
    evidence: list[Evidence] = []
    if saved_boot_id is not None:
        if saved_boot_id and current_boot_id and saved_boot_id != current_boot_id:
            evidence.append(Evidence(
                "boot_id",
                f"the saved boot id {saved_boot_id[:8]}… differs from this boot's "
                f"{current_boot_id[:8]}…: the machine restarted since the owner started",
            ))
            return ProcessProbe("gone", evidence)
        if not saved_boot_id or not current_boot_id:
            evidence.append(Evidence("boot_id", "the boot id is not available to compare"))
        else:
            evidence.append(Evidence("boot_id", "the saved boot id is this boot's"))
    try:
        proc = psutil.Process(pid)
        status = proc.status()
        if status == psutil.STATUS_ZOMBIE:
            evidence.append(Evidence(
                "process",
                f"pid {pid} is a zombie: it has exited and waits to be reaped",
            ))
            return ProcessProbe("gone", evidence)
        actual = proc.create_time()
    except psutil.ZombieProcess:
        evidence.append(Evidence(
            "process",
            f"pid {pid} is a zombie: it has exited and waits to be reaped",
        ))
        return ProcessProbe("gone", evidence)
    except psutil.NoSuchProcess:
        evidence.append(Evidence("process", f"no process has pid {pid}"))
        return ProcessProbe("gone", evidence)
    except psutil.AccessDenied:
        evidence.append(Evidence("process", f"pid {pid} exists but cannot be inspected "
                                 "(permission denied)"))
        return ProcessProbe("unknown", evidence)
    except (OSError, psutil.Error) as exc:
        evidence.append(Evidence("process", f"pid {pid} could not be inspected ({exc})"))
        return ProcessProbe("unknown", evidence)
    if abs(actual - create_time) > CREATE_TIME_TOLERANCE:
        if lock_path is not None and holds_flock(pid, lock_path):
            evidence.append(Evidence(
                "create_time",
                f"pid {pid} reads as started at {_iso(actual)}, not at {_iso(create_time)} as "
                f"recorded, but it holds the OS lock on {lock_path.name} (the kernel's "
                "/proc/locks): it is the owner, and the system clock was set since it "
                "started",
            ))
            return ProcessProbe("alive", evidence)
        if actual < create_time:
            # No pid goes to a process older than its first holder: the owner recorded it
            # in another pid namespace (a container), or the clock was set since.
            evidence.append(Evidence(
                "create_time",
                f"pid {pid} belongs to a process started at {_iso(actual)}, before the owner "
                f"started at {_iso(create_time)}, so it is not the owner: the owner recorded "
                "its pid in another pid namespace (a container), or the system clock was set "
                "since",
            ))
            return ProcessProbe("gone", evidence)
        evidence.append(Evidence(
            "create_time",
            f"pid {pid} now belongs to a process started at {_iso(actual)}, not the owner "
            f"started at {_iso(create_time)}: the pid was reused",
        ))
        return ProcessProbe("gone", evidence)
    drift = actual - create_time
    if (abs(drift - round(drift)) > _TICKS_APART and lock_path is not None
            and holds_flock(pid, lock_path) is False):  # None: not told, so not proven
        # One process's create time, read twice, differs only by whole seconds (the boot
        # time psutil adds is whole seconds, re-derived after a clock step): a fraction
        # apart is another process, which a pid reused within the second of the owner's
        # start got. Counted alive, it blocked recover until that stranger exited.
        # Older than the owner: no reuse (no pid goes to a process older than its first
        # holder), but a pid recorded in another pid namespace, as said above for a larger gap.
        how = ("the pid was reused" if drift > 0 else "it is not the owner, which recorded "
               "its pid in another pid namespace (a container)")
        evidence.append(Evidence(
            "create_time",
            f"pid {pid} belongs to a process started at {_iso(actual)}, {abs(drift):.2f} s "
            f"{'after' if drift > 0 else 'before'} the owner started ({_iso(create_time)}), "
            f"a fraction of a second that no re-reading of one process's start gives, and it "
            f"holds no OS lock on {lock_path.name}: {how}",
        ))
        return ProcessProbe("gone", evidence)
    evidence.append(Evidence(
        "process", f"process {pid} exists with the owner's create time {_iso(create_time)}"
        + ("" if abs(drift) <= _TICKS_APART else f" (read now as {_iso(actual)})")
    ))
    return ProcessProbe("alive", evidence)


def judge(lock: LockProbe, process: ProcessProbe) -> OwnerStatus:
    """Combine both probes: gone needs the lock free *and* the process proved gone."""
    if process.state == "alive":
        return "alive"
    if process.state == "gone" and lock.state == "free":
        return "gone"
    return "unknown"


def paused(pid: int, *, traced: bool = True) -> bool:
    """``pid`` is stopped by a signal (SIGSTOP, Ctrl-Z, a debugger): alive, and unable to
    answer or finish anything until it is resumed. ``traced=False`` leaves out a tracer's
    stop: under ``strace -p`` a busy process reads as stopped at every other system call,
    which one sample cannot tell from a debugger holding it."""
    stopped = ((psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP) if traced
               else (psutil.STATUS_STOPPED,))
    try:
        return psutil.Process(pid).status() in stopped
    except psutil.Error:
        return False


def host_starting(*, service_json: bool, os_lock: Literal["free", "held", "unknown"],
                  owner: str | None, owner_paused: bool) -> bool:
    """Whether the facts show a host in its start-up: the one rule for ``starting_owner``
    (fresh reads, for the client) and ``diagnostics.owners`` (its snapshot, for status and
    doctor). A start takes ``service.lock`` first and writes ``service.json`` last, once it
    listens (after loading Workflows and restoring Runs, which may take a while), holding
    the lock's OS lock throughout; a stop removes ``service.json`` just before the lock.
    So a live, unpaused owner of the lock (``owner``: None without a readable lock record),
    its OS lock held, and no ``service.json`` is a host starting; a paused one will not
    finish starting until it is resumed."""
    return not service_json and os_lock == "held" and owner == "alive" and not owner_paused


def _lock_owner(paths: ProjectPaths) -> tuple[ServiceLock, ProcessProbe] | None:
    """``service.lock``'s record, read now, and its owner process probed; None when there is
    none or it cannot be read (doctor says why: nothing here is proof of anything)."""
    try:
        lock = read_lock(paths.service_lock)
    except IntloomError:
        return None
    if lock is None:
        return None
    return lock, probe_process(lock.pid, lock.create_time, lock.boot_id, boot_id(),
                               paths.service_lock)


def starting_owner(paths: ProjectPaths, *, service_json_gone: bool = False) -> ServiceLock | None:
    """The lock record of a host in its start-up (``host_starting``, read now), or None.
    ``service_json_gone``: the caller proved the host ``service.json`` names gone (a crashed
    host's file, which the starting one replaces once it serves): it counts as absent."""
    found = _lock_owner(paths)
    if found is None:
        return None
    lock, process = found
    starting = host_starting(
        service_json=not service_json_gone and os.path.lexists(paths.service_json),
        os_lock=probe_lock(paths.service_lock).state,
        owner=process.state,
        owner_paused=paused(lock.pid),
    )
    return lock if starting else None


def gone_owner(paths: ProjectPaths) -> ServiceLock | None:
    """The lock record of ``service.lock`` when its owner is provably gone (``judge``: the
    process gone and the OS lock free), read now; None otherwise (no file, unreadable, an
    owner alive or unknown: nothing here is proof)."""
    found = _lock_owner(paths)
    if found is None:
        return None
    lock, process = found
    return lock if judge(probe_lock(paths.service_lock), process) == "gone" else None


def unheld_lock(path: Path) -> tuple[int, int] | None:
    """The identity (device, inode) of ``path`` when it is a regular file whose OS lock
    nobody holds, else None. The lock is probed on the very file opened, and that file is
    still the one at ``path`` afterwards (filelock's identity check): a lock file removed
    or replaced meanwhile proves nothing about the one read before."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            return None
        try:
            fd = exclusive_lock(fd, path)  # on NFS, through a writable descriptor
        except OSError:
            return None  # held, or not to be probed: not free either way
        fcntl.flock(fd, fcntl.LOCK_UN)
        there = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    finally:
        os.close(fd)
    identity = (opened.st_dev, opened.st_ino)
    return identity if (there.st_dev, there.st_ino) == identity else None


def holds_open(pid: int, identity: tuple[int, int]) -> bool | None:
    """Whether process ``pid`` has a descriptor open on the file ``identity`` (device,
    inode), from ``/proc/PID/fd``; None when that cannot be told (another user's process,
    no ``/proc``, the process gone meanwhile). A host creates its ``service.lock`` through
    a descriptor it keeps, and only takes the OS lock on it a moment after the file
    appears: a free lock alone does not prove that a live pid is not its owner."""
    fds = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fds)
    except OSError:
        return None
    for name in names:
        try:
            target = os.stat(f"{fds}/{name}")
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                continue  # closed since the listing
            return None
        if (target.st_dev, target.st_ino) == identity:
            return True
    return False
