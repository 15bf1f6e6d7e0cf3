"""The Python client of a project's host: ``Client.connect(root)``, one method per request.

``intloom.client.lifecycle`` (imported on demand) starts and stops the host;
``intloom.client.hostlog`` names its log without a socket.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from intloom.client.client import Client, ServiceStarting

__all__ = ["Client", "ServiceStarting"]


def __getattr__(name: str) -> Any:
    # On first use: a submodule that needs no socket (hostlog, for ``intloom logs``) is
    # imported without the client's socket and protocol stack.
    if name in __all__:
        from intloom.client import client

        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    # The public names only, loaded on use as above: without it dir() listed Any and
    # TYPE_CHECKING and not Client, and help(intloom.client) showed no class at all.
    return sorted(__all__)
