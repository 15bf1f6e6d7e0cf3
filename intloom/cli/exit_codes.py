"""Exit codes: named constants and the one place that maps an outcome to a number.

Scripts branch on these numbers, so they never change meaning; docs/cli.md lists them.
Every known error exits FAILURE, as the TypeScript IntLoom does, so ``$? -ne 0`` checks
written for it keep working; the distinct codes below only split what it lumps together.
``CLI_INTERNAL_ERROR`` exits INTERNAL (70) wherever it was raised, as docs/cli.md says.
"""

from __future__ import annotations

from collections.abc import Mapping

# Imported by intloom/cli/entry.py before its Ctrl-C guard: typing is not (see there).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Final

__all__ = [
    "DOCTOR_ATTENTION",
    "DOCTOR_BLOCKED",
    "FAILURE",
    "INTERNAL",
    "INTERRUPTED",
    "OK",
    "RUN_FAILED",
    "RUN_SUSPENDED",
    "TERMINATED",
    "USAGE",
    "for_doctor",
    "for_exception",
    "for_run_status",
]

OK: Final = 0
# A known IntloomError: the message says what to do.
FAILURE: Final = 1
# The Run the command created, attached to or answered ended failed (or stopped).
RUN_FAILED: Final = 1
# The command line could not be parsed (click's convention, kept for muscle memory).
USAGE: Final = 2
# doctor: nothing is broken, but something needs a person (recover, an interrupted Run).
DOCTOR_ATTENTION: Final = 3
# doctor: an owner is alive or unknown, or metadata is invalid; nothing can be cleaned up.
DOCTOR_BLOCKED: Final = 4
# A bug in intloom rather than a fact about the project (sysexits EX_SOFTWARE), including a
# CLI_INTERNAL_ERROR that a host reported.
INTERNAL: Final = 70
# The Run the command followed was suspended by its host (intloom stop, a log it could not
# write), not ended: its view reads failed/RUN_INTERRUPTED, but the next start continues it or
# reports it, by the restart table (sysexits EX_TEMPFAIL: start the host, then look again).
# Non-zero, as IntLoom's 1 for it, so ``$? -ne 0`` checks still stop there.
RUN_SUSPENDED: Final = 75
# Ctrl-C outside attach (128 + SIGINT, as shells report it).
INTERRUPTED: Final = 130
# SIGTERM to a command that waits on a Run (128 + SIGTERM): its wait ends, as for Ctrl-C.
TERMINATED: Final = 143

_DIAGNOSIS_BLOCKED = frozenset({"blocked"})
_DIAGNOSIS_ATTENTION = frozenset({"recovery_required"})


def for_exception(exc: BaseException) -> int:
    """The exit code of a command that ended with ``exc``."""
    # Imported here so that importing this module stays free for the renderer's tests.
    from intloom.errors import IntloomError

    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED
    if isinstance(exc, IntloomError):
        # CLI_INTERNAL_ERROR is a bug whichever side found it (this process, or a host that
        # reported it over the socket or the readiness pipe): scripts see 70 for it, always.
        if getattr(exc, "usage", False):  # options that contradict each other
            return USAGE
        return INTERNAL if exc.code == "CLI_INTERNAL_ERROR" else FAILURE
    return INTERNAL


def for_run_status(status: str, *, suspended: bool = False) -> int:
    """flow / attach / answer mirror the Run: only a failed (or stopped) Run is non-zero, and
    one its host ``suspended`` (failed/RUN_INTERRUPTED in its view, not over) is not failed."""
    if status != "failed":
        return OK
    return RUN_SUSPENDED if suspended else RUN_FAILED


def for_doctor(report: Mapping[str, Any]) -> int:
    """0 healthy, DOCTOR_ATTENTION, or DOCTOR_BLOCKED, from a doctor report as plain data.

    An explicit ``health`` (healthy | attention | blocked) wins. Otherwise the diagnosis
    status decides blocked / attention, and any check with status ``attention`` makes a
    healthy diagnosis need attention. ``not_checked`` is not a problem by itself.
    """
    health = report.get("health")
    if health == "blocked":
        return DOCTOR_BLOCKED
    if health == "attention":
        return DOCTOR_ATTENTION
    if health == "healthy":
        return OK
    status = report.get("status")
    if status in _DIAGNOSIS_BLOCKED:
        return DOCTOR_BLOCKED
    if status in _DIAGNOSIS_ATTENTION:
        return DOCTOR_ATTENTION
    checks = report.get("checks") or []
    if any(isinstance(c, Mapping) and c.get("status") == "attention" for c in checks):
        return DOCTOR_ATTENTION
    return OK
