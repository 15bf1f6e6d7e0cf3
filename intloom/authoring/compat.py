"""Whether a loaded Workflow can take a Run on from where its journal left it.

Identity and Stage schemas are compared first, by each caller in its own words (the host's
restore, ``doctor`` and ``inspect``). What this module adds is shared, so that the three
judge a Run alike: the identity covers the Workflow's source tree only, and code imported
from elsewhere (a builder in another project directory, an installed package) can change
the Stages and Steps without changing it. A Run whose cursor names a Stage or Step the
loaded Workflow does not have is held like any incompatible Run -- never driven from a
place that is not there (the host failed it with an internal error) nor judged by a Step
it cannot find ("has no recover entry").
"""

from __future__ import annotations

import copy as copy_module
import dataclasses
import posixpath
from typing import TYPE_CHECKING, Any, Final

import msgspec

from intloom.errors import LoadInterrupted, as_call, clip, message_of

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from intloom.authoring.loader import LoadedWorkflow
    from intloom.runtime.machine import RunState

__all__ = ["DETERMINISTIC", "cursor_problem", "deterministic_json", "failed_sources_note",
           "not_defined_note", "schema_changes", "schema_problem", "state_problem",
           "version_change", "what_changed"]

# The order the driver saves a State in when plain encoding is not deterministic (a State
# with sets: executor/driver.py, _encode_state); the restore judges it by the same encoder.
DETERMINISTIC: Final = msgspec.json.Encoder(order="deterministic")


def deterministic_json(value: Any) -> bytes:
    """``value`` (a State as its type decodes it) as JSON with its sets in a fixed order.

    DETERMINISTIC sorts sets and dict keys, but only what Python can order and only str keys:
    a State with a set and a ``dict[int, str]``, or a set of Enums, of frozen Structs, of
    ints and None or of Decimals with a NaN, raised TypeError (InvalidOperation) and its Run
    failed CLI_INTERNAL_ERROR. Such a State has each set sorted by its items' JSON instead,
    which always orders (its dicts keep the order they decode in); any other keeps the bytes
    DETERMINISTIC gave it (saved journals)."""
    try:
        return DETERMINISTIC.encode(value)
    except (TypeError, ArithmeticError):  # ArithmeticError: a Decimal NaN is not ordered
        return msgspec.json.encode(_sets_sorted(value))


def _sets_sorted(value: Any) -> Any:
    """``value`` with every set in it a list of its items, sorted by their JSON; a Struct or a
    container is copied only when something in it changed (a Struct without running its
    ``__post_init__``, which may not expect a list in a set field)."""
    if isinstance(value, (set, frozenset)):
        return sorted((_sets_sorted(item) for item in value), key=msgspec.json.encode)
    if isinstance(value, msgspec.Struct):
        copy: Any = None
        for field in msgspec.structs.fields(value):
            item = getattr(value, field.name)
            fixed = _sets_sorted(item)
            if fixed is not item:
                if copy is None:
                    copy = copy_module.copy(value)
                msgspec.structs.force_setattr(copy, field.name, fixed)
        return value if copy is None else copy
    if isinstance(value, dict):
        pairs = {key: _sets_sorted(item) for key, item in value.items()}
        return value if all(pairs[key] is item for key, item in value.items()) else pairs
    if isinstance(value, (list, tuple)):
        items = [_sets_sorted(item) for item in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _sets_sorted(getattr(value, f.name)) for f in dataclasses.fields(value)}
        same = all(fields[f.name] is getattr(value, f.name) for f in dataclasses.fields(value))
        return value if same else fields
    return value


# Why a Run is held for a definition that changed outside the tree, and where to look.
_OUTSIDE = ("its definition changed outside the Workflow's source tree, which the identity "
            "does not cover (docs/authoring.md, Changing a Workflow)")


