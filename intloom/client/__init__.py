"""The Python client of a project's host: ``Client.connect(root)``, one method per request.

``intloom.client.lifecycle`` (imported on demand) starts and stops the host.
"""

from __future__ import annotations

from intloom.client.client import Client, ServiceStarting

__all__ = ["Client", "ServiceStarting"]
