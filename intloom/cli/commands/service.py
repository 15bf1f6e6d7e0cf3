"""``intloom start`` and ``intloom stop``: the host's lifecycle (``intloom.client.lifecycle``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from intloom.cli.options import CliState, Interrupted, command
from intloom.cli.render import Renderer, changed_lines, plain, service_lines

if TYPE_CHECKING:
    from intloom.client.drift import SourceChange
    from intloom.client.lifecycle import CutRun, StopResult

__all__ = ["start", "stop", "stop_lines"]

# intloom.client.client.MAX_SECONDS, above which lifecycle refuses a timeout; imported here
# it would cost every command's start-up. Checked while parsing, a timeout past it is a usage
# error (exit 2), as a negative one is, not a failure found once the command has begun.
MAX_TIMEOUT = 1e9


def _timeout_option(default: str) -> Any:
    """--timeout, whose default (lifecycle's) differs between start and stop."""
    return typer.Option(
        "--timeout", metavar="S", min=0.0, max=MAX_TIMEOUT,
        help=f"Give up after S seconds (default {default}).", show_default=False,
    )


@command
def start(
    state: CliState,
    port: Annotated[
        int | None,
        typer.Option(
            "--port", metavar="N", min=0, max=65535,
            help="Listen on this port; later starts reuse it unless intloom.toml sets a port.",
            show_default=False,
        ),
    ] = None,
    foreground: Annotated[
        bool, typer.Option("--foreground", help="Run the host in this terminal; Ctrl-C stops it.")
    ] = False,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict", help="Refuse to start when any journal is corrupt or incompatible."
        ),
    ] = False,
    timeout: Annotated[float | None, _timeout_option("300")] = None,
) -> None:
    """Start the project's host (or reuse the one running) and restore its Runs."""
    from intloom.client import lifecycle

    root = state.root()
    renderer = state.renderer
    kwargs: dict[str, Any] = {"port": port, "strict": strict, "foreground": foreground}
    if timeout is not None:
        kwargs["timeout"] = timeout
    if foreground:
        from intloom.cli.streams import foreground_streams

        foreground_streams(renderer)
        ctrl_c = lifecycle.ctrl_c_stops()

        # The host runs here until it stops: say so once it serves, not when it has gone.
        def ready(result: Any) -> None:
            _report(renderer, result)
            renderer.note(
                "Running in the foreground; Ctrl-C stops the host gracefully." if ctrl_c
                else "Running in the foreground; Ctrl-C does not stop it (this command was "
                "started with SIGINT ignored, as cmd & in a script starts it): stop it with "
                f"intloom stop from another terminal, or kill -TERM {result.service.pid}.")

        def stopped(done: StopResult) -> None:
            """What intloom stop would have printed: the Runs the stop cut (the next start
            reports them RUN_INTERRUPTED) are named, as are waits it cannot restore."""
            kept = "The service stopped; checkpoints are kept for the next intloom start."
            if done.forced and done.suspended is None:  # cut short before it counted them
                renderer.note(
                    "The service stopped at once (a second Ctrl-C or signal): it did not wait "
                    "for the Steps still running; the next start reports their Runs "
                    "RUN_INTERRUPTED (intloom doctor previews it). Checkpoints are kept.")
            elif not (done.cut_count or done.lost_count or done.suspended or done.others):
                renderer.note(kept)  # no Run to speak of: "No Run was unfinished" adds nothing
            else:
                for line in stop_lines(done, first=kept):
                    renderer.note(line)

        lifecycle.start_service(root, progress=lambda _text: None, on_ready=ready,
                                on_lost=renderer.error, on_stopped=stopped,
                                on_stopping=renderer.note, waiting=renderer.note, **kwargs)
        return
    with renderer.spinner("Starting the intloom service...") as update:
        # On a terminal the spinner's line says it (a note would be drawn over); elsewhere
        # a note on stderr, since nothing else is said until the --timeout.
        slow = update if renderer.rich_err else renderer.note
        try:
            result = lifecycle.start_service(root, progress=update, slow_import=slow,
                                             waiting=slow, **kwargs)
        except lifecycle.LaunchInterrupted as interrupted:
            raise Interrupted(interrupted.note) from None
    _report(renderer, result)


