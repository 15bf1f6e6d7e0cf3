"""Time stamps and identifiers: the only place the executor reads the clock or randomness."""

from __future__ import annotations

import secrets
import time

__all__ = ["action_id", "call_id", "now", "run_id"]

# (whole millisecond since the epoch, its text). Every record carries a stamp, twice per
# Step, and a busy host writes dozens per millisecond: formatting one costs ~0.8 us
# (datetime.isoformat ~2.5 us), looking it up ~0.15 us. A tuple is replaced in one store,
# so threads never see half of it.
_milli: tuple[int, str] = (-1, "")
# (whole second, its "YYYY-MM-DDTHH:MM:SS" text), for a millisecond not cached above: a
# lone Run's stamps lie an fdatasync apart, so most of them miss that cache, and gmtime +
# strftime were ~7k of a sync Step's ~170k instructions per miss (callgrind).
_second: tuple[int, str] = (-1, "")
# ".000Z" .. ".999Z": formatting the milliseconds with ":03d" was another ~2.5k per Step.
_MILLIS: tuple[str, ...] = tuple(f".{milli:03d}Z" for milli in range(1000))


def now() -> str:
    """UTC, ISO 8601 with milliseconds (truncated, as ``isoformat`` does) and a Z."""
    global _milli, _second
    ms = time.time_ns() // 1_000_000
    cached = _milli
    if cached[0] == ms:
        return cached[1]
    sec, milli = divmod(ms, 1000)
    head = _second
    if head[0] != sec:
        head = _second = (sec, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)))
    text = head[1] + _MILLIS[milli]
    _milli = (ms, text)
    return text


def _random(n: int = 21) -> str:
    return secrets.token_urlsafe(16)[:n]


def run_id(at: str | None = None) -> str:
    """``RUN-<stamp>-<random>``, its stamp ``at`` (a ``now()``; the clock's now without):
    read apart, the id's stamp could be a millisecond after the Run's createdAt."""
    stamp = (at or now()).replace("-", "").replace(":", "").replace(".", "")
    return f"RUN-{stamp}-{_random()}"


def action_id() -> str:
    return f"ASK-{_random()}"


def call_id() -> str:
    return f"CALL-{_random()}"