def _missing_place(lw: LoadedWorkflow, state: RunState) -> str | None:
    """``Stage 's'`` or ``Step s/x``: where the Run is, when the loaded Workflow lacks it."""
    if state.phase in ("header", "terminal"):
        return None
    cursor = state.cursor
    stage = lw.workflow.stages.get(cursor.stage)
    if stage is None:
        return f"Stage {cursor.stage!r}"
    if cursor.step is not None and cursor.step not in stage.steps:
        return f"Step {cursor.stage}/{cursor.step}"
    return None


def schema_changes(lw: LoadedWorkflow, state: RunState) -> list[str]:
    """Each Stage the Run started with that the loaded Workflow no longer declares, or
    whose State schema it changed, in words. A Stage gone was called "State schema
    changed", which sent the user looking for an edit of a State class they never made."""
    out: list[str] = []
    for stage, fingerprint in sorted(state.schemas.items()):
        now = lw.schemas.get(stage)
        if now is None:
            out.append(f"Stage {stage!r} is no longer declared")
        elif now != fingerprint:
            out.append(f"the State schema of Stage {stage!r} changed")
    return out


def what_changed(lw: LoadedWorkflow, state: RunState) -> str:
    """``; version 'a' when the Run started, 'b' now; the State schema of Stage 's'
    changed; ...``: what the journal can tell of an edit that changed the identity (the
    version, the Stages' State schemas, the place the Run is at), else ``""``. Two hashes
    alone told the user neither whether their edit reached the Run's State nor its Step."""
    facts = schema_changes(lw, state)
    place = _missing_place(lw, state)
    if place is not None and not any(fact.startswith(place) for fact in facts):
        facts.append(f"{place}, where the Run is, is no longer declared")
    unrouted = _unrouted(lw, state)
    if unrouted is not None:
        facts.append(f"no route now for {unrouted}")
    version = version_change(lw, state)
    if not facts and not version:
        # Nothing the journal records changed: two hashes alone left the user of a Workflow
        # they never touched (one sharing its directory with the one edited) at a loss.
        tree = (posixpath.dirname(lw.source) or ".") if lw.source.endswith((".py", ".pyi")) \
            else lw.source.rstrip("/")
        facts.append(f"its version, its Stages' State schemas and the Step the Run is at are "
                     f"as they were, so what changed is a file of its source tree, {tree}/ (a "
                     "Step's code, a helper, another Workflow's file there, a comment: every "
                     "byte counts; docs/authoring.md, Changing a Workflow)"
                     f"{_written_since(lw, tree, state.created_at)}")
    return version + "".join(f"; {fact}" for fact in facts)


def _written_since(lw: LoadedWorkflow, tree: str, created_at: str) -> str:
    """``; written since the Run began: a.py~``: the files of the tree whose times are later
    than the Run's creation, likely the edit (a hint from file times: the journal keeps one
    hash of the whole tree, so which file differs cannot be read from it; a file that is
    hard to see, an editor's backup say, held Runs with nothing to look for). "" when none
    is, or that cannot be told."""
    from datetime import datetime

    from intloom.authoring.identity import named_files

    if not lw.entry:
        return ""
    try:
        since = datetime.fromisoformat(created_at).timestamp()
    except ValueError:
        return ""
    times = _tree_times(lw.entry)
    if times is None:
        return ""
    prefix = "" if tree in ("", ".") else f"{tree}/"
    names = [f"{prefix}{rel}" for rel, written in times if written > since]
    if not names:
        # Its identity is its host's load's, older than the Run: an edit between the two
        # left no file newer than the Run, and "written since" would have named none.
        return ("; no file of it was written since the Run began, by file times: the edit "
                "is older (made after the Run's host had loaded the code), or removed a file")
    return (f"; from file times, written since the Run began: {named_files(names)} (a "
            "file removed since leaves no time)")


# Each entry's files with the later of their modification and inode change times (a file
# renamed into the tree, as an editor's backup is, keeps its modification time), kept for
# _TIMES_FOR_S: a restore or a doctor of 1,000 Runs held for one edit walked the tree once
# per Run.
_TIMES: dict[str, tuple[float, list[tuple[str, float]] | None]] = {}
_TIMES_FOR_S: Final = 2.0