def _report(renderer: Renderer, result: Any) -> None:
    """``{service, reused, changedSinceStart}``, or the service's lines, what its restore
    did, and what changed on disk since a reused host started."""
    service = result.service
    reused = bool(result.reused)
    changed = plain(result.changed)

    def text() -> list[str]:
        title = "Reusing existing service" if reused else "Service started"
        return service_lines(plain(service), title) + changed_lines(changed)

    renderer.result({"service": service, "reused": reused, "changedSinceStart": changed},
                    text)


@command
def stop(state: CliState, timeout: Annotated[
        float | None, _timeout_option("10, or as long as the host says its stop may take; 300 "
                                       "for a host still starting")
] = None) -> None:
    """Ask the running host to stop, once, and wait until it has released its files."""
    from intloom.client import lifecycle

    root = state.root()
    kwargs: dict[str, Any] = {}
    if timeout is not None:
        kwargs["timeout"] = timeout
    renderer = state.renderer
    with renderer.spinner("Stopping the intloom service...") as update:
        # On a terminal the spinner's line says what it waits for; elsewhere a note on
        # stderr, since a host still starting may keep this stop silent for minutes.
        kwargs["starting"] = update if renderer.rich_err else renderer.note
        try:
            result = lifecycle.stop_service_report(root, **kwargs)
        except KeyboardInterrupt:
            raise Interrupted(lifecycle.stop_interrupted_note(root)) from None
    stopped = result.stopped

    def text() -> list[str]:
        if not stopped:
            return ["The service is not running; no stop is needed."]
        return stop_lines(result)

    doc: dict[str, Any] = {"projectRoot": str(root), "stopped": stopped}
    if stopped:
        doc.update(stop_fields(result))
    state.renderer.result(doc, text)


def stop_fields(result: StopResult) -> dict[str, Any]:
    """What ``stop_lines`` says, for ``--json``: DESIGN's two fields stay, these are added
    so that a script learns which Runs the next start reports RUN_INTERRUPTED."""
    def listed(runs: list[CutRun]) -> list[dict[str, str]]:
        return [{"runId": run.run_id, "evidence": run.evidence} for run in runs]

    return {"cut": listed(result.cut), "cutCount": result.cut_count,
            "lost": listed(result.lost), "lostCount": result.lost_count,
            "suspended": result.suspended, "others": result.others,
            "changedSinceLoad": plain(result.changed), "served": result.served}


def _listed(runs: list[CutRun], count: int) -> list[str]:
    lines = [f"  {run.run_id}: {run.evidence}" for run in runs]
    if count > len(runs):
        lines.append(f"  ... and {count - len(runs)} more (intloom start lists them all).")
    return lines


