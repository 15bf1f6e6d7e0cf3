"""One handler per request: translate a protocol message into a ``Runtime`` call and back.

No logic lives here beyond the translation; every rule (answers, cancel, agent tasks) is the
Runtime's. Errors propagate as ``IntloomError`` and the server turns them into ``ErrorReply``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from intloom.errors import IntloomError
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
    ) -> None:
        self.runtime = runtime
        self.instance_id = instance_id
        self.service_view = service_view
        self.workflows = workflows

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
                    raise IntloomError(
                        "CONFLICT",
                        f"This host is instance {self.instance_id}, not {instance_id}; the stop "
                        "request was refused. Check intloom status and retry.",
                    )
                return Stopping()
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
                return RunReply(run=rt.get(run_id))
            case WaitRun(run_id=run_id):
                return RunReply(run=await rt.wait_stable(run_id))
            case ListRuns(flow=flow, page_bytes=page_bytes, after=after):
                if page_bytes <= 0:
                    return RunsReply(runs=rt.list(flow))
                runs, next_after = rt.list_page(flow, after, page_bytes)
                return RunsReply(runs=runs, next_after=next_after)
            case Answer(run_id=run_id, action_id=action_id, answer=answer):
                return RunReply(run=await rt.answer(run_id, action_id, answer))
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

    async def subscribe(self, run_id: str) -> AsyncIterator[list[RunEvent]]:
        """The Run's history, then live changes, in batches; the last event has ``final``."""
        last = None
        first = True
        async for updates in self.runtime.subscribe(run_id):
            events: list[RunEvent] = []
            for i, update in enumerate(updates):
                # Every event of the publish that ends the Run shows it ended: the last of
                # them (its ``terminal``) is the final one.
                final = (update.run.status in _TERMINAL and not update.history
                         and (i + 1 == len(updates) or updates[i + 1].run.status not in _TERMINAL))
                last = update.run
                events.append(RunEvent(
                    run=update.run, event=update.event, detail=update.detail,
                    history=update.history, final=final,
                    caught_up=first and (final or i + 1 == len(updates)),
                ))
                if final:
                    yield events
                    return
            first = False
            yield events
        # The Runtime ended the stream (the Run ended while we replayed history, or the host
        # is stopping): say so explicitly, so a follower never waits on a closed stream.
        yield [RunEvent(run=last if last is not None else self.runtime.get(run_id),
                        event="end", final=True)]
