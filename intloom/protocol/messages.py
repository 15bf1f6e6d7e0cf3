"""The socket protocol: msgspec tagged unions shared by the host and the client.

Every connection opens with :class:`Hello`. After that each frame is one ``Request`` and the
host answers with one ``Response`` -- except :class:`Subscribe`, after which the host sends
:class:`RunEvent` frames until the Run is terminal or the client closes.

New fields always get defaults; a field is never retyped; ``PROTOCOL`` changes on any
incompatible change.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from intloom.errors import ErrorView
from intloom.runtime.model import PendingAgentCall, RunView

__all__ = [
    "ANSWER_WAIT",
    "CAUGHT_UP",
    "FEATURES",
    "MAX_FRAME",
    "MAX_PAGE",
    "PROTOCOL",
    "RESTORE_LISTED",
    "Answer",
    "CallTool",
    "Cancel",
    "ClaimAgentCall",
    "Claimed",
    "CompleteAgentCall",
    "CreateRun",
    "ErrorReply",
    "FailAgentCall",
    "GetRun",
    "Hello",
    "HelloOk",
    "ListRuns",
    "ListWorkflows",
    "Request",
    "Response",
    "RestoreCounts",
    "RestoreSummary",
    "RunEvent",
    "RunReply",
    "RunsReply",
    "ServiceView",
    "Status",
    "StatusReply",
    "Stop",
    "Stopping",
    "Subscribe",
    "ToolResult",
    "WaitRun",
    "WorkflowInfo",
    "WorkflowProblem",
    "WorkflowsReply",
]

# 2 (2026-12): a Run view's pendingAction.kind is the reference's ``user_ask_confirmation``
# or ``user_ask_questions`` (was ``confirmation``, ``questions``), and it gains ``flowName``.
PROTOCOL: Final = 2
MAX_FRAME: Final = 4 * 1024 * 1024
# The most encoded bytes of Run views one RunsReply page carries: a frame, less room for the
# reply's own fields.
MAX_PAGE: Final = MAX_FRAME - 64 * 1024
# The Run ids each of a reply's restore lists names at most (``RestoreSummary.counts`` has
# how many there are): every id of 89,000 restored Runs took a StatusReply over the frame,
# and status, runs and doctor failed for a healthy host. 4 x 1,000 ids are ~170 KB. Also
# the store problems a ServiceView lists (~450 bytes each).
RESTORE_LISTED: Final = 1000


class _Msg(msgspec.Struct, frozen=True, tag_field="op", rename="camel", omit_defaults=True):
    pass


# ----- handshake ---------------------------------------------------------------------------


class Hello(_Msg, tag="hello", frozen=True):
    # ``token`` must stay in every protocol's hello: the host checks it before the protocol,
    # so that a peer without it learns nothing (not even the host's pid and version).
    protocol: int
    token: str
    client: str = "intloom"


class HelloOk(_Msg, tag="hello_ok", frozen=True):
    instance_id: str
    pid: int
    project_root: str
    protocol: int
    package_version: str = ""
    # What this host does beyond its protocol's first version, by name: an older host sends
    # none, so a client can fall back for it. "caughtUp": RunEvent.caught_up is set.
    features: list[str] = msgspec.field(default_factory=list)


# The features this host announces in its hello.
CAUGHT_UP: Final = "caughtUp"
# Added 2026-12-05: ``Answer.wait`` is honoured (an older host ignores it and waits).
ANSWER_WAIT: Final = "answerWait"
FEATURES: Final = (CAUGHT_UP, ANSWER_WAIT)


# ----- requests ----------------------------------------------------------------------------


class Status(_Msg, tag="status", frozen=True):
    pass


class Stop(_Msg, tag="stop", frozen=True):
    instance_id: str


class ListWorkflows(_Msg, tag="list_workflows", frozen=True):
    pass


class CreateRun(_Msg, tag="create_run", frozen=True):
    workflow: str
    intent: str
    wait: bool = True  # reply at the first wait or terminal state, else at once


class GetRun(_Msg, tag="get_run", frozen=True):
    run_id: str


class WaitRun(_Msg, tag="wait_run", frozen=True):
    """Reply when the Run is waiting or terminal."""

    run_id: str


class ListRuns(_Msg, tag="list_runs", frozen=True):
    """The host's Runs. With ``page_bytes`` > 0, one page: the Runs listed after position
    ``after`` (0: from the first) that fit in about ``page_bytes`` encoded bytes (at least
    one, at most ``MAX_PAGE``); ``RunsReply.next_after`` asks for the next page. With 0 (a
    client older than paging), every Run in one reply, which fails with RESPONSE_TOO_LARGE
    once they no longer fit in a frame."""

    flow: str | None = None
    page_bytes: int = 0
    after: int = 0


class Answer(_Msg, tag="answer", frozen=True):
    run_id: str
    action_id: str
    answer: Any
    # Added 2026-12-05: reply once the answer is durable, not once the Run is stable (an
    # older host ignores it and waits).
    wait: bool = True


class Cancel(_Msg, tag="cancel", frozen=True):
    run_id: str


class Subscribe(_Msg, tag="subscribe", frozen=True):
    """History so far, then live events, as RunEvent frames."""

    run_id: str


class ClaimAgentCall(_Msg, tag="claim_agent_call", frozen=True):
    run_id: str
    call_id: str
    claim_id: str


class CallTool(_Msg, tag="call_tool", frozen=True):
    run_id: str
    call_id: str
    owner_token: str
    tool_call_id: str
    tool: str
    input: Any = None


class CompleteAgentCall(_Msg, tag="complete_agent_call", frozen=True):
    run_id: str
    call_id: str
    owner_token: str
    outcome: str
    output: Any = None


class FailAgentCall(_Msg, tag="fail_agent_call", frozen=True):
    run_id: str
    call_id: str
    owner_token: str
    message: str


Request = (
    Status
    | Stop
    | ListWorkflows
    | CreateRun
    | GetRun
    | WaitRun
    | ListRuns
    | Answer
    | Cancel
    | Subscribe
    | ClaimAgentCall
    | CallTool
    | CompleteAgentCall
    | FailAgentCall
)

# ----- responses ---------------------------------------------------------------------------


class RestoreCounts(msgspec.Struct, frozen=True, rename="camel"):
    """How many Run ids each of ``RestoreSummary``'s lists has, listed or not."""

    resumed: int = 0
    waiting: int = 0
    interrupted: int = 0
    needs_attention: int = 0


