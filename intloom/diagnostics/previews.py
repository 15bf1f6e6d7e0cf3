"""The ``journals`` check and the restart preview: what a start would do with every Run.

Each journal is judged as the host would judge it -- verified, corrupt, or incompatible with
the loaded Workflow (identity or Stage schema) -- and every unfinished, verified Run gets the
row of the restart table (DESIGN section 6) that will apply, with the reason. Reading only.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Final, Literal

import msgspec

from intloom import __version__
from intloom.authoring.compat import (
    cursor_problem,
    failed_sources_note,
    not_defined_note,
    schema_problem,
    state_problem,
    what_changed,
)
from intloom.diagnostics.checks import Check, CheckStatus
from intloom.errors import IntloomError
from intloom.project import ProjectPaths
from intloom.runtime.machine import RunState, restart_verdict, unreadable
from intloom.runtime.model import EffectRef

if TYPE_CHECKING:
    from intloom.authoring.loader import LoadResult
    from intloom.store.reader import RunJournal

__all__ = ["PreviewVerdict", "RunPreview", "preview_run", "preview_runs"]

JournalStatus = Literal["verified", "corrupt", "incompatible"]


class PreviewVerdict(msgspec.Struct, frozen=True, omit_defaults=True):
    """A restart-table row (or ``needs_attention`` / ``unknown``) and why."""

    row: str
    reason: str
    effect: EffectRef | None = None


class RunPreview(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    run_id: str
    journal: JournalStatus
    verdict: PreviewVerdict
    workflow: str | None = None
    phase: str | None = None
    status: str | None = None
    problem: str | None = None
    torn_tail: bool = False
    # The Agent task the Run waits on: the last host's log names the Tool calls it made.
    agent_task: str | None = None


def _back(state: RunState) -> str:
    """The two ways on for a Run held for its changed code: ``doctor`` and ``inspect`` gave
    only the first, and ``inspect RUN`` is where a user reading one Run looks for both. A Run
    the restart table interrupts whatever its code (one waiting on an Agent task, whose claim
    is never restored) does not resume with its code put back: said so, it was told to."""
    verdict = restart_verdict(state, has_recover=False)
    with_recover = restart_verdict(state, True)
    if verdict.row == "interrupted" and with_recover.row == "interrupted":
        return (f"(with the code the Run started with put back, the next start would report "
                f"it RUN_INTERRUPTED, not resume it: {verdict.reason}; end it with intloom "
                f"cancel {state.run_id})")
    if verdict.row != with_recover.row:
        # A wait, or an accepted answer: whether it goes on depends on a recover entry of
        # the code it started with, which the journal does not record. "Restore it to
        # resume it" was untrue of one without.
        cursor = state.cursor
        goes_on = ("resumes its wait" if state.phase == "waiting" else
                   "continues it in recover with the accepted answer")
        return (f"(with the code the Run started with put back, the next start {goes_on} "
                f"only if Step {cursor.stage}/{cursor.step} there has a recover entry; "
                f"without one it reports the Run RUN_INTERRUPTED; or end it with intloom "
                f"cancel {state.run_id})")
    return (f"(restore the code the Run started with to resume it, or end it with intloom "
            f"cancel {state.run_id})")


def _incompatibility(state: RunState, loaded: LoadResult) -> str | None:
    wf = loaded.workflows.get(state.workflow)
    withheld = loaded.withheld.get(state.workflow)
    if wf is None and withheld is not None:  # two sources define it (LoadResult.withheld)
        return (f"{withheld}: the Run cannot be restored (keep only the source the Run "
                f"started with in intloom.toml, or end it with intloom cancel {state.run_id})")
    if wf is None:
        note = failed_sources_note(loaded.failed)
        if note:
            # Its source may be gone on purpose: cancel is the way out then, as for the rest.
            return (f"Workflow {state.workflow!r} is not loaded, so the Run cannot be "
                    f"restored{note}; or end it with intloom cancel {state.run_id}")
        return (f"Workflow {state.workflow!r} is not loaded, so the Run cannot be restored"
                f"{not_defined_note(loaded.workflows)} (put back the source that defined it, "
                "under the name it had, and its entry in intloom.toml, to resume it, or end "
                f"it with intloom cancel {state.run_id})")
    if wf.identity != state.identity:
        return (f"Workflow {state.workflow!r} changed: the journal was written by identity "
                f"{state.identity[:12]}…, the loaded code is {wf.identity[:12]}…"
                f"{what_changed(wf, state)} {_back(state)}")
    changed = schema_problem(wf, state)
    if changed is not None:
        return f"{changed} {_back(state)}"
    moved = cursor_problem(wf, state)
    if moved is not None:
        return f"{moved} {_back(state)}"
    saved = state_problem(wf, state)
    if saved is not None:  # judged as the host's restore judges it
        return f"{saved} {_back(state)}"
    return None


def _verdict(state: RunState, loaded: LoadResult | None) -> PreviewVerdict:
    if loaded is not None:
        wf = loaded.workflows[state.workflow]
        v = restart_verdict(state, wf.has_recover(state.cursor.stage, state.cursor.step))
        return PreviewVerdict(v.row, v.reason, v.effect)
    with_recover = restart_verdict(state, True)
    without = restart_verdict(state, False)
    if with_recover.row == without.row:
        return PreviewVerdict(without.row, without.reason, without.effect)
    return PreviewVerdict(
        "unknown", "the row depends on whether the Step has a recover entry, and the "
        "Workflows could not be loaded to tell",
    )


def _make(
    journal: RunJournal, kind: JournalStatus, verdict: PreviewVerdict, problem: str | None
) -> RunPreview:
    state = journal.state
    return RunPreview(
        run_id=journal.run_id,
        journal=kind,
        verdict=verdict,
        workflow=state.workflow if state else None,
        phase=state.phase if state else None,
        status=state.status if state else None,
        problem=problem,
        torn_tail=journal.torn_tail,
        agent_task=(state.pending_agent_call.id
                    if state is not None and state.pending_agent_call is not None else None),
    )


def _preview(journal: RunJournal, loaded: LoadResult | None) -> RunPreview | None:
    state = journal.state
    if journal.status != "ok" or state is None:
        kind: JournalStatus = "incompatible" if journal.status == "incompatible" else "corrupt"
        return _make(
            journal, kind,
            PreviewVerdict(
                "needs_attention",
                f"the journal is {kind}; it is kept byte-identical and not restored",
            ),
            journal.problem or f"the journal is {kind}",
        )
    if state.phase == "terminal":
        return None
    # As the host's restore judges it: first whether this intloom may read the journal at
    # all (one a newer intloom wrote is held, "upgrade intloom"), then the Workflow.
    other_intloom = unreadable(state, __version__, journal.written_by)
    problem = other_intloom or (
        _incompatibility(state, loaded) if loaded is not None else None)
    if problem is not None:
        return _make(journal, "incompatible",
                     _held(state, _HELD_VERSION if other_intloom else _HELD), problem)
    return _make(journal, "verified", _verdict(state, loaded), None)


_HELD: Final = ("the journal is incompatible with the loaded Workflow; it is kept "
                "byte-identical and not restored")
# A journal another intloom wrote is held whatever the Workflow: "incompatible with the
# loaded Workflow" sent a user looking for an edit to undo after an upgrade or downgrade.
_HELD_VERSION: Final = ("the journal was written by an intloom this one does not continue; "
                        "it is kept byte-identical and not restored")


def _held(state: RunState, held: str) -> PreviewVerdict:
    """A held Run's verdict. One whose code was running an effect names it, as an interrupted
    one does: a Run held for a changed Workflow is often ended with ``cancel``, and no
    restart ever says what was in flight before that."""
    if state.effect_in_flight is None:
        return PreviewVerdict("needs_attention", held)
    said = restart_verdict(state, has_recover=False)
    return PreviewVerdict("needs_attention", f"{held}; {said.reason}", said.effect)


def preview_run(journal: RunJournal, loaded: LoadResult | None) -> RunPreview | None:
    """One Run's preview, judged as ``preview_runs`` judges it; None for a terminal Run."""
    return _preview(journal, loaded)


