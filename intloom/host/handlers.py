"""One handler per request: translate a protocol message into a ``Runtime`` call and back.

No logic lives here beyond the translation; every rule (answers, cancel, agent tasks) is the
Runtime's. Errors propagate as ``IntloomError`` and the server turns them into ``ErrorReply``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from intloom.errors import IntloomError
from intloom.executor.updates import RunUpdate
from intloom.protocol.messages import (
    Answer,
    CallTool,
    Cancel,
    ClaimAgentCall,
    Claimed,
    CompleteAgentCall,
    CreateRun,
    FailAgentCall,
    GetRun,
    ListRuns,
    ListWorkflows,
    Request,
    Response,
    RunEvent,
    RunReply,
    RunsReply,
    ServiceView,
    Status,
    StatusReply,
    Stop,
    Stopping,
    Subscribe,
    ToolResult,
    WaitRun,
    WorkflowInfo,
    WorkflowsReply,
)
from intloom.runtime.machine import Verdict
from intloom.runtime.model import RunView

if TYPE_CHECKING:
    from intloom.executor.runtime import Runtime

__all__ = ["Handlers"]

_TERMINAL = frozenset({"completed", "failed"})


class Handlers:
    """The host's request table. ``service_view`` is read at each Status (counts change)."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        instance_id: str,
        service_view: Callable[[], ServiceView],
        workflows: list[WorkflowInfo],
        stop_within: Callable[[], float] | None = None,
    ) -> None:
        self.runtime = runtime
        self.instance_id = instance_id
        self.service_view = service_view
        self.workflows = workflows
        self.stop_within = stop_within

    def next_start(self, run_id: str) -> Verdict | None:
        """What the next start does with Run ``run_id``, when already settled (RunSlot's
        ``next_start``), or None: whether a request refused now may be sent again then."""
        slot = self.runtime.runs.get(run_id)
        if slot is not None:
            return slot.next_start()
        held = self.runtime.held.get(run_id)
        if held is not None and held.ended is not None:  # cancelled here: its journal ended
            return Verdict("terminal", "the Run was cancelled while it was held")
        return None

    def _unloaded(self, exc: IntloomError) -> IntloomError:
        """NOT_FOUND for a Workflow, with the sources that failed to load: the Workflow asked
        for may be in one of them (its name is unknown until its source loads)."""
        failed = [w.source for w in self.workflows if not w.ready]
        if exc.code != "NOT_FOUND" or not failed:
            return exc
        return IntloomError(
            exc.code,
            f"{exc.message} {len(failed)} Workflow source(s) failed to load and may define it: "
            f"{', '.join(failed)} (intloom flows says why; fix the source, then intloom stop "
            "and intloom start).",
            retryable=exc.retryable,
        )

    async def handle(self, request: Request) -> Response:
        rt = self.runtime
        match request:
            case Status():
                return StatusReply(service=self.service_view())
            case Stop(instance_id=instance_id):
                if instance_id != self.instance_id:
                    # "Check intloom status and retry" sent the same id back, refused again.
                    raise IntloomError(
                        "CONFLICT",
                        f"This host is instance {self.instance_id}, not {instance_id!r}; the "
                        "stop request was refused and the host runs on. Pass the id of the "
                        "host to stop: the one its hello gave "
                        "(Client.stop(client.hello.instance_id)), or intloom status shows it.",
                    )
                return Stopping(within=self.stop_within() if self.stop_within else None)
            case ListWorkflows():
                return WorkflowsReply(workflows=self.workflows)
            case CreateRun(workflow=workflow, intent=intent, wait=wait):
                try:
                    view = await rt.create_run(workflow, intent)
                except IntloomError as exc:
                    raise self._unloaded(exc) from None
                if wait:
                    view = await rt.wait_stable(view.run_id)
                return RunReply(run=view)
            case GetRun(run_id=run_id):
                return RunReply(run=await rt.get_any(run_id))
            case WaitRun(run_id=run_id):
                return RunReply(run=await rt.wait_stable(run_id))
            case ListRuns(flow=flow, page_bytes=page_bytes, after=after):
                if page_bytes <= 0:
                    return RunsReply(runs=rt.list(flow))
                runs, next_after = rt.list_page(flow, after, page_bytes)
                return RunsReply(runs=runs, next_after=next_after)
            case Answer(run_id=run_id, action_id=action_id, answer=answer, wait=wait):
                return RunReply(run=await rt.answer(run_id, action_id, answer, wait=wait))
            case Cancel(run_id=run_id):
                view, already_ended = await rt.cancel(run_id)
                return RunReply(run=view, already_ended=already_ended)
            case ClaimAgentCall(run_id=run_id, call_id=call_id, claim_id=claim_id):
                owner_token, call = await rt.claim_agent_call(run_id, call_id, claim_id)
                return Claimed(owner_token=owner_token, call=call)
            case CallTool():
                output, replayed = await rt.call_tool(
                    request.run_id, request.call_id, request.owner_token,
                    request.tool_call_id, request.tool, request.input,
                )
                return ToolResult(output=output, replayed=replayed)
            case CompleteAgentCall():
                return RunReply(run=await rt.complete_agent_call(
                    request.run_id, request.call_id, request.owner_token, request.outcome,
                    request.output,
                ))
            case FailAgentCall():
                return RunReply(run=await rt.fail_agent_call(
                    request.run_id, request.call_id, request.owner_token, request.message
                ))
            case Subscribe():
                raise IntloomError("INVALID_REQUEST", "Subscribe is streamed, not answered once.")
        raise IntloomError("INVALID_REQUEST", f"{type(request).__name__} is not a request.")

    async def follow(
        self, run_id: str, send: Callable[[list[RunEvent]], None],
        fail: Callable[[Exception], None],
    ) -> Callable[[], None]:
        """The Run's history, then its live changes, handed to ``send`` in batches (on the
        loop, each live batch as the publish behind it runs); the last event has ``final``
        and ends the stream. Returns what ends it earlier (the follower left). Raises, having
        sent nothing, when there is no such Run. ``fail``: the stream broke (a bug), from
        inside a publish: the follower loses its stream, never the Run its publish."""
        events = _Events(send, fail)
        try:
            slot, history = await self.runtime.attach(run_id, events.live)
        except IntloomError as exc:
            ended = await self.runtime.ended_view(run_id) if exc.code == "NOT_FOUND" else None
            if ended is None:
                raise
            # Ended before this host started: its end, at once (its events are in the
            # journal, which intloom inspect reads).
            events.end(ended)
            return events.close
        events.stop = functools.partial(slot.detach, events.live)
        if history:
            events.live(history)
        if not events.done and slot.ended():
            # The Run ended before the follower came (or while its history was read): say so
            # explicitly, so a follower never waits on a closed stream.
            # At the time of the last event shown, when it has its own: a Run restored as
            # interrupted ends at its ``restored`` event, and its view's updatedAt (its last
            # record's, from before the crash) put the end line before that event.
            last = history[-1] if history else None
            at = last.detail.get("at") if last is not None and isinstance(
                last.detail, dict) else None
            events.end(last.run if last is not None else self.runtime.get(run_id),
                       at if isinstance(at, str) else None)
        return events.close


