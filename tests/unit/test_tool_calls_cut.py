"""What the last host's log says of the Agent work it left unfinished (``tool_calls_cut``),
from log lines as a host writes them."""

from __future__ import annotations

import json

from intloom.host.toolcalls import tool_calls_cut


def _log(*records: dict[str, object]) -> tuple[str, bytes]:
    return "LOG-x.jsonl", b"\n".join(json.dumps(r).encode() for r in records)


def test_a_tool_call_whose_id_reads_as_a_completion_is_still_a_tool_call() -> None:
    """Completions were keyed by a "completion <callId>" string where Tool calls are keyed
    by the id the Agent picked: a Tool call named "completion CALL-1" was reported as "the
    Agent completed task None (outcome None)"."""
    cut = tool_calls_cut(_log(
        {"event": "run_tool_started", "runId": "RUN-1", "callId": "CALL-1",
         "toolCallId": "completion CALL-1", "tool": "charge", "time": "T1"}))
    assert cut["RUN-1"].endswith("says Tool call completion CALL-1 (Tool 'charge') started T1 "
                                 "and never returned: it was running when the host went, so "
                                 "check what that Tool did"), cut


def test_a_completion_is_lost_until_its_records_are_durable_and_a_refusal_is_not_lost() -> None:
    cut = tool_calls_cut(_log(
        {"event": "run_completion_started", "runId": "RUN-1", "callId": "CALL-1",
         "outcome": "done", "time": "T1"},
        {"event": "run_completion_started", "runId": "RUN-2", "callId": "CALL-2",
         "outcome": "done", "time": "T2"},
        {"event": "run_completion_ended", "runId": "RUN-2", "callId": "CALL-2",
         "outcome": "done", "ended": "recorded"},
        {"event": "run_completion_started", "runId": "RUN-3", "callId": "CALL-3",
         "outcome": "done", "time": "T3"},
        {"event": "run_completion_ended", "runId": "RUN-3", "callId": "CALL-3",
         "outcome": "done", "ended": "INVALID_REQUEST"},
        {"event": "run_completion_started", "runId": "RUN-4", "callId": "CALL-4",
         "outcome": "done", "time": "T4"},
        {"event": "run_completion_ended", "runId": "RUN-4", "callId": "CALL-4",
         "outcome": "done", "ended": "CLI_SERVICE_CLOSING"}))
    assert set(cut) == {"RUN-1", "RUN-4"}, cut
    assert "the Agent completed task CALL-1 (outcome 'done') at T1, and the host went " \
        "before that completion was recorded" in cut["RUN-1"], cut
    assert "the Agent completed task CALL-4 (outcome 'done') at T4, while the host " \
        "stopped" in cut["RUN-4"], cut


def _call(run: str, task: str, call: str, outcome: str) -> list[dict[str, object]]:
    return [{"event": "run_tool_started", "runId": run, "callId": task, "toolCallId": call,
             "tool": "charge", "time": "T"},
            {"event": "run_tool_ended", "runId": run, "callId": task, "toolCallId": call,
             "outcome": outcome, "ms": 1.0}]


def test_the_tool_calls_a_lost_task_made_are_named_and_no_other_tasks() -> None:
    """A Tool call that returned (a card charged) was named nowhere after a crash: only one
    still running was. Those of the task each Run waited on are named, with how they ended;
    those of an earlier task, whose completion was recorded, are not."""
    log = _log(*_call("RUN-1", "CALL-old", "tc-0", "returned"),
               *_call("RUN-1", "CALL-1", "tc-1", "returned"),
               *_call("RUN-1", "CALL-1", "tc-2", "TOOL_EXECUTION_FAILED"),
               *[r for i in range(7) for r in _call("RUN-2", "CALL-2", f"t{i}", "returned")],
               *_call("RUN-3", "CALL-3", "tc-3", "returned"))
    cut = tool_calls_cut(log, {"RUN-1": "CALL-1", "RUN-2": "CALL-2", "RUN-3": "CALL-other"})
    assert set(cut) == {"RUN-1", "RUN-2"}, cut
    assert cut["RUN-1"] == (
        "the log of the host it ran on (.intloom/logs/LOG-x.jsonl) says task CALL-1 had made "
        "Tool calls tc-1 (Tool 'charge', returned), tc-2 (Tool 'charge', ended "
        "TOOL_EXECUTION_FAILED) before the host went: each ran, and what they did stands, so "
        "check it before starting new work"), cut
    assert "tc-0" not in cut["RUN-1"]
    assert ("task CALL-2 had made Tool calls t0 (Tool 'charge', returned), t1 " in cut["RUN-2"]
            and "t4 (Tool 'charge', returned) and 2 more before the host went" in cut["RUN-2"]), cut
    # Without the tasks (a caller that knows none), only what was left running is named.
    assert tool_calls_cut(log) == {}
    # One call, and one left running beside it: both clauses.
    both = tool_calls_cut(_log(*_call("RUN-1", "CALL-1", "tc-1", "returned"),
                               _call("RUN-1", "CALL-1", "tc-2", "returned")[0]),
                          {"RUN-1": "CALL-1"})["RUN-1"]
    assert ("says Tool call tc-2 (Tool 'charge') started T and never returned: it was running "
            "when the host went, so check what that Tool did; task CALL-1 had made Tool call "
            "tc-1 (Tool 'charge', returned) before the host went: it ran, and what it did "
            "stands") in both