def check_journals_dir(paths: ProjectPaths) -> None:
    """CLI_SERVICE_METADATA_INVALID when ``.intloom`` is a link or no directory: journals
    are never read through a link (start and status refuse it too)."""
    from intloom.host.observe import check_state_dir

    check_state_dir(paths.state)


def journals_present(paths: ProjectPaths) -> bool:
    """Whether ``.intloom/runtime`` exists; STORAGE_ERROR naming the directory that refuses a
    search when that cannot be told (``Path.exists`` let a PermissionError out)."""
    from intloom.store.files import present

    return present(paths.runtime)


def preview_runs(
    paths: ProjectPaths, loaded: LoadResult | None, *, host_running: bool,
    interrupted_by_host: frozenset[str] = frozenset(), host_list_cut: bool = False,
) -> tuple[Check, list[RunPreview]]:
    """The ``journals`` check and one preview per unfinished or unrestorable Run.

    The journals are read the way a restore reads them, so the preview is what ``start``
    would do; terminal Runs are not part of a restore and are not listed.
    ``interrupted_by_host``: with a host running, the Runs its start restored as
    interrupted (its restore summary). Only those need a person now: a live Run whose
    journal a restart would interrupt (a wait without recover, a Step running) is fine.
    ``host_list_cut``: that summary names only the first of them, so any may be one.
    """
    from intloom.store.files import present
    from intloom.store.reader import load

    try:
        check_journals_dir(paths)
    except IntloomError as exc:
        return Check("journals", "attention", f"The journals were not read: {exc.message}",
                     "Fix .intloom first; its files are kept as they are."), []
    try:
        if not present(paths.runtime):
            return Check("journals", "ok", "No Run journals yet.", None), []
        store = load(paths.runtime, "restore")
    except IntloomError as exc:
        return Check("journals", "attention", exc.message,
                     "Fix the runtime directory; its files are kept as they are."), []
    journals = list(store.journals.values())
    previews = [p for p in (_preview(j, loaded) for j in journals) if p is not None]
    by_journal = Counter(p.journal for p in previews)
    rows = Counter(p.verdict.row for p in previews if p.journal == "verified")
    torn = sum(1 for p in previews if p.torn_tail)
    parts = [f"{len(previews):,} unfinished Run(s): {by_journal['verified']:,} verified, "
             f"{by_journal['corrupt']:,} corrupt, {by_journal['incompatible']:,} incompatible"]
    if rows:
        parts.append("on restart: " + ", ".join(f"{n:,} {row}" for row, n in sorted(rows.items())))
    if torn:
        parts.append(f"{torn:,} with a torn last record (an unfinished write, ignored)")
    if loaded is None:
        parts.append("identity and schemas not compared: the Workflows did not load")
    parts.extend(f"{f.path} is {f.kind}: {f.problem}" for f in store.files)
    message = "; ".join(parts) + "."
    nexts: list[str] = []
    # The host's store keeps a damaged manifest or snapshot as it is and reads the whole log
    # instead, at every start, until the file is moved out.
    # A damaged done/ snapshot is kept the same way; its Run's records stay read instead.
    damaged = [store.manifest_error, *store.snapshot_errors]
    for err in damaged:
        if err is not None:
            instead = ("reads the ended Run's records from the log" if err.path.parent.name
                       == "done" else "reads the whole log")
            nexts.append(f"intloom start keeps {err.path} as it is and {instead} "
                         "instead, at every start; move the file out of the runtime directory "
                         "to let intloom write it again.")
    # snap/live itself: snapshots gone with every record of their Runs (nothing rebuilds
    # those); one file: a snapshot whose Run the log still holds.
    gone = [f for f in store.files if f.kind == "missing" and f.path == "snap/live"]
    if gone:
        nexts.append("snap/live/ lost snapshots whose Runs nothing else names (their segments "
                     "are damaged or missing): those Runs are neither restored nor held; "
                     "copy back only the files missing from snap/live/ (cp -n from a copy "
                     "made before the damage), or those segments.")
    missing = [f for f in store.files if f.kind == "missing" and f.path.startswith("snap/")
               and f.path != "snap/live"]
    if missing:
        nexts.append(f"{len(missing)} snapshot file(s) are missing from snap/live/: the next "
                     "start reads those Runs from the log and writes their snapshots again "
                     "(find out what removed them: intloom never does).")
    lost = [f for f in store.files if f.kind == "missing" and f.path.startswith("wal/")]
    if lost:
        nexts.append(f"{len(lost)} segment(s) are missing from wal/ or hold none of their "
                     "records "
                     f"({', '.join(f.path for f in lost)}): the Runs whose records they may "
                     "hold are held, never resumed from an earlier point; put each file back "
                     "from a copy (a backup) and start again, and find out what removed or "
                     "emptied it "
                     "(intloom never does). Without a copy, a Run's loss is accepted by "
                     "moving its snapshot out of snap/live/ once a start has held it "
                     "(docs/recovery.md; moved out before, that start holds it again and "
                     "writes the file anew): the next start resumes it from its last "
                     "readable record.")
    if by_journal["incompatible"]:
        nexts.append("Inspect each incompatible Run with intloom inspect RUN: put back the "
                     "Workflow source it started with and restart to continue it, or end it "
                     "with intloom cancel RUN; a journal another intloom version wrote is "
                     "continued or ended by that version.")
    if by_journal["corrupt"]:
        nexts.append("Inspect each corrupt Run with intloom inspect RUN (what was found, in "
                     "which file) and check the effects it names by hand: intloom never writes "
                     "to a damaged journal, so such a Run cannot be cancelled and stays held at "
                     "every start, until a copy of the damaged file from before the damage (a "
                     "backup) is put back.")
    unexpected = [f for f in store.files if f.kind == "unexpected"]
    if unexpected:
        nexts.append(f"{len(unexpected)} file(s) intloom did not write are in the runtime "
                     "directory: find out what put them there, then move them out of it "
                     "(intloom never reads, moves or removes them).")
    kept = {f.kind for f in store.files} - {"missing", "unexpected"}
    if kept:
        # A newer intloom's file is no damage: "Damaged files" sent the user looking for one.
        what = ("Files of another format (another intloom's)" if kept == {"incompatible"}
                else "Damaged files and files of another format" if "incompatible" in kept
                else "Damaged files")
        nexts.append(f"{what} are kept byte-identical: never restored, rewritten or removed.")
    # An interrupted Run needs a person until it is dismissed (its journal then ends), whether
    # or not a host has restored it meanwhile as failed/RUN_INTERRUPTED.
    interrupted = sum(
        1 for p in previews
        if p.journal == "verified" and p.verdict.row == "interrupted"
        and (not host_running or host_list_cut or p.run_id in interrupted_by_host)
    )
    if interrupted:
        nexts.append(("Check" if host_running else "After intloom start, check")
                     + " each interrupted Run's committed effects (intloom inspect RUN), "
                     "then dismiss it with intloom cancel RUN.")
    status: CheckStatus = "attention" if nexts else "ok"
    return Check("journals", status, message, " ".join(nexts) or None), previews
