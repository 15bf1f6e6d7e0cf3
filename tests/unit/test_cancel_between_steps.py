"""What a cancel says of a Run it finds between two Steps: a Step's result not yet routed,
the next Step or Stage not yet begun. It said "The Run was stopped." alone, and the view's
cursor stayed on the Step that had returned, as if that Step had been cut."""

from __future__ import annotations

from intloom.executor.runtime import _between
from intloom.runtime.machine import fold
from intloom.runtime.records import Executing, Record, StagePending, StepReady, StepResult
from tests.unit.test_store_support import header


def test_a_cancel_between_steps_says_where_and_that_nothing_was_cut() -> None:
    entering: list[Record] = [header("RUN-A"), StagePending(at="t1", stage="draft")]
    ready: list[Record] = [*entering, StepReady(at="t2", stage="draft", step="look",
                                                state=b"{}")]
    returned: list[Record] = [*ready, Executing(at="t3", stage="draft", step="look", kind="step"),
                StepResult(at="t4", stage="draft", step="look", outcome="found", state=b"{}",
                           output=None)]
    said = {phase: _between(state) for phase, records in
            (("stage_pending", entering), ("step_ready", ready), ("step_result", returned))
            if (state := fold(records)) is not None and state.phase == phase}
    assert said == {
        "stage_pending": "between Steps: Stage draft had not begun, and nothing was cut",
        "step_ready": "between Steps: Step draft/look had not begun, and nothing was cut",
        "step_result": "between Steps: Step draft/look had returned 'found' and nothing was "
                       "cut; the Step it routes to had not begun",
    }, said
    running = fold([*ready, Executing(at="t3", stage="draft", step="look", kind="step")])
    assert running is not None and _between(running) is None  # a Step running: _running's
