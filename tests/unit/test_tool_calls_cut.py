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
