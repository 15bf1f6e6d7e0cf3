"""The Python client: one typed, blocking method per request of the socket protocol.

The CLI is a thin adapter over this module; users import it to drive Runs and client Agents.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from intloom.protocol.messages import HelloOk, RunEvent, ServiceView, WorkflowInfo
from intloom.runtime.model import PendingAgentCall, RunView

__all__ = ["Client"]


class Client:
    """A verified, authenticated connection to a project's host.

    ``Client.connect(root)`` reads ``connection.json`` and ``service.json`` strictly, connects
    to 127.0.0.1 at the saved port, sends the hello with the token and checks the reply's
    instanceId, pid and projectRoot against ``service.json``. Errors are ``IntloomError``s:
    CLI_SERVICE_OFFLINE, CLI_SERVICE_METADATA_INVALID, CLI_SERVICE_CLOSING, ...
    """

    hello: HelloOk

    @classmethod
    def connect(cls, root: Path, *, timeout: float = 5.0) -> Client:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def status(self) -> ServiceView:
        raise NotImplementedError

    def stop(self, instance_id: str) -> bool:
        raise NotImplementedError

    def workflows(self) -> list[WorkflowInfo]:
        raise NotImplementedError

    def create_run(self, workflow: str, intent: str, *, wait: bool = True) -> RunView:
        raise NotImplementedError

    def get_run(self, run_id: str) -> RunView:
        raise NotImplementedError

    def wait_run(self, run_id: str) -> RunView:
        raise NotImplementedError

    def runs(self, flow: str | None = None) -> list[RunView]:
        raise NotImplementedError

    def answer(self, run_id: str, action_id: str, answer: Any) -> RunView:
        raise NotImplementedError

    def cancel(self, run_id: str) -> tuple[RunView, bool]:
        raise NotImplementedError

    def subscribe(self, run_id: str) -> Iterator[RunEvent]:
        raise NotImplementedError

    def claim_agent_call(
        self, run_id: str, call_id: str, claim_id: str
    ) -> tuple[str, PendingAgentCall]:
        raise NotImplementedError

    def call_tool(
        self, run_id: str, call_id: str, owner_token: str, tool_call_id: str, tool: str,
        input: Any = None,
    ) -> tuple[Any, bool]:
        raise NotImplementedError

    def complete_agent_call(
        self, run_id: str, call_id: str, owner_token: str, outcome: str, output: Any = None
    ) -> RunView:
        raise NotImplementedError

    def fail_agent_call(
        self, run_id: str, call_id: str, owner_token: str, message: str
    ) -> RunView:
        raise NotImplementedError
