"""``intloom status``, ``doctor`` and ``recover``: read-only diagnosis and explicit cleanup.

All three go through ``intloom.diagnostics``; none of them starts a host or creates files.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
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

    root = state.root()
    diagnosis = diagnostics.diagnose(root)
    data = _as_mapping(diagnosis)
    service = getattr(diagnosis, "service", None)
    if data.get("status") != "running" or service is None:
        doc = {key: data.get(key) for key in _DIAGNOSIS_KEYS}
        refusal = _start_refuses(root) if data.get("status") == "offline" else None
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


def _start_refuses(root: Path) -> str | None:
    """Why the ``intloom start`` an offline diagnosis suggests would refuse or fail on the
    project's state directories as they are (group/other bits, or private but not writable
    by us), with the fix, or on its intloom.toml (invalid: its error names the key); or,
    for a flag that only snapshot compaction runs into, what happens instead; None when
    nothing stands in its way. The diagnosis leaves modes to doctor's runtime_dir check and
    the configuration to its config check, but "Run intloom start" alone sent people
    straight into those refusals."""
    from intloom.diagnostics.doctor import refused_state_dir, unwritable_state_dirs
    from intloom.errors import IntloomError
    from intloom.fsutil import privacy_fix
    from intloom.project import ProjectPaths, load_config

    paths = ProjectPaths(root)
    exc = refused_state_dir(paths)  # the directories doctor's runtime_dir checks
    if exc is not None:
        return (f"But intloom start refuses the project as it is: {exc.path} {exc.fact}. "
                f"{privacy_fix(exc)}.")
    found = unwritable_state_dirs(paths)
    failing = [dir_ for dir_ in found if not dir_.compaction_only]
    if failing:
        return (f"But intloom start fails on the project as it is: {failing[0].fact} "
                f"{failing[0].fix}.")
    # A start reads intloom.toml next, and refuses one it cannot use (INVALID_REQUEST).
    try:
        load_config(root)
    except IntloomError as invalid:
        return f"But intloom start refuses the project as it is: {invalid.message}"
    if found:
        # The host starts and runs; saying it would fail sent people to fix the wrong thing.
        fix = found[0].fix
        return (f"intloom start works and the Runs go on, but {found[0].refused}: snapshot "
                "compaction fails when it writes there (a warning in the host log each "
                "time), and the log a start reads grows until the flag is cleared. "
                f"{fix[:1].upper()}{fix[1:]}.")
    return None


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

    result = diagnostics.recover(state.root(), dry_run=dry_run)
    data = _as_mapping(result)
    state.renderer.result(data, lambda: recover_lines(data))