class _Events:
    """A follower's ``RunUpdate`` batches as ``RunEvent`` batches: ``caught_up`` on the last
    event of the first batch (the history, or the first live batch when there is none),
    ``final`` on the event that ends the Run, after which nothing is sent."""

    def __init__(self, send: Callable[[list[RunEvent]], None],
                 fail: Callable[[Exception], None]) -> None:
        self.send = send
        self.fail = fail
        self.first = True
        self.done = False
        self.stop: Callable[[], None] | None = None

    def live(self, updates: list[RunUpdate]) -> None:
        if self.done:
            return
        try:
            self._live(updates)
        except Exception as exc:
            self.close()
            self.fail(exc)

    def _live(self, updates: list[RunUpdate]) -> None:
        events: list[RunEvent] = []
        for i, update in enumerate(updates):
            # Every event of the publish that ends the Run shows it ended: the last of them
            # (its ``terminal``) is the final one.
            final = (update.run.status in _TERMINAL and not update.history
                     and (i + 1 == len(updates) or updates[i + 1].run.status not in _TERMINAL))
            events.append(RunEvent(
                run=update.run, event=update.event, detail=update.detail,
                history=update.history, final=final, omitted=update.omitted,
                caught_up=self.first and (final or i + 1 == len(updates)),
            ))
            if final:
                self.close()
                break
        self.first = False
        self.send(events)

    def end(self, run: RunView, at: str | None = None) -> None:
        """The event that says the Run has ended; ``at``: its time, when it is not the
        view's updatedAt (an event that is no record has its own, as ``restored`` does)."""
        self.close()
        # The first batch's last event is caught up, this one too when it is the only one
        # (an ended Run the host no longer lists): a client waiting for the mark never saw it.
        caught_up, self.first = self.first, False
        self.send([RunEvent(run=run, event="end", final=True, caught_up=caught_up,
                            detail=None if at is None else {"at": at})])

    def close(self) -> None:
        self.done = True
        if self.stop is not None:
            self.stop()
            self.stop = None
