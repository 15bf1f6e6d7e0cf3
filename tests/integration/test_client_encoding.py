"""Values the client cannot encode (msgpack: integers within 64 bits, UTF-8 text, plain data)
are refused with INVALID_REQUEST before a byte is sent: the error names the value, the Run is
left exactly as it was, and the same connection keeps working. A real host, a real client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from intloom.client.client import Client
from intloom.errors import IntloomError
from intloom.protocol.messages import MAX_FRAME
from intloom.runtime.model import RunView
from tests.helpers import Project
from tests.integration.host_support import start

pytestmark = pytest.mark.timeout(60)

HUGE = 123456789012345678901234567890


@pytest.fixture
def client(project: Project) -> Iterator[Client]:
    start(project)
    with Client.connect(project.root) as connected:
        yield connected


def _waiting(client: Client) -> tuple[RunView, str]:
    run = client.create_run("example", "release notes")
    assert run.status == "waiting" and run.pending_action is not None
    return run, run.pending_action.id


def _refused(call: Any) -> str:
    with pytest.raises(IntloomError) as refused:
        call()
    assert refused.value.code == "INVALID_REQUEST", refused.value.message
    assert refused.value.retryable is False
    assert "Nothing was sent" in refused.value.message
    return refused.value.message


@pytest.mark.parametrize(
    ("answer", "where"),
    [
        ({"isConfirmed": True, "feedback": HUGE}, "answer.feedback"),
        ({"isConfirmed": True, "extra": {"deep": [1, -(2**63) - 1]}}, "answer.extra.deep[1]"),
        (2**64, "answer"),
    ],
)
def test_an_answer_beyond_64_bits_leaves_the_wait_and_the_connection_as_they_were(
    client: Client, answer: Any, where: str
) -> None:
    run, action = _waiting(client)
    message = _refused(lambda: client.answer(run.run_id, action, answer))
    assert message.startswith(f"Cannot send the Answer request: {where} is an integer beyond "
                              "64 bits"), message
    assert "-2**63 to 2**64-1" in message and "as a string" in message
    # Nothing reached the host: the same wait, untouched, on the same connection.
    assert client.get_run(run.run_id) == run
    done = client.answer(run.run_id, action, {"isConfirmed": True, "feedback": str(HUGE)})
    assert done.status == "completed"


def test_the_64_bit_limits_themselves_are_sent(client: Client) -> None:
    run, action = _waiting(client)
    for edge in (2**64 - 1, -(2**63)):
        # The host reads them and refuses the shape (feedback is text), as it would any int.
        with pytest.raises(IntloomError) as shape:
            client.answer(run.run_id, action, {"isConfirmed": True, "feedback": edge})
        assert shape.value.code == "INVALID_REQUEST"
        assert "Cannot send" not in shape.value.message
    assert client.get_run(run.run_id) == run


def test_an_intent_that_is_not_utf8_is_refused_and_no_run_is_created(client: Client) -> None:
    # What ``--intent`` holds when the shell passed bytes that are not UTF-8 (surrogateescape).
    message = _refused(lambda: client.create_run("example", "notes \udcff"))
    assert message.startswith("Cannot send the CreateRun request: intent holds text that is "
                              "not valid Unicode"), message
    assert "\udcff" not in message  # the message itself can be printed
    assert client.runs() == []


def test_agent_values_are_checked_before_sending(client: Client) -> None:
    # No such call exists: a request that reached the host would be NOT_FOUND, so
    # INVALID_REQUEST proves the client refused it first.
    message = _refused(lambda: client.call_tool("RUN-x", "CALL-x", "token", "tc-1", "lookup",
                                                {"ids": [HUGE]}))
    assert message.startswith("Cannot send the CallTool request: input.ids[0] is an integer")
    message = _refused(lambda: client.complete_agent_call("RUN-x", "CALL-x", "token", "done",
                                                          {"result": object()}))
    assert message.startswith("Cannot send the CompleteAgentCall request: output cannot be "
                              "encoded"), message
    deep: Any = []
    for _ in range(5000):
        deep = [deep]
    message = _refused(lambda: client.complete_agent_call("RUN-x", "CALL-x", "token", "done",
                                                          deep))
    assert "output is nested too deeply" in message
    with pytest.raises(IntloomError) as unknown:
        client.call_tool("RUN-x", "CALL-x", "token", "tc-1", "lookup", {"ids": [1]})
    assert unknown.value.code == "NOT_FOUND"  # and the connection still serves


def test_a_request_over_the_frame_limit_is_refused_before_sending(client: Client) -> None:
    run, action = _waiting(client)
    message = _refused(lambda: client.answer(run.run_id, action, {
        "isConfirmed": True, "feedback": "x" * MAX_FRAME}))
    assert f"over the {MAX_FRAME}-byte frame limit" in message
    assert client.get_run(run.run_id) == run


def test_an_intent_over_the_frame_limit_names_the_intents_own_limit(client: Client) -> None:
    """An intent of 5 MB was refused by the frame's 4 MiB bound, which the message named
    alone: shrunk to 4 MB, it was refused again, by the host's 1 MiB limit for an intent."""
    before = len(client.runs())
    message = _refused(lambda: client.create_run("example", "x" * (5 << 20)))
    assert message.startswith("The intent is 5,242,880 bytes, over the 1,048,576-byte limit; "
                              "no Run was created."), message
    assert "frame limit" not in message
    assert len(client.runs()) == before  # and the connection still serves


@pytest.mark.parametrize(
    ("call", "starts"),
    [
        (lambda c: c.create_run("example", None),
         "Cannot send the CreateRun request: intent must be a str, not NoneType"),
        (lambda c: c.create_run(None, "notes"),
         "Cannot send the CreateRun request: workflow must be a str, not NoneType"),
        (lambda c: c.get_run(5), "Cannot send the GetRun request: run_id must be a str, not int"),
        (lambda c: c.cancel(b"RUN-x"),
         "Cannot send the Cancel request: run_id must be a str, not bytes"),
    ],
)
def test_an_argument_of_the_wrong_type_is_named_before_sending(
    client: Client, call: Any, starts: str
) -> None:
    """create_run("example", None) was sent, and the host's reply spoke of its protocol:
    "the frame is not a valid request (Expected `str`, got `None` - at `$.intent`)"."""
    message = _refused(lambda: call(client))
    assert message.startswith(starts), message
    assert "frame" not in message, message
    assert client.runs() == []  # the connection is as it was


def test_a_value_that_contains_itself_is_named_as_a_cycle_not_as_deep(client: Client) -> None:
    """An answer or output holding a reference to itself (``notes["self"] = notes``) was
    refused as "nested too deeply. Flatten it": no flattening ends a cycle. It is now named
    where it loops back, with its fix; the wait and the connection are as they were."""
    run, action = _waiting(client)
    feedback: dict[str, Any] = {"text": "ok"}
    feedback["again"] = [1, feedback]
    message = _refused(lambda: client.answer(run.run_id, action,
                                             {"isConfirmed": True, "extra": feedback}))
    assert message.startswith(
        "Cannot send the Answer request: answer.extra.again[1] refers back to answer.extra, "
        "which holds it (a reference cycle), so it has no end to send. Send a copy without the "
        "cycle (copy.deepcopy keeps it)."), message
    assert "nested too deeply" not in message
    still = client.get_run(run.run_id)
    assert still.pending_action is not None and still.pending_action.id == action