class RestoreSummary(msgspec.Struct, frozen=True, rename="camel"):
    """What the last restore did, by restart-table outcome (every key, even when empty).
    In a reply each list names its first ``RESTORE_LISTED`` ids; ``counts`` has them all."""

    resumed: list[str] = msgspec.field(default_factory=list)
    waiting: list[str] = msgspec.field(default_factory=list)
    interrupted: list[str] = msgspec.field(default_factory=list)
    needs_attention: list[str] = msgspec.field(default_factory=list)
    terminal_skipped: int = 0
    # Added 2026-12: how many ids each list has, and how many of them, in all, the lists
    # leave out (0: every id is listed). None and 0 from an older host, whose lists are whole.
    counts: RestoreCounts | None = None
    omitted: int = 0
    # Added 2026-12-05: why each listed ``needs_attention`` Run is held, its first clause
    # (``doctor`` says the rest). Empty from an older host.
    reasons: dict[str, str] = msgspec.field(default_factory=dict)

    def count(self, key: str) -> int:
        """How many Runs the list ``key`` (a field name) has, listed or not."""
        listed: list[str] = getattr(self, key)
        return len(listed) if self.counts is None else int(getattr(self.counts, key))


class WorkflowProblem(msgspec.Struct, frozen=True, rename="camel"):
    """A Workflow source (an ``intloom.toml`` entry) that failed to load, and why."""

    source: str
    code: str
    message: str


class StoreProblem(msgspec.Struct, frozen=True, rename="camel"):
    """A checkpoint-store file the restore read past (damaged, foreign, unexpected or torn):
    kept byte-identical; ``path`` is relative to ``.intloom/runtime``."""

    path: str
    kind: str
    problem: str


