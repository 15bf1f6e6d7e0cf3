"""What every benchmark shares: statistics, the raw disk floor, the machine, and real hosts.

Every figure is a ratio against a baseline measured in the same run, on the same disk, never
a hard-coded number (but ``events``, an absolute p99, and ``crash``, counts). Timed regions
never include set-up; repeats are interleaved with their baseline so that a noisy neighbour
hits both sides alike; figures are medians.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
VENV_PY = REPO / ".venv" / "bin" / "python"
INTLOOM = REPO / ".venv" / "bin" / "intloom"


# ----- statistics ------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by the nearest-rank method: a value that occurred."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, -(-len(ordered) * q // 100))  # ceil without floats
    return float(ordered[int(rank) - 1])


def rnd(value: float, digits: int = 1) -> float:
    return round(float(value), digits)


def verdict(ratio: float, target: float, *, at_most: bool) -> str:
    ok = ratio <= target if at_most else ratio >= target
    return "met" if ok else "not met"


def shown(value: float, digits: int, *, at_most: bool) -> float:
    """``value`` rounded to ``digits`` decimals toward missing its target: up where the
    target is a ceiling (``at_most``), down where it is a floor.

    Rounded to the nearest, a ratio of 4.996 was shown as 5 beside "not met" against
    "≥ 5" (and the chart drew it on the line, as met). Rounded this way, a figure shown
    with its target's own digits never lands on the other side of the target from its
    verdict, which is taken from the value before rounding.
    """
    if not math.isfinite(value):
        return float(value)
    mode = ROUND_CEILING if at_most else ROUND_FLOOR
    # repr: the shortest text of the float, so that 1.1 is not ceiled to 1.101.
    return float(Decimal(repr(float(value))).quantize(Decimal(1).scaleb(-digits), mode))


def judged(ratio: float, target: float, *, at_most: bool, digits: int) -> tuple[float, str]:
    """(the ratio as shown, its verdict): see ``shown``."""
    return shown(ratio, digits, at_most=at_most), verdict(ratio, target, at_most=at_most)


def worst(kinds: dict[str, dict[str, Any]], *, at_most: bool) -> str:
    """Of the kinds of one figure (each with its ``ratio`` and ``verdict``), the one that
    fares worst against the target: one "not met" before any "met", then the larger ratio
    where the target is a ceiling (``at_most``), the smaller where it is a floor.

    A figure's headline (its top-level ``ratio`` and ``verdict``, its bar in the chart) is
    that kind's: a figure is met only when every kind of it is.
    """
    def badness(kind: str) -> tuple[bool, float]:
        ratio = float(kinds[kind]["ratio"])
        return kinds[kind]["verdict"] != "met", ratio if at_most else -ratio

    return max(kinds, key=badness)


def round_order(names: Sequence[str], round_: int) -> list[str]:
    """The order to run ``names`` in, round ``round_`` (0, 1, ...) of interleaved repeats.

    Each round starts one name later, and every other cycle of ``len(names)`` rounds runs
    them backwards: over ``2 * len(names)`` rounds each name runs first, and before each
    other name, equally often. In a fixed order whatever one left behind (page cache, the
    CPU's frequency, a neighbour's burst) fell on the same next one every time.
    """
    count = len(names)
    forward = list(names) if (round_ // count) % 2 == 0 else list(reversed(names))
    turn = round_ % count
    return forward[turn:] + forward[:turn]


# ----- the disk floor --------------------------------------------------------------------------


def raw_floor(directory: Path, writes: int, size: int, *, warmup: int = 50) -> tuple[float, float]:
    """(wall µs, CPU µs) per ``write`` + ``fdatasync`` of ``size`` bytes, appended to one file.

    The same syscalls a durable Step needs at the least, in the same directory, after a
    warm-up that makes the file's own metadata durable first.
    """
    path = directory / f"floor-{uuid.uuid4().hex}.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    payload = os.urandom(max(1, size))
    try:
        for _ in range(warmup):
            os.write(fd, payload)
            os.fdatasync(fd)
        os.fsync(fd)
        started, cpu = time.perf_counter(), time.process_time()
        for _ in range(writes):
            os.write(fd, payload)
            os.fdatasync(fd)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    finally:
        os.close(fd)
        path.unlink()
    return elapsed / writes * 1e6, cpu / writes * 1e6


# ----- the machine -----------------------------------------------------------------------------


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or "" when it cannot be read."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return ""


def machine(scratch_dir: str | None = None) -> dict[str, Any]:
    """What the figures were measured on, for the report; ``scratch_dir``: where their
    scratch files went (``--dir``; default: the system temp dir)."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
    }
    cpu = cpu_model()
    if cpu:
        info["cpu"] = cpu
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
    info["filesystem"] = filesystem(Path(scratch_dir or tempfile.gettempdir()))
    info["load_average"] = load_average()
    return info


