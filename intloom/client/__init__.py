"""The Python client of a project's host: ``Client.connect(root)``, one method per request.

The views its methods return are re-exported here, so an Agent or a script can annotate
with them: ``RunView`` (a Run, as ``runs --json`` shows it) and its ``Cursor``,
``PendingAction``, ``PendingAgentCall`` and ``ErrorView``; ``RunEvent`` (``subscribe``),
``ServiceView`` (``status``), ``WorkflowInfo`` (``workflows``) and ``Stopping``
(``stop_reply``).

``intloom.client.lifecycle`` (imported on demand) starts and stops the host;
``intloom.client.hostlog`` names its log without a socket.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from intloom.client.client import Client, HelloFailed, ServiceStarting, ServiceUnlistened
    from intloom.errors import ErrorView
    from intloom.protocol.messages import RunEvent, ServiceView, Stopping, WorkflowInfo
    from intloom.runtime.model import Cursor, PendingAction, PendingAgentCall, RunView

__all__ = [
    "Client",
    "Cursor",
    "ErrorView",
    "HelloFailed",
    "PendingAction",
    "PendingAgentCall",
    "RunEvent",
    "RunView",
    "ServiceStarting",
    "ServiceUnlistened",
    "ServiceView",
    "Stopping",
    "WorkflowInfo",
]

# Where each name is defined; loaded on first use, so that a submodule that needs no socket
# (hostlog, for ``intloom logs``) is imported without the client's socket and protocol stack.
_WHERE = {
    "Client": "intloom.client.client",
    "HelloFailed": "intloom.client.client",
    "ServiceStarting": "intloom.client.client",
    "ServiceUnlistened": "intloom.client.client",
    "ErrorView": "intloom.errors",
    "RunEvent": "intloom.protocol.messages",
    "ServiceView": "intloom.protocol.messages",
    "Stopping": "intloom.protocol.messages",
    "WorkflowInfo": "intloom.protocol.messages",
    "Cursor": "intloom.runtime.model",
    "PendingAction": "intloom.runtime.model",
    "PendingAgentCall": "intloom.runtime.model",
    "RunView": "intloom.runtime.model",
}


# Not seen by type checkers: a module __getattr__ typed Any made every name imported from
# here check, a misspelt one too (`from intloom.client import RunVeiw` passed
# mypy --strict as Any, and failed at import).
if not TYPE_CHECKING:
    def __getattr__(name: str) -> Any:
        module = _WHERE.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return getattr(import_module(module), name)


def __dir__() -> list[str]:
    # The public names only, loaded on use as above: without it dir() listed Any and
    # TYPE_CHECKING and not Client, and help(intloom.client) showed no class at all.
    return sorted(__all__)
