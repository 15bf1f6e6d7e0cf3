"""The restart table, proven by ending the real host at its durable writes (a CI sample).

``scripts/crash-sweep`` ends the host at *every* durable write of the reference Workflow, in
every way (SIGKILL after or before the fdatasync, a torn write, every torn prefix of a batch,
a graceful stop), on the first host and on the host that continues a restored wait. CI runs
the points below, chosen so that every row of the table is reached (each point states the
row it must reach and why), plus a few rotating ones. The invariants checked at each point
are the harness's (``tests/e2e/conformance_harness.py``): no completed Step and no started
effect ran again, no acknowledged record was lost, each Run is in the state its row names and
``doctor``'s preview agreed with what ``start`` then did, an interrupted Run names its
in-flight effect, a restored wait has the same action id and view.

The flush numbers follow the executor's batching (``FLUSHES_GUESS``); if it changes, a point
reaches another row and its test says which, and ``scripts/crash-sweep`` shows the new map.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.e2e.conformance_harness import (
    CONTINUATION_GUESS,
    FLUSHES_GUESS,
    MODES,
    RESTORED_WAIT,
    Fault,
    Plan,
    Totals,
    find_last,
    run_all,
    sample,
    with_modes,
)

pytestmark = pytest.mark.e2e

CAB, CBS, TORN, STOP = "crash_after_sync", "crash_before_sync", "torn_write", "stop_after_sync"

# (plan, the row(s) doctor may preview at the last restart, words its reason must hold)
Point = tuple[Plan, str, str]
# A graceful stop lands at the next boundary the Run reaches after the signal is handled:
# the Run may get one boundary further than the flush that sent it, so either row is right.
AFTER_A_STOP = "resume|restore_wait"
GROUPS: dict[str, list[Point]] = {
    "creation and safe boundaries": [
        ((Fault(TORN, 1),), "none", ""),  # the creation torn: the Run never became visible
        ((Fault(CBS, 1, cut=1),), "resume", "was created"),  # only its header made it
        ((Fault(STOP, 3),), AFTER_A_STOP, ""),  # a graceful stop while Steps run
        ((Fault(CBS, 6, cut=2),), "route", "finished with outcome"),  # outcome saved, no more
        ((Fault(CBS, 12, cut=2),), "resume", "entering Stage 'review'"),  # routed to a Stage
    ],
    "effects and waits with recover": [
        ((Fault(CAB, 4),), "interrupted", "effect 'download'"),  # an effect in flight
        ((RESTORED_WAIT,), "restore_wait", "confirmation"),  # waiting, with recover
        ((Fault(TORN, 11),), "restore_wait", "confirmation"),  # shown, then the answer torn
        ((Fault(CBS, 11, cut=1),), "recover", "continues in recover"),  # answered, with recover
        ((Fault(CAB, 13),), "restore_wait", "questions"),  # a questions wait, with recover
        ((Fault(CBS, 14, cut=1),), "recover", "continues in recover"),
    ],
    "waits without recover, Agent tasks, the end": [
        ((Fault(CAB, 16),), "interrupted", "has no recover entry"),  # confirmation waiting
        ((Fault(CBS, 17, cut=1),), "interrupted", "accepted but"),  # confirmation answered
        ((Fault(CAB, 19),), "interrupted", "questions"),  # questions waiting, no recover
        ((Fault(CAB, 22),), "interrupted", "(available)"),  # an Agent task published
        ((Fault(CAB, 23),), "interrupted", "(claimed)"),  # claimed; Tool receipts not kept
    ],
    "the host that continues a restored wait": [
        ((RESTORED_WAIT, Fault(CAB, 1)), "recover", "continues in recover"),
        ((RESTORED_WAIT, Fault(STOP, 2)), AFTER_A_STOP, ""),
        ((RESTORED_WAIT, Fault(TORN, 4)), "interrupted", ""),
        ((RESTORED_WAIT, Fault(CAB, CONTINUATION_GUESS)), "none", ""),  # its terminal record
    ],
}
# Which rotation of the sample runs; a CI that varies it covers every flush over time.
OFFSET = int(os.environ.get("INTLOOM_SWEEP_OFFSET", "0"))


def check(totals: Totals) -> None:
    print(json.dumps(totals.summary()))  # the figures the issue asks for (pytest -s)
    assert not totals.violations, "\n".join(totals.violations)


@pytest.mark.parametrize("group", list(GROUPS))
def test_every_row_of_the_restart_table_through_the_real_host(group: str,
                                                               tmp_path: Path) -> None:
    points = GROUPS[group]
    results = run_all(tmp_path, [plan for plan, _, _ in points], jobs=2)
    check(Totals.of(results))
    for (plan, row, words), result in zip(points, results, strict=True):
        name = " then ".join(str(f) for f in plan)
        assert result.fired, f"{name}: nothing fired; the Run makes fewer flushes now"
        assert result.rows[-1] in row.split("|"), (
            f"{name} reached {result.rows[-1]} ({result.reasons[-1]}), not {row}: the "
            "executor's batching changed; scripts/crash-sweep shows which flush is which")
        assert words in result.reasons[-1], (name, result.reasons[-1])
    if group == "effects and waits with recover":
        # The wait `flow` showed came back identical: same action id, same view.
        [torn] = [r for r in results if r.plan == (Fault(TORN, 11),)]
        assert torn.compared == 1


def test_the_sweep_covers_every_durable_write(tmp_path: Path) -> None:
    """A crash at the last flush finds the Run's end durable; one past it finds nothing."""
    last, probes = find_last(tmp_path, (), FLUSHES_GUESS, jobs=2)
    check(Totals.of(probes))
    assert last == FLUSHES_GUESS, f"the Run now makes {last} flushes; update FLUSHES_GUESS"
    [at_last] = [r for r in probes if r.plan[-1].n == last]
    assert at_last.rows == ["none"]  # terminal: never loaded again


def test_a_rotating_sample_of_the_other_points(tmp_path: Path) -> None:
    explicit = {plan for points in GROUPS.values() for plan, _, _ in points}
    plans = [p for p in sample(with_modes((), FLUSHES_GUESS, MODES), 8, OFFSET)
             if p not in explicit and p[-1].n <= FLUSHES_GUESS]
    results = run_all(tmp_path, plans, jobs=2)
    check(Totals.of(results))
    assert all(r.fired for r in results)
