"""The unit of a doctor report: one check with a stable id, a status, a finding and a next step."""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from intloom.host.liveness import Evidence

__all__ = ["KEEP_IT", "Check", "CheckStatus"]

CheckStatus = Literal["ok", "attention", "not_checked"]

KEEP_IT: Final = (
    "intloom keeps it exactly as it is; fix or move it by hand only once you are sure no "
    "intloom host runs for this project, then run intloom doctor again."
)


class Check(msgspec.Struct, frozen=True, omit_defaults=True):
    """One check: a stable ``id``, its status, what was found, and what to do next.

    ``next`` is always present (null when there is nothing to do); ``evidence`` only on the
    owner checks.
    """

    id: str
    status: CheckStatus
    message: str
    next: str | None
    evidence: list[Evidence] | None = None
