"""``RunUpdate``: one entry of a Run's history, shared by the driver and the Runtime facade.

It lives apart so that ``RunSlot.publish`` (a few times per Step) can import it at module
level instead of through a function-level import that would cycle back into the Runtime.
"""

from __future__ import annotations

from typing import Any

import msgspec

from intloom.runtime.model import RunView

__all__ = ["RunUpdate"]


class RunUpdate(msgspec.Struct, frozen=True, gc=False):
    """One entry of a Run's history or a live change, for ``subscribe``."""

    event: str
    run: RunView
    detail: Any = None
    history: bool = False
    # On the first entry of a history that does not start at the Run's start: how many
    # earlier events are no longer held (a host keeps a Run's last entries; its journal
    # keeps every record, for ``inspect``).
    omitted: int = 0
