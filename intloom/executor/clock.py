"""Time stamps and identifiers: the only place the executor reads the clock or randomness."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime

__all__ = ["action_id", "call_id", "now", "run_id"]


def now() -> str:
    """UTC, ISO 8601 with milliseconds and a Z."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _random(n: int = 21) -> str:
    return secrets.token_urlsafe(16)[:n]


def run_id() -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")[:-3] + "Z"
    return f"RUN-{stamp}-{_random()}"


def action_id() -> str:
    return f"ASK-{_random()}"


def call_id() -> str:
    return f"CALL-{_random()}"
