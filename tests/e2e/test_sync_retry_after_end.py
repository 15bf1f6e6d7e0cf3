"""A sync Step retrying ``ctx.effect`` in a loop that catches everything, as real code around
a flaky call does, once its Run no longer waited for it (a stop's grace that ran out, a
cancel): every call was refused at once (the ctx is over) and the loop spun on its worker
thread at 100 % of a core, until the host exited (a stop) or for good (a cancel, the host
staying up). The first refusal is still raised, so a Step that catches it and ends ends; a
thread that calls through the over ctx again waits there until the host exits."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.helpers import Project, eventually, ok, one_source_project, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SOURCE = '''
import time
from pathlib import Path

import intloom

SEEN = Path(__file__).resolve().parent.parent / "seen.txt"

spin = intloom.Workflow("spin", version="1")
s = spin.stage("s")


@s.step("a", routes={"ok": intloom.COMPLETE})
def a(ctx: intloom.StepContext[None]) -> str:
    # Bounded, so that the host this test starts without the fix ends its loop some day.
    for n in range(5_000_000):
        try:
            ctx.effect("nap", time.sleep, 0.001, key=f"k{n}")
        except Exception as exc:  # the mistake under test
            if n % 1000 == 0 or not SEEN.exists() or SEEN.stat().st_size < 4000:
                with SEEN.open("a") as f:
                    f.write(getattr(exc, "code", type(exc).__name__) + "\\n")
    return "ok"
'''


@pytest.fixture
def proj(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "spin", SOURCE))


def _refusals(proj: Project) -> list[str]:
    seen = proj.root / "seen.txt"
    return seen.read_text().split() if seen.exists() else []


def _once_each(refusals: list[str]) -> bool:
    """EXECUTION_OWNERSHIP_LOST when the Run's end came between two effects (said by the
    effect the loop refused), then the over ctx's own refusal: each once at most."""
    return (len(refusals) == len(set(refusals))
            and set(refusals) <= {"EXECUTION_OWNERSHIP_LOST", "STEP_INTERACTION_INVALID"})


def _effects_ran(proj: Project, run_id: str) -> bool:
    return proj.cli("inspect", run_id).stdout.count("effect_done") >= 3


class _Cpu:
    """CPU time of a process, sampled at each poll: idle once it used under ``most`` s of
    CPU over a span of at least ``window`` s of wall time."""

    def __init__(self, process: psutil.Process, window: float = 0.5, most: float = 0.1
                 ) -> None:
        self.process, self.window, self.most = process, window, most
        self.samples: list[tuple[float, float]] = []
        self.worst = 0.0

    def idle(self) -> bool:
        times = self.process.cpu_times()
        now = time.monotonic()
        self.samples.append((now, times.user + times.system))
        for at, cpu in reversed(self.samples):
            if now - at >= self.window:
                used = (self.samples[-1][1] - cpu) / (now - at)
                self.worst = max(self.worst, used)
                return self.samples[-1][1] - cpu < self.most
        return False


def test_a_sync_step_retrying_its_effect_after_a_cancel_does_not_spin(proj: Project) -> None:
    ok(proj.cli("start", "--json"))
    run_id = ok(proj.cli("flow", "spin", "--intent", "x", "--detach", "--json"))["run"]["runId"]
    eventually(lambda: _effects_ran(proj, run_id), timeout=20, what="the Step's effects")
    cancelled = ok(proj.cli("cancel", run_id, "--json"))["run"]
    assert cancelled["status"] == "failed"
    assert cancelled["lastError"]["code"] == "RUN_STOPPED"
    # The Step heard that its Run no longer waits for it, once.
    eventually(lambda: _refusals(proj), timeout=20, what="the Step's first refusal")

    host = psutil.Process(proj.host_pid())
    cpu = _Cpu(host)
    # The host stays up after a cancel: its thread would spin on its refusals for good.
    try:
        eventually(cpu.idle, timeout=20, what="the host to idle")
    except AssertionError:
        raise AssertionError(f"the host kept using {cpu.worst:.0%} of a core") from None
    refusals = _refusals(proj)
    assert _once_each(refusals) and refusals[-1] == "STEP_INTERACTION_INVALID", refusals[:5]

    # The host still serves: another Run of the Workflow runs its effects.
    again = ok(proj.cli("flow", "spin", "--intent", "y", "--detach", "--json"))["run"]["runId"]
    eventually(lambda: _effects_ran(proj, again), timeout=20, what="the next Run's effects")
    ok(proj.cli("cancel", again, "--json"))
    stopped = ok(proj.cli("stop", "--json", "--timeout", "60"))
    assert stopped["stopped"] is True


def test_a_sync_step_retrying_its_effect_through_a_stop_does_not_spin(proj: Project) -> None:
    ok(proj.cli("start", "--json", env={"INTLOOM_TEST_SUSPEND_GRACE": "1"}))
    run_id = ok(proj.cli("flow", "spin", "--intent", "x", "--detach", "--json"))["run"]["runId"]
    eventually(lambda: _effects_ran(proj, run_id), timeout=20, what="the Step's effects")
    stopped = ok(proj.cli("stop", "--json", "--timeout", "60"))
    assert stopped["stopped"] is True
    [cut] = stopped["cut"]
    assert cut["runId"] == run_id
    # Each refusal once at most (none: cut in an effect, whose end never came back to the
    # Step), then the thread waited for the host to exit rather than spin until it did.
    assert _once_each(_refusals(proj)), _refusals(proj)[:5]

    ok(proj.cli("start", "--json"))
    [view] = [r for r in ok(proj.cli("runs", "--json"))["runs"] if r["runId"] == run_id]
    assert view["status"] == "failed"
    assert view["lastError"]["code"] == "RUN_INTERRUPTED", view["lastError"]
    ok(proj.cli("stop", "--json"))