# How much slower the gauge below may read than the fastest run on record on the same CPU
# model before ``all`` refuses to replace the report: it read 14-15 ms on this machine kind's
# Intel Xeon, 35-37 ms in the VM's slow spells, which lasted whole sessions (and moved the
# ratios, not just the times), and 20-36 ms on the AMD EPYC the VM ran on from 2026-12-06:
# a gauge says nothing of a spell against another model's.
SLOW_CPU = 1.5


def cpu_calibration_ms() -> float:
    """Milliseconds for a fixed pure-Python loop (best of 5): how fast this VM's CPU was
    around a run. The load average misses a slow host under the VM; this does not."""
    best = float("inf")
    for _ in range(5):
        began = time.perf_counter()
        total = 0
        for i in range(300_000):
            total += i * i % 7
        best = min(best, time.perf_counter() - began)
    return round(best * 1000, 1)


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages: how busy the machine was around a figure."""
    return [round(x, 2) for x in os.getloadavg()]


def filesystem(path: Path) -> str:
    """``device fstype (options)`` of the mount holding ``path``, from /proc/mounts."""
    best = ("", "?", "?", "")
    target = str(path.resolve())
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mnt, fstype, opts = line.split()[:4]
            if (target == mnt or target.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(
                best[1]
            ):
                best = (dev, mnt, fstype, opts)
    return f"{best[0]} {best[2]} ({best[3]})"


@contextlib.contextmanager
def scratch(base: str | None, prefix: str) -> Iterator[Path]:
    """A temporary directory under ``base`` (default: the system temp dir), removed after."""
    with tempfile.TemporaryDirectory(prefix=prefix, dir=base) as tmp:
        yield Path(tmp)


# ----- processes -------------------------------------------------------------------------------


def bench_env(**extra: str) -> dict[str, str]:
    """The environment for child processes: bytecode caches on, no colour."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["NO_COLOR"] = "1"
    env.update(extra)
    return env


def wait4_spawn(cmd: Sequence[str], *, cwd: Path | None = None,
                env: dict[str, str] | None = None,
                timeout: float = 300.0) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB) of one process, spawn to reap, output discarded; one
    still running after ``timeout`` s is killed (and reported as failed)."""
    started = time.perf_counter()
    proc = subprocess.Popen(list(cmd), cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    watchdog = threading.Timer(timeout, proc.kill)  # wait4 itself has no timeout
    watchdog.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        watchdog.cancel()
    elapsed = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}")
    return elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def pid_gone(pid: int) -> bool:
    """No such process, or only its zombie is left (it holds no lock, port or file)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(") ", 1)[-1].startswith("Z")
    except OSError:
        return True