def _tree_times(entry: str) -> list[tuple[str, float]] | None:
    import time
    from pathlib import Path

    from intloom.authoring.identity import source_stats
    from intloom.errors import IntloomError

    now = time.monotonic()
    kept = _TIMES.get(entry)
    if kept is not None and now - kept[0] < _TIMES_FOR_S:
        return kept[1]
    times: list[tuple[str, float]] | None
    try:
        times = [(rel, max(st.st_mtime, st.st_ctime))
                 for rel, _path, st in source_stats(Path(entry))]
    except (OSError, IntloomError):
        times = None
    _TIMES[entry] = (now, times)
    return times


def cursor_problem(lw: LoadedWorkflow, state: RunState) -> str | None:
    """Why the loaded Workflow has no place for the Run's cursor, or None.

    A Run that has only its header has no cursor yet (it enters the entry Stage); an ended
    Run is never continued.
    """
    place = _missing_place(lw, state)
    if place is not None:
        return (f"Workflow {lw.name!r} as loaded has no {place}, where the Run is: "
                f"{_OUTSIDE}")
    unrouted = _unrouted(lw, state)
    if unrouted is not None:
        return (f"Workflow {lw.name!r} as loaded has no route for {unrouted}: its routes "
                "changed outside the Workflow's source tree, which the identity does not "
                "cover, or it never routed that outcome and the host stopped before that "
                "failure was recorded (docs/authoring.md, Changing a Workflow)")
    return None


def _unrouted(lw: LoadedWorkflow, state: RunState) -> str | None:
    """``outcome 'x', which Step s/y returned before the restart (its routes now: [...])``
    when the Run's journal ends at that Step's result and the loaded Step does not route it:
    routing it is the restart's next act, and without a route the Run failed
    STEP_OUTCOME_NOT_HANDLED for good, which putting the code back could not undo."""
    cursor = state.cursor
    if state.phase != "step_result" or cursor.step is None:
        return None
    stage = lw.workflow.stages.get(cursor.stage)
    step = stage.steps.get(cursor.step) if stage is not None else None
    if step is None or state.outcome in step.routes:
        return None
    return (f"outcome {state.outcome!r}, which Step {cursor.stage}/{cursor.step} returned "
            f"before the restart (its routes now: {sorted(step.routes)})")


def schema_problem(lw: LoadedWorkflow, state: RunState) -> str | None:
    """``schema_changes`` in words, for a Run whose identity is the loaded one: the change
    then came from outside the source tree (a State class in a module of the project
    root), and "put back the exact Workflow source" alone sent the user to a tree no one
    had touched."""
    changes = schema_changes(lw, state)
    if not changes:
        return None
    return (f"since the Run started, {'; '.join(changes)}: the Workflow's source tree is as "
            "it was, so this changed outside it, which the identity does not cover (a State "
            "class or Stage imported from another module, another msgspec version, which "
            "describes State types, or a field's default computed at import, such as "
            "datetime.now() or uuid4(), which is new in every process: give that field "
            "msgspec.field(default_factory=...); docs/authoring.md, Changing a Workflow)")


