"""A host SIGKILLed between its answer to status's hello and its reply to the status
request: status said ``blocked`` with the lost request's own error (PROJECT_CONNECTION_FAILED
or PROJECT_REQUEST_FAILED, "run intloom status") over files whose owner had gone. The
request is a read: it is sent again on a new connection, which the dead host's port
refuses, and the owners are judged gone: ``recovery_required``, as a status a moment later
says.

Real host, real socket, real SIGKILL; only the moment is chosen: just before the status
request is sent, or once it is sent to a host that a SIGSTOP keeps from answering it.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from intloom.client.client import Client
from intloom.diagnostics import owners
from tests.helpers import Project

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@pytest.mark.parametrize("moment", ["before_the_request", "before_the_reply"])
def test_a_host_killed_after_the_hello_is_judged_by_what_is_left(
    project: Project, monkeypatch: pytest.MonkeyPatch, moment: str,
) -> None:
    assert project.cli("start").code == 0
    pid = project.host_pid()
    killed: list[int] = []
    status, send = Client.status, Client._send

    def killed_first(client: Client, *args: Any, **kwargs: Any) -> Any:
        if not killed:
            killed.append(project.kill_host())
        return status(client, *args, **kwargs)

    def sent_then_killed(client: Client, request: Any) -> Any:
        if killed:
            return send(client, request)
        os.kill(pid, signal.SIGSTOP)  # the request is sent, never read
        try:
            return send(client, request)
        finally:
            killed.append(project.kill_host())

    if moment == "before_the_request":
        monkeypatch.setattr(Client, "status", killed_first)
    else:
        monkeypatch.setattr(Client, "_send", sent_then_killed)
    found = owners.inspect(project.root)
    assert killed, "the probe never asked the host for its status"
    assert found.diagnosis.status == "recovery_required", (found.diagnosis.message,
                                                           found.problem)
    assert found.diagnosis.message == owners.MESSAGES["recovery_required"]
    assert {owner.status for owner in found.diagnosis.owners} == {"absent"}
    assert not found.answered
    monkeypatch.undo()
    assert project.cli("--json", "status").json["status"] == "recovery_required"
    assert project.cli("recover").code == 0
