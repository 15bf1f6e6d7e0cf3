"""attach's waits on its event thread's condition, in this process, with a real SIGINT."""

from __future__ import annotations

import signal
import threading
from typing import Any

import pytest

from intloom.cli.commands.attach import _wait

pytestmark = pytest.mark.timeout(30)


def test_ctrl_c_in_a_wait_leaves_the_condition_held_for_its_with_block() -> None:
    """Condition.wait releases its lock, then enters the try that takes it back: a Ctrl-C
    raised between the two left it released, and leaving ``with cond`` then failed with
    RuntimeError (attach exited 70, "cannot release un-acquired lock") instead of
    detaching. The SIGINT is raised in that very window here."""
    cond = threading.Condition()
    release_save = cond._release_save  # type: ignore[attr-defined]

    def released_then_interrupted() -> Any:
        state = release_save()
        signal.raise_signal(signal.SIGINT)
        return state

    cond._release_save = released_then_interrupted  # type: ignore[attr-defined]
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), cond:
            _wait(cond, lambda: False)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert cond.acquire(blocking=False)  # released by the with block, not left held
    cond.release()
