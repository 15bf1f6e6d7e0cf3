"""Run commands against the live host: ``flow``, ``flows``, ``runs``, ``answer``, ``cancel``."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from intloom.cli import exit_codes
from intloom.cli.inputs import (
    action_id_problem,
    interactive,
    read_answer,
    read_intent,
    run_id_problem,
)
from intloom.cli.options import CliState, Interrupted, command, sigterm_as_ctrl_c
from intloom.cli.render import asked_lines, changed_lines, named_runs, plain, run_lines, run_row
from intloom.errors import BLANK_INTENT, IntloomError, error_view

if TYPE_CHECKING:
    from intloom.client.client import Client
    from intloom.client.drift import SourceChange
    from intloom.runtime.model import RunView

__all__ = [
    "answer", "cancel", "finish_run", "flow", "flows", "left_suspended", "refuse_bad_ids", "runs",
]

RunArg = Annotated[str, typer.Argument(metavar="RUN", help="The Run's id (RUN-...).")]
# The waiting Runs whose question ``runs`` prints under its table; the rest are counted.
_ASKS_SHOWN: Final = 20


def finish_run(state: CliState, run: RunView, *, prefix: list[str] | None = None,
               suspended: bool = False, extra: dict[str, Any] | None = None) -> int:
    """Print ``{run}`` once; a failed Run also says CLI_RUN_FAILED (text mode) and exits 1.
    ``suspended``: the command saw the Run's host suspend it (attach: its event stream ended
    with ``suspended``; flow, answer: a Run they created or answered cannot be one a start
    restored interrupted). A Run its host suspended has not ended: it exits RUN_SUSPENDED,
    and says so, not CLI_RUN_FAILED. ``extra``: more keys of the JSON document."""
    data = plain(run)
    held = left_suspended(run, suspended=suspended)
    code = state.verdict = exit_codes.for_run_status(run.status, suspended=held)
    state.renderer.result({"run": run, **(extra or {})},
                          lambda: [*(prefix or []),
                                   *run_lines(data, suspended=held, intloom=state.intloom())])
    if code == exit_codes.OK or state.json_mode:
        return code
    err = data.get("lastError") or {}
    code_ = err.get("code", "an error")
    # An interrupted Run has not necessarily ended: a host stop suspends a Run that the
    # next start continues; its own message says which (executor RunSlot.view).
    said = str(err.get("message") or "").strip()
    if held:
        # A stop suspends the Runs of a host that exits; a lost log, of one that serves on
        # (refusing new work), which a start would only reuse.
        state.renderer.note(
            f"Suspended · The Run {run.run_id} was suspended by its host, not ended (its view "
            f"reads failed/RUN_INTERRUPTED until the next start): {said} Run intloom stop "
            "first if its host still serves (intloom status says; one whose log failed "
            f"does), then intloom start, then intloom attach {run.run_id}.")
        return code
    if code_ == "RUN_INTERRUPTED":
        fact = (f"was interrupted (RUN_INTERRUPTED): {said}" if said else
                "was interrupted (RUN_INTERRUPTED).")
    else:
        fact = f"ended {run.status} with {code_}."
    state.renderer.error(error_view(
        "CLI_RUN_FAILED",
        f"The Run {run.run_id} {fact} Run {state.intloom()} inspect {run.run_id} for its "
        "journal."))
    return code


def left_suspended(run: RunView, *, suspended: bool = False) -> bool:
    """``run`` is as its host left it when it suspended it: failed/RUN_INTERRUPTED, not
    dismissed, and either ``suspended`` (the caller saw it happen) or not over by its view:
    ``phase`` is that of its last record, and ``terminal`` for a Run a start restored
    RUN_INTERRUPTED (docs/cli.md, "A stop, seen from a program"). The view tells it when
    attach begins at a Run a host whose log failed had suspended already."""
    error = run.last_error
    return (run.status == "failed" and error is not None and error.code == "RUN_INTERRUPTED"
            and not run.dismissed
            and (suspended or (run.phase is not None and run.phase != "terminal")))


@command
def flow(
    state: CliState,
    workflow: Annotated[str, typer.Argument(metavar="WORKFLOW", help="The Workflow's name.")],
    intent: Annotated[
        str | None, typer.Option("--intent", metavar="TEXT", help="What the Run is for.")
    ] = None,
    intent_file: Annotated[
        str | None,
        typer.Option(
            "--intent-file", metavar="PATH", help="Read the intent from a file (- is stdin)."
        ),
    ] = None,
    detach: Annotated[
        bool, typer.Option("--detach", help="Return as soon as the Run is created.")
    ] = False,
) -> int:
    """Create a Run and wait for its first question, confirmation or end.

    On a terminal without --intent or --intent-file, the intent is asked for. Exit 0 when
    it waits, completes or runs on (--detach), 1 when it fails, 75 when its host stopped
    and suspended it meanwhile (not ended).
    """
    prompt = interactive(state.json_mode)
    if prompt and intent is None and intent_file is None:
        _usable(state, workflow)
    text = read_intent(intent, intent_file, prompt=prompt, hint=not state.json_mode)
    # Created, then waited for in a second request on the same connection: a Ctrl-C, or a
    # failure (a stop, a crash) while it waits, can then name the Run. One request that
    # created and waited left the id unknown until the Run was stable.
    created: str | None = None
    changed: list[SourceChange] = []
    try:
        with (sigterm_as_ctrl_c(state), state.client(waits=not detach) as client,
              state.renderer.spinner(f"Running {workflow}...")):
            # Before the create: after it, the Run's first Step may hold the host's loop (an
            # async Step that blocks), and --detach returned only once it let go.
            changed = _edited_since_start(state, client, workflow)
            try:
                run = client.create_run(workflow, text, wait=False)
            except IntloomError as exc:
                if exc.code != "NOT_FOUND":
                    raise
                raise _not_loaded(state, client, exc) from None
            if not detach:
                created = run.run_id
                try:
                    run = client.wait_run(created)
                except IntloomError as exc:
                    raise _created_anyway(state, created, exc) from None
    except KeyboardInterrupt:
        intloom = state.intloom()
        if created is not None:
            raise Interrupted(
                f"Stopped waiting ({state.stopped_by()}). Run {created} goes on in the host: "
                f"{intloom} attach {created} follows it."
            ) from None
        # Ctrl-C before the host replied: the id is not known, and "attach RUN" read as a
        # Run's id to copy.
        from intloom.fsutil import shell_arg

        raise Interrupted(
            f"Stopped waiting ({state.stopped_by()}). A Run this command created goes on in "
            "the host, but its id is not known here: the host had not replied yet. "
            f"{intloom} runs --flow {shell_arg(workflow)} lists it with its id (the newest "
            f"one, if you started no other); {intloom} attach with that id follows it."
        ) from None
    if changed and not state.json_mode:
        # After the wait: a note under the spinner would be drawn over.
        for line in changed_lines(plain(changed), new_run=run.run_id):
            state.renderer.note(line)
    # Only a start restores a Run RUN_INTERRUPTED, so a Run created here that reads so was
    # suspended by its host (intloom stop while it ran): it has not ended.
    return finish_run(state, run, suspended=True,
                      extra={"changedSinceStart": changed} if changed else None)


def _edited_since_start(state: CliState, client: Client, workflow: str) -> list[SourceChange]:
    """How ``workflow``'s source on disk differs from what the host loaded, which the new
    Run runs (``drift.workflow_since_start``); nothing when the host went meanwhile (the
    Run's create or wait says so)."""
    from intloom.client.drift import workflow_since_start

    try:
        return workflow_since_start(state.root(), client.status(), client.workflows(),
                                    workflow)
    except IntloomError:
        return []


def _usable(state: CliState, workflow: str) -> None:
    """Before a person is asked for the intent: a host serves and has loaded ``workflow``.
    An offline host or a misspelt name was said only once they had typed it, and lost it."""
    with state.client() as client:
        try:
            # A blank intent: the host looks up the Workflow first (NOT_FOUND), then refuses
            # the intent, so no Run can be created by this look.
            client.create_run(workflow, "", wait=False)
        except IntloomError as exc:
            if exc.code == "NOT_FOUND":
                raise _not_loaded(state, client, exc) from None
            # Only the host's refusal of the intent says the rest would be taken: a name
            # the client cannot send is INVALID_REQUEST too, and fails the create the same.
            if exc.code != "INVALID_REQUEST" or not exc.message.startswith(BLANK_INTENT):
                raise
            return
    raise IntloomError(  # a host that took a blank intent: nothing was asked
        "CLI_INTERNAL_ERROR",
        f"The host took a blank intent for Workflow {workflow!r} and created a Run of it; "
        "report this. intloom runs lists it; intloom cancel RUN ends it.")


def _answered_anyway(state: CliState, run_id: str, exc: IntloomError) -> IntloomError:
    """``exc``, from waiting for Run ``run_id`` after its answer was recorded: a stop that
    began between the two requests, or a host gone. Its own advice ("run it again", a
    WaitRun the person never sent, "safe to send again") would send the answer again,
    which is refused: it is recorded. Not retryable, as the answer itself is not."""
    intloom = state.intloom()
    why = ("its host began to stop before the Run could be followed" if exc.code ==
           "CLI_SERVICE_CLOSING" else "following the Run failed")
    return IntloomError(
        exc.code,
        f"The answer was recorded, but {why}: {exc.message} Do not send the answer again: "
        f"it is recorded, and the Run goes on with it as the restart table allows once a host "
        f"serves it ({intloom} status says whether one does; {intloom} attach {run_id} "
        "follows the Run).",
        retryable=False,
    )


def _created_anyway(state: CliState, run_id: str, exc: IntloomError) -> IntloomError:
    """``exc``, from waiting for Run ``run_id`` that this command created, saying so: the
    host's advice to send the request again (a stop began meanwhile) would, for ``flow``,
    create a second Run."""
    intloom = state.intloom()
    # The client's own error for a lost connection already says how to follow it.
    follow = "" if f"attach {run_id}" in exc.message else (
        f" {intloom} attach {run_id} follows it once a host serves it.")
    return IntloomError(
        exc.code,
        f"{exc.message} This command created Run {run_id}, which is not lost: running "
        f"{intloom} flow again would create another Run.{follow}",
        retryable=False,
    )


def _not_loaded(state: CliState, client: Client, exc: IntloomError) -> IntloomError:
    """The host's NOT_FOUND for a Workflow it did not load, and, when the project changed
    since that host started (a source listed since, an edited tree), what changed and how
    to load it: the host loads the project once, at its start."""
    from intloom.client.drift import since_start

    try:
        changes = since_start(state.root(), client.status(), client.workflows())
    except IntloomError:
        return exc  # the host went meanwhile: its own answer stands
    # Another intloom installed since the host started is no reason for a missing Workflow.
    changes = [c for c in changes if c.change != "intloom"]
    if not changes:
        return exc
    found = " ".join(c.message for c in changes)
    return IntloomError(
        exc.code,
        f"{exc.message} The project changed since this host started: {found} To load it: "
        "intloom stop, then intloom start.",
        retryable=exc.retryable,
    )


@command
def flows(state: CliState) -> None:
    """List the Workflows the host loaded, with their identity and readiness."""
    from intloom.client.drift import since_start

    with state.client() as client:
        workflows = client.workflows()
        # What intloom.toml and the sources say now, against what the host loaded at its
        # start: a source listed since was in no list, and flows is where one looks first.
        try:
            changed = plain(since_start(state.root(), client.status(), workflows))
        except IntloomError:
            changed = []  # the host went meanwhile: what it loaded no longer matters
    renderer = state.renderer
    if renderer.json_mode:
        renderer.document({"workflows": workflows, "changedSinceStart": changed})
        return
    # On stderr: stdout stays one line per Workflow for a script that reads it.
    if not workflows:
        renderer.lines(["The current service has no Workflows. Add one to intloom.toml."])
        for line in changed_lines(changed):
            renderer.note(line)
        return
    rows = [
        [
            w.name,
            w.version,
            "ready" if w.ready else f"not ready: {w.problem or 'see intloom doctor'}",
            w.identity[:12],
            w.source,
        ]
        for w in workflows
    ]
    renderer.table(["WORKFLOW", "VERSION", "READINESS", "IDENTITY", "SOURCE"], rows)
    for line in changed_lines(changed):
        renderer.note(line)


@command
def runs(
    state: CliState,
    flow: Annotated[
        str | None, typer.Option("--flow", metavar="WORKFLOW", help="Only this Workflow's Runs.")
    ] = None,
) -> None:
    """List the Runs of the current host (new ones and restored unfinished ones)."""
    renderer = state.renderer
    held: list[str] = []
    held_count = 0
    with state.client() as client:
        found = client.runs(flow)  # NOT_FOUND for a Workflow the host did not load
        if flow is None:
            # Unfinished Runs the host holds are not its Runs: a person reading "no Runs",
            # or a script reading {"runs": []}, would not look for them.
            restore = client.status().restore
            if restore is not None:
                held, held_count = restore.needs_attention, restore.count("needs_attention")
    if renderer.json_mode:
        # DESIGN's {runs} document, plus (only when there are any) the held Runs' ids: the
        # first 1,000 (restore.needsAttention), and how many there are in all.
        extra = ({"needsAttention": held, "needsAttentionCount": held_count}
                 if held_count else {})
        renderer.document({"runs": found, **extra})
        return
    held_lines = ([f"Not listed, needs attention (journal kept as is, not loaded): "
                   f"{named_runs(held, 'intloom doctor lists them all', held_count)}. "
                   "Run intloom doctor."]
                  if held else [])
    if not found:
        renderer.lines([f"The current service has no Runs of Workflow {flow!r}." if flow
                        else "The current service has no Runs.", *held_lines])
        return
    views = [plain(r) for r in found]
    renderer.table(["RUN", "WORKFLOW", "STATUS", "STAGE/STEP", "UPDATED"],
                   [run_row(v) for v in views])
    # What each waiting Run asks, so that an answer can be composed from this output alone.
    asks: list[str] = []
    intloom = state.intloom()
    blocks = (block for block in (asked_lines(v, intloom=intloom) for v in views) if block)
    for block in itertools.islice(blocks, _ASKS_SHOWN):
        asks.extend(["", *block])  # a blank line: the table's rows end above
    # The rest counted: 10,000 waiting Runs gave 50,000 lines of these, under which the
    # table scrolled away.
    more = sum(1 for _ in blocks)
    if more:
        asks.extend(["", f"... and {more:,} more waiting Runs: intloom attach RUN shows what "
                         "one asks, intloom runs --json lists every one."])
    if asks:
        renderer.lines(asks)
    if any(((v.get("lastError") or {}).get("code")) == "RUN_CHECKPOINT_FAILED" for v in views):
        renderer.lines(["", "RUN_CHECKPOINT_FAILED: this host stopped the Run, which is not "
                        "necessarily ended: the next intloom start restores it from its last "
                        "durable checkpoint (intloom doctor previews it)."])
    if held_lines:
        renderer.lines(["", *held_lines])


def refuse_bad_ids(run_id: str, action_id: str | None = None) -> None:
    """INVALID_REQUEST, before anything is sent, for a RUN (or ACTION) that no id can be:
    empty, blank, or not UTF-8 (``inputs.id_problem``)."""
    bad = run_id_problem(run_id, "nothing was sent")
    if bad is None and action_id is not None:
        bad = action_id_problem(action_id)
    if bad is not None:
        raise bad


@command
def answer(
    state: CliState,
    run_id: RunArg,
    action_id: Annotated[
        str, typer.Argument(metavar="ACTION", help="The pending action's id (from the Run).")
    ],
    answer_json: Annotated[
        str, typer.Argument(metavar="ANSWER", help="The answer as JSON; - reads it from stdin.")
    ],
) -> int:
    """Answer a pending question or confirmation, then wait for the next stable state.

    Exit 0 unless the Run then fails (1), or its host stops and suspends it meanwhile (75).
    """
    # The ids first, before ANSWER is read (from stdin, perhaps): an empty RUN was the
    # host's NOT_FOUND, "Run '' is not known", where an empty ACTION was a bad argument.
    refuse_bad_ids(run_id, action_id)
    value = read_answer(answer_json, hint=not state.json_mode)
    # Delivered, then waited for, in two requests: one that also waited left the person, at
    # a Ctrl-C while the Steps after the answer ran, unable to tell whether it was recorded
    # ("If the host took the answer ..."), under "Delivering the answer..." all along.
    recorded = False
    try:
        with sigterm_as_ctrl_c(state), state.client(waits=True) as client:
            with state.renderer.spinner("Delivering the answer..."):
                client.answer(run_id, action_id, value, wait=False)
            recorded = True
            with state.renderer.spinner("Answer recorded; waiting for the Run..."):
                try:
                    run = client.wait_run(run_id)
                except IntloomError as exc:
                    raise _answered_anyway(state, run_id, exc) from None
    except KeyboardInterrupt:
        said = ("The answer was recorded, and the Run goes on with it" if recorded else
                "If the host took the answer, the Run goes on with it")
        raise Interrupted(
            f"Stopped waiting ({state.stopped_by()}). {said}: {state.intloom()} attach "
            f"{run_id} shows where it is."
        ) from None
    # The Run took this answer, so no start had restored it RUN_INTERRUPTED: a reply that
    # reads so is its host suspending it (intloom stop while it ran on), not its end.
    return finish_run(state, run, suspended=True)


@command
def cancel(state: CliState, run_id: RunArg) -> None:
    """Stop a Run for good (failed/RUN_STOPPED). Repeating it returns the same snapshot."""
    refuse_bad_ids(run_id)
    with state.client() as client:
        run, already_ended = client.cancel(run_id)
    prefix = []
    if already_ended and not (
        run.last_error is not None and run.last_error.code == "RUN_STOPPED"
    ):
        prefix.append("The Run has ended; no stop is needed.")
    data = plain(run)
    state.renderer.result({"run": run},
                          lambda: [*prefix, *run_lines(data, intloom=state.intloom())])
