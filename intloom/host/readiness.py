"""The readiness pipe: how a starting host tells its launcher how startup went.

The launcher passes the write end of a pipe (``--ready-fd``). The host writes JSON lines:
``{"event": "progress", "step": ...}`` while it starts (``"step": "importing"`` adds the
``"source"`` being imported, and ``"imported"`` says that import ended), then exactly one of
``{"event": "ready", "service": ServiceView}`` (after restore, listen and ``service.json``) or
``{"event": "error", "error": {code, message, retryable}}``, and closes its end. A launcher
that sees end-of-file without either knows the host exited during initialisation.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any, Final

import msgspec

from intloom.errors import ErrorView
from intloom.protocol.messages import ServiceView

__all__ = ["ReadyChannel"]

_encoder: Final = msgspec.json.Encoder()


class ReadyChannel:
    """The host's end of the pipe, or a set of callbacks when the host runs in the foreground."""

    def __init__(
        self,
        fd: int | None = None,
        *,
        on_progress: Callable[[str], None] | None = None,
        on_ready: Callable[[ServiceView], None] | None = None,
        on_failed: Callable[[ErrorView], None] | None = None,
        on_importing: Callable[[str | None], None] | None = None,
    ) -> None:
        self._fd = fd
        self._on_importing = on_importing
        self._on_progress = on_progress
        self._on_ready = on_ready
        self._on_failed = on_failed

    def _send(self, line: dict[str, Any]) -> None:
        if self._fd is None:
            return
        data = _encoder.encode(line) + b"\n"
        try:
            while data:
                data = data[os.write(self._fd, data):]
        except OSError:
            # The launcher went away (Ctrl-C, timeout): the host carries on or stops on its
            # own terms; nobody is left to tell.
            self.close()

    def progress(self, step: str) -> None:
        if self._on_progress is not None:
            self._on_progress(step)
        self._send({"event": "progress", "step": step})

    def importing(self, source: str | None) -> None:
        """The Workflow source whose import begins now, or None once it ended: a launcher
        whose start outlasts its deadline names the source it is stuck in (an import that
        loops or waits), which no other step of the start can name."""
        if self._on_importing is not None:
            self._on_importing(source)
        if source is None:
            self.progress("imported")
            return
        if self._on_progress is not None:
            self._on_progress("importing")
        self._send({"event": "progress", "step": "importing", "source": source})

    def ready(self, service: ServiceView) -> None:
        if self._on_ready is not None:
            self._on_ready(service)
        self._send({"event": "ready", "service": service})
        self.close()

    def failed(self, error: ErrorView) -> None:
        if self._on_failed is not None:
            self._on_failed(error)
        self._send({"event": "error", "error": error})
        self.close()

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
