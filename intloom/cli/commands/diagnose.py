"""``intloom status``, ``doctor`` and ``recover``: read-only diagnosis and explicit cleanup.

All three go through ``intloom.diagnostics``; none of them starts a host or creates files.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import typer

from intloom.cli import exit_codes
from intloom.cli.options import CliState, command
from intloom.cli.render import (
    changed_lines,
    diagnosis_lines,
    doctor_lines,
    plain,
    recover_lines,
)

__all__ = ["doctor", "recover", "status"]

_DIAGNOSIS_KEYS = ("projectRoot", "status", "message", "owners")


def _as_mapping(value: Any) -> Mapping[str, Any]:
    data = plain(value)
    return data if isinstance(data, Mapping) else {"result": data}


@command
def status(state: CliState) -> None:
    """Say whether the host is running, offline, or what blocks it. Exits 0 when diagnosable."""
    from intloom import diagnostics
    from intloom.diagnostics.doctor import runtime_left, start_problem

    root = state.root()
    diagnosis = diagnostics.diagnose(root)
    data = _as_mapping(diagnosis)
    service = getattr(diagnosis, "service", None)
    if data.get("status") != "running" or service is None:
        refusal = start_problem(root) if data.get("status") == "offline" else None
        if refusal is None and data.get("status") in ("offline", "recovery_required"):
            refusal = runtime_left(root)  # .intloom/runtime/ moved under the last host
        doc = {**{key: data.get(key) for key in _DIAGNOSIS_KEYS}, "startProblem": refusal}
        state.renderer.result(
            doc, lambda: diagnosis_lines(data) + ([refusal] if refusal else []))
        return
    from intloom.client.drift import against_host

    # What the host loaded at its start against the project now: edited Workflows run as
    # they were until a restart, and this is where a user looks first.
    found = against_host(root, service)
    changed = plain(found[1]) if found is not None else []
    state.renderer.result({"service": service, "changedSinceStart": changed},
                          lambda: diagnosis_lines(data) + changed_lines(changed))


@command
def doctor(state: CliState) -> int:
    """Check configuration, owners, Workflows and every journal; preview each restart.

    Exit 0 healthy, 3 when something needs attention, 4 when blocked.
    """
    from intloom import diagnostics

    report = diagnostics.run_doctor(state.root())
    data = _as_mapping(report)
    state.verdict = exit_codes.for_doctor(data)
    state.renderer.result(data, lambda: doctor_lines(data))
    return state.verdict


@command
def recover(
    state: CliState,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan and its evidence; change nothing.")
    ] = False,
) -> None:
    """Remove stale service files (service.json, service.lock) once their owner is gone."""
    from intloom import diagnostics
    from intloom.diagnostics.doctor import runtime_left

    root = state.root()
    result = diagnostics.recover(root, dry_run=dry_run)
    data = _as_mapping(result)
    # "Run intloom start" alone, after a host whose .intloom/runtime/ was moved away: that
    # start begins an empty journal, the Runs left in the moved directory (added in text
    # only: the JSON keeps IntLoom's shape).
    left = runtime_left(root) if data.get("recovered") or data.get("dryRun") else None
    state.renderer.result(data, lambda: recover_lines(data) + ([left] if left else []))
