"""What an Agent Step's ``on_complete`` receives when its client Agent completes the task."""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["AgentResult"]


class AgentResult(msgspec.Struct, frozen=True):
    """The client Agent's completion: the ``outcome`` it chose (one of the Step's routes)
    and the ``output`` it sent (plain JSON data; ``None`` when it sent none)."""

    outcome: str
    output: Any = None
