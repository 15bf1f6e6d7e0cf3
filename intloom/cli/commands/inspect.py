"""``intloom inspect RUN``: one Run's journal, phase by phase, with its verification. Offline.

It reads ``.intloom/runtime/`` through ``intloom.diagnostics.journal`` and writes nothing; it
needs no host and works the same whether one runs or not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from intloom.cli.commands.runs import RunArg
from intloom.cli.inputs import run_id_problem
from intloom.cli.options import CliState, command
from intloom.cli.render import PrintedRows, history_row, plain
from intloom.errors import IntloomError

__all__ = ["inspect"]


# inspect works offline, where intloom runs fails (CLI_SERVICE_OFFLINE): name what lists
# Run ids without a host too.
_LISTS: Final = ("intloom runs lists a running host's Runs; intloom doctor, with or without "
                 "a host, lists the unfinished ones")


def _not_found(run_id: str, where: object, missing: list[str] | None = None,
               unreadable: list[str] | None = None) -> IntloomError:
    if unreadable:
        # Its snapshot is there, damaged: the Run id is right, and "check the Run id" would
        # send the user the wrong way. doctor names the file too; inspect did not.
        return IntloomError(
            "NOT_FOUND",
            f"No readable journal for Run {run_id!r} under {where}: no record of it is in the "
            f"log, and its snapshot {'; '.join(unreadable)}. That file is its only trace, "
            "kept as it is: put back a copy of it, or of the Run's segments, from before the "
            "damage (a backup), then run intloom inspect again.",
        )
    if missing:
        # A segment a host created is gone: the Run id may well be right, and its records
        # lost with that file. "Check the Run id" alone would send the user the wrong way.
        gone = ", ".join(missing)
        return IntloomError(
            "NOT_FOUND",
            f"No journal for Run {run_id!r} under {where}, and the log is incomplete: {gone} "
            f"{'is' if len(missing) == 1 else 'are'} missing or hold none of their records "
            f"(intloom doctor names "
            f"{'it' if len(missing) == 1 else 'them'}), and a Run whose records were only "
            "there has no journal left. Put the segment back from a copy if there is one, "
            f"then run intloom inspect again; otherwise check the Run id ({_LISTS}).",
        )
    return IntloomError(
        "NOT_FOUND",
        f"No journal for Run {run_id!r} under {where}. Check the Run id ({_LISTS}).",
    )


def _went_on(entries: Iterable[Any], state: Any) -> Any:
    """The last readable record past ``state`` (a corrupt journal's fold stops at the damage):
    records that could not be checked against the state machine, but that are the Run's."""
    seq = state.seq if state is not None else 0
    last = None
    for e in entries:
        if e.seq > seq and e.checksum == "ok" and e.verdict not in ("void", "torn"):
            last = e
    return last


def _summary(run_id: str, journal: Any, restored: Any = None,
             entries: Iterable[Any] | None = None) -> dict[str, Any]:
    """``{runId, status, verdict, problem?, ...}``: the verdict on the whole journal, the Run
    as the next start reads it (``restored``, when that differs: a snapshot covers damaged
    history)."""
    summary: dict[str, Any] = {"runId": run_id}
    if journal is None:
        summary["status"] = "unknown"
        return summary
    shown = restored if restored is not None else journal
    state = getattr(shown, "state", None)
    verdict = getattr(journal, "status", None)
    summary["status"] = getattr(state, "status", None) or getattr(shown, "status", None) \
        or "unknown"
    if state is not None:
        summary["workflow"] = state.workflow
        summary["phase"] = state.phase
        if state.last_error is not None:
            summary["lastError"] = plain(state.last_error)
        went_on = (_went_on(entries or [], state) if getattr(shown, "status", None)
                   == "corrupt" else None)
        if went_on is not None:
            # The fold stopped at the damage, but the Run's records go on past it: whatever
            # it was doing there (an effect, say) ended, in the damaged bytes or after them.
            summary["wentOn"] = {"seq": went_on.seq, "phase": went_on.phase}
        elif state.effect_in_flight is not None:
            summary["effectInFlight"] = plain(state.effect_in_flight)
    if verdict is not None:
        summary["verdict"] = verdict
    if getattr(journal, "torn_tail", False):
        summary["tornTail"] = True
    problem = getattr(journal, "problem", None)
    if problem:
        summary["problem"] = problem
    restore_verdict = getattr(restored, "status", None)
    if restore_verdict is not None and restore_verdict != verdict:
        summary["restoreVerdict"] = restore_verdict
        if state is not None:
            summary["restoreSeq"] = state.seq
    return summary


def _text(run: Mapping[str, Any]) -> list[str]:
    gone = run.get("hostGone")
    if isinstance(gone, Mapping):
        # The journal's last word is not what runs shows once a host restored the Run: say
        # both, so the two commands do not seem to disagree.
        head = f"Run {run['runId']} · interrupted (journal: {run.get('status')}; host gone)"
    else:
        head = f"Run {run['runId']} · {run.get('status')}"
    if run.get("workflow"):
        head += f" · {run['workflow']}"
    if run.get("verdict"):
        head += f" · journal {run['verdict']}"
    lines = [head]
    if run.get("problem"):
        lines.append(f"Problem: {run['problem']}")
    if run.get("restoreVerdict") == "ok" and run.get("phase") == "terminal":
        lines.append(
            f"The damaged records are history: the Run's end (record {run.get('restoreSeq')})"
            " is in its snapshot, and a start does not load an ended Run. The records shown "
            "are kept byte-identical."
        )
    elif run.get("restoreVerdict") == "ok":
        lines.append(
            "A start does not read the damaged records: it restores the Run from its snapshot "
            f"and the log after it (up to record {run.get('restoreSeq')}). The records shown "
            "are kept byte-identical."
        )
    went_on = run.get("wentOn")
    if isinstance(went_on, Mapping):
        lines.append(
            f"Readable records follow the damage (the last: record {went_on.get('seq')}, "
            f"{went_on.get('phase')}): the Run went on past it, so nothing is known to have "
            "been in flight there."
        )
    effect = run.get("effectInFlight")
    if isinstance(effect, Mapping):
        lines.append(
            f"In flight: effect {effect.get('name')} (key {effect.get('key')}), started "
            f"{effect.get('startedAt')}; it was not replayed."
        )
    restart = run.get("restart")
    if isinstance(restart, Mapping):
        lines.append(f"On restart: {restart.get('row')}: {restart.get('reason')}.")
    if isinstance(gone, Mapping):
        running = gone.get("runningHost")
        if isinstance(running, Mapping):
            after = (f"the host running now (pid {running.get('pid')}) started after it and "
                     "restored the Run as failed (RUN_INTERRUPTED), as intloom runs lists it")
        else:
            after = "the next start fails the Run with RUN_INTERRUPTED"
        lines.append(f"The host that ran it (instance {gone.get('instanceId')}) is gone: "
                     f"{after}, replaying nothing; intloom cancel {run['runId']} dismisses it.")
    if run.get("tornTail"):
        lines.append("The last record is torn (an unfinished write); it is ignored, not removed.")
    return lines


def _restart(root: Path, journal: Any) -> dict[str, Any] | None:
    """What the next start does with this Run, judged as doctor judges it: against the
    Workflows loadable now (identity, Stage schemas), so a change that strands the Run shows
    here too. None for a terminal Run, or when there is no journal to judge."""
    from intloom.authoring.loader import load_workflows_offline
    from intloom.diagnostics.previews import preview_run
    from intloom.project import load_config

    if journal is None:
        return None
    try:  # inspect writes nothing, not even bytecode
        loaded = load_workflows_offline(root, load_config(root))
    except IntloomError:
        loaded = None  # the restart row is then judged without the Workflows
    preview = preview_run(journal, loaded)
    return None if preview is None else plain(preview)


def _host_gone(root: Path, writer: str | None) -> dict[str, Any] | None:
    """``{instanceId, runningHost?: {pid, instanceId}}`` when the host instance that wrote
    the Run's last record is provably not running (no owner of that instance is alive or
    unknown, judged as status judges owners, without asking a host); None when it may be,
    or when that cannot be told. Such a Run is no host's: the next start, or the host
    running now, has it as the restart table says."""
    from intloom.diagnostics.owners import inspect as observe_owners

    if writer is None:
        return None
    try:
        seen = observe_owners(root, probe=False)
    except IntloomError:
        return None  # unreadable metadata: no claim about any host
    recorded = {"service_info": seen.snapshot.service.value,
                "service_lock": seen.snapshot.lock.value}
    running = None
    for owner in seen.diagnosis.owners:
        meta = recorded.get(owner.resource)
        if owner.status == "absent" or meta is None:
            continue
        if meta.instance_id == writer:
            return None  # its own host may still run it
        running = {"pid": owner.pid, "instanceId": meta.instance_id}
    gone: dict[str, Any] = {"instanceId": writer}
    if running is not None:
        gone["runningHost"] = running
    return gone


@command
def inspect(state: CliState, run_id: RunArg) -> None:
    """Show a Run's journal, phase by phase, with verification results. Works offline."""
    from intloom.diagnostics.journal import read_run, unreadable_snapshots, written_by
    from intloom.diagnostics.previews import check_journals_dir, journals_present
    from intloom.project import ProjectPaths

    paths = ProjectPaths(state.root())
    bad = run_id_problem(run_id)
    if bad is not None:
        raise bad
    check_journals_dir(paths)  # never read journals through a link
    runtime = paths.runtime
    if not journals_present(paths):  # a .intloom/ that may not be searched: STORAGE_ERROR
        raise _not_found(run_id, runtime)
    read = read_run(runtime, run_id)
    entries, journal, found, restored = read.entries, read.journal, read.files, read.restored
    if not entries:  # an empty list: a History is never empty (read_run)
        raise _not_found(run_id, runtime, read.missing, unreadable_snapshots(runtime, run_id))
    run = _summary(run_id, journal, restored, entries)
    # Judged on what a start reads, as doctor judges it; an ended Run is not loaded.
    restart = _restart(state.root(), restored if restored is not None else journal)
    if restart is not None:
        run["restart"] = restart["verdict"]
        if restart["journal"] == "incompatible" and run.get("verdict") == "ok":
            run["verdict"] = "incompatible"
            run["problem"] = restart.get("problem")
        if run["restart"].get("row") == "interrupted":
            gone = _host_gone(state.root(), written_by(runtime, entries))
            if gone is not None:
                run["hostGone"] = gone
    # The records are made one at a time as they are written (text: as the rows the table
    # aligns), never all held; the summary above judged them again only for what it says of
    # a corrupt Run or a host gone.
    records = (plain(entry) for entry in entries)
    # Whole-file findings of what was read (the Run's segments and snapshot, or the whole
    # store for a Run found unsound): doctor and start read neither snap/done/ nor the
    # segments below the manifest's start, so this is where their damage and strays are
    # told.
    files = [{"path": f.path, "kind": f.kind, "problem": f.problem} for f in found]
    renderer = state.renderer
    if renderer.json_mode:
        renderer.streamed_document({"run": run}, "records", records,
                                   {"files": files} if files else {})
        return
    rows = PrintedRows(history_row(record) for record in records)
    renderer.lines(_text(run))
    renderer.lines([f"File {f['path']} is {f['kind']}: {f['problem']}" for f in files])
    renderer.table(["SEQ", "PHASE", "TIME", "RECORD", "CHECKSUM/VERDICT", "LOCATION"], rows)
