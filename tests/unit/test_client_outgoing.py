"""The client's request encoding (``frame_of``) names what cannot be sent, without looping."""

from __future__ import annotations

from typing import Any

import pytest

from intloom.client.outgoing import frame_of
from intloom.errors import IntloomError
from intloom.protocol.messages import Answer

pytestmark = pytest.mark.timeout(20)


def test_a_value_that_contains_itself_is_refused_not_walked_for_ever() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(IntloomError) as info:  # msgpack refuses the big int (in a set)
        frame_of(Answer(run_id="RUN-1", action_id="ASK-1", answer=[{2**70}, cycle]))
    assert info.value.code == "INVALID_REQUEST" and "beyond 64 bits" in info.value.message


def test_the_path_of_a_big_integer_is_named() -> None:
    shared = {"n": 2**70}
    with pytest.raises(IntloomError) as info:
        frame_of(Answer(run_id="RUN-1", action_id="ASK-1",
                        answer={"a": [1, shared], "b": shared}))
    assert "answer.a[1].n is an integer beyond 64 bits" in info.value.message