def wait_gone(pid: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not pid_gone(pid):
        if time.monotonic() > deadline:
            raise RuntimeError(f"process {pid} did not exit within {timeout} s")
        time.sleep(0.005)  # a poll interval


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a live process, in MiB."""
    values: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


# ----- a project and its host, driven through the real CLI ------------------------------------

# The Workflows the host benchmarks run. Parameters travel in the intent, as JSON.
WORKFLOWS = '''\
"""Benchmark Workflows (generated by scripts/bench_common.py)."""

from __future__ import annotations

import json
import os
import time

import msgspec

import intloom


class Count(msgspec.Struct):
    n: int = 0
    data: str = ""


def _param(ctx, name, default):
    try:
        return json.loads(ctx.intent).get(name, default)
    except ValueError:
        return default


# loop: `target` trivial Steps, then a confirmation that survives restarts.
loop = intloom.Workflow("loop", version="1")
work = loop.stage("work", state=Count)


@work.step("tick", routes={"again": "tick", "done": "hold"})
async def tick(ctx):
    ctx.state = Count(n=ctx.state.n + 1, data=ctx.state.data)
    return "done" if ctx.state.n >= _param(ctx, "target", 1) else "again"


@work.step("hold", routes={"yes": intloom.COMPLETE, "no": intloom.COMPLETE})
async def hold(ctx):
    answer = await ctx.confirm({"steps": ctx.state.n})
    return "yes" if answer.confirmed else "no"


@hold.recover
def hold_recover(ctx, saved):
    return "yes" if saved.answer.confirmed else "no"


# busy: trivial Steps until cancelled.
busy = intloom.Workflow("busy", version="1")
spin = busy.stage("spin", state=Count)


# "done" is never returned: a Workflow none of whose routes completes is refused.
@spin.step("tick", routes={"again": "tick", "done": intloom.COMPLETE})
async def spin_tick(ctx):
    ctx.state = Count(n=ctx.state.n + 1)
    return "again"


# side: Step k records "step-k pid=... t=..." in a file through an effect; Step `slow`
# then hangs there (the test kills the host while it does).
side = intloom.Workflow("side", version="1")
chain = side.stage("chain", state=Count)


def _record(path, k, slow):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, f"step-{k} pid={os.getpid()} t={time.time():.6f}\\n".encode())
    finally:
        os.close(fd)
    if k == slow:
        time.sleep(600)
    return {"step": k, "ok": True, "data": "x" * 64}


@chain.step("step", routes={"again": "step", "done": intloom.COMPLETE})
def side_step(ctx):
    k = ctx.state.n + 1
    ctx.effect("side", _record, _param(ctx, "path", "side.txt"), k, _param(ctx, "slow", 0))
    ctx.state = Count(n=k)
    return "done" if k >= _param(ctx, "steps", 10) else "again"
'''


# Every process a Host's CLI calls start carries this variable, set to the Host's own tag,
# and passes it on (the CLI gives the host its environment): how ``close`` finds a host that
# never named itself in .intloom/, as one whose start timed out may not have.
TAG_ENV = "INTLOOM_BENCH_HOST"


def tagged(tag: str, name: str = TAG_ENV) -> set[int]:
    """The live processes of this user whose environment holds ``name=tag``."""
    marker = f"{name}={tag}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):  # gone meanwhile, or another user's
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                found.add(int(entry.name))
    found.discard(os.getpid())
    return found


def same_process(pid: int, created: float) -> bool:
    """Whether ``pid`` is the process created at ``created`` (the create time intloom's
    files record), as intloom's owner checks judge it: a reused pid has another."""
    import psutil

    from intloom.host.metadata import CREATE_TIME_TOLERANCE

    try:
        return abs(psutil.Process(pid).create_time() - created) <= CREATE_TIME_TOLERANCE
    except psutil.Error:
        return False


@dataclass
class Host:
    """A scratch project and the hosts started for it; ``close`` stops or kills them all."""

    root: Path
    # The pids .intloom/'s files named, each with the create time its file recorded.
    pids: dict[int, float] = field(default_factory=dict)
    tag: str = field(default_factory=lambda: uuid.uuid4().hex)
    timeout: float = 600.0  # seconds one CLI command may take before it is killed

    @classmethod
    def create(cls, parent: Path, name: str = "proj") -> Host:
        root = parent / name
        (root / "workflows").mkdir(parents=True)
        (root / "intloom.toml").write_text('workflows = ["workflows/bench.py"]\n')
        (root / "workflows" / "bench.py").write_text(WORKFLOWS)
        return cls(root)

    def cli(self, *args: str, check: bool = True) -> tuple[float, Any]:
        """(wall s, JSON reply) of ``intloom --project ROOT ARGS --json``."""
        started = time.perf_counter()
        try:
            proc = subprocess.run(
                [str(INTLOOM), "--project", str(self.root), *args, "--json"],
                capture_output=True, text=True, timeout=self.timeout,
                env=bench_env(**{TAG_ENV: self.tag}), cwd=self.root,
            )
        finally:
            self._track()  # also when the command timed out: its host may still be there
        elapsed = time.perf_counter() - started
        data = json.loads(proc.stdout) if proc.stdout.strip() else None
        if check and proc.returncode != 0:
            raise RuntimeError(f"intloom {' '.join(args)} exited {proc.returncode}: "
                               f"{proc.stdout[-1000:]} {proc.stderr[-1000:]}")
        return elapsed, data

    def _track(self) -> None:
        for name in ("service.json", "service.lock"):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                owner = json.loads((self.root / ".intloom" / name).read_text())
                self.pids[int(owner["pid"])] = float(owner["createTime"])

    def start(self) -> float:
        """Seconds from spawning ``intloom start`` to its exit, the host ready."""
        elapsed, data = self.cli("start")
        assert data["reused"] is False, data
        return elapsed

    def stop(self) -> None:
        self.cli("stop")

    def pid(self) -> int:
        return int(json.loads((self.root / ".intloom" / "service.json").read_text())["pid"])

    def kill(self) -> None:
        """SIGKILL the host and wait until it is gone; its files stay as a crash leaves them."""
        pid = self.pid()
        os.kill(pid, signal.SIGKILL)
        wait_gone(pid)

    def client(self) -> Any:
        from intloom.client import Client

        return Client.connect(self.root, request_timeout=None)

    def close(self) -> None:
        """Stop the live host; kill any process we started that is still there: those
        carrying this Host's tag (a host whose start timed out before it wrote its files, a
        CLI command still running), and those its files named that are still the process
        they recorded. A named pid alone is no proof: a host killed earlier leaves it in
        its files, and the pid may since belong to an unrelated process."""
        with contextlib.suppress(Exception):
            if (self.root / ".intloom" / "service.json").exists():
                self.cli("stop", check=False)
        named = {pid for pid, created in self.pids.items() if same_process(pid, created)}
        for pid in named | tagged(self.tag):
            if not pid_gone(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(RuntimeError):
                    wait_gone(pid, 5.0)


@contextlib.contextmanager
def project(parent: Path, name: str = "proj") -> Iterator[Host]:
    host = Host.create(parent, name)
    try:
        yield host
    finally:
        host.close()


def emit(result: dict[str, Any]) -> dict[str, Any]:
    """Print one figure as one JSON line and return it."""
    print(json.dumps(result), flush=True)
    return result


def note(message: str) -> None:
    """Progress for people, on stderr (stdout carries only the JSON)."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)