def state_problem(lw: LoadedWorkflow, state: RunState) -> str | None:
    """Why the Stage State saved in the journal does not decode, as it was saved, with the
    loaded State type (DESIGN section 6), or None. Its fingerprint (the JSON Schema) may be
    unchanged while the class is not: a ``__post_init__`` check, say, from outside the tree."""
    if state.stage_state is None:
        return None
    stage = lw.workflow.stages.get(state.cursor.stage)
    st_type = stage.state_type if stage is not None else None
    if st_type is None:
        return None
    try:
        decoded = msgspec.json.decode(state.stage_state, type=st_type)
    except msgspec.MsgspecError as exc:
        return f"the State saved in Stage {state.cursor.stage!r} no longer decodes ({exc})"
    except LoadInterrupted:  # the process's own signal: not this code's failure
        raise
    except BaseException as exc:
        # User code runs here (a ``__post_init__``): msgspec turns only its ValueError and
        # TypeError into a ValidationError. Anything else (an ``assert``) is this Run's
        # problem, never the host's: it stopped every Run from restoring. So is an exit or
        # an interrupt it raises, contained as the loader and the driver contain them: one
        # failed the host's start (CLI_INTERNAL_ERROR), and ended doctor and inspect
        # silently with its exit status (3 read as doctor's "attention").
        raised = (f"{type(exc).__name__}: {clip(message_of(exc), 500)}"
                  if isinstance(exc, Exception) else as_call(exc))
        return (f"the State saved in Stage {state.cursor.stage!r} no longer decodes: "
                f"building {st_type.__name__} raised {raised}")
    # Saved as encoded, or (a State with sets, floats, ...) in the deterministic order the
    # driver saves it in.
    again = msgspec.json.encode(decoded)
    if again != state.stage_state and deterministic_json(decoded) != state.stage_state:
        # The Workflow and its schemas are as they were (checked first): building the State
        # changed what it was given. "no longer matches its schema output" named neither
        # that nor the values, and read as a schema change nobody made.
        saved = state.stage_state.decode("utf-8", "replace")
        return (f"the State saved in Stage {state.cursor.stage!r} ({clip(saved, 200)}) "
                f"decodes as {st_type.__name__} to another value "
                f"({clip(again.decode('utf-8', 'replace'), 200)}): {st_type.__name__} does "
                "not keep what was saved (a field it lacks, or a __post_init__ that sets "
                "fields, say), so the Run would go on from a State it never saved")
    return None


def version_change(lw: LoadedWorkflow, state: RunState) -> str:
    """``; version 'a' when the Run started, 'b' now`` when the Workflow's declared version
    is part of what changed its identity (said along with the identities), else ``""``."""
    if lw.version == state.workflow_version:
        return ""
    return f"; version {state.workflow_version!r} when the Run started, {lw.version!r} now"


def not_defined_note(workflows: Mapping[str, LoadedWorkflow]) -> str:
    """``: no source of intloom.toml defines it now (they define 'b' from workflows/b.py)``,
    for a Workflow that is not loaded while every source loaded: the source and its entry
    may well be there, defining the Workflow under another name (``Workflow("b", ...)``
    renamed), and "restore its source and its entry" sent the user looking for neither."""
    shown = [f"{lw.name!r} from {lw.source}" for lw in sorted(workflows.values(),
                                                            key=lambda lw: lw.name)]
    if not shown:
        return ": no source of intloom.toml defines it now (none defines a Workflow)"
    more = f" and {len(shown) - 3} more" if len(shown) > 3 else ""
    return f": no source of intloom.toml defines it now (they define {', '.join(shown[:3])}{more})"


def failed_sources_note(failed: Sequence[str], *, advice: bool = True) -> str:
    """``; SOURCE failed to load ...`` for a Workflow that is not loaded while sources of
    intloom.toml failed to load: its Runs are held for that, most likely, and the fix is in
    that source -- not in putting back a source and an entry that are both still there.
    Which Workflows a source that fails defines cannot be known, hence "may". ``advice``
    False: the fact alone, for a Run that has ended (no fix applies to it any more)."""
    if not failed:
        return ""
    shown = ", ".join(failed[:3]) + (f" and {len(failed) - 3} more" if len(failed) > 3 else "")
    which = "it" if len(failed) == 1 else "them"
    fact = f"; {shown} (listed in intloom.toml) failed to load and may define it"
    if not advice:
        return fact
    # "Fix it" alone: a fix that left any byte of the tree other than the Run began with
    # brought the Run back held as changed instead.
    return (f"{fact} (intloom doctor says why): make {which} load as the Run started with "
            f"it (install what it imports, or put back its code: a fix that changes any byte "
            f"of its source tree holds the Run as changed), then intloom stop and intloom start")
