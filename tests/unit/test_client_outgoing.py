"""The client's request encoding (``frame_of``) names what cannot be sent, without looping."""

from __future__ import annotations

from pathlib import Path
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


def test_a_zombie_host_is_said_to_have_exited_as_doctor_says_it(tmp_path: Path) -> None:
    """`runs` said the pid "no longer exists" where `status` (doctor's evidence) said, of the
    same process a moment later, that it is a zombie: an exited host not yet reaped."""
    import subprocess

    from intloom.client.client import _host_gone
    from tests.helpers import eventually

    def zombie() -> bool:
        with open(f"/proc/{child.pid}/stat", "rb") as fh:
            return fh.read().rpartition(b") ")[2][:1] == b"Z"

    child = subprocess.Popen(["true"])
    try:
        eventually(zombie, timeout=10, what="the child to exit, unreaped")
        why = _host_gone(child.pid, 0.0, tmp_path / "service.lock")
        assert why is not None and why.startswith("which has exited (a zombie"), why
    finally:
        child.wait()
    assert _host_gone(child.pid, 0.0, tmp_path / "service.lock") == (
        "which no longer exists (the host exited without cleaning up)")