def stop_lines(result: StopResult,
               first: str = "The original service instance stopped.") -> list[str]:
    """What a stop did to the Runs: the ones cut mid-Step, the ones whose wait the next start
    cannot restore (both come back RUN_INTERRUPTED), and how many it resumes; after
    ``first``, the sentence saying the host stopped."""
    lines = [first]
    if not result.served:
        return _joined([first, "It exited before it ever served requests (its start was "
                        "given up, or failed), not asked by this stop, so it had taken on no "
                        "Run: the unfinished Runs are as the host before it left them "
                        "(intloom doctor previews what the next start does with each)."])
    n = result.cut_count
    if n:
        lines.append(
            f"{'1 Run' if n == 1 else f'{n} Runs'} still had a Step, Tool or on_complete "
            "running when the stop began that did not reach its checkpoint (the stop's grace "
            "ran out, or it was an on_complete, whose completion a stopping host never "
            "records); the next start reports "
            f"{'it' if n == 1 else 'them'} RUN_INTERRUPTED and replays nothing:")
        lines += _listed(result.cut, n)
    lost = result.lost_count
    if lost:
        lines.append(
            f"{'1 Run waits' if lost == 1 else f'{lost} Runs wait'} on what the next start "
            "cannot restore (a question or confirmation whose Step has no recover, or that "
            "recover asked after running an effect, or a task for a client Agent); it "
            f"reports {'it' if lost == 1 else 'them'} "
            "RUN_INTERRUPTED:")
        lines += _listed(result.lost, lost)
    saved = ("suspended at their last checkpoint; committed data is retained. Run intloom "
             "start to resume them.")
    if result.suspended is None and result.forced:
        lines.append(
            "A second stop signal stopped the host at once: it did not wait for the Steps "
            "still running, and the next start reports their Runs RUN_INTERRUPTED (intloom "
            "doctor previews it; its log's tasks_abandoned names them). Checkpoints are kept.")
        return _joined(lines)
    if result.suspended is None:
        # A host that did not say (its log's last lines unwritten, as on a full disk, or an
        # older host): its Runs may have failed by a checkpoint, which no start resumes.
        lines.append(
            f"Its log does not say what the stop did to the {'other ' if n or lost else ''}"
            "unfinished Runs (the log cannot be read, or its last lines were never written, "
            "as on a full disk): intloom doctor previews what the next start does with each.")
        return _joined(lines)
    rest = result.suspended - n - lost
    if rest > 0:
        other = "other " if n or lost else ""
        lines.append(
            f"1 {other}unfinished Run was suspended at its last checkpoint; committed data is "
            "retained. Run intloom start to resume it." if rest == 1
            else f"{rest:,} {other}unfinished Runs were {saved}")
    if result.others:
        lines.append(
            f"{'1 Run stays' if result.others == 1 else f'{result.others:,} Runs stay'} "
            "unfinished as this host found or left "
            f"{'it' if result.others == 1 else 'them'} (interrupted earlier and not dismissed, "
            "held, or failed by a checkpoint): the next start reports "
            f"{'it' if result.others == 1 else 'them'} again (intloom doctor previews it).")
    if not result.suspended and not result.others:
        lines.append("No Run was unfinished.")
    if result.changed:
        lines.append(_changed_since_load(result.changed))
    return _joined(lines)


def _changed_since_load(changed: list[SourceChange]) -> str:
    """"Run intloom start to resume them" is not so for the Runs of a Workflow whose source
    changed since the host loaded it: the next start holds them (needs attention); nor
    while intloom.toml is one the next start refuses."""
    config = next((change for change in changed if change.change == "config"), None)
    if config is not None:
        return (f"But the next intloom start refuses the project as it is: {config.message} "
                "Once it is fixed, that start holds (needs attention) every unfinished Run of "
                "a Workflow it cannot load and those that began with other code than the code "
                "on disk at that start, rather than restoring them by the restart table; "
                "intloom doctor lists them and what a start would do.")
    facts = []
    from intloom.client.drift import changed_tree, named_source

    for change in changed:
        what = named_source(change.source, change.workflow)
        facts.append({"edited": f"{changed_tree(change.source, change.workflow)} changed "
                      "since this host loaded it",
                      "unlisted": f"{what} is no longer listed in intloom.toml"}.get(
                          change.change, f"{what} cannot be loaded as this host loaded it"))
    names = sorted({change.workflow for change in changed if change.workflow})
    whose = f"of {', '.join(names)} " if names else ""
    # "Rather than resuming them" promised a resume, with the code put back, to Runs the
    # restart table interrupts whatever their code (a wait on an Agent task).
    if any(change.change != "edited" for change in changed):
        # Not loaded at the next start at all: every Run of it is held, whatever its code.
        held = f"every unfinished Run {whose}(its Workflow is not loaded then; "
    else:
        # Not "unless the code they started with is put back": said after an edit was
        # undone, of Runs whose code is the code on disk again, it told of a hold that
        # never came.
        held = (f"those unfinished Runs {whose}that began with other code than what is on "
                "disk now (")
    # Said last, after the lines that name Runs the next start reports RUN_INTERRUPTED or
    # resumes: of those, the ones of these Workflows are held instead (a reader took the
    # earlier lines for what would happen to every Run).
    return (f"But {'; '.join(facts)}: the next start holds {held}needs attention) rather "
            "than restoring them by the restart table, whatever the lines above say of them; "
            "intloom doctor lists them and what a start would do.")


def _joined(lines: list[str]) -> list[str]:
    """The first sentence goes on with the second, on one line."""
    return [f"{lines[0]} {lines[1]}", *lines[2:]] if len(lines) > 1 else lines
