"""The Run model: what a Run is, and the views that leave the host.

Views use camelCase on the wire so that scripts written for the TypeScript IntLoom read ours.

The Run's structs here, in ``records`` and ``machine`` are ``gc=False``: they only hold data
and never take part in a reference cycle, so the cyclic collector need not walk the many a
busy host keeps (each Run's states, views and recent history). Tracked, they made every
full collection of a host with 128 finished Runs a ~40 ms pause of its event loop.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from intloom.errors import ErrorView

__all__ = [
    "ActionKind",
    "AgentPhase",
    "Cursor",
    "EffectRef",
    "PendingAction",
    "PendingAgentCall",
    "PendingKind",
    "RunStatus",
    "RunView",
    "WaitingAction",
    "shown_action",
]

RunStatus = Literal["running", "waiting", "completed", "failed"]
# As journaled (``waiting`` records, snapshots) and as the executor branches on it.
ActionKind = Literal["confirmation", "questions"]
# As shown (Run views, events, ``Recovery.action``): the TypeScript IntLoom's values
# (``PendingUserAction.kind``), so that a script reading ``pendingAction.kind`` reads both.
PendingKind = Literal["user_ask_confirmation", "user_ask_questions"]
AgentPhase = Literal["available", "claimed"]


class Cursor(msgspec.Struct, frozen=True, gc=False):
    """Where a Run stands: a Stage and, once inside it, a Step."""

    stage: str
    step: str | None = None


class WaitingAction(msgspec.Struct, frozen=True, rename="camel", gc=False):
    """A question or confirmation waiting for a person, as the journal holds it."""

    id: str
    kind: ActionKind
    request: Any
    cursor: Cursor
    created_at: str


class PendingAction(msgspec.Struct, frozen=True, rename="camel", gc=False):
    """A question or confirmation waiting for a person, as a Run's view shows it: the
    reference's ``PendingUserAction`` (id, flowName, cursor, kind, request, createdAt)."""

    id: str
    flow_name: str
    cursor: Cursor
    kind: PendingKind
    request: Any
    created_at: str


_SHOWN: dict[str, PendingKind] = {"confirmation": "user_ask_confirmation",
                                  "questions": "user_ask_questions"}


def shown_action(action: WaitingAction, flow_name: str) -> PendingAction:
    """``action`` as views show it. Built only for a Run that waits on a person."""
    return PendingAction(id=action.id, flow_name=flow_name, cursor=action.cursor,
                         kind=_SHOWN[action.kind], request=action.request,
                         created_at=action.created_at)


class PendingAgentCall(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True,
                       gc=False):
    """A task published for a client Agent."""

    id: str
    agent_id: str
    phase: AgentPhase
    request: Any
    tools: list[str]
    created_at: str
    # What each Tool is for (``intloom.Tool(..., description=...)``), by name, for those
    # given one: the Agent that calls them had only their names. Added 2026-12; left out
    # when empty, so a task without descriptions is encoded as before.
    tool_descriptions: dict[str, str] = msgspec.field(default_factory=dict)


class EffectRef(msgspec.Struct, frozen=True, rename="camel", gc=False):
    """An effect that was started; named in RUN_INTERRUPTED messages."""

    name: str
    key: str
    started_at: str


class RunView(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True, gc=False):
    """The public projection of a Run. Fields are added, never renamed."""

    run_id: str
    flow_name: str
    cursor: Cursor
    status: RunStatus
    created_at: str
    updated_at: str
    pending_action: PendingAction | None = None
    pending_agent_call: PendingAgentCall | None = None
    last_error: ErrorView | None = None
    phase: str | None = None
    workflow_version: str | None = None
    dismissed: bool = False