class ServiceView(msgspec.Struct, frozen=True, rename="camel"):
    """The host as ``start``/``status`` show it: every field, ``null`` when unknown (a count
    of 0 is a fact scripts read, not an absence)."""

    project_root: str
    pid: int
    instance_id: str
    port: int
    started_at: str
    package_version: str = ""
    protocol_version: int = PROTOCOL
    log_file: str | None = None
    workflow_count: int = 0
    running_runs: int = 0
    waiting_runs: int = 0
    completed_runs: int = 0
    failed_runs: int = 0
    restore: RestoreSummary | None = None
    # Set when the host log could not be written: the host refuses new work (LOG_WRITE_FAILED).
    log_error: str | None = None
    # Set when the journal takes no more checkpoints in this process (a failed write left no
    # segment to write to): every Run's next checkpoint fails until a restart. Added 2026-12.
    journal_error: str | None = None
    # What to fix on the disk, with ``journal_error``, when it is not free space: a file
    # system with no inode left (ENOSPC either way), or a wal/ that refuses a new segment (a
    # flag, its mode, a read-only mount). Null: free space. Added 2026-12.
    journal_fix: str | None = None
    # The last compaction (snapshots, manifest.json, a rotation's segment) that could not be
    # written, as the log's ``store_compaction_failed`` says it: harmless (the next start
    # reads more of the log) but a full disk's first sign. Added 2026-12.
    compaction_error: str | None = None
    # The sources that failed to load (the others run; their Runs are held until they load).
    workflow_problems: list[WorkflowProblem] = msgspec.field(default_factory=list)
    # The store files the last restore read past; every start lists them until they are
    # dealt with (the journal is never written over them). The first RESTORE_LISTED only:
    # 100,000 snapshots moved out of snap/live/ made a 38 MB StatusReply.
    store_problems: list[StoreProblem] = msgspec.field(default_factory=list)
    # How many more there are than ``store_problems`` lists (0: all listed). Added 2026-12;
    # 0 from an older host, which lists them all.
    store_problems_omitted: int = 0
    # The port intloom.toml set when this host started (null: none), which ``port`` is not
    # when start was given --port: what changed on disk since is judged against it
    # (client/drift.py). Absent from a host of an intloom before it.
    config_port: int | msgspec.UnsetType | None = msgspec.UNSET
    # The Workflow protocol the host's identities hash in (``runtime.records.
    # PROTOCOL_VERSION``): an intloom installed since with the same one computes the same
    # identities, so edits to the Workflows are still told (client/drift.py). "" from a host
    # of an intloom before it (added 2026-12-05).
    workflow_protocol: str = ""


class WorkflowInfo(msgspec.Struct, frozen=True, rename="camel"):
    """One loaded Workflow (every field; ``problem`` is null unless ``ready`` is false)."""

    name: str
    version: str
    identity: str
    source: str
    stages: list[str]
    ready: bool = True
    problem: str | None = None


class StatusReply(_Msg, tag="status_reply", frozen=True):
    service: ServiceView


class Stopping(_Msg, tag="stopping", frozen=True):
    """The host's reply to a stop request (``Client.stop_reply``): it has begun to stop."""

    stopping: bool = True
    # Seconds this host's stop may take from its reply until it has released its files: the
    # sum of its own bounds, which grows with the snapshots its close writes. A client waits
    # that long rather than a fixed time. Added 2026-12; absent (None) from an older host.
    within: float | None = None


class WorkflowsReply(_Msg, tag="workflows", frozen=True):
    workflows: list[WorkflowInfo]


class RunReply(_Msg, tag="run", frozen=True):
    run: RunView
    already_ended: bool = False


class RunsReply(_Msg, tag="runs", frozen=True):
    runs: list[RunView]
    next_after: int = 0  # > 0: more Runs follow; pass it as ListRuns.after


class Claimed(_Msg, tag="claimed", frozen=True):
    owner_token: str
    call: PendingAgentCall


class ToolResult(_Msg, tag="tool_result", frozen=True):
    output: Any = None
    replayed: bool = False


class RunEvent(_Msg, tag="run_event", frozen=True):
    """One step of a Run's history (``history=True``) or a live change."""

    run: RunView
    event: str
    detail: Any = None
    history: bool = False
    final: bool = False
    # On the last event of the first batch: the Run's history up to the subscription has all
    # been sent (an earlier host's, then ``restored``, for a restored Run). Added in
    # 2026-12; a host before it never sets it.
    caught_up: bool = False
    # On the first event of a history that does not start at the Run's start: how many of
    # the Run's earlier events the host no longer holds, so were not sent (intloom inspect
    # reads them all from the journal). Added in 2026-12; 0 from a host before it.
    omitted: int = 0


class ErrorReply(_Msg, tag="error", frozen=True):
    error: ErrorView


Response = (
    HelloOk
    | StatusReply
    | Stopping
    | WorkflowsReply
    | RunReply
    | RunsReply
    | Claimed
    | ToolResult
    | RunEvent
    | ErrorReply
)
